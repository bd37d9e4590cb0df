//! Index generators for tests and benchmarks (thesis §5.4.1.1): uniform, Zipf(alpha) with
//! ranks scrambled per table by a maximum-length LFSR with its own seed (so popular rows are
//! not neighbours), and a production-like generator whose per-batch reuse histogram follows
//! the ones Meta published for its embedding-lookup datasets.

use rayon::prelude::*;

use tiermem_core::{ensure, Result};

/// Feedback masks of maximum-length Galois LFSRs, indexed by register width (2..=32 bits).
const TAPS: [u32; 33] = [
    0,
    0,
    0x3,
    0x6,
    0xC,
    0x14,
    0x30,
    0x60,
    0xB8,
    0x110,
    0x240,
    0x500,
    0x829,
    0x100D,
    0x2015,
    0x6000,
    0xD008,
    0x12000,
    0x20400,
    0x40023,
    0x90000,
    0x140000,
    0x300000,
    0x420000,
    0xE10000,
    0x1200000,
    0x2000023,
    0x4000013,
    0x9000000,
    0x14000000,
    0x20000029,
    0x48000000,
    0x8020_0003,
];

/// A maximum-length Galois LFSR: visits every non-zero state of its width once per period.
#[derive(Debug, Clone)]
pub struct Lfsr {
    state: u32,
    mask: u32,
}

impl Lfsr {
    /// The narrowest LFSR with at least `n` non-zero states, started at a state from `seed`.
    pub fn new(n: usize, seed: u64) -> Result<Self> {
        ensure!(
            (1..=u32::MAX as usize).contains(&n),
            "an LFSR permutation needs 1 to {} items, not {n}",
            u32::MAX
        );
        let bits = (usize::BITS - n.leading_zeros()).max(2) as usize;
        let period = (1u64 << bits) - 1;
        Ok(Lfsr {
            state: (seed % period) as u32 + 1,
            mask: TAPS[bits],
        })
    }

    /// Next state.
    #[inline]
    pub fn step(&mut self) -> u32 {
        let lsb = self.state & 1;
        self.state >>= 1;
        if lsb != 0 {
            self.state ^= self.mask;
        }
        self.state
    }

    /// `0..n` in the order an LFSR seeded with `seed` visits them (states beyond `n` are
    /// skipped): a scrambling permutation that is cheap and reproducible.
    pub fn permutation(n: usize, seed: u64) -> Result<impl Iterator<Item = usize>> {
        let mut l = Lfsr::new(n, seed)?;
        let mut left = n;
        Ok(std::iter::from_fn(move || {
            if left == 0 {
                return None;
            }
            loop {
                let s = l.step() as usize;
                if s <= n {
                    left -= 1;
                    return Some(s - 1);
                }
            }
        }))
    }
}

/// xoshiro256** seeded by SplitMix64: fast, reproducible, good enough for workloads.
#[derive(Debug, Clone)]
pub struct Rng([u64; 4]);

impl Rng {
    /// Seeded generator.
    #[must_use]
    pub fn new(seed: u64) -> Self {
        let mut x = seed;
        let mut next = || {
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        Rng([next(), next(), next(), next()])
    }

    /// Next 64 random bits.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.0;
        let r = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        r
    }

    /// Uniform in `[0, 1)`.
    #[inline]
    pub fn f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in `0..n` (n > 0).
    #[inline]
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }
}

/// Zipf(s) over ranks `1..=n` by rejection-inversion (Hörmann & Derflinger 1996): O(1) per
/// sample, any `s >= 0` including 1.
#[derive(Debug, Clone)]
pub struct Zipf {
    n: f64,
    s: f64,
    h_x1: f64,
    h_n: f64,
    cut: f64,
}

impl Zipf {
    /// Sampler over `1..=n` with exponent `s`.
    pub fn new(n: usize, s: f64) -> Result<Self> {
        ensure!(n >= 1, "Zipf needs at least one item");
        ensure!(
            s >= 0.0 && s.is_finite(),
            "Zipf exponent must be >= 0, not {s}"
        );
        let mut z = Zipf {
            n: n as f64,
            s,
            h_x1: 0.0,
            h_n: 0.0,
            cut: 0.0,
        };
        z.h_x1 = z.h_integral(1.5) - 1.0;
        z.h_n = z.h_integral(n as f64 + 0.5);
        z.cut = 2.0 - z.h_integral_inv(z.h_integral(2.5) - z.h(2.0));
        Ok(z)
    }

    fn h(&self, x: f64) -> f64 {
        (-self.s * x.ln()).exp()
    }

    fn h_integral(&self, x: f64) -> f64 {
        let l = x.ln();
        helper2((1.0 - self.s) * l) * l
    }

    fn h_integral_inv(&self, x: f64) -> f64 {
        let t = (x * (1.0 - self.s)).max(-1.0);
        (helper1(t) * x).exp()
    }

    /// A rank in `1..=n` (1 most likely).
    pub fn sample(&self, rng: &mut Rng) -> u64 {
        loop {
            let u = self.h_n + rng.f64() * (self.h_x1 - self.h_n);
            let x = self.h_integral_inv(u);
            let k = (x + 0.5).floor().clamp(1.0, self.n);
            if k - x <= self.cut || u >= self.h_integral(k + 0.5) - self.h(k) {
                return k as u64;
            }
        }
    }
}

/// `ln(1 + x) / x`, continuous at 0.
fn helper1(x: f64) -> f64 {
    if x.abs() > 1e-8 {
        x.ln_1p() / x
    } else {
        1.0 - x * (0.5 - x * (1.0 / 3.0 - 0.25 * x))
    }
}

/// `(exp(x) - 1) / x`, continuous at 0.
fn helper2(x: f64) -> f64 {
    if x.abs() > 1e-8 {
        x.exp_m1() / x
    } else {
        1.0 + x * 0.5 * (1.0 + x * (1.0 / 3.0) * (1.0 + 0.25 * x))
    }
}

/// Reuse-factor buckets of Meta's published histograms: a row is used `(lo, hi]` times in a
/// batch; the last bucket is open-ended (capped at 65536 here).
pub const REUSE_BUCKETS: [(u64, u64); 17] = [
    (0, 1),
    (1, 2),
    (2, 4),
    (4, 8),
    (8, 16),
    (16, 32),
    (32, 64),
    (64, 128),
    (128, 256),
    (256, 512),
    (512, 1024),
    (1024, 2048),
    (2048, 4096),
    (4096, 8192),
    (8192, 16384),
    (16384, 32768),
    (32768, 65536),
];

/// An index distribution.
#[derive(Debug, Clone)]
pub enum Dist {
    /// Every row equally likely.
    Uniform,
    /// Zipf with this exponent over popularity ranks, scrambled per table by an LFSR.
    Zipf(f64),
    /// Per batch, the share of distinct rows used `(lo, hi]` times follows these
    /// probabilities (one per [`REUSE_BUCKETS`] entry). Rows used more than once keep their
    /// popularity rank from batch to batch (hot rows stay hot); rows used once are drawn
    /// afresh.
    Production(Vec<f64>),
}

impl Dist {
    /// Every distribution's name, as [`Dist::parse`] takes them.
    pub const NAMES: &'static [&'static str] = &["uniform", "zipf", "production"];

    /// The distribution called `name`: `zipf` takes the exponent `alpha`, `production` the
    /// reuse histogram (one share per [`REUSE_BUCKETS`] entry).
    pub fn parse(name: &str, alpha: f64, histogram: Option<Vec<f64>>) -> Result<Self> {
        Ok(match (name, histogram) {
            ("uniform", _) => Dist::Uniform,
            ("zipf", _) => Dist::Zipf(alpha),
            ("production", Some(h)) => Dist::Production(h),
            ("production", None) => {
                tiermem_core::bail!("distribution 'production' needs a reuse histogram")
            }
            _ => tiermem_core::bail!(
                "unknown distribution '{name}' (known: {})",
                Self::NAMES.join(", ")
            ),
        })
    }
}

/// Generate one batch of fixed-size bags for each table: `tables[t]` rows, `batch` bags of
/// `bag` indices, reproducible from `seed` and `step` (the batch number). Returns each
/// table's `values` (length `batch * bag`).
pub fn generate(
    dist: &Dist,
    tables: &[usize],
    batch: usize,
    bag: usize,
    seed: u64,
    step: u64,
) -> Result<Vec<Vec<i64>>> {
    ensure!(
        tables.iter().all(|&r| r > 0 && r <= u32::MAX as usize),
        "every table needs 1 to {} rows",
        u32::MAX
    );
    if let Dist::Production(p) = dist {
        ensure!(
            p.len() == REUSE_BUCKETS.len()
                && p.iter().all(|x| *x >= 0.0)
                && p.iter().sum::<f64>() > 0.0,
            "a production histogram needs {} non-negative bucket shares, not {:?}",
            REUSE_BUCKETS.len(),
            p
        );
    }
    if let Dist::Zipf(s) = dist {
        Zipf::new(1, *s)?;
    }
    let n = batch * bag;
    tiermem_core::process::in_kernel_pool(|| {
        Ok(tables
            .par_iter()
            .enumerate()
            .map(|(t, &rows)| {
                let table_seed = seed.wrapping_mul(0x100_0000_01B3) ^ (t as u64 + 1);
                let mut rng = Rng::new(table_seed ^ step.wrapping_mul(0x9E37_79B9_7F4A_7C15));
                match dist {
                    Dist::Uniform => (0..n).map(|_| rng.below(rows as u64) as i64).collect(),
                    Dist::Zipf(s) => {
                        let perm: Vec<u32> = Lfsr::permutation(rows, table_seed)
                            .expect("rows checked")
                            .map(|r| r as u32)
                            .collect();
                        let z = Zipf::new(rows, *s).expect("checked");
                        (0..n)
                            .map(|_| i64::from(perm[(z.sample(&mut rng) - 1) as usize]))
                            .collect()
                    }
                    Dist::Production(p) => production(p, rows, n, table_seed, &mut rng),
                }
            })
            .collect())
    })?
}

fn production(p: &[f64], rows: usize, n: usize, table_seed: u64, rng: &mut Rng) -> Vec<i64> {
    let total: f64 = p.iter().sum();
    // Multiplicities of distinct rows until they cover n indices (and no more rows than
    // the table has).
    let mut mult: Vec<u64> = Vec::new();
    let mut covered = 0u64;
    while covered < n as u64 && mult.len() < rows {
        let mut u = rng.f64() * total;
        let mut b = 0;
        while b + 1 < p.len() && u >= p[b] {
            u -= p[b];
            b += 1;
        }
        let (lo, hi) = REUSE_BUCKETS[b];
        let m = (lo + 1 + rng.below(hi - lo)).min(n as u64 - covered);
        mult.push(m);
        covered += m;
    }
    if covered < n as u64 {
        // Table smaller than the batch's distinct rows: spread the rest over what exists.
        let extra = n as u64 - covered;
        let k = mult.len() as u64;
        for (i, m) in mult.iter_mut().enumerate() {
            *m += extra / k + u64::from((i as u64) < extra % k);
        }
    }
    mult.sort_unstable_by(|a, b| b.cmp(a));
    // Rows: reused rows take stable popularity ranks (scrambled by the table's LFSR); rows
    // used once are drawn uniformly from the rows not yet taken.
    let mut taken = vec![false; rows];
    let mut rank = Lfsr::permutation(rows, table_seed).expect("rows checked");
    let mut out = Vec::with_capacity(n);
    for &m in &mult {
        let row = if m > 1 {
            loop {
                let r = rank.next().expect("fewer distinct rows than table rows");
                if !taken[r] {
                    break r;
                }
            }
        } else {
            loop {
                let r = rng.below(rows as u64) as usize;
                if !taken[r] {
                    break r;
                }
            }
        };
        taken[row] = true;
        out.extend(std::iter::repeat_n(row as i64, m as usize));
    }
    for i in (1..out.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        out.swap(i, j);
    }
    out
}

/// Fill `out` with values uniform in `[low, high)`: element `k` is a pure function of `seed`
/// and `start + k` (splitmix64 of the index), so any split into chunks or threads gives the
/// same numbers. Initial embedding rows for every placement of a model come from here.
pub fn uniform_fill(out: &mut [f32], low: f32, high: f32, seed: u64, start: u64) {
    use rayon::prelude::*;
    const CHUNK: usize = 1 << 16;
    let span = high - low;
    out.par_chunks_mut(CHUNK).enumerate().for_each(|(c, xs)| {
        let base = start + (c * CHUNK) as u64;
        for (k, x) in xs.iter_mut().enumerate() {
            let mut z = (seed ^ 0x6A09_E667_F3BC_C909)
                .wrapping_add((base + k as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            // 24 random bits: every value exactly representable, in [0, 1).
            let u = (z >> 40) as f32 * (1.0 / (1u64 << 24) as f32);
            *x = low + span * u;
        }
    });
}

/// Share of distinct rows of `values` in each reuse bucket (as Meta's histograms report).
#[must_use]
pub fn reuse_histogram(values: &[i64]) -> Vec<f64> {
    let mut counts = std::collections::HashMap::<i64, u64>::new();
    for &v in values {
        *counts.entry(v).or_default() += 1;
    }
    let mut h = vec![0f64; REUSE_BUCKETS.len()];
    for &c in counts.values() {
        let b = REUSE_BUCKETS
            .iter()
            .position(|&(lo, hi)| c > lo && c <= hi)
            .unwrap_or(REUSE_BUCKETS.len() - 1);
        h[b] += 1.0;
    }
    let k = counts.len().max(1) as f64;
    h.iter().map(|x| x / k).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lfsr_taps_are_maximum_length() {
        for (bits, &mask) in TAPS.iter().enumerate().take(21).skip(2) {
            let mut l = Lfsr { state: 1, mask };
            let period = (1u64 << bits) - 1;
            let mut k = 0u64;
            loop {
                k += 1;
                if l.step() == 1 {
                    break;
                }
                assert!(k <= period, "{bits} bits: period exceeds {period}");
            }
            assert_eq!(k, period, "{bits} bits");
        }
    }

    #[test]
    fn lfsr_permutation_is_a_permutation() {
        for n in [1usize, 2, 3, 7, 8, 1000, 4097] {
            let mut v: Vec<usize> = Lfsr::permutation(n, 42).unwrap().collect();
            v.sort_unstable();
            assert_eq!(v, (0..n).collect::<Vec<_>>());
        }
    }

    #[test]
    fn zipf_matches_its_probabilities() {
        let n = 100;
        let z = Zipf::new(n, 1.0).unwrap();
        let mut rng = Rng::new(7);
        let mut c = vec![0u64; n + 1];
        let draws = 400_000;
        for _ in 0..draws {
            c[z.sample(&mut rng) as usize] += 1;
        }
        let hn: f64 = (1..=n).map(|k| 1.0 / k as f64).sum();
        for k in [1usize, 2, 10, 100] {
            let want = draws as f64 / (k as f64 * hn);
            let got = c[k] as f64;
            assert!(
                (got - want).abs() < 5.0 * want.sqrt() + 5.0,
                "rank {k}: {got} vs {want}"
            );
        }
    }

    #[test]
    fn production_reproduces_the_histogram() {
        let p = vec![
            0.473, 0.152, 0.139, 0.112, 0.072, 0.032, 0.011, 0.005, 0.002, 0.001, 0.0, 0.0, 0.0,
            0.0, 0.0, 0.0, 0.0,
        ];
        let v = generate(&Dist::Production(p.clone()), &[1 << 20], 4096, 40, 1, 0).unwrap();
        assert_eq!(v[0].len(), 4096 * 40);
        let h = reuse_histogram(&v[0]);
        for (b, (got, want)) in h.iter().zip(&p).enumerate() {
            assert!((got - want).abs() < 0.01, "bucket {b}: {got} vs {want}");
        }
    }
}
