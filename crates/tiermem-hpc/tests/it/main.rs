//! Integration tests of the HPC kernels and staging: property tests over tiered arrays.

mod hpc_props;

pub use tiermem_testkit::two_tier;
