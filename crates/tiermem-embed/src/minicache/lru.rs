//! Bandana's simulated cache: an LRU list of rows (intrusive, O(1) per operation).

use super::{SimCache, NIL};

/// An LRU list over row ids.
pub(super) struct Lru {
    prev: Vec<u32>,
    next: Vec<u32>,
    cached: Vec<bool>,
    head: u32,
    tail: u32,
    len: usize,
    capacity: usize,
}

impl Lru {
    pub(super) fn new(n: usize, capacity: usize) -> Self {
        Lru {
            prev: vec![NIL; n],
            next: vec![NIL; n],
            cached: vec![false; n],
            head: NIL,
            tail: NIL,
            len: 0,
            capacity,
        }
    }

    fn unlink(&mut self, r: u32) {
        let (p, n) = (self.prev[r as usize], self.next[r as usize]);
        if p == NIL {
            self.head = n;
        } else {
            self.next[p as usize] = n;
        }
        if n == NIL {
            self.tail = p;
        } else {
            self.prev[n as usize] = p;
        }
    }

    /// Move cached row `r` to the tail (next to leave).
    fn move_to_tail(&mut self, r: u32) {
        self.unlink(r);
        self.prev[r as usize] = self.tail;
        self.next[r as usize] = NIL;
        if self.tail != NIL {
            self.next[self.tail as usize] = r;
        }
        self.tail = r;
        if self.head == NIL {
            self.head = r;
        }
    }

    fn push_front(&mut self, r: u32) {
        self.prev[r as usize] = NIL;
        self.next[r as usize] = self.head;
        if self.head != NIL {
            self.prev[self.head as usize] = r;
        }
        self.head = r;
        if self.tail == NIL {
            self.tail = r;
        }
    }

    /// Insert `r` at the head, dropping the tail of a full list.
    fn push(&mut self, r: u32) {
        if self.len == self.capacity {
            let t = self.tail;
            self.unlink(t);
            self.cached[t as usize] = false;
            self.len -= 1;
        }
        self.cached[r as usize] = true;
        self.push_front(r);
        self.len += 1;
    }
}

impl SimCache for Lru {
    fn cached(&self, r: u32) -> bool {
        self.cached[r as usize]
    }

    fn hit(&mut self, r: u32) {
        self.unlink(r);
        self.push_front(r);
    }

    /// An LRU list makes room as it inserts.
    fn make_room(&mut self, _want: usize, _keep: &[u32]) {}

    /// A row asked for at the head, or at the tail if `cold`; a prefetch just behind the
    /// head (behind the row asked for, when a call asks for one).
    fn insert(&mut self, r: u32, cold: bool, prefetch: bool) -> bool {
        if self.capacity == 0 {
            return false;
        }
        self.push(r);
        let head = self.next[r as usize];
        if cold {
            self.move_to_tail(r);
        } else if prefetch && head != NIL {
            // Swap the new head with the row it pushed back.
            self.unlink(head);
            self.push_front(head);
        }
        true
    }

    fn capacity(&self) -> usize {
        self.capacity
    }
}
