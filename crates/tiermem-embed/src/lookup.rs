//! Ensemble lookups (thesis §5.2.1–5.2.3, Listing 5.1): many tables in one call, parallel
//! across tables and across chunks of bags within a table, each bag reduced in registers
//! (for the static widths) and written straight into its slice of a concatenated output.

use rayon::prelude::*;
use tiermem_core::process::in_kernel_pool;

use super::bags::Bags;
use super::codec::{with_codec, RowCodec};
use super::rows::RowFn;
use super::rows::{RowSource, Tally};
use super::table::Table;
use super::{with_width, DType};
use tiermem_core::arch::{isa, Isa};
use tiermem_core::{bail, ensure, Error, Result};

/// How a bag's rows combine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Sum (optionally weighted per sample).
    Sum,
    /// Mean (an empty bag gives zeros).
    Mean,
    /// No reduction: one output row per index (`torch.nn.functional.embedding`).
    None,
}

impl Mode {
    /// Every mode's name, as [`Mode::parse`] takes them.
    pub const NAMES: &'static [&'static str] = &["sum", "mean", "none"];

    /// Parse `sum`, `mean` or `none`.
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "sum" => Ok(Mode::Sum),
            "mean" => Ok(Mode::Mean),
            "none" => Ok(Mode::None),
            "max" => bail!("mode 'max' is not supported (supported: sum, mean, none)"),
            _ => bail!("unknown mode '{s}' (supported: sum, mean, none)"),
        }
    }
}

/// A row-major `f32` matrix that an ensemble call reads or writes: `row_stride` floats per
/// row, table `t` in columns `cols[t]..cols[t] + width_t`. Reducing modes use one row per
/// bag; [`Mode::None`] stacks the tables' rows, one per index, table after table.
#[derive(Debug)]
pub struct LookupOut<'a> {
    /// The matrix.
    pub data: &'a mut [f32],
    /// Floats per row.
    pub row_stride: usize,
    /// First column of each table.
    pub cols: &'a [usize],
}

/// Default software prefetch distance, in indices. Measured with `tiermem bench embedding`
/// on the development machine: 32 halves a width-64 lookup's time against 8 (the rows of 32
/// indices are in flight at once), and hides a cached table's dependent pointer-table load
/// (the row's address is known only once its entry arrives). Wide rows are bandwidth-bound
/// and insensitive to it.
pub const DEFAULT_PREFETCH: usize = 32;

/// Cache lines a lookup keeps in flight at most through software prefetch: the distance in
/// rows is capped at this over the lines a row spans. A width-256 float32 row spans 16
/// lines, so 32 rows ahead would ask for 512 lines at once, more than the core's fill
/// buffers and L2 queue hold; dropped and stalled prefetches made the default distance
/// slower than 4-8 rows there. `tiermem bench embedding --quick`, width 256, bags of 40,
/// against torch: 0.86x, 1.00x and 0.79x (uniform, zipf, production) at 32 rows, 1.32x,
/// 1.20x and 0.88x capped (one run each, back to back, load 2-3). Width 64 keeps 32.
pub const PREFETCH_LINES: usize = 128;

/// The prefetch distance in rows for `distance` asked and rows of `stride` bytes.
#[must_use]
pub fn prefetch_rows(distance: usize, stride: usize) -> usize {
    let lines = stride.div_ceil(64).max(1);
    distance.min((PREFETCH_LINES / lines).max(1))
}

/// Check an ensemble call's shapes; returns each table's first output row.
pub(crate) fn check_call(
    tables: &[&Table],
    bags: &[Bags<'_>],
    mode: Mode,
    len: usize,
    row_stride: usize,
    cols: &[usize],
) -> Result<Vec<usize>> {
    ensure!(!tables.is_empty(), "no tables given");
    ensure!(
        bags.len() == tables.len() && cols.len() == tables.len(),
        "{} tables, {} sets of bags and {} column offsets: they must match",
        tables.len(),
        bags.len(),
        cols.len()
    );
    let mut first_row = Vec::with_capacity(tables.len());
    let mut rows_needed = 0usize;
    for (t, (tab, b)) in tables.iter().zip(bags).enumerate() {
        let w = tab.featuresize();
        ensure!(
            cols[t].checked_add(w).is_some_and(|end| end <= row_stride),
            "table {t} (width {w}) at column {} does not fit rows of {row_stride} floats",
            cols[t]
        );
        if b.weights().is_some() && mode != Mode::Sum {
            bail!("per-sample weights need mode 'sum' (as torch.nn.EmbeddingBag requires)");
        }
        match mode {
            Mode::None => {
                first_row.push(rows_needed);
                rows_needed += b.values().len();
            }
            Mode::Sum | Mode::Mean => {
                ensure!(
                    b.batch() == bags[0].batch(),
                    "table {t} has {} bags but table 0 has {}: every table needs the same batch",
                    b.batch(),
                    bags[0].batch()
                );
                first_row.push(0);
                rows_needed = b.batch();
            }
        }
    }
    if mode != Mode::None {
        let mut spans: Vec<(usize, usize, usize)> = (0..tables.len())
            .map(|t| (cols[t], cols[t] + tables[t].featuresize(), t))
            .collect();
        spans.sort_unstable();
        for w in spans.windows(2) {
            ensure!(
                w[1].0 >= w[0].1,
                "tables {} and {} write overlapping output columns",
                w[0].2,
                w[1].2
            );
        }
    }
    let need = rows_needed.saturating_mul(row_stride);
    ensure!(
        len >= need,
        "the output holds {len} floats but {rows_needed} rows of {row_stride} are needed"
    );
    Ok(first_row)
}

/// Split `n` items into chunks for `tables` tables so every thread gets several.
pub(crate) fn chunk_size(n: usize, tables: usize) -> usize {
    let threads = tiermem_core::process::kernel_threads().max(1);
    (n * tables).div_ceil(threads * 16).clamp(32, 4096)
}

/// A pointer shared by parallel workers that each write their own disjoint part of it
/// (lookup outputs, gradient sinks, per-row optimizer state).
#[derive(Clone, Copy)]
pub(crate) struct SharedMut(pub(crate) *mut f32);
// SAFETY: workers write disjoint parts: output rows and columns (checked by `check_call`:
// disjoint column ranges, each bag/index row is one task's) or distinct rows' state.
unsafe impl Send for SharedMut {}
// SAFETY: as above.
unsafe impl Sync for SharedMut {}

/// One task: table `t`, bags (or indices, non-reducing) `first..last`.
struct Job<'a> {
    table: usize,
    rows: usize,
    width: usize,
    bags: Bags<'a>,
    mode: Mode,
    first: usize,
    last: usize,
    out: SharedMut,
    row_stride: usize,
    col: usize,
    out_row: usize,
    prefetch: usize,
    /// Padding row (skipped), or `u64::MAX`.
    pad: u64,
}

/// Look up an ensemble: for each table `t`, every bag of `bags[t]` reduced by `mode` into
/// `out`. Cached tables whose policy says so first make room if their cache is full, then
/// cache what they touch, or fill their cache on first use. `prefetch` is the software prefetch distance in indices (0: none). Returns the
/// tally of hits, misses and bytes.
pub fn lookup(
    tables: &[&Table],
    bags: &[Bags<'_>],
    mode: Mode,
    out: LookupOut<'_>,
    prefetch: usize,
) -> Result<Tally> {
    let first_row = check_call(tables, bags, mode, out.data.len(), out.row_stride, out.cols)?;
    // Full dynamic caches make room first, each under its own table's exclusive lock and
    // never on the rayon pool (a pool worker blocked on a table lock that a lookup in
    // flight holds shared would deadlock it: the lock order in `locks`). Several full
    // tables reclaim on scoped threads of their own: dropped rows' write-backs to the slow
    // device are the longest wait of a lookup. A full cache that holds every row has
    // nothing to make room for (no row can miss), and its rows carry no marks: a reclaim
    // would only drop rows that the next lookups miss.
    let full: Vec<&&Table> = tables
        .iter()
        .filter(|t| {
            t.cache().is_some_and(|c| {
                !c.staged() && c.policy.reclaims_when_full() && !c.holds_every_row() && c.isfull()
            })
        })
        .collect();
    match full.as_slice() {
        [] => {}
        [t] => {
            t.reclaim()?;
        }
        many => std::thread::scope(|s| {
            let hs: Vec<_> = many.iter().map(|t| s.spawn(|| t.reclaim())).collect();
            hs.into_iter().try_for_each(|h| {
                h.join()
                    .unwrap_or_else(|p| std::panic::resume_unwind(p))
                    .map(|_| ())
            })
        })?,
    }
    for t in tables {
        if let Some(c) = t.cache() {
            if !c.staged() && c.policy.fills_on_first_use() && !c.filled() {
                t.fill_cache(0)?;
            }
        }
    }
    let _locks = super::table::locks::for_lookup(tables)?;
    let staged = stage_all(tables, bags)?;
    let ptr = SharedMut(out.data.as_mut_ptr());
    let mut jobs = Vec::new();
    for (t, (tab, b)) in tables.iter().zip(bags).enumerate() {
        let n = if mode == Mode::None {
            b.values().len()
        } else {
            b.batch()
        };
        let step = chunk_size(n, tables.len());
        for first in (0..n).step_by(step) {
            jobs.push(Job {
                table: t,
                rows: tab.rows(),
                width: tab.featuresize(),
                bags: *b,
                mode,
                first,
                last: (first + step).min(n),
                out: ptr,
                row_stride: out.row_stride,
                col: out.cols[t],
                out_row: first_row[t],
                prefetch,
                pad: tab.padding_idx().map_or(u64::MAX, |p| p as u64),
            });
        }
    }
    let tallies: Vec<(usize, Tally)> = in_kernel_pool(|| {
        jobs.par_iter()
            .map(|j| {
                let tab = tables[j.table];
                tab.with_rows(
                    true,
                    Run {
                        job: j,
                        dtype: tab.dtype(),
                    },
                )
                .map(|t| (j.table, t))
            })
            .collect::<Result<_>>()
    })??;
    let mut per = vec![Tally::default(); tables.len()];
    for (t, x) in &tallies {
        per[*t].add(x);
    }
    for (t, s) in staged {
        // A staged table's kernel only hits: the staging saw the misses.
        per[t].hits = s.hits;
        per[t].misses = s.misses;
        per[t].cached += s.cached;
        per[t].home_read += s.home_read;
    }
    let mut total = Tally::default();
    for (tab, x) in tables.iter().zip(&per) {
        tab.record(x);
        total.add(x);
    }
    Ok(total)
}

/// Stage the rows of every staged table (exclusive lock held by the caller), each table
/// once with the indices of all its bags; every index is checked first. Returns, per
/// table staged, the first position it has in `tables` and the staging's tally.
pub(crate) fn stage_all(tables: &[&Table], bags: &[Bags<'_>]) -> Result<Vec<(usize, Tally)>> {
    let mut out: Vec<(usize, Tally)> = Vec::new();
    for (t, tab) in tables.iter().enumerate() {
        let Some(c) = tab.cache().filter(|c| c.staged()) else {
            continue;
        };
        if tables[..t].iter().any(|o| std::ptr::eq(*o, *tab)) {
            continue;
        }
        let mut rows = Vec::new();
        for (u, b) in bags.iter().enumerate() {
            if std::ptr::eq(tables[u], *tab) {
                super::bags::check_indices(u, b.values(), tab.rows())?;
                rows.extend(b.values().iter().map(|&v| v as u64));
            }
        }
        out.push((t, c.stage(&mut rows, super::cache::Room::All)?));
    }
    Ok(out)
}

struct Run<'a, 'b> {
    job: &'a Job<'b>,
    dtype: DType,
}

impl RowFn<Result<Tally>> for Run<'_, '_> {
    fn call<R: RowSource>(self, rows: &R) -> Result<Tally> {
        let j = self.job;
        let t =
            with_width!(j.width, W => with_codec!(self.dtype, E => dispatch::<E, R, W>(j, rows)))?;
        rows.charge(&t);
        Ok(t)
    }
}

super::isa_dispatch!(Result<Tally>, RowCodec);

/// The kernel: bags (or indices) `first..last` of one table.
///
/// # Safety
/// `j.out` must be valid for the rows and columns `check_call` accepted, written by no other
/// job; the table's shared lock must be held.
#[inline(always)]
unsafe fn body<E: RowCodec, R: RowSource, const W: usize>(j: &Job<'_>, src: &R) -> Result<Tally> {
    let mut t = Tally::default();
    let width = if W > 0 { W } else { j.width };
    let vals = j.bags.values();
    let weights = j.bags.weights();
    let rows = j.rows as u64;
    let (lo, hi) = match j.mode {
        Mode::None => (j.first, j.last),
        _ => (j.bags.bag(j.first).start, j.bags.bag(j.last - 1).end),
    };
    let pd = prefetch_rows(j.prefetch, src.stride());
    let check = |p: usize| -> Result<usize> {
        let v = vals[p];
        if (v as u64) < rows {
            Ok(v as usize)
        } else {
            Err(Error::IndexOutOfRange {
                table: j.table,
                position: p,
                value: v,
                rows: j.rows,
            })
        }
    };
    let ahead = |p: usize| {
        if pd > 0 {
            if let Some(&v) = vals.get(p + pd).filter(|_| p + pd < hi) {
                if (v as u64) < rows {
                    src.prefetch(v as usize);
                }
            }
            if let Some(&v) = vals.get(p + 4 * pd).filter(|_| p + 4 * pd < hi) {
                if (v as u64) < rows {
                    src.prefetch_far(v as usize);
                }
            }
        }
    };
    for p in lo..lo + pd.min(hi - lo) {
        if let Ok(v) = check(p) {
            src.prefetch_far(v);
            src.prefetch(v);
        }
    }
    let out_at = |row: usize| {
        // SAFETY: check_call verified the output holds this row and column span; only
        // this job writes it.
        unsafe {
            std::slice::from_raw_parts_mut(
                j.out.0.add((j.out_row + row) * j.row_stride + j.col),
                width,
            )
        }
    };
    if j.mode == Mode::None {
        for p in lo..hi {
            ahead(p);
            let v = check(p)?;
            if v as u64 == j.pad {
                out_at(p).fill(0.0);
                continue;
            }
            let row = src.read(v, &mut t);
            // SAFETY: the row source gives a stored row of `width` values under the shared lock.
            unsafe { E::load_row(out_at(p), row) };
        }
        return Ok(t);
    }
    let mut buf = [0f32; 256];
    for b in j.first..j.last {
        let range = j.bags.bag(b);
        let mut n = range.len();
        let out = out_at(b);
        let acc: &mut [f32] = if W > 0 { &mut buf[..W] } else { &mut *out };
        acc.fill(0.0);
        for p in range {
            ahead(p);
            let v = check(p)?;
            if v as u64 == j.pad {
                n -= 1;
                continue;
            }
            let row = src.read(v, &mut t);
            // SAFETY: as above.
            unsafe {
                match weights {
                    Some(w) => E::add_row(acc, row, w[p]),
                    None => E::sum_row(acc, row),
                }
            }
        }
        if j.mode == Mode::Mean && n > 0 {
            let s = 1.0 / n as f32;
            for a in acc.iter_mut() {
                *a *= s;
            }
        }
        if W > 0 {
            out.copy_from_slice(&buf[..W]);
        }
    }
    Ok(t)
}

/// The gather roofline: read every row an ensemble lookup would read, in the same order,
/// with the same split into parallel chunks of bags, the same instruction sets and the given
/// prefetch distance, but with no arithmetic and no output (rows are folded with XOR so the
/// loads cannot be optimised away). Returns the fold.
pub fn gather(tables: &[&Table], bags: &[Bags<'_>], prefetch: usize) -> Result<u64> {
    ensure!(
        tables.len() == bags.len(),
        "{} tables but {} sets of bags",
        tables.len(),
        bags.len()
    );
    let _locks = super::table::locks::for_lookup(tables)?;
    stage_all(tables, bags)?;
    let mut jobs = Vec::new();
    for (t, b) in bags.iter().enumerate() {
        super::bags::check_indices(t, b.values(), tables[t].rows())?;
        let step = chunk_size(b.batch(), tables.len());
        for first in (0..b.batch()).step_by(step) {
            let last = (first + step).min(b.batch());
            jobs.push((t, b.bag(first).start, b.bag(last - 1).end));
        }
    }
    in_kernel_pool(|| {
        jobs.par_iter()
            .map(|&(t, lo, hi)| {
                let vals = bags[t].values();
                tables[t].with_rows(
                    false,
                    Gather {
                        vals,
                        lo,
                        hi,
                        prefetch,
                    },
                )
            })
            .reduce(|| 0, |a, b| a ^ b)
    })
}

struct Gather<'a> {
    vals: &'a [i64],
    lo: usize,
    hi: usize,
    prefetch: usize,
}

impl RowFn<u64> for Gather<'_> {
    fn call<R: RowSource>(self, src: &R) -> u64 {
        match isa() {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: AVX-512F was detected at run time; indices were checked by `gather`.
            Isa::Avx512 => unsafe { gather_avx512(&self, src) },
            // SAFETY: indices were checked by `gather`.
            _ => unsafe { gather_body(&self, src) },
        }
    }
}

/// [`gather_body`] with explicit 64-byte loads.
///
/// # Safety
/// As [`gather_body`]; the CPU has AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn gather_avx512<R: RowSource>(g: &Gather<'_>, src: &R) -> u64 {
    use std::arch::x86_64::{
        _mm512_loadu_si512, _mm512_reduce_add_epi64, _mm512_setzero_si512, _mm512_xor_si512,
    };
    let lines = src.stride() / 64;
    let mut t = Tally::default();
    let mut acc = _mm512_setzero_si512();
    let mut rest = 0u64;
    for p in g.lo..g.hi {
        if g.prefetch > 0 && p + g.prefetch < g.hi {
            src.prefetch(g.vals[p + g.prefetch] as usize);
        }
        let row = src.read(g.vals[p] as usize, &mut t);
        for l in 0..lines {
            // SAFETY: the row has `stride` readable bytes; loadu has no alignment needs.
            acc = _mm512_xor_si512(acc, unsafe { _mm512_loadu_si512(row.add(l * 64).cast()) });
        }
        for k in (lines * 64..src.stride()).step_by(4) {
            // SAFETY: as above; rows are whole multiples of 4 bytes.
            rest ^= u64::from(unsafe { row.add(k).cast::<u32>().read_unaligned() });
        }
    }
    _mm512_reduce_add_epi64(acc) as u64 ^ rest
}

/// # Safety
/// Every index in `g.vals[g.lo..g.hi]` is a row of the table; its shared lock is held.
#[inline(always)]
unsafe fn gather_body<R: RowSource>(g: &Gather<'_>, src: &R) -> u64 {
    let words = src.stride() / 8;
    let lines = words / 8;
    let mut t = Tally::default();
    let mut acc = [0u64; 8];
    for p in g.lo..g.hi {
        if g.prefetch > 0 && p + g.prefetch < g.hi {
            src.prefetch(g.vals[p + g.prefetch] as usize);
        }
        let row = src.read(g.vals[p] as usize, &mut t).cast::<u64>();
        for l in 0..lines {
            for (q, a) in acc.iter_mut().enumerate() {
                // SAFETY: the row has `stride` readable bytes; read_unaligned tolerates
                // its 4-byte alignment.
                *a ^= unsafe { row.add(l * 8 + q).read_unaligned() };
            }
        }
        for k in lines * 8..words {
            // SAFETY: as above.
            acc[0] ^= unsafe { row.add(k).read_unaligned() };
        }
    }
    acc.iter().fold(0, |a, b| a ^ b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefetch_distance_caps_the_lines_in_flight() {
        // float32 rows of width 16, 64 and 256: 1, 4 and 16 lines.
        assert_eq!(prefetch_rows(DEFAULT_PREFETCH, 64), 32);
        assert_eq!(prefetch_rows(DEFAULT_PREFETCH, 256), 32);
        assert_eq!(prefetch_rows(DEFAULT_PREFETCH, 1024), 8);
        assert_eq!(prefetch_rows(DEFAULT_PREFETCH, 1 << 20), 1);
        assert_eq!(prefetch_rows(0, 1024), 0);
        assert_eq!(prefetch_rows(4, 1024), 4);
    }
}
