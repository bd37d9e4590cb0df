//! `tiermem._tiermem.Table`: an embedding table of `tiermem-embed` (rows in a home,
//! optionally cached), its statistics, cache controls and optimizer state.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::PyDict;
use tiermem_core::Error;
use tiermem_embed::blockfile::BlockFile;
use tiermem_embed::cache::Admission;
use tiermem_embed::home::{FileHome, MemoryHome, ModelHome};
use tiermem_embed::{Cache, CacheConfig, DType, Shape, Table};

use crate::buffer::view;
use crate::core::manager::PyManager;
use crate::error::{run, to_py};
use crate::shared::Shared;

/// An embedding table (see `tiermem.embedding.EmbeddingTable` for the documented facade).
#[pyclass(name = "Table", module = "tiermem._tiermem", frozen)]
pub struct PyTable {
    pub(crate) inner: Shared<Table>,
    /// Blocks a relayout in progress has written: read by `relayout_progress` without the
    /// table's lock, so Python can show a bar while the relayout holds it.
    relayout_done: Arc<AtomicU64>,
}

#[pymethods]
impl PyTable {
    /// The table constructor: rows of `shape` = (rows, width, dtype) in the home `home`
    /// describes, behind the cache `cache` describes (None: a direct table). `home` is a
    /// dict with `kind` and that kind's settings (`tiermem.embedding.config.Placement`
    /// builds both): `memory` (`device`), `model` (`model`), `block` (`path`, `name`,
    /// `attach`, `depth`: None for the calibrated depth) or `file` (`path`, `name`,
    /// `attach`, `read_only`); `cache` has `fast`, `lower`, `slack` (bytes), `policy` and
    /// `admission`.
    #[staticmethod]
    #[pyo3(signature = (manager, shape, home, cache=None))]
    fn new(
        py: Python<'_>,
        manager: &PyManager,
        shape: (usize, usize, String),
        home: &Bound<'_, PyDict>,
        cache: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        let (rows, width, dtype) = shape;
        let shape = Shape {
            rows,
            width,
            dtype: DType::parse(&dtype).map_err(to_py)?,
        };
        let cache = cache.map(cache_of).transpose()?;
        let m = Arc::clone(&manager.inner);
        let kind: String = item(home, "kind")?;
        let t = match kind.as_str() {
            "memory" => {
                let device: usize = item(home, "device")?;
                run(py, || {
                    let make = |s| Ok(MemoryHome::new(&m, device, rows, s)?.into());
                    Table::new(&m, shape, make, cache)
                })?
            }
            "model" => {
                let model: PyRef<'_, crate::core::model::PyTwoLm> = item(home, "model")?;
                let md = Arc::clone(&model.inner);
                drop(model);
                run(py, || {
                    let make = |s| Ok(ModelHome::new(&m, &md, rows, s)?.into());
                    Table::new(&m, shape, make, cache)
                })?
            }
            "block" | "file" => {
                let path: std::path::PathBuf = item(home, "path")?;
                let name: String = item(home, "name")?;
                let attach: bool = item(home, "attach")?;
                let Some(cache) = cache else {
                    return Err(to_py(Error::InvalidArgument(format!(
                        "a {kind} table reads its rows through a cache: give it one ({})",
                        path.display()
                    ))));
                };
                if kind == "block" {
                    let depth: Option<usize> = item(home, "depth")?;
                    let depth = depth.unwrap_or_else(tiermem_core::calib::block_depth);
                    let want = (rows as u64, width as u32, shape.dtype);
                    run(py, || {
                        let file = if attach {
                            BlockFile::open(&path, &name, depth, Some(want), false)?
                        } else {
                            BlockFile::create(&path, &name, want.0, want.1, want.2, false, depth)?
                        };
                        Table::block(&m, cache.fast, file, cache.config)
                    })?
                } else {
                    let read_only: bool = item(home, "read_only")?;
                    run(py, || {
                        let make = |s| {
                            let h = if attach {
                                FileHome::open(&path, &name, rows as u64, s, read_only)?
                            } else {
                                FileHome::create(&path, &name, rows as u64, s)?
                            };
                            Ok(h.into())
                        };
                        Table::new(&m, shape, make, Some(cache))
                    })?
                }
            }
            other => {
                return Err(to_py(Error::InvalidArgument(format!(
                    "home kind '{other}': known are {}",
                    tiermem_embed::home::KINDS.join(", ")
                ))))
            }
        };
        Ok(PyTable {
            inner: Shared::new(t),
            relayout_done: Arc::default(),
        })
    }

    /// Put a block table's rows in `layout`'s order (uint32, row → position): written
    /// aside in chunks of at most `budget` bytes and switched in atomically.
    fn relayout(&self, py: Python<'_>, layout: &Bound<'_, PyAny>, budget: usize) -> PyResult<()> {
        let v = view::<u32>(layout, "layout (uint32)", false)?;
        // SAFETY: `v` keeps the buffer exported for the call; only read.
        let l = unsafe { v.slice() }.to_vec();
        let done = Arc::clone(&self.relayout_done);
        done.store(0, Ordering::Relaxed);
        run(py, || {
            self.inner
                .relayout(l, budget, |d, _| done.store(d, Ordering::Relaxed))
        })
    }

    /// Data blocks the relayout in progress has written (0 before its first chunk).
    fn relayout_progress(&self) -> u64 {
        self.relayout_done.load(Ordering::Relaxed)
    }

    /// Stage these rows (int64 indices) into a block table's cache ahead of the lookup that
    /// will use them; returns the distinct rows that were missing (0 for other tables).
    fn prefetch(&self, py: Python<'_>, indices: &Bound<'_, PyAny>) -> PyResult<u64> {
        let v = view::<i64>(indices, "indices (int64)", false)?;
        // SAFETY: `v` keeps the buffer exported for the call; only read.
        run(py, || self.inner.prefetch(unsafe { v.slice() }))
    }

    /// Write a block table's updated rows to its file and sync it (no-op for others).
    fn sync(&self, py: Python<'_>) -> PyResult<()> {
        run(py, || self.inner.sync())
    }

    /// Fault tests: a block table's reads fail with EIO after `reads` more requests, its
    /// writes after `writes` more (None: never).
    #[pyo3(signature = (reads=None, writes=None))]
    fn inject_io_faults(&self, reads: Option<u64>, writes: Option<u64>) -> PyResult<()> {
        self.inner.inject_faults(reads, writes).map_err(to_py)
    }

    /// Copy a block table's file, synced first, to `path`; returns how ("reflink" or
    /// "copy") and the file's layout generation.
    fn snapshot(&self, py: Python<'_>, path: std::path::PathBuf) -> PyResult<(&'static str, u64)> {
        run(py, || {
            self.inner.snapshot(&path).map(|(how, g)| (how.name(), g))
        })
    }

    /// A block table's file, layout generation, prefetch admission and I/O counters; None
    /// for other tables.
    fn block_info<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let Some(c) = self.inner.cache() else {
            return Ok(None);
        };
        let (Some((prefetch, st)), Some(b)) = (c.stage_info(), c.home().block()) else {
            return Ok(None);
        };
        let (io, f) = (b.counters(), b.file());
        let h = f.header();
        let d = PyDict::new(py);
        d.set_item("path", f.path())?;
        d.set_item("generation", h.generation)?;
        d.set_item("admission", prefetch)?;
        d.set_item("depth", f.depth())?;
        d.set_item("read_engine", f.read_engine())?;
        d.set_item("rows_per_block", h.rows_per_block)?;
        d.set_item("data_blocks", h.data_blocks)?;
        for (k, v) in [
            ("accesses", st.accesses),
            ("misses", st.misses),
            ("blocks_read", st.blocks_read),
            ("prefetched", st.prefetched),
            ("rows_written", io.rows_written),
            ("blocks_written", io.blocks_written),
            ("write_requests", io.write_requests),
            ("log_blocks", f.log_figures().blocks),
            ("compactions", f.log_figures().compactions),
            ("pending_rows", b.pending_rows() as u64),
        ] {
            d.set_item(k, v)?;
        }
        Ok(Some(d))
    }

    /// A file table's path, whether read-only, and I/O counters; None for other tables.
    fn file_info<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let Some(c) = self.inner.cache() else {
            return Ok(None);
        };
        let (Some((_, st)), Some(f)) = (c.stage_info(), c.home().file()) else {
            return Ok(None);
        };
        let io = f.counters();
        let d = PyDict::new(py);
        d.set_item("path", f.path())?;
        d.set_item("read_only", f.read_only())?;
        for (k, v) in [
            ("accesses", st.accesses),
            ("misses", st.misses),
            ("rows_read", io.rows_read),
            ("reads", io.reads),
            ("rows_written", io.rows_written),
            ("pending_rows", f.pending_rows() as u64),
        ] {
            d.set_item(k, v)?;
        }
        Ok(Some(d))
    }

    /// Per-row query counts of the layout's training trace (threshold admission).
    fn set_access_counts(&self, counts: &Bound<'_, PyAny>) -> PyResult<()> {
        let v = view::<u32>(counts, "counts", false)?;
        // SAFETY: `v` keeps the buffer exported for the call.
        let counts = unsafe { v.slice() }.to_vec();
        let c = self.cache()?;
        c.set_access_counts(counts).map_err(to_py)
    }

    /// Change a block table's admission of a read block's other rows (`row`, `row:T`,
    /// `block`, `threshold:T`, `shadow:M`).
    fn set_admission(&self, admission: &str) -> PyResult<()> {
        let a = Admission::parse(admission).map_err(to_py)?;
        self.cache()?.set_admission(a);
        Ok(())
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
    fn devices(&self) -> (Option<usize>, Option<usize>) {
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
            ("rows_evicted", s.rows_evicted),
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
                ("bypass", u64::from(c.bypassing())),
                ("resident", u64::from(c.resident())),
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

    fn set_bypass(&self, on: bool) -> PyResult<()> {
        self.cache()?.set_bypass(on).map_err(to_py)
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

    /// The optimizer the rows were last updated with (or a re-attached file's), or None.
    fn trained_with(&self, py: Python<'_>) -> PyResult<Option<&'static str>> {
        run(py, || self.inner.trained_with())
    }

    /// Forget the optimizer's state and steps.
    fn reset_optimizer(&self, py: Python<'_>) -> PyResult<()> {
        run(py, || self.inner.reset_optimizer())
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

/// `d[key]`, converted; a missing key or a value of the wrong type is an error naming it.
fn item<'py, T: pyo3::conversion::FromPyObjectOwned<'py>>(
    d: &Bound<'py, PyDict>,
    key: &str,
) -> PyResult<T> {
    match d.get_item(key)? {
        Some(v) => v.extract::<T>().map_err(|e| {
            let e: PyErr = e.into();
            to_py(Error::InvalidArgument(format!(
                "placement setting '{key}': {e}"
            )))
        }),
        None => Err(to_py(Error::InvalidArgument(format!(
            "placement setting '{key}' is missing"
        )))),
    }
}

/// A cache as Python describes it (see `PyTable::new`).
fn cache_of(d: &Bound<'_, PyDict>) -> PyResult<Cache> {
    let policy: String = item(d, "policy")?;
    let admission: Option<String> = item(d, "admission")?;
    Ok(Cache {
        fast: item(d, "fast")?,
        config: CacheConfig {
            lower: item(d, "lower")?,
            slack: item(d, "slack")?,
            policy: tiermem_embed::cache::policy::by_name(&policy).map_err(to_py)?,
            admission: admission
                .map(|a| Admission::parse(&a))
                .transpose()
                .map_err(to_py)?,
        },
    })
}

/// Fast memory a cache of `slots` rows takes beside its pages and pointer table (its
/// back-edges and bitmap of holes), in bytes.
#[pyfunction]
pub fn cache_slot_metadata_bytes(slots: usize) -> u64 {
    tiermem_embed::cache::slot_metadata_bytes(slots)
}

/// DRAM a table of `rows` rows keeps per row whatever its cache's size (reindex scratch;
/// for a cached table also the pointer table and the bitmap of cached rows), in bytes.
#[pyfunction]
#[pyo3(signature = (rows, cached=true))]
pub fn table_row_metadata_bytes(rows: usize, cached: bool) -> u64 {
    tiermem_embed::table::row_metadata_bytes(rows, cached)
}

/// Bytes a row of `width` values of storage type `dtype` (a name of `DTYPES`) takes in a
/// table (`tiermem_embed::table::stride_of`).
#[pyfunction]
pub fn table_row_stride(width: usize, dtype: &str) -> PyResult<usize> {
    let dt = tiermem_embed::DType::parse(dtype).map_err(to_py)?;
    Ok(tiermem_embed::table::stride_of(width, dt))
}

/// The devices `[(spec, bytes)]` of a private manager for a table of `table_bytes` whose
/// rows live on `spec`, cached (`cache`: its size and slack as fractions of the table) or
/// not (`tiermem_embed::table::private_devices`).
#[pyfunction]
#[pyo3(signature = (spec, table_bytes, cache=None))]
pub fn table_private_devices(
    spec: &str,
    table_bytes: u64,
    cache: Option<(f64, f64)>,
) -> Vec<(String, u64)> {
    tiermem_embed::table::private_devices(spec, table_bytes, cache)
}
