//! `2lm_model`: rows stored contiguously on the 2LM model's slow device, every access run
//! through the model (the hardware-cache baseline).

use std::sync::Arc;

use super::{MemoryHome, RowHome};
use crate::rows::{RowSource, Tally, MEMORY_PARALLELISM};
use tiermem_core::device::Device;
use tiermem_core::manager::Manager;
use tiermem_core::model::{Access, TwoLm};
use tiermem_core::{ensure, Result};

/// Rows stored contiguously on a slow device behind the 2LM model: every row a kernel reads
/// or updates runs through the model's tags, which charge the hardware cache's traffic.
pub struct ModelHome {
    pub(crate) direct: MemoryHome,
    pub(crate) model: Arc<TwoLm>,
}

// SAFETY: the same rows as MemoryHome; the model only looks at their addresses.
unsafe impl RowSource for ModelHome {
    #[inline(always)]
    fn stride(&self) -> usize {
        self.direct.stride
    }

    #[inline(always)]
    fn read(&self, i: usize, t: &mut Tally) -> *const u8 {
        let p = self.direct.base.wrapping_add(i * self.direct.stride);
        if self
            .model
            .access(p, self.direct.stride, Access::Read, &mut t.events)
        {
            t.hits += 1;
        } else {
            t.misses += 1;
            t.home_rows += 1;
        }
        p
    }

    #[inline(always)]
    fn write(&self, i: usize, t: &mut Tally) -> *mut u8 {
        let p = self.direct.base.wrapping_add(i * self.direct.stride);
        if !self.model.access(
            p,
            self.direct.stride,
            Access::ReadModifyWrite,
            &mut t.events,
        ) {
            t.home_rows += 1;
        }
        p
    }

    #[inline(always)]
    fn prefetch(&self, i: usize) {
        self.direct.prefetch(i);
    }

    #[inline(always)]
    fn prefetch_far(&self, i: usize) {
        self.model
            .prefetch(self.direct.base.wrapping_add(i * self.direct.stride));
    }

    fn charge(&self, t: &Tally) {
        self.model
            .charge(&t.events, t.home_rows.div_ceil(MEMORY_PARALLELISM));
    }
}

impl ModelHome {
    /// `rows` zeroed rows of `stride` bytes on `model`'s slow device of `manager`.
    pub fn new(
        manager: &Arc<Manager>,
        model: &Arc<TwoLm>,
        rows: usize,
        stride: usize,
    ) -> Result<Self> {
        let (slow, _) = model.devices();
        let direct = MemoryHome::new(manager, slow, rows, stride)?;
        ensure!(
            model.covers(direct.mem.ptr, direct.mem.len),
            "the table's rows are not on the 2LM model's slow device (was the model built for another manager?)"
        );
        Ok(ModelHome {
            direct,
            model: model.clone(),
        })
    }
}

impl RowHome for ModelHome {
    const KIND: &'static str = "2lm_model";

    fn device_index(&self) -> Option<usize> {
        self.direct.device_index()
    }

    fn device(&self) -> Option<&Arc<Device>> {
        Some(&self.direct.device)
    }

    /// `None`: a cache in front of the model would bypass it.
    fn memory(&self) -> Option<*mut u8> {
        None
    }

    /// The row through the model: counted as the read it is.
    unsafe fn load_row(&self, i: usize, dst: *mut u8) {
        let mut t = Tally::default();
        let p = self.read(i, &mut t);
        // SAFETY: the row source gives `stride` readable bytes; the caller's contract.
        unsafe { std::ptr::copy_nonoverlapping(p, dst, self.direct.stride) };
        self.charge(&t);
    }

    /// The row through the model: counted as the read-modify-write it is.
    unsafe fn store_row(&self, i: usize, src: *const u8) {
        let mut t = Tally::default();
        let p = self.write(i, &mut t);
        // SAFETY: as in `load_row`, under the exclusive lock.
        unsafe { std::ptr::copy_nonoverlapping(src, p, self.direct.stride) };
        self.charge(&t);
    }
}
