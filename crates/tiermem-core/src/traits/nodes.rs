//! A manager whose devices stand for the machine's NUMA nodes (the H2M interface's view of
//! memory): which nodes, in what order, with what spec and capacity, from the topology, its
//! space map and the environment.
//!
//! | variable | what it sets | default |
//! | --- | --- | --- |
//! | `TIERMEM_NODE_DEVICES` | a node's device spec: `1,3=emulated:optane-pmem;4-7=dram` | `numa:N` on this machine's own topology, `dram` on a sysfs fixture's |
//! | `TIERMEM_NODE_BYTES` | a node's capacity: `0-3=1GiB;4-7=256MiB` | the node's size divided by the scale |
//! | `TIERMEM_NODE_SCALE` | the divisor of node sizes | 1 on this machine (free memory, three quarters of it); on a fixture the smallest power of two that fits the nodes in a quarter of this machine's available memory |
//!
//! Devices are ordered fastest first as the manager expects: the `hbw` space's nodes, then
//! `low_lat`'s, then the rest, each by node id.

use std::collections::BTreeMap;

pub use crate::device::spaces::NODE_DEVICES_VAR;
use crate::device::spaces::{node_spec, per_node, Space, SpaceMap};
use crate::sys::discover::Topology;
use crate::Result;

/// The variable naming each node's capacity.
pub const NODE_BYTES_VAR: &str = "TIERMEM_NODE_BYTES";
/// The variable naming the divisor of node sizes.
pub const NODE_SCALE_VAR: &str = "TIERMEM_NODE_SCALE";

/// The devices standing for a topology's nodes, and how they were chosen.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeDevices {
    /// `(spec, capacity)` per device, fastest first (for [`crate::device::open_all`]).
    pub specs: Vec<(String, u64)>,
    /// The node each device stands for.
    pub nodes: Vec<u32>,
    /// What was chosen and why, one line each (for a verbose log).
    pub notes: Vec<String>,
}

/// Bytes in `s`: a whole number with an optional `K`, `M`, `G` or `T` (`KiB`, ... alike:
/// powers of 1024).
///
/// # Errors
/// [`crate::Error::InvalidArgument`] naming `what` and the text.
pub fn parse_bytes(what: &str, s: &str) -> Result<u64> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let shift = match unit.trim().trim_end_matches("iB").trim_end_matches('B') {
        "" => 0,
        "K" | "k" => 10,
        "M" => 20,
        "G" => 30,
        "T" => 40,
        _ => crate::bail!("{what}: {s:?} is not a size (e.g. 512MiB, 4G, 1048576)"),
    };
    digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(1u64 << shift))
        .filter(|&n| n > 0)
        .ok_or_else(|| {
            crate::Error::InvalidArgument(format!(
                "{what}: {s:?} is not a size above zero (e.g. 512MiB, 4G, 1048576)"
            ))
        })
}

/// The devices for `topo`'s nodes with memory, as `map` ranks them. `own` says `topo` is
/// this machine's (its nodes can be bound); `env` reads the variables above;
/// `available` is the memory this process may take (to scale a fixture's nodes).
///
/// # Errors
/// A malformed variable, one naming a node without memory, or a spec that does not parse.
pub fn node_devices(
    topo: &Topology,
    map: &SpaceMap,
    env: &dyn Fn(&str) -> Option<String>,
    own: bool,
    available: u64,
) -> Result<NodeDevices> {
    let with_memory: Vec<&crate::sys::discover::NumaNode> =
        topo.nodes.iter().filter(|n| n.total_bytes > 0).collect();
    let ids: Vec<u32> = with_memory.iter().map(|n| n.id).collect();
    let rank = |id: u32| {
        if map.nodes(Space::Hbw).contains(&id) {
            0
        } else if map.nodes(Space::LowLat).contains(&id) {
            1
        } else {
            2
        }
    };
    let mut order = ids.clone();
    order.sort_by_key(|&id| (rank(id), id));
    let specs_env = match env(NODE_DEVICES_VAR) {
        Some(t) => per_node(NODE_DEVICES_VAR, &t)?,
        None => BTreeMap::new(),
    };
    // Every node's spec the one way (the given ones checked against the nodes below).
    let spec_of = |id: u32| node_spec(id, own, env);
    let bytes_env = match env(NODE_BYTES_VAR) {
        Some(t) => per_node(NODE_BYTES_VAR, &t)?,
        None => BTreeMap::new(),
    };
    for (var, m) in [(NODE_DEVICES_VAR, &specs_env), (NODE_BYTES_VAR, &bytes_env)] {
        if let Some(bad) = m.keys().find(|n| !ids.contains(n)) {
            crate::bail!("{var} names node {bad}, which has no memory here (nodes: {ids:?})");
        }
    }
    let mut notes = Vec::new();
    let scale = match env(NODE_SCALE_VAR) {
        Some(t) => match t.trim().parse::<u64>() {
            Ok(s) if s >= 1 => s,
            _ => crate::bail!("{NODE_SCALE_VAR}={t:?} is not a whole number >= 1"),
        },
        None if own => 1,
        None => {
            let total: u64 = with_memory.iter().map(|n| n.total_bytes).sum();
            let mut s = 1u64;
            while s < (1 << 40) && total / s > available / 4 {
                s *= 2;
            }
            notes.push(format!(
                "node sizes divided by {s} to fit this machine ({NODE_SCALE_VAR} to choose)"
            ));
            s
        }
    };
    let mut specs = Vec::with_capacity(order.len());
    for &id in &order {
        let node = with_memory
            .iter()
            .find(|n| n.id == id)
            .expect("a node with memory");
        let spec = spec_of(id)?;
        crate::device::DeviceKind::parse(&spec)?;
        let bytes = match bytes_env.get(&id) {
            Some(b) => parse_bytes(NODE_BYTES_VAR, b)?,
            None if own && scale == 1 => (node.free_bytes / 4 * 3).max(1 << 20),
            None => (node.total_bytes / scale).max(1 << 20),
        };
        notes.push(format!("NUMA node {id} -> device {spec}, {bytes} bytes"));
        specs.push((spec, bytes));
    }
    Ok(NodeDevices {
        specs,
        nodes: order,
        notes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::spaces::map_spaces;
    use crate::sys::discover::topology_from;
    use std::path::PathBuf;

    fn fixture(name: &str) -> Topology {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures/sysfs")
            .join(name);
        topology_from(&root, &root.join("meminfo"))
    }

    fn build(name: &str, vars: &[(&str, &str)]) -> Result<NodeDevices> {
        let topo = fixture(name);
        let env = |k: &str| {
            vars.iter()
                .find(|(v, _)| *v == k)
                .map(|(_, x)| (*x).to_owned())
        };
        let map = map_spaces(&topo, &env, &BTreeMap::new())?;
        node_devices(&topo, &map, &env, false, 16 << 30)
    }

    #[test]
    fn knl_puts_mcdram_first_and_scales_to_fit() {
        let d = build("knl-snc4-flat", &[]).unwrap();
        assert_eq!(d.nodes, vec![4, 5, 6, 7, 0, 1, 2, 3]);
        let total: u64 = d.specs.iter().map(|s| s.1).sum();
        assert!(total <= 4 << 30, "{total}");
        assert!(d.specs.iter().all(|s| s.0 == "dram"));
    }

    #[test]
    fn overrides_set_specs_and_bytes() {
        let d = build(
            "cascadelake-optane",
            &[
                (NODE_DEVICES_VAR, "2,3=emulated:optane-pmem"),
                (NODE_BYTES_VAR, "0-3=64MiB"),
            ],
        )
        .unwrap();
        assert_eq!(d.nodes, vec![0, 1, 2, 3]);
        assert_eq!(d.specs[2], ("emulated:optane-pmem".to_owned(), 64 << 20));
        assert_eq!(d.specs[0], ("dram".to_owned(), 64 << 20));
    }

    #[test]
    fn bad_variables_are_refused_by_name() {
        for (vars, msg) in [
            (vec![(NODE_DEVICES_VAR, "1=floppy")], "floppy"),
            (vec![(NODE_DEVICES_VAR, "9=dram")], "names node 9"),
            (vec![(NODE_DEVICES_VAR, "dram")], "is not NODES=VALUE"),
            (vec![(NODE_BYTES_VAR, "0=lots")], "is not a size"),
            (vec![(NODE_BYTES_VAR, "0=0")], "above zero"),
            (vec![(NODE_SCALE_VAR, "0")], "whole number >= 1"),
        ] {
            let e = build("cascadelake-optane", &vars).unwrap_err().to_string();
            assert!(e.contains(msg), "{vars:?}: {e}");
        }
        assert_eq!(parse_bytes("x", "4GiB").unwrap(), 4 << 30);
        assert_eq!(parse_bytes("x", "512M").unwrap(), 512 << 20);
    }
}
