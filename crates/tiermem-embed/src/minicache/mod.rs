//! Miniature caches (Bandana §4.3.3, after Waldspurger et al.'s miniature simulations):
//! simulated caches of a block table, run on a spatially sampled trace, that say which
//! admission ([`Admission`]) reads the fewest blocks at a given cache size and what hit rate
//! each gets.
//!
//! A miss reads the row's block, caches the row, and caches each other row of the block
//! that is not cached and that the admission takes (the table's own admission object,
//! asked the same questions: none for `row` and `row:T`, all for `block`, a query count in
//! the layout's training trace above `t` for `threshold:T`, a recent count for `tinylfu`;
//! shadow caches are not simulated). Two
//! caches are simulated ([`Evict`]): Bandana's LRU list of rows, and the table cache's own
//! second chance over pages, which is what a table runs and so what picks its admission (on
//! the query trace at a 5 % cache the LRU, which drops a cold row at the next miss, picked
//! `row:2` where the table does best at `row:4`). The trace runs in the table's lookup calls
//! ([`Model::batch`]), so, unsampled, the second chance predicts a table's misses and blocks
//! read exactly. Sampling is by *block* (a block's hash below `rate` keeps every access to
//! its rows), so a sampled block keeps all of its prefetches; the cache is `rate` times the
//! size (the second chance keeps the full-size cache's page count, each page scaled), and
//! hits and blocks read are scaled back.

use rayon::prelude::*;

mod clock;
mod lookups;
mod lru;

pub use lookups::{simulate_lookups, LookupCache};

use crate::cache::admit::{Admission, Known};
use crate::cache::evict::SecondChance;
use crate::layout::Queries;
use crate::mrc::mix;
use tiermem_core::{ensure, Result};

/// What one simulation saw, scaled to the whole trace.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct SimResult {
    /// Row accesses (lookups).
    pub accesses: f64,
    /// Accesses that hit.
    pub hits: f64,
    /// Blocks read (a memory table's simulation: rows read from its home).
    pub blocks_read: f64,
    /// Rows inserted into the cache (asked for or prefetched).
    pub inserts: f64,
}

impl SimResult {
    /// Hits per access.
    #[must_use]
    pub fn hit_rate(&self) -> f64 {
        if self.accesses == 0.0 {
            0.0
        } else {
            self.hits / self.accesses
        }
    }
}

pub(crate) const NIL: u32 = u32::MAX;

/// Which cache is simulated (its eviction: a list, or the table's own pages).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Simulated {
    /// Bandana's: an LRU list of rows. A hit moves the row to the head; a row asked for goes
    /// in at the head, or at the tail if cold (`ColdRow` only); prefetches go just behind
    /// the head.
    Lru,
    /// The table cache's own second chance over pages (rows of `row_bytes` bytes set the
    /// page size, as [`CachedRows::frame_rows`] does): rows asked for go in marked unless
    /// cold (`ColdRow` and `Threshold` alike, as staging does), prefetches unmarked; a
    /// reclaim frees at least `slack_rows` slots (the table's `cacheslack` in rows).
    Clock {
        /// Bytes per row.
        row_bytes: usize,
        /// Slots a reclaim frees at least (of the full-size cache; scaled like it).
        slack_rows: usize,
    },
}

/// How the simulation runs: which cache, on which sample, in which calls.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Model {
    /// The cache simulated.
    pub cache: Simulated,
    /// The share of blocks sampled, in (0, 1] (1: exact).
    pub rate: f64,
    /// Queries per lookup call, as a table stages them (each call's distinct rows: hits
    /// marked, misses read once per block, room made for them all, then inserted); `None`:
    /// every access is a call of its own (Bandana's simulator).
    pub batch: Option<usize>,
}

/// A simulated cache of rows.
pub(crate) trait SimCache {
    /// Whether `r` is cached.
    fn cached(&self, r: u32) -> bool;
    /// A cached row used.
    fn hit(&mut self, r: u32);
    /// Before `want` rows are inserted: make room, keeping the call's rows `keep`.
    fn make_room(&mut self, want: usize, keep: &[u32]);
    /// Insert `r`, asked for (`cold`: it leaves first unless used again) or prefetched;
    /// false if there is no room.
    fn insert(&mut self, r: u32, cold: bool, prefetch: bool) -> bool;
    /// Rows the cache holds at most.
    fn capacity(&self) -> usize;
}

/// Simulate a cache of `capacity` rows over the trace as `model` says, blocks of
/// `rows_per_block` by `layout` (row → position), admitting rows by `admit`
/// (`counts`: per-row query counts, for thresholds).
pub fn simulate(
    layout: &[u32],
    rows_per_block: usize,
    trace: Queries<'_>,
    capacity: usize,
    admit: &str,
    counts: Option<&[u32]>,
    model: &Model,
) -> Result<SimResult> {
    let n = layout.len();
    trace.check(n)?;
    if let Some(why) = crate::layout::permutation_problem(layout, n) {
        tiermem_core::bail!("the layout simulated is not a permutation: {why}");
    }
    let rate = model.rate;
    ensure!(rows_per_block > 0, "blocks hold at least one row");
    ensure!(
        rate > 0.0 && rate <= 1.0,
        "sampling rate {rate} must be in (0, 1]"
    );
    ensure!(
        model.batch != Some(0),
        "a lookup call holds at least one query"
    );
    let admit = Admission::parse(admit)?;
    ensure!(
        !admit.needs_counts() || counts.is_some_and(|c| c.len() == n),
        "admission {} needs a query count for each of the table's {n} rows",
        admit.name()
    );
    if matches!(admit, Admission::Shadow(_)) {
        tiermem_core::bail!(
            "admission '{}': shadow caches are not simulated by the miniature caches",
            admit.name()
        );
    }
    let lru_cold = !matches!(admit, Admission::Threshold(_));
    let simulated = model.cache;
    let mut run = Replay {
        layout,
        rows_per_block: rows_per_block as u32,
        trace,
        admit,
        counts,
        model,
    };
    match simulated {
        Simulated::Lru => {
            let scaled = ((capacity as f64 * rate).round() as usize).max(1);
            run.admit.sized(scaled);
            Ok(run.through(&mut lru::Lru::new(n, scaled), lru_cold))
        }
        Simulated::Clock {
            row_bytes,
            slack_rows,
        } => {
            let mut clock =
                clock::Clock::<SecondChance>::for_table(n, capacity, row_bytes, slack_rows, rate)?;
            run.admit.sized(clock.capacity());
            Ok(run.through(&mut clock, true))
        }
    }
}

/// One simulation's inputs.
struct Replay<'a> {
    layout: &'a [u32],
    rows_per_block: u32,
    trace: Queries<'a>,
    admit: Admission,
    counts: Option<&'a [u32]>,
    model: &'a Model,
}

impl Replay<'_> {
    /// Run the sampled trace through `cache`, call by call; a row asked for goes in cold
    /// when the admission says so and `colds` (Bandana's LRU does not for thresholds).
    fn through(&self, cache: &mut impl SimCache, colds: bool) -> SimResult {
        let (layout, rpb, rate) = (self.layout, self.rows_per_block, self.model.rate);
        let n = layout.len();
        let mut at = vec![0u32; n];
        for (r, &p) in layout.iter().enumerate() {
            at[p as usize] = r as u32;
        }
        let known = Known {
            counts: self.counts,
        };
        let cut = (rate * u64::MAX as f64) as u64;
        let sampled = |r: u32| rate >= 1.0 || mix(u64::from(layout[r as usize] / rpb)) <= cut;
        // Each call's rows, as a range of access indices: one access, or `q` queries.
        let rows = self.trace.rows;
        let off = self.trace.offsets;
        let queries = off.len().saturating_sub(1);
        let calls: Box<dyn Iterator<Item = std::ops::Range<usize>>> = match self.model.batch {
            None => Box::new((0..rows.len()).map(|i| i..i + 1)),
            Some(q) => Box::new(
                (0..queries)
                    .step_by(q)
                    .map(move |k| off[k] as usize..off[(k + q).min(queries)] as usize),
            ),
        };
        let mut s = SimResult::default();
        let (mut call, mut missing, mut blocks) = (Vec::new(), Vec::new(), Vec::new());
        let (mut asked, mut extra) = (Vec::new(), Vec::new());
        for range in calls {
            call.clear();
            call.extend(
                rows[range]
                    .iter()
                    .map(|&r| r as u32)
                    .filter(|&r| sampled(r)),
            );
            if call.is_empty() {
                continue;
            }
            if self.admit.decides_misses() {
                for &r in &call {
                    self.admit.touch(u64::from(r));
                }
            }
            s.accesses += call.len() as f64;
            let accesses = call.len();
            call.sort_unstable();
            call.dedup();
            missing.clear();
            for &r in &call {
                if cache.cached(r) {
                    cache.hit(r);
                } else {
                    missing.push(r);
                }
            }
            s.hits += (accesses - missing.len()) as f64;
            if missing.is_empty() {
                continue;
            }
            blocks.clear();
            blocks.extend(missing.iter().map(|&r| layout[r as usize] / rpb));
            blocks.sort_unstable();
            blocks.dedup();
            s.blocks_read += blocks.len() as f64;
            // The blocks' rows in file order, as the table reads them: those asked for, and
            // the others the admission takes.
            asked.clear();
            extra.clear();
            for &b in &blocks {
                let first = b * rpb;
                for p in first..(first + rpb).min(n as u32) {
                    let o = at[p as usize];
                    if missing.binary_search(&o).is_ok() {
                        asked.push(o);
                    } else if !cache.cached(o) && self.admit.neighbour(u64::from(o), known) {
                        extra.push(o);
                    }
                }
            }
            let room = cache.capacity().saturating_sub(call.len());
            cache.make_room(missing.len() + extra.len().min(room), &call);
            for &r in &asked {
                if !cache.insert(r, colds && self.admit.cold(u64::from(r), known), false) {
                    break;
                }
                s.inserts += 1.0;
            }
            for &o in &extra {
                if !cache.insert(o, false, true) {
                    break;
                }
                s.inserts += 1.0;
            }
        }
        SimResult {
            accesses: s.accesses / rate,
            hits: s.hits / rate,
            blocks_read: s.blocks_read / rate,
            inserts: s.inserts / rate,
        }
    }
}

/// Simulate every admission of `admits` at every cache size of `capacities`, in parallel:
/// `out[a][c]`.
pub fn sweep(
    layout: &[u32],
    rows_per_block: usize,
    trace: Queries<'_>,
    capacities: &[usize],
    admits: &[String],
    counts: Option<&[u32]>,
    model: &Model,
) -> Result<Vec<Vec<SimResult>>> {
    let jobs: Vec<(usize, usize)> = (0..admits.len())
        .flat_map(|a| (0..capacities.len()).map(move |c| (a, c)))
        .collect();
    let res: Vec<SimResult> = tiermem_core::process::in_kernel_pool(|| {
        jobs.par_iter()
            .map(|&(a, c)| {
                simulate(
                    layout,
                    rows_per_block,
                    trace,
                    capacities[c],
                    &admits[a],
                    counts,
                    model,
                )
            })
            .collect::<Result<_>>()
    })??;
    Ok(res
        .chunks(capacities.len())
        .map(<[SimResult]>::to_vec)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXACT_LRU: Model = Model {
        cache: Simulated::Lru,
        rate: 1.0,
        batch: None,
    };

    /// `ColdRow(t)`: rows counted at most `t` leave first, so a hot set outlives a stream
    /// of rows used once that plain LRU lets push it out; with every count above `t` it is
    /// plain LRU.
    #[test]
    fn cold_rows_leave_first() {
        let n = 20_000usize;
        let mut rows = Vec::new();
        for k in 0..6_000i64 {
            rows.push(if k % 3 == 0 { (k / 3) % 50 } else { 1_000 + k });
        }
        let offsets = vec![0, rows.len() as i64];
        let t = Queries {
            offsets: &offsets,
            rows: &rows,
        };
        let layout: Vec<u32> = (0..n as u32).collect();
        let mut counts = vec![0u32; n];
        counts[..50].fill(5);
        let lru = simulate(&layout, 8, t, 60, "row", None, &EXACT_LRU).unwrap();
        let cold = simulate(&layout, 8, t, 60, "row:0", Some(&counts), &EXACT_LRU).unwrap();
        assert!(
            lru.hits < 1.0,
            "plain LRU keeps none of the hot set: {}",
            lru.hits
        );
        assert!(
            (cold.hits - 1_950.0).abs() < 1e-9,
            "every hot access after the first 50 hits: {}",
            cold.hits
        );
        let all_hot = vec![9u32; n];
        let same = simulate(&layout, 8, t, 60, "row:3", Some(&all_hot), &EXACT_LRU).unwrap();
        assert_eq!(same, lru);
        let e = simulate(&layout, 8, t, 60, "row:3", None, &EXACT_LRU).unwrap_err();
        assert!(e.to_string().contains("query count"), "{e}");
    }

    #[test]
    fn row_admission_is_the_lru_curve_and_blocks_read_are_the_misses() {
        let mut rows = Vec::new();
        let mut x = 7u64;
        for _ in 0..20_000 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
            rows.push(((x >> 33) % 1000) as i64 / (1 + (x >> 60) as i64));
        }
        let offsets = vec![0, rows.len() as i64];
        let t = Queries {
            offsets: &offsets,
            rows: &rows,
        };
        let layout: Vec<u32> = (0..1000).collect();
        let u: Vec<u64> = rows.iter().map(|&r| r as u64).collect();
        for cap in [10usize, 100, 400] {
            let s = simulate(&layout, 8, t, cap, "row", None, &EXACT_LRU).unwrap();
            let exact = crate::mrc::lru_curve(&u, &[cap as u64])[0];
            assert!(
                (s.hit_rate() - exact).abs() < 1e-12,
                "{cap}: {} vs {exact}",
                s.hit_rate()
            );
            assert!((s.blocks_read - (s.accesses - s.hits)).abs() < 1e-9);
            let all = simulate(&layout, 8, t, cap, "block", None, &EXACT_LRU).unwrap();
            let none = simulate(
                &layout,
                8,
                t,
                cap,
                &format!("threshold:{}", u32::MAX),
                Some(&[0; 1000]),
                &EXACT_LRU,
            )
            .unwrap();
            assert_eq!(none, s, "a threshold nothing passes is row admission");
            assert!(all.accesses == s.accesses);
        }
    }

    /// Four in five accesses to the first `hot` rows, the rest to any of `n`, uniformly.
    pub(super) fn hot_rows(n: u64, hot: u64, len: usize) -> Vec<i64> {
        let mut x = 11u64;
        (0..len)
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let r = x >> 24;
                (if r.is_multiple_of(5) {
                    r / 5 % n
                } else {
                    r / 5 % hot
                }) as i64
            })
            .collect()
    }

    /// The second chance: a cache that holds every row misses each once; sampled at 10 %,
    /// its hit rate is within 0.03 of the unsampled one's (the LRU list's sampling error on
    /// this trace is 0.004 and 0.025 at these sizes: about 25 of the 250 hot blocks are
    /// sampled).
    #[test]
    fn second_chance_misses_once_when_all_fits_and_samples_close() {
        let n = 20_000usize;
        let rows = hot_rows(n as u64, 2_000, 200_000);
        let offsets = vec![0, rows.len() as i64];
        let t = Queries {
            offsets: &offsets,
            rows: &rows,
        };
        let layout: Vec<u32> = (0..n as u32).collect();
        let clock = Model {
            cache: Simulated::Clock {
                row_bytes: 128,
                slack_rows: 0,
            },
            rate: 1.0,
            batch: None,
        };
        let sampled_clock = Model { rate: 0.1, ..clock };
        let distinct = rows.iter().collect::<std::collections::HashSet<_>>().len();
        let all = simulate(&layout, 8, t, n, "row", None, &clock).unwrap();
        assert_eq!(all.accesses - all.hits, distinct as f64);
        for cap in [1_000usize, 3_000] {
            let exact = simulate(&layout, 8, t, cap, "row", None, &clock).unwrap();
            let sampled = simulate(&layout, 8, t, cap, "row", None, &sampled_clock).unwrap();
            assert!(
                exact.hit_rate() > 0.3 && exact.hit_rate() < 0.95,
                "{exact:?}"
            );
            assert!(
                (exact.hit_rate() - sampled.hit_rate()).abs() < 0.03,
                "{cap}: {} vs {}",
                exact.hit_rate(),
                sampled.hit_rate()
            );
        }
    }
}
