//! `tiermem._tiermem.BlockFile`: a table's block file (`tiermem_embed::blockfile`), rows in
//! and out as bytes, with the GIL released.

use std::path::PathBuf;

use pyo3::prelude::*;
use pyo3::types::PyDict;
use tiermem_embed::blockfile::BlockFile;
use tiermem_embed::DType;

use crate::buffer::view;
use crate::error::{run, to_py};
use crate::shared::Shared;

/// An open, locked table file.
#[pyclass(name = "BlockFile", module = "tiermem._tiermem", frozen)]
pub struct PyBlockFile {
    inner: Shared<BlockFile>,
}

#[pymethods]
impl PyBlockFile {
    /// Create the file for `shape` = (rows, width, dtype): zeroed rows of `width` elements
    /// of `dtype`.
    #[staticmethod]
    fn create(
        py: Python<'_>,
        path: PathBuf,
        name: &str,
        shape: (u64, u32, String),
        overwrite: bool,
        depth: usize,
    ) -> PyResult<Self> {
        let (rows, width, dtype) = shape;
        let dt = DType::parse(&dtype).map_err(to_py)?;
        let f = run(py, || {
            BlockFile::create(&path, name, rows, width, dt, overwrite, depth)
        })?;
        Ok(PyBlockFile {
            inner: Shared::new(f),
        })
    }

    /// Re-attach an existing table file; `read_only` opens it under a shared lock (a
    /// snapshot several processes read at once), refusing every write.
    #[staticmethod]
    #[pyo3(signature = (path, name, depth, read_only=false))]
    fn open(
        py: Python<'_>,
        path: PathBuf,
        name: &str,
        depth: usize,
        read_only: bool,
    ) -> PyResult<Self> {
        let f = run(py, || BlockFile::open(&path, name, depth, None, read_only))?;
        Ok(PyBlockFile {
            inner: Shared::new(f),
        })
    }

    #[getter]
    fn rows(&self) -> u64 {
        self.inner.rows()
    }

    /// (rows, width, dtype) the header gives.
    #[getter]
    fn shape(&self) -> (u64, u32, &'static str) {
        let h = self.inner.header();
        (h.rows, h.width, h.dtype.name())
    }

    /// The layout generation.
    #[getter]
    fn generation(&self) -> u64 {
        self.inner.header().generation
    }

    #[getter]
    fn stride(&self) -> usize {
        self.inner.stride()
    }

    #[getter]
    fn depth(&self) -> usize {
        self.inner.depth()
    }

    #[getter]
    fn read_engine(&self) -> &'static str {
        self.inner.read_engine()
    }

    /// Rows per block (1 for rows wider than a block) and blocks per row.
    #[getter]
    fn geometry(&self) -> (u32, u32) {
        let h = self.inner.header();
        (h.rows_per_block, h.blocks_per_row)
    }

    /// Copy rows `rows` (uint64) into `out` (uint8, `len(rows) * stride` bytes).
    fn read_rows(
        &self,
        py: Python<'_>,
        rows: &Bound<'_, PyAny>,
        out: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let r = view::<u64>(rows, "rows (uint64)", false)?;
        let o = view::<u8>(out, "out (uint8)", true)?;
        run(py, || {
            // SAFETY: both views keep their buffers exported for the call; `out` is written
            // only here, `rows` only read.
            let (r, o) = unsafe { (r.slice(), o.slice_mut()) };
            self.inner.read_rows(r, o)
        })
    }

    /// Overwrite rows `rows` (uint64) from `src` (uint8, `len(rows) * stride` bytes): they
    /// are appended to the row log, compacted home once it outgrows its limit. Returns
    /// `(write requests, blocks written)`.
    fn write_rows(
        &self,
        py: Python<'_>,
        rows: &Bound<'_, PyAny>,
        src: &Bound<'_, PyAny>,
    ) -> PyResult<(u64, u64)> {
        let r = view::<u64>(rows, "rows (uint64)", false)?;
        let s = view::<u8>(src, "src (uint8)", false)?;
        run(py, || {
            // SAFETY: both views keep their buffers exported for the call; only read.
            let (r, s) = unsafe { (r.slice(), s.slice()) };
            self.inner.write_rows(r, s).map(|w| (w.requests, w.blocks))
        })
    }

    /// Write every logged row home and cut the log off; returns `(write requests, blocks
    /// written)`.
    fn compact(&self, py: Python<'_>) -> PyResult<(u64, u64)> {
        run(py, || self.inner.compact().map(|w| (w.requests, w.blocks)))
    }

    /// Compact once the row log holds more than `bytes` (0: after every write).
    fn set_log_limit(&self, bytes: u64) {
        self.inner.set_log_limit(bytes);
    }

    /// The row log's counters: chunks and rows appended, compactions, rows and write
    /// requests they took, and the blocks it holds now.
    fn log_counters<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let f = self.inner.log_figures();
        let d = PyDict::new(py);
        d.set_item("chunks", f.chunks)?;
        d.set_item("rows", f.rows)?;
        d.set_item("compactions", f.compactions)?;
        d.set_item("compacted_rows", f.compacted_rows)?;
        d.set_item("compaction_writes", f.compaction_writes)?;
        d.set_item("blocks", f.blocks)?;
        Ok(d)
    }

    /// Make every write durable.
    fn sync(&self, py: Python<'_>) -> PyResult<()> {
        run(py, || self.inner.sync())
    }
}

/// Bytes a block table file of `rows` rows of `width` elements of `dtype` takes on disk
/// (header, layout and data blocks: the format's own count); rows written to it are logged
/// after these until compacted, up to as many bytes again by default.
#[pyfunction]
#[pyo3(signature = (rows, width, dtype="float32"))]
pub fn block_file_bytes(rows: u64, width: u32, dtype: &str) -> PyResult<u64> {
    let dt = DType::parse(dtype).map_err(to_py)?;
    Ok(tiermem_embed::blockfile::format::Header::new(rows, width, dt).file_bytes())
}

/// How a block table file lays out rows of `width` elements of `dtype`: `block_bytes` (the
/// file's block, its direct-I/O unit), `rows_per_block` (1 when a row spans blocks) and
/// `blocks_per_row` (1 when rows share blocks): the format's own figures.
#[pyfunction]
#[pyo3(signature = (width, dtype="float32"))]
pub fn block_geometry<'py>(
    py: Python<'py>,
    width: u32,
    dtype: &str,
) -> PyResult<Bound<'py, PyDict>> {
    let dt = DType::parse(dtype).map_err(to_py)?;
    let h = tiermem_embed::blockfile::format::Header::new(1, width, dt);
    let d = PyDict::new(py);
    d.set_item("block_bytes", tiermem_embed::blockfile::format::BLOCK)?;
    d.set_item("rows_per_block", h.rows_per_block)?;
    d.set_item("blocks_per_row", h.blocks_per_row)?;
    Ok(d)
}
