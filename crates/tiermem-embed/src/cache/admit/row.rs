//! `row` (Bandana's baseline): every miss goes in, a block's other rows do not. `row:T`: the
//! same, but a row asked for that the layout's training trace held in at most `T` queries
//! goes in without the reference mark, so the next reclaim drops it unless it is hit again
//! (the rows a trace holds once or never seldom come back before then).

use super::{count_arg, Admit, Known};

/// `row` (`cold: None`) or `row:T` (`cold: Some(T)`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Row {
    /// Rows asked for with at most this count go in cold.
    pub cold: Option<u32>,
}

impl Admit for Row {
    const NAME: &'static str = "row";

    fn parse(arg: Option<&str>) -> Result<Self, String> {
        Ok(Row {
            cold: arg.map(|a| count_arg(Some(a), 1)).transpose()?,
        })
    }

    fn name(&self) -> String {
        self.cold
            .map_or_else(|| "row".into(), |t| format!("row:{t}"))
    }

    fn needs_counts(&self) -> bool {
        self.cold.is_some()
    }

    fn cold(&self, row: u64, known: Known<'_>) -> bool {
        self.cold
            .is_some_and(|t| known.count(row).is_some_and(|n| n <= t))
    }
}
