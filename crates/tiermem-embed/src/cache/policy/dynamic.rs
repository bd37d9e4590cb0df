//! `dynamic` (thesis §5.6.1): cache rows as lookups touch them; updates of cached rows stay
//! in fast memory; a full cache makes room before the next lookup, keeping rows hit since
//! they were cached (second chance).

use super::CachePolicy;
use crate::cache::{Eviction, Filling};

/// The dynamic policy.
#[derive(Debug, Clone, Copy)]
pub struct Dynamic;

impl Dynamic {
    /// Registry name.
    pub const NAME: &'static str = "dynamic";
}

impl CachePolicy for Dynamic {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn filling(&self) -> Filling {
        Filling::OnMiss
    }

    fn eviction(&self) -> Eviction {
        Eviction::SecondChance
    }
}
