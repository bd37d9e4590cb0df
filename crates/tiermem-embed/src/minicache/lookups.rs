//! Miniature caches of a memory-backed table that caches in its lookups (`dynamic`, `admit`):
//! the kernel's own way of caching, simulated, so a table can be given the admission that
//! pays best on a profile of its input, or no cache at all.
//!
//! A lookup call first makes room if the cache is full (one
//! second-chance pass freeing the slack, [`crate::cache::CachedRows::reclaim`]; after it,
//! `admit` forgets the first misses of a quarter of the table, as
//! [`crate::cache::CachedRows::age_seen`] does). Then each access in order: a cached row is
//! hit and marked; a missing row is inserted unmarked while a slot is free, under
//! [`"second"`] only if it missed before (its first miss only notes it); once
//! no slot is free the call's remaining misses read through. The admission is the table's
//! own object ([`crate::cache::admit`]), asked the same questions at the same points: every
//! access counted, each miss asked, marks aged after each reclaim. Rows are sampled by hash
//! at `rate` (the cache's pages scaled, as [`super::simulate`] does); the counts are scaled
//! back.

use std::cell::Cell;

use super::{clock::Clock, SimCache, SimResult};
use crate::cache::admit::{Admission, Seen};
use crate::cache::evict::{Eviction, SecondChance};
use crate::layout::Queries;
use crate::mrc::mix;
use tiermem_core::{ensure, Result};

/// The cache simulated: a table of `rows` rows of `row_bytes` bytes whose cache holds
/// `capacity` rows, reclaims at least `slack_rows` at a time, and admits misses by
/// `admission`.
#[derive(Debug, Clone, PartialEq)]
pub struct LookupCache {
    /// Rows of the table.
    pub rows: usize,
    /// Rows the cache holds.
    pub capacity: usize,
    /// Bytes per row (they size the cache's pages).
    pub row_bytes: usize,
    /// Slots a reclaim frees at least.
    pub slack_rows: usize,
    /// Which misses are cached (the admission's name, [`Admission::parse`]).
    pub admission: String,
    /// Which rows leave a full cache (the policy's).
    pub eviction: Eviction,
}

/// The `SEEN` marks of a simulated table: one per row, aged a quarter at a time.
struct Marks {
    seen: Vec<Cell<bool>>,
    sweep: Cell<usize>,
}

impl Seen for Marks {
    fn seen_or_mark(&self, row: usize) -> bool {
        self.seen[row].replace(true)
    }

    fn age(&self) {
        let n = self.seen.len();
        let quarter = n.div_ceil(4);
        let start = self.sweep.get();
        for k in 0..quarter {
            self.seen[(start + k) % n].set(false);
        }
        self.sweep.set((start + quarter) % n.max(1));
    }
}

/// Simulate `cache` over `trace` in lookup calls of `batch` queries (`None`: one access
/// per call), sampled at `rate`.
pub fn simulate_lookups(
    cache: &LookupCache,
    trace: Queries<'_>,
    rate: f64,
    batch: Option<usize>,
) -> Result<SimResult> {
    let n = cache.rows;
    trace.check(n)?;
    ensure!(
        rate > 0.0 && rate <= 1.0,
        "sampling rate {rate} must be in (0, 1]"
    );
    ensure!(batch != Some(0), "a lookup call holds at least one query");
    let mut adm = Admission::parse(&cache.admission)?;
    let (capacity, row_bytes, slack) = (cache.capacity, cache.row_bytes, cache.slack_rows);
    let mut cache = match cache.eviction {
        Eviction::SecondChance => Clock::<SecondChance>::for_table(n, capacity, row_bytes, slack, rate)?,
        Eviction::Never => tiermem_core::bail!(
            "a cache that never evicts is filled once and read through: its lookups have nothing to simulate"
        ),
    };
    adm.sized(cache.capacity());
    let cut = (rate * u64::MAX as f64) as u64;
    let sampled = |r: u64| rate >= 1.0 || mix(r) <= cut;
    let decides = adm.decides_misses();
    let marks = Marks {
        seen: (0..n).map(|_| Cell::new(false)).collect(),
        sweep: Cell::new(0),
    };
    let (rows, off) = (trace.rows, trace.offsets);
    let queries = off.len().saturating_sub(1);
    let calls: Vec<std::ops::Range<usize>> = match batch {
        None => (0..rows.len()).map(|i| i..i + 1).collect(),
        Some(q) => (0..queries)
            .step_by(q)
            .map(|k| off[k] as usize..off[(k + q).min(queries)] as usize)
            .collect(),
    };
    let mut s = SimResult::default();
    let mut full = false;
    for range in calls {
        if full || cache.is_full() {
            cache.reclaim_once();
            full = false;
            adm.after_room_made(&marks);
        }
        for &v in &rows[range] {
            let r = v as u64;
            if !sampled(r) {
                continue;
            }
            if decides {
                adm.touch(r);
            }
            let r = r as u32;
            s.accesses += 1.0;
            if cache.cached(r) {
                cache.hit(r);
                s.hits += 1.0;
                continue;
            }
            if full {
                continue;
            }
            if decides && !adm.miss(u64::from(r), &marks) {
                continue;
            }
            if cache.insert(r, true, false) {
                s.inserts += 1.0;
                marks.seen[r as usize].set(false); // a cached row's entry holds no mark
            } else {
                full = true;
            }
        }
    }
    Ok(SimResult {
        accesses: s.accesses / rate,
        hits: s.hits / rate,
        blocks_read: (s.accesses - s.hits) / rate,
        inserts: s.inserts / rate,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cache(
        rows: usize,
        capacity: usize,
        row_bytes: usize,
        slack_rows: usize,
        admission: &str,
    ) -> LookupCache {
        LookupCache {
            rows,
            capacity,
            row_bytes,
            slack_rows,
            admission: admission.to_owned(),
            eviction: Eviction::SecondChance,
        }
    }

    fn q(rows: &[i64]) -> (Vec<i64>, Vec<i64>) {
        (vec![0, rows.len() as i64], rows.to_vec())
    }

    /// Every row fits: each distinct row misses once and is inserted once (dynamic); with
    /// second-miss admission each row used at least twice is inserted on its second use.
    #[test]
    fn a_cache_that_holds_every_row_inserts_each_row_once() {
        let rows: Vec<i64> = (0..3_000).map(|k| (k * 7 % 500) / (1 + k % 3)).collect();
        let (off, r) = q(&rows);
        let t = Queries {
            offsets: &off,
            rows: &r,
        };
        let distinct = rows.iter().collect::<std::collections::HashSet<_>>().len() as f64;
        let d = simulate_lookups(&cache(500, 500, 64, 0, "row"), t, 1.0, None).unwrap();
        assert_eq!(d.accesses, 3_000.0);
        assert_eq!(d.accesses - d.hits, distinct);
        assert_eq!(d.inserts, distinct);
        let mut uses = std::collections::HashMap::new();
        for &x in &rows {
            *uses.entry(x).or_insert(0) += 1;
        }
        let twice = uses.values().filter(|&&u| u >= 2).count() as f64;
        let a = simulate_lookups(&cache(500, 500, 64, 0, "second"), t, 1.0, None).unwrap();
        assert_eq!(a.inserts, twice);
        assert_eq!(a.accesses - a.hits, distinct + twice);
    }

    /// A hot set reused beside a stream of rows used once: every-miss admission lets the
    /// stream push the hot rows out, second-miss admission keeps them and inserts almost
    /// nothing but them.
    #[test]
    fn second_miss_admission_keeps_a_hot_set_against_a_stream() {
        let mut rows = Vec::new();
        for k in 0..40_000i64 {
            rows.push(if k % 2 == 0 { (k / 2) % 300 } else { 1_000 + k });
        }
        let off: Vec<i64> = (0..=400).map(|k| k * 100).collect();
        let t = Queries {
            offsets: &off,
            rows: &rows,
        };
        let n = 41_000;
        let d = simulate_lookups(&cache(n, 400, 64, 40, "row"), t, 1.0, Some(1)).unwrap();
        let a = simulate_lookups(&cache(n, 400, 64, 40, "second"), t, 1.0, Some(1)).unwrap();
        assert!(a.hit_rate() > 0.45, "{a:?}");
        assert!(a.hit_rate() > d.hit_rate(), "{a:?} vs {d:?}");
        assert!(
            a.inserts < 1_000.0 && d.inserts > 10_000.0,
            "{a:?} vs {d:?}"
        );
    }

    #[test]
    fn sampled_simulations_stay_close_and_bad_arguments_are_refused() {
        let rows = crate::minicache::tests::hot_rows(50_000, 4_000, 200_000);
        let off: Vec<i64> = (0..=200).map(|k| k * 1_000).collect();
        let t = Queries {
            offsets: &off,
            rows: &rows,
        };
        for adm in ["row", "second"] {
            let exact =
                simulate_lookups(&cache(50_000, 5_000, 128, 500, adm), t, 1.0, Some(10)).unwrap();
            let sampled =
                simulate_lookups(&cache(50_000, 5_000, 128, 500, adm), t, 0.1, Some(10)).unwrap();
            assert!(
                (exact.hit_rate() - sampled.hit_rate()).abs() < 0.03,
                "{adm:?}: {exact:?} vs {sampled:?}"
            );
        }
        let e = simulate_lookups(&cache(100, 10, 64, 0, "row"), t, 1.0, None).unwrap_err();
        assert!(e.to_string().contains("100"), "{e}");
        let e = simulate_lookups(&cache(50_000, 10, 64, 0, "row"), t, 0.0, None).unwrap_err();
        assert!(e.to_string().contains("rate"), "{e}");
    }
}
