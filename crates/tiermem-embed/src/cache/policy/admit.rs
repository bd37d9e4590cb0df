//! `admit`: `dynamic` with admission control: the `second` admission
//! ([`crate::cache::admit::SecondMiss`]), a row cached on its second miss within a window.

use super::CachePolicy;

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

    fn caches_on_lookup(&self) -> bool {
        true
    }

    fn admission(&self) -> &'static str {
        "second"
    }

    fn reclaims_when_full(&self) -> bool {
        true
    }
}
