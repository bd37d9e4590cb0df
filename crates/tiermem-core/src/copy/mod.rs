//! The copy engine: moves bytes between regions of any two devices, by the route its
//! [`routes`] table gives for the pair of devices' reaches. Memory-to-memory copies
//! are split into per-thread chunks and use non-temporal stores above a size threshold;
//! transfers touching a `block` device are batched aligned direct-I/O reads and writes
//! issued from several threads (a queue depth). Threads per (source, destination) pair are
//! configurable. Every copy is charged to the devices' counters and, for `emulated`
//! devices, to their throttles.

mod routes;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use rayon::prelude::*;

use crate::device::emulated::wait_or_defer;
use crate::device::Device;
use crate::sys::direct_io::{AlignedBuf, ALIGN};
use crate::{Error, Result};

/// Bytes per block-I/O request.
const IO_CHUNK: usize = 1 << 20;
/// Below this, memory copies run on one thread.
const MIN_PARALLEL: usize = 1 << 20;
/// Concurrent block-I/O requests unless configured otherwise (NVMe needs depth to stream).
pub const DEFAULT_IO_DEPTH: usize = 16;

/// Tunables of the copy engine.
#[derive(Debug, Clone)]
pub struct CopyConfig {
    /// Copies at least this large use non-temporal stores.
    pub nt_threshold: usize,
    /// Threads for memory copies when no pair override applies.
    pub threads: usize,
    /// Concurrent requests for block-device transfers.
    pub io_depth: usize,
    /// Thread count per (source name, destination name).
    pub pair_threads: HashMap<(String, String), usize>,
}

impl Default for CopyConfig {
    fn default() -> Self {
        CopyConfig {
            nt_threshold: 4 << 20,
            threads: std::thread::available_parallelism().map_or(1, std::num::NonZero::get),
            io_depth: DEFAULT_IO_DEPTH,
            pair_threads: HashMap::new(),
        }
    }
}

/// Runs copies on thread pools sized per device pair.
pub struct CopyEngine {
    config: Mutex<CopyConfig>,
    pools: Mutex<HashMap<usize, Arc<rayon::ThreadPool>>>,
}

#[derive(Clone, Copy)]
struct SendPtr(usize);

/// Threads and kernel choice for one copy.
struct Plan {
    threads: usize,
    writers: usize,
    nt_threshold: usize,
}

impl CopyEngine {
    /// An engine with the given configuration.
    #[must_use]
    pub fn new(config: CopyConfig) -> Self {
        CopyEngine {
            config: Mutex::new(config),
            pools: Mutex::new(HashMap::new()),
        }
    }

    /// Set the thread count for copies from `src` to `dst` (device names).
    pub fn set_pair_threads(&self, src: &str, dst: &str, threads: usize) -> Result<()> {
        if threads == 0 || threads > 1024 {
            crate::bail!("thread count for {src} -> {dst} must be 1..=1024, got {threads}");
        }
        self.cfg()
            .pair_threads
            .insert((src.to_owned(), dst.to_owned()), threads);
        Ok(())
    }

    fn cfg(&self) -> std::sync::MutexGuard<'_, CopyConfig> {
        self.config
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Threads used for a copy between these devices.
    #[must_use]
    pub fn threads_for(&self, src: &Device, dst: &Device) -> usize {
        Self::plan(&self.cfg(), src, dst).threads
    }

    /// How a copy between two devices runs, from one read of the configuration.
    fn plan(cfg: &CopyConfig, src: &Device, dst: &Device) -> Plan {
        let threads = if let Some(&n) = cfg.pair_threads.get(&(src.name.clone(), dst.name.clone()))
        {
            n
        } else if !src.byte_addressable() || !dst.byte_addressable() {
            cfg.io_depth
        } else {
            // Emulated devices whose writes degrade past a thread count get at most that many
            // writers, as a real Optane-aware copy would.
            let cap = dst
                .throttle
                .as_ref()
                .map_or(usize::MAX, |t| t.profile.write_peak_threads);
            cfg.threads.min(cap).max(1)
        };
        // Writers beyond the core count (block-I/O queue depth) do not add store streams.
        Plan {
            threads,
            writers: threads.min(cfg.threads),
            nt_threshold: cfg.nt_threshold,
        }
    }

    /// The name of the route a copy from `src` to `dst` takes (`memory copy`,
    /// `direct-I/O read`, ...), from the routes table.
    pub fn route(&self, src: &Device, dst: &Device) -> Result<&'static str> {
        routes::find(src.reach(), dst.reach()).map(|r| r.name)
    }

    /// Bandwidth in GB/s an emulated profile allows a large copy between these devices; `None`
    /// when no emulated device takes part, or a block device bounds the copy instead.
    #[must_use]
    pub fn expected_gbps(&self, src: &Device, dst: &Device) -> Option<f64> {
        if !src.byte_addressable() || !dst.byte_addressable() {
            return None;
        }
        let plan = Self::plan(&self.cfg(), src, dst);
        let read = src.throttle.as_ref().map(|t| t.read_bps);
        let write = dst.throttle.as_ref().map(|t| t.write_bps_at(plan.writers));
        let limit = match (read, write) {
            (Some(r), Some(w)) => r.min(w),
            (r, w) => r.or(w)?,
        };
        Some(limit / 1e9)
    }

    fn pool(&self, threads: usize) -> Arc<rayon::ThreadPool> {
        let mut pools = self
            .pools
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        pools
            .entry(threads)
            .or_insert_with(|| {
                Arc::new(
                    rayon::ThreadPoolBuilder::new()
                        .num_threads(threads)
                        .thread_name(move |i| format!("tiermem-copy{threads}-{i}"))
                        .build()
                        .expect("build copy thread pool"),
                )
            })
            .clone()
    }

    /// Copy `len` bytes from `src` at `src_off` to `dst` at `dst_off`. The caller guarantees
    /// that both ranges lie in regions it owns and that nobody else writes them meanwhile.
    pub fn copy(
        &self,
        src: &Device,
        src_off: u64,
        dst: &Device,
        dst_off: u64,
        len: u64,
    ) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        let plan = Self::plan(&self.cfg(), src, dst);
        let writers = plan.writers;
        // Reserve the emulated devices' time before the transfer, wait after it.
        let read_deadline = src.throttle.as_ref().map(|t| t.reserve_read((len, 1, 1)));
        let write_deadline = dst
            .throttle
            .as_ref()
            .map(|t| t.reserve_write((len, 1, writers)));
        let n =
            usize::try_from(len).map_err(|_| Error::InvalidArgument("copy too large".into()))?;
        let route = routes::find(src.reach(), dst.reach())?;
        let (from, to) = (
            routes::End {
                dev: src,
                off: src_off,
            },
            routes::End {
                dev: dst,
                off: dst_off,
            },
        );
        (route.run)(self, from, to, n, &plan)?;
        // The data has moved; the emulated time is served now, or after the manager lock is
        // released when the caller runs inside a `DeferScope`.
        for d in [read_deadline, write_deadline].into_iter().flatten() {
            wait_or_defer(d);
        }
        src.counters.read(len);
        dst.counters.wrote(len);
        crate::counters::DeviceCounters::bump(&src.counters.moves_out);
        crate::counters::DeviceCounters::bump(&dst.counters.moves_in);
        Ok(())
    }

    /// Parallel memory copy on `threads` threads (one chunk each, 64-byte aligned splits).
    /// The caller guarantees both ranges are valid for `len` bytes and disjoint.
    fn copy_memory(&self, dst: *mut u8, src: *const u8, len: usize, threads: usize, nt: bool) {
        let kernel = if nt {
            crate::arch::copy::copy_nt
        } else {
            crate::arch::copy::copy_cached
        };
        if threads <= 1 || len < MIN_PARALLEL {
            // SAFETY: the caller guarantees both ranges are valid and disjoint.
            unsafe { kernel(dst, src, len) };
            return;
        }
        let chunk = len.div_ceil(threads).next_multiple_of(64);
        let (d, s) = (SendPtr(dst as usize), SendPtr(src as usize));
        self.pool(threads).install(|| {
            (0..threads).into_par_iter().for_each(|i| {
                let start = i * chunk;
                if start >= len {
                    return;
                }
                let n = chunk.min(len - start);
                // SAFETY: [start, start + n) lies inside both ranges; chunks are disjoint.
                unsafe { kernel((d.0 + start) as *mut u8, (s.0 + start) as *const u8, n) };
            });
        });
    }

    fn read_block(
        &self,
        src: &Device,
        off: u64,
        dst: *mut u8,
        len: usize,
        depth: usize,
    ) -> Result<()> {
        let file = src.block_file().expect("block device");
        let d = SendPtr(dst as usize);
        self.for_each_chunk(len, depth, |start, n, bounce| {
            let target = d.0 + start;
            let file_off = off + start as u64;
            let padded = n.next_multiple_of(ALIGN);
            if target.is_multiple_of(ALIGN) && padded == n {
                // SAFETY: [target, target + n) is inside the caller's destination range.
                let buf = unsafe { std::slice::from_raw_parts_mut(target as *mut u8, n) };
                file.read_at(buf, file_off)
            } else {
                let b = &mut bounce.as_mut_slice()[..padded];
                file.read_at(b, file_off)?;
                // SAFETY: n bytes of the bounce buffer into the caller's destination range.
                unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), target as *mut u8, n) };
                Ok(())
            }
        })
        .map_err(|e| {
            Error::io(
                &src.name,
                &src.name,
                format!("read {len} bytes at offset {off}"),
                e,
            )
        })
    }

    fn write_block(
        &self,
        dst: &Device,
        off: u64,
        src: *const u8,
        len: usize,
        depth: usize,
    ) -> Result<()> {
        let file = dst.block_file().expect("block device");
        let s = SendPtr(src as usize);
        self.for_each_chunk(len, depth, |start, n, bounce| {
            let source = s.0 + start;
            let file_off = off + start as u64;
            let padded = n.next_multiple_of(ALIGN);
            if source.is_multiple_of(ALIGN) && padded == n {
                // SAFETY: [source, source + n) is inside the caller's source range.
                let buf = unsafe { std::slice::from_raw_parts(source as *const u8, n) };
                file.write_at(buf, file_off)
            } else {
                let b = &mut bounce.as_mut_slice()[..padded];
                // SAFETY: n bytes from the caller's source range into the bounce buffer.
                unsafe { std::ptr::copy_nonoverlapping(source as *const u8, b.as_mut_ptr(), n) };
                b[n..].fill(0);
                file.write_at(b, file_off)
            }
        })
        .map_err(|e| {
            Error::io(
                &dst.name,
                &dst.name,
                format!("write {len} bytes at offset {off}"),
                e,
            )
        })
    }

    fn block_to_block(
        &self,
        src: &Device,
        src_off: u64,
        dst: &Device,
        dst_off: u64,
        len: usize,
        depth: usize,
    ) -> Result<()> {
        let mut staging = AlignedBuf::new(len);
        let p = staging.as_mut_slice().as_mut_ptr();
        self.read_block(src, src_off, p, len, depth)?;
        self.write_block(dst, dst_off, p, len, depth)
    }

    /// Run `f(start, len, bounce)` over `IO_CHUNK`-sized pieces on `depth` threads.
    fn for_each_chunk(
        &self,
        len: usize,
        depth: usize,
        f: impl Fn(usize, usize, &mut AlignedBuf) -> std::io::Result<()> + Sync,
    ) -> std::io::Result<()> {
        let chunks = len.div_ceil(IO_CHUNK);
        let run = || {
            (0..chunks).into_par_iter().try_for_each_init(
                || AlignedBuf::new(IO_CHUNK),
                |bounce, i| {
                    let start = i * IO_CHUNK;
                    f(start, IO_CHUNK.min(len - start), bounce)
                },
            )
        };
        if chunks <= 1 {
            let mut b = AlignedBuf::new(len.min(IO_CHUNK));
            return f(0, len, &mut b);
        }
        self.pool(depth.min(chunks).max(1)).install(run)
    }
}

impl Default for CopyEngine {
    fn default() -> Self {
        CopyEngine::new(CopyConfig::default())
    }
}
