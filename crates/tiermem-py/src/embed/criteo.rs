//! `tiermem_embed::criteo`: the Criteo reader in the core, for `tiermem.dlrm.data.criteo`.

use std::sync::Mutex;

use pyo3::prelude::*;
use tiermem_embed::criteo::{self, Out, Reader};

use crate::buffer::view;
use crate::error::run;

/// A reader of the lines of a Criteo file that start in a byte range.
#[pyclass(name = "CriteoParser", module = "tiermem._tiermem", frozen)]
pub struct PyCriteoParser {
    inner: Mutex<Reader>,
}

/// What one `fill` did: samples, the position after the last line consumed, lines read and
/// malformed lines skipped so far, and the malformed line that stopped the read, if any.
type Filled = (usize, u64, u64, u64, Option<(u64, String)>);

#[pymethods]
impl PyCriteoParser {
    #[new]
    #[pyo3(signature = (path, rows, start, end, max_line, stop_on_bad))]
    fn new(
        py: Python<'_>,
        path: &str,
        rows: Vec<u64>,
        start: u64,
        end: Option<u64>,
        max_line: u64,
        stop_on_bad: bool,
    ) -> PyResult<Self> {
        let r = run(py, || {
            Reader::open(path, &rows, (start, end), max_line, stop_on_bad)
        })?;
        Ok(PyCriteoParser {
            inner: Mutex::new(r),
        })
    }

    /// Fill `labels` (float32, B), `dense` (float32, B x 13) and `cats` (int64, 26 x B) with
    /// up to B samples, the GIL released.
    fn fill(
        &self,
        py: Python<'_>,
        labels: &Bound<'_, PyAny>,
        dense: &Bound<'_, PyAny>,
        cats: &Bound<'_, PyAny>,
    ) -> PyResult<Filled> {
        let (l, d, c) = (
            view::<f32>(labels, "labels (float32)", true)?,
            view::<f32>(dense, "dense (float32)", true)?,
            view::<i64>(cats, "cats (int64)", true)?,
        );
        // SAFETY: the views keep the three buffers exported for the call; they are distinct
        // arrays the caller made for this, and nothing else touches them meanwhile.
        let mut out = unsafe {
            Out {
                labels: l.slice_mut(),
                dense: d.slice_mut(),
                cats: c.slice_mut(),
            }
        };
        let inner = &self.inner;
        run(py, || {
            let mut r = inner
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let n = r.fill(&mut out)?;
            Ok((n, r.position(), r.lines, r.bad, r.failed.clone()))
        })
    }

    /// The first malformed lines skipped: (line number from the start, reason).
    fn examples(&self, py: Python<'_>) -> PyResult<Vec<(u64, String)>> {
        let inner = &self.inner;
        run(py, || {
            Ok(inner
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .examples
                .clone())
        })
    }
}

/// `parts` byte ranges of a file, each starting at a line start.
#[pyfunction]
pub fn criteo_ranges(py: Python<'_>, path: &str, parts: u64) -> PyResult<Vec<(u64, u64)>> {
    run(py, || criteo::line_aligned_ranges(path, parts))
}
