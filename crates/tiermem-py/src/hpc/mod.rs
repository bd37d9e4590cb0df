//! Bindings of `tiermem-hpc`, file for file: the HPC kernels over tiered arrays with their
//! staged runs and the staging calibration, and the access-pattern analysis.

pub mod kernels;
pub mod pattern;
