//! The cached table (thesis §5.4, Fig. 5.7, Table 5.4): base rows on a slow byte-addressable
//! device, a per-row pointer table, and cache pages in fast memory filled by atomic bump
//! pointers, each slot with a back-edge to its row's home.
//!
//! Pointer-table entries are `u32`: `slot << 2 | CACHED` for a cached row (plus `DIRTY`, the
//! top bit, once it is updated, and `REF`, bit 30, once it is hit between reclaims),
//! `LOCKED` while a thread moves it, `0` when the row is at home (its home address follows
//! from the row number). Keeping the dirty and reference bits in the entry a hit or update
//! already reads saves touching the slot's back-edge, a second random access per hit. The
//! thesis stores full pointers with the same two low bits; a slot number is half the size,
//! so twice as much of the pointer table stays in the CPU caches. A bitmap of the cached
//! rows, a bit each ([`present`]), is read before the entry: a miss that will not cache a
//! row goes home without touching the pointer table.
//!
//! This is the mechanism; what it does with misses, when it fills and whether it makes room
//! is a [`CachePolicy`]'s to say ([`policy`]).
//!
//! Concurrency: lookups run under the table's shared lock and cache rows concurrently (a
//! row's owner is whoever wins the compare-and-swap on its entry; losers read the home row,
//! which stays valid until the owner publishes the slot). Updates and flushes run under the
//! exclusive lock, so a flush never tears a row a lookup is reading.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock, RwLockReadGuard};

pub mod admit;
pub mod evict;
pub mod fill;
mod holes;
pub mod policy;
mod prefetch;
mod present;
mod stage;

pub use admit::{Admission, Admit};
pub use evict::{Evict, Eviction};
pub use fill::{Fill, Filling};
pub use policy::{CachePolicy, PolicyRef};
pub use stage::{Room, StageCounters};

use super::home::Home;
use super::rows::{charge, RowSource, Tally};
use holes::Holes;
use present::Present;
use tiermem_core::arch::hints::prefetch;
use tiermem_core::device::Device;
use tiermem_core::manager::Reservation;
use tiermem_core::sys::huge::HugeSlice;
use tiermem_core::{ensure, Result};

const CACHED: u32 = 1;
const LOCKED: u32 = 2;
const DIRTY: u32 = 1 << 31;
/// On an entry that is not cached: the row missed once recently ([`admit::SecondMiss`]).
const SEEN: u32 = 4;
/// On a cached entry: the row was hit since it was cached or last kept by a reclaim
/// (dynamic policies' second chance).
const REF: u32 = 1 << 30;
/// On a back-edge: the slot is a hole (a reclaim dropped its row there; [`holes`] lists
/// it). Back-edges otherwise hold `row + 1` (at most [`MAX_ROWS`]) or 0 (never used), so
/// the top bit is free.
const HOLE: u32 = 1 << 31;

/// The row a back-edge names, if it names one (not 0, not a hole).
#[inline]
fn row_of_back(b: u32) -> Option<usize> {
    (b != 0 && b & HOLE == 0).then(|| (b - 1) as usize)
}

/// The cache slot of a cached entry.
#[inline(always)]
fn slot_of(e: u32) -> usize {
    ((e & !(DIRTY | REF)) >> 2) as usize
}
const NONE: usize = usize::MAX;

/// Most rows a cached table may have (back-edges hold `row + 1` in a `u32`; entries are
/// indexed by row).
pub const MAX_ROWS: usize = 1 << 29;
/// Most rows a cache may hold (slot numbers share a `u32` entry with four flag bits).
pub const MAX_SLOTS: usize = 1 << 28;

/// Cache sizes in bytes (thesis `cachelower` / `cacheslack`), the policy and the admission.
#[derive(Debug, Clone, PartialEq)]
pub struct CacheConfig {
    /// Flushes shrink the cache to at most this many bytes.
    pub lower: u64,
    /// Which rows go in ([`admit`]); `None`: the policy's ([`CachePolicy::admission`]).
    pub admission: Option<Admission>,
    /// The cache may grow this far beyond `lower` before it is full.
    pub slack: u64,
    /// Policy.
    pub policy: PolicyRef,
}

/// Counters of one cached table since creation (or the last reset).
#[derive(Debug, Default, Clone, Copy, serde::Serialize)]
pub struct CacheCounters {
    /// Pages flushed.
    pub pages_flushed: u64,
    /// Dirty rows written back to the base rows.
    pub rows_written_back: u64,
    /// Rows that left the cache (reclaims and flushes).
    pub rows_evicted: u64,
}

#[derive(Debug)]
struct Pages {
    /// Frames holding live pages, oldest first.
    active: VecDeque<usize>,
    /// Frames not in use.
    free: Vec<usize>,
}

/// Rows of a cached table.
pub struct CachedRows {
    rows: usize,
    stride: usize,
    /// The home's rows in memory ([`Home::memory`]): misses read there, dirty rows go back.
    /// Null for a home whose rows are not in memory (a block or file home): every row a kernel
    /// touches is staged into a slot first ([`CachedRows::stage`]).
    home: *mut u8,
    /// Staging state, for a home whose rows are not in memory.
    staging: Option<Mutex<stage::Staging>>,
    cache: *mut u8,
    entries: HugeSlice<AtomicU32>,
    entries_ptr: *const AtomicU32,
    /// Which rows are cached, a bit each: a lookup's first look, before the entry
    /// ([`present`]).
    present: Present,
    back: HugeSlice<AtomicU32>,
    bumps: Box<[AtomicUsize]>,
    frame_rows: usize,
    frames: usize,
    current: AtomicUsize,
    pages: Mutex<Pages>,
    lower: AtomicU64,
    slack: AtomicU64,
    full: AtomicBool,
    /// Free slots inside live pages, left by reclaims (whose rows they dropped there):
    /// `alloc_slot` takes them, without a lock, before it bumps a page. Added by reclaims
    /// and dropped by flushes, both under the table's exclusive lock.
    holes: Holes,
    /// Whether the cache can fill up (its page limit holds fewer slots than the table has
    /// rows), so reclaims happen and hits must mark their rows (`REF`). A cache that holds
    /// every row skips the mark, an extra random access per hit.
    marks: AtomicBool,
    /// Whether every row is cached in the slot of its own number (a fill of a cache that
    /// holds every row caches them in row order): lookups then find row `i` at slot `i`
    /// without reading the pointer table ([`ResidentView`]), as a direct table does. Set
    /// after a fill, cleared by the first row that leaves ([`CachedRows::uncache`]), both
    /// under the table's exclusive lock; read once per kernel view.
    resident: AtomicBool,
    /// Whether the `static` policy's one fill has run.
    filled: AtomicBool,
    /// Lookups read through without caching what they miss (hits still hit): set when a
    /// table's hit-rate curve says insertions cost more than they save
    /// (`tiermem.embedding.cacheplan`).
    bypass: AtomicBool,
    /// Next row whose `SEEN` bit ages ([`CachedRows::age_seen`]).
    sweep: AtomicUsize,
    pub(crate) policy: PolicyRef,
    /// Which rows go in. A leaf lock: read once per kernel view and per staged call,
    /// written only by [`CachedRows::set_admission`].
    admission: RwLock<Admission>,
    counters: Mutex<CacheCounters>,
    /// Where the rows live when not cached (owned: released with the table).
    home_rows: Home,
    cache_dev: Arc<Device>,
    /// The cache pages' bytes in the manager.
    _cache_mem: Reservation,
}

// SAFETY: home and cache are plain memory pinned for the table's lifetime; every shared
// mutable field is atomic or behind a mutex, and row memory is written only by the owner of
// a freshly bumped slot or under the table's exclusive lock.
unsafe impl Send for CachedRows {}
// SAFETY: as above.
unsafe impl Sync for CachedRows {}

/// Fast memory a cached table of `rows` rows takes per row, whatever its cache: the
/// pointer table (a 4-byte entry per row) and the bitmap of cached rows (a bit per row,
/// whole 8-byte words).
#[must_use]
pub fn row_metadata_bytes(rows: usize) -> u64 {
    4 * rows as u64 + Present::bytes_for(rows)
}

/// Fast memory a cache of `slots` slots takes beside its pages and the pointer table: a
/// 4-byte back-edge per slot and the bitmap of holes (a bit per slot, whole 8-byte words).
#[must_use]
pub fn slot_metadata_bytes(slots: usize) -> u64 {
    4 * slots as u64 + Holes::bytes_for(slots)
}

impl CachedRows {
    /// Rows per cache page for a cache of `cache_rows` rows: up to 2 MiB pages, and at least
    /// eight pages so flushes can free part of the cache.
    #[must_use]
    pub fn frame_rows(cache_rows: usize, stride: usize) -> usize {
        ((2usize << 20) / stride).min(cache_rows.div_ceil(8)).max(1)
    }

    /// Build over `home` (base rows in memory, [`Home::memory`], or a home whose rows
    /// are staged) and the reservation `cache` on device `cache_dev` (`frames * frame_rows`
    /// slots).
    ///
    /// # Safety
    /// `home` must hold `rows * stride` bytes of rows and `cache` at least `frames *
    /// frame_rows * stride` bytes.
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn new(
        rows: usize,
        stride: usize,
        home: Home,
        cache: (Reservation, Arc<Device>),
        frame_rows: usize,
        frames: usize,
        config: CacheConfig,
    ) -> Result<Self> {
        let staging = home.staged().then(|| Mutex::new(stage::Staging::default()));
        let home_base = match home.memory() {
            Some(p) => p,
            None if staging.is_some() => std::ptr::null_mut(),
            None => tiermem_core::bail!(
                "a cache in front of a '{}' home is not supported: its rows are not in memory \
                 the cache can read in place",
                home.kind()
            ),
        };
        let slots = frame_rows * frames;
        ensure!(
            slots <= MAX_SLOTS,
            "a cache of {slots} rows: caches hold at most {MAX_SLOTS} rows"
        );
        let entries = HugeSlice::<AtomicU32>::zeroed(rows)?;
        let mut admission = match config.admission {
            Some(a) => a,
            None => Admission::parse(config.policy.admission())?,
        };
        admission.sized(slots);
        let c = CachedRows {
            rows,
            stride,
            home: home_base,
            staging,
            cache: cache.0.ptr,
            entries_ptr: entries.as_ptr(),
            entries,
            present: Present::new(rows),
            back: HugeSlice::zeroed(slots)?,
            bumps: (0..frames).map(|_| AtomicUsize::new(0)).collect(),
            frame_rows,
            frames,
            current: AtomicUsize::new(NONE),
            pages: Mutex::new(Pages {
                active: VecDeque::new(),
                free: (0..frames).rev().collect(),
            }),
            lower: AtomicU64::new(config.lower),
            slack: AtomicU64::new(config.slack),
            full: AtomicBool::new(false),
            holes: Holes::new(slots),
            marks: AtomicBool::new(true),
            resident: AtomicBool::new(false),
            filled: AtomicBool::new(false),
            bypass: AtomicBool::new(false),
            sweep: AtomicUsize::new(0),
            policy: config.policy,
            admission: RwLock::new(admission),
            counters: Mutex::new(CacheCounters::default()),
            home_rows: home,
            cache_dev: cache.1,
            _cache_mem: cache.0,
        };
        c.update_marks();
        Ok(c)
    }

    /// The home's manager device, if it is one.
    fn home_device(&self) -> Option<&Device> {
        self.home_rows.device().map(|d| &**d)
    }

    fn frame_bytes(&self) -> u64 {
        (self.frame_rows * self.stride) as u64
    }

    /// Bytes reserved for cache pages.
    #[must_use]
    pub fn capacity(&self) -> u64 {
        self.frame_bytes() * self.frames as u64
    }

    /// Bytes in live cache pages.
    #[must_use]
    pub fn size(&self) -> u64 {
        self.pages.lock().active.len() as u64 * self.frame_bytes()
    }

    /// Rows currently cached.
    #[must_use]
    pub fn cached_rows(&self) -> usize {
        self.entries
            .iter()
            .filter(|e| e.load(Ordering::Relaxed) & CACHED != 0)
            .count()
    }

    /// `cachelower` in bytes.
    #[must_use]
    pub fn cachelower(&self) -> u64 {
        self.lower.load(Ordering::Relaxed)
    }

    /// `cacheslack` in bytes.
    #[must_use]
    pub fn cacheslack(&self) -> u64 {
        self.slack.load(Ordering::Relaxed)
    }

    /// Set `cachelower` (bytes); `cachelower + cacheslack` must fit the reserved pages.
    pub fn set_cachelower(&self, bytes: u64) -> Result<()> {
        self.check_limits(bytes, self.cacheslack())?;
        self.lower.store(bytes, Ordering::Relaxed);
        self.full.store(false, Ordering::Relaxed);
        self.update_marks();
        Ok(())
    }

    /// Set `cacheslack` (bytes).
    pub fn set_cacheslack(&self, bytes: u64) -> Result<()> {
        self.check_limits(self.cachelower(), bytes)?;
        self.slack.store(bytes, Ordering::Relaxed);
        self.full.store(false, Ordering::Relaxed);
        self.update_marks();
        Ok(())
    }

    /// Whether hits of a call that caches (`caching`) mark their rows: only when the cache
    /// can fill up. Read once per call, not per row (a stale answer only costs a row its
    /// second chance).
    fn marking(&self, caching: bool) -> bool {
        // A staged cache's rows are marked by its staging, which leaves the rows it admits
        // cold unmarked: the kernel that follows must not mark them.
        caching && self.marks.load(Ordering::Relaxed) && self.staging.is_none()
    }

    fn update_marks(&self) {
        self.marks.store(!self.holds_every_row(), Ordering::Relaxed);
    }

    /// Whether the cache's page limit has a slot for every row, so it never fills up.
    #[must_use]
    pub fn holds_every_row(&self) -> bool {
        self.limit_frames() * self.frame_rows >= self.rows
    }

    /// After a fill (exclusive lock): whether every row now sits in the slot of its own
    /// number, so kernels may skip the pointer table ([`CachedRows::resident`]).
    pub(crate) fn settle_resident(&self) {
        let identity = self.holds_every_row()
            && (0..self.rows).all(|i| {
                let e = self.entry(i).load(Ordering::Relaxed);
                e & CACHED != 0 && slot_of(e) == i
            });
        self.resident.store(identity, Ordering::Relaxed);
    }

    /// Whether every row is cached at the slot of its own number (see the field).
    #[must_use]
    pub fn resident(&self) -> bool {
        self.resident.load(Ordering::Relaxed)
    }

    fn check_limits(&self, lower: u64, slack: u64) -> Result<()> {
        ensure!(
            lower.saturating_add(slack) <= self.capacity(),
            "cachelower + cacheslack = {} bytes exceeds the {} bytes of cache pages reserved \
             for this table on '{}' (make a table with a larger cache)",
            lower.saturating_add(slack),
            self.capacity(),
            self.cache_dev.name
        );
        Ok(())
    }

    /// Pages the cache may hold: `cachelower + cacheslack`, rounded up to whole pages.
    fn limit_frames(&self) -> usize {
        let bytes = self.cachelower() + self.cacheslack();
        (bytes.div_ceil(self.frame_bytes()) as usize).min(self.frames)
    }

    /// Whether no more rows can be cached until a flush.
    #[must_use]
    pub fn isfull(&self) -> bool {
        if self.full.load(Ordering::Relaxed) {
            return true;
        }
        let p = self.pages.lock();
        let cur = self.current.load(Ordering::Acquire);
        p.active.len() >= self.limit_frames()
            && (cur == NONE || self.bumps[cur].load(Ordering::Relaxed) >= self.frame_rows)
            && self.holes.len() == 0
    }

    /// Counters.
    #[must_use]
    pub fn counters(&self) -> CacheCounters {
        *self.counters.lock()
    }

    /// Row `i`'s pointer-table entry, without a bounds check on the hot path.
    #[inline(always)]
    fn entry(&self, i: usize) -> &AtomicU32 {
        debug_assert!(i < self.rows);
        // SAFETY: every caller passes a row index already checked against `rows`, the
        // length of `entries`; `entries_ptr` is `entries.as_ptr()`, valid while self lives.
        unsafe { &*self.entries_ptr.add(i) }
    }

    fn slot_ptr(&self, slot: usize) -> *mut u8 {
        self.cache.wrapping_add(slot * self.stride)
    }

    /// Row `row` in its home. A staged home has no rows in memory: reaching here for one is
    /// a broken invariant (every row a kernel touches is staged first), so it stops loudly
    /// rather than hand out a wild pointer.
    fn home_ptr(&self, row: usize) -> *mut u8 {
        assert!(
            !self.home.is_null(),
            "row {row} of a table on a file was not staged into the cache before a kernel used it"
        );
        self.home.wrapping_add(row * self.stride)
    }

    /// Take a free cache slot: a hole a reclaim left, else bump the current page, opening a
    /// new one when it is full.
    fn alloc_slot(&self) -> Option<usize> {
        if self.holes.len() > 0 {
            // Only reclaims and flushes (exclusive lock) read back-edges; the caller stores
            // its row over the hole mark before publishing the slot.
            if let Some(s) = self.holes.take() {
                return Some(s);
            }
        }
        loop {
            let cur = self.current.load(Ordering::Acquire);
            if cur != NONE {
                let s = self.bumps[cur].fetch_add(1, Ordering::AcqRel);
                if s < self.frame_rows {
                    return Some(cur * self.frame_rows + s);
                }
            }
            let mut p = self.pages.lock();
            if self.current.load(Ordering::Acquire) != cur {
                continue; // another thread opened a page meanwhile
            }
            if p.active.len() >= self.limit_frames() {
                self.full.store(true, Ordering::Relaxed);
                return None;
            }
            let f = p.free.pop()?;
            self.bumps[f].store(0, Ordering::Relaxed);
            p.active.push_back(f);
            self.current.store(f, Ordering::Release);
        }
    }

    /// Whether the admission decides which misses go in (else every miss does).
    #[must_use]
    pub fn admits(&self) -> bool {
        self.admission.read_recursive().decides_misses()
    }

    /// The admission's name.
    #[must_use]
    pub fn admission_name(&self) -> String {
        self.admission.read_recursive().name()
    }

    /// Change which rows go in (sized to this cache; what the old one remembered is gone).
    pub fn set_admission(&self, mut admission: Admission) {
        admission.sized(self.frames * self.frame_rows);
        *self.admission.write() = admission;
    }

    /// The admission, read (a leaf lock).
    pub(crate) fn admission(&self) -> RwLockReadGuard<'_, Admission> {
        self.admission.read_recursive()
    }

    /// Whether lookups cache rows (the policy says).
    #[must_use]
    pub fn caches_on_lookup(&self) -> bool {
        self.policy.caches_on_lookup()
    }

    /// `access_and_cache` (or `access` when `caching` is false): where row `i` is now.
    /// With `mark`, a hit sets its row's `REF` mark (decided once per call by
    /// [`CachedRows::marking`]). With an admission `adm` (one that decides misses, read once
    /// per call), the access is counted and a miss is cached only if it says so.
    #[inline(always)]
    fn locate(
        &self,
        i: usize,
        caching: bool,
        mark: bool,
        adm: Option<&Admission>,
        t: &mut Tally,
    ) -> *const u8 {
        if let Some(a) = adm {
            a.touch(i as u64);
        }
        // The bitmap first: a miss that will not cache never reads its entry.
        let mut e = 0;
        if self.present.get(i) {
            e = self.entry(i).load(Ordering::Acquire);
            if e & CACHED != 0 {
                t.hits += 1;
                t.cache_read += self.stride as u64;
                let s = slot_of(e);
                if mark && e & REF == 0 {
                    // The entry is already loaded: the store (one per row between reclaims)
                    // is the rare case. Only other hits change a cached entry under the
                    // shared lock, and they only set this bit.
                    self.entry(i).fetch_or(REF, Ordering::Relaxed);
                }
                return self.slot_ptr(s);
            }
        }
        t.misses += 1;
        t.home_read += self.stride as u64;
        t.home_rows += 1;
        let home = self.home_ptr(i);
        if !caching || self.full.load(Ordering::Relaxed) {
            return home;
        }
        if e == 0 {
            e = self.entry(i).load(Ordering::Acquire);
        }
        if e & (LOCKED | CACHED) != 0 {
            // Another thread is caching the row, or has cached it since the bit was read:
            // the home copy is valid until the exclusive lock is taken.
            return home;
        }
        if adm.is_some_and(|a| !a.miss(i as u64, self)) {
            return home;
        }
        if self
            .entry(i)
            .compare_exchange(e, e | LOCKED, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            return home;
        }
        let Some(slot) = self.alloc_slot() else {
            self.entry(i).store(e, Ordering::Release);
            return home;
        };
        let dst = self.slot_ptr(slot);
        // SAFETY: `slot` was just taken (bumped, or a hole whose bit this thread cleared), so
        // no other thread uses it; the slot is `stride` bytes inside the cache, apart from the
        // home. We own row i (lock bit), i < rows, and rows are written in place only under
        // the exclusive table lock.
        unsafe { self.home_rows.load_row(i, dst) };
        self.back[slot].store(i as u32 + 1, Ordering::Relaxed);
        self.entry(i)
            .store(((slot as u32) << 2) | CACHED, Ordering::Release);
        self.present.set(i);
        t.cached += 1;
        t.cache_written += self.stride as u64;
        dst
    }

    /// Cache rows in the given order until the cache is full (a policy's fill on first use).
    /// Call with the table's exclusive lock held.
    pub(crate) fn fill(&self, order: impl Iterator<Item = usize>) -> Tally {
        self.filled.store(true, Ordering::Relaxed);
        let mut t = Tally::default();
        for i in order {
            if self.full.load(Ordering::Relaxed) {
                break;
            }
            self.locate(i, true, self.marking(true), None, &mut t);
        }
        charge(self.home_device(), Some(&self.cache_dev), &t);
        t
    }

    /// Bytes of DRAM metadata: per row, [`row_metadata_bytes`] (the pointer table and the
    /// bitmap of cached rows), and per slot, [`slot_metadata_bytes`].
    #[must_use]
    pub fn metadata_bytes(&self) -> u64 {
        row_metadata_bytes(self.rows) + slot_metadata_bytes(self.back.len())
    }

    /// Flush the oldest pages until the cache holds at most `cachelower` bytes; with
    /// `write_back`, dirty rows go home first (`flush_dirty`), otherwise a flush that would
    /// drop a dirty row is refused before anything changes (`flush_clean`). Call with the
    /// table's exclusive lock held. Returns the rows flushed.
    pub(crate) fn flush(&self, write_back: bool) -> Result<u64> {
        let mut p = self.pages.lock();
        let keep = self.cachelower().div_ceil(self.frame_bytes()) as usize;
        let n = p.active.len().saturating_sub(keep);
        let victims: Vec<usize> = p.active.iter().take(n).copied().collect();
        let filled = |f: usize| {
            let used = self.bumps[f].load(Ordering::Relaxed).min(self.frame_rows);
            f * self.frame_rows..f * self.frame_rows + used
        };
        let row_dirty = |row: usize| self.entry(row).load(Ordering::Relaxed) & DIRTY != 0;
        if !write_back {
            let dirty = victims
                .iter()
                .flat_map(|&f| filled(f))
                .filter_map(|s| row_of_back(self.back[s].load(Ordering::Relaxed)))
                .filter(|&row| row_dirty(row))
                .count();
            ensure!(
                dirty == 0,
                "flush_clean would drop {dirty} updated (dirty) rows; use flush_dirty, which \
                 writes them back"
            );
        }
        for &f in &victims {
            self.holes
                .drop_range(f * self.frame_rows..(f + 1) * self.frame_rows);
        }
        let mut t = Tally::default();
        let mut rows = 0;
        let mut written = 0;
        for &f in &victims {
            for s in filled(f) {
                let Some(row) = row_of_back(self.back[s].swap(0, Ordering::Relaxed)) else {
                    continue;
                };
                written += u64::from(self.uncache(s, row, row_dirty(row), &mut t));
                rows += 1;
            }
            self.bumps[f].store(0, Ordering::Relaxed);
            if self.current.load(Ordering::Relaxed) == f {
                self.current.store(NONE, Ordering::Release);
            }
        }
        p.active.drain(..n);
        p.free.extend(victims.iter().rev());
        drop(p);
        self.after_room_made(&t, n as u64, written, rows)?;
        Ok(rows)
    }

    /// After a flush or reclaim (pages lock released): tell the policy, clear `full`,
    /// charge the traffic, count freed pages and written-back rows, and have the home finish
    /// the write-backs (a block home writes them together; if that fails they stay buffered
    /// there, still the rows' values, and the error is returned).
    fn after_room_made(
        &self,
        t: &Tally,
        pages_freed: u64,
        written: u64,
        evicted: u64,
    ) -> Result<()> {
        self.policy.after_room_made(self);
        self.admission.read_recursive().after_room_made(self);
        self.full.store(false, Ordering::Relaxed);
        charge(self.home_device(), Some(&self.cache_dev), t);
        let mut c = self.counters.lock();
        c.pages_flushed += pages_freed;
        c.rows_written_back += written;
        c.rows_evicted += evicted;
        drop(c);
        self.home_rows.stores_done()
    }

    /// Take `row` out of the cache from `slot`, writing it home first if `dirty`; returns
    /// whether it was written. Call with the table's exclusive lock held.
    fn uncache(&self, slot: usize, row: usize, dirty: bool, t: &mut Tally) -> bool {
        self.resident.store(false, Ordering::Relaxed);
        if dirty {
            // SAFETY: exclusive table lock: no one reads or writes the row or the slot; both
            // ranges lie inside their regions.
            unsafe { self.home_rows.store_row(row, self.slot_ptr(slot)) };
            t.cache_read += self.stride as u64;
            t.home_written += self.stride as u64;
            t.home_written_rows += 1;
        }
        self.entry(row).store(0, Ordering::Release);
        self.present.clear(row);
        dirty
    }

    /// Make room in a full cache, second-chance style (CLOCK over the pages, oldest first):
    /// in each walked page, a row hit since it was cached (or last kept) stays where it is
    /// with its mark cleared; the others leave (dirty ones written back first) and their
    /// slots become holes that new rows fill before any page is bumped. Stops once a
    /// slack's worth of holes is free, or after one pass over every page; walked pages go
    /// to the back of the queue. Rows are never moved, so a reclaim copies nothing but the
    /// dirty rows it writes home. Call with the table's exclusive lock held. Returns rows
    /// dropped.
    pub(crate) fn reclaim(&self) -> Result<u64> {
        self.reclaim_for((self.cacheslack() / self.stride as u64).max(1) as usize)
    }

    /// [`CachedRows::reclaim`], stopping once `want` slots are free, by the policy's
    /// eviction (one dispatch per pass; the per-row decision is inlined).
    fn reclaim_for(&self, want: usize) -> Result<u64> {
        self.reclaim_by(self.policy.eviction(), want)
    }

    /// A reclaim pass by `eviction`.
    fn reclaim_by(&self, eviction: Eviction, want: usize) -> Result<u64> {
        match eviction {
            Eviction::SecondChance => self.reclaim_with::<evict::SecondChance>(want),
            Eviction::Never => self.reclaim_with::<evict::Never>(want),
        }
    }

    /// A reclaim pass of a staged cache, which must make room for the rows it stages
    /// whatever its policy (a row not in memory cannot be read through): a policy that
    /// never evicts gets second chance here.
    fn reclaim_staged(&self, want: usize) -> Result<u64> {
        let eviction = match self.policy.eviction() {
            Eviction::Never => Eviction::SecondChance,
            e => e,
        };
        self.reclaim_by(eviction, want)
    }

    /// One reclaim pass deciding each row by `E` ([`Evict::keeps`]).
    fn reclaim_with<E: Evict>(&self, want: usize) -> Result<u64> {
        if !E::RECLAIMS {
            return Ok(0);
        }
        let mut p = self.pages.lock();
        let fr = self.frame_rows;
        let mut t = Tally::default();
        let (mut dropped, mut written) = (0u64, 0u64);
        let total = p.active.len();
        let mut walked = 0;
        while walked < total && self.holes.len() < want {
            let Some(f) = p.active.pop_front() else { break };
            walked += 1;
            let used = self.bumps[f].load(Ordering::Relaxed).min(fr);
            for s in f * fr..f * fr + used {
                let Some(row) = row_of_back(self.back[s].load(Ordering::Relaxed)) else {
                    continue; // a hole already chained
                };
                let e = self.entry(row).load(Ordering::Relaxed);
                if E::keeps(e & REF != 0) {
                    if e & REF != 0 {
                        self.entry(row).store(e & !REF, Ordering::Release);
                    }
                } else {
                    written += u64::from(self.uncache(s, row, e & DIRTY != 0, &mut t));
                    self.back[s].store(HOLE, Ordering::Relaxed);
                    self.holes.put(s);
                    dropped += 1;
                }
            }
            p.active.push_back(f);
        }
        drop(p);
        self.after_room_made(&t, 0, written, dropped)?;
        Ok(dropped)
    }

    /// Clear the `SEEN` bit of the next quarter of the table's uncached rows (round robin),
    /// so "missed before" means "missed within the last few flushes". Exclusive lock held.
    pub fn age_seen(&self) {
        let n = self.rows.div_ceil(4);
        let start = self.sweep.load(Ordering::Relaxed) % self.rows;
        for k in 0..n {
            let i = (start + k) % self.rows;
            let e = self.entry(i).load(Ordering::Relaxed);
            if e & CACHED == 0 && e & SEEN != 0 {
                self.entry(i).store(e & !SEEN, Ordering::Relaxed);
            }
        }
        self.sweep.store((start + n) % self.rows, Ordering::Relaxed);
    }

    /// The `SEEN` mark of row `i`: whether it was set; sets it if not (an uncached row's).
    fn seen_mark(&self, i: usize) -> bool {
        let e = self.entry(i).load(Ordering::Relaxed);
        if e & SEEN != 0 {
            return true;
        }
        if e & (LOCKED | CACHED) == 0 {
            // A compare-and-swap, not fetch_or: if another thread cached the row meanwhile,
            // bit 2 is part of its slot number and must not be touched.
            let _ =
                self.entry(i)
                    .compare_exchange(e, e | SEEN, Ordering::Relaxed, Ordering::Relaxed);
        }
        false
    }

    /// Check the pointer table and back-edges agree, and that every hole is a free slot of a
    /// live page (tests).
    pub fn check(&self) -> std::result::Result<(), String> {
        {
            let p = self.pages.lock();
            let mut n = 0;
            for at in self.holes.iter() {
                let (f, k) = (at / self.frame_rows, at % self.frame_rows);
                let used = self.bumps.get(f).map_or(0, |b| b.load(Ordering::Relaxed));
                if !p.active.contains(&f) || k >= used.min(self.frame_rows) {
                    return Err(format!("hole {at} is not a used slot of a live page"));
                }
                let b = self.back[at].load(Ordering::Relaxed);
                if b != HOLE {
                    return Err(format!("hole {at} holds a row (back-edge {b:#x})"));
                }
                n += 1;
            }
            if n != self.holes.len() {
                return Err(format!("{n} holes listed, {} counted", self.holes.len()));
            }
            let unlisted = (0..self.back.len())
                .find(|&s| self.back[s].load(Ordering::Relaxed) == HOLE && !self.holes.contains(s));
            if let Some(s) = unlisted {
                return Err(format!("slot {s} is marked a hole but not listed"));
            }
        }
        for (i, e) in self.entries.iter().enumerate() {
            let e = e.load(Ordering::Relaxed);
            if (e & CACHED != 0) != self.present.get(i) {
                return Err(format!(
                    "row {i}'s entry is {e:#x} but its bit in the bitmap of cached rows is {}",
                    self.present.get(i)
                ));
            }
            if self.resident() && (e & CACHED == 0 || slot_of(e) != i) {
                return Err(format!(
                    "the cache is resident but row {i}'s entry is {e:#x}"
                ));
            }
            if e & LOCKED != 0 {
                return Err(format!("row {i} left locked"));
            }
            if e & CACHED == 0 && e & !SEEN != 0 {
                return Err(format!("row {i} is not cached but its entry is {e:#x}"));
            }
            if e & CACHED != 0 {
                let s = slot_of(e);
                let b = self.back.get(s).map(|b| b.load(Ordering::Relaxed));
                if b != Some(i as u32 + 1) {
                    return Err(format!("row {i} -> slot {s} but its back-edge is {b:?}"));
                }
            }
        }
        Ok(())
    }

    /// Read through without caching misses (`true`) or cache them as the policy says.
    /// A cache over a home whose rows are not in memory cannot bypass: its rows are read
    /// only through the cache.
    pub fn set_bypass(&self, on: bool) -> Result<()> {
        ensure!(
            !(on && self.staged()),
            "a {} table's rows are read through its cache: it cannot bypass it",
            self.home_rows.kind()
        );
        self.bypass.store(on, Ordering::Relaxed);
        Ok(())
    }

    /// Whether lookups read through without caching misses.
    #[must_use]
    pub fn bypassing(&self) -> bool {
        self.bypass.load(Ordering::Relaxed)
    }

    /// A view for kernels: `caching` selects `access_and_cache` over `access` (never while
    /// bypassing).
    pub(crate) fn view(&self, caching: bool) -> CachedView<'_> {
        let caching = caching && !self.bypassing();
        CachedView {
            rows: self,
            caching,
            mark: self.marking(caching),
            // A staged cache's staging already counted and admitted the call's rows (the
            // kernel only hits).
            adm: (caching && self.staging.is_none())
                .then(|| self.admission.read_recursive())
                .filter(|a| a.decides_misses()),
        }
    }

    /// A view that finds row `i` at slot `i` without the pointer table, if the cache is
    /// resident (every row at the slot of its number) and hits need no mark (the cache
    /// holds every row). Under the table's lock, which keeps both true for the view's life.
    pub(crate) fn resident_view(&self) -> Option<ResidentView<'_>> {
        (self.resident() && !self.marks.load(Ordering::Relaxed))
            .then_some(ResidentView { rows: self })
    }

    /// Whether kernels may read and write the home directly, as a direct table does: the
    /// cache is bypassed (lookups cache nothing) and holds no row (no live page; a row is
    /// cached only in a live page's slot). A bypassed table is bypassed before it caches
    /// anything (`tiermem.dlrm`'s `dynamic` mode), and then every entry says "at home":
    /// reading them is one more random access per row for nothing. Call under the table's
    /// lock: under the shared lock a lookup that caches after `set_bypass(false)` leaves
    /// home rows valid (rows are cached by copying, and updated only under the exclusive
    /// lock), and under the exclusive lock nothing caches.
    pub(crate) fn reads_home(&self) -> bool {
        self.bypassing() && self.pages.lock().active.is_empty()
    }

    /// Where an update writes row `i`: its cached copy (marked dirty) or its home row.
    /// Exclusive lock held.
    #[inline(always)]
    fn write_ptr(&self, i: usize, t: &mut Tally) -> *mut u8 {
        let e = self.entry(i).load(Ordering::Acquire);
        if e & CACHED != 0 {
            if e & DIRTY == 0 {
                // Writers hold the exclusive lock: no one else changes the entry now.
                self.entry(i).store(e | DIRTY, Ordering::Relaxed);
            }
            t.hits += 1;
            t.cache_read += self.stride as u64;
            t.cache_written += self.stride as u64;
            self.slot_ptr(slot_of(e))
        } else {
            t.misses += 1;
            t.home_read += self.stride as u64;
            t.home_rows += 1;
            t.home_written += self.stride as u64;
            t.home_written_rows += 1;
            self.home_ptr(i)
        }
    }

    /// Charge a kernel's tally to the home and cache devices.
    fn charge_tally(&self, t: &Tally) {
        charge(self.home_device(), Some(&self.cache_dev), t);
    }

    /// Whether the cache has been filled once (a policy may fill on first use).
    #[must_use]
    pub fn filled(&self) -> bool {
        self.filled.load(Ordering::Relaxed)
    }

    /// The policy.
    #[must_use]
    pub fn policy(&self) -> PolicyRef {
        self.policy
    }

    /// Row count.
    #[must_use]
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Where the rows live when not cached.
    #[must_use]
    pub fn home(&self) -> &Home {
        &self.home_rows
    }

    /// Manager index of the cache's device.
    #[must_use]
    pub fn cache_device(&self) -> usize {
        self._cache_mem.device
    }
}

/// A cached table seen by one kernel call.
pub struct CachedView<'a> {
    rows: &'a CachedRows,
    caching: bool,
    /// Whether hits mark their rows ([`CachedRows::marking`]), read once per view.
    mark: bool,
    /// The admission, when it decides misses: read once per view (a match, no virtual
    /// call, per row).
    adm: Option<RwLockReadGuard<'a, Admission>>,
}

// SAFETY: slot and home pointers stay inside their pinned regions for every i < rows; rows
// are written only by the owner of a fresh slot or under the exclusive lock.
unsafe impl RowSource for CachedView<'_> {
    #[inline(always)]
    fn stride(&self) -> usize {
        self.rows.stride
    }

    #[inline(always)]
    fn read(&self, i: usize, t: &mut Tally) -> *const u8 {
        self.rows
            .locate(i, self.caching, self.mark, self.adm.as_deref(), t)
    }

    #[inline(always)]
    fn write(&self, i: usize, t: &mut Tally) -> *mut u8 {
        self.rows.write_ptr(i, t)
    }

    #[inline(always)]
    fn prefetch(&self, i: usize) {
        let e = if self.rows.present.get(i) {
            self.rows.entry(i).load(Ordering::Relaxed)
        } else {
            0
        };
        let p = if e & CACHED != 0 {
            self.rows.slot_ptr(slot_of(e))
        } else {
            // A staged home's null base only yields a harmless prefetch address.
            self.rows.home.wrapping_add(i * self.rows.stride)
        };
        prefetch(p, self.rows.stride);
    }

    #[inline(always)]
    fn prefetch_far(&self, i: usize) {
        // The entry is read for a cached row, and for a missing one only by a view that
        // caches (its compare-and-swap would otherwise wait on memory).
        if self.caching || self.rows.present.get(i) {
            prefetch(self.rows.entries_ptr.wrapping_add(i).cast(), 1);
        }
    }

    fn charge(&self, t: &Tally) {
        self.rows.charge_tally(t);
    }
}

/// A resident cache seen by one kernel call ([`CachedRows::resident_view`]): row `i` is at
/// slot `i`, read with no pointer-table access, as a direct table reads its rows. Writes
/// still go through the entry, which carries the dirty bit.
pub struct ResidentView<'a> {
    rows: &'a CachedRows,
}

// SAFETY: a resident cache holds row i at slot i for every i < rows (checked when it became
// resident, and no row leaves while the caller holds the table's lock); slots lie inside
// the pinned cache pages.
unsafe impl RowSource for ResidentView<'_> {
    #[inline(always)]
    fn stride(&self) -> usize {
        self.rows.stride
    }

    #[inline(always)]
    fn read(&self, i: usize, t: &mut Tally) -> *const u8 {
        t.hits += 1;
        t.cache_read += self.rows.stride as u64;
        self.rows.slot_ptr(i)
    }

    #[inline(always)]
    fn write(&self, i: usize, t: &mut Tally) -> *mut u8 {
        self.rows.write_ptr(i, t)
    }

    #[inline(always)]
    fn prefetch(&self, i: usize) {
        prefetch(self.rows.slot_ptr(i), self.rows.stride);
    }

    fn charge(&self, t: &Tally) {
        self.rows.charge_tally(t);
    }
}

impl admit::Seen for CachedRows {
    fn seen_or_mark(&self, row: usize) -> bool {
        self.seen_mark(row)
    }

    fn age(&self) {
        self.age_seen();
    }
}
