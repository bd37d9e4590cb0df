//! Cache policies: what a cached table's mechanism ([`super::CachedRows`]: pointer table,
//! slots, pages, back-edges, fill, flush and reclaim) is told to do. Each is one file
//! implementing [`CachePolicy`] and one name in the [`cache_policies!`] list below, which
//! builds the registry ([`NAMES`], exported to Python; [`by_name`]).
//!
//! A policy decides; the mechanism acts. The decisions are read once per kernel call (what
//! a lookup does with a miss) or once per flush, never per row through a virtual call.
//! Which rows go in is an admission's to say ([`super::admit`]); a policy names its default.

mod admit;
mod dynamic;
mod static_fill;
mod tinylfu;

pub use admit::Admit;
pub use dynamic::Dynamic;
pub use static_fill::Static;
pub use tinylfu::TinyLfuPolicy;

use super::CachedRows;
use tiermem_core::{bail, Result};

/// A cached table's policy.
pub trait CachePolicy: Send + Sync + 'static {
    /// Registry name.
    fn name(&self) -> &'static str;

    /// Whether lookups copy the rows they miss into the cache (else they read through it).
    fn caches_on_lookup(&self) -> bool;

    /// The admission its caches use unless a table's placement names another
    /// ([`super::admit::Admission::parse`] reads it).
    fn admission(&self) -> &'static str {
        "row"
    }

    /// Whether the cache is filled once, before the first lookup, with rows in a scrambled
    /// order (and only read through after).
    fn fills_on_first_use(&self) -> bool {
        false
    }

    /// Whether a lookup that finds the cache full first makes room (second-chance reclaim,
    /// [`CachedRows::reclaim`]).
    fn reclaims_when_full(&self) -> bool;

    /// Called after a flush or reclaim made room, under the table's exclusive lock.
    fn after_room_made(&self, _cache: &CachedRows) {}
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
    fn every_name_resolves_to_itself_and_unknown_names_are_refused() {
        for n in NAMES {
            assert_eq!(by_name(n).unwrap().name(), *n);
        }
        let e = by_name("lfu").unwrap_err().to_string();
        assert!(e.contains("'lfu'") && e.contains("dynamic"), "{e}");
    }
}
