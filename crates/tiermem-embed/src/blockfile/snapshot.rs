//! Snapshots: a whole table file copied to another path, as a checkpoint records a block
//! table (its file and generation) instead of streaming its rows. The copy is a reflink where
//! the filesystem offers one (instant, copy-on-write), otherwise an in-kernel copy; either
//! way no row passes through this process. It is written to `DST.partial`, synced, renamed
//! to `DST` and the directory synced, so `DST` is either absent, an older snapshot, or this
//! one whole.

use std::path::{Path, PathBuf};

use super::BlockFile;
use tiermem_core::sys::clone::{clone_file, CloneHow};
use tiermem_core::{Error, Result};

/// Where a snapshot is written before it is renamed into place.
fn partial(dst: &Path) -> PathBuf {
    let mut p = dst.as_os_str().to_owned();
    p.push(".partial");
    PathBuf::from(p)
}

impl BlockFile {
    /// Copy this file, as it is on the disk now, to `dst`. Rows must already hold their
    /// newest values (a cache writes its dirty rows back and syncs first). On error nothing
    /// is left at `DST.partial` and `dst` is untouched.
    pub fn snapshot(&self, dst: &Path) -> Result<CloneHow> {
        let tmp = partial(dst);
        let err = |what: &str, e: std::io::Error| {
            Error::io(&self.name, &dst.display().to_string(), what, e)
        };
        match std::fs::remove_file(&tmp) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(err("remove a stale partial snapshot", e)),
        }
        let out = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .map_err(|e| err("create the snapshot", e))?;
        let done = std::fs::File::open(&self.path)
            .map_err(|e| err("open the table file to copy it", e))
            .and_then(|src| {
                clone_file(&src, &out, self.header.file_bytes())
                    .map_err(|e| err("copy the table file", e))
            })
            .and_then(|how| {
                out.sync_all().map_err(|e| err("sync the snapshot", e))?;
                std::fs::rename(&tmp, dst).map_err(|e| err("rename the snapshot into place", e))?;
                Ok(how)
            });
        drop(out);
        let how = match done {
            Ok(how) => how,
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                return Err(e);
            }
        };
        if let Some(dir) = dst.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(|e| err("sync the snapshot's directory", e))?;
        }
        Ok(how)
    }
}
