//! An embedding table: rows of `width` elements on one device (direct) or cached (base rows
//! on a slow device, cache pages in fast memory). Its memory comes from the manager as
//! objects pinned in place for the table's lifetime, so the table shows up in the manager's
//! usage and counters and no policy ever moves it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};

pub(crate) mod locks;
mod private;

pub use private::private_devices;

use super::blockfile::{optstate, BlockFile};
use super::cache::{CacheConfig, CachedRows, Room, MAX_ROWS};
use super::home::{BlockHome, Home, MemoryHome, ModelHome};
use super::rows::{RowFn, RowSource, Tally};
use super::DType;
use tiermem_core::manager::{Manager, Reservation};
use tiermem_core::model::TwoLm;
use tiermem_core::sys::clone::CloneHow;
use tiermem_core::sys::huge::HugeSlice;
use tiermem_core::{ensure, Error, Result};

pub(crate) enum Storage {
    /// Kernels read and update rows in their home.
    Direct(Home),
    /// Through a cache in fast memory in front of the home.
    Cached(Box<CachedRows>),
}

/// Per-table optimizer state and reindex scratch; lives under the exclusive lock.
pub(crate) struct Mutable {
    /// Row -> unique slot during reindexing (`u32::MAX` when unseen).
    pub(crate) slot_of: HugeSlice<u32>,
    /// The fused optimizer's state: its name and `rows x state_len` floats (Adagrad's sums of
    /// squares, row-wise Adagrad's accumulators), for optimizers that keep any.
    pub(crate) state: Option<(&'static str, HugeSlice<f32>)>,
    /// Optimizer steps taken (Adagrad learning-rate decay).
    pub(crate) steps: u64,
    /// The optimizer of the last update (stateless ones too), or of a re-attached file.
    pub(crate) optimizer: Option<&'static str>,
    /// Whether `optimizer` came from a table file's companion: updating with another is
    /// refused until the state is reset.
    pub(crate) optimizer_fixed: bool,
}

/// Hit/miss counters of a table since creation or the last reset.
#[derive(Debug, Default, Clone, Copy, serde::Serialize)]
pub struct TableStats {
    /// Row reads served from fast memory.
    pub hits: u64,
    /// Row reads served from the slow device's base rows.
    pub misses: u64,
    /// Rows copied into the cache.
    pub rows_cached: u64,
    /// Cache pages flushed.
    pub pages_flushed: u64,
    /// Dirty rows written back by flushes and reclaims.
    pub rows_written_back: u64,
    /// Rows that left the cache (reclaims and flushes).
    pub rows_evicted: u64,
}

/// An embedding table (thesis Table 5.2 / 5.4).
pub struct Table {
    rows: usize,
    width: usize,
    dtype: DType,
    stride: usize,
    pub(crate) storage: Storage,
    /// Taken only through [`locks`] (the lock order).
    pub(super) lock: RwLock<Mutable>,
    /// The process it was made in (a forked child refuses it).
    pub(super) born: tiermem_core::process::Born,
    padding: std::sync::atomic::AtomicI64,
    hits: AtomicU64,
    misses: AtomicU64,
    cached: AtomicU64,
    base_flushed: Mutex<(u64, u64, u64)>,
}

pub use crate::MAX_WIDTH;

/// A table's shape: `rows` rows of `width` elements stored as `dtype`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// Rows.
    pub rows: usize,
    /// Elements per row.
    pub width: usize,
    /// Storage type.
    pub dtype: DType,
}

/// A cache in front of a table's home: pages on manager device `fast`, sized and run as
/// `config` says.
#[derive(Debug, Clone)]
pub struct Cache {
    /// Manager index of the device holding the cache pages.
    pub fast: usize,
    /// Sizes and policy.
    pub config: CacheConfig,
}

/// Bytes per row; `width` is at most [`MAX_WIDTH`] (checked by `check_shape`), so no overflow.
#[must_use]
pub fn stride_of(width: usize, dtype: DType) -> usize {
    dtype.row_bytes(width).next_multiple_of(4)
}

/// DRAM a table of `rows` rows keeps per row outside the manager's devices, whatever its
/// cache's size: the reindex scratch (4 bytes a row) and, for a cached table, the pointer
/// table and the bitmap of cached rows ([`crate::cache::row_metadata_bytes`]).
#[must_use]
pub fn row_metadata_bytes(rows: usize, cached: bool) -> u64 {
    4 * rows as u64
        + if cached {
            crate::cache::row_metadata_bytes(rows)
        } else {
            0
        }
}

impl Table {
    fn check_shape(rows: usize, width: usize) -> Result<()> {
        ensure!(rows > 0, "an embedding table needs at least one row");
        ensure!(
            width > 0,
            "an embedding table needs a row width of at least 1"
        );
        ensure!(
            rows <= u32::MAX as usize,
            "{rows} rows: tables hold at most {} rows",
            u32::MAX
        );
        ensure!(
            width <= MAX_WIDTH,
            "row width {width}: rows hold at most {MAX_WIDTH} elements"
        );
        Ok(())
    }

    fn build(rows: usize, width: usize, dtype: DType, storage: Storage) -> Result<Self> {
        Self::check_shape(rows, width)?;
        let mut slot_of = HugeSlice::zeroed(rows)?;
        slot_of.fill(u32::MAX);
        Ok(Table {
            rows,
            width,
            dtype,
            stride: stride_of(width, dtype),
            storage,
            lock: RwLock::new(Mutable {
                slot_of,
                state: None,
                steps: 0,
                optimizer: None,
                optimizer_fixed: false,
            }),
            born: tiermem_core::process::Born::now(),
            padding: std::sync::atomic::AtomicI64::new(-1),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            cached: AtomicU64::new(0),
            base_flushed: Mutex::new((0, 0, 0)),
        })
    }

    /// The table constructor: rows of `shape` in the home `make` builds for the row stride
    /// it is given (after the shape is checked), behind `cache` if given. A home whose rows
    /// are not in memory (a file) needs a cache. Every other constructor is this one.
    pub fn new(
        manager: &Arc<Manager>,
        shape: Shape,
        make: impl FnOnce(usize) -> Result<Home>,
        cache: Option<Cache>,
    ) -> Result<Self> {
        let Shape { rows, width, dtype } = shape;
        match cache {
            None => Self::over_home(rows, width, dtype, make),
            Some(c) => Self::cached_over(manager, c.fast, rows, width, dtype, c.config, make),
        }
    }

    /// A direct table over the home `make` builds for rows of the stride it is given (after
    /// the shape is checked).
    pub fn over_home(
        rows: usize,
        width: usize,
        dtype: DType,
        make: impl FnOnce(usize) -> Result<Home>,
    ) -> Result<Self> {
        Self::check_shape(rows, width)?;
        let home = make(stride_of(width, dtype))?;
        ensure!(
            !home.staged(),
            "a {} table's rows are not in memory: they are read through a cache, so give it one",
            home.kind()
        );
        Self::build(rows, width, dtype, Storage::Direct(home))
    }

    /// A table whose rows live directly on manager device `device`. Rows start as zeros.
    pub fn direct(
        manager: &Arc<Manager>,
        device: usize,
        rows: usize,
        width: usize,
        dtype: DType,
    ) -> Result<Self> {
        Self::over_home(rows, width, dtype, |stride| {
            Ok(MemoryHome::new(manager, device, rows, stride)?.into())
        })
    }

    /// A table whose rows live on the 2LM model's slow device, every access running through
    /// the model (the hardware-cache baseline). Rows start as zeros.
    pub fn behind_model(
        manager: &Arc<Manager>,
        model: &Arc<TwoLm>,
        rows: usize,
        width: usize,
        dtype: DType,
    ) -> Result<Self> {
        Self::over_home(rows, width, dtype, |stride| {
            Ok(ModelHome::new(manager, model, rows, stride)?.into())
        })
    }

    /// A cached table: base rows on device `slow`, cache pages for `cachelower + cacheslack`
    /// bytes reserved on device `fast`. Rows start as zeros, none cached.
    pub fn cached(
        manager: &Arc<Manager>,
        slow: usize,
        fast: usize,
        rows: usize,
        width: usize,
        dtype: DType,
        config: CacheConfig,
    ) -> Result<Self> {
        ensure!(slow != fast, "a cached table needs two different devices");
        let n = manager.devices().len();
        ensure!(
            slow < n,
            "device index {slow} (base rows) must be below {n}"
        );
        Self::cached_over(manager, fast, rows, width, dtype, config, |stride| {
            Ok(MemoryHome::new(manager, slow, rows, stride)?.into())
        })
    }

    /// A block table: rows in the table file `file` (created or re-attached), a cache of
    /// `cachelower + cacheslack` bytes on manager device `fast`, rows of the file's shape.
    /// Every call stages the rows it touches into the cache first (read from the file in
    /// one batch); dirty rows go back to the file as the cache makes room, on
    /// [`Table::sync`] and when the table is dropped.
    pub fn block(
        manager: &Arc<Manager>,
        fast: usize,
        file: BlockFile,
        config: CacheConfig,
    ) -> Result<Self> {
        let h = *file.header();
        let rows = usize::try_from(h.rows).map_err(|_| {
            Error::InvalidArgument(format!("{} rows do not fit this machine", h.rows))
        })?;
        let saved =
            optstate::read(file.path(), h.rows, h.width).map_err(|what| Error::Corrupt {
                path: optstate::path_of(file.path()).display().to_string(),
                what: format!("table '{}': {what}", file.name()),
            })?;
        if let Some(s) = &saved {
            ensure!(
                s.generation == h.generation,
                "table '{}': the optimizer state beside {} was written at layout generation {}, \
                 the file is at generation {}: they are not one table's (restore both from one \
                 checkpoint)",
                file.name(),
                file.path().display(),
                s.generation,
                h.generation
            );
        }
        let t = Self::cached_over(
            manager,
            fast,
            rows,
            h.width as usize,
            h.dtype,
            config,
            |stride| {
                ensure!(
                    stride == file.stride(),
                    "table file '{}' has rows of {} bytes, expected {stride}",
                    file.path().display(),
                    file.stride()
                );
                Ok(BlockHome::new(file).into())
            },
        )?;
        if let Some(s) = saved {
            t.restore_saved(s)?;
        }
        Ok(t)
    }

    /// Take a companion's optimizer, steps and state (a re-attached block table).
    fn restore_saved(&self, s: optstate::Saved) -> Result<()> {
        let (kind, per_row) = super::optim::state_of(&s.optimizer, self.width)?;
        ensure!(
            s.state.len() == self.rows * per_row,
            "optimizer '{kind}' keeps {per_row} floats per row; its saved state has {}",
            s.state.len()
        );
        let mut x = self.exclusive()?;
        x.state = if per_row == 0 {
            None
        } else {
            let mut v = HugeSlice::zeroed(s.state.len())?;
            v.copy_from_slice(&s.state);
            Some((kind, v))
        };
        x.steps = s.steps;
        x.optimizer = Some(kind);
        x.optimizer_fixed = true;
        Ok(())
    }
}

/// Write a block table's optimizer companion (if an update has run) for the file at its
/// current generation; call under the exclusive lock.
/// Nothing is written when the table file's name is gone or names another file (a scratch
/// table removed while open).
fn save_optimizer(x: &Mutable, file: &BlockFile) -> Result<()> {
    // The state's own optimizer where there is state (a table may have been stepped by a
    // stateless one since), else the last one's.
    let Some(k) = x.state.as_ref().map(|(k, _)| *k).or(x.optimizer) else {
        return Ok(());
    };
    if !file.still_at_path() {
        return Ok(());
    }
    let h = file.header();
    let s = optstate::Saved {
        optimizer: k.to_owned(),
        steps: x.steps,
        generation: h.generation,
        rows: h.rows,
        width: h.width,
        state: x
            .state
            .as_ref()
            .map(|(_, v)| v.to_vec())
            .unwrap_or_default(),
    };
    optstate::write(file.path(), &s).map_err(|e| {
        Error::io(
            file.name(),
            &optstate::path_of(file.path()).display().to_string(),
            "write the optimizer state",
            e,
        )
    })
}

impl Drop for Table {
    /// A block table's optimizer state goes into its file's companion when the table goes
    /// (no lock to wait for: nothing else holds the table). A failure is reported on
    /// stderr (a drop has no caller to return it to).
    fn drop(&mut self) {
        let Storage::Cached(c) = &self.storage else {
            return;
        };
        let Some(b) = c.home().block() else {
            return;
        };
        if b.file().forked() {
            return; // a forked child's copy: the file and its companion are the parent's
        }
        if let Err(e) = save_optimizer(self.lock.get_mut(), &b.file()) {
            eprintln!("tiermem: saving a block table's optimizer state on close: {e}");
        }
    }
}

impl Table {
    /// The optimizer this table's rows were last updated with (or its re-attached file's).
    pub fn trained_with(&self) -> Result<Option<&'static str>> {
        Ok(self.shared()?.optimizer)
    }

    /// Forget the optimizer's state and steps (a table re-initialised, or switched to
    /// another optimizer on purpose).
    pub fn reset_optimizer(&self) -> Result<()> {
        let mut x = self.exclusive()?;
        x.state = None;
        x.steps = 0;
        x.optimizer = None;
        x.optimizer_fixed = false;
        Ok(())
    }

    /// A cached table over the home `make` builds for rows of the stride it is given, its
    /// cache on device `fast`.
    fn cached_over(
        manager: &Arc<Manager>,
        fast: usize,
        rows: usize,
        width: usize,
        dtype: DType,
        config: CacheConfig,
        make: impl FnOnce(usize) -> Result<Home>,
    ) -> Result<Self> {
        Self::check_shape(rows, width)?;
        ensure!(
            rows < MAX_ROWS,
            "{rows} rows: cached tables hold fewer than {MAX_ROWS} rows"
        );
        let stride = stride_of(width, dtype);
        let table_bytes = rows as u64 * stride as u64;
        let want = config.lower.saturating_add(config.slack).min(table_bytes);
        ensure!(want >= stride as u64, "the cache must hold at least one row ({stride} bytes); cachelower + cacheslack is {} bytes", config.lower.saturating_add(config.slack));
        let cache_rows = (want / stride as u64) as usize;
        let frame_rows = CachedRows::frame_rows(cache_rows, stride);
        let frames = cache_rows.div_ceil(frame_rows);
        let cache_bytes = (frames * frame_rows * stride) as u64;
        let n = manager.devices().len();
        ensure!(fast < n, "device index {fast} (cache) must be below {n}");
        let fast_dev = &manager.devices()[fast];
        ensure!(
            cache_bytes <= fast_dev.capacity,
            "a cache of {cache_bytes} bytes does not fit fast device '{}' ({} bytes capacity)",
            fast_dev.name,
            fast_dev.capacity
        );
        let home = make(stride)?;
        let cache = Reservation::new(manager, fast, cache_bytes)?;
        let config = CacheConfig {
            lower: config.lower.min(cache_bytes),
            slack: config
                .slack
                .min(cache_bytes - config.lower.min(cache_bytes)),
            ..config
        };
        // SAFETY: the home holds rows * stride bytes (or stages them), the cache frames *
        // frame_rows * stride; the cached rows own both.
        let rows_impl = unsafe {
            CachedRows::new(
                rows,
                stride,
                home,
                (cache, manager.devices()[fast].clone()),
                frame_rows,
                frames,
                config,
            )
        }?;
        Self::build(rows, width, dtype, Storage::Cached(Box::new(rows_impl)))
    }

    /// The padding row (`torch.nn.EmbeddingBag`'s `padding_idx`): its indices are left out
    /// of reductions (and of a mean's count), and updates never change it.
    #[must_use]
    pub fn padding_idx(&self) -> Option<usize> {
        usize::try_from(self.padding.load(Ordering::Relaxed)).ok()
    }

    /// Set or clear the padding row.
    pub fn set_padding_idx(&self, row: Option<usize>) -> Result<()> {
        if let Some(r) = row {
            ensure!(
                r < self.rows,
                "padding_idx {r} is outside the table's {} rows",
                self.rows
            );
        }
        let _x = self.exclusive()?;
        self.padding
            .store(row.map_or(-1, |r| r as i64), Ordering::Relaxed);
        Ok(())
    }

    /// Rows.
    #[must_use]
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Elements per row (thesis `featuresize`).
    #[must_use]
    pub fn featuresize(&self) -> usize {
        self.width
    }

    /// Storage type.
    #[must_use]
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Bytes between rows.
    #[must_use]
    pub fn stride(&self) -> usize {
        self.stride
    }

    /// The cache of a cached table.
    #[must_use]
    pub fn cache(&self) -> Option<&CachedRows> {
        match &self.storage {
            Storage::Cached(c) => Some(c),
            Storage::Direct(_) => None,
        }
    }

    /// Where the rows live when not cached.
    #[must_use]
    pub fn home(&self) -> &Home {
        match &self.storage {
            Storage::Direct(h) => h,
            Storage::Cached(c) => c.home(),
        }
    }

    /// Whether the table stages the rows each call touches into its cache (a block table).
    #[must_use]
    pub fn staged(&self) -> bool {
        self.cache().is_some_and(CachedRows::staged)
    }

    /// Manager device indices: (home, cache); the home's is `None` for a table file.
    #[must_use]
    pub fn devices(&self) -> (Option<usize>, Option<usize>) {
        match &self.storage {
            Storage::Direct(h) => (h.device_index(), None),
            Storage::Cached(c) => (c.home().device_index(), Some(c.cache_device())),
        }
    }

    pub(crate) fn shared(&self) -> Result<RwLockReadGuard<'_, Mutable>> {
        locks::shared(self)
    }

    pub(crate) fn exclusive(&self) -> Result<RwLockWriteGuard<'_, Mutable>> {
        locks::exclusive(self)
    }

    /// Run `f` with the table's row source: `caching` picks `access_and_cache` for cached
    /// tables under the dynamic policy.
    pub(crate) fn with_rows<T>(&self, caching: bool, f: impl RowFn<T>) -> T {
        match &self.storage {
            Storage::Direct(h) => h.with(f),
            Storage::Cached(c) => match c.resident_view() {
                Some(v) => f.call(&v),
                None if c.reads_home() => c.home().with(f),
                None => f.call(&c.view(caching && c.caches_on_lookup())),
            },
        }
    }

    pub(crate) fn record(&self, t: &Tally) {
        self.hits.fetch_add(t.hits, Ordering::Relaxed);
        self.misses.fetch_add(t.misses, Ordering::Relaxed);
        self.cached.fetch_add(t.cached, Ordering::Relaxed);
    }

    /// Hit/miss counters.
    #[must_use]
    pub fn stats(&self) -> TableStats {
        let c = self.cache().map(CachedRows::counters).unwrap_or_default();
        let base = *self.base_flushed.lock();
        TableStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            rows_cached: self.cached.load(Ordering::Relaxed),
            pages_flushed: c.pages_flushed - base.0,
            rows_written_back: c.rows_written_back - base.1,
            rows_evicted: c.rows_evicted - base.2,
        }
    }

    /// Zero the counters.
    pub fn reset_stats(&self) {
        self.hits.store(0, Ordering::Relaxed);
        self.misses.store(0, Ordering::Relaxed);
        self.cached.store(0, Ordering::Relaxed);
        let c = self.cache().map(CachedRows::counters).unwrap_or_default();
        *self.base_flushed.lock() = (c.pages_flushed, c.rows_written_back, c.rows_evicted);
    }

    /// `flush_dirty` (`write_back`) or `flush_clean`: shrink the cache to `cachelower`.
    /// Waits for lookups in flight (exclusive lock). No-op for direct tables.
    pub fn flush(&self, write_back: bool) -> Result<u64> {
        let _x = self.exclusive()?;
        match self.cache() {
            Some(c) => c.flush(write_back),
            None => Ok(0),
        }
    }

    /// Make room in a full dynamic cache, keeping rows hit since they were cached (see
    /// `CachedRows::reclaim`); what lookups do when the cache is full. No-op for direct tables.
    pub fn reclaim(&self) -> Result<u64> {
        let _x = self.exclusive()?;
        match self.cache() {
            Some(c) => c.reclaim(),
            None => Ok(0),
        }
    }

    /// Fill the cache with rows in a scrambled order (LFSR, `seed`) until it is full: the
    /// `static` policy's warm-up, and a way to cache every row of a table whose cache can
    /// hold it. Returns rows cached.
    pub fn fill_cache(&self, seed: u64) -> Result<u64> {
        let _x = self.exclusive()?;
        let Some(c) = self.cache() else {
            return Ok(0);
        };
        let t = if c.holds_every_row() {
            // Every row will be cached, so the order only decides the slots: row order puts
            // each in the slot of its number, and lookups then skip the pointer table.
            Self::fill_in(c, 0..self.rows)?
        } else {
            Self::fill_in(c, super::workload::Lfsr::permutation(self.rows, seed)?)?
        };
        self.record(&Tally {
            hits: 0,
            misses: 0,
            ..t
        });
        Ok(t.cached)
    }

    /// Cache rows of `c` in `order` until it is full (staged or not), then see whether
    /// every row sits at the slot of its number. Exclusive lock held.
    fn fill_in(c: &CachedRows, order: impl Iterator<Item = usize>) -> Result<Tally> {
        let t = if c.staged() {
            c.stage_fill(order)?
        } else {
            c.fill(order)
        };
        c.settle_resident();
        Ok(t)
    }

    /// Fill the cache with `rows`, in the order given, until it is full (e.g. the rows a
    /// profile of the input uses most, hottest first); rows already cached are skipped.
    /// Every row is checked before any is cached. Returns rows cached.
    pub fn fill_cache_rows(&self, rows: &[u64]) -> Result<u64> {
        if let Some(bad) = rows.iter().position(|&r| r >= self.rows as u64) {
            return Err(Error::IndexOutOfRange {
                table: 0,
                position: bad,
                value: rows[bad] as i64,
                rows: self.rows,
            });
        }
        let _x = self.exclusive()?;
        let Some(c) = self.cache() else {
            return Ok(0);
        };
        let t = Self::fill_in(c, rows.iter().map(|&r| r as usize))?;
        self.record(&Tally {
            hits: 0,
            misses: 0,
            ..t
        });
        Ok(t.cached)
    }

    /// Copy rows `start..start + n` out as `f32` (following the pointer table, so cached
    /// and updated rows read their newest value) into `out` (`n * width` floats).
    pub fn read_rows(&self, start: usize, out: &mut [f32]) -> Result<()> {
        let n = self.span(start, out.len())?;
        if let Some(c) = self.cache().filter(|c| c.staged()) {
            return self.read_through(c, start, n, out);
        }
        let _s = self.shared()?;
        self.copy_rows(start, CopyDir::Out(out));
        Ok(())
    }

    /// A staged table's rows `start..start + n` into `out` without caching them
    /// ([`CachedRows::read_through`]), in pieces of at most 16 MiB of rows.
    fn read_through(&self, c: &CachedRows, start: usize, n: usize, out: &mut [f32]) -> Result<()> {
        use super::codec::{with_codec, RowCodec};
        let _x = self.exclusive()?;
        let (w, dtype) = (self.width, self.dtype);
        let piece = ((16usize << 20) / self.stride).max(1);
        // Rows of the write-back buffer need not be aligned: each row goes through this.
        let mut row_buf = vec![0u32; self.stride.div_ceil(4)];
        let mut first = start;
        while first < start + n {
            let k = piece.min(start + n - first);
            c.read_through(first as u64, k as u64, |row, bytes| {
                let dst = &mut out[(row as usize - start) * w..][..w];
                let aligned = &mut row_buf[..];
                // SAFETY: `aligned` holds at least `bytes.len()` (one stride) bytes.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        bytes.as_ptr(),
                        aligned.as_mut_ptr().cast::<u8>(),
                        bytes.len(),
                    );
                }
                // SAFETY: `aligned` holds one stored row: at least `width` elements of the
                // table's type, 4-byte aligned.
                unsafe {
                    with_codec!(dtype, C => C::load_row(dst, aligned.as_ptr().cast()));
                }
            })?;
            first += k;
        }
        Ok(())
    }

    fn copy_rows(&self, start: usize, out: CopyDir<'_>) {
        self.with_rows(
            false,
            RowCopy {
                start,
                width: self.width,
                dtype: self.dtype,
                out,
            },
        );
    }

    /// Stage rows ahead of the call that will use them (the prefetch pipeline: the next
    /// batch's indices, while the current step computes): a block table reads the missing
    /// ones into its cache now, so that call only hits. Room is made by one reclaim pass,
    /// which keeps the rows used since the previous one (the step in flight's), and what
    /// does not fit is left for the call to stage. A `dynamic` cache over a home in memory
    /// caches the missing rows the same way ([`CachedRows::prefetch_rows`]). Every index is
    /// checked first. No-op for direct tables and for caches that do not cache on lookup
    /// (`static`), admit on a second miss (`admit`), are bypassed or hold every row.
    /// Returns the distinct rows that were missing.
    pub fn prefetch(&self, indices: &[i64]) -> Result<u64> {
        let Some(c) = self.cache() else {
            return Ok(0);
        };
        super::bags::check_indices(0, indices, self.rows)?;
        let _x = self.exclusive()?;
        if c.staged() {
            let mut rows: Vec<u64> = indices.iter().map(|&v| v as u64).collect();
            return Ok(c.stage(&mut rows, Room::Once)?.misses);
        }
        let t = c.prefetch_rows(indices)?;
        self.record(&Tally {
            cached: t.cached,
            ..Tally::default()
        });
        Ok(t.misses)
    }

    /// Put a block table's rows in a new order (`layout`: row → position, e.g. from
    /// [`crate::layout::shp`]): dirty rows are written back, then the file is rewritten
    /// aside in chunks of at most `budget` bytes and switched in atomically
    /// ([`BlockFile::relayout`]). Cached rows stay cached. `progress(done, total)` gets
    /// blocks written.
    pub fn relayout(
        &self,
        layout: Vec<u32>,
        budget: usize,
        progress: impl FnMut(u64, u64),
    ) -> Result<()> {
        let _x = self.exclusive()?;
        let Some(c) = self.cache().filter(|c| c.staged()) else {
            tiermem_core::bail!("only a block table has a layout to change");
        };
        c.write_back_dirty()?;
        match c.home().block() {
            Some(b) => {
                b.relayout(layout, budget, progress)?;
                save_optimizer(&_x, &b.file())
            }
            None => Ok(()),
        }
    }

    /// Snapshot a block table's file to `dst`: its newest values are made durable first
    /// ([`Table::sync`]), then the file is copied whole without passing through this process
    /// ([`BlockFile::snapshot`]), all under the
    /// exclusive lock so no write-back lands mid-copy. Returns how it was copied and the
    /// file's layout generation.
    pub fn snapshot(&self, dst: &std::path::Path) -> Result<(CloneHow, u64)> {
        let _x = self.exclusive()?;
        let Some((c, b)) = self
            .cache()
            .filter(|c| c.staged())
            .and_then(|c| c.home().block().map(|b| (c, b)))
        else {
            tiermem_core::bail!("only a block table has a file to snapshot");
        };
        c.write_back_dirty()?;
        b.sync()?;
        let f = b.file();
        Ok((f.snapshot(dst)?, f.header().generation))
    }

    /// Make a block table's reads fail with `EIO` after `reads` more requests and its
    /// writes after `writes` more (`None`: never); for fault tests
    /// ([`BlockFile::inject_faults`]).
    pub fn inject_faults(&self, reads: Option<u64>, writes: Option<u64>) -> Result<()> {
        match self.cache().and_then(|c| c.home().block()) {
            Some(b) => {
                b.file().inject_faults(reads, writes);
                Ok(())
            }
            None => tiermem_core::bail!("only a block table has a file to inject faults into"),
        }
    }

    /// Make a file-backed table's file hold every row's newest value, durably: dirty cached
    /// rows are written back (they stay cached) and the file is synced (a block table's
    /// optimizer state too). No-op for tables in memory.
    pub fn sync(&self) -> Result<()> {
        let _x = self.exclusive()?;
        let Some(c) = self.cache().filter(|c| c.staged()) else {
            return Ok(());
        };
        c.write_back_dirty()?;
        c.home().sync()?;
        match c.home().block() {
            Some(b) => save_optimizer(&_x, &b.file()),
            None => Ok(()),
        }
    }

    /// Overwrite rows `start..start + n` from `f32` values (`n * width` floats), rounding
    /// to the storage type. Cached copies are updated too.
    pub fn write_rows(&self, start: usize, src: &[f32]) -> Result<()> {
        self.span(start, src.len())?;
        self.writable()?;
        if let Some(c) = self.cache().filter(|c| c.staged()) {
            let _x = self.exclusive()?;
            return c.write_through(start, src, self.width, self.dtype);
        }
        let _x = self.exclusive()?;
        self.copy_rows(start, CopyDir::In(src));
        Ok(())
    }

    /// An error if the rows' home is opened read-only (a user's file): nothing may change
    /// them, in the cache either.
    pub fn writable(&self) -> Result<()> {
        match self.cache() {
            Some(c) => c.home().writable(),
            None => Ok(()),
        }
    }

    fn span(&self, start: usize, floats: usize) -> Result<usize> {
        ensure!(
            floats.is_multiple_of(self.width),
            "{floats} values is not a whole number of rows of width {}",
            self.width
        );
        let n = floats / self.width;
        ensure!(
            start.checked_add(n).is_some_and(|e| e <= self.rows),
            "rows {start}..{} are outside the table's {} rows",
            start.saturating_add(n),
            self.rows
        );
        Ok(n)
    }

    /// Bytes of DRAM the table keeps outside the manager's devices (huge-page maps): the
    /// reindex scratch, optimizer state and, for cached tables, the pointer table and
    /// back-edges. Fast memory a report should count next to the manager's usage.
    pub fn metadata_bytes(&self) -> Result<u64> {
        let s = self.shared()?;
        let state = s.state.as_ref().map_or(0, |(_, v)| v.len());
        Ok(4 * state as u64
            + row_metadata_bytes(s.slot_of.len(), false)
            + self.cache().map_or(0, CachedRows::metadata_bytes))
    }

    /// The fused optimizer's state, if any: the optimizer's name, the state's length
    /// (`rows * width` for Adagrad, `rows` for row-wise Adagrad) and the steps taken.
    pub fn optimizer_state_info(&self) -> Result<Option<(&'static str, usize, u64)>> {
        let s = self.shared()?;
        Ok(s.state.as_ref().map(|(k, v)| (*k, v.len(), s.steps)))
    }

    /// Copy values `offset..offset + out.len()` of the optimizer state into `out` (its
    /// length from [`Table::optimizer_state_info`]; chunks let a checkpoint stream it).
    pub fn read_optimizer_state(&self, offset: usize, out: &mut [f32]) -> Result<()> {
        let s = self.shared()?;
        let Some((_, v)) = s.state.as_ref() else {
            tiermem_core::bail!("this table has no optimizer state (no stateful update has run)");
        };
        let end = offset.checked_add(out.len()).filter(|e| *e <= v.len());
        let Some(end) = end else {
            tiermem_core::bail!(
                "optimizer state values {offset}..{} are outside its {} values",
                offset.saturating_add(out.len()),
                v.len()
            );
        };
        out.copy_from_slice(&v[offset..end]);
        Ok(())
    }

    /// Write `values` at `offset` into the state of optimizer `kind` (from a checkpoint, in
    /// one piece or in chunks): state of another optimizer, or none, is replaced by zeros
    /// first. `steps` becomes the state's step count.
    pub fn set_optimizer_state(
        &self,
        kind: &str,
        offset: usize,
        values: &[f32],
        steps: u64,
    ) -> Result<()> {
        let (kind, per_row) = super::optim::state_of(kind, self.width)?;
        ensure!(
            per_row > 0,
            "optimizer '{kind}' keeps no state, so there is none to restore"
        );
        let want = self.rows * per_row;
        let end = offset.checked_add(values.len()).filter(|e| *e <= want);
        let Some(end) = end else {
            tiermem_core::bail!(
                "optimizer state values {offset}..{} for a table whose state has {want}",
                offset.saturating_add(values.len())
            );
        };
        let mut x = self.exclusive()?;
        if x.state.as_ref().is_none_or(|(k, _)| *k != kind) {
            x.state = Some((kind, HugeSlice::zeroed(want)?));
        }
        if let Some((_, v)) = x.state.as_mut() {
            v[offset..end].copy_from_slice(values);
        }
        x.steps = steps;
        x.optimizer = Some(kind);
        x.optimizer_fixed = false;
        Ok(())
    }
}

enum CopyDir<'a> {
    Out(&'a mut [f32]),
    In(&'a [f32]),
}

struct RowCopy<'a> {
    start: usize,
    width: usize,
    dtype: DType,
    out: CopyDir<'a>,
}

impl RowFn<()> for RowCopy<'_> {
    fn call<R: RowSource>(self, rows: &R) {
        use super::codec::{with_codec, RowCodec};
        let mut t = Tally::default();
        let (start, dtype) = (self.start, self.dtype);
        match self.out {
            CopyDir::Out(o) => {
                for (k, row) in o.chunks_exact_mut(self.width).enumerate() {
                    let p = rows.read(start + k, &mut t);
                    // SAFETY: start + k < rows (checked by `span`); the pointer is valid for
                    // `width` elements while our caller holds the shared lock.
                    unsafe {
                        with_codec!(dtype, C => C::load_row(row, p));
                    }
                }
            }
            CopyDir::In(s) => {
                for (k, row) in s.chunks_exact(self.width).enumerate() {
                    let p = rows.write(start + k, &mut t);
                    // SAFETY: as above, under the exclusive lock.
                    unsafe {
                        with_codec!(dtype, C => C::store_row(p, row, false));
                    }
                }
            }
        }
        rows.charge(&t);
    }
}
