//! The lock order (`tiermem_core::lock_order`) for tables: lookups and updates over tables
//! named in different orders from several threads never deadlock (parking_lot's detector
//! watches); table locks are refused on the rayon pool.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tiermem_core::manager::Manager;
use tiermem_core::mechanism::Place;
use tiermem_core::Error;
use tiermem_embed::bags::Bags;
use tiermem_embed::cache::policy::Dynamic;
use tiermem_embed::optim::Sgd;
use tiermem_embed::update::{update, GradIn};
use tiermem_embed::Optimizer;
use tiermem_embed::{lookup, CacheConfig, DType, LookupOut, Mode, PolicyRef, Table};

use super::two_tier;

fn watched(f: impl FnOnce()) {
    let done = Arc::new(AtomicBool::new(false));
    let d = done.clone();
    let watcher = std::thread::spawn(move || {
        while !d.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(200));
            let cycles = parking_lot::deadlock::check_deadlock();
            if !cycles.is_empty() {
                let stacks: Vec<String> = cycles
                    .iter()
                    .flatten()
                    .map(|t| format!("{:?}", t.backtrace()))
                    .collect();
                eprintln!("deadlock:\n{}", stacks.join("\n---\n"));
                std::process::abort();
            }
        }
    });
    f();
    done.store(true, Ordering::Relaxed);
    watcher.join().unwrap();
}

fn cached(m: &Arc<Manager>, rows: usize, policy: PolicyRef, frac: u64) -> Table {
    let bytes = (rows * 16 * 4) as u64 * frac / 100;
    let cfg = CacheConfig {
        admission: None,
        lower: bytes,
        slack: bytes / 2,
        policy,
    };
    let t = Table::cached(m, 1, 0, rows, 16, DType::F32, cfg).unwrap();
    if policy.name() == "static" {
        t.fill_cache(1).unwrap();
    }
    t
}

#[test]
fn lookups_and_updates_in_opposite_table_orders_never_deadlock() {
    let m = Arc::new(two_tier(16 << 20, 64 << 20, "lru"));
    let (a, b) = (cached(&m, 4000, &Dynamic, 2), cached(&m, 4000, &Dynamic, 2));
    let values: Vec<i64> = (0..512).map(|i| (i * 37) % 4000).collect();
    let offsets: Vec<i64> = (0..=64).map(|i| i * 8).collect();
    let bags = Bags::new(0, &values, &offsets, None).unwrap();
    let deadline = Instant::now() + Duration::from_secs(3);
    watched(|| {
        std::thread::scope(|s| {
            for k in 0..4 {
                let (a, b, bags) = (&a, &b, bags);
                s.spawn(move || {
                    let tabs: [&Table; 2] = if k % 2 == 0 { [a, b] } else { [b, a] };
                    let mut out = vec![0f32; 64 * 32];
                    let grad = vec![0f32; 64 * 32];
                    while Instant::now() < deadline {
                        if k < 2 {
                            let o = LookupOut {
                                data: &mut out,
                                row_stride: 32,
                                cols: &[0, 16],
                            };
                            lookup(&tabs, &[bags, bags], Mode::Sum, o, 0).unwrap();
                        } else {
                            let g = GradIn {
                                data: &grad,
                                row_stride: 32,
                                cols: &[0, 16],
                            };
                            let opt = Optimizer::Sgd(Sgd {
                                lr: 0.0,
                                weight_decay: 0.0,
                            });
                            update(&tabs, &[bags, bags], Mode::Sum, g, opt, false).unwrap();
                        }
                    }
                });
            }
        });
    });
    assert!(a.stats().rows_evicted > 0, "the caches never filled up");
    m.check().unwrap();
}

#[test]
fn table_locks_are_refused_on_the_rayon_pool() {
    let m = Arc::new(two_tier(4 << 20, 16 << 20, "lru"));
    let t = Table::direct(&m, 0, 100, 16, DType::F32).unwrap();
    let values = [1i64, 2];
    let offsets = [0i64, 2];
    let bags = Bags::new(0, &values, &offsets, None).unwrap();
    let r = rayon::scope(|_| {
        let mut out = vec![0f32; 16];
        let o = LookupOut {
            data: &mut out,
            row_stride: 16,
            cols: &[0],
        };
        lookup(&[&t], &[bags], Mode::Sum, o, 0)
    });
    assert!(matches!(r, Err(Error::LockOrder(_))), "{r:?}");
    let r = rayon::scope(|_| m.alloc(64, Place::Fast));
    assert!(matches!(r, Err(Error::LockOrder(_))), "{r:?}");
}
