//! Policies (thesis Table 4.5): the API applications call, implemented on the data
//! manager's mechanism. A policy decides; the mechanism ([`crate::mechanism`]: the
//! [`DataManager`] and the moves every policy shares) acts. One file per policy; [`builtin`]
//! is the registry, and [`BUILTIN`] names every entry once for the layers above.

mod all_fast;
mod all_slow;
mod first_touch;
mod lru;
mod planned;
mod twolm;

pub use all_fast::AllFast;
pub use all_slow::AllSlow;
pub use first_touch::FirstTouch;
pub use lru::Lru;
pub use planned::Planned;
pub use twolm::TwoLmPolicy;

use crate::mechanism::{evict_object, stage_in, DataManager, GuardUse, ObjectId, Place};
use crate::{Error, Result};

/// The policy API of thesis Table 4.5, plus the two access hooks guards call.
/// Every method runs under the manager's lock with exclusive access to the data manager.
pub trait Policy: Send {
    /// Name used in reports.
    fn name(&self) -> String;

    /// `alloc_fast` / `alloc_slow` / allocate on a device.
    fn alloc(&mut self, m: &mut DataManager, bytes: u64, place: Place) -> Result<ObjectId>;

    /// [`Policy::alloc`] at heap offset `at` of the device `place` names, for a policy that
    /// follows a plan's offsets (the `planned` policy); the others ignore `at`.
    fn alloc_at(
        &mut self,
        m: &mut DataManager,
        bytes: u64,
        place: Place,
        _at: Option<u64>,
    ) -> Result<ObjectId> {
        self.alloc(m, bytes, place)
    }

    /// A planned prefetch into fast memory, at heap offset `at` for a policy that follows a
    /// plan's offsets; the others prefetch as [`Policy::prefetch`] without forcing.
    fn prefetch_at(&mut self, m: &mut DataManager, id: ObjectId, _at: Option<u64>) -> Result<()> {
        self.prefetch(m, id, false)
    }

    /// `read_use`: the object was used read-only.
    fn read_use(&mut self, _m: &mut DataManager, _id: ObjectId) -> Result<()> {
        Ok(())
    }

    /// `write_use`: the object was written (the manager has already marked it dirty).
    fn write_use(&mut self, _m: &mut DataManager, _id: ObjectId) -> Result<()> {
        Ok(())
    }

    /// `prefetch!(object, force)`.
    fn prefetch(&mut self, m: &mut DataManager, id: ObjectId, force: bool) -> Result<()>;

    /// A prefetch into fast memory for an object its user will overwrite whole: its bytes
    /// there are unspecified until written (zeros where the policy skips the copy, as the
    /// LRU policies do; its old bytes under policies that copy). The manager marks it dirty.
    fn prefetch_for_overwrite(
        &mut self,
        m: &mut DataManager,
        id: ObjectId,
        force: bool,
    ) -> Result<()> {
        self.prefetch(m, id, force)
    }

    /// `evict!(object)`.
    fn evict(&mut self, m: &mut DataManager, id: ObjectId) -> Result<()> {
        evict_object(m, id)
    }

    /// `softevict!(object)`: prefer it for the next eviction.
    fn softevict(&mut self, _m: &mut DataManager, _id: ObjectId) -> Result<()> {
        Ok(())
    }

    /// `unsafe_free(object)`: free now; its data is dead and never written back.
    fn unsafe_free(&mut self, m: &mut DataManager, id: ObjectId) -> Result<()> {
        m.destroy_object(id)
    }

    /// Called before a guard opens: the object's primary must end on a byte-addressable
    /// device. The default stages block-resident data into memory without evicting anything.
    fn before_access(&mut self, m: &mut DataManager, id: ObjectId, _write: bool) -> Result<()> {
        stage_in(m, id)
    }

    /// Called when any guard on the object closes (overlapping guards each call it), with how
    /// the guard used the bytes; before [`Policy::after_access`]. For policies that model
    /// the memory system per access (the 2LM model).
    fn guard_closed(&mut self, _m: &mut DataManager, _id: ObjectId, _how: GuardUse) -> Result<()> {
        Ok(())
    }

    /// What the policy itself counts, for reports (the 2LM model's events and traffic), as
    /// JSON; `None` for policies that count nothing of their own.
    fn stats_json(&self) -> Option<String> {
        None
    }

    /// Called after the last open guard closes (the manager has already unpinned it).
    fn after_access(&mut self, _m: &mut DataManager, _id: ObjectId, _write: bool) -> Result<()> {
        Ok(())
    }

    /// Whether [`crate::manager::Manager::charge`] should charge operands' bytes to the
    /// devices they live on. A policy that models the memory system itself (the 2LM model,
    /// which charges every guard's bytes when it closes) says no.
    fn charges_operands(&self) -> bool {
        true
    }
}

/// The built-in policies' names ([`builtin`] also takes `2lm_model:LINE`), exported to the
/// layers above so that none of them lists them again.
pub const BUILTIN: &[&str] = &[
    "lru",
    "lru_in_place",
    "all_fast",
    "all_slow",
    "first_touch",
    "planned",
    "2lm_model",
];

/// A built-in policy by name: `lru`, `lru_in_place`, `all_fast`, `all_slow`, `first_touch`,
/// `planned`, `2lm_model` (`2lm_model:LINE` for coarser lines).
pub fn builtin(name: &str) -> Result<Box<dyn Policy>> {
    let name = name.replace('-', "_");
    if let Some(line) = name.strip_prefix("2lm_model:") {
        let line: usize = line.parse().map_err(|_| {
            Error::InvalidArgument(format!(
                "policy '{name}': the line size after '2lm_model:' must be a number of bytes"
            ))
        })?;
        crate::ensure!(
            line >= crate::model::LINE && line.is_power_of_two(),
            "policy '{name}': the line must be a power of two of at least 64 bytes"
        );
        return Ok(Box::new(TwoLmPolicy::new(line)));
    }
    Ok(match name.as_str() {
        "lru" => Box::new(Lru::default()),
        "lru_in_place" => Box::new(Lru::in_place()),
        "2lm_model" => Box::new(TwoLmPolicy::new(crate::model::LINE)),
        "all_fast" => Box::new(AllFast),
        "all_slow" => Box::new(AllSlow),
        "first_touch" => Box::new(FirstTouch),
        "planned" => Box::new(Planned::default()),
        _ => {
            return Err(Error::InvalidArgument(format!(
                "unknown policy '{name}' (built-ins: {}, and 2lm_model:LINE)",
                BUILTIN.join(", ")
            )))
        }
    })
}
