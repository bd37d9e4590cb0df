//! Which rows are cached, a bit per row: what a lookup reads before the pointer table.
//!
//! A miss that reads only its row's entry to learn that the row is at home pays a random
//! access to the pointer table (4 bytes a row: megabytes, beyond the CPU caches) before it
//! can read the row. The bitmap is 32 times smaller (a 250,000-row table's fits in 32 KiB),
//! so it stays in the CPU caches and a miss goes home without touching the entry; a hit
//! reads the bit and then the entry, as before.
//!
//! A row's bit is set after its entry is published as cached and cleared when it leaves
//! the cache (under the table's exclusive lock), so under the shared lock a set bit means
//! the entry is cached, and a clear bit means the row is at home or being cached by another
//! thread right now (whose home copy stays valid until the exclusive lock is taken). The
//! entry remains the truth: callers that act on a set bit still read the entry.

use std::sync::atomic::{AtomicU64, Ordering};

/// The bitmap of cached rows.
pub(super) struct Present {
    bits: Box<[AtomicU64]>,
    rows: usize,
}

impl Present {
    /// No row cached, room for `rows` rows.
    pub(super) fn new(rows: usize) -> Self {
        let bits: Box<[AtomicU64]> = (0..rows.div_ceil(64)).map(|_| AtomicU64::new(0)).collect();
        Present { bits, rows }
    }

    /// Bytes the bitmap of a table of `rows` rows takes (whole 8-byte words).
    pub(super) fn bytes_for(rows: usize) -> u64 {
        8 * rows.div_ceil(64) as u64
    }

    #[inline(always)]
    fn word(&self, row: usize) -> &AtomicU64 {
        debug_assert!(row < self.rows);
        // SAFETY: every caller passes a row already checked against the table's rows, and
        // the bitmap has a bit for each (`rows.div_ceil(64)` words).
        unsafe { self.bits.get_unchecked(row / 64) }
    }

    /// Whether row `row` is cached (see the module's note on concurrent caching).
    #[inline(always)]
    pub(super) fn get(&self, row: usize) -> bool {
        self.word(row).load(Ordering::Relaxed) & (1 << (row % 64)) != 0
    }

    /// Row `row` is now cached (after its entry is published).
    #[inline(always)]
    pub(super) fn set(&self, row: usize) {
        self.word(row).fetch_or(1 << (row % 64), Ordering::Release);
    }

    /// Row `row` left the cache. Under the table's exclusive lock, so no other thread
    /// writes the word: a plain load and store, not a locked read-modify-write, which would
    /// stall a reclaim's loop on every row it drops until the loads before it completed.
    #[inline(always)]
    pub(super) fn clear(&self, row: usize) {
        let w = self.word(row);
        w.store(
            w.load(Ordering::Relaxed) & !(1 << (row % 64)),
            Ordering::Relaxed,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bits_are_set_and_cleared_per_row() {
        let p = Present::new(130);
        for r in [0, 63, 64, 129] {
            assert!(!p.get(r));
            p.set(r);
            assert!(p.get(r));
        }
        p.clear(63);
        assert!(!p.get(63) && p.get(64) && p.get(0));
        assert!(p.get(129) && !p.get(128));
        assert_eq!(Present::bytes_for(130), 24);
    }
}
