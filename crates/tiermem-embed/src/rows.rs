//! Where a kernel finds row `i` (thesis Table 5.2's `rowpointer`): in its home
//! ([`crate::home`]) or through a cached table's pointer table. Kernels are generic over
//! [`RowSource`], so the direct path has no indirection at all.

use tiermem_core::device::Device;
use tiermem_core::model::Events;

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
    /// Rows written to the base device (separate accesses, each at least the device's
    /// access granularity).
    pub home_written_rows: u64,
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
        self.home_written_rows += o.home_written_rows;
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
/// A home that is not a manager device (a table file) is charged nothing: its I/O is real.
pub fn charge(home: Option<&Device>, cache: Option<&Device>, t: &Tally) {
    let threads = tiermem_core::process::kernel_threads();
    if let Some(home) = home.filter(|_| t.home_read > 0 || t.home_written > 0) {
        home.charge_kernel(
            (
                t.home_read,
                t.home_rows,
                t.home_rows.div_ceil(MEMORY_PARALLELISM),
            ),
            (t.home_written, t.home_written_rows, threads),
        );
    }
    if let Some(c) = cache {
        if t.cache_read > 0 || t.cache_written > 0 {
            c.charge_kernel((t.cache_read, 1, 0), (t.cache_written, 1, threads));
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

/// A function generic over the row source (closures cannot be generic): what a table hands
/// its rows to (`Table::with_rows`, a home's `with`).
pub(crate) trait RowFn<T> {
    fn call<R: RowSource>(self, rows: &R) -> T;
}
