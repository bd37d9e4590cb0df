//! The prefetch pipeline over a home in memory: cache the rows a coming lookup will use
//! while the current step computes, so that lookup only hits (a block home stages them
//! instead, `stage.rs`).

use std::sync::atomic::Ordering;

use super::{CachedRows, CACHED, REF};
use crate::rows::{charge, Tally};
use tiermem_core::Result;

impl CachedRows {
    /// Cache the missing ones of `rows` (checked indices) now, for a cache that caches on
    /// lookup and admits every miss (`dynamic`), is neither bypassed nor resident, over a
    /// home in memory. The cached ones are marked first, so making room keeps them; room is
    /// made for the missing ones and a slack's worth more (so the lookup that follows finds
    /// the cache not full and reclaims nothing); the rows cached go in marked, to stay until
    /// that lookup. Rows that find no slot stay at home (the lookup reads them there).
    /// Exclusive table lock held; a staged cache goes through `stage` instead (the caller,
    /// `Table::prefetch`, dispatches). Returns the tally: `misses` the distinct rows that
    /// were missing, `cached` those now cached.
    pub(crate) fn prefetch_rows(&self, rows: &[i64]) -> Result<Tally> {
        debug_assert!(!self.staged(), "a block home stages its rows");
        let mut t = Tally::default();
        if !self.caches_on_lookup() || self.admits() || self.bypassing() || self.resident() {
            return Ok(t);
        }
        let mark = self.marking(true);
        let mut missing: Vec<usize> = Vec::with_capacity(rows.len());
        for &v in rows {
            let i = v as usize;
            let e = self.entry(i).load(Ordering::Relaxed);
            if e & CACHED == 0 {
                missing.push(i);
            } else if mark && e & REF == 0 {
                self.entry(i).store(e | REF, Ordering::Relaxed);
            }
        }
        missing.sort_unstable();
        missing.dedup();
        if missing.is_empty() {
            return Ok(t);
        }
        if self.policy.reclaims_when_full() && !self.holds_every_row() {
            let slack = (self.cacheslack() / self.stride as u64) as usize;
            let want = missing.len() + slack.max(1);
            let free = self.free_slots();
            if free < want {
                // `reclaim_for` counts holes: those beside the slots still to be bumped.
                let bumpable = free.saturating_sub(self.holes.len());
                self.reclaim_for(want.saturating_sub(bumpable))?;
            }
        }
        let mut located = Tally::default();
        for &i in &missing {
            self.locate(i, true, false, None, &mut located);
            let e = self.entry(i).load(Ordering::Relaxed);
            if mark && e & CACHED != 0 {
                self.entry(i).store(e | REF, Ordering::Relaxed);
            }
        }
        // Only the rows cached were read (`locate` hands the others' home rows to a caller
        // that would read them; here no one does).
        let bytes = located.cached * self.stride as u64;
        let copied = Tally {
            cached: located.cached,
            home_read: bytes,
            home_rows: located.cached,
            cache_written: bytes,
            ..Tally::default()
        };
        charge(self.home_device(), Some(&self.cache_dev), &copied);
        t.misses = missing.len() as u64;
        t.cached = located.cached;
        Ok(t)
    }
}
