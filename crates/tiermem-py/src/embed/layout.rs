//! Layouts, hit-rate curves and miniature caches of `tiermem-embed` (`layout`, `mrc`,
//! `minicache`) for Python: traces come in as int64 `offsets` and `rows` buffers, layouts
//! go out into uint32 buffers, with the GIL released.

use pyo3::prelude::*;
use pyo3::types::PyDict;
use tiermem_embed::cache::Admission;
use tiermem_embed::layout::{self, Queries};
use tiermem_embed::minicache::{self, Model, Simulated};
use tiermem_embed::mrc;

use crate::buffer::{view, View};
use crate::error::{run, to_py};

fn trace_views(
    offsets: &Bound<'_, PyAny>,
    rows: &Bound<'_, PyAny>,
) -> PyResult<(View<i64>, View<i64>)> {
    Ok((
        view::<i64>(offsets, "offsets (int64)", false)?,
        view::<i64>(rows, "rows (int64)", false)?,
    ))
}

/// SHP's layout (row → position) of the table `out` covers (uint32, one per row), the
/// bisection starting from the layout `start` (uint32) when given.
#[pyfunction]
#[pyo3(signature = (out, rows_per_block, offsets, rows, iters, start=None))]
pub fn layout_shp(
    py: Python<'_>,
    out: &Bound<'_, PyAny>,
    rows_per_block: usize,
    offsets: &Bound<'_, PyAny>,
    rows: &Bound<'_, PyAny>,
    iters: usize,
    start: Option<&Bound<'_, PyAny>>,
) -> PyResult<()> {
    let o = view::<u32>(out, "out (uint32)", true)?;
    let (off, r) = trace_views(offsets, rows)?;
    let st = start
        .map(|s| view::<u32>(s, "start (uint32)", false))
        .transpose()?;
    run(py, || {
        // SAFETY: the views keep their buffers exported for the call; `out` is written only
        // here, the others only read.
        let (o, off, r) = unsafe { (o.slice_mut(), off.slice(), r.slice()) };
        // SAFETY: as above; read only.
        let st = st.as_ref().map(|s| unsafe { s.slice() });
        let q = Queries {
            offsets: off,
            rows: r,
        };
        o.copy_from_slice(&layout::shp(o.len(), rows_per_block, q, iters, st)?);
        Ok(())
    })
}

/// Average blocks per query of `layout` (uint32) on the trace.
#[pyfunction]
pub fn layout_fanout(
    py: Python<'_>,
    layout: &Bound<'_, PyAny>,
    rows_per_block: usize,
    offsets: &Bound<'_, PyAny>,
    rows: &Bound<'_, PyAny>,
) -> PyResult<f64> {
    let l = view::<u32>(layout, "layout (uint32)", false)?;
    let (off, r) = trace_views(offsets, rows)?;
    run(py, || {
        // SAFETY: the views keep their buffers exported for the call; only read.
        let (l, off, r) = unsafe { (l.slice(), off.slice(), r.slice()) };
        layout::fanout(
            l,
            rows_per_block,
            Queries {
                offsets: off,
                rows: r,
            },
        )
    })
}

/// Per row, the queries of the trace that use it, into `out` (uint32, one per row).
#[pyfunction]
pub fn query_counts_into(
    py: Python<'_>,
    out: &Bound<'_, PyAny>,
    offsets: &Bound<'_, PyAny>,
    rows: &Bound<'_, PyAny>,
) -> PyResult<()> {
    let o = view::<u32>(out, "out (uint32)", true)?;
    let (off, r) = trace_views(offsets, rows)?;
    run(py, || {
        // SAFETY: as in `layout_shp`.
        let (o, off, r) = unsafe { (o.slice_mut(), off.slice(), r.slice()) };
        let c = layout::query_counts(
            o.len(),
            Queries {
                offsets: off,
                rows: r,
            },
        )?;
        o.copy_from_slice(&c);
        Ok(())
    })
}

/// How a miniature cache runs, as Python hands it over: a dict of these keys.
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
pub struct SimModel<'py> {
    /// Per-row query counts of the layout's training trace (uint32), for thresholds.
    counts: Option<Bound<'py, PyAny>>,
    /// Share of blocks sampled.
    rate: f64,
    /// Bytes per row: the table cache's second chance; None: Bandana's LRU.
    row_bytes: Option<usize>,
    /// Queries per lookup call; None: each access alone.
    batch: Option<usize>,
    /// Slots a reclaim frees at least.
    slack_rows: usize,
}

/// Miniature caches: for each admission of `admits` (`row`, `row:T`, `block`,
/// `threshold:T`, `tinylfu`, ...) and cache size (rows), the simulated accesses, hits and
/// blocks read of the trace `(offsets, rows)`, run as `model` says (`tiermem.admission`
/// builds it: counts, rate, row_bytes, batch, slack_rows).
#[pyfunction]
pub fn minicache_sweep<'py>(
    py: Python<'py>,
    layout: &Bound<'_, PyAny>,
    rows_per_block: usize,
    trace: (Bound<'_, PyAny>, Bound<'_, PyAny>),
    capacities: Vec<usize>,
    admits: Vec<String>,
    model: SimModel<'_>,
) -> PyResult<Vec<Vec<Bound<'py, PyDict>>>> {
    let (offsets, rows) = (&trace.0, &trace.1);
    let SimModel {
        counts,
        rate,
        row_bytes,
        batch,
        slack_rows,
    } = model;
    let counts = counts.as_ref();
    let model = Model {
        cache: row_bytes.map_or(Simulated::Lru, |row_bytes| Simulated::Clock {
            row_bytes,
            slack_rows,
        }),
        rate,
        batch,
    };
    for a in &admits {
        Admission::parse(a).map_err(to_py)?;
    }
    let l = view::<u32>(layout, "layout (uint32)", false)?;
    let (off, r) = trace_views(offsets, rows)?;
    let c = counts
        .map(|c| view::<u32>(c, "counts (uint32)", false))
        .transpose()?;
    let res = run(py, || {
        // SAFETY: the views keep their buffers exported for the call; only read.
        let (l, off, r) = unsafe { (l.slice(), off.slice(), r.slice()) };
        // SAFETY: as above.
        let c = c.as_ref().map(|c| unsafe { c.slice() });
        let q = Queries {
            offsets: off,
            rows: r,
        };
        minicache::sweep(l, rows_per_block, q, &capacities, &admits, c, &model)
    })?;
    res.into_iter()
        .map(|per| per.into_iter().map(|s| sim_dict(py, &s)).collect())
        .collect()
}

/// A memory-backed cache as Python hands it over: a dict of these keys.
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
pub struct SimTable {
    /// Rows of the table.
    rows: usize,
    /// Rows the cache holds.
    capacity: usize,
    /// Bytes per row.
    row_bytes: usize,
    /// Slots a reclaim frees at least.
    slack_rows: usize,
    /// Cache policy (`dynamic`, `admit`).
    policy: String,
    /// Admission; None: the policy's.
    admission: Option<String>,
}

/// Miniature caches of a memory-backed table that caches in its lookups (`table`: rows,
/// capacity, row_bytes, slack_rows, policy, admission): the simulated accesses, hits, rows
/// read from the home (`blocks_read`) and rows inserted, for the trace `(offsets, rows)` in
/// lookup calls of `batch` queries, on rows sampled at `rate`.
#[pyfunction]
#[pyo3(signature = (trace, table, rate, batch=None))]
pub fn minicache_lookups<'py>(
    py: Python<'py>,
    trace: (Bound<'_, PyAny>, Bound<'_, PyAny>),
    table: SimTable,
    rate: f64,
    batch: Option<usize>,
) -> PyResult<Bound<'py, PyDict>> {
    let (offsets, rows) = (&trace.0, &trace.1);
    let SimTable {
        rows: rows_total,
        capacity,
        row_bytes,
        slack_rows,
        policy,
        admission,
    } = table;
    let policy = policy.as_str();
    let p = tiermem_embed::cache::policy::by_name(policy).map_err(to_py)?;
    if !p.caches_on_lookup() {
        return Err(to_py(tiermem_core::Error::InvalidArgument(format!(
            "cache policy '{policy}' does not cache in its lookups; simulate 'dynamic' or 'admit'"
        ))));
    }
    let (off, r) = trace_views(offsets, rows)?;
    let s = run(py, || {
        // SAFETY: the views keep their buffers exported for the call; only read.
        let (off, r) = unsafe { (off.slice(), r.slice()) };
        let q = Queries {
            offsets: off,
            rows: r,
        };
        let cache = minicache::LookupCache {
            rows: rows_total,
            capacity,
            row_bytes,
            slack_rows,
            admission: admission.unwrap_or_else(|| p.admission().to_owned()),
            eviction: p.eviction(),
        };
        minicache::simulate_lookups(&cache, q, rate, batch)
    })?;
    sim_dict(py, &s)
}

/// A simulation's figures as a dict.
fn sim_dict<'py>(py: Python<'py>, s: &minicache::SimResult) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("accesses", s.accesses)?;
    d.set_item("hits", s.hits)?;
    d.set_item("blocks_read", s.blocks_read)?;
    d.set_item("inserts", s.inserts)?;
    Ok(d)
}

fn row_trace(rows: &Bound<'_, PyAny>) -> PyResult<View<i64>> {
    view::<i64>(rows, "rows (int64)", false)
}

fn as_u64(v: &View<i64>) -> Vec<u64> {
    // SAFETY: the view keeps its buffer exported while it lives; only read.
    unsafe { v.slice() }.iter().map(|&r| r as u64).collect()
}

/// The exact LRU hit rate of each cache size (rows) on a row trace.
#[pyfunction]
pub fn lru_curve(py: Python<'_>, rows: &Bound<'_, PyAny>, sizes: Vec<u64>) -> PyResult<Vec<f64>> {
    let v = row_trace(rows)?;
    let t = as_u64(&v);
    Ok(py.detach(|| mrc::lru_curve(&t, &sizes)))
}

/// The SHARDS-adj estimate of the LRU hit-rate curve from a `rate` sample of the rows,
/// picked by `sampling`: `"hash"` (SHARDS's; `table_rows`, the table's row count, lets it
/// count the share of ids actually sampled) or `"count"` (stratified by access count).
#[pyfunction]
#[pyo3(signature = (rows, rate, sizes, table_rows=None, sampling="hash"))]
pub fn shards_curve(
    py: Python<'_>,
    rows: &Bound<'_, PyAny>,
    rate: f64,
    sizes: Vec<u64>,
    table_rows: Option<u64>,
    sampling: &str,
) -> PyResult<Vec<f64>> {
    let how = mrc::Sampling::named(sampling, table_rows).map_err(to_py)?;
    let v = row_trace(rows)?;
    let t = as_u64(&v);
    py.detach(|| mrc::shards_curve(&t, rate, &sizes, how))
        .map_err(to_py)
}

/// Hits of the optimal (Belady) cache of `capacity` rows on a row trace, counted from
/// access `start` on (the ones before warm the cache).
#[pyfunction]
#[pyo3(signature = (rows, capacity, start=0))]
pub fn belady_hits(
    py: Python<'_>,
    rows: &Bound<'_, PyAny>,
    capacity: usize,
    start: usize,
) -> PyResult<u64> {
    let v = row_trace(rows)?;
    let t = as_u64(&v);
    Ok(py.detach(|| mrc::belady_hits_from(&t, capacity, start)))
}
