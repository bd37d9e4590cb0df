//! An in-place radix-2 complex FFT (forward, unnormalised) over `n = 2^k` interleaved
//! `(re, im)` `f64` pairs: a bit-reversal permutation, then `k` butterfly stages, each
//! split over the threads by blocks (or, for the last stages, within a block).

use rayon::prelude::*;

use super::traffic::{Stream, Traffic};
use super::{charge, threads, view_mut, Kernel, Operand};
use tiermem_core::manager::Manager;
use tiermem_core::mechanism::ObjectId;
use tiermem_core::Result;

/// An FFT of one array of `n` complex numbers.
#[derive(Debug, Clone)]
pub struct Fft {
    /// The data, `2 n` `f64`s.
    pub data: ObjectId,
    /// Points, a power of two of at least 2.
    pub n: u64,
}

impl Fft {
    /// # Errors
    /// When `n` is not a power of two of at least 2.
    pub fn new(data: ObjectId, n: u64) -> Result<Self> {
        tiermem_core::ensure!(
            n >= 2 && n.is_power_of_two(),
            "FFT: the length ({n}) must be a power of two of at least 2"
        );
        Ok(Fft { data, n })
    }

    fn bits(&self) -> u32 {
        self.n.trailing_zeros()
    }

    fn reverse(&self, i: u64) -> u64 {
        i.reverse_bits() >> (64 - self.bits())
    }
}

fn butterflies(
    lo: &mut [[f64; 2]],
    hi: &mut [[f64; 2]],
    tw: &[[f64; 2]],
    step: usize,
    first: usize,
) {
    for (j, (a, b)) in lo.iter_mut().zip(hi.iter_mut()).enumerate() {
        let w = tw[(first + j) * step];
        let t = [w[0] * b[0] - w[1] * b[1], w[0] * b[1] + w[1] * b[0]];
        *b = [a[0] - t[0], a[1] - t[1]];
        *a = [a[0] + t[0], a[1] + t[1]];
    }
}

impl Kernel for Fft {
    fn name(&self) -> String {
        "FFT".into()
    }

    fn operands(&self) -> Vec<Operand> {
        vec![Operand::new(self.data, "data", 16, self.n, true, true)]
    }

    fn target(&self) -> (usize, f64) {
        (0, f64::from(self.bits()) + 1.0)
    }

    fn sample(
        &self,
        _m: &Manager,
        _op: usize,
        t: usize,
        threads: usize,
        n: usize,
    ) -> Result<Vec<u64>> {
        let (lo, hi) = super::share(self.n as usize, t, threads);
        Ok((lo as u64..(hi as u64).min(lo as u64 + n as u64))
            .map(|i| self.reverse(i) * 16)
            .collect())
    }

    fn run(&self, m: &Manager) -> Result<()> {
        let mut g = m.write(self.data)?;
        let flat = view_mut::<f64>("FFT data", g.as_mut_slice(), 2 * self.n)?;
        let (pairs, _) = flat.as_chunks_mut::<2>();
        let n = self.n as usize;
        let mut perm = Stream::default();
        for i in 0..n {
            let j = self.reverse(i as u64) as usize;
            perm.touch(j as u64 * 16, true);
            if i < j {
                pairs.swap(i, j);
            }
        }
        let tw: Vec<[f64; 2]> = (0..n / 2)
            .map(|j| {
                let a = -2.0 * std::f64::consts::PI * j as f64 / n as f64;
                [a.cos(), a.sin()]
            })
            .collect();
        let th = threads();
        let mut h = 1;
        while h < n {
            let step = n / (2 * h);
            if n / (2 * h) >= th {
                pairs.par_chunks_mut(2 * h).for_each(|blk| {
                    let (lo, hi) = blk.split_at_mut(h);
                    butterflies(lo, hi, &tw, step, 0);
                });
            } else {
                let per = h.div_ceil(th);
                for blk in pairs.chunks_mut(2 * h) {
                    let (lo, hi) = blk.split_at_mut(h);
                    lo.par_chunks_mut(per)
                        .zip(hi.par_chunks_mut(per))
                        .enumerate()
                        .for_each(|(k, (a, b))| butterflies(a, b, &tw, step, k * per));
                }
            }
            h *= 2;
        }
        let stages = Traffic::sequential(self.n * 16, true, true).times(u64::from(self.bits()));
        charge(m, &[(self.data, perm.traffic.plus(stages))])
    }
}
