//! The names Python validates against, exported from the crates' own registries so that no
//! layer above keeps a copy: policies, the heap alignment of memory, memory spaces and their overrides, places, optimizers, where DRAM figures came from, cache policies, lookup modes,
//! storage types, row-home kinds, the default prefetch distance, instruction sets, and the reuse buckets of the
//! production-like workloads.

use pyo3::prelude::*;
use pyo3::types::PyDict;
use tiermem_core::mechanism::Place;

/// Add every vocabulary to the module.
pub fn add(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("POLICIES", tiermem_core::policy::BUILTIN.to_vec())?;
    m.add("MEMORY_ALIGN", tiermem_core::device::MEMORY_ALIGN)?;
    m.add(
        "MEMORY_SPACES",
        tiermem_core::device::spaces::Space::ALL
            .iter()
            .map(|s| s.name())
            .collect::<Vec<_>>(),
    )?;
    m.add("TRAIT_KEYS", tiermem_core::traits::KEYS.to_vec())?;
    m.add(
        "HPC_KERNELS",
        tiermem_hpc::KERNELS
            .iter()
            .map(|(k, o, p)| (*k, o.to_vec(), p.to_vec()))
            .collect::<Vec<_>>(),
    )?;
    {
        use tiermem_embed::criteo as c;
        m.add(
            "CRITEO",
            [
                ("int_features", c::INT_FEATURES),
                ("cat_features", c::CAT_FEATURES),
                ("max_int_digits", c::MAX_INT_DIGITS),
                ("max_hex_digits", c::MAX_HEX_DIGITS),
                ("examples", c::EXAMPLES),
            ]
            .into_iter()
            .collect::<std::collections::BTreeMap<_, _>>(),
        )?;
    }
    m.add(
        "COMMIT_STRATEGIES",
        tiermem_core::traits::Strategy::NAMES.to_vec(),
    )?;
    m.add(
        "MEMORY_SPACE_ENV",
        tiermem_core::device::spaces::Space::ALL
            .iter()
            .map(|s| s.env_var())
            .collect::<Vec<_>>(),
    )?;
    let places = PyDict::new(m.py());
    for (name, code) in Place::CODES {
        places.set_item(name, code)?;
    }
    m.add("PLACES", places)?;
    m.add("OPTIMIZERS", tiermem_embed::optim::NAMES.to_vec())?;
    m.add(
        "OPTIMIZER_SETTINGS",
        tiermem_embed::optim::SETTINGS.to_vec(),
    )?;
    m.add(
        "WEIGHT_DECAY_MODES",
        tiermem_embed::optim::DECAY_MODES.to_vec(),
    )?;
    m.add(
        "DRAM_SOURCES",
        tiermem_core::calib::SOURCES
            .into_iter()
            .collect::<std::collections::BTreeMap<_, _>>(),
    )?;
    m.add(
        "CACHE_POLICIES",
        tiermem_embed::cache::policy::NAMES.to_vec(),
    )?;
    m.add("ADMISSIONS", tiermem_embed::cache::admit::NAMES.to_vec())?;
    m.add("MODES", tiermem_embed::lookup::Mode::NAMES.to_vec())?;
    m.add("PREFETCH", tiermem_embed::lookup::DEFAULT_PREFETCH)?;
    m.add("DTYPES", tiermem_embed::DType::NAMES.to_vec())?;
    m.add("HOME_KINDS", tiermem_embed::home::KINDS.to_vec())?;
    m.add(
        "DISTRIBUTIONS",
        tiermem_embed::workload::Dist::NAMES.to_vec(),
    )?;
    m.add(
        "REUSE_BUCKETS",
        tiermem_embed::workload::REUSE_BUCKETS.to_vec(),
    )?;
    m.add(
        "ISAS",
        tiermem_core::arch::available()
            .iter()
            .map(|i| format!("{i:?}").to_lowercase())
            .collect::<Vec<_>>(),
    )?;
    Ok(())
}
