//! The write-back buffer of a home that writes rows to a file: rows a cache stored
//! ([`super::RowHome::store_row`]) wait here until written together. A write that fails
//! leaves them here, still what reads of those rows return, to be tried again: no update is
//! lost to a full disk or a failed request.

use std::collections::BTreeMap;

use parking_lot::{Mutex, MutexGuard};
use tiermem_core::Result;

/// Rows stored but not yet written (row → bytes). A leaf lock.
#[derive(Default)]
pub(super) struct Pending(Mutex<BTreeMap<u64, Box<[u8]>>>);

impl Pending {
    /// Buffer row `row`'s new bytes.
    pub(super) fn put(&self, row: u64, bytes: &[u8]) {
        self.0.lock().insert(row, bytes.into());
    }

    /// Buffer the `stride` bytes at `src` as row `row`'s new bytes.
    ///
    /// # Safety
    /// `src` is readable for `stride` bytes.
    pub(super) unsafe fn put_raw(&self, row: usize, src: *const u8, stride: usize) {
        // SAFETY: the caller's contract.
        let bytes = unsafe { std::slice::from_raw_parts(src, stride) };
        self.put(row as u64, bytes);
    }

    /// Rows waiting.
    pub(super) fn len(&self) -> usize {
        self.0.lock().len()
    }

    /// The buffer, held while a read overlays it on the file's bytes.
    pub(super) fn held(&self) -> MutexGuard<'_, BTreeMap<u64, Box<[u8]>>> {
        self.0.lock()
    }

    /// Drop the buffered values of `rows` (newer ones are being written) and run `write`
    /// with the buffer held, so no store slips between.
    pub(super) fn superseded_by<T>(&self, rows: &[u64], write: impl FnOnce() -> T) -> T {
        let mut p = self.0.lock();
        for r in rows {
            p.remove(r);
        }
        write()
    }

    /// Hand every buffered row to `write(rows, bytes)` (rows ascending, their bytes
    /// concatenated); on success the buffer empties, on error it stays as it was. Returns
    /// the rows written.
    pub(super) fn flush(&self, write: impl FnOnce(&[u64], &[u8]) -> Result<()>) -> Result<u64> {
        let mut p = self.0.lock();
        if p.is_empty() {
            return Ok(0);
        }
        let rows: Vec<u64> = p.keys().copied().collect();
        let src: Vec<u8> = p.values().flat_map(|v| v.iter().copied()).collect();
        write(&rows, &src)?;
        p.clear();
        Ok(rows.len() as u64)
    }
}
