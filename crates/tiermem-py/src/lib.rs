//! Python binding of tiermem-core and tiermem-embed: conversions, GIL release and error
//! mapping only. Files mirror the crates (`core/` and `embed/`, one file per core module
//! bound); the names Python validates against are exported from the crates' registries
//! (`vocab.rs`), never copied.

mod buffer;
mod convert;
mod core;
mod embed;
mod error;
mod hpc;
mod shared;
mod vocab;

use pyo3::prelude::*;

/// The native module `tiermem._tiermem`.
#[pymodule(gil_used = false)]
fn _tiermem(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    tiermem_core::lock_order::set_blocking_check(shared::holds_gil);
    vocab::add(m)?;
    m.add_class::<core::manager::PyManager>()?;
    m.add_class::<core::manager::PyRecorder>()?;
    m.add_class::<core::manager::PyMover>()?;
    m.add_function(wrap_pyfunction!(core::manager::remove_device_files, m)?)?;
    m.add_class::<core::policy::DataApi>()?;
    m.add_class::<core::model::PyTwoLm>()?;
    m.add_class::<core::traits::PyTraited>()?;
    m.add_class::<hpc::kernels::PyKernel>()?;
    m.add_function(wrap_pyfunction!(hpc::kernels::calibrate_staging, m)?)?;
    m.add_class::<embed::criteo::PyCriteoParser>()?;
    m.add_function(wrap_pyfunction!(embed::criteo::criteo_ranges, m)?)?;
    m.add_class::<embed::table::PyTable>()?;
    m.add_function(wrap_pyfunction!(
        embed::table::cache_slot_metadata_bytes,
        m
    )?)?;
    m.add_function(wrap_pyfunction!(embed::table::table_row_metadata_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(embed::table::table_row_stride, m)?)?;
    m.add_function(wrap_pyfunction!(embed::table::table_private_devices, m)?)?;
    m.add_class::<embed::blockfile::PyBlockFile>()?;
    m.add_function(wrap_pyfunction!(embed::blockfile::block_file_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(embed::blockfile::block_geometry, m)?)?;
    m.add_function(wrap_pyfunction!(embed::kernels::lookup_into, m)?)?;
    m.add_function(wrap_pyfunction!(embed::kernels::update_from, m)?)?;
    m.add_function(wrap_pyfunction!(embed::kernels::check_optimizer, m)?)?;
    m.add_function(wrap_pyfunction!(embed::kernels::optimizer_state_width, m)?)?;
    m.add_function(wrap_pyfunction!(embed::kernels::sparse_grad, m)?)?;
    m.add_function(wrap_pyfunction!(embed::kernels::gather, m)?)?;
    m.add_function(wrap_pyfunction!(embed::workload::generate_into, m)?)?;
    m.add_function(wrap_pyfunction!(embed::workload::uniform_into, m)?)?;
    m.add_function(wrap_pyfunction!(embed::workload::reuse_histogram, m)?)?;
    for f in [
        wrap_pyfunction!(embed::layout::layout_shp, m)?,
        wrap_pyfunction!(embed::layout::layout_fanout, m)?,
        wrap_pyfunction!(embed::layout::query_counts_into, m)?,
        wrap_pyfunction!(embed::layout::minicache_sweep, m)?,
        wrap_pyfunction!(embed::layout::minicache_lookups, m)?,
        wrap_pyfunction!(embed::layout::lru_curve, m)?,
        wrap_pyfunction!(embed::layout::shards_curve, m)?,
        wrap_pyfunction!(embed::layout::belady_hits, m)?,
    ] {
        m.add_function(f)?;
    }
    m.add_function(wrap_pyfunction!(core::calib::topology, m)?)?;
    m.add_function(wrap_pyfunction!(core::calib::memory_spaces, m)?)?;
    m.add_function(wrap_pyfunction!(hpc::pattern::analyse_pattern, m)?)?;
    m.add_function(wrap_pyfunction!(hpc::pattern::staging_decision, m)?)?;
    m.add_function(wrap_pyfunction!(core::calib::profiles, m)?)?;
    m.add_function(wrap_pyfunction!(core::calib::dram_figures, m)?)?;
    m.add_function(wrap_pyfunction!(core::calib::measure_dram, m)?)?;
    m.add_function(wrap_pyfunction!(core::calib::dram_probe_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(core::calib::block_depth, m)?)?;
    m.add_function(wrap_pyfunction!(core::calib::random_reads_per_s, m)?)?;
    m.add_function(wrap_pyfunction!(core::calib::memcpy_seconds, m)?)?;
    m.add_function(wrap_pyfunction!(core::calib::calibration_path, m)?)?;
    m.add_function(wrap_pyfunction!(core::calib::kernel_isa, m)?)?;
    Ok(())
}
