//! The lock order, written down and enforced in one place.
//!
//! 1. The manager lock (`Manager::with`) before any table lock; a table lock holder never
//!    takes the manager lock.
//! 2. Table locks in address order, shared or exclusive alike
//!    (`tiermem_embed::table::locks::{for_lookup, exclusive_all}`).
//! 3. No manager or table lock is taken on a thread of the rayon pool: jobs on the pool may
//!    be what a lock holder waits for, so a pool worker blocked on a lock can deadlock it.
//!    Kernels on the pool only touch tables whose locks their caller holds; copies on the
//!    copy engine's pools take no lock.
//! 4. No lock is waited for by a thread that holds a resource the lock's holder may need. The
//!    binding installs [`set_blocking_check`] so that a thread holding Python's GIL (which a
//!    Python policy needs under the manager lock) is refused instead of deadlocking.
//!
//! 5. The traits registry (`traits::Traited`) is locked only inside the manager lock, and
//!    never held when a manager call starts.
//! 6. The C API's H2M state lock (`tiermem-capi`, `h2m::state`) is taken before any manager
//!    call and never while a manager or table lock is held.
//!
//! Leaf locks take nothing else and wait only for the kernel or another process: among them
//! the DRAM probe's file lock (`calib::shared`), held while a process's DRAM figures are
//! first fetched, before the devices of the manager that asks for them exist.
//!
//! The process's pool registry (`process`) and the device files' registry
//! (`sys::devfile`) are leaf locks too, held only to look up or record an entry.
//!
//! [`may_block_in`] is called before every manager and table lock is taken: it refuses a
//! forked child's use of its parent's object, then runs [`may_block`].

use std::sync::OnceLock;

use crate::{Error, Result};

/// Returns why the current thread must not block on a tiermem lock, if it must not.
pub type BlockingCheck = fn() -> Option<String>;

static CHECK: OnceLock<BlockingCheck> = OnceLock::new();

/// Install the check [`may_block`] runs (once per process; later calls are ignored).
pub fn set_blocking_check(check: BlockingCheck) {
    let _ = CHECK.set(check);
}

/// [`may_block`] for the lock of an object made in process `born`: a forked child's use of
/// its parent's object is refused first ([`crate::process::Born::check`]).
pub fn may_block_in(what: &str, born: crate::process::Born) -> Result<()> {
    born.check(what)?;
    may_block(what)
}

/// Whether the current thread may wait for the lock named `what` (rules 3 and 4).
pub fn may_block(what: &str) -> Result<()> {
    if let Some(i) = rayon::current_thread_index() {
        return Err(Error::LockOrder(format!(
            "{what} requested on rayon pool worker {i}: call tiermem from your own threads, \
             not from inside a rayon job"
        )));
    }
    if let Some(why) = CHECK.get().and_then(|c| c()) {
        return Err(Error::LockOrder(format!("{what} requested while {why}")));
    }
    Ok(())
}
