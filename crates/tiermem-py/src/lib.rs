//! Python binding of tiermem-core: conversions, GIL release and error mapping only.

mod embedding;
mod error;
mod manager;
mod measure;
mod policy;
mod shared;
mod twolm;

use pyo3::prelude::*;

/// The native part of the `tiermem` package.
#[pymodule(gil_used = false)]
fn _tiermem(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    tiermem_core::lock_order::set_blocking_check(shared::holds_gil);
    m.add_class::<manager::PyManager>()?;
    m.add_class::<manager::PyRecorder>()?;
    m.add_class::<policy::DataApi>()?;
    m.add_class::<embedding::PyTable>()?;
    m.add_class::<twolm::PyTwoLm>()?;
    m.add_function(wrap_pyfunction!(embedding::lookup_into, m)?)?;
    m.add_function(wrap_pyfunction!(embedding::update_from, m)?)?;
    m.add_function(wrap_pyfunction!(embedding::sparse_grad, m)?)?;
    m.add_function(wrap_pyfunction!(embedding::gather, m)?)?;
    m.add_function(wrap_pyfunction!(embedding::generate_into, m)?)?;
    m.add_function(wrap_pyfunction!(embedding::uniform_into, m)?)?;
    m.add_function(wrap_pyfunction!(embedding::reuse_histogram, m)?)?;
    m.add_function(wrap_pyfunction!(measure::topology_json, m)?)?;
    m.add_function(wrap_pyfunction!(measure::profiles_json, m)?)?;
    m.add_function(wrap_pyfunction!(measure::dram_figures_json, m)?)?;
    m.add_function(wrap_pyfunction!(measure::measure_dram_json, m)?)?;
    m.add_function(wrap_pyfunction!(measure::memcpy_seconds, m)?)?;
    m.add_function(wrap_pyfunction!(measure::calibration_path, m)?)?;
    m.add_function(wrap_pyfunction!(measure::kernel_isa, m)?)?;
    Ok(())
}
