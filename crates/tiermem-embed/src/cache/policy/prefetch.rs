//! What a cache over a block home does with the other rows of a block it reads for one row
//! (Bandana §4.3): the block comes in whole, whether or not its neighbours are kept.

use tiermem_core::{bail, Result};

/// Admission of a block's other rows. The row asked for is always cached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Prefetch {
    /// Only the row asked for (Bandana's baseline).
    #[default]
    Row,
    /// Only the row asked for; one whose count in the layout's training trace is at most
    /// this goes in without the reference mark, so it leaves at the next reclaim unless
    /// hit again (the rows a trace holds once or never seldom come back before then).
    ColdRow(u32),
    /// Every row of the block (Fig. 10: treated as if asked for, but with no recent use, so
    /// the second-chance reclaim drops unused ones first).
    Block,
    /// A neighbour whose count in the layout's training trace is above this (Fig. 12); a
    /// row asked for whose count is not goes in without the reference mark, so it leaves
    /// at the next reclaim unless hit again.
    Threshold(u32),
    /// A neighbour that is in a shadow cache (row ids only) of the rows asked for, this many
    /// hundredths of the cache's size (Fig. 11b).
    Shadow(u32),
}

/// Prefetch admission kinds, as [`Prefetch::parse`] reads them.
pub const NAMES: &[&str] = &["row", "block", "threshold", "shadow"];

/// The forms [`Prefetch::parse`] reads, for messages.
const FORMS: &str = "row, row:T, block, threshold:T, shadow:M";

impl Prefetch {
    /// `row`, `row:T`, `block`, `threshold:T` (T a count, default 1) or `shadow:M` (M a
    /// multiple of the cache's size, default 1).
    pub fn parse(s: &str) -> Result<Self> {
        let (kind, arg) = s.split_once(':').map_or((s, None), |(k, a)| (k, Some(a)));
        let bad = |why: &str| -> Result<Self> {
            bail!("prefetch admission '{s}': {why} (known: {FORMS})")
        };
        match (kind, arg) {
            ("row", None) => Ok(Prefetch::Row),
            ("block", None) => Ok(Prefetch::Block),
            ("threshold", None) => Ok(Prefetch::Threshold(1)),
            ("threshold" | "row", Some(a)) => match a.parse::<u32>() {
                Ok(t) if kind == "row" => Ok(Prefetch::ColdRow(t)),
                Ok(t) => Ok(Prefetch::Threshold(t)),
                Err(_) => bad("the threshold is a count of accesses, a whole number"),
            },
            ("shadow", None) => Ok(Prefetch::Shadow(100)),
            ("shadow", Some(a)) => match a.parse::<f64>() {
                Ok(m) if m.is_finite() && m > 0.0 && m <= 1000.0 => {
                    Ok(Prefetch::Shadow((m * 100.0).round().max(1.0) as u32))
                }
                _ => bad("the shadow cache's size is a multiple of the cache's, above 0 and at most 1000"),
            },
            ("block", Some(_)) => bad("takes no argument"),
            _ => bad("unknown kind"),
        }
    }

    /// The name `parse` reads back.
    #[must_use]
    pub fn name(&self) -> String {
        match self {
            Prefetch::Row => "row".into(),
            Prefetch::ColdRow(t) => format!("row:{t}"),
            Prefetch::Block => "block".into(),
            Prefetch::Threshold(t) => format!("threshold:{t}"),
            Prefetch::Shadow(m) => format!("shadow:{}", f64::from(*m) / 100.0),
        }
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
        ] {
            assert_eq!(Prefetch::parse(s).unwrap().name(), s);
        }
        assert_eq!(
            Prefetch::parse("threshold").unwrap(),
            Prefetch::Threshold(1)
        );
        for s in [
            "rows",
            "block:2",
            "row:x",
            "threshold:-1",
            "threshold:x",
            "shadow:0",
            "shadow:nan",
            "",
        ] {
            let e = Prefetch::parse(s).unwrap_err().to_string();
            assert!(e.contains(&format!("'{s}'")), "{e}");
        }
    }
}
