//! tiermem core: devices, heaps, the data manager, policies, the copy engine, counters and
//! tiered embedding tables, and a model of the hardware DRAM cache they are measured against.
//! No Python here; the `tiermem-py` crate binds it.
//!
//! ```
//! use tiermem_core::{device::Device, policy::{self, Place}, manager::Manager};
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

pub mod copy;
pub mod counters;
pub mod device;
pub mod embedding;
mod error;
pub mod heap;
pub mod lock_order;
pub mod manager;
pub mod measure;
pub mod policy;
pub mod sys;
pub mod twolm;

pub use error::{Error, Result};
