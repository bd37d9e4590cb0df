//! Integration tests of the embedding crate: cached tables against direct ones, concurrency
//! and the lock order, bad input.

mod block_table;
mod blockfile;
mod embedding;
mod file_table;
mod kernels;
mod lock_order;

pub use tiermem_testkit::{scratch, two_tier};
