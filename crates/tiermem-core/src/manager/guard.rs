//! Borrow guards: data is reached only while one is alive, and a guarded object is pinned
//! (never moved, evicted or freed), so the torn write of thesis Listing 6.1 cannot happen.

use super::{GuardTicket, Manager};

/// Shared access to an object's bytes.
pub struct ReadGuard<'a> {
    mgr: &'a Manager,
    ticket: GuardTicket,
    ptr: *const u8,
    len: usize,
}

/// Exclusive access to an object's bytes.
pub struct WriteGuard<'a> {
    mgr: &'a Manager,
    ticket: GuardTicket,
    ptr: *mut u8,
    len: usize,
}

impl<'a> ReadGuard<'a> {
    pub(super) fn new(mgr: &'a Manager, ticket: GuardTicket, ptr: *mut u8, len: usize) -> Self {
        ReadGuard {
            mgr,
            ticket,
            ptr,
            len,
        }
    }

    /// The bytes.
    #[must_use]
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the object is pinned while the guard lives, so its primary region stays at
        // `ptr` with `len` initialised bytes; no write guard can coexist with this one.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl<'a> WriteGuard<'a> {
    pub(super) fn new(mgr: &'a Manager, ticket: GuardTicket, ptr: *mut u8, len: usize) -> Self {
        WriteGuard {
            mgr,
            ticket,
            ptr,
            len,
        }
    }

    /// The bytes, writable.
    #[must_use]
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: pinned as for ReadGuard, and this is the only guard on the object, so the
        // bytes are not aliased.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for ReadGuard<'_> {
    fn drop(&mut self) {
        let _ = self.mgr.close(self.ticket);
    }
}

impl Drop for WriteGuard<'_> {
    fn drop(&mut self) {
        let _ = self.mgr.close(self.ticket);
    }
}
