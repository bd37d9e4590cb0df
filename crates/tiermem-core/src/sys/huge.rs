//! Zero-initialised arrays in memory backed by transparent huge pages: the per-row arrays
//! kernels touch at random (pointer tables, back-edges, reindex scratch, optimizer state).
//! With 4 KiB pages, most random reads of a multi-megabyte array would also miss the TLB.

use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::atomic::AtomicU32;

use crate::sys::mmap::Mapping;
use crate::{Error, Result};

/// Types for which all-zero bytes are a valid value.
///
/// # Safety
/// Implement only for such types.
pub unsafe trait Zeroable {}
// SAFETY: zero is a valid u32.
unsafe impl Zeroable for u32 {}
// SAFETY: all-zero bytes are 0.0.
unsafe impl Zeroable for f32 {}
// SAFETY: AtomicU32 has the layout of u32.
unsafe impl Zeroable for AtomicU32 {}

/// A fixed-length array of `T`, zeroed, in its own huge-page mapping.
pub struct HugeSlice<T: Zeroable> {
    map: Option<Mapping>,
    len: usize,
    _t: PhantomData<T>,
}

impl<T: Zeroable> HugeSlice<T> {
    /// `len` zeroed elements.
    pub fn zeroed(len: usize) -> Result<Self> {
        let bytes = len
            .checked_mul(std::mem::size_of::<T>())
            .ok_or_else(|| Error::InvalidArgument(format!("{len} elements overflow")))?;
        let map = if bytes == 0 {
            None
        } else {
            Some(Mapping::anonymous(bytes, true, None).map_err(|e| {
                Error::io(
                    "dram",
                    "anonymous",
                    format!("map {bytes} bytes for table metadata"),
                    e,
                )
            })?)
        };
        Ok(HugeSlice {
            map,
            len,
            _t: PhantomData,
        })
    }

    fn ptr(&self) -> *mut T {
        self.map
            .as_ref()
            .map_or(NonNull::dangling().as_ptr(), |m| m.as_ptr().cast())
    }
}

impl<T: Zeroable> Deref for HugeSlice<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: the mapping holds `len * size_of::<T>()` zero-initialised (hence valid,
        // T: Zeroable) bytes, 2 MiB-aligned (so aligned for T), mapped while `self` lives;
        // an empty slice may use a dangling pointer.
        unsafe { std::slice::from_raw_parts(self.ptr(), self.len) }
    }
}

impl<T: Zeroable> DerefMut for HugeSlice<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as above, and `&mut self` makes this the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.ptr(), self.len) }
    }
}

// SAFETY: the mapping is owned plain memory; T's own Send/Sync rules govern access.
unsafe impl<T: Zeroable + Send> Send for HugeSlice<T> {}
// SAFETY: as above.
unsafe impl<T: Zeroable + Sync> Sync for HugeSlice<T> {}
