//! Bindings of `tiermem-embed`, file for file: tables, kernels, workloads.

pub mod kernels;
pub mod table;
pub mod workload;
