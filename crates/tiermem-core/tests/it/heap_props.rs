use proptest::prelude::*;
use tiermem_core::heap::{Disposition, Heap};

#[derive(Debug, Clone)]
enum Op {
    Alloc(u64),
    AllocAt(u64, u64),
    Free(usize),
    EvictFrom(u64, u64, u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (1u64..5000).prop_map(Op::Alloc),
        2 => (0u64..70000, 1u64..5000).prop_map(|(o, n)| Op::AllocAt(o, n)),
        3 => any::<usize>().prop_map(Op::Free),
        1 => (0u64..65536, 1u64..20000, any::<u8>()).prop_map(|(a, b, c)| Op::EvictFrom(a, b, c)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]
    #[test]
    fn heap_invariants_hold(ops in prop::collection::vec(op(), 1..120)) {
        let cap = 65536;
        let mut h = Heap::new(cap, 64);
        let mut live: Vec<(u64, u64)> = Vec::new(); // (offset, owner)
        let mut next = 1u64;
        for o in ops {
            match o {
                Op::Alloc(n) => {
                    let fits = h.largest_free() >= n.next_multiple_of(64);
                    match h.alloc(n, next) {
                        Some(off) => {
                            prop_assert!(fits);
                            // No overlap with any live block.
                            for &(lo, _) in &live {
                                let lb = h.block_at(lo).unwrap().1;
                                prop_assert!(off + n <= lo || lo + lb.size <= off);
                            }
                            live.push((off, next));
                            next += 1;
                        }
                        None => prop_assert!(!fits),
                    }
                }
                Op::AllocAt(at, n) => {
                    // Succeeds exactly when the span is aligned, inside the heap and free.
                    let size = n.next_multiple_of(64);
                    let free = at % 64 == 0
                        && h.block_at(at).is_some_and(|(bo, b)| b.owner.is_none() && at + size <= bo + b.size);
                    let used = h.used();
                    match h.alloc_at(at, n, next) {
                        Some(off) => {
                            prop_assert!(free);
                            prop_assert_eq!(off, at);
                            prop_assert_eq!(h.block_at(at).unwrap(), (at, tiermem_core::heap::Block { size, owner: Some(next) }));
                            prop_assert_eq!(h.used(), used + size);
                            live.push((off, next));
                            next += 1;
                        }
                        None => {
                            prop_assert!(!free);
                            prop_assert_eq!(h.used(), used);
                        }
                    }
                }
                Op::Free(i) if !live.is_empty() => {
                    let (off, _) = live.swap_remove(i % live.len());
                    prop_assert!(h.free(off).is_some());
                    prop_assert!(h.free(off).is_none(), "double free must be refused");
                }
                Op::Free(_) => {}
                Op::EvictFrom(start, size, keep_mask) => {
                    let mut evicted = Vec::new();
                    let got = h.evict_from::<()>(start, size, |off, owner| {
                        if owner % 4 == u64::from(keep_mask % 4) {
                            Ok(Disposition::Kept)
                        } else {
                            evicted.push(off);
                            Ok(Disposition::Evicted)
                        }
                    }).unwrap();
                    live.retain(|(o, _)| !evicted.contains(o));
                    if let Some(off) = got {
                        let (bo, b) = h.block_at(off).unwrap();
                        prop_assert_eq!(bo, off);
                        prop_assert!(b.owner.is_none() && b.size >= size.next_multiple_of(64));
                    }
                }
            }
            prop_assert_eq!(h.check(), Ok(()));
        }
        // No leak: freeing everything leaves one free block spanning the heap.
        for (off, _) in live {
            h.free(off).unwrap();
        }
        prop_assert_eq!(h.used(), 0);
        prop_assert_eq!(h.largest_free(), cap);
        prop_assert_eq!(h.iter().count(), 1);
    }
}

#[test]
fn best_fit_picks_the_smallest_hole() {
    let mut h = Heap::new(64 * 100, 64);
    let a = h.alloc(64 * 10, 1).unwrap();
    let _b = h.alloc(64, 2).unwrap();
    let c = h.alloc(64 * 3, 3).unwrap();
    let _d = h.alloc(64, 4).unwrap();
    h.free(a);
    h.free(c);
    // Holes of 10 and 3 lines: a 2-line request goes to the 3-line hole.
    assert_eq!(h.alloc(128, 5), Some(c));
}

#[test]
fn evict_from_walks_forward_and_coalesces() {
    let mut h = Heap::new(64 * 8, 64);
    let offs: Vec<u64> = (0..8).map(|i| h.alloc(64, i + 1).unwrap()).collect();
    let mut seen = Vec::new();
    let got = h
        .evict_from::<()>(offs[2], 64 * 3, |off, owner| {
            seen.push(off);
            Ok(if owner == 4 {
                Disposition::Kept
            } else {
                Disposition::Evicted
            })
        })
        .unwrap();
    // Block 2 evicted, block 3 (owner 4) pinned, then 4, 5, 6 evicted make 3 lines.
    assert_eq!(seen, vec![offs[2], offs[3], offs[4], offs[5], offs[6]]);
    assert_eq!(got, Some(offs[4]));
    assert_eq!(h.block_at(offs[4]).unwrap().1.size, 64 * 3);
    h.check().unwrap();
}

#[test]
fn evict_from_reports_when_everything_is_kept() {
    let mut h = Heap::new(64 * 4, 64);
    for i in 0..4 {
        h.alloc(64, i + 1).unwrap();
    }
    let got = h
        .evict_from::<()>(0, 128, |_, _| Ok(Disposition::Kept))
        .unwrap();
    assert_eq!(got, None);
    h.check().unwrap();
}
