//! The moves every policy shares, written once: allocation helpers, evict (thesis Listing
//! 4.1), write-behind, prefetch (Listing 4.2), making room by walking a heap (Fig. 4.3), and
//! staging block-resident data through memory. They act; policies decide when.

use super::{DataManager, ObjectId, Place, RegionId};
use crate::counters::DeviceCounters;
use crate::{Error, Result};

/// Resolve a [`Place`] to a device index.
pub fn device_for(m: &DataManager, place: Place) -> Result<usize> {
    let n = m.devices().len();
    match place {
        Place::Fast | Place::Auto => Ok(0),
        Place::Slow => Ok(n - 1),
        Place::Device(d) if d < n => Ok(d),
        Place::Device(d) => Err(Error::InvalidArgument(format!(
            "device index {d} out of range: the manager has {n} devices"
        ))),
    }
}

/// Allocate on the device `place` names, or on the slowest device for any other place
/// (the policies that keep everything slow).
pub fn create_slow(m: &mut DataManager, bytes: u64, place: Place) -> Result<ObjectId> {
    let d = match place {
        Place::Device(_) => device_for(m, place)?,
        _ => m.devices().len() - 1,
    };
    create_on(m, d, bytes)
}

/// The error for an allocation nothing could satisfy.
pub fn full(m: &DataManager, d: usize, bytes: u64) -> Error {
    let h = m.heap(d);
    Error::DeviceFull {
        device: m.devices()[d].name.clone(),
        requested: bytes,
        free: h.free_bytes(),
        largest: h.largest_free(),
        capacity: h.capacity(),
    }
}

/// Create an object on device `d` or fail with [`Error::DeviceFull`].
pub fn create_on(m: &mut DataManager, d: usize, bytes: u64) -> Result<ObjectId> {
    m.create_object(d, bytes)?.ok_or_else(|| full(m, d, bytes))
}

/// Create an object on the first device from `d` on, in speed order, that has room.
pub fn create_first_fit(m: &mut DataManager, d: usize, bytes: u64) -> Result<ObjectId> {
    for k in d..m.devices().len() {
        if let Some(id) = m.create_object(k, bytes)? {
            return Ok(id);
        }
    }
    Err(full(m, m.devices().len() - 1, bytes))
}

/// Link a new region to the primary and every sibling of the object (links are symmetric
/// among all regions of an object).
fn link_all(m: &mut DataManager, primary: RegionId, new: RegionId) -> Result<()> {
    let siblings = m.region(primary)?.links.clone();
    m.link(primary, new)?;
    for s in siblings {
        m.link(s, new)?;
    }
    Ok(())
}

/// Free the secondaries of `primary` except `keep` (they are stale once it is dirty).
fn drop_stale(m: &mut DataManager, primary: RegionId, keep: Option<RegionId>) -> Result<()> {
    for s in m.region(primary)?.links.clone() {
        if Some(s) != keep {
            m.free(s)?;
        }
    }
    Ok(())
}

/// `evict!` (thesis Listing 4.1), generalised to N devices: move the object's primary to
/// the nearest slower device, reusing a linked slower region when there is one (and copying
/// nothing when the primary is clean), else allocating on the first slower device with room.
/// On failure the object is left where it was.
pub fn evict_object(m: &mut DataManager, id: ObjectId) -> Result<()> {
    let x = m.primary(id)?;
    let d = m.device_of(x)?;
    let n = m.devices().len();
    if d + 1 >= n {
        return Ok(());
    }
    m.ensure_unpinned(id, "evict")?;
    let len = m.object(id)?.len;
    let mut y = None;
    for k in d + 1..n {
        if let Some(r) = m.getlinked(x, k)? {
            y = Some(r);
            break;
        }
    }
    let allocated = y.is_none();
    if y.is_none() {
        for k in d + 1..n {
            if let Some(r) = m.allocate(k, len, id)? {
                y = Some(r);
                break;
            }
        }
    }
    let Some(y) = y else {
        return Err(full(m, n - 1, len));
    };
    let dirty = m.region(x)?.dirty;
    let counters = m.devices()[d].counters.clone();
    if dirty || allocated {
        if let Err(e) = m.copy(y, x) {
            if allocated {
                m.free(y)?;
            }
            return Err(e);
        }
        DeviceCounters::bump(&counters.dirty_writebacks);
    } else {
        DeviceCounters::bump(&counters.writebacks_elided);
    }
    if dirty {
        drop_stale(m, x, Some(y))?;
    }
    for s in m.region(x)?.links.clone() {
        if s != y {
            m.link(y, s)?;
        }
    }
    m.set_primary(id, y)?;
    m.set_dirty(y, false)?;
    m.free(x)?;
    DeviceCounters::bump(&counters.evictions);
    Ok(())
}

/// Move the object's bytes to device `target` (faster or slower) and keep no other copy:
/// copy the primary there, make it primary, free every other region. For objects written
/// behind the manager's back (through an address mapped a second time, the H2M interface),
/// whose dirty state the manager cannot know, so no clean sibling may stand in for them.
/// Skipped (nothing changes) when the object is pinned or `target` has no contiguous room.
pub fn relocate_object(m: &mut DataManager, id: ObjectId, target: usize) -> Result<Prefetched> {
    let x = m.primary(id)?;
    if m.device_of(x)? == target {
        return Ok(Prefetched::Done);
    }
    let o = m.object(id)?;
    if o.pins > 0 {
        return Ok(Prefetched::Skipped);
    }
    let Some(y) = m.allocate(target, o.len, id)? else {
        return Ok(Prefetched::Skipped);
    };
    if let Err(e) = m.copy(y, x) {
        m.free(y)?;
        return Err(e);
    }
    let others = m.region(x)?.links.clone();
    m.set_primary(id, y)?;
    m.set_dirty(y, false)?;
    m.free(x)?;
    for s in others {
        m.free(s)?;
    }
    Ok(Prefetched::Done)
}

/// A write-back begun by [`writeback_begin`]: copy `len` bytes from the primary `x` to the
/// slower sibling `y`, then finish with [`writeback_end`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Writeback {
    /// The object.
    pub id: ObjectId,
    /// Its primary (the source, held for the copy).
    pub x: RegionId,
    /// The slower sibling written (linked to the object from the start).
    pub y: RegionId,
    /// The object's write count when the write-back began.
    pub writes: u64,
}

/// Clean ahead (write-behind): copy a dirty primary to a sibling on the nearest slower
/// device (reusing a linked one, else allocating on the first slower device with room) and
/// mark the primary clean; the primary stays put, so data stays where it is used and a
/// later [`evict_object`] copies nothing. Returns whether it copied. An object being written
/// (a write guard open) is skipped, as is one already clean or on the slowest device; no
/// room on a slower device leaves it dirty (and is not an error).
pub fn writeback_object(m: &mut DataManager, id: ObjectId) -> Result<bool> {
    let Some(w) = writeback_begin(m, id)? else {
        return Ok(false);
    };
    let copied = m.copy(w.y, w.x);
    let done = writeback_end(m, &w, copied.is_ok())?;
    copied.map(|()| done)
}

/// The first step of a write-back whose copy may run outside the manager lock (the
/// "moving" state): checks as [`writeback_object`], then finds or allocates the slower
/// sibling, links it, and holds the object, so that until [`writeback_end`] it is not moved,
/// evicted or freed while guards (readers and writers) still open on it. `None`: nothing to
/// do.
pub fn writeback_begin(m: &mut DataManager, id: ObjectId) -> Result<Option<Writeback>> {
    let x = m.primary(id)?;
    let d = m.device_of(x)?;
    let n = m.devices().len();
    if d + 1 >= n || !m.region(x)?.dirty || m.object(id)?.writer {
        return Ok(None);
    }
    let len = m.object(id)?.len;
    let mut y = None;
    for k in d + 1..n {
        if let Some(r) = m.getlinked(x, k)? {
            y = Some(r);
            break;
        }
    }
    if y.is_none() {
        for k in d + 1..n {
            if let Some(r) = m.allocate(k, len, id)? {
                link_all(m, x, r)?;
                y = Some(r);
                break;
            }
        }
    }
    let Some(y) = y else {
        return Ok(None);
    };
    m.pin(id, false)?;
    m.hold(id)?;
    Ok(Some(Writeback {
        id,
        x,
        y,
        writes: m.object(id)?.writes,
    }))
}

/// The last step of a write-back: releases the hold and, when the copy succeeded (`copied`) and no
/// write guard opened on the object since [`writeback_begin`] (its write count is
/// unchanged and none is open), marks the primary clean and frees its other stale
/// siblings. Otherwise the copy may hold a torn mix and the sibling stays stale (the
/// primary stays dirty: a later eviction copies again), so nothing is lost. Returns whether
/// the object is now clean.
pub fn writeback_end(m: &mut DataManager, w: &Writeback, copied: bool) -> Result<bool> {
    m.release(w.id)?;
    let o = m.object(w.id)?;
    if !copied || o.writes != w.writes || o.writer || o.primary != w.x {
        return Ok(false);
    }
    let d = m.device_of(w.x)?;
    drop_stale(m, w.x, Some(w.y))?;
    m.set_dirty(w.x, false)?;
    DeviceCounters::bump(&m.devices()[d].counters.dirty_writebacks);
    Ok(true)
}

/// What [`prefetch_object`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prefetched {
    /// The primary is now on the target device (or a faster one).
    Done,
    /// Nothing moved: no room and not forced, or the object is pinned.
    Skipped,
}

/// `prefetch!` (thesis Listing 4.2): copy the object to `target`, keep the old region linked
/// as a clean sibling, and make the new region primary. When `force` is set and the target
/// is full, walk its heap from `start` (the policy's eviction choice) evicting what is in
/// the way with [`evict_object`]. Fails with [`Error::AllPinned`] when only pinned data
/// could make room.
pub fn prefetch_object(
    m: &mut DataManager,
    id: ObjectId,
    target: usize,
    force: bool,
    start: Option<u64>,
) -> Result<Prefetched> {
    prefetch_filled(m, id, target, (force, start), Fill::Copy)
}

/// How a prefetch fills the object's new region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fill {
    /// With the object's bytes (every prefetch but one for overwrite).
    Copy,
    /// With zeros, reading nothing from the old region, and dirty: for an object its user
    /// is about to overwrite whole (staging a write-only chunk). Its slower copy is stale.
    Zero,
}

/// [`prefetch_object`] filling the new region as `fill` says; `(force, start)` as there.
pub fn prefetch_filled(
    m: &mut DataManager,
    id: ObjectId,
    target: usize,
    (force, start): (bool, Option<u64>),
    fill: Fill,
) -> Result<Prefetched> {
    let (x, len) = match prefetchable(m, id, target)? {
        Ok(from) => from,
        Err(outcome) => return Ok(outcome),
    };
    let mut y = m.allocate(target, len, id)?;
    if y.is_none() && force {
        make_room(m, target, len, start.unwrap_or(0), Some(id))?;
        y = m.allocate(target, len, id)?;
    }
    let Some(y) = y else {
        return Ok(Prefetched::Skipped);
    };
    switch_primary(m, id, x, y, fill)
}

/// [`prefetch_object`] into the span at heap offset `at` of `target` (a plan's offset),
/// never forcing: skipped when that span is not free or the object is pinned.
pub fn prefetch_object_at(
    m: &mut DataManager,
    id: ObjectId,
    target: usize,
    at: u64,
) -> Result<Prefetched> {
    let (x, len) = match prefetchable(m, id, target)? {
        Ok(from) => from,
        Err(outcome) => return Ok(outcome),
    };
    match m.allocate_at(target, len, id, Some(at))? {
        Some(y) => switch_primary(m, id, x, y, Fill::Copy),
        None => Ok(Prefetched::Skipped),
    }
}

/// The object's primary and length when a prefetch to `target` has work to do; otherwise
/// its outcome: `Done` when the object is already there or faster, `Skipped` when pinned.
fn prefetchable(
    m: &DataManager,
    id: ObjectId,
    target: usize,
) -> Result<std::result::Result<(RegionId, u64), Prefetched>> {
    let x = m.primary(id)?;
    if m.device_of(x)? <= target {
        return Ok(Err(Prefetched::Done));
    }
    let o = m.object(id)?;
    if o.pins > 0 {
        return Ok(Err(Prefetched::Skipped));
    }
    Ok(Ok((x, o.len)))
}

/// Fill the new region `y` from primary `x` as `fill` says, keep `x` linked as a clean
/// sibling and make `y` primary (the end of every prefetch); a zero-filled `y` is dirty, so
/// `x` is stale until it is written back.
fn switch_primary(
    m: &mut DataManager,
    id: ObjectId,
    x: RegionId,
    y: RegionId,
    fill: Fill,
) -> Result<Prefetched> {
    let filled = match fill {
        Fill::Zero => match m.zero(y) {
            Ok(true) => Ok(()),
            Ok(false) => m.copy(y, x), // not byte-addressable: copy instead
            Err(e) => Err(e),
        },
        Fill::Copy => m.copy(y, x),
    };
    if let Err(e) = filled {
        m.free(y)?;
        return Err(e);
    }
    if m.region(x)?.dirty {
        drop_stale(m, x, None)?;
        m.set_dirty(x, false)?;
    }
    link_all(m, x, y)?;
    m.set_primary(id, y)?;
    if fill == Fill::Zero {
        m.set_dirty(y, true)?;
    }
    Ok(Prefetched::Done)
}

/// Make `bytes` contiguous bytes free on device `d` by walking its heap from `start`
/// (thesis Fig. 4.3) and evicting every unpinned object in the way (except `keep`) with
/// [`evict_object`]. Fails with [`Error::AllPinned`] when pinned data blocks every span,
/// and with [`Error::DeviceFull`] when the request exceeds the device.
pub fn make_room(
    m: &mut DataManager,
    d: usize,
    bytes: u64,
    start: u64,
    keep: Option<ObjectId>,
) -> Result<()> {
    let cap = m.heap(d).capacity();
    if m.heap(d).round(bytes).is_none_or(|r| r > cap) {
        return Err(full(m, d, bytes));
    }
    let walked = m.evict_from(d, start, bytes, &mut |m, region| {
        let owner = m.parent(region)?;
        if Some(owner) == keep || m.object(owner)?.pins > 0 {
            return Ok(());
        }
        if m.primary(owner)? == region {
            evict_object(m, owner)
        } else {
            m.free(region)
        }
    })?;
    if walked.is_none() {
        return Err(Error::AllPinned {
            device: m.devices()[d].name.clone(),
            requested: bytes,
            pinned_bytes: pinned_bytes(m, d),
            capacity: cap,
        });
    }
    Ok(())
}

fn pinned_bytes(m: &DataManager, d: usize) -> u64 {
    m.heap(d)
        .iter()
        .filter_map(|(_, b)| b.owner)
        .filter(|&r| {
            m.parent(r)
                .and_then(|o| m.object(o).map(|o| o.pins > 0))
                .unwrap_or(false)
        })
        .map(|r| m.region(r).map_or(0, |r| r.size))
        .sum()
}

/// If the object's primary is not byte-addressable, copy it into the fastest memory device
/// with room (evicting nothing). Fails with a guard error naming the numbers if none has room.
pub fn stage_in(m: &mut DataManager, id: ObjectId) -> Result<()> {
    let x = m.primary(id)?;
    if m.devices()[m.device_of(x)?].byte_addressable() {
        return Ok(());
    }
    let len = m.object(id)?.len;
    for k in 0..m.devices().len() {
        if m.devices()[k].byte_addressable()
            && m.fits(k, len)
            && prefetch_object(m, id, k, false, None)? == Prefetched::Done
        {
            return Ok(());
        }
    }
    Err(Error::Guard(format!(
        "object {id} ({len} bytes) lives on block device '{}', which is not byte-addressable, \
         and no memory device has {len} contiguous bytes free to stage it; evict something \
         or use a policy that evicts (lru)",
        m.devices()[m.device_of(x)?].name
    )))
}

/// Undo [`stage_in`]: if the object has a block-device sibling, evict back to it (writing
/// back only if the staged copy was modified).
pub fn stage_out(m: &mut DataManager, id: ObjectId) -> Result<()> {
    let x = m.primary(id)?;
    let has_block_home = m.region(x)?.links.iter().any(|l| {
        m.region(*l)
            .is_ok_and(|r| !m.devices()[r.device].byte_addressable())
    });
    if !has_block_home {
        return Ok(());
    }
    while m.object(id)?.pins == 0 {
        let p = m.primary(id)?;
        if !m.devices()[m.device_of(p)?].byte_addressable() {
            break;
        }
        evict_object(m, id)?;
        if m.primary(id)? == p {
            break;
        }
    }
    Ok(())
}
