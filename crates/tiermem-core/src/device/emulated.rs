//! `emulated:PROFILE` devices: DRAM whose traffic through tiermem is throttled to a slower
//! device's figures, given as ratios of this machine's own DRAM, so the relative gap is the
//! published one whatever machine runs it.

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
        source: "thesis §2.3, Fig. 2.2/3.3 (30 GB/s read, 11 GB/s NT write vs ~110 GB/s \
                 DRAM, writes peak at 4 threads); H2M PPAM'22 slides (MLC latency 245.8/75.7 ns)",
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

    /// Time `bytes` of reads in `accesses` dependent-latency steps take on this device.
    #[must_use]
    pub fn read_cost(&self, bytes: u64, accesses: u64) -> Duration {
        secs(bytes as f64 / self.read_bps + accesses as f64 * self.latency_ns * 1e-9)
    }

    /// Time `bytes` of writes by `threads` writers take on this device.
    #[must_use]
    pub fn write_cost(&self, bytes: u64, threads: usize) -> Duration {
        secs(bytes as f64 / self.write_bps_at(threads))
    }

    /// Reserve the device's read channel for `bytes` read in `accesses` dependent steps and
    /// return when the reservation ends. Reserve before doing the transfer and
    /// [`wait_until`] the deadline after it, so all tiermem traffic to the device together
    /// runs at the profile's bandwidth and the real copy time is not charged twice.
    pub fn reserve_read(&self, bytes: u64, accesses: u64) -> Instant {
        reserve(&self.read_busy, self.read_cost(bytes, accesses))
    }

    /// Reserve the device's write channel for `bytes` written by `threads` writers
    /// (see [`Throttle::reserve_read`]).
    pub fn reserve_write(&self, bytes: u64, threads: usize) -> Instant {
        reserve(&self.write_busy, self.write_cost(bytes, threads))
    }

    /// Extra time `bytes` of reads in `accesses` dependent steps take on this device over the
    /// same reads from this machine's DRAM. An emulated device is DRAM, so a kernel that has
    /// read from it has already spent the DRAM time; it waits out only the difference.
    #[must_use]
    pub fn read_extra(&self, bytes: u64, accesses: u64) -> Duration {
        let p = self.profile;
        secs(
            bytes as f64 / self.read_bps * (1.0 - p.read_ratio)
                + accesses as f64 * self.latency_ns * 1e-9 * (1.0 - 1.0 / p.latency_ratio),
        )
    }

    /// Extra time `bytes` of writes by `threads` writers take over the same writes to DRAM.
    #[must_use]
    pub fn write_extra(&self, bytes: u64, threads: usize) -> Duration {
        let dram_bps = self.write_bps / self.profile.write_ratio;
        secs(bytes as f64 / self.write_bps_at(threads) - bytes as f64 / dram_bps)
    }

    /// Charge a kernel's reads and writes that ran at DRAM speed: reserve the extra time
    /// on each channel and wait for the later deadline. Returns the extra time the traffic
    /// costs on this device (the longer channel's; without any wait queued behind other
    /// charges, so the same traffic always returns the same figure).
    pub fn charge_kernel(&self, read: (u64, u64), write: (u64, usize)) -> Duration {
        let mut until = Instant::now();
        let mut cost = Duration::ZERO;
        if read.0 > 0 || read.1 > 0 {
            let c = self.read_extra(read.0, read.1);
            until = until.max(reserve(&self.read_busy, c));
            cost = cost.max(c);
        }
        if write.0 > 0 {
            let c = self.write_extra(write.0, write.1);
            until = until.max(reserve(&self.write_busy, c));
            cost = cost.max(c);
        }
        wait_until(until);
        cost
    }

    /// Charge traffic a model of a hardware cache put on this device (the 2LM model):
    /// slow reads (`read.0` bytes in `read.1` dependent steps) and writes at this device's
    /// full cost, plus `dram_extra` bytes of extra DRAM accesses at this machine's DRAM read
    /// bandwidth (they share the memory controllers the slow reads use).
    pub fn charge_full(&self, read: (u64, u64), write: (u64, usize), dram_extra: u64) {
        let dram_bps = self.read_bps / self.profile.read_ratio;
        let mut until = Instant::now();
        let r = self.read_cost(read.0, read.1) + secs(dram_extra as f64 / dram_bps);
        if !r.is_zero() {
            until = until.max(reserve(&self.read_busy, r));
        }
        if write.0 > 0 {
            until = until.max(reserve(&self.write_busy, self.write_cost(write.0, write.1)));
        }
        // Deferred past the manager's lock when a policy charges (see DeferScope).
        wait_or_defer(until);
    }

    /// Charge a read made by a kernel: reserve and wait.
    pub fn charge_read(&self, bytes: u64, accesses: u64) {
        wait_until(self.reserve_read(bytes, accesses));
    }

    /// Charge a write made by a kernel: reserve and wait.
    pub fn charge_write(&self, bytes: u64, threads: usize) {
        wait_until(self.reserve_write(bytes, threads));
    }
}

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
