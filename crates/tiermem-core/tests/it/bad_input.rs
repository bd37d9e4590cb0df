use tiermem_core::device::Device;
use tiermem_core::manager::Manager;
use tiermem_core::mechanism::Place;
use tiermem_core::policy;
use tiermem_core::Error;

use crate::{scratch, two_tier};

fn open_err(spec: &str, cap: u64) -> Error {
    Device::open(spec, cap).unwrap_err()
}

#[test]
fn bad_specs_and_sizes_are_named() {
    assert!(matches!(open_err("hbm", 1 << 20), Error::UnknownDevice(_)));
    assert!(
        matches!(open_err("emulated:quantum", 1 << 20), Error::UnknownDevice(m) if m.contains("optane-pmem"))
    );
    assert!(matches!(open_err("numa:999", 1 << 20), Error::UnknownDevice(m) if m.contains("999")));
    assert!(matches!(
        open_err("numa:x", 1 << 20),
        Error::InvalidArgument(_)
    ));
    assert!(matches!(
        open_err("block:", 1 << 20),
        Error::InvalidArgument(_)
    ));
    assert!(matches!(open_err("dram", 0), Error::InvalidArgument(m) if m.contains("zero")));
    assert!(
        matches!(open_err("dram", u64::MAX), Error::InvalidArgument(m) if m.contains("overflow"))
    );
    let e = open_err("dram", 1 << 50);
    assert!(
        matches!(&e, Error::InvalidArgument(m) if m.contains("larger than")),
        "{e}"
    );
}

#[test]
fn bad_paths_are_named() {
    let e = open_err("mapped:/nonexistent-dir/x", 1 << 20);
    assert!(
        matches!(&e, Error::Io { .. }) && e.to_string().contains("/nonexistent-dir/x"),
        "{e}"
    );
    let e = open_err("block:/nonexistent-dir/x", 1 << 20);
    assert!(matches!(&e, Error::Io { .. }), "{e}");
    if std::path::Path::new("/dev/shm").is_dir() {
        let e = open_err("block:/dev/shm/tiermem-test-block", 1 << 20);
        assert!(e.to_string().contains("tmpfs"), "{e}");
    }
    let e = open_err(&format!("block:{}/huge", scratch("bad").display()), 1 << 62);
    assert!(
        matches!(e, Error::DeviceFull { .. } | Error::InvalidArgument(_)),
        "{e}"
    );
}

#[test]
fn zero_and_oversized_objects_are_refused_and_manager_stays_consistent() {
    let m = two_tier(1 << 20, 4 << 20, "lru");
    assert!(matches!(
        m.alloc(0, Place::Fast),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        m.alloc(u64::MAX, Place::Fast),
        Err(Error::InvalidArgument(_) | Error::DeviceFull { .. })
    ));
    let e = m.alloc(64 << 20, Place::Fast).unwrap_err();
    assert!(e.to_string().contains("emulated:cxl"), "{e}");
    assert!(matches!(
        m.alloc(1, Place::Device(7)),
        Err(Error::InvalidArgument(_))
    ));
    assert_eq!(m.object_count().unwrap(), 0);
    m.check().unwrap();
}

#[test]
fn full_slow_device_leaves_object_in_place() {
    let m = two_tier(1 << 20, 64 << 10, "lru");
    let filler = m.alloc(60_000, Place::Slow).unwrap();
    let id = m.alloc(100_000, Place::Fast).unwrap();
    m.write(id).unwrap().as_mut_slice().fill(5);
    let e = m.evict(id).unwrap_err();
    assert!(matches!(e, Error::DeviceFull { .. }), "{e}");
    assert!(m.in_fast(id).unwrap());
    assert!(m.read(id).unwrap().as_slice().iter().all(|&b| b == 5));
    assert_eq!(m.stats()["dram"].evictions, 0);
    let _ = filler;
    m.check().unwrap();
}

#[test]
fn block_device_round_trips_and_guards_stage_its_data() {
    let dir = scratch("block");
    let spec = format!("block:{}/slow.bin", dir.display());
    for pol in ["lru", "all_slow", "first_touch"] {
        let m = Manager::new(
            vec![
                Device::open("dram", 4 << 20).unwrap(),
                Device::open(&spec, 16 << 20).unwrap(),
            ],
            policy::builtin(pol).unwrap(),
        )
        .unwrap();
        let id = m.alloc(3_000_001, Place::Slow).unwrap();
        assert_eq!(m.placement(id).unwrap().device, 1);
        {
            let mut g = m.write(id).unwrap();
            for (i, b) in g.as_mut_slice().iter_mut().enumerate() {
                *b = (i % 253) as u8;
            }
        }
        m.evict(id).unwrap();
        assert_eq!(m.placement(id).unwrap().device, 1, "{pol}");
        let g = m.read(id).unwrap();
        assert!(
            g.as_slice()
                .iter()
                .enumerate()
                .all(|(i, &b)| b == (i % 253) as u8),
            "{pol}"
        );
        drop(g);
        m.check().unwrap();
    }
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn first_device_must_be_memory_and_names_unique() {
    let dir = scratch("order");
    let spec = format!("block:{}/b.bin", dir.display());
    let e = Manager::new(
        vec![
            Device::open(&spec, 1 << 20).unwrap(),
            Device::open("dram", 1 << 20).unwrap(),
        ],
        policy::builtin("lru").unwrap(),
    )
    .err()
    .unwrap();
    assert!(e.to_string().contains("byte-addressable"), "{e}");
    let e = Manager::new(
        vec![
            Device::open("dram", 1 << 20).unwrap(),
            Device::open("dram", 1 << 20).unwrap(),
        ],
        policy::builtin("lru").unwrap(),
    )
    .err()
    .unwrap();
    assert!(e.to_string().contains("twice"), "{e}");
    assert!(policy::builtin("fifo").is_err());
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn guards_exclude_writers() {
    let m = two_tier(1 << 20, 4 << 20, "lru");
    let id = m.alloc(1000, Place::Fast).unwrap();
    let r = m.read(id).unwrap();
    let r2 = m.read(id).unwrap();
    assert!(matches!(m.write(id), Err(Error::Guard(_))));
    drop((r, r2));
    let w = m.write(id).unwrap();
    assert!(matches!(m.read(id), Err(Error::Guard(_))));
    drop(w);
    m.check().unwrap();
}

#[test]
fn data_manager_refuses_to_lose_a_primary_or_double_up_a_device() {
    let m = two_tier(1 << 20, 4 << 20, "lru");
    let id = m.alloc(1000, Place::Fast).unwrap();
    m.with_data(|dm, _| {
        let p = dm.primary(id)?;
        assert!(matches!(dm.free(p), Err(Error::InvalidArgument(msg)) if msg.contains("primary")));
        assert!(matches!(dm.allocate(0, 1000, id), Err(Error::InvalidArgument(msg)) if msg.contains("one region per device")));
        let r = dm.allocate(1, 1000, id)?.unwrap();
        dm.link(p, r)?;
        dm.free(r)?;
        assert!(dm.free(r).is_err(), "double free refused");
        Ok(())
    })
    .unwrap();
    m.check().unwrap();
}
