//! `planned`: a plan decides (the planner's executor, thesis ch. 3): objects are made where
//! asked (fast memory, or the next device with room when a plan's fast allocation does not
//! fit, as first-touch does), and move only when told: a prefetch copies the object into
//! fast memory if it fits there without evicting anything (the plan evicts explicitly), an
//! evict sends it home (copying only if it is dirty: a prefetched object keeps its clean
//! home copy linked). Nothing moves on the policy's own initiative.

use super::Policy;
use crate::mechanism::{
    create_first_fit, device_for, evict_object, prefetch_object, stage_in, stage_out, DataManager,
    ObjectId, Place,
};
use crate::Result;

/// The executor's policy.
#[derive(Debug, Default, Clone, Copy)]
pub struct Planned;

impl Policy for Planned {
    fn name(&self) -> String {
        "planned".into()
    }

    fn alloc(&mut self, m: &mut DataManager, bytes: u64, place: Place) -> Result<ObjectId> {
        let d = device_for(m, place)?;
        create_first_fit(m, d, bytes)
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
}
