//! `tiermem._tiermem.Traited`: allocation by H2M traits over a manager
//! (`tiermem_core::traits`). Traits cross as `(key, value)` text pairs; the core parses and
//! validates them, so the keys and values are defined once, there.

use std::sync::Arc;

use pyo3::prelude::*;
use tiermem_core::traits::{Strategy, Traited, Traits};

use super::manager::PyManager;
use crate::convert::to_object;
use crate::error::run;
use crate::shared::Shared;

type Pairs = Vec<(String, String)>;

/// A manager's allocations by traits.
#[pyclass(name = "Traited", module = "tiermem._tiermem", frozen)]
pub struct PyTraited {
    inner: Shared<Traited>,
}

#[pymethods]
impl PyTraited {
    #[new]
    fn new(py: Python<'_>, manager: &PyManager) -> PyResult<Self> {
        let m = Arc::clone(&manager.inner);
        let t = run(py, || Ok(Traited::new(m)))?;
        Ok(PyTraited {
            inner: Shared::new(t),
        })
    }

    /// Parse and validate a trait set; returns its typed fields.
    #[staticmethod]
    fn parse(py: Python<'_>, traits: Pairs) -> PyResult<Py<PyAny>> {
        let t = run(py, || Traits::from_pairs(&traits))?;
        to_object(py, &t)
    }

    /// The memory spaces over the manager's devices.
    fn spaces(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        to_object(py, self.inner.spaces())
    }

    /// Allocate `(bytes, traits)` declarations in `strategy`'s order; `(object, device)`
    /// per declaration, in declaration order.
    fn commit(
        &self,
        py: Python<'_>,
        decls: Vec<(u64, Pairs)>,
        strategy: &str,
    ) -> PyResult<Vec<(u64, usize)>> {
        let t = Arc::clone(&self.inner);
        run(py, move || {
            let s = Strategy::parse(strategy)?;
            let parsed = decls
                .iter()
                .map(|(b, p)| Ok((*b, Traits::from_pairs(p)?)))
                .collect::<tiermem_core::Result<Vec<_>>>()?;
            t.commit(&parsed, s)
        })
    }

    /// Record new traits for an object.
    fn update_traits(&self, py: Python<'_>, id: u64, traits: Pairs) -> PyResult<()> {
        let t = Arc::clone(&self.inner);
        run(py, move || {
            t.update_traits(id, Traits::from_pairs(&traits)?)
        })
    }

    /// The object's current traits (typed fields), or None.
    fn traits_of(&self, py: Python<'_>, id: u64) -> PyResult<Py<PyAny>> {
        let t = Arc::clone(&self.inner);
        let got = run(py, move || t.traits_of(id))?;
        to_object(py, &got)
    }

    /// Place again `only` (None: every object allocated by traits) and move what changes.
    #[pyo3(signature = (only, strategy))]
    fn apply_migration(
        &self,
        py: Python<'_>,
        only: Option<Vec<u64>>,
        strategy: &str,
    ) -> PyResult<Py<PyAny>> {
        let t = Arc::clone(&self.inner);
        let out = run(py, move || {
            let s = Strategy::parse(strategy)?;
            t.apply_migration(only.as_deref(), s)
        })?;
        to_object(py, &out)
    }
}
