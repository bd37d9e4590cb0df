//! `sgd`: `w -= lr * g` (`torch.optim.SGD` without momentum).

use super::{check, OptimizerConfig, RowOptimizer};
use tiermem_core::Result;

/// Plain SGD.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sgd {
    /// Learning rate.
    pub lr: f32,
}

impl RowOptimizer for Sgd {
    const NAME: &'static str = "sgd";

    fn from_config(c: &OptimizerConfig) -> Result<Self> {
        check(Self::NAME, "lr", c.lr, 0.0)?;
        Ok(Sgd { lr: c.lr })
    }

    fn state_len(_width: usize) -> usize {
        0
    }

    #[inline(always)]
    fn apply(&self, w: &mut [f32], g: &[f32], _s: &mut [f32]) {
        for (wk, gk) in w.iter_mut().zip(g) {
            *wk -= self.lr * gk;
        }
    }

    fn elementwise(&self) -> Option<fn(&Self, f32, f32) -> f32> {
        Some(|o, w, g| w - o.lr * g)
    }
}
