//! This machine's DRAM figures, which emulated profiles scale: read from the calibration
//! file `tiermem calibrate` writes, else measured (about a second, on buffers past the
//! last-level cache: [`probe_bytes`]) once per process, or taken from a process on the same
//! machine that measured in the last minute ([`shared`]).

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Instant;

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

pub mod probe;
pub mod shared;

use crate::arch::copy as kernels;
use crate::sys::mmap::Mapping;

/// DRAM bandwidth and latency on this machine.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct DramFigures {
    /// Read bandwidth, all threads, GB/s.
    pub read_gbps: f64,
    /// Write bandwidth (non-temporal stores), all threads, GB/s.
    pub write_gbps: f64,
    /// Copy bandwidth (bytes copied per second), all threads, GB/s.
    pub copy_gbps: f64,
    /// Load-to-use latency of a dependent random access, ns.
    pub latency_ns: f64,
    /// Where they came from: one of [`SOURCES`].
    pub source: String,
}

/// The `source` of figures read from the calibration file.
pub const CALIBRATED: &str = "calibrated";
/// The `source` of figures this process measured.
pub const MEASURED: &str = "measured";

/// Every [`DramFigures::source`], with what it means (reports print it).
pub const SOURCES: [(&str, &str); 4] = [
    (CALIBRATED, "from `tiermem calibrate`"),
    (MEASURED, "measured by this process"),
    (
        shared::SHARED,
        "measured by another process on this machine in the last minute",
    ),
    (
        shared::ALONE,
        "measured by this process without waiting longer for another process's probe \
         (it held the probe lock past TIERMEM_PROBE_WAIT)",
    ),
];

/// Where `tiermem calibrate` keeps its results: `$TIERMEM_CALIBRATION`, else
/// `$XDG_CACHE_HOME/tiermem/calibration.json`, else `~/.cache/tiermem/calibration.json`.
#[must_use]
pub fn calibration_path() -> PathBuf {
    if let Ok(p) = std::env::var("TIERMEM_CALIBRATION") {
        return PathBuf::from(p);
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("tiermem").join("calibration.json")
}

/// Physical bounds of a memory's figures: bandwidth in GB/s (a slow NVMe to many HBM
/// stacks), latency in ns. Figures outside them are a broken file or a broken measurement.
pub const GBPS_BOUNDS: (f64, f64) = (0.05, 20_000.0);
/// See [`GBPS_BOUNDS`].
pub const LATENCY_NS_BOUNDS: (f64, f64) = (1.0, 1_000_000.0);

impl DramFigures {
    /// Every figure finite and within physical bounds; the error names the field and value.
    pub fn validate(&self) -> Result<(), String> {
        let check = |name: &str, v: f64, (lo, hi): (f64, f64), unit: &str| {
            if v.is_finite() && (lo..=hi).contains(&v) {
                Ok(())
            } else {
                Err(format!(
                    "dram.{name} is {v} {unit}: it must be a finite number from {lo} to {hi} {unit}"
                ))
            }
        };
        check("read_gbps", self.read_gbps, GBPS_BOUNDS, "GB/s")?;
        check("write_gbps", self.write_gbps, GBPS_BOUNDS, "GB/s")?;
        check("copy_gbps", self.copy_gbps, GBPS_BOUNDS, "GB/s")?;
        check("latency_ns", self.latency_ns, LATENCY_NS_BOUNDS, "ns")
    }
}

/// This process's DRAM figures, once [`dram_figures`] has them.
static FIGS: OnceLock<Result<DramFigures, String>> = OnceLock::new();

/// The DRAM figures if this process already has them (never measures).
#[must_use]
pub fn dram_figures_if_known() -> Option<&'static DramFigures> {
    FIGS.get().and_then(|r| r.as_ref().ok())
}

/// DRAM figures for this process: the calibration file's if it has them, else a fresh
/// measurement another process on this machine left beside it, else measured now (one process
/// at a time). A calibration file with bad figures (zero, negative, not finite, beyond
/// physical bounds) is an error naming the file and the figure, every time it is asked for.
pub fn dram_figures() -> crate::Result<&'static DramFigures> {
    FIGS.get_or_init(|| match load_calibrated() {
        Some(r) => r,
        None => {
            let path = calibration_path();
            let folder = path
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or(std::path::Path::new("."));
            shared::figures(folder, || {
                let f = measure_dram(probe_bytes(), 3);
                f.validate().map(|()| f).map_err(|e| {
                    format!("measuring this machine's DRAM gave unusable figures: {e}")
                })
            })
        }
    })
    .as_ref()
    .map_err(|e| crate::Error::InvalidArgument(e.clone()))
}

/// Bytes of each of the two buffers a DRAM measurement uses: twice the last-level cache, so
/// reads come from memory and not from the cache (on a shared server's 300 MiB cache, a 64 MiB
/// probe read 13 to 47 GB/s from one process to the next, and memory gave 22), at least 64
/// MiB, and small enough for a container: both buffers together at most an eighth of what the
/// process may still take, and at least 8 MiB each.
#[must_use]
pub fn probe_bytes() -> usize {
    let llc = crate::sys::discover::topology().last_level_cache;
    probe_bytes_for(llc, crate::sys::cgroup::available_memory().0)
}

/// [`probe_bytes`] for a last-level cache of `llc` bytes and `available` bytes the process
/// may take.
fn probe_bytes_for(llc: u64, available: u64) -> usize {
    let want = llc.saturating_mul(2).max(64 << 20);
    let bytes = want.min(available / 16).max(8 << 20);
    usize::try_from(bytes).unwrap_or(usize::MAX)
}

/// Reads in flight when no calibration says otherwise: what NVMe-class disks need.
pub const DEFAULT_BLOCK_DEPTH: usize = 16;

/// The queue depth at which `tiermem calibrate` measured the most random 4 KiB reads per
/// second on the block device (its `block_depth.best_depth`, 1 to 256), else
/// [`DEFAULT_BLOCK_DEPTH`]. An unreadable entry falls back to the default too: a depth
/// changes speed, never results.
#[must_use]
pub fn block_depth() -> usize {
    let text = std::fs::read_to_string(calibration_path()).ok();
    text.and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .and_then(|v| v.get("block_depth")?.get("best_depth")?.as_u64())
        .filter(|d| (1..=256).contains(d))
        .map_or(DEFAULT_BLOCK_DEPTH, |d| d as usize)
}

/// `None`: no calibration file, or one without DRAM figures. `Some(Err)`: a file whose
/// figures cannot be used.
fn load_calibrated() -> Option<Result<DramFigures, String>> {
    let path = calibration_path();
    let text = std::fs::read_to_string(&path).ok()?;
    let bad = |why: String| {
        format!(
            "calibration file {}: {why}; run `tiermem calibrate` again or delete the file",
            path.display()
        )
    };
    let v: serde_json::Value = match serde_json::from_str(&text) {
        Ok(v) => v,
        Err(e) => return Some(Err(bad(format!("not valid JSON ({e})")))),
    };
    let dram = v.get("dram")?;
    Some(
        serde_json::from_value::<DramFigures>(dram.clone())
            .map_err(|e| bad(format!("bad 'dram' entry ({e})")))
            .and_then(|mut f| {
                f.source = CALIBRATED.into();
                f.validate().map(|()| f).map_err(bad)
            }),
    )
}

/// Shortest timed repetition of a bandwidth measurement: passes over the buffer are repeated
/// until one lasts this long, so a scheduling hiccup or a cold start is a small part of it.
const MIN_REP: std::time::Duration = std::time::Duration::from_millis(20);

/// Measure DRAM read, write and copy bandwidth on `bytes`-sized buffers (best of `reps`
/// timed repetitions after an untimed pass) and random-access latency. `bytes` should exceed
/// the last-level cache ([`probe_bytes`]).
#[must_use]
pub fn measure_dram(bytes: usize, reps: usize) -> DramFigures {
    let bytes = bytes.next_multiple_of(1 << 20);
    let a = Mapping::anonymous(bytes, true, None).expect("map DRAM for measurement");
    let b = Mapping::anonymous(bytes, true, None).expect("map DRAM for measurement");
    let threads = rayon::current_num_threads();
    let chunk = bytes / threads;
    let (pa, pb) = (a.as_ptr() as usize, b.as_ptr() as usize);
    let best = |f: &dyn Fn()| -> f64 {
        // An untimed pass first: the pool's threads awake, the pages and the TLB warm.
        f();
        (0..reps.max(1))
            .map(|_| {
                let t = Instant::now();
                let mut passes = 0u32;
                while passes == 0 || t.elapsed() < MIN_REP {
                    f();
                    passes += 1;
                }
                t.elapsed().as_secs_f64() / f64::from(passes)
            })
            .fold(f64::INFINITY, f64::min)
    };
    let read = best(&|| {
        let s: u64 = (0..threads)
            .into_par_iter()
            // SAFETY: each chunk lies inside map `a`, which outlives the loop.
            .map(|i| unsafe { kernels::read_sum((pa + i * chunk) as *const u8, chunk) })
            .sum();
        std::hint::black_box(s);
    });
    let write = best(&|| {
        (0..threads).into_par_iter().for_each(|i| {
            // SAFETY: disjoint chunks of map `b`, which outlives the loop; the fill streams
            // from a cached zero block, so this is store traffic on `b` alone.
            unsafe { fill_nt((pb + i * chunk) as *mut u8, chunk) };
        });
    });
    let copy = best(&|| {
        (0..threads).into_par_iter().for_each(|i| {
            // SAFETY: disjoint chunks of two distinct maps.
            unsafe {
                kernels::copy_nt(
                    (pb + i * chunk) as *mut u8,
                    (pa + i * chunk) as *const u8,
                    chunk,
                );
            }
        });
    });
    let gb = bytes as f64 / 1e9;
    DramFigures {
        read_gbps: gb / read,
        write_gbps: gb / write,
        copy_gbps: gb / copy,
        // SAFETY: map `a` is ours, writable, page-aligned and `bytes` long.
        latency_ns: unsafe { probe::latency_ns(a.as_ptr(), bytes, 400_000) },
        source: MEASURED.into(),
    }
}

/// Fill with streaming stores, 1 MiB at a time from a zeroed block (the same kernel and
/// chunking the copy engine and `measure` use for large transfers).
///
/// # Safety
/// `dst` valid for `len` writes.
unsafe fn fill_nt(dst: *mut u8, len: usize) {
    static ZERO: OnceLock<Vec<u8>> = OnceLock::new();
    let zero = ZERO.get_or_init(|| vec![0u8; 1 << 20]);
    let mut off = 0;
    while off < len {
        let n = (len - off).min(zero.len());
        // SAFETY: dst + off .. + n is inside the caller's range; `zero` holds n bytes.
        unsafe { kernels::copy_nt(dst.add(off), zero.as_ptr(), n) };
        off += n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probe_leaves_the_cache_within_the_room() {
        const MIB: u64 = 1 << 20;
        // A 300 MiB cache: 600 MiB buffers when 9.6 GB or more are free.
        assert_eq!(probe_bytes_for(300 * MIB, 24 << 30), 600 << 20);
        // No cache listed, or a small one: at least 64 MiB.
        assert_eq!(probe_bytes_for(0, 24 << 30), 64 << 20);
        assert_eq!(probe_bytes_for(8 * MIB, 24 << 30), 64 << 20);
        // A tight container: an eighth of the room for both buffers, never under 8 MiB.
        assert_eq!(probe_bytes_for(300 * MIB, 1 << 30), 64 << 20);
        assert_eq!(probe_bytes_for(300 * MIB, 16 * MIB), 8 << 20);
    }
}
