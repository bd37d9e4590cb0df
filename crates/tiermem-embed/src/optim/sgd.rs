//! `sgd`: `w -= lr * (g + weight_decay * w)` (`torch.optim.SGD` without momentum, FBGEMM's
//! `EXACT_SGD` when `weight_decay` is 0; with plain SGD the L2 and decoupled forms of weight
//! decay are the same update).

use super::{check, decay_mode, Decay, OptimizerConfig, RowOptimizer};
use tiermem_core::{ensure, Result};

/// Plain SGD.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sgd {
    /// Learning rate.
    pub lr: f32,
    /// Weight decay.
    pub weight_decay: f32,
}

impl RowOptimizer for Sgd {
    const NAME: &'static str = "sgd";

    fn from_config(c: &OptimizerConfig) -> Result<Self> {
        check(Self::NAME, "lr", c.lr, 0.0)?;
        check(Self::NAME, "weight_decay", c.weight_decay, 0.0)?;
        ensure!(
            c.momentum == 0.0,
            "optimizer 'sgd' keeps no momentum (momentum {}): use 'momentum_sgd'",
            c.momentum
        );
        decay_mode(Self::NAME, c, Decay::L2, &[Decay::L2, Decay::Decoupled])?;
        Ok(Sgd {
            lr: c.lr,
            weight_decay: c.weight_decay,
        })
    }

    fn state_len(_width: usize) -> usize {
        0
    }

    #[inline(always)]
    fn apply(&self, w: &mut [f32], g: &[f32], _s: &mut [f32]) {
        for (wk, gk) in w.iter_mut().zip(g) {
            *wk -= self.lr * (gk + self.weight_decay * *wk);
        }
    }

    fn elementwise(&self) -> Option<fn(&Self, f32, f32) -> f32> {
        Some(|o, w, g| w - o.lr * (g + o.weight_decay * w))
    }
}
