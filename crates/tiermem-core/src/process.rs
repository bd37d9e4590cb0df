//! What belongs to one process.
//!
//! - [`Born`]: the process an object was made in. A forked child inherits its parent's
//!   managers, tables and files, but not their threads, and shares their file locks (a
//!   `flock` belongs to the open file description): using them would lose its updates or
//!   hang on a lock a thread that does not exist holds. Every manager and table lock checks
//!   its object's [`Born`] first ([`crate::lock_order::may_block_in`]), so a child's use is
//!   a clear error; objects the child makes itself work.
//! - The thread pools: the kernels' ([`in_kernel_pool`]) and the block files' I/O pools
//!   ([`io_pool`], one per queue depth, shared by every file). rayon's global pool is never
//!   used: it panics for the rest of the process if it cannot start its threads (a task
//!   limit), and has no threads in a forked child. These pools are made on first use, per
//!   process (a child makes its own), and a pool that cannot start is an error for that
//!   call only: the next call tries again.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, Once, PoisonError};

use rayon::ThreadPool;

use crate::{Error, Result};

/// This process's id, cached: no system call on the lock paths that check it. A child
/// handler registered with `pthread_atfork` clears it, so a forked child reads its own.
static PID: AtomicU32 = AtomicU32::new(0);
static AT_FORK: Once = Once::new();

extern "C" fn forked_child() {
    PID.store(0, Ordering::Relaxed); // an atomic store: async-signal-safe
}

/// This process's id (cached; right in a forked child).
#[must_use]
pub fn pid() -> u32 {
    AT_FORK.call_once(|| {
        // SAFETY: registers a handler that only stores to an atomic; no pointers are passed.
        unsafe { libc::pthread_atfork(None, None, Some(forked_child)) };
    });
    match PID.load(Ordering::Relaxed) {
        0 => {
            let p = std::process::id();
            PID.store(p, Ordering::Relaxed);
            p
        }
        p => p,
    }
}

/// The process an object was made in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Born(u32);

impl Born {
    /// This process.
    #[must_use]
    pub fn now() -> Self {
        Born(pid())
    }

    /// Whether this is the process the object was made in.
    #[must_use]
    pub fn is_here(self) -> bool {
        self.0 == pid()
    }

    /// An error if this is not the process the object (`what`) was made in.
    pub fn check(self, what: &str) -> Result<()> {
        let me = pid();
        if me == self.0 {
            return Ok(());
        }
        Err(Error::Poisoned(format!(
            "{what}: the object belongs to process {} and this is process {me}, a forked child; \
             its locks, threads and files stay the parent's, so the child cannot use it (its \
             updates would be lost or it would hang). Make tiermem objects in the child after \
             the fork, or start workers with the 'spawn' or 'forkserver' method",
            self.0
        )))
    }
}

/// This process's pools: `(pid, kernels, I/O pools by depth)`. A leaf lock, held only to
/// look a pool up or make one (never while a pool runs anything).
type Pools = (
    u32,
    Option<Arc<ThreadPool>>,
    HashMap<usize, Arc<ThreadPool>>,
);
static POOLS: Mutex<Option<Pools>> = Mutex::new(None);

fn pools<T>(f: impl FnOnce(&mut Pools) -> T) -> T {
    let mut g = POOLS.lock().unwrap_or_else(PoisonError::into_inner);
    let me = pid();
    if g.as_ref().is_none_or(|p| p.0 != me) {
        // A forked child's copies of the parent's pools have no threads: forgotten, never
        // dropped (dropping would wait for threads that do not exist here).
        if let Some(old) = g.take() {
            std::mem::forget(old);
        }
        *g = Some((me, None, HashMap::new()));
    }
    f(g.as_mut().expect("just set"))
}

fn build(threads: usize, name: &'static str) -> Result<Arc<ThreadPool>> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(move |i| format!("{name}-{i}"))
        .build()
        .map(Arc::new)
        .map_err(|e| {
            Error::InvalidArgument(format!(
                "cannot start {} threads for tiermem's {name} pool ({e}): the process is at \
                 its thread or task limit (ulimit -u, the cgroup's pids.max); the next call \
                 tries again",
                if threads == 0 {
                    "its".to_owned()
                } else {
                    threads.to_string()
                }
            ))
        })
}

/// Run `f` on this process's kernel pool (one thread per core, or `RAYON_NUM_THREADS`), so
/// the parallel iterators inside it use that pool; on a thread of a pool already, `f` runs
/// there.
pub fn in_kernel_pool<R: Send>(f: impl FnOnce() -> R + Send) -> Result<R> {
    if rayon::current_thread_index().is_some() {
        return Ok(f());
    }
    Ok(kernel_pool()?.install(f))
}

thread_local! {
    /// This thread's handle on its process's kernel pool, so a lookup takes no global lock.
    static KERNELS: std::cell::RefCell<Option<(u32, Arc<ThreadPool>)>> = const { std::cell::RefCell::new(None) };
}

/// This process's kernel pool, made on first use.
fn kernel_pool() -> Result<Arc<ThreadPool>> {
    let me = pid();
    if let Some(k) =
        KERNELS.with_borrow(|c| c.as_ref().filter(|c| c.0 == me).map(|c| Arc::clone(&c.1)))
    {
        return Ok(k);
    }
    let k = pools(|p| match &p.1 {
        Some(k) => Ok(Arc::clone(k)),
        None => {
            let k = build(0, "kernels")?;
            p.1 = Some(Arc::clone(&k));
            Ok(k)
        }
    })?;
    KERNELS.with_borrow_mut(|c| {
        // A forked child's stale handle (its parent's pool) is forgotten, never dropped.
        if let Some(old) = c.replace((me, Arc::clone(&k))) {
            if old.0 != me {
                std::mem::forget(old);
            }
        }
    });
    Ok(k)
}

/// Threads of the kernel pool: the calling pool's when on one, else this process's kernel
/// pool's, else (it cannot start) the cores.
#[must_use]
pub fn kernel_threads() -> usize {
    if rayon::current_thread_index().is_some() {
        return rayon::current_num_threads();
    }
    kernel_pool().map_or_else(
        |_| std::thread::available_parallelism().map_or(1, std::num::NonZero::get),
        |k| k.current_num_threads(),
    )
}

/// The I/O pool of `depth` threads every block file of that queue depth shares.
pub fn io_pool(depth: usize) -> Result<Arc<ThreadPool>> {
    pools(|p| {
        if let Some(k) = p.2.get(&depth) {
            return Ok(Arc::clone(k));
        }
        let k = build(depth, "blockio")?;
        p.2.insert(depth, Arc::clone(&k));
        Ok(k)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_refuse_another_process_and_pools_are_shared() {
        Born::now().check("a table").unwrap();
        let e = Born(std::process::id().wrapping_add(1))
            .check("table 't'")
            .unwrap_err();
        assert!(e.to_string().contains("forked child"), "{e}");
        let (a, b) = (io_pool(3).unwrap(), io_pool(3).unwrap());
        assert!(Arc::ptr_eq(&a, &b) && a.current_num_threads() == 3);
        use rayon::prelude::*;
        let s: u64 = in_kernel_pool(|| (0..1000u64).into_par_iter().sum()).unwrap();
        assert_eq!(s, 499_500);
    }
}
