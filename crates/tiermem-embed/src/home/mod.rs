//! Row homes: where a table's rows live when they are not cached. Each is one file
//! implementing [`RowHome`] (kernels read a home directly through its [`RowSource`]) and
//! one name in the [`homes!`] list below, which generates the [`Home`] enum tables hold
//! and the static dispatch of kernels to each home's own code.
//!
//! Homes today: [`MemoryHome`] (contiguous rows on a byte-addressable device) and
//! [`ModelHome`] (the same behind the 2LM model). A home whose rows are not in memory (a
//! block store) returns `None` from [`RowHome::memory`]; a cache over it then has to stage
//! rows through its slots.

mod memory;
mod model;

pub use memory::MemoryHome;
pub use model::ModelHome;

use std::sync::Arc;

use crate::rows::RowSource;
use crate::table::RowFn;
use tiermem_core::device::Device;

/// A place rows live.
pub trait RowHome: RowSource + Send + Sync {
    /// Kind name for reports.
    const KIND: &'static str;

    /// Manager index of the device the rows are on.
    fn device_index(&self) -> usize;

    /// That device.
    fn device(&self) -> &Arc<Device>;

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

            /// Manager index of the rows' device.
            #[must_use]
            pub fn device_index(&self) -> usize {
                match self {
                    $(Home::$variant(h) => h.device_index(),)*
                }
            }

            /// The rows' device.
            #[must_use]
            pub fn device(&self) -> &Arc<Device> {
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

homes!(MemoryHome, ModelHome);
