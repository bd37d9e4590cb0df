//! `memory`: rows stored contiguously on one byte-addressable device of the manager, reserved
//! there for the table's lifetime.

use std::sync::Arc;

use super::RowHome;
use crate::rows::{charge, RowSource, Tally};
use tiermem_core::arch::hints::prefetch;
use tiermem_core::device::Device;
use tiermem_core::manager::{Manager, Reservation};
use tiermem_core::{Error, Result};

/// Rows stored contiguously on one device.
pub struct MemoryHome {
    pub(crate) base: *mut u8,
    pub(crate) stride: usize,
    /// Whether the device is the manager's fastest (reads count as hits, else misses).
    pub(crate) fast: bool,
    pub(crate) device: Arc<Device>,
    /// The rows' bytes in the manager (released when the home drops).
    pub(crate) mem: Reservation,
}

impl MemoryHome {
    /// `rows` zeroed rows of `stride` bytes on manager device `device`.
    pub fn new(manager: &Arc<Manager>, device: usize, rows: usize, stride: usize) -> Result<Self> {
        let bytes = (rows as u64).checked_mul(stride as u64).ok_or_else(|| {
            Error::InvalidArgument(format!("{rows} rows of {stride} bytes overflow"))
        })?;
        let mem = Reservation::new(manager, device, bytes)?;
        // SAFETY: mem is valid for `bytes` writes and ours alone.
        unsafe { std::ptr::write_bytes(mem.ptr, 0, mem.len) };
        Ok(MemoryHome {
            base: mem.ptr,
            stride,
            fast: device == 0,
            device: manager.devices()[device].clone(),
            mem,
        })
    }
}

impl RowHome for MemoryHome {
    const KIND: &'static str = "memory";

    fn device_index(&self) -> Option<usize> {
        Some(self.mem.device)
    }

    fn device(&self) -> Option<&Arc<Device>> {
        Some(&self.device)
    }

    fn memory(&self) -> Option<*mut u8> {
        Some(self.base)
    }

    unsafe fn load_row(&self, i: usize, dst: *mut u8) {
        // SAFETY: row i lies inside the reserved rows (i < rows); the caller's contract
        // covers `dst` and the lock.
        unsafe { std::ptr::copy_nonoverlapping(self.base.add(i * self.stride), dst, self.stride) };
    }

    unsafe fn store_row(&self, i: usize, src: *const u8) {
        // SAFETY: as in `load_row`, under the exclusive lock.
        unsafe { std::ptr::copy_nonoverlapping(src, self.base.add(i * self.stride), self.stride) };
    }
}

// SAFETY: the rows are plain memory owned by the table (pinned in the manager for its
// lifetime); concurrent access is governed by the table's lock, as RowSource requires.
unsafe impl Send for MemoryHome {}
// SAFETY: as above.
unsafe impl Sync for MemoryHome {}

// SAFETY: base + i * stride stays inside the table's pinned region for every i < rows.
unsafe impl RowSource for MemoryHome {
    #[inline(always)]
    fn stride(&self) -> usize {
        self.stride
    }

    #[inline(always)]
    fn read(&self, i: usize, t: &mut Tally) -> *const u8 {
        if self.fast {
            t.hits += 1;
        } else {
            t.misses += 1;
        }
        t.home_read += self.stride as u64;
        t.home_rows += 1;
        self.base.wrapping_add(i * self.stride)
    }

    #[inline(always)]
    fn write(&self, i: usize, t: &mut Tally) -> *mut u8 {
        t.home_read += self.stride as u64;
        t.home_rows += 1;
        t.home_written += self.stride as u64;
        t.home_written_rows += 1;
        self.base.wrapping_add(i * self.stride)
    }

    #[inline(always)]
    fn prefetch(&self, i: usize) {
        prefetch(self.base.wrapping_add(i * self.stride), self.stride);
    }

    fn charge(&self, t: &Tally) {
        charge(Some(&self.device), None, t);
    }
}
