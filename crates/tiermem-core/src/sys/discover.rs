//! Topology discovery from sysfs: NUMA nodes, their sizes, CPUs and distances, and the
//! kernel's memory tiers where it exposes them.

use std::fs;
use std::path::Path;

use serde::Serialize;

/// One NUMA node as the kernel reports it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct NumaNode {
    /// Node id.
    pub id: u32,
    /// Total memory in bytes.
    pub total_bytes: u64,
    /// Free memory in bytes.
    pub free_bytes: u64,
    /// CPU list (empty for memory-only nodes such as CXL expanders or Optane in flat mode).
    pub cpus: String,
    /// Distances to every node, in node order (10 = local).
    pub distances: Vec<u32>,
    /// The kernel memory tier holding the node, if `memory_tiering` is exposed.
    pub memory_tier: Option<u32>,
    /// Performance the firmware declares (ACPI HMAT, via `access0/initiators`), if any.
    pub declared: Option<Declared>,
}

/// Bandwidth and latency a node's firmware declares for its nearest initiators (the
/// kernel's `nodeN/access0/initiators/*`, from ACPI HMAT; what hwloc reports as memory
/// attributes). Often missing: firmware without HMAT declares nothing.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Declared {
    /// Read bandwidth, GB/s.
    pub read_gbps: Option<f64>,
    /// Write bandwidth, GB/s.
    pub write_gbps: Option<f64>,
    /// Read latency, ns.
    pub read_latency_ns: Option<f64>,
    /// Write latency, ns.
    pub write_latency_ns: Option<f64>,
}

fn declared(node_dir: &Path) -> Option<Declared> {
    let dir = node_dir.join("access0/initiators");
    let num = |f: &str| -> Option<f64> {
        let v: f64 = fs::read_to_string(dir.join(f)).ok()?.trim().parse().ok()?;
        (v > 0.0).then_some(v)
    };
    let d = Declared {
        // The kernel gives MB/s.
        read_gbps: num("read_bandwidth").map(|v| v / 1000.0),
        write_gbps: num("write_bandwidth").map(|v| v / 1000.0),
        read_latency_ns: num("read_latency"),
        write_latency_ns: num("write_latency"),
    };
    (d.read_gbps.is_some() || d.read_latency_ns.is_some()).then_some(d)
}

/// What the machine looks like.
#[derive(Debug, Clone, Serialize)]
pub struct Topology {
    /// NUMA nodes with memory.
    pub nodes: Vec<NumaNode>,
    /// Memory available to new allocations (`MemAvailable`), bytes.
    pub mem_available: u64,
    /// Transparent huge page mode (`always`, `madvise`, `never`).
    pub thp: String,
    /// Online CPUs.
    pub cpus: usize,
    /// Bytes of CPU 0's last-level data cache (the highest level sysfs lists, 0 when it lists
    /// none). On a shared server this can hold hundreds of MiB: a bandwidth probe smaller
    /// than it measures the cache, not memory.
    pub last_level_cache: u64,
}

/// Read the topology. Missing sysfs files give an empty node list, not an error.
#[must_use]
pub fn topology() -> Topology {
    topology_from(Path::new("/sys"), Path::new("/proc/meminfo"))
}

/// The variable naming a sysfs tree to place by instead of `/sys` (a fixture's, e.g.
/// `tests/fixtures/sysfs/knl-snc4-flat`, its `meminfo` beside it).
pub const SYSFS_VAR: &str = "TIERMEM_SYSFS";

/// The topology placement follows: `TIERMEM_SYSFS`'s tree when set, else this machine's;
/// and whether it is this machine's (its nodes can be bound).
#[must_use]
pub fn configured_topology() -> (Topology, bool) {
    match std::env::var_os(SYSFS_VAR) {
        Some(root) => {
            let root = Path::new(&root);
            (topology_from(root, &root.join("meminfo")), false)
        }
        None => (topology(), true),
    }
}

/// Read the topology from a sysfs root (tests point this at a fake tree).
#[must_use]
pub fn topology_from(sys: &Path, meminfo: &Path) -> Topology {
    let node_dir = sys.join("devices/system/node");
    let mut nodes = Vec::new();
    if let Ok(entries) = fs::read_dir(&node_dir) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(id) = name
                .strip_prefix("node")
                .and_then(|s| s.parse::<u32>().ok())
            else {
                continue;
            };
            let p = e.path();
            let info = fs::read_to_string(p.join("meminfo")).unwrap_or_default();
            nodes.push(NumaNode {
                id,
                total_bytes: meminfo_field(&info, "MemTotal:").unwrap_or(0),
                free_bytes: meminfo_field(&info, "MemFree:").unwrap_or(0),
                cpus: fs::read_to_string(p.join("cpulist"))
                    .unwrap_or_default()
                    .trim()
                    .to_owned(),
                distances: fs::read_to_string(p.join("distance"))
                    .unwrap_or_default()
                    .split_whitespace()
                    .filter_map(|d| d.parse().ok())
                    .collect(),
                memory_tier: None,
                declared: declared(&p),
            });
        }
    }
    nodes.sort_by_key(|n| n.id);
    let tiers = sys.join("devices/virtual/memory_tiering");
    if let Ok(entries) = fs::read_dir(&tiers) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(tier) = name
                .strip_prefix("memory_tier")
                .and_then(|s| s.parse().ok())
            else {
                continue;
            };
            let list = fs::read_to_string(e.path().join("nodelist")).unwrap_or_default();
            for id in parse_list(&list) {
                if let Some(n) = nodes.iter_mut().find(|n| n.id == id) {
                    n.memory_tier = Some(tier);
                }
            }
        }
    }
    let mem = fs::read_to_string(meminfo).unwrap_or_default();
    Topology {
        nodes,
        mem_available: meminfo_field(&mem, "MemAvailable:").unwrap_or(0),
        thp: crate::sys::thp_mode(),
        cpus: std::thread::available_parallelism().map_or(1, std::num::NonZero::get),
        last_level_cache: last_level_cache(&sys.join("devices/system/cpu/cpu0/cache")),
    }
}

/// The size of the highest-level data or unified cache under a CPU's sysfs `cache` folder
/// (`index*/level`, `type`, `size` like `307200K`); 0 when none is listed.
fn last_level_cache(dir: &Path) -> u64 {
    let Ok(entries) = fs::read_dir(dir) else {
        return 0;
    };
    let read = |p: &Path, f: &str| fs::read_to_string(p.join(f)).unwrap_or_default();
    entries
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("index"))
        .filter_map(|e| {
            let p = e.path();
            if read(&p, "type").trim() == "Instruction" {
                return None;
            }
            let level: u32 = read(&p, "level").trim().parse().ok()?;
            Some((level, parse_size(read(&p, "size").trim())?))
        })
        .max()
        .map_or(0, |(_, bytes)| bytes)
}

/// A sysfs cache size: a number of bytes with an optional `K`, `M` or `G` suffix.
fn parse_size(s: &str) -> Option<u64> {
    let (digits, unit) = match s.char_indices().last()? {
        (i, 'K') => (&s[..i], 1 << 10),
        (i, 'M') => (&s[..i], 1 << 20),
        (i, 'G') => (&s[..i], 1 << 30),
        _ => (s, 1),
    };
    digits.parse::<u64>().ok()?.checked_mul(unit)
}

/// A `meminfo` field in bytes (the files give kB). Node files prefix lines with "Node N".
fn meminfo_field(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let at = l.find(key)?;
        let kb: u64 = l[at + key.len()..]
            .split_whitespace()
            .next()?
            .parse()
            .ok()?;
        Some(kb * 1024)
    })
}

/// The largest id a kernel list may name (Linux's CPU and node limits are far below it):
/// larger ids are dropped before anything is allocated for them.
pub const MAX_LIST_ID: u32 = 1 << 16;

/// Parse a kernel list like `0-2,5` (ids above [`MAX_LIST_ID`] are dropped).
#[must_use]
pub fn parse_list(s: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for part in s.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                if let (Ok(a), Ok(b)) = (a.parse::<u32>(), b.parse::<u32>()) {
                    out.extend(a..=b.min(MAX_LIST_ID));
                }
            }
            None => out.extend(part.parse::<u32>().ok().filter(|&v| v <= MAX_LIST_ID)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_fake_two_node_machine_with_tiers() {
        let root = std::env::temp_dir().join(format!("tiermem-sysfs-{}", std::process::id()));
        let n0 = root.join("devices/system/node/node0");
        let n1 = root.join("devices/system/node/node1");
        let t = root.join("devices/virtual/memory_tiering");
        for d in [&n0, &n1, &t.join("memory_tier4"), &t.join("memory_tier22")] {
            fs::create_dir_all(d).unwrap();
        }
        fs::write(
            n0.join("meminfo"),
            "Node 0 MemTotal:  1024 kB\nNode 0 MemFree: 512 kB\n",
        )
        .unwrap();
        fs::write(n0.join("distance"), "10 21\n").unwrap();
        fs::write(n0.join("cpulist"), "0-3\n").unwrap();
        fs::write(
            n1.join("meminfo"),
            "Node 1 MemTotal:  4096 kB\nNode 1 MemFree: 4000 kB\n",
        )
        .unwrap();
        fs::write(n1.join("distance"), "21 10\n").unwrap();
        fs::write(n1.join("cpulist"), "\n").unwrap();
        fs::write(t.join("memory_tier4/nodelist"), "0\n").unwrap();
        let hmat = n1.join("access0/initiators");
        fs::create_dir_all(&hmat).unwrap();
        fs::write(hmat.join("read_bandwidth"), "25600\n").unwrap();
        fs::write(hmat.join("read_latency"), "250\n").unwrap();
        fs::write(t.join("memory_tier22/nodelist"), "1\n").unwrap();
        for (i, level, kind, size) in [
            (0, "1", "Data", "48K"),
            (1, "1", "Instruction", "32K"),
            (2, "2", "Unified", "2048K"),
            (3, "3", "Unified", "300M"),
        ] {
            let c = root.join(format!("devices/system/cpu/cpu0/cache/index{i}"));
            fs::create_dir_all(&c).unwrap();
            for (f, v) in [("level", level), ("type", kind), ("size", size)] {
                fs::write(c.join(f), format!("{v}\n")).unwrap();
            }
        }
        let mi = root.join("meminfo");
        fs::write(&mi, "MemTotal: 10 kB\nMemAvailable: 7 kB\n").unwrap();
        let topo = topology_from(&root, &mi);
        assert_eq!(topo.nodes.len(), 2);
        assert_eq!(topo.nodes[0].total_bytes, 1024 * 1024);
        assert_eq!(topo.nodes[1].free_bytes, 4000 * 1024);
        assert_eq!(topo.nodes[1].distances, vec![21, 10]);
        assert_eq!(topo.nodes[0].cpus, "0-3");
        assert_eq!(topo.nodes[1].cpus, "");
        assert_eq!(topo.nodes[0].memory_tier, Some(4));
        assert_eq!(topo.nodes[1].memory_tier, Some(22));
        assert_eq!(topo.mem_available, 7 * 1024);
        assert_eq!(topo.last_level_cache, 300 << 20);
        assert_eq!(topo.nodes[0].declared, None);
        let d = topo.nodes[1].declared.clone().unwrap();
        assert_eq!(
            (d.read_gbps, d.read_latency_ns, d.write_gbps),
            (Some(25.6), Some(250.0), None)
        );
        fs::remove_dir_all(root).unwrap();
    }

    #[test]
    fn a_machine_without_cache_files_has_no_last_level_cache() {
        let root = std::env::temp_dir().join(format!("tiermem-nocache-{}", std::process::id()));
        fs::create_dir_all(&root).unwrap();
        assert_eq!(
            last_level_cache(&root.join("devices/system/cpu/cpu0/cache")),
            0
        );
        assert_eq!(parse_size("307200K"), Some(307_200 << 10));
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("x"), None);
        assert_eq!(parse_size(""), None);
        fs::remove_dir_all(root).unwrap();
    }

    #[test]
    fn parses_kernel_lists() {
        assert_eq!(parse_list("0-2,5\n"), vec![0, 1, 2, 5]);
        assert_eq!(parse_list(""), Vec::<u32>::new());
        // A crafted list allocates nothing for ids no machine has.
        assert_eq!(parse_list("0-4294967295").len(), MAX_LIST_ID as usize + 1);
        assert_eq!(parse_list("4294967295"), Vec::<u32>::new());
    }
}
