//! A background mover: a thread of its own that prefetches objects into fast memory and
//! writes dirty ones back ahead of their eviction, on requests a caller queues without
//! waiting (the look-ahead of tiered tensors' `async` variant). Requests go down a channel;
//! the thread takes the manager lock per request like any caller and never touches Python,
//! so a caller that queues holds no lock and crosses no GIL hand-off. A request for an object
//! freed meanwhile, pinned or without room is skipped and counted. Others may queue to it
//! too ([`Mover::sender`]: the manager's trace follower, `trace.rs`, under the manager lock:
//! sending never waits).

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

/// What goes down the mover's channel: a request, or the word to stop.
enum Msg {
    Move(Move),
    Stop,
}

/// A handle that queues requests to a mover (another owner than the [`Mover`] itself: a
/// trace follower inside the manager). Requests sent after the mover stopped are dropped.
#[derive(Clone)]
pub struct MoveSender(Sender<Msg>);

impl MoveSender {
    /// Queue a request; returns at once.
    pub fn push(&self, m: Move) {
        let _ = self.0.send(Msg::Move(m));
    }
}

/// A sender whose requests land in the returned receiver (for tests of what is queued).
#[cfg(test)]
pub(crate) fn test_sender() -> (MoveSender, TestReceiver) {
    let (tx, rx) = channel();
    (MoveSender(tx), TestReceiver(rx))
}

/// The receiving end of [`test_sender`].
#[cfg(test)]
pub(crate) struct TestReceiver(std::sync::mpsc::Receiver<Msg>);

#[cfg(test)]
impl TestReceiver {
    pub(crate) fn try_recv(&self) -> std::result::Result<Move, ()> {
        match self.0.try_recv() {
            Ok(Msg::Move(m)) => Ok(m),
            _ => Err(()),
        }
    }

    pub(crate) fn try_iter(&self) -> impl Iterator<Item = Move> + '_ {
        std::iter::from_fn(|| self.try_recv().ok())
    }
}

/// The mover thread and its queue (see the module doc). Dropping it stops the thread after
/// the requests already queued, whoever else still holds a [`MoveSender`].
pub struct Mover {
    tx: Option<Sender<Msg>>,
    thread: Option<JoinHandle<()>>,
    counts: Arc<Counts>,
}

impl Mover {
    /// Start a mover for `manager` (its thread is named `tiermem-mover`).
    pub fn start(manager: Arc<Manager>) -> Result<Mover> {
        let (tx, rx) = channel::<Msg>();
        let counts = Arc::new(Counts::default());
        let c = counts.clone();
        let thread = std::thread::Builder::new()
            .name("tiermem-mover".into())
            .spawn(move || {
                for m in rx {
                    let Msg::Move(m) = m else {
                        break;
                    };
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
            let _ = tx.send(Msg::Move(m));
        }
    }

    /// A handle that queues to this mover, or None once it is stopped.
    pub fn sender(&self) -> Option<MoveSender> {
        self.tx.clone().map(MoveSender)
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
        if let Some(tx) = self.tx.take() {
            let _ = tx.send(Msg::Stop);
        }
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
