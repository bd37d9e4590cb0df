//! `block` (Bandana Fig. 10): every row of a block read goes in; the others than those asked
//! for unmarked (no recent use), so the second-chance reclaim drops unused ones first.

use super::{no_arg, Admit, Known};

/// `block`.
#[derive(Debug, Clone, Copy)]
pub struct Block;

impl Admit for Block {
    const NAME: &'static str = "block";

    fn parse(arg: Option<&str>) -> Result<Self, String> {
        no_arg(arg).map(|()| Block)
    }

    fn neighbour(&self, _row: u64, _known: Known<'_>) -> bool {
        true
    }
}
