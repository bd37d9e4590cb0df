//! Every optimised kernel against the plain scalar reference (`tiermem_embed::reference`),
//! on every instruction set this CPU has (forced in turn with `arch::force_isa`), for both
//! storage types, specialised and general widths, every mode, weights and padding, direct
//! and cached tables, and every optimizer of the registry.

use std::sync::Arc;

use tiermem_core::arch::{self, Isa};
use tiermem_core::manager::Manager;
use tiermem_embed::cache::policy::Dynamic;
use tiermem_embed::optim::{self, Optimizer, OptimizerConfig};
use tiermem_embed::update::{update, GradIn};
use tiermem_embed::workload::Rng;
use tiermem_embed::{lookup, reference, Bags, CacheConfig, DType, LookupOut, Mode, Table};

use super::two_tier;

const ROWS: usize = 300;

fn close(a: &[f32], b: &[f32], tol: f32, what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    for (k, (x, y)) in a.iter().zip(b).enumerate() {
        assert!(
            (x - y).abs() <= tol * (1.0 + y.abs()),
            "{what}: element {k}: kernel {x} vs reference {y}"
        );
    }
}

/// A direct or cached (dynamic, a third of the rows) table with random rows and row 3 as
/// padding.
fn table(m: &Arc<Manager>, cached: bool, width: usize, dtype: DType, rng: &mut Rng) -> Table {
    let t = if cached {
        let bytes = (ROWS * width * 4 / 3) as u64;
        let cfg = CacheConfig {
            admission: None,
            lower: bytes,
            slack: bytes / 4,
            policy: &Dynamic,
        };
        Table::cached(m, 1, 0, ROWS, width, dtype, cfg).unwrap()
    } else {
        Table::direct(m, 0, ROWS, width, dtype).unwrap()
    };
    let init: Vec<f32> = (0..ROWS * width).map(|_| rng.f64() as f32 - 0.5).collect();
    t.write_rows(0, &init).unwrap();
    t.set_padding_idx(Some(3)).unwrap();
    t
}

fn batch(rng: &mut Rng, bags: usize) -> (Vec<i64>, Vec<i64>, Vec<f32>) {
    let mut values = Vec::new();
    let mut offsets = vec![0i64];
    for b in 0..bags {
        for _ in 0..(b % 5) {
            values.push(rng.below(if b % 2 == 0 { 10 } else { ROWS as u64 }) as i64);
        }
        offsets.push(values.len() as i64);
    }
    let w = (0..values.len()).map(|_| rng.f64() as f32).collect();
    (values, offsets, w)
}

fn isas() -> Vec<Isa> {
    let a = arch::available();
    assert!(a.contains(&Isa::Scalar));
    a
}

#[test]
fn lookups_match_the_reference_on_every_isa() {
    let m = Arc::new(two_tier(32 << 20, 64 << 20, "lru"));
    let mut rng = Rng::new(11);
    for isa in isas() {
        arch::force_isa(Some(isa)).unwrap();
        for (width, dtype) in [
            (16, DType::F32),
            (7, DType::F32),
            (64, DType::Bf16),
            (100, DType::Bf16),
        ] {
            for cached in [false, true] {
                let t = table(&m, cached, width, dtype, &mut rng);
                let r = table(&m, false, width, dtype, &mut Rng::new(0));
                let all: Vec<f32> = {
                    let mut v = vec![0f32; ROWS * width];
                    t.read_rows(0, &mut v).unwrap();
                    v
                };
                r.write_rows(0, &all).unwrap();
                r.set_padding_idx(Some(3)).unwrap();
                for (k, mode) in [Mode::Sum, Mode::Mean, Mode::None, Mode::Sum]
                    .into_iter()
                    .enumerate()
                {
                    let (values, offsets, weights) = batch(&mut rng, 40);
                    let w = (k == 3).then_some(&weights[..]);
                    let bags = Bags::new(0, &values, &offsets, w).unwrap();
                    let n = if mode == Mode::None { values.len() } else { 40 };
                    let mut out = vec![0f32; n * width];
                    lookup(
                        &[&t],
                        &[bags],
                        mode,
                        LookupOut {
                            data: &mut out,
                            row_stride: width,
                            cols: &[0],
                        },
                        8,
                    )
                    .unwrap();
                    let want = reference::lookup(&r, &bags, mode).unwrap();
                    close(
                        &out,
                        &want,
                        1e-6,
                        &format!("{isa:?} {dtype:?} w{width} cached={cached} {mode:?}"),
                    );
                }
            }
        }
    }
    arch::force_isa(None).unwrap();
}

#[test]
fn updates_match_the_reference_on_every_isa_for_every_optimizer() {
    let m = Arc::new(two_tier(32 << 20, 64 << 20, "lru"));
    let cfg = OptimizerConfig {
        weight_decay: 0.01,
        ..OptimizerConfig::new(0.05, 1e-8, 0.01, 0.1)
    };
    for isa in isas() {
        arch::force_isa(Some(isa)).unwrap();
        for name in optim::NAMES {
            let opt = Optimizer::new(name, &cfg).unwrap();
            for (width, dtype) in [
                (16, DType::F32),
                (9, DType::F32),
                (32, DType::Bf16),
                (16, DType::F16),
            ] {
                for cached in [false, true] {
                    let mut rng = Rng::new(width as u64);
                    let t = table(&m, cached, width, dtype, &mut rng);
                    let r = table(&m, false, width, dtype, &mut Rng::new(width as u64));
                    let mut state = vec![opt.initial_state(); ROWS * opt.state_len(width)];
                    for step in 1..=3u64 {
                        let mode = [Mode::Sum, Mode::Mean, Mode::None][step as usize - 1];
                        let (values, offsets, weights) = batch(&mut rng, 30);
                        let w = (mode == Mode::Sum).then_some(&weights[..]);
                        let bags = Bags::new(0, &values, &offsets, w).unwrap();
                        let n = if mode == Mode::None { values.len() } else { 30 };
                        let grad: Vec<f32> =
                            (0..n * width).map(|_| rng.f64() as f32 - 0.5).collect();
                        let g = GradIn {
                            data: &grad,
                            row_stride: width,
                            cols: &[0],
                        };
                        update(&[&t], &[bags], mode, g, opt, step == 2).unwrap();
                        reference::update(&r, &bags, mode, &grad, opt, step, &mut state).unwrap();
                    }
                    let (mut a, mut b) = (vec![0f32; ROWS * width], vec![0f32; ROWS * width]);
                    t.read_rows(0, &mut a).unwrap();
                    r.read_rows(0, &mut b).unwrap();
                    let tol = if dtype == DType::Bf16 { 1e-2 } else { 1e-5 };
                    close(
                        &a,
                        &b,
                        tol,
                        &format!("{isa:?} {name} {dtype:?} w{width} cached={cached}"),
                    );
                }
            }
        }
    }
    arch::force_isa(None).unwrap();
}
