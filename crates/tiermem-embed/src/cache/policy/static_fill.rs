//! `static` (thesis §5.6.1): fill the cache once, before the first lookup, with rows in a
//! scrambled order; lookups then only read through it.

use super::CachePolicy;

/// The static policy.
#[derive(Debug, Clone, Copy)]
pub struct Static;

impl Static {
    /// Registry name.
    pub const NAME: &'static str = "static";
}

impl CachePolicy for Static {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn caches_on_lookup(&self) -> bool {
        false
    }

    fn fills_on_first_use(&self) -> bool {
        true
    }

    fn reclaims_when_full(&self) -> bool {
        false
    }
}
