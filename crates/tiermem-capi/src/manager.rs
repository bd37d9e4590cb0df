//! Managers and their objects from C: a manager over devices given by spec and capacity,
//! objects allocated on a place, pinned (`tm_pin`: its bytes stay where they are, at the
//! address returned, until `tm_unpin`), moved between devices and freed.

use std::ffi::{c_char, c_void, CStr};
use std::sync::Arc;

use tiermem_core::counters::CounterSnapshot;
use tiermem_core::manager::Manager;
use tiermem_core::mechanism::Place;
use tiermem_core::{bail, device, policy, Result};

use crate::status::{guard, TmStatus};

/// Place code: the manager's fastest device with room (the policy may make room).
pub const TM_PLACE_FAST: i64 = -1;
/// Place code: the manager's slowest device.
pub const TM_PLACE_SLOW: i64 = -2;
/// Place code: wherever the policy puts new data.
pub const TM_PLACE_AUTO: i64 = -3;

/// One device of a manager: its spec (`"dram"`, `"numa:1"`, `"emulated:optane-pmem"`,
/// `"block:/path"`, ...; see the README) and its capacity in bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct TmDevice {
    /// The spec, a NUL-terminated string.
    pub spec: *const c_char,
    /// Capacity in bytes.
    pub bytes: u64,
}

/// A manager (opaque): devices, fastest first, and a placement policy.
pub struct TmManager {
    inner: Arc<Manager>,
    /// Device names as C strings, for [`tm_device_counters`].
    names: Vec<std::ffi::CString>,
}

/// A NUL-terminated C string as UTF-8, or an error naming `what`.
///
/// # Safety
/// `p` must be NULL or a valid NUL-terminated string.
pub(crate) unsafe fn text<'a>(p: *const c_char, what: &str) -> Result<&'a str> {
    if p.is_null() {
        bail!("{what} is NULL");
    }
    // SAFETY: non-null, NUL-terminated by the caller's contract.
    let s = unsafe { CStr::from_ptr(p) };
    s.to_str()
        .map_err(|_| tiermem_core::Error::InvalidArgument(format!("{what} is not UTF-8")))
}

/// The manager behind a handle, or an error.
///
/// # Safety
/// `m` must be NULL or a handle from [`tm_manager_new`] not yet freed.
pub(crate) unsafe fn manager<'a>(m: *const TmManager) -> Result<&'a Manager> {
    // SAFETY: forwarded contract.
    Ok(&unsafe { handle(m) }?.inner)
}

/// The handle behind a pointer, or an error.
///
/// # Safety
/// As [`manager`].
unsafe fn handle<'a>(m: *const TmManager) -> Result<&'a TmManager> {
    if m.is_null() {
        bail!("the manager handle is NULL");
    }
    // SAFETY: a live handle by the caller's contract.
    Ok(unsafe { &*m })
}

/// Write `v` through `out`, or fail if it is NULL.
///
/// # Safety
/// `out` must be NULL or valid for a write of `T`.
pub(crate) unsafe fn put<T>(out: *mut T, v: T, what: &str) -> Result<()> {
    if out.is_null() {
        bail!("{what} is NULL");
    }
    // SAFETY: non-null and writable by the caller's contract.
    unsafe { out.write(v) };
    Ok(())
}

fn place(code: i64) -> Result<Place> {
    Place::from_code(code)
}

/// Make a manager over `n` devices (fastest first) with policy `policy` (`"lru"`,
/// `"lru_in_place"`, `"first_touch"`, `"all_fast"`, `"all_slow"`; NULL: `"lru"`). On
/// success `*out` holds the handle; free it with [`tm_manager_free`].
///
/// # Safety
/// `devices` must point to `n` valid [`TmDevice`]s; `policy` NULL or a NUL-terminated
/// string; `out` valid for a write.
#[no_mangle]
pub unsafe extern "C" fn tm_manager_new(
    devices: *const TmDevice,
    n: usize,
    policy: *const c_char,
    out: *mut *mut TmManager,
) -> TmStatus {
    guard(|| {
        if devices.is_null() || n == 0 {
            bail!("a manager needs at least one device (devices is NULL or n is 0)");
        }
        // SAFETY: `n` devices by the caller's contract.
        let ds = unsafe { std::slice::from_raw_parts(devices, n) };
        let mut specs = Vec::with_capacity(n);
        for (i, d) in ds.iter().enumerate() {
            // SAFETY: each spec is NULL or NUL-terminated by the caller's contract.
            let spec = unsafe { text(d.spec, &format!("devices[{i}].spec")) }?;
            specs.push((spec.to_owned(), d.bytes));
        }
        let name = if policy.is_null() {
            "lru"
        } else {
            // SAFETY: NUL-terminated by the caller's contract.
            unsafe { text(policy, "policy") }?
        };
        let m = Manager::new(device::open_all(&specs)?, policy::builtin(name)?)?;
        let names = m
            .devices()
            .iter()
            .map(|d| std::ffi::CString::new(d.name.replace('\0', " ")).unwrap_or_default())
            .collect();
        let h = Box::into_raw(Box::new(TmManager {
            inner: Arc::new(m),
            names,
        }));
        // SAFETY: writable by the caller's contract.
        unsafe { put(out, h, "out") }.inspect_err(|_| {
            // SAFETY: `h` was made just above and given to no one.
            drop(unsafe { Box::from_raw(h) });
        })
    })
}

/// Free a manager and every object it holds (NULL is ignored). Pointers from `tm_pin` into
/// its objects are dangling afterwards.
///
/// # Safety
/// `m` must be NULL or a handle from [`tm_manager_new`] not yet freed.
#[no_mangle]
pub unsafe extern "C" fn tm_manager_free(m: *mut TmManager) {
    if !m.is_null() {
        // SAFETY: a live handle, freed once, by the caller's contract.
        drop(unsafe { Box::from_raw(m) });
    }
}

/// How many devices `m` has (`*count`).
///
/// # Safety
/// `m` a live handle; `count` valid for a write.
#[no_mangle]
pub unsafe extern "C" fn tm_device_count(m: *const TmManager, count: *mut usize) -> TmStatus {
    // SAFETY: forwarded contracts.
    guard(|| unsafe { put(count, manager(m)?.devices().len(), "count") })
}

/// Allocate `bytes` at `place` (a device index, or `TM_PLACE_FAST`/`SLOW`/`AUTO`); the new
/// object's id in `*id`.
///
/// # Safety
/// `m` a live handle; `id` valid for a write.
#[no_mangle]
pub unsafe extern "C" fn tm_alloc(
    m: *const TmManager,
    bytes: u64,
    place_code: i64,
    id: *mut u64,
) -> TmStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let mgr = unsafe { manager(m) }?;
        let new = mgr.alloc(bytes, place(place_code)?)?;
        // SAFETY: forwarded contract.
        unsafe { put(id, new, "id") }.inspect_err(|_| {
            let _ = mgr.free(new);
        })
    })
}

/// Free object `id` (refused while it is pinned).
///
/// # Safety
/// `m` a live handle.
#[no_mangle]
pub unsafe extern "C" fn tm_free(m: *const TmManager, id: u64) -> TmStatus {
    // SAFETY: forwarded contract.
    guard(|| unsafe { manager(m) }?.free(id))
}

/// Pin object `id` for reading (`write == 0`) or writing: `*addr` is its bytes' address
/// and `*bytes` their length, valid until [`tm_unpin`] with `*ticket`. While pinned, the
/// object is never moved (a loop over it is safe from migration); other pins may be open.
///
/// # Safety
/// `m` a live handle; `addr`, `bytes` and `ticket` valid for writes.
#[no_mangle]
pub unsafe extern "C" fn tm_pin(
    m: *const TmManager,
    id: u64,
    write: i32,
    addr: *mut *mut c_void,
    bytes: *mut usize,
    ticket: *mut u64,
) -> TmStatus {
    guard(|| {
        if addr.is_null() || bytes.is_null() || ticket.is_null() {
            bail!("tm_pin: addr, bytes and ticket must not be NULL");
        }
        // SAFETY: forwarded contract.
        let mgr = unsafe { manager(m) }?;
        let (t, p, len) = mgr.open(id, write != 0)?;
        // SAFETY: all three checked non-null, writable by the caller's contract.
        unsafe {
            addr.write(p.cast());
            bytes.write(len);
            ticket.write(t);
        }
        Ok(())
    })
}

/// Close the pin with this ticket (once).
///
/// # Safety
/// `m` a live handle.
#[no_mangle]
pub unsafe extern "C" fn tm_unpin(m: *const TmManager, ticket: u64) -> TmStatus {
    // SAFETY: forwarded contract.
    guard(|| unsafe { manager(m) }?.close(ticket))
}

/// Move object `id` to the fastest device (`TM_PLACE_FAST`, making room as the policy
/// does) or out of it (`TM_PLACE_SLOW`). Refused while it is pinned.
///
/// # Safety
/// `m` a live handle.
#[no_mangle]
pub unsafe extern "C" fn tm_move(m: *const TmManager, id: u64, place_code: i64) -> TmStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let mgr = unsafe { manager(m) }?;
        match place(place_code)? {
            Place::Fast => mgr.prefetch(id, true),
            Place::Slow => mgr.evict(id),
            other => bail!("tm_move: place {other:?}: give TM_PLACE_FAST or TM_PLACE_SLOW"),
        }
    })
}

/// Charge a loop that ran over pinned objects: `n` triples `(object, bytes read, bytes
/// written)` in `charges` (flattened), written by `threads` threads. The bytes are counted
/// per device and, on an `emulated` device, the time the device would have taken beyond
/// the DRAM the loop ran on is waited out here (loops over pinned memory run at DRAM speed
/// otherwise: emulation charges what it is told).
///
/// # Safety
/// `m` a live handle; `charges` valid for `3 * n` reads.
#[no_mangle]
pub unsafe extern "C" fn tm_charge(
    m: *const TmManager,
    charges: *const u64,
    n: usize,
    threads: usize,
) -> TmStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let mgr = unsafe { manager(m) }?;
        if n == 0 {
            return Ok(());
        }
        if charges.is_null() {
            bail!("tm_charge: charges is NULL");
        }
        // SAFETY: `3 * n` values by the caller's contract.
        let flat = unsafe { std::slice::from_raw_parts(charges, 3 * n) };
        let ops: Vec<(u64, u64, u64)> = flat.chunks_exact(3).map(|c| (c[0], c[1], c[2])).collect();
        mgr.charge(&ops, threads.max(1))
    })
}

/// The index of the device object `id` is on (`*device`; 0 is the fastest).
///
/// # Safety
/// `m` a live handle; `device` valid for a write.
#[no_mangle]
pub unsafe extern "C" fn tm_device_of(
    m: *const TmManager,
    id: u64,
    device: *mut usize,
) -> TmStatus {
    guard(|| {
        // SAFETY: forwarded contracts.
        let d = unsafe { manager(m) }?.placement(id)?.device;
        // SAFETY: forwarded contract.
        unsafe { put(device, d, "device") }
    })
}

/// Device `device`'s counters (`*out`) and its name (`*name`, owned by the manager, valid
/// while it lives; `name` may be NULL).
///
/// # Safety
/// `m` a live handle; `out` valid for a write; `name` NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn tm_device_counters(
    m: *const TmManager,
    device: usize,
    out: *mut CounterSnapshot,
    name: *mut *const c_char,
) -> TmStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let h = unsafe { handle(m) }?;
        let Some(d) = h.inner.devices().get(device) else {
            bail!(
                "no device {device} (the manager has {})",
                h.inner.devices().len()
            );
        };
        if !name.is_null() {
            // SAFETY: non-null and writable by the caller's contract.
            unsafe { name.write(h.names[device].as_ptr()) };
        }
        // SAFETY: forwarded contract.
        unsafe { put(out, d.counters.snapshot(), "out") }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn place_codes_are_the_cores() {
        let ours = [
            ("fast", TM_PLACE_FAST),
            ("slow", TM_PLACE_SLOW),
            ("auto", TM_PLACE_AUTO),
        ];
        assert_eq!(ours, Place::CODES);
    }
}
