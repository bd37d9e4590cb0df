//! NUMA binding with the `mbind` system call (no libnuma dependency).

const MPOL_BIND: libc::c_long = 2;
const MPOL_MF_STRICT: libc::c_ulong = 1;
const MPOL_MF_MOVE: libc::c_ulong = 2;

/// Bind the pages of `[ptr, ptr + len)` to NUMA node `node`. Call before faulting them in.
///
/// # Safety
/// The range must be a mapping the caller owns (its pages' policy is replaced).
pub unsafe fn bind(ptr: *mut u8, len: usize, node: u32) -> std::io::Result<()> {
    let bits = usize::BITS as usize;
    let mut mask = vec![0usize; node as usize / bits + 1];
    mask[node as usize / bits] |= 1 << (node as usize % bits);
    let maxnode = (mask.len() * bits + 1) as libc::c_ulong;
    // SAFETY: the range belongs to a map the caller owns; `mask` outlives the call and holds
    // `maxnode - 1` bits as the system call expects.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mbind,
            ptr,
            len,
            MPOL_BIND,
            mask.as_ptr(),
            maxnode,
            MPOL_MF_STRICT | MPOL_MF_MOVE,
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
