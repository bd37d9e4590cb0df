//! Workload generators of `tiermem-embed` (synthetic index streams and fills) for Python.

use pyo3::prelude::*;
use tiermem_core::Error;
use tiermem_embed::workload::{self, Dist};

use crate::buffer::view;
use crate::error::{run, to_py};

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

/// Fill each `outs[t]` (int64, `batch * bag` long) with a batch of indices for a table of
/// `tables[t]` rows. `dist`: uniform, zipf (exponent `alpha`) or production (`histogram`).
#[pyfunction]
pub fn generate_into(
    py: Python<'_>,
    dist: (String, f64, Option<Vec<f64>>),
    tables: Vec<usize>,
    outs: Vec<Bound<'_, PyAny>>,
    bag: usize,
    seed: u64,
    step: u64,
) -> PyResult<()> {
    let (dist, alpha, histogram) = dist;
    let d = Dist::parse(&dist, alpha, histogram).map_err(to_py)?;
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
