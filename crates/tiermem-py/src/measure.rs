//! Topology, profiles and measurement functions for `tiermem info`, `calibrate` and `bench`.

use pyo3::prelude::*;
use tiermem_core::calib as baseline;
use tiermem_core::device::PROFILES;
use tiermem_core::sys::discover;

fn json<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).expect("plain data serialises")
}

/// The machine's topology as JSON.
#[pyfunction]
pub fn topology_json(py: Python<'_>) -> String {
    py.detach(|| json(&discover::topology()))
}

/// The emulated profiles as JSON.
#[pyfunction]
pub fn profiles_json() -> String {
    json(&PROFILES)
}

/// This process's DRAM figures (calibrated or measured) as JSON.
#[pyfunction]
pub fn dram_figures_json(py: Python<'_>) -> PyResult<String> {
    crate::error::run(py, || baseline::dram_figures().map(json))
}

/// Measure DRAM now on `bytes`-sized buffers, best of `reps`.
#[pyfunction]
pub fn measure_dram_json(py: Python<'_>, bytes: usize, reps: usize) -> String {
    py.detach(|| json(&baseline::measure_dram(bytes, reps)))
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
    baseline::calibration_path().display().to_string()
}

/// Which copy kernels run here (`Avx512`, `Avx2`, `Scalar`).
#[pyfunction]
pub fn kernel_isa() -> String {
    format!("{:?}", tiermem_core::arch::isa())
}
