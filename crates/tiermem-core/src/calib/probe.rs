//! Probes of raw memory: load-to-use latency by pointer chasing, and the small generator
//! the probes and measurements shuffle with.

use std::time::Instant;

/// A xorshift generator (fast, good enough to shuffle measurement order).
pub fn rng(seed: u64) -> impl FnMut() -> u64 {
    let mut x = seed | 1;
    move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    }
}

/// Pointer chase along a random cycle through the cache lines of `len` bytes at `base`
/// (overwriting them): average ns per dependent load.
///
/// # Safety
/// `base` must be valid for `len` writes, 8-byte aligned, and owned by the caller.
pub unsafe fn latency_ns(base: *mut u8, len: usize, steps: usize) -> f64 {
    let lines = len / 64;
    let mut order: Vec<usize> = (0..lines).collect();
    let mut r = rng(0x5EED);
    for i in (1..lines).rev() {
        order.swap(i, r() as usize % i);
    }
    let p = base.cast::<u64>();
    for w in 0..lines {
        let (a, b) = (order[w], order[(w + 1) % lines]);
        // SAFETY: a < lines, so the word is inside the region.
        unsafe { p.add(a * 8).write(b as u64) };
    }
    let mut cur = order[0];
    let t = Instant::now();
    for _ in 0..steps {
        // SAFETY: every stored value is a line index < lines.
        cur = unsafe { p.add(cur * 8).read_volatile() } as usize;
    }
    std::hint::black_box(cur);
    t.elapsed().as_secs_f64() * 1e9 / steps as f64
}
