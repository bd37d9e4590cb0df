//! `static` (thesis §5.6.1): fill the cache once, before the first lookup, with rows in a
//! scrambled order; lookups then only read through it.

use super::CachePolicy;
use crate::cache::{Eviction, Filling};

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

    fn filling(&self) -> Filling {
        Filling::Prefill
    }

    fn eviction(&self) -> Eviction {
        Eviction::Never
    }
}
