//! Copying a whole file without passing its bytes through user space: a reflink (the
//! filesystem shares the extents, copy-on-write: instant on XFS, btrfs and bcachefs) where
//! the filesystem offers one, otherwise the kernel's `copy_file_range` (an in-kernel copy on
//! ext4, offloaded by NFS and some SSDs), and where the kernel copies nothing across the two
//! file systems (`EXDEV`, and file systems without `copy_file_range`), a streamed copy
//! through a buffer in this process.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

/// How [`clone_file`] copied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloneHow {
    /// The destination shares the source's extents (copy-on-write).
    Reflink,
    /// The kernel copied the bytes.
    Copy,
    /// Read and written through this process (another file system).
    Stream,
}

impl CloneHow {
    /// `"reflink"` or `"copy"`.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            CloneHow::Reflink => "reflink",
            CloneHow::Copy => "copy",
            CloneHow::Stream => "stream",
        }
    }
}

/// Make `dst` (empty, open for writing) a copy of the first `len` bytes of `src`. Does not
/// sync `dst`.
pub fn clone_file(src: &File, dst: &File, len: u64) -> io::Result<CloneHow> {
    // SAFETY: FICLONE takes the source descriptor as its argument; both descriptors are open
    // for the duration of the call and the kernel reads no user memory.
    let rc = unsafe { libc::ioctl(dst.as_raw_fd(), libc::FICLONE, src.as_raw_fd()) };
    if rc == 0 {
        return Ok(CloneHow::Reflink);
    }
    let mut off_in: libc::loff_t = 0;
    let mut off_out: libc::loff_t = 0;
    let mut left = len;
    while left > 0 {
        let chunk = usize::try_from(left.min(1 << 30)).unwrap_or(1 << 30);
        // SAFETY: both descriptors are open; the offsets are valid `loff_t`s this function
        // owns, updated by the kernel.
        let n = unsafe {
            libc::copy_file_range(
                src.as_raw_fd(),
                &raw mut off_in,
                dst.as_raw_fd(),
                &raw mut off_out,
                chunk,
                0,
            )
        };
        match n {
            n if n > 0 => left -= n as u64,
            0 => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("the source ended {left} bytes early"),
                ))
            }
            _ => {
                let e = io::Error::last_os_error();
                let cross = matches!(
                    e.raw_os_error(),
                    Some(libc::EXDEV | libc::EOPNOTSUPP | libc::ENOSYS | libc::EINVAL)
                );
                if cross && off_in == 0 {
                    return stream(src, dst, len);
                }
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
    Ok(CloneHow::Copy)
}

/// Copy the first `len` bytes of `src` to `dst` through a 1 MiB buffer.
fn stream(src: &File, dst: &File, len: u64) -> io::Result<CloneHow> {
    use std::os::unix::fs::FileExt;
    let mut buf = vec![0u8; 1 << 20];
    let mut off = 0u64;
    while off < len {
        let want = usize::try_from((len - off).min(buf.len() as u64)).unwrap_or(buf.len());
        let n = src.read_at(&mut buf[..want], off)?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("the source ended {} bytes early", len - off),
            ));
        }
        dst.write_all_at(&buf[..n], off)?;
        off += n as u64;
    }
    Ok(CloneHow::Stream)
}

/// Whether `a` and `b` (existing paths) are on one file system.
#[must_use]
pub fn same_file_system(a: &std::path::Path, b: &std::path::Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) => x.dev() == y.dev(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    #[test]
    fn copies_every_byte() {
        let dir = std::env::temp_dir().join(format!("tiermem-clone-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (a, b) = (dir.join("a"), dir.join("b"));
        let data: Vec<u8> = (0..3_000_017u32).map(|i| (i * 7 % 251) as u8).collect();
        File::create(&a).unwrap().write_all(&data).unwrap();
        let dst = File::create(&b).unwrap();
        clone_file(&File::open(&a).unwrap(), &dst, data.len() as u64).unwrap();
        let mut back = Vec::new();
        File::open(&b).unwrap().read_to_end(&mut back).unwrap();
        assert_eq!(back, data);
        let short = File::create(dir.join("c")).unwrap();
        let err = clone_file(&File::open(&a).unwrap(), &short, data.len() as u64 + 10);
        // A reflink clones the whole file whatever `len` says; a copy finds the end early.
        if let Err(e) = err {
            assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        }
        let streamed = File::create(dir.join("d")).unwrap();
        assert_eq!(
            stream(&File::open(&a).unwrap(), &streamed, data.len() as u64).unwrap(),
            CloneHow::Stream
        );
        assert_eq!(std::fs::read(dir.join("d")).unwrap(), data);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
