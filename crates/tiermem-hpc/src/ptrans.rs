//! HPCC PTRANS on one node: `c = a^T + b` for `n x n` row-major `f64` matrices, rows of `c`
//! split over the threads. `a` is read down its columns (a stride of a row), `b` and `c`
//! in order.

use super::traffic::Traffic;
use super::{matrix_rows, Kernel, Operand};
use tiermem_core::manager::Manager;
use tiermem_core::mechanism::ObjectId;
use tiermem_core::Result;

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
        let nn = self.n * self.n;
        vec![
            Operand::new(self.a, "a", 8, nn, true, false),
            Operand::new(self.b, "b", 8, nn, true, false),
            Operand::new(self.c, "c", 8, nn, false, true),
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
        let n = self.n as usize;
        let traffic = [
            Traffic::strided(nn, self.n * 8, 8, true, false),
            Traffic::sequential(nn * 8, true, false),
            Traffic::sequential(nn * 8, false, true),
        ];
        matrix_rows(
            m,
            "PTRANS",
            [self.a, self.b, self.c],
            self.n,
            traffic,
            |i, row, a, b| {
                for (j, x) in row.iter_mut().enumerate() {
                    *x = a[j * n + i] + b[i * n + j];
                }
            },
        )
    }
}
