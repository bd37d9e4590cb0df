//! Snapshots: a whole table file copied to another path, as a checkpoint records a block
//! table (its file and generation) instead of streaming its rows. The copy is a reflink where
//! the filesystem offers one (instant, copy-on-write), otherwise an in-kernel copy; either
//! way no row passes through this process. It is written to `DST.partial`, synced, renamed
//! to `DST` and the directory synced, so `DST` is either absent, an older snapshot, or this
//! one whole.

use std::path::{Path, PathBuf};

use super::BlockFile;
use tiermem_core::sys::clone::{clone_file, CloneHow};
use tiermem_core::sys::devfile::MARK_TABLE;
use tiermem_core::sys::files::{self, Create, Replace};
use tiermem_core::{Error, Result};

/// Where a snapshot is written before it is renamed into place.
fn partial(dst: &Path) -> PathBuf {
    files::with_suffix(dst, ".partial")
}

impl BlockFile {
    /// Copy this file to `dst`, its row log compacted first, so the copy holds every row
    /// at home, each block checksummed (a file open read-only, which cannot compact, is
    /// copied with its log, which the copy replays). Rows must already hold their newest
    /// values (a cache writes its dirty rows back and syncs first). `dst` may be
    /// absent or an earlier snapshot (a file tiermem made that no table holds open); a
    /// user's file, a live table's, a symbolic or hard link there is refused. On error
    /// nothing is left at `DST.partial` and `dst` is untouched.
    pub fn snapshot(&self, dst: &Path) -> Result<CloneHow> {
        self.here()?;
        let tmp = partial(dst);
        let err = |what: &str, e: std::io::Error| {
            Error::io(&self.name, &dst.display().to_string(), what, e)
        };
        if let Some(p) = files::rename_target_problem(dst, Replace::Marked) {
            return Err(Error::InvalidArgument(format!(
                "table '{}': a snapshot is not written to '{}': {p}",
                self.name,
                dst.display()
            )));
        }
        // No row is logged while the file is compacted and copied.
        let _guard = self.appending.lock();
        if !self.read_only {
            self.compact_locked()?;
        }
        let out = files::create_aside_marked(
            &tmp,
            Create {
                read: false,
                flags: 0,
                mode: 0o600,
            },
            MARK_TABLE,
        )
        .map_err(|e| err("create the snapshot", e))?;
        let len = self.header.data_offset(self.log.read().end);
        let done = files::open_existing(&self.path, false, 0)
            .map_err(|e| err("open the table file to copy it", e))
            .and_then(|src| clone_file(&src, &out, len).map_err(|e| err("copy the table file", e)))
            .and_then(|how| {
                out.sync_all().map_err(|e| err("sync the snapshot", e))?;
                files::rename_over(&tmp, dst, Replace::Marked)
                    .map_err(|e| err("rename the snapshot into place", e))?;
                Ok(how)
            });
        drop(out);
        done.inspect_err(|_| {
            let _ = std::fs::remove_file(&tmp);
        })
    }
}
