//! HPCC PTRANS on one node: `c = a^T + b` for `n x n` row-major `f64` matrices, rows of `c`
//! split over the threads. `a` is read down its columns (a stride of a row), `b` and `c`
//! in order.

use rayon::prelude::*;

use super::traffic::Traffic;
use super::{charge, threads, view, view_mut, Kernel, Operand};
use crate::manager::Manager;
use crate::mechanism::ObjectId;
use crate::Result;

/// PTRANS over three `n x n` matrices.
#[derive(Debug, Clone)]
pub struct Ptrans {
    /// The transposed input.
    pub a: ObjectId,
    /// The added input.
    pub b: ObjectId,
    /// The output.
    pub c: ObjectId,
    /// The order.
    pub n: u64,
}

impl Kernel for Ptrans {
    fn name(&self) -> String {
        "PTRANS".into()
    }

    fn operands(&self) -> Vec<Operand> {
        let op = |id, name, read, write| Operand {
            id,
            name,
            elem: 8,
            len: self.n * self.n,
            read,
            write,
        };
        vec![
            op(self.a, "a", true, false),
            op(self.b, "b", true, false),
            op(self.c, "c", false, true),
        ]
    }

    fn target(&self) -> (usize, f64) {
        (0, 1.0)
    }

    fn sample(
        &self,
        _m: &Manager,
        op: usize,
        t: usize,
        threads: usize,
        n: usize,
    ) -> Result<Vec<u64>> {
        let order = self.n as usize;
        let (lo, _) = super::share(order, t, threads);
        Ok((0..n.min(order * order))
            .map(|k| {
                let (i, j) = (lo + k / order, k % order);
                let at = if op == 0 {
                    j * order + i
                } else {
                    i * order + j
                };
                (at * 8) as u64
            })
            .collect())
    }

    fn run(&self, m: &Manager) -> Result<()> {
        let nn = self.n * self.n;
        let ga = m.read(self.a)?;
        let gb = m.read(self.b)?;
        let mut gc = m.write(self.c)?;
        let a = view::<f64>("PTRANS a", ga.as_slice(), nn)?;
        let b = view::<f64>("PTRANS b", gb.as_slice(), nn)?;
        let c = view_mut::<f64>("PTRANS c", gc.as_mut_slice(), nn)?;
        let n = self.n as usize;
        let rows = n.div_ceil(threads()).max(1);
        c.par_chunks_mut(rows * n)
            .enumerate()
            .for_each(|(k, block)| {
                for (r, row) in block.chunks_mut(n).enumerate() {
                    let i = k * rows + r;
                    for (j, x) in row.iter_mut().enumerate() {
                        *x = a[j * n + i] + b[i * n + j];
                    }
                }
            });
        let bytes = nn * 8;
        charge(
            m,
            &[
                (self.a, Traffic::strided(nn, self.n * 8, 8, true, false)),
                (self.b, Traffic::sequential(bytes, true, false)),
                (self.c, Traffic::sequential(bytes, false, true)),
            ],
        )
    }
}
