//! A background mover: a thread of its own that prefetches objects into fast memory and
//! writes dirty ones back ahead of their eviction, on requests a caller queues without
//! waiting (the look-ahead of tiered tensors' `async` variant). Requests go down a channel;
//! the thread takes the manager lock per request like any caller and never touches Python,
//! so a caller that queues holds no lock and crosses no GIL hand-off. A request for an object
//! freed meanwhile, pinned or without room is skipped and counted.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;

use super::Manager;
use crate::mechanism::ObjectId;
use crate::Result;

/// One request to the mover.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Move {
    /// A forced prefetch into fast memory ([`Manager::prefetch`]).
    Prefetch(ObjectId),
    /// A write-back that leaves the object clean where it is ([`Manager::writeback`]).
    Writeback(ObjectId),
}

/// What a mover did: prefetches made, write-backs that cleaned an object, requests skipped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MoverCounts {
    /// Prefetches made (an object already in fast memory counts: it is where it was asked).
    pub prefetched: u64,
    /// Write-backs that left their object clean.
    pub written_back: u64,
    /// Requests that did nothing: the object freed, pinned, or no room.
    pub skipped: u64,
}

#[derive(Default)]
struct Counts([AtomicU64; 3]);

/// The mover thread and its queue (see the module doc). Dropping it stops the thread after
/// the requests already queued.
pub struct Mover {
    tx: Option<Sender<Move>>,
    thread: Option<JoinHandle<()>>,
    counts: Arc<Counts>,
}

impl Mover {
    /// Start a mover for `manager` (its thread is named `tiermem-mover`).
    pub fn start(manager: Arc<Manager>) -> Result<Mover> {
        let (tx, rx) = channel::<Move>();
        let counts = Arc::new(Counts::default());
        let c = counts.clone();
        let thread = std::thread::Builder::new()
            .name("tiermem-mover".into())
            .spawn(move || {
                for m in rx {
                    let slot = match m {
                        Move::Prefetch(id) => match manager.prefetch(id, true) {
                            Ok(()) => 0,
                            Err(_) => 2,
                        },
                        Move::Writeback(id) => match manager.writeback(id) {
                            Ok(true) => 1,
                            Ok(false) | Err(_) => 2,
                        },
                    };
                    c.0[slot].fetch_add(1, Ordering::Relaxed);
                }
            })
            .map_err(|e| {
                crate::Error::io("-", "tiermem-mover", "cannot start the mover thread", e)
            })?;
        Ok(Mover {
            tx: Some(tx),
            thread: Some(thread),
            counts,
        })
    }

    /// Queue a request; returns at once. Ignored once the mover is stopped.
    pub fn push(&self, m: Move) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(m);
        }
    }

    /// What the mover has done so far.
    pub fn counts(&self) -> MoverCounts {
        let get = |i: usize| self.counts.0[i].load(Ordering::Relaxed);
        MoverCounts {
            prefetched: get(0),
            written_back: get(1),
            skipped: get(2),
        }
    }

    /// Stop after the requests already queued, and wait for the thread.
    pub fn stop(&mut self) {
        self.tx = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Mover {
    fn drop(&mut self) {
        self.stop();
    }
}
