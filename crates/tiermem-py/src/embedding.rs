//! `tiermem._tiermem.Table` and the embedding kernels. Arrays arrive through the buffer
//! protocol (checked for element type, C-contiguity and writability here); the work runs
//! with the GIL released.

use std::collections::HashMap;
use std::sync::Arc;

use pyo3::buffer::{Element, PyBuffer};
use pyo3::prelude::*;
use tiermem_core::Error;
use tiermem_embed::bags::Bags;
use tiermem_embed::rows::Tally;
use tiermem_embed::update::{self, GradIn};
use tiermem_embed::workload::{self, Dist};
use tiermem_embed::{lookup, CacheConfig, DType, LookupOut, Mode, Table};
use tiermem_embed::{Optimizer, OptimizerConfig};

use crate::error::{run, to_py};
use crate::manager::PyManager;
use crate::shared::Shared;

/// A checked, contiguous buffer: kept alive (exported) while the address is used.
struct View<T: Element> {
    _buf: PyBuffer<T>,
    addr: usize,
    len: usize,
}

fn view<T: Element>(obj: &Bound<'_, PyAny>, what: &str, write: bool) -> PyResult<View<T>> {
    let bad = |m: String| to_py(Error::InvalidArgument(format!("{what}: {m}")));
    let b = PyBuffer::<T>::get(obj).map_err(|e| bad(e.to_string()))?;
    if !b.is_c_contiguous() {
        return Err(bad("must be C-contiguous".into()));
    }
    if write && b.readonly() {
        return Err(bad("must be writable".into()));
    }
    Ok(View {
        addr: b.buf_ptr() as usize,
        len: b.item_count(),
        _buf: b,
    })
}

impl<T: Element> View<T> {
    /// # Safety
    /// The buffer is alive (held by `self`) and nothing else writes it during the call.
    unsafe fn slice<'a>(&self) -> &'a [T] {
        // SAFETY: the exporter guarantees `len` contiguous items at `addr` while exported;
        // empty buffers may have a dangling but non-null pointer.
        unsafe { std::slice::from_raw_parts(self.addr as *const T, self.len) }
    }

    /// # Safety
    /// As `slice`, and no other live reference to the buffer exists.
    #[allow(clippy::mut_from_ref)]
    unsafe fn slice_mut<'a>(&self) -> &'a mut [T] {
        // SAFETY: checked writable and contiguous in `view`; the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.addr as *mut T, self.len) }
    }
}

fn tally_dict(t: &Tally) -> HashMap<&'static str, u64> {
    HashMap::from([
        ("hits", t.hits),
        ("misses", t.misses),
        ("rows_cached", t.cached),
        ("home_read", t.home_read),
        ("home_written", t.home_written),
        ("cache_read", t.cache_read),
        ("cache_written", t.cache_written),
    ])
}

/// An embedding table (see `tiermem.embedding.EmbeddingTable` for the documented facade).
#[pyclass(name = "Table", module = "tiermem._tiermem", frozen)]
pub struct PyTable {
    inner: Shared<Table>,
}

#[pymethods]
impl PyTable {
    /// Rows directly on manager device `device`.
    #[staticmethod]
    fn direct(
        py: Python<'_>,
        manager: &PyManager,
        device: usize,
        rows: usize,
        width: usize,
        dtype: &str,
    ) -> PyResult<Self> {
        let dt = DType::parse(dtype).map_err(to_py)?;
        let m = Arc::clone(&manager.inner);
        let t = run(py, || Table::direct(&m, device, rows, width, dt))?;
        Ok(PyTable {
            inner: Shared::new(t),
        })
    }

    /// Rows on a 2LM model's slow device, every access through the model.
    #[staticmethod]
    fn behind_model(
        py: Python<'_>,
        manager: &PyManager,
        model: &crate::twolm::PyTwoLm,
        rows: usize,
        width: usize,
        dtype: &str,
    ) -> PyResult<Self> {
        let dt = DType::parse(dtype).map_err(to_py)?;
        let (m, md) = (Arc::clone(&manager.inner), Arc::clone(&model.inner));
        let t = run(py, || Table::behind_model(&m, &md, rows, width, dt))?;
        Ok(PyTable {
            inner: Shared::new(t),
        })
    }

    /// Base rows on device `slow`, a cache of `lower + slack` bytes on device `fast`.
    #[staticmethod]
    #[allow(clippy::too_many_arguments)]
    fn cached(
        py: Python<'_>,
        manager: &PyManager,
        slow: usize,
        fast: usize,
        rows: usize,
        width: usize,
        dtype: &str,
        lower: u64,
        slack: u64,
        policy: &str,
    ) -> PyResult<Self> {
        let dt = DType::parse(dtype).map_err(to_py)?;
        let policy = tiermem_embed::cache::policy::by_name(policy).map_err(to_py)?;
        let m = Arc::clone(&manager.inner);
        let cfg = CacheConfig {
            lower,
            slack,
            policy,
        };
        let t = run(py, || Table::cached(&m, slow, fast, rows, width, dt, cfg))?;
        Ok(PyTable {
            inner: Shared::new(t),
        })
    }

    #[getter]
    fn rows(&self) -> usize {
        self.inner.rows()
    }

    #[getter]
    fn width(&self) -> usize {
        self.inner.featuresize()
    }

    #[getter]
    fn dtype(&self) -> &'static str {
        self.inner.dtype().name()
    }

    #[getter]
    fn stride(&self) -> usize {
        self.inner.stride()
    }

    /// (home device index, cache device index or None).
    #[getter]
    fn devices(&self) -> (usize, Option<usize>) {
        self.inner.devices()
    }

    #[getter]
    fn padding_idx(&self) -> Option<usize> {
        self.inner.padding_idx()
    }

    fn set_padding_idx(&self, py: Python<'_>, row: Option<usize>) -> PyResult<()> {
        run(py, || self.inner.set_padding_idx(row))
    }

    fn stats(&self) -> HashMap<&'static str, u64> {
        let s = self.inner.stats();
        HashMap::from([
            ("hits", s.hits),
            ("misses", s.misses),
            ("rows_cached", s.rows_cached),
            ("pages_flushed", s.pages_flushed),
            ("rows_written_back", s.rows_written_back),
        ])
    }

    fn reset_stats(&self) {
        self.inner.reset_stats();
    }

    #[getter]
    fn metadata_bytes(&self, py: Python<'_>) -> PyResult<u64> {
        run(py, || self.inner.metadata_bytes())
    }

    /// Cache state, or None for a direct table.
    fn cache_info(&self) -> Option<HashMap<&'static str, u64>> {
        self.inner.cache().map(|c| {
            HashMap::from([
                ("capacity", c.capacity()),
                ("size", c.size()),
                ("cachelower", c.cachelower()),
                ("cacheslack", c.cacheslack()),
                ("isfull", u64::from(c.isfull())),
                ("cached_rows", c.cached_rows() as u64),
            ])
        })
    }

    fn cache_policy(&self) -> Option<&'static str> {
        self.inner.cache().map(|c| c.policy().name())
    }

    fn set_cachelower(&self, bytes: u64) -> PyResult<()> {
        self.cache()?.set_cachelower(bytes).map_err(to_py)
    }

    fn set_cacheslack(&self, bytes: u64) -> PyResult<()> {
        self.cache()?.set_cacheslack(bytes).map_err(to_py)
    }

    fn flush(&self, py: Python<'_>, write_back: bool) -> PyResult<u64> {
        run(py, || self.inner.flush(write_back))
    }

    /// Fill the cache with these rows (hottest first) until full.
    fn fill_cache_rows(&self, py: Python<'_>, rows: &Bound<'_, PyAny>) -> PyResult<u64> {
        let v = view::<u64>(rows, "rows", false)?;
        // SAFETY: `v` keeps the buffer exported for the call.
        run(py, || self.inner.fill_cache_rows(unsafe { v.slice() }))
    }

    fn fill_cache(&self, py: Python<'_>, seed: u64) -> PyResult<u64> {
        run(py, || self.inner.fill_cache(seed))
    }

    fn read_rows(&self, py: Python<'_>, start: usize, out: &Bound<'_, PyAny>) -> PyResult<()> {
        let v = view::<f32>(out, "out", true)?;
        // SAFETY: `v` keeps the buffer exported for the call; the caller passed no alias.
        run(py, || self.inner.read_rows(start, unsafe { v.slice_mut() }))
    }

    fn write_rows(&self, py: Python<'_>, start: usize, src: &Bound<'_, PyAny>) -> PyResult<()> {
        let v = view::<f32>(src, "rows", false)?;
        // SAFETY: as above.
        run(py, || self.inner.write_rows(start, unsafe { v.slice() }))
    }

    /// (kind, length, steps) of the fused optimizer's state, or None.
    fn optimizer_state_info(&self, py: Python<'_>) -> PyResult<Option<(&'static str, usize, u64)>> {
        let info = run(py, || self.inner.optimizer_state_info())?;
        Ok(info)
    }

    fn read_optimizer_state(
        &self,
        py: Python<'_>,
        offset: usize,
        out: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let v = view::<f32>(out, "out", true)?;
        run(py, || {
            // SAFETY: `v` keeps the buffer exported for the call; the caller passed no alias.
            let out = unsafe { v.slice_mut() };
            self.inner.read_optimizer_state(offset, out)
        })
    }

    fn set_optimizer_state(
        &self,
        py: Python<'_>,
        kind: &str,
        offset: usize,
        src: &Bound<'_, PyAny>,
        steps: u64,
    ) -> PyResult<()> {
        let v = view::<f32>(src, "state", false)?;
        run(py, || {
            // SAFETY: `v` keeps the buffer exported for the call; it is only read.
            let values = unsafe { v.slice() };
            self.inner.set_optimizer_state(kind, offset, values, steps)
        })
    }
}

impl PyTable {
    fn cache(&self) -> PyResult<&tiermem_embed::cache::CachedRows> {
        self.inner.cache().ok_or_else(|| {
            to_py(Error::InvalidArgument(
                "this table has no cache (it is a direct table)".into(),
            ))
        })
    }
}

/// The tables of a call, to carry across the GIL release (`PyRef` stays behind).
fn shared(tables: &[PyRef<'_, PyTable>]) -> Vec<Arc<Table>> {
    tables.iter().map(|t| Arc::clone(&t.inner)).collect()
}

fn borrowed(tables: &[Arc<Table>]) -> Vec<&Table> {
    tables.iter().map(|t| &**t).collect()
}

/// Checked per-table index buffers of one call.
struct Inputs {
    values: Vec<View<i64>>,
    offsets: Vec<View<i64>>,
    weights: Vec<Option<View<f32>>>,
}

fn inputs(
    n: usize,
    values: &[Bound<'_, PyAny>],
    offsets: &[Bound<'_, PyAny>],
    weights: &[Option<Bound<'_, PyAny>>],
) -> PyResult<Inputs> {
    if values.len() != n || offsets.len() != n || weights.len() != n {
        return Err(to_py(Error::InvalidArgument(format!(
            "{n} tables but {} values, {} offsets and {} weights arrays",
            values.len(),
            offsets.len(),
            weights.len()
        ))));
    }
    Ok(Inputs {
        values: values
            .iter()
            .enumerate()
            .map(|(t, v)| view::<i64>(v, &format!("table {t} indices (int64)"), false))
            .collect::<PyResult<_>>()?,
        offsets: offsets
            .iter()
            .enumerate()
            .map(|(t, v)| view::<i64>(v, &format!("table {t} offsets (int64)"), false))
            .collect::<PyResult<_>>()?,
        weights: weights
            .iter()
            .enumerate()
            .map(|(t, w)| {
                w.as_ref()
                    .map(|w| {
                        view::<f32>(w, &format!("table {t} per-sample weights (float32)"), false)
                    })
                    .transpose()
            })
            .collect::<PyResult<_>>()?,
    })
}

impl Inputs {
    /// # Safety
    /// The views are alive (held by `self`) and not written during the call.
    unsafe fn bags(&self) -> tiermem_core::Result<Vec<Bags<'_>>> {
        (0..self.values.len())
            .map(|t| {
                // SAFETY: the caller's contract.
                unsafe {
                    Bags::new(
                        t,
                        self.values[t].slice(),
                        self.offsets[t].slice(),
                        self.weights[t].as_ref().map(|w| w.slice()),
                    )
                }
            })
            .collect()
    }
}

/// Ensemble lookup into `out` (float32, rows of `row_stride`, table t at column cols[t]).
#[pyfunction]
#[allow(clippy::too_many_arguments)]
pub fn lookup_into(
    py: Python<'_>,
    tables: Vec<PyRef<'_, PyTable>>,
    values: Vec<Bound<'_, PyAny>>,
    offsets: Vec<Bound<'_, PyAny>>,
    weights: Vec<Option<Bound<'_, PyAny>>>,
    mode: &str,
    out: &Bound<'_, PyAny>,
    row_stride: usize,
    cols: Vec<usize>,
    prefetch: usize,
) -> PyResult<HashMap<&'static str, u64>> {
    let mode = Mode::parse(mode).map_err(to_py)?;
    let inp = inputs(tables.len(), &values, &offsets, &weights)?;
    let out = view::<f32>(out, "out (float32)", true)?;
    let ts = shared(&tables);
    run(py, || {
        let refs = borrowed(&ts);
        // SAFETY: every view is held for the call; `out` is distinct from the inputs
        // (writable output vs read-only index arrays of another type).
        let bags = unsafe { inp.bags() }?;
        // SAFETY: as above; the facade allocates `out` itself.
        let data = unsafe { out.slice_mut() };
        lookup(
            &refs,
            &bags,
            mode,
            LookupOut {
                data,
                row_stride,
                cols: &cols,
            },
            prefetch,
        )
    })
    .map(|t| tally_dict(&t))
}

/// Backward of an ensemble lookup with the optimizer fused in.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
pub fn update_from(
    py: Python<'_>,
    tables: Vec<PyRef<'_, PyTable>>,
    values: Vec<Bound<'_, PyAny>>,
    offsets: Vec<Bound<'_, PyAny>>,
    weights: Vec<Option<Bound<'_, PyAny>>>,
    mode: &str,
    grad: &Bound<'_, PyAny>,
    row_stride: usize,
    cols: Vec<usize>,
    optimizer: &str,
    lr: f32,
    eps: f32,
    lr_decay: f32,
    initial_accumulator: f32,
    nt: bool,
) -> PyResult<HashMap<&'static str, u64>> {
    let mode = Mode::parse(mode).map_err(to_py)?;
    let opt = Optimizer::new(
        optimizer,
        &OptimizerConfig {
            lr,
            eps,
            lr_decay,
            initial_accumulator,
        },
    )
    .map_err(to_py)?;
    let inp = inputs(tables.len(), &values, &offsets, &weights)?;
    let g = view::<f32>(grad, "grad (float32)", false)?;
    let ts = shared(&tables);
    run(py, || {
        let refs = borrowed(&ts);
        // SAFETY: every view is held for the call and only read.
        let bags = unsafe { inp.bags() }?;
        // SAFETY: as above.
        let data = unsafe { g.slice() };
        update::update(
            &refs,
            &bags,
            mode,
            GradIn {
                data,
                row_stride,
                cols: &cols,
            },
            opt,
            nt,
        )
    })
    .map(|t| tally_dict(&t))
}

/// The sparse gradient of one table's lookup: (distinct rows, their gradients flattened).
#[pyfunction]
pub fn sparse_grad(
    py: Python<'_>,
    table: PyRef<'_, PyTable>,
    values: Bound<'_, PyAny>,
    offsets: Bound<'_, PyAny>,
    weights: Option<Bound<'_, PyAny>>,
    mode: &str,
    grad: &Bound<'_, PyAny>,
) -> PyResult<(Vec<u32>, Vec<f32>)> {
    let mode = Mode::parse(mode).map_err(to_py)?;
    let inp = inputs(1, &[values], &[offsets], &[weights])?;
    let g = view::<f32>(grad, "grad (float32)", false)?;
    let t = Arc::clone(&table.inner);
    run(py, || {
        // SAFETY: every view is held for the call and only read.
        let bags = unsafe { inp.bags() }?;
        // SAFETY: as above.
        let data = unsafe { g.slice() };
        update::sparse_grad(&t, &bags[0], mode, data)
    })
}

/// The gather roofline over the same tables and bags (see the core's `gather`).
#[pyfunction]
pub fn gather(
    py: Python<'_>,
    tables: Vec<PyRef<'_, PyTable>>,
    values: Vec<Bound<'_, PyAny>>,
    offsets: Vec<Bound<'_, PyAny>>,
    prefetch: usize,
) -> PyResult<u64> {
    let none: Vec<Option<Bound<'_, PyAny>>> = vec![None; tables.len()];
    let inp = inputs(tables.len(), &values, &offsets, &none)?;
    let ts = shared(&tables);
    run(py, || {
        let refs = borrowed(&ts);
        // SAFETY: the views are held for the call and only read.
        let bags = unsafe { inp.bags() }?;
        tiermem_embed::lookup::gather(&refs, &bags, prefetch)
    })
}

/// Fill each `outs[t]` (int64, `batch * bag` long) with a batch of indices for a table of
/// Fill a float32 buffer with values uniform in `[low, high)`, element k a function of
/// `(seed, start + k)` only.
#[pyfunction]
pub fn uniform_into(
    py: Python<'_>,
    out: &Bound<'_, PyAny>,
    low: f32,
    high: f32,
    seed: u64,
    start: u64,
) -> PyResult<()> {
    let v = view::<f32>(out, "out (float32)", true)?;
    // SAFETY: `v` keeps the buffer exported for the call; the caller passed no alias.
    let o = unsafe { v.slice_mut() };
    py.detach(|| workload::uniform_fill(o, low, high, seed, start));
    Ok(())
}

/// `tables[t]` rows. `dist`: uniform, zipf (exponent `alpha`) or production (`histogram`).
#[pyfunction]
#[allow(clippy::too_many_arguments)]
pub fn generate_into(
    py: Python<'_>,
    dist: &str,
    alpha: f64,
    histogram: Option<Vec<f64>>,
    tables: Vec<usize>,
    outs: Vec<Bound<'_, PyAny>>,
    bag: usize,
    seed: u64,
    step: u64,
) -> PyResult<()> {
    let d = match (dist, histogram) {
        ("uniform", _) => Dist::Uniform,
        ("zipf", _) => Dist::Zipf(alpha),
        ("production", Some(h)) => Dist::Production(h),
        _ => {
            return Err(to_py(Error::InvalidArgument(format!(
                "unknown distribution '{dist}' (known: uniform, zipf, production with a histogram)"
            ))))
        }
    };
    let vs = outs
        .iter()
        .map(|o| view::<i64>(o, "indices out (int64)", true))
        .collect::<PyResult<Vec<_>>>()?;
    if vs.len() != tables.len()
        || bag == 0
        || vs.iter().any(|v| v.len % bag != 0 || v.len != vs[0].len)
    {
        return Err(to_py(Error::InvalidArgument(format!(
            "{} tables need {} output arrays of the same length, a multiple of bag {bag}",
            tables.len(),
            tables.len()
        ))));
    }
    run(py, || {
        let batch = vs.first().map_or(0, |v| v.len / bag);
        let gen = workload::generate(&d, &tables, batch, bag, seed, step)?;
        for (v, g) in vs.iter().zip(gen) {
            // SAFETY: each view is held for the call, writable, and distinct.
            unsafe { v.slice_mut() }.copy_from_slice(&g);
        }
        Ok(())
    })
}

/// Share of distinct rows in each reuse bucket of Meta's published histograms.
#[pyfunction]
pub fn reuse_histogram(values: &Bound<'_, PyAny>) -> PyResult<Vec<f64>> {
    let v = view::<i64>(values, "indices (int64)", false)?;
    // SAFETY: held for the call, only read.
    Ok(workload::reuse_histogram(unsafe { v.slice() }))
}
