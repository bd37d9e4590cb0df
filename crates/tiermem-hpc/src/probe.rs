//! The three calibration patterns of the break-even line (Arima & Schulz eq. 7): touch
//! every element of a `u64` array once — in order, at a stride longer than a page, or in a
//! random order — reading, writing, or both.

use rayon::prelude::*;

use super::traffic::Stream;
use super::{charge, share, threads, view_mut, Kernel, Operand};
use tiermem_core::manager::Manager;
use tiermem_core::mechanism::ObjectId;
use tiermem_core::Result;

/// Which order a probe touches its elements in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// Random (`R_sf ~ 0`, `R_paf ~ 0`).
    Random,
    /// A stride of just over a page (`R_sf ~ 1`, `R_paf ~ 0`).
    Strided,
    /// In order (`R_sf ~ 1`, `R_paf ~ 1`).
    Sequential,
}

/// Elements between strided touches: odd, so it visits every element of a power-of-two
/// array, and over a page.
pub const STRIDE: u64 = 513;

/// A probe over a power-of-two `u64` array.
#[derive(Debug, Clone)]
pub struct Probe {
    /// The array.
    pub data: ObjectId,
    /// Elements (a power of two of at least 2^12).
    pub len: u64,
    /// The order.
    pub order: Order,
    /// Whether it reads.
    pub read: bool,
    /// Whether it writes.
    pub write: bool,
}

impl Probe {
    /// # Errors
    /// For a length that is not a power of two of at least 2^12, or a probe that neither
    /// reads nor writes.
    pub fn new(data: ObjectId, len: u64, order: Order, read: bool, write: bool) -> Result<Self> {
        tiermem_core::ensure!(
            len.is_power_of_two() && len >= 1 << 12 && (read || write),
            "probe: the length ({len}) must be a power of two of at least 4096, and a probe \
             must read or write"
        );
        Ok(Probe {
            data,
            len,
            order,
            read,
            write,
        })
    }

    /// The element touched `i`-th.
    #[must_use]
    pub fn at(&self, i: u64) -> u64 {
        let mask = self.len - 1;
        match self.order {
            Order::Sequential => i,
            Order::Strided => i.wrapping_mul(STRIDE) & mask,
            Order::Random => {
                // Multiplying by an odd number and xor-shifting right are both bijections
                // of [0, len).
                let half = self.len.trailing_zeros() / 2 + 1;
                let x = i.wrapping_mul(0x9e37_79b9_7f4a_7c15) & mask;
                (x ^ (x >> half)).wrapping_mul(0xbf58_476d_1ce4_e5b9) & mask
            }
        }
    }
}

impl Kernel for Probe {
    fn name(&self) -> String {
        format!("probe {:?}", self.order).to_lowercase()
    }

    fn operands(&self) -> Vec<Operand> {
        vec![Operand::new(
            self.data, "data", 8, self.len, self.read, self.write,
        )]
    }

    fn target(&self) -> (usize, f64) {
        (0, 1.0)
    }

    fn sample(
        &self,
        _m: &Manager,
        _op: usize,
        t: usize,
        threads: usize,
        n: usize,
    ) -> Result<Vec<u64>> {
        let (lo, hi) = share(self.len as usize, t, threads);
        Ok((lo as u64..(hi as u64).min((lo + n) as u64))
            .map(|i| self.at(i) * 8)
            .collect())
    }

    fn run(&self, m: &Manager) -> Result<()> {
        let mut g = m.write(self.data)?;
        let cells = view_mut::<u64>("probe data", g.as_mut_slice(), self.len)?;
        let base = cells.as_mut_ptr() as usize;
        let th = threads();
        let traffic = (0..th)
            .into_par_iter()
            .map(|t| {
                let (lo, hi) = share(self.len as usize, t, th);
                let mut s = Stream::default();
                let mut acc = 0u64;
                for i in lo as u64..hi as u64 {
                    let k = self.at(i);
                    s.touch(k * 8, self.write);
                    // SAFETY: `k < len` (`at` is a bijection of [0, len)), and the threads'
                    // shares of `i` map to disjoint elements, so no element is touched by
                    // two threads; the write guard holds the bytes for the whole loop.
                    let p = unsafe { (base as *mut u64).add(k as usize) };
                    // SAFETY: as above.
                    unsafe {
                        match (self.read, self.write) {
                            (true, false) => acc = acc.wrapping_add(p.read()),
                            (false, true) => p.write(i),
                            _ => p.write(p.read().wrapping_add(1)),
                        }
                    }
                }
                std::hint::black_box(acc);
                s.traffic
            })
            .reduce(Default::default, super::traffic::Traffic::plus);
        let traffic = if self.read {
            traffic
        } else {
            super::traffic::Traffic {
                read_bytes: 0,
                misses: 0,
                ..traffic
            }
        };
        charge(m, &[(self.data, traffic)])
    }
}
