//! The one mapping from core errors to Python exceptions. The classes are defined in
//! `tiermem/exceptions.py` (they also derive from built-ins such as `ValueError`).

use pyo3::prelude::*;
use tiermem_core::Error;

mod exc {
    pyo3::import_exception!(tiermem.exceptions, InvalidArgumentError);
    pyo3::import_exception!(tiermem.exceptions, UnknownDeviceError);
    pyo3::import_exception!(tiermem.exceptions, DeviceFullError);
    pyo3::import_exception!(tiermem.exceptions, PinnedError);
    pyo3::import_exception!(tiermem.exceptions, AllPinnedError);
    pyo3::import_exception!(tiermem.exceptions, NoSuchObjectError);
    pyo3::import_exception!(tiermem.exceptions, DeviceIOError);
    pyo3::import_exception!(tiermem.exceptions, IndexOutOfRangeError);
    pyo3::import_exception!(tiermem.exceptions, GuardError);
    pyo3::import_exception!(tiermem.exceptions, PolicyError);
    pyo3::import_exception!(tiermem.exceptions, LockOrderError);
    pyo3::import_exception!(tiermem.exceptions, PoisonedError);
}

/// Convert a core error into the matching Python exception.
pub fn to_py(e: Error) -> PyErr {
    let msg = e.to_string();
    match e {
        Error::InvalidArgument(_) => exc::InvalidArgumentError::new_err(msg),
        Error::UnknownDevice(_) => exc::UnknownDeviceError::new_err(msg),
        Error::DeviceFull { .. } => exc::DeviceFullError::new_err(msg),
        Error::Pinned { .. } => exc::PinnedError::new_err(msg),
        Error::AllPinned { .. } => exc::AllPinnedError::new_err(msg),
        Error::NoSuchObject(_) => exc::NoSuchObjectError::new_err(msg),
        Error::Io { source, .. } => {
            exc::DeviceIOError::new_err((source.raw_os_error().unwrap_or(0), msg))
        }
        Error::IndexOutOfRange { .. } => exc::IndexOutOfRangeError::new_err(msg),
        Error::Guard(_) => exc::GuardError::new_err(msg),
        Error::Policy { .. } => exc::PolicyError::new_err(msg),
        Error::LockOrder(_) => exc::LockOrderError::new_err(msg),
        Error::Poisoned(_) => exc::PoisonedError::new_err(msg),
    }
}

thread_local! {
    /// Depth of Python policy callbacks running on this thread (they run under the manager
    /// lock, so calling back into a manager from one would deadlock).
    pub static IN_POLICY: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Run core work with the GIL released and convert its error: the one way out of Python.
pub fn run<T: Send>(
    py: Python<'_>,
    f: impl FnOnce() -> tiermem_core::Result<T> + Send,
) -> PyResult<T> {
    if IN_POLICY.with(std::cell::Cell::get) > 0 {
        return Err(to_py(Error::Policy {
            policy: "python".into(),
            message: "a policy callback called a Manager or array method; inside a policy use \
                      only the DataApi it was given (the manager lock is held)"
                .into(),
        }));
    }
    py.detach(f).map_err(to_py)
}
