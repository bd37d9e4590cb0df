//! The embedding kernels of `tiermem-embed` over tables from Python: ensemble lookups,
//! fused updates, sparse gradients and gathers, with the GIL released.

use std::collections::HashMap;
use std::sync::Arc;

use pyo3::prelude::*;
use tiermem_core::Error;
use tiermem_embed::bags::Bags;
use tiermem_embed::optim::Decay;
use tiermem_embed::rows::Tally;
use tiermem_embed::update::{self, GradIn};
use tiermem_embed::{lookup, LookupOut, Mode, Optimizer, OptimizerConfig, Table};

use super::table::PyTable;
use crate::buffer::{view, View};
use crate::error::{run, to_py};

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

/// Each table's bags: (indices, offsets, per-sample weights or None), a list per table.
type BagLists<'py> = (
    Vec<Bound<'py, PyAny>>,
    Vec<Bound<'py, PyAny>>,
    Vec<Option<Bound<'py, PyAny>>>,
);

/// Ensemble lookup into `out` (float32, rows of `row_stride`, table t at column cols[t]:
/// `columns` = (row_stride, cols)).
#[pyfunction]
pub fn lookup_into(
    py: Python<'_>,
    tables: Vec<PyRef<'_, PyTable>>,
    bags: BagLists<'_>,
    mode: &str,
    out: &Bound<'_, PyAny>,
    columns: (usize, Vec<usize>),
    prefetch: usize,
) -> PyResult<HashMap<&'static str, u64>> {
    let (values, offsets, weights) = bags;
    let (row_stride, cols) = columns;
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

/// The fused optimizer as Python hands it over: (name, non-temporal stores, its settings by
/// the names in `OPTIMIZER_SETTINGS`, the weight decay mode or None for the optimizer's own).
type OptimizerArgs = (String, bool, Vec<(String, f32)>, Option<String>);

fn optimizer_of(args: OptimizerArgs) -> tiermem_core::Result<(Optimizer, bool)> {
    let (name, nt, settings, decay) = args;
    let mut c = OptimizerConfig::new(0.0, 0.0, 0.0, 0.0);
    for (k, v) in &settings {
        c.set(k, *v)?;
    }
    c.weight_decay_mode = decay.as_deref().map(Decay::parse).transpose()?;
    Ok((Optimizer::new(&name, &c)?, nt))
}

/// Check an optimizer's name and settings as the fused update would, without running it.
#[pyfunction]
pub fn check_optimizer(optimizer: OptimizerArgs) -> PyResult<()> {
    optimizer_of(optimizer).map(|_| ()).map_err(to_py)
}

/// Floats of state optimizer `name` keeps per row of `width` elements (0: stateless).
#[pyfunction]
pub fn optimizer_state_width(name: &str, width: usize) -> PyResult<usize> {
    tiermem_embed::optim::state_of(name, width)
        .map(|(_, n)| n)
        .map_err(to_py)
}

/// Backward of an ensemble lookup with the optimizer fused in (`columns` as for
/// `lookup_into`).
#[pyfunction]
pub fn update_from(
    py: Python<'_>,
    tables: Vec<PyRef<'_, PyTable>>,
    bags: BagLists<'_>,
    mode: &str,
    grad: &Bound<'_, PyAny>,
    columns: (usize, Vec<usize>),
    optimizer: OptimizerArgs,
) -> PyResult<HashMap<&'static str, u64>> {
    let (values, offsets, weights) = bags;
    let (row_stride, cols) = columns;
    let mode = Mode::parse(mode).map_err(to_py)?;
    let (opt, nt) = optimizer_of(optimizer).map_err(to_py)?;
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
