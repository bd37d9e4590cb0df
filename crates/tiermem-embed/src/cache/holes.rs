//! Free slots inside a cache's live pages: the holes a reclaim leaves where it dropped rows,
//! which new rows take before any page is bumped.
//!
//! A bitmap, one bit per slot. Lookups under the table's shared lock take holes
//! concurrently without a lock: each clears one bit with an atomic `fetch_and`, and the
//! thread that cleared it owns the slot (read-modify-writes of one word are totally ordered,
//! so no two threads clear the same bit). Holes are added and dropped only under the table's
//! exclusive lock (reclaims and flushes), which orders them before the next lookup's takes.
//! The lowest free slot goes first, so a single thread takes holes in a fixed order (the
//! miniature caches' simulation of the table, `minicache::clock`, takes them in the same
//! one).
//!
//! A chain of holes through the back-edges, the earlier form, cost no memory but made every
//! allocation follow a pointer to a random slot under a mutex: a dynamic cache refilling
//! after each reclaim spent a third of its lookup kernel's time there on two threads.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// The free-slot bitmap.
pub(super) struct Holes {
    bits: Box<[AtomicU64]>,
    /// Every word below this one is empty: takes start here (raised past empty words as
    /// takes find them, lowered by [`Holes::put`]).
    cursor: AtomicUsize,
    /// Holes left: exact under the exclusive lock, and never below the true count while
    /// takes run (a take clears its bit before it counts down).
    count: AtomicUsize,
}

impl Holes {
    /// No holes, room for `slots` of them.
    pub(super) fn new(slots: usize) -> Self {
        Holes {
            bits: (0..slots.div_ceil(64)).map(|_| AtomicU64::new(0)).collect(),
            cursor: AtomicUsize::new(0),
            count: AtomicUsize::new(0),
        }
    }

    /// Bytes the bitmap of a cache of `slots` slots takes.
    pub(super) fn bytes_for(slots: usize) -> u64 {
        8 * slots.div_ceil(64) as u64
    }

    /// Holes left (see the field).
    #[inline]
    pub(super) fn len(&self) -> usize {
        self.count.load(Ordering::Relaxed)
    }

    /// Take the lowest free slot, if there is one; any number of threads at once.
    pub(super) fn take(&self) -> Option<usize> {
        let mut w = self.cursor.load(Ordering::Relaxed);
        while let Some(word) = self.bits.get(w) {
            let b = word.load(Ordering::Relaxed);
            if b == 0 {
                // Holes are only added under the exclusive lock, so this word stays empty
                // until then: later takes can start past it.
                self.cursor.fetch_max(w + 1, Ordering::Relaxed);
                w += 1;
                continue;
            }
            let bit = b & b.wrapping_neg();
            if word.fetch_and(!bit, Ordering::Relaxed) & bit != 0 {
                self.count.fetch_sub(1, Ordering::Relaxed);
                return Some(w * 64 + bit.trailing_zeros() as usize);
            }
            // Another thread took that bit first: look at the word again.
        }
        None
    }

    /// Make `slot` a hole. Under the table's exclusive lock, so no take runs and no other
    /// thread writes these words: plain loads and stores, not locked read-modify-writes,
    /// each of which would stall a reclaim's loop until the loads before it completed.
    pub(super) fn put(&self, slot: usize) {
        let (w, bit) = (slot / 64, 1u64 << (slot % 64));
        let before = self.bits[w].load(Ordering::Relaxed);
        debug_assert!(before & bit == 0, "slot {slot} is a hole already");
        self.bits[w].store(before | bit, Ordering::Relaxed);
        let n = self.count.load(Ordering::Relaxed);
        self.count.store(n + 1, Ordering::Relaxed);
        if w < self.cursor.load(Ordering::Relaxed) {
            self.cursor.store(w, Ordering::Relaxed);
        }
    }

    /// Drop the holes among `slots` (a page a flush frees). Under the exclusive lock.
    pub(super) fn drop_range(&self, slots: std::ops::Range<usize>) {
        for s in slots {
            let (w, bit) = (s / 64, 1u64 << (s % 64));
            if self.bits[w].fetch_and(!bit, Ordering::Relaxed) & bit != 0 {
                self.count.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }

    /// Whether `slot` is a hole.
    pub(super) fn contains(&self, slot: usize) -> bool {
        self.bits[slot / 64].load(Ordering::Relaxed) & (1 << (slot % 64)) != 0
    }

    /// Every hole, lowest first (checks).
    pub(super) fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        self.bits.iter().enumerate().flat_map(|(w, word)| {
            let b = word.load(Ordering::Relaxed);
            (0..64)
                .filter(move |k| b & (1 << k) != 0)
                .map(move |k| w * 64 + k)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holes_go_lowest_first_and_each_once() {
        let h = Holes::new(200);
        for s in [130, 5, 64, 199, 6] {
            h.put(s);
        }
        assert_eq!(h.len(), 5);
        assert!(h.contains(64) && !h.contains(65));
        assert_eq!(h.iter().collect::<Vec<_>>(), [5, 6, 64, 130, 199]);
        assert_eq!((h.take(), h.take()), (Some(5), Some(6)));
        // A hole added below the cursor is found again.
        h.put(1);
        h.drop_range(120..150);
        assert_eq!(h.len(), 3);
        assert_eq!(
            std::iter::from_fn(|| h.take()).collect::<Vec<_>>(),
            [1, 64, 199]
        );
        assert_eq!((h.take(), h.len()), (None, 0));
    }

    #[test]
    fn threads_taking_at_once_never_share_a_slot() {
        // Whatever the schedule: every hole is taken exactly once, and the count ends at 0.
        let h = Holes::new(10_000);
        for s in (0..10_000).step_by(3) {
            h.put(s);
        }
        let n = h.len();
        let taken: Vec<Vec<usize>> = std::thread::scope(|sc| {
            let hs: Vec<_> = (0..4)
                .map(|_| sc.spawn(|| std::iter::from_fn(|| h.take()).collect::<Vec<_>>()))
                .collect();
            hs.into_iter().map(|j| j.join().unwrap()).collect()
        });
        let mut all: Vec<usize> = taken.into_iter().flatten().collect();
        all.sort_unstable();
        assert_eq!(all, (0..10_000).step_by(3).collect::<Vec<_>>());
        assert_eq!((all.len(), h.len()), (n, 0));
    }
}
