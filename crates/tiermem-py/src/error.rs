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
    pyo3::import_exception!(tiermem.exceptions, CorruptFileError);
}

/// Convert a core error into the matching Python exception, with the error's fields as
/// attributes of the exception (`device`, `requested`, `free`, `largest`, `capacity`,
/// `object`, `pins`, `held`, `action`, `pinned_bytes`, `path`, `what`, `table`, `position`,
/// `value`, `rows`, `policy`, `path`; documented on the classes in `tiermem/exceptions.py`).
pub fn to_py(e: Error) -> PyErr {
    let msg = e.to_string();
    let (err, fields): (PyErr, Vec<(&str, Field)>) = match e {
        Error::InvalidArgument(_) => (exc::InvalidArgumentError::new_err(msg), vec![]),
        Error::UnknownDevice(_) => (exc::UnknownDeviceError::new_err(msg), vec![]),
        Error::DeviceFull {
            device,
            requested,
            free,
            largest,
            capacity,
        } => (
            exc::DeviceFullError::new_err(msg),
            vec![
                ("device", Field::Str(device)),
                ("requested", Field::Int(requested)),
                ("free", Field::Int(free)),
                ("largest", Field::Int(largest)),
                ("capacity", Field::Int(capacity)),
            ],
        ),
        Error::Pinned {
            object,
            pins,
            held,
            action,
        } => (
            exc::PinnedError::new_err(msg),
            vec![
                ("object", Field::Int(object)),
                ("pins", Field::Int(pins.into())),
                ("held", Field::Int(held.into())),
                ("action", Field::Str(action.to_owned())),
            ],
        ),
        Error::AllPinned {
            device,
            requested,
            pinned_bytes,
            capacity,
        } => (
            exc::AllPinnedError::new_err(msg),
            vec![
                ("device", Field::Str(device)),
                ("requested", Field::Int(requested)),
                ("pinned_bytes", Field::Int(pinned_bytes)),
                ("capacity", Field::Int(capacity)),
            ],
        ),
        Error::NoSuchObject(id) => (
            exc::NoSuchObjectError::new_err(msg),
            vec![("object", Field::Int(id))],
        ),
        Error::Io {
            device,
            path,
            what,
            source,
        } => (
            exc::DeviceIOError::new_err((source.raw_os_error().unwrap_or(0), msg)),
            vec![
                ("device", Field::Str(device)),
                ("path", Field::Str(path)),
                ("what", Field::Str(what)),
            ],
        ),
        Error::IndexOutOfRange {
            table,
            position,
            value,
            rows,
        } => (
            exc::IndexOutOfRangeError::new_err(msg),
            vec![
                ("table", Field::Int(table as u64)),
                ("position", Field::Int(position as u64)),
                ("value", Field::Signed(value)),
                ("rows", Field::Int(rows as u64)),
            ],
        ),
        Error::Guard(_) => (exc::GuardError::new_err(msg), vec![]),
        Error::Policy { policy, .. } => (
            exc::PolicyError::new_err(msg),
            vec![("policy", Field::Str(policy))],
        ),
        Error::LockOrder(_) => (exc::LockOrderError::new_err(msg), vec![]),
        Error::Poisoned(_) => (exc::PoisonedError::new_err(msg), vec![]),
        Error::Corrupt { path, .. } => (
            exc::CorruptFileError::new_err(msg),
            vec![("path", Field::Str(path))],
        ),
    };
    if !fields.is_empty() {
        Python::attach(|py| {
            let v = err.value(py);
            for (name, f) in fields {
                // An attribute that cannot be set leaves the message, which says it all.
                let _ = match f {
                    Field::Str(s) => v.setattr(name, s),
                    Field::Int(i) => v.setattr(name, i),
                    Field::Signed(i) => v.setattr(name, i),
                };
            }
        });
    }
    err
}

/// One field of an error, as a Python attribute.
enum Field {
    Str(String),
    Int(u64),
    Signed(i64),
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
