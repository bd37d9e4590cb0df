//! The data manager: the mechanism of thesis Table 4.4, generalised to N devices ordered
//! fastest first. It tracks objects, their primary and linked regions and dirty state, and
//! copies between regions. It makes no decisions: policies do.

use std::collections::HashMap;
use std::sync::Arc;

use super::object::{Object, ObjectId, Region, RegionId};
use crate::copy::CopyEngine;
use crate::counters::DeviceCounters;
use crate::device::Device;
use crate::heap::{Disposition, Heap};
use crate::{Error, Result};

/// Objects, regions, heaps and devices.
pub struct DataManager {
    devices: Vec<Arc<Device>>,
    heaps: Vec<Heap>,
    objects: HashMap<ObjectId, Object>,
    regions: HashMap<RegionId, Region>,
    next_object: u64,
    next_region: u64,
    /// Device whose heap `evict_from` is walking (its frees are done by the walk).
    walking: Option<usize>,
    copy: Arc<CopyEngine>,
}

impl DataManager {
    /// A manager over `devices` (fastest first). The first device must be byte-addressable.
    pub fn new(devices: Vec<Arc<Device>>, copy: Arc<CopyEngine>) -> Result<Self> {
        if devices.is_empty() {
            crate::bail!("a manager needs at least one device");
        }
        if !devices[0].byte_addressable() {
            crate::bail!(
                "the first (fastest) device '{}' is not byte-addressable; list a memory \
                 device first",
                devices[0].name
            );
        }
        for (i, a) in devices.iter().enumerate() {
            if devices[..i].iter().any(|b| b.name == a.name) {
                crate::bail!("device '{}' is listed twice", a.name);
            }
        }
        let heaps = devices
            .iter()
            .map(|d| Heap::new(d.capacity, d.alignment()))
            .collect();
        Ok(DataManager {
            devices,
            heaps,
            objects: HashMap::new(),
            regions: HashMap::new(),
            next_object: 1,
            next_region: 1,
            walking: None,
            copy,
        })
    }

    // ----- devices -----

    /// The devices, fastest first.
    #[must_use]
    pub fn devices(&self) -> &[Arc<Device>] {
        &self.devices
    }

    /// The heap of device `d`.
    #[must_use]
    pub fn heap(&self, d: usize) -> &Heap {
        &self.heaps[d]
    }

    /// Restart peak-use measurement on every heap.
    pub fn reset_peaks(&mut self) {
        for h in &mut self.heaps {
            h.reset_peak();
        }
    }

    /// The copy engine.
    #[must_use]
    pub fn copy_engine(&self) -> &Arc<CopyEngine> {
        &self.copy
    }

    /// Whether device `d` can satisfy an allocation of `bytes` without eviction.
    #[must_use]
    pub fn fits(&self, d: usize, bytes: u64) -> bool {
        self.heaps[d]
            .round(bytes)
            .is_some_and(|b| b <= self.heaps[d].largest_free())
    }

    fn counters(&self, d: usize) -> &DeviceCounters {
        &self.devices[d].counters
    }

    // ----- objects -----

    /// Create an object of `len` bytes whose primary is a new region on `device`.
    /// Returns `Ok(None)` when the device has no room.
    pub fn create_object(&mut self, device: usize, len: u64) -> Result<Option<ObjectId>> {
        self.create_object_at(device, len, None)
    }

    /// [`DataManager::create_object`] at heap offset `at` when given (see
    /// [`DataManager::allocate_at`]).
    pub fn create_object_at(
        &mut self,
        device: usize,
        len: u64,
        at: Option<u64>,
    ) -> Result<Option<ObjectId>> {
        let id = self.next_object;
        let Some(r) = self.allocate_at(device, len, id, at)? else {
            return Ok(None);
        };
        self.next_object += 1;
        self.objects.insert(
            id,
            Object {
                id,
                len,
                primary: r,
                pins: 0,
                held: 0,
                writer: false,
                writes: 0,
            },
        );
        Ok(Some(id))
    }

    /// The object record.
    pub fn object(&self, id: ObjectId) -> Result<&Object> {
        self.objects.get(&id).ok_or(Error::NoSuchObject(id))
    }

    fn object_mut(&mut self, id: ObjectId) -> Result<&mut Object> {
        self.objects.get_mut(&id).ok_or(Error::NoSuchObject(id))
    }

    /// Ids of every live object.
    pub fn object_ids(&self) -> impl Iterator<Item = ObjectId> + '_ {
        self.objects.keys().copied()
    }

    /// `primary(object)`.
    pub fn primary(&self, id: ObjectId) -> Result<RegionId> {
        Ok(self.object(id)?.primary)
    }

    /// `set!(object, region)`: make `region` (which must belong to the object) its primary.
    pub fn set_primary(&mut self, id: ObjectId, region: RegionId) -> Result<()> {
        let owner = self.region(region)?.object;
        if owner != id {
            crate::bail!("region {region} belongs to object {owner}, not {id}");
        }
        if self.object(id)?.primary != region {
            // A guard's view points at the primary: switching it would leave the view on
            // memory the object no longer owns.
            self.ensure_unpinned(id, "switching its primary region")?;
        }
        self.object_mut(id)?.primary = region;
        Ok(())
    }

    /// Open a guard on an object: many readers or one writer, like a Rust borrow.
    pub fn pin(&mut self, id: ObjectId, write: bool) -> Result<()> {
        let o = self.object_mut(id)?;
        if o.writer || (write && o.pins > o.held) {
            return Err(Error::Guard(format!(
                "object {id} is already open in {} {} guard(s); a write guard needs it alone",
                o.pins - o.held,
                if o.writer { "write" } else { "read" }
            )));
        }
        o.pins += 1;
        o.writer = write;
        o.writes += u64::from(write);
        Ok(())
    }

    /// Turn one open guard into a hold: the object stays pinned (not moved, evicted or
    /// freed), but no longer counts as an open guard.
    pub fn hold(&mut self, id: ObjectId) -> Result<()> {
        let o = self.object_mut(id)?;
        if o.pins <= o.held {
            return Err(Error::Guard(format!(
                "object {id} has no open guard to turn into a hold"
            )));
        }
        o.held += 1;
        o.writer = false;
        Ok(())
    }

    /// Release a hold made with [`DataManager::hold`].
    pub fn release(&mut self, id: ObjectId) -> Result<()> {
        let o = self.object_mut(id)?;
        if o.held == 0 {
            return Err(Error::Guard(format!("object {id} has no hold to release")));
        }
        o.held -= 1;
        o.pins -= 1;
        Ok(())
    }

    /// Close a guard opened with [`DataManager::pin`].
    pub fn unpin(&mut self, id: ObjectId) -> Result<()> {
        let o = self.object_mut(id)?;
        if o.pins <= o.held {
            return Err(Error::Guard(format!(
                "object {id} has no open guard to close"
            )));
        }
        o.pins -= 1;
        o.writer = false;
        Ok(())
    }

    /// Fail with [`Error::Pinned`] if a guard holds the object.
    pub fn ensure_unpinned(&self, id: ObjectId, action: &'static str) -> Result<()> {
        let o = self.object(id)?;
        if o.pins > 0 {
            return Err(Error::Pinned {
                object: id,
                pins: o.pins - o.held,
                held: o.held,
                action,
            });
        }
        Ok(())
    }

    /// Free an object and every region it has, copying nothing (its data is dead).
    pub fn destroy_object(&mut self, id: ObjectId) -> Result<()> {
        self.ensure_unpinned(id, "free")?;
        let regions = self.regions_of(id)?;
        self.objects.remove(&id);
        for r in regions {
            self.free(r)?;
        }
        Ok(())
    }

    /// The primary and every linked region of an object.
    pub fn regions_of(&self, id: ObjectId) -> Result<Vec<RegionId>> {
        let primary = self.primary(id)?;
        let mut regions = self.region(primary)?.links.clone();
        regions.push(primary);
        Ok(regions)
    }

    // ----- regions -----

    /// The region record.
    pub fn region(&self, id: RegionId) -> Result<&Region> {
        self.regions
            .get(&id)
            .ok_or_else(|| Error::InvalidArgument(format!("no region with id {id}")))
    }

    fn region_mut(&mut self, id: RegionId) -> Result<&mut Region> {
        self.regions
            .get_mut(&id)
            .ok_or_else(|| Error::InvalidArgument(format!("no region with id {id}")))
    }

    /// `allocate(device, bytes)` for `object`. `Ok(None)` when the device is full (counted
    /// as an allocation failure).
    pub fn allocate(
        &mut self,
        device: usize,
        bytes: u64,
        object: ObjectId,
    ) -> Result<Option<RegionId>> {
        self.allocate_at(device, bytes, object, None)
    }

    /// [`DataManager::allocate`] at heap offset `at` when given (a plan's offset): `Ok(None)`
    /// when that span is not free, counted as an allocation failure like a full device.
    pub fn allocate_at(
        &mut self,
        device: usize,
        bytes: u64,
        object: ObjectId,
        at: Option<u64>,
    ) -> Result<Option<RegionId>> {
        let dev = self.devices.get(device).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "no device index {device} ({} devices)",
                self.devices.len()
            ))
        })?;
        if bytes == 0 {
            crate::bail!("cannot allocate zero bytes");
        }
        let Some(size) = self.heaps[device].round(bytes) else {
            crate::bail!(
                "{bytes} bytes overflow when rounded to the alignment of '{}'",
                dev.name
            );
        };
        if self.walking == Some(device) {
            crate::bail!(
                "cannot allocate on '{}' while evict_from walks its heap",
                dev.name
            );
        }
        if self.objects.contains_key(&object) {
            for r in self.regions_of(object)? {
                if self.regions[&r].device == device {
                    crate::bail!(
                        "object {object} already has region {r} on '{}' (one region per device)",
                        dev.name
                    );
                }
            }
        }
        let id = self.next_region;
        let got = match at {
            Some(off) => self.heaps[device].alloc_at(off, size, id),
            None => self.heaps[device].alloc(size, id),
        };
        let Some(offset) = got else {
            DeviceCounters::bump(&self.counters(device).alloc_failures);
            return Ok(None);
        };
        self.next_region += 1;
        self.regions.insert(
            id,
            Region {
                id,
                device,
                offset,
                size,
                object,
                dirty: false,
                links: Vec::new(),
            },
        );
        Ok(Some(id))
    }

    /// `free(region)`: unlink it from its siblings and return its space to the heap.
    /// Freeing a live object's primary is refused: make another region primary first (or
    /// destroy the object), so no object ever loses its data.
    pub fn free(&mut self, id: RegionId) -> Result<()> {
        let owner = self.region(id)?.object;
        if self.objects.get(&owner).is_some_and(|o| o.primary == id) {
            crate::bail!(
                "region {id} is the primary of object {owner}; set another primary first or \
                 free the object"
            );
        }
        let r = self.regions.remove(&id).ok_or_else(|| {
            Error::InvalidArgument(format!("no region with id {id} (double free?)"))
        })?;
        for l in &r.links {
            if let Some(other) = self.regions.get_mut(l) {
                other.links.retain(|x| *x != id);
            }
        }
        if self.walking != Some(r.device) {
            self.heaps[r.device]
                .free(r.offset)
                .expect("region recorded in its heap");
        }
        Ok(())
    }

    /// `link!(a, b)`: record `a` and `b` as copies of the same object.
    pub fn link(&mut self, a: RegionId, b: RegionId) -> Result<()> {
        let (oa, ob) = (self.region(a)?.object, self.region(b)?.object);
        if oa != ob || a == b {
            crate::bail!("cannot link regions {a} (object {oa}) and {b} (object {ob})");
        }
        if !self.region(a)?.links.contains(&b) {
            self.region_mut(a)?.links.push(b);
            self.region_mut(b)?.links.push(a);
        }
        Ok(())
    }

    /// `unlink!(a, b)`.
    pub fn unlink(&mut self, a: RegionId, b: RegionId) -> Result<()> {
        self.region_mut(a)?.links.retain(|x| *x != b);
        self.region_mut(b)?.links.retain(|x| *x != a);
        Ok(())
    }

    /// `getlinked(region, device)`.
    pub fn getlinked(&self, id: RegionId, device: usize) -> Result<Option<RegionId>> {
        let r = self.region(id)?;
        Ok(r.links
            .iter()
            .copied()
            .find(|l| self.regions.get(l).is_some_and(|x| x.device == device)))
    }

    /// `copyto!(dst, src)`: copy the object's bytes between two of its regions.
    pub fn copy(&self, dst: RegionId, src: RegionId) -> Result<()> {
        let (d, s) = (self.region(dst)?, self.region(src)?);
        if self.object(d.object)?.primary == dst {
            // Guards read and write the primary in place: a copy into it would tear.
            self.ensure_unpinned(d.object, "copying into its primary region")?;
        }
        let len = self.object(s.object)?.len;
        self.copy.copy(
            &self.devices[s.device],
            s.offset,
            &self.devices[d.device],
            d.offset,
            len,
        )
    }

    /// Zero a region of an object (its length), counting the bytes written; a region on a
    /// device that is not byte-addressable is left as it is and `false` returned. The write
    /// is not throttled: it is for fast memory, where staging puts a chunk to overwrite.
    pub fn zero(&self, id: RegionId) -> Result<bool> {
        let r = self.region(id)?;
        let len = self.object(r.object)?.len;
        if self.object(r.object)?.primary == id {
            self.ensure_unpinned(r.object, "zeroing its primary region")?;
        }
        let dev = &self.devices[r.device];
        let Some(p) = dev.addr(r.offset) else {
            return Ok(false);
        };
        // SAFETY: the heap gave this region `len` bytes from `offset` on the device's map, no
        // other region overlaps them, and no guard is open on it (it is not a pinned
        // primary; a new region has no guard at all), so nothing else reads or writes them.
        unsafe { std::ptr::write_bytes(p, 0, len as usize) };
        dev.counters.wrote(len);
        Ok(true)
    }

    /// `in(region, device)`: the device index of a region.
    pub fn device_of(&self, id: RegionId) -> Result<usize> {
        Ok(self.region(id)?.device)
    }

    /// `markdirty!` / `markclean!`.
    pub fn set_dirty(&mut self, id: RegionId, dirty: bool) -> Result<()> {
        let r = self.region_mut(id)?;
        r.dirty = dirty;
        let owner = r.object;
        if dirty {
            if let Some(o) = self.objects.get_mut(&owner) {
                o.writes += 1;
            }
        }
        Ok(())
    }

    /// `parent(region)`.
    pub fn parent(&self, id: RegionId) -> Result<ObjectId> {
        Ok(self.region(id)?.object)
    }

    /// Address of a region on a byte-addressable device.
    pub fn address(&self, id: RegionId) -> Result<Option<*mut u8>> {
        let r = self.region(id)?;
        Ok(self.devices[r.device].addr(r.offset))
    }

    /// `evictfrom!(cb, device, region, size)`: starting at byte `start` of `device`, hand
    /// each occupied region to `cb` until `size` contiguous bytes are free; `cb` moves the
    /// region's data away and frees it with [`DataManager::free`] (or leaves it, e.g. when
    /// pinned). Returns the offset of the free span, `None` if everything in the way stayed.
    pub fn evict_from(
        &mut self,
        device: usize,
        start: u64,
        size: u64,
        cb: &mut dyn FnMut(&mut DataManager, RegionId) -> Result<()>,
    ) -> Result<Option<u64>> {
        if self.walking.is_some() {
            crate::bail!("evict_from is already walking a heap");
        }
        let align = self.devices[device].alignment();
        let mut heap = std::mem::replace(&mut self.heaps[device], Heap::new(align, align));
        self.walking = Some(device);
        let out = heap.evict_from(start, size, |_, region| {
            cb(self, region)?;
            Ok(if self.regions.contains_key(&region) {
                Disposition::Kept
            } else {
                Disposition::Evicted
            })
        });
        self.walking = None;
        self.heaps[device] = heap;
        out
    }

    /// Check the manager's invariants: heaps consistent; regions recorded exactly once in
    /// their heaps without overlap; every object's regions exist and are linked
    /// symmetrically; a region on a faster device than the primary never exists
    /// (fast ⇒ primary); nothing leaks.
    pub fn check(&self) -> Result<(), String> {
        let mut owned = 0usize;
        for (d, h) in self.heaps.iter().enumerate() {
            h.check().map_err(|e| format!("heap of device {d}: {e}"))?;
            for (off, b) in h.iter() {
                let Some(rid) = b.owner else { continue };
                owned += 1;
                let r = self
                    .regions
                    .get(&rid)
                    .ok_or(format!("heap block {off} owned by unknown region {rid}"))?;
                if r.device != d || r.offset != off || r.size != b.size {
                    return Err(format!("region {rid} disagrees with its heap block"));
                }
            }
        }
        if owned != self.regions.len() {
            return Err(format!(
                "{} regions but {owned} heap blocks in use",
                self.regions.len()
            ));
        }
        let mut seen = 0usize;
        for o in self.objects.values() {
            let p = self
                .regions
                .get(&o.primary)
                .ok_or(format!("object {} lost its primary", o.id))?;
            seen += 1 + p.links.len();
            for l in &p.links {
                let r = self
                    .regions
                    .get(l)
                    .ok_or(format!("object {}: dangling link {l}", o.id))?;
                if r.object != o.id {
                    return Err(format!(
                        "region {l} linked to object {} but owned by {}",
                        o.id, r.object
                    ));
                }
                if !r.links.contains(&o.primary) {
                    return Err(format!("link {} -> {l} is not symmetric", o.primary));
                }
                if r.device < p.device {
                    return Err(format!(
                        "object {}: region on faster device {} is not primary",
                        o.id, r.device
                    ));
                }
            }
        }
        for r in self.regions.values() {
            if !self.objects.contains_key(&r.object) {
                return Err(format!(
                    "region {} belongs to freed object {}",
                    r.id, r.object
                ));
            }
        }
        if seen != self.regions.len() {
            return Err(format!(
                "{} regions, {seen} reachable from objects (leak)",
                self.regions.len()
            ));
        }
        Ok(())
    }
}
