//! Copy, fill and read kernels: a scalar reference plus AVX-512 / AVX2 non-temporal
//! variants, picked once at run time ([`super::isa`]).

use super::{isa, Isa};

/// Copy `len` bytes from `src` to `dst` with non-temporal stores where the CPU has them
/// (bypassing the cache: right for copies larger than the last-level cache).
///
/// # Safety
/// `src` must be valid for `len` reads, `dst` for `len` writes, and the ranges must not
/// overlap.
pub unsafe fn copy_nt(dst: *mut u8, src: *const u8, len: usize) {
    match isa() {
        // SAFETY: the caller's contract; the feature was detected at run time.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { x86::copy_avx512(dst, src, len) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { x86::copy_avx2(dst, src, len) },
        // SAFETY: the caller's contract.
        _ => unsafe { std::ptr::copy_nonoverlapping(src, dst, len) },
    }
}

/// Copy with ordinary (cached) stores: `memcpy`.
///
/// # Safety
/// As [`copy_nt`].
pub unsafe fn copy_cached(dst: *mut u8, src: *const u8, len: usize) {
    // SAFETY: the caller's contract.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, len) }
}

/// Read `len` bytes and fold them into a checksum (used to measure read bandwidth, so it
/// must not be limited by arithmetic: wide loads where the CPU has them).
///
/// # Safety
/// `src` must be valid for `len` reads and 8-byte aligned.
pub unsafe fn read_sum(src: *const u8, len: usize) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if isa() == Isa::Avx512 {
        // SAFETY: the caller's contract; AVX-512F was detected at run time.
        return unsafe { x86::read_sum_avx512(src, len) };
    }
    // SAFETY: the caller's contract.
    unsafe { read_sum_scalar(src, len) }
}

/// Scalar reference of [`read_sum`].
///
/// # Safety
/// As [`read_sum`].
pub unsafe fn read_sum_scalar(src: *const u8, len: usize) -> u64 {
    let words = len / 8;
    let p = src.cast::<u64>();
    let mut acc = [0u64; 8];
    let mut i = 0;
    while i + 8 <= words {
        for (k, a) in acc.iter_mut().enumerate() {
            // SAFETY: i + k < words, inside the caller's range.
            *a = a.wrapping_add(unsafe { p.add(i + k).read() });
        }
        i += 8;
    }
    while i < words {
        // SAFETY: i < words.
        acc[0] = acc[0].wrapping_add(unsafe { p.add(i).read() });
        i += 1;
    }
    acc.iter().fold(0, |x, y| x.wrapping_add(*y))
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::{
        __m256i, __m512i, _mm256_loadu_si256, _mm256_stream_si256, _mm512_add_epi64,
        _mm512_loadu_si512, _mm512_reduce_add_epi64, _mm512_setzero_si512, _mm512_stream_si512,
        _mm_prefetch, _mm_sfence, _MM_HINT_T0,
    };

    /// How far ahead of the loads the source is prefetched.
    const PREFETCH_AHEAD: usize = 1024;
    /// Page size of the interleaved large-copy loop.
    const PAGE: usize = 4096;

    /// Split `len` into an unaligned head (so that `dst + head` is `align`-aligned), a body of
    /// whole `align`-byte blocks and a tail.
    fn split(dst: *mut u8, len: usize, align: usize) -> (usize, usize) {
        let head = ((dst as usize).next_multiple_of(align) - dst as usize).min(len);
        let body = (len - head) / align * align;
        (head, body)
    }

    /// # Safety
    /// As `copy_nt`, and the CPU supports AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn copy_avx512(dst: *mut u8, src: *const u8, len: usize) {
        let (head, body) = split(dst, len, 64);
        // SAFETY: head <= len; caller's contract.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, head) };
        let mut off = head;
        let end = head + body;
        // Large bodies: four pages at a time, interleaved line by line, so the memory
        // controller sees four streams (fewer DRAM page conflicts; glibc does the same).
        while off + 4 * PAGE <= end {
            let mut line = 0;
            while line < PAGE {
                for p in 0..4 {
                    let at = off + p * PAGE + line;
                    // SAFETY: at + 128 <= off + 4 * PAGE <= end <= len; dst + at is 64-byte
                    // aligned (dst + off is, and PAGE and line are multiples of 64).
                    unsafe {
                        let s = src.add(at);
                        let d = dst.add(at);
                        _mm_prefetch::<_MM_HINT_T0>(s.wrapping_add(PREFETCH_AHEAD).cast());
                        let a = _mm512_loadu_si512(s.cast());
                        let b = _mm512_loadu_si512(s.add(64).cast());
                        _mm512_stream_si512(d.cast::<__m512i>(), a);
                        _mm512_stream_si512(d.add(64).cast::<__m512i>(), b);
                    }
                }
                line += 128;
            }
            off += 4 * PAGE;
        }
        while off + 256 <= end {
            // SAFETY: off + 256 <= end <= len; dst + off is 64-byte aligned (split).
            unsafe {
                let s = src.add(off);
                let d = dst.add(off);
                // A prefetch past the end of the source is harmless: prefetches never fault.
                _mm_prefetch::<_MM_HINT_T0>(s.wrapping_add(PREFETCH_AHEAD).cast());
                _mm_prefetch::<_MM_HINT_T0>(s.wrapping_add(PREFETCH_AHEAD + 128).cast());
                let a = _mm512_loadu_si512(s.cast());
                let b = _mm512_loadu_si512(s.add(64).cast());
                let c = _mm512_loadu_si512(s.add(128).cast());
                let e = _mm512_loadu_si512(s.add(192).cast());
                _mm512_stream_si512(d.cast::<__m512i>(), a);
                _mm512_stream_si512(d.add(64).cast::<__m512i>(), b);
                _mm512_stream_si512(d.add(128).cast::<__m512i>(), c);
                _mm512_stream_si512(d.add(192).cast::<__m512i>(), e);
            }
            off += 256;
        }
        while off + 64 <= end {
            // SAFETY: off + 64 <= end; aligned destination.
            unsafe {
                let a = _mm512_loadu_si512(src.add(off).cast());
                _mm512_stream_si512(dst.add(off).cast::<__m512i>(), a);
            }
            off += 64;
        }
        // SAFETY: the tail [off, len) is inside the caller's ranges; sfence orders the
        // streaming stores before anything that follows.
        unsafe {
            std::ptr::copy_nonoverlapping(src.add(off), dst.add(off), len - off);
            _mm_sfence();
        }
    }

    /// Sum of the 64-bit words of `[src, src + len)` (the tail past whole words is ignored,
    /// as in the scalar reference).
    ///
    /// # Safety
    /// As `read_sum`, and the CPU supports AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn read_sum_avx512(src: *const u8, len: usize) -> u64 {
        let words = len / 8;
        let mut acc = [_mm512_setzero_si512(); 4];
        let mut i = 0;
        while i + 32 <= words {
            for (k, a) in acc.iter_mut().enumerate() {
                // SAFETY: words i + 8k .. i + 8k + 8 lie inside the caller's range.
                let v = unsafe { _mm512_loadu_si512(src.add((i + 8 * k) * 8).cast()) };
                *a = _mm512_add_epi64(*a, v);
            }
            i += 32;
        }
        let total = _mm512_add_epi64(
            _mm512_add_epi64(acc[0], acc[1]),
            _mm512_add_epi64(acc[2], acc[3]),
        );
        let mut sum = _mm512_reduce_add_epi64(total) as u64;
        while i < words {
            // SAFETY: i < words.
            sum = sum.wrapping_add(unsafe { src.cast::<u64>().add(i).read_unaligned() });
            i += 1;
        }
        sum
    }

    /// # Safety
    /// As `copy_nt`, and the CPU supports AVX.
    #[target_feature(enable = "avx2")]
    pub unsafe fn copy_avx2(dst: *mut u8, src: *const u8, len: usize) {
        let (head, body) = split(dst, len, 32);
        // SAFETY: head <= len; caller's contract.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, head) };
        let mut off = head;
        let end = head + body;
        while off + 32 <= end {
            // SAFETY: off + 32 <= end <= len; dst + off is 32-byte aligned.
            unsafe {
                let a = _mm256_loadu_si256(src.add(off).cast());
                _mm256_stream_si256(dst.add(off).cast::<__m256i>(), a);
            }
            off += 32;
        }
        // SAFETY: the tail is inside the caller's ranges.
        unsafe {
            std::ptr::copy_nonoverlapping(src.add(off), dst.add(off), len - off);
            _mm_sfence();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nt_copy_matches_reference_at_every_alignment() {
        let src: Vec<u8> = (0..70_000u32)
            .map(|i| (i * 7 + 3 + i / 251) as u8)
            .collect();
        for off_s in [0usize, 1, 7, 63] {
            for off_d in [0usize, 1, 31, 64] {
                for len in [
                    0usize, 1, 63, 64, 65, 255, 256, 257, 1000, 4000, 16_384, 16_448, 65_000,
                ] {
                    let mut dst = vec![0xAAu8; len + off_d + 16];
                    // SAFETY: both ranges are inside their vectors and do not overlap.
                    unsafe { copy_nt(dst.as_mut_ptr().add(off_d), src.as_ptr().add(off_s), len) };
                    assert_eq!(&dst[off_d..off_d + len], &src[off_s..off_s + len]);
                    assert!(dst[..off_d].iter().all(|&b| b == 0xAA), "guard before");
                    assert!(dst[off_d + len..].iter().all(|&b| b == 0xAA), "guard after");
                }
            }
        }
    }

    #[test]
    fn read_sum_adds_words_like_the_reference() {
        for n in [0u64, 1, 31, 32, 33, 1003, 4096] {
            let v: Vec<u64> = (0..n)
                .map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15))
                .collect();
            let want = v.iter().fold(0u64, |a, b| a.wrapping_add(*b));
            // SAFETY: the vector is 8-byte aligned and holds v.len() * 8 bytes.
            unsafe {
                assert_eq!(read_sum(v.as_ptr().cast(), v.len() * 8), want);
                assert_eq!(read_sum_scalar(v.as_ptr().cast(), v.len() * 8), want);
            }
        }
    }
}
