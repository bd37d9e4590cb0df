//! Direct I/O on a file: aligned, page-cache-bypassing reads and writes for `block` devices.

use std::ffi::CString;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;

/// Alignment of offsets, lengths and buffers for direct I/O.
pub const ALIGN: usize = 4096;

/// A device file opened with `O_DIRECT` (by [`super::devfile::DevFile`], which owns its
/// lifetime rules), sized to the device capacity.
#[derive(Debug)]
pub struct DirectFile {
    file: File,
}

impl DirectFile {
    /// Wrap a file opened with `O_DIRECT`.
    #[must_use]
    pub fn new(file: File) -> Self {
        DirectFile { file }
    }

    /// Read `buf.len()` bytes at `offset`. `buf`, its length and `offset` must be aligned to
    /// [`ALIGN`].
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        debug_assert!(aligned(buf.as_ptr() as usize, buf.len(), offset));
        let (fd, p) = (self.file.as_raw_fd(), buf.as_mut_ptr());
        let short = || {
            std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "read past the end of the device file",
            )
        };
        // SAFETY: [done, done + n) lies inside `buf`, a live writable buffer.
        transfer(buf.len(), offset, short, |done, n, at| unsafe {
            libc::pread(fd, p.add(done).cast(), n, at)
        })
    }

    /// Write `buf` at `offset`, with the same alignment rules as [`DirectFile::read_at`].
    pub fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        debug_assert!(aligned(buf.as_ptr() as usize, buf.len(), offset));
        let (fd, p) = (self.file.as_raw_fd(), buf.as_ptr());
        let full = || std::io::Error::from_raw_os_error(libc::ENOSPC);
        // SAFETY: [done, done + n) lies inside `buf`, a live readable buffer.
        transfer(buf.len(), offset, full, |done, n, at| unsafe {
            libc::pwrite(fd, p.add(done).cast(), n, at)
        })
    }
}

/// Repeat `op(done, remaining, file offset)` until `len` bytes moved, retrying on EINTR;
/// a zero-byte transfer fails with `on_zero()`.
fn transfer(
    len: usize,
    offset: u64,
    on_zero: impl Fn() -> std::io::Error,
    mut op: impl FnMut(usize, usize, libc::off_t) -> isize,
) -> std::io::Result<()> {
    let mut done = 0;
    while done < len {
        let n = op(done, len - done, (offset + done as u64) as libc::off_t);
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(on_zero());
        }
        done += n as usize;
    }
    Ok(())
}

/// Whether a buffer address, length and file offset all satisfy direct-I/O alignment.
#[must_use]
pub fn aligned(addr: usize, len: usize, offset: u64) -> bool {
    addr.is_multiple_of(ALIGN) && len.is_multiple_of(ALIGN) && offset.is_multiple_of(ALIGN as u64)
}

/// File-system magic number and bytes available to unprivileged users for `dir`.
pub fn statfs(dir: &Path) -> std::io::Result<(i64, u64)> {
    let c = CString::new(dir.as_os_str().as_encoded_bytes())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    // SAFETY: statfs is plain old data; zeroed is a valid initial value.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid NUL-terminated path and `st` a valid out-pointer.
    let rc = unsafe { libc::statfs(c.as_ptr(), &mut st) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    #[allow(clippy::unnecessary_cast)]
    Ok((st.f_type as i64, st.f_bavail as u64 * st.f_bsize as u64))
}

/// A heap buffer aligned to [`ALIGN`] for bounce copies.
pub struct AlignedBuf {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the buffer is uniquely owned memory.
unsafe impl Send for AlignedBuf {}

impl AlignedBuf {
    /// Allocate `len` bytes (rounded up to [`ALIGN`]).
    #[must_use]
    pub fn new(len: usize) -> Self {
        let len = len.next_multiple_of(ALIGN).max(ALIGN);
        let layout = std::alloc::Layout::from_size_align(len, ALIGN).expect("valid layout");
        // SAFETY: layout has non-zero size.
        let ptr = unsafe { std::alloc::alloc(layout) };
        if ptr.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        AlignedBuf { ptr, len }
    }

    /// The buffer as a mutable slice.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: ptr is a live allocation of len bytes owned by self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        let layout = std::alloc::Layout::from_size_align(self.len, ALIGN).expect("valid layout");
        // SAFETY: allocated in `new` with this exact layout.
        unsafe { std::alloc::dealloc(self.ptr, layout) };
    }
}
