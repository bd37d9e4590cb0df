//! `block`: rows in a table file on a block device ([`BlockFile`], Bandana's store). Kernels
//! cannot read a file in place, so a block home is only ever behind a cache, which stages a
//! call's rows into its slots first ([`crate::cache::CachedRows::stage`]).
//!
//! Rows written back (a cache's dirty rows leaving it) are buffered here and written to the
//! file together, each touched block read, changed and written once
//! ([`BlockHome::write_back`]). A write that fails leaves the rows buffered, still read from
//! the buffer, and tried again at the next write-back: no update is lost to a full disk or a
//! failed request.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock, RwLockReadGuard};

use super::RowHome;
use crate::blockfile::BlockFile;
use crate::rows::{RowSource, Tally};
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
    /// Rows written back but not yet in the file (row → bytes).
    pending: Mutex<BTreeMap<u64, Box<[u8]>>>,
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
            pending: Mutex::new(BTreeMap::new()),
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
        self.pending.lock().len()
    }

    /// Read the blocks holding `rows` and call `f(row, bytes)` once for every row in them
    /// (see [`BlockFile::read_blocks_of`]), with buffered write-backs taking precedence over
    /// the file's bytes. Returns the blocks read.
    pub fn read_blocks_of(&self, rows: &[u64], mut f: impl FnMut(u64, &[u8])) -> Result<u64> {
        let pending = self.pending.lock();
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
        let mut pending = self.pending.lock();
        for r in rows {
            pending.remove(r);
        }
        let file = self.file();
        file.write_rows(rows, src)?;
        self.rows_written
            .fetch_add(rows.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Write every buffered row to the file, each touched block once; on error the rows
    /// stay buffered. Returns the rows written.
    pub fn write_back(&self) -> Result<u64> {
        let mut pending = self.pending.lock();
        if pending.is_empty() {
            return Ok(0);
        }
        let file = self.file();
        let stride = file.stride();
        let rows: Vec<u64> = pending.keys().copied().collect();
        let mut src = Vec::with_capacity(rows.len() * stride);
        for v in pending.values() {
            src.extend_from_slice(v);
        }
        file.write_rows(&rows, &src)?;
        let mut blocks: Vec<u64> = rows.iter().map(|&r| file.block_of(r)).collect();
        blocks.sort_unstable();
        blocks.dedup();
        pending.clear();
        self.rows_written
            .fetch_add(rows.len() as u64, Ordering::Relaxed);
        self.blocks_written
            .fetch_add(blocks.len() as u64, Ordering::Relaxed);
        Ok(rows.len() as u64)
    }

    /// Write back, then make the file durable (`fdatasync`).
    pub fn sync(&self) -> Result<()> {
        self.write_back()?;
        self.file().sync()
    }
}

impl RowHome for BlockHome {
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
        let stride = self.file().stride();
        // SAFETY: the caller's contract: `dst` is valid for `stride` bytes of writes.
        let out = unsafe { std::slice::from_raw_parts_mut(dst, stride) };
        let r = i as u64;
        let res = self.read_blocks_of(&[r], |row, bytes| {
            if row == r {
                out.copy_from_slice(bytes);
            }
        });
        if let Err(e) = res {
            // Callers that can fail stage rows through `read_blocks_of`; this path serves
            // only whole-cache fills, which have no error to return.
            panic!("{e}");
        }
    }

    unsafe fn store_row(&self, i: usize, src: *const u8) {
        let stride = self.file().stride();
        // SAFETY: the caller's contract: `src` is readable for `stride` bytes.
        let row = unsafe { std::slice::from_raw_parts(src, stride) };
        self.pending.lock().insert(i as u64, row.into());
    }

    fn stores_done(&self) -> Result<()> {
        self.write_back().map(|_| ())
    }
}

// SAFETY: a block home hands kernels no pointers: a table never runs kernels on it directly
// (`Table::over_home` refuses a home without memory), and a cache in front of it stages
// every row a kernel touches into its slots first. These bodies are unreachable.
unsafe impl RowSource for BlockHome {
    fn stride(&self) -> usize {
        self.file().stride()
    }

    fn read(&self, i: usize, _t: &mut Tally) -> *const u8 {
        unreachable!("row {i} of a block table read in place: block rows are read through a cache")
    }

    fn write(&self, i: usize, _t: &mut Tally) -> *mut u8 {
        unreachable!(
            "row {i} of a block table written in place: block rows are written through a cache"
        )
    }

    fn prefetch(&self, _i: usize) {}

    fn charge(&self, _t: &Tally) {}
}
