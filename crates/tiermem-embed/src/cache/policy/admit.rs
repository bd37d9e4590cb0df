//! `admit`: `dynamic` with admission control. A row is cached on its second miss within a
//! window (a "seen" mark in its entry, cleared for a quarter of the table after every flush
//! or reclaim), so rows used once do not push out rows that are reused.

use super::{Admission, CachePolicy};
use crate::cache::CachedRows;

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

    fn admission(&self) -> Admission {
        Admission::SecondMiss
    }

    fn reclaims_when_full(&self) -> bool {
        true
    }

    fn after_room_made(&self, cache: &CachedRows) {
        cache.age_seen();
    }
}
