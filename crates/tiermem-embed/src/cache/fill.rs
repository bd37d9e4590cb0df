//! Filling: when rows enter a cache. Each way is a type implementing [`Fill`]; a policy
//! names one through the [`Filling`] enum, read once per kernel call (what a lookup does
//! with a miss), never per row. Which of the rows a fill offers go in is an admission's to
//! say ([`super::admit`]).

/// A way to fill a cache (see the module doc).
pub trait Fill: Copy + Send + Sync + 'static {
    /// What reports call it.
    const NAME: &'static str;

    /// Whether lookups copy the rows they miss into the cache (else they read through it).
    const ON_MISS: bool;

    /// Whether the cache is filled once, before the first lookup, with rows in a scrambled
    /// order.
    const BEFORE_FIRST_USE: bool;
}

/// Rows enter as lookups miss them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OnMiss;

impl Fill for OnMiss {
    const NAME: &'static str = "on-miss";
    const ON_MISS: bool = true;
    const BEFORE_FIRST_USE: bool = false;
}

/// The cache is filled once before the first lookup (rows in a scrambled order) and only
/// read through after.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Prefill;

impl Fill for Prefill {
    const NAME: &'static str = "prefill";
    const ON_MISS: bool = false;
    const BEFORE_FIRST_USE: bool = true;
}

/// A filling as a policy names it: one arm per [`Fill`] type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Filling {
    /// [`OnMiss`].
    OnMiss,
    /// [`Prefill`].
    Prefill,
}

impl Filling {
    /// Its name.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Filling::OnMiss => OnMiss::NAME,
            Filling::Prefill => Prefill::NAME,
        }
    }

    /// [`Fill::ON_MISS`].
    #[must_use]
    pub fn on_miss(self) -> bool {
        match self {
            Filling::OnMiss => OnMiss::ON_MISS,
            Filling::Prefill => Prefill::ON_MISS,
        }
    }

    /// [`Fill::BEFORE_FIRST_USE`].
    #[must_use]
    pub fn before_first_use(self) -> bool {
        match self {
            Filling::OnMiss => OnMiss::BEFORE_FIRST_USE,
            Filling::Prefill => Prefill::BEFORE_FIRST_USE,
        }
    }
}
