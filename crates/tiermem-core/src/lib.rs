//! tiermem core: devices, heaps, the data manager, policies, the copy engine, counters, and
//! a model of the hardware DRAM cache tiermem is measured against: memory management only.
//! No Python here; the `tiermem-py` crate binds it, `tiermem-embed` builds embedding tables
//! on it and `tiermem-hpc` HPC kernels and pattern-aware staging.
//!
//! Modules are floors; each uses only floors below it (checked by `make lint`,
//! `scripts/check_layers.py`), bottom first:
//!
//! | floor | modules |
//! | --- | --- |
//! | base | [`error`](Error), [`lock_order`] |
//! | hardware | [`arch`] (ISA, copy kernels, hints), [`sys`] (maps, files, NUMA) |
//! | counting | [`counters`] |
//! | figures | [`calib`] (DRAM figures and probes) |
//! | devices | [`device`] (kinds, traits, emulation, discovery) |
//! | copies | [`copy`] (the copy engine) |
//! | heaps | [`heap`] |
//! | mechanism | [`mechanism`] (data manager, objects, places, moves) |
//! | models | [`model`] (the 2LM model) |
//! | decisions | [`policy`] (the trait, the registry, one file per policy) |
//! | facade | [`manager`] (one lock, guards, reservations, batched ops) |
//! | traits | [`traits`] (allocation by H2M traits: spaces over devices, commit strategies, migration) |
//! | measurement | [`measure`] (device figures for calibrate and info) |
//!
//! ```
//! use tiermem_core::{device::Device, mechanism::Place, policy, manager::Manager};
//! let m = Manager::new(
//!     vec![Device::open("dram", 1 << 20)?, Device::open("emulated:optane-pmem", 8 << 20)?],
//!     policy::builtin("lru")?,
//! )?;
//! let id = m.alloc(4096, Place::Fast)?;
//! m.write(id)?.as_mut_slice().fill(7);
//! m.evict(id)?;                              // dirty: written back to the slow device
//! assert_eq!(m.read(id)?.as_slice()[0], 7);  // the guard brings it back
//! # Ok::<(), tiermem_core::Error>(())
//! ```

pub mod arch;
pub mod calib;
pub mod copy;
pub mod counters;
pub mod device;
mod error;
pub mod heap;
pub mod lock_order;
pub mod manager;
pub mod measure;
pub mod mechanism;
pub mod model;
pub mod policy;
pub mod process;
pub mod sys;
pub mod traits;

pub use error::{Error, Result};
