//! What a device is, apart from how it is backed: the description placement decisions read
//! (H2M's memory spaces, a planner's cost model, a GPU kind later).

use serde::Serialize;

use super::Reach;

/// A device's traits.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeviceTraits {
    /// How the CPU reaches its bytes (what copies to and from it are routed by).
    pub reach: Reach,
    /// Whether the CPU loads and stores its bytes (else data is staged through memory).
    pub host_accessible: bool,
    /// Whether it is addressed in bytes (loads and stores, or an accelerator's own), not in
    /// blocks.
    pub byte_addressable: bool,
    /// Allocation alignment in bytes.
    pub alignment: u64,
    /// Usable bytes.
    pub capacity: u64,
    /// Whether its data outlives the process (a `mapped:` or `block:` file).
    pub persistent: bool,
    /// Whether it is DRAM throttled to stand in for another device.
    pub emulated: bool,
    /// Whether its reads and writes proceed on independent channels, so that a kernel's
    /// reads and writes on it together take the longer of the two, not their sum (an
    /// emulated device's throttle charges each channel apart and waits for the later).
    pub duplex: bool,
    /// The NUMA node its memory is bound to, if any.
    pub numa_node: Option<u32>,
    /// Read and write bandwidth (GB/s) and load-to-use latency (ns), where known: an
    /// emulated device's profile scaled to this machine, DRAM's figures for `dram` once
    /// this process has them (calibrated or measured for an emulated device); `None` until
    /// then, and for other kinds until `tiermem calibrate` measures them.
    pub read_gbps: Option<f64>,
    /// See `read_gbps`.
    pub write_gbps: Option<f64>,
    /// See `read_gbps`.
    pub latency_ns: Option<f64>,
}
