//! Bindings of `tiermem-embed`, file for file: tables, kernels, workloads, block files,
//! layouts, hit-rate curves and miniature caches.

pub mod blockfile;
pub mod kernels;
pub mod layout;
pub mod table;
pub mod workload;
