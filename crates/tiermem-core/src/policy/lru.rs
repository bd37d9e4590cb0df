//! `lru`: the thesis's CachedArrays policy. New objects go to fast memory, making room by
//! walking the heap from the least recently used object (softevicted objects first) and
//! evicting what is in the way; guards bring objects into fast memory (a forced prefetch);
//! evicted objects keep their slow sibling, so evicting a clean object copies nothing; freed
//! objects are never written back.
//!
//! `lru_in_place` is the same policy without prefetch on access: new objects still go to fast
//! memory, but a guard uses an object where it lives (the thesis's "CA: L"/"CA: LM" modes,
//! where prefetching an operand is a separate, optional hint).

use std::collections::{BTreeMap, HashMap};

use super::Policy;
use crate::mechanism::{
    create_first_fit, create_on, device_for, evict_object, make_room, prefetch_filled,
    prefetch_object, stage_in, DataManager, Fill, ObjectId, Place,
};
use crate::{Error, Result};

/// Stamps of softevicted objects start here, below every use's stamp (uses count up from 0).
const SOFT_BASE: i64 = i64::MIN / 2;

/// LRU state: a recency stamp per object; softevicted objects get stamps below every use.
#[derive(Debug)]
pub struct Lru {
    stamps: HashMap<ObjectId, i64>,
    order: BTreeMap<i64, ObjectId>,
    clock: i64,
    soft: i64,
    prefetch_on_access: bool,
}

impl Default for Lru {
    fn default() -> Self {
        Lru {
            stamps: HashMap::new(),
            order: BTreeMap::new(),
            clock: 0,
            soft: 0,
            prefetch_on_access: true,
        }
    }
}

impl Lru {
    /// `lru_in_place`: guards use objects where they live; only hints move them.
    #[must_use]
    pub fn in_place() -> Self {
        Lru {
            prefetch_on_access: false,
            ..Lru::default()
        }
    }

    fn set_stamp(&mut self, id: ObjectId, stamp: i64) {
        if let Some(old) = self.stamps.insert(id, stamp) {
            self.order.remove(&old);
        }
        self.order.insert(stamp, id);
    }

    fn touch(&mut self, id: ObjectId) {
        self.clock += 1;
        self.set_stamp(id, self.clock);
    }

    fn forget(&mut self, id: ObjectId) {
        if let Some(s) = self.stamps.remove(&id) {
            self.order.remove(&s);
        }
    }

    /// A forced-or-not prefetch into fast memory, filled as `fill` says; the object is used.
    fn prefetch_filled(
        &mut self,
        m: &mut DataManager,
        id: ObjectId,
        force: bool,
        fill: Fill,
    ) -> Result<()> {
        let start = self.victim_start(m);
        prefetch_filled(m, id, 0, (force, Some(start)), fill)?;
        self.touch(id);
        Ok(())
    }

    /// The offset in fast memory of the least recently used unpinned object living there.
    /// Entries for objects that have left fast memory (or been freed) are dropped on the
    /// way, so the walk stays short however many objects live on slower devices; an object
    /// that comes back is re-entered by its next use.
    fn victim_start(&mut self, m: &DataManager) -> u64 {
        let mut stale = Vec::new();
        let mut found = 0;
        for (&stamp, &id) in &self.order {
            let place = m.object(id).ok().and_then(|o| {
                m.region(o.primary)
                    .ok()
                    .map(|r| (o.pins, r.device, r.offset))
            });
            match place {
                Some((pins, 0, offset)) => {
                    if pins == 0 {
                        found = offset;
                        break;
                    }
                }
                _ => stale.push((stamp, id)),
            }
        }
        for (stamp, id) in stale {
            self.order.remove(&stamp);
            self.stamps.remove(&id);
        }
        found
    }
}

impl Policy for Lru {
    fn name(&self) -> String {
        if self.prefetch_on_access {
            "lru".into()
        } else {
            "lru_in_place".into()
        }
    }

    fn alloc(&mut self, m: &mut DataManager, bytes: u64, place: Place) -> Result<ObjectId> {
        let id = match place {
            Place::Fast | Place::Auto => match m.create_object(0, bytes)? {
                Some(id) => id,
                None => {
                    let start = self.victim_start(m);
                    match make_room(m, 0, bytes, start, None) {
                        Ok(()) => create_on(m, 0, bytes)?,
                        // Larger than fast memory, or fast memory all pinned: go slower.
                        Err(Error::DeviceFull { .. } | Error::AllPinned { .. })
                            if m.devices().len() > 1 =>
                        {
                            create_first_fit(m, 1, bytes)?
                        }
                        Err(e) => return Err(e),
                    }
                }
            },
            Place::Slow => create_first_fit(m, m.devices().len().min(2) - 1, bytes)?,
            Place::Device(_) => create_on(m, device_for(m, place)?, bytes)?,
        };
        self.touch(id);
        Ok(id)
    }

    fn read_use(&mut self, _m: &mut DataManager, id: ObjectId) -> Result<()> {
        self.touch(id);
        Ok(())
    }

    fn write_use(&mut self, _m: &mut DataManager, id: ObjectId) -> Result<()> {
        self.touch(id);
        Ok(())
    }

    fn prefetch(&mut self, m: &mut DataManager, id: ObjectId, force: bool) -> Result<()> {
        self.prefetch_filled(m, id, force, Fill::Copy)
    }

    fn prefetch_for_overwrite(
        &mut self,
        m: &mut DataManager,
        id: ObjectId,
        force: bool,
    ) -> Result<()> {
        self.prefetch_filled(m, id, force, Fill::Zero)
    }

    fn evict(&mut self, m: &mut DataManager, id: ObjectId) -> Result<()> {
        evict_object(m, id)
    }

    fn softevict(&mut self, m: &mut DataManager, id: ObjectId) -> Result<()> {
        m.object(id)?;
        // Below every use, and in the order they were soft-evicted: among eviction
        // candidates the least recently marked goes first ("on an LRU basis", thesis §4.5).
        // Training soft-evicts each forward op's inputs; backward needs the last ones first.
        self.soft += 1;
        self.set_stamp(id, SOFT_BASE + self.soft);
        Ok(())
    }

    fn unsafe_free(&mut self, m: &mut DataManager, id: ObjectId) -> Result<()> {
        m.destroy_object(id)?;
        self.forget(id);
        Ok(())
    }

    fn before_access(&mut self, m: &mut DataManager, id: ObjectId, _write: bool) -> Result<()> {
        if !self.prefetch_on_access {
            return stage_in(m, id);
        }
        let start = self.victim_start(m);
        match prefetch_object(m, id, 0, true, Some(start)) {
            Ok(_) => Ok(()),
            // Cannot be cached (too large, or fast memory pinned): use it where it is.
            Err(Error::DeviceFull { .. } | Error::AllPinned { .. }) => stage_in(m, id),
            Err(e) => Err(e),
        }
    }
}
