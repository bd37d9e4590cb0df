//! `momentum_sgd`: `torch.optim.SGD` with momentum (no dampening, not Nesterov), lazy: per
//! element of a row a step touches, `d = g + weight_decay * w; b = momentum * b + d;
//! w -= lr * b`. A buffer starting at zero makes the first step `b = d`, as torch's does.
//! Rows a step does not touch keep their buffer and do not move (torch's dense SGD moves
//! every row whose buffer is not zero); on steps that touch every row the two are equal.

use super::{check, decay_mode, Decay, OptimizerConfig, RowOptimizer};
use tiermem_core::Result;

/// Lazy SGD with momentum.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MomentumSgd {
    /// Learning rate.
    pub lr: f32,
    /// Momentum.
    pub momentum: f32,
    /// L2 weight decay.
    pub weight_decay: f32,
}

impl RowOptimizer for MomentumSgd {
    const NAME: &'static str = "momentum_sgd";

    fn from_config(c: &OptimizerConfig) -> Result<Self> {
        check(Self::NAME, "lr", c.lr, 0.0)?;
        check(Self::NAME, "momentum", c.momentum, 0.0)?;
        check(Self::NAME, "weight_decay", c.weight_decay, 0.0)?;
        decay_mode(Self::NAME, c, Decay::L2, &[Decay::L2])?;
        Ok(MomentumSgd {
            lr: c.lr,
            momentum: c.momentum,
            weight_decay: c.weight_decay,
        })
    }

    fn state_len(width: usize) -> usize {
        width
    }

    #[inline(always)]
    fn apply(&self, w: &mut [f32], g: &[f32], s: &mut [f32]) {
        for k in 0..w.len() {
            let d = g[k] + self.weight_decay * w[k];
            s[k] = self.momentum * s[k] + d;
            w[k] -= self.lr * s[k];
        }
    }
}
