//! The lock order (`tiermem_core::lock_order`) at the manager: a panic under the manager
//! lock poisons the manager instead of leaving it half-moved. (Table locks are tested in
//! `tiermem-embed`.)

use tiermem_core::manager::Manager;
use tiermem_core::mechanism::{DataManager, ObjectId, Place};
use tiermem_core::policy::{self, Policy};
use tiermem_core::{Error, Result};

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
