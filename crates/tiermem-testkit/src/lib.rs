//! What the Rust test suites of tiermem's crates share: a two-tier manager and a scratch
//! directory on the disk. A dev-dependency only; nothing ships with it.

use tiermem_core::device::Device;
use tiermem_core::manager::Manager;
use tiermem_core::policy;

/// A manager over DRAM of `fast` bytes and emulated CXL memory of `slow` bytes, driven by
/// the built-in policy `pol`.
#[must_use]
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

/// A fresh scratch directory on the disk (not tmpfs: block devices and block files refuse
/// memory file systems), under the test's target directory when Cargo gives one.
#[must_use]
pub fn scratch(tag: &str) -> std::path::PathBuf {
    let base = std::env::var_os("CARGO_TARGET_TMPDIR").map_or_else(std::env::temp_dir, Into::into);
    let d = base.join(format!("tiermem-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}
