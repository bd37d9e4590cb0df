//! Property tests of allocation by traits and of the memory-space mapping: whatever the
//! sequence of commits, trait updates, migrations and frees, no data is lost, a failed commit
//! allocates nothing, a migration reports where each object is, and the manager's
//! invariants hold; every node's view of a space is that space's nodes by distance.

use std::collections::BTreeMap;
use std::sync::Arc;

use proptest::prelude::*;
use tiermem_core::device::spaces::{map_spaces, Space};
use tiermem_core::sys::discover::{NumaNode, Topology};
use tiermem_core::traits::{Strategy as Claim, Traited, Traits};

use crate::two_tier;

const STRATEGIES: [Claim; 4] = [Claim::Fifo, Claim::Size, Claim::Priority, Claim::Gain];

#[derive(Debug, Clone)]
enum Op {
    Commit(Vec<(u64, u8, u8, bool)>, u8), // (KiB, space, priority, strict), strategy
    Update(usize, u8, u8),
    Migrate(u8, bool),
    Free(usize),
}

fn op() -> impl proptest::strategy::Strategy<Value = Op> {
    let decl = (1u64..300, 0u8..4, 0u8..20, any::<bool>());
    prop_oneof![
        4 => (prop::collection::vec(decl, 1..4), 0u8..4).prop_map(|(d, s)| Op::Commit(d, s)),
        2 => (any::<usize>(), 0u8..4, 0u8..20).prop_map(|(i, s, p)| Op::Update(i, s, p)),
        2 => (0u8..4, any::<bool>()).prop_map(|(s, all)| Op::Migrate(s, all)),
        1 => any::<usize>().prop_map(Op::Free),
    ]
}

fn traits(space: u8, prio: u8, strict: bool) -> Traits {
    let mut pairs = vec![
        ("priority".to_string(), prio.to_string()),
        ("gain".into(), (f64::from(prio) / 10.0).to_string()),
    ];
    if space < 3 {
        let key = if strict { "required" } else { "preferred" };
        pairs.push((key.into(), Space::ALL[space as usize].name().into()));
        if strict {
            pairs.push(("fallback".into(), "error".into()));
        }
    }
    Traits::from_pairs(&pairs).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn traits_never_lose_data(ops in prop::collection::vec(op(), 1..40)) {
        let m = Arc::new(two_tier(1 << 20, 4 << 20, "first_touch"));
        let t = Traited::new(m.clone());
        let mut live: Vec<(u64, u8)> = Vec::new(); // (object, fill byte)
        let mut fill = 0u8;
        for o in ops {
            match o {
                Op::Commit(decls, s) => {
                    let before = m.object_count().unwrap();
                    let d: Vec<(u64, Traits)> = decls.iter().map(|&(k, sp, p, st)| (k << 10, traits(sp, p, st))).collect();
                    match t.commit(&d, STRATEGIES[s as usize]) {
                        Ok(made) => {
                            prop_assert_eq!(made.len(), d.len());
                            for (id, dev) in made {
                                prop_assert_eq!(m.placement(id).unwrap().device, dev);
                                fill = fill.wrapping_add(1);
                                m.write(id).unwrap().as_mut_slice().fill(fill);
                                live.push((id, fill));
                            }
                        }
                        Err(_) => prop_assert_eq!(m.object_count().unwrap(), before),
                    }
                }
                Op::Update(i, sp, p) if !live.is_empty() => {
                    t.update_traits(live[i % live.len()].0, traits(sp, p, false)).unwrap();
                }
                Op::Migrate(s, all) => {
                    let only: Vec<u64> = live.iter().step_by(2).map(|x| x.0).collect();
                    let moved = t.apply_migration((!all).then_some(only.as_slice()), STRATEGIES[s as usize]).unwrap();
                    for r in &moved {
                        prop_assert_eq!(m.placement(r.object).unwrap().device, r.now);
                        prop_assert!(r.now == r.to || r.note.is_some());
                    }
                }
                Op::Free(i) if !live.is_empty() => {
                    let (id, _) = live.swap_remove(i % live.len());
                    m.free(id).unwrap();
                }
                _ => {}
            }
            m.check().map_err(TestCaseError::fail)?;
            for &(id, b) in &live {
                prop_assert!(m.read(id).unwrap().as_slice().iter().all(|&x| x == b));
            }
        }
    }

    #[test]
    fn views_are_each_space_by_distance(n in 1usize..7, seed in any::<u64>()) {
        let mut x = seed | 1;
        let mut next = |r: u64| { x ^= x << 13; x ^= x >> 7; x ^= x << 17; x % r };
        let mut d = vec![vec![10u32; n]; n];
        for (i, j) in (0..n).flat_map(|i| (i + 1..n).map(move |j| (i, j))) {
            let v = 11 + next(40) as u32;
            d[i][j] = v;
            d[j][i] = v;
        }
        let nodes: Vec<NumaNode> = (0..n)
            .map(|i| NumaNode {
                id: i as u32,
                total_bytes: (1 + next(8)) << 30,
                free_bytes: 0,
                cpus: if next(2) == 0 { String::new() } else { "0".into() },
                distances: d[i].clone(),
                memory_tier: Some(4 + 18 * next(2) as u32),
                declared: None,
            })
            .collect();
        let topo = Topology { nodes, mem_available: 0, thp: "never".into(), cpus: 1, last_level_cache: 0 };
        let map = map_spaces(&topo, &|_| None, &BTreeMap::new()).unwrap();
        prop_assert_eq!(map.views.len(), n);
        for s in Space::ALL {
            prop_assert!(!map.nodes(s).is_empty());
            for v in &map.views {
                let view = map.view(v.node, s).unwrap();
                let mut sorted = map.nodes(s).to_vec();
                sorted.sort_by_key(|&j| (d[v.node as usize][j as usize], j));
                prop_assert_eq!(view, sorted.as_slice());
            }
        }
    }
}
