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
use tiermem_core::mechanism::ObjectId;
use tiermem_core::sys::discover::configured_topology;
use tiermem_core::sys::mmap;
use tiermem_core::traits::nodes::node_devices;
use tiermem_core::traits::{DeviceSpaces, Strategy, Traited, Traits};
use tiermem_core::{device, policy, Error};

use super::log;
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

struct Alloc {
    id: ObjectId,
    size: usize,
    len: usize,
    pairs: Pairs,
    /// Device and offset the address maps now.
    at: (usize, u64),
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

    /// Map `len` bytes of the object's pages at `fixed` (replacing what is there) or
    /// anywhere.
    fn map_at(&self, at: (usize, u64), len: usize, fixed: Option<usize>) -> Result<usize> {
        let dev = &self.manager.devices()[at.0];
        let (fd, off) = dev.alias_source(at.1).ok_or_else(|| {
            Error::InvalidArgument(format!("device {} cannot map its pages twice", dev.name))
        })?;
        let at = fixed.map_or(std::ptr::null_mut(), |a| a as *mut u8);
        // SAFETY: pages of a memory file the device keeps open, at a fresh address or over
        // the map this library made for this object (`fixed`), replaced whole.
        let p = unsafe { mmap::map_pages(at, fd, len, off) }
            .map_err(|e| Error::io(&dev.name, &dev.name, "map an allocation's pages", e))?;
        Ok(p.as_ptr() as usize)
    }

    /// Allocate `decls` in `strategy`'s order near the calling thread; their addresses.
    fn place(&mut self, decls: Vec<(usize, Pairs)>, strategy: Strategy) -> Result<Vec<usize>> {
        let mut typed = Vec::with_capacity(decls.len());
        for (size, pairs) in &decls {
            typed.push((*size as u64, Traits::from_pairs(pairs)?));
        }
        let spaces = self.view().clone();
        let made = self.traited.commit_in(&typed, strategy, &spaces)?;
        let mut out = Vec::with_capacity(made.len());
        for (i, ((id, _), (size, pairs))) in made.iter().zip(decls).enumerate() {
            let mapped = self
                .where_now(*id)
                .and_then(|at| Ok((at, self.map_at(at, page_round(size as u64), None)?)));
            let (at, addr) = match mapped {
                Ok(x) => x,
                Err(e) => {
                    for (later, _) in &made[i..] {
                        let _ = self.manager.free(*later);
                    }
                    for a in out.drain(..) {
                        let _ = self.free(a);
                    }
                    return Err(e);
                }
            };
            log::say(&format!(
                "allocated {size} bytes at {addr:#x} on {} ({})",
                self.names[at.0],
                pairs
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
            self.allocs.insert(
                addr,
                Alloc {
                    id: *id,
                    size,
                    len: page_round(size as u64),
                    pairs,
                    at,
                },
            );
            out.push(addr);
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
        let id = self.get(addr)?.id;
        self.manager.free(id)?;
        let a = self.allocs.remove(&addr).expect("looked up above");
        // SAFETY: the map this library made for this allocation, of `a.len` bytes.
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
        self.traited
            .update_traits(a.id, Traits::from_pairs(&new)?)?;
        self.allocs.get_mut(&addr).expect("looked up above").pairs = new;
        Ok(())
    }

    /// Place again (`only`: these addresses; None: all) and map moved allocations again.
    pub(crate) fn migrate(&mut self, only: Option<Vec<usize>>) -> Result<()> {
        let ids = match &only {
            Some(addrs) => Some(
                addrs
                    .iter()
                    .map(|a| Ok(self.get(*a)?.id))
                    .collect::<Result<Vec<_>>>()?,
            ),
            None => None,
        };
        let moved = self
            .traited
            .apply_migration(ids.as_deref(), self.strategy)?;
        for m in &moved {
            if let Some(n) = &m.note {
                log::say(&format!(
                    "object {} stays on {}: {n}",
                    m.object, self.names[m.now]
                ));
            }
        }
        let addrs: Vec<usize> = self.allocs.keys().copied().collect();
        for addr in addrs {
            let (id, at, len) = {
                let a = &self.allocs[&addr];
                (a.id, a.at, a.len)
            };
            let now = self.where_now(id)?;
            if now != at {
                self.map_at(now, len, Some(addr))?;
                self.allocs.get_mut(&addr).expect("listed above").at = now;
                log::say(&format!(
                    "moved {addr:#x} from {} to {}",
                    self.names[at.0], self.names[now.0]
                ));
            }
        }
        Ok(())
    }

    /// The NUMA node an allocation is on now.
    pub(crate) fn node_of(&self, addr: usize) -> Result<u32> {
        Ok(self.nodes[self.get(addr)?.at.0])
    }
}
