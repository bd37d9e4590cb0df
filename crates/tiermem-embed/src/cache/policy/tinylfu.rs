//! `tinylfu`: `dynamic` with the `tinylfu` admission ([`crate::cache::admit::TinyLfu`]): a
//! miss is cached once a count-min sketch of recent accesses says the row was used before.

use super::CachePolicy;
use crate::cache::{Eviction, Filling};

/// The tinylfu policy.
#[derive(Debug, Clone, Copy)]
pub struct TinyLfuPolicy;

impl TinyLfuPolicy {
    /// Registry name.
    pub const NAME: &'static str = "tinylfu";
}

impl CachePolicy for TinyLfuPolicy {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn filling(&self) -> Filling {
        Filling::OnMiss
    }

    fn eviction(&self) -> Eviction {
        Eviction::SecondChance
    }

    fn admission(&self) -> &'static str {
        "tinylfu"
    }
}
