//! Layouts: which rows share a block of a table file. Bandana §4.2.2 places rows that the
//! same queries use in the same block with SHP (Kabiljo et al., VLDB'17), a balanced
//! recursive bisection of the query hypergraph that minimises *fan-out*: the blocks a query
//! has to read (eq. 3). This module has that partitioner ([`shp`]) and the measure
//! ([`fanout`]); semantic (K-means) layouts and the original order are the comparisons.
//!
//! A query trace is given as `offsets` (query starts, the last entry the number of lookups)
//! and `rows`, the same form as `tiermem.traces`. A layout is a permutation, row →
//! position; position `p` is slot `p % rows_per_block` of block `p / rows_per_block`.
//!
//! SHP here: rows no query uses go after all others (they would only dilute blocks). The
//! rest start in trace order of first use (or, given a start layout, every row starts in
//! its order and its blocks join the queries: see [`shp`]); each level splits every part
//! of more than one block's worth of rows into a left part of whole blocks (half of its
//! blocks) and the rest, then runs `iters` rounds of moves: every row's gain from switching
//! sides is computed from its queries' probabilistic fan-out (`1 - (1 - p)^k` for `k` of a
//! query's rows on a side, `p` = 1/2: a smooth stand-in for "is the side touched", SHP's
//! choice), and the best-gaining rows of the two sides swap in pairs while a pair's total
//! gain is positive, so parts stay balanced. Parts of one level are independent; all of
//! them share one pass over the trace per round.

use rayon::prelude::*;
use tiermem_core::{ensure, Result};

/// A trace as query offsets and row ids.
#[derive(Debug, Clone, Copy)]
pub struct Queries<'a> {
    /// Query starts; the last entry is `rows.len()`.
    pub offsets: &'a [i64],
    /// Row ids.
    pub rows: &'a [i64],
}

impl Queries<'_> {
    /// Check the shape against a table of `n` rows; the error names the first bad entry.
    pub fn check(&self, n: usize) -> Result<()> {
        ensure!(
            !self.offsets.is_empty() && self.offsets[0] == 0,
            "trace offsets must start with 0"
        );
        ensure!(
            *self.offsets.last().unwrap_or(&0) == self.rows.len() as i64,
            "the last trace offset is {} but the trace has {} row ids",
            self.offsets.last().unwrap_or(&0),
            self.rows.len()
        );
        if let Some(q) = self.offsets.windows(2).position(|w| w[1] < w[0]) {
            tiermem_core::bail!("trace offsets decrease at query {q}");
        }
        if let Some(k) = self
            .rows
            .iter()
            .position(|&r| r < 0 || r as u64 >= n as u64)
        {
            tiermem_core::bail!(
                "trace row id {} at position {k} is outside the table's {n} rows",
                self.rows[k]
            );
        }
        Ok(())
    }

    fn queries(&self) -> usize {
        self.offsets.len() - 1
    }

    fn query(&self, q: usize) -> &[i64] {
        &self.rows[self.offsets[q] as usize..self.offsets[q + 1] as usize]
    }
}

/// Average blocks per query (eq. 3) of `layout` (row → position) with `rows_per_block` rows
/// per block, over the trace's non-empty queries.
pub fn fanout(layout: &[u32], rows_per_block: usize, trace: Queries<'_>) -> Result<f64> {
    tiermem_core::process::in_kernel_pool(|| fanout_on_pool(layout, rows_per_block, trace))?
}

fn fanout_on_pool(layout: &[u32], rows_per_block: usize, trace: Queries<'_>) -> Result<f64> {
    trace.check(layout.len())?;
    ensure!(rows_per_block > 0, "blocks hold at least one row");
    let (sum, n) = (0..trace.queries())
        .into_par_iter()
        .map(|q| {
            let mut b: Vec<u32> = trace
                .query(q)
                .iter()
                .map(|&r| layout[r as usize] / rows_per_block as u32)
                .collect();
            b.sort_unstable();
            b.dedup();
            (b.len() as u64, u64::from(!b.is_empty()))
        })
        .reduce(|| (0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
    Ok(if n == 0 { 0.0 } else { sum as f64 / n as f64 })
}

/// Per row, how many queries of the trace use it (the counts threshold admission reads).
pub fn query_counts(n: usize, trace: Queries<'_>) -> Result<Vec<u32>> {
    trace.check(n)?;
    let mut counts = vec![0u32; n];
    let mut seen: Vec<u32> = vec![u32::MAX; n];
    for q in 0..trace.queries() {
        for &r in trace.query(q) {
            let r = r as usize;
            if seen[r] != q as u32 {
                seen[r] = q as u32;
                counts[r] = counts[r].saturating_add(1);
            }
        }
    }
    Ok(counts)
}

/// What stops `layout` (row → position) from being a permutation of `n` rows: the first
/// row out of place, or the length; `None` when it is one. Callers wrap the message in
/// their own error (a bad argument, a damaged file).
#[must_use]
pub fn permutation_problem(layout: &[u32], n: usize) -> Option<String> {
    if layout.len() != n {
        return Some(format!(
            "a layout of {} rows for a table of {n}",
            layout.len()
        ));
    }
    let mut seen = vec![false; n];
    for (row, &p) in layout.iter().enumerate() {
        match seen.get_mut(p as usize) {
            Some(s) if !*s => *s = true,
            Some(_) => {
                return Some(format!(
                    "the layout is not a permutation: row {row} at position {p}, which another \
                     row holds"
                ))
            }
            None => {
                return Some(format!(
                    "the layout is not a permutation: row {row} at position {p}, outside the \
                     table's {n} rows"
                ))
            }
        }
    }
    None
}

/// The query hypergraph over the rows the trace uses: vertices are those rows, renumbered.
struct Graph {
    /// Query → its distinct vertices (CSR).
    qoff: Vec<usize>,
    qpins: Vec<u32>,
    /// Vertex → the pins (indices into `qpins`) that are it (CSR).
    voff: Vec<usize>,
    vpins: Vec<u32>,
    /// Vertex → row.
    row_of: Vec<u32>,
}

/// With `start` (a layout, row → position), every row is a vertex, numbered in the
/// layout's order, and each of the layout's blocks of `rows_per_block` rows is one more
/// query; without, the rows the trace uses, in order of first use.
fn graph(n: usize, rows_per_block: usize, trace: Queries<'_>, start: Option<&[u32]>) -> Graph {
    let mut vid = vec![u32::MAX; n];
    let mut row_of = Vec::new();
    if let Some(s) = start {
        row_of = vec![0u32; n];
        for (r, &p) in s.iter().enumerate() {
            row_of[p as usize] = r as u32;
        }
        for (v, &r) in row_of.iter().enumerate() {
            vid[r as usize] = v as u32;
        }
    }
    let mut qoff = vec![0usize];
    let mut qpins: Vec<u32> = Vec::with_capacity(trace.rows.len());
    let mut stamp = vec![u32::MAX; n];
    for q in 0..trace.queries() {
        for &r in trace.query(q) {
            let r = r as usize;
            if stamp[r] == q as u32 {
                continue;
            }
            stamp[r] = q as u32;
            if vid[r] == u32::MAX {
                vid[r] = row_of.len() as u32;
                row_of.push(r as u32);
            }
            qpins.push(vid[r]);
        }
        qoff.push(qpins.len());
    }
    if start.is_some() {
        for first in (0..n).step_by(rows_per_block) {
            qpins.extend(first as u32..(first + rows_per_block).min(n) as u32);
            qoff.push(qpins.len());
        }
    }
    let m = row_of.len();
    let mut deg = vec![0usize; m + 1];
    for &v in &qpins {
        deg[v as usize + 1] += 1;
    }
    for i in 0..m {
        deg[i + 1] += deg[i];
    }
    let voff = deg.clone();
    let mut fill = deg;
    let mut vpins = vec![0u32; qpins.len()];
    for (pin, &v) in qpins.iter().enumerate() {
        vpins[fill[v as usize]] = pin as u32;
        fill[v as usize] += 1;
    }
    Graph {
        qoff,
        qpins,
        voff,
        vpins,
        row_of,
    }
}

/// A fair coin for the pair `(a, c)` in round `round` (deterministic: layouts repeat).
fn coin(a: u32, c: u32, round: usize) -> bool {
    let mut x =
        (u64::from(a) << 32 | u64::from(c)) ^ (round as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x & 1 == 0
}

/// Probabilistic fan-out of `k` rows on one side.
fn pf(k: u32) -> f64 {
    if k >= 64 {
        1.0
    } else {
        1.0 - 1.0 / (1u64 << k) as f64
    }
}

/// SHP's layout of a table of `n` rows in blocks of `rows_per_block` from the trace, with
/// `iters` rounds of moves per level (Bandana ran 16). Returns row → position.
///
/// `start`, a layout of the same rows (row → position), is where the bisection begins,
/// every row taking part in that layout's order, and each of its blocks counts as one
/// more query: a row the trace uses often goes where its queries pull it, one the trace
/// uses rarely or never stays with its neighbours there. Given a semantic layout (rows
/// with similar values together), this generalises beyond the training trace: on
/// `tiermem bench ssd`'s query trace the held-out fan-out fell from 25.3 (the trace
/// alone, rows in order of first use, rows it never uses at the end) to 19.5 from
/// the recursive K-means layout.
pub fn shp(
    n: usize,
    rows_per_block: usize,
    trace: Queries<'_>,
    iters: usize,
    start: Option<&[u32]>,
) -> Result<Vec<u32>> {
    tiermem_core::process::in_kernel_pool(|| shp_on_pool(n, rows_per_block, trace, iters, start))?
}

fn shp_on_pool(
    n: usize,
    rows_per_block: usize,
    trace: Queries<'_>,
    iters: usize,
    start: Option<&[u32]>,
) -> Result<Vec<u32>> {
    trace.check(n)?;
    ensure!(rows_per_block > 0, "blocks hold at least one row");
    ensure!(
        n <= u32::MAX as usize,
        "{n} rows: layouts hold at most 2^32 - 1"
    );
    if let Some(p) = start.and_then(|s| permutation_problem(s, n)) {
        tiermem_core::bail!("SHP's start layout: {p}");
    }
    let g = graph(n, rows_per_block, trace, start);
    let m = g.row_of.len();
    let b = rows_per_block;
    // `order` holds vertices; parts are contiguous ranges of it.
    let mut order: Vec<u32> = (0..m as u32).collect();
    let mut parts: Vec<(usize, usize)> = vec![(0, m)];
    let mut part = vec![0u32; m];
    let mut side = vec![0u8; m];
    let mut pin_gain = vec![0f32; g.qpins.len()];
    loop {
        // Split every part holding more than one block: left = half its blocks, whole.
        let mut split: Vec<(usize, usize, usize)> = Vec::new(); // (start, mid, end)
        for &(s, e) in &parts {
            let blocks = (e - s).div_ceil(b);
            if blocks > 1 {
                split.push((s, s + blocks / 2 * b, e));
            }
        }
        if split.is_empty() {
            break;
        }
        for (k, &(s, mid, e)) in split.iter().enumerate() {
            for (i, &v) in order[s..e].iter().enumerate() {
                part[v as usize] = k as u32;
                side[v as usize] = u8::from(s + i >= mid);
            }
        }
        for &(s, _, e) in &split {
            let _ = (s, e);
        }
        // Rows of parts not being split take no part in this level.
        let active: Vec<bool> = {
            let mut a = vec![false; m];
            for &(s, _, e) in &split {
                for &v in &order[s..e] {
                    a[v as usize] = true;
                }
            }
            a
        };
        for round in 0..iters {
            // Per pin: the gain of moving its row to the other side, as far as its query
            // sees it (its rows of the same part on each side). Queries own disjoint runs
            // of pins, so they run in parallel.
            let mut runs: Vec<(usize, &mut [f32])> = Vec::with_capacity(g.qoff.len() - 1);
            let mut rest = pin_gain.as_mut_slice();
            for q in 0..g.qoff.len() - 1 {
                let (head, tail) = rest.split_at_mut(g.qoff[q + 1] - g.qoff[q]);
                runs.push((q, head));
                rest = tail;
            }
            runs.into_par_iter()
                .for_each_init(Vec::new, |keys: &mut Vec<u32>, (q, out)| {
                    let pins = &g.qpins[g.qoff[q]..g.qoff[q + 1]];
                    keys.clear();
                    keys.extend(
                        pins.iter()
                            .filter(|&&v| active[v as usize])
                            .map(|&v| part[v as usize] << 1 | u32::from(side[v as usize])),
                    );
                    keys.sort_unstable();
                    for (o, &v) in out.iter_mut().zip(pins) {
                        if !active[v as usize] {
                            *o = 0.0;
                            continue;
                        }
                        let k = part[v as usize] << 1;
                        let lo = keys.partition_point(|&x| x < k);
                        let mid = keys.partition_point(|&x| x <= k);
                        let hi = keys.partition_point(|&x| x <= k | 1);
                        let (l, r) = ((mid - lo) as u32, (hi - mid) as u32);
                        let (from, to) = if side[v as usize] == 0 {
                            (l, r)
                        } else {
                            (r, l)
                        };
                        *o = (pf(from) + pf(to) - pf(from - 1) - pf(to + 1)) as f32;
                    }
                });
            let gain: Vec<f64> = (0..m)
                .into_par_iter()
                .map(|v| {
                    g.vpins[g.voff[v]..g.voff[v + 1]]
                        .iter()
                        .map(|&pin| f64::from(pin_gain[pin as usize]))
                        .sum()
                })
                .collect();
            let mut moved = false;
            for &(s, mid, e) in &split {
                let mut left: Vec<u32> = order[s..e]
                    .iter()
                    .copied()
                    .filter(|&v| side[v as usize] == 0)
                    .collect();
                let mut right: Vec<u32> = order[s..e]
                    .iter()
                    .copied()
                    .filter(|&v| side[v as usize] == 1)
                    .collect();
                debug_assert_eq!(left.len(), mid - s);
                let by_gain = |a: &u32, c: &u32| gain[*c as usize].total_cmp(&gain[*a as usize]);
                left.sort_by(by_gain);
                right.sort_by(by_gain);
                for (&a, &c) in left.iter().zip(&right) {
                    if gain[a as usize] + gain[c as usize] <= 1e-12 {
                        break;
                    }
                    moved = true;
                    // Each gaining pair swaps with probability 1/2: rows of one query split
                    // across the sides all gain from moving, and moving all of them at once
                    // would only swap the split (SHP's damping).
                    if coin(a, c, round) {
                        side[a as usize] = 1;
                        side[c as usize] = 0;
                    }
                }
            }
            if !moved {
                break;
            }
        }
        // Lay each split part out as its left rows then its right rows.
        let mut next: Vec<(usize, usize)> = Vec::new();
        let mut sp = split.iter().peekable();
        for &(s, e) in &parts {
            match sp.peek() {
                Some(&&(ss, mid, ee)) if ss == s && ee == e => {
                    sp.next();
                    let (l, r): (Vec<u32>, Vec<u32>) =
                        order[s..e].iter().partition(|&&v| side[v as usize] == 0);
                    order[s..mid].copy_from_slice(&l);
                    order[mid..e].copy_from_slice(&r);
                    next.push((s, mid));
                    next.push((mid, e));
                }
                _ => next.push((s, e)),
            }
        }
        parts = next;
    }
    let mut layout = vec![u32::MAX; n];
    for (p, &v) in order.iter().enumerate() {
        layout[g.row_of[v as usize] as usize] = p as u32;
    }
    for (p, slot) in (m as u32..).zip(layout.iter_mut().filter(|s| **s == u32::MAX)) {
        *slot = p;
    }
    Ok(layout)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Queries that each use one of `groups` disjoint groups of `b` rows, the groups'
    /// rows scattered over the table: SHP must find the groups (fan-out 1).
    #[test]
    fn shp_recovers_planted_groups() {
        let (b, groups) = (8usize, 64usize);
        let n = b * groups + 100; // 100 rows no query uses
        let scatter = |r: usize| (r * 7919) % n;
        let (offsets, rows) = planted(b, 0..groups, 4000, scatter);
        let t = Queries {
            offsets: &offsets,
            rows: &rows,
        };
        let original: Vec<u32> = (0..n as u32).collect();
        let before = fanout(&original, b, t).unwrap();
        let layout = shp(n, b, t, 16, None).unwrap();
        let mut sorted = layout.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, original, "a layout is a permutation");
        let after = fanout(&layout, b, t).unwrap();
        assert!(before > 2.5, "{before}");
        assert!(after < 1.1, "SHP fan-out {after} (original order {before})");
    }

    /// `count` queries of 4 rows each from one of the planted groups `used` (group `g` is
    /// rows `g * b..(g + 1) * b`, placed in the table by `scatter`).
    fn planted(
        b: usize,
        used: std::ops::Range<usize>,
        count: usize,
        scatter: impl Fn(usize) -> usize,
    ) -> (Vec<i64>, Vec<i64>) {
        let mut offsets = vec![0i64];
        let mut rows = Vec::new();
        let mut x = 99u64;
        for _ in 0..count {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let gr = used.start + (x >> 33) as usize % used.len();
            for k in 0..4 {
                rows.push(scatter(gr * b + ((x >> (k * 3)) as usize % b)) as i64);
            }
            offsets.push(rows.len() as i64);
        }
        (offsets, rows)
    }

    /// From a start layout that holds the groups together, the groups the trace never
    /// uses stay together (a held-out trace over them reads one block per query), and the
    /// ones it uses stay found; from a start layout that scatters them, the trace still
    /// finds the groups it uses.
    #[test]
    fn shp_from_a_start_layout_keeps_what_the_trace_does_not_see() {
        let (b, groups) = (8usize, 64usize);
        let n = b * groups;
        let scatter = |r: usize| (r * 7919) % n;
        let together: Vec<u32> = {
            let mut l = vec![0u32; n];
            for r in 0..n {
                l[scatter(r)] = r as u32;
            }
            l
        };
        let (off, rows) = planted(b, 0..32, 4000, scatter);
        let (hoff, hrows) = planted(b, 32..64, 2000, scatter);
        let (train, held) = (
            Queries {
                offsets: &off,
                rows: &rows,
            },
            Queries {
                offsets: &hoff,
                rows: &hrows,
            },
        );
        let plain = shp(n, b, train, 16, None).unwrap();
        let seeded = shp(n, b, train, 16, Some(&together)).unwrap();
        assert!(permutation_problem(&seeded, n).is_none());
        let (plain_held, seeded_held) = (
            fanout(&plain, b, held).unwrap(),
            fanout(&seeded, b, held).unwrap(),
        );
        assert!(plain_held > 2.5, "without a start: {plain_held}");
        assert!(seeded_held < 1.1, "from the start layout: {seeded_held}");
        assert!(fanout(&seeded, b, train).unwrap() < 1.1);
        let scattered: Vec<u32> = (0..n as u32).collect();
        let from_scattered = shp(n, b, train, 16, Some(&scattered)).unwrap();
        let f = fanout(&from_scattered, b, train).unwrap();
        assert!(f < 1.1, "from a scattered start, on the trace: {f}");
    }

    #[test]
    fn bad_traces_are_named() {
        let e = fanout(
            &[0, 1],
            1,
            Queries {
                offsets: &[0, 2],
                rows: &[0, 5],
            },
        )
        .unwrap_err();
        assert!(e.to_string().contains("row id 5 at position 1"), "{e}");
        let e = shp(
            2,
            1,
            Queries {
                offsets: &[0, 3],
                rows: &[0, 1],
            },
            1,
            None,
        )
        .unwrap_err();
        assert!(e.to_string().contains("last trace offset is 3"), "{e}");
        let t = Queries {
            offsets: &[0, 2],
            rows: &[0, 1],
        };
        let e = shp(3, 1, t, 1, Some(&[0, 2, 2])).unwrap_err();
        assert!(
            e.to_string().contains("row 2 at position 2, which another"),
            "{e}"
        );
        let e = shp(3, 1, t, 1, Some(&[0, 1])).unwrap_err();
        assert!(
            e.to_string()
                .contains("a layout of 2 rows for a table of 3"),
            "{e}"
        );
        let e = query_counts(
            2,
            Queries {
                offsets: &[1, 2],
                rows: &[0, 1],
            },
        )
        .unwrap_err();
        assert!(e.to_string().contains("start with 0"), "{e}");
    }
}
