//! The mechanism floor: the data manager (objects, regions, links, the heaps of every
//! device and the copy engine), where a new object goes ([`Place`]), how a guard used its
//! bytes ([`GuardUse`]), and the moves ([`moves`]). No decisions here: policies make them.

mod data;
pub mod moves;
mod object;

pub use data::DataManager;
pub use moves::{
    create_first_fit, create_on, create_slow, device_for, evict_object, full, make_room,
    prefetch_filled, prefetch_object, prefetch_object_at, stage_in, stage_out, writeback_begin,
    writeback_end, writeback_object, Fill, Prefetched, Writeback,
};
pub use object::{Object, ObjectId, Region, RegionId};

/// Where a new object should go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// Fast memory (`alloc_fast`): device 0.
    Fast,
    /// Slow memory (`alloc_slow`): the last device.
    Slow,
    /// A particular device index.
    Device(usize),
    /// Wherever the policy prefers.
    Auto,
}

impl Place {
    /// The codes the layers above pass places by, named once here: a device index is its
    /// own code (`>= 0`); these are the negative ones.
    pub const CODES: [(&'static str, i64); 3] = [("fast", -1), ("slow", -2), ("auto", -3)];

    /// The place a code names (see [`Place::CODES`]).
    pub fn from_code(code: i64) -> crate::Result<Place> {
        Ok(match code {
            -1 => Place::Fast,
            -2 => Place::Slow,
            -3 => Place::Auto,
            n if n >= 0 => Place::Device(n as usize),
            _ => crate::bail!(
                "bad place code {code}: a device index (0 or more) or one of {:?}",
                Place::CODES
            ),
        })
    }
}

/// How a guard used its object's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GuardUse {
    /// Read only.
    Read,
    /// Read and written (in-place updates with ordinary stores).
    Write,
    /// Overwritten whole without being read (an op's output, a copy in): the old contents
    /// are dead, so a policy need not bring them in, and a cache model sees stores only.
    Overwrite,
}
