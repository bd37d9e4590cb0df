//! Bindings of `tiermem-embed`, file for file: tables, kernels, workloads, block files,
//! layouts, hit-rate curves and miniature caches, and the Criteo reader of the DLRM data.

pub mod blockfile;
pub mod criteo;
pub mod kernels;
pub mod layout;
pub mod table;
pub mod workload;
