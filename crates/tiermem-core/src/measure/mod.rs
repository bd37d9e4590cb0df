//! Device measurements for `tiermem calibrate` and `tiermem info`: sequential and random
//! read/write bandwidth and load-to-use latency of a scratch region on any device, charged
//! like every other tiermem access (so `emulated` devices report their throttled figures),
//! and plain `memcpy` baselines for the copy benchmark.

mod access;

pub use access::{access_figures, AccessFigure};

use std::time::Instant;

use rayon::prelude::*;
use serde::Serialize;

use crate::arch::copy as kernels;
use crate::calib::probe::rng;
use crate::device::emulated::wait_until_measuring as wait_until;
use crate::device::Device;
use crate::sys::direct_io::{AlignedBuf, ALIGN};
use crate::{Error, Result};

/// Measured figures of one device.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct DeviceFigures {
    /// Sequential read bandwidth, GB/s.
    pub seq_read_gbps: f64,
    /// Sequential write bandwidth, GB/s.
    pub seq_write_gbps: f64,
    /// Random read bandwidth of `random_bytes` accesses, GB/s.
    pub rand_read_gbps: f64,
    /// Random write bandwidth of `random_bytes` accesses, GB/s.
    pub rand_write_gbps: f64,
    /// Size of one random access: 256 B rows on memory, 4 KiB blocks on block devices.
    pub random_bytes: u64,
    /// Load-to-use latency (memory) or one 4 KiB read (block), ns.
    pub latency_ns: f64,
}

#[derive(Clone, Copy)]
struct P(usize);

/// Shortest wall time of `reps` runs of `f`, in seconds.
pub fn best(reps: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    let mut t = f64::INFINITY;
    for _ in 0..reps.max(1) {
        let s = Instant::now();
        f()?;
        t = t.min(s.elapsed().as_secs_f64());
    }
    Ok(t)
}

/// Measure the device over `[offset, offset + len)` of its heap (a region the caller owns).
pub fn device_figures(dev: &Device, offset: u64, len: u64, reps: usize) -> Result<DeviceFigures> {
    let n = usize::try_from(len).map_err(|_| Error::InvalidArgument("region too large".into()))?;
    // Below 1 MiB the figures measure caches, not the device.
    crate::ensure!(
        n >= 1 << 20,
        "measuring '{}' needs a scratch region of at least 1 MiB, got {n} bytes",
        dev.name
    );
    match dev.addr(offset) {
        Some(p) => memory_figures(dev, p, n, reps),
        None => block_figures(dev, offset, n, reps),
    }
}

fn memory_figures(dev: &Device, base: *mut u8, len: usize, reps: usize) -> Result<DeviceFigures> {
    let threads = rayon::current_num_threads();
    let len = len / (threads * 64) * (threads * 64);
    let chunk = len / threads;
    let b = P(base as usize);
    let gb = len as f64 / 1e9;
    let t = dev.throttle.as_ref();
    let read = best(reps, || {
        let deadline = t.map(|t| t.reserve_read((len as u64, 1, 1)));
        let s: u64 = (0..threads)
            .into_par_iter()
            // SAFETY: each chunk lies inside the caller's region.
            .map(|i| unsafe { kernels::read_sum((b.0 + i * chunk) as *const u8, chunk) })
            .sum();
        std::hint::black_box(s);
        if let Some(d) = deadline {
            wait_until(d);
        }
        Ok(())
    })?;
    let zeros = vec![0u8; chunk.min(1 << 20)];
    let write = best(reps, || {
        let deadline = t.map(|t| t.reserve_write((len as u64, 1, threads)));
        (0..threads).into_par_iter().for_each(|i| {
            let mut off = 0;
            while off < chunk {
                let k = (chunk - off).min(zeros.len());
                // SAFETY: inside the caller's region; `zeros` holds at least k bytes.
                unsafe { kernels::copy_nt((b.0 + i * chunk + off) as *mut u8, zeros.as_ptr(), k) };
                off += k;
            }
        });
        if let Some(d) = deadline {
            wait_until(d);
        }
        Ok(())
    })?;
    // Random 256-byte rows, the embedding-table access shape.
    let row = 256usize;
    let rows = len / row;
    let count = (rows * 2).min(1 << 20);
    let per_thread = count / threads;
    // Apply `f` to `per_thread` random row addresses on every thread; sum what it returns.
    let random_rows = |seed: u64, f: &(dyn Fn(usize) -> u64 + Sync)| -> u64 {
        (0..threads)
            .into_par_iter()
            .map(|i| {
                let mut r = rng(seed + i as u64);
                (0..per_thread).fold(0u64, |acc, _| {
                    acc.wrapping_add(f(b.0 + (r() as usize % rows) * row))
                })
            })
            .sum()
    };
    let rand_read = best(reps, || {
        let deadline =
            t.map(|t| t.reserve_read(((count * row) as u64, count as u64, (count / 16) as u64)));
        // SAFETY: every row lies inside the caller's region and is 8-byte aligned.
        let s = random_rows(7, &|at| unsafe { kernels::read_sum(at as *const u8, row) });
        std::hint::black_box(s);
        if let Some(d) = deadline {
            wait_until(d);
        }
        Ok(())
    })?;
    let rand_write = best(reps, || {
        let deadline = t.map(|t| t.reserve_write(((count * row) as u64, count as u64, threads)));
        random_rows(11, &|at| {
            // SAFETY: the row lies inside the caller's region; `zeros` holds at least `row` bytes.
            unsafe { std::ptr::copy_nonoverlapping(zeros.as_ptr(), at as *mut u8, row) };
            0
        });
        if let Some(d) = deadline {
            wait_until(d);
        }
        Ok(())
    })?;
    // SAFETY: [base, base + len) is the caller's region.
    let latency = unsafe { crate::calib::probe::latency_ns(base, len.min(256 << 20), 200_000) };
    let latency = t.map_or(latency, |t| latency.max(t.latency_ns));
    let rgb = (per_thread * threads * row) as f64 / 1e9;
    Ok(DeviceFigures {
        seq_read_gbps: gb / read,
        seq_write_gbps: gb / write,
        rand_read_gbps: rgb / rand_read,
        rand_write_gbps: rgb / rand_write,
        random_bytes: row as u64,
        latency_ns: latency,
    })
}

fn block_figures(dev: &Device, offset: u64, len: usize, reps: usize) -> Result<DeviceFigures> {
    let file = dev.block_file().expect("block device");
    let len = len / ALIGN * ALIGN;
    let io = |what: &str, e| Error::io(&dev.name, &dev.name, what, e);
    let depth = crate::copy::DEFAULT_IO_DEPTH;
    // One aligned block-sized request in either direction.
    let io_at = |b: &mut AlignedBuf, o: u64, write: bool| {
        if write {
            file.write_at(b.as_mut_slice(), o)
        } else {
            file.read_at(b.as_mut_slice(), o)
        }
    };
    let chunk = (1usize << 20).min(len);
    let chunks = len / chunk;
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(depth)
        .build()
        .expect("pool");
    let seq = |write: bool| {
        best(reps, || {
            pool.install(|| {
                (0..chunks).into_par_iter().try_for_each_init(
                    || AlignedBuf::new(chunk),
                    |b, i| io_at(b, offset + (i * chunk) as u64, write),
                )
            })
            .map_err(|e| io("sequential transfer", e))
        })
    };
    let seq_write = seq(true)?;
    let seq_read = seq(false)?;
    let blocks = len / ALIGN;
    let count = blocks.min(16_384);
    let random = |write: bool| {
        best(reps, || {
            pool.install(|| {
                (0..depth).into_par_iter().try_for_each_init(
                    || AlignedBuf::new(ALIGN),
                    |b, i| {
                        let mut r = rng(i as u64 + 3);
                        for _ in 0..count / depth {
                            io_at(b, offset + (r() as usize % blocks * ALIGN) as u64, write)?;
                        }
                        Ok(())
                    },
                )
            })
            .map_err(|e| io("random transfer", e))
        })
    };
    let rand_read = random(false)?;
    let rand_write = random(true)?;
    let mut one = AlignedBuf::new(ALIGN);
    let mut r = rng(99);
    let lat = best(1, || {
        for _ in 0..256 {
            let o = offset + (r() as usize % blocks * ALIGN) as u64;
            file.read_at(one.as_mut_slice(), o)
                .map_err(|e| io("read", e))?;
        }
        Ok(())
    })? / 256.0;
    let rb = (count / depth * depth * ALIGN) as f64 / 1e9;
    Ok(DeviceFigures {
        seq_read_gbps: (chunks * chunk) as f64 / 1e9 / seq_read,
        seq_write_gbps: (chunks * chunk) as f64 / 1e9 / seq_write,
        rand_read_gbps: rb / rand_read,
        rand_write_gbps: rb / rand_write,
        random_bytes: ALIGN as u64,
        latency_ns: lat * 1e9,
    })
}

/// `memcpy` on `threads` plain threads over disjoint chunks (the baseline copy benchmarks
/// compare against). Returns seconds, best of `reps`.
///
/// # Safety
/// `dst` and `src` must be valid for `len` bytes and not overlap.
pub unsafe fn memcpy_seconds(
    dst: *mut u8,
    src: *const u8,
    len: usize,
    threads: usize,
    reps: usize,
) -> f64 {
    let (d, s) = (P(dst as usize), P(src as usize));
    let threads = threads.max(1);
    let chunk = len.div_ceil(threads).next_multiple_of(64);
    // A pool built before timing, as the copy engine's are, so neither pays thread start-up.
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("pool");
    let mut t = f64::INFINITY;
    for _ in 0..reps.max(1) {
        let start = Instant::now();
        if threads == 1 {
            // SAFETY: the caller's contract.
            unsafe { libc::memcpy(dst.cast(), src.cast(), len) };
        } else {
            pool.install(|| {
                (0..threads).into_par_iter().for_each(|i| {
                    let off = i * chunk;
                    if off < len {
                        let n = chunk.min(len - off);
                        // SAFETY: disjoint chunks inside the caller's ranges.
                        unsafe {
                            libc::memcpy(
                                (d.0 + off) as *mut libc::c_void,
                                (s.0 + off) as *const libc::c_void,
                                n,
                            )
                        };
                    }
                });
            });
        }
        t = t.min(start.elapsed().as_secs_f64());
    }
    t
}

/// Random 4 KiB reads per second from the file `path` (read with direct I/O; its first `len`
/// bytes), `depth` reads in flight: through io_uring where the kernel allows it (what block
/// tables use), else from `depth` threads. Best of `reps` runs of `count` reads. Returns the
/// rate and the engine (`"io_uring"` or `"threads"`).
pub fn random_reads_per_s(
    path: &std::path::Path,
    len: u64,
    depth: usize,
    count: usize,
    reps: usize,
) -> Result<(f64, &'static str)> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    let shown = path.display().to_string();
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .map_err(|e| Error::io("random reads", &shown, "open", e))?;
    let file = &file;
    let blocks = (len / ALIGN as u64) as usize;
    crate::ensure!(
        blocks >= 1 && depth >= 1 && count >= depth,
        "random reads need a file of at least one block, a depth of 1 or more and at least \
         depth reads (file {len} bytes, depth {depth}, {count} reads)"
    );
    let io = |e| Error::io("random reads", &shown, "read", e);
    let mut r = rng(depth as u64 * 7 + 1);
    let offsets: Vec<u64> = (0..count)
        .map(|_| (r() as usize % blocks * ALIGN) as u64)
        .collect();
    if let Ok(ring) = crate::sys::uring::Uring::new(depth as u32) {
        let reqs: Vec<(u64, usize)> = offsets.iter().map(|&o| (o, ALIGN)).collect();
        let run = |reqs: &[(u64, usize)]| {
            let mut failed = None;
            ring.read_each(file.as_raw_fd(), reqs, |_, bytes| {
                if let Err(e) = bytes {
                    failed.get_or_insert(e);
                }
            });
            failed.map_or(Ok(()), |e| Err(io(e)))
        };
        // A short batch outside the clock allocates the ring's buffers and faults them in
        // (a direct read into an untouched page also pays for the page: 51 k reads per
        // second over fresh pages against 75 k over touched ones, measured here).
        run(&reqs[..(4 * depth).min(count)])?;
        let t = best(reps, || run(&reqs))?;
        return Ok((count as f64 / t, "io_uring"));
    }
    let direct = crate::sys::direct_io::DirectFile::new(file.try_clone().map_err(io)?);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(depth)
        .build()
        .map_err(|e| Error::InvalidArgument(format!("I/O threads: {e}")))?;
    let t = best(reps, || {
        pool.install(|| {
            offsets.par_chunks(count.div_ceil(depth)).try_for_each_init(
                || AlignedBuf::new(ALIGN),
                |b, part| {
                    part.iter()
                        .try_for_each(|&o| direct.read_at(b.as_mut_slice(), o))
                },
            )
        })
        .map_err(io)
    })?;
    Ok((count as f64 / t, "threads"))
}
