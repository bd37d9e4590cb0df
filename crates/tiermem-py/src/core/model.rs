//! `tiermem._tiermem.TwoLmModel`: the hardware DRAM cache ("2LM") model.

use std::sync::Arc;

use pyo3::prelude::*;
use tiermem_core::manager::{reserve_model, Reservation};
use tiermem_core::model::{TwoLm, EVENTS, EVENT_NAMES};

use super::manager::PyManager;
use crate::convert::to_object;
use crate::error::run;
use crate::shared::Shared;

/// A 2LM model: `cache_bytes` of device `fast` as a direct-mapped cache of `line`-byte lines
/// in front of device `slow`.
#[pyclass(name = "TwoLmModel", module = "tiermem._tiermem", frozen)]
pub struct PyTwoLm {
    pub(crate) inner: Shared<TwoLm>,
    /// The cache's bytes, taken from the fast device as the hardware's DRAM would be.
    _cache: Shared<Reservation>,
}

#[pymethods]
impl PyTwoLm {
    /// Line event names, in the order `stats()`'s `events` lists them.
    #[classattr]
    const EVENT_NAMES: [&'static str; EVENTS] = EVENT_NAMES;

    #[new]
    fn new(
        py: Python<'_>,
        manager: &PyManager,
        slow: usize,
        fast: usize,
        cache_bytes: u64,
        line: usize,
    ) -> PyResult<Self> {
        let m = Arc::clone(&manager.inner);
        let (t, cache) = run(py, || reserve_model(&m, slow, fast, cache_bytes, line))?;
        Ok(PyTwoLm {
            inner: Shared::new(t),
            _cache: Shared::new(cache),
        })
    }

    #[getter]
    fn line(&self) -> usize {
        self.inner.line()
    }

    #[getter]
    fn cache_bytes(&self) -> u64 {
        self.inner.cache_bytes()
    }

    #[getter]
    fn metadata_bytes(&self) -> u64 {
        self.inner.metadata_bytes()
    }

    /// (slow, fast) device indices.
    #[getter]
    fn devices(&self) -> (usize, usize) {
        self.inner.devices()
    }

    /// Events, traffic, amplification and hit rate.
    fn stats(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        to_object(py, &self.inner.stats())
    }

    fn reset_stats(&self) {
        self.inner.reset_stats();
    }

    fn clear(&self) {
        self.inner.clear();
    }
}
