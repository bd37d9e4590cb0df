//! Unblocked DGEMM, `c += a b` for `n x n` row-major `f64` matrices in the `i, j, k` order
//! (a dot product of a row of `a` and a column of `b` per entry), rows of `c` split over the
//! threads: the H2M slides' multi-buffer application, with no blocking, so `b` is streamed
//! once per row of `c`.

use super::traffic::{Traffic, LINE, PAGE};
use super::{matrix_rows, share, Kernel, Operand};
use tiermem_core::manager::Manager;
use tiermem_core::mechanism::ObjectId;
use tiermem_core::Result;

/// One DGEMM.
#[derive(Debug, Clone)]
pub struct Dgemm {
    /// Left factor.
    pub a: ObjectId,
    /// Right factor (read down its columns).
    pub b: ObjectId,
    /// Accumulator.
    pub c: ObjectId,
    /// The order.
    pub n: u64,
}

impl Dgemm {
    /// `b`'s traffic: a column walk at a row's stride whose lines stay cached for the next
    /// seven columns, so `b` streams once per row of `c`; each line a miss once the stride
    /// reaches a page.
    fn column_walks(n: u64) -> Traffic {
        let lines = (n * n * 8).div_ceil(LINE) * n;
        Traffic {
            read_bytes: lines * LINE,
            write_bytes: 0,
            misses: if n * 8 >= PAGE { lines } else { 0 },
        }
    }
}

impl Kernel for Dgemm {
    fn name(&self) -> String {
        "DGEMM".into()
    }

    fn operands(&self) -> Vec<Operand> {
        let nn = self.n * self.n;
        vec![
            Operand::new(self.a, "a", 8, nn, true, false),
            Operand::new(self.b, "b", 8, nn, true, false),
            Operand::new(self.c, "c", 8, nn, true, true),
        ]
    }

    fn target(&self) -> (usize, f64) {
        (1, self.n as f64)
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
        let (i, _) = share(order, t, threads);
        Ok((0..n.min(order * order))
            .map(|q| {
                let (j, k) = (q / order, q % order);
                let at = match op {
                    0 => i * order + k,
                    1 => k * order + j,
                    _ => i * order + j,
                };
                (at * 8) as u64
            })
            .collect())
    }

    fn run(&self, m: &Manager) -> Result<()> {
        let bytes = self.n * self.n * 8;
        let n = self.n as usize;
        let traffic = [
            Traffic::sequential(bytes, true, false),
            Self::column_walks(self.n),
            Traffic::sequential(bytes, true, true),
        ];
        matrix_rows(
            m,
            "DGEMM",
            [self.a, self.b, self.c],
            self.n,
            traffic,
            |i, crow, a, b| {
                let arow = &a[i * n..][..n];
                for (j, x) in crow.iter_mut().enumerate() {
                    let mut acc = 0.0;
                    for (k, &av) in arow.iter().enumerate() {
                        acc += av * b[k * n + j];
                    }
                    *x += acc;
                }
            },
        )
    }
}
