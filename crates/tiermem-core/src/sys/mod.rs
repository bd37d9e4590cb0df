//! The only module that talks to the operating system with `unsafe` code: memory maps,
//! NUMA binding, direct I/O (and io_uring batches), file clones, huge-page arrays, and what the machine reports (topology,
//! memory cgroups). Every `unsafe` block carries a `// SAFETY:` comment.

pub mod cgroup;
pub mod clone;
pub mod devfile;
pub mod direct_io;
pub mod discover;
pub mod files;
pub mod huge;
pub mod mmap;
pub mod numa;
pub mod uring;

/// The system page size in bytes.
#[must_use]
pub fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions and only reads a constant.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(n).unwrap_or(4096)
}

/// Size of a transparent huge page (2 MiB on x86-64).
pub const HUGE_PAGE: usize = 2 << 20;

/// Whether the kernel lets a process ask for transparent huge pages with `madvise`.
#[must_use]
pub fn thp_mode() -> String {
    std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
        .ok()
        .and_then(|s| {
            let start = s.find('[')?;
            let end = s.find(']')?;
            Some(s[start + 1..end].to_owned())
        })
        .unwrap_or_else(|| "unavailable".to_owned())
}
