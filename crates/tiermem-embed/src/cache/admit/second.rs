//! `second`: a miss goes in on the row's second miss within a window: the first sets a
//! "seen" mark ([`super::Seen`]: a bit of the row's pointer-table entry), and each reclaim
//! or flush forgets the marks of a quarter of the table, so rows used once do not push out
//! rows that are reused. The `admit` cache policy's admission.

use super::{no_arg, Admit, Seen};

/// `second`.
#[derive(Debug, Clone, Copy)]
pub struct SecondMiss;

impl Admit for SecondMiss {
    const NAME: &'static str = "second";

    fn parse(arg: Option<&str>) -> Result<Self, String> {
        no_arg(arg).map(|()| SecondMiss)
    }

    fn decides_misses(&self) -> bool {
        true
    }

    fn miss(&self, row: u64, seen: &impl Seen) -> bool {
        seen.seen_or_mark(row as usize)
    }

    fn after_room_made(&self, seen: &impl Seen) {
        seen.age();
    }
}
