//! Admission: which rows a cache takes in. One trait, [`Admit`], answers every question a
//! cache asks about a row it does not hold: a miss of a lookup that caches (a cache over
//! memory: copy it in now?), a row asked for by a staged call (a cache over a file: in with
//! or without the reference mark?), and a row a read brought for free (a block's
//! neighbours: in too?). Each admission is one file here and one name in the
//! `admissions!` line below, which builds the [`Admission`] enum caches hold (matched, never a
//! virtual call, per row), its registry ([`NAMES`], exported to Python) and the parser.
//! The miniature caches (`crate::minicache`) replay through the same objects.
//!
//! A cache policy ([`super::CachePolicy`]) names its default admission; a table's
//! placement may choose another.

mod block;
mod row;
mod second;
mod shadow;
mod threshold;
mod tinylfu;

pub use block::Block;
pub use row::Row;
pub use second::SecondMiss;
pub use shadow::Shadow;
pub use threshold::Threshold;
pub use tinylfu::{Sketch, TinyLfu};

use tiermem_core::{bail, Result};

/// Per-row "missed before" marks an admission may keep: the table's cache keeps them in its
/// pointer-table entries, a simulation in a vector.
pub trait Seen {
    /// Whether `row` missed before (since its mark was last aged); marks it if not.
    fn seen_or_mark(&self, row: usize) -> bool;
    /// Forget the marks of the next part of the table (round robin).
    fn age(&self);
}

/// What a staged cache knows about rows beyond their accesses.
#[derive(Clone, Copy, Default)]
pub struct Known<'a> {
    /// Per row, how many queries of the layout's training trace held it.
    pub counts: Option<&'a [u32]>,
}

impl Known<'_> {
    /// Row `row`'s count (0 when none were given or the row is beyond them).
    #[must_use]
    pub fn count(&self, row: u64) -> Option<u32> {
        self.counts
            .map(|c| c.get(row as usize).copied().unwrap_or(0))
    }
}

/// An admission.
pub trait Admit: Sized + Send + Sync {
    /// Registry name: the word before any `:`.
    const NAME: &'static str;

    /// Build from the text after `NAME:` (`None` when there is none), or say what is wrong.
    fn parse(arg: Option<&str>) -> std::result::Result<Self, String>;

    /// The text [`Admit::parse`] reads back, `NAME` included.
    fn name(&self) -> String {
        Self::NAME.to_owned()
    }

    /// Fit what it remembers to a cache of `slots` rows (called when the cache is built, and
    /// by a simulation with its scaled size).
    fn sized(&mut self, _slots: usize) {}

    /// Whether it needs [`Known::counts`] (the simulation refuses to run without them).
    fn needs_counts(&self) -> bool {
        false
    }

    /// Whether it watches every access ([`Admit::touch`]) or decides misses
    /// ([`Admit::miss`]): caches call `touch` and `miss` only then, so that admitting every
    /// miss costs their lookups and staging nothing.
    fn decides_misses(&self) -> bool {
        false
    }

    /// An access of `row`, hit or miss, before it is answered.
    fn touch(&self, _row: u64) {}

    /// A miss of `row` by a lookup of a cache over memory that caches: take it in now?
    fn miss(&self, _row: u64, _seen: &impl Seen) -> bool {
        true
    }

    /// The rows a staged call asks for, each access once (repeats included).
    fn asked(&self, _rows: &[u64], _slots: usize) {}

    /// A row a staged call asked for goes in without the reference mark (it leaves at the
    /// next reclaim unless hit again)?
    fn cold(&self, _row: u64, _known: Known<'_>) -> bool {
        false
    }

    /// A row the home's read brought beside those asked for (a block's neighbour): take it
    /// in, unmarked?
    fn neighbour(&self, _row: u64, _known: Known<'_>) -> bool {
        false
    }

    /// A reclaim or flush made room (the table's exclusive lock held).
    fn after_room_made(&self, _seen: &impl Seen) {}
}

macro_rules! admissions {
    ($($ty:ident),* $(,)?) => {
        /// An admission as a cache holds it: one variant per [`Admit`].
        pub enum Admission {
            $(
                #[doc = concat!("[`", stringify!($ty), "`]")]
                $ty($ty),
            )*
        }

        /// Every admission's name, in registry order.
        pub const NAMES: &[&str] = &[$($ty::NAME),*];

        impl Admission {
            /// `NAME` or `NAME:ARG` as each admission reads it.
            pub fn parse(s: &str) -> Result<Self> {
                let (kind, arg) = s.split_once(':').map_or((s, None), |(k, a)| (k, Some(a)));
                $(
                    if kind == $ty::NAME {
                        return match $ty::parse(arg) {
                            Ok(a) => Ok(Admission::$ty(a)),
                            Err(why) => bail!("admission '{s}': {why} (known: {})", FORMS),
                        };
                    }
                )*
                bail!("admission '{s}': unknown kind (known: {})", FORMS)
            }

            /// The text [`Admission::parse`] reads back.
            #[must_use]
            pub fn name(&self) -> String {
                match self { $(Admission::$ty(a) => a.name(),)* }
            }

            /// See [`Admit::sized`].
            pub fn sized(&mut self, slots: usize) {
                match self { $(Admission::$ty(a) => a.sized(slots),)* }
            }

            /// See [`Admit::needs_counts`].
            #[must_use]
            pub fn needs_counts(&self) -> bool {
                match self { $(Admission::$ty(a) => a.needs_counts(),)* }
            }

            /// See [`Admit::decides_misses`].
            #[must_use]
            pub fn decides_misses(&self) -> bool {
                match self { $(Admission::$ty(a) => a.decides_misses(),)* }
            }

            /// See [`Admit::touch`].
            #[inline(always)]
            pub fn touch(&self, row: u64) {
                match self { $(Admission::$ty(a) => a.touch(row),)* }
            }

            /// See [`Admit::miss`].
            #[inline(always)]
            pub fn miss(&self, row: u64, seen: &impl Seen) -> bool {
                match self { $(Admission::$ty(a) => a.miss(row, seen),)* }
            }

            /// See [`Admit::asked`].
            pub fn asked(&self, rows: &[u64], slots: usize) {
                match self { $(Admission::$ty(a) => a.asked(rows, slots),)* }
            }

            /// See [`Admit::cold`].
            #[must_use]
            pub fn cold(&self, row: u64, known: Known<'_>) -> bool {
                match self { $(Admission::$ty(a) => a.cold(row, known),)* }
            }

            /// See [`Admit::neighbour`].
            #[must_use]
            pub fn neighbour(&self, row: u64, known: Known<'_>) -> bool {
                match self { $(Admission::$ty(a) => a.neighbour(row, known),)* }
            }

            /// See [`Admit::after_room_made`].
            pub fn after_room_made(&self, seen: &impl Seen) {
                match self { $(Admission::$ty(a) => a.after_room_made(seen),)* }
            }
        }
    };
}

/// The forms [`Admission::parse`] reads, for messages.
const FORMS: &str = "row, row:T, block, threshold:T, shadow:M, second, tinylfu";

admissions!(Row, Block, Threshold, Shadow, SecondMiss, TinyLfu);

impl std::fmt::Debug for Admission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name())
    }
}

impl PartialEq for Admission {
    fn eq(&self, other: &Self) -> bool {
        self.name() == other.name()
    }
}

impl Clone for Admission {
    /// A fresh admission of the same name and settings (what it remembered is not copied).
    fn clone(&self) -> Self {
        Admission::parse(&self.name()).unwrap_or_else(|e| unreachable!("{e}"))
    }
}

impl Default for Admission {
    fn default() -> Self {
        Admission::Row(Row::default())
    }
}

/// A count `T` after `NAME:` (default `dflt`).
pub(super) fn count_arg(arg: Option<&str>, dflt: u32) -> std::result::Result<u32, String> {
    arg.map_or(Ok(dflt), |a| {
        a.parse::<u32>()
            .map_err(|_| "the threshold is a count of accesses, a whole number".to_owned())
    })
}

/// No argument after `NAME`.
pub(super) fn no_arg(arg: Option<&str>) -> std::result::Result<(), String> {
    match arg {
        None => Ok(()),
        Some(_) => Err("takes no argument".to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_bad_input_is_named() {
        for s in [
            "row",
            "block",
            "threshold:0",
            "threshold:7",
            "row:2",
            "shadow:1.5",
            "shadow:0.01",
            "second",
            "tinylfu",
        ] {
            assert_eq!(Admission::parse(s).unwrap().name(), s);
        }
        assert_eq!(Admission::parse("threshold").unwrap().name(), "threshold:1");
        for s in [
            "rows",
            "block:2",
            "row:x",
            "threshold:-1",
            "threshold:x",
            "shadow:0",
            "shadow:nan",
            "second:1",
            "tinylfu:x",
            "",
        ] {
            let e = Admission::parse(s).unwrap_err().to_string();
            assert!(e.contains(&format!("'{s}'")), "{e}");
        }
        for n in NAMES {
            assert!(
                FORMS.contains(n),
                "{n} is missing from the forms messages list"
            );
        }
    }
}
