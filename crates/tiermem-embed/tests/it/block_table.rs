//! Block tables (rows in a table file, read through a staged DRAM cache) against direct DRAM
//! tables: bit-identical lookups and updates under every prefetch admission, with flushes,
//! re-attaching the file in a new table, and rows wider than a block; updates survive a
//! failed write-back; bad configurations are refused with the numbers.

use std::path::Path;
use std::sync::Arc;

use tiermem_core::manager::Manager;
use tiermem_embed::bags::Bags;
use tiermem_embed::blockfile::BlockFile;
use tiermem_embed::cache::policy::Dynamic;
use tiermem_embed::cache::Admission;
use tiermem_embed::optim::{Decay, RowwiseAdagrad, Sgd};
use tiermem_embed::update::{update, GradIn};
use tiermem_embed::workload::Rng;
use tiermem_embed::{lookup, CacheConfig, DType, LookupOut, Mode, Optimizer, Table};

use super::{look, scratch, two_tier};

const ROWS: usize = 600;
const BAGS: usize = 24;

fn config(rows: usize, stride: usize, admission: &str) -> CacheConfig {
    let bytes = (rows * stride) as u64;
    CacheConfig {
        admission: Some(Admission::parse(admission).unwrap()),
        lower: bytes * 3 / 4,
        slack: bytes / 4,
        policy: &Dynamic,
    }
}

fn open_block(
    m: &Arc<Manager>,
    path: &Path,
    create: Option<(usize, DType)>,
    cfg: CacheConfig,
) -> Table {
    let file = match create {
        Some((width, dtype)) => {
            BlockFile::create(path, "t", ROWS as u64, width as u32, dtype, true, 8).unwrap()
        }
        None => BlockFile::open(path, "t", 8, None, false).unwrap(),
    };
    Table::block(m, 0, file, cfg.clone()).unwrap()
}

fn batch(rng: &mut Rng) -> (Vec<i64>, Vec<i64>) {
    let mut offsets = vec![0i64];
    let mut values = Vec::new();
    for _ in 0..BAGS {
        for _ in 0..rng.below(6) {
            let r = if rng.below(2) == 0 {
                rng.below(30)
            } else {
                rng.below(ROWS as u64)
            };
            values.push(r as i64);
        }
        offsets.push(values.len() as i64);
    }
    (values, offsets)
}

fn step(t: &Table, bags: Bags<'_>, grad: &[f32], width: usize, opt: Optimizer) {
    let g = GradIn {
        data: grad,
        row_stride: width,
        cols: &[0],
    };
    update(&[t], &[bags], Mode::Sum, g, opt, false).unwrap();
}

fn header(t: &Table) -> tiermem_embed::blockfile::format::Header {
    *t.cache().unwrap().home().block().unwrap().file().header()
}

fn all_rows(t: &Table) -> Vec<f32> {
    let mut v = vec![0f32; t.rows() * t.featuresize()];
    t.read_rows(0, &mut v).unwrap();
    v
}

/// A new table over the same file, carrying the optimizer state over (as a checkpoint does).
fn reopen(m: &Arc<Manager>, t: Table, path: &Path, cfg: CacheConfig) -> Table {
    let state = t.optimizer_state_info().unwrap().map(|(k, n, steps)| {
        let mut v = vec![0f32; n];
        t.read_optimizer_state(0, &mut v).unwrap();
        (k, v, steps)
    });
    drop(t); // writes the dirty rows back
    let t = open_block(m, path, None, cfg.clone());
    if let Some((k, v, steps)) = state {
        t.set_optimizer_state(k, 0, &v, steps).unwrap();
    }
    t
}

#[test]
fn block_tables_match_direct_tables_bit_for_bit() {
    let m = Arc::new(two_tier(64 << 20, 64 << 20, "lru"));
    let dir = scratch("block-table");
    for (width, dtype) in [(16, DType::F32), (7, DType::Bf16), (1100, DType::F32)] {
        let stride = dtype.row_bytes(width).next_multiple_of(4);
        for prefetch in ["row", "block", "threshold:1", "shadow:1.5"] {
            let what = format!("width {width} {dtype:?} {}", prefetch);
            let path = dir.join(format!("t{width}-{}.tmb", prefetch.replace(':', "_")));
            let cfg = config(160, stride, prefetch);
            let direct = Table::direct(&m, 0, ROWS, width, dtype).unwrap();
            let mut block = open_block(&m, &path, Some((width, dtype)), cfg.clone());
            let mut rng = Rng::new(width as u64);
            let init: Vec<f32> = (0..ROWS * width).map(|_| rng.f64() as f32 - 0.5).collect();
            direct.write_rows(0, &init).unwrap();
            block.write_rows(0, &init).unwrap();
            let counts: Vec<u32> = (0..ROWS).map(|_| rng.below(4) as u32).collect();
            block.cache().unwrap().set_access_counts(counts).unwrap();
            for s in 0..8 {
                let (values, offsets) = batch(&mut rng);
                let bags = Bags::new(0, &values, &offsets, None).unwrap();
                assert_eq!(
                    look(&direct, bags, width, BAGS),
                    look(&block, bags, width, BAGS),
                    "{what} step {s}"
                );
                let grad: Vec<f32> = (0..BAGS * width).map(|_| rng.f64() as f32 - 0.5).collect();
                let opt = if s % 2 == 0 {
                    Optimizer::Sgd(Sgd {
                        lr: 0.1,
                        weight_decay: 0.0,
                    })
                } else {
                    Optimizer::RowwiseAdagrad(RowwiseAdagrad {
                        lr: 0.1,
                        eps: 1e-8,
                        initial_accumulator: 0.0,
                        weight_decay: 0.0,
                        decay: Decay::L2,
                    })
                };
                step(&direct, bags, &grad, width, opt);
                step(&block, bags, &grad, width, opt);
                block.cache().unwrap().check().unwrap();
                match s {
                    2 => {
                        block.flush(true).unwrap();
                    }
                    4 => block = reopen(&m, block, &path, cfg.clone()),
                    5 => block.sync().unwrap(),
                    6 => {
                        // A random order, written in chunks of about a third of the file
                        // (several passes over the old file).
                        let mut layout: Vec<u32> = (0..ROWS as u32).collect();
                        for i in (1..ROWS).rev() {
                            layout.swap(i, rng.below(i as u64 + 1) as usize);
                        }
                        let h = header(&block);
                        let mut calls = 0;
                        let chunk = (h.data_blocks / 3).max(2) / 2 * 2; // whole wide rows
                        let budget = chunk as usize * 4096;
                        block.relayout(layout, budget, |_, _| calls += 1).unwrap();
                        let f = header(&block).generation;
                        assert_eq!(f, h.generation + 1, "{what}");
                        assert_eq!(calls, h.data_blocks.div_ceil(chunk), "{what}: chunks");
                        assert!(calls > 1, "{what}");
                        assert!(!tiermem_embed::blockfile::aside(&path).exists());
                    }
                    _ => {}
                }
            }
            assert!(all_rows(&direct) == all_rows(&block), "{what}: rows differ");
            let (_, c) = block.cache().unwrap().stage_info().unwrap();
            assert!(c.misses > 0 && c.blocks_read > 0, "{what}: {c:?}");
            if prefetch == "block" && width < 1000 {
                assert!(c.prefetched > 0, "{what}: {c:?}");
            }
            if prefetch == "row" {
                assert_eq!(c.prefetched, 0, "{what}: {c:?}");
            }
            // A new table over the file after the last drop reads the same rows.
            let block = reopen(&m, block, &path, cfg);
            assert!(
                all_rows(&direct) == all_rows(&block),
                "{what}: rows differ after reopening"
            );
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_batch_larger_than_the_cache_is_refused_with_the_numbers() {
    let m = Arc::new(two_tier(64 << 20, 64 << 20, "lru"));
    let dir = scratch("block-small-cache");
    let t = open_block(
        &m,
        &dir.join("t.tmb"),
        Some((16, DType::F32)),
        config(8, 64, "row"),
    );
    let values: Vec<i64> = (0..100).collect();
    let offsets = [0i64, 100];
    let bags = Bags::new(0, &values, &offsets, None).unwrap();
    let mut out = vec![0f32; 16];
    let o = LookupOut {
        data: &mut out,
        row_stride: 16,
        cols: &[0],
    };
    let e = lookup(&[&t], &[bags], Mode::Sum, o, 8)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("100 distinct rows") && e.contains("holds 8"),
        "{e}"
    );
    // A direct table over a block home is refused: its rows are read through a cache.
    let file = BlockFile::create(&dir.join("d.tmb"), "d", 4, 4, DType::F32, true, 1).unwrap();
    let e = Table::over_home(4, 4, DType::F32, |_| {
        Ok(tiermem_embed::home::BlockHome::new(file).into())
    });
    assert!(e.is_err_and(|e| e.to_string().contains("through a cache")));
    drop(t);
    std::fs::remove_dir_all(&dir).unwrap();
}
