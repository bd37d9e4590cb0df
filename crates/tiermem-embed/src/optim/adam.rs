//! `adam` (FBGEMM's `ADAM`, lazy: only the rows a step touches move): per element,
//! `m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g²;
//! w -= lr (m / (1 - b1^t) / (sqrt(v / (1 - b2^t)) + eps) + weight_decay w)`, with `t` the
//! table's step. The weight decay is decoupled, as FBGEMM's (AdamW's form).

use super::{bias_correction, check, check_beta, decay_mode, Decay, OptimizerConfig, RowOptimizer};
use tiermem_core::Result;

/// The settings the Adam and LAMB family share, with the bias corrections of the step
/// they run at.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Moments {
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
    /// `1 / (1 - beta1^t)` at this step (set by [`Moments::at_step`]).
    pub c1: f32,
    /// `1 / (1 - beta2^t)` at this step.
    pub c2: f32,
}

impl Moments {
    /// From a config, checking lr, eps, weight decay (decoupled only) and the betas.
    pub(crate) fn from_config(name: &str, c: &OptimizerConfig) -> Result<Self> {
        check(name, "lr", c.lr, 0.0)?;
        check(name, "eps", c.eps, 0.0)?;
        check(name, "weight_decay", c.weight_decay, 0.0)?;
        check_beta(name, "beta1", c.beta1)?;
        check_beta(name, "beta2", c.beta2)?;
        decay_mode(name, c, Decay::Decoupled, &[Decay::Decoupled])?;
        Ok(Moments {
            lr: c.lr,
            eps: c.eps,
            beta1: c.beta1,
            beta2: c.beta2,
            weight_decay: c.weight_decay,
            c1: 1.0,
            c2: 1.0,
        })
    }

    /// With the bias corrections of step `step`.
    pub(crate) fn at_step(self, step: u64) -> Self {
        Moments {
            c1: bias_correction(self.beta1, step),
            c2: bias_correction(self.beta2, step),
            ..self
        }
    }

    /// `m = b1 m + (1 - b1) g`.
    #[inline(always)]
    pub(crate) fn first(&self, m: f32, g: f32) -> f32 {
        self.beta1 * m + (1.0 - self.beta1) * g
    }

    /// `v = b2 v + (1 - b2) sq`.
    #[inline(always)]
    pub(crate) fn second(&self, v: f32, sq: f32) -> f32 {
        self.beta2 * v + (1.0 - self.beta2) * sq
    }

    /// The bias-corrected step `m / (1 - b1^t) / (sqrt(v / (1 - b2^t)) + eps)`.
    #[inline(always)]
    pub(crate) fn step(&self, m: f32, v: f32) -> f32 {
        m * self.c1 / ((v * self.c2).sqrt() + self.eps)
    }
}

/// Generate a [`RowOptimizer`]'s `from_config` and `at_step` for a newtype over [`Moments`].
macro_rules! moments_optimizer {
    () => {
        fn from_config(c: &OptimizerConfig) -> Result<Self> {
            Ok(Self(Moments::from_config(Self::NAME, c)?))
        }

        fn at_step(self, step: u64) -> Self {
            Self(self.0.at_step(step))
        }
    };
}
pub(crate) use moments_optimizer;

/// Element-wise lazy Adam.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Adam(pub Moments);

impl RowOptimizer for Adam {
    const NAME: &'static str = "adam";

    moments_optimizer!();

    fn state_len(width: usize) -> usize {
        2 * width // m, then v
    }

    #[inline(always)]
    fn apply(&self, w: &mut [f32], g: &[f32], s: &mut [f32]) {
        let o = &self.0;
        let (m, v) = s.split_at_mut(w.len());
        for k in 0..w.len() {
            m[k] = o.first(m[k], g[k]);
            v[k] = o.second(v[k], g[k] * g[k]);
            w[k] -= o.lr * (o.step(m[k], v[k]) + o.weight_decay * w[k]);
        }
    }
}
