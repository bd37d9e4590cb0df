//! The manager: devices, the data manager (mechanism) and a policy behind one lock, and the
//! guards through which data is reached.
//!
//! Thread model: every operation takes the manager lock for its whole duration, copies
//! included (as the thesis does), except the emulated time of `emulated` devices, which is
//! served after the lock is released; a guard holds no lock while it is open, only a pin
//! that keeps its object from being moved, evicted or freed.

mod data;
mod guard;
mod object;

use std::sync::Arc;

use parking_lot::{FairMutex, FairMutexGuard};

pub use data::DataManager;
pub use guard::{ReadGuard, WriteGuard};
pub use object::{Object, ObjectId, Region, RegionId};

use crate::copy::CopyEngine;
use crate::counters::Snapshot;
use crate::device::emulated::DeferScope;
use crate::device::Device;
use crate::policy::{Place, Policy};
use crate::{Error, Result};

struct Inner {
    data: DataManager,
    policy: Box<dyn Policy>,
}

/// A tiered memory manager.
pub struct Manager {
    inner: FairMutex<Inner>,
    devices: Vec<Arc<Device>>,
    policy_name: String,
}

/// Bytes in use on one device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Usage {
    /// Device name.
    pub device: String,
    /// Bytes in allocated regions now.
    pub used: u64,
    /// Highest `used` since creation or the last `reset_stats`.
    pub peak: u64,
    /// Heap capacity.
    pub capacity: u64,
}

/// Where an object lives now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// Device index of the primary region.
    pub device: usize,
    /// Device indices of the linked (sibling) regions.
    pub siblings: Vec<usize>,
    /// Whether the primary is modified with respect to its siblings.
    pub dirty: bool,
    /// Open guards.
    pub pins: u32,
}

impl Manager {
    /// A manager over `devices` (fastest first) driven by `policy`.
    pub fn new(devices: Vec<Device>, policy: Box<dyn Policy>) -> Result<Self> {
        Self::with_copy_engine(devices, policy, Arc::new(CopyEngine::default()))
    }

    /// As [`Manager::new`], with a configured copy engine.
    pub fn with_copy_engine(
        devices: Vec<Device>,
        policy: Box<dyn Policy>,
        copy: Arc<CopyEngine>,
    ) -> Result<Self> {
        let devices: Vec<Arc<Device>> = devices.into_iter().map(Arc::new).collect();
        let data = DataManager::new(devices.clone(), copy)?;
        let policy_name = policy.name();
        Ok(Manager {
            inner: FairMutex::new(Inner { data, policy }),
            devices,
            policy_name,
        })
    }

    /// The manager lock. Fair: a thread releasing it hands it to the longest waiter, so a
    /// thread looping over manager calls cannot starve one that opens and closes guards.
    /// (A panic inside a policy does not poison it; the data manager's operations leave it
    /// consistent at every step that can fail.)
    fn lock(&self) -> FairMutexGuard<'_, Inner> {
        self.inner.lock()
    }

    fn with<T>(&self, f: impl FnOnce(&mut DataManager, &mut dyn Policy) -> Result<T>) -> Result<T> {
        // Declared before the lock guard, so dropped after it: emulated delays are served
        // once the lock is free.
        let _defer = DeferScope::enter();
        let mut g = self.lock();
        let Inner { data, policy } = &mut *g;
        f(data, policy.as_mut())
    }

    /// The devices, fastest first.
    #[must_use]
    pub fn devices(&self) -> &[Arc<Device>] {
        &self.devices
    }

    /// Name of the policy.
    #[must_use]
    pub fn policy_name(&self) -> &str {
        &self.policy_name
    }

    /// Allocate an object of `bytes` bytes where `place` says.
    pub fn alloc(&self, bytes: u64, place: Place) -> Result<ObjectId> {
        if bytes == 0 {
            crate::bail!("cannot allocate an object of zero bytes");
        }
        self.with(|m, p| p.alloc(m, bytes, place))
    }

    /// `unsafe_free`: free now; nothing is written back.
    pub fn free(&self, id: ObjectId) -> Result<()> {
        self.with(|m, p| p.unsafe_free(m, id))
    }

    /// `prefetch!(object, force)`.
    pub fn prefetch(&self, id: ObjectId, force: bool) -> Result<()> {
        self.with(|m, p| {
            m.object(id)?;
            p.prefetch(m, id, force)
        })
    }

    /// `evict!(object)`.
    pub fn evict(&self, id: ObjectId) -> Result<()> {
        self.with(|m, p| {
            m.ensure_unpinned(id, "evict")?;
            p.evict(m, id)
        })
    }

    /// Write a dirty object to a slower sibling now, leaving it where it is (see
    /// [`crate::policy::writeback_object`]). Returns whether anything was copied.
    pub fn writeback(&self, id: ObjectId) -> Result<bool> {
        self.with(|m, p| p.writeback(m, id))
    }

    /// `softevict!(object)`.
    pub fn softevict(&self, id: ObjectId) -> Result<()> {
        self.with(|m, p| p.softevict(m, id))
    }

    /// `read_use(object)`.
    pub fn read_use(&self, id: ObjectId) -> Result<()> {
        self.with(|m, p| {
            m.object(id)?;
            p.read_use(m, id)
        })
    }

    /// `write_use(object)`: marks the primary dirty.
    pub fn write_use(&self, id: ObjectId) -> Result<()> {
        self.with(|m, p| {
            let r = m.primary(id)?;
            m.set_dirty(r, true)?;
            p.write_use(m, id)
        })
    }

    /// `in_fast(object)`: whether the primary is on device 0.
    pub fn in_fast(&self, id: ObjectId) -> Result<bool> {
        Ok(self.placement(id)?.device == 0)
    }

    /// Where an object lives.
    pub fn placement(&self, id: ObjectId) -> Result<Placement> {
        self.with(|m, _| {
            let o = m.object(id)?;
            let r = m.region(o.primary)?;
            let mut siblings: Vec<usize> = r
                .links
                .iter()
                .filter_map(|l| m.region(*l).ok().map(|x| x.device))
                .collect();
            siblings.sort_unstable();
            Ok(Placement {
                device: r.device,
                siblings,
                dirty: r.dirty,
                pins: o.pins,
            })
        })
    }

    /// Copy the bytes of object `src` into object `dst` (same length) with the copy engine,
    /// primary to primary; nothing moves. Used by benchmarks and calibration.
    pub fn copy_objects(&self, dst: ObjectId, src: ObjectId) -> Result<()> {
        self.with(|m, _| {
            let (ld, ls) = (m.object(dst)?.len, m.object(src)?.len);
            crate::ensure!(ld == ls, "objects differ in length: {ld} vs {ls} bytes");
            crate::ensure!(dst != src, "cannot copy object {src} onto itself");
            m.copy(m.primary(dst)?, m.primary(src)?)
        })
    }

    /// Run `f` with exclusive access to the data manager and the policy (for policies written
    /// outside the core, reports and tests).
    pub fn with_data<T>(
        &self,
        f: impl FnOnce(&mut DataManager, &mut dyn Policy) -> Result<T>,
    ) -> Result<T> {
        self.with(f)
    }

    /// Open a guard: let the policy place the object, require a byte-addressable primary,
    /// pin it. Returns the address and length. Pair with [`Manager::close`]. Prefer
    /// [`Manager::read`] / [`Manager::write`], which pair them for you.
    pub fn open(&self, id: ObjectId, write: bool) -> Result<(*mut u8, usize)> {
        self.with(|m, p| {
            let (pins, writer) = {
                let o = m.object(id)?;
                (o.pins, o.writer)
            };
            if writer || (write && pins > 0) {
                // Fails with a clear error before the policy moves anything.
                m.pin(id, write)?;
            }
            if pins == 0 {
                p.before_access(m, id, write)?;
            }
            let r = m.primary(id)?;
            let Some(addr) = m.address(r)? else {
                return Err(Error::Guard(format!(
                    "object {id} is on '{}', which is not byte-addressable, and policy '{}' did \
                     not bring it to memory",
                    m.devices()[m.device_of(r)?].name,
                    p.name()
                )));
            };
            m.pin(id, write)?;
            let len = usize::try_from(m.object(id)?.len).expect("object length fits memory");
            Ok((addr, len))
        })
    }

    /// Close a guard opened with [`Manager::open`]: unpin, record the use (a write marks the
    /// primary dirty) and let the policy react.
    pub fn close(&self, id: ObjectId, write: bool) -> Result<()> {
        self.with(|m, p| {
            m.unpin(id)?;
            if write {
                let r = m.primary(id)?;
                m.set_dirty(r, true)?;
                p.write_use(m, id)?;
            } else {
                p.read_use(m, id)?;
            }
            if m.object(id)?.pins == 0 {
                p.after_access(m, id, write)?;
            }
            Ok(())
        })
    }

    /// Charge the bytes a kernel outside tiermem read from and wrote to objects, each
    /// `(object, bytes read, bytes written)`, to the devices their primaries are on now
    /// (call it while they are pinned): the bytes are counted and, on an emulated device,
    /// the time the device would have taken beyond the DRAM the kernel ran on is waited out
    /// ([`Device::charge_kernel`], after the manager's lock is released). `threads` is the
    /// number of threads that wrote. A policy that models the memory system itself
    /// ([`Policy::charges_operands`]) is left to do its own charging.
    pub fn charge(&self, operands: &[(ObjectId, u64, u64)], threads: usize) -> Result<()> {
        let mut per_device = vec![(0u64, 0u64); self.devices.len()];
        let charges = self.with(|m, p| {
            for &(id, read, written) in operands {
                let d = m.device_of(m.primary(id)?)?;
                per_device[d].0 += read;
                per_device[d].1 += written;
            }
            Ok(p.charges_operands())
        })?;
        if charges {
            for (d, (read, written)) in self.devices.iter().zip(per_device) {
                if read > 0 || written > 0 {
                    d.charge_kernel((read, 0), (written, threads.max(1)));
                }
            }
        }
        Ok(())
    }

    /// A read guard: shared, immutable access while it lives.
    pub fn read(&self, id: ObjectId) -> Result<ReadGuard<'_>> {
        let (ptr, len) = self.open(id, false)?;
        Ok(ReadGuard::new(self, id, ptr, len))
    }

    /// A write guard: exclusive, mutable access while it lives.
    pub fn write(&self, id: ObjectId) -> Result<WriteGuard<'_>> {
        let (ptr, len) = self.open(id, true)?;
        Ok(WriteGuard::new(self, id, ptr, len))
    }

    /// Counters of every device.
    #[must_use]
    pub fn stats(&self) -> Snapshot {
        self.devices
            .iter()
            .map(|d| (d.name.clone(), d.counters.snapshot()))
            .collect()
    }

    /// Zero every counter and restart peak-use measurement.
    pub fn reset_stats(&self) {
        for d in &self.devices {
            d.counters.reset();
        }
        self.lock().data.reset_peaks();
    }

    /// Use of every device's heap.
    #[must_use]
    pub fn usage(&self) -> Vec<Usage> {
        let g = self.lock();
        self.devices
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let h = g.data.heap(i);
                Usage {
                    device: d.name.clone(),
                    used: h.used(),
                    peak: h.peak(),
                    capacity: h.capacity(),
                }
            })
            .collect()
    }

    /// Live object count.
    #[must_use]
    pub fn object_count(&self) -> usize {
        self.lock().data.object_ids().count()
    }

    /// Check every invariant of the data manager.
    pub fn check(&self) -> Result<(), String> {
        self.lock().data.check()
    }
}
