//! Row homes: where a table's rows live when they are not cached. Each is one file
//! implementing [`RowHome`] (kernels read a home directly through its [`RowSource`]) and
//! one name in the [`homes!`] list below, which generates the [`Home`] enum tables hold
//! and the static dispatch of kernels to each home's own code.
//!
//! Homes today: [`MemoryHome`] (contiguous rows on a byte-addressable device),
//! [`ModelHome`] (the same behind the 2LM model) and [`BlockHome`] (a table file on a block
//! device). A home whose rows are not in memory (the block home) returns `None` from
//! [`RowHome::memory`]; a cache over it stages each call's rows into its slots first.

mod block;
mod memory;
mod model;

pub use block::{BlockCounters, BlockHome};
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
}

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

homes!(MemoryHome, ModelHome, BlockHome);

impl Home {
    /// The block home, if this is one.
    #[must_use]
    pub fn block(&self) -> Option<&BlockHome> {
        match self {
            Home::BlockHome(b) => Some(b),
            _ => None,
        }
    }
}
