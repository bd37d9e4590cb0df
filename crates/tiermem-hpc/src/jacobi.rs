//! Jacobi sweeps: the 5-point (2D) and 7-point (3D) averaging stencils over row-major `f64`
//! grids. Sweep `k` reads one grid and writes the other (`u -> v`, then `v -> u`, ...);
//! boundary points are copied. Planes (3D) or rows (2D) of the output are split over the
//! threads.

use rayon::prelude::*;

use super::traffic::Traffic;
use super::{charge, share, view_mut, Kernel, Operand};
use tiermem_core::manager::Manager;
use tiermem_core::mechanism::ObjectId;
use tiermem_core::Result;

/// Jacobi over two grids of `dims` (`[ny, nx]` or `[nz, ny, nx]`).
#[derive(Debug, Clone)]
pub struct Jacobi {
    /// The grid read first.
    pub u: ObjectId,
    /// The grid written first.
    pub v: ObjectId,
    /// `[ny, nx]` or `[nz, ny, nx]`, each at least 3.
    pub dims: Vec<u64>,
    /// Sweeps per run.
    pub sweeps: u64,
}

impl Jacobi {
    /// # Errors
    /// For dimensions other than 2 or 3 of at least 3 points, or no sweeps.
    pub fn new(u: ObjectId, v: ObjectId, dims: Vec<u64>, sweeps: u64) -> Result<Self> {
        tiermem_core::ensure!(
            matches!(dims.len(), 2 | 3) && dims.iter().all(|&d| d >= 3) && sweeps >= 1,
            "Jacobi: dims must be [ny, nx] or [nz, ny, nx] of at least 3 points each and sweeps \
             at least 1 (got {dims:?}, {sweeps})"
        );
        Ok(Jacobi { u, v, dims, sweeps })
    }

    fn points(&self) -> u64 {
        self.dims.iter().product()
    }

    /// Neighbour offsets, in the order the stencil reads them.
    fn stencil(&self) -> Vec<i64> {
        let nx = self.dims[self.dims.len() - 1] as i64;
        let ny = self.dims[self.dims.len() - 2] as i64;
        if self.dims.len() == 2 {
            vec![-nx, -1, 0, 1, nx]
        } else {
            vec![-nx * ny, -nx, -1, 0, 1, nx, nx * ny]
        }
    }

    /// Whether point `p` is on the boundary.
    fn boundary(&self, p: u64) -> bool {
        let mut rest = p;
        self.dims.iter().rev().any(|&d| {
            let c = rest % d;
            rest /= d;
            c == 0 || c == d - 1
        })
    }
}

impl Kernel for Jacobi {
    fn name(&self) -> String {
        format!("Jacobi{}D", self.dims.len())
    }

    fn operands(&self) -> Vec<Operand> {
        let more = self.sweeps > 1;
        vec![
            Operand::new(self.u, "u", 8, self.points(), true, more),
            Operand::new(self.v, "v", 8, self.points(), more, true),
        ]
    }

    /// `U` counts the passes over `u`, one per sweep that reads or writes it: a point's
    /// other stencil references hit lines the cache holds for the pass (the paper counts
    /// references, 5 and 7 per read sweep, which overstates what staging gains).
    fn target(&self) -> (usize, f64) {
        (0, self.sweeps as f64)
    }

    fn sample(
        &self,
        _m: &Manager,
        _op: usize,
        t: usize,
        threads: usize,
        n: usize,
    ) -> Result<Vec<u64>> {
        let outer = self.dims[0] as usize;
        let (lo, _) = share(outer, t, threads);
        let inner = self.points() / self.dims[0];
        let st = self.stencil();
        let mut out = Vec::with_capacity(n);
        // The first interior point at or after the thread's first slab.
        let mut p = (lo.max(1) as u64) * inner + inner / self.dims[1] + 1;
        while out.len() < n && p < self.points() {
            if !self.boundary(p) {
                out.extend(st.iter().map(|&o| ((p as i64 + o) * 8) as u64));
            }
            p += 1;
        }
        out.truncate(n);
        Ok(out)
    }

    fn run(&self, m: &Manager) -> Result<()> {
        let n = self.points();
        let st = self.stencil();
        let w = 1.0 / st.len() as f64;
        let inner = (n / self.dims[0]) as usize;
        for s in 0..self.sweeps {
            let (src, dst) = if s % 2 == 0 {
                (self.u, self.v)
            } else {
                (self.v, self.u)
            };
            let gs = m.read(src)?;
            let mut gd = m.write(dst)?;
            let a = super::view::<f64>("Jacobi grid", gs.as_slice(), n)?;
            let b = view_mut::<f64>("Jacobi grid", gd.as_mut_slice(), n)?;
            b.par_chunks_mut(inner).enumerate().for_each(|(k, slab)| {
                let base = (k * inner) as u64;
                for (q, x) in slab.iter_mut().enumerate() {
                    let p = base + q as u64;
                    *x = if self.boundary(p) {
                        a[p as usize]
                    } else {
                        w * st.iter().map(|&o| a[(p as i64 + o) as usize]).sum::<f64>()
                    };
                }
            });
            let bytes = n * 8;
            charge(
                m,
                &[
                    (src, Traffic::sequential(bytes, true, false)),
                    (dst, Traffic::sequential(bytes, false, true)),
                ],
            )?;
        }
        Ok(())
    }
}
