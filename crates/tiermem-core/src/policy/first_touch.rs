//! `first_touch`: fill fast memory in allocation order, then the next device, and never move
//! anything — the NUMA first-touch baseline of thesis §3.5.3. Block-resident data is staged
//! for the length of a guard like `all_slow` does.

use super::Policy;
use crate::mechanism::{
    create_first_fit, device_for, stage_in, stage_out, DataManager, ObjectId, Place,
};
use crate::Result;

/// The first-touch baseline.
#[derive(Debug, Default, Clone, Copy)]
pub struct FirstTouch;

impl Policy for FirstTouch {
    fn name(&self) -> String {
        "first_touch".into()
    }

    fn alloc(&mut self, m: &mut DataManager, bytes: u64, place: Place) -> Result<ObjectId> {
        let d = match place {
            Place::Device(_) | Place::Slow => device_for(m, place)?,
            Place::Fast | Place::Auto => 0,
        };
        create_first_fit(m, d, bytes)
    }

    fn prefetch(&mut self, _m: &mut DataManager, _id: ObjectId, _force: bool) -> Result<()> {
        Ok(())
    }

    fn evict(&mut self, _m: &mut DataManager, _id: ObjectId) -> Result<()> {
        Ok(())
    }

    fn before_access(&mut self, m: &mut DataManager, id: ObjectId, _write: bool) -> Result<()> {
        stage_in(m, id)
    }

    fn after_access(&mut self, m: &mut DataManager, id: ObjectId, _write: bool) -> Result<()> {
        stage_out(m, id)
    }
}
