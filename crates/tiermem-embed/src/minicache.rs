//! Miniature caches (Bandana §4.3.3, after Waldspurger et al.'s miniature simulations):
//! simulated LRU caches of a block table, run on a spatially sampled trace, that say which
//! prefetch threshold `t` reads the fewest blocks at a given cache size and what hit rate
//! each size gets.
//!
//! The simulated cache is Bandana's: an LRU list of rows; a miss reads the row's block,
//! caches the row at the head, and caches each other row of the block that is not cached
//! and whose query count in the layout's training trace is above `t` (none for
//! [`Admit::Row`], all for [`Admit::Block`]). Sampling is by *block* (a block's hash below
//! `rate` keeps every access to its rows), so a sampled block keeps all of its prefetches;
//! the cache is `rate` times the size, and hits and blocks read are scaled back.

use rayon::prelude::*;

use crate::layout::Queries;
use crate::mrc::mix;
use tiermem_core::{ensure, Result};

/// What a simulated miss admits besides the row asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Nothing (the baseline).
    Row,
    /// The block's other rows.
    Block,
    /// The block's rows whose count is above this.
    Threshold(u32),
    /// Nothing, and a row asked for whose count is at most this goes in at the list's
    /// tail, the next to leave unless hit first (the staged cache's `row:T`, which inserts
    /// it without the reference mark).
    ColdRow(u32),
}

/// What one simulation saw, scaled to the whole trace.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct SimResult {
    /// Row accesses (lookups).
    pub accesses: f64,
    /// Accesses that hit.
    pub hits: f64,
    /// Blocks read.
    pub blocks_read: f64,
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

/// An LRU list over row ids (intrusive, O(1) per operation).
struct Lru {
    prev: Vec<u32>,
    next: Vec<u32>,
    cached: Vec<bool>,
    head: u32,
    tail: u32,
    len: usize,
    capacity: usize,
}

const NIL: u32 = u32::MAX;

impl Lru {
    fn new(n: usize, capacity: usize) -> Self {
        Lru {
            prev: vec![NIL; n],
            next: vec![NIL; n],
            cached: vec![false; n],
            head: NIL,
            tail: NIL,
            len: 0,
            capacity,
        }
    }

    fn unlink(&mut self, r: u32) {
        let (p, n) = (self.prev[r as usize], self.next[r as usize]);
        if p == NIL {
            self.head = n;
        } else {
            self.next[p as usize] = n;
        }
        if n == NIL {
            self.tail = p;
        } else {
            self.prev[n as usize] = p;
        }
    }

    /// Move cached row `r` to the tail (next to leave).
    fn move_to_tail(&mut self, r: u32) {
        self.unlink(r);
        self.prev[r as usize] = self.tail;
        self.next[r as usize] = NIL;
        if self.tail != NIL {
            self.next[self.tail as usize] = r;
        }
        self.tail = r;
        if self.head == NIL {
            self.head = r;
        }
    }

    fn push_front(&mut self, r: u32) {
        self.prev[r as usize] = NIL;
        self.next[r as usize] = self.head;
        if self.head != NIL {
            self.prev[self.head as usize] = r;
        }
        self.head = r;
        if self.tail == NIL {
            self.tail = r;
        }
    }

    /// Whether `r` was cached; either way it is now at the head.
    fn touch(&mut self, r: u32) -> bool {
        if self.cached[r as usize] {
            self.unlink(r);
            self.push_front(r);
            return true;
        }
        self.insert(r);
        false
    }

    fn insert(&mut self, r: u32) {
        if self.capacity == 0 {
            return;
        }
        if self.len == self.capacity {
            let t = self.tail;
            self.unlink(t);
            self.cached[t as usize] = false;
            self.len -= 1;
        }
        self.cached[r as usize] = true;
        self.push_front(r);
        self.len += 1;
    }
}

/// Simulate the cache of `capacity` rows over the trace, blocks of `rows_per_block` by
/// `layout` (row → position), admitting prefetches by `admit` (`counts`: per-row query
/// counts, for thresholds), on the blocks sampled at `rate` (1: every block, exact).
#[allow(clippy::too_many_arguments)]
pub fn simulate(
    layout: &[u32],
    rows_per_block: usize,
    trace: Queries<'_>,
    capacity: usize,
    admit: Admit,
    counts: Option<&[u32]>,
    rate: f64,
) -> Result<SimResult> {
    let n = layout.len();
    trace.check(n)?;
    ensure!(rows_per_block > 0, "blocks hold at least one row");
    ensure!(
        rate > 0.0 && rate <= 1.0,
        "sampling rate {rate} must be in (0, 1]"
    );
    if let Admit::Threshold(_) | Admit::ColdRow(_) = admit {
        ensure!(
            counts.is_some_and(|c| c.len() == n),
            "{admit:?} admission needs a query count for each of the table's {n} rows"
        );
    }
    let rpb = rows_per_block as u32;
    let mut at = vec![0u32; n];
    for (r, &p) in layout.iter().enumerate() {
        at[p as usize] = r as u32;
    }
    let cut = (rate * u64::MAX as f64) as u64;
    let sampled = |b: u32| rate >= 1.0 || mix(u64::from(b)) <= cut;
    let mut lru = Lru::new(n, ((capacity as f64 * rate).round() as usize).max(1));
    let mut s = SimResult::default();
    for &r in trace.rows {
        let r = r as u32;
        let b = layout[r as usize] / rpb;
        if !sampled(b) {
            continue;
        }
        s.accesses += 1.0;
        if lru.touch(r) {
            s.hits += 1.0;
            continue;
        }
        s.blocks_read += 1.0;
        if let Admit::ColdRow(t) = admit {
            if lru.cached[r as usize] && counts.is_some_and(|c| c[r as usize] <= t) {
                lru.move_to_tail(r);
            }
            continue;
        }
        if admit == Admit::Row {
            continue;
        }
        let first = b * rpb;
        let last = (first + rpb).min(n as u32);
        for p in first..last {
            let o = at[p as usize];
            if o == r || lru.cached[o as usize] {
                continue;
            }
            let take = match admit {
                Admit::Block => true,
                Admit::Threshold(t) => counts.is_some_and(|c| c[o as usize] > t),
                Admit::Row | Admit::ColdRow(_) => false,
            };
            if take {
                lru.insert(o);
                // Keep the row asked for at the head: prefetches go just behind it.
                lru.unlink(r);
                lru.push_front(r);
            }
        }
    }
    Ok(SimResult {
        accesses: s.accesses / rate,
        hits: s.hits / rate,
        blocks_read: s.blocks_read / rate,
    })
}

/// Simulate every admission of `admits` at every cache size of `capacities`, in parallel:
/// `out[a][c]`.
pub fn sweep(
    layout: &[u32],
    rows_per_block: usize,
    trace: Queries<'_>,
    capacities: &[usize],
    admits: &[Admit],
    counts: Option<&[u32]>,
    rate: f64,
) -> Result<Vec<Vec<SimResult>>> {
    let jobs: Vec<(usize, usize)> = (0..admits.len())
        .flat_map(|a| (0..capacities.len()).map(move |c| (a, c)))
        .collect();
    let res: Vec<SimResult> = jobs
        .par_iter()
        .map(|&(a, c)| {
            simulate(
                layout,
                rows_per_block,
                trace,
                capacities[c],
                admits[a],
                counts,
                rate,
            )
        })
        .collect::<Result<_>>()?;
    Ok(res
        .chunks(capacities.len())
        .map(<[SimResult]>::to_vec)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let lru = simulate(&layout, 8, t, 60, Admit::Row, None, 1.0).unwrap();
        let cold = simulate(&layout, 8, t, 60, Admit::ColdRow(0), Some(&counts), 1.0).unwrap();
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
        let same = simulate(&layout, 8, t, 60, Admit::ColdRow(3), Some(&all_hot), 1.0).unwrap();
        assert_eq!(same, lru);
        let e = simulate(&layout, 8, t, 60, Admit::ColdRow(3), None, 1.0).unwrap_err();
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
            let s = simulate(&layout, 8, t, cap, Admit::Row, None, 1.0).unwrap();
            let exact = crate::mrc::lru_curve(&u, &[cap as u64])[0];
            assert!(
                (s.hit_rate() - exact).abs() < 1e-12,
                "{cap}: {} vs {exact}",
                s.hit_rate()
            );
            assert!((s.blocks_read - (s.accesses - s.hits)).abs() < 1e-9);
            let all = simulate(&layout, 8, t, cap, Admit::Block, None, 1.0).unwrap();
            let none = simulate(
                &layout,
                8,
                t,
                cap,
                Admit::Threshold(u32::MAX),
                Some(&[0; 1000]),
                1.0,
            )
            .unwrap();
            assert_eq!(none, s, "a threshold nothing passes is row admission");
            assert!(all.accesses == s.accesses);
        }
    }
}
