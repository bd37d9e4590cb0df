//! `tiermem._tiermem.Kernel`: the HPC kernels over a manager's objects
//! (`tiermem_hpc`), their staged runs and the staging calibration.

use std::collections::HashMap;
use std::sync::Arc;

use pyo3::prelude::*;
use tiermem_core::manager::Manager;
use tiermem_core::Error;
use tiermem_hpc::pattern::BreakEven;
use tiermem_hpc::{staging, Kernel};

use crate::convert::to_object;
use crate::core::manager::PyManager;
use crate::error::{run, to_py};

/// A kernel bound to a manager's objects.
#[pyclass(name = "Kernel", module = "tiermem._tiermem", frozen)]
pub struct PyKernel {
    manager: Arc<Manager>,
    kernel: Box<dyn Kernel>,
}

fn line_from(json: &str) -> PyResult<BreakEven> {
    serde_json::from_str(json).map_err(|e| {
        to_py(Error::InvalidArgument(format!(
            "not a staging break-even line: {e}"
        )))
    })
}

#[pymethods]
impl PyKernel {
    /// `kind` (see `HPC_KERNELS`) over `objects` (name -> object id) with `params`.
    #[new]
    fn new(
        manager: &PyManager,
        kind: &str,
        objects: HashMap<String, u64>,
        params: HashMap<String, u64>,
    ) -> PyResult<Self> {
        let kernel = tiermem_hpc::build(kind, &objects, &params).map_err(to_py)?;
        Ok(PyKernel {
            manager: Arc::clone(&manager.inner),
            kernel,
        })
    }

    /// Its name.
    fn name(&self) -> String {
        self.kernel.name()
    }

    /// `(target operand index, accesses per element U)`.
    fn target(&self) -> (usize, f64) {
        self.kernel.target()
    }

    /// `(name, object, elem bytes, elements, read, write)` per operand.
    fn operands(&self) -> Vec<(String, u64, u64, u64, bool, bool)> {
        self.kernel
            .operands()
            .iter()
            .map(|o| (o.name.to_string(), o.id, o.elem, o.len, o.read, o.write))
            .collect()
    }

    /// One run, charged.
    fn run(&self, py: Python<'_>) -> PyResult<()> {
        run(py, || self.kernel.run(&self.manager))
    }

    /// Sampled `{r_paf, r_sf, samples}` of operand `op`.
    fn analyse(&self, py: Python<'_>, op: usize) -> PyResult<Py<PyAny>> {
        let n = self.kernel.operands().len();
        if op >= n {
            return Err(to_py(Error::InvalidArgument(format!(
                "operand {op} out of range: the kernel has {n}"
            ))));
        }
        let r = run(py, || {
            staging::analyse(&self.manager, self.kernel.as_ref(), op)
        })?;
        to_object(py, &r)
    }

    /// One staged run: `mode` `slow_only`, `always_stage` or `pattern_aware` (with `line`,
    /// a break-even line as JSON, and threshold `t_th` s/GB); returns the report.
    #[pyo3(signature = (mode, line = None, t_th = 0.0))]
    fn staged(
        &self,
        py: Python<'_>,
        mode: &str,
        line: Option<&str>,
        t_th: f64,
    ) -> PyResult<Py<PyAny>> {
        let m = match (mode, line) {
            ("slow_only", _) => staging::Mode::SlowOnly,
            ("always_stage", _) => staging::Mode::AlwaysStage,
            ("pattern_aware", Some(l)) => staging::Mode::PatternAware(line_from(l)?, t_th),
            ("pattern_aware", None) => {
                return Err(to_py(Error::InvalidArgument(
                    "pattern_aware staging needs a calibrated break-even line".into(),
                )))
            }
            _ => {
                return Err(to_py(Error::InvalidArgument(format!(
                    "unknown staging mode '{mode}' (slow_only, always_stage, pattern_aware)"
                ))))
            }
        };
        let r = run(py, || staging::run(&self.manager, self.kernel.as_ref(), m))?;
        to_object(py, &r)
    }
}

/// Calibrate the break-even line between the manager's slowest and fastest devices with a
/// probe array of `len` `u64`s, medians of `reps` runs.
#[pyfunction]
pub fn calibrate_staging(
    py: Python<'_>,
    manager: &PyManager,
    len: u64,
    reps: usize,
) -> PyResult<Py<PyAny>> {
    let m = Arc::clone(&manager.inner);
    let line = run(py, move || staging::calibrate(&m, len, reps))?;
    to_object(py, &line)
}
