//! `adam` (FBGEMM's `ADAM`, lazy: only the rows a step touches move): per element,
//! `m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g²;
//! w -= lr (m / (1 - b1^t) / (sqrt(v / (1 - b2^t)) + eps) + weight_decay w)`, with `t` the
//! table's step. The weight decay is decoupled, as FBGEMM's (AdamW's form).

use super::{check, OptimizerConfig, RowOptimizer};
use tiermem_core::{ensure, Result};

/// Element-wise lazy Adam.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Adam {
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
    /// `1 / (1 - beta1^t)` at this step (set by [`RowOptimizer::at_step`]).
    pub c1: f32,
    /// `1 / (1 - beta2^t)` at this step.
    pub c2: f32,
}

impl RowOptimizer for Adam {
    const NAME: &'static str = "adam";

    fn from_config(c: &OptimizerConfig) -> Result<Self> {
        check(Self::NAME, "lr", c.lr, 0.0)?;
        check(Self::NAME, "eps", c.eps, 0.0)?;
        check(Self::NAME, "weight_decay", c.weight_decay, 0.0)?;
        for (what, b) in [("beta1", c.beta1), ("beta2", c.beta2)] {
            ensure!(
                b.is_finite() && (0.0..1.0).contains(&b),
                "optimizer 'adam': {what} must be in [0, 1), not {b}"
            );
        }
        Ok(Adam {
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
        2 * width // m, then v
    }

    fn at_step(self, step: u64) -> Self {
        let t = i32::try_from(step.max(1)).unwrap_or(i32::MAX);
        let c = |b: f32| (1.0 / (1.0 - f64::from(b).powi(t))) as f32;
        Adam {
            c1: c(self.beta1),
            c2: c(self.beta2),
            ..self
        }
    }

    #[inline(always)]
    fn apply(&self, w: &mut [f32], g: &[f32], s: &mut [f32]) {
        let (m, v) = s.split_at_mut(w.len());
        for k in 0..w.len() {
            m[k] = self.beta1 * m[k] + (1.0 - self.beta1) * g[k];
            v[k] = self.beta2 * v[k] + (1.0 - self.beta2) * g[k] * g[k];
            let step = m[k] * self.c1 / ((v[k] * self.c2).sqrt() + self.eps);
            w[k] -= self.lr * (step + self.weight_decay * w[k]);
        }
    }
}
