//! The H2M interface (`h2m.h`), source-compatible with the PPAM'22 slides' API
//! (`../shared/papers/terboven-h2m-ppam22-slides.txt`): `h2m_init` maps the memory spaces
//! to the machine's NUMA nodes (or a sysfs fixture's, `TIERMEM_SYSFS`), allocations are
//! placed by their traits near the calling thread, moved when their traits change, and
//! their pointers stay valid across migration ([`state`] says how). Every call returns (or
//! writes through `err`) an `H2M_*` code and leaves a message for `tm_last_error()`; a
//! panic never crosses the boundary.

mod log;
mod parts;
mod state;
pub mod traits;
pub mod types;

use std::ffi::{c_int, c_void};

use tiermem_core::traits::Strategy;

use state::{H2mError, Result};
use types::*;

/// Run a call's body: its error becomes a code and the thread's last message; a panic
/// becomes `H2M_PANIC`.
fn run<T>(body: impl FnOnce() -> Result<T>) -> std::result::Result<T, h2m_status_t> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => {
            crate::status::set_last(e.message());
            Err(e.code())
        }
        Err(p) => {
            crate::status::set_last(crate::status::panic_message(p.as_ref()));
            Err(H2M_PANIC)
        }
    }
}

fn code(r: std::result::Result<(), h2m_status_t>) -> h2m_status_t {
    r.err().unwrap_or(H2M_SUCCESS)
}

/// `traits` (`n` of them) as the core's pairs.
///
/// # Safety
/// `traits` must be NULL (with `n == 0`) or point to `n` traits.
unsafe fn pairs_of(n: c_int, traits: *const h2m_alloc_trait_t) -> Result<Vec<(String, String)>> {
    let n = usize::try_from(n).map_err(|_| bad(format!("n_traits is negative ({n})")))?;
    if n == 0 {
        return Ok(Vec::new());
    }
    if traits.is_null() {
        return Err(bad(format!("traits is NULL with n_traits = {n}")));
    }
    // SAFETY: `n` traits by the caller's contract.
    let ts = unsafe { std::slice::from_raw_parts(traits, n) };
    Ok(traits::pairs(ts)?)
}

fn bad(msg: String) -> H2mError {
    H2mError::Core(tiermem_core::Error::InvalidArgument(msg))
}

fn strategy(s: h2m_strategy_t) -> Result<Strategy> {
    Ok(match s {
        H2M_STRATEGY_FIFO => Strategy::Fifo,
        H2M_STRATEGY_SIZE => Strategy::Size,
        H2M_STRATEGY_PRIORITY => Strategy::Priority,
        H2M_STRATEGY_GAIN => Strategy::Gain,
        _ => {
            return Err(bad(format!(
                "unknown strategy {s} (H2M_STRATEGY_FIFO, _SIZE, _PRIORITY, _GAIN are 0-3)"
            )))
        }
    })
}

/// Map the memory spaces and open a device per NUMA node (logged when `H2M_VERBOSE` or
/// `TIERMEM_VERBOSE` is set). `H2M_NODES_HBW`, `H2M_NODES_LOW_LAT`, `H2M_NODES_LARGE_CAP`
/// (or their `TIERMEM_` names) override a space's nodes; `TIERMEM_SYSFS` reads a sysfs tree
/// instead of `/sys`; `TIERMEM_NODE_DEVICES`, `TIERMEM_NODE_BYTES` and `TIERMEM_NODE_SCALE`
/// choose each node's device and capacity.
#[no_mangle]
pub extern "C" fn h2m_init() -> h2m_status_t {
    code(run(state::init))
}

/// A thread's start (nothing to do: no per-thread state). `H2M_NOT_INITIALIZED` before
/// `h2m_init`.
#[no_mangle]
pub extern "C" fn h2m_thread_init() -> h2m_status_t {
    code(run(|| state::with(|_| Ok(()))))
}

/// After the serial part of initialisation (nothing to do).
#[no_mangle]
pub extern "C" fn h2m_post_init_serial() -> h2m_status_t {
    code(run(|| state::with(|_| Ok(()))))
}

/// A thread's end (nothing to do).
#[no_mangle]
pub extern "C" fn h2m_thread_finalize() -> h2m_status_t {
    code(run(|| state::with(|_| Ok(()))))
}

/// Free every allocation and the devices; pointers from this library dangle afterwards.
#[no_mangle]
pub extern "C" fn h2m_finalize() -> h2m_status_t {
    code(run(state::finalize))
}

/// Write `code` through `err` when it is not NULL.
///
/// # Safety
/// `err` NULL or valid for a write.
unsafe fn report(err: *mut c_int, code: h2m_status_t) {
    if !err.is_null() {
        // SAFETY: non-null and writable by the caller's contract.
        unsafe { err.write(code) };
    }
}

/// Allocate `size` bytes with no traits (the fastest node near the calling thread with
/// room). NULL on failure, with the code in `*err` (`err` may be NULL).
///
/// # Safety
/// `err` NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn h2m_alloc(size: usize, err: *mut c_int) -> *mut c_void {
    // SAFETY: forwarded contract; no traits.
    unsafe { h2m_alloc_w_traits(size, err, 0, std::ptr::null()) }
}

/// Allocate `size` bytes placed by `traits` (`n_traits` of them) near the calling thread.
/// NULL on failure, with the code in `*err` (`err` may be NULL).
///
/// # Safety
/// `err` NULL or valid for a write; `traits` valid for `n_traits` reads.
#[no_mangle]
pub unsafe extern "C" fn h2m_alloc_w_traits(
    size: usize,
    err: *mut c_int,
    n_traits: c_int,
    traits: *const h2m_alloc_trait_t,
) -> *mut c_void {
    let got = run(|| {
        // SAFETY: forwarded contract.
        let pairs = unsafe { pairs_of(n_traits, traits) }?;
        if size == 0 {
            return Err(bad("h2m: cannot allocate zero bytes".into()));
        }
        state::with(|s| s.alloc(size, pairs))
    });
    // SAFETY: forwarded contract.
    unsafe { report(err, got.err().unwrap_or(H2M_SUCCESS)) };
    got.map_or(std::ptr::null_mut(), |a| a as *mut c_void)
}

/// Free an allocation (NULL is ignored, as `free` does). `H2M_NO_SUCH_ALLOCATION` for a
/// pointer this library did not return or freed already.
#[no_mangle]
pub extern "C" fn h2m_free(ptr: *mut c_void) -> h2m_status_t {
    if ptr.is_null() {
        return H2M_SUCCESS;
    }
    code(run(|| state::with(|s| s.free(ptr as usize))))
}

/// Record new traits for an allocation (`size`: at most its size): with
/// `replace_complete`, the new set; otherwise the old set with these keys replaced or
/// added. Nothing moves until `h2m_apply_migration`.
///
/// # Safety
/// `traits` valid for `n_traits` reads.
#[no_mangle]
pub unsafe extern "C" fn h2m_update_traits(
    ptr: *mut c_void,
    size: usize,
    n_traits: c_int,
    traits: *const h2m_alloc_trait_t,
    replace_complete: c_int,
) -> h2m_status_t {
    code(run(|| {
        // SAFETY: forwarded contract.
        let pairs = unsafe { pairs_of(n_traits, traits) }?;
        state::with(|s| s.update(ptr as usize, size, pairs, replace_complete != 0))
    }))
}

/// Place every allocation again by its current traits (the last commit's strategy) and
/// move those whose node changes; their pointers stay valid. Call it where no thread
/// reads or writes the allocations.
#[no_mangle]
pub extern "C" fn h2m_apply_migration() -> h2m_status_t {
    code(run(|| state::with(|s| s.migrate(None))))
}

/// As [`h2m_apply_migration`] for `n_allocs` allocations only.
///
/// # Safety
/// `allocations` valid for `n_allocs` reads.
#[no_mangle]
pub unsafe extern "C" fn h2m_apply_migration_for_allocations(
    allocations: *mut *mut c_void,
    n_allocs: c_int,
) -> h2m_status_t {
    code(run(|| {
        let n = usize::try_from(n_allocs)
            .map_err(|_| bad(format!("n_allocs is negative ({n_allocs})")))?;
        if n > 0 && allocations.is_null() {
            return Err(bad(format!("allocations is NULL with n_allocs = {n}")));
        }
        let addrs: Vec<usize> = if n == 0 {
            Vec::new()
        } else {
            // SAFETY: `n` pointers by the caller's contract.
            unsafe { std::slice::from_raw_parts(allocations, n) }
                .iter()
                .map(|p| *p as usize)
                .collect()
        };
        state::with(|s| s.migrate(Some(addrs)))
    }))
}

/// Declare an allocation; `h2m_commit_allocs` makes every declaration at once and writes
/// each address through its `ptr` (which must stay valid until then).
///
/// # Safety
/// `ptr` valid for a write until the commit; `traits` valid for `n_traits` reads.
#[no_mangle]
pub unsafe extern "C" fn h2m_declare_alloc_w_traits(
    ptr: *mut *mut c_void,
    size: usize,
    n_traits: c_int,
    traits: *const h2m_alloc_trait_t,
) -> h2m_status_t {
    code(run(|| {
        if ptr.is_null() {
            return Err(bad("h2m_declare_alloc_w_traits: ptr is NULL".into()));
        }
        // SAFETY: forwarded contract.
        let pairs = unsafe { pairs_of(n_traits, traits) }?;
        state::with(|s| s.declare(ptr as usize, size, pairs))
    }))
}

/// Allocate every declaration in `strategy`'s order (`H2M_STRATEGY_*`; also the order of
/// later migrations), all or none.
#[no_mangle]
pub extern "C" fn h2m_commit_allocs(strategy_code: h2m_strategy_t) -> h2m_status_t {
    code(run(|| {
        let st = strategy(strategy_code)?;
        let outs = state::with(|s| s.commit(st))?;
        for (out, addr) in outs {
            // SAFETY: each `out` was given to h2m_declare_alloc_w_traits, valid until now by
            // its contract.
            unsafe { (out as *mut *mut c_void).write(addr as *mut c_void) };
        }
        Ok(())
    }))
}

/// tiermem: the NUMA node an allocation is on now (`*node`).
///
/// # Safety
/// `node` valid for a write.
#[no_mangle]
pub unsafe extern "C" fn tm_h2m_node_of(ptr: *const c_void, node: *mut c_int) -> h2m_status_t {
    code(run(|| {
        if node.is_null() {
            return Err(bad("tm_h2m_node_of: node is NULL".into()));
        }
        let n = state::with(|s| s.node_of(ptr as usize))?;
        // SAFETY: non-null and writable by the caller's contract.
        unsafe { node.write(n as c_int) };
        Ok(())
    }))
}

/// tiermem: the NUMA node of each part of an allocation (one for a whole allocation; one
/// per node of its space for a blocked or interleaved one): up to `cap` in `nodes`, their
/// number in `*n`.
///
/// # Safety
/// `nodes` valid for `cap` writes (NULL with `cap == 0`); `n` valid for a write.
#[no_mangle]
pub unsafe extern "C" fn tm_h2m_nodes_of(
    ptr: *const c_void,
    nodes: *mut c_int,
    cap: usize,
    n: *mut usize,
) -> h2m_status_t {
    code(run(|| {
        if n.is_null() || (nodes.is_null() && cap > 0) {
            return Err(bad(
                "tm_h2m_nodes_of: n is NULL, or nodes is NULL with cap > 0".into(),
            ));
        }
        let got = state::with(|s| s.nodes_of(ptr as usize))?;
        for (i, v) in got.iter().take(cap).enumerate() {
            // SAFETY: i < cap, writable by the caller's contract.
            unsafe { nodes.add(i).write(*v as c_int) };
        }
        // SAFETY: non-null and writable by the caller's contract.
        unsafe { n.write(got.len()) };
        Ok(())
    }))
}

/// tiermem: allocate near `node` from this thread (as if it ran there); `-1` goes back to
/// the node it runs on.
#[no_mangle]
pub extern "C" fn tm_h2m_set_node(node: c_int) -> h2m_status_t {
    state::set_node(node);
    H2M_SUCCESS
}
