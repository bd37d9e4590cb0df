//! `block`: rows in a table file on a block device ([`BlockFile`], Bandana's store). Kernels
//! cannot read a file in place, so a block home is only ever behind a cache, which stages a
//! call's rows into its slots first ([`crate::cache::CachedRows::stage`]).
//!
//! Rows written back (a cache's dirty rows leaving it) are buffered ([`super::pending`]) and
//! written to the file together, each touched block read, changed and written once
//! ([`BlockHome::write_back`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{RwLock, RwLockReadGuard};

use super::pending::Pending;
use super::RowHome;
use crate::blockfile::BlockFile;
use tiermem_core::device::Device;
use tiermem_core::Result;

/// Counters of a block home's I/O.
#[derive(Debug, Default, Clone, Copy, serde::Serialize)]
pub struct BlockCounters {
    /// Blocks read from the file.
    pub blocks_read: u64,
    /// Rows written back to the file.
    pub rows_written: u64,
    /// Blocks rewritten (read-modify-write) by write-backs.
    pub blocks_written: u64,
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

    /// Write rows straight to the file (`src`: `rows.len()` rows of bytes), each touched
    /// block once; buffered write-backs of these rows are dropped first (these values are
    /// newer).
    pub fn write_rows(&self, rows: &[u64], src: &[u8]) -> Result<()> {
        if rows.is_empty() {
            return Ok(());
        }
        self.pending
            .superseded_by(rows, || self.file().write_rows(rows, src))?;
        self.rows_written
            .fetch_add(rows.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Write every buffered row to the file, each touched block once; on error the rows
    /// stay buffered. Returns the rows written.
    pub fn write_back(&self) -> Result<u64> {
        let file = self.file();
        let mut blocks = 0;
        let n = self.pending.flush(|rows, src| {
            file.write_rows(rows, src)?;
            let mut b: Vec<u64> = rows.iter().map(|&r| file.block_of(r)).collect();
            b.sort_unstable();
            b.dedup();
            blocks = b.len() as u64;
            Ok(())
        })?;
        self.rows_written.fetch_add(n, Ordering::Relaxed);
        self.blocks_written.fetch_add(blocks, Ordering::Relaxed);
        Ok(n)
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
