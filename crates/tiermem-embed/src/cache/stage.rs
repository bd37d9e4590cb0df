//! Staging: how a cache works in front of a home whose rows are not in memory (a block or
//! a file home: any home whose [`crate::home::RowHome::memory`] is `None`). Before a kernel
//! runs, every row it will touch is made cached: the rows missing from the cache are read
//! from the home in one batch ([`crate::home::RowHome::read_rows`]: a block home reads each
//! block once, at the file's queue depth), room is made first by the second-chance reclaim
//! (dirty rows leaving are written back block by block), and the blocks' other rows are
//! admitted as the table's admission says ([`super::admit`], Bandana §4.3). The kernel then
//! only hits. Staging and the kernel run under the table's exclusive lock, so nothing is
//! evicted between them.

use std::sync::atomic::Ordering;

use super::admit::Known;
use super::{slot_of, CachedRows, CACHED, DIRTY, NONE, REF};
use crate::rows::Tally;
use tiermem_core::{ensure, Result};

/// Counters of a staged cache since creation.
#[derive(Debug, Default, Clone, Copy, serde::Serialize)]
pub struct StageCounters {
    /// Row accesses staged (every index of every lookup, update and prefetch: a prefetched
    /// row is counted again, as a hit, by the lookup that uses it).
    pub accesses: u64,
    /// Distinct rows a call needed that were not cached (each read from the file).
    pub misses: u64,
    /// Blocks read.
    pub blocks_read: u64,
    /// A block's other rows admitted by the prefetch policy.
    pub prefetched: u64,
}

/// How hard staging makes room.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Room {
    /// None: rows that do not fit the free slots are left out (a fill).
    Fill,
    /// One reclaim pass, then what fits (a prefetch: it must not push out the rows of the
    /// call in flight, which the pass keeps as recently used; the lookup stages the rest).
    Once,
    /// Until every row fits (a call about to run its kernel; refused if the cache cannot
    /// hold them all at once).
    All,
}

/// A staged cache's state. Held through a call's staging (under the table's exclusive
/// lock), with the admission, the page list, the home's write-back buffer and its file taken
/// inside it in that order (ARCHITECTURE.md, the lock order); elsewhere taken alone.
#[derive(Default)]
pub(crate) struct Staging {
    /// Per row, how many queries of the layout's training trace held it (thresholds).
    counts: Option<Vec<u32>>,
    counters: StageCounters,
}

impl CachedRows {
    /// Whether this cache stages rows (its home's rows are not in memory).
    #[must_use]
    pub fn staged(&self) -> bool {
        self.staging.is_some()
    }

    /// Slots free for new rows: holes a reclaim left, and those that can still be bumped
    /// before the page limit.
    pub(super) fn free_slots(&self) -> usize {
        let p = self.pages.lock();
        let cur = self.current.load(Ordering::Acquire);
        let in_current = if cur == NONE {
            0
        } else {
            self.frame_rows - self.bumps[cur].load(Ordering::Relaxed).min(self.frame_rows)
        };
        self.limit_frames().saturating_sub(p.active.len()) * self.frame_rows
            + in_current
            + self.holes.len()
    }

    /// Mark the cached ones of `rows` referenced, so a reclaim keeps them.
    fn mark(&self, rows: &[u64]) {
        for &r in rows {
            let e = self.entry(r as usize).load(Ordering::Relaxed);
            if e & CACHED != 0 && e & REF == 0 {
                self.entry(r as usize).fetch_or(REF, Ordering::Relaxed);
            }
        }
    }

    /// Make every row of `rows` (in range; any order, repeats allowed: one per access)
    /// cached, making room as `room` says; the prefetch policy decides which of the read
    /// blocks' other rows come in too. Call with the table's exclusive lock held. Returns
    /// the tally: hits and misses per access.
    pub(crate) fn stage(&self, rows: &mut Vec<u64>, room: Room) -> Result<Tally> {
        let mut t = Tally::default();
        let Some(staging) = &self.staging else {
            return Ok(t);
        };
        let accesses = rows.len() as u64;
        let st = staging.lock();
        let adm = self.admission();
        if adm.decides_misses() {
            // An admission that watches accesses counts each one (repeats included).
            for &r in rows.iter() {
                adm.touch(r);
            }
        }
        rows.sort_unstable();
        rows.dedup();
        // The rows to read, and the hits marked (the kernel after staging leaves marks to
        // staging, so that rows admitted cold stay unmarked): the next reclaim keeps them.
        let missing: Vec<u64> = rows
            .iter()
            .copied()
            .filter(|&r| {
                let e = self.entry(r as usize).load(Ordering::Relaxed);
                if e & CACHED == 0 {
                    return true;
                }
                if e & REF == 0 {
                    self.entry(r as usize).fetch_or(REF, Ordering::Relaxed);
                }
                false
            })
            .collect();
        let mut st = st;
        adm.asked(rows, self.frames * self.frame_rows);
        st.counters.accesses += accesses;
        st.counters.misses += missing.len() as u64;
        t.hits = accesses - missing.len() as u64;
        t.misses = missing.len() as u64;
        if missing.is_empty() {
            return Ok(t);
        }
        let capacity = self.limit_frames() * self.frame_rows;
        if room == Room::All {
            ensure!(
                rows.len() <= capacity,
                "this call touches {} distinct rows but the table's cache holds {capacity} \
                 (rows of {} bytes): a block table's rows are read through its cache, so give \
                 it a larger cache or split the batch",
                rows.len(),
                self.stride
            );
        }
        let home = &self.home_rows;
        // Read the rows (a block home brings their blocks' other rows along); keep the rows
        // asked for and the neighbours the policy admits.
        let stride = self.stride;
        let (mut asked, mut extra): (Vec<u8>, Vec<u8>) = (Vec::new(), Vec::new());
        let (mut asked_rows, mut extra_rows): (Vec<u64>, Vec<u64>) = (Vec::new(), Vec::new());
        let known = Known {
            counts: st.counts.as_deref(),
        };
        let blocks = home.read_rows(&missing, |row, bytes| {
            if missing.binary_search(&row).is_ok() {
                asked_rows.push(row);
                asked.extend_from_slice(bytes);
            } else if self.entry(row as usize).load(Ordering::Relaxed) & CACHED == 0
                && adm.neighbour(row, known)
            {
                extra_rows.push(row);
                extra.extend_from_slice(bytes);
            }
        })?;
        // Room for the rows asked for, and for as many admitted neighbours as fit beside
        // this call's rows: the second-chance reclaim keeps rows used since their last pass
        // (this call's cached rows are marked so), and drops unused prefetches first.
        let want = missing.len() + extra_rows.len().min(capacity.saturating_sub(rows.len()));
        if room != Room::Fill {
            let slack = (self.cacheslack() / stride as u64).max(1) as usize;
            let passes = if room == Room::Once { 1 } else { 4 };
            // Each pass asks for all `want` slots as holes (a row kept by one pass, its
            // mark cleared, may leave in the next); the hits were marked above and are
            // marked again after each pass.
            for _ in 0..passes {
                if self.free_slots() >= want {
                    break;
                }
                self.reclaim_staged(want.max(slack))?;
                self.mark(rows);
            }
        }
        let mut insert = |row: u64, bytes: &[u8], referenced: u32| -> bool {
            let Some(slot) = self.alloc_slot() else {
                return false;
            };
            // SAFETY: the slot was just taken (ours alone, inside the cache); `bytes` is one
            // row of `stride` bytes; exclusive table lock held.
            unsafe {
                std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.slot_ptr(slot), stride);
            }
            self.back[slot].store(row as u32 + 1, Ordering::Relaxed);
            self.entry(row as usize).store(
                ((slot as u32) << 2) | CACHED | referenced,
                Ordering::Release,
            );
            self.present.set(row as usize);
            t.cached += 1;
            true
        };
        for (row, bytes) in asked_rows.iter().zip(asked.chunks_exact(stride)) {
            // Safe unmarked: no reclaim runs between this insertion and the call's kernel.
            let mark = if room != Room::Once && adm.cold(*row, known) {
                0
            } else {
                REF
            };
            if !insert(*row, bytes, mark) {
                break;
            }
        }
        let mut prefetched = 0u64;
        for (row, bytes) in extra_rows.iter().zip(extra.chunks_exact(stride)) {
            if !insert(*row, bytes, 0) {
                break;
            }
            prefetched += 1;
        }
        st.counters.blocks_read += blocks;
        st.counters.prefetched += prefetched;
        t.home_read += blocks * home.read_unit() as u64;
        t.home_rows += missing.len() as u64;
        t.cache_written += t.cached * self.stride as u64;
        if room == Room::All {
            let left = missing
                .iter()
                .filter(|&&r| self.entry(r as usize).load(Ordering::Relaxed) & CACHED == 0)
                .count();
            ensure!(
                left == 0,
                "{left} of {} rows could not be staged into the cache of {capacity} rows (this \
                 call touches {}; {} slots free after making room)",
                missing.len(),
                rows.len(),
                self.free_slots()
            );
        }
        Ok(t)
    }

    /// Rows `first..first + k` as they are now, caching none of them: cached rows from
    /// their slots, the others read from the home (each block once, rows waiting in its
    /// write-back buffer overlaid), each handed to `f(row, bytes)`. A read of the whole
    /// table (`to_numpy`, a checkpoint) thus leaves the cache as it was. Exclusive lock
    /// held.
    pub(crate) fn read_through(
        &self,
        first: u64,
        k: u64,
        mut f: impl FnMut(u64, &[u8]),
    ) -> Result<()> {
        let home = &self.home_rows;
        let mut missing = Vec::new();
        for r in first..first + k {
            let e = self.entry(r as usize).load(Ordering::Relaxed);
            if e & CACHED == 0 {
                missing.push(r);
                continue;
            }
            // SAFETY: exclusive table lock: the slot holds row r and no one writes it; the
            // slot's `stride` bytes lie inside the cache.
            let bytes =
                unsafe { std::slice::from_raw_parts(self.slot_ptr(slot_of(e)), self.stride) };
            f(r, bytes);
        }
        if !missing.is_empty() {
            home.read_rows(&missing, |row, bytes| {
                if missing.binary_search(&row).is_ok() {
                    f(row, bytes);
                }
            })?;
        }
        Ok(())
    }

    /// Stage rows in `order` until the cache is full (no eviction): a fill.
    pub(crate) fn stage_fill(&self, order: impl Iterator<Item = usize>) -> Result<Tally> {
        let mut total = Tally::default();
        let mut order = order.peekable();
        loop {
            let free = self.free_slots();
            if free == 0 || order.peek().is_none() {
                return Ok(total);
            }
            let mut chunk: Vec<u64> = order
                .by_ref()
                .filter(|&r| self.entry(r).load(Ordering::Relaxed) & CACHED == 0)
                .take(free)
                .map(|r| r as u64)
                .collect();
            if chunk.is_empty() {
                return Ok(total);
            }
            let t = self.stage(&mut chunk, Room::Fill)?;
            total.add(&Tally {
                hits: 0,
                misses: 0,
                ..t
            });
        }
    }

    /// Write every dirty cached row home (they stay cached, now clean), then finish the
    /// home's stores. Exclusive lock held. Returns the rows written.
    pub(crate) fn write_back_dirty(&self) -> Result<u64> {
        let mut n = 0;
        for (row, e) in self.entries.iter().enumerate() {
            let v = e.load(Ordering::Relaxed);
            if v & CACHED != 0 && v & DIRTY != 0 {
                // SAFETY: exclusive table lock: the slot holds the row and no one writes it.
                unsafe { self.home_rows.store_row(row, self.slot_ptr(slot_of(v))) };
                e.store(v & !DIRTY, Ordering::Relaxed);
                n += 1;
            }
        }
        self.counters.lock().rows_written_back += n;
        self.home_rows.stores_done()?;
        Ok(n)
    }

    /// Overwrite rows `start..` from `src` (`width` floats per row, rounded to `dtype`):
    /// cached rows in their slots (now dirty), the others straight into the file, each
    /// touched block rewritten once (a bulk load does not pass through the cache). Call with
    /// the table's exclusive lock held.
    pub(crate) fn write_through(
        &self,
        start: usize,
        src: &[f32],
        width: usize,
        dtype: crate::DType,
    ) -> Result<()> {
        use crate::codec::{with_codec, RowCodec};
        if !self.staged() {
            return Ok(());
        }
        let home = &self.home_rows;
        let stride = self.stride;
        let mut rows = Vec::new();
        let mut bytes = vec![0u8; 0];
        for (k, vals) in src.chunks_exact(width).enumerate() {
            let row = start + k;
            let e = self.entry(row).load(Ordering::Relaxed);
            let dst = if e & CACHED != 0 {
                self.entry(row).store(e | DIRTY, Ordering::Relaxed);
                self.slot_ptr(slot_of(e))
            } else {
                rows.push(row as u64);
                bytes.resize(rows.len() * stride, 0);
                bytes[(rows.len() - 1) * stride..].as_mut_ptr()
            };
            // SAFETY: `dst` is a cached row's slot (exclusive lock) or a fresh `stride`-byte
            // piece of `bytes`; `vals` holds `width` floats and a row holds `width` elements.
            unsafe {
                with_codec!(dtype, C => C::store_row(dst, vals, false));
            }
        }
        home.write_rows(&rows, &bytes)
    }

    /// Set the per-row counts of the layout's training trace (threshold admission).
    pub fn set_access_counts(&self, counts: Vec<u32>) -> Result<()> {
        ensure!(
            counts.len() == self.rows,
            "{} access counts for a table of {} rows",
            counts.len(),
            self.rows
        );
        if let Some(s) = &self.staging {
            s.lock().counts = Some(counts);
        }
        Ok(())
    }

    /// The admission's name and the staging counters, for a staged cache.
    #[must_use]
    pub fn stage_info(&self) -> Option<(String, StageCounters)> {
        self.staging
            .as_ref()
            .map(|s| (self.admission_name(), s.lock().counters))
    }
}

impl Drop for CachedRows {
    /// A staged cache's dirty rows go home when the table goes: the file is where they
    /// live. A failure is reported on stderr (a drop has no caller to return it to).
    fn drop(&mut self) {
        // A forked child's copy writes nothing back: the file is its parent's.
        let forked = self.home().forked();
        if self.staged() && !forked {
            if let Err(e) = self.write_back_dirty() {
                eprintln!(
                    "tiermem: writing a {} table's updated rows back on close: {e}",
                    self.home().kind()
                );
            }
        }
    }
}
