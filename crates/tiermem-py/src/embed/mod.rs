//! Bindings of `tiermem-embed`, file for file: tables, kernels, workloads, block files.

pub mod blockfile;
pub mod kernels;
pub mod table;
pub mod workload;
