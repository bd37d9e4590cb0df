use tiermem_core::mechanism::Place;
use tiermem_core::Error;

use crate::two_tier;

fn stat(m: &tiermem_core::manager::Manager, dev: &str) -> tiermem_core::counters::CounterSnapshot {
    m.stats()[dev]
}

#[test]
fn clean_eviction_is_elided_and_slow_sibling_retained() {
    let m = two_tier(1 << 20, 8 << 20, "lru");
    let id = m.alloc(100_000, Place::Slow).unwrap();
    m.write(id).unwrap().as_mut_slice().fill(3); // lru brings it to fast on access
    assert!(m.in_fast(id).unwrap());
    m.evict(id).unwrap(); // dirty: written back
    assert_eq!(stat(&m, "dram").dirty_writebacks, 1);
    m.prefetch(id, false).unwrap();
    let p = m.placement(id).unwrap();
    assert_eq!(
        (p.device, p.siblings.clone(), p.dirty),
        (0, vec![1], false),
        "slow sibling kept"
    );
    let written = stat(&m, "emulated:cxl").bytes_written;
    m.evict(id).unwrap(); // clean: nothing copied
    assert_eq!(stat(&m, "dram").writebacks_elided, 1);
    assert_eq!(stat(&m, "emulated:cxl").bytes_written, written);
    assert!(m.read(id).unwrap().as_slice().iter().all(|&b| b == 3));
    m.check().unwrap();
}

#[test]
fn freed_data_is_never_written_back() {
    let m = two_tier(1 << 20, 8 << 20, "lru");
    let id = m.alloc(500_000, Place::Fast).unwrap();
    m.write(id).unwrap().as_mut_slice().fill(1);
    m.free(id).unwrap();
    assert_eq!(stat(&m, "emulated:cxl").bytes_written, 0);
    let u = &m.usage().unwrap()[0];
    assert_eq!((u.used, u.peak), (0, 500_032));
}

#[test]
fn lru_evicts_least_recent_first_and_softevict_jumps_the_queue() {
    let m = two_tier(64 * 1024, 8 << 20, "lru");
    let a = m.alloc(20_000, Place::Fast).unwrap();
    let b = m.alloc(20_000, Place::Fast).unwrap();
    let c = m.alloc(20_000, Place::Fast).unwrap();
    m.read_use(a).unwrap(); // b is now least recent
    let d = m.alloc(20_000, Place::Fast).unwrap();
    assert!(m.in_fast(a).unwrap() && m.in_fast(d).unwrap());
    assert!(!m.in_fast(b).unwrap(), "least recently used object evicted");
    m.softevict(d).unwrap();
    m.read_use(c).unwrap();
    let e = m.alloc(20_000, Place::Fast).unwrap();
    assert!(m.in_fast(e).unwrap());
    assert!(!m.in_fast(d).unwrap(), "softevicted object goes first");
    m.check().unwrap();
}

#[test]
fn softevicted_objects_leave_in_the_order_they_were_marked() {
    let m = two_tier(64 * 1024, 8 << 20, "lru");
    let a = m.alloc(20_000, Place::Fast).unwrap();
    let b = m.alloc(20_000, Place::Fast).unwrap();
    let c = m.alloc(20_000, Place::Fast).unwrap();
    for id in [b, a, c] {
        m.softevict(id).unwrap();
    }
    m.alloc(20_000, Place::Fast).unwrap();
    assert!(!m.in_fast(b).unwrap(), "marked first, evicted first");
    assert!(m.in_fast(a).unwrap() && m.in_fast(c).unwrap());
    m.alloc(20_000, Place::Fast).unwrap();
    assert!(!m.in_fast(a).unwrap() && m.in_fast(c).unwrap());
    m.check().unwrap();
}

#[test]
fn forced_prefetch_fails_clearly_when_only_pinned_data_is_in_the_way() {
    let m = two_tier(64 * 1024, 8 << 20, "lru");
    let a = m.alloc(60_000, Place::Fast).unwrap();
    let b = m.alloc(60_000, Place::Slow).unwrap();
    let g = m.read(a).unwrap();
    let err = m.prefetch(b, true).unwrap_err();
    assert!(matches!(err, Error::AllPinned { .. }), "{err}");
    assert!(err.to_string().contains("pinned"), "{err}");
    assert!(matches!(m.evict(a), Err(Error::Pinned { .. })));
    assert!(matches!(m.free(a), Err(Error::Pinned { .. })));
    drop(g);
    m.prefetch(b, true).unwrap();
    assert!(m.in_fast(b).unwrap() && !m.in_fast(a).unwrap());
    m.check().unwrap();
}

#[test]
fn first_touch_fills_fast_in_order_and_never_moves() {
    let m = two_tier(64 * 1024, 8 << 20, "first_touch");
    let ids: Vec<u64> = (0..5)
        .map(|_| m.alloc(20_000, Place::Auto).unwrap())
        .collect();
    let devs: Vec<usize> = ids
        .iter()
        .map(|&i| m.placement(i).unwrap().device)
        .collect();
    assert_eq!(devs, vec![0, 0, 0, 1, 1]);
    m.prefetch(ids[4], true).unwrap();
    m.write(ids[4]).unwrap().as_mut_slice().fill(9);
    assert_eq!(m.placement(ids[4]).unwrap().device, 1);
}

#[test]
fn all_fast_and_all_slow_place_as_named() {
    let fast = two_tier(64 * 1024, 8 << 20, "all_fast");
    fast.alloc(60_000, Place::Auto).unwrap();
    assert!(matches!(
        fast.alloc(60_000, Place::Auto),
        Err(Error::DeviceFull { .. })
    ));
    let slow = two_tier(64 * 1024, 8 << 20, "all_slow");
    let id = slow.alloc(60_000, Place::Auto).unwrap();
    slow.write(id).unwrap().as_mut_slice().fill(2);
    assert_eq!(slow.placement(id).unwrap().device, 1);
}

#[test]
fn copies_are_counted_per_device_and_direction() {
    let m = two_tier(1 << 20, 8 << 20, "lru");
    let id = m.alloc(300_000, Place::Fast).unwrap();
    m.write(id).unwrap();
    m.evict(id).unwrap();
    let s = m.stats();
    assert_eq!(s["dram"].bytes_read, 300_000);
    assert_eq!(s["emulated:cxl"].bytes_written, 300_000);
    assert_eq!((s["dram"].moves_out, s["emulated:cxl"].moves_in), (1, 1));
    assert_eq!(s["dram"].evictions, 1);
    m.reset_stats().unwrap();
    assert_eq!(m.stats()["dram"].bytes_read, 0);
}

#[test]
fn kernel_traffic_is_counted_and_throttled_on_emulated_devices() {
    let m = two_tier(1 << 20, 64 << 20, "lru");
    let slow = &m.devices()[1];
    let t = slow.throttle.as_ref().unwrap();
    let bytes = 32u64 << 20;
    let expect = t.read_cost((bytes, 1, 0));
    let start = std::time::Instant::now();
    slow.charge_read((bytes, 1, 0));
    let took = start.elapsed();
    assert!(took >= expect, "{took:?} < {expect:?}");
    assert!(
        took < expect * 2 + std::time::Duration::from_millis(20),
        "{took:?}"
    );
    slow.charge_write((1000, 1, 1));
    let s = m.stats()["emulated:cxl"];
    assert_eq!((s.bytes_read, s.bytes_written), (bytes, 1000));
    // Real devices count but never wait.
    let fast = &m.devices()[0];
    let start = std::time::Instant::now();
    fast.charge_read((1 << 30, 1, 0));
    assert!(start.elapsed() < std::time::Duration::from_millis(5));
    assert_eq!(m.stats()["dram"].bytes_read, 1 << 30);
}

#[test]
fn lru_in_place_uses_data_where_it_lives_and_still_allocates_fast() {
    let m = two_tier(1 << 20, 8 << 20, "lru_in_place");
    assert_eq!(m.policy_name(), "lru_in_place");
    let slow = m.alloc(100_000, Place::Slow).unwrap();
    m.write(slow).unwrap().as_mut_slice().fill(7);
    assert!(!m.in_fast(slow).unwrap(), "a guard does not move it");
    let fresh = m.alloc(100_000, Place::Auto).unwrap();
    assert!(m.in_fast(fresh).unwrap(), "new objects go to fast memory");
    m.prefetch(slow, true).unwrap(); // an explicit hint still moves it
    assert!(m.in_fast(slow).unwrap());
    assert!(m.read(slow).unwrap().as_slice().iter().all(|&b| b == 7));
    m.check().unwrap();
}

#[test]
fn charge_counts_operand_bytes_where_they_live() {
    let m = two_tier(1 << 20, 8 << 20, "lru_in_place");
    let fast = m.alloc(4096, Place::Fast).unwrap();
    let slow = m.alloc(8192, Place::Slow).unwrap();
    m.charge(&[(fast, 100, 200), (slow, 300, 400)], 2).unwrap();
    assert_eq!(
        (stat(&m, "dram").bytes_read, stat(&m, "dram").bytes_written),
        (100, 200)
    );
    let s = stat(&m, "emulated:cxl");
    assert_eq!((s.bytes_read, s.bytes_written), (300, 400));
    assert!(
        m.charge(&[(999_999, 1, 1)], 1).is_err(),
        "an unknown object is an error"
    );
}

#[test]
fn the_2lm_model_does_its_own_charging() {
    let m = two_tier(1 << 20, 8 << 20, "2lm_model");
    let id = m.alloc(4096, Place::Auto).unwrap();
    let before = m.stats();
    m.charge(&[(id, 4096, 4096)], 1).unwrap();
    assert_eq!(
        m.stats(),
        before,
        "guards already ran the bytes through the model"
    );
}

#[test]
fn writeback_cleans_ahead_so_eviction_copies_nothing() {
    let m = two_tier(1 << 20, 8 << 20, "lru_in_place");
    let id = m.alloc(100_000, Place::Fast).unwrap();
    m.write(id).unwrap().as_mut_slice().fill(5);
    assert!(m.writeback(id).unwrap(), "dirty: copied");
    let p = m.placement(id).unwrap();
    assert_eq!((p.device, p.siblings.clone(), p.dirty), (0, vec![1], false));
    assert!(!m.writeback(id).unwrap(), "clean: nothing to do");
    let written = stat(&m, "emulated:cxl").bytes_written;
    m.evict(id).unwrap();
    assert_eq!(
        stat(&m, "emulated:cxl").bytes_written,
        written,
        "eviction elided"
    );
    assert!(m.read(id).unwrap().as_slice().iter().all(|&b| b == 5));
    // Written again after the write-back: the sibling is stale and is replaced.
    m.prefetch(id, true).unwrap();
    m.write(id).unwrap().as_mut_slice().fill(6);
    assert!(m.writeback(id).unwrap());
    m.evict(id).unwrap();
    assert!(m.read(id).unwrap().as_slice().iter().all(|&b| b == 6));
    // An object under a write guard is left alone.
    let w = m.alloc(4096, Place::Fast).unwrap();
    let g = m.write(w).unwrap();
    assert!(!m.writeback(w).unwrap());
    drop(g);
    m.check().unwrap();
}

#[test]
fn planned_places_as_asked_and_moves_only_when_told() {
    let m = two_tier(64 * 1024, 8 << 20, "planned");
    let a = m.alloc(40_000, Place::Fast).unwrap();
    let b = m.alloc(40_000, Place::Slow).unwrap();
    assert!(m.in_fast(a).unwrap() && !m.in_fast(b).unwrap());
    // Accesses never move anything, and a prefetch that does not fit evicts nothing.
    m.write(b).unwrap().as_mut_slice().fill(7);
    m.prefetch(b, true).unwrap();
    assert!(m.in_fast(a).unwrap() && !m.in_fast(b).unwrap());
    // A fast allocation that does not fit goes to the next device with room.
    let c = m.alloc(40_000, Place::Fast).unwrap();
    assert!(!m.in_fast(c).unwrap());
    // Told to: evict a (dirty: written home), then prefetch b (its slow copy stays linked).
    m.write(a).unwrap().as_mut_slice().fill(1);
    m.evict(a).unwrap();
    m.prefetch(b, false).unwrap();
    assert!(!m.in_fast(a).unwrap() && m.in_fast(b).unwrap());
    let p = m.placement(b).unwrap();
    assert_eq!((p.device, p.siblings.clone(), p.dirty), (0, vec![1], false));
    let written = stat(&m, "emulated:cxl").bytes_written;
    m.evict(b).unwrap(); // clean: nothing copied
    assert_eq!(stat(&m, "emulated:cxl").bytes_written, written);
    assert!(m.read(a).unwrap().as_slice().iter().all(|&x| x == 1));
    assert!(m.read(b).unwrap().as_slice().iter().all(|&x| x == 7));
    m.check().unwrap();
}

#[test]
fn op_open_places_each_output_where_asked() {
    use tiermem_core::manager::OpRequest;
    use tiermem_core::mechanism::GuardUse;
    let m = two_tier(1 << 20, 8 << 20, "planned");
    let x = m.alloc(4096, Place::Fast).unwrap();
    let o = m
        .op_open(&OpRequest {
            inputs: &[(x, GuardUse::Read)],
            outputs: &[4096, 8192],
            places: &[Place::Slow, Place::Fast],
            ..OpRequest::default()
        })
        .unwrap();
    m.op_close(&o.tickets, &[], 1, &[], &[]).unwrap();
    assert!(!m.in_fast(o.outputs[0]).unwrap() && m.in_fast(o.outputs[1]).unwrap());
    let err = m
        .op_open(&OpRequest {
            outputs: &[4096, 4096],
            places: &[Place::Fast, Place::Fast, Place::Slow],
            ..OpRequest::default()
        })
        .unwrap_err();
    assert!(err.to_string().contains("3 places for 2 outputs"), "{err}");
    m.check().unwrap();
}

#[test]
fn planned_follows_offsets_and_counts_misses() {
    use tiermem_core::manager::OpRequest;
    use tiermem_core::mechanism::GuardUse;
    let m = two_tier(1 << 20, 8 << 20, "planned");
    // Outputs made at the offsets asked for, in reverse address order.
    let o = m
        .op_open(&OpRequest {
            outputs: &[4096, 4096],
            places: &[Place::Fast],
            offsets: &[Some(65536), Some(0)],
            ..OpRequest::default()
        })
        .unwrap();
    m.op_close(&o.tickets, &[], 1, &[], &[]).unwrap();
    let (a, b) = (o.outputs[0], o.outputs[1]);
    let addr = |id| m.read(id).unwrap().as_slice().as_ptr() as usize;
    assert_eq!(addr(a) - addr(b), 65536);
    let misses = |m: &tiermem_core::manager::Manager| {
        let s = m.policy_stats_json().unwrap().unwrap();
        s.split("\"offset_misses\": ")
            .nth(1)
            .unwrap()
            .trim_end_matches('}')
            .trim()
            .parse::<u64>()
            .unwrap()
    };
    assert_eq!(misses(&m), 0);
    // A taken span: made elsewhere in fast memory, and counted.
    let c = m
        .op_open(&OpRequest {
            outputs: &[4096],
            places: &[Place::Fast],
            offsets: &[Some(2048)],
            ..OpRequest::default()
        })
        .unwrap();
    m.op_close(&c.tickets, &[], 1, &[], &[]).unwrap();
    assert!(m.in_fast(c.outputs[0]).unwrap());
    assert_eq!(misses(&m), 1);
    // A planned prefetch lands at its offset; one into a taken span goes elsewhere.
    let s = m.alloc(4096, Place::Slow).unwrap();
    m.write(s).unwrap().as_mut_slice().fill(3);
    assert_eq!(m.plan_moves(&[(s, Some(131_072))], &[a]).unwrap(), 0);
    assert_eq!(addr(s) - addr(b), 131_072);
    assert!(m.read(s).unwrap().as_slice().iter().all(|&x| x == 3));
    let t = m.alloc(4096, Place::Slow).unwrap();
    assert_eq!(m.plan_moves(&[(t, Some(131_072))], &[]).unwrap(), 0);
    assert_eq!(misses(&m), 2);
    // An unaligned offset is a miss, not an error.
    let u = m
        .op_open(&OpRequest {
            outputs: &[64],
            places: &[Place::Fast],
            offsets: &[Some(7)],
            ..OpRequest::default()
        })
        .unwrap();
    m.op_close(&u.tickets, &[], 1, &[], &[]).unwrap();
    assert_eq!(misses(&m), 3);
    let _ = GuardUse::Read;
    m.check().unwrap();
}

#[test]
fn a_plans_moves_ride_on_the_ops_two_calls() {
    use tiermem_core::manager::{Moves, MovesDone, OpRequest};
    use tiermem_core::mechanism::GuardUse;
    let m = two_tier(1 << 20, 8 << 20, "planned");
    let (a, b) = (
        m.alloc(4096, Place::Fast).unwrap(),
        m.alloc(4096, Place::Slow).unwrap(),
    );
    m.write(b).unwrap().as_mut_slice().fill(5);
    let gone = m.alloc(64, Place::Slow).unwrap();
    m.free(gone).unwrap();
    // Before the op: `a` leaves fast memory, `b` comes in at offset 0; a freed object is
    // one refusal, and the rest still run.
    let o = m
        .op_open(&OpRequest {
            inputs: &[(b, GuardUse::Read)],
            outputs: &[4096],
            places: &[Place::Fast],
            moves: Moves {
                prefetch: &[(b, Some(0)), (gone, None)],
                evict: &[a],
            },
            ..OpRequest::default()
        })
        .unwrap();
    assert_eq!(
        o.moves,
        MovesDone {
            missed: 0,
            refused: 1
        }
    );
    assert!(!m.in_fast(a).unwrap() && m.in_fast(b).unwrap());
    assert_eq!(o.addrs[0], m.read(b).unwrap().as_slice().as_ptr() as usize);
    // After it, in the closing call: `b` and the output leave (once unpinned); evicting
    // the freed object is refused and counted.
    let out = o.outputs[0];
    let refused = m
        .op_close(&o.tickets, &[], 1, &[], &[b, gone, out])
        .unwrap();
    assert_eq!(refused, 1);
    assert!(!m.in_fast(b).unwrap() && !m.in_fast(out).unwrap());
    assert!(m.read(b).unwrap().as_slice().iter().all(|&x| x == 5));
    m.check().unwrap();
}

#[test]
fn the_mover_prefetches_and_writes_back_without_the_caller_waiting() {
    use std::sync::Arc;
    use tiermem_core::manager::{Move, Mover, MoverCounts};
    let m = Arc::new(two_tier(1 << 20, 8 << 20, "lru_in_place"));
    let s = m.alloc(4096, Place::Slow).unwrap();
    m.write(s).unwrap().as_mut_slice().fill(9);
    let f = m.alloc(4096, Place::Fast).unwrap();
    m.write(f).unwrap().as_mut_slice().fill(4); // dirty in fast memory
    let gone = m.alloc(64, Place::Slow).unwrap();
    m.free(gone).unwrap();
    let mut mover = Mover::start(m.clone()).unwrap();
    mover.push(Move::Prefetch(s));
    mover.push(Move::Writeback(f));
    mover.push(Move::Prefetch(gone));
    mover.stop(); // after the queued requests
    assert_eq!(
        mover.counts(),
        MoverCounts {
            prefetched: 1,
            written_back: 1,
            skipped: 1
        }
    );
    assert!(m.in_fast(s).unwrap());
    assert!(m.read(s).unwrap().as_slice().iter().all(|&x| x == 9));
    mover.push(Move::Prefetch(f)); // ignored once stopped
    assert_eq!(mover.counts().prefetched, 1);
    drop(mover);
    m.check().unwrap();
}

#[test]
fn a_followed_trace_prefetches_the_next_ops_operands_from_slow_memory() {
    use std::sync::Arc;
    use tiermem_core::manager::{Mover, OpRequest, TraceFollower, TraceOp};
    use tiermem_core::mechanism::GuardUse;
    let m = Arc::new(two_tier(1 << 20, 8 << 20, "lru_in_place"));
    let a = m.alloc(4096, Place::Fast).unwrap();
    let b = m.alloc(4096, Place::Slow).unwrap(); // read by op 1 of each iteration
    let mut mover = Mover::start(m.clone()).unwrap();
    let f = TraceFollower::new(1, 1 << 20, mover.sender().unwrap());
    assert!(m.follow_trace(Some(f)).unwrap().is_none());
    let step = |pos: u32, name: u32, x| {
        let o = m
            .op_open(&OpRequest {
                inputs: &[(x, GuardUse::Read)],
                outputs: &[4096],
                places: &[Place::Fast],
                trace: Some(TraceOp {
                    pos,
                    name,
                    softening: false,
                }),
                ..OpRequest::default()
            })
            .unwrap();
        m.op_close(&o.tickets, &[], 1, &[], &[]).unwrap();
        m.free(o.outputs[0]).unwrap();
    };
    for _ in 0..2 {
        m.trace_iteration().unwrap();
        step(0, 1, a);
        step(1, 2, b);
    }
    let counts = m.trace_counts().unwrap().unwrap();
    assert_eq!((counts.queued, counts.mismatches), (1, 0), "{counts:?}");
    // The manager still holds a sender: stopping must not wait for it.
    mover.stop();
    assert_eq!(mover.counts().prefetched, 1);
    assert!(
        m.in_fast(b).unwrap(),
        "op 1's operand was prefetched at op 0"
    );
    assert_eq!(m.follow_trace(None).unwrap(), Some(counts));
    m.check().unwrap();
}
