//! Embedding tables: cached tables give bit-identical results to direct ones under every
//! policy; flushes never tear rows that concurrent lookups read; bad input is refused.

use std::sync::Arc;

use tiermem_core::Error;
use tiermem_embed::bags::Bags;
use tiermem_embed::cache::policy::{Admit, Dynamic, Static};
use tiermem_embed::optim::{Decay, RowwiseAdagrad, Sgd};
use tiermem_embed::update::{update, GradIn};
use tiermem_embed::workload::Rng;
use tiermem_embed::Optimizer;
use tiermem_embed::{lookup, CacheConfig, DType, LookupOut, Mode, PolicyRef, Table};

use super::two_tier;

const ROWS: usize = 500;

fn manager() -> Arc<tiermem_core::manager::Manager> {
    Arc::new(two_tier(16 << 20, 64 << 20, "lru"))
}

fn tables(m: &Arc<tiermem_core::manager::Manager>, width: usize, dtype: DType) -> Vec<Table> {
    let bytes = |pct: u64| (ROWS * dtype.row_bytes(width)) as u64 * pct / 100;
    let mut v = vec![
        Table::direct(m, 0, ROWS, width, dtype).unwrap(),
        Table::direct(m, 1, ROWS, width, dtype).unwrap(),
    ];
    for (pct, policy) in [
        (10, &Dynamic as PolicyRef),
        (50, &Dynamic),
        (100, &Dynamic),
        (25, &Static),
        (20, &Admit),
    ] {
        let cfg = CacheConfig {
            admission: None,
            lower: bytes(pct) * 3 / 4,
            slack: bytes(pct) / 4,
            policy,
        };
        let t = Table::cached(m, 1, 0, ROWS, width, dtype, cfg).unwrap();
        v.push(t);
    }
    let mut rng = Rng::new(3);
    let init: Vec<f32> = (0..ROWS * width).map(|_| rng.f64() as f32 - 0.5).collect();
    for t in &v {
        t.write_rows(0, &init).unwrap();
        if t.cache().is_some_and(|c| c.policy().name() == "static") {
            assert!(t.fill_cache(9).unwrap() > 0);
        }
    }
    v
}

fn batch(rng: &mut Rng, bags: usize) -> (Vec<i64>, Vec<i64>, Vec<f32>) {
    let mut offsets = vec![0i64];
    let mut values = Vec::new();
    for _ in 0..bags {
        let n = rng.below(6) as usize; // includes empty bags
        for _ in 0..n {
            // Zipf-ish: half the indices from the first 20 rows, so rows repeat.
            let r = if rng.below(2) == 0 {
                rng.below(20)
            } else {
                rng.below(ROWS as u64)
            };
            values.push(r as i64);
        }
        offsets.push(values.len() as i64);
    }
    let w = (0..values.len()).map(|_| rng.f64() as f32).collect();
    (values, offsets, w)
}

#[test]
fn cached_tables_match_direct_tables_bit_for_bit() {
    let m = manager();
    for (width, dtype) in [
        (16, DType::F32),
        (24, DType::F32),
        (64, DType::Bf16),
        (7, DType::Bf16),
    ] {
        let ts = tables(&m, width, dtype);
        let mut rng = Rng::new(width as u64);
        for step in 0..6 {
            let (values, offsets, weights) = batch(&mut rng, 64);
            let mode = [Mode::Sum, Mode::Mean, Mode::Sum][step % 3];
            let w = (step % 3 == 2).then_some(&weights[..]);
            let bags = Bags::new(0, &values, &offsets, w).unwrap();
            let mut outs = Vec::new();
            for t in &ts {
                let mut out = vec![0f32; 64 * width];
                lookup(
                    &[t],
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
                outs.push(out);
            }
            for (k, o) in outs.iter().enumerate() {
                assert!(
                    o == &outs[0],
                    "width {width} step {step}: table {k} differs"
                );
            }
            let grad: Vec<f32> = (0..64 * width).map(|_| rng.f64() as f32 - 0.5).collect();
            let opt = [
                Optimizer::Sgd(Sgd {
                    lr: 0.1,
                    weight_decay: 0.0,
                }),
                Optimizer::RowwiseAdagrad(RowwiseAdagrad {
                    lr: 0.1,
                    eps: 1e-8,
                    initial_accumulator: 0.0,
                    weight_decay: 0.0,
                    decay: Decay::L2,
                }),
            ][step % 2];
            for t in &ts {
                update(
                    &[t],
                    &[bags],
                    mode,
                    GradIn {
                        data: &grad,
                        row_stride: width,
                        cols: &[0],
                    },
                    opt,
                    step % 2 == 1,
                )
                .unwrap();
                if step == 3 {
                    t.flush(true).unwrap();
                }
            }
            let mut want = vec![0f32; ROWS * width];
            ts[0].read_rows(0, &mut want).unwrap();
            for (k, t) in ts.iter().enumerate() {
                let mut got = vec![0f32; ROWS * width];
                t.read_rows(0, &mut got).unwrap();
                assert!(
                    got == want,
                    "width {width} step {step}: table {k} weights differ"
                );
                if let Some(c) = t.cache() {
                    c.check().unwrap();
                }
            }
        }
    }
    // Dynamic tables really cached rows and flushed pages.
    let ts = tables(&m, 16, DType::F32);
    let mut rng = Rng::new(1);
    for _ in 0..20 {
        let (values, offsets, _) = batch(&mut rng, 64);
        let bags = Bags::new(0, &values, &offsets, None).unwrap();
        let mut out = vec![0f32; 64 * 16];
        lookup(
            &[&ts[2]],
            &[bags],
            Mode::Sum,
            LookupOut {
                data: &mut out,
                row_stride: 16,
                cols: &[0],
            },
            8,
        )
        .unwrap();
    }
    let s = ts[2].stats();
    assert!(
        s.hits > 0 && s.misses > 0 && s.rows_cached > 0 && s.rows_evicted > 0,
        "{s:?}"
    );
}

#[test]
fn flushes_never_tear_rows_read_by_concurrent_lookups() {
    for policy in [&Dynamic as PolicyRef, &Admit] {
        flush_stress(policy);
    }
}

fn flush_stress(policy: PolicyRef) {
    let m = manager();
    let width = 32;
    let stride_bytes = (ROWS * width * 4) as u64;
    let t = Arc::new(
        Table::cached(
            &m,
            1,
            0,
            ROWS,
            width,
            DType::F32,
            CacheConfig {
                admission: None,
                lower: stride_bytes / 8,
                slack: stride_bytes / 8,
                policy,
            },
        )
        .unwrap(),
    );
    let init: Vec<f32> = (0..ROWS * width).map(|k| (k / width) as f32).collect();
    t.write_rows(0, &init).unwrap();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let readers: Vec<_> = (0..2)
        .map(|seed| {
            let (t, stop) = (t.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut rng = Rng::new(seed);
                let mut rounds = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) || rounds < 20 {
                    let values: Vec<i64> =
                        (0..256).map(|_| rng.below(ROWS as u64) as i64).collect();
                    let offsets: Vec<i64> = (0..=256).collect();
                    let bags = Bags::new(0, &values, &offsets, None).unwrap();
                    let mut out = vec![0f32; 256 * width];
                    lookup(
                        &[&*t],
                        &[bags],
                        Mode::None,
                        LookupOut {
                            data: &mut out,
                            row_stride: width,
                            cols: &[0],
                        },
                        4,
                    )
                    .unwrap();
                    for (k, row) in out.chunks(width).enumerate() {
                        let want = values[k] as f32;
                        assert!(
                            row.iter().all(|&x| x == want),
                            "row {} torn: {row:?}",
                            values[k]
                        );
                    }
                    rounds += 1;
                }
                rounds
            })
        })
        .collect();
    // Writer: lookups that cache its rows (so there are cached rows to dirty however the
    // readers are scheduled), updates that leave values unchanged (lr 0) but mark them
    // dirty, then flushes that write them back, racing the readers.
    let mut rng = Rng::new(99);
    for _ in 0..300 {
        let values: Vec<i64> = (0..64).map(|_| rng.below(ROWS as u64) as i64).collect();
        let offsets: Vec<i64> = (0..=64).collect();
        let bags = Bags::new(0, &values, &offsets, None).unwrap();
        let mut sums = vec![0f32; 64 * width];
        let out = LookupOut {
            data: &mut sums,
            row_stride: width,
            cols: &[0],
        };
        lookup(&[&*t], &[bags], Mode::Sum, out, 4).unwrap();
        let grad = vec![1.0f32; 64 * width];
        update(
            &[&*t],
            &[bags],
            Mode::Sum,
            GradIn {
                data: &grad,
                row_stride: width,
                cols: &[0],
            },
            Optimizer::Sgd(Sgd {
                lr: 0.0,
                weight_decay: 0.0,
            }),
            false,
        )
        .unwrap();
        t.flush(true).unwrap();
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for r in readers {
        assert!(r.join().unwrap() >= 20);
    }
    t.cache().unwrap().check().unwrap();
    assert!(t.stats().rows_written_back > 0);
}

#[test]
fn bad_input_is_refused_before_anything_changes() {
    let m = manager();
    let t = Table::direct(&m, 0, 10, 16, DType::F32).unwrap();
    t.write_rows(0, &[1.0; 160]).unwrap();
    let mut out = vec![0f32; 2 * 16];
    let values = [1i64, 10, 2];
    let bags = Bags::new(0, &values, &[0, 2, 3], None).unwrap();
    let e = lookup(
        &[&t],
        &[bags],
        Mode::Sum,
        LookupOut {
            data: &mut out,
            row_stride: 16,
            cols: &[0],
        },
        8,
    )
    .unwrap_err();
    assert!(
        matches!(
            e,
            Error::IndexOutOfRange {
                table: 0,
                position: 1,
                value: 10,
                rows: 10
            }
        ),
        "{e}"
    );
    let neg = [-1i64];
    let bags = Bags::new(0, &neg, &[0, 1], None).unwrap();
    let grad = [1.0f32; 16];
    let e = update(
        &[&t],
        &[bags],
        Mode::Sum,
        GradIn {
            data: &grad,
            row_stride: 16,
            cols: &[0],
        },
        Optimizer::Sgd(Sgd {
            lr: 1.0,
            weight_decay: 0.0,
        }),
        false,
    )
    .unwrap_err();
    assert!(e.to_string().contains("holds -1"), "{e}");
    let mut rows = vec![0f32; 160];
    t.read_rows(0, &mut rows).unwrap();
    assert!(rows.iter().all(|&x| x == 1.0), "nothing changed");
    // Output too small, mismatched widths, overlapping columns, duplicate tables in update.
    let v = [0i64];
    let bags = Bags::new(0, &v, &[0, 1], None).unwrap();
    let mut small = vec![0f32; 8];
    assert!(lookup(
        &[&t],
        &[bags],
        Mode::Sum,
        LookupOut {
            data: &mut small,
            row_stride: 16,
            cols: &[0]
        },
        8
    )
    .is_err());
    let mut out = vec![0f32; 24];
    assert!(lookup(
        &[&t, &t],
        &[bags, bags],
        Mode::Sum,
        LookupOut {
            data: &mut out,
            row_stride: 24,
            cols: &[0, 8]
        },
        8
    )
    .unwrap_err()
    .to_string()
    .contains("overlapping"));
    let g = [0f32; 32];
    assert!(update(
        &[&t, &t],
        &[bags, bags],
        Mode::Sum,
        GradIn {
            data: &g,
            row_stride: 32,
            cols: &[0, 16]
        },
        Optimizer::Sgd(Sgd {
            lr: 1.0,
            weight_decay: 0.0
        }),
        false
    )
    .unwrap_err()
    .to_string()
    .contains("same table"));
    // Per-sample weights need sum.
    let w = [1.0f32];
    let wb = Bags::new(0, &v, &[0, 1], Some(&w)).unwrap();
    let mut o = vec![0f32; 16];
    assert!(lookup(
        &[&t],
        &[wb],
        Mode::Mean,
        LookupOut {
            data: &mut o,
            row_stride: 16,
            cols: &[0]
        },
        8
    )
    .is_err());
    // A cache larger than the fast device.
    let e = Table::cached(
        &m,
        1,
        0,
        1 << 20,
        64,
        DType::F32,
        CacheConfig {
            admission: None,
            lower: 200 << 20,
            slack: 0,
            policy: &Dynamic,
        },
    );
    assert!(e.is_err());
    // flush_clean refuses to drop dirty rows.
    let c = Table::cached(
        &m,
        1,
        0,
        10,
        16,
        DType::F32,
        CacheConfig {
            admission: None,
            lower: 0,
            slack: 640,
            policy: &Dynamic,
        },
    )
    .unwrap();
    let bags = Bags::new(0, &v, &[0, 1], None).unwrap();
    lookup(
        &[&c],
        &[bags],
        Mode::Sum,
        LookupOut {
            data: &mut o,
            row_stride: 16,
            cols: &[0],
        },
        8,
    )
    .unwrap();
    update(
        &[&c],
        &[bags],
        Mode::Sum,
        GradIn {
            data: &grad,
            row_stride: 16,
            cols: &[0],
        },
        Optimizer::Sgd(Sgd {
            lr: 1.0,
            weight_decay: 0.0,
        }),
        false,
    )
    .unwrap();
    assert!(c.flush(false).unwrap_err().to_string().contains("dirty"));
    assert_eq!(c.flush(true).unwrap(), 1);
    let mut r = vec![0f32; 16];
    c.read_rows(0, &mut r).unwrap();
    assert!(r.iter().all(|&x| x == -1.0));
}

#[test]
fn reclaim_keeps_rows_hit_since_cached_and_matches_direct() {
    let m = manager();
    let width = 16;
    let cfg = CacheConfig {
        admission: None,
        lower: 100 * 64,
        slack: 20 * 64,
        policy: &Dynamic,
    };
    let t = Table::cached(&m, 1, 0, 2000, width, DType::F32, cfg).unwrap();
    let d = Table::direct(&m, 1, 2000, width, DType::F32).unwrap();
    let mut rng = Rng::new(11);
    let init: Vec<f32> = (0..2000 * width).map(|_| rng.f64() as f32).collect();
    t.write_rows(0, &init).unwrap();
    d.write_rows(0, &init).unwrap();
    let run = |values: &[i64], grad: bool| -> u64 {
        let offsets: Vec<i64> = (0..=values.len() as i64).collect();
        let bags = Bags::new(0, values, &offsets, None).unwrap();
        let mut outs = Vec::new();
        let mut hits = 0;
        for tab in [&t, &d] {
            let mut out = vec![0f32; values.len() * width];
            let out_ref = LookupOut {
                data: &mut out,
                row_stride: width,
                cols: &[0],
            };
            let tally = lookup(&[tab], &[bags], Mode::Sum, out_ref, 4).unwrap();
            if std::ptr::eq(tab, &t) {
                hits = tally.hits;
            }
            if grad {
                let g: Vec<f32> = (0..values.len() * width).map(|k| k as f32 * 1e-3).collect();
                let gi = GradIn {
                    data: &g,
                    row_stride: width,
                    cols: &[0],
                };
                update(
                    &[tab],
                    &[bags],
                    Mode::Sum,
                    gi,
                    Optimizer::Sgd(Sgd {
                        lr: 0.1,
                        weight_decay: 0.0,
                    }),
                    false,
                )
                .unwrap();
            }
            outs.push(out);
        }
        assert_eq!(outs[0], outs[1]);
        t.cache().unwrap().check().unwrap();
        hits
    };
    // 40 hot rows every step and 30 rows never seen before: with first-in-first-out pages
    // the hot rows leave with the oldest pages and miss again; the second chance keeps them.
    let mut hot_hits = 0;
    for step in 0..40i64 {
        let mut values: Vec<i64> = (0..40).collect();
        values.extend((0..30).map(|k| 100 + (step * 30 + k) % 1900));
        let h = run(&values, true);
        if step >= 10 {
            hot_hits += h;
        }
    }
    assert!(t.stats().rows_evicted > 0, "the cache cycled");
    assert_eq!(hot_hits, 30 * 40, "every hot row hit in every later step");
    // Reclaims leave holes that new rows take before pages are bumped; a flush that frees
    // pages holding holes takes them out of the chain (check() walks it), and the cache
    // keeps cycling at its smaller size.
    let c = t.cache().unwrap();
    c.set_cachelower(40 * 64).unwrap();
    t.flush(true).unwrap();
    c.check().unwrap();
    for step in 40..60i64 {
        let values: Vec<i64> = (0..30).map(|k| (step * 37 + k * 11) % 2000).collect();
        run(&values, true);
    }
    t.flush(true).unwrap();
    let (mut a, mut b) = (vec![0f32; 2000 * width], vec![0f32; 2000 * width]);
    t.read_rows(0, &mut a).unwrap();
    d.read_rows(0, &mut b).unwrap();
    assert_eq!(a, b);
}

#[test]
fn a_cache_filled_with_every_row_in_row_order_reads_like_a_direct_table() {
    // A cache that holds every row, filled: each row sits at the slot of its number, so
    // kernels skip the pointer table (`resident`). Lookups and updates stay bit-identical
    // to a direct table's through updates, a flush that makes rows leave (no longer
    // resident), and a refill.
    let m = manager();
    let (rows, width) = (3000, 16);
    let bytes = (rows * width * 4) as u64;
    let cfg = |lower: u64, policy: PolicyRef| CacheConfig {
        admission: None,
        lower,
        slack: bytes / 8,
        policy,
    };
    let full = Table::cached(&m, 1, 0, rows, width, DType::F32, cfg(bytes, &Dynamic)).unwrap();
    let warm = Table::cached(&m, 1, 0, rows, width, DType::F32, cfg(bytes, &Dynamic)).unwrap();
    let part = Table::cached(&m, 1, 0, rows, width, DType::F32, cfg(bytes / 4, &Static)).unwrap();
    let d = Table::direct(&m, 1, rows, width, DType::F32).unwrap();
    let mut rng = Rng::new(5);
    let init: Vec<f32> = (0..rows * width).map(|_| rng.f64() as f32 - 0.5).collect();
    for t in [&full, &warm, &part, &d] {
        t.write_rows(0, &init).unwrap();
    }
    let resident = |t: &Table| t.cache().unwrap().resident();
    let step = |rng: &mut Rng, ts: &[&Table]| {
        let values: Vec<i64> = (0..400).map(|_| rng.below(rows as u64) as i64).collect();
        let offsets: Vec<i64> = (0..=100).map(|b| b * 4).collect();
        let bags = Bags::new(0, &values, &offsets, None).unwrap();
        let grad: Vec<f32> = (0..100 * width).map(|_| rng.f64() as f32 - 0.5).collect();
        let mut outs = Vec::new();
        for t in ts {
            let mut out = vec![0f32; 100 * width];
            let o = LookupOut {
                data: &mut out,
                row_stride: width,
                cols: &[0],
            };
            lookup(&[*t], &[bags], Mode::Sum, o, 8).unwrap();
            let g = GradIn {
                data: &grad,
                row_stride: width,
                cols: &[0],
            };
            update(
                &[*t],
                &[bags],
                Mode::Sum,
                g,
                Optimizer::Sgd(Sgd {
                    lr: 0.1,
                    weight_decay: 0.0,
                }),
                false,
            )
            .unwrap();
            outs.push(out);
        }
        let mut want = vec![0f32; rows * width];
        ts[0].read_rows(0, &mut want).unwrap();
        for (k, t) in ts.iter().enumerate() {
            assert!(outs[k] == outs[0], "table {k}'s lookup differs");
            let mut got = vec![0f32; rows * width];
            t.read_rows(0, &mut got).unwrap();
            assert!(got == want, "table {k}'s rows differ");
            if let Some(c) = t.cache() {
                c.check().unwrap();
            }
        }
    };
    // A lookup caches some of `warm`'s rows out of order first: its fill cannot put every
    // row at its own slot. `part` holds a quarter of the rows.
    let mut out = vec![0f32; 2 * width];
    let o = LookupOut {
        data: &mut out,
        row_stride: width,
        cols: &[0],
    };
    let bags = Bags::new(0, &[2999, 5, 1000], &[0, 1, 3], None).unwrap();
    lookup(&[&warm], &[bags], Mode::Sum, o, 8).unwrap();
    for t in [&full, &warm, &part] {
        assert!(t.fill_cache(7).unwrap() > 0);
    }
    assert!(resident(&full) && !resident(&warm) && !resident(&part));
    assert_eq!(full.cache().unwrap().cached_rows(), rows);
    for _ in 0..5 {
        step(&mut rng, &[&d, &full, &warm, &part]);
    }
    // Updates keep it resident (rows stay in their slots, marked dirty).
    assert!(resident(&full));
    // A smaller cache: the flush writes the dirty rows home and drops rows, so the cache is
    // no longer resident, and lookups cache rows where there is room again.
    let c = full.cache().unwrap();
    c.set_cachelower(bytes / 4).unwrap();
    full.flush(true).unwrap();
    assert!(!resident(&full));
    for _ in 0..5 {
        step(&mut rng, &[&d, &full, &warm, &part]);
    }
    // Room for every row again: a refill leaves rows cached in other slots, not resident.
    c.set_cachelower(bytes).unwrap();
    full.fill_cache(3).unwrap();
    c.check().unwrap();
    step(&mut rng, &[&d, &full]);
}
