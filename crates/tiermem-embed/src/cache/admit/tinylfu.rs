//! `tinylfu` (after Einziger, Friedman and Manes, "TinyLFU: A Highly Efficient Cache
//! Admission Policy", 2017): every access is counted in a count-min sketch (four rows of
//! 4-bit counters, each row as wide as the cache's slots rounded up to a power of two, about
//! 4 bytes a slot), halved each time ten accesses per counter have been counted, so counts
//! are of the recent past. A row whose estimate, this access included, is below
//! [`ADMIT_AT`] has not been used recently: a miss of it is not cached (a cache over
//! memory), it goes in without the reference mark (a staged cache), and as a block's
//! neighbour it stays out; at or above, it goes in. Unlike `second`, which keeps one bit a
//! row and forgets a quarter of the table at each reclaim, the sketch's size follows the
//! cache's, not the table's, and a row used often in the past keeps some of its count.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};

use super::{no_arg, Admit, Known, Seen};
use crate::mrc::mix;

/// Rows of counters (independent hashes).
const DEPTH: usize = 4;
/// A counter's largest value.
const MAX: u8 = 15;
/// Counts (per counter of a row) between halvings.
const SAMPLE_PER_COUNTER: u64 = 10;
/// The estimate at which a row goes in.
pub const ADMIT_AT: u8 = 2;
const SEEDS: [u64; DEPTH] = [
    0x9E37_79B9_7F4A_7C15,
    0xC2B2_AE3D_27D4_EB4F,
    0x1656_67B1_9E37_79F9,
    0x27D4_EB2F_1656_67C5,
];

/// A count-min sketch of recent accesses.
#[derive(Default)]
pub struct Sketch {
    counters: Box<[AtomicU8]>,
    mask: usize,
    /// Accesses counted since the last halving.
    added: AtomicU64,
    /// Accesses between halvings.
    sample: u64,
}

impl Sketch {
    /// A sketch for a cache of `slots` rows.
    #[must_use]
    pub fn new(slots: usize) -> Self {
        let width = slots.max(64).next_power_of_two();
        Sketch {
            counters: (0..DEPTH * width).map(|_| AtomicU8::new(0)).collect(),
            mask: width - 1,
            added: AtomicU64::new(0),
            sample: SAMPLE_PER_COUNTER * width as u64,
        }
    }

    #[inline(always)]
    fn cells(&self, row: u64) -> [usize; DEPTH] {
        let w = self.mask + 1;
        std::array::from_fn(|k| k * w + (mix(row ^ SEEDS[k]) as usize & self.mask))
    }

    /// Count an access of `row` (conservative update: only the smallest counters grow).
    /// Concurrent counts may lose an increment: an estimate, never memory unsafety.
    pub fn add(&self, row: u64) {
        if self.counters.is_empty() {
            return;
        }
        let cells = self.cells(row);
        let v = cells.map(|c| self.counters[c].load(Ordering::Relaxed));
        let low = v.iter().copied().min().unwrap_or(0);
        if low < MAX {
            for (c, x) in cells.into_iter().zip(v) {
                if x == low {
                    self.counters[c].store(low + 1, Ordering::Relaxed);
                }
            }
        }
        if self.added.fetch_add(1, Ordering::Relaxed) + 1 == self.sample {
            self.halve();
        }
    }

    /// The estimated recent accesses of `row`.
    #[must_use]
    pub fn estimate(&self, row: u64) -> u8 {
        if self.counters.is_empty() {
            return 0;
        }
        self.cells(row)
            .into_iter()
            .map(|c| self.counters[c].load(Ordering::Relaxed))
            .min()
            .unwrap_or(0)
    }

    /// Halve every counter and the count of accesses (TinyLFU's reset).
    fn halve(&self) {
        for c in self.counters.iter() {
            c.store(c.load(Ordering::Relaxed) / 2, Ordering::Relaxed);
        }
        self.added.store(self.sample / 2, Ordering::Relaxed);
    }

    /// Bytes it takes.
    #[must_use]
    pub fn bytes(&self) -> usize {
        self.counters.len()
    }
}

/// `tinylfu`.
#[derive(Default)]
pub struct TinyLfu(Sketch);

impl TinyLfu {
    /// Whether `row` has been used recently enough to go in.
    #[inline(always)]
    fn frequent(&self, row: u64) -> bool {
        self.0.estimate(row) >= ADMIT_AT
    }
}

impl Admit for TinyLfu {
    const NAME: &'static str = "tinylfu";

    fn parse(arg: Option<&str>) -> Result<Self, String> {
        no_arg(arg).map(|()| TinyLfu::default())
    }

    fn sized(&mut self, slots: usize) {
        self.0 = Sketch::new(slots);
    }

    fn decides_misses(&self) -> bool {
        true
    }

    #[inline(never)]
    fn touch(&self, row: u64) {
        self.0.add(row);
    }

    #[inline(never)]
    fn miss(&self, row: u64, _seen: &impl Seen) -> bool {
        self.frequent(row)
    }

    fn cold(&self, row: u64, _known: Known<'_>) -> bool {
        !self.frequent(row)
    }

    fn neighbour(&self, row: u64, _known: Known<'_>) -> bool {
        self.frequent(row)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_grow_saturate_and_halve() {
        let s = Sketch::new(64);
        assert_eq!(s.estimate(7), 0);
        for k in 1..=20u8 {
            s.add(7);
            assert_eq!(s.estimate(7), k.min(MAX));
        }
        // Filling the sample halves every counter.
        let before = s.estimate(7);
        for r in 1000..1000 + s.sample {
            s.add(r);
        }
        assert!(
            s.estimate(7) <= before / 2 + 1,
            "{} after {before}",
            s.estimate(7)
        );
        assert_eq!(s.bytes(), 4 * 64);
    }

    #[test]
    fn a_row_used_once_stays_out_and_one_used_twice_goes_in() {
        let mut a = TinyLfu::default();
        a.sized(1024);
        struct NoMarks;
        impl Seen for NoMarks {
            fn seen_or_mark(&self, _: usize) -> bool {
                unreachable!()
            }
            fn age(&self) {}
        }
        a.touch(5);
        assert!(!a.miss(5, &NoMarks) && a.cold(5, Known::default()));
        a.touch(5);
        assert!(a.miss(5, &NoMarks) && !a.cold(5, Known::default()));
        assert!(!a.neighbour(6, Known::default()));
    }

    #[test]
    fn racing_counts_never_exceed_the_counters_range() {
        let s = std::sync::Arc::new(Sketch::new(64));
        let hs: Vec<_> = (0..4)
            .map(|t| {
                let s = std::sync::Arc::clone(&s);
                std::thread::spawn(move || {
                    for i in 0..20_000u64 {
                        s.add(i % (7 + t));
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        assert!((0..100).all(|r| s.estimate(r) <= MAX));
    }
}
