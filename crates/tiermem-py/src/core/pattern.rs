//! `tiermem_core::pattern`: access-pattern analysis and the staging decision, for
//! `tiermem.staging`.

use pyo3::prelude::*;
use tiermem_core::pattern::{self, Boosts, BreakEven, Rates, Use};

use crate::buffer::view;
use crate::convert::to_object;
use crate::error::run;

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

/// The staging decision (eq. 9) for rates `(r_paf, r_sf)`, use `(u, read, write)` and a
/// break-even line: `boosts` `[[random, strided, sequential]]` for read, write and
/// read-write (s/GB), copy times `t_1st`, `t_3rd` (s/GB), threshold `t_th` (s/GB).
#[pyfunction]
#[allow(clippy::too_many_arguments)]
pub fn staging_decision(
    py: Python<'_>,
    r_paf: f64,
    r_sf: f64,
    u: f64,
    read: bool,
    write: bool,
    boosts: [[f64; 3]; 3],
    t_1st: f64,
    t_3rd: f64,
    t_th: f64,
) -> PyResult<Py<PyAny>> {
    let b = |x: [f64; 3]| Boosts {
        random: x[0],
        strided: x[1],
        sequential: x[2],
    };
    let be = BreakEven {
        read: b(boosts[0]),
        write: b(boosts[1]),
        read_write: b(boosts[2]),
        t_1st,
        t_3rd,
    };
    let rates = Rates {
        r_paf,
        r_sf,
        samples: 0,
    };
    let d = run(py, || be.decide(&rates, &Use { u, read, write }, t_th))?;
    to_object(py, &d)
}
