//! Relayout: the same rows in a new order (a layout from [`crate::layout`]), written aside
//! and switched atomically. The new file is written next to the old one (`PATH.relayout`),
//! synced, then renamed over it and the directory synced: a kill at any moment leaves at
//! `PATH` either the old file or the new one, each whole, so the table opens and reads every
//! row at its last written value. The new file is created anew (`O_EXCL|O_NOFOLLOW`, a stale
//! name unlinked first, never followed) and renamed only over the very file the table holds
//! open ([`files::rename_over`]); a stale `.relayout` file of a killed relayout is removed
//! when the table is next opened ([`remove_stale_aside`]) or relaid out. A disk without room
//! for the copy refuses before anything changes.
//!
//! Memory stays bounded: the new file is written in chunks of at most `budget` bytes, and
//! for each chunk the old file is scanned sequentially for the rows that land in it (one
//! pass when the table fits the budget).

use std::path::{Path, PathBuf};

use super::format::{BLOCK, HEADER_BYTES};
use super::{layout_bytes, open_error, runs, BlockFile};
use tiermem_core::sys::devfile::{DevFile, Options, MARK_TABLE};
use tiermem_core::sys::direct_io::AlignedBuf;
use tiermem_core::sys::files::{self, Replace};
use tiermem_core::Result;

/// Where a relayout writes the new file before the switch.
#[must_use]
pub fn aside(path: &Path) -> PathBuf {
    files::with_suffix(path, ".relayout")
}

/// Remove the `.relayout` file a killed relayout of the table at `path` left (the caller
/// holds the table's lock, so no relayout of it runs): only a regular file tiermem made.
/// Returns whether one was removed.
pub(super) fn remove_stale_aside(path: &Path) -> bool {
    let tmp = aside(path);
    files::marked(&tmp).as_deref() == Some(MARK_TABLE)
        && !files::locked_elsewhere(&tmp)
        && std::fs::remove_file(&tmp).is_ok()
}

impl BlockFile {
    /// Write the rows in `layout`'s order (row → position, a permutation) to a new file and
    /// switch it in for this one; returns the new file, its generation one higher. Rows
    /// must already hold their newest values (a cache writes its dirty rows back first);
    /// the row log is compacted first, so the homes hold them. `progress(done, total)` is
    /// called after each chunk. On error the old file is untouched and still this table's.
    pub fn relayout(
        &self,
        layout: Vec<u32>,
        budget: usize,
        mut progress: impl FnMut(u64, u64),
    ) -> Result<BlockFile> {
        self.writable("be relaid out")?;
        // No row is logged while the homes are copied.
        let _guard = self.appending.lock();
        self.compact_locked()?;
        let n = self.header.rows as usize;
        if let Some(p) = crate::layout::permutation_problem(&layout, n) {
            tiermem_core::bail!("table '{}': {p}", self.name);
        }
        let mut header = self.header;
        header.generation += 1;
        header.layout_crc = crc32c::crc32c(&layout_bytes(&layout));
        let tmp = aside(&self.path);
        match std::fs::remove_file(&tmp) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(self.io_error("remove a stale relayout file", e)),
        }
        let opts = Options {
            len: header.file_bytes(),
            overwrite: false,
            direct: true,
            refuse_memory_fs: true,
            attach: false,
            keep: true,
            read_only: false,
        };
        let file = DevFile::open(&tmp, opts).map_err(|e| open_error(&self.name, &tmp, e))?;
        let mut new = BlockFile::assemble(&self.name, &tmp, file, header, layout, self.depth())?;
        let done = self
            .copy_rows_to(&new, budget, &mut progress)
            .and_then(|()| new.sync())
            .and_then(|()| {
                let me = files::identity(&self.file.file)
                    .map_err(|e| self.io_error("stat the table file", e))?;
                files::rename_over(&tmp, &self.path, Replace::Same(me))
                    .map_err(|e| self.io_error("switch in the relaid-out file", e))
            });
        if let Err(e) = done {
            drop(new);
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        new.path.clone_from(&self.path);
        Ok(new)
    }

    /// Write the header, the layout and every data block of `new` from this file's rows.
    fn copy_rows_to(
        &self,
        new: &BlockFile,
        budget: usize,
        progress: &mut impl FnMut(u64, u64),
    ) -> Result<()> {
        const _: () = assert!(HEADER_BYTES <= BLOCK);
        new.write_meta()?;
        let h = &self.header;
        let bpr = u64::from(h.blocks_per_row);
        let total = h.data_blocks;
        let chunk = ((budget / BLOCK) as u64 / bpr * bpr).max(bpr);
        let scan = (256 / bpr).max(1) * bpr;
        let stride = self.stride();
        let mut row = vec![0u8; stride];
        let mut out_start = 0;
        while out_start < total {
            let out_end = (out_start + chunk).min(total);
            let out_blocks: Vec<u64> = (out_start..out_end).collect();
            let mut out = AlignedBuf::new(out_blocks.len() * BLOCK);
            let data = out.as_mut_slice();
            let mut b = 0;
            while b < total {
                let run: Vec<u64> = (b..(b + scan).min(total)).collect();
                let mut buf = self.read_blocks(&run)?;
                let old = buf.as_mut_slice();
                for r in self.rows_in(&run) {
                    let first = new.place(None, r).block;
                    if (out_start..out_end).contains(&first) {
                        self.copy_out(None, r, &run, old, &mut row);
                        new.copy_in(r, &out_blocks, data, &row);
                    }
                }
                b += scan;
            }
            for (j, blk) in data.chunks_exact_mut(BLOCK).enumerate() {
                super::format::seal(blk, out_start + j as u64);
            }
            for (first_idx, first, k) in runs(&out_blocks, 256, h.blocks_per_row) {
                let s = &data[first_idx * BLOCK..(first_idx + k) * BLOCK];
                new.write_raw(s, h.data_offset(first), "write the relaid-out blocks")?;
            }
            out_start = out_end;
            progress(out_start, total);
        }
        Ok(())
    }

    /// The rows stored in the given consecutive data blocks (whole rows only).
    fn rows_in(&self, blocks: &[u64]) -> Vec<u64> {
        let h = &self.header;
        let (rpb, bpr) = (u64::from(h.rows_per_block), u64::from(h.blocks_per_row));
        let (Some(&first), Some(&last)) = (blocks.first(), blocks.last()) else {
            return Vec::new();
        };
        let positions = (first / bpr * rpb)..((last + 1) / bpr * rpb).min(h.rows);
        positions
            .map(|p| u64::from(self.rows_at[p as usize]))
            .collect()
    }
}
