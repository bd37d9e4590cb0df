//! A model of Intel's hardware DRAM cache ("2LM", memory mode; thesis Ch.2, Table 2.2,
//! Fig. 2.3): the baseline tiermem replaces. Fast memory acts as a direct-mapped,
//! insert-on-miss cache of lines in front of a slow device, with a tag and a dirty bit per
//! line and no knowledge of which data is dead.
//!
//! The model does not move data: rows and arrays stay on the slow device (on an `emulated`
//! device that is DRAM). What it does is classify every line tiermem touches through it —
//! read hit, clean or dirty read miss, write hit, clean or dirty write miss, and the "dirty
//! data optimisation" write that follows a read of the same line — and charge each event the
//! memory accesses of thesis Table 2.2 on the devices they hit: counted as bytes on both devices
//! and, when the slow device is `emulated`, waited out as time. It is a model, not the
//! hardware; reports call it "2LM model".
//!
//! Lines are 64 bytes, as in the hardware; a coarser power-of-two line may be chosen for very
//! large arrays, an approximation that moves whole lines where the hardware would move 64
//! bytes. Tags are checked and replaced with relaxed atomics: two threads missing on one
//! set at once may both count a miss, which the hardware's memory controller would
//! serialise; the error is bounded by the number of such races and does not affect data.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use serde::Serialize;

use crate::device::Device;
use crate::sys::huge::HugeSlice;
use crate::{ensure, Result};

/// The hardware's line size.
pub const LINE: usize = 64;

/// What one line access did (thesis Table 2.2's columns).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// LLC read, tag hit.
    ReadHit = 0,
    /// LLC read, miss, the evicted line was clean.
    ReadMissClean = 1,
    /// LLC read, miss, the evicted line was dirty (written back).
    ReadMissDirty = 2,
    /// LLC write, tag hit.
    WriteHit = 3,
    /// LLC write, miss, clean victim.
    WriteMissClean = 4,
    /// LLC write, miss, dirty victim.
    WriteMissDirty = 5,
    /// A write-back of a line the same access just read (read-modify-write): the tag check
    /// is elided (thesis §2.4.3).
    Ddo = 6,
}

/// Number of [`Event`] kinds.
pub const EVENTS: usize = 7;

/// Event names, in [`Event`] order.
pub const EVENT_NAMES: [&str; EVENTS] = [
    "read_hit",
    "read_miss_clean",
    "read_miss_dirty",
    "write_hit",
    "write_miss_clean",
    "write_miss_dirty",
    "ddo",
];

/// Thesis Table 2.2: accesses each event makes, as (fast reads, fast writes, slow reads,
/// slow writes). Their sums are the table's amplification row: 1, 3, 4, 2, 4, 5, 1.
pub const ACCESSES: [[u64; 4]; EVENTS] = [
    [1, 0, 0, 0],
    [1, 1, 1, 0],
    [1, 1, 1, 1],
    [1, 1, 0, 0],
    [1, 2, 1, 0],
    [1, 2, 1, 1],
    [0, 1, 0, 0],
];

/// Event counts a kernel thread keeps while it works (in lines).
pub type Events = [u64; EVENTS];

/// How a range is touched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Loads only.
    Read,
    /// Stores that overwrite whole lines (non-temporal stores, copies in).
    Write,
    /// Loads then stores to the same lines (an in-place update with ordinary stores).
    ReadModifyWrite,
}

const DIRTY: u32 = 1 << 31;

/// Memory traffic the model has charged, in bytes.
#[derive(Debug, Default, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct Traffic {
    /// Fast-memory (DRAM cache) reads: tag checks and hits.
    pub fast_read: u64,
    /// Fast-memory writes: inserts, write hits, DDO writes.
    pub fast_written: u64,
    /// Slow-device reads: miss fills.
    pub slow_read: u64,
    /// Slow-device writes: dirty-victim write-backs.
    pub slow_written: u64,
}

/// Counters of a model since creation or the last reset.
#[derive(Debug, Default, Clone, Serialize)]
pub struct TwoLmStats {
    /// Line events, in [`Event`] order.
    pub events: Events,
    /// Bytes the events moved.
    pub traffic: Traffic,
    /// Memory accesses per demand access (thesis "access amplification").
    pub amplification: f64,
    /// Fraction of demand line accesses (reads and writes, DDO aside) that hit.
    pub hit_rate: f64,
}

/// The model: a tag per line of a fast-memory cache of `sets * line` bytes.
pub struct TwoLm {
    line_shift: u32,
    sets: u64,
    tags: HugeSlice<AtomicU32>,
    /// Start and length of the slow device's memory (addresses are taken relative to it,
    /// like the physical addresses the hardware indexes by).
    base: usize,
    span: usize,
    slow: Arc<Device>,
    fast: Arc<Device>,
    slow_index: usize,
    fast_index: usize,
    counters: [AtomicU64; EVENTS],
}

impl TwoLm {
    /// A model over two devices (with their manager indices). It reserves nothing: the
    /// `2lm_model` policy never places data on the fast device, so all of it serves as the
    /// cache, as all of DRAM does in memory mode; a table behind the model takes its cache's
    /// bytes with [`crate::manager::reserve_model`].
    pub fn over(
        slow: (Arc<Device>, usize),
        fast: (Arc<Device>, usize),
        cache_bytes: u64,
        line: usize,
    ) -> Result<Self> {
        ensure!(
            line >= LINE && line.is_power_of_two(),
            "a 2LM model line must be a power of two of at least {LINE} bytes, not {line}"
        );
        let sets = cache_bytes / line as u64;
        ensure!(
            sets > 0,
            "a 2LM model cache of {cache_bytes} bytes holds no {line}-byte line"
        );
        ensure!(
            cache_bytes <= fast.0.capacity,
            "a 2LM model cache of {cache_bytes} bytes is larger than fast device '{}' ({} bytes)",
            fast.0.name,
            fast.0.capacity
        );
        let base = slow.0.addr(0).ok_or_else(|| {
            crate::Error::InvalidArgument(format!(
                "a 2LM model needs a byte-addressable slow device, and '{}' is a block device",
                slow.0.name
            ))
        })? as usize;
        let span = slow.0.capacity as usize;
        let max_tag = (span as u64 / line as u64) / sets;
        ensure!(
            max_tag < u64::from(DIRTY - 1),
            "a 2LM model of {cache_bytes} bytes in front of {span} bytes needs tags wider than 31 bits; use a larger cache or line"
        );
        Ok(TwoLm {
            line_shift: line.trailing_zeros(),
            sets,
            tags: HugeSlice::zeroed(sets as usize)?,
            base,
            span,
            slow: slow.0,
            fast: fast.0,
            slow_index: slow.1,
            fast_index: fast.1,
            counters: Default::default(),
        })
    }

    /// Line size in bytes.
    #[must_use]
    pub fn line(&self) -> usize {
        1 << self.line_shift
    }

    /// Cache capacity in bytes.
    #[must_use]
    pub fn cache_bytes(&self) -> u64 {
        self.sets << self.line_shift
    }

    /// Bytes of DRAM the tags take (outside the manager's devices).
    #[must_use]
    pub fn metadata_bytes(&self) -> u64 {
        4 * self.sets
    }

    /// Manager device indices (slow, fast).
    #[must_use]
    pub fn devices(&self) -> (usize, usize) {
        (self.slow_index, self.fast_index)
    }

    /// Whether `[ptr, ptr + len)` lies on the modelled slow device.
    #[must_use]
    pub fn covers(&self, ptr: *const u8, len: usize) -> bool {
        let a = ptr as usize;
        a >= self.base && a - self.base + len <= self.span
    }

    /// Hint: the tag of the line at `ptr` will be checked soon.
    #[inline(always)]
    pub fn prefetch(&self, ptr: *const u8) {
        let line = ((ptr as usize).wrapping_sub(self.base) >> self.line_shift) as u64;
        let set = (line % self.sets) as usize;
        crate::arch::hints::prefetch(self.tags.as_ptr().wrapping_add(set).cast(), 4);
    }

    /// Run the lines of `[ptr, ptr + len)` through the cache; returns whether every line hit.
    /// The range must lie on the slow device ([`TwoLm::covers`]; checked in debug builds).
    #[inline]
    pub fn access(&self, ptr: *const u8, len: usize, how: Access, ev: &mut Events) -> bool {
        debug_assert!(self.covers(ptr, len));
        let off = (ptr as usize).wrapping_sub(self.base);
        let first = off >> self.line_shift;
        let last = (off + len.max(1) - 1) >> self.line_shift;
        let mut all = true;
        for line in first..=last {
            all &= self.touch(line as u64, how, ev);
        }
        all
    }

    #[inline(always)]
    fn touch(&self, line: u64, how: Access, ev: &mut Events) -> bool {
        let set = (line % self.sets) as usize;
        // Tags are stored plus one, so zero means "empty".
        let tag = (line / self.sets) as u32 + 1;
        let entry = &self.tags[set];
        let cur = entry.load(Ordering::Relaxed);
        let writes = how != Access::Read;
        if cur & !DIRTY == tag {
            ev[if how == Access::Write {
                Event::WriteHit
            } else {
                Event::ReadHit
            } as usize] += 1;
            if how == Access::ReadModifyWrite {
                ev[Event::Ddo as usize] += 1;
            }
            if writes && cur & DIRTY == 0 {
                entry.fetch_or(DIRTY, Ordering::Relaxed);
            }
            return true;
        }
        let old = entry.swap(if writes { tag | DIRTY } else { tag }, Ordering::Relaxed);
        let dirty_victim = old & DIRTY != 0 && old & !DIRTY != tag;
        let e = match (how, dirty_victim) {
            (Access::Write, false) => Event::WriteMissClean,
            (Access::Write, true) => Event::WriteMissDirty,
            (_, false) => Event::ReadMissClean,
            (_, true) => Event::ReadMissDirty,
        };
        ev[e as usize] += 1;
        if how == Access::ReadModifyWrite {
            ev[Event::Ddo as usize] += 1;
        }
        false
    }

    /// Bytes of traffic a set of events stands for.
    #[must_use]
    pub fn traffic(&self, ev: &Events) -> Traffic {
        let mut a = [0u64; 4];
        for (n, acc) in ev.iter().zip(ACCESSES.iter()) {
            for (s, k) in a.iter_mut().zip(acc) {
                *s += n * k;
            }
        }
        let line = self.line() as u64;
        Traffic {
            fast_read: a[0] * line,
            fast_written: a[1] * line,
            slow_read: a[2] * line,
            slow_written: a[3] * line,
        }
    }

    /// Account for a kernel's events: add them to the counters, count their bytes on both
    /// devices and, when the slow device is emulated, wait out the time the hardware would
    /// have spent beyond the one DRAM access per demand access the kernel already made:
    /// slow-device reads and write-backs at the slow device's full cost (a miss is served
    /// after its tag check), `miss_steps` dependent slow-device latencies, and the extra
    /// fast-memory accesses at DRAM bandwidth.
    pub fn charge(&self, ev: &Events, miss_steps: u64) {
        if ev.iter().all(|&n| n == 0) {
            return;
        }
        for (c, n) in self.counters.iter().zip(ev) {
            if *n > 0 {
                c.fetch_add(*n, Ordering::Relaxed);
            }
        }
        let t = self.traffic(ev);
        let threads = rayon::current_num_threads();
        self.fast.counters.read(t.fast_read);
        self.fast.counters.wrote(t.fast_written);
        self.slow.counters.read(t.slow_read);
        self.slow.counters.wrote(t.slow_written);
        let demand = demand_lines(ev) << self.line_shift;
        let extra_fast = (t.fast_read + t.fast_written).saturating_sub(demand);
        if let Some(th) = &self.slow.throttle {
            // Lines of a row are filled one after another and merge in the device's
            // buffer: charged as streams, not at the device's granularity per line (the
            // model does not know which lines a row spans).
            th.charge_full(
                (t.slow_read, 1, miss_steps),
                (t.slow_written, 1, threads),
                extra_fast,
            );
        }
    }

    /// Counters since creation or the last reset.
    #[must_use]
    pub fn stats(&self) -> TwoLmStats {
        let mut events = [0u64; EVENTS];
        for (e, c) in events.iter_mut().zip(&self.counters) {
            *e = c.load(Ordering::Relaxed);
        }
        let traffic = self.traffic(&events);
        let demand = demand_lines(&events);
        let accesses: u64 = events
            .iter()
            .zip(ACCESSES.iter())
            .map(|(n, a)| n * a.iter().sum::<u64>())
            .sum();
        let hits = events[Event::ReadHit as usize] + events[Event::WriteHit as usize];
        let looked_up: u64 = events[..Event::Ddo as usize].iter().sum();
        TwoLmStats {
            events,
            traffic,
            amplification: if demand == 0 {
                0.0
            } else {
                accesses as f64 / demand as f64
            },
            hit_rate: if looked_up == 0 {
                0.0
            } else {
                hits as f64 / looked_up as f64
            },
        }
    }

    /// Zero the counters (the cache's contents stay).
    pub fn reset_stats(&self) {
        for c in &self.counters {
            c.store(0, Ordering::Relaxed);
        }
    }

    /// Empty the cache without writing anything back (a fresh machine).
    pub fn clear(&self) {
        for t in self.tags.iter() {
            t.store(0, Ordering::Relaxed);
        }
    }
}

/// Demand accesses: one per line looked up plus one per DDO write-back.
fn demand_lines(ev: &Events) -> u64 {
    ev.iter().sum()
}
