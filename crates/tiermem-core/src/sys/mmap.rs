//! Memory maps backing the byte-addressable devices.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::ptr::NonNull;

use super::HUGE_PAGE;

/// An owned memory map. Its contract: `ptr` points to `len` readable and writable bytes
/// that stay mapped until the `Mapping` is dropped, and nothing else unmaps them.
#[derive(Debug)]
pub struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
    /// Bytes at the front skipped to align `ptr` (part of the original map).
    lead: usize,
    /// Length of the original map.
    map_len: usize,
    /// Whether transparent huge pages were requested for this map.
    pub huge_pages: bool,
}

// SAFETY: the mapping is plain memory owned by this value; concurrent access to the bytes
// is coordinated by the manager (regions do not overlap, pinned data is not moved).
unsafe impl Send for Mapping {}
// SAFETY: as above; `&Mapping` only exposes the base pointer and length.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Map `len` bytes of anonymous memory, aligned to 2 MiB, ask for transparent huge
    /// pages when `huge` is set, and optionally bind it to a NUMA node before faulting it in.
    pub fn anonymous(len: usize, huge: bool, numa_node: Option<u32>) -> std::io::Result<Self> {
        let total = len.checked_add(HUGE_PAGE).ok_or_else(overflow)?;
        // SAFETY: a fresh anonymous private map; no existing memory is affected.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                total,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let addr = raw as usize;
        let lead = addr.next_multiple_of(HUGE_PAGE) - addr;
        // SAFETY: lead < HUGE_PAGE <= total, so the result stays inside the map.
        let ptr = unsafe { raw.cast::<u8>().add(lead) };
        let mut map = Mapping {
            ptr: NonNull::new(ptr).ok_or_else(overflow)?,
            len,
            lead,
            map_len: total,
            huge_pages: false,
        };
        if huge {
            // SAFETY: the range is inside our own map.
            let rc = unsafe { libc::madvise(ptr.cast(), len, libc::MADV_HUGEPAGE) };
            map.huge_pages = rc == 0;
        }
        if let Some(node) = numa_node {
            // SAFETY: the range is our own fresh map, not yet faulted in.
            unsafe { super::numa::bind(ptr, len, node)? };
        }
        map.prefault()?;
        Ok(map)
    }

    /// Map `len` bytes of `file` shared (the file must already be that long) and fault it in.
    pub fn file(file: &File, len: usize) -> std::io::Result<Self> {
        // SAFETY: maps a file we hold open; the map outlives no borrow of it (the kernel keeps
        // its own reference to the file).
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                file.as_raw_fd(),
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let ptr = NonNull::new(raw.cast::<u8>()).ok_or_else(overflow)?;
        let map = Mapping {
            ptr,
            len,
            lead: 0,
            map_len: len,
            huge_pages: false,
        };
        map.prefault()?;
        Ok(map)
    }

    /// Touch every page so later measurements see no first-touch page faults.
    fn prefault(&self) -> std::io::Result<()> {
        // MADV_POPULATE_WRITE faults pages in writable without changing their contents;
        // kernels before 5.14 lack it, so fall back to touching one byte per page.
        // SAFETY: the range is inside our own map.
        let rc = unsafe {
            libc::madvise(
                self.ptr.as_ptr().cast(),
                self.len,
                libc::MADV_POPULATE_WRITE,
            )
        };
        if rc == 0 {
            return Ok(());
        }
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() == Some(libc::ENOMEM) || err.raw_os_error() == Some(libc::EFAULT) {
            return Err(err);
        }
        let step = super::page_size();
        let mut off = 0;
        while off < self.len {
            // SAFETY: off < len; reading then writing back a byte of our own map.
            unsafe {
                let p = self.ptr.as_ptr().add(off);
                std::ptr::write_volatile(p, std::ptr::read_volatile(p));
            }
            off += step;
        }
        Ok(())
    }

    /// Base address of the map.
    #[must_use]
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Length in bytes.
    #[must_use]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the map is empty (never true for a device heap).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the map created in the constructor (base = ptr - lead,
        // length = map_len), which nothing references any more: the owner is being dropped.
        unsafe {
            libc::munmap(self.ptr.as_ptr().sub(self.lead).cast(), self.map_len);
        }
    }
}

fn overflow() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::InvalidInput,
        "size overflows the address space",
    )
}
