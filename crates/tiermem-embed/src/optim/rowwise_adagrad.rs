//! `rowwise_adagrad` (FBGEMM's): one accumulator per row, `m += mean(g²);
//! w -= lr * g / (sqrt(m) + eps)`.

use super::{check, OptimizerConfig, RowOptimizer};
use tiermem_core::Result;

/// Row-wise Adagrad.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RowwiseAdagrad {
    /// Learning rate.
    pub lr: f32,
    /// Added to the denominator.
    pub eps: f32,
    /// Starting value of `m` (FBGEMM starts at 0).
    pub initial_accumulator: f32,
}

impl RowOptimizer for RowwiseAdagrad {
    const NAME: &'static str = "rowwise_adagrad";

    fn from_config(c: &OptimizerConfig) -> Result<Self> {
        check(Self::NAME, "lr", c.lr, 0.0)?;
        check(Self::NAME, "eps", c.eps, 0.0)?;
        check(
            Self::NAME,
            "initial_accumulator",
            c.initial_accumulator,
            0.0,
        )?;
        Ok(RowwiseAdagrad {
            lr: c.lr,
            eps: c.eps,
            initial_accumulator: c.initial_accumulator,
        })
    }

    fn state_len(_width: usize) -> usize {
        1
    }

    fn initial_state(&self) -> f32 {
        self.initial_accumulator
    }

    #[inline(always)]
    fn apply(&self, w: &mut [f32], g: &[f32], s: &mut [f32]) {
        let sq: f32 = g.iter().map(|x| x * x).sum::<f32>() / w.len() as f32;
        s[0] += sq;
        let mult = self.lr / (s[0].sqrt() + self.eps);
        for k in 0..w.len() {
            w[k] -= mult * g[k];
        }
    }
}
