//! Integration tests of the embedding crate: cached tables against direct ones, concurrency
//! and the lock order, bad input.

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
