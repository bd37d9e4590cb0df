//! `partial_rowwise_adam` (FBGEMM's `PARTIAL_ROWWISE_ADAM`): Adam with the first moment per
//! element and the second per row, from the row's mean squared gradient:
//! `v = b2 v + (1 - b2) mean(g²); m = b1 m + (1 - b1) g;
//! w -= lr (m / (1 - b1^t) / (sqrt(v / (1 - b2^t)) + eps) + weight_decay w)`. Lazy, weight
//! decay decoupled, `t` the table's step, as [`super::Adam`].

use super::adam::{moments_optimizer, Moments};
use super::{OptimizerConfig, RowOptimizer};
use tiermem_core::Result;

/// Adam with a row-wise second moment.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PartialRowwiseAdam(pub Moments);

impl RowOptimizer for PartialRowwiseAdam {
    const NAME: &'static str = "partial_rowwise_adam";

    moments_optimizer!();

    fn state_len(width: usize) -> usize {
        width + 1 // m, then v
    }

    #[inline(always)]
    fn apply(&self, w: &mut [f32], g: &[f32], s: &mut [f32]) {
        let o = &self.0;
        let n = w.len();
        let (m, v) = s.split_at_mut(n);
        v[0] = o.second(v[0], g.iter().map(|x| x * x).sum::<f32>() / n as f32);
        for k in 0..n {
            m[k] = o.first(m[k], g[k]);
            w[k] -= o.lr * (o.step(m[k], v[0]) + o.weight_decay * w[k]);
        }
    }
}
