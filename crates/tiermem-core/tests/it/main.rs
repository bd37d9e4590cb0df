//! Integration tests of the core: property tests, stress tests, bad input.

mod bad_input;
mod devices;
mod heap_props;
mod lock_order;
mod manager_props;
mod model;
mod model_check;
mod policies;
mod torn_write;
mod traits_props;

pub use tiermem_testkit::{scratch, two_tier};
