//! `block`: rows in a table file on a block device ([`BlockFile`], Bandana's store). Kernels
//! cannot read a file in place, so a block home is only ever behind a cache, which stages a
//! call's rows into its slots first ([`crate::cache::CachedRows::stage`]).
//!
//! Rows written back (a cache's dirty rows leaving it) are buffered ([`super::pending`]) and
//! written to the file together, appended to its row log ([`crate::blockfile::log`]) in
//! chunks of one sequential request, compacted home once the log outgrows its limit
//! ([`BlockHome::write_back`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{RwLock, RwLockReadGuard};

use super::pending::Pending;
use super::RowHome;
use crate::blockfile::{BlockFile, Written};
use tiermem_core::device::Device;
use tiermem_core::Result;

/// Counters of a block home's I/O.
#[derive(Debug, Default, Clone, Copy, serde::Serialize)]
pub struct BlockCounters {
    /// Blocks read from the file.
    pub blocks_read: u64,
    /// Rows written back to the file.
    pub rows_written: u64,
    /// Blocks written: log chunks appended and home blocks their compactions rewrote.
    pub blocks_written: u64,
    /// Write requests those took (a chunk is one; a compaction one per run of blocks).
    pub write_requests: u64,
}

/// Rows in a table file.
pub struct BlockHome {
    /// Boxed: the file's pool and ring are large beside the other homes. Replaced by a
    /// relayout (a leaf lock, taken under the table's lock).
    file: RwLock<Box<BlockFile>>,
    /// Rows written back but not yet in the file.
    pending: Pending,
    blocks_read: AtomicU64,
    rows_written: AtomicU64,
    blocks_written: AtomicU64,
    write_requests: AtomicU64,
}

impl BlockHome {
    /// A home over an open table file.
    #[must_use]
    pub fn new(file: BlockFile) -> Self {
        BlockHome {
            file: RwLock::new(Box::new(file)),
            pending: Pending::default(),
            blocks_read: AtomicU64::new(0),
            rows_written: AtomicU64::new(0),
            blocks_written: AtomicU64::new(0),
            write_requests: AtomicU64::new(0),
        }
    }

    /// The table file.
    pub fn file(&self) -> RwLockReadGuard<'_, Box<BlockFile>> {
        self.file.read()
    }

    /// Write back, then put the rows in `layout`'s order in a new file switched in for the
    /// old one ([`BlockFile::relayout`]). Call with the table's exclusive lock held and
    /// every dirty cached row already stored here.
    pub fn relayout(
        &self,
        layout: Vec<u32>,
        budget: usize,
        progress: impl FnMut(u64, u64),
    ) -> Result<()> {
        self.write_back()?;
        let mut f = self.file.write();
        let new = f.relayout(layout, budget, progress)?;
        **f = new;
        Ok(())
    }

    /// Bytes per row.
    fn row_bytes(&self) -> usize {
        self.file().stride()
    }

    /// I/O counters.
    #[must_use]
    pub fn counters(&self) -> BlockCounters {
        BlockCounters {
            blocks_read: self.blocks_read.load(Ordering::Relaxed),
            rows_written: self.rows_written.load(Ordering::Relaxed),
            blocks_written: self.blocks_written.load(Ordering::Relaxed),
            write_requests: self.write_requests.load(Ordering::Relaxed),
        }
    }

    /// Rows written back but not yet in the file (a failed write leaves them here).
    #[must_use]
    pub fn pending_rows(&self) -> usize {
        self.pending.len()
    }

    /// Read the blocks holding `rows` and call `f(row, bytes)` once for every row in them
    /// (see [`BlockFile::read_blocks_of`]), with buffered write-backs taking precedence over
    /// the file's bytes. Returns the blocks read.
    pub fn read_blocks_of(&self, rows: &[u64], mut f: impl FnMut(u64, &[u8])) -> Result<u64> {
        let pending = self.pending.held();
        let n = self.file().read_blocks_of(rows, |r, bytes| {
            f(r, pending.get(&r).map_or(bytes, |p| p));
        })?;
        self.blocks_read.fetch_add(n, Ordering::Relaxed);
        Ok(n)
    }

    /// Write rows straight to the file (`src`: `rows.len()` rows of bytes); buffered
    /// write-backs of these rows are dropped first (these values are newer).
    pub fn write_rows(&self, rows: &[u64], src: &[u8]) -> Result<()> {
        if rows.is_empty() {
            return Ok(());
        }
        let mut w = Written::default();
        self.pending.superseded_by(rows, || {
            w = self.file().write_rows(rows, src)?;
            Ok(())
        })?;
        self.count(rows.len() as u64, w);
        Ok(())
    }

    /// Write every buffered row to the file; on error the rows stay buffered. Returns the
    /// rows written.
    pub fn write_back(&self) -> Result<u64> {
        let file = self.file();
        let mut w = Written::default();
        let n = self.pending.flush(|rows, src| {
            w = file.write_rows(rows, src)?;
            Ok(())
        })?;
        self.count(n, w);
        Ok(n)
    }

    fn count(&self, rows: u64, w: Written) {
        self.rows_written.fetch_add(rows, Ordering::Relaxed);
        self.blocks_written.fetch_add(w.blocks, Ordering::Relaxed);
        self.write_requests.fetch_add(w.requests, Ordering::Relaxed);
    }

    /// Write back, then make the file durable (`fdatasync`).
    pub fn sync(&self) -> Result<()> {
        self.write_back()?;
        self.file().sync()
    }
}

impl RowHome for BlockHome {
    const STAGED: bool = true;
    const KIND: &'static str = "block";

    fn device_index(&self) -> Option<usize> {
        None
    }

    fn device(&self) -> Option<&Arc<Device>> {
        None
    }

    fn memory(&self) -> Option<*mut u8> {
        None
    }

    unsafe fn load_row(&self, i: usize, dst: *mut u8) {
        // SAFETY: the caller's contract.
        unsafe { super::load_staged(self, i, dst) }
    }

    unsafe fn store_row(&self, i: usize, src: *const u8) {
        // SAFETY: the caller's contract: `src` is readable for a row's bytes.
        unsafe { self.pending.put_raw(i, src, self.row_bytes()) }
    }

    fn stores_done(&self) -> Result<()> {
        self.write_back().map(|_| ())
    }

    fn read_unit(&self) -> usize {
        crate::blockfile::format::BLOCK
    }

    fn read_rows(&self, rows: &[u64], f: impl FnMut(u64, &[u8])) -> Result<u64> {
        self.read_blocks_of(rows, f)
    }

    fn write_rows(&self, rows: &[u64], src: &[u8]) -> Result<()> {
        BlockHome::write_rows(self, rows, src)
    }

    fn sync(&self) -> Result<()> {
        BlockHome::sync(self)
    }

    fn forked(&self) -> bool {
        self.file().forked()
    }
}

super::not_in_memory!(BlockHome, "a block table");
