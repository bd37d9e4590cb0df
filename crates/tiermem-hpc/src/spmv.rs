//! The sparse matrix-vector product of CG, `y = A x` with `A` in CRS (`rowptr` `u64`,
//! `cols` `u32`, `vals` `f64`), `reps` times per run. Rows are split over the threads;
//! `x` is gathered through the column indices, so its traffic is counted by running each
//! thread's indices through the prefetcher model ([`Stream`]).

use rayon::prelude::*;

use super::traffic::{Stream, Traffic};
use super::{charge, share, threads, view, view_mut, Kernel, Operand};
use tiermem_core::manager::Manager;
use tiermem_core::mechanism::ObjectId;
use tiermem_core::Result;

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
        tiermem_core::ensure!(
            rowptr.first() == Some(&0)
                && rowptr.windows(2).all(|w| w[0] <= w[1])
                && rowptr.last() == Some(&(cols.len() as u64)),
            "SpMV: rowptr must start at 0, never decrease and end at nnz ({})",
            cols.len()
        );
        if let Some(k) = cols.iter().position(|&c| u64::from(c) >= ncols) {
            tiermem_core::bail!(
                "SpMV: column index {} at entry {k} is outside the {ncols} columns",
                cols[k]
            );
        }
        Ok(())
    }
}

/// One `y = A x`, rows split over the threads; with `COUNT`, also the traffic of `x`'s
/// gather through each thread's [`Stream`] (zero without: every product gathers alike).
fn product<const COUNT: bool>(
    rowptr: &[u64],
    cols: &[u32],
    vals: &[f64],
    x: &[f64],
    y: &mut [f64],
) -> Traffic {
    let per = y.len().div_ceil(threads()).max(1);
    y.par_chunks_mut(per)
        .enumerate()
        .map(|(k, ys)| {
            let mut s = COUNT.then(Stream::default);
            for (r, out) in ys.iter_mut().enumerate() {
                let row = k * per + r;
                let (a, b) = (rowptr[row] as usize, rowptr[row + 1] as usize);
                let mut acc = 0.0;
                for e in a..b {
                    let c = cols[e] as usize;
                    if let Some(s) = s.as_mut() {
                        s.touch(c as u64 * 8, false);
                    }
                    acc += vals[e] * x[c];
                }
                *out = acc;
            }
            s.map_or_else(Traffic::default, |s| s.traffic)
        })
        .reduce(Traffic::default, Traffic::plus)
}

impl Kernel for Spmv {
    fn name(&self) -> String {
        "SpMV".into()
    }

    fn operands(&self) -> Vec<Operand> {
        vec![
            Operand::new(self.x, "x", 8, self.ncols, true, false),
            Operand::new(self.rowptr, "rowptr", 8, self.rows + 1, true, false),
            Operand::new(self.cols, "cols", 4, self.nnz, true, false),
            Operand::new(self.vals, "vals", 8, self.nnz, true, false),
            Operand::new(self.y, "y", 8, self.rows, false, true),
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
        // The first product counts `x`'s gather through the model; the others only compute.
        let gathered = product::<true>(rowptr, cols, vals, x, y);
        for _ in 1..self.reps {
            product::<false>(rowptr, cols, vals, x, y);
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
