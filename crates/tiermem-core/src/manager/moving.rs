//! Write-back with the copy outside the manager lock: the *moving* state.
//!
//! [`Manager::writeback`] (write-behind: a copy thread cleaning dirty objects ahead of their
//! eviction) takes the lock twice, and copies in between with no lock held, so guards and
//! every other manager call go on during the copy. While it copies the object is *moving*:
//! held (`writeback_begin`), so it is not moved, evicted or freed; guards open on it as
//! usual, readers and writers alike. The copy reads the primary, which stays where it is, and
//! writes a slower sibling that nothing reads while the primary is dirty. At the end
//! (`writeback_end`) the primary is marked clean only if no write guard opened meanwhile
//! (the object's write count is unchanged) and none is open; otherwise the copy may be torn
//! and is simply not used (the primary stays dirty; the next eviction copies). A free of
//! the object during the copy is recorded and done when the copy ends.

use super::Manager;
use crate::mechanism::{writeback_begin, writeback_end, ObjectId};
use crate::Result;

impl Manager {
    /// Write a dirty object to a slower sibling now, leaving it where it is (see
    /// [`crate::mechanism::writeback_object`]), with the copy outside the manager lock (see
    /// the module). Returns whether the object is clean because of it: `false` when there
    /// was nothing to do (clean, slowest device, a write guard open, no room, a write-back of
    /// it already running) or a write guard opened during the copy.
    pub fn writeback(&self, id: ObjectId) -> Result<bool> {
        let begun = self.with_inner(|i| {
            if i.moving.contains_key(&id) {
                return Ok(None);
            }
            let Some(w) = writeback_begin(&mut i.data, id)? else {
                return Ok(None);
            };
            i.moving.insert(id, false);
            let (x, y) = (i.data.region(w.x)?, i.data.region(w.y)?);
            let span = (
                x.device,
                x.offset,
                y.device,
                y.offset,
                i.data.object(id)?.len,
            );
            Ok(Some((w, span, i.data.copy_engine().clone())))
        })?;
        let Some((w, (sd, so, dd, doff, len), engine)) = begun else {
            return Ok(false);
        };
        // No lock held: the source is the held primary (guards may read or write it; a write
        // makes the copy unused), the destination a sibling only this call writes.
        let copied = engine.copy(&self.devices[sd], so, &self.devices[dd], doff, len);
        self.with_inner(|i| {
            let freed = i.moving.remove(&id).unwrap_or(false);
            let clean = writeback_end(&mut i.data, &w, copied.is_ok());
            if freed {
                i.policy.unsafe_free(&mut i.data, id)?;
            }
            copied.and(clean)
        })
    }
}
