//! Devices: where bytes live. A device has a name, a kind, a capacity, whether it is
//! byte-addressable, its backing storage and its counters.
//!
//! | spec | backing |
//! | --- | --- |
//! | `dram` | anonymous memory, transparent huge pages where allowed |
//! | `numa:N` | anonymous memory bound to NUMA node N (`mbind`) |
//! | `interleave:NODES` | anonymous memory spread page by page over NUMA nodes (`0,2`, `0-3`; weighted interleave where the kernel offers it) |
//! | `hbw`, `low_lat`, `large_cap` | the space's node nearest the calling thread (`interleave:hbw`: all of its nodes), as [`spaces::resolve_spec`] maps it |
//! | `mapped:PATH` | a file mapped shared (App Direct persistent memory is a file on DAX) |
//! | `block:PATH` | a file on an SSD, read and written with direct I/O in aligned blocks |
//! | `emulated:PROFILE` | DRAM whose tiermem traffic is throttled to a published device |
//!
//! Memory devices are checked against the memory the process can take when opened, and
//! faulted in ([`Prefault`]): [`Device::open`] now; a manager's ([`open_all`]) fast device
//! now and the others as [`default_prefault`] says, unless `TIERMEM_PREFAULT` says otherwise.

pub mod emulated;
pub mod spaces;
mod traits;

pub use emulated::{Reads, Writes};
pub use traits::DeviceTraits;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Serialize;

use crate::counters::DeviceCounters;
use crate::sys::devfile::{self, DevFile, DevFileError};
use crate::sys::direct_io::{self, DirectFile};
use crate::sys::mmap::{Mapping, Prefault};
use crate::sys::numa::NodePolicy;
use crate::{Error, Result};
pub use emulated::{Profile, Throttle, PROFILES};

/// The kind of a device, parsed from its spec string.
#[derive(Debug, Clone, PartialEq)]
pub enum DeviceKind {
    /// Ordinary memory.
    Dram,
    /// Memory of one NUMA node.
    Numa(u32),
    /// Memory spread over NUMA nodes, page by page.
    Interleave(Vec<u32>),
    /// A memory-mapped file.
    Mapped(PathBuf),
    /// A direct-I/O file on a block device.
    Block(PathBuf),
    /// DRAM throttled to a profile.
    Emulated(&'static Profile),
}

impl DeviceKind {
    /// Parse `dram`, `numa:N`, `interleave:NODES`, `mapped:PATH`, `block:PATH` or
    /// `emulated:PROFILE` (a memory space's name is resolved first: [`spaces::resolve_spec`]).
    pub fn parse(spec: &str) -> Result<Self> {
        let (kind, arg) = match spec.split_once(':') {
            Some((k, a)) => (k, Some(a)),
            None => (spec, None),
        };
        let need = |what: &str| -> Result<&str> {
            match arg {
                Some(a) if !a.is_empty() => Ok(a),
                _ => Err(Error::InvalidArgument(format!(
                    "device spec '{spec}' needs {what} after '{kind}:'"
                ))),
            }
        };
        Ok(match kind {
            "dram" if arg.is_none() => DeviceKind::Dram,
            "numa" => {
                let a = need("a node number")?;
                DeviceKind::Numa(a.parse().map_err(|_| {
                    Error::InvalidArgument(format!("'{a}' in '{spec}' is not a NUMA node number"))
                })?)
            }
            "interleave" => {
                let a = need("a node list")?;
                let nodes = crate::sys::discover::parse_list(a);
                let ok = !nodes.is_empty()
                    && a.split([',', '-']).all(|p| p.trim().parse::<u32>().is_ok());
                if !ok {
                    return Err(Error::InvalidArgument(format!(
                        "'{a}' in '{spec}' is not a NUMA node list (e.g. 0,2 or 0-3)"
                    )));
                }
                DeviceKind::Interleave(nodes)
            }
            "mapped" => DeviceKind::Mapped(PathBuf::from(need("a file path")?)),
            "block" => DeviceKind::Block(PathBuf::from(need("a file path")?)),
            "emulated" => DeviceKind::Emulated(emulated::profile(need("a profile name")?)?),
            _ => {
                return Err(Error::UnknownDevice(format!(
                    "'{spec}': kinds are dram, numa:N, interleave:NODES, mapped:PATH, block:PATH, \
                     emulated:PROFILE, or a memory space (hbw, low_lat, large_cap)"
                )))
            }
        })
    }

    /// Short kind name: `dram`, `numa`, `mapped`, `block`, `emulated`.
    #[must_use]
    pub fn kind_name(&self) -> &'static str {
        match self {
            DeviceKind::Dram => "dram",
            DeviceKind::Numa(_) => "numa",
            DeviceKind::Interleave(_) => "interleave",
            DeviceKind::Mapped(_) => "mapped",
            DeviceKind::Block(_) => "block",
            DeviceKind::Emulated(_) => "emulated",
        }
    }
}

/// How the CPU reaches a device's bytes: what copies are routed by
/// (`copy::routes`, one entry per pair) and what a guard needs before it hands out an
/// address (a host address only for [`Reach::Host`]; anything else is staged into memory
/// first). A kind of memory the CPU cannot load (an accelerator's) is a new variant, a
/// `Storage` of its own and its routes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Reach {
    /// Loads and stores reach it: DRAM, NUMA nodes, maps, emulated devices.
    Host,
    /// Reached by aligned direct I/O: a `block` device.
    Block,
}

impl Reach {
    /// Whether the CPU loads and stores the device's bytes.
    #[must_use]
    pub fn host_accessible(self) -> bool {
        matches!(self, Reach::Host)
    }

    /// Allocation alignment on a device of this reach: [`MEMORY_ALIGN`] for host memory,
    /// the direct-I/O block for block devices.
    #[must_use]
    pub fn alignment(self) -> u64 {
        match self {
            Reach::Host => MEMORY_ALIGN,
            Reach::Block => direct_io::ALIGN as u64,
        }
    }
}

/// Where a device's bytes are.
#[derive(Debug)]
enum Storage {
    Memory(Mapping),
    Block(DirectFile),
}

/// The heap alignment of byte-addressable devices: a cache line (a plan's heap offsets are
/// multiples of it).
pub const MEMORY_ALIGN: u64 = 64;

/// A device with its heap memory reserved.
#[derive(Debug)]
pub struct Device {
    /// Name, as given in the spec (`dram`, `block:/mnt/nvme/t`, ...).
    pub name: String,
    /// Kind.
    pub kind: DeviceKind,
    /// Usable bytes.
    pub capacity: u64,
    storage: Storage,
    /// The locked device file of `block`/`mapped` devices (dropped after `storage`, so the
    /// map is gone before the file is unlocked and, if tiermem created it, removed).
    _file: Option<DevFile>,
    /// Throttle for `emulated` devices.
    pub throttle: Option<Throttle>,
    /// Traffic and event counters.
    pub counters: Arc<DeviceCounters>,
}

/// Plain description of a device for `info` and reports.
#[derive(Debug, Clone, Serialize)]
pub struct DeviceInfo {
    /// Name.
    pub name: String,
    /// Kind name.
    pub kind: &'static str,
    /// Capacity in bytes.
    pub capacity: u64,
    /// Whether loads and stores reach it directly.
    pub byte_addressable: bool,
    /// `real` or `emulated`.
    pub real: &'static str,
    /// Whether transparent huge pages back it.
    pub huge_pages: bool,
    /// Emulated read bandwidth, GB/s (profile scaled to this machine).
    pub read_gbps: Option<f64>,
    /// Emulated write bandwidth, GB/s.
    pub write_gbps: Option<f64>,
    /// Emulated latency, ns.
    pub latency_ns: Option<f64>,
    /// Where the emulated figures come from.
    pub profile_source: Option<&'static str>,
    /// What the device is ([`Device::traits`]).
    pub traits: DeviceTraits,
}

impl Device {
    /// Parse `spec` and reserve `capacity` bytes on it. A `block:PATH` or `mapped:PATH`
    /// spec may end in `?overwrite` to use an existing non-empty file or a block-device
    /// node (destroying what it holds); without it those are refused.
    pub fn open(spec: &str, capacity: u64) -> Result<Self> {
        Self::open_with(spec, capacity, Prefault::Now)
    }

    /// As [`Device::open`], with memory devices (`dram`, `emulated`, `numa`) faulted in as
    /// `prefault` says. The capacity checks are the same whatever the choice.
    pub fn open_with(spec: &str, capacity: u64, prefault: Prefault) -> Result<Self> {
        Self::open_backed(spec, capacity, prefault, false)
    }

    /// As [`Device::open_with`] for a memory device (`dram`, `emulated`, `numa`) whose
    /// bytes are a memory file mapped shared, allocated in whole pages: each object's pages
    /// can be mapped a second time at an address of the caller's ([`Device::alias_source`]),
    /// which follows the object when it moves (the H2M interface's promise that pointers
    /// stay valid across migration). Other kinds are refused by name.
    pub fn open_shared(spec: &str, capacity: u64, prefault: Prefault) -> Result<Self> {
        Self::open_backed(spec, capacity, prefault, true)
    }

    fn open_backed(spec: &str, capacity: u64, prefault: Prefault, shared: bool) -> Result<Self> {
        let (spec, overwrite) = strip_overwrite(spec);
        let resolved = spaces::resolve_spec(spec)?;
        let kind = DeviceKind::parse(resolved.as_deref().unwrap_or(spec))?;
        if overwrite && !matches!(kind, DeviceKind::Mapped(_) | DeviceKind::Block(_)) {
            return Err(Error::InvalidArgument(format!(
                "'{spec}?overwrite': only block: and mapped: devices have files to overwrite"
            )));
        }
        let mut file = None;
        if shared && matches!(kind, DeviceKind::Mapped(_) | DeviceKind::Block(_)) {
            return Err(Error::InvalidArgument(format!(
                "device '{spec}': only memory devices (dram, numa:N, emulated:PROFILE) can back \
                 addresses that follow their objects"
            )));
        }
        if capacity == 0 {
            return Err(Error::InvalidArgument(format!(
                "device '{spec}' needs a capacity above zero bytes"
            )));
        }
        let page = crate::sys::page_size() as u64;
        let capacity = capacity
            .checked_next_multiple_of(page.max(direct_io::ALIGN as u64))
            .filter(|c| isize::try_from(*c).is_ok())
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "capacity {capacity} bytes for '{spec}' overflows the address space"
                ))
            })?;
        let len = capacity as usize;
        let anonymous = |policy: Option<NodePolicy>| {
            if shared {
                Mapping::shared_with(len, policy.as_ref(), prefault)
            } else {
                Mapping::anonymous_with(len, true, policy.as_ref(), prefault)
            }
        };
        let io = |what: &str, e: std::io::Error| Error::io(spec, spec, what, e);
        let (storage, throttle) = match &kind {
            DeviceKind::Dram | DeviceKind::Emulated(_) => {
                let (avail, what) = crate::sys::cgroup::available_memory();
                check_fits(spec, capacity, avail, &what)?;
                // The DRAM figures first: measured (once per process, when no calibration
                // file has them) before this map's pages are faulted in beside the probe.
                let throttle = match &kind {
                    DeviceKind::Emulated(p) => {
                        Some(Throttle::new(p, crate::calib::dram_figures()?))
                    }
                    _ => None,
                };
                let map = anonymous(None).map_err(|e| io("map memory", e))?;
                (Storage::Memory(map), throttle)
            }
            DeviceKind::Numa(node) => {
                let free = free_on_nodes(&[*node])?;
                check_fits(spec, capacity, free, &format!("free on NUMA node {node}"))?;
                let map = anonymous(Some(NodePolicy::Bind(*node)))
                    .map_err(|e| io(&format!("bind to NUMA node {node} and fault in"), e))?;
                (Storage::Memory(map), None)
            }
            DeviceKind::Interleave(nodes) => {
                let free = free_on_nodes(nodes)?;
                check_fits(
                    spec,
                    capacity,
                    free,
                    &format!("free on NUMA nodes {nodes:?}"),
                )?;
                let map = anonymous(Some(NodePolicy::Interleave(nodes.clone())))
                    .map_err(|e| io(&format!("interleave over NUMA nodes {nodes:?}"), e))?;
                (Storage::Memory(map), None)
            }
            DeviceKind::Mapped(path) => {
                let f = open_file(spec, path, capacity, overwrite, false)?;
                let map = Mapping::file(&f.file, len)
                    .map_err(|e| Error::io(spec, &path.display().to_string(), "map", e))?;
                file = Some(f);
                (Storage::Memory(map), None)
            }
            DeviceKind::Block(path) => {
                let f = open_file(spec, path, capacity, overwrite, true)?;
                let direct = f
                    .file
                    .try_clone()
                    .map_err(|e| Error::io(spec, &path.display().to_string(), "duplicate", e))?;
                file = Some(f);
                (Storage::Block(DirectFile::new(direct)), None)
            }
        };
        Ok(Device {
            name: match &resolved {
                Some(r) => format!("{spec} ({r})"),
                None => spec.to_owned(),
            },
            kind,
            capacity,
            storage,
            _file: file,
            throttle,
            counters: Arc::new(DeviceCounters::default()),
        })
    }

    /// How the CPU reaches the device's bytes ([`Reach`]).
    #[must_use]
    pub fn reach(&self) -> Reach {
        match self.storage {
            Storage::Memory(_) => Reach::Host,
            Storage::Block(_) => Reach::Block,
        }
    }

    /// Whether loads and stores reach the device directly (everything but `block`).
    #[must_use]
    pub fn byte_addressable(&self) -> bool {
        self.reach().host_accessible()
    }

    /// Allocation alignment ([`Reach::alignment`]).
    #[must_use]
    pub fn alignment(&self) -> u64 {
        if self.shared() {
            crate::sys::page_size() as u64
        } else {
            self.reach().alignment()
        }
    }

    /// Whether the device was opened with [`Device::open_shared`].
    #[must_use]
    pub fn shared(&self) -> bool {
        matches!(&self.storage, Storage::Memory(m) if m.alias_source(0).is_some())
    }

    /// The memory file and its offset holding byte `offset` of a device opened with
    /// [`Device::open_shared`], to map those pages a second time; None otherwise.
    #[must_use]
    pub fn alias_source(&self, offset: u64) -> Option<(std::os::fd::RawFd, u64)> {
        match &self.storage {
            Storage::Memory(m) => m.alias_source(usize::try_from(offset).ok()?),
            Storage::Block(_) => None,
        }
    }

    /// Host address of `offset` on a host-reached device; `None` on any other.
    #[must_use]
    pub fn addr(&self, offset: u64) -> Option<*mut u8> {
        match &self.storage {
            Storage::Memory(m) if offset <= m.len() as u64 => {
                // SAFETY: offset <= len, so the result stays inside (or one past) the map.
                Some(unsafe { m.as_ptr().add(offset as usize) })
            }
            _ => None,
        }
    }

    /// The direct-I/O file of a block device.
    #[must_use]
    pub fn block_file(&self) -> Option<&DirectFile> {
        match &self.storage {
            Storage::Block(f) => Some(f),
            Storage::Memory(_) => None,
        }
    }

    /// Account for reads a tiermem kernel made from the device: count the bytes and, on an
    /// emulated device, wait out their cost (see [`Reads`]).
    pub fn charge_read(&self, read: Reads) {
        self.counters.read(read.0);
        if let Some(t) = &self.throttle {
            t.charge_read(read);
        }
    }

    /// Account for writes to the device (see [`Writes`]).
    pub fn charge_write(&self, write: Writes) {
        self.counters.wrote(write.0);
        if let Some(t) = &self.throttle {
            t.charge_write(write);
        }
    }

    /// Account for a kernel that read and wrote the device at DRAM speed ([`Reads`],
    /// [`Writes`]): count the bytes and, on an emulated device, wait out the extra time the
    /// device would have taken ([`Throttle::read_extra`]). Embedding kernels call this once
    /// per chunk of work.
    pub fn charge_kernel(&self, read: Reads, write: Writes) {
        if read.0 > 0 {
            self.counters.read(read.0);
        }
        if write.0 > 0 {
            self.counters.wrote(write.0);
        }
        if let Some(t) = &self.throttle {
            self.counters.stalled(t.charge_kernel(read, write));
        }
    }

    /// What the device is, for placement decisions ([`DeviceTraits`]). Figures are never
    /// measured here: an emulated device has its throttle's, `dram` the process's DRAM
    /// figures if it already has them ([`crate::calib::dram_figures_if_known`]).
    #[must_use]
    pub fn traits(&self) -> DeviceTraits {
        let figures = match (&self.throttle, &self.kind) {
            (Some(t), _) => Some((t.read_bps / 1e9, t.write_bps / 1e9, t.latency_ns)),
            (None, DeviceKind::Dram) => crate::calib::dram_figures_if_known()
                .map(|f| (f.read_gbps, f.write_gbps, f.latency_ns)),
            _ => None,
        };
        DeviceTraits {
            reach: self.reach(),
            host_accessible: self.reach().host_accessible(),
            byte_addressable: self.byte_addressable(),
            alignment: self.alignment(),
            capacity: self.capacity,
            persistent: matches!(self.kind, DeviceKind::Mapped(_) | DeviceKind::Block(_)),
            emulated: self.throttle.is_some(),
            duplex: self.throttle.is_some(),
            numa_node: match &self.kind {
                DeviceKind::Numa(n) => Some(*n),
                _ => None,
            },
            read_gbps: figures.map(|f| f.0),
            write_gbps: figures.map(|f| f.1),
            latency_ns: figures.map(|f| f.2),
        }
    }

    /// Plain description.
    #[must_use]
    pub fn info(&self) -> DeviceInfo {
        let t = self.throttle.as_ref();
        DeviceInfo {
            name: self.name.clone(),
            kind: self.kind.kind_name(),
            capacity: self.capacity,
            byte_addressable: self.byte_addressable(),
            real: if t.is_some() { "emulated" } else { "real" },
            huge_pages: matches!(&self.storage, Storage::Memory(m) if m.huge_pages),
            read_gbps: t.map(|t| t.read_bps / 1e9),
            write_gbps: t.map(|t| t.write_bps / 1e9),
            latency_ns: t.map(|t| t.latency_ns),
            profile_source: t.map(|t| t.profile.source),
            traits: self.traits(),
        }
    }
}

/// The kind of `spec`, a memory space's name resolved first.
fn parse_resolved(spec: &str) -> Result<DeviceKind> {
    DeviceKind::parse(spaces::resolve_spec(spec)?.as_deref().unwrap_or(spec))
}

/// Free bytes on `nodes` together, or [`Error::UnknownDevice`] naming one the machine lacks.
fn free_on_nodes(nodes: &[u32]) -> Result<u64> {
    let topo = crate::sys::discover::topology();
    let mut free = 0u64;
    for node in nodes {
        let Some(n) = topo.nodes.iter().find(|n| n.id == *node) else {
            let have: Vec<String> = topo.nodes.iter().map(|n| n.id.to_string()).collect();
            return Err(Error::UnknownDevice(format!(
                "NUMA node {node} does not exist (nodes with memory: {})",
                if have.is_empty() {
                    "none found".into()
                } else {
                    have.join(", ")
                }
            )));
        };
        free = free.saturating_add(n.free_bytes);
    }
    Ok(free)
}

fn check_fits(spec: &str, capacity: u64, available: u64, what: &str) -> Result<()> {
    if available > 0 && capacity > available {
        return Err(Error::InvalidArgument(format!(
            "heap of {capacity} bytes for '{spec}' is larger than the {available} bytes {what}"
        )));
    }
    Ok(())
}

/// Open every device of a manager: `(spec, capacity)` pairs, fastest first. Before any
/// memory is reserved, the anonymous-memory devices (`dram`, `emulated`) are checked
/// together against the memory this process can take ([`crate::sys::cgroup::available_memory`]), and `numa:N`
/// devices together per node: each alone may fit while all of them would not.
pub fn open_all(specs: &[(String, u64)]) -> Result<Vec<Device>> {
    open_all_backed(specs, false)
}

/// As [`open_all`], every device opened with [`Device::open_shared`] and faulted in lazily
/// (pages become memory as the program first touches them).
pub fn open_all_shared(specs: &[(String, u64)]) -> Result<Vec<Device>> {
    open_all_backed(specs, true)
}

fn open_all_backed(specs: &[(String, u64)], shared: bool) -> Result<Vec<Device>> {
    let mut anon = 0u64;
    let mut per_node: std::collections::BTreeMap<u32, u64> = Default::default();
    for (spec, cap) in specs {
        match parse_resolved(strip_overwrite(spec).0)? {
            DeviceKind::Dram | DeviceKind::Emulated(_) => anon = anon.saturating_add(*cap),
            DeviceKind::Numa(n) => *per_node.entry(n).or_default() += *cap,
            _ => {}
        }
    }
    if specs.len() > 1 {
        let (avail, what) = crate::sys::cgroup::available_memory();
        if avail > 0 && anon > avail {
            return Err(Error::InvalidArgument(format!(
                "the memory devices ask for {anon} bytes together, more than the {avail} bytes \
                 {what}"
            )));
        }
        let topo = crate::sys::discover::topology();
        for (node, want) in per_node {
            if let Some(n) = topo.nodes.iter().find(|n| n.id == node) {
                check_fits(
                    &format!("numa:{node} (all devices on it)"),
                    want,
                    n.free_bytes,
                    &format!("free on NUMA node {node}"),
                )?;
            }
        }
    }
    let forced = forced_prefault()?;
    let mut devices = Vec::with_capacity(specs.len());
    for (i, (s, c)) in specs.iter().enumerate() {
        let kind = parse_resolved(strip_overwrite(s).0)?;
        if matches!(kind, DeviceKind::Emulated(_)) {
            // Measured (if it must be) before any map is faulted in, here or in the
            // background: a probe beside a populating thread would read low figures.
            crate::calib::dram_figures()?;
        }
        let prefault = match (i, forced) {
            (0, _) => Prefault::Now,
            (_, Some(p)) => p,
            _ => default_prefault(&kind),
        };
        devices.push(if shared {
            Device::open_shared(s, *c, Prefault::Lazy)?
        } else {
            Device::open_with(s, *c, prefault)?
        });
    }
    Ok(devices)
}

/// How [`open_all`] faults in a device after the first (the fast tier, always faulted in
/// now) when `TIERMEM_PREFAULT` says nothing: `dram` and `numa` devices in the background
/// (usable at once, the memory the process's soon after); `emulated` ones lazily, as they
/// are used (a stand-in for memory that is not this machine's DRAM should not take DRAM it
/// never fills; its capacity was checked against the memory available all the same).
#[must_use]
pub fn default_prefault(kind: &DeviceKind) -> Prefault {
    match kind {
        DeviceKind::Emulated(_) => Prefault::Lazy,
        _ => Prefault::Background,
    }
}

/// `TIERMEM_PREFAULT` = `now` (what the measuring commands set: no first-touch fault may
/// reach a timing), `background` or `lazy`, for every device after the first; `None` when
/// unset or empty.
pub fn forced_prefault() -> Result<Option<Prefault>> {
    match std::env::var("TIERMEM_PREFAULT") {
        Err(_) => Ok(None),
        Ok(v) if v.is_empty() => Ok(None),
        Ok(v) => Prefault::parse(&v).map(Some).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "TIERMEM_PREFAULT={v:?}: expected now, background or lazy"
            ))
        }),
    }
}

/// `spec` without a trailing `?overwrite`, and whether it had one.
fn strip_overwrite(spec: &str) -> (&str, bool) {
    match spec.strip_suffix("?overwrite") {
        Some(s) => (s, true),
        None => (spec, false),
    }
}

/// Open a device file with the rules of [`DevFile`], mapping its errors to the device's.
fn open_file(
    spec: &str,
    path: &Path,
    capacity: u64,
    overwrite: bool,
    block: bool,
) -> Result<DevFile> {
    let shown = path.display().to_string();
    let opts = devfile::Options {
        len: capacity,
        overwrite,
        direct: block,
        refuse_memory_fs: block,
        attach: false,
        keep: false,
        read_only: false,
    };
    DevFile::open(path, opts).map_err(|e| match e {
        DevFileError::Os(what, e) => Error::io(spec, &shown, what, e),
        DevFileError::MemoryFs(fs) => Error::InvalidArgument(format!(
            "'{shown}' is on {fs}, a memory file system: a block device there would keep its \
             data in RAM and direct I/O is not real; use a path on an SSD"
        )),
        DevFileError::NoSpace { free } => Error::DeviceFull {
            device: spec.to_owned(),
            requested: capacity,
            free,
            largest: free,
            capacity,
        },
        DevFileError::Exists { what } => Error::InvalidArgument(format!(
            "'{shown}' is {what}; tiermem creates its device files itself and does not \
             overwrite one. Choose a new path, delete it, or write '{spec}?overwrite' to use it \
             anyway (what it holds is lost)"
        )),
        DevFileError::Locked => Error::InvalidArgument(format!(
            "'{shown}' is in use by another tiermem manager (it is locked): two managers on one \
             device file would overwrite each other's data; give each its own path (e.g. with \
             the rank or process id in it)"
        )),
        DevFileError::TooSmall { size } => Error::InvalidArgument(format!(
            "block device '{shown}' holds {size} bytes, less than the {capacity} bytes asked for"
        )),
    })
}
