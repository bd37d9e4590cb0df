//! `tiermem_hpc::pattern`: access-pattern analysis and the staging decision, for
//! `tiermem.staging`.

use pyo3::prelude::*;
use tiermem_hpc::pattern::{self, BreakEven, Rates, Use};

use crate::buffer::view;
use crate::convert::to_object;
use crate::error::{run, to_py};

/// PAF and SF hit rates of an int64 index stream (`elem_bytes` per element) as `threads`
/// threads sample it.
#[pyfunction]
pub fn analyse_pattern(
    py: Python<'_>,
    indices: &Bound<'_, PyAny>,
    elem_bytes: u64,
    threads: usize,
) -> PyResult<Py<PyAny>> {
    let v = view::<i64>(indices, "indices (int64)", false)?;
    // SAFETY: held for the call (the view keeps the buffer exported), only read.
    let s = unsafe { v.slice() };
    let r = run(py, || pattern::analyse_indices(s, elem_bytes, threads))?;
    to_object(py, &r)
}

/// The staging decision (eq. 9) for sampled `rates` (`{r_paf, r_sf, r_lf}` as JSON), use
/// `(u, read, write)`, a break-even `line` (as JSON) and threshold `t_th` (s/GB).
#[pyfunction]
pub fn staging_decision(
    py: Python<'_>,
    rates: &str,
    u: f64,
    read: bool,
    write: bool,
    line: &str,
    t_th: f64,
) -> PyResult<Py<PyAny>> {
    let bad = |what: &str, e: serde_json::Error| {
        to_py(tiermem_core::Error::InvalidArgument(format!(
            "not {what}: {e}"
        )))
    };
    let r: Rates = serde_json::from_str(rates).map_err(|e| bad("pattern rates", e))?;
    let be: BreakEven = serde_json::from_str(line).map_err(|e| bad("a break-even line", e))?;
    let d = run(py, || be.decide(&r, &Use { u, read, write }, t_th))?;
    to_object(py, &d)
}
