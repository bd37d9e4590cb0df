//! Injected I/O errors, for the tests that a failed read or write in the middle of a batch
//! is an error naming the table, block and file, and that no row loses its last written
//! value. Off unless armed ([`BlockFile::inject_faults`]); when off, each read batch or
//! write costs one relaxed atomic load.

use std::sync::atomic::{AtomicU64, Ordering};

use super::BlockFile;

const OFF: u64 = u64::MAX;
/// Linux's `EIO`, the error a failing disk gives.
const EIO: i32 = 5;

/// Requests to let through before every later one fails, per direction.
#[derive(Debug)]
pub(super) struct Faults {
    reads: AtomicU64,
    writes: AtomicU64,
}

impl Default for Faults {
    fn default() -> Self {
        Faults {
            reads: AtomicU64::new(OFF),
            writes: AtomicU64::new(OFF),
        }
    }
}

/// Count one request against `left`; an error once none are left.
fn take(left: &AtomicU64) -> Option<std::io::Error> {
    let mut cur = left.load(Ordering::Relaxed);
    loop {
        match cur {
            OFF => return None,
            0 => return Some(std::io::Error::from_raw_os_error(EIO)),
            n => match left.compare_exchange_weak(cur, n - 1, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return None,
                Err(now) => cur = now,
            },
        }
    }
}

impl Faults {
    pub(super) fn read(&self) -> Option<std::io::Error> {
        take(&self.reads)
    }

    pub(super) fn write(&self) -> Option<std::io::Error> {
        take(&self.writes)
    }
}

impl BlockFile {
    /// Make read requests (a run of blocks each) fail with `EIO` after `reads` more have
    /// succeeded, and writes after `writes` more; `None` turns a direction off. For fault
    /// tests: a real disk's errors take the same paths.
    pub fn inject_faults(&self, reads: Option<u64>, writes: Option<u64>) {
        self.faults
            .reads
            .store(reads.unwrap_or(OFF), Ordering::Relaxed);
        self.faults
            .writes
            .store(writes.unwrap_or(OFF), Ordering::Relaxed);
    }
}
