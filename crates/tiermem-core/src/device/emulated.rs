//! `emulated:PROFILE` devices: DRAM whose traffic through tiermem is throttled to a slower
//! device's figures, given as ratios of this machine's own DRAM, so the relative gap is the
//! published one whatever machine runs it.
//!
//! Traffic is charged at the device's access granularity: `accesses` separate accesses of
//! `bytes` in all cost `accesses * round_up(bytes / accesses, access_bytes)` bytes of the
//! device's bandwidth (Optane reads and writes 256-byte blocks, so a 64-byte row costs a
//! 256-byte read; [`Throttle::device_bytes`]). A stream is one access.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::calib::DramFigures;
use crate::{Error, Result};

/// A published slow-memory device, as ratios of DRAM figures measured on the same machine.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Profile {
    /// Profile name used in device specs (`emulated:<name>`).
    pub name: &'static str,
    /// Read bandwidth as a fraction of DRAM read bandwidth.
    pub read_ratio: f64,
    /// Write bandwidth as a fraction of DRAM write bandwidth (at or below `write_peak_threads`).
    pub write_ratio: f64,
    /// Load-to-use latency as a multiple of DRAM latency.
    pub latency_ratio: f64,
    /// Writer threads at which write bandwidth peaks.
    pub write_peak_threads: usize,
    /// Fraction of write bandwidth lost per writer thread beyond the peak.
    pub write_degrade_per_thread: f64,
    /// Bytes the device reads or writes at least per access (its media's block).
    pub access_bytes: u64,
    /// Where the figures come from.
    pub source: &'static str,
}

/// Profiles shipped with tiermem.
pub const PROFILES: &[Profile] = &[
    Profile {
        name: "optane-pmem",
        // Thesis Ch.2-3 (Cascade Lake, 6 interleaved Optane DC DIMMs): "just over 30 GB/s
        // read and 11 GB/s write to PM" (§2.3, non-temporal stores, writes peaking at 4
        // threads and falling with more, Fig. 2.2b/3.3) against about 110 GB/s of DRAM
        // (§5.3.3, Fig. 3.3): reads ~1/3, writes ~1/7 of DRAM. H2M slides (Intel MLC,
        // Cascade Lake + Optane): idle latency 245.8 ns vs 75.7 ns local DRAM (3.25x); STREAM
        // triad NVM/DRAM ratio 2-4.5x by thread count.
        read_ratio: 1.0 / 3.0,
        write_ratio: 1.0 / 7.0,
        latency_ratio: 3.25,
        write_peak_threads: 4,
        write_degrade_per_thread: 0.06,
        // Thesis §2.3 and §5.3 ("this generation of Optane DIMMs have a 256 B access
        // granularity"; random writes match sequential ones only from 256 B up).
        access_bytes: 256,
        source: "thesis §2.3, Fig. 2.2/3.3 (30 GB/s read, 11 GB/s NT write vs ~110 GB/s \
                 DRAM, writes peak at 4 threads, 256 B access granularity); H2M PPAM'22 \
                 slides (MLC latency 245.8/75.7 ns)",
    },
    Profile {
        name: "cxl",
        // A CXL 1.1/2.0 Type-3 memory expander behind one PCIe 5.0 x16 link. Latency: Pond
        // (Li et al., ASPLOS 2023) reports CXL-attached memory adding roughly 70-90 ns to
        // local DRAM, about doubling access latency. Bandwidth: one x16 link carries about
        // 64 GB/s raw per direction, roughly half of what a socket's local DDR5 channels
        // deliver in the configurations such expanders are paired with; the 0.5 / 0.45 ratios
        // are that link-bound estimate (writes a little below reads), not a measured figure.
        read_ratio: 0.5,
        write_ratio: 0.45,
        latency_ratio: 2.0,
        write_peak_threads: 8,
        write_degrade_per_thread: 0.02,
        // CXL.mem moves 64-byte flits: a cache line per access, as DRAM.
        access_bytes: 64,
        source: "latency: Pond, ASPLOS'23 (+70-90 ns, ~2x local DRAM); bandwidth: estimate \
                 bound by one PCIe 5.0 x16 link (~1/2 of local DRAM)",
    },
];

/// Look a profile up by name.
pub fn profile(name: &str) -> Result<&'static Profile> {
    PROFILES.iter().find(|p| p.name == name).ok_or_else(|| {
        let names: Vec<_> = PROFILES.iter().map(|p| p.name).collect();
        Error::UnknownDevice(format!(
            "no emulated profile named '{name}' (known: {})",
            names.join(", ")
        ))
    })
}

/// Absolute figures of an emulated device on this machine, and the throttle that holds its
/// traffic to them.
#[derive(Debug)]
pub struct Throttle {
    /// The profile.
    pub profile: &'static Profile,
    /// Read bandwidth in bytes per second.
    pub read_bps: f64,
    /// Write bandwidth (at the peak thread count) in bytes per second.
    pub write_bps: f64,
    /// Latency in nanoseconds.
    pub latency_ns: f64,
    read_busy: Mutex<Instant>,
    write_busy: Mutex<Instant>,
}

impl Throttle {
    /// Scale a profile to this machine's DRAM figures.
    #[must_use]
    pub fn new(profile: &'static Profile, dram: &DramFigures) -> Self {
        let now = Instant::now();
        Throttle {
            profile,
            read_bps: dram.read_gbps * 1e9 * profile.read_ratio,
            write_bps: dram.write_gbps * 1e9 * profile.write_ratio,
            latency_ns: dram.latency_ns * profile.latency_ratio,
            read_busy: Mutex::new(now),
            write_busy: Mutex::new(now),
        }
    }

    /// Write bandwidth in bytes per second with `threads` concurrent writers.
    #[must_use]
    pub fn write_bps_at(&self, threads: usize) -> f64 {
        let extra = threads.saturating_sub(self.profile.write_peak_threads) as f64;
        self.write_bps * (1.0 - self.profile.write_degrade_per_thread * extra).max(0.3)
    }

    /// Bytes of the device's bandwidth `bytes` in `accesses` separate accesses of equal
    /// size take: each rounded up to the device's access granularity (`accesses` 0 or 1: one
    /// stream).
    #[must_use]
    pub fn device_bytes(&self, bytes: u64, accesses: u64) -> u64 {
        let n = accesses.max(1);
        n * bytes
            .div_ceil(n)
            .next_multiple_of(self.profile.access_bytes.max(1))
    }

    /// The bandwidth the profile cites for accesses of `size` bytes, GB/s: its read or
    /// write bandwidth (writes at `threads` writers), of which a random access gets the
    /// share of the device's granularity it asks for (a 64-byte random read on a 256-byte
    /// device: a quarter); a stream merges its accesses into whole blocks.
    #[must_use]
    pub fn cited_gbps(&self, write: bool, random: bool, size: u64, threads: usize) -> f64 {
        let bps = if write {
            self.write_bps_at(threads)
        } else {
            self.read_bps
        };
        let share = if random {
            size as f64 / self.device_bytes(size, 1) as f64
        } else {
            1.0
        };
        bps * share / 1e9
    }

    /// Time reads `read` take on this device: `(bytes, accesses, dependent steps)`, the
    /// bytes at the device's granularity ([`Throttle::device_bytes`]), a latency per step.
    #[must_use]
    pub fn read_cost(&self, (bytes, accesses, steps): Reads) -> Duration {
        let b = if bytes == 0 {
            0
        } else {
            self.device_bytes(bytes, accesses)
        };
        secs(b as f64 / self.read_bps + steps as f64 * self.latency_ns * 1e-9)
    }

    /// Time writes `write` take on this device: `(bytes, accesses, writer threads)`.
    #[must_use]
    pub fn write_cost(&self, (bytes, accesses, threads): Writes) -> Duration {
        let b = if bytes == 0 {
            0
        } else {
            self.device_bytes(bytes, accesses)
        };
        secs(b as f64 / self.write_bps_at(threads))
    }

    /// Reserve the device's read channel for reads `read` ([`Throttle::read_cost`]) and
    /// return when the reservation ends. Reserve before doing the transfer and
    /// [`wait_until`] the deadline after it, so all tiermem traffic to the device together
    /// runs at the profile's bandwidth and the real copy time is not charged twice.
    pub fn reserve_read(&self, read: Reads) -> Instant {
        reserve(&self.read_busy, self.read_cost(read))
    }

    /// Reserve the device's write channel for writes `write` (see
    /// [`Throttle::reserve_read`]).
    pub fn reserve_write(&self, write: Writes) -> Instant {
        reserve(&self.write_busy, self.write_cost(write))
    }

    /// Extra time reads `read` take on this device over the same reads from this machine's
    /// DRAM (which moves cache lines: the bytes as they are). An emulated device is DRAM,
    /// so a kernel that has read from it has already spent the DRAM time; it waits out only
    /// the difference.
    #[must_use]
    pub fn read_extra(&self, read @ (bytes, _, steps): Reads) -> Duration {
        let dram_bps = self.read_bps / self.profile.read_ratio;
        let dram = bytes as f64 / dram_bps
            + steps as f64 * self.latency_ns * 1e-9 / self.profile.latency_ratio;
        secs(self.read_cost(read).as_secs_f64() - dram)
    }

    /// Extra time writes `write` take over the same writes to DRAM.
    #[must_use]
    pub fn write_extra(&self, write @ (bytes, _, _): Writes) -> Duration {
        let dram_bps = self.write_bps / self.profile.write_ratio;
        secs(self.write_cost(write).as_secs_f64() - bytes as f64 / dram_bps)
    }

    /// Charge a kernel's reads and writes that ran at DRAM speed: reserve the extra time
    /// on each channel and wait for the later deadline. Returns the extra time the traffic
    /// costs on this device (the longer channel's; without any wait queued behind other
    /// charges, so the same traffic always returns the same figure).
    pub fn charge_kernel(&self, read: Reads, write: Writes) -> Duration {
        let mut until = Instant::now();
        let mut cost = Duration::ZERO;
        if read.0 > 0 || read.2 > 0 {
            let c = self.read_extra(read);
            until = until.max(reserve(&self.read_busy, c));
            cost = cost.max(c);
        }
        if write.0 > 0 {
            let c = self.write_extra(write);
            until = until.max(reserve(&self.write_busy, c));
            cost = cost.max(c);
        }
        wait_until(until);
        cost
    }

    /// Charge traffic a model of a hardware cache put on this device (the 2LM model):
    /// slow reads and writes at this device's full cost, plus `dram_extra` bytes of extra
    /// DRAM accesses at this machine's DRAM read bandwidth (they share the memory
    /// controllers the slow reads use).
    pub fn charge_full(&self, read: Reads, write: Writes, dram_extra: u64) {
        let dram_bps = self.read_bps / self.profile.read_ratio;
        let mut until = Instant::now();
        let r = self.read_cost(read) + secs(dram_extra as f64 / dram_bps);
        if !r.is_zero() {
            until = until.max(reserve(&self.read_busy, r));
        }
        if write.0 > 0 {
            until = until.max(reserve(&self.write_busy, self.write_cost(write)));
        }
        // Deferred past the manager's lock when a policy charges (see DeferScope).
        wait_or_defer(until);
    }

    /// Charge a read made by a kernel: reserve and wait.
    pub fn charge_read(&self, read: Reads) {
        wait_until(self.reserve_read(read));
    }

    /// Charge a write made by a kernel: reserve and wait.
    pub fn charge_write(&self, write: Writes) {
        wait_until(self.reserve_write(write));
    }
}

/// Reads as a charge gives them: `(bytes, accesses, dependent steps)`. `accesses` are the
/// separate accesses the bytes came in (rows; 1 for a stream), each costing at least the
/// device's access granularity; `steps` the latencies paid one after another.
pub type Reads = (u64, u64, u64);

/// Writes as a charge gives them: `(bytes, accesses, writer threads)`.
pub type Writes = (u64, u64, usize);

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s.max(0.0))
}

/// Reserve `cost` on a channel whose reservations run back to back; returns the end of ours.
fn reserve(busy: &Mutex<Instant>, cost: Duration) -> Instant {
    let mut b = busy
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let now = Instant::now();
    let start = if *b > now { *b } else { now };
    *b = start + cost;
    *b
}

thread_local! {
    /// Whether this thread holds a manager lock now ([`UnderManagerLock`]).
    static UNDER_MANAGER_LOCK: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// Open deferral scopes on this thread and the latest deadline deferred in them.
    static DEFERRED: std::cell::Cell<(u32, Option<Instant>)> = const { std::cell::Cell::new((0, None)) };
}

/// While alive, [`wait_or_defer`] on this thread records deadlines instead of waiting; the
/// outermost scope waits for the latest one when it ends. The manager opens one around each
/// operation, before taking its lock, so an emulated device's delay is served after the lock
/// is released: other threads are not blocked by a slow device's emulated time.
#[must_use = "the scope ends (and waits) when dropped"]
pub struct DeferScope(());

impl DeferScope {
    /// Open a scope.
    pub fn enter() -> Self {
        DEFERRED.with(|d| {
            let (depth, pending) = d.get();
            d.set((depth + 1, pending));
        });
        DeferScope(())
    }
}

impl Drop for DeferScope {
    fn drop(&mut self) {
        let pending = DEFERRED.with(|d| {
            let (depth, pending) = d.get();
            if depth == 1 {
                d.set((0, None));
                pending
            } else {
                d.set((depth - 1, pending));
                None
            }
        });
        if let Some(deadline) = pending {
            wait_until(deadline);
        }
    }
}

/// Wait until `deadline`, or leave it to the enclosing [`DeferScope`] if there is one.
pub fn wait_or_defer(deadline: Instant) {
    let deferred = DEFERRED.with(|d| {
        let (depth, pending) = d.get();
        if depth == 0 {
            return false;
        }
        d.set((depth, Some(pending.map_or(deadline, |p| p.max(deadline)))));
        true
    });
    if !deferred {
        wait_until(deadline);
    }
}

/// Marks, while alive, that this thread holds a manager lock: an emulated stall served now
/// would block every other thread's manager call for the device's emulated time, so
/// [`wait_until`] refuses to (panics, which poisons the manager: a bug, caught by tests
/// whatever the schedule). The manager creates one with its lock guard.
#[must_use = "marks the lock as held until dropped"]
pub struct UnderManagerLock(bool);

impl UnderManagerLock {
    /// Mark the lock as held on this thread.
    pub fn enter() -> Self {
        UnderManagerLock(UNDER_MANAGER_LOCK.with(|f| f.replace(true)))
    }
}

impl Drop for UnderManagerLock {
    fn drop(&mut self) {
        UNDER_MANAGER_LOCK.with(|f| f.set(self.0));
    }
}

/// Hold the core until `deadline`, as a load or store stalled on slow memory holds it.
///
/// Every emulated transfer is CPU-driven (tiermem's kernels, and copies the copy engine's
/// threads make with loads and stores), so its stall is a busy core, not a sleep: a sleep
/// would let a loaded machine run other work inside the stall and hide the slow device's
/// cost (measured: a demo's `static`-vs-`all-slow` ratio fell from 1.24x to 0.92x with other
/// work running). A transfer a real system overlaps with other work (a DMA engine, I/O on a
/// block device) would sleep instead; no emulated path is one today.
pub fn wait_until(deadline: Instant) {
    if Instant::now() >= deadline {
        return;
    }
    assert!(
        !UNDER_MANAGER_LOCK.with(std::cell::Cell::get),
        "an emulated stall was about to be served under the manager lock (it must be \
         deferred past it: DeferScope)"
    );
    spin_until(deadline);
}

/// [`wait_until`] for calibration, which measures a device alone and holds the manager lock
/// on purpose while it does (`Manager::with_data` around `measure::device_figures`).
pub fn wait_until_measuring(deadline: Instant) {
    spin_until(deadline);
}

fn spin_until(deadline: Instant) {
    while Instant::now() < deadline {
        std::hint::spin_loop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn throttle(name: &str) -> Throttle {
        let dram = DramFigures {
            read_gbps: 30.0,
            write_gbps: 21.0,
            copy_gbps: 15.0,
            latency_ns: 100.0,
            source: "test".into(),
        };
        Throttle::new(profile(name).unwrap(), &dram)
    }

    #[test]
    fn accesses_cost_whole_blocks_of_the_device() {
        let o = throttle("optane-pmem");
        // 1,000 random 64-byte rows on 256-byte media: 256 KB of the device's bandwidth;
        // 256-byte and 4 KiB rows cost what they ask; a stream is one access.
        assert_eq!(o.device_bytes(64_000, 1000), 256_000);
        assert_eq!(o.device_bytes(256_000, 1000), 256_000);
        assert_eq!(o.device_bytes(4_096_000, 1000), 4_096_000);
        assert_eq!(o.device_bytes(64_000, 1), 64_000);
        assert_eq!(o.device_bytes(100, 0), 256);
        // 320-byte rows: two blocks each.
        assert_eq!(o.device_bytes(320 * 10, 10), 5120);
        let c = throttle("cxl");
        assert_eq!(c.device_bytes(64_000, 1000), 64_000);
        // A random 64-byte read costs four times a streamed one on Optane, the same on CXL,
        // and the extra time over DRAM grows with it; writes alike.
        let (r, s) = (o.read_cost((64_000, 1000, 0)), o.read_cost((64_000, 1, 0)));
        assert!(
            (r.as_secs_f64() / s.as_secs_f64() - 4.0).abs() < 1e-3,
            "{r:?} {s:?}"
        );
        assert!(o.read_extra((64_000, 1000, 0)) > o.read_extra((64_000, 1, 0)) * 4);
        let (w, ws) = (
            o.write_cost((64_000, 1000, 1)),
            o.write_cost((64_000, 1, 1)),
        );
        assert!((w.as_secs_f64() / ws.as_secs_f64() - 4.0).abs() < 1e-3);
        assert_eq!(c.read_cost((64_000, 1000, 0)), c.read_cost((64_000, 1, 0)));
        // Nothing read costs nothing but its latency.
        assert_eq!(o.read_cost((0, 0, 0)), Duration::ZERO);
        let (dev, dram) = (64_000.0 / (30e9 / 3.0), 64_000.0 / 30e9);
        assert!((o.read_extra((64_000, 1, 0)).as_secs_f64() - (dev - dram)).abs() < 2e-9);
    }

    #[test]
    fn cited_figures_are_the_profile_share_of_dram_at_the_granularity() {
        let o = throttle("optane-pmem");
        assert!((o.cited_gbps(false, false, 64, 1) - 10.0).abs() < 1e-9);
        assert!((o.cited_gbps(false, true, 64, 1) - 2.5).abs() < 1e-9);
        assert!((o.cited_gbps(false, true, 4096, 1) - 10.0).abs() < 1e-9);
        assert!((o.cited_gbps(true, true, 256, 1) - 3.0).abs() < 1e-9);
        assert!((o.cited_gbps(true, true, 64, 1) - 0.75).abs() < 1e-9);
        // Writes fall beyond the peak thread count.
        assert!(o.cited_gbps(true, false, 4096, 8) < o.cited_gbps(true, false, 4096, 4));
        let c = throttle("cxl");
        assert!((c.cited_gbps(false, true, 64, 1) - 15.0).abs() < 1e-9);
    }
}
