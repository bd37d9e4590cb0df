//! Effective bandwidth of a memory device by access pattern: sequential and random reads
//! and writes of a given access size, charged like every tiermem access (an `emulated`
//! device at its granularity), beside the figure its profile cites for the same pattern
//! (`tiermem bench emulation`, and the test holding each profile to its sources).

use rayon::prelude::*;
use serde::Serialize;

use super::{best, P};
use crate::arch::copy as kernels;
use crate::calib::probe::rng;
use crate::device::emulated::wait_until_measuring as wait_until;
use crate::device::Device;
use crate::{ensure, Result};

/// One access pattern measured on a device.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct AccessFigure {
    /// `"read"` or `"write"`.
    pub op: &'static str,
    /// `"sequential"` or `"random"`.
    pub pattern: &'static str,
    /// Bytes per access.
    pub access_bytes: u64,
    /// Bytes asked for over the wall time, GB/s.
    pub gbps: f64,
    /// What the device's profile cites for the pattern, GB/s (emulated devices only):
    /// its bandwidth, of which a random access smaller than the device's granularity
    /// gets its share ([`crate::device::emulated::Throttle::cited_gbps`]).
    pub cited_gbps: Option<f64>,
}

/// Measure `device` over the `len` bytes at `base` (a region the caller owns, at least 4
/// MiB) with every pattern at every access size in `sizes` (each a multiple of 64 dividing
/// the region), on every thread of the pool, best of `reps`. Random accesses are at
/// size-aligned places, charged as that many accesses with no dependent step: bandwidth
/// with the latency hidden, as the cited figures are (many threads in flight).
pub fn access_figures(
    dev: &Device,
    base: *mut u8,
    len: usize,
    sizes: &[u64],
    reps: usize,
) -> Result<Vec<AccessFigure>> {
    ensure!(
        len >= 4 << 20,
        "measuring accesses needs at least 4 MiB, got {len} bytes"
    );
    let threads = rayon::current_num_threads();
    let t = dev.throttle.as_ref();
    let b = P(base as usize);
    let zeros = vec![0u8; 1 << 16];
    // Fault the region in first (uncharged): a first touch would be timed as the device.
    let chunk = len / threads / 64 * 64;
    (0..threads).into_par_iter().for_each(|i| {
        for k in (0..chunk).step_by(zeros.len()) {
            let n = zeros.len().min(chunk - k);
            // SAFETY: inside the caller's region; `zeros` holds `n` bytes.
            unsafe {
                std::ptr::copy_nonoverlapping(zeros.as_ptr(), (b.0 + i * chunk + k) as *mut u8, n)
            };
        }
    });
    let mut out = Vec::new();
    for &size in sizes {
        let s = size as usize;
        ensure!(
            s >= 64 && s.is_multiple_of(64) && s <= zeros.len(),
            "access size {s}: a multiple of 64 bytes up to 64 KiB"
        );
        let slots = len / s;
        let per_thread = slots / threads;
        let count = per_thread * threads;
        let bytes = (count * s) as u64;
        for random in [false, true] {
            // A sequential pattern is one stream per thread over its own stretch, whatever
            // the access size (a device merges consecutive accesses; a loop of small calls
            // would measure the calls); a random one is `per_thread` accesses anywhere.
            let accesses = if random { count as u64 } else { 1 };
            let pattern = if random { "random" } else { "sequential" };
            let stretch = |i: usize| b.0 + i * per_thread * s;
            let read = best(reps, || {
                let deadline = t.map(|t| t.reserve_read((bytes, accesses, 0)));
                let sum: u64 = (0..threads)
                    .into_par_iter()
                    .map(|i| {
                        if !random {
                            // SAFETY: the thread's stretch lies inside the caller's region.
                            return unsafe {
                                kernels::read_sum(stretch(i) as *const u8, per_thread * s)
                            };
                        }
                        let mut r = rng(17 + i as u64);
                        (0..per_thread).fold(0u64, |acc, _| {
                            let at = b.0 + (r() as usize % slots) * s;
                            // SAFETY: every access lies inside the caller's region.
                            acc.wrapping_add(unsafe { kernels::read_sum(at as *const u8, s) })
                        })
                    })
                    .sum();
                std::hint::black_box(sum);
                if let Some(d) = deadline {
                    wait_until(d);
                }
                Ok(())
            })?;
            let write = best(reps, || {
                let deadline = t.map(|t| t.reserve_write((bytes, accesses, threads)));
                (0..threads).into_par_iter().for_each(|i| {
                    if !random {
                        // Non-temporal stores, as a device's sequential writes are measured.
                        for k in (0..per_thread * s).step_by(zeros.len()) {
                            let n = zeros.len().min(per_thread * s - k);
                            // SAFETY: inside the thread's stretch; `zeros` holds `n` bytes.
                            unsafe {
                                kernels::copy_nt((stretch(i) + k) as *mut u8, zeros.as_ptr(), n)
                            };
                        }
                        return;
                    }
                    let mut r = rng(29 + i as u64);
                    for _ in 0..per_thread {
                        let at = b.0 + (r() as usize % slots) * s;
                        // SAFETY: inside the caller's region; `zeros` holds `s` bytes. Plain
                        // stores, as a kernel updating rows makes them.
                        unsafe { std::ptr::copy_nonoverlapping(zeros.as_ptr(), at as *mut u8, s) };
                    }
                });
                if let Some(d) = deadline {
                    wait_until(d);
                }
                Ok(())
            })?;
            for (op, secs) in [("read", read), ("write", write)] {
                out.push(AccessFigure {
                    op,
                    pattern,
                    access_bytes: size,
                    gbps: bytes as f64 / secs / 1e9,
                    cited_gbps: t.map(|t| t.cited_gbps(op == "write", random, size, threads)),
                });
            }
        }
    }
    Ok(out)
}
