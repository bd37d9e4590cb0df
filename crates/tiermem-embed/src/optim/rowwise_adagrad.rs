//! `rowwise_adagrad` (FBGEMM's `EXACT_ROWWISE_ADAGRAD`): one accumulator per row. With
//! `d = g + weight_decay * w` under L2 decay (else `d = g`): `m += mean(d²);
//! mult = lr / (sqrt(m) + eps); w = c * w - mult * g`, where `c` is `1 - mult * weight_decay`
//! (L2), `1 - lr * weight_decay` (decoupled), or 1 with no decay; FBGEMM's CPU kernel's
//! order of operations.

use super::{check, decay_mode, Decay, OptimizerConfig, RowOptimizer};
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
    /// Weight decay.
    pub weight_decay: f32,
    /// Its form.
    pub decay: Decay,
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
        check(Self::NAME, "weight_decay", c.weight_decay, 0.0)?;
        Ok(RowwiseAdagrad {
            lr: c.lr,
            eps: c.eps,
            initial_accumulator: c.initial_accumulator,
            weight_decay: c.weight_decay,
            decay: decay_mode(Self::NAME, c, Decay::L2, &[Decay::L2, Decay::Decoupled])?,
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
        let l2 = if self.decay == Decay::L2 {
            self.weight_decay
        } else {
            0.0
        };
        let sq: f32 = g
            .iter()
            .zip(w.iter())
            .map(|(gk, wk)| (gk + l2 * wk) * (gk + l2 * wk))
            .sum::<f32>()
            / w.len() as f32;
        s[0] += sq;
        let mult = self.lr / (s[0].sqrt() + self.eps);
        let c = match self.decay {
            Decay::L2 => 1.0 - mult * self.weight_decay,
            Decay::Decoupled => 1.0 - self.lr * self.weight_decay,
        };
        for k in 0..w.len() {
            w[k] = c * w[k] - mult * g[k];
        }
    }
}
