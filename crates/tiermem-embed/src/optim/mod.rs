//! Row optimizers fused into the backward pass: each is one file implementing
//! [`RowOptimizer`] and one line in the [`optimizers!`] list below, which generates the
//! [`Optimizer`] enum the kernels dispatch on (one `match` per row, inlined: no virtual
//! call in the update loop), the registry of names ([`NAMES`], exported to Python) and the
//! constructor from a name and [`OptimizerConfig`].

mod adagrad;
mod adam;
mod lamb;
mod lars_sgd;
mod momentum_sgd;
mod partial_rowwise_adam;
mod partial_rowwise_lamb;
mod rowwise_adagrad;
mod sgd;

pub use adagrad::Adagrad;
pub use adam::{Adam, Moments};
pub use lamb::Lamb;
pub use lars_sgd::LarsSgd;
pub use momentum_sgd::MomentumSgd;
pub use partial_rowwise_adam::PartialRowwiseAdam;
pub use partial_rowwise_lamb::PartialRowwiseLamb;
pub use rowwise_adagrad::RowwiseAdagrad;
pub use sgd::Sgd;

use tiermem_core::{bail, ensure, Result};

/// How weight decay enters an update.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decay {
    /// Added to the gradient (`g + wd w`), before the optimizer's statistics: `torch.optim`'s
    /// `weight_decay`, FBGEMM's `WeightDecayMode.L2`.
    L2,
    /// Applied to the weight beside the step (`w -= lr wd w`): AdamW's form, FBGEMM's
    /// `WeightDecayMode.DECOUPLED`.
    Decoupled,
}

/// The names [`Decay::parse`] takes.
pub const DECAY_MODES: &[&str] = &["l2", "decoupled"];

impl Decay {
    /// From its name in [`DECAY_MODES`].
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "l2" => Ok(Decay::L2),
            "decoupled" => Ok(Decay::Decoupled),
            _ => bail!(
                "unknown weight_decay_mode '{s}' (known: {})",
                DECAY_MODES.join(", ")
            ),
        }
    }
}

/// The decay mode `c` asks for, or `default` (the optimizer's own form); an optimizer that
/// has one form only passes it as the only one in `allowed`.
pub(crate) fn decay_mode(
    name: &str,
    c: &OptimizerConfig,
    default: Decay,
    allowed: &[Decay],
) -> Result<Decay> {
    let d = c.weight_decay_mode.unwrap_or(default);
    ensure!(
        allowed.contains(&d),
        "optimizer '{name}' has no {d:?} weight decay (it has: {:?})",
        allowed
    );
    Ok(d)
}

/// `1 / (1 - beta^t)` for the step `t` (1-based): Adam's and LAMB's bias correction.
pub(crate) fn bias_correction(beta: f32, step: u64) -> f32 {
    let t = i32::try_from(step.max(1)).unwrap_or(i32::MAX);
    (1.0 / (1.0 - f64::from(beta).powi(t))) as f32
}

/// Check that a moment decay is in `[0, 1)`.
pub(crate) fn check_beta(name: &str, what: &str, b: f32) -> Result<()> {
    ensure!(
        b.is_finite() && (0.0..1.0).contains(&b),
        "optimizer '{name}': {what} must be in [0, 1), not {b}"
    );
    Ok(())
}

/// The Euclidean norm of a row, summed in `f64`.
#[inline(always)]
pub(crate) fn norm(x: &[f32]) -> f32 {
    x.iter()
        .map(|v| f64::from(*v) * f64::from(*v))
        .sum::<f64>()
        .sqrt() as f32
}

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
    /// Weight decay (each optimizer's form unless `weight_decay_mode` says).
    pub weight_decay: f32,
    /// How weight decay enters the update; `None`: the optimizer's own form.
    pub weight_decay_mode: Option<Decay>,
    /// Momentum (`momentum_sgd`, `lars_sgd`).
    pub momentum: f32,
    /// LARS's trust coefficient.
    pub eta: f32,
}

/// The settings [`OptimizerConfig::set`] takes, by the names `torch.optim` and FBGEMM give
/// them (exported to Python, which passes its config's values under these names).
pub const SETTINGS: &[&str] = &[
    "lr",
    "eps",
    "lr_decay",
    "initial_accumulator_value",
    "beta1",
    "beta2",
    "weight_decay",
    "momentum",
    "eta",
];

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
            weight_decay_mode: None,
            momentum: 0.0,
            eta: 0.001,
        }
    }

    /// Set the setting called `key` (one of [`SETTINGS`]).
    pub fn set(&mut self, key: &str, v: f32) -> Result<()> {
        let slot = match key {
            "lr" => &mut self.lr,
            "eps" => &mut self.eps,
            "lr_decay" => &mut self.lr_decay,
            "initial_accumulator_value" => &mut self.initial_accumulator,
            "beta1" => &mut self.beta1,
            "beta2" => &mut self.beta2,
            "weight_decay" => &mut self.weight_decay,
            "momentum" => &mut self.momentum,
            "eta" => &mut self.eta,
            _ => bail!(
                "unknown optimizer setting '{key}' (known: {})",
                SETTINGS.join(", ")
            ),
        };
        *slot = v;
        Ok(())
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

optimizers!(
    Sgd,
    Adagrad,
    RowwiseAdagrad,
    Adam,
    MomentumSgd,
    PartialRowwiseAdam,
    Lamb,
    PartialRowwiseLamb,
    LarsSgd,
);

/// A plain reference of the update every optimizer's `apply` is tested against: the same
/// formulas written out per element in `f64`, from a first update at step 3.
#[cfg(test)]
mod tests {
    use super::*;

    /// Settings every optimizer takes (`sgd` refuses momentum: [`cfg_for`]).
    fn cfg() -> OptimizerConfig {
        OptimizerConfig {
            weight_decay: 0.01,
            momentum: 0.5,
            eta: 0.2,
            ..OptimizerConfig::new(0.1, 1e-8, 0.01, 0.5)
        }
    }

    fn cfg_for(name: &str) -> OptimizerConfig {
        let momentum = if name == "sgd" { 0.0 } else { 0.5 };
        OptimizerConfig { momentum, ..cfg() }
    }

    #[test]
    fn every_name_builds_and_bad_configs_are_refused() {
        for n in NAMES {
            assert_eq!(Optimizer::new(n, &cfg_for(n)).unwrap().name(), *n);
        }
        let e = Optimizer::new("sgd", &cfg()).unwrap_err().to_string();
        assert!(e.contains("use 'momentum_sgd'"), "{e}");
        let e = Optimizer::new("shampoo", &cfg()).unwrap_err().to_string();
        assert!(
            e.contains("unknown optimizer 'shampoo'") && e.contains("lamb"),
            "{e}"
        );
        let bad = OptimizerConfig {
            lr: f32::NAN,
            ..cfg()
        };
        assert!(Optimizer::new("sgd", &bad).is_err());
        let l2 = OptimizerConfig {
            weight_decay_mode: Some(Decay::L2),
            ..cfg()
        };
        let e = Optimizer::new("adam", &l2).unwrap_err().to_string();
        assert!(e.contains("'adam' has no L2 weight decay"), "{e}");
        let beta = OptimizerConfig {
            beta2: 1.0,
            ..cfg()
        };
        assert!(Optimizer::new("lamb", &beta)
            .unwrap_err()
            .to_string()
            .contains("beta2"));
        let mut c = cfg();
        c.set("eta", 0.5).unwrap();
        assert_eq!(c.eta, 0.5);
        assert!(c
            .set("nesterov", 1.0)
            .unwrap_err()
            .to_string()
            .contains("'nesterov'"));
        assert!(Decay::parse("l1")
            .unwrap_err()
            .to_string()
            .contains("l2, decoupled"));
    }

    fn norm64(x: &[f64]) -> f64 {
        x.iter().map(|v| v * v).sum::<f64>().sqrt()
    }

    /// The row after one update of a fresh state at step 3.
    fn reference(name: &str, c: &OptimizerConfig, mode: Decay, w: &[f64], g: &[f64]) -> Vec<f64> {
        let (lr, eps, wd) = (f64::from(c.lr), f64::from(c.eps), f64::from(c.weight_decay));
        let (b1, b2) = (f64::from(c.beta1), f64::from(c.beta2));
        // Momentum does not show in one update from a fresh state (the buffer becomes the
        // step); the tests against torch.optim.SGD check it over many.
        let (eta, init) = (f64::from(c.eta), f64::from(c.initial_accumulator));
        let n = w.len() as f64;
        let (c1, c2) = (1.0 / (1.0 - b1.powi(3)), 1.0 / (1.0 - b2.powi(3)));
        let adam_r = |k: usize, v: f64| (1.0 - b1) * g[k] * c1 / ((v * c2).sqrt() + eps);
        let trust = |r: &[f64]| {
            let ratio = norm64(w) / norm64(r);
            w.iter()
                .zip(r)
                .map(|(wk, rk)| wk - lr * ratio * rk)
                .collect()
        };
        let mean_sq = g.iter().map(|x| x * x).sum::<f64>() / n;
        match name {
            "sgd" => w
                .iter()
                .zip(g)
                .map(|(wk, gk)| wk - lr * (gk + wd * wk))
                .collect(),
            "momentum_sgd" => w
                .iter()
                .zip(g)
                .map(|(wk, gk)| wk - lr * (gk + wd * wk))
                .collect(),
            "adagrad" => {
                let clr = lr / (1.0 + 2.0 * f64::from(c.lr_decay));
                let (l2, keep) = if mode == Decay::L2 {
                    (wd, 1.0)
                } else {
                    (0.0, 1.0 - clr * wd)
                };
                w.iter()
                    .zip(g)
                    .map(|(wk, gk)| {
                        let d = gk + l2 * wk;
                        keep * wk - clr * d / ((init + d * d).sqrt() + eps)
                    })
                    .collect()
            }
            "rowwise_adagrad" => {
                let l2 = if mode == Decay::L2 { wd } else { 0.0 };
                let m = init
                    + w.iter()
                        .zip(g)
                        .map(|(wk, gk)| (gk + l2 * wk).powi(2))
                        .sum::<f64>()
                        / n;
                let mult = lr / (m.sqrt() + eps);
                let keep = if mode == Decay::L2 {
                    1.0 - mult * wd
                } else {
                    1.0 - lr * wd
                };
                w.iter()
                    .zip(g)
                    .map(|(wk, gk)| keep * wk - mult * gk)
                    .collect()
            }
            "adam" => (0..w.len())
                .map(|k| w[k] - lr * (adam_r(k, (1.0 - b2) * g[k] * g[k]) + wd * w[k]))
                .collect(),
            "partial_rowwise_adam" => (0..w.len())
                .map(|k| w[k] - lr * (adam_r(k, (1.0 - b2) * mean_sq) + wd * w[k]))
                .collect(),
            "lamb" => {
                let r: Vec<f64> = (0..w.len())
                    .map(|k| adam_r(k, (1.0 - b2) * g[k] * g[k]) + wd * w[k])
                    .collect();
                trust(&r)
            }
            "partial_rowwise_lamb" => {
                let r: Vec<f64> = (0..w.len())
                    .map(|k| adam_r(k, (1.0 - b2) * mean_sq) + wd * w[k])
                    .collect();
                trust(&r)
            }
            "lars_sgd" => {
                let a = lr * eta * norm64(w) / (norm64(g) + wd * norm64(w));
                w.iter()
                    .zip(g)
                    .map(|(wk, gk)| wk - a * (gk + wd * wk))
                    .collect()
            }
            other => panic!("no reference for optimizer '{other}': add one here"),
        }
    }

    #[test]
    fn each_matches_its_formula() {
        let g = [0.5f32, -1.0, 2.0, 0.25];
        let w0 = [1.0f32, 2.0, -3.0, 0.5];
        for n in NAMES {
            for mode in [None, Some(Decay::L2), Some(Decay::Decoupled)] {
                let c = OptimizerConfig {
                    weight_decay_mode: mode,
                    ..cfg_for(n)
                };
                let Ok(o) = Optimizer::new(n, &c) else {
                    assert!(mode.is_some(), "{n} refuses its own weight decay form");
                    continue; // a form this optimizer does not have
                };
                let o = o.at_step(3);
                let mut w = w0;
                let mut s = vec![o.initial_state(); o.state_len(4)];
                o.apply(&mut w, &g, &mut s);
                let own = if [
                    "adam",
                    "partial_rowwise_adam",
                    "lamb",
                    "partial_rowwise_lamb",
                ]
                .contains(n)
                {
                    Decay::Decoupled
                } else {
                    Decay::L2
                };
                let want = reference(
                    n,
                    &c,
                    mode.unwrap_or(own),
                    &w0.map(f64::from),
                    &g.map(f64::from),
                );
                for k in 0..4 {
                    assert!(
                        (f64::from(w[k]) - want[k]).abs() < 1e-5,
                        "{n} {mode:?} [{k}]: {} vs {}",
                        w[k],
                        want[k]
                    );
                }
            }
        }
    }

    #[test]
    fn trust_ratio_is_one_where_a_norm_is_zero() {
        let o = Optimizer::new("lamb", &cfg()).unwrap().at_step(1);
        let mut w = [0f32; 4];
        let mut s = vec![0f32; o.state_len(4)];
        o.apply(&mut w, &[1.0, 1.0, 1.0, 1.0], &mut s);
        assert!(w.iter().all(|x| x.is_finite() && *x < 0.0), "{w:?}");
        let o = Optimizer::new("lars_sgd", &cfg()).unwrap();
        let mut w = [0f32; 4];
        let mut s = vec![0f32; 4];
        o.apply(&mut w, &[0.0; 4], &mut s);
        assert!(w.iter().all(|x| *x == 0.0), "{w:?}");
    }
}
