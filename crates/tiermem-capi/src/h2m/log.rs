//! The H2M interface's verbose log, on standard error when `TIERMEM_VERBOSE` (or H2M's
//! `H2M_VERBOSE`) is set to a number above zero: the nodes, each space's mapping and every
//! node's view, in the lines the H2M slides show, then each allocation and move.

use std::fmt::Write as _;
use std::io::Write as _;
use std::sync::OnceLock;

use tiermem_core::device::spaces::{Space, SpaceMap};
use tiermem_core::sys::discover::Topology;

use super::traits::space_constant;

/// Whether the log is on (read once per process).
pub(crate) fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        ["TIERMEM_VERBOSE", "H2M_VERBOSE"]
            .iter()
            .filter_map(|k| std::env::var(k).ok())
            .any(|v| v.trim().parse::<u32>().is_ok_and(|n| n > 0))
    })
}

/// One line, when the log is on.
pub(crate) fn say(line: &str) {
    if enabled() {
        let tid = tiermem_core::process::pid();
        let _ = writeln!(std::io::stderr().lock(), "tiermem-h2m P#{tid}: --> {line}");
    }
}

fn list(nodes: &[u32], sep: &str) -> String {
    nodes
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(sep)
}

/// The nodes, the spaces' mapping and each node's view (the slides' "Mapping ..." and
/// "Resulting view ..." lines), and how devices were chosen.
pub(crate) fn mapping(topo: &Topology, map: &SpaceMap, notes: &[String]) {
    let with_memory: Vec<_> = topo.nodes.iter().filter(|n| n.total_bytes > 0).collect();
    say(&format!("Number of NUMA nodes: {}", with_memory.len()));
    for n in &with_memory {
        say(&format!(
            "NUMANode Idx={} - total={}KB",
            n.id,
            n.total_bytes / 1024
        ));
    }
    for s in &map.spaces {
        say(&format!(
            "Mapping {} -> {} ({}: {})",
            space_constant(s.space.name()),
            list(&s.nodes, ","),
            s.source,
            s.why
        ));
    }
    for v in &map.views {
        let mut line = format!("Source node {} - Sorted by distances:", v.node);
        for (n, d) in &v.by_distance {
            let _ = match d {
                Some(d) => write!(line, " (N: {n}, D: {d})"),
                None => write!(line, " (N: {n}, D: ?)"),
            };
        }
        say(&line);
        for s in Space::ALL {
            say(&format!(
                "Resulting view from numa node {} and memspace {}: {}",
                v.node,
                space_constant(s.name()),
                list(map.view(v.node, s).unwrap_or(&[]), " ")
            ));
        }
    }
    for n in notes.iter().chain(&map.notes) {
        say(n);
    }
}
