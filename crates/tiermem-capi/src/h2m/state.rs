//! The process's H2M state between `h2m_init` and `h2m_finalize`: a manager whose devices
//! stand for the NUMA nodes (`tiermem_core::traits::nodes`), allocation by traits over it,
//! and each allocation's address.
//!
//! Pointers stay valid across migration: the devices are memory files mapped shared
//! (`Device::open_shared`), and the address handed out is a second map of the object's
//! pages. When a migration moves the object (whole, keeping no copy:
//! `Traited::relocating`), the address is mapped again (`MAP_FIXED`) onto the pages of its
//! new place. The bytes never pass through the address during a move; it only points
//! elsewhere afterwards.
//!
//! Lock order: the state lock is taken before any manager call and never while a manager
//! lock is held (`tiermem_core::lock_order`, rule 6).

use std::cell::Cell;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use tiermem_core::device::spaces::{map_spaces, read_env, SpaceMap};
use tiermem_core::manager::Manager;
use tiermem_core::mechanism::moves::relocate_object;
use tiermem_core::mechanism::ObjectId;
use tiermem_core::mechanism::Place;
use tiermem_core::sys::discover::configured_topology;
use tiermem_core::sys::mmap;
use tiermem_core::traits::nodes::node_devices;
use tiermem_core::traits::{DeviceSpaces, Partition, Strategy, Traited, Traits};
use tiermem_core::{device, policy, Error};

use super::log;
use super::parts::{layout, Piece};
use super::types::*;

type Pairs = Vec<(String, String)>;

/// What an H2M call can fail with beyond the core's errors: one type, mapped to codes once
/// ([`H2mError::code`]).
#[derive(Debug)]
pub(crate) enum H2mError {
    Core(Error),
    NotInitialized,
    AlreadyInitialized,
    Forked { parent: u32, me: u32 },
    NoSuchAllocation(usize),
}

impl From<Error> for H2mError {
    fn from(e: Error) -> Self {
        H2mError::Core(e)
    }
}

impl H2mError {
    pub(crate) fn code(&self) -> h2m_status_t {
        match self {
            H2mError::Core(e) => match e {
                Error::InvalidArgument(_)
                | Error::UnknownDevice(_)
                | Error::IndexOutOfRange { .. } => H2M_INVALID_ARGUMENT,
                Error::DeviceFull { .. } => H2M_OUT_OF_MEMORY,
                _ => H2M_FAILURE,
            },
            H2mError::NotInitialized => H2M_NOT_INITIALIZED,
            H2mError::AlreadyInitialized => H2M_ALREADY_INITIALIZED,
            H2mError::Forked { .. } => H2M_FORKED,
            H2mError::NoSuchAllocation(_) => H2M_NO_SUCH_ALLOCATION,
        }
    }

    pub(crate) fn message(&self) -> String {
        match self {
            H2mError::Core(e) => e.to_string(),
            H2mError::NotInitialized => {
                "h2m: not initialised (call h2m_init first; after h2m_finalize, again)".into()
            }
            H2mError::AlreadyInitialized => "h2m: h2m_init called again before h2m_finalize".into(),
            H2mError::Forked { parent, me } => format!(
                "h2m: this is process {me}, forked from process {parent} which called h2m_init; \
                 its allocations belong to the parent (call h2m_finalize and h2m_init in the child \
                 only after the parent's allocations are no longer used there)"
            ),
            H2mError::NoSuchAllocation(p) => format!(
                "h2m: pointer {p:#x} is not an allocation of this library (freed already, never \
                 allocated by h2m, or not its start)"
            ),
        }
    }
}

pub(crate) type Result<T> = std::result::Result<T, H2mError>;

/// One object of an allocation and the pieces of the allocation's range it backs.
struct Part {
    id: ObjectId,
    /// Device and offset of the object now (what its pieces map).
    at: (usize, u64),
    pieces: Vec<Piece>,
}

struct Alloc {
    parts: Vec<Part>,
    size: usize,
    len: usize,
    pairs: Pairs,
    partition: Partition,
}

struct Pending {
    out: usize,
    size: usize,
    pairs: Pairs,
}

pub(crate) struct H2m {
    manager: Arc<Manager>,
    traited: Traited,
    names: Vec<String>,
    nodes: Vec<u32>,
    map: SpaceMap,
    views: BTreeMap<u32, DeviceSpaces>,
    allocs: BTreeMap<usize, Alloc>,
    pending: Vec<Pending>,
    strategy: Strategy,
    pid: u32,
}

static STATE: Mutex<Option<H2m>> = Mutex::new(None);

thread_local! {
    /// The node this thread allocates near (`tm_h2m_set_node`), instead of the one it runs on.
    static NODE: Cell<Option<u32>> = const { Cell::new(None) };
}

fn lock() -> MutexGuard<'static, Option<H2m>> {
    // A panic under the lock is caught at the boundary; the state is still whole (every
    // change below is made after the fallible calls), so a poisoned lock is taken as is.
    STATE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Run `f` on the initialised state of this process.
pub(crate) fn with<T>(f: impl FnOnce(&mut H2m) -> Result<T>) -> Result<T> {
    let mut g = lock();
    let s = g.as_mut().ok_or(H2mError::NotInitialized)?;
    let me = tiermem_core::process::pid();
    if s.pid != me {
        return Err(H2mError::Forked { parent: s.pid, me });
    }
    f(s)
}

pub(crate) fn init() -> Result<()> {
    let mut g = lock();
    if let Some(s) = g.as_ref() {
        if s.pid == tiermem_core::process::pid() {
            return Err(H2mError::AlreadyInitialized);
        }
        // A forked child's copy of its parent's state: forgotten (the parent owns the maps).
        std::mem::forget(g.take());
    }
    let (topo, own) = configured_topology();
    let map = map_spaces(&topo, &read_env, &BTreeMap::new())?;
    let available = tiermem_core::sys::cgroup::available_memory().0;
    let nd = node_devices(&topo, &map, &read_env, own, available)?;
    let names: Vec<String> = nd
        .nodes
        .iter()
        .zip(&nd.specs)
        .map(|(n, (spec, _))| format!("node {n} ({spec})"))
        .collect();
    let mut devices = device::open_all_shared(&nd.specs)?;
    for (d, name) in devices.iter_mut().zip(&names) {
        // Each device is named for its node: two nodes of a fixture may both be `dram`.
        d.name.clone_from(name);
    }
    let manager = Arc::new(Manager::new(devices, policy::builtin("first_touch")?)?);
    let spaces = DeviceSpaces::of_nodes(names.clone(), &nd.nodes, &map, None);
    let traited = Traited::with_spaces(manager.clone(), spaces).relocating();
    if log::enabled() {
        log::mapping(&topo, &map, &nd.notes);
    }
    *g = Some(H2m {
        manager,
        traited,
        names,
        nodes: nd.nodes,
        map,
        views: BTreeMap::new(),
        allocs: BTreeMap::new(),
        pending: Vec::new(),
        strategy: Strategy::Fifo,
        pid: tiermem_core::process::pid(),
    });
    Ok(())
}

pub(crate) fn finalize() -> Result<()> {
    let mut g = lock();
    let s = g.as_mut().ok_or(H2mError::NotInitialized)?;
    let me = tiermem_core::process::pid();
    if s.pid != me {
        return Err(H2mError::Forked { parent: s.pid, me });
    }
    for (addr, a) in std::mem::take(&mut s.allocs) {
        // SAFETY: `addr` is a map this library made for `a.len` bytes; after finalize the
        // program's pointers are dangling by contract.
        unsafe { mmap::unmap_pages(addr as *mut u8, a.len) };
    }
    *g = None;
    Ok(())
}

/// The node the calling thread runs on (or the one it set).
fn calling_node() -> Option<u32> {
    if let Some(n) = NODE.with(Cell::get) {
        return Some(n);
    }
    tiermem_core::sys::numa::current_node()
}

pub(crate) fn set_node(node: i32) {
    NODE.with(|c| c.set(u32::try_from(node).ok()));
}

/// A whole allocation's declaration as the traits registry keeps it: the range this layer
/// locks for `pinned` is its own business (the registry's objects share device pages).
fn registered((bytes, t): &(u64, Traits)) -> (u64, Traits) {
    let mut t = t.clone();
    t.pinned = false;
    (*bytes, t)
}

/// The devices a partitioned allocation spreads over: its space's, or (when its required
/// spaces share none and the fallback allows) every candidate.
fn spread_over(spaces: &DeviceSpaces, t: &Traits) -> Result<Vec<usize>> {
    let devs = spaces.space_devices(t);
    Ok(if devs.is_empty() {
        spaces.candidates(t)?
    } else {
        devs
    })
}

/// Lock an allocation's range in memory (the `pinned` trait).
fn lock_range(base: usize, len: usize) -> Result<()> {
    // SAFETY: the range this library reserved and mapped for the allocation.
    unsafe { mmap::lock_pages(base as *mut u8, len) }.map_err(|e| {
        H2mError::Core(Error::InvalidArgument(format!(
            "h2m: cannot lock {len} bytes in memory for the pinned trait ({e}; see ulimit -l)"
        )))
    })
}

fn page_round(bytes: u64) -> usize {
    let page = tiermem_core::sys::page_size() as u64;
    bytes.next_multiple_of(page) as usize
}

impl H2m {
    fn view(&mut self) -> &DeviceSpaces {
        let node = calling_node().filter(|n| self.map.views.iter().any(|v| v.node == *n));
        let key = node.unwrap_or(u32::MAX);
        let (names, nodes, map) = (&self.names, &self.nodes, &self.map);
        self.views
            .entry(key)
            .or_insert_with(|| DeviceSpaces::of_nodes(names.clone(), nodes, map, node))
    }

    fn where_now(&self, id: ObjectId) -> Result<(usize, u64)> {
        Ok(self.manager.with_data(|m, _| {
            let r = m.region(m.primary(id)?)?;
            Ok((r.device, r.offset))
        })?)
    }

    /// Map each piece of `part` into the range at `base` (replacing what is there).
    fn map_part(&self, part: &Part, base: usize) -> Result<()> {
        let dev = &self.manager.devices()[part.at.0];
        for p in &part.pieces {
            let (fd, off) = dev
                .alias_source(part.at.1 + p.part_off as u64)
                .ok_or_else(|| {
                    Error::InvalidArgument(format!(
                        "device {} cannot map its pages twice",
                        dev.name
                    ))
                })?;
            // SAFETY: pages of a memory file the device keeps open, over a span of the range
            // this library reserved for this allocation, replaced whole.
            unsafe { mmap::map_pages((base + p.range_off) as *mut u8, fd, p.len, off) }
                .map_err(|e| Error::io(&dev.name, &dev.name, "map an allocation's pages", e))?;
        }
        Ok(())
    }

    fn has_room(&self, d: usize, bytes: u64) -> Result<bool> {
        Ok(self.manager.with_data(|m, _| {
            let h = m.heap(d);
            Ok(h.round(bytes).is_some_and(|b| h.largest_free() >= b))
        })?)
    }

    /// The objects of a partitioned allocation: one per part, each on the part's node of
    /// the space if it has room, else (fallback `next_best`) the next candidate with room.
    fn make_parts(&self, len: usize, t: &Traits, spaces: &DeviceSpaces) -> Result<Vec<Part>> {
        let devs = spread_over(spaces, t)?;
        let cands = spaces.candidates(t)?;
        let page = tiermem_core::sys::page_size();
        let mut made: Vec<Part> = Vec::new();
        for (p, (bytes, pieces)) in layout(t.partition, len, devs.len(), page)
            .into_iter()
            .enumerate()
        {
            let mut order = vec![devs[p % devs.len()]];
            if t.fallback == tiermem_core::traits::Fallback::NextBest {
                order.extend(cands.iter().copied());
            }
            match self.part_on(&order, bytes as u64) {
                Ok(Some((id, at))) => made.push(Part { id, at, pieces }),
                outcome => {
                    for part in made {
                        let _ = self.manager.free(part.id);
                    }
                    outcome?;
                    return Err(Error::InvalidArgument(format!(
                        "h2m: no node of the allocation's space has room for a {bytes}-byte part ({:?} partition)",
                        t.partition
                    ))
                    .into());
                }
            }
        }
        Ok(made)
    }

    /// An object of `bytes` on the first device of `order` with room, and where it is.
    fn part_on(&self, order: &[usize], bytes: u64) -> Result<Option<(ObjectId, (usize, u64))>> {
        for &d in order {
            if self.has_room(d, bytes)? {
                let id = self.manager.alloc(bytes, Place::Device(d))?;
                return match self.where_now(id) {
                    Ok(at) => Ok(Some((id, at))),
                    Err(e) => {
                        let _ = self.manager.free(id);
                        Err(e)
                    }
                };
            }
        }
        Ok(None)
    }

    /// Allocate `decls` near the calling thread; their addresses. Whole ones claim memory in
    /// `strategy`'s order, partitioned ones after them, as declared.
    fn place(&mut self, decls: Vec<(usize, Pairs)>, strategy: Strategy) -> Result<Vec<usize>> {
        let mut typed = Vec::with_capacity(decls.len());
        for (size, pairs) in &decls {
            typed.push((*size as u64, Traits::from_pairs(pairs)?));
        }
        let spaces = self.view().clone();
        let whole: Vec<usize> = (0..decls.len())
            .filter(|&i| typed[i].1.partition == Partition::Nearest)
            .collect();
        let wanted: Vec<(u64, Traits)> = whole.iter().map(|&i| registered(&typed[i])).collect();
        let committed = self.traited.commit_in(&wanted, strategy, &spaces)?;
        let mut parts: Vec<Option<Vec<Part>>> = (0..decls.len()).map(|_| None).collect();
        let mut fail = None;
        for (&i, (id, _)) in whole.iter().zip(&committed) {
            match self.where_now(*id) {
                Ok(at) => {
                    let len = page_round(decls[i].0 as u64);
                    let pieces = vec![Piece {
                        range_off: 0,
                        part_off: 0,
                        len,
                    }];
                    parts[i] = Some(vec![Part {
                        id: *id,
                        at,
                        pieces,
                    }]);
                }
                Err(e) => fail = fail.or(Some(e)),
            }
        }
        for i in 0..decls.len() {
            if fail.is_none() && parts[i].is_none() {
                match self.make_parts(page_round(decls[i].0 as u64), &typed[i].1, &spaces) {
                    Ok(p) => parts[i] = Some(p),
                    Err(e) => fail = Some(e),
                }
            }
        }
        let mut out = Vec::with_capacity(decls.len());
        for (i, (size, pairs)) in decls.into_iter().enumerate() {
            let len = page_round(size as u64);
            let ps = parts[i].take();
            let mapped = match (&fail, &ps) {
                (None, Some(ps)) => mmap::reserve_pages(len)
                    .map_err(|e| {
                        Error::io("h2m", "address space", "reserve an allocation's range", e).into()
                    })
                    .and_then(|base| {
                        let base = base.as_ptr() as usize;
                        let locked = |()| {
                            if typed[i].1.pinned {
                                lock_range(base, len)
                            } else {
                                Ok(())
                            }
                        };
                        match ps
                            .iter()
                            .try_for_each(|p| self.map_part(p, base))
                            .and_then(locked)
                        {
                            Ok(()) => Ok(base),
                            Err(e) => {
                                // SAFETY: the range reserved just above, used by no one.
                                unsafe { mmap::unmap_pages(base as *mut u8, len) };
                                Err(e)
                            }
                        }
                    }),
                _ => Err(H2mError::NotInitialized),
            };
            match mapped {
                Ok(addr) => {
                    let ps = ps.expect("mapped above");
                    log::say(&format!(
                        "allocated {size} bytes at {addr:#x} on {} ({})",
                        ps.iter()
                            .map(|p| self.names[p.at.0].as_str())
                            .collect::<Vec<_>>()
                            .join(" + "),
                        pairs
                            .iter()
                            .map(|(k, v)| format!("{k}={v}"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ));
                    let partition = typed[i].1.partition;
                    self.allocs.insert(
                        addr,
                        Alloc {
                            parts: ps,
                            size,
                            len,
                            pairs,
                            partition,
                        },
                    );
                    out.push(addr);
                }
                Err(e) => {
                    if !matches!(e, H2mError::NotInitialized) {
                        fail = Some(e);
                    }
                    for p in ps.into_iter().flatten() {
                        let _ = self.manager.free(p.id);
                    }
                }
            }
        }
        if let Some(e) = fail {
            for a in out {
                let _ = self.free(a);
            }
            for p in parts.into_iter().flatten().flatten() {
                let _ = self.manager.free(p.id);
            }
            return Err(e);
        }
        Ok(out)
    }

    pub(crate) fn alloc(&mut self, size: usize, pairs: Pairs) -> Result<usize> {
        let strategy = self.strategy;
        Ok(self.place(vec![(size, pairs)], strategy)?[0])
    }

    pub(crate) fn declare(&mut self, out: usize, size: usize, pairs: Pairs) -> Result<()> {
        Traits::from_pairs(&pairs)?;
        if size == 0 {
            return Err(Error::InvalidArgument(
                "h2m: cannot declare an allocation of zero bytes".into(),
            )
            .into());
        }
        self.pending.push(Pending { out, size, pairs });
        Ok(())
    }

    /// Allocate every declaration in `strategy`'s order; `(where to write, address)` each.
    pub(crate) fn commit(&mut self, strategy: Strategy) -> Result<Vec<(usize, usize)>> {
        let pending = std::mem::take(&mut self.pending);
        let decls = pending.iter().map(|p| (p.size, p.pairs.clone())).collect();
        let addrs = self.place(decls, strategy)?;
        self.strategy = strategy;
        Ok(pending.iter().map(|p| p.out).zip(addrs).collect())
    }

    fn get(&self, addr: usize) -> Result<&Alloc> {
        self.allocs
            .get(&addr)
            .ok_or(H2mError::NoSuchAllocation(addr))
    }

    pub(crate) fn free(&mut self, addr: usize) -> Result<()> {
        let ids: Vec<ObjectId> = self.get(addr)?.parts.iter().map(|p| p.id).collect();
        for id in ids {
            self.manager.free(id)?;
        }
        let a = self.allocs.remove(&addr).expect("looked up above");
        // SAFETY: the range this library reserved for this allocation, of `a.len` bytes.
        unsafe { mmap::unmap_pages(addr as *mut u8, a.len) };
        Ok(())
    }

    pub(crate) fn update(
        &mut self,
        addr: usize,
        size: usize,
        pairs: Pairs,
        replace: bool,
    ) -> Result<()> {
        let a = self.get(addr)?;
        if size > a.size {
            return Err(Error::InvalidArgument(format!(
                "h2m_update_traits: size {size} is larger than the allocation at {addr:#x} ({} bytes)",
                a.size
            ))
            .into());
        }
        let new = if replace {
            pairs
        } else {
            super::traits::merged(&a.pairs, pairs)
        };
        let t = Traits::from_pairs(&new)?;
        if t.partition != a.partition {
            return Err(Error::InvalidArgument(format!(
                "h2m_update_traits: the partition is fixed at allocation ({:?}, asked {:?})",
                a.partition, t.partition
            ))
            .into());
        }
        if a.partition == Partition::Nearest {
            self.traited
                .update_traits(a.parts[0].id, registered(&(0, t)).1)?;
        } else {
            self.traited.spaces().candidates(&t)?;
        }
        self.allocs.get_mut(&addr).expect("looked up above").pairs = new;
        Ok(())
    }

    /// Place again (`only`: these addresses; None: all) and map moved allocations again.
    pub(crate) fn migrate(&mut self, only: Option<Vec<usize>>) -> Result<()> {
        let chosen: Vec<usize> = match &only {
            Some(addrs) => {
                for a in addrs {
                    self.get(*a)?;
                }
                addrs.clone()
            }
            None => self.allocs.keys().copied().collect(),
        };
        let whole: Vec<ObjectId> = chosen
            .iter()
            .filter(|a| self.allocs[a].partition == Partition::Nearest)
            .map(|a| self.allocs[a].parts[0].id)
            .collect();
        let ids = only.as_ref().map(|_| whole.as_slice());
        let moved = self.traited.apply_migration(ids, self.strategy)?;
        for m in &moved {
            if let Some(n) = &m.note {
                log::say(&format!(
                    "object {} stays on {}: {n}",
                    m.object, self.names[m.now]
                ));
            }
        }
        // Partitioned allocations: part p to the p-th node of the space their traits name now.
        for addr in &chosen {
            let a = &self.allocs[addr];
            if a.partition == Partition::Nearest {
                continue;
            }
            let devs = spread_over(self.traited.spaces(), &Traits::from_pairs(&a.pairs)?)?;
            for (p, part) in a.parts.iter().enumerate() {
                let target = devs[p % devs.len()];
                let id = part.id;
                let done = self
                    .manager
                    .with_data(|m, _| relocate_object(m, id, target))?;
                if done == tiermem_core::mechanism::moves::Prefetched::Skipped {
                    log::say(&format!(
                        "part {p} of {addr:#x} stays: {} has no room",
                        self.names[target]
                    ));
                }
            }
        }
        let addrs: Vec<usize> = self.allocs.keys().copied().collect();
        for addr in addrs {
            for p in 0..self.allocs[&addr].parts.len() {
                let (id, at) = {
                    let part = &self.allocs[&addr].parts[p];
                    (part.id, part.at)
                };
                let now = self.where_now(id)?;
                if now != at {
                    // Mapped first, recorded after: a failed map leaves the record true.
                    let pieces = self.allocs[&addr].parts[p].pieces.clone();
                    self.map_part(
                        &Part {
                            id,
                            at: now,
                            pieces,
                        },
                        addr,
                    )?;
                    self.allocs.get_mut(&addr).expect("listed above").parts[p].at = now;
                    let a = &self.allocs[&addr];
                    if Traits::from_pairs(&a.pairs)?.pinned {
                        lock_range(addr, a.len)?;
                    }
                    log::say(&format!(
                        "moved {addr:#x} from {} to {}",
                        self.names[at.0], self.names[now.0]
                    ));
                }
            }
        }
        Ok(())
    }

    /// The NUMA node of each part of an allocation now (one for a whole allocation).
    pub(crate) fn nodes_of(&self, addr: usize) -> Result<Vec<u32>> {
        Ok(self
            .get(addr)?
            .parts
            .iter()
            .map(|p| self.nodes[p.at.0])
            .collect())
    }

    /// The NUMA node an allocation (its first part) is on now.
    pub(crate) fn node_of(&self, addr: usize) -> Result<u32> {
        Ok(self.nodes_of(addr)?[0])
    }
}
