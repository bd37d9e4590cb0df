//! `tinylfu`: `dynamic` with the `tinylfu` admission ([`crate::cache::admit::TinyLfu`]): a
//! miss is cached once a count-min sketch of recent accesses says the row was used before.

use super::CachePolicy;

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

    fn caches_on_lookup(&self) -> bool {
        true
    }

    fn admission(&self) -> &'static str {
        "tinylfu"
    }

    fn reclaims_when_full(&self) -> bool {
        true
    }
}
