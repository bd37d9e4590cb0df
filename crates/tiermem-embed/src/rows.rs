//! Where a kernel finds row `i` (thesis Table 5.2's `rowpointer`): directly at
//! `base + i * stride`, or through a cached table's pointer table. Kernels are generic over
//! [`RowSource`], so the direct path has no indirection at all.

use std::sync::Arc;

use tiermem_core::arch::hints::prefetch;
use tiermem_core::device::Device;
use tiermem_core::model::{Access, Events, TwoLm};

/// Per-thread tallies a kernel keeps while it works and hands to [`RowSource::charge`] at
/// the end of each chunk: cache behaviour and bytes per tier.
#[derive(Debug, Default, Clone, Copy)]
pub struct Tally {
    /// Row reads served from fast memory (cache hits; reads of a direct table on the
    /// manager's fastest device).
    pub hits: u64,
    /// Row reads served from slower memory (base rows of a cached table; reads of a direct
    /// table on a slower device).
    pub misses: u64,
    /// Rows copied into the cache.
    pub cached: u64,
    /// Bytes read from the base (home) device.
    pub home_read: u64,
    /// Bytes written to the base (home) device.
    pub home_written: u64,
    /// Rows read from the base device (dependent steps for the latency term).
    pub home_rows: u64,
    /// Bytes read from the cache device.
    pub cache_read: u64,
    /// Bytes written to the cache device.
    pub cache_written: u64,
    /// Line events of the 2LM model (tables behind it only).
    pub events: Events,
}

impl Tally {
    /// Add another tally.
    pub fn add(&mut self, o: &Tally) {
        self.hits += o.hits;
        self.misses += o.misses;
        self.cached += o.cached;
        self.home_read += o.home_read;
        self.home_written += o.home_written;
        self.home_rows += o.home_rows;
        self.cache_read += o.cache_read;
        self.cache_written += o.cache_written;
        for (a, b) in self.events.iter_mut().zip(&o.events) {
            *a += b;
        }
    }
}

/// Independent row reads a core keeps in flight (line-fill buffers): emulated latency is
/// charged once per this many rows read from a slow device.
pub const MEMORY_PARALLELISM: u64 = 16;

/// Charge the traffic of a tally to the devices it touched (counts bytes; on emulated devices
/// waits out the extra time, see [`Device::charge_kernel`]).
pub fn charge(home: &Device, cache: Option<&Device>, t: &Tally) {
    let threads = rayon::current_num_threads();
    if t.home_read > 0 || t.home_written > 0 {
        home.charge_kernel(
            (t.home_read, t.home_rows.div_ceil(MEMORY_PARALLELISM)),
            (t.home_written, threads),
        );
    }
    if let Some(c) = cache {
        if t.cache_read > 0 || t.cache_written > 0 {
            c.charge_kernel((t.cache_read, 0), (t.cache_written, threads));
        }
    }
}

/// A table's rows as kernels see them.
///
/// # Safety
/// Implementations return pointers valid for `stride` bytes of reads (`read`) or reads and
/// writes (`write`) for as long as the caller holds the table's access lock: shared for
/// `read`, exclusive for `write`.
pub unsafe trait RowSource: Sync {
    /// Bytes between rows (row bytes rounded up to 4).
    fn stride(&self) -> usize;
    /// Start of row `i` for reading (`i` already range-checked); may cache the row.
    fn read(&self, i: usize, t: &mut Tally) -> *const u8;
    /// Start of row `i` for an in-place update; marks a cached row dirty.
    fn write(&self, i: usize, t: &mut Tally) -> *mut u8;
    /// Hint: row `i` will be read soon.
    fn prefetch(&self, i: usize);
    /// Hint: row `i` will be read a little later (fetch any indirection first).
    fn prefetch_far(&self, _i: usize) {}
    /// Charge a tally to the devices behind the rows.
    fn charge(&self, t: &Tally);
}

/// Rows stored contiguously on one device.
pub struct DirectRows {
    pub(crate) base: *mut u8,
    pub(crate) stride: usize,
    /// Whether the device is the manager's fastest (reads count as hits, else misses).
    pub(crate) fast: bool,
    pub(crate) device: Arc<Device>,
}

// SAFETY: the rows are plain memory owned by the table (pinned in the manager for its
// lifetime); concurrent access is governed by the table's lock, as RowSource requires.
unsafe impl Send for DirectRows {}
// SAFETY: as above.
unsafe impl Sync for DirectRows {}

// SAFETY: base + i * stride stays inside the table's pinned region for every i < rows.
unsafe impl RowSource for DirectRows {
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
        self.base.wrapping_add(i * self.stride)
    }

    #[inline(always)]
    fn prefetch(&self, i: usize) {
        prefetch(self.base.wrapping_add(i * self.stride), self.stride);
    }

    fn charge(&self, t: &Tally) {
        charge(&self.device, None, t);
    }
}

/// Rows stored contiguously on a slow device behind the 2LM model: every row a kernel reads
/// or updates runs through the model's tags, which charge the hardware cache's traffic.
pub struct ModelRows {
    pub(crate) direct: DirectRows,
    pub(crate) model: Arc<TwoLm>,
}

// SAFETY: the same rows as DirectRows; the model only looks at their addresses.
unsafe impl RowSource for ModelRows {
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
