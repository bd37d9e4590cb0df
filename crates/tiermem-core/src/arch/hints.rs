//! Cache hints: software prefetch and the store fence that orders streaming stores.

/// Hint the CPU to bring `bytes` starting at `p` into the cache. Never faults.
#[inline(always)]
pub fn prefetch(p: *const u8, bytes: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let mut off = 0;
        while off < bytes {
            // SAFETY: prefetch is a hint; it never dereferences in a way that can fault, and
            // wrapping_add keeps the pointer arithmetic defined.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(off).cast()) };
            off += 64;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (p, bytes);
}

/// Order earlier streaming stores before later stores (no-op where there are none).
#[inline]
pub fn sfence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a fence has no memory-safety preconditions.
    unsafe {
        std::arch::x86_64::_mm_sfence();
    }
}
