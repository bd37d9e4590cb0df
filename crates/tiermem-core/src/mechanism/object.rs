//! Objects and regions: the records the data manager keeps (thesis Table 4.4).

/// Object identifier; ids increase monotonically and are never reused.
pub type ObjectId = u64;
/// Region identifier; ids increase monotonically and are never reused.
pub type RegionId = u64;

/// A contiguous range of one device holding an object's data (its primary) or a copy of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Region {
    /// Id.
    pub id: RegionId,
    /// Index of the device in the manager's list (0 = fastest).
    pub device: usize,
    /// Offset in the device heap.
    pub offset: u64,
    /// Length in bytes (the object's length rounded up to the device's alignment).
    pub size: u64,
    /// The object the region belongs to (`parent`).
    pub object: ObjectId,
    /// Modified with respect to the linked regions (meaningful for the primary).
    pub dirty: bool,
    /// Linked regions of the same object (symmetric).
    pub links: Vec<RegionId>,
}

/// An object: what applications hold. Its data lives in the primary region.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Object {
    /// Id.
    pub id: ObjectId,
    /// Length in bytes as requested.
    pub len: u64,
    /// Current primary region.
    pub primary: RegionId,
    /// Open read and write guards, and holds (`held`).
    pub pins: u32,
    /// Pins that are holds, not guards: a view derived inside a guard outlived it, so the
    /// object stays where that view points until the view is gone ([`super::Manager::hold`]).
    /// Holds keep the object from being moved, evicted or freed, but do not block guards.
    pub held: u32,
    /// Whether the open guard is a write guard (then it is the only one).
    pub writer: bool,
    /// Write guards opened and primaries marked dirty so far: a move whose copy ran outside
    /// the manager lock checks it is unchanged before it switches anything.
    pub writes: u64,
}
