//! The 2LM model (moved from the model's unit tests: they reserve through the manager,
//! a floor above the model).

use std::sync::Arc;

use tiermem_core::device::Device;
use tiermem_core::manager::{reserve_model, Manager};
use tiermem_core::mechanism::Place;
use tiermem_core::model::{Access, Event, TwoLm, ACCESSES, EVENTS};
use tiermem_core::policy;

fn manager() -> Arc<Manager> {
    Arc::new(
        Manager::new(
            vec![
                Device::open("dram", 1 << 20).unwrap(),
                Device::open("emulated:optane-pmem", 4 << 20).unwrap(),
            ],
            policy::builtin("all_slow").unwrap(),
        )
        .unwrap(),
    )
}

fn model(cache: u64, line: usize) -> (Arc<Manager>, TwoLm) {
    let m = manager();
    let (t, _cache) = reserve_model(&m, 1, 0, cache, line).unwrap();
    (m, t)
}

#[test]
fn amplification_row_matches_table_2_2() {
    let sums: Vec<u64> = ACCESSES.iter().map(|a| a.iter().sum()).collect();
    assert_eq!(sums, vec![1, 3, 4, 2, 4, 5, 1]);
}

#[test]
fn events_follow_figure_2_3() {
    let (m, t) = model(4096, 64);
    let base = m.devices()[1].addr(0).unwrap();
    let at = |off: usize| base.wrapping_add(off).cast_const();
    let mut ev = [0; EVENTS];
    // Cold read: clean miss; again: hit.
    assert!(!t.access(at(0), 64, Access::Read, &mut ev));
    assert!(t.access(at(0), 64, Access::Read, &mut ev));
    // Write hit dirties the line; an aliasing read (same set, 4096 bytes on) is a dirty miss.
    assert!(t.access(at(0), 64, Access::Write, &mut ev));
    assert!(!t.access(at(4096), 64, Access::Read, &mut ev));
    // Read-modify-write of that clean line: hit + DDO; now dirty, so a write miss to the
    // first address evicts it dirty.
    assert!(t.access(at(4096), 64, Access::ReadModifyWrite, &mut ev));
    assert!(!t.access(at(0), 64, Access::Write, &mut ev));
    // A write miss over a clean set.
    assert!(!t.access(at(64), 64, Access::Write, &mut ev));
    assert_eq!(ev, [2, 1, 1, 1, 1, 1, 1]);
    let tr = t.traffic(&ev);
    assert_eq!(tr.slow_read, 4 * 64);
    assert_eq!(tr.slow_written, 2 * 64);
    t.charge(&ev, 1);
    let s = t.stats();
    assert_eq!(s.events, ev);
    // 2*1 + 3 + 4 + 2 + 4 + 5 + 1 accesses over 8 demand accesses.
    assert!((s.amplification - 21.0 / 8.0).abs() < 1e-12);
    assert_eq!(m.devices()[1].counters.snapshot().bytes_read, 4 * 64);
}

#[test]
fn ranges_span_lines_and_coarse_lines_count_whole() {
    let (m, t) = model(1 << 16, 256);
    let base = m.devices()[1].addr(0).unwrap().cast_const();
    let mut ev = [0; EVENTS];
    // 100 bytes from offset 200 touch lines 0 and 1 of 256 bytes.
    t.access(base.wrapping_add(200), 100, Access::Read, &mut ev);
    assert_eq!(ev[Event::ReadMissClean as usize], 2);
    assert_eq!(t.traffic(&ev).slow_read, 512);
}

#[test]
fn bad_configurations_are_refused() {
    let m = manager();
    for (cache, line, slow) in [(4096, 32, 1), (4096, 96, 1), (32, 64, 1), (4096, 64, 0)] {
        let e = reserve_model(&m, slow, 0, cache, line).err().unwrap();
        assert!(e.to_string().contains("2LM model"), "{e}");
    }
    // A cache larger than the fast device.
    assert!(reserve_model(&m, 1, 0, 2 << 20, 64).is_err());
}

#[test]
fn the_policy_charges_guards_on_both_devices() {
    let m = Manager::new(
        vec![
            Device::open("dram", 64 << 10).unwrap(),
            Device::open("emulated:optane-pmem", 1 << 20).unwrap(),
        ],
        policy::builtin("2lm_model").unwrap(),
    )
    .unwrap();
    let id = m.alloc(256 << 10, Place::Fast).unwrap();
    let before = m.devices()[1].counters.snapshot();
    m.write(id).unwrap().as_mut_slice().fill(3);
    let dram = m.devices()[0].counters.snapshot();
    let slow = m.devices()[1].counters.snapshot();
    // 4096 lines through 1024 sets, each read then written back (DDO): every line
    // misses; the first 1024 over empty sets, the other 3072 evict lines this pass
    // dirtied, which go back to the slow device.
    assert_eq!(dram.bytes_read, 256 << 10);
    assert_eq!(dram.bytes_written, 2 * (256 << 10));
    assert_eq!(slow.bytes_read - before.bytes_read, 256 << 10);
    assert_eq!(slow.bytes_written - before.bytes_written, 3 * (64 << 10));
    // Reading it back misses on every line again; only the first 1024 victims (the
    // last lines written) are dirty, and no dead data is known to the model.
    assert_eq!(m.read(id).unwrap().as_slice()[7], 3);
    let slow2 = m.devices()[1].counters.snapshot();
    assert_eq!(slow2.bytes_read - slow.bytes_read, 256 << 10);
    assert_eq!(slow2.bytes_written - slow.bytes_written, 64 << 10);
    assert!(policy::builtin("2lm_model:4096").is_ok());
    for bad in ["2lm_model:100", "2lm_model:x", "2lm_model:32"] {
        assert!(policy::builtin(bad).is_err(), "{bad}");
    }
}
