//! `tiermem_core::calib` and the machine facts next to it: topology, emulated profiles, DRAM
//! figures and measurements for `tiermem info`, `calibrate` and `bench`.

use pyo3::prelude::*;

use crate::convert::to_object;
use tiermem_core::calib;
use tiermem_core::device::{spaces, PROFILES};
use tiermem_core::sys::discover;

/// The machine's topology (nodes, distances, memory, THP).
#[pyfunction]
pub fn topology(py: Python<'_>) -> PyResult<Py<PyAny>> {
    let t = py.detach(discover::topology);
    to_object(py, &t)
}

/// Calibrated `(read GB/s, latency ns)` by NUMA node.
type MeasuredByNode = std::collections::BTreeMap<u32, (Option<f64>, Option<f64>)>;

/// Memory spaces mapped to NUMA nodes, and each node's view of them
/// (`tiermem_core::device::spaces`). `sysfs`: a sysfs root to read instead of `/sys` (its
/// `meminfo` beside it); `env`: the overrides to use instead of the process environment;
/// `measured`: calibrated `(read GB/s, latency ns)` by node.
#[pyfunction]
#[pyo3(signature = (sysfs = None, env = None, measured = None))]
pub fn memory_spaces(
    py: Python<'_>,
    sysfs: Option<std::path::PathBuf>,
    env: Option<std::collections::HashMap<String, String>>,
    measured: Option<MeasuredByNode>,
) -> PyResult<Py<PyAny>> {
    let measured = measured
        .unwrap_or_default()
        .into_iter()
        .map(|(n, (read_gbps, latency_ns))| {
            (
                n,
                spaces::Measured {
                    read_gbps,
                    latency_ns,
                },
            )
        })
        .collect();
    let map = crate::error::run(py, || {
        let topo = match &sysfs {
            Some(root) => discover::topology_from(root, &root.join("meminfo")),
            None => discover::topology(),
        };
        let read = |k: &str| match &env {
            Some(e) => e.get(k).cloned(),
            None => std::env::var(k).ok(),
        };
        spaces::map_spaces(&topo, &read, &measured)
    })?;
    to_object(py, &map)
}

/// The emulated device profiles.
#[pyfunction]
pub fn profiles(py: Python<'_>) -> PyResult<Py<PyAny>> {
    to_object(py, &PROFILES)
}

/// This process's DRAM figures (calibrated or measured).
#[pyfunction]
pub fn dram_figures(py: Python<'_>) -> PyResult<Py<PyAny>> {
    let f = crate::error::run(py, || calib::dram_figures().cloned())?;
    to_object(py, &f)
}

/// Bytes of each buffer a DRAM measurement should use on this machine (twice the last-level
/// cache, within what the process may take).
#[pyfunction]
pub fn dram_probe_bytes() -> usize {
    calib::probe_bytes()
}

/// Measure DRAM now on `bytes`-sized buffers, best of `reps`.
#[pyfunction]
pub fn measure_dram(py: Python<'_>, bytes: usize, reps: usize) -> PyResult<Py<PyAny>> {
    let f = py.detach(|| calib::measure_dram(bytes, reps));
    to_object(py, &f)
}

/// Seconds (best of `reps`) for `memcpy` of `len` bytes between two addresses on `threads`
/// threads. The addresses must come from live guards of two distinct objects.
#[pyfunction]
pub fn memcpy_seconds(
    py: Python<'_>,
    dst: usize,
    src: usize,
    len: usize,
    threads: usize,
    reps: usize,
) -> PyResult<f64> {
    if dst == 0 || src == 0 || (dst < src + len && src < dst + len) {
        return Err(pyo3::exceptions::PyValueError::new_err(
            "memcpy ranges are null or overlap",
        ));
    }
    // SAFETY: the caller passes addresses of two guarded, non-overlapping regions of at least
    // `len` bytes (checked for overlap above); they stay pinned during the call.
    Ok(py.detach(|| unsafe {
        tiermem_core::measure::memcpy_seconds(dst as *mut u8, src as *const u8, len, threads, reps)
    }))
}

/// Where calibration results are kept.
#[pyfunction]
pub fn calibration_path() -> String {
    calib::calibration_path().display().to_string()
}

/// Which copy kernels run here (`Avx512`, `Avx2`, `Scalar`).
#[pyfunction]
pub fn kernel_isa() -> String {
    format!("{:?}", tiermem_core::arch::isa())
}

/// The block device's queue depth: calibrated, else the default.
#[pyfunction]
pub fn block_depth() -> usize {
    calib::block_depth()
}

/// Random 4 KiB reads per second from the first `len` bytes of the file `path` (direct
/// I/O), `depth` in flight; best of `reps` runs of `count` reads. Returns (rate, engine).
#[pyfunction]
pub fn random_reads_per_s(
    py: Python<'_>,
    path: std::path::PathBuf,
    len: u64,
    depth: usize,
    count: usize,
    reps: usize,
) -> PyResult<(f64, &'static str)> {
    crate::error::run(py, || {
        tiermem_core::measure::random_reads_per_s(&path, len, depth, count, reps)
    })
}
