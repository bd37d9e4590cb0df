//! The sparse matrix-vector product of CG, `y = A x` with `A` in CRS (`rowptr` `u64`,
//! `cols` `u32`, `vals` `f64`), `reps` times per run. Rows are split over the threads;
//! `x` is gathered through the column indices, so its traffic is counted by running each
//! thread's indices through the prefetcher model ([`Stream`]).

use rayon::prelude::*;

use super::traffic::{Stream, Traffic};
use super::{charge, share, threads, view, view_mut, Kernel, Operand};
use crate::manager::Manager;
use crate::mechanism::ObjectId;
use crate::Result;

/// SpMV over a CRS matrix.
#[derive(Debug, Clone)]
pub struct Spmv {
    /// `rows + 1` row starts (`u64`).
    pub rowptr: ObjectId,
    /// `nnz` column indices (`u32`).
    pub cols: ObjectId,
    /// `nnz` values (`f64`).
    pub vals: ObjectId,
    /// `ncols` source entries (`f64`).
    pub x: ObjectId,
    /// `rows` results (`f64`).
    pub y: ObjectId,
    /// Rows.
    pub rows: u64,
    /// Columns.
    pub ncols: u64,
    /// Stored entries.
    pub nnz: u64,
    /// Products per run.
    pub reps: u64,
}

impl Spmv {
    fn check_structure(rowptr: &[u64], cols: &[u32], ncols: u64) -> Result<()> {
        crate::ensure!(
            rowptr.first() == Some(&0)
                && rowptr.windows(2).all(|w| w[0] <= w[1])
                && rowptr.last() == Some(&(cols.len() as u64)),
            "SpMV: rowptr must start at 0, never decrease and end at nnz ({})",
            cols.len()
        );
        if let Some(k) = cols.iter().position(|&c| u64::from(c) >= ncols) {
            crate::bail!(
                "SpMV: column index {} at entry {k} is outside the {ncols} columns",
                cols[k]
            );
        }
        Ok(())
    }
}

impl Kernel for Spmv {
    fn name(&self) -> String {
        "SpMV".into()
    }

    fn operands(&self) -> Vec<Operand> {
        let op = |id, name, elem, len, read, write| Operand {
            id,
            name,
            elem,
            len,
            read,
            write,
        };
        vec![
            op(self.x, "x", 8, self.ncols, true, false),
            op(self.rowptr, "rowptr", 8, self.rows + 1, true, false),
            op(self.cols, "cols", 4, self.nnz, true, false),
            op(self.vals, "vals", 8, self.nnz, true, false),
            op(self.y, "y", 8, self.rows, false, true),
        ]
    }

    fn target(&self) -> (usize, f64) {
        (0, (self.nnz * self.reps) as f64 / self.ncols as f64)
    }

    fn sample(
        &self,
        m: &Manager,
        op: usize,
        t: usize,
        threads: usize,
        n: usize,
    ) -> Result<Vec<u64>> {
        let gp = m.read(self.rowptr)?;
        let rowptr = view::<u64>("SpMV rowptr", gp.as_slice(), self.rows + 1)?;
        let (lo, _) = share(self.rows as usize, t, threads);
        let start = rowptr[lo] as usize;
        let end = (start + n).min(self.nnz as usize);
        Ok(match op {
            0 => {
                let gc = m.read(self.cols)?;
                let cols = view::<u32>("SpMV cols", gc.as_slice(), self.nnz)?;
                cols[start..end].iter().map(|&c| u64::from(c) * 8).collect()
            }
            2 => (start..end).map(|k| k as u64 * 4).collect(),
            3 => (start..end).map(|k| k as u64 * 8).collect(),
            _ => (lo..(lo + n).min(self.rows as usize))
                .map(|r| r as u64 * 8)
                .collect(),
        })
    }

    fn run(&self, m: &Manager) -> Result<()> {
        let gp = m.read(self.rowptr)?;
        let gc = m.read(self.cols)?;
        let gv = m.read(self.vals)?;
        let gx = m.read(self.x)?;
        let mut gy = m.write(self.y)?;
        let rowptr = view::<u64>("SpMV rowptr", gp.as_slice(), self.rows + 1)?;
        let cols = view::<u32>("SpMV cols", gc.as_slice(), self.nnz)?;
        let vals = view::<f64>("SpMV vals", gv.as_slice(), self.nnz)?;
        let x = view::<f64>("SpMV x", gx.as_slice(), self.ncols)?;
        let y = view_mut::<f64>("SpMV y", gy.as_mut_slice(), self.rows)?;
        Self::check_structure(rowptr, cols, self.ncols)?;
        let per = (self.rows as usize).div_ceil(threads()).max(1);
        let mut gathered = Traffic::default();
        for rep in 0..self.reps {
            let counted: Vec<Traffic> = y
                .par_chunks_mut(per)
                .enumerate()
                .map(|(k, ys)| {
                    let mut s = Stream::default();
                    for (r, out) in ys.iter_mut().enumerate() {
                        let row = k * per + r;
                        let (a, b) = (rowptr[row] as usize, rowptr[row + 1] as usize);
                        let mut acc = 0.0;
                        for e in a..b {
                            let c = cols[e] as usize;
                            if rep == 0 {
                                s.touch(c as u64 * 8, false);
                            }
                            acc += vals[e] * x[c];
                        }
                        *out = acc;
                    }
                    s.traffic
                })
                .collect();
            if rep == 0 {
                gathered = counted.into_iter().fold(Traffic::default(), Traffic::plus);
            }
        }
        let (n, r) = (self.nnz, self.reps);
        charge(
            m,
            &[
                (self.x, gathered.times(r)),
                (
                    self.rowptr,
                    Traffic::sequential((self.rows + 1) * 8, true, false).times(r),
                ),
                (self.cols, Traffic::sequential(n * 4, true, false).times(r)),
                (self.vals, Traffic::sequential(n * 8, true, false).times(r)),
                (
                    self.y,
                    Traffic::sequential(self.rows * 8, false, true).times(r),
                ),
            ],
        )
    }
}
