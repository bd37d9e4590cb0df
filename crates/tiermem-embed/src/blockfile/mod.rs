//! A table's rows in a file on a block device (Bandana's store, §4.1): a header, the row →
//! position layout and 4 KiB blocks of rows, each checksummed ([`format`]). The file is
//! read and written with direct I/O in whole blocks; it outlives the process ([`BlockFile::open`]
//! re-attaches it) and is locked while open, so a second process is refused instead of
//! corrupting it. Every block read is verified: a damaged, truncated or misplaced block is a
//! [`Error::Corrupt`] naming the table, the block and the file, never a wrong row.
//!
//! Reads and writes of a batch are deduplicated per block, one block (or one run of a wide
//! row's blocks) per request, `depth` requests in flight (the queue depth): reads through
//! io_uring where the kernel allows it ([`tiermem_core::sys::uring`]), else from a pool of
//! `depth` threads (`TIERMEM_IO=threads` forces the pool). Through io_uring each run of
//! blocks is verified and handed over as it arrives, and writes are read-modify-write of
//! whole blocks streamed through the same ring, each block once per batch; the pool reads a
//! batch's blocks into one buffer and writes them from its threads.
//!
//! Rows written go to a log after the data blocks ([`log`]): one sequential request per
//! chunk of rows instead of a read-modify-write per block; a row's newest value is read from
//! the log while it is there; [`BlockFile::compact`] writes the logged rows home once the
//! log outgrows its limit ([`BlockFile::set_log_limit`], by default the table's size: the
//! file may grow to twice the table's).
//!
//! This is the store: the row home over it (`crate::home::BlockHome`, behind a staged cache),
//! relayout ([`BlockFile::relayout`]) and layouts (`crate::layout`) build on it.

mod faults;
pub mod format;
pub mod log;
pub mod optstate;
mod relayout;
mod snapshot;

pub use relayout::aside;

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use parking_lot::{Mutex, RwLock};

use format::{Header, BLOCK, HEADER_BYTES, PAYLOAD};
use log::{Log, LogCounters, LogFigures, Manifest};
use tiermem_core::process::Born;
use tiermem_core::sys::devfile::{DevFile, DevFileError, Options};
use tiermem_core::sys::direct_io::{AlignedBuf, DirectFile};
use tiermem_core::sys::uring::Uring;
use tiermem_core::{ensure, Error, Result};

use crate::DType;

/// Queue depth when none is given: what `tiermem calibrate` finds best on NVMe-class disks.
pub const DEFAULT_DEPTH: usize = 16;

/// The most consecutive blocks one request reads or writes (64 KiB) unless one row is
/// longer (a row is always one request, [`runs`]): long enough for the disk's sequential
/// rate, short enough that the ring's buffers (two per request in flight) stay small.
const RUN_BLOCKS: usize = 16;

/// Bytes of logged rows compaction reads and writes home at a time (what it holds in
/// memory, twice: the rows and the blocks they come from).
const COMPACT_BYTES: usize = 16 << 20;
/// The smallest default log limit: a small table's log is compacted no more often.
const MIN_LOG_LIMIT: u64 = 16 << 20;

/// What a write of rows cost: write requests and blocks written (the appended chunks and
/// any compaction it started).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Written {
    /// Write requests issued.
    pub requests: u64,
    /// Blocks written.
    pub blocks: u64,
}

impl std::ops::AddAssign for Written {
    fn add_assign(&mut self, o: Self) {
        self.requests += o.requests;
        self.blocks += o.blocks;
    }
}

/// An open, locked table file.
pub struct BlockFile {
    name: String,
    path: PathBuf,
    io: DirectFile,
    /// The open file: its lock lasts as long as this value; io_uring and `sync` use it.
    file: DevFile,
    header: Header,
    /// Row → position.
    layout: Vec<u32>,
    /// Position → row (the layout's inverse): which rows share a block.
    rows_at: Vec<u32>,
    /// Requests in flight: the threads of the shared I/O pool it uses
    /// ([`tiermem_core::process::io_pool`]) or the ring's depth.
    depth: usize,
    /// The process that opened it (a forked child refuses it).
    born: Born,
    /// Opened for reading only, under a shared lock.
    read_only: bool,
    /// Batched reads through io_uring, where the kernel allows it.
    uring: Option<Uring>,
    /// Injected I/O errors (tests).
    faults: faults::Faults,
    /// Where logged rows' newest values are. Lock order: `appending`, then `log`; reads
    /// hold `log` shared while their blocks are read (a compaction, which rewrites homes
    /// and cuts the log off, waits for them).
    log: RwLock<Log>,
    /// Held by whoever appends to, compacts or copies the log (one at a time).
    appending: Mutex<()>,
    /// Log blocks beyond which a write compacts.
    log_limit: AtomicU64,
    log_counters: LogCounters,
}

impl std::fmt::Debug for BlockFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockFile")
            .field("name", &self.name)
            .field("path", &self.path)
            .field("header", &self.header)
            .finish_non_exhaustive()
    }
}

/// Where a row's bytes are: the first data block (or log block) and the offset in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Place {
    block: u64,
    offset: usize,
}

impl BlockFile {
    /// Create the table file `path` for `rows` zeroed rows of `width` elements of `dtype`,
    /// in the original order (row i at position i). The file must not exist unless
    /// `overwrite` (what it holds is lost). `name` names the table in errors; `depth` is
    /// the number of requests kept in flight.
    pub fn create(
        path: &Path,
        name: &str,
        rows: u64,
        width: u32,
        dtype: DType,
        overwrite: bool,
        depth: usize,
    ) -> Result<Self> {
        ensure!(
            rows > 0 && rows <= u64::from(u32::MAX) && width > 0,
            "table '{name}': {rows} rows of width {width} cannot be a block table (1 to 2^32 - 1 \
             rows of width 1 or more)"
        );
        ensure!(
            width as usize <= crate::MAX_WIDTH,
            "table '{name}': row width {width} exceeds {}",
            crate::MAX_WIDTH
        );
        optstate::remove_orphan(path)
            .map_err(|what| Error::InvalidArgument(format!("table '{name}': {what}")))?;
        let mut header = Header::new(rows, width, dtype);
        let layout: Vec<u32> = (0..rows as u32).collect();
        header.layout_crc = crc32c::crc32c(&layout_bytes(&layout));
        let opts = Options {
            len: header.file_bytes(),
            overwrite,
            direct: true,
            refuse_memory_fs: true,
            attach: false,
            keep: true,
            read_only: false,
        };
        let file = DevFile::open(path, opts).map_err(|e| open_error(name, path, e))?;
        let me = Self::assemble(name, path, file, header, layout, depth)?;
        me.initialise().inspect_err(|_| {
            // A file that never held a table is not left behind to be mistaken for one.
            let _ = std::fs::remove_file(path);
        })?;
        Ok(me)
    }

    /// Re-attach the table file `path` written by [`BlockFile::create`] (in this process or
    /// an earlier one). Checks the header against the file's length and, if given, the
    /// caller's `expect`ed shape before anything is allocated for it; then the layout, read
    /// in chunks and checked as it arrives (a crafted or sparse file fails at its first
    /// repeated position, having cost a chunk); blocks are verified as they are read. A
    /// `.relayout` file a killed relayout left beside it is removed. `read_only` opens it
    /// under a shared lock (a snapshot several processes restore from at once): every write
    /// is refused.
    pub fn open(
        path: &Path,
        name: &str,
        depth: usize,
        expect: Option<(u64, u32, DType)>,
        read_only: bool,
    ) -> Result<Self> {
        let opts = Options {
            len: 0,
            overwrite: false,
            direct: true,
            refuse_memory_fs: true,
            attach: true,
            keep: true,
            read_only,
        };
        let file = DevFile::open(path, opts).map_err(|e| open_error(name, path, e))?;
        let io = DirectFile::new(
            file.file
                .try_clone()
                .map_err(|e| Error::io(name, &path.display().to_string(), "open", e))?,
        );
        let corrupt = |what: String| Error::Corrupt {
            path: path.display().to_string(),
            what: format!("table '{name}': {what}"),
        };
        let len = file
            .file
            .metadata()
            .map_err(|e| Error::io(name, &path.display().to_string(), "stat", e))?
            .len();
        if len < BLOCK as u64 {
            return Err(corrupt(format!("{len} bytes: shorter than a header block")));
        }
        let mut head = AlignedBuf::new(BLOCK);
        io.read_at(head.as_mut_slice(), 0)
            .map_err(|e| Error::io(name, &path.display().to_string(), "read the header", e))?;
        let header = Header::decode(&head.as_mut_slice()[..BLOCK]).map_err(corrupt)?;
        if let Some((rows, width, dtype)) = expect {
            let got = (header.rows, header.width, header.dtype);
            ensure!(
                got == (rows, width, dtype),
                "table '{name}': the table file {} holds {} rows of width {} ({}); asked for {rows} \
                 x {width} ({}): open it with its own shape or use another path",
                path.display(),
                got.0,
                got.1,
                got.2.name(),
                dtype.name()
            );
        }
        if len < header.file_bytes() {
            return Err(corrupt(format!(
                "truncated: {len} bytes, the header describes {} ({} data blocks)",
                header.file_bytes(),
                header.data_blocks
            )));
        }
        let layout = read_layout(&io, &header)
            .map_err(|e| Error::io(name, &path.display().to_string(), "read the layout", e))?
            .map_err(corrupt)?;
        drop(io);
        if !read_only {
            relayout::remove_stale_aside(path);
        }
        let mut me = Self::assemble(name, path, file, header, layout, depth)?;
        me.read_only = read_only;
        me.replay(len)?;
        Ok(me)
    }

    fn assemble(
        name: &str,
        path: &Path,
        file: DevFile,
        header: Header,
        layout: Vec<u32>,
        depth: usize,
    ) -> Result<Self> {
        let shown = path.display().to_string();
        let io = DirectFile::new(
            file.file
                .try_clone()
                .map_err(|e| Error::io(name, &shown, "open", e))?,
        );
        let threads_only = std::env::var("TIERMEM_IO").is_ok_and(|v| v == "threads");
        let uring = if threads_only {
            None
        } else {
            Uring::new(depth.clamp(1, 256) as u32).ok()
        };
        let mut rows_at = vec![0u32; layout.len()];
        for (row, &p) in layout.iter().enumerate() {
            rows_at[p as usize] = row as u32;
        }
        // A compaction rewrites about every home block once the log holds a share of the
        // table: its cost hardly grows with the log, so a long log spreads it thinnest.
        let limit = (header.data_blocks * BLOCK as u64).max(MIN_LOG_LIMIT) / BLOCK as u64;
        Ok(BlockFile {
            name: name.to_owned(),
            path: path.to_owned(),
            io,
            file,
            log: RwLock::new(Log::empty(header.data_blocks)),
            appending: Mutex::new(()),
            log_limit: AtomicU64::new(limit),
            log_counters: LogCounters::default(),
            header,
            layout,
            rows_at,
            depth: depth.clamp(1, 256),
            born: Born::now(),
            read_only: false,
            uring,
            faults: faults::Faults::default(),
        })
    }

    /// Write the header and the layout.
    fn write_meta(&self) -> Result<()> {
        let h = &self.header;
        let mut head = AlignedBuf::new(BLOCK);
        head.as_mut_slice().copy_from_slice(&h.encode());
        self.write_raw(head.as_mut_slice(), 0, "write the header")?;
        let mut lay = AlignedBuf::new(h.layout_blocks as usize * BLOCK);
        let bytes = layout_bytes(&self.layout);
        lay.as_mut_slice()[..bytes.len()].copy_from_slice(&bytes);
        self.write_raw(lay.as_mut_slice(), BLOCK as u64, "write the layout")
    }

    /// Write the header, the layout and every data block (zero rows, sealed), then sync. A
    /// file overwritten keeps no log of the table it held.
    fn initialise(&self) -> Result<()> {
        let h = &self.header;
        self.file
            .file
            .set_len(h.file_bytes())
            .map_err(|e| self.io_error("size the file", e))?;
        self.write_meta()?;
        // Data blocks in 1 MiB runs: zero payloads, each sealed with its own index.
        const RUN: u64 = 256;
        let mut buf = AlignedBuf::new(RUN as usize * BLOCK);
        let mut b = 0;
        while b < h.data_blocks {
            let n = RUN.min(h.data_blocks - b);
            let s = &mut buf.as_mut_slice()[..n as usize * BLOCK];
            s.fill(0);
            for (k, blk) in s.chunks_exact_mut(BLOCK).enumerate() {
                format::seal(blk, b + k as u64);
            }
            self.write_raw(s, h.data_offset(b), "write the data blocks")?;
            b += n;
        }
        self.sync()
    }

    fn write_raw(&self, buf: &[u8], offset: u64, what: &str) -> Result<()> {
        match self.faults.write() {
            Some(e) => Err(e),
            None => self.io.write_at(buf, offset),
        }
        .map_err(|e| Error::io(&self.name, &self.path.display().to_string(), what, e))
    }

    /// The table's name (as errors give it).
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The file.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the file's path still names this open file (not removed or replaced).
    #[must_use]
    pub fn still_at_path(&self) -> bool {
        use tiermem_core::sys::files::{identity, rename_target_problem, Replace};
        std::fs::symlink_metadata(&self.path).is_ok()
            && identity(&self.file.file)
                .is_ok_and(|id| rename_target_problem(&self.path, Replace::Same(id)).is_none())
    }

    /// The geometry and generation.
    #[must_use]
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// Rows.
    #[must_use]
    pub fn rows(&self) -> u64 {
        self.header.rows
    }

    /// Bytes per row.
    #[must_use]
    pub fn stride(&self) -> usize {
        self.header.stride as usize
    }

    /// Requests kept in flight.
    #[must_use]
    pub fn depth(&self) -> usize {
        self.depth
    }

    /// An error if this process is a forked child of the one that opened the file.
    fn here(&self) -> Result<()> {
        if self.born.is_here() {
            return Ok(()); // the message is built only for a refusal
        }
        self.born.check(&format!(
            "table '{}' (file {})",
            self.name,
            self.path.display()
        ))
    }

    /// [`BlockFile::here`], and an error if it was opened read-only: `what` would write.
    fn writable(&self, what: &str) -> Result<()> {
        self.here()?;
        ensure!(
            !self.read_only,
            "table '{}': {} is open read-only (a snapshot): it cannot {what}",
            self.name,
            self.path.display()
        );
        Ok(())
    }

    /// Whether this is a forked child of the process that opened the file (nothing may be
    /// written back from here).
    #[must_use]
    pub fn forked(&self) -> bool {
        !self.born.is_here()
    }

    /// Issue reads from the thread pool from now on, even where io_uring works (what
    /// `TIERMEM_IO=threads` does for every file; tests compare the two).
    pub fn use_threads(&mut self) {
        self.uring = None;
    }

    /// How reads are issued: `"io_uring"` or `"threads"`.
    #[must_use]
    pub fn read_engine(&self) -> &'static str {
        if self.uring.is_some() {
            "io_uring"
        } else {
            "threads"
        }
    }

    /// Where row `row`'s newest value is: in `log` if given and the row is there, else at
    /// home.
    fn place(&self, log: Option<&Log>, row: u64) -> Place {
        let h = &self.header;
        if let Some((block, offset)) = log.and_then(|l| l.place(h, row)) {
            return Place { block, offset };
        }
        let p = u64::from(self.layout[row as usize]);
        let rpb = u64::from(h.rows_per_block);
        Place {
            block: p / rpb * u64::from(h.blocks_per_row),
            offset: (p % rpb) as usize * h.stride as usize,
        }
    }

    /// The blocks row `row` occupies (see [`BlockFile::place`]).
    fn blocks_of(&self, log: Option<&Log>, row: u64) -> std::ops::Range<u64> {
        let b = self.place(log, row).block;
        b..b + u64::from(self.header.blocks_per_row)
    }

    fn check_rows(&self, rows: &[u64]) -> Result<()> {
        if let Some((k, &r)) = rows
            .iter()
            .enumerate()
            .find(|(_, &r)| r >= self.header.rows)
        {
            return Err(Error::IndexOutOfRange {
                table: 0,
                position: k,
                value: r as i64,
                rows: self.header.rows as usize,
            });
        }
        Ok(())
    }

    /// Read and verify the given data blocks (sorted, distinct) at the queue depth; returns
    /// one buffer holding them in order.
    fn read_blocks(&self, blocks: &[u64]) -> Result<AlignedBuf> {
        let mut buf = AlignedBuf::new(blocks.len().max(1) * BLOCK);
        let data = buf.as_mut_slice();
        self.read_runs(blocks, |first_idx, run| {
            data[first_idx * BLOCK..first_idx * BLOCK + run.len()].copy_from_slice(run);
        })?;
        Ok(buf)
    }

    /// The ring's request `(offset in the file, bytes)` of each run of blocks.
    fn requests(&self, runs: &[(usize, u64, usize)]) -> Vec<(u64, usize)> {
        runs.iter()
            .map(|&(_, first, n)| (self.header.data_offset(first), n * BLOCK))
            .collect()
    }

    /// An I/O error of this table's file: `what` failed.
    fn io_error(&self, what: impl Into<String>, e: std::io::Error) -> Error {
        Error::io(&self.name, &self.path.display().to_string(), what, e)
    }

    /// A run `(index in blocks, first block, blocks)` as read: the read's error, an injected
    /// fault, or the first block that does not verify; else its bytes.
    fn checked<'d>(
        &self,
        blocks: &[u64],
        (first_idx, first, _): (usize, u64, usize),
        read: std::io::Result<&'d [u8]>,
    ) -> Result<&'d [u8]> {
        let failed = |e| self.io_error(format!("read block {first}"), e);
        let data = read.map_err(failed)?;
        if let Some(e) = self.faults.read() {
            return Err(failed(e));
        }
        for (j, blk) in data.chunks_exact(BLOCK).enumerate() {
            format::verify(blk, blocks[first_idx + j]).map_err(|what| Error::Corrupt {
                path: self.path.display().to_string(),
                what: format!("table '{}': {what}", self.name),
            })?;
        }
        Ok(data)
    }

    /// Read the given data blocks (sorted, distinct) at the queue depth, one request per run
    /// of consecutive blocks, and call `each(index of the run's first block in blocks, its
    /// verified bytes)` for every run in order. Through io_uring each run is verified and
    /// handed over as soon as it and the runs before it are in, while later reads are in
    /// flight. The first failure (a read, an injected fault, a block that does not verify)
    /// is returned and `each` is not called again.
    fn read_runs(&self, blocks: &[u64], mut each: impl FnMut(usize, &[u8])) -> Result<()> {
        self.here()?;
        // Runs of consecutive blocks (a wide row's) are one request each.
        let runs = runs(blocks, RUN_BLOCKS, self.header.blocks_per_row);
        let mut first_error = None;
        let mut on_run = |k: usize, read: std::io::Result<&[u8]>| {
            if first_error.is_some() {
                return;
            }
            match self.checked(blocks, runs[k], read) {
                Ok(data) => each(runs[k].0, data),
                Err(e) => first_error = Some(e),
            }
        };
        if let Some(u) = &self.uring {
            u.read_each(
                self.file.file.as_raw_fd(),
                &self.requests(&runs),
                &mut on_run,
            );
        } else {
            let mut buf = AlignedBuf::new(blocks.len().max(1) * BLOCK);
            let base = buf.as_mut_slice().as_mut_ptr() as usize;
            self.on_pool(&runs, |first_idx, first, n| {
                // SAFETY: run `first_idx..first_idx + n` of the buffer is this request's
                // alone (`on_pool` hands each run to one thread); the buffer outlives the call.
                let s = unsafe {
                    std::slice::from_raw_parts_mut((base + first_idx * BLOCK) as *mut u8, n * BLOCK)
                };
                self.io
                    .read_at(s, self.header.data_offset(first))
                    .map_err(|e| self.io_error(format!("read block {first}"), e))
            })?;
            let data = buf.as_mut_slice();
            for (k, &(first_idx, _, n)) in runs.iter().enumerate() {
                on_run(k, Ok(&data[first_idx * BLOCK..(first_idx + n) * BLOCK]));
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Copy rows `rows` (any order, repeats allowed) into `out` (`rows.len() * stride`
    /// bytes, row k at `k * stride`). Each block is read once.
    pub fn read_rows(&self, rows: &[u64], out: &mut [u8]) -> Result<()> {
        self.read_rows_in(&self.log.read(), rows, out)
    }

    /// [`BlockFile::read_rows`] with the log's index held.
    fn read_rows_in(&self, log: &Log, rows: &[u64], out: &mut [u8]) -> Result<()> {
        let stride = self.stride();
        let (blocks, mut buf) = self.fetch(Some(log), rows, out.len(), "output")?;
        let data = buf.as_mut_slice();
        for (k, &r) in rows.iter().enumerate() {
            self.copy_out(
                Some(log),
                r,
                &blocks,
                data,
                &mut out[k * stride..(k + 1) * stride],
            );
        }
        Ok(())
    }

    /// Read, once each, the blocks holding `rows` (any order, repeats allowed) and call
    /// `f(row, bytes)` for every row stored in them, each once: the rows asked for and the
    /// rows sharing their blocks (Bandana's prefetch of a block's other rows). A row wider
    /// than a block has no neighbours. Rows in one block are handed over as their blocks
    /// arrive, while later blocks are still being read, so on an error `f` may have seen
    /// some rows already. Returns the blocks read.
    pub fn read_blocks_of(&self, rows: &[u64], mut f: impl FnMut(u64, &[u8])) -> Result<u64> {
        self.check_rows(rows)?;
        let guard = self.log.read();
        let log: &Log = &guard;
        let blocks = self.distinct_blocks(Some(log), rows);
        let h = &self.header;
        let stride = self.stride();
        if h.blocks_per_row > 1 {
            let mut buf = self.read_blocks(&blocks)?;
            let data = buf.as_mut_slice();
            let mut distinct = rows.to_vec();
            distinct.sort_unstable();
            distinct.dedup();
            let mut row = vec![0u8; stride];
            for r in distinct {
                self.copy_out(Some(log), r, &blocks, data, &mut row);
                f(r, &row);
            }
        } else {
            // Each run's rows are handed over as it arrives, while later blocks are read. A
            // block hands over the rows whose newest value it holds: a home block not its
            // rows in the log, a log block not its rows logged again since.
            let rpb = u64::from(h.rows_per_block);
            self.read_runs(&blocks, |first_idx, data| {
                for (j, blk) in data.chunks_exact(BLOCK).enumerate() {
                    let b = blocks[first_idx + j];
                    let mut hand = |k: usize, r: u32| {
                        let at = k * stride;
                        f(u64::from(r), &blk[at..at + stride]);
                    };
                    if b >= h.data_blocks {
                        for (k, r) in log.rows_in_block(h, b).enumerate() {
                            if let Some(r) = r {
                                hand(k, r);
                            }
                        }
                        continue;
                    }
                    for k in 0..rpb {
                        let Some(&r) = self.rows_at.get((b * rpb + k) as usize) else {
                            break;
                        };
                        if !log.holds(r) {
                            hand(k as usize, r);
                        }
                    }
                }
            })?;
        }
        Ok(blocks.len() as u64)
    }

    /// The data block holding row `row` at home (its first, for a row spanning blocks).
    #[must_use]
    pub fn block_of(&self, row: u64) -> u64 {
        self.place(None, row).block
    }

    /// Overwrite rows `rows` from `src` (`rows.len() * stride` bytes); a row given twice
    /// takes its last value. The rows are appended to the log, each once, in chunks of one
    /// write request ([`log`]); once the log outgrows its limit they are compacted home
    /// ([`BlockFile::compact`]). A chunk that fails to write leaves its rows at their
    /// older values (the chunks before it are written).
    pub fn write_rows(&self, rows: &[u64], src: &[u8]) -> Result<Written> {
        self.writable("be written")?;
        self.check_batch(rows, src.len(), "input")?;
        if rows.is_empty() {
            return Ok(Written::default());
        }
        // Each row once, with its last value in the batch, in row order.
        let mut order: Vec<(u64, usize)> = rows.iter().copied().zip(0..).collect();
        order.sort_unstable();
        order.dedup_by(|later, earlier| {
            let same = later.0 == earlier.0;
            if same {
                earlier.1 = later.1;
            }
            same
        });
        let mut done = Written::default();
        let guard = self.appending.lock();
        let rpb = self.header.rows_per_block as usize;
        for chunk in order.chunks(log::chunk_rows(&self.header)) {
            if !self.log.read().room_for(rpb, chunk.len()) {
                done += self.compact_locked()?; // positions are u32s
            }
            done += self.append_chunk(chunk, src)?;
        }
        if self.log.read().end - self.header.data_blocks > self.log_limit.load(Ordering::Relaxed) {
            done += self.compact_locked()?;
        }
        drop(guard);
        Ok(done)
    }

    /// Append one chunk: `(row, index of its value in src)` per row, distinct rows. Call
    /// with `appending` held.
    fn append_chunk(&self, chunk: &[(u64, usize)], src: &[u8]) -> Result<Written> {
        let h = &self.header;
        let (rpb, bpr, stride) = (
            h.rows_per_block as usize,
            h.blocks_per_row as usize,
            self.stride(),
        );
        let groups = chunk.len().div_ceil(rpb);
        let mblocks = log::manifest_blocks(chunk.len());
        let total = mblocks + groups * bpr;
        let (start, seq) = {
            let l = self.log.read();
            (l.end, l.seq + 1)
        };
        let ids: Vec<u32> = chunk.iter().map(|&(r, _)| r as u32).collect();
        let mut buf = AlignedBuf::new(total * BLOCK);
        let data = buf.as_mut_slice();
        data.fill(0);
        Manifest {
            seq,
            blocks: mblocks as u32,
            groups: groups as u32,
            rows: ids.clone(),
        }
        .encode(data);
        for (i, &(_, k)) in chunk.iter().enumerate() {
            let first = (mblocks + i / rpb * bpr) * BLOCK;
            let row = &src[k * stride..(k + 1) * stride];
            if bpr == 1 {
                let at = first + i % rpb * stride;
                data[at..at + stride].copy_from_slice(row);
            } else {
                for (j, piece) in row.chunks(PAYLOAD).enumerate() {
                    let at = first + j * BLOCK;
                    data[at..at + piece.len()].copy_from_slice(piece);
                }
            }
        }
        for (j, blk) in data.chunks_exact_mut(BLOCK).enumerate() {
            format::seal(blk, start + j as u64);
        }
        let what = format!("append rows to the log at block {start}");
        self.write_raw(data, h.data_offset(start), &what)?;
        let firsts = (0..groups).map(|g| start + (mblocks + g * bpr) as u64);
        self.log
            .write()
            .push_chunk(h.rows, rpb, firsts, &ids, start + total as u64);
        let c = &self.log_counters;
        c.chunks.fetch_add(1, Ordering::Relaxed);
        c.rows.fetch_add(chunk.len() as u64, Ordering::Relaxed);
        Ok(Written {
            requests: 1,
            blocks: total as u64,
        })
    }

    /// Write every row whose newest value is in the log to its home (each touched home
    /// block read, changed and written once per part of [`COMPACT_BYTES`] of rows), make
    /// that durable, and cut the log off. A kill before the cut leaves the log to be
    /// replayed over homes that already hold (some of) its values: every row reopens to
    /// its newest value. Returns what was written.
    pub fn compact(&self) -> Result<Written> {
        self.writable("be compacted")?;
        let _guard = self.appending.lock();
        self.compact_locked()
    }

    /// [`BlockFile::compact`] with `appending` held.
    fn compact_locked(&self) -> Result<Written> {
        let mut log = self.log.write();
        if log.is_empty() {
            return Ok(Written::default());
        }
        let stride = self.stride();
        let live = log.live();
        let mut done = Written::default();
        for part in live.chunks((COMPACT_BYTES / stride).max(1)) {
            let rows: Vec<u64> = part.iter().map(|&(_, r)| u64::from(r)).collect();
            let mut values = vec![0u8; rows.len() * stride];
            self.read_rows_in(&log, &rows, &mut values)?;
            done += self.write_home(&rows, &values)?;
            self.log_counters
                .compacted_rows
                .fetch_add(rows.len() as u64, Ordering::Relaxed);
        }
        self.sync()?;
        let h = &self.header;
        self.file
            .file
            .set_len(h.file_bytes())
            .map_err(|e| self.io_error("cut off the compacted log", e))?;
        let seq = log.seq;
        *log = Log::empty(h.data_blocks);
        log.seq = seq;
        let c = &self.log_counters;
        c.compactions.fetch_add(1, Ordering::Relaxed);
        c.compaction_writes
            .fetch_add(done.requests, Ordering::Relaxed);
        Ok(done)
    }

    /// Compact once the log holds more than `bytes` (rounded down to whole blocks; 0:
    /// after every write). The default is the table's data bytes, at least 16 MiB.
    pub fn set_log_limit(&self, bytes: u64) {
        self.log_limit
            .store(bytes / BLOCK as u64, Ordering::Relaxed);
    }

    /// The log's counters and its size now.
    #[must_use]
    pub fn log_figures(&self) -> LogFigures {
        let blocks = self.log.read().end - self.header.data_blocks;
        self.log_counters.figures(blocks)
    }

    /// Replay the log of a file `len` bytes long: each chunk after the data blocks, in
    /// order, while it verifies whole; a torn tail is cut off (when writable).
    fn replay(&mut self, len: u64) -> Result<()> {
        let h = self.header;
        let file_blocks = len / BLOCK as u64 - (1 + h.layout_blocks);
        let (rpb, bpr) = (h.rows_per_block as u64, u64::from(h.blocks_per_row));
        let log = self.log.get_mut();
        let mut at = h.data_blocks;
        let mut first = AlignedBuf::new(BLOCK);
        while at < file_blocks {
            let b = first.as_mut_slice();
            if self.io.read_at(b, h.data_offset(at)).is_err() || format::verify(b, at).is_err() {
                break;
            }
            let Some(head @ (seq, rows, mblocks, groups)) = Manifest::head(&b[..PAYLOAD]) else {
                break;
            };
            let total = u64::from(mblocks) + u64::from(groups) * bpr;
            let fits = seq > log.seq
                && rows > 0
                && u64::from(groups) == u64::from(rows).div_ceil(rpb)
                && mblocks as usize == log::manifest_blocks(rows as usize)
                && at + total <= file_blocks;
            if !fits {
                break;
            }
            let mut chunk = AlignedBuf::new(total as usize * BLOCK);
            let c = chunk.as_mut_slice();
            if self.io.read_at(c, h.data_offset(at)).is_err()
                || c.chunks_exact(BLOCK)
                    .enumerate()
                    .any(|(j, blk)| format::verify(blk, at + j as u64).is_err())
            {
                break;
            }
            let m = Manifest::decode(c, head);
            if let Some(&bad) = m.rows.iter().find(|&&r| u64::from(r) >= h.rows) {
                return Err(Error::Corrupt {
                    path: self.path.display().to_string(),
                    what: format!(
                        "table '{}': the row log's chunk at block {at} names row {bad} of {}",
                        self.name, h.rows
                    ),
                });
            }
            let firsts = (0..u64::from(groups)).map(|g| at + u64::from(mblocks) + g * bpr);
            log.push_chunk(h.rows, rpb as usize, firsts, &m.rows, at + total);
            log.seq = seq;
            at += total;
        }
        let seq = log.seq;
        if at < file_blocks {
            // A kill tears only the last chunk: a whole chunk after the one that failed
            // means the log was damaged, and cutting it off would lose rows silently.
            if let Some(later) = self.later_chunk(at, file_blocks, seq) {
                return Err(Error::Corrupt {
                    path: self.path.display().to_string(),
                    what: format!(
                        "table '{}': the row log's chunk at block {at} does not verify, and a \
                         later chunk (block {later}) does: the log is damaged, not torn",
                        self.name
                    ),
                });
            }
        }
        if at < file_blocks && !self.read_only {
            self.file.file.set_len(h.data_offset(at)).map_err(|e| {
                Error::io(
                    &self.name,
                    &self.path.display().to_string(),
                    "cut off a torn log",
                    e,
                )
            })?;
        }
        Ok(())
    }

    /// The first block after `from` (up to `end`) that is a verified manifest of a chunk
    /// later than `seq`, if any.
    fn later_chunk(&self, from: u64, end: u64, seq: u64) -> Option<u64> {
        let h = &self.header;
        let mut b = AlignedBuf::new(BLOCK);
        (from + 1..end).find(|&at| {
            let blk = b.as_mut_slice();
            self.io.read_at(blk, h.data_offset(at)).is_ok()
                && format::verify(blk, at).is_ok()
                && Manifest::head(&blk[..PAYLOAD]).is_some_and(|(s, ..)| s > seq)
        })
    }

    /// Overwrite rows at their homes (the log's compaction): each touched block is read,
    /// changed and written once (read-modify-write), at the queue depth: through io_uring
    /// each run of blocks is changed and written back as soon as it is read, in the ring's
    /// own buffers, so a batch of any size holds no more than them; a block that fails to
    /// read or verify stops the batch there (the blocks before it are written).
    fn write_home(&self, rows: &[u64], src: &[u8]) -> Result<Written> {
        self.writable("be written")?;
        let Some(u) = &self.uring else {
            return self.write_rows_from_pool(rows, src);
        };
        let stride = self.stride();
        self.check_batch(rows, src.len(), "input")?;
        let blocks = self.distinct_blocks(None, rows);
        // Each piece of each row: (offset among the blocks, row k, offset in the row,
        // bytes), in block order and, within a place, in batch order (the last value wins).
        let mut pieces: Vec<(usize, usize, usize, usize)> = Vec::with_capacity(rows.len());
        for (k, &r) in rows.iter().enumerate() {
            self.walk(None, r, &blocks, |at, row_off, n| {
                pieces.push((at, k, row_off, n))
            });
        }
        pieces.sort_unstable();
        let runs = runs(&blocks, RUN_BLOCKS, self.header.blocks_per_row);
        let reqs = self.requests(&runs);
        let mut first_error = None;
        let mut next_piece = 0;
        let written = u.modify_each(self.file.file.as_raw_fd(), &reqs, |k, read| {
            if first_error.is_some() {
                return false;
            }
            let (first_idx, first, n) = runs[k];
            let data = match read {
                Ok(data) => data,
                Err(e) => {
                    first_error = self.checked(&blocks, runs[k], Err(e)).err();
                    return false;
                }
            };
            if let Err(e) = self.checked(&blocks, runs[k], Ok(&*data)) {
                first_error = Some(e);
                return false;
            }
            let start = first_idx * BLOCK;
            while let Some(&(at, row, row_off, len)) = pieces.get(next_piece) {
                if at >= start + n * BLOCK {
                    break;
                }
                let from = &src[row * stride + row_off..][..len];
                data[at - start..at - start + len].copy_from_slice(from);
                next_piece += 1;
            }
            for (j, blk) in data.chunks_exact_mut(BLOCK).enumerate() {
                format::seal(blk, blocks[first_idx + j]);
            }
            match self.faults.write() {
                Some(e) => {
                    first_error = Some(self.io_error(format!("write block {first}"), e));
                    false
                }
                None => true,
            }
        });
        if let Err((k, e)) = written {
            first_error.get_or_insert(self.io_error(format!("write block {}", runs[k].1), e));
        }
        first_error.map_or(
            Ok(Written {
                requests: runs.len() as u64,
                blocks: blocks.len() as u64,
            }),
            Err,
        )
    }

    /// [`BlockFile::write_home`] without io_uring: every touched block read (and verified)
    /// into one buffer, changed, and written from the thread pool.
    fn write_rows_from_pool(&self, rows: &[u64], src: &[u8]) -> Result<Written> {
        let stride = self.stride();
        let (blocks, mut buf) = self.fetch(None, rows, src.len(), "input")?;
        let data = buf.as_mut_slice();
        for (k, &r) in rows.iter().enumerate() {
            self.copy_in(r, &blocks, data, &src[k * stride..(k + 1) * stride]);
        }
        for (j, blk) in data.chunks_exact_mut(BLOCK).take(blocks.len()).enumerate() {
            format::seal(blk, blocks[j]);
        }
        let runs = runs(&blocks, RUN_BLOCKS, self.header.blocks_per_row);
        let base = data.as_ptr() as usize;
        self.on_pool(&runs, |first_idx, first, n| {
            // SAFETY: as in `read_runs`; here only read.
            let s = unsafe {
                std::slice::from_raw_parts((base + first_idx * BLOCK) as *const u8, n * BLOCK)
            };
            match self.faults.write() {
                Some(e) => Err(e),
                None => self.io.write_at(s, self.header.data_offset(first)),
            }
            .map_err(|e| self.io_error(format!("write block {first}"), e))
        })?;
        Ok(Written {
            requests: runs.len() as u64,
            blocks: blocks.len() as u64,
        })
    }

    /// Run `f(index in the buffer, first block, blocks)` for every run on the I/O pool, each
    /// run on one thread, `depth` at a time; the first error is returned.
    fn on_pool(
        &self,
        runs: &[(usize, u64, usize)],
        f: impl Fn(usize, u64, usize) -> Result<()> + Sync,
    ) -> Result<()> {
        let next = AtomicUsize::new(0);
        let pool = tiermem_core::process::io_pool(self.depth)
            .map_err(|e| Error::InvalidArgument(format!("table '{}': {e}", self.name)))?;
        pool.install(|| {
            rayon::broadcast(|_| -> Result<()> {
                loop {
                    let k = next.fetch_add(1, Ordering::Relaxed);
                    let Some(&(first_idx, first, n)) = runs.get(k) else {
                        return Ok(());
                    };
                    f(first_idx, first, n)?;
                }
            })
            .into_iter()
            .collect()
        })
    }

    /// Check a batch: `bytes` of `what` for `rows`, every row in range.
    fn check_batch(&self, rows: &[u64], bytes: usize, what: &str) -> Result<()> {
        let stride = self.stride();
        ensure!(
            bytes == rows.len() * stride,
            "table '{}': {bytes} bytes of {what} for {} rows of {stride} bytes",
            self.name,
            rows.len()
        );
        self.check_rows(rows)
    }

    /// Check a batch ([`BlockFile::check_batch`]) and read, once each, the blocks its rows
    /// occupy: the blocks (sorted) and a buffer holding them in order.
    fn fetch(
        &self,
        log: Option<&Log>,
        rows: &[u64],
        bytes: usize,
        what: &str,
    ) -> Result<(Vec<u64>, AlignedBuf)> {
        self.check_batch(rows, bytes, what)?;
        let blocks = self.distinct_blocks(log, rows);
        let buf = self.read_blocks(&blocks)?;
        Ok((blocks, buf))
    }

    /// Make every write so far durable (`fdatasync`).
    pub fn sync(&self) -> Result<()> {
        if self.read_only {
            return self.here();
        }
        self.here()?;
        self.file
            .file
            .sync_data()
            .map_err(|e| Error::io(&self.name, &self.path.display().to_string(), "sync", e))
    }

    fn distinct_blocks(&self, log: Option<&Log>, rows: &[u64]) -> Vec<u64> {
        let mut blocks: Vec<u64> = rows.iter().flat_map(|&r| self.blocks_of(log, r)).collect();
        blocks.sort_unstable();
        blocks.dedup();
        blocks
    }

    /// Row `r`'s bytes, gathered from the blocks read (`blocks` sorted, `data` in that order).
    fn copy_out(&self, log: Option<&Log>, r: u64, blocks: &[u64], data: &[u8], out: &mut [u8]) {
        self.walk(log, r, blocks, |buf_off, row_off, n| {
            out[row_off..row_off + n].copy_from_slice(&data[buf_off..buf_off + n]);
        });
    }

    /// Row `r`'s bytes put into its home blocks read (`blocks` sorted, `data` in that order).
    fn copy_in(&self, r: u64, blocks: &[u64], data: &mut [u8], src: &[u8]) {
        self.walk(None, r, blocks, |buf_off, row_off, n| {
            data[buf_off..buf_off + n].copy_from_slice(&src[row_off..row_off + n]);
        });
    }

    /// Call `f(offset in the read buffer, offset in the row, bytes)` for each piece of row
    /// `r` (one piece for a row in one block; one per block for a wide row).
    fn walk(
        &self,
        log: Option<&Log>,
        r: u64,
        blocks: &[u64],
        mut f: impl FnMut(usize, usize, usize),
    ) {
        let stride = self.stride();
        let place = self.place(log, r);
        let mut done = 0;
        for b in self.blocks_of(log, r) {
            let j = blocks
                .binary_search(&b)
                .expect("the row's blocks were read");
            let within = if done == 0 { place.offset } else { 0 };
            let n = (stride - done).min(PAYLOAD - within);
            f(j * BLOCK + within, done, n);
            done += n;
        }
        debug_assert_eq!(done, stride);
    }
}

/// `(index in blocks, first block, length)` of each run of consecutive blocks, at most
/// `max` long unless a row of `blocks_per_row` blocks would be cut: a run starts only at a
/// row's first block, so every row is read and written by one request, whole (a kill or a
/// failed request between requests leaves each row wholly old or wholly new).
fn runs(blocks: &[u64], max: usize, blocks_per_row: u32) -> Vec<(usize, u64, usize)> {
    let bpr = u64::from(blocks_per_row.max(1));
    let mut out: Vec<(usize, u64, usize)> = Vec::new();
    for (i, &b) in blocks.iter().enumerate() {
        match out.last_mut() {
            Some((_, first, n)) if *first + *n as u64 == b && (*n < max || b % bpr != 0) => {
                *n += 1;
            }
            _ => out.push((i, b, 1)),
        }
    }
    out
}

/// The layout of `header`'s file, read in 1 MiB chunks: its checksum computed and each
/// position checked (in range, not seen before) as it arrives, so memory grows only with
/// what the file really holds; after the first bad position only the checksum goes on (a
/// damaged layout is named as such). The outer error is the read's, the inner what is wrong.
fn read_layout(
    io: &DirectFile,
    header: &Header,
) -> std::io::Result<std::result::Result<Vec<u32>, String>> {
    const CHUNK: usize = 256 * BLOCK;
    let rows = header.rows as usize;
    let mut seen = vec![0u64; rows.div_ceil(64)];
    let mut layout: Vec<u32> = Vec::new();
    let mut problem = None;
    let mut crc = 0u32;
    let mut buf = AlignedBuf::new(CHUNK);
    let total = header.layout_blocks as usize * BLOCK;
    let mut off = 0;
    while off < total {
        let n = CHUNK.min(total - off);
        let chunk = &mut buf.as_mut_slice()[..n];
        io.read_at(chunk, BLOCK as u64 + off as u64)?;
        let want = (rows * 4).saturating_sub(off).min(n);
        let bytes = &chunk[..want];
        crc = crc32c::crc32c_append(crc, bytes);
        for c in bytes.chunks_exact(4) {
            if problem.is_some() {
                break;
            }
            let p = u32::from_le_bytes(c.try_into().expect("4 bytes")) as usize;
            let row = layout.len();
            if p >= rows {
                problem = Some(format!(
                    "the layout puts row {row} at position {p}, outside 0..{rows}"
                ));
            } else if seen[p / 64] & (1 << (p % 64)) != 0 {
                problem = Some(format!(
                    "the layout puts row {row} at position {p}, which another row holds (not a \
                     permutation)"
                ));
            } else {
                seen[p / 64] |= 1 << (p % 64);
                layout.push(p as u32);
            }
        }
        if problem.is_some() {
            layout = Vec::new();
        }
        off += n;
    }
    if crc != header.layout_crc {
        return Ok(Err(format!(
            "layout checksum mismatch (stored {:#010x}, computed {crc:#010x})",
            header.layout_crc
        )));
    }
    Ok(problem.map_or(Ok(layout), Err))
}

fn layout_bytes(layout: &[u32]) -> Vec<u8> {
    layout.iter().flat_map(|p| p.to_le_bytes()).collect()
}

/// A table file's open error, naming the table and the file.
pub(crate) fn open_error(name: &str, path: &Path, e: DevFileError) -> Error {
    let shown = path.display().to_string();
    match e {
        DevFileError::Os(what, e) => Error::io(name, &shown, what, e),
        DevFileError::MemoryFs(fs) => Error::InvalidArgument(format!(
            "table '{name}': '{shown}' is on {fs}, a memory file system: a block table there \
             keeps its rows in RAM and direct I/O is not real; use a path on an SSD"
        )),
        DevFileError::NoSpace { free } => Error::InvalidArgument(format!(
            "table '{name}': '{shown}' needs more than the {free} bytes free on its file system"
        )),
        DevFileError::Exists { what } => Error::InvalidArgument(format!(
            "table '{name}': '{shown}' is {what}; a new table file is never written over one \
             (open it to re-attach the table, or allow overwriting: what it holds is lost)"
        )),
        DevFileError::Locked => Error::InvalidArgument(format!(
            "table '{name}': '{shown}' is open in another process or table (it is locked): two \
             owners of one table file would corrupt it"
        )),
        DevFileError::TooSmall { size } => Error::InvalidArgument(format!(
            "table '{name}': '{shown}' holds {size} bytes, too few for the table"
        )),
    }
}

/// Rows in a header's table are at most `u32::MAX`, so positions fit the layout's `u32`s;
/// `HEADER_BYTES` fields fit the header block.
const _: () = assert!(HEADER_BYTES <= BLOCK);

#[cfg(test)]
mod tests {
    use super::runs;

    /// Every row's blocks land in one request, for every row length (the torn-row defect:
    /// runs of 16 blocks cut a 3-block row at block 15/16), and runs stay short when rows do.
    #[test]
    fn runs_never_cut_a_row() {
        for bpr in 1..=40u32 {
            let rows: Vec<u64> = (0..60u64).filter(|r| r % 7 != 3).collect();
            let blocks: Vec<u64> = rows
                .iter()
                .flat_map(|&r| r * u64::from(bpr)..(r + 1) * u64::from(bpr))
                .collect();
            let rs = runs(&blocks, 16, bpr);
            assert_eq!(rs.iter().map(|r| r.2).sum::<usize>(), blocks.len());
            for &(i, first, n) in &rs {
                assert_eq!(blocks[i], first);
                assert_eq!(
                    first % u64::from(bpr),
                    0,
                    "a run starts mid-row (bpr {bpr})"
                );
                assert_eq!(n % bpr as usize, 0, "a run ends mid-row (bpr {bpr})");
                assert!(n < 16usize.max(bpr as usize) + bpr as usize);
            }
        }
    }
}
