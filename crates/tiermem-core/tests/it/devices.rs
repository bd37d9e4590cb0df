//! Device traits: what placement decisions read, the same whatever backs the device.

use tiermem_core::device::{Device, PROFILES};

use crate::scratch;

#[test]
fn traits_describe_each_kind() {
    let dram = Device::open("dram", 1 << 20).unwrap().traits();
    assert!(dram.byte_addressable && !dram.persistent && !dram.emulated);
    assert_eq!((dram.capacity, dram.numa_node), (1 << 20, None));

    let em = Device::open("emulated:optane-pmem", 1 << 20)
        .unwrap()
        .traits();
    assert!(em.byte_addressable && em.emulated && !em.persistent);
    let (r, w, l) = (
        em.read_gbps.unwrap(),
        em.write_gbps.unwrap(),
        em.latency_ns.unwrap(),
    );
    assert!(r > 0.0 && w > 0.0 && l > 0.0, "{em:?}");
    // The emulated device received the DRAM figures, so `dram` now knows them too, and
    // the stand-in is the profile's fractions of them. (Not `w < r`: that holds only while
    // this machine's measured DRAM writes are under 7/3 of its reads, and a noisy
    // measurement once gave 57 against 24 GB/s.)
    let dram = Device::open("dram", 1 << 20).unwrap().traits();
    let p = PROFILES.iter().find(|p| p.name == "optane-pmem").unwrap();
    let (dr, dw) = (dram.read_gbps.unwrap(), dram.write_gbps.unwrap());
    assert!((r / dr - p.read_ratio).abs() < 1e-9, "{em:?} over {dram:?}");
    assert!(
        (w / dw - p.write_ratio).abs() < 1e-9,
        "{em:?} over {dram:?}"
    );
    assert!(dr > r && dram.latency_ns.unwrap() < l, "{dram:?}");

    let d = scratch("traits");
    let blk = Device::open(&format!("block:{}/t.bin", d.display()), 1 << 20)
        .unwrap()
        .traits();
    assert!(!blk.byte_addressable && blk.persistent && !blk.emulated);
    assert_eq!(blk.read_gbps, None);
    std::fs::remove_dir_all(d).ok();
}
