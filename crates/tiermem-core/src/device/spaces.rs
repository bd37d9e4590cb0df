//! Memory spaces (H2M's and OpenMP's `hbw`, `low_lat`, `large_cap`) mapped to the
//! machine's NUMA nodes, and for each source node its candidates in order of distance.
//!
//! Each space is the set of nodes best at one thing, within [`TIE`] of the best:
//!
//! | space | nodes | from, first that applies |
//! | --- | --- | --- |
//! | `hbw` | highest bandwidth | `TIERMEM_NODES_HBW`; HMAT read bandwidth; the fastest kernel memory tier; calibrated read bandwidth; nodes with CPUs |
//! | `low_lat` | lowest latency | `TIERMEM_NODES_LOW_LAT`; HMAT read latency; the fastest kernel memory tier; calibrated latency; nodes with CPUs |
//! | `large_cap` | largest capacity | `TIERMEM_NODES_LARGE_CAP`; node sizes |
//!
//! A figure is used only when every node has it (HMAT declared for some nodes and not others
//! cannot rank them). hwloc's memory attributes are not a separate source: on Linux hwloc
//! reads the same HMAT files (`access0/initiators`). A source node's *view* of a space is
//! the space's nodes in the order of the source's distances (ties by node id), as H2M's
//! per-node lists are: a thread on that node allocates from the first that has room.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::sys::discover::{configured_topology, parse_list, NumaNode, Topology};
use crate::{Error, Result};

/// Nodes within this fraction of the best figure count as equally good (two sockets' DRAM
/// declare slightly different sizes and bandwidths).
pub const TIE: f64 = 0.10;

/// A memory space.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Space {
    /// Highest bandwidth (HBM, MCDRAM, or DRAM beside slower memory).
    Hbw,
    /// Lowest latency (usually DRAM).
    LowLat,
    /// Largest capacity (Optane, CXL expanders, or DRAM beside HBM).
    LargeCap,
}

impl Space {
    /// Every space, in this order everywhere.
    pub const ALL: [Space; 3] = [Space::Hbw, Space::LowLat, Space::LargeCap];

    /// Its name (`hbw`, `low_lat`, `large_cap`).
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Space::Hbw => "hbw",
            Space::LowLat => "low_lat",
            Space::LargeCap => "large_cap",
        }
    }

    /// The environment variable that overrides its nodes (a kernel list, `0,2` or `0-1`).
    #[must_use]
    pub fn env_var(self) -> &'static str {
        match self {
            Space::Hbw => "TIERMEM_NODES_HBW",
            Space::LowLat => "TIERMEM_NODES_LOW_LAT",
            Space::LargeCap => "TIERMEM_NODES_LARGE_CAP",
        }
    }

    /// The space named `s`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming the known spaces.
    pub fn parse(s: &str) -> Result<Space> {
        Space::ALL
            .into_iter()
            .find(|sp| sp.name() == s)
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "unknown memory space {s:?} (known: hbw, low_lat, large_cap)"
                ))
            })
    }
}

/// The variable naming each node's device spec (`1,3=emulated:optane-pmem;4-7=dram`).
pub const NODE_DEVICES_VAR: &str = "TIERMEM_NODE_DEVICES";

/// An environment variable, or H2M's name for it (`H2M_NODES_HBW` beside
/// `TIERMEM_NODES_HBW`; tiermem's wins when both are set).
#[must_use]
pub fn read_env(k: &str) -> Option<String> {
    std::env::var(k).ok().or_else(|| {
        k.strip_prefix("TIERMEM_")
            .and_then(|r| std::env::var(format!("H2M_{r}")).ok())
    })
}

/// `nodes=value;nodes=value` (nodes a kernel list) as a map from node to value.
///
/// # Errors
/// [`Error::InvalidArgument`] naming `var` and the part that is malformed.
pub fn per_node(var: &str, text: &str) -> Result<BTreeMap<u32, String>> {
    let mut out = BTreeMap::new();
    for part in text.split(';').map(str::trim).filter(|p| !p.is_empty()) {
        let Some((ids, value)) = part.split_once('=') else {
            crate::bail!("{var}: {part:?} is not NODES=VALUE (e.g. \"1,3=emulated:optane-pmem\")");
        };
        let nodes = parse_list(ids);
        if nodes.is_empty() || value.trim().is_empty() {
            crate::bail!("{var}: {part:?} names no node or no value");
        }
        for n in nodes {
            out.insert(n, value.trim().to_owned());
        }
    }
    Ok(out)
}

/// The device spec standing for node `id`: `TIERMEM_NODE_DEVICES`'s (read by `env`), else
/// `numa:N` on this machine (`own`) and `dram` on a sysfs fixture's.
///
/// # Errors
/// A malformed `TIERMEM_NODE_DEVICES`.
pub fn node_spec(id: u32, own: bool, env: &dyn Fn(&str) -> Option<String>) -> Result<String> {
    let given = match env(NODE_DEVICES_VAR) {
        Some(t) => per_node(NODE_DEVICES_VAR, &t)?.remove(&id),
        None => None,
    };
    Ok(given.unwrap_or_else(|| {
        if own {
            format!("numa:{id}")
        } else {
            "dram".to_owned()
        }
    }))
}

/// A device spec that names a memory space, as the spec of its nodes: `hbw`, `low_lat` or
/// `large_cap` is the space's node nearest the calling thread (the first of its node's
/// view); `interleave:SPACE` spreads over all of the space's nodes. The topology is
/// [`configured_topology`]'s, overrides as [`map_spaces`] reads them ([`read_env`]); on a
/// sysfs fixture a node is [`node_spec`]'s device. None for any other spec.
///
/// # Errors
/// As [`map_spaces`] and [`node_spec`].
pub fn resolve_spec(spec: &str) -> Result<Option<String>> {
    let (spread, name) = match spec.strip_prefix("interleave:") {
        Some(rest) => (true, rest),
        None => (false, spec),
    };
    let Ok(space) = Space::parse(name) else {
        return Ok(None);
    };
    let (topo, own) = configured_topology();
    let map = map_spaces(&topo, &read_env, &BTreeMap::new())?;
    let nodes = match crate::sys::numa::current_node().and_then(|n| map.view(n, space)) {
        Some(v) if !v.is_empty() => v.to_vec(),
        _ => map.nodes(space).to_vec(),
    };
    let Some(&first) = nodes.first() else {
        crate::bail!("memory space {name} has no node here");
    };
    if spread && own {
        let list: Vec<String> = nodes.iter().map(u32::to_string).collect();
        return Ok(Some(format!("interleave:{}", list.join(","))));
    }
    node_spec(first, own, &read_env).map(Some)
}

/// Figures tiermem measured for a node (`tiermem calibrate`'s `numa:N`).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Measured {
    /// Sequential read bandwidth, GB/s.
    pub read_gbps: Option<f64>,
    /// Latency, ns.
    pub latency_ns: Option<f64>,
}

/// One space's nodes and why.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct SpaceNodes {
    /// The space.
    pub space: Space,
    /// Its nodes, by id.
    pub nodes: Vec<u32>,
    /// Where they came from: `environment`, `hmat`, `memory_tier`, `calibration`,
    /// `capacity` or `cpus`.
    pub source: &'static str,
    /// The figures that decided, in words.
    pub why: String,
}

/// One source node's view: every node by distance, and each space's nodes in that order.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct View {
    /// The node a thread runs on.
    pub node: u32,
    /// `(node, distance)` nearest first (ties by id); distance `None` when the node's
    /// distance row is missing or malformed, and then the order is by id.
    pub by_distance: Vec<(u32, Option<u32>)>,
    /// Per space (in [`Space::ALL`] order), its nodes in this view's order.
    pub spaces: Vec<(Space, Vec<u32>)>,
}

/// The mapping of every space, every node's view, and what was missing on the way.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct SpaceMap {
    /// Per space, in [`Space::ALL`] order.
    pub spaces: Vec<SpaceNodes>,
    /// Per node with memory or CPUs, in id order.
    pub views: Vec<View>,
    /// What the mapping had to do without (a missing distance row, a node without size).
    pub notes: Vec<String>,
}

impl SpaceMap {
    /// The nodes of `space`.
    #[must_use]
    pub fn nodes(&self, space: Space) -> &[u32] {
        self.spaces
            .iter()
            .find(|s| s.space == space)
            .map_or(&[], |s| &s.nodes)
    }

    /// `space`'s nodes as a thread on `node` should try them, or None for an unknown node.
    #[must_use]
    pub fn view(&self, node: u32, space: Space) -> Option<&[u32]> {
        let v = self.views.iter().find(|v| v.node == node)?;
        v.spaces
            .iter()
            .find(|(s, _)| *s == space)
            .map(|(_, n)| n.as_slice())
    }
}

/// Map the spaces of `topo`. `env` reads an environment variable (tests pass their own);
/// `measured` holds calibrated figures by node.
///
/// # Errors
/// [`Error::InvalidArgument`] for a malformed override (naming the variable and its value)
/// or one naming a node the machine does not have (naming the nodes it has), and when no
/// node has memory.
pub fn map_spaces(
    topo: &Topology,
    env: &dyn Fn(&str) -> Option<String>,
    measured: &BTreeMap<u32, Measured>,
) -> Result<SpaceMap> {
    let mut notes = Vec::new();
    let nodes: Vec<_> = topo
        .nodes
        .iter()
        .filter(|n| {
            if n.total_bytes == 0 {
                notes.push(format!(
                    "node {}: no memory (size 0, or no meminfo), so it is in no space",
                    n.id
                ));
            }
            n.total_bytes > 0
        })
        .collect();
    if nodes.is_empty() {
        crate::bail!(
            "memory spaces: sysfs lists no NUMA node with memory ({} nodes without a size)",
            topo.nodes.len()
        );
    }
    let ids: Vec<u32> = nodes.iter().map(|n| n.id).collect();
    let mut spaces = Vec::new();
    for space in Space::ALL {
        let chosen = match overridden(space, env, &ids)? {
            Some(s) => s,
            None => ranked(space, &nodes, measured),
        };
        spaces.push(chosen);
    }
    // Sources: every node with memory or CPUs (a thread may run on a node without memory).
    let views = topo
        .nodes
        .iter()
        .filter(|n| n.total_bytes > 0 || !n.cpus.is_empty())
        .map(|n| view(topo, n.id, &ids, &spaces, &mut notes))
        .collect();
    Ok(SpaceMap {
        spaces,
        views,
        notes,
    })
}

fn overridden(
    space: Space,
    env: &dyn Fn(&str) -> Option<String>,
    ids: &[u32],
) -> Result<Option<SpaceNodes>> {
    let var = space.env_var();
    let Some(value) = env(var) else {
        return Ok(None);
    };
    let ok = !value.trim().is_empty()
        && value.trim().split(',').all(|p| {
            let mut it = p.splitn(2, '-');
            let a = it.next().and_then(|a| a.parse::<u32>().ok());
            match (a, it.next()) {
                (Some(_), None) => true,
                (Some(a), Some(b)) => b.parse::<u32>().is_ok_and(|b| b >= a),
                _ => false,
            }
        });
    if !ok {
        crate::bail!("{var}={value:?} is not a node list (expected e.g. \"0,2\" or \"0-1\")");
    }
    // Every id is checked before the list is expanded (`0-4294967295` names 2^32 nodes).
    let top = ids.iter().copied().max().unwrap_or(0);
    if let Some(bad) = value
        .split(['-', ','])
        .filter_map(|n| n.trim().parse::<u32>().ok())
        .find(|&n| n > top)
    {
        crate::bail!("{var}={value:?} names node {bad}, which has no memory here (nodes: {ids:?})");
    }
    let mut nodes = parse_list(&value);
    nodes.sort_unstable();
    nodes.dedup();
    if let Some(bad) = nodes.iter().find(|n| !ids.contains(n)) {
        crate::bail!("{var}={value:?} names node {bad}, which has no memory here (nodes: {ids:?})");
    }
    Ok(Some(SpaceNodes {
        space,
        nodes,
        source: "environment",
        why: format!("{var}={value}"),
    }))
}

/// The best of `(id, score)` pairs (higher is better), within [`TIE`] of the best score.
#[must_use]
pub fn best<I: Copy>(scored: &[(I, f64)]) -> Vec<I> {
    let top = scored.iter().map(|n| n.1).fold(f64::NEG_INFINITY, f64::max);
    scored
        .iter()
        .filter(|n| n.1 >= top - TIE * top.abs())
        .map(|n| n.0)
        .collect()
}

fn ranked(space: Space, nodes: &[&NumaNode], measured: &BTreeMap<u32, Measured>) -> SpaceNodes {
    let all = |f: &dyn Fn(&NumaNode) -> Option<f64>| -> Option<Vec<(u32, f64)>> {
        nodes.iter().map(|n| Some((n.id, f(n)?))).collect()
    };
    let listed = |v: &[(u32, f64)], unit: &str| -> String {
        v.iter()
            .map(|(id, x)| format!("node {id} {x:.1} {unit}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let make = |nodes: Vec<u32>, source: &'static str, why: String| SpaceNodes {
        space,
        nodes,
        source,
        why,
    };
    if space == Space::LargeCap {
        let v: Vec<(u32, f64)> = nodes.iter().map(|n| (n.id, n.total_bytes as f64)).collect();
        let gib: Vec<(u32, f64)> = v
            .iter()
            .map(|(i, b)| (*i, b / f64::from(1 << 30)))
            .collect();
        return make(
            best(&v),
            "capacity",
            format!("sizes: {}", listed(&gib, "GiB")),
        );
    }
    // Higher is better: bandwidth as is, latency negated.
    let hbw = space == Space::Hbw;
    let hmat = |n: &NumaNode| -> Option<f64> {
        let d = n.declared.as_ref()?;
        if hbw {
            d.read_gbps
        } else {
            d.read_latency_ns.map(|l| -l)
        }
    };
    let cal = |id: u32| -> Option<f64> {
        let m = measured.get(&id)?;
        if hbw {
            m.read_gbps
        } else {
            m.latency_ns.map(|l| -l)
        }
    };
    let what = if hbw {
        "read bandwidth"
    } else {
        "read latency"
    };
    let unit = if hbw { "GB/s" } else { "ns" };
    let shown =
        |v: &[(u32, f64)]| -> Vec<(u32, f64)> { v.iter().map(|(i, x)| (*i, x.abs())).collect() };
    if let Some(v) = all(&hmat) {
        return make(
            best(&v),
            "hmat",
            format!("HMAT {what}: {}", listed(&shown(&v), unit)),
        );
    }
    if let Some(v) = all(&|n| n.memory_tier.map(f64::from)) {
        // A lower tier id is a smaller abstract distance: faster memory.
        let neg: Vec<(u32, f64)> = v.iter().map(|(i, t)| (*i, -t)).collect();
        let top = neg.iter().map(|n| n.1).fold(f64::NEG_INFINITY, f64::max);
        let ids = neg.iter().filter(|n| n.1 == top).map(|n| n.0).collect();
        let tiers = v
            .iter()
            .map(|(i, t)| format!("node {i} memory_tier{t}"))
            .collect::<Vec<_>>()
            .join(", ");
        return make(
            ids,
            "memory_tier",
            format!("no HMAT {what} for every node; kernel memory tiers: {tiers}"),
        );
    }
    if let Some(v) = nodes
        .iter()
        .map(|n| Some((n.id, cal(n.id)?)))
        .collect::<Option<Vec<_>>>()
    {
        return make(
            best(&v),
            "calibration",
            format!(
                "no HMAT or memory tiers; calibrated {what}: {}",
                listed(&shown(&v), unit)
            ),
        );
    }
    let with_cpus: Vec<u32> = nodes
        .iter()
        .filter(|n| !n.cpus.is_empty())
        .map(|n| n.id)
        .collect();
    let ids = if with_cpus.is_empty() {
        nodes.iter().map(|n| n.id).collect()
    } else {
        with_cpus
    };
    make(
        ids,
        "cpus",
        format!(
            "no {what} figures for every node (no HMAT, memory tiers or calibration): \
             nodes with CPUs, taken as DRAM"
        ),
    )
}

fn view(
    topo: &Topology,
    src: u32,
    ids: &[u32],
    spaces: &[SpaceNodes],
    notes: &mut Vec<String>,
) -> View {
    let node = topo.nodes.iter().find(|n| n.id == src);
    // The distance row is in the order of every node sysfs lists, with memory or not.
    let all_ids: Vec<u32> = topo.nodes.iter().map(|n| n.id).collect();
    let row = node.map(|n| n.distances.clone()).unwrap_or_default();
    let known = row.len() == all_ids.len();
    if !known {
        notes.push(format!(
            "node {src}: its distance row has {} entries for {} nodes, so its candidates are in node order",
            row.len(),
            all_ids.len()
        ));
    }
    let dist = |id: u32| -> Option<u32> {
        known.then(|| row[all_ids.iter().position(|&x| x == id).expect("listed")])
    };
    let mut by: Vec<(u32, Option<u32>)> = ids.iter().map(|&id| (id, dist(id))).collect();
    by.sort_by_key(|&(id, d)| (d.unwrap_or(0), id));
    let spaces = spaces
        .iter()
        .map(|s| {
            let order = by
                .iter()
                .map(|&(id, _)| id)
                .filter(|id| s.nodes.contains(id))
                .collect();
            (s.space, order)
        })
        .collect();
    View {
        node: src,
        by_distance: by,
        spaces,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::discover::{Declared, NumaNode};

    fn node(id: u32, gib: u64, cpus: &str, distances: Vec<u32>) -> NumaNode {
        NumaNode {
            id,
            total_bytes: gib << 30,
            free_bytes: gib << 30,
            cpus: cpus.into(),
            distances,
            memory_tier: None,
            declared: None,
        }
    }

    fn topo(nodes: Vec<NumaNode>) -> Topology {
        Topology {
            nodes,
            mem_available: 0,
            thp: "never".into(),
            cpus: 1,
            last_level_cache: 0,
        }
    }

    fn no_env(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn one_node_is_every_space() {
        let t = topo(vec![node(0, 24, "0-1", vec![10])]);
        let m = map_spaces(&t, &no_env, &BTreeMap::new()).unwrap();
        for s in Space::ALL {
            assert_eq!(m.nodes(s), &[0]);
            assert_eq!(m.view(0, s), Some(&[0][..]));
        }
        assert_eq!(m.spaces[0].source, "cpus");
        assert_eq!(m.spaces[2].source, "capacity");
        assert!(m.notes.is_empty());
    }

    #[test]
    fn declared_figures_rank_and_ties_group() {
        let mut a = node(0, 96, "0-3", vec![10, 31]);
        let mut b = node(1, 16, "", vec![31, 10]);
        a.declared = Some(Declared {
            read_gbps: Some(90.0),
            write_gbps: None,
            read_latency_ns: Some(130.0),
            write_latency_ns: None,
        });
        b.declared = Some(Declared {
            read_gbps: Some(400.0),
            write_gbps: None,
            read_latency_ns: Some(150.0),
            write_latency_ns: None,
        });
        let m = map_spaces(&topo(vec![a, b]), &no_env, &BTreeMap::new()).unwrap();
        assert_eq!(m.nodes(Space::Hbw), &[1]);
        assert_eq!(m.nodes(Space::LowLat), &[0]);
        assert_eq!(m.nodes(Space::LargeCap), &[0]);
        assert_eq!(m.spaces[0].source, "hmat");
        assert!(
            m.spaces[1].why.contains("node 1 150.0 ns"),
            "{}",
            m.spaces[1].why
        );
    }

    #[test]
    fn calibration_ranks_when_sysfs_declares_nothing() {
        let t = topo(vec![
            node(0, 8, "0", vec![10, 20]),
            node(1, 8, "1", vec![20, 10]),
        ]);
        let mut cal = BTreeMap::new();
        cal.insert(
            0,
            Measured {
                read_gbps: Some(20.0),
                latency_ns: Some(90.0),
            },
        );
        cal.insert(
            1,
            Measured {
                read_gbps: Some(60.0),
                latency_ns: Some(95.0),
            },
        );
        let m = map_spaces(&t, &no_env, &cal).unwrap();
        assert_eq!(m.nodes(Space::Hbw), &[1]);
        assert_eq!(m.nodes(Space::LowLat), &[0, 1]); // within 10 %
        assert_eq!(m.spaces[0].source, "calibration");
        assert_eq!(m.view(1, Space::LowLat), Some(&[1, 0][..]));
    }

    #[test]
    fn overrides_win_and_bad_ones_are_refused_by_name() {
        let t = topo(vec![
            node(0, 8, "0", vec![10, 20]),
            node(1, 64, "", vec![20, 10]),
        ]);
        let env = |v: &str| (v == "TIERMEM_NODES_HBW").then(|| "1".to_string());
        let m = map_spaces(&t, &env, &BTreeMap::new()).unwrap();
        assert_eq!(
            (m.nodes(Space::Hbw), m.spaces[0].source),
            (&[1][..], "environment")
        );
        for (value, msg) in [
            ("x", "is not a node list"),
            ("", "is not a node list"),
            ("1-0", "is not a node list"),
            ("0,", "is not a node list"),
            (
                "7",
                "names node 7, which has no memory here (nodes: [0, 1])",
            ),
            (
                "0-4294967295",
                "names node 4294967295, which has no memory here (nodes: [0, 1])",
            ),
        ] {
            let env = |v: &str| (v == "TIERMEM_NODES_LARGE_CAP").then(|| value.to_string());
            let e = map_spaces(&t, &env, &BTreeMap::new())
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("TIERMEM_NODES_LARGE_CAP") && e.contains(msg),
                "{e}"
            );
        }
        assert!(Space::parse("fast")
            .unwrap_err()
            .to_string()
            .contains("known: hbw"));
    }

    #[test]
    fn missing_files_are_noted_not_guessed() {
        let t = topo(vec![
            node(0, 8, "0", vec![10]),
            node(1, 0, "", vec![20, 10]),
        ]);
        let m = map_spaces(&t, &no_env, &BTreeMap::new()).unwrap();
        assert_eq!(m.nodes(Space::LargeCap), &[0]);
        assert!(m.notes.iter().any(|n| n.contains("node 1: no memory")));
        assert!(m
            .notes
            .iter()
            .any(|n| n.contains("node 0: its distance row has 1 entries for 2 nodes")));
        assert_eq!(m.views[0].by_distance, vec![(0, None)]);
        let none = topo(vec![node(0, 0, "", vec![10])]);
        let e = map_spaces(&none, &no_env, &BTreeMap::new())
            .unwrap_err()
            .to_string();
        assert!(e.contains("no NUMA node with memory"), "{e}");
    }
}
