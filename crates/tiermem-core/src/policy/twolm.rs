//! `2lm_model`: the hardware DRAM cache as a policy for tiered arrays. Every object lives on
//! the slowest device; the fastest device, none of which the policy allocates, serves whole
//! as the 2LM model's cache (as memory mode uses all of DRAM). When any guard closes
//! (overlapping guards each count), the object's bytes run through the model — a read guard
//! as reads, a write guard as read-modify-write (loads then ordinary stores; the model cannot
//! see which bytes the program touched, so it charges them all), an overwrite guard as
//! whole-line stores (thesis Table 2.2's write events) — and their thesis Table 2.2 traffic is counted on
//! both devices and, on an emulated slow device, waited out after the manager's lock is
//! released.
//!
//! `2lm_model:LINE` picks a coarser line (a power of two) for very large arrays.

use std::sync::Arc;

use super::Policy;
use crate::mechanism::{create_slow, stage_in, DataManager, GuardUse, ObjectId, Place};
use crate::model::{Access, TwoLm, EVENTS, LINE};
use crate::{ensure, Result};

/// The 2LM-model baseline for arrays.
pub struct TwoLmPolicy {
    line: usize,
    model: Option<Arc<TwoLm>>,
}

impl TwoLmPolicy {
    /// With `line`-byte lines (64 is the hardware's).
    #[must_use]
    pub fn new(line: usize) -> Self {
        TwoLmPolicy { line, model: None }
    }

    fn model_for(&mut self, m: &DataManager) -> Result<Arc<TwoLm>> {
        if let Some(t) = &self.model {
            return Ok(t.clone());
        }
        let devs = m.devices();
        ensure!(
            devs.len() >= 2,
            "the 2lm_model policy needs a fast and a slow device"
        );
        let slow = devs.len() - 1;
        let t = Arc::new(TwoLm::over(
            (devs[slow].clone(), slow),
            (devs[0].clone(), 0),
            devs[0].capacity,
            self.line,
        )?);
        self.model = Some(t.clone());
        Ok(t)
    }
}

impl Policy for TwoLmPolicy {
    fn name(&self) -> String {
        if self.line == LINE {
            "2lm_model".into()
        } else {
            format!("2lm_model:{}", self.line)
        }
    }

    fn alloc(&mut self, m: &mut DataManager, bytes: u64, place: Place) -> Result<ObjectId> {
        self.model_for(m)?;
        create_slow(m, bytes, place)
    }

    fn prefetch(&mut self, _m: &mut DataManager, _id: ObjectId, _force: bool) -> Result<()> {
        Ok(())
    }

    fn before_access(&mut self, m: &mut DataManager, id: ObjectId, _write: bool) -> Result<()> {
        stage_in(m, id)
    }

    fn stats_json(&self) -> Option<String> {
        self.model
            .as_ref()
            .and_then(|m| serde_json::to_string(&m.stats()).ok())
    }

    fn charges_operands(&self) -> bool {
        false // every guard's bytes already ran through the model when it closed
    }

    fn guard_closed(&mut self, m: &mut DataManager, id: ObjectId, how: GuardUse) -> Result<()> {
        let model = self.model_for(m)?;
        let r = m.primary(id)?;
        let len = m.object(id)?.len as usize;
        let Some(ptr) = m.address(r)? else {
            return Ok(());
        };
        if !model.covers(ptr, len) {
            return Ok(()); // placed elsewhere by request (Place::Device): not behind the cache
        }
        let mut ev = [0u64; EVENTS];
        let how = match how {
            GuardUse::Read => Access::Read,
            GuardUse::Write => Access::ReadModifyWrite,
            GuardUse::Overwrite => Access::Write,
        };
        model.access(ptr, len, how, &mut ev);
        // Whole arrays stream: hardware prefetchers hide latency, so bandwidth only.
        model.charge(&ev, 0);
        Ok(())
    }
}
