//! Integration tests of the core: property tests, stress tests, bad input.

mod bad_input;
mod devices;
mod heap_props;
mod lock_order;
mod manager_props;
mod model;
mod model_check;
mod policies;
mod torn_write;

use tiermem_core::device::Device;
use tiermem_core::manager::Manager;
use tiermem_core::policy;

/// A manager over DRAM of `fast` bytes and emulated PM of `slow` bytes.
pub fn two_tier(fast: u64, slow: u64, pol: &str) -> Manager {
    Manager::new(
        vec![
            Device::open("dram", fast).unwrap(),
            Device::open("emulated:cxl", slow).unwrap(),
        ],
        policy::builtin(pol).unwrap(),
    )
    .unwrap()
}

/// A fresh scratch directory on the disk (not tmpfs).
pub fn scratch(tag: &str) -> std::path::PathBuf {
    let base = std::env::var_os("CARGO_TARGET_TMPDIR").map_or_else(std::env::temp_dir, Into::into);
    let d = base.join(format!("tiermem-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}
