//! The table cache's own eviction, simulated: pages of slots walked as
//! [`crate::cache::CachedRows`]'s reclaim walks them, each row decided by the same
//! [`Evict::keeps`] (second chance: [`crate::cache::evict::SecondChance`]). Slots are bumped page by page up to the page
//! limit; a full cache's reclaim walks whole pages, oldest first, where a row used since
//! the last pass keeps its slot (its mark cleared) and the others leave, their slots becoming
//! holes that new rows fill (lowest slot first) before any page is bumped; walked
//! pages go to the back of the queue; a reclaim stops once the rows wanted, and at least the
//! slack, are free. A row asked for goes in marked, unless `cold`; a block's other rows go
//! in unmarked, as many as fit once room is made.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use std::marker::PhantomData;

use super::{SimCache, NIL};
use crate::cache::{CachedRows, Evict};
use tiermem_core::{ensure, Result};

/// The simulated cache of `pages` pages of `page_rows` slots, evicting by `E`.
pub(super) struct Clock<E: Evict> {
    slot_of: Vec<u32>,
    marked: Vec<bool>,
    row_at: Vec<u32>,
    page_rows: usize,
    pages: usize,
    /// Pages in use, next to walk first.
    active: VecDeque<usize>,
    /// The page being bumped and its slots used.
    current: Option<(usize, usize)>,
    /// Free slots in live pages, lowest first (as the table's bitmap gives them).
    holes: BinaryHeap<Reverse<u32>>,
    /// Slots a reclaim frees at least.
    slack: usize,
    evict: PhantomData<E>,
}

impl<E: Evict> Clock<E> {
    /// For a table of `n` rows, reclaims freeing at least `slack` slots.
    pub(super) fn new(n: usize, pages: usize, page_rows: usize, slack: usize) -> Self {
        Clock {
            slot_of: vec![NIL; n],
            marked: vec![false; n],
            row_at: vec![NIL; pages * page_rows],
            page_rows,
            pages,
            active: VecDeque::with_capacity(pages),
            current: None,
            holes: BinaryHeap::new(),
            slack: slack.max(1),
            evict: PhantomData,
        }
    }

    /// The table's own cache of `capacity` rows of `row_bytes` bytes (its pages, as
    /// [`CachedRows::frame_rows`] sizes them), freeing at least `slack_rows` per reclaim, for
    /// a trace sampled at `rate`: the page count kept, each page and the slack scaled.
    pub(super) fn for_table(
        n: usize,
        capacity: usize,
        row_bytes: usize,
        slack_rows: usize,
        rate: f64,
    ) -> Result<Self> {
        ensure!(row_bytes > 0, "rows hold at least one byte");
        ensure!(
            slack_rows <= capacity,
            "a cache of {capacity} rows cannot keep a slack of {slack_rows}"
        );
        let slack = ((slack_rows as f64 * rate).round() as usize).max(1);
        let page_rows = CachedRows::frame_rows(capacity.max(1), row_bytes);
        let pages = capacity.max(1).div_ceil(page_rows);
        let scaled_rows = ((page_rows as f64 * rate).round() as usize).max(1);
        Ok(Self::new(n, pages, scaled_rows, slack))
    }

    /// Whether no slot is free ([`CachedRows::isfull`]).
    pub(super) fn is_full(&self) -> bool {
        self.free() == 0
    }

    /// A lookup's reclaim of a full cache ([`CachedRows::reclaim`]): one pass at most,
    /// stopping once the slack is free.
    pub(super) fn reclaim_once(&mut self) {
        self.reclaim(self.slack);
    }

    fn free(&self) -> usize {
        let bumpable = self.current.map_or(0, |(_, used)| self.page_rows - used);
        self.holes.len() + bumpable + (self.pages - self.active.len()) * self.page_rows
    }

    fn alloc(&mut self) -> Option<usize> {
        if let Some(Reverse(s)) = self.holes.pop() {
            return Some(s as usize);
        }
        if let Some((f, used)) = self.current {
            if used < self.page_rows {
                self.current = Some((f, used + 1));
                return Some(f * self.page_rows + used);
            }
        }
        if self.active.len() == self.pages {
            return None;
        }
        let f = self.active.len();
        self.active.push_back(f);
        self.current = Some((f, 1));
        Some(f * self.page_rows)
    }

    /// Walk pages until `want` holes are free or every page was walked once.
    fn reclaim(&mut self, want: usize) {
        let total = self.active.len();
        let mut walked = 0;
        while walked < total && self.holes.len() < want {
            let Some(f) = self.active.pop_front() else {
                break;
            };
            walked += 1;
            let used = match self.current {
                Some((c, used)) if c == f => used,
                _ => self.page_rows,
            };
            for s in f * self.page_rows..f * self.page_rows + used {
                let r = self.row_at[s];
                if r == NIL {
                    continue;
                }
                if E::keeps(self.marked[r as usize]) {
                    self.marked[r as usize] = false;
                } else {
                    self.slot_of[r as usize] = NIL;
                    self.row_at[s] = NIL;
                    self.holes.push(Reverse(s as u32));
                }
            }
            self.active.push_back(f);
        }
    }

    fn put(&mut self, r: u32, mark: bool) -> bool {
        let Some(s) = self.alloc() else {
            return false;
        };
        self.row_at[s] = r;
        self.slot_of[r as usize] = s as u32;
        self.marked[r as usize] = mark;
        true
    }
}

impl<E: Evict> SimCache for Clock<E> {
    fn cached(&self, r: u32) -> bool {
        self.slot_of[r as usize] != NIL
    }

    fn hit(&mut self, r: u32) {
        self.marked[r as usize] = true;
    }

    /// The staged cache's `Room::All`: up to four passes, the call's cached rows marked
    /// again after each.
    fn make_room(&mut self, want: usize, keep: &[u32]) {
        for _ in 0..4 {
            if self.free() >= want {
                break;
            }
            self.reclaim(want.max(self.slack));
            for &r in keep {
                if self.slot_of[r as usize] != NIL {
                    self.marked[r as usize] = true;
                }
            }
        }
    }

    fn insert(&mut self, r: u32, cold: bool, prefetch: bool) -> bool {
        self.put(r, !cold && !prefetch)
    }

    fn capacity(&self) -> usize {
        self.pages * self.page_rows
    }
}
