//! `planned`: a plan decides (the planner's executor, thesis ch. 3): objects are made where
//! asked (on the device asked for, or the next one with room when a plan's allocation does
//! not fit there, as first-touch does: counted, so fragmentation shows), and move only when
//! told: a prefetch copies the object into fast memory if it fits there without evicting
//! anything (the plan evicts explicitly), an evict sends it to the next slower device
//! (copying only if it is dirty: a prefetched object keeps its clean slow copy linked).
//! Nothing moves on the policy's own initiative.

use super::Policy;
use crate::mechanism::{
    create_first_fit, device_for, evict_object, prefetch_object, stage_in, stage_out, DataManager,
    ObjectId, Place,
};
use crate::Result;

/// The executor's policy, with what went other than asked.
#[derive(Debug, Default, Clone, Copy)]
pub struct Planned {
    /// Allocations that did not fit on the device asked for.
    alloc_fallbacks: u64,
    /// Their bytes.
    fallback_bytes: u64,
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
            "{{\"alloc_fallbacks\": {}, \"fallback_bytes\": {}}}",
            self.alloc_fallbacks, self.fallback_bytes
        ))
    }
}
