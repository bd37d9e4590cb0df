//! `partial_rowwise_lamb` (FBGEMM's `PARTIAL_ROWWISE_LAMB`): [`super::Lamb`] with the second
//! moment per row, from the row's mean squared gradient: `v = b2 v + (1 - b2) mean(g²)`.

use super::adam::{moments_optimizer, Moments};
use super::lamb::trust_step;
use super::{OptimizerConfig, RowOptimizer};
use tiermem_core::Result;

/// LAMB with a row-wise second moment.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PartialRowwiseLamb(pub Moments);

impl RowOptimizer for PartialRowwiseLamb {
    const NAME: &'static str = "partial_rowwise_lamb";

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
        trust_step(o.lr, w, |w, r| {
            for k in 0..n {
                m[k] = o.first(m[k], g[k]);
                r[k] = o.step(m[k], v[0]) + o.weight_decay * w[k];
            }
        });
    }
}
