//! `adam` (FBGEMM's `ADAM`, lazy: only the rows a step touches move): per element,
//! `m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g²;
//! w -= lr (m / (1 - b1^t) / (sqrt(v / (1 - b2^t)) + eps) + weight_decay w)`, with `t` the
//! table's step. The weight decay is decoupled, as FBGEMM's (AdamW's form).

use super::{bias_correction, check, check_beta, decay_mode, Decay, OptimizerConfig, RowOptimizer};
use tiermem_core::Result;

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

/// Checks shared by the Adam and LAMB family: lr, eps, weight decay, the betas.
pub(crate) fn check_moments(name: &str, c: &OptimizerConfig) -> Result<()> {
    check(name, "lr", c.lr, 0.0)?;
    check(name, "eps", c.eps, 0.0)?;
    check(name, "weight_decay", c.weight_decay, 0.0)?;
    check_beta(name, "beta1", c.beta1)?;
    check_beta(name, "beta2", c.beta2)?;
    decay_mode(name, c, Decay::Decoupled, &[Decay::Decoupled])?;
    Ok(())
}

impl RowOptimizer for Adam {
    const NAME: &'static str = "adam";

    fn from_config(c: &OptimizerConfig) -> Result<Self> {
        check_moments(Self::NAME, c)?;
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
        Adam {
            c1: bias_correction(self.beta1, step),
            c2: bias_correction(self.beta2, step),
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
