//! Reservations: bytes a structure owns for its lifetime (an embedding table's rows, a cache
//! model's DRAM), allocated on one device and held in place (never moved, evicted or freed
//! by a policy) until dropped.

use std::sync::Arc;

use super::{GuardTicket, Manager};
use crate::mechanism::ObjectId;
use crate::model::TwoLm;
use crate::{ensure, Error, Result};

/// Memory for a table: one manager object, held in place (`Manager::hold_in_place`) so
/// nothing moves or frees it while the table lives.
pub struct Reservation {
    manager: Arc<Manager>,
    id: ObjectId,
    ticket: GuardTicket,
    /// Address of the reserved bytes.
    pub ptr: *mut u8,
    /// Their length.
    pub len: usize,
    /// The device they are on.
    pub device: usize,
}

// SAFETY: the pointer is to manager memory pinned for this value's lifetime; access to the
// bytes is governed by the owning table's lock.
unsafe impl Send for Reservation {}
// SAFETY: as above.
unsafe impl Sync for Reservation {}

impl Reservation {
    /// Reserve `bytes` on device `device` of `manager` (a byte-addressable one), held in
    /// place until dropped.
    pub fn new(manager: &Arc<Manager>, device: usize, bytes: u64) -> Result<Self> {
        let dev = manager.devices().get(device).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "device index {device} out of range: the manager has {} devices",
                manager.devices().len()
            ))
        })?;
        ensure!(
            dev.byte_addressable(),
            "a reservation needs a byte-addressable device, and '{}' is a block device",
            dev.name
        );
        ensure!(
            bytes <= dev.capacity,
            "{bytes} bytes do not fit device '{}' ({} bytes capacity)",
            dev.name,
            dev.capacity
        );
        let id = manager.alloc(bytes.max(1), crate::mechanism::Place::Device(device))?;
        match manager.hold_in_place(id) {
            Ok((ticket, d, Some(ptr))) if d == device => Ok(Reservation {
                manager: manager.clone(),
                id,
                ticket,
                ptr,
                len: bytes as usize,
                device,
            }),
            other => {
                if let Ok((ticket, ..)) = other {
                    let _ = manager.close(ticket);
                }
                let _ = manager.free(id);
                other?;
                Err(Error::Policy {
                    policy: manager.policy_name().to_owned(),
                    message: format!(
                        "asked to place {bytes} bytes on '{}' but put them elsewhere",
                        manager.devices()[device].name
                    ),
                })
            }
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let _ = self.manager.close(self.ticket);
        let _ = self.manager.free(self.id);
    }
}

/// A 2LM model with `cache_bytes` of manager device `fast` as its cache (reserved there, so
/// it shows in the manager's usage as the hardware's DRAM would be taken) in front of device
/// `slow`, with `line`-byte lines. Keep the reservation as long as the model.
pub fn reserve_model(
    manager: &Arc<Manager>,
    slow: usize,
    fast: usize,
    cache_bytes: u64,
    line: usize,
) -> Result<(TwoLm, Reservation)> {
    let devs = manager.devices();
    let n = devs.len();
    ensure!(
        slow < n && fast < n && slow != fast,
        "a 2LM model needs two different devices below {n}, got fast {fast} and slow {slow}"
    );
    let model = TwoLm::over(
        (devs[slow].clone(), slow),
        (devs[fast].clone(), fast),
        cache_bytes,
        line,
    )?;
    let cache = Reservation::new(manager, fast, model.cache_bytes())?;
    Ok((model, cache))
}
