//! `lamb` (FBGEMM's `LAMB`): Adam's bias-corrected step plus decoupled weight decay,
//! `r = m / (1 - b1^t) / (sqrt(v / (1 - b2^t)) + eps) + weight_decay w`, scaled per row by
//! the trust ratio `|w| / |r|`: `w -= lr (|w| / |r|) r`. Lazy, `t` the table's step. Where
//! either norm is 0 the ratio is 1 (FBGEMM's kernel gives 0 or NaN there).

use super::adam::check_moments;
use super::{bias_correction, norm, OptimizerConfig, RowOptimizer};
use tiermem_core::Result;

/// Element-wise LAMB.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Lamb {
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
    /// `1 / (1 - beta1^t)` at this step.
    pub c1: f32,
    /// `1 / (1 - beta2^t)` at this step.
    pub c2: f32,
}

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

    fn from_config(c: &OptimizerConfig) -> Result<Self> {
        check_moments(Self::NAME, c)?;
        Ok(Lamb {
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
        Lamb {
            c1: bias_correction(self.beta1, step),
            c2: bias_correction(self.beta2, step),
            ..self
        }
    }

    #[inline(always)]
    fn apply(&self, w: &mut [f32], g: &[f32], s: &mut [f32]) {
        let (m, v) = s.split_at_mut(w.len());
        trust_step(self.lr, w, |w, r| {
            for k in 0..w.len() {
                m[k] = self.beta1 * m[k] + (1.0 - self.beta1) * g[k];
                v[k] = self.beta2 * v[k] + (1.0 - self.beta2) * g[k] * g[k];
                r[k] = m[k] * self.c1 / ((v[k] * self.c2).sqrt() + self.eps)
                    + self.weight_decay * w[k];
            }
        });
    }
}
