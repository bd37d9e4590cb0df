//! Pattern-aware staging over C arrays (Arima & Schulz, `tiermem_hpc::pattern`): sample a
//! loop's index stream (`tm_analyse`), decide on a device pair's calibrated break-even line
//! whether copying its data to fast memory first pays (`tm_stage_decide`), and run the loop
//! chunk by chunk on a fast copy (`tm_stage_run`).

use std::ffi::{c_char, c_int, c_void};

use tiermem_core::mechanism::Place;
use tiermem_core::{bail, Result};
use tiermem_hpc::pattern::{self, BreakEven, Rates, Use};

use crate::manager::{manager, put, text, TmManager};
use crate::status::{guard, TmStatus};

/// A staging decision (eq. 9) and the figures behind it, s/GB of chunk.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct TmDecision {
    /// 1: stage (`t_boost - t_copy > t_th`).
    pub stage: c_int,
    /// Predicted gain on the fast device, per the lines the loop fetches.
    pub t_boost: f64,
    /// Copy time, in if read, back if written.
    pub t_copy: f64,
    /// The paper's predicted gain (per reference).
    pub t_boost_paper: f64,
    /// 1: the paper's rule would stage.
    pub stage_paper: c_int,
}

/// A device pair's calibrated break-even line (opaque).
pub struct TmBreakEven {
    line: BreakEven,
}

/// Sample `n` indices (element `i` at byte `i * elem_bytes`) as `threads` threads would under
/// a static schedule; the rates in `*out`.
///
/// # Safety
/// `indices` valid for `n` reads; `out` valid for a write.
#[no_mangle]
pub unsafe extern "C" fn tm_analyse(
    indices: *const i64,
    n: usize,
    elem_bytes: u64,
    threads: usize,
    out: *mut Rates,
) -> TmStatus {
    guard(|| {
        if indices.is_null() && n > 0 {
            bail!("tm_analyse: indices is NULL with n = {n}");
        }
        let s = if n == 0 {
            &[][..]
        } else {
            // SAFETY: `n` values by the caller's contract.
            unsafe { std::slice::from_raw_parts(indices, n) }
        };
        let r = pattern::analyse_indices(s, elem_bytes, threads)?;
        // SAFETY: forwarded contract.
        unsafe { put(out, r, "out") }
    })
}

/// A break-even line from its JSON (what `tiermem calibrate` keeps under `"staging"`, or
/// Python's `BreakEven.as_dict()`); free it with [`tm_break_even_free`].
///
/// # Safety
/// `json` a NUL-terminated string; `out` valid for a write.
#[no_mangle]
pub unsafe extern "C" fn tm_break_even_from_json(
    json: *const c_char,
    out: *mut *mut TmBreakEven,
) -> TmStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let t = unsafe { text(json, "json") }?;
        let line: BreakEven = serde_json::from_str(t).map_err(|e| {
            tiermem_core::Error::InvalidArgument(format!("not a break-even line: {e}"))
        })?;
        give(out, line)
    })
}

/// Calibrate the break-even line between `m`'s slowest and fastest devices over arrays of
/// `len` `uint64`s (a power of two that fits fast memory), each figure the median of
/// `reps` runs; `m`'s policy must move only when told (`lru_in_place`).
///
/// # Safety
/// `m` a live handle; `out` valid for a write.
#[no_mangle]
pub unsafe extern "C" fn tm_break_even_calibrate(
    m: *const TmManager,
    len: u64,
    reps: usize,
    out: *mut *mut TmBreakEven,
) -> TmStatus {
    guard(|| {
        if len < 4096 || !len.is_power_of_two() {
            bail!("calibration length must be a power of two of at least 4096, got {len}");
        }
        // SAFETY: forwarded contract.
        let line = tiermem_hpc::staging::calibrate(unsafe { manager(m) }?, len, reps.max(1))?;
        give(out, line)
    })
}

fn give(out: *mut *mut TmBreakEven, line: BreakEven) -> Result<()> {
    if out.is_null() {
        bail!("out is NULL");
    }
    let h = Box::into_raw(Box::new(TmBreakEven { line }));
    // SAFETY: non-null and writable by the caller's contract.
    unsafe { out.write(h) };
    Ok(())
}

/// Free a break-even line (NULL is ignored).
///
/// # Safety
/// `line` NULL or a handle from this library not yet freed.
#[no_mangle]
pub unsafe extern "C" fn tm_break_even_free(line: *mut TmBreakEven) {
    if !line.is_null() {
        // SAFETY: a live handle, freed once, by the caller's contract.
        drop(unsafe { Box::from_raw(line) });
    }
}

/// Decide whether to stage a chunk a loop uses `u` times per element (reads it if `read`,
/// writes it if `write`) with sampled `rates`, on `line`, with threshold `t_th` s/GB.
///
/// # Safety
/// `line` a live handle; `rates` valid for a read; `out` valid for a write.
#[no_mangle]
pub unsafe extern "C" fn tm_stage_decide(
    line: *const TmBreakEven,
    rates: *const Rates,
    u: f64,
    read: c_int,
    write: c_int,
    t_th: f64,
    out: *mut TmDecision,
) -> TmStatus {
    guard(|| {
        if line.is_null() || rates.is_null() {
            bail!("tm_stage_decide: line and rates must not be NULL");
        }
        // SAFETY: live and readable by the caller's contract.
        let (line, r) = unsafe { (&(*line).line, *rates) };
        let d = line.decide(
            &r,
            &Use {
                u,
                read: read != 0,
                write: write != 0,
            },
            t_th,
        )?;
        let c = TmDecision {
            stage: c_int::from(d.stage),
            t_boost: d.t_boost,
            t_copy: d.t_copy,
            t_boost_paper: d.t_boost_paper,
            stage_paper: c_int::from(d.stage_paper),
        };
        // SAFETY: forwarded contract.
        unsafe { put(out, c, "out") }
    })
}

/// A loop body over one chunk: its fast copy, its byte offset in the array and length, and
/// the caller's context. Nonzero stops the run (its value is named in the message).
pub type TmChunkFn = Option<unsafe extern "C" fn(*mut c_void, usize, usize, *mut c_void) -> c_int>;

/// Run `body` over `data` (`bytes` long) `chunk` bytes at a time, each chunk copied into a
/// buffer on `m`'s fastest device first (if `read`) and back after (if `write`): the
/// staging executor. The buffer is pinned for the run, so nothing moves it meanwhile.
///
/// # Safety
/// `m` a live handle; `data` valid for `bytes` reads and writes; `body` safe to call with
/// the buffer, its offsets and `ctx`.
#[no_mangle]
pub unsafe extern "C" fn tm_stage_run(
    m: *const TmManager,
    data: *mut c_void,
    bytes: usize,
    chunk: usize,
    read: c_int,
    write: c_int,
    body: TmChunkFn,
    ctx: *mut c_void,
) -> TmStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let mgr = unsafe { manager(m) }?;
        let Some(body) = body else {
            bail!("tm_stage_run: body is NULL");
        };
        if data.is_null() || bytes == 0 || chunk == 0 {
            bail!("tm_stage_run: data is NULL or bytes ({bytes}) or chunk ({chunk}) is zero");
        }
        let len = chunk.min(bytes);
        let id = mgr.alloc(len as u64, Place::Fast)?;
        let run = || -> Result<()> {
            let (ticket, fast, _) = mgr.open(id, true)?;
            let mut off = 0;
            let mut outcome = Ok(());
            while off < bytes && outcome.is_ok() {
                let n = len.min(bytes - off);
                // SAFETY: `data` holds `bytes` bytes and `fast` `len`; `n` fits both; they
                // do not overlap (the buffer is tiermem's).
                let src = unsafe { data.cast::<u8>().add(off) };
                if read != 0 {
                    // SAFETY: as above.
                    unsafe { std::ptr::copy_nonoverlapping(src, fast, n) };
                }
                // SAFETY: the caller's contract for `body`; the buffer is pinned.
                let rc = unsafe { body(fast.cast(), off, n, ctx) };
                if rc != 0 {
                    outcome = Err(tiermem_core::Error::InvalidArgument(format!(
                        "tm_stage_run: the body returned {rc} for the chunk at byte {off}"
                    )));
                } else if write != 0 {
                    // SAFETY: as above.
                    unsafe { std::ptr::copy_nonoverlapping(fast, src, n) };
                }
                off += n;
            }
            mgr.close(ticket)?;
            outcome
        };
        let r = run();
        mgr.free(id)?;
        r
    })
}
