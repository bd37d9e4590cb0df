//! `all_fast`: every object in fast memory (device 0); nothing ever moves. The upper bound
//! baseline: allocation fails when fast memory is full.

use super::Policy;
use crate::mechanism::{create_on, device_for, DataManager, ObjectId, Place};
use crate::Result;

/// The all-fast baseline.
#[derive(Debug, Default, Clone, Copy)]
pub struct AllFast;

impl Policy for AllFast {
    fn name(&self) -> String {
        "all_fast".into()
    }

    fn alloc(&mut self, m: &mut DataManager, bytes: u64, place: Place) -> Result<ObjectId> {
        let d = match place {
            Place::Device(_) => device_for(m, place)?,
            _ => 0,
        };
        create_on(m, d, bytes)
    }

    fn prefetch(&mut self, _m: &mut DataManager, _id: ObjectId, _force: bool) -> Result<()> {
        Ok(())
    }

    fn evict(&mut self, _m: &mut DataManager, _id: ObjectId) -> Result<()> {
        Ok(())
    }
}
