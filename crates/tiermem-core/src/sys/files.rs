//! Every file tiermem creates is made here, one way: `O_CREAT|O_EXCL|O_NOFOLLOW|O_CLOEXEC`,
//! owner-only where asked, after the stale name (a temporary of a killed process) is
//! unlinked, never followed. A file is put in place by [`rename_over`], which renames only
//! over a name that is absent or the very file the caller verified (same device and inode,
//! a regular file with one link): a symbolic or hard link planted in a table's folder is
//! refused, never written through.
//!
//! Files tiermem made are marked with the extended attribute [`MARK`], so a file a dead
//! process left can be told from a user's ([`marked`]); only the file's owner can set it.

use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// The extended attribute marking a file tiermem made; its value says what the file is.
pub const MARK: &str = "user.tiermem";
const MARK_C: &std::ffi::CStr = c"user.tiermem";
const _: () = assert!(MARK_C.to_bytes().len() == MARK.len());

/// How [`create`] opens the new file.
#[derive(Debug, Clone, Copy, Default)]
pub struct Create {
    /// Open for reading too.
    pub read: bool,
    /// Extra `open(2)` flags (`O_DIRECT`).
    pub flags: i32,
    /// Permission bits (0: the default 0o644, less the umask).
    pub mode: u32,
}

/// Create `path` anew: refused if any name is there (`EEXIST`), a symbolic link included.
pub fn create(path: &Path, how: Create) -> io::Result<File> {
    let mut o = OpenOptions::new();
    o.read(how.read)
        .write(true)
        .create_new(true)
        .custom_flags(how.flags | libc::O_NOFOLLOW | libc::O_CLOEXEC);
    o.mode(if how.mode == 0 { 0o644 } else { how.mode });
    o.open(path)
}

/// Create `path` anew as [`create`] does, already carrying [`mark`]'s `what`: the file is
/// made unnamed in its folder (`O_TMPFILE`), marked, then linked in, so no kill can leave an
/// unmarked file at `path` that a later run may not reclaim. Where the file system has no
/// `O_TMPFILE`, it is created and then marked. Returns the file and whether it is marked.
pub fn create_marked(path: &Path, how: Create, what: &str) -> io::Result<(File, bool)> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let mut o = OpenOptions::new();
    o.read(how.read)
        .write(true)
        .custom_flags(how.flags | libc::O_TMPFILE | libc::O_CLOEXEC);
    o.mode(if how.mode == 0 { 0o644 } else { how.mode });
    let f = match o.open(dir) {
        Ok(f) => f,
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::EOPNOTSUPP | libc::EISDIR | libc::EINVAL)
            ) =>
        {
            let f = create(path, how)?;
            let marked = mark(&f, what);
            return Ok((f, marked));
        }
        Err(e) => return Err(e),
    };
    let marked = mark(&f, what);
    let from =
        CString::new(format!("/proc/self/fd/{}", f.as_raw_fd())).map_err(io::Error::other)?;
    let to = CString::new(path.as_os_str().as_bytes()).map_err(io::Error::other)?;
    // SAFETY: both strings are NUL-terminated and outlive the call; linkat fails with EEXIST
    // when any name (a symbolic link included) is at `path`, as O_EXCL would.
    let rc = unsafe {
        libc::linkat(
            libc::AT_FDCWD,
            from.as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            libc::AT_SYMLINK_FOLLOW,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((f, marked))
}

/// Create the temporary `tmp`, unlinking a stale file of that name first (an unlink removes
/// a link itself, never what it points to).
pub fn create_aside(tmp: &Path, how: Create) -> io::Result<File> {
    remove_stale(tmp)?;
    create(tmp, how)
}

/// [`create_aside`], the new file carrying [`mark`]'s `what` from its first moment
/// ([`create_marked`]).
pub fn create_aside_marked(tmp: &Path, how: Create, what: &str) -> io::Result<File> {
    remove_stale(tmp)?;
    create_marked(tmp, how, what).map(|(f, _)| f)
}

fn remove_stale(tmp: &Path) -> io::Result<()> {
    match std::fs::remove_file(tmp) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// Open an existing file without following a symbolic link at `path`, for reading (and
/// writing if `write`), with extra `flags`.
pub fn open_existing(path: &Path, write: bool, flags: i32) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(write)
        .custom_flags(flags | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
}

/// Whether `m` is owned by this process's (effective) user.
#[must_use]
pub fn is_mine(m: &std::fs::Metadata) -> bool {
    // SAFETY: geteuid has no preconditions.
    m.uid() == unsafe { libc::geteuid() }
}

/// `path`'s device and inode, from the open file.
pub fn identity(f: &File) -> io::Result<(u64, u64)> {
    let m = f.metadata()?;
    Ok((m.dev(), m.ino()))
}

/// Why the open regular file `f` cannot be used as a tiermem file: it has more than one
/// name (a hard link planted elsewhere would be written through).
pub fn single_link_problem(f: &File) -> Option<String> {
    let m = f.metadata().ok()?;
    (m.is_file() && m.nlink() > 1).then(|| {
        format!(
            "it has {} hard links: another name shares its data, and writing it would change \
             that file too",
            m.nlink()
        )
    })
}

/// What [`rename_over`] may replace at its destination (a symbolic link, a folder, a file
/// with a second hard link or one a live owner holds locked never).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replace {
    /// Nothing: the name must be free.
    Nothing,
    /// Only the file of this (device, inode): the one the caller holds open.
    Same((u64, u64)),
    /// A regular file (in a folder only this user writes: calibration files).
    Regular,
    /// A file tiermem made ([`mark`]) that no live owner holds.
    Marked,
}

/// What is at `dst` that a rename must not replace under `allow` (`None`: it may go).
#[must_use]
pub fn rename_target_problem(dst: &Path, allow: Replace) -> Option<String> {
    let m = match std::fs::symlink_metadata(dst) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return None,
        Err(e) => return Some(format!("it cannot be inspected ({e})")),
    };
    if m.file_type().is_symlink() {
        return Some("it is a symbolic link".into());
    }
    if !m.is_file() {
        return Some("it is not a regular file".into());
    }
    if m.nlink() > 1 {
        return Some(format!("it has {} hard links", m.nlink()));
    }
    match allow {
        Replace::Same(id) if id == (m.dev(), m.ino()) => None,
        Replace::Same(_) => {
            Some("it is no longer the file this table opened (it was replaced)".into())
        }
        Replace::Regular => None,
        Replace::Marked if locked_elsewhere(dst) => {
            Some("it is a live table's file (open and locked by a table)".into())
        }
        Replace::Marked if marked(dst).is_some() => None,
        Replace::Marked => Some("it is a file tiermem did not make".into()),
        Replace::Nothing => Some("a file is already there".into()),
    }
}

/// Rename `tmp` over `dst` once [`rename_target_problem`] finds nothing, then sync `dst`'s
/// folder. A refusal is `PermissionDenied` naming the reason.
pub fn rename_over(tmp: &Path, dst: &Path, allow: Replace) -> io::Result<()> {
    if let Some(p) = rename_target_problem(dst, allow) {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("not renamed over {}: {p}", dst.display()),
        ));
    }
    std::fs::rename(tmp, dst)?;
    sync_folder(dst)
}

/// Whether another open file description holds `path`'s `flock` (a live table or device);
/// a symbolic link is not followed.
#[must_use]
pub fn locked_elsewhere(path: &Path) -> bool {
    let Ok(probe) = open_existing(path, false, 0) else {
        return false;
    };
    // SAFETY: the fd is open and owned by `probe`; the shared lock, if taken, goes with it.
    let rc = unsafe { libc::flock(probe.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) };
    rc != 0 && io::Error::last_os_error().raw_os_error() == Some(libc::EWOULDBLOCK)
}

/// Sync the folder holding `path` (a rename in it is then durable).
pub fn sync_folder(path: &Path) -> io::Result<()> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    File::open(dir)?.sync_all()
}

/// `path` with `suffix` appended to its last component.
#[must_use]
pub fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(suffix);
    PathBuf::from(p)
}

/// Mark the open file `f` as tiermem's (`what` says which kind); `false` where the file
/// system keeps no extended attributes (the file then cannot be reclaimed after a crash).
pub fn mark(f: &File, what: &str) -> bool {
    let name = MARK_C;
    // SAFETY: the fd is open; name is NUL-terminated; value points to `what.len()` bytes.
    let rc = unsafe {
        libc::fsetxattr(
            f.as_raw_fd(),
            name.as_ptr(),
            what.as_ptr().cast(),
            what.len(),
            0,
        )
    };
    rc == 0
}

/// The kind [`mark`] gave the file at `path` (a symbolic link is not followed), if it is
/// marked and owned by this process's user.
#[must_use]
pub fn marked(path: &Path) -> Option<String> {
    let m = std::fs::symlink_metadata(path).ok()?;
    if !m.is_file() || !is_mine(&m) {
        return None;
    }
    let c = CString::new(path.as_os_str().as_bytes()).ok()?;
    let name = MARK_C;
    let mut buf = [0u8; 64];
    // SAFETY: both strings are NUL-terminated; buf is valid for its length.
    let n = unsafe {
        libc::lgetxattr(
            c.as_ptr(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    let n = usize::try_from(n).ok()?;
    String::from_utf8(buf[..n].to_vec()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    fn dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("tiermem-files-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn a_marked_file_appears_marked_and_never_replaces_a_name() {
        let d = dir("marked");
        let how = Create {
            read: true,
            flags: 0,
            mode: 0o600,
        };
        let p = d.join("t.tbl");
        let (mut f, is_marked) = create_marked(&p, how, "table").unwrap();
        f.write_all(b"rows").unwrap();
        if is_marked {
            assert_eq!(marked(&p).as_deref(), Some("table"));
        }
        assert_eq!(std::fs::read(&p).unwrap(), b"rows");
        assert_eq!(
            create_marked(&p, how, "table").unwrap_err().kind(),
            io::ErrorKind::AlreadyExists
        );
        let victim = d.join("victim");
        std::fs::write(&victim, b"precious").unwrap();
        let link = d.join("link");
        std::os::unix::fs::symlink(&victim, &link).unwrap();
        assert_eq!(
            create_marked(&link, how, "table").unwrap_err().kind(),
            io::ErrorKind::AlreadyExists
        );
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_planted_symlink_is_unlinked_never_followed() {
        let d = dir("link");
        let victim = d.join("victim");
        std::fs::write(&victim, b"precious").unwrap();
        let tmp = d.join("t.tmp");
        std::os::unix::fs::symlink(&victim, &tmp).unwrap();
        assert_eq!(
            create(&tmp, Create::default()).unwrap_err().kind(),
            io::ErrorKind::AlreadyExists
        );
        let mut f = create_aside(&tmp, Create::default()).unwrap();
        f.write_all(b"new").unwrap();
        let mut s = String::new();
        File::open(&victim).unwrap().read_to_string(&mut s).unwrap();
        assert_eq!(s, "precious");
        assert!(open_existing(&d.join("l2"), false, 0).is_err());
        std::os::unix::fs::symlink(&victim, d.join("l2")).unwrap();
        assert!(open_existing(&d.join("l2"), false, 0).is_err());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn rename_goes_only_over_the_verified_file() {
        let d = dir("rename");
        let (tmp, dst) = (d.join("a.tmp"), d.join("a"));
        std::fs::write(&dst, b"old").unwrap();
        let id = identity(&File::open(&dst).unwrap()).unwrap();
        std::fs::write(&tmp, b"new").unwrap();
        assert!(
            rename_over(&tmp, &dst, Replace::Nothing).is_err(),
            "an existing file"
        );
        assert!(
            rename_over(&tmp, &dst, Replace::Marked).is_err(),
            "not ours"
        );
        std::fs::hard_link(&dst, d.join("other")).unwrap();
        let e = rename_over(&tmp, &dst, Replace::Same(id)).unwrap_err();
        assert!(e.to_string().contains("hard links"), "{e}");
        std::fs::remove_file(d.join("other")).unwrap();
        rename_over(&tmp, &dst, Replace::Same(id)).unwrap();
        assert_eq!(std::fs::read(&dst).unwrap(), b"new");
        std::fs::write(&tmp, b"newer").unwrap();
        std::fs::remove_file(&dst).unwrap();
        std::os::unix::fs::symlink(d.join("elsewhere"), &dst).unwrap();
        let e = rename_over(&tmp, &dst, Replace::Same(id)).unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn hard_linked_files_are_named() {
        let d = dir("hard");
        std::fs::write(d.join("a"), b"x").unwrap();
        assert!(single_link_problem(&File::open(d.join("a")).unwrap()).is_none());
        std::fs::hard_link(d.join("a"), d.join("b")).unwrap();
        assert!(single_link_problem(&File::open(d.join("a")).unwrap())
            .unwrap()
            .contains("2 hard links"));
        std::fs::remove_dir_all(&d).unwrap();
    }
}
