//! `lars_sgd` (FBGEMM's `LARS_SGD`): SGD with momentum and a layer-wise (here row-wise)
//! learning rate, `a = lr * eta * |w| / (|g| + weight_decay * |w|)`, then per element
//! `m = momentum * m + a (g + weight_decay * w); w -= m`. Lazy; where `|w|` or
//! `|g| + weight_decay |w|` is 0, `a = lr` (FBGEMM's kernel gives 0 or NaN there).

use super::{check, decay_mode, norm, Decay, OptimizerConfig, RowOptimizer};
use tiermem_core::Result;

/// LARS-SGD.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LarsSgd {
    /// Learning rate.
    pub lr: f32,
    /// Trust coefficient.
    pub eta: f32,
    /// Momentum.
    pub momentum: f32,
    /// L2 weight decay.
    pub weight_decay: f32,
}

impl RowOptimizer for LarsSgd {
    const NAME: &'static str = "lars_sgd";

    fn from_config(c: &OptimizerConfig) -> Result<Self> {
        check(Self::NAME, "lr", c.lr, 0.0)?;
        check(Self::NAME, "eta", c.eta, 0.0)?;
        check(Self::NAME, "momentum", c.momentum, 0.0)?;
        check(Self::NAME, "weight_decay", c.weight_decay, 0.0)?;
        decay_mode(Self::NAME, c, Decay::L2, &[Decay::L2])?;
        Ok(LarsSgd {
            lr: c.lr,
            eta: c.eta,
            momentum: c.momentum,
            weight_decay: c.weight_decay,
        })
    }

    fn state_len(width: usize) -> usize {
        width
    }

    #[inline(always)]
    fn apply(&self, w: &mut [f32], g: &[f32], s: &mut [f32]) {
        let wn = norm(w);
        let den = norm(g) + self.weight_decay * wn;
        let a = if wn > 0.0 && den > 0.0 {
            self.lr * self.eta * wn / den
        } else {
            self.lr
        };
        for k in 0..w.len() {
            s[k] = self.momentum * s[k] + a * (g[k] + self.weight_decay * w[k]);
            w[k] -= s[k];
        }
    }
}
