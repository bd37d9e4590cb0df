//! `file`: rows in a plain file, row `i` at byte `i * stride`, read and written with buffered
//! I/O (`pread`/`pwrite` through the page cache): for file systems without direct I/O (tmpfs,
//! network and overlay file systems) and for rows another program wrote (`numpy.tofile`).
//! Like the block home it is only ever behind a cache, which stages a call's rows
//! (`cache::stage`); its reads bring no neighbours.
//!
//! Files: a new one is created `O_EXCL|O_NOFOLLOW` and marked as tiermem's table
//! ([`tiermem_core::sys::files::mark`]); an existing one is opened without following links,
//! locked (`flock`, shared when read-only), and written only if tiermem made it: a user's
//! file opens read-only. Rows written back go through a journal `PATH.journal` (rows and
//! bytes, checksummed, written whole before the first row changes and removed after the
//! last): a kill at any moment leaves every row wholly old or new, since opening the file
//! replays a whole journal and drops a torn one. [`FileHome::sync`] makes it durable.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::pending::Pending;
use super::RowHome;
use tiermem_core::device::Device;
use tiermem_core::process::Born;
use tiermem_core::sys::devfile::{DevFile, Options, MARK_TABLE};
use tiermem_core::sys::files;
use tiermem_core::{ensure, Error, Result};

const MAGIC: &[u8; 8] = b"TMJOURN1";
/// Bytes of a journal before its rows: magic, stride, count.
const JOURNAL_HEAD: usize = 24;
/// Most bytes one read request covers (consecutive rows are read together).
const MAX_RUN: usize = 1 << 20;

/// Counters of a file home's I/O.
#[derive(Debug, Default, Clone, Copy, serde::Serialize)]
pub struct FileCounters {
    /// Rows read from the file.
    pub rows_read: u64,
    /// Read requests (runs of consecutive rows).
    pub reads: u64,
    /// Rows written to the file.
    pub rows_written: u64,
}

/// Rows in a plain file.
pub struct FileHome {
    dev: DevFile,
    name: String,
    rows: u64,
    stride: usize,
    read_only: bool,
    born: Born,
    /// Rows written back but not yet in the file.
    pending: Pending,
    rows_read: AtomicU64,
    reads: AtomicU64,
    rows_written: AtomicU64,
}

impl std::fmt::Debug for FileHome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileHome")
            .field("name", &self.name)
            .field("path", &self.path())
            .field("rows", &self.rows)
            .field("stride", &self.stride)
            .field("read_only", &self.read_only)
            .finish_non_exhaustive()
    }
}

/// The journal beside `path`.
#[must_use]
pub fn journal_path(path: &Path) -> PathBuf {
    files::with_suffix(path, ".journal")
}

impl FileHome {
    /// Create the plain file `path` for `rows` zeroed rows of `stride` bytes (`name` names
    /// the table in errors). Nothing may be at `path`.
    pub fn create(path: &Path, name: &str, rows: u64, stride: usize) -> Result<Self> {
        let len = rows
            .checked_mul(stride as u64)
            .filter(|&l| l > 0)
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "table '{name}': {rows} rows of {stride} bytes cannot be a file table"
                ))
            })?;
        let o = Options {
            len,
            overwrite: false,
            direct: false,
            refuse_memory_fs: false,
            attach: false,
            keep: true,
            read_only: false,
        };
        let dev =
            DevFile::open(path, o).map_err(|e| crate::blockfile::open_error(name, path, e))?;
        // A journal left by a table of that name that was removed is not this table's.
        let _ = std::fs::remove_file(journal_path(path));
        Ok(Self::assemble(dev, name, rows, stride, false))
    }

    /// Open the existing plain file `path` as `rows` rows of `stride` bytes: its length must
    /// be exactly that. Writable only if tiermem made it (else pass `read_only`); a
    /// journal a killed write-back left is replayed first (read-only: overlaid).
    pub fn open(
        path: &Path,
        name: &str,
        rows: u64,
        stride: usize,
        read_only: bool,
    ) -> Result<Self> {
        let shown = path.display().to_string();
        let o = Options {
            len: 0,
            overwrite: false,
            direct: false,
            refuse_memory_fs: false,
            attach: true,
            keep: true,
            read_only,
        };
        let dev =
            DevFile::open(path, o).map_err(|e| crate::blockfile::open_error(name, path, e))?;
        // Checked on the file now held open (no link followed): a file tiermem did not make
        // is never written.
        if !read_only && files::marked(path).as_deref() != Some(MARK_TABLE) {
            tiermem_core::bail!(
                "table '{name}': '{shown}' was not made by tiermem (it carries no \
                 {}={MARK_TABLE} mark, or its file system keeps no extended attributes), and \
                 tiermem never writes into a file it did not make: open it read-only, or \
                 copy its rows into a new table",
                files::MARK
            );
        }
        let len = dev
            .file
            .metadata()
            .map_err(|e| Error::io(name, &shown, "stat", e))?
            .len();
        ensure!(
            Some(len) == rows.checked_mul(stride as u64),
            "table '{name}': '{shown}' holds {len} bytes; {rows} rows of {stride} bytes are {} \
             (open it with its own shape)",
            rows.saturating_mul(stride as u64)
        );
        let me = Self::assemble(dev, name, rows, stride, read_only);
        me.recover()?;
        Ok(me)
    }

    fn assemble(dev: DevFile, name: &str, rows: u64, stride: usize, read_only: bool) -> Self {
        FileHome {
            dev,
            name: name.to_owned(),
            rows,
            stride,
            read_only,
            born: Born::now(),
            pending: Pending::default(),
            rows_read: AtomicU64::new(0),
            reads: AtomicU64::new(0),
            rows_written: AtomicU64::new(0),
        }
    }

    /// Bytes per row.
    fn row_bytes(&self) -> usize {
        self.stride
    }

    fn file(&self) -> &File {
        &self.dev.file
    }

    /// The file's path.
    #[must_use]
    pub fn path(&self) -> &Path {
        self.dev.path()
    }

    /// Whether it was opened read-only.
    #[must_use]
    pub fn read_only(&self) -> bool {
        self.read_only
    }

    fn io_error(&self, what: &str, e: std::io::Error) -> Error {
        Error::io(&self.name, &self.path().display().to_string(), what, e)
    }

    fn may_write(&self, what: &str) -> Result<()> {
        if !self.born.is_here() {
            self.born.check(&format!(
                "table '{}' (file {})",
                self.name,
                self.path().display()
            ))?;
        }
        ensure!(
            !self.read_only,
            "table '{}': {} is open read-only: it cannot {what}",
            self.name,
            self.path().display()
        );
        Ok(())
    }

    /// A journal a killed write-back left: replayed when writable (every row then wholly
    /// new), overlaid as buffered rows when read-only; a torn one (its write never finished,
    /// so no row changed) is dropped.
    fn recover(&self) -> Result<()> {
        let jp = journal_path(self.path());
        let bytes = match files::open_existing(&jp, false, 0) {
            Ok(mut f) => {
                let mut b = Vec::new();
                std::io::Read::read_to_end(&mut f, &mut b)
                    .map_err(|e| self.io_error("read the journal", e))?;
                b
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(self.io_error("open the journal", e)),
        };
        match decode_journal(&bytes, self.stride, self.rows) {
            Some((rows, src)) if self.read_only => {
                for (&r, row) in rows.iter().zip(src.chunks_exact(self.stride)) {
                    self.pending.put(r, row);
                }
            }
            Some((rows, src)) => {
                self.write_in_place(&rows, src)?;
                self.file()
                    .sync_data()
                    .map_err(|e| self.io_error("sync the replayed rows", e))?;
                remove_journal(&jp).map_err(|e| self.io_error("remove the journal", e))?;
            }
            None if !self.read_only => {
                remove_journal(&jp).map_err(|e| self.io_error("remove a torn journal", e))?;
            }
            None => {}
        }
        Ok(())
    }

    /// Rows straight into the file (each run of consecutive rows one request).
    fn write_in_place(&self, rows: &[u64], src: &[u8]) -> Result<()> {
        let s = self.stride;
        for (first, k, at) in runs(rows, s) {
            self.file()
                .write_all_at(&src[at * s..(at + k) * s], first * s as u64)
                .map_err(|e| self.io_error("write rows", e))?;
        }
        Ok(())
    }

    /// Journal the rows, write them in place, drop the journal.
    fn write_now(&self, rows: &[u64], src: &[u8]) -> Result<()> {
        self.may_write("be written")?;
        ensure!(
            src.len() == rows.len() * self.stride && rows.iter().all(|&r| r < self.rows),
            "table '{}': {} bytes for {} rows of {} bytes (rows below {})",
            self.name,
            src.len(),
            rows.len(),
            self.stride,
            self.rows
        );
        let jp = journal_path(self.path());
        let mut j = files::create_aside(
            &jp,
            files::Create {
                read: false,
                flags: 0,
                mode: 0o600,
            },
        )
        .map_err(|e| self.io_error("create the journal", e))?;
        if let Err(e) = j.write_all(&encode_journal(rows, src, self.stride)) {
            let _ = std::fs::remove_file(&jp);
            return Err(self.io_error("write the journal", e));
        }
        drop(j);
        self.write_in_place(rows, src)?;
        remove_journal(&jp).map_err(|e| self.io_error("remove the journal", e))?;
        self.rows_written
            .fetch_add(rows.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Write every buffered row to the file; on error they stay buffered. Returns the rows
    /// written.
    pub fn write_back(&self) -> Result<u64> {
        self.pending.flush(|rows, src| self.write_now(rows, src))
    }

    /// Write back, then make the file durable (`fdatasync`).
    pub fn sync(&self) -> Result<()> {
        if self.read_only {
            return Ok(());
        }
        self.write_back()?;
        self.file()
            .sync_data()
            .map_err(|e| self.io_error("sync", e))
    }

    /// Rows written back but not yet in the file.
    #[must_use]
    pub fn pending_rows(&self) -> usize {
        self.pending.len()
    }

    /// I/O counters.
    #[must_use]
    pub fn counters(&self) -> FileCounters {
        FileCounters {
            rows_read: self.rows_read.load(Ordering::Relaxed),
            reads: self.reads.load(Ordering::Relaxed),
            rows_written: self.rows_written.load(Ordering::Relaxed),
        }
    }
}

fn remove_journal(jp: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(jp) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Runs of consecutive rows of sorted `rows`: (first row, rows, index of the first in
/// `rows`), each at most [`MAX_RUN`] bytes.
fn runs(rows: &[u64], stride: usize) -> Vec<(u64, usize, usize)> {
    let most = (MAX_RUN / stride).max(1);
    let mut out: Vec<(u64, usize, usize)> = Vec::new();
    for (i, &r) in rows.iter().enumerate() {
        match out.last_mut() {
            Some((first, k, _)) if *first + *k as u64 == r && *k < most => *k += 1,
            _ => out.push((r, 1, i)),
        }
    }
    out
}

fn encode_journal(rows: &[u64], src: &[u8], stride: usize) -> Vec<u8> {
    let mut b = Vec::with_capacity(JOURNAL_HEAD + rows.len() * 8 + src.len() + 4);
    b.extend_from_slice(MAGIC);
    b.extend_from_slice(&(stride as u64).to_le_bytes());
    b.extend_from_slice(&(rows.len() as u64).to_le_bytes());
    for r in rows {
        b.extend_from_slice(&r.to_le_bytes());
    }
    b.extend_from_slice(src);
    let crc = crc32c::crc32c(&b);
    b.extend_from_slice(&crc.to_le_bytes());
    b
}

/// A whole journal's rows and bytes, or `None` if it is torn, damaged or of another shape.
fn decode_journal(b: &[u8], stride: usize, table_rows: u64) -> Option<(Vec<u64>, &[u8])> {
    let body = b.get(..b.len().checked_sub(4)?)?;
    let crc = u32::from_le_bytes(b[body.len()..].try_into().ok()?);
    if body.len() < JOURNAL_HEAD || &body[..8] != MAGIC || crc32c::crc32c(body) != crc {
        return None;
    }
    let word = |at: usize| u64::from_le_bytes(body[at..at + 8].try_into().unwrap_or([0; 8]));
    let (s, n) = (word(8), word(16));
    let n = usize::try_from(n).ok()?;
    let rows_end = JOURNAL_HEAD.checked_add(n.checked_mul(8)?)?;
    if s != stride as u64 || body.len() != rows_end.checked_add(n.checked_mul(stride)?)? {
        return None;
    }
    let rows: Vec<u64> = (0..n).map(|k| word(JOURNAL_HEAD + 8 * k)).collect();
    rows.iter()
        .all(|&r| r < table_rows)
        .then_some((rows, &body[rows_end..]))
}

impl RowHome for FileHome {
    const STAGED: bool = true;
    const KIND: &'static str = "file";

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
        unsafe { self.pending.put_raw(i, src, self.stride) }
    }

    fn stores_done(&self) -> Result<()> {
        self.write_back().map(|_| ())
    }

    fn read_rows(&self, rows: &[u64], mut f: impl FnMut(u64, &[u8])) -> Result<u64> {
        let s = self.stride;
        let pending = self.pending.held();
        let mut buf = Vec::new();
        let plan = runs(rows, s);
        for &(first, k, _) in &plan {
            buf.resize(k * s, 0);
            self.file()
                .read_exact_at(&mut buf, first * s as u64)
                .map_err(|e| self.io_error("read rows", e))?;
            for (j, row) in buf.chunks_exact(s).enumerate() {
                let r = first + j as u64;
                f(r, pending.get(&r).map_or(row, |p| p));
            }
        }
        self.rows_read
            .fetch_add(rows.len() as u64, Ordering::Relaxed);
        self.reads.fetch_add(plan.len() as u64, Ordering::Relaxed);
        Ok(rows.len() as u64)
    }

    fn write_rows(&self, rows: &[u64], src: &[u8]) -> Result<()> {
        if rows.is_empty() {
            return Ok(());
        }
        self.pending
            .superseded_by(rows, || self.write_now(rows, src))
    }

    fn sync(&self) -> Result<()> {
        FileHome::sync(self)
    }

    fn writable(&self) -> Result<()> {
        self.may_write("change its rows")
    }

    fn forked(&self) -> bool {
        !self.born.is_here()
    }
}

super::not_in_memory!(FileHome, "a file table");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_join_consecutive_rows_only() {
        assert_eq!(
            runs(&[0, 1, 2, 5, 6, 9], 8),
            vec![(0, 3, 0), (5, 2, 3), (9, 1, 5)]
        );
        let long: Vec<u64> = (0..300).collect();
        let r = runs(&long, 8192);
        assert!(r.iter().all(|&(_, k, _)| k * 8192 <= MAX_RUN), "{r:?}");
        assert_eq!(r.iter().map(|x| x.1).sum::<usize>(), 300);
    }

    #[test]
    fn a_journal_reads_back_and_any_damage_or_cut_drops_it() {
        let rows = [3u64, 7];
        let src: Vec<u8> = (0..16).collect();
        let j = encode_journal(&rows, &src, 8);
        let (r, s) = decode_journal(&j, 8, 10).unwrap();
        assert_eq!((r.as_slice(), s), (&rows[..], &src[..]));
        for cut in 0..j.len() {
            assert!(decode_journal(&j[..cut], 8, 10).is_none(), "cut at {cut}");
        }
        for at in 0..j.len() {
            let mut bad = j.clone();
            bad[at] ^= 1;
            assert!(decode_journal(&bad, 8, 10).is_none(), "flipped byte {at}");
        }
        assert!(decode_journal(&j, 16, 10).is_none(), "another stride");
        assert!(decode_journal(&j, 8, 5).is_none(), "rows beyond the table");
    }
}
