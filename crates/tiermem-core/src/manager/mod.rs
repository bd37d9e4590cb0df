//! The manager: devices, the data manager (mechanism) and a policy behind one lock, and the
//! guards through which data is reached.
//!
//! Thread model: every operation takes the manager lock for its whole duration, copies
//! included (as the thesis does), except the emulated time of `emulated` devices, which is
//! served after the lock is released, and the copy of a write-back ([`Manager::writeback`]:
//! the object is *moving*, held for the copy, see `moving.rs`); a guard holds no lock while
//! it is open, only a pin that keeps its object from being moved, evicted or freed.

mod guard;
mod mover;
mod moving;
mod ops;
mod reservation;
mod trace;

use std::sync::Arc;

use parking_lot::{FairMutex, FairMutexGuard};

pub use guard::{ReadGuard, WriteGuard};
pub use mover::MoveSender;
pub use mover::{Move, Mover, MoverCounts};
pub use ops::{Moves, MovesDone, OpRequest, OpenOp};
pub use reservation::{reserve_model, Reservation};
pub use trace::{Key, TraceCounts, TraceFollower, TraceOp, WINDOW};

use crate::copy::CopyEngine;
use crate::counters::Snapshot;
use crate::device::emulated::{DeferScope, UnderManagerLock};
use crate::device::Device;
use crate::mechanism::{DataManager, GuardUse, ObjectId, Place};
use crate::policy::Policy;
use crate::{Error, Result};

struct Inner {
    data: DataManager,
    policy: Box<dyn Policy>,
    /// Open guards by ticket: (object, write). A ticket closes once, so closing a guard
    /// twice cannot unpin another guard of the same object.
    guards: std::collections::HashMap<GuardTicket, (ObjectId, Use, usize)>,
    next_ticket: GuardTicket,
    /// Objects whose write-back copies outside the lock, and whether they were freed
    /// meanwhile (the free is done when the copy ends).
    moving: std::collections::HashMap<ObjectId, bool>,
    /// The trace follower that ops told of their place in the iteration drive, if any.
    follower: Option<trace::TraceFollower>,
}

impl Inner {
    /// A new ticket for a guard or hold on `id` whose view is at `addr`.
    fn issue(&mut self, id: ObjectId, use_: Use, addr: usize) -> GuardTicket {
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        self.guards.insert(ticket, (id, use_, addr));
        ticket
    }
}

/// Names one open guard (returned by [`Manager::open`], consumed by [`Manager::close`]).
pub type GuardTicket = u64;

/// What a ticket stands for: an open guard, or a hold ([`Manager::hold`]).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Use {
    Guard(GuardUse),
    Hold,
}

/// A tiered memory manager.
pub struct Manager {
    inner: FairMutex<Inner>,
    /// Set when an operation panicked midway under the lock: what it was doing.
    poisoned: parking_lot::Mutex<Option<String>>,
    devices: Vec<Arc<Device>>,
    policy_name: String,
    /// The process it was made in (a forked child refuses it).
    born: crate::process::Born,
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
            inner: FairMutex::new(Inner {
                data,
                policy,
                guards: std::collections::HashMap::new(),
                next_ticket: 1,
                moving: std::collections::HashMap::new(),
                follower: None,
            }),
            poisoned: parking_lot::Mutex::new(None),
            devices,
            policy_name,
            born: crate::process::Born::now(),
        })
    }

    /// The manager lock. Fair: a thread releasing it hands it to the longest waiter, so a
    /// thread looping over manager calls cannot starve one that opens and closes guards.
    /// Taken only here, after [`crate::lock_order::may_block_in`] and the poison check.
    fn lock(&self) -> Result<FairMutexGuard<'_, Inner>> {
        crate::lock_order::may_block_in("the manager lock", self.born)?;
        let g = self.inner.lock();
        // After acquiring: a thread that waited while another poisoned the manager under
        // this lock sees it here.
        self.check_poison()?;
        Ok(g)
    }

    fn check_poison(&self) -> Result<()> {
        match &*self.poisoned.lock() {
            None => Ok(()),
            Some(what) => Err(Error::Poisoned(format!(
                "this manager is unusable: an earlier operation panicked midway ({what}); \
                 its objects' state cannot be vouched for, so every call is refused. Create a \
                 new manager"
            ))),
        }
    }

    /// Run `f` under the manager lock. The data manager's operations leave it consistent at
    /// every step that can fail; a panic (a bug, or a broken invariant) midway cannot be
    /// vouched for, so it poisons the manager: the panic becomes an error here and every
    /// later call is refused with [`Error::Poisoned`].
    fn with<T>(&self, f: impl FnOnce(&mut DataManager, &mut dyn Policy) -> Result<T>) -> Result<T> {
        self.with_inner(|i| f(&mut i.data, i.policy.as_mut()))
    }

    fn with_inner<T>(&self, f: impl FnOnce(&mut Inner) -> Result<T>) -> Result<T> {
        // Declared before the lock guard, so dropped after it: emulated delays are served
        // once the lock is free.
        let _defer = DeferScope::enter();
        let mut g = self.lock()?;
        let _held = UnderManagerLock::enter();
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&mut g))) {
            Ok(r) => r,
            Err(p) => {
                let what = panic_message(&*p);
                *self.poisoned.lock() = Some(what.clone());
                Err(Error::Poisoned(format!(
                    "a manager operation panicked midway: {what}; the manager refuses every \
                     later call"
                )))
            }
        }
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
        self.alloc_at(bytes, place, None)
    }

    /// [`Manager::alloc`] at heap offset `at` when given, for a policy that follows a plan's
    /// offsets (the others ignore it).
    pub fn alloc_at(&self, bytes: u64, place: Place, at: Option<u64>) -> Result<ObjectId> {
        if bytes == 0 {
            crate::bail!("cannot allocate an object of zero bytes");
        }
        self.with(|m, p| p.alloc_at(m, bytes, place, at))
    }

    /// `unsafe_free`: free now; nothing is written back.
    pub fn free(&self, id: ObjectId) -> Result<()> {
        self.with_inner(|i| {
            if let Some(freed) = i.moving.get_mut(&id) {
                *freed = true; // freed when its write-back's copy ends
                return Ok(());
            }
            i.policy.unsafe_free(&mut i.data, id)
        })
    }

    /// `prefetch!(object, force)`.
    pub fn prefetch(&self, id: ObjectId, force: bool) -> Result<()> {
        self.with(|m, p| {
            m.object(id)?;
            p.prefetch(m, id, force)
        })
    }

    /// A forced prefetch into fast memory for an object the caller will overwrite whole
    /// ([`Policy::prefetch_for_overwrite`]): under a policy that skips the copy, nothing is
    /// read from the slow copy, the object reads as zeros until written, and it is dirty (an
    /// eviction writes it back).
    pub fn prefetch_for_overwrite(&self, id: ObjectId) -> Result<()> {
        self.with(|m, p| {
            m.object(id)?;
            p.prefetch_for_overwrite(m, id, true)?;
            let r = m.primary(id)?;
            m.set_dirty(r, true)?;
            p.write_use(m, id)
        })
    }

    /// `evict!(object)`.
    pub fn evict(&self, id: ObjectId) -> Result<()> {
        self.with(|m, p| {
            m.ensure_unpinned(id, "evict")?;
            p.evict(m, id)
        })
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
    /// pin it. Returns the guard's ticket, the address and the length. Pair with
    /// [`Manager::close`]. Prefer [`Manager::read`] / [`Manager::write`], which pair them for
    /// you.
    pub fn open(&self, id: ObjectId, write: bool) -> Result<(GuardTicket, *mut u8, usize)> {
        self.open_for(
            id,
            if write {
                GuardUse::Write
            } else {
                GuardUse::Read
            },
        )
    }

    /// [`Manager::open`] saying how the guard will use the bytes: an
    /// [`GuardUse::Overwrite`] guard is a write guard whose old contents are dead.
    pub fn open_for(&self, id: ObjectId, how: GuardUse) -> Result<(GuardTicket, *mut u8, usize)> {
        self.with_inner(|i| {
            let (ticket, addr) = Self::open_inner(i, id, how)?;
            let len = usize::try_from(i.data.object(id)?.len).expect("object length fits memory");
            Ok((ticket, addr, len))
        })
    }

    /// Close the guard `ticket` opened with [`Manager::open`]: unpin, record the use (a
    /// write marks the primary dirty) and let the policy react. A ticket closes once; an
    /// unknown or already closed one is a [`Error::Guard`] and changes nothing. Closing a
    /// hold ([`Manager::hold`]) releases it.
    pub fn close(&self, ticket: GuardTicket) -> Result<()> {
        self.with_inner(|i| Self::close_inner(i, ticket))
    }

    /// Close the guard `ticket` but keep its object pinned where it is until the ticket is
    /// closed again: for a view derived inside the guard that outlives it (its memory must
    /// not be handed to another object while the view can still write to it). The use is
    /// recorded now; the hold blocks moves, evictions and frees, not other guards.
    pub fn hold(&self, ticket: GuardTicket) -> Result<()> {
        self.with_inner(|i| {
            let (id, use_, addr) = Self::take_ticket(i, ticket)?;
            if use_ == Use::Hold {
                i.guards.insert(ticket, (id, use_, addr));
                return Err(Error::Guard(format!("ticket {ticket} is a hold already")));
            }
            let Use::Guard(how) = use_ else {
                unreachable!("holds were put back above")
            };
            let (m, p) = (&mut i.data, i.policy.as_mut());
            m.hold(id)?;
            i.guards.insert(ticket, (id, Use::Hold, addr));
            Self::record_use(m, p, id, how)
        })
    }

    /// Pin object `id` where it is now, as a hold, for as long as the caller keeps the
    /// ticket (structures that own manager memory for their lifetime, like embedding tables).
    /// Returns the ticket, the primary's device and its address (`None` if that device is not
    /// byte-addressable). Release with [`Manager::close`].
    pub fn hold_in_place(&self, id: ObjectId) -> Result<(GuardTicket, usize, Option<*mut u8>)> {
        self.with_inner(|i| {
            let m = &mut i.data;
            let r = m.primary(id)?;
            let (device, addr) = (m.device_of(r)?, m.address(r)?);
            m.pin(id, false)?;
            m.hold(id)?;
            let ticket = i.issue(id, Use::Hold, addr.map_or(0, |p| p as usize));
            Ok((ticket, device, addr))
        })
    }

    fn take_ticket(i: &mut Inner, ticket: GuardTicket) -> Result<(ObjectId, Use, usize)> {
        i.guards.remove(&ticket).ok_or_else(|| {
            Error::Guard(format!(
                "guard {ticket} is not open (closed already, or never opened): a guard closes \
                 once"
            ))
        })
    }

    fn record_use(
        m: &mut DataManager,
        p: &mut dyn Policy,
        id: ObjectId,
        how: GuardUse,
    ) -> Result<()> {
        let write = how != GuardUse::Read;
        p.guard_closed(m, id, how)?;
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
    }

    /// Charge the bytes a kernel outside tiermem read from and wrote to objects, each
    /// `(object, bytes read, bytes written)`, to the devices their primaries are on now
    /// (call it while they are pinned): the bytes are counted and, on an emulated device,
    /// the time the device would have taken beyond the DRAM the kernel ran on is waited out
    /// ([`Device::charge_kernel`], after the manager's lock is released). `threads` is the
    /// number of threads that wrote. A policy that models the memory system itself
    /// ([`Policy::charges_operands`]) is left to do its own charging.
    pub fn charge(&self, operands: &[(ObjectId, u64, u64)], threads: usize) -> Result<()> {
        let with_steps: Vec<_> = operands.iter().map(|&(id, r, w)| (id, r, 0, w)).collect();
        self.charge_steps(&with_steps, threads)
    }

    /// [`Manager::charge`] with the dependent-latency steps of each operand's reads:
    /// `(object, bytes read, steps, bytes written)`. A step is one miss latency the kernel
    /// could not overlap (see `tiermem_core::hpc::traffic` for how kernels count them).
    pub fn charge_steps(
        &self,
        operands: &[(ObjectId, u64, u64, u64)],
        threads: usize,
    ) -> Result<()> {
        let mut per_device = vec![(0u64, 0u64, 0u64); self.devices.len()];
        let charges = self.with(|m, p| {
            for &(id, read, steps, written) in operands {
                let d = m.device_of(m.primary(id)?)?;
                per_device[d].0 += read;
                per_device[d].1 += steps;
                per_device[d].2 += written;
            }
            Ok(p.charges_operands())
        })?;
        if charges {
            self.charge_devices(&per_device, threads);
        }
        Ok(())
    }

    /// Charge `(bytes read, dependent steps, bytes written)` per device (outside the
    /// manager lock).
    fn charge_devices(&self, per_device: &[(u64, u64, u64)], threads: usize) {
        for (d, &(read, steps, written)) in self.devices.iter().zip(per_device) {
            if read > 0 || steps > 0 || written > 0 {
                // Whole objects: one stream each way.
                d.charge_kernel((read, 1, steps), (written, 1, threads.max(1)));
            }
        }
    }

    /// A read guard: shared, immutable access while it lives.
    pub fn read(&self, id: ObjectId) -> Result<ReadGuard<'_>> {
        let (ticket, ptr, len) = self.open(id, false)?;
        Ok(ReadGuard::new(self, ticket, ptr, len))
    }

    /// A write guard: exclusive, mutable access while it lives.
    pub fn write(&self, id: ObjectId) -> Result<WriteGuard<'_>> {
        let (ticket, ptr, len) = self.open(id, true)?;
        Ok(WriteGuard::new(self, ticket, ptr, len))
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
    pub fn reset_stats(&self) -> Result<()> {
        for d in &self.devices {
            d.counters.reset();
        }
        self.with(|m, _| {
            m.reset_peaks();
            Ok(())
        })
    }

    /// Use of every device's heap.
    pub fn usage(&self) -> Result<Vec<Usage>> {
        self.with(|m, _| {
            Ok(self
                .devices
                .iter()
                .enumerate()
                .map(|(i, d)| {
                    let h = m.heap(i);
                    Usage {
                        device: d.name.clone(),
                        used: h.used(),
                        peak: h.peak(),
                        capacity: h.capacity(),
                    }
                })
                .collect())
        })
    }

    /// The policy's own counters as JSON ([`Policy::stats_json`]), if it keeps any.
    pub fn policy_stats_json(&self) -> Result<Option<String>> {
        self.with(|_, p| Ok(p.stats_json()))
    }

    /// Live object count.
    pub fn object_count(&self) -> Result<usize> {
        self.with(|m, _| Ok(m.object_ids().count()))
    }

    /// Check every invariant of the data manager, that every open guard and hold still
    /// points at its object's primary (nothing moved a pinned object) and, with the holds of
    /// write-backs copying outside the lock, agrees with the object's pin counts, and that
    /// no operation panicked.
    pub fn check(&self) -> Result<(), String> {
        self.with_inner(|i| Ok(Self::check_inner(i)))
            .map_err(|e| e.to_string())
            .and_then(|r| r)
    }

    fn check_inner(i: &Inner) -> Result<(), String> {
        i.data.check()?;
        let mut counts: std::collections::HashMap<ObjectId, (u32, u32)> = Default::default();
        for (t, &(id, use_, addr)) in &i.guards {
            let o = i
                .data
                .object(id)
                .map_err(|_| format!("guard {t} is open on object {id}, which was freed"))?;
            let now = i
                .data
                .address(o.primary)
                .map_err(|e| e.to_string())?
                .map_or(0, |p| p as usize);
            if now != addr {
                return Err(format!(
                    "object {id} moved while guard {t} pinned it (view at {addr:#x}, primary \
                     now at {now:#x})"
                ));
            }
            let c = counts.entry(id).or_default();
            c.0 += 1;
            c.1 += u32::from(use_ == Use::Hold);
        }
        // A write-back copying outside the lock holds its object (see `moving.rs`).
        for &id in i.moving.keys() {
            let c = counts.entry(id).or_default();
            c.0 += 1;
            c.1 += 1;
        }
        for id in i.data.object_ids() {
            let o = i.data.object(id).map_err(|e| e.to_string())?;
            let (pins, held) = counts.get(&id).copied().unwrap_or_default();
            if (o.pins, o.held) != (pins, held) {
                return Err(format!(
                    "object {id} counts {} pins ({} holds) but {pins} guards ({held} holds) \
                     are open on it",
                    o.pins, o.held
                ));
            }
        }
        Ok(())
    }
}

/// The text of a caught panic's payload.
pub(crate) fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic with a non-text payload".to_owned()
    }
}
