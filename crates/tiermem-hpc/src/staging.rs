//! The chunked staging executor (Arima & Schulz §2.2, §5): run a kernel with its target
//! operand left where it is, always copied to fast memory first, or copied when the
//! sampled pattern says the copy pays (eq. 9); and the calibration of the break-even line
//! from the three probe patterns on the slow and the fast device (eq. 7).
//!
//! Staging copies the target in before the kernel and evicts it after (a target already in
//! fast memory is used there and stays): a target the kernel
//! only read is dropped from fast memory with no copy back (its slow copy is still valid);
//! one it wrote is copied back. A target it only writes is not copied in: the manager
//! places it in fast memory without reading the slow copy
//! ([`Manager::prefetch_for_overwrite`]), and the kernel overwrites it whole. A target
//! larger than fast memory is never staged (the report says so).

use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use serde::Serialize;

use super::probe::{Order, Probe};
use super::{threads, Kernel};
use crate::pattern::{rates, with_samplers, Boosts, BreakEven, Decision, Rates, Use, WANTED};
use tiermem_core::manager::Manager;
use tiermem_core::Result;

/// How [`run`] treats the target.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Mode {
    /// Leave it where it is.
    SlowOnly,
    /// Copy it to fast memory before the kernel.
    AlwaysStage,
    /// Sample, and stage when `t_boost - t_copy > t_th` on this line.
    PatternAware(BreakEven, f64),
}

/// What one staged run did and how long each part took.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The kernel.
    pub kernel: String,
    /// The target operand's name.
    pub target: String,
    /// Its sampled rates (pattern-aware runs).
    pub rates: Option<Rates>,
    /// Accesses per element, and whether the kernel reads and writes the target.
    pub u: f64,
    /// Whether the kernel reads the target.
    pub read: bool,
    /// Whether the kernel writes the target.
    pub write: bool,
    /// The decision (pattern-aware runs).
    pub decision: Option<Decision>,
    /// Whether the target ran in fast memory.
    pub staged: bool,
    /// Why a stage that was asked for did not happen.
    pub fallback: Option<String>,
    /// Sampling and analysis.
    pub analysis_seconds: f64,
    /// Copy in.
    pub copy_in_seconds: f64,
    /// Whether the copy in was skipped (a target the kernel only writes).
    pub copy_in_skipped: bool,
    /// The kernel.
    pub kernel_seconds: f64,
    /// Of which the emulated devices held the kernel past its run at DRAM speed (the
    /// devices' `kernel_stall_ns`; 0 on real devices). Unlike a wall-clock difference it
    /// carries no noise from the compute both placements share.
    pub stall_seconds: f64,
    /// Copy back (or drop).
    pub copy_back_seconds: f64,
    /// All of it.
    pub seconds: f64,
}

/// Sample operand `op` of a kernel as its threads would and return the filters' rates.
///
/// # Errors
/// When the kernel cannot be sampled or yields too few addresses.
pub fn analyse(m: &Manager, k: &dyn Kernel, op: usize) -> Result<Rates> {
    let th = threads();

    // Each thread's share is sampled as that thread would see it, all on this thread: a
    // kernel's sampler may open guards (the manager lock), which no rayon pool thread takes.
    let mut r = with_samplers(th, |samplers| {
        for (t, s) in samplers.iter_mut().enumerate() {
            s.feed_all(&k.sample(m, op, t, th, WANTED)?);
        }
        rates(samplers)
    })?;
    let (target, u) = k.target();
    if target == op {
        r.accesses_per_thread = u * k.operands()[op].len as f64 / th as f64;
    }
    Ok(r)
}

/// Run `k` once under `mode` on a manager whose policy moves only when told
/// (`lru_in_place`).
///
/// # Errors
/// What the kernel, the sampler or a move returns.
pub fn run(m: &Manager, k: &dyn Kernel, mode: Mode) -> Result<Report> {
    let start = Instant::now();
    let (t, u) = k.target();
    let op = k.operands()[t];
    let mut rep = Report {
        kernel: k.name(),
        target: op.name.into(),
        rates: None,
        u,
        read: op.read,
        write: op.write,
        decision: None,
        staged: false,
        fallback: None,
        analysis_seconds: 0.0,
        copy_in_seconds: 0.0,
        copy_in_skipped: false,
        kernel_seconds: 0.0,
        stall_seconds: 0.0,
        copy_back_seconds: 0.0,
        seconds: 0.0,
    };
    let stage = match mode {
        Mode::SlowOnly => false,
        Mode::AlwaysStage => true,
        Mode::PatternAware(line, t_th) => {
            let r = analyse(m, k, t)?;
            let d = line.decide(
                &r,
                &Use {
                    u,
                    read: op.read,
                    write: op.write,
                },
                t_th,
            )?;
            rep.analysis_seconds = start.elapsed().as_secs_f64();
            rep.rates = Some(r);
            rep.decision = Some(d);
            d.stage
        }
    };
    let bytes = op.len * op.elem;
    let fast = m.devices()[0].capacity;
    let mut moved = false;
    if stage && bytes > fast {
        rep.fallback = Some(format!(
            "the target '{}' ({bytes} bytes) is larger than fast memory ({fast} bytes): not staged",
            op.name
        ));
    } else if stage && m.in_fast(op.id)? {
        rep.staged = true; // already there: nothing to copy, and it stays
    } else if stage {
        let t0 = Instant::now();
        if op.write && !op.read {
            m.prefetch_for_overwrite(op.id)?;
            rep.copy_in_skipped = true;
        } else {
            m.prefetch(op.id, true)?;
        }
        rep.copy_in_seconds = t0.elapsed().as_secs_f64();
        rep.staged = m.in_fast(op.id)?;
        moved = rep.staged;
        if !rep.staged {
            rep.fallback = Some(format!(
                "the policy '{}' did not move '{}' to fast memory",
                m.policy_name(),
                op.name
            ));
        }
    }
    let (t1, s1) = (Instant::now(), stalled(m));
    k.run(m)?;
    rep.kernel_seconds = t1.elapsed().as_secs_f64();
    rep.stall_seconds = stalled(m) - s1;
    if moved {
        let t2 = Instant::now();
        m.evict(op.id)?;
        rep.copy_back_seconds = t2.elapsed().as_secs_f64();
    }
    rep.seconds = start.elapsed().as_secs_f64();
    Ok(rep)
}

/// Seconds the manager's emulated devices have held kernels so far (their
/// `kernel_stall_ns`; 0 on real devices).
fn stalled(m: &Manager) -> f64 {
    let ns: u64 = m
        .devices()
        .iter()
        .map(|d| d.counters.kernel_stall_ns.load(Relaxed))
        .sum();
    ns as f64 * 1e-9
}

/// The median of `reps` timings of `f`.
fn median_secs(reps: usize, mut f: impl FnMut() -> Result<f64>) -> Result<f64> {
    let mut v = (0..reps.max(1)).map(|_| f()).collect::<Result<Vec<_>>>()?;
    v.sort_by(f64::total_cmp);
    Ok(v[v.len() / 2])
}

/// Calibrate the break-even line between the manager's slowest and fastest devices with a
/// probe array of `len` `u64`s (a power of two that fits fast memory), each figure the
/// median of `reps` runs: gains `(slow - fast) / GB` of the three probe orders for reads,
/// writes and both (on an emulated slow device, from the time it held each probe: its
/// stall counter), and copy times in and back per GB. The manager's policy must move only
/// when told (`lru_in_place`); the array is allocated on the slowest device and freed.
/// The line-filter hit rates of the three orders are sampled as a kernel's are.
///
/// # Errors
/// When the array cannot be allocated or staged, or a probe fails.
pub fn calibrate(m: &Manager, len: u64, reps: usize) -> Result<BreakEven> {
    let slow = m.devices().len() - 1;
    tiermem_core::ensure!(
        slow > 0,
        "staging calibration needs a fast and a slow device"
    );
    let bytes = len * 8;
    let id = m.alloc(bytes, tiermem_core::mechanism::Place::Device(slow))?;
    let out = calibrate_on(m, id, len, reps);
    let freed = m.free(id);
    let line = out?;
    freed?;
    Ok(line)
}

fn calibrate_on(
    m: &Manager,
    id: tiermem_core::mechanism::ObjectId,
    len: u64,
    reps: usize,
) -> Result<BreakEven> {
    let gb = (len * 8) as f64 / 1e9;
    let orders = [Order::Random, Order::Strided, Order::Sequential];
    let modes = [(true, false), (false, true), (true, true)];
    let mut slow_t = [[0.0; 3]; 3];
    let mut fast_t = [[0.0; 3]; 3];
    // A probe's time is its wall-clock seconds; on an emulated slow device, what the device
    // held it (its stall counter) instead: the same difference between the two placements,
    // both of which run the same compute on the same DRAM, without that compute's noise.
    let emulated = m.devices()[m.devices().len() - 1].throttle.is_some();
    let time = |o, (r, w)| -> Result<f64> {
        let p = Probe::new(id, len, o, r, w)?;
        median_secs(reps, || {
            let (t, s) = (Instant::now(), stalled(m));
            p.run(m)?;
            Ok(if emulated {
                stalled(m) - s
            } else {
                t.elapsed().as_secs_f64()
            })
        })
    };
    for (i, &mode) in modes.iter().enumerate() {
        for (j, &o) in orders.iter().enumerate() {
            slow_t[i][j] = time(o, mode)?;
        }
    }
    let t_1st = median_secs(reps, || {
        m.evict(id)?;
        let t = Instant::now();
        m.prefetch(id, true)?;
        Ok(t.elapsed().as_secs_f64())
    })?;
    tiermem_core::ensure!(
        m.in_fast(id)?,
        "staging calibration: the probe array did not move to fast memory"
    );
    for (i, &mode) in modes.iter().enumerate() {
        for (j, &o) in orders.iter().enumerate() {
            fast_t[i][j] = time(o, mode)?;
        }
    }
    let t_3rd = median_secs(reps, || {
        m.prefetch(id, true)?;
        m.write_use(id)?;
        let t = Instant::now();
        m.evict(id)?;
        Ok(t.elapsed().as_secs_f64())
    })?;
    let boosts = |i: usize| Boosts {
        random: (slow_t[i][0] - fast_t[i][0]) / gb,
        strided: (slow_t[i][1] - fast_t[i][1]) / gb,
        sequential: (slow_t[i][2] - fast_t[i][2]) / gb,
    };
    let mut lines = [0.0; 3];
    for (h, &o) in lines.iter_mut().zip(&orders) {
        *h = analyse(m, &Probe::new(id, len, o, true, false)?, 0)?.r_lf;
    }
    Ok(BreakEven {
        read: boosts(0),
        write: boosts(1),
        read_write: boosts(2),
        t_1st: t_1st / gb,
        t_3rd: t_3rd / gb,
        lines,
        cache_lines: super::traffic::CACHE_LINES as u64,
    })
}
