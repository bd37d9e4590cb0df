//! `adagrad` (`torch.optim.Adagrad`, FBGEMM's `EXACT_ADAGRAD`): per element,
//! `g += weight_decay * w` (L2, torch's form); `s += g²; w -= clr * g / (sqrt(s) + eps)`,
//! with `clr = lr / (1 + (step - 1) * lr_decay)`. Decoupled decay instead scales
//! `w *= 1 - clr * weight_decay` beside the step.

use super::{check, decay_mode, Decay, OptimizerConfig, RowOptimizer};
use tiermem_core::Result;

/// Element-wise Adagrad.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Adagrad {
    /// Learning rate (after [`RowOptimizer::at_step`], the decayed one).
    pub lr: f32,
    /// Added to the denominator.
    pub eps: f32,
    /// Learning-rate decay per step.
    pub lr_decay: f32,
    /// Starting value of `s`.
    pub initial_accumulator: f32,
    /// Weight decay.
    pub weight_decay: f32,
    /// Its form.
    pub decay: Decay,
}

impl RowOptimizer for Adagrad {
    const NAME: &'static str = "adagrad";

    fn from_config(c: &OptimizerConfig) -> Result<Self> {
        check(Self::NAME, "lr", c.lr, 0.0)?;
        check(Self::NAME, "eps", c.eps, 0.0)?;
        check(Self::NAME, "lr_decay", c.lr_decay, 0.0)?;
        check(
            Self::NAME,
            "initial_accumulator",
            c.initial_accumulator,
            0.0,
        )?;
        check(Self::NAME, "weight_decay", c.weight_decay, 0.0)?;
        Ok(Adagrad {
            lr: c.lr,
            eps: c.eps,
            lr_decay: c.lr_decay,
            initial_accumulator: c.initial_accumulator,
            weight_decay: c.weight_decay,
            decay: decay_mode(Self::NAME, c, Decay::L2, &[Decay::L2, Decay::Decoupled])?,
        })
    }

    fn state_len(width: usize) -> usize {
        width
    }

    fn initial_state(&self) -> f32 {
        self.initial_accumulator
    }

    fn at_step(self, step: u64) -> Self {
        Adagrad {
            lr: self.lr / (1.0 + (step.max(1) - 1) as f32 * self.lr_decay),
            ..self
        }
    }

    #[inline(always)]
    fn apply(&self, w: &mut [f32], g: &[f32], s: &mut [f32]) {
        let (l2, keep) = match self.decay {
            Decay::L2 => (self.weight_decay, 1.0),
            Decay::Decoupled => (0.0, 1.0 - self.lr * self.weight_decay),
        };
        for k in 0..w.len() {
            let gk = g[k] + l2 * w[k];
            s[k] += gk * gk;
            w[k] = keep * w[k] - self.lr * (gk / (s[k].sqrt() + self.eps));
        }
    }
}
