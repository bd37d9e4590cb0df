//! Eviction: which cached rows a full cache drops to make room. Each way is a type
//! implementing [`Evict`], dispatched once per reclaim pass through the [`Eviction`] enum
//! (a reclaim pass is generic over it, so the per-row decision is inlined: no virtual call
//! in the loop). The table's reclaim ([`super::CachedRows::reclaim`]) and the miniature
//! caches' second chance (`crate::minicache`) both walk their pages through the same
//! [`Evict::keeps`].

/// A way to make room (see the module doc).
pub trait Evict: Copy + Send + Sync + 'static {
    /// What reports call it.
    const NAME: &'static str;

    /// Whether a full cache makes room at all (else it was filled once and only read
    /// through after).
    const RECLAIMS: bool;

    /// A cached row's fate in a reclaim pass, given whether it was referenced since the
    /// last pass: kept (its reference cleared) or dropped.
    fn keeps(referenced: bool) -> bool;
}

/// Second chance (CLOCK over pages): a row referenced since the last pass stays, once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SecondChance;

impl Evict for SecondChance {
    const NAME: &'static str = "second-chance";
    const RECLAIMS: bool = true;

    #[inline]
    fn keeps(referenced: bool) -> bool {
        referenced
    }
}

/// No eviction: what is cached stays (a cache filled once).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Never;

impl Evict for Never {
    const NAME: &'static str = "never";
    const RECLAIMS: bool = false;

    #[inline]
    fn keeps(_referenced: bool) -> bool {
        true
    }
}

/// An eviction as a policy names it: one arm per [`Evict`] type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Eviction {
    /// [`SecondChance`].
    SecondChance,
    /// [`Never`].
    Never,
}

impl Eviction {
    /// Its name.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Eviction::SecondChance => SecondChance::NAME,
            Eviction::Never => Never::NAME,
        }
    }

    /// Whether a full cache makes room ([`Evict::RECLAIMS`]).
    #[must_use]
    pub fn reclaims(self) -> bool {
        match self {
            Eviction::SecondChance => SecondChance::RECLAIMS,
            Eviction::Never => Never::RECLAIMS,
        }
    }
}
