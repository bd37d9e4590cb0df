//! Integration tests of the embedding crate: cached tables against direct ones, concurrency
//! and the lock order, bad input.

mod blockfile;
mod embedding;
mod kernels;
mod lock_order;

use tiermem_core::device::Device;
use tiermem_core::manager::Manager;
use tiermem_core::policy;

/// A manager over DRAM of `fast` bytes and emulated CXL memory of `slow` bytes.
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

/// A fresh scratch directory on the disk (not tmpfs: block files refuse memory file systems).
pub fn scratch(tag: &str) -> std::path::PathBuf {
    let base = std::env::var_os("CARGO_TARGET_TMPDIR").map_or_else(std::env::temp_dir, Into::into);
    let d = base.join(format!("tiermem-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}
