//! HPCC RandomAccess (GUPS): `updates` read-modify-writes `table[ran & (len - 1)] ^= ran` at
//! the positions of HPCC's polynomial random stream, cut as HPCC's reference loop cuts it
//! into [`STREAMS`] streams advanced in turn (consecutive updates come from different
//! streams; HPCC starts stream `j` at step `j * updates / 128`, whose values are sparse
//! polynomials, so each stream's first few dozen positions are correlated and a sample of
//! them finds more page reuse than a uniform stream would). Each thread advances its share of the streams; updates are atomic XORs, so the
//! result does not depend on the thread count or the schedule.

use std::sync::atomic::{AtomicU64, Ordering};

use rayon::prelude::*;

use super::traffic::{Traffic, LINE};
use super::{charge, share, threads, view_mut, Kernel, Operand};
use tiermem_core::manager::Manager;
use tiermem_core::mechanism::ObjectId;
use tiermem_core::Result;

const POLY: u64 = 7;
/// Streams the update sequence is cut into (HPCC's 128).
pub const STREAMS: u64 = 128;
const PERIOD: i64 = 1_317_624_576_693_539_401;

/// The stream's next value after `x`.
#[inline]
#[must_use]
pub fn next(x: u64) -> u64 {
    (x << 1) ^ if (x as i64) < 0 { POLY } else { 0 }
}

/// The stream's value before its `n`-th step (HPCC's `HPCC_starts`).
#[must_use]
pub fn starts(n: i64) -> u64 {
    let n = n.rem_euclid(PERIOD);
    if n == 0 {
        return 1;
    }
    let mut m2 = [0u64; 64];
    let mut temp = 1u64;
    for m in &mut m2 {
        *m = temp;
        temp = next(next(temp));
    }
    let mut i = 62;
    while i > 0 && (n >> i) & 1 == 0 {
        i -= 1;
    }
    let mut ran = 2u64;
    while i > 0 {
        let mut t = 0;
        for (j, m) in m2.iter().enumerate() {
            if (ran >> j) & 1 == 1 {
                t ^= m;
            }
        }
        ran = t;
        i -= 1;
        if (n >> i) & 1 == 1 {
            ran = next(ran);
        }
    }
    ran
}

/// RandomAccess over a `u64` table of a power-of-two length.
#[derive(Debug, Clone)]
pub struct RandomAccess {
    /// The table.
    pub table: ObjectId,
    /// Its length (a power of two).
    pub len: u64,
    /// Updates per run (HPCC: four times the length).
    pub updates: u64,
    /// Each stream's first value.
    starts: Vec<u64>,
}

impl RandomAccess {
    /// # Errors
    /// When the length is not a power of two.
    pub fn new(table: ObjectId, len: u64, updates: u64) -> Result<Self> {
        tiermem_core::ensure!(
            len.is_power_of_two() && updates.is_multiple_of(STREAMS),
            "RandomAccess: the table length ({len}) must be a power of two and the updates \
             ({updates}) a multiple of {STREAMS}"
        );
        let per = updates / STREAMS;
        let starts = (0..STREAMS).map(|j| starts((per * j) as i64)).collect();
        Ok(RandomAccess {
            table,
            len,
            updates,
            starts,
        })
    }

    /// Thread `t`'s updates in order: its streams advanced in turn; `f` returns false to
    /// stop.
    fn walk(&self, t: usize, threads: usize, mut f: impl FnMut(u64) -> bool) {
        let (lo, hi) = share(STREAMS as usize, t, threads);
        let per = self.updates / STREAMS;
        let mut ran = self.starts[lo..hi].to_vec();
        for _ in 0..per {
            for r in &mut ran {
                *r = next(*r);
                if !f(*r) {
                    return;
                }
            }
        }
    }
}

impl Kernel for RandomAccess {
    fn name(&self) -> String {
        "RandomAccess".into()
    }

    fn operands(&self) -> Vec<Operand> {
        vec![Operand::new(self.table, "table", 8, self.len, true, true)]
    }

    fn target(&self) -> (usize, f64) {
        (0, self.updates as f64 / self.len as f64)
    }

    fn sample(
        &self,
        _m: &Manager,
        _op: usize,
        t: usize,
        threads: usize,
        n: usize,
    ) -> Result<Vec<u64>> {
        let mut out = Vec::with_capacity(n);
        self.walk(t, threads, |ran| {
            out.push((ran & (self.len - 1)) * 8);
            out.len() < n
        });
        Ok(out)
    }

    fn run(&self, m: &Manager) -> Result<()> {
        let mut g = m.write(self.table)?;
        let table = view_mut::<u64>("RandomAccess table", g.as_mut_slice(), self.len)?;
        // SAFETY: AtomicU64 has the size and alignment of u64, and the exclusive borrow of
        // `table` is held for as long as the atomic view lives.
        let cells: &[AtomicU64] =
            unsafe { &*(std::ptr::from_mut::<[u64]>(table) as *const [AtomicU64]) };
        let n = threads();
        let mask = self.len - 1;
        (0..n).into_par_iter().for_each(|t| {
            self.walk(t, n, |ran| {
                cells[(ran & mask) as usize].fetch_xor(ran, Ordering::Relaxed);
                true
            });
        });
        // Every update reads and writes one line no prefetcher predicts.
        let u = self.updates;
        let tr = Traffic {
            read_bytes: u * LINE,
            write_bytes: u * LINE,
            misses: u,
        };
        charge(m, &[(self.table, tr)])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_jumps_along_the_stream() {
        let mut x = 1u64;
        for n in 0..200 {
            assert_eq!(starts(n), x, "step {n}");
            x = next(x);
        }
    }
}
