//! `all_slow`: every object on the slowest device; nothing is cached. Data on a block device
//! is staged into memory for the length of a guard and written back (if modified) when the
//! guard closes — the cost of using the slow tier directly.

use super::Policy;
use crate::mechanism::{create_slow, stage_in, stage_out, DataManager, ObjectId, Place};
use crate::Result;

/// The all-slow baseline.
#[derive(Debug, Default, Clone, Copy)]
pub struct AllSlow;

impl Policy for AllSlow {
    fn name(&self) -> String {
        "all_slow".into()
    }

    fn alloc(&mut self, m: &mut DataManager, bytes: u64, place: Place) -> Result<ObjectId> {
        create_slow(m, bytes, place)
    }

    fn prefetch(&mut self, _m: &mut DataManager, _id: ObjectId, _force: bool) -> Result<()> {
        Ok(())
    }

    fn before_access(&mut self, m: &mut DataManager, id: ObjectId, _write: bool) -> Result<()> {
        stage_in(m, id)
    }

    fn after_access(&mut self, m: &mut DataManager, id: ObjectId, _write: bool) -> Result<()> {
        stage_out(m, id)
    }
}
