//! Row homes: where a table's rows live when they are not cached. Each is one file
//! implementing [`RowHome`] (kernels read a home directly through its [`RowSource`]) and
//! one name in the [`homes!`] list below, which generates the [`Home`] enum tables hold
//! and the static dispatch of kernels to each home's own code.
//!
//! Homes today: [`MemoryHome`] (contiguous rows on a byte-addressable device),
//! [`ModelHome`] (the same behind the 2LM model), [`BlockHome`] (a table file on a block
//! device, direct I/O) and [`FileHome`] (rows in a plain file, buffered I/O). A home whose
//! rows are not in memory returns `None` from [`RowHome::memory`]; a cache over it stages
//! each call's rows into its slots first, through [`RowHome::read_rows`] and
//! [`RowHome::write_rows`] (`cache::stage`), whatever the home.
//!
//! A new home is one file here implementing [`RowHome`] and [`RowSource`], and one name in
//! the `homes!` line at the bottom.

mod block;
mod file;
mod memory;
mod model;
mod pending;

pub use block::{BlockCounters, BlockHome};
pub use file::{journal_path, FileCounters, FileHome};
pub use memory::MemoryHome;
pub use model::ModelHome;

use std::sync::Arc;

use crate::rows::RowFn;
use crate::rows::RowSource;
use tiermem_core::device::Device;

/// A place rows live.
pub trait RowHome: RowSource + Send + Sync {
    /// Kind name for reports.
    const KIND: &'static str;

    /// Whether kernels never read the rows in place (they are in a file): a cache in front
    /// stages every row a call touches ([`RowHome::read_rows`]), and the home needs one.
    const STAGED: bool = false;

    /// Manager index of the device the rows are on (`None`: not a manager device, e.g. a
    /// file on a block device).
    fn device_index(&self) -> Option<usize>;

    /// That device.
    fn device(&self) -> Option<&Arc<Device>>;

    /// The rows' memory (`rows * stride` contiguous bytes) when a cache in front of this
    /// home may read rows there in place; `None` otherwise.
    fn memory(&self) -> Option<*mut u8>;

    /// Copy row `i` (`stride` bytes) to `dst`: how a cache fills a slot.
    ///
    /// # Safety
    /// `i` is below the table's rows; `dst` is valid for `stride` bytes of writes and does
    /// not overlap the home; the caller holds the table's lock (shared at least).
    unsafe fn load_row(&self, i: usize, dst: *mut u8);

    /// Copy `stride` bytes from `src` into row `i`: how a cache writes a dirty row back.
    ///
    /// # Safety
    /// As [`RowHome::load_row`], with `src` readable, under the table's exclusive lock.
    unsafe fn store_row(&self, i: usize, src: *const u8);

    /// Finish the [`RowHome::store_row`]s so far (a home may buffer them to write many at
    /// once); an error leaves them buffered, never lost. Exclusive lock held.
    fn stores_done(&self) -> tiermem_core::Result<()> {
        Ok(())
    }

    /// Bytes one unit of [`RowHome::read_rows`]'s count brings in (a block; a row).
    fn read_unit(&self) -> usize {
        self.stride()
    }

    /// Read `rows` (sorted, distinct, each below the table's rows) and call `f(row, bytes)`
    /// once for each, and once for each other row the same reads bring for free (a block's
    /// neighbours: `f` sees rows it did not ask for, which a cache may admit). Rows stored
    /// but not yet written take precedence over what the home holds. Returns the units
    /// read ([`RowHome::read_unit`] bytes each). Table lock held (shared at least).
    fn read_rows(&self, rows: &[u64], mut f: impl FnMut(u64, &[u8])) -> tiermem_core::Result<u64> {
        let stride = self.stride();
        let mut buf = vec![0u8; stride];
        for &r in rows {
            // SAFETY: `r` is below the table's rows (the caller's contract); `buf` holds a
            // row and is apart from the home.
            unsafe { self.load_row(r as usize, buf.as_mut_ptr()) };
            f(r, &buf);
        }
        Ok(rows.len() as u64)
    }

    /// Write `rows` (`src`: `rows.len()` rows of bytes) to the home now; values stored but
    /// not yet written for these rows are older and dropped. Exclusive lock held.
    fn write_rows(&self, rows: &[u64], src: &[u8]) -> tiermem_core::Result<()> {
        let stride = self.stride();
        for (&r, row) in rows.iter().zip(src.chunks_exact(stride)) {
            // SAFETY: `r` is below the table's rows; `row` is one row of bytes.
            unsafe { self.store_row(r as usize, row.as_ptr()) };
        }
        Ok(())
    }

    /// Whether this process is a forked child of the one that opened the home's file: it
    /// writes nothing back (the file is its parent's).
    fn forked(&self) -> bool {
        false
    }

    /// An error if the rows may not change (a home opened read-only).
    fn writable(&self) -> tiermem_core::Result<()> {
        Ok(())
    }

    /// Finish the stores and make the rows durable (a file's `fdatasync`). Exclusive lock
    /// held.
    fn sync(&self) -> tiermem_core::Result<()> {
        self.stores_done()
    }
}

/// [`RowHome::load_row`] of a home in a file: row `i` read through [`RowHome::read_rows`]
/// (neighbours the read brings are ignored). Only whole-cache fills come here, with no error
/// to return, so a failed read stops loudly; callers that can fail stage rows instead. Kept
/// out of line: the lookup's miss path inlines the other homes' copies.
///
/// # Safety
/// As [`RowHome::load_row`].
#[cold]
#[inline(never)]
pub(super) unsafe fn load_staged<H: RowHome>(home: &H, i: usize, dst: *mut u8) {
    // SAFETY: the caller's contract: `dst` is valid for a row's bytes of writes.
    let out = unsafe { std::slice::from_raw_parts_mut(dst, home.stride()) };
    let r = i as u64;
    if let Err(e) = home.read_rows(&[r], |row, bytes| {
        if row == r {
            out.copy_from_slice(bytes);
        }
    }) {
        panic!("{e}");
    }
}

/// The [`RowSource`] of a home whose rows are not in memory: kernels never read it in place
/// (`Table::over_home` refuses such a home without a cache, and a cache stages every row a
/// kernel touches into its slots first), so reading or writing a row here is a broken
/// invariant and stops loudly.
/// The home defines `fn row_bytes(&self) -> usize` (its rows' stride).
macro_rules! not_in_memory {
    ($home:ty, $what:literal) => {
        // SAFETY: this source hands out no pointer: every accessor that would is
        // unreachable (see the macro's doc).
        unsafe impl $crate::rows::RowSource for $home {
            fn stride(&self) -> usize {
                self.row_bytes()
            }

            fn read(&self, i: usize, _t: &mut $crate::rows::Tally) -> *const u8 {
                unreachable!(
                    concat!(
                        "row {} of ",
                        $what,
                        " read in place: its rows are read through a cache"
                    ),
                    i
                )
            }

            fn write(&self, i: usize, _t: &mut $crate::rows::Tally) -> *mut u8 {
                unreachable!(
                    concat!(
                        "row {} of ",
                        $what,
                        " written in place: its rows are written through a cache"
                    ),
                    i
                )
            }

            fn prefetch(&self, _i: usize) {}

            fn charge(&self, _t: &$crate::rows::Tally) {}
        }
    };
}
pub(crate) use not_in_memory;

macro_rules! homes {
    ($($variant:ident),* $(,)?) => {
        /// A table's home: one variant per [`RowHome`].
        pub enum Home {
            $(
                #[doc = concat!("[`", stringify!($variant), "`]")]
                $variant($variant),
            )*
        }

        /// Every home kind's name.
        pub const KINDS: &[&str] = &[$(<$variant as RowHome>::KIND),*];

        impl Home {
            /// Run `f` with this home as the kernels' row source (static dispatch).
            pub(crate) fn with<T>(&self, f: impl RowFn<T>) -> T {
                match self {
                    $(Home::$variant(h) => f.call(h),)*
                }
            }

            fn staged_kind(&self) -> bool {
                match self {
                    $(Home::$variant(_) => <$variant as RowHome>::STAGED,)*
                }
            }

            /// Kind name.
            #[must_use]
            pub fn kind(&self) -> &'static str {
                match self {
                    $(Home::$variant(_) => <$variant as RowHome>::KIND,)*
                }
            }

            /// Manager index of the rows' device, if a manager device.
            #[must_use]
            pub fn device_index(&self) -> Option<usize> {
                match self {
                    $(Home::$variant(h) => h.device_index(),)*
                }
            }

            /// The rows' device, if a manager device.
            #[must_use]
            pub fn device(&self) -> Option<&Arc<Device>> {
                match self {
                    $(Home::$variant(h) => h.device(),)*
                }
            }

            /// See [`RowHome::memory`].
            #[must_use]
            pub fn memory(&self) -> Option<*mut u8> {
                match self {
                    $(Home::$variant(h) => h.memory(),)*
                }
            }

            /// See [`RowHome::load_row`].
            ///
            /// # Safety
            /// As [`RowHome::load_row`].
            pub unsafe fn load_row(&self, i: usize, dst: *mut u8) {
                match self {
                    // SAFETY: the caller's contract.
                    $(Home::$variant(h) => unsafe { h.load_row(i, dst) },)*
                }
            }

            /// See [`RowHome::store_row`].
            ///
            /// # Safety
            /// As [`RowHome::store_row`].
            pub unsafe fn store_row(&self, i: usize, src: *const u8) {
                match self {
                    // SAFETY: the caller's contract.
                    $(Home::$variant(h) => unsafe { h.store_row(i, src) },)*
                }
            }

            /// See [`RowHome::stores_done`].
            pub fn stores_done(&self) -> tiermem_core::Result<()> {
                match self {
                    $(Home::$variant(h) => h.stores_done(),)*
                }
            }

            /// See [`RowHome::read_unit`].
            #[must_use]
            pub fn read_unit(&self) -> usize {
                match self {
                    $(Home::$variant(h) => h.read_unit(),)*
                }
            }

            /// See [`RowHome::read_rows`].
            pub fn read_rows(
                &self,
                rows: &[u64],
                f: impl FnMut(u64, &[u8]),
            ) -> tiermem_core::Result<u64> {
                match self {
                    $(Home::$variant(h) => h.read_rows(rows, f),)*
                }
            }

            /// See [`RowHome::write_rows`].
            pub fn write_rows(&self, rows: &[u64], src: &[u8]) -> tiermem_core::Result<()> {
                match self {
                    $(Home::$variant(h) => h.write_rows(rows, src),)*
                }
            }

            /// See [`RowHome::writable`].
            pub fn writable(&self) -> tiermem_core::Result<()> {
                match self {
                    $(Home::$variant(h) => h.writable(),)*
                }
            }

            /// See [`RowHome::sync`].
            pub fn sync(&self) -> tiermem_core::Result<()> {
                match self {
                    $(Home::$variant(h) => h.sync(),)*
                }
            }

            /// See [`RowHome::forked`].
            #[must_use]
            pub fn forked(&self) -> bool {
                match self {
                    $(Home::$variant(h) => h.forked(),)*
                }
            }
        }

        $(
            impl From<$variant> for Home {
                fn from(h: $variant) -> Home {
                    Home::$variant(h)
                }
            }
        )*
    };
}

homes!(MemoryHome, ModelHome, BlockHome, FileHome);

impl Home {
    /// The block home, if this is one (block-only operations: relayout, snapshot).
    #[must_use]
    pub fn block(&self) -> Option<&BlockHome> {
        match self {
            Home::BlockHome(b) => Some(b),
            _ => None,
        }
    }

    /// The file home, if this is one.
    #[must_use]
    pub fn file(&self) -> Option<&FileHome> {
        match self {
            Home::FileHome(f) => Some(f),
            _ => None,
        }
    }

    /// See [`RowHome::STAGED`].
    #[must_use]
    pub fn staged(&self) -> bool {
        self.staged_kind()
    }
}
