//! The one place embedding-table locks are taken, and the lock order they follow.
//!
//! The order is `crate::lock_order`'s: the manager lock before any table lock; table locks
//! in address order, shared or exclusive alike; none taken on a thread of the rayon pool.
//! Kernels that run on the pool only touch tables whose locks their caller holds. Every
//! table lock in the crate is taken through [`shared`] / [`exclusive`] (one table) or
//! [`for_lookup`] / [`exclusive_all`] (several, sorted here).

use parking_lot::{RwLockReadGuard, RwLockWriteGuard};

use super::{Mutable, Table};
use tiermem_core::Result;

use tiermem_core::lock_order::{may_block, may_block_in};

const SHARED: &str = "an embedding table's shared lock";
const EXCLUSIVE: &str = "an embedding table's exclusive lock";

/// One table, shared (lookups, reads of rows and state).
pub(crate) fn shared(t: &Table) -> Result<RwLockReadGuard<'_, Mutable>> {
    may_block_in(SHARED, t.born)?;
    Ok(t.lock.read_recursive())
}

/// One table, exclusive (updates, flushes, fills, writes of rows and state).
pub(crate) fn exclusive(t: &Table) -> Result<RwLockWriteGuard<'_, Mutable>> {
    may_block_in(EXCLUSIVE, t.born)?;
    Ok(t.lock.write())
}

/// Refuse tables a forked child inherited ([`tiermem_core::process::Born`]).
fn born(tables: &[&Table]) -> Result<()> {
    tables.iter().try_for_each(|t| t.born.check(EXCLUSIVE))
}

/// Indices of `tables` in lock (address) order.
fn order(tables: &[&Table]) -> Vec<usize> {
    let mut o: Vec<usize> = (0..tables.len()).collect();
    o.sort_by_key(|&t| std::ptr::from_ref(tables[t]) as usize);
    o
}

/// A lock held by a lookup: shared, or exclusive for a table that stages its rows. Held for
/// its drop, which releases the lock; never read.
#[expect(dead_code, reason = "a guard is held, not read")]
pub(crate) enum Held<'a> {
    /// Shared.
    Shared(RwLockReadGuard<'a, Mutable>),
    /// Exclusive.
    Exclusive(RwLockWriteGuard<'a, Mutable>),
}

/// A lookup's locks, in address order: exclusive on tables whose cache stages rows (the
/// staging and the kernel must not be separated by another call's eviction), shared on
/// the rest. A table named twice is locked once.
pub(crate) fn for_lookup<'a>(tables: &[&'a Table]) -> Result<Vec<Held<'a>>> {
    born(tables)?;
    may_block(EXCLUSIVE)?;
    let o = order(tables);
    let mut out = Vec::with_capacity(o.len());
    for (k, &t) in o.iter().enumerate() {
        if k > 0 && std::ptr::eq(tables[o[k - 1]], tables[t]) {
            continue;
        }
        out.push(if tables[t].staged() {
            Held::Exclusive(tables[t].lock.write())
        } else {
            Held::Shared(tables[t].lock.read_recursive())
        });
    }
    Ok(out)
}

/// Exclusive locks on every table, taken in address order and returned in the caller's
/// order. A table named twice is refused (it would deadlock on itself).
pub(crate) fn exclusive_all<'a>(
    tables: &[&'a Table],
) -> Result<Vec<RwLockWriteGuard<'a, Mutable>>> {
    born(tables)?;
    may_block(EXCLUSIVE)?;
    let o = order(tables);
    for w in o.windows(2) {
        tiermem_core::ensure!(
            !std::ptr::eq(tables[w[0]], tables[w[1]]),
            "table {} and table {} are the same table: update each table once per call",
            w[0].min(w[1]),
            w[0].max(w[1])
        );
    }
    let mut got: Vec<(usize, RwLockWriteGuard<'a, Mutable>)> =
        o.iter().map(|&t| (t, tables[t].lock.write())).collect();
    got.sort_by_key(|g| g.0);
    Ok(got.into_iter().map(|g| g.1).collect())
}
