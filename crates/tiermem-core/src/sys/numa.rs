//! NUMA binding with the `mbind` system call (no libnuma dependency).

const MPOL_BIND: libc::c_long = 2;
const MPOL_MF_STRICT: libc::c_ulong = 1;
const MPOL_MF_MOVE: libc::c_ulong = 2;

/// `MPOL_INTERLEAVE`: pages round-robin over the nodes.
const MPOL_INTERLEAVE: libc::c_long = 3;
/// `MPOL_WEIGHTED_INTERLEAVE` (Linux 6.9): round-robin by the weights the administrator
/// set in `/sys/kernel/mm/mempolicy/weighted_interleave` (1 each by default).
const MPOL_WEIGHTED_INTERLEAVE: libc::c_long = 6;

/// Where a map's pages may go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodePolicy {
    /// On this node only (`MPOL_BIND`).
    Bind(u32),
    /// Spread over these nodes, page by page (`MPOL_WEIGHTED_INTERLEAVE` where the kernel
    /// offers it, else `MPOL_INTERLEAVE`).
    Interleave(Vec<u32>),
}

/// Set `policy` on the pages of `[ptr, ptr + len)`. Call before faulting them in.
///
/// # Safety
/// The range must be a mapping the caller owns (its pages' policy is replaced).
pub unsafe fn apply(ptr: *mut u8, len: usize, policy: &NodePolicy) -> std::io::Result<()> {
    match policy {
        // SAFETY: the caller's contract.
        NodePolicy::Bind(n) => unsafe {
            mbind(ptr, len, MPOL_BIND, &[*n], MPOL_MF_STRICT | MPOL_MF_MOVE)
        },
        NodePolicy::Interleave(nodes) => {
            // SAFETY: the caller's contract.
            match unsafe { mbind(ptr, len, MPOL_WEIGHTED_INTERLEAVE, nodes, 0) } {
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                    // SAFETY: the caller's contract.
                    unsafe { mbind(ptr, len, MPOL_INTERLEAVE, nodes, 0) }
                }
                other => other,
            }
        }
    }
}

/// Bind the pages of `[ptr, ptr + len)` to NUMA node `node`. Call before faulting them in.
///
/// # Safety
/// The range must be a mapping the caller owns (its pages' policy is replaced).
pub unsafe fn bind(ptr: *mut u8, len: usize, node: u32) -> std::io::Result<()> {
    // SAFETY: the caller's contract.
    unsafe { apply(ptr, len, &NodePolicy::Bind(node)) }
}

/// # Safety
/// As [`apply`].
unsafe fn mbind(
    ptr: *mut u8,
    len: usize,
    mode: libc::c_long,
    nodes: &[u32],
    flags: libc::c_ulong,
) -> std::io::Result<()> {
    let bits = usize::BITS as usize;
    let top = nodes.iter().copied().max().unwrap_or(0) as usize;
    let mut mask = vec![0usize; top / bits + 1];
    for &n in nodes {
        mask[n as usize / bits] |= 1 << (n as usize % bits);
    }
    let maxnode = (mask.len() * bits + 1) as libc::c_ulong;
    // SAFETY: the range belongs to a map the caller owns; `mask` outlives the call and holds
    // `maxnode - 1` bits as the system call expects.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mbind,
            ptr,
            len,
            mode,
            mask.as_ptr(),
            maxnode,
            flags,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// The NUMA node the calling thread runs on now (`getcpu`), or None where the kernel does
/// not say.
#[must_use]
pub fn current_node() -> Option<u32> {
    let (mut cpu, mut node) = (0u32, 0u32);
    // SAFETY: getcpu writes two u32s through valid pointers; its cache argument may be NULL.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_getcpu,
            &mut cpu as *mut u32,
            &mut node as *mut u32,
            std::ptr::null_mut::<libc::c_void>(),
        )
    };
    (rc == 0).then_some(node)
}
