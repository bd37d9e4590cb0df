//! `partial_rowwise_adam` (FBGEMM's `PARTIAL_ROWWISE_ADAM`): Adam with the first moment per
//! element and the second per row, from the row's mean squared gradient:
//! `v = b2 v + (1 - b2) mean(g²); m = b1 m + (1 - b1) g;
//! w -= lr (m / (1 - b1^t) / (sqrt(v / (1 - b2^t)) + eps) + weight_decay w)`. Lazy, weight
//! decay decoupled, `t` the table's step, as [`super::Adam`].

use super::adam::check_moments;
use super::{bias_correction, OptimizerConfig, RowOptimizer};
use tiermem_core::Result;

/// Adam with a row-wise second moment.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PartialRowwiseAdam {
    /// Learning rate.
    pub lr: f32,
    /// Added to the denominator.
    pub eps: f32,
    /// Decay of the first moment.
    pub beta1: f32,
    /// Decay of the second moment.
    pub beta2: f32,
    /// Decoupled weight decay.
    pub weight_decay: f32,
    /// `1 / (1 - beta1^t)` at this step.
    pub c1: f32,
    /// `1 / (1 - beta2^t)` at this step.
    pub c2: f32,
}

impl RowOptimizer for PartialRowwiseAdam {
    const NAME: &'static str = "partial_rowwise_adam";

    fn from_config(c: &OptimizerConfig) -> Result<Self> {
        check_moments(Self::NAME, c)?;
        Ok(PartialRowwiseAdam {
            lr: c.lr,
            eps: c.eps,
            beta1: c.beta1,
            beta2: c.beta2,
            weight_decay: c.weight_decay,
            c1: 1.0,
            c2: 1.0,
        })
    }

    fn state_len(width: usize) -> usize {
        width + 1 // m, then v
    }

    fn at_step(self, step: u64) -> Self {
        PartialRowwiseAdam {
            c1: bias_correction(self.beta1, step),
            c2: bias_correction(self.beta2, step),
            ..self
        }
    }

    #[inline(always)]
    fn apply(&self, w: &mut [f32], g: &[f32], s: &mut [f32]) {
        let n = w.len();
        let (m, v) = s.split_at_mut(n);
        let mean_sq = g.iter().map(|x| x * x).sum::<f32>() / n as f32;
        v[0] = self.beta2 * v[0] + (1.0 - self.beta2) * mean_sq;
        let denom = (v[0] * self.c2).sqrt() + self.eps;
        for k in 0..n {
            m[k] = self.beta1 * m[k] + (1.0 - self.beta1) * g[k];
            w[k] -= self.lr * (m[k] * self.c1 / denom + self.weight_decay * w[k]);
        }
    }
}
