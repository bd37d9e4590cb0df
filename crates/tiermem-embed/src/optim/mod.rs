//! Row optimizers fused into the backward pass: each is one file implementing
//! [`RowOptimizer`] and one line in the [`optimizers!`] list below, which generates the
//! [`Optimizer`] enum the kernels dispatch on (one `match` per row, inlined: no virtual
//! call in the update loop), the registry of names ([`NAMES`], exported to Python) and the
//! constructor from a name and [`OptimizerConfig`].

mod adagrad;
mod adam;
mod rowwise_adagrad;
mod sgd;

pub use adagrad::Adagrad;
pub use adam::Adam;
pub use rowwise_adagrad::RowwiseAdagrad;
pub use sgd::Sgd;

use tiermem_core::{bail, ensure, Result};

/// Hyperparameters an optimizer may read; each checks the ones it uses.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OptimizerConfig {
    /// Learning rate.
    pub lr: f32,
    /// Added to denominators.
    pub eps: f32,
    /// Learning-rate decay per step.
    pub lr_decay: f32,
    /// Starting value of the state.
    pub initial_accumulator: f32,
    /// Adam's decay of the first moment.
    pub beta1: f32,
    /// Adam's decay of the second moment.
    pub beta2: f32,
    /// Decoupled weight decay (Adam).
    pub weight_decay: f32,
}

impl OptimizerConfig {
    /// `torch.optim`'s defaults for the settings not given: betas (0.9, 0.999), no weight
    /// decay.
    #[must_use]
    pub fn new(lr: f32, eps: f32, lr_decay: f32, initial_accumulator: f32) -> Self {
        OptimizerConfig {
            lr,
            eps,
            lr_decay,
            initial_accumulator,
            beta1: 0.9,
            beta2: 0.999,
            weight_decay: 0.0,
        }
    }
}

/// One optimizer: how it updates a row from its accumulated gradient.
pub trait RowOptimizer: Copy + std::fmt::Debug + Send + Sync {
    /// Registry name (what Python passes).
    const NAME: &'static str;

    /// From a config, checking the values this optimizer uses.
    fn from_config(c: &OptimizerConfig) -> Result<Self>;

    /// Floats of state per row for rows of `width` elements (0: stateless).
    fn state_len(width: usize) -> usize;

    /// Starting value of every state float.
    fn initial_state(&self) -> f32 {
        0.0
    }

    /// This optimizer as it runs at step `step` (1-based; once per call per table): fold
    /// step-dependent values (a decayed learning rate) into a copy.
    fn at_step(self, _step: u64) -> Self {
        self
    }

    /// Update one row: `w` its values, `g` its gradient, `s` its `state_len` state floats.
    fn apply(&self, w: &mut [f32], g: &[f32], s: &mut [f32]);

    /// A stateless optimizer may update the stored row in place element by element
    /// (`Some(f)` with `f(w, g)` the new value), which saves copying rows to and from a
    /// buffer. `None` (the default): rows go through [`RowOptimizer::apply`].
    fn elementwise(&self) -> Option<fn(&Self, f32, f32) -> f32> {
        None
    }
}

/// Check that a hyperparameter is finite and at least `min`.
pub(crate) fn check(name: &str, what: &str, v: f32, min: f32) -> Result<()> {
    ensure!(
        v.is_finite() && v >= min,
        "optimizer '{name}': {what} must be a finite number of at least {min}, not {v}"
    );
    Ok(())
}

macro_rules! optimizers {
    ($($variant:ident),* $(,)?) => {
        /// The optimizer a fused update runs: one variant per [`RowOptimizer`].
        #[derive(Debug, Clone, Copy, PartialEq)]
        pub enum Optimizer {
            $(
                #[doc = concat!("[`", stringify!($variant), "`]")]
                $variant($variant),
            )*
        }

        /// Every optimizer's name, in registry order.
        pub const NAMES: &[&str] = &[$(<$variant as RowOptimizer>::NAME),*];

        /// The registry's own copy of `name` and the state floats per row of `width`
        /// elements that optimizer keeps (for restoring state from a checkpoint).
        pub fn state_of(name: &str, width: usize) -> Result<(&'static str, usize)> {
            $(
                if name == <$variant as RowOptimizer>::NAME {
                    return Ok((<$variant as RowOptimizer>::NAME, <$variant as RowOptimizer>::state_len(width)));
                }
            )*
            bail!("unknown optimizer '{name}' (known: {})", NAMES.join(", "))
        }

        impl Optimizer {
            /// The optimizer called `name`, configured from `c`.
            pub fn new(name: &str, c: &OptimizerConfig) -> Result<Self> {
                $(
                    if name == <$variant as RowOptimizer>::NAME {
                        return Ok(Optimizer::$variant(<$variant as RowOptimizer>::from_config(c)?));
                    }
                )*
                bail!("unknown optimizer '{name}' (known: {})", NAMES.join(", "))
            }

            /// Its registry name.
            #[must_use]
            pub fn name(&self) -> &'static str {
                match self {
                    $(Optimizer::$variant(_) => <$variant as RowOptimizer>::NAME,)*
                }
            }

            /// State floats per row of `width` elements.
            #[must_use]
            pub fn state_len(&self, width: usize) -> usize {
                match self {
                    $(Optimizer::$variant(_) => <$variant as RowOptimizer>::state_len(width),)*
                }
            }

            /// Starting value of the state.
            #[must_use]
            pub fn initial_state(&self) -> f32 {
                match self {
                    $(Optimizer::$variant(o) => o.initial_state(),)*
                }
            }

            /// As it runs at step `step`.
            #[must_use]
            pub fn at_step(self, step: u64) -> Self {
                match self {
                    $(Optimizer::$variant(o) => Optimizer::$variant(o.at_step(step)),)*
                }
            }

            /// Update one row.
            #[inline(always)]
            pub fn apply(&self, w: &mut [f32], g: &[f32], s: &mut [f32]) {
                match self {
                    $(Optimizer::$variant(o) => o.apply(w, g, s),)*
                }
            }

            /// Update the stored row in place, element by element, if the optimizer can
            /// (see [`RowOptimizer::elementwise`]): `load`/`store` read and write element `k`.
            #[inline(always)]
            pub(crate) fn elementwise(
                &self,
                g: &[f32],
                mut load: impl FnMut(usize) -> f32,
                mut store: impl FnMut(usize, f32),
            ) -> bool {
                match self {
                    $(Optimizer::$variant(o) => match o.elementwise() {
                        Some(f) => {
                            for (k, gk) in g.iter().enumerate() {
                                store(k, f(o, load(k), *gk));
                            }
                            true
                        }
                        None => false,
                    },)*
                }
            }
        }
    };
}

optimizers!(Sgd, Adagrad, RowwiseAdagrad, Adam);

/// A plain reference of the update every optimizer's `apply` is tested against: the same
/// formulas written out per element in `f64`.
#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> OptimizerConfig {
        OptimizerConfig {
            weight_decay: 0.01,
            ..OptimizerConfig::new(0.1, 1e-8, 0.01, 0.5)
        }
    }

    #[test]
    fn every_name_builds_and_unknown_names_are_refused() {
        for n in NAMES {
            assert_eq!(Optimizer::new(n, &cfg()).unwrap().name(), *n);
        }
        let e = Optimizer::new("lamb", &cfg()).unwrap_err().to_string();
        assert!(
            e.contains("unknown optimizer 'lamb'") && e.contains("sgd"),
            "{e}"
        );
        let bad = OptimizerConfig {
            lr: f32::NAN,
            ..cfg()
        };
        assert!(Optimizer::new("sgd", &bad).is_err());
    }

    #[test]
    fn each_matches_its_formula() {
        let g = [0.5f32, -1.0, 2.0, 0.25];
        let w0 = [1.0f32, 2.0, -3.0, 0.0];
        for n in NAMES {
            let o = Optimizer::new(n, &cfg()).unwrap().at_step(3);
            let mut w = w0;
            let mut s = vec![o.initial_state(); o.state_len(4)];
            o.apply(&mut w, &g, &mut s);
            let (lr, eps, init) = (0.1f64, 1e-8f64, 0.5f64);
            for k in 0..4 {
                let (gk, wk) = (f64::from(g[k]), f64::from(w0[k]));
                let want = match *n {
                    "sgd" => wk - lr * gk,
                    "adagrad" => {
                        let clr = lr / (1.0 + 2.0 * 0.01);
                        wk - clr * gk / ((init + gk * gk).sqrt() + eps)
                    }
                    "rowwise_adagrad" => {
                        let m = init + g.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>() / 4.0;
                        wk - lr * gk / (m.sqrt() + eps)
                    }
                    "adam" => {
                        // First update from zero state at step 3: m = 0.1 g, v = 0.001 g².
                        let (b1, b2, wd) = (0.9f64, 0.999f64, 0.01f64);
                        let m = (1.0 - b1) * gk / (1.0 - b1.powi(3));
                        let v = (1.0 - b2) * gk * gk / (1.0 - b2.powi(3));
                        wk - lr * (m / (v.sqrt() + eps) + wd * wk)
                    }
                    other => panic!("no reference for optimizer '{other}': add one here"),
                };
                assert!(
                    (f64::from(w[k]) - want).abs() < 1e-5,
                    "{n}[{k}]: {} vs {want}",
                    w[k]
                );
            }
        }
    }
}
