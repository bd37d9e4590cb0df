//! `admit`: `dynamic` with admission control: the `second` admission
//! ([`crate::cache::admit::SecondMiss`]), a row cached on its second miss within a window.

use super::CachePolicy;
use crate::cache::{Eviction, Filling};

/// The admit policy.
#[derive(Debug, Clone, Copy)]
pub struct Admit;

impl Admit {
    /// Registry name.
    pub const NAME: &'static str = "admit";
}

impl CachePolicy for Admit {
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
        "second"
    }
}
