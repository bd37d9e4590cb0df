//! `planned`: a plan decides (the planner's executor, thesis ch. 3): objects are made where
//! asked, at the heap offset the plan gives when it gives one (a plan's offsets keep the
//! fast heap from fragmenting); when that span is taken the object goes anywhere on the
//! device, and when the device has no room, to the next one with room, as first-touch does
//! (both counted, so a plan that does not fit shows), and move only when
//! told: a prefetch copies the object into fast memory if it fits there without evicting
//! anything (the plan evicts explicitly), an evict sends it to the next slower device
//! (copying only if it is dirty: a prefetched object keeps its clean slow copy linked).
//! Nothing moves on the policy's own initiative.

use super::Policy;
use crate::mechanism::{
    create_first_fit, device_for, evict_object, prefetch_object, prefetch_object_at, stage_in,
    stage_out, DataManager, ObjectId, Place, Prefetched,
};
use crate::Result;

/// The executor's policy, with what went other than asked.
#[derive(Debug, Default, Clone, Copy)]
pub struct Planned {
    /// Allocations that did not fit on the device asked for.
    alloc_fallbacks: u64,
    /// Their bytes.
    fallback_bytes: u64,
    /// Allocations and prefetches given an offset whose span was taken.
    offset_misses: u64,
}

impl Policy for Planned {
    fn name(&self) -> String {
        "planned".into()
    }

    fn alloc(&mut self, m: &mut DataManager, bytes: u64, place: Place) -> Result<ObjectId> {
        let d = device_for(m, place)?;
        let id = create_first_fit(m, d, bytes)?;
        if m.device_of(m.primary(id)?)? != d {
            self.alloc_fallbacks += 1;
            self.fallback_bytes += bytes;
        }
        Ok(id)
    }

    fn alloc_at(
        &mut self,
        m: &mut DataManager,
        bytes: u64,
        place: Place,
        at: Option<u64>,
    ) -> Result<ObjectId> {
        if let Some(off) = at {
            if let Some(id) = m.create_object_at(device_for(m, place)?, bytes, Some(off))? {
                return Ok(id);
            }
            self.offset_misses += 1;
        }
        self.alloc(m, bytes, place)
    }

    fn prefetch_at(&mut self, m: &mut DataManager, id: ObjectId, at: Option<u64>) -> Result<()> {
        if let Some(off) = at {
            if prefetch_object_at(m, id, 0, off)? == Prefetched::Done {
                return Ok(());
            }
            self.offset_misses += 1;
        }
        self.prefetch(m, id, false)
    }

    fn prefetch(&mut self, m: &mut DataManager, id: ObjectId, _force: bool) -> Result<()> {
        prefetch_object(m, id, 0, false, None).map(|_| ())
    }

    fn evict(&mut self, m: &mut DataManager, id: ObjectId) -> Result<()> {
        evict_object(m, id)
    }

    fn before_access(&mut self, m: &mut DataManager, id: ObjectId, _write: bool) -> Result<()> {
        stage_in(m, id)
    }

    fn after_access(&mut self, m: &mut DataManager, id: ObjectId, _write: bool) -> Result<()> {
        stage_out(m, id)
    }

    fn stats_json(&self) -> Option<String> {
        Some(format!(
            "{{\"alloc_fallbacks\": {}, \"fallback_bytes\": {}, \"offset_misses\": {}}}",
            self.alloc_fallbacks, self.fallback_bytes, self.offset_misses
        ))
    }
}
