//! The lock order (`tiermem_core::lock_order`): lookups and updates over tables named in
//! different orders from several threads never deadlock (parking_lot's detector watches);
//! table locks are refused on the rayon pool; a panic under the manager lock poisons the
//! manager instead of leaving it half-moved.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tiermem_core::embedding::bags::Bags;
use tiermem_core::embedding::update::{update, GradIn, Optimizer};
use tiermem_core::embedding::{lookup, CacheConfig, CachePolicy, DType, LookupOut, Mode, Table};
use tiermem_core::manager::{DataManager, Manager, ObjectId};
use tiermem_core::policy::{self, Place, Policy};
use tiermem_core::{Error, Result};

use super::two_tier;

/// Polls parking_lot's deadlock detector while `f` runs; panics with the cycle if one forms.
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

fn cached(m: &Arc<Manager>, rows: usize, policy: CachePolicy, frac: u64) -> Table {
    let bytes = (rows * 16 * 4) as u64 * frac / 100;
    let cfg = CacheConfig {
        lower: bytes,
        slack: bytes / 2,
        policy,
    };
    let t = Table::cached(m, 1, 0, rows, 16, DType::F32, cfg).unwrap();
    if policy == CachePolicy::Static {
        t.fill_cache(1).unwrap();
    }
    t
}

#[test]
fn lookups_and_updates_in_opposite_table_orders_never_deadlock() {
    let m = Arc::new(two_tier(16 << 20, 64 << 20, "lru"));
    let (a, b) = (
        cached(&m, 4000, CachePolicy::Dynamic, 2),
        cached(&m, 4000, CachePolicy::Dynamic, 2),
    );
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
                            let opt = Optimizer::Sgd { lr: 0.0 };
                            update(&tabs, &[bags, bags], Mode::Sum, g, opt, false).unwrap();
                        }
                    }
                });
            }
        });
    });
    assert!(a.stats().pages_flushed > 0, "the caches never filled up");
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

/// A policy that panics on its third allocation, after the data manager made a region.
struct PanicAfter(u32, Box<dyn Policy>);

impl Policy for PanicAfter {
    fn name(&self) -> String {
        "panics".into()
    }
    fn alloc(&mut self, m: &mut DataManager, bytes: u64, place: Place) -> Result<ObjectId> {
        self.0 += 1;
        let id = self.1.alloc(m, bytes, place)?;
        assert!(self.0 < 3, "injected panic midway through an allocation");
        Ok(id)
    }
    fn prefetch(&mut self, m: &mut DataManager, id: ObjectId, force: bool) -> Result<()> {
        self.1.prefetch(m, id, force)
    }
}

#[test]
fn a_panic_under_the_manager_lock_poisons_the_manager() {
    let devs = vec![
        tiermem_core::device::Device::open("dram", 1 << 20).unwrap(),
        tiermem_core::device::Device::open("emulated:cxl", 4 << 20).unwrap(),
    ];
    let m = Manager::new(
        devs,
        Box::new(PanicAfter(0, policy::builtin("lru").unwrap())),
    )
    .unwrap();
    let a = m.alloc(4096, Place::Fast).unwrap();
    m.write(a).unwrap().as_mut_slice().fill(3);
    m.alloc(4096, Place::Fast).unwrap();
    let e = m.alloc(4096, Place::Fast).unwrap_err();
    assert!(matches!(e, Error::Poisoned(_)), "{e}");
    assert!(e.to_string().contains("injected panic"), "{e}");
    // Every later call is refused with the reason, including reads and the checker.
    for r in [
        m.read(a).map(|_| ()),
        m.evict(a),
        m.free(a),
        m.usage().map(|_| ()),
    ] {
        assert!(
            matches!(&r, Err(Error::Poisoned(s)) if s.contains("injected panic")),
            "{r:?}"
        );
    }
    assert!(m.check().unwrap_err().contains("panicked"));
}
