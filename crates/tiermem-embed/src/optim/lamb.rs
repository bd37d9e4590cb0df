//! `lamb` (FBGEMM's `LAMB`): Adam's bias-corrected step plus decoupled weight decay,
//! `r = m / (1 - b1^t) / (sqrt(v / (1 - b2^t)) + eps) + weight_decay w`, scaled per row by
//! the trust ratio `|w| / |r|`: `w -= lr (|w| / |r|) r`. Lazy, `t` the table's step. Where
//! either norm is 0 the ratio is 1 (FBGEMM's kernel gives 0 or NaN there).

use super::adam::{moments_optimizer, Moments};
use super::{norm, OptimizerConfig, RowOptimizer};
use tiermem_core::Result;

/// Element-wise LAMB.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Lamb(pub Moments);

/// `|w| / |r|`, or 1 where either norm is 0.
#[inline(always)]
pub(crate) fn trust_ratio(w: &[f32], r: &[f32]) -> f32 {
    let (wn, rn) = (norm(w), norm(r));
    if wn > 0.0 && rn > 0.0 {
        wn / rn
    } else {
        1.0
    }
}

/// Most rows are this wide or less: their `r` stays on the stack.
const STACK_WIDTH: usize = 256;

/// `w -= lr * ratio * r` for the `r` that `fill` writes (one element per index), on the
/// stack for rows up to [`STACK_WIDTH`] wide.
#[inline(always)]
pub(crate) fn trust_step(lr: f32, w: &mut [f32], mut fill: impl FnMut(&[f32], &mut [f32])) {
    let mut stack = [0f32; STACK_WIDTH];
    let mut heap = Vec::new();
    let r: &mut [f32] = if w.len() <= STACK_WIDTH {
        &mut stack[..w.len()]
    } else {
        heap.resize(w.len(), 0.0);
        &mut heap
    };
    fill(w, r);
    let step = lr * trust_ratio(w, r);
    for (wk, rk) in w.iter_mut().zip(r.iter()) {
        *wk -= step * rk;
    }
}

impl RowOptimizer for Lamb {
    const NAME: &'static str = "lamb";

    moments_optimizer!();

    fn state_len(width: usize) -> usize {
        2 * width // m, then v
    }

    #[inline(always)]
    fn apply(&self, w: &mut [f32], g: &[f32], s: &mut [f32]) {
        let o = &self.0;
        let (m, v) = s.split_at_mut(w.len());
        trust_step(o.lr, w, |w, r| {
            for k in 0..w.len() {
                m[k] = o.first(m[k], g[k]);
                v[k] = o.second(v[k], g[k] * g[k]);
                r[k] = o.step(m[k], v[k]) + o.weight_decay * w[k];
            }
        });
    }
}
