//! Thesis Listing 6.1: one thread writes an array while another evicts it. With guards,
//! eviction of a guarded object is refused, so no write is ever torn. The tests assert what
//! must hold whatever the schedule; the race they need is forced, not hoped for.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use tiermem_core::mechanism::Place;
use tiermem_core::Error;

use crate::two_tier;

#[test]
fn concurrent_eviction_never_tears_a_write() {
    let m = Arc::new(two_tier(1 << 20, 16 << 20, "lru"));
    let id = m.alloc(256 * 1024, Place::Fast).unwrap();
    let rounds = 200u32;
    let stop = Arc::new(AtomicBool::new(false));
    let start = Arc::new(Barrier::new(2));
    let evictor = {
        let (m, stop, start) = (m.clone(), stop.clone(), start.clone());
        std::thread::spawn(move || {
            start.wait();
            while !stop.load(Ordering::Relaxed) {
                match m.evict(id) {
                    Ok(()) | Err(Error::Pinned { .. }) => {}
                    Err(e) => panic!("evict: {e}"),
                }
                let _ = m.prefetch(id, true);
            }
        })
    };
    start.wait();
    let deadline = Instant::now() + Duration::from_secs(30);
    for round in 0..rounds {
        assert!(Instant::now() < deadline, "stress test hung");
        let v = (round % 251) as u8;
        {
            let mut g = m.write(id).unwrap();
            for chunk in g.as_mut_slice().chunks_mut(4096) {
                chunk.fill(v);
                std::thread::sleep(Duration::from_micros(20)); // widen the window an evictor would need
            }
            if round % 50 == 0 {
                // The race forced, not left to the scheduler: an eviction from another thread
                // while this guard is open is refused.
                let m2 = m.clone();
                let r = std::thread::spawn(move || m2.evict(id)).join().unwrap();
                assert!(matches!(r, Err(Error::Pinned { .. })), "{r:?}");
            }
        }
        let g = m.read(id).unwrap();
        assert!(
            g.as_slice().iter().all(|&b| b == v),
            "torn write in round {round}"
        );
    }
    stop.store(true, Ordering::Relaxed);
    evictor.join().unwrap();
    m.check().unwrap();
}

/// A long move to an emulated device does not serve its emulated time under the manager
/// lock: the stall is deferred past the lock (`DeferScope`), and `wait_until` refuses to stall
/// while this thread holds a manager lock (a panic, which would poison the manager). What is
/// asserted holds whatever the schedule: the eviction takes at least the device's time, and
/// the manager is neither poisoned nor inconsistent after evictions racing guard openings.
#[test]
fn emulated_delay_is_served_outside_the_manager_lock() {
    let m = Arc::new(
        tiermem_core::manager::Manager::new(
            vec![
                tiermem_core::device::Device::open("dram", 200 << 20).unwrap(),
                tiermem_core::device::Device::open("emulated:optane-pmem", 200 << 20).unwrap(),
            ],
            tiermem_core::policy::builtin("lru").unwrap(),
        )
        .unwrap(),
    );
    let big = m.alloc(128 << 20, Place::Fast).unwrap();
    let small = m.alloc(4096, Place::Fast).unwrap();
    m.write(big).unwrap().as_mut_slice().fill(1);
    let expected = m.devices()[1]
        .throttle
        .as_ref()
        .unwrap()
        .write_cost((128 << 20, 1, 2));
    let evictor = {
        let m = m.clone();
        std::thread::spawn(move || {
            let t = Instant::now();
            m.evict(big).unwrap();
            t.elapsed()
        })
    };
    for _ in 0..1000 {
        drop(m.read(small).unwrap());
    }
    let evict_time = evictor.join().unwrap();
    assert!(
        evict_time >= expected,
        "{evict_time:?} < emulated {expected:?}"
    );
    assert_eq!(m.read(big).unwrap().as_slice()[0], 1);
    m.check().unwrap();
}

/// `Manager::writeback` copies with no lock held while a writer writes and closes guards on
/// the same object and the owner frees objects mid-copy. Whatever the schedule: the last
/// write survives an eviction (a write during the copy leaves the object dirty), a free
/// during a copy is done when it ends (nothing leaks), and the manager stays consistent,
/// checked while copies run.
#[test]
fn write_back_outside_the_lock_against_writers_and_frees() {
    let m = Arc::new(two_tier(16 << 20, 64 << 20, "lru_in_place"));
    let id = m.alloc(8 << 20, Place::Fast).unwrap();
    assert!(m.in_fast(id).unwrap());
    let stop = Arc::new(AtomicBool::new(false));
    let start = Arc::new(Barrier::new(2));
    let behind = {
        let (m, stop, start) = (m.clone(), stop.clone(), start.clone());
        std::thread::spawn(move || {
            start.wait();
            let mut k = 0u32;
            while !stop.load(Ordering::Relaxed) {
                m.writeback(id).unwrap();
                k += 1;
                if k.is_multiple_of(16) {
                    // An object freed while its write-back copies.
                    let tmp = m.alloc(1 << 20, Place::Fast).unwrap();
                    m.write(tmp).unwrap().as_mut_slice().fill(1);
                    let m2 = m.clone();
                    let freer = std::thread::spawn(move || m2.free(tmp).unwrap());
                    let _ = m.writeback(tmp);
                    freer.join().unwrap();
                }
            }
        })
    };
    start.wait();
    let deadline = Instant::now() + Duration::from_secs(30);
    for round in 0..200u32 {
        assert!(Instant::now() < deadline, "stress test hung");
        // Two writes, the second likely during the write-back of the first; then evict (the
        // write-back holds it: retry) and read the slow copy.
        let v = (round % 250) as u8 + 1;
        m.write(id).unwrap().as_mut_slice().fill(v);
        // Force the race: wait (up to 5 ms) for the write-back to hold the object.
        let until = Instant::now() + Duration::from_millis(5);
        while m.placement(id).unwrap().pins == 0 && Instant::now() < until {
            std::hint::spin_loop();
        }
        m.write(id).unwrap().as_mut_slice().fill(v + 1);
        loop {
            match m.evict(id) {
                Ok(()) => break,
                Err(Error::Pinned { .. }) => std::thread::yield_now(),
                Err(e) => panic!("evict: {e}"),
            }
        }
        assert!(
            m.read(id).unwrap().as_slice().iter().all(|&b| b == v + 1),
            "a write was lost"
        );
        m.prefetch(id, true).unwrap();
        assert!(m.in_fast(id).unwrap(), "prefetched");
        // The invariants hold mid-copy too: a write-back's hold is counted as one.
        m.check().unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    behind.join().unwrap();
    m.free(id).unwrap();
    assert_eq!(
        m.object_count().unwrap(),
        0,
        "an object freed mid-copy leaked"
    );
    m.check().unwrap();
}
