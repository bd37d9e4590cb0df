//! Device files (`block:PATH`, `mapped:PATH`) are the user's files: tiermem creates a new
//! one exclusively, refuses to overwrite an existing non-empty file or a block-device node
//! unless asked to, locks the file for the owner's life (two managers on one path would
//! corrupt each other), and removes a file it created when the owner drops it.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use super::direct_io::statfs;

const TMPFS_MAGIC: i64 = 0x0102_1994;
const RAMFS_MAGIC: i64 = 0x8584_58f6;

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
    /// An existing non-empty file, or a block-device node, and no `overwrite`.
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
}

impl DevFile {
    /// Open or create `path` as a device file of `o.len` bytes (see the module doc).
    pub fn open(path: &Path, o: Options) -> Result<Self, DevFileError> {
        let meta = std::fs::metadata(path).ok();
        let block_node = meta
            .as_ref()
            .is_some_and(|m| m.file_type().is_block_device());
        let existing = meta.as_ref().map(std::fs::Metadata::len);
        if meta.as_ref().is_some_and(std::fs::Metadata::is_file) && locked_elsewhere(path) {
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
            if !o.overwrite && !o.attach && (block_node || m.len() > 0) {
                return Err(DevFileError::Exists {
                    what: if block_node {
                        "a block device (its contents would be destroyed)".into()
                    } else {
                        format!("an existing file of {} bytes", m.len())
                    },
                });
            }
        }
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
        let mut opts = OpenOptions::new();
        opts.read(true).write(true);
        let mut flags = 0;
        if o.direct {
            flags |= libc::O_DIRECT;
        }
        if block_node {
            // On a block device, O_EXCL means: fail if it is mounted or in use elsewhere.
            flags |= libc::O_EXCL;
        } else if meta.is_none() {
            opts.create_new(true);
        }
        opts.custom_flags(flags);
        if o.attach && meta.is_none() {
            return Err(DevFileError::Os(
                "open (no such file to attach)",
                std::io::Error::from_raw_os_error(libc::ENOENT),
            ));
        }
        let created = meta.is_none();
        let file = opts.open(path).map_err(|e| {
            if created {
                let _ = std::fs::remove_file(path);
            }
            match e.raw_os_error() {
                Some(libc::EINVAL) if o.direct => {
                    DevFileError::Os("open with O_DIRECT (the file system refuses direct I/O)", e)
                }
                Some(libc::EEXIST) => DevFileError::Exists {
                    what: "a file created by someone else just now".into(),
                },
                Some(libc::EBUSY) => DevFileError::Locked,
                _ => DevFileError::Os("open", e),
            }
        })?;
        let mut me = DevFile {
            file,
            path: path.to_owned(),
            created: created && !o.keep,
            block_node,
        };
        // SAFETY: the fd is open and owned by `me.file`; flock has no memory effects.
        if unsafe { libc::flock(me.file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let e = std::io::Error::last_os_error();
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
                    me.created = false;
                }
                return Err(e);
            }
        }
        Ok(me)
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
        if self.created {
            // Removed while still locked, so no other manager can open it half-gone.
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Whether another open file description holds `path`'s lock (a live manager's device).
fn locked_elsewhere(path: &Path) -> bool {
    let Ok(probe) = File::open(path) else {
        return false;
    };
    // SAFETY: the fd is open and owned by `probe`; the shared lock, if taken, goes with it.
    let rc = unsafe { libc::flock(probe.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) };
    rc != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EWOULDBLOCK)
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
