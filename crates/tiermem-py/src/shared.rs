//! Core objects held by Python objects, dropped with the GIL released.
//!
//! Dropping a table, a 2LM model or a manager frees memory through the manager, which takes
//! the manager lock; a thread holding the GIL must not wait for it (a Python policy running
//! under that lock needs the GIL: `tiermem_core::lock_order`, rule 4). Python drops its
//! objects with the GIL held, so every core object a Python object owns sits in a
//! [`Shared`], whose drop releases the GIL first. Clones taken for one call are moved into
//! that call's GIL-free closure for the same reason.

use std::ops::Deref;
use std::sync::Arc;

use pyo3::Python;

/// An `Arc<T>` released with the GIL released.
pub struct Shared<T: Send + Sync + 'static>(Option<Arc<T>>);

impl<T: Send + Sync + 'static> Shared<T> {
    pub fn new(t: T) -> Self {
        Shared(Some(Arc::new(t)))
    }
}

impl<T: Send + Sync + 'static> Deref for Shared<T> {
    type Target = Arc<T>;
    fn deref(&self) -> &Arc<T> {
        self.0
            .as_ref()
            .expect("a Shared is only emptied by its drop")
    }
}

impl<T: Send + Sync + 'static> Drop for Shared<T> {
    fn drop(&mut self) {
        if let Some(a) = self.0.take() {
            // Not attached (interpreter finalizing): the closure is dropped unrun, and
            // `a` with it, with no GIL to hold.
            Python::try_attach(|py| py.detach(move || drop(a)));
        }
    }
}

/// The lock-order check the core runs before every lock: refuse a thread that holds the
/// GIL (see the module doc).
pub fn holds_gil() -> Option<String> {
    extern "C" {
        // CPython's (exported by every CPython 3.x; outside the limited API that pyo3's
        // abi3 declarations cover).
        fn PyGILState_Check() -> std::ffi::c_int;
    }
    // SAFETY: `PyGILState_Check` may be called from any thread at any time; it only reads
    // the calling thread's state.
    let held = unsafe { PyGILState_Check() } == 1;
    held.then(|| {
        "holding Python's GIL (a Python policy may need it under the manager lock); the \
         binding releases the GIL around every call that takes a lock"
            .to_owned()
    })
}
