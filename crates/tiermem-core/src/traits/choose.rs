//! Which of a manager's devices a trait set may use, in the order to try them: the memory
//! spaces over the manager's devices (from their [`DeviceTraits`]), then the traits' required,
//! preferred or inferred spaces.

use serde::Serialize;

use super::set::{Fallback, Traits};
use crate::device::spaces::{best, Space, SpaceMap};
use crate::device::DeviceTraits;
use crate::{Error, Result};

/// Each space's devices (indices, fastest first) over one manager's devices.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeviceSpaces {
    /// Device names, by index.
    pub names: Vec<String>,
    /// Per space (in [`Space::ALL`] order), its devices and why.
    pub spaces: Vec<(Space, Vec<usize>, String)>,
    /// Every device in the order to try them after the spaces' (the manager's, fastest
    /// first; a source node's view: nearest first).
    pub order: Vec<usize>,
}

impl DeviceSpaces {
    /// Map the spaces over devices with these traits (index order = the manager's, fastest
    /// first). A space whose figure some byte-addressable device lacks falls back to the
    /// manager's order: `hbw` and `low_lat` to the fastest device; `large_cap` is by capacity.
    #[must_use]
    pub fn of(names: Vec<String>, traits: &[DeviceTraits]) -> DeviceSpaces {
        let mem: Vec<usize> = (0..traits.len())
            .filter(|&i| traits[i].byte_addressable)
            .collect();
        let mem = if mem.is_empty() { vec![0] } else { mem };
        let by = |f: &dyn Fn(&DeviceTraits) -> Option<f64>| -> Option<Vec<(usize, f64)>> {
            mem.iter().map(|&i| Some((i, f(&traits[i])?))).collect()
        };
        let mut spaces = Vec::new();
        for s in Space::ALL {
            let (ids, why) = match s {
                Space::LargeCap => (
                    best(
                        &mem.iter()
                            .map(|&i| (i, traits[i].capacity as f64))
                            .collect::<Vec<_>>(),
                    ),
                    "largest capacity".to_owned(),
                ),
                Space::Hbw => match by(&|t| t.read_gbps) {
                    Some(v) => (best(&v), "highest read bandwidth".to_owned()),
                    None => (
                        vec![mem[0]],
                        "no bandwidth for every device: the fastest".to_owned(),
                    ),
                },
                Space::LowLat => match by(&|t| t.latency_ns.map(|l| -l)) {
                    Some(v) => (best(&v), "lowest latency".to_owned()),
                    None => (
                        vec![mem[0]],
                        "no latency for every device: the fastest".to_owned(),
                    ),
                },
            };
            spaces.push((s, ids, why));
        }
        let order = (0..names.len()).collect();
        DeviceSpaces {
            names,
            spaces,
            order,
        }
    }

    /// The spaces over devices that stand for NUMA nodes (`nodes[i]` is device `i`'s node),
    /// as the machine's space map `map` gives them: each space's devices in the order of
    /// `source`'s view (the node a thread runs on: nearest first, as H2M's per-node lists),
    /// or by device index when `source` is None or has no view; devices outside every
    /// space keep their index order after the others.
    #[must_use]
    pub fn of_nodes(
        names: Vec<String>,
        nodes: &[u32],
        map: &SpaceMap,
        source: Option<u32>,
    ) -> DeviceSpaces {
        let index = |n: u32| nodes.iter().position(|&x| x == n);
        let view = source.and_then(|s| map.views.iter().find(|v| v.node == s));
        let mut spaces = Vec::new();
        for s in Space::ALL {
            let ns: Vec<u32> = match view.and_then(|_| map.view(source?, s)) {
                Some(v) => v.to_vec(),
                None => map.nodes(s).to_vec(),
            };
            let ids: Vec<usize> = ns.into_iter().filter_map(index).collect();
            let why = map
                .spaces
                .iter()
                .find(|x| x.space == s)
                .map_or_else(String::new, |x| format!("{} ({})", x.source, x.why));
            spaces.push((s, ids, why));
        }
        let mut order: Vec<usize> = match view {
            Some(v) => v
                .by_distance
                .iter()
                .filter_map(|(n, _)| index(*n))
                .collect(),
            None => Vec::new(),
        };
        for d in 0..names.len() {
            if !order.contains(&d) {
                order.push(d);
            }
        }
        DeviceSpaces {
            names,
            spaces,
            order,
        }
    }

    /// The devices of `space`.
    #[must_use]
    pub fn devices(&self, space: Space) -> &[usize] {
        self.spaces
            .iter()
            .find(|(s, _, _)| *s == space)
            .map_or(&[], |(_, d, _)| d)
    }

    fn named(&self, ds: &[usize]) -> String {
        let n: Vec<&str> = ds.iter().map(|&d| self.names[d].as_str()).collect();
        format!("[{}]", n.join(", "))
    }

    /// The devices of the space `t` names (every required space's, else the first
    /// preferred space's, else the sensitivities': `hbw`, then `low_lat`), in this map's
    /// order; every device (in [`DeviceSpaces::order`]) when it names none. What a
    /// partitioned allocation spreads over.
    #[must_use]
    pub fn space_devices(&self, t: &Traits) -> Vec<usize> {
        let space = t.required.first().or(t.preferred.first()).copied().or(
            match (t.bandwidth_sensitive, t.latency_sensitive) {
                (true, _) => Some(Space::Hbw),
                (false, true) => Some(Space::LowLat),
                _ => None,
            },
        );
        match space {
            Some(s) => self
                .devices(s)
                .iter()
                .copied()
                .filter(|d| t.required.iter().all(|&r| self.devices(r).contains(d)))
                .collect(),
            None => self.order.clone(),
        }
    }

    /// The devices `t` allows, in the order to try them: with `required`, the devices in
    /// every required space, then (fallback `next_best`) the rest of the preferred and
    /// required spaces' devices and every other device, fastest first; without, the
    /// preferred spaces' devices in the given order (else the space the sensitivities name:
    /// bandwidth `hbw`, latency `low_lat`, both `hbw` then `low_lat`), then every other.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the required spaces share no device and the fallback
    /// is `error`, naming each space's devices.
    pub fn candidates(&self, t: &Traits) -> Result<Vec<usize>> {
        let n = self.names.len();
        let mut out: Vec<usize> = Vec::new();
        let push = |d: usize, out: &mut Vec<usize>| {
            if !out.contains(&d) {
                out.push(d);
            }
        };
        if !t.required.is_empty() {
            let all: Vec<usize> = self
                .devices(t.required[0])
                .iter()
                .copied()
                .filter(|d| t.required.iter().all(|&s| self.devices(s).contains(d)))
                .collect();
            if all.is_empty() && t.fallback == Fallback::Error {
                let each: Vec<String> = t
                    .required
                    .iter()
                    .map(|&s| format!("{} = {}", s.name(), self.named(self.devices(s))))
                    .collect();
                return Err(Error::InvalidArgument(format!(
                    "required spaces {} share no device ({}); devices: {}",
                    t.required
                        .iter()
                        .map(|s| s.name())
                        .collect::<Vec<_>>()
                        .join(" and "),
                    each.join(", "),
                    self.named(&(0..n).collect::<Vec<_>>())
                )));
            }
            for d in all {
                push(d, &mut out);
            }
            if t.fallback == Fallback::Error {
                return Ok(out);
            }
        }
        let mut wanted = t.preferred.clone();
        if wanted.is_empty() {
            if t.bandwidth_sensitive {
                wanted.push(Space::Hbw);
            }
            if t.latency_sensitive {
                wanted.push(Space::LowLat);
            }
        }
        wanted.extend(t.required.iter().copied());
        for s in wanted {
            for &d in self.devices(s) {
                push(d, &mut out);
            }
        }
        for &d in &self.order {
            push(d, &mut out);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev(capacity: u64, gbps: f64, ns: f64) -> DeviceTraits {
        DeviceTraits {
            reach: crate::device::Reach::Host,
            host_accessible: true,
            alignment: crate::device::MEMORY_ALIGN,
            byte_addressable: true,
            capacity,
            persistent: false,
            emulated: false,
            duplex: false,
            numa_node: None,
            read_gbps: Some(gbps),
            write_gbps: None,
            latency_ns: Some(ns),
        }
    }

    /// KNL-like: MCDRAM (fast, small, higher latency), DDR (large, lowest latency).
    fn knl() -> DeviceSpaces {
        DeviceSpaces::of(
            vec!["mcdram".into(), "ddr".into()],
            &[dev(16 << 30, 400.0, 154.0), dev(96 << 30, 90.0, 130.0)],
        )
    }

    fn traits(pairs: &[(&str, &str)]) -> Traits {
        Traits::from_pairs(pairs).unwrap()
    }

    #[test]
    fn spaces_over_devices() {
        let s = knl();
        assert_eq!(s.devices(Space::Hbw), &[0]);
        assert_eq!(s.devices(Space::LowLat), &[1]);
        assert_eq!(s.devices(Space::LargeCap), &[1]);
    }

    #[test]
    fn candidates_follow_required_preferred_and_sensitivity() {
        let s = knl();
        assert_eq!(s.candidates(&traits(&[])).unwrap(), vec![0, 1]);
        assert_eq!(
            s.candidates(&traits(&[("preferred", "low_lat")])).unwrap(),
            vec![1, 0]
        );
        assert_eq!(
            s.candidates(&traits(&[("sensitivity", "latency")]))
                .unwrap(),
            vec![1, 0]
        );
        assert_eq!(
            s.candidates(&traits(&[("required", "large_cap")])).unwrap(),
            vec![1, 0]
        );
        let strict = traits(&[("required", "large_cap"), ("fallback", "error")]);
        assert_eq!(s.candidates(&strict).unwrap(), vec![1]);
    }

    #[test]
    fn contradictory_requirements_name_the_spaces_and_devices() {
        let s = knl();
        let t = traits(&[("required", "hbw|large_cap"), ("fallback", "error")]);
        let e = s.candidates(&t).unwrap_err().to_string();
        assert!(
            e.contains("required spaces hbw and large_cap share no device (hbw = [mcdram], large_cap = [ddr])"),
            "{e}"
        );
        // With the default fallback the same set places on the required spaces' devices.
        let t = traits(&[("required", "hbw|large_cap")]);
        assert_eq!(s.candidates(&t).unwrap(), vec![0, 1]);
    }
}
