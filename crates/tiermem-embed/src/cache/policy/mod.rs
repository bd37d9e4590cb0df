//! Cache policies: what a cached table's mechanism ([`super::CachedRows`]: pointer table,
//! slots, pages, back-edges, fill, flush and reclaim) is told to do. A policy is three
//! choices, each from a room of its own: how rows enter ([`super::fill`]), which rows that
//! miss go in ([`super::admit`], by default; a table's placement may name another) and which
//! rows leave when the cache is full ([`super::evict`]). Each policy is one file
//! implementing [`CachePolicy`] and one name in the [`cache_policies!`] list below, which
//! builds the registry ([`NAMES`], exported to Python; [`by_name`]).
//!
//! A policy decides; the mechanism acts. The choices are read once per kernel call (what
//! a lookup does with a miss) or once per reclaim pass (generic over the eviction), never
//! per row through a virtual call.

mod admit;
mod dynamic;
mod static_fill;
mod tinylfu;

pub use admit::Admit;
pub use dynamic::Dynamic;
pub use static_fill::Static;
pub use tinylfu::TinyLfuPolicy;

use super::{CachedRows, Eviction, Filling};
use tiermem_core::{bail, Result};

/// A cached table's policy.
pub trait CachePolicy: Send + Sync + 'static {
    /// Registry name.
    fn name(&self) -> &'static str;

    /// How rows enter the cache.
    fn filling(&self) -> Filling;

    /// Which rows leave a full cache.
    fn eviction(&self) -> Eviction;

    /// The admission its caches use unless a table's placement names another
    /// ([`super::admit::Admission::parse`] reads it).
    fn admission(&self) -> &'static str {
        "row"
    }

    /// Called after a flush or reclaim made room, under the table's exclusive lock.
    fn after_room_made(&self, _cache: &CachedRows) {}

    /// Whether lookups copy the rows they miss into the cache (else they read through it):
    /// the filling's [`super::Fill::ON_MISS`].
    fn caches_on_lookup(&self) -> bool {
        self.filling().on_miss()
    }

    /// Whether the cache is filled once, before the first lookup: the filling's
    /// [`super::Fill::BEFORE_FIRST_USE`].
    fn fills_on_first_use(&self) -> bool {
        self.filling().before_first_use()
    }

    /// Whether a lookup that finds the cache full first makes room: the eviction's
    /// [`super::Evict::RECLAIMS`].
    fn reclaims_when_full(&self) -> bool {
        self.eviction().reclaims()
    }
}

/// A policy as tables hold it.
pub type PolicyRef = &'static dyn CachePolicy;

macro_rules! cache_policies {
    ($($ty:ident),* $(,)?) => {
        /// Every cache policy's name, in registry order.
        pub const NAMES: &[&str] = &[$($ty::NAME),*];

        /// The policy called `name`.
        pub fn by_name(name: &str) -> Result<PolicyRef> {
            $(
                if name == $ty::NAME {
                    return Ok(&$ty);
                }
            )*
            bail!(
                "unknown cache policy '{name}' (known: {}; 'simple' is a direct table on the slow device)",
                NAMES.join(", ")
            )
        }
    };
}

cache_policies!(Static, Dynamic, Admit, TinyLfuPolicy);

impl std::fmt::Debug for dyn CachePolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl PartialEq for dyn CachePolicy {
    fn eq(&self, other: &Self) -> bool {
        self.name() == other.name()
    }
}

impl Eq for dyn CachePolicy {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn todays_policies_are_their_fill_admit_and_evict() {
        let all: Vec<_> = NAMES.iter().map(|n| by_name(n).unwrap()).collect();
        let parts: Vec<_> = all
            .iter()
            .map(|p| (p.name(), p.filling(), p.admission(), p.eviction()))
            .collect();
        assert_eq!(
            parts,
            [
                ("static", Filling::Prefill, "row", Eviction::Never),
                ("dynamic", Filling::OnMiss, "row", Eviction::SecondChance),
                ("admit", Filling::OnMiss, "second", Eviction::SecondChance),
                (
                    "tinylfu",
                    Filling::OnMiss,
                    "tinylfu",
                    Eviction::SecondChance
                ),
            ]
        );
        for p in all {
            assert_eq!(p.caches_on_lookup(), p.filling() == Filling::OnMiss);
            assert_eq!(
                p.reclaims_when_full(),
                p.eviction() == Eviction::SecondChance
            );
        }
    }

    #[test]
    fn every_name_resolves_to_itself_and_unknown_names_are_refused() {
        for n in NAMES {
            assert_eq!(by_name(n).unwrap().name(), *n);
        }
        let e = by_name("lfu").unwrap_err().to_string();
        assert!(e.contains("'lfu'") && e.contains("dynamic"), "{e}");
    }
}
