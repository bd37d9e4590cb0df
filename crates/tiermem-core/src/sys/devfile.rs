//! Device files (`block:PATH`, `mapped:PATH`) and table files: tiermem creates a new one
//! exclusively ([`super::files::create`]: `O_EXCL|O_NOFOLLOW`) and marks it as its own
//! ([`super::files::mark`]), refuses to overwrite an existing non-empty file or a
//! block-device node unless asked to, never follows a symbolic link to a regular file nor
//! writes a file with a second hard link, locks the file for the owner's life (two managers
//! on one path would corrupt each other), and removes a device file it created when the
//! owner drops it or the process exits ([`remove_created`]). A device file a dead process
//! left (marked, not locked) is reclaimed by the next run instead of refused.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::direct_io::statfs;
use super::files;

const TMPFS_MAGIC: i64 = 0x0102_1994;
const RAMFS_MAGIC: i64 = 0x8584_58f6;

/// The mark of a device file, removed when its owner goes ([`files::MARK`]).
pub const MARK_DEVICE: &str = "device";
/// The mark of a table file, which outlives processes.
pub const MARK_TABLE: &str = "table";

/// Device files created and not yet removed, with the process that created each: what
/// [`remove_created`] unlinks at exit (a forked child inherits the list but never removes
/// its parent's files). A leaf lock (lock order: taken alone, holding nothing else).
static CREATED: Mutex<Vec<(u32, PathBuf)>> = Mutex::new(Vec::new());

fn created_list() -> std::sync::MutexGuard<'static, Vec<(u32, PathBuf)>> {
    CREATED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Unlink every device file this process created and still holds (at interpreter exit, or a
/// CLI's signal handler): open maps stay valid, the names go. Returns how many.
pub fn remove_created() -> usize {
    let me = std::process::id();
    let mine: Vec<PathBuf> = {
        let mut g = created_list();
        let (mine, others) = std::mem::take(&mut *g).into_iter().partition(|c| c.0 == me);
        *g = others;
        mine.into_iter().map(|c| c.1).collect()
    };
    mine.iter()
        .filter(|p| std::fs::remove_file(p).is_ok())
        .count()
}

fn forget_created(path: &Path) {
    created_list().retain(|(_, p)| p != path);
}

/// Why a path cannot hold a device.
#[derive(Debug)]
pub enum DevFileError {
    /// The OS refused (missing directory, permissions, O_DIRECT unsupported, ...).
    Os(&'static str, std::io::Error),
    /// The path is on a memory file system (data would live in RAM, not on a disk).
    MemoryFs(&'static str),
    /// Less free space than the device needs (checked up front).
    NoSpace {
        /// Bytes free on the file system.
        free: u64,
    },
    /// An existing non-empty file, or a block-device node, and no `overwrite`; or a link
    /// that is never written through.
    Exists {
        /// What is there.
        what: String,
    },
    /// Another process (or manager) holds the file's lock.
    Locked,
    /// A block-device node smaller than the capacity.
    TooSmall {
        /// Its size in bytes.
        size: u64,
    },
}

/// An open, locked device file.
#[derive(Debug)]
pub struct DevFile {
    /// The file (opened read-write, `O_DIRECT` if asked for).
    pub file: File,
    path: PathBuf,
    created: bool,
    /// Whether it is a block-device node.
    pub block_node: bool,
    /// Whether this call removed a file a dead process left (and made it anew).
    pub reclaimed: bool,
    /// The process that opened it (a forked child never removes it).
    opener: u32,
}

/// Options for [`DevFile::open`].
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// Bytes the device needs.
    pub len: u64,
    /// Use an existing non-empty file or a block-device node, destroying what it holds.
    pub overwrite: bool,
    /// Open with `O_DIRECT`.
    pub direct: bool,
    /// Refuse memory file systems (a `block` device there would not be a disk).
    pub refuse_memory_fs: bool,
    /// Open an existing regular file as it is, to use what it holds (a table file that
    /// outlives processes): no overwrite refusal, nothing reserved, never removed.
    pub attach: bool,
    /// Keep a file this call creates when the owner drops it (a table file).
    pub keep: bool,
    /// With `attach`: open for reading only, under a shared lock, so several readers (the
    /// processes restoring one checkpoint's snapshot) open it at once and no writer can.
    pub read_only: bool,
}

impl DevFile {
    /// Open or create `path` as a device file of `o.len` bytes (see the module doc).
    pub fn open(path: &Path, o: Options) -> Result<Self, DevFileError> {
        let mut reclaimed = false;
        let mut meta = std::fs::symlink_metadata(path).ok();
        if meta.as_ref().is_some_and(|m| m.file_type().is_symlink()) {
            // A link to a block-device node (`/dev/disk/by-id/...`) is how disks are named;
            // a link to anything else is never followed.
            match std::fs::metadata(path) {
                Ok(t) if t.file_type().is_block_device() => meta = Some(t),
                _ => {
                    return Err(DevFileError::Exists {
                        what: "a symbolic link (tiermem never writes through one; give the \
                               file's own path)"
                            .into(),
                    })
                }
            }
        }
        let block_node = meta
            .as_ref()
            .is_some_and(|m| m.file_type().is_block_device());
        if meta.as_ref().is_some_and(std::fs::Metadata::is_file) && locked_for(path, LOCK_GRACE) {
            return Err(DevFileError::Locked);
        }
        if let Some(m) = &meta {
            if m.is_dir() {
                return Err(DevFileError::Os(
                    "open (a directory, not a file)",
                    std::io::Error::from_raw_os_error(libc::EISDIR),
                ));
            }
            if !m.is_file() && !block_node {
                return Err(DevFileError::Exists {
                    what: "something that is neither a regular file nor a block device".into(),
                });
            }
            if o.attach && !m.is_file() {
                return Err(DevFileError::Exists {
                    what: "a block device, not a table file".into(),
                });
            }
            let refused = !o.overwrite && !o.attach && (block_node || m.len() > 0);
            if refused && !o.keep && files::marked(path).as_deref() == Some(MARK_DEVICE) {
                // A device file of a process that died (its lock went with it): ours to reuse.
                // Removed while this process holds its lock, so no live owner loses it.
                let held = files::open_existing(path, false, 0)
                    .map_err(|e| DevFileError::Os("open a dead process's device file", e))?;
                // SAFETY: the fd is open and owned by `held`; flock has no memory effects.
                if unsafe { libc::flock(held.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
                    return Err(DevFileError::Locked);
                }
                std::fs::remove_file(path)
                    .map_err(|e| DevFileError::Os("remove a dead process's device file", e))?;
                drop(held);
                reclaimed = true;
                meta = None;
            } else if refused {
                return Err(DevFileError::Exists {
                    what: if block_node {
                        "a block device (its contents would be destroyed)".into()
                    } else {
                        format!("an existing file of {} bytes", m.len())
                    },
                });
            }
        }
        let existing = meta.as_ref().map(std::fs::Metadata::len);
        if !block_node {
            let dir = path
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or(Path::new("."));
            let (fs_type, free) = statfs(dir).map_err(|e| DevFileError::Os("statfs", e))?;
            if o.refuse_memory_fs && fs_type == TMPFS_MAGIC {
                return Err(DevFileError::MemoryFs("tmpfs"));
            }
            if o.refuse_memory_fs && fs_type == RAMFS_MAGIC {
                return Err(DevFileError::MemoryFs("ramfs"));
            }
            let have = existing.unwrap_or(0);
            if !o.attach && o.len > have && o.len - have > free {
                return Err(DevFileError::NoSpace { free });
            }
        }
        if o.attach && meta.is_none() {
            return Err(DevFileError::Os(
                "open (no such file to attach)",
                std::io::Error::from_raw_os_error(libc::ENOENT),
            ));
        }
        let flags = if o.direct { libc::O_DIRECT } else { 0 };
        let created = meta.is_none();
        let opened = if created {
            let how = files::Create {
                read: true,
                flags,
                mode: 0o600,
            };
            files::create_marked(path, how, if o.keep { MARK_TABLE } else { MARK_DEVICE })
                .map(|(f, _)| f)
        } else if block_node {
            // On a block device, O_EXCL means: fail if it is mounted or in use elsewhere. The
            // path may be a link to the node (checked above).
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .custom_flags(flags | libc::O_EXCL | libc::O_CLOEXEC)
                .open(path)
        } else {
            files::open_existing(path, !(o.attach && o.read_only), flags)
        };
        let file = opened.map_err(|e| match e.raw_os_error() {
            Some(libc::EINVAL) if o.direct => {
                if created {
                    let _ = std::fs::remove_file(path);
                }
                DevFileError::Os("open with O_DIRECT (the file system refuses direct I/O)", e)
            }
            Some(libc::EEXIST) => DevFileError::Exists {
                what: "a file created by someone else just now".into(),
            },
            Some(libc::ELOOP) => DevFileError::Exists {
                what: "a symbolic link placed there just now (never followed)".into(),
            },
            Some(libc::EBUSY) => DevFileError::Locked,
            _ => DevFileError::Os("open", e),
        })?;
        if !created && !block_node {
            if let Some(p) = files::single_link_problem(&file) {
                return Err(DevFileError::Exists {
                    what: format!("a file whose data {p}"),
                });
            }
        }
        let mut me = DevFile {
            file,
            path: path.to_owned(),
            created: created && !o.keep,
            block_node,
            reclaimed,
            opener: std::process::id(),
        };
        // (`me.created` implies `created`: a file this call made, to remove when dropped.)
        if me.created {
            created_list().push((std::process::id(), path.to_owned()));
        }
        let how = if o.attach && o.read_only {
            libc::LOCK_SH
        } else {
            libc::LOCK_EX
        };
        // SAFETY: the fd is open and owned by `me.file`; flock has no memory effects.
        if unsafe { libc::flock(me.file.as_raw_fd(), how | libc::LOCK_NB) } != 0 {
            let e = std::io::Error::last_os_error();
            if me.created {
                forget_created(path);
            }
            me.created = false; // not ours to remove: someone else's live device
            return Err(if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
                DevFileError::Locked
            } else {
                DevFileError::Os("lock", e)
            });
        }
        if block_node {
            let size = block_size(&me.file).map_err(|e| DevFileError::Os("read its size", e))?;
            if size < o.len {
                return Err(DevFileError::TooSmall { size });
            }
        } else if !o.attach {
            if let Err(e) = me.reserve(o.len) {
                if created {
                    // Nothing of it is anyone's yet, whether or not it was to be kept.
                    let _ = std::fs::remove_file(path);
                    forget_created(path);
                    me.created = false;
                }
                return Err(e);
            }
        }
        Ok(me)
    }

    /// The path it was opened at.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reserve the blocks now, so a full disk shows up here rather than as a failed write
    /// (or, for a shared map, a SIGBUS) later; file systems without fallocate get a sparse
    /// file of the same length.
    fn reserve(&self, len: u64) -> Result<(), DevFileError> {
        // SAFETY: the fd is an open, writable file descriptor owned by `self.file`.
        let rc = unsafe { libc::posix_fallocate(self.file.as_raw_fd(), 0, len as libc::off_t) };
        match rc {
            0 => Ok(()),
            libc::EOPNOTSUPP | libc::EINVAL => self
                .file
                .set_len(len)
                .map_err(|e| DevFileError::Os("set length", e)),
            e => Err(DevFileError::Os(
                "reserve space",
                std::io::Error::from_raw_os_error(e),
            )),
        }
    }
}

impl Drop for DevFile {
    fn drop(&mut self) {
        if self.created && self.opener == std::process::id() {
            // Removed while still locked, so no other manager can open it half-gone.
            let _ = std::fs::remove_file(&self.path);
            forget_created(&self.path);
        }
    }
}

/// How long a lock found held is waited for before the file is refused: the kernel releases
/// a killed process's files after it is reaped, once its in-flight I/O (an io_uring's
/// requests) completes, so a rerun right after a kill would otherwise be refused.
pub const LOCK_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// Whether `path`'s lock stays held by another owner for `grace`.
fn locked_for(path: &Path, grace: std::time::Duration) -> bool {
    let start = std::time::Instant::now();
    while files::locked_elsewhere(path) {
        if start.elapsed() >= grace {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    false
}

/// Size of a block-device node (`BLKGETSIZE64`).
fn block_size(f: &File) -> std::io::Result<u64> {
    const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
    let mut size: u64 = 0;
    // SAFETY: BLKGETSIZE64 writes one u64 through the pointer, which is valid.
    let rc = unsafe { libc::ioctl(f.as_raw_fd(), BLKGETSIZE64, &mut size) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(size)
}
