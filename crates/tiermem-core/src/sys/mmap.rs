//! Memory maps backing the byte-addressable devices.

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use super::numa::NodePolicy;
use super::HUGE_PAGE;

/// When an anonymous map's pages are faulted in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prefault {
    /// Before the constructor returns: measurements never see a first-touch fault, and the
    /// memory is the process's from the start.
    Now,
    /// On a background thread, in chunks, after the constructor returns: the map is usable at
    /// once (a page touched first is faulted by whoever touches it) and resident soon after.
    Background,
    /// Never ahead: pages are faulted as they are first touched.
    Lazy,
}

impl Prefault {
    /// Parse `now`, `background` or `lazy`.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "now" => Some(Prefault::Now),
            "background" => Some(Prefault::Background),
            "lazy" => Some(Prefault::Lazy),
            _ => None,
        }
    }
}

/// Bytes a background pre-fault populates per call, checking for cancellation in between.
const BACKGROUND_CHUNK: usize = 64 << 20;

/// A background pre-fault in progress: cancelled and joined before the map goes away.
#[derive(Debug)]
struct Background {
    cancel: Arc<AtomicBool>,
    done: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

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
    background: Option<Background>,
    /// The memory file behind a shared map ([`Mapping::shared_with`]): other maps of its
    /// pages ([`Mapping::alias_source`]) see the same bytes.
    memfd: Option<OwnedFd>,
}

// SAFETY: the mapping is plain memory owned by this value; concurrent access to the bytes
// is coordinated by the manager (regions do not overlap, pinned data is not moved).
unsafe impl Send for Mapping {}
// SAFETY: as above; `&Mapping` only exposes the base pointer and length.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Map `len` bytes of anonymous memory, aligned to 2 MiB, ask for transparent huge
    /// pages when `huge` is set, and optionally set a node policy (bind, interleave) before faulting it in
    /// (now).
    pub fn anonymous(len: usize, huge: bool, numa_node: Option<u32>) -> std::io::Result<Self> {
        Self::anonymous_with(
            len,
            huge,
            numa_node.map(NodePolicy::Bind).as_ref(),
            Prefault::Now,
        )
    }

    /// As [`Mapping::anonymous`], faulting pages in as `prefault` says.
    pub fn anonymous_with(
        len: usize,
        huge: bool,
        policy: Option<&NodePolicy>,
        prefault: Prefault,
    ) -> std::io::Result<Self> {
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
            background: None,
            memfd: None,
        };
        if huge {
            // SAFETY: the range is inside our own map.
            let rc = unsafe { libc::madvise(ptr.cast(), len, libc::MADV_HUGEPAGE) };
            map.huge_pages = rc == 0;
        }
        if let Some(policy) = policy {
            // SAFETY: the range is our own fresh map, not yet faulted in.
            unsafe { super::numa::apply(ptr, len, policy)? };
        }
        map.fault_in(prefault)?;
        Ok(map)
    }

    /// Map `len` bytes of a new memory file (`memfd_create`) shared, optionally under a node
    /// policy, faulting pages in as `prefault` says: anonymous memory whose pages can be
    /// mapped a second time elsewhere ([`Mapping::alias_source`]), so an address handed out
    /// can follow its bytes when they move to another map. Page-aligned; no huge pages
    /// (shared memory's are the kernel's `shmem_enabled` choice).
    pub fn shared_with(
        len: usize,
        policy: Option<&NodePolicy>,
        prefault: Prefault,
    ) -> std::io::Result<Self> {
        if len == 0 || isize::try_from(len).is_err() {
            return Err(overflow());
        }
        // SAFETY: a NUL-terminated name and plain flags.
        let raw_fd = unsafe { libc::memfd_create(c"tiermem-device".as_ptr(), libc::MFD_CLOEXEC) };
        if raw_fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: a descriptor just returned to us and owned by no one else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw_fd) };
        // SAFETY: a descriptor we own; the length fits an off_t (checked above).
        if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let mut map = Mapping {
            ptr: map_shared(fd.as_raw_fd(), len, 0, libc::MAP_NORESERVE)?,
            len,
            lead: 0,
            map_len: len,
            huge_pages: false,
            background: None,
            memfd: Some(fd),
        };
        if let Some(policy) = policy {
            // SAFETY: the range is our own fresh map, not yet faulted in (for shared memory
            // the policy is the file's, so every map of these pages follows it).
            unsafe { super::numa::apply(map.ptr.as_ptr(), len, policy)? };
        }
        map.fault_in(prefault)?;
        Ok(map)
    }

    /// The memory file and the file offset of byte `offset` of a shared map, for mapping
    /// those pages a second time (`mmap(addr, len, .., MAP_SHARED | MAP_FIXED, fd, off)`);
    /// None for any other map. The descriptor lives as long as this map.
    #[must_use]
    pub fn alias_source(&self, offset: usize) -> Option<(RawFd, u64)> {
        let fd = self.memfd.as_ref()?;
        (offset <= self.len).then(|| (fd.as_raw_fd(), offset as u64))
    }

    /// Map `len` bytes of `file` shared (the file must already be that long) and fault it in.
    pub fn file(file: &File, len: usize) -> std::io::Result<Self> {
        let ptr = map_shared(file.as_raw_fd(), len, 0, libc::MAP_POPULATE)?;
        let map = Mapping {
            ptr,
            len,
            lead: 0,
            map_len: len,
            huge_pages: false,
            background: None,
            memfd: None,
        };
        map.prefault()?;
        Ok(map)
    }

    /// Fault the pages in as `prefault` says.
    fn fault_in(&mut self, prefault: Prefault) -> std::io::Result<()> {
        match prefault {
            Prefault::Now => self.prefault(),
            Prefault::Background => self.prefault_in_background(),
            Prefault::Lazy => Ok(()),
        }
    }

    /// Touch every page so later measurements see no first-touch page faults.
    fn prefault(&self) -> std::io::Result<()> {
        // SAFETY: the whole map is ours and mapped.
        unsafe { populate(self.ptr.as_ptr(), self.len) }
    }

    /// Start a thread that faults the map in, 64 MiB at a time; dropping the map cancels
    /// and joins it first. Populating never changes contents, so pages the owner already
    /// uses are unaffected.
    fn prefault_in_background(&mut self) -> std::io::Result<()> {
        let cancel = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicBool::new(false));
        let (c, d) = (cancel.clone(), done.clone());
        let (base, len) = (self.ptr.as_ptr() as usize, self.len);
        let thread = std::thread::Builder::new()
            .name("tiermem-prefault".into())
            .spawn(move || {
                let mut off = 0;
                while off < len && !c.load(Ordering::Relaxed) {
                    let n = BACKGROUND_CHUNK.min(len - off);
                    // SAFETY: [base + off, + n) lies in the map, which stays mapped until this
                    // thread is joined (Drop cancels and joins before unmapping).
                    if unsafe { populate((base + off) as *mut u8, n) }.is_err() {
                        // Out of memory now: the rest faults on first touch, as a lazy map.
                        break;
                    }
                    off += n;
                }
                d.store(off >= len, Ordering::Release);
            })?;
        self.background = Some(Background {
            cancel,
            done,
            thread: Some(thread),
        });
        Ok(())
    }

    /// Whether every page has been faulted in ahead (always, for maps pre-faulted now).
    #[must_use]
    pub fn prefaulted(&self) -> bool {
        self.background
            .as_ref()
            .is_none_or(|b| b.done.load(Ordering::Acquire))
    }

    /// Wait for a background pre-fault to finish (no-op otherwise).
    pub fn wait_prefaulted(&mut self) {
        if let Some(b) = self.background.as_mut() {
            if let Some(t) = b.thread.take() {
                let _ = t.join();
            }
        }
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

/// Fault `len` bytes at `ptr` in, writable, without changing their contents.
///
/// # Safety
/// The range must be mapped, readable and writable.
unsafe fn populate(ptr: *mut u8, len: usize) -> std::io::Result<()> {
    // MADV_POPULATE_WRITE faults pages in writable without changing their contents;
    // kernels before 5.14 lack it, so fall back to touching one byte per page.
    // SAFETY: the caller's range.
    let rc = unsafe { libc::madvise(ptr.cast(), len, libc::MADV_POPULATE_WRITE) };
    if rc == 0 {
        return Ok(());
    }
    let err = std::io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::ENOMEM) || err.raw_os_error() == Some(libc::EFAULT) {
        return Err(err);
    }
    let step = super::page_size();
    let mut off = 0;
    while off < len {
        // SAFETY: off < len; an atomic add of zero keeps the byte (and any concurrent
        // writer's value) while faulting the page in writable.
        unsafe {
            (*ptr.add(off).cast::<std::sync::atomic::AtomicU8>()).fetch_add(0, Ordering::Relaxed);
        }
        off += step;
    }
    Ok(())
}

impl Drop for Mapping {
    fn drop(&mut self) {
        if let Some(b) = self.background.as_mut() {
            b.cancel.store(true, Ordering::Relaxed);
            if let Some(t) = b.thread.take() {
                let _ = t.join();
            }
        }
        // SAFETY: unmapping exactly the map created in the constructor (base = ptr - lead,
        // length = map_len), which nothing references any more: the owner is being dropped.
        unsafe {
            libc::munmap(self.ptr.as_ptr().sub(self.lead).cast(), self.map_len);
        }
    }
}

/// Map `len` bytes of the file `fd` from `offset` shared at a fresh address, with `flags` beside
/// `MAP_SHARED`.
fn map_shared(
    fd: RawFd,
    len: usize,
    offset: u64,
    flags: libc::c_int,
) -> std::io::Result<NonNull<u8>> {
    // SAFETY: a fresh address (no `MAP_FIXED`), so no existing memory is affected.
    unsafe { map_pages_at(std::ptr::null_mut(), fd, len, offset, flags) }
}

/// Map `len` bytes of the file `fd` from `offset` shared, at `addr` if it is not NULL
/// (replacing whatever is mapped there), else at a fresh address; the address. The second
/// maps of [`Mapping::alias_source`]'s pages; unmap with [`unmap_pages`].
///
/// # Safety
/// With a non-NULL `addr`, `[addr, addr + len)` must be a map the caller owns and no one
/// else uses meanwhile (it is replaced).
pub unsafe fn map_pages(
    addr: *mut u8,
    fd: RawFd,
    len: usize,
    offset: u64,
) -> std::io::Result<NonNull<u8>> {
    let fixed = if addr.is_null() { 0 } else { libc::MAP_FIXED };
    // SAFETY: the caller's contract.
    unsafe { map_pages_at(addr, fd, len, offset, fixed) }
}

/// Reserve `len` bytes of address space (no memory, no access), for [`map_pages`] to fill
/// piece by piece; unmap with [`unmap_pages`].
pub fn reserve_pages(len: usize) -> std::io::Result<NonNull<u8>> {
    // SAFETY: a fresh private map at an address of the kernel's choosing; nothing existing
    // is affected.
    let raw = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if raw == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    NonNull::new(raw.cast::<u8>()).ok_or_else(overflow)
}

/// Lock `[addr, addr + len)` in memory (`mlock`: faulted in now, never swapped out);
/// unmapping unlocks.
///
/// # Safety
/// The range must be a map the caller owns.
pub unsafe fn lock_pages(addr: *mut u8, len: usize) -> std::io::Result<()> {
    // SAFETY: the caller's range.
    if unsafe { libc::mlock(addr.cast(), len) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Unmap `[addr, addr + len)`, a map made by [`map_pages`] or [`reserve_pages`].
///
/// # Safety
/// The range must be such a map, which no one uses afterwards.
pub unsafe fn unmap_pages(addr: *mut u8, len: usize) {
    // SAFETY: the caller's contract.
    unsafe { libc::munmap(addr.cast(), len) };
}

/// # Safety
/// As [`map_pages`] (with `MAP_FIXED` in `flags` only for a non-NULL `addr`).
unsafe fn map_pages_at(
    addr: *mut u8,
    fd: RawFd,
    len: usize,
    offset: u64,
    flags: libc::c_int,
) -> std::io::Result<NonNull<u8>> {
    // SAFETY: a map of a file the caller holds open (the kernel keeps its own reference to
    // it), at a fresh address or over the caller's own range.
    let raw = unsafe {
        libc::mmap(
            addr.cast(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | flags,
            fd,
            libc::off_t::try_from(offset).map_err(|_| overflow())?,
        )
    };
    if raw == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    NonNull::new(raw.cast::<u8>()).ok_or_else(overflow)
}

fn overflow() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::InvalidInput,
        "size overflows the address space",
    )
}

/// Pages of `[ptr, ptr + len)` resident in memory now (`mincore`), for tests and reports.
pub fn resident_pages(map: &Mapping) -> std::io::Result<usize> {
    let page = super::page_size();
    let mut vec = vec![0u8; map.len.div_ceil(page)];
    // SAFETY: the range is the map's own; `vec` has one byte per page of it.
    let rc = unsafe { libc::mincore(map.as_ptr().cast(), map.len, vec.as_mut_ptr()) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(vec.iter().filter(|b| *b & 1 != 0).count())
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEN: usize = 64 << 20;

    #[test]
    fn a_shared_map_seen_through_a_second_map() {
        let page = super::super::page_size();
        let map = Mapping::shared_with(4 * page, None, Prefault::Lazy).unwrap();
        assert!(Mapping::anonymous(page, false, None)
            .unwrap()
            .alias_source(0)
            .is_none());
        let (fd, off) = map.alias_source(2 * page).unwrap();
        let second = map_shared(fd, page, off, 0).unwrap();
        // SAFETY: both ranges are mapped, writable and `page` long; the second is ours.
        unsafe {
            map.as_ptr().add(2 * page).write(42);
            assert_eq!(off, 2 * page as u64);
            assert_eq!(second.as_ptr().read(), 42);
            second.as_ptr().write(7);
            assert_eq!(map.as_ptr().add(2 * page).read(), 7);
            libc::munmap(second.as_ptr().cast(), page);
        }
    }

    #[test]
    fn prefault_now_background_and_lazy() {
        let pages = LEN / super::super::page_size();
        let now = Mapping::anonymous_with(LEN, false, None, Prefault::Now).unwrap();
        assert!(now.prefaulted());
        assert_eq!(resident_pages(&now).unwrap(), pages);

        let lazy = Mapping::anonymous_with(LEN, false, None, Prefault::Lazy).unwrap();
        assert_eq!(resident_pages(&lazy).unwrap(), 0);

        // Usable at once: a write before the background thread reaches the page survives it.
        let mut bg = Mapping::anonymous_with(LEN, false, None, Prefault::Background).unwrap();
        // SAFETY: inside the map.
        unsafe {
            bg.as_ptr().write(7);
            bg.as_ptr().add(LEN - 1).write(9);
        }
        bg.wait_prefaulted();
        assert!(bg.prefaulted());
        assert_eq!(resident_pages(&bg).unwrap(), pages);
        // SAFETY: inside the map.
        unsafe {
            assert_eq!(
                (bg.as_ptr().read(), bg.as_ptr().add(LEN - 1).read()),
                (7, 9)
            );
        }
    }

    #[test]
    fn dropping_a_map_while_it_faults_in_cancels_the_thread_first() {
        for _ in 0..8 {
            let m = Mapping::anonymous_with(4 * LEN, false, None, Prefault::Background).unwrap();
            drop(m); // joins the thread before unmapping: no fault on an unmapped range
        }
    }
}
