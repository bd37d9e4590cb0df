//! Trace following: look-ahead prefetch and write-behind for a caller whose ops repeat from
//! one iteration to the next (tiered tensors' `async` variant), riding on the op's own two
//! calls into the core ([`Manager::op_open`], [`Manager::op_close`]) so that following
//! costs the caller no crossing of its own. The moves it decides go to a [`Mover`] thread.
//!
//! Each op's operands are recorded as keys that survive from one iteration to the next:
//! [`Key::Old`] (an object older than the iteration: parameters, optimizer state) and
//! [`Key::Made`] (the `k`-th output of the op at a position of this iteration). When op *i*
//! opens and matches the op the previous iteration ran at its cursor (by name, allowing
//! [`WINDOW`] ops inserted or dropped), the operands recorded for ops *i+1 … i+depth* are
//! resolved to this iteration's objects and queued to the mover, which prefetches them into
//! fast memory (forced) while op *i* computes. An op with no match is not acted on, and
//! every iteration records a fresh trace, so a changed control flow costs one iteration of
//! look-ahead, never a prefetch of a live object it was not about (object ids are never
//! reused: a stale one is not found).
//!
//! **Write-behind**: operands soft-evicted after a forward op are the next eviction victims,
//! oldest first; once `lag` bytes have been soft-evicted after one that is still allocated,
//! it is queued for a write-back, which leaves it clean in fast memory so that its eviction
//! later copies nothing.
//!
//! [`Mover`]: super::Mover

use std::collections::{HashMap, VecDeque};

use super::mover::MoveSender;
use super::Move;
use crate::mechanism::ObjectId;

/// Ops after the cursor searched for a match (an op inserted or dropped since).
pub const WINDOW: usize = 16;

/// An operand as the trace records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Key {
    /// An object allocated before the iteration began.
    Old(ObjectId),
    /// An output of an op of the iteration.
    Made {
        /// The op's position.
        pos: u32,
        /// Which of its outputs.
        k: u32,
    },
}

/// What a follower has done (see [`TraceFollower`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TraceCounts {
    /// Prefetches queued.
    pub queued: u64,
    /// Write-backs queued.
    pub behind_queued: u64,
    /// Operands not queued: asked for within the last `depth` ops, or an operand of the op
    /// running then that is not soft-evicted after it or is kept in fast memory instead (it
    /// stays where it is for the next).
    pub kept: u64,
    /// Ops not found in the previous trace.
    pub mismatches: u64,
    /// Ops matched after skipping some of the previous trace.
    pub resyncs: u64,
}

/// One op of the caller, as [`Manager::op_open`](super::Manager::op_open) is told of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceOp {
    /// Its position in the iteration.
    pub pos: u32,
    /// Its name, as a number the caller keeps stable.
    pub name: u32,
    /// Whether its read operands are soft-evicted after it.
    pub softening: bool,
}

/// The state of trace following (see the module docs).
pub struct TraceFollower {
    depth: usize,
    lag: u64,
    tx: MoveSender,
    prev: Vec<(u32, Vec<Key>)>,
    cur: Vec<(u32, Vec<Key>)>,
    /// This iteration's outputs: `(pos, k)` -> object, and object -> `(pos, k)`.
    made: HashMap<(u32, u32), ObjectId>,
    born: HashMap<ObjectId, (u32, u32)>,
    /// Previous-trace position -> this iteration's position.
    pmap: HashMap<u32, u32>,
    cursor: usize,
    /// Previous-trace positions before this one are issued.
    issued_to: usize,
    /// Object -> the position of the op that queued it.
    fetched: HashMap<ObjectId, u32>,
    /// Operands of the op now open that stay in fast memory for the next ops: not
    /// soft-evicted after it.
    keep: Vec<ObjectId>,
    behind: VecDeque<(u64, ObjectId)>,
    marked: u64,
    counts: TraceCounts,
}

impl TraceFollower {
    /// Follow with look-ahead `depth` ops and write-behind after `lag` bytes, queueing to
    /// `tx`.
    pub fn new(depth: usize, lag: u64, tx: MoveSender) -> TraceFollower {
        TraceFollower {
            depth,
            lag,
            tx,
            prev: Vec::new(),
            cur: Vec::new(),
            made: HashMap::new(),
            born: HashMap::new(),
            pmap: HashMap::new(),
            cursor: 0,
            issued_to: 0,
            fetched: HashMap::new(),
            keep: Vec::new(),
            behind: VecDeque::new(),
            marked: 0,
            counts: TraceCounts::default(),
        }
    }

    /// What it has done so far.
    pub fn counts(&self) -> TraceCounts {
        self.counts
    }

    /// An iteration starts: this one's trace becomes the one to follow.
    pub fn iteration(&mut self) {
        if !self.cur.is_empty() {
            self.prev = std::mem::take(&mut self.cur);
        }
        self.made.clear();
        self.born.clear();
        self.pmap.clear();
        self.fetched.clear();
        self.behind.clear();
        self.cursor = 0;
        self.issued_to = 0;
        self.marked = 0;
    }

    /// Output `k` of the op at `pos` is object `id`.
    pub fn made(&mut self, pos: u32, k: u32, id: ObjectId) {
        self.made.insert((pos, k), id);
        self.born.insert(id, (pos, k));
    }

    /// Whether the op now open keeps operand `id` in fast memory for the next ops (so it
    /// is not soft-evicted after it).
    pub fn keeps(&self, id: ObjectId) -> bool {
        self.keep.contains(&id)
    }

    /// Op `op` opens with operands `inputs` (each object once, in the caller's order):
    /// record it, find it in the previous trace and queue the operands of the ops after it.
    /// An operand of this op that a next op reads and that is in fast memory (`fast`) is
    /// kept there instead (not soft-evicted after the op: soft-evicting it and prefetching
    /// it back would change nothing but cost the mover a wake-up).
    pub fn op_start(&mut self, op: TraceOp, inputs: &[ObjectId], fast: impl Fn(ObjectId) -> bool) {
        self.keep.clear();
        let keys = inputs
            .iter()
            .map(|id| match self.born.get(id) {
                Some(&(pos, k)) => Key::Made { pos, k },
                None => Key::Old(*id),
            })
            .collect();
        self.cur.push((op.name, keys));
        let Some(c) = self.find(op.name) else {
            return;
        };
        self.pmap.insert(c as u32, op.pos);
        self.cursor = c + 1;
        let lo = (c + 1).max(self.issued_to);
        let hi = (c + 1 + self.depth).min(self.prev.len());
        if lo >= hi {
            return;
        }
        self.issued_to = hi;
        let recent = i64::from(op.pos) - self.depth as i64;
        for j in lo..hi {
            for &key in &self.prev[j].1 {
                let id = match key {
                    Key::Old(id) => id,
                    Key::Made { pos, k } => {
                        let Some(&now) = self.pmap.get(&pos) else {
                            continue;
                        };
                        let Some(&id) = self.made.get(&(now, k)) else {
                            continue;
                        };
                        id
                    }
                };
                let asked = self
                    .fetched
                    .get(&id)
                    .is_some_and(|&p| i64::from(p) >= recent);
                let operand = inputs.contains(&id);
                if asked || (operand && !op.softening) {
                    self.counts.kept += 1;
                    continue;
                }
                if operand && fast(id) {
                    self.keep.push(id);
                    self.counts.kept += 1;
                    continue;
                }
                self.fetched.insert(id, op.pos);
                self.counts.queued += 1;
                self.tx.push(Move::Prefetch(id));
            }
        }
    }

    /// Position of op `name` in the previous trace: the cursor, or the first match within
    /// [`WINDOW`] ops after it.
    fn find(&mut self, name: u32) -> Option<usize> {
        if self.prev.is_empty() {
            return None;
        }
        let end = (self.cursor + WINDOW).min(self.prev.len());
        let found = (self.cursor..end).find(|&c| self.prev[c].0 == name);
        match found {
            Some(c) if c != self.cursor => self.counts.resyncs += 1,
            Some(_) => {}
            None => self.counts.mismatches += 1,
        }
        found
    }

    /// Object `id` (`bytes` long) was soft-evicted; `alive` says whether an object is still
    /// allocated. Queues the write-back of those soft-evicted `lag` bytes ago.
    pub fn softevicted(&mut self, id: ObjectId, bytes: u64, alive: impl Fn(ObjectId) -> bool) {
        self.marked += bytes;
        self.behind.push_back((self.marked, id));
        while let Some(&(at, old)) = self.behind.front() {
            if self.marked - at <= self.lag {
                break;
            }
            self.behind.pop_front();
            if alive(old) {
                self.counts.behind_queued += 1;
                self.tx.push(Move::Writeback(old));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manager::mover::test_sender;

    fn op(pos: u32, name: u32) -> TraceOp {
        TraceOp {
            pos,
            name,
            softening: true,
        }
    }

    #[test]
    fn the_second_iteration_prefetches_the_next_ops_operands() {
        let (tx, rx) = test_sender();
        let mut t = TraceFollower::new(1, 1 << 20, tx);
        t.iteration();
        // Iteration 0: op 0 reads parameter 1 and makes 10; op 1 reads 10 and parameter 2.
        t.op_start(op(0, 7), &[1], |_| false);
        t.made(0, 0, 10);
        t.op_start(op(1, 8), &[10, 2], |_| false);
        assert!(
            rx.try_recv().is_err(),
            "nothing to follow in the first iteration"
        );
        t.iteration();
        t.op_start(op(0, 7), &[1], |_| false);
        t.made(0, 0, 20); // this iteration's output of op 0
        assert_eq!(t.counts().queued, 1);
        t.op_start(op(1, 8), &[20, 2], |_| false);
        let got: Vec<Move> = rx.try_iter().collect();
        // At op 0: op 1's operands, resolved: 10's twin is not made yet (skipped), 2 queued.
        assert_eq!(got, vec![Move::Prefetch(2)]);
        assert_eq!(t.counts().mismatches, 0);
    }

    #[test]
    fn an_inserted_op_resyncs_and_an_unknown_one_mismatches() {
        let (tx, _rx) = test_sender();
        let mut t = TraceFollower::new(2, 0, tx);
        t.iteration();
        for (p, n) in [(0, 1), (1, 2), (2, 3)] {
            t.op_start(op(p, n), &[], |_| false);
        }
        t.iteration();
        t.op_start(op(0, 1), &[], |_| false);
        t.op_start(op(1, 9), &[], |_| false); // inserted: no match
        t.op_start(op(2, 3), &[], |_| false); // op 2 dropped: resync
        assert_eq!(t.counts().mismatches, 1);
        assert_eq!(t.counts().resyncs, 1);
    }

    #[test]
    fn an_operand_the_next_op_reads_stays_if_fast_and_is_fetched_if_not() {
        let (tx, rx) = test_sender();
        let mut t = TraceFollower::new(1, 1 << 20, tx);
        t.iteration();
        t.op_start(op(0, 1), &[5, 6], |_| false);
        t.op_start(op(1, 2), &[5, 6], |_| false);
        t.iteration();
        // 5 is in fast memory: kept (not soft-evicted after op 0); 6 is not: queued.
        t.op_start(op(0, 1), &[5, 6], |id| id == 5);
        assert!(t.keeps(5) && !t.keeps(6));
        assert_eq!(rx.try_iter().collect::<Vec<_>>(), vec![Move::Prefetch(6)]);
        t.op_start(op(1, 2), &[5, 6], |_| true);
        assert!(!t.keeps(5), "a new op clears what the last kept");
    }

    #[test]
    fn write_behind_queues_what_lag_bytes_have_passed_if_alive() {
        let (tx, rx) = test_sender();
        let mut t = TraceFollower::new(1, 100, tx);
        t.softevicted(1, 60, |_| true);
        t.softevicted(2, 60, |_| true); // 1 is 60 behind: not yet
        assert!(rx.try_recv().is_err());
        t.softevicted(3, 60, |id| id != 1); // 1 is 120 behind, freed: dropped; 2 is 60
        assert!(rx.try_recv().is_err());
        t.softevicted(4, 60, |_| true); // 2 is 120 behind
        assert_eq!(rx.try_iter().collect::<Vec<_>>(), vec![Move::Writeback(2)]);
        assert_eq!(t.counts().behind_queued, 1);
    }
}
