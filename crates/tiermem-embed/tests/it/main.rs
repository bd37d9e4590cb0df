//! Integration tests of the embedding crate: cached tables against direct ones, concurrency
//! and the lock order, bad input.

mod block_table;
mod blockfile;
mod embedding;
mod file_table;
mod kernels;
mod lock_order;

pub use tiermem_testkit::{scratch, two_tier};

use tiermem_embed::bags::Bags;
use tiermem_embed::{lookup, LookupOut, Mode, Table};

/// A sum lookup of `n` bags of rows `width` wide from table `t`, with the default prefetch.
pub fn look(t: &Table, bags: Bags<'_>, width: usize, n: usize) -> Vec<f32> {
    let mut out = vec![0f32; n * width];
    let o = LookupOut {
        data: &mut out,
        row_stride: width,
        cols: &[0],
    };
    lookup(&[t], &[bags], Mode::Sum, o, 8).unwrap();
    out
}
