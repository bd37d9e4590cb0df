//! Policies written in Python. `PyPolicy` implements the core `Policy` trait by calling the
//! user's object; each call receives a `DataApi`, the data-manager API of thesis Table 4.4,
//! valid only for the duration of that call.

use std::cell::Cell;

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyTuple};
use tiermem_core::mechanism::{self, DataManager, ObjectId, Place};
use tiermem_core::policy::Policy;
use tiermem_core::{Error, Result};

use crate::error::{to_py, IN_POLICY};

/// A user object implementing some of: `alloc(api, nbytes, place)`, `prefetch(api, id,
/// force)`, `evict(api, id)`, `softevict(api, id)`, `read_use(api, id)`, `write_use(api,
/// id)`, `unsafe_free(api, id)`, `before_access(api, id, write)`, `after_access(api, id,
/// write)`. Missing methods fall back to the shared mechanisms.
pub struct PyPolicy {
    obj: Py<PyAny>,
    name: String,
}

impl PyPolicy {
    pub fn new(obj: &Bound<'_, PyAny>) -> PyResult<Self> {
        if !obj.hasattr("alloc")? {
            return Err(pyo3::exceptions::PyTypeError::new_err(
                "a policy is a built-in name (lru, all_fast, all_slow, first_touch) or an object \
                 with at least an alloc(api, nbytes, place) method",
            ));
        }
        let name = obj
            .getattr("name")
            .and_then(|n| n.extract::<String>())
            .or_else(|_| obj.get_type().name().map(|n| n.to_string()))?;
        Ok(PyPolicy {
            obj: obj.clone().unbind(),
            name,
        })
    }

    /// Call `method(api, *extra)` if the object has it. `None` when it does not.
    fn call(
        &self,
        m: &mut DataManager,
        method: &str,
        extra: impl for<'py> FnOnce(Python<'py>) -> PyResult<Vec<Bound<'py, PyAny>>>,
    ) -> Result<Option<Py<PyAny>>> {
        Python::attach(|py| {
            let obj = self.obj.bind(py);
            if !obj.hasattr(method).map_err(|e| self.err(py, e))? {
                return Ok(None);
            }
            let api = Bound::new(
                py,
                DataApi {
                    ptr: Cell::new(m as *mut DataManager),
                },
            )
            .map_err(|e| self.err(py, e))?;
            IN_POLICY.with(|d| d.set(d.get() + 1));
            let out = extra(py)
                .and_then(|rest| {
                    let mut args = vec![api.clone().into_any()];
                    args.extend(rest);
                    PyTuple::new(py, args)
                })
                .and_then(|args| obj.call_method1(method, args))
                .map(Bound::unbind);
            IN_POLICY.with(|d| d.set(d.get() - 1));
            api.borrow().ptr.set(std::ptr::null_mut());
            out.map(Some).map_err(|e| self.err(py, e))
        })
    }

    /// Call `method(api, id, flag)`, or `default` when the object does not define it.
    fn flag_hook(
        &self,
        m: &mut DataManager,
        method: &str,
        id: ObjectId,
        flag: bool,
        default: impl FnOnce(&mut DataManager, ObjectId) -> Result<()>,
    ) -> Result<()> {
        let out = self.call(m, method, |py| {
            Ok(vec![
                id.into_pyobject(py)?.into_any(),
                PyBool::new(py, flag).to_owned().into_any(),
            ])
        })?;
        match out {
            Some(_) => Ok(()),
            None => default(m, id),
        }
    }

    fn err(&self, py: Python<'_>, e: PyErr) -> Error {
        Error::Policy {
            policy: self.name.clone(),
            message: python_error_text(py, &e),
        }
    }
}

fn python_error_text(py: Python<'_>, e: &PyErr) -> String {
    let ty = e
        .get_type(py)
        .name()
        .map(|n| n.to_string())
        .unwrap_or_default();
    format!("{ty}: {}", e.value(py))
}

fn ids(v: Option<Py<PyAny>>) -> Result<Option<u64>> {
    Python::attach(|py| match v {
        Some(o) if !o.is_none(py) => o
            .extract::<u64>(py)
            .map(Some)
            .map_err(|e| Error::InvalidArgument(format!("policy returned a non-id: {e}"))),
        _ => Ok(None),
    })
}

macro_rules! hook {
    ($fname:ident, $default:expr) => {
        fn $fname(&mut self, m: &mut DataManager, id: ObjectId) -> Result<()> {
            match self.call(m, stringify!($fname), |py| {
                Ok(vec![id.into_pyobject(py)?.into_any()])
            })? {
                Some(_) => Ok(()),
                None => $default(m, id),
            }
        }
    };
}

impl Policy for PyPolicy {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn alloc(&mut self, m: &mut DataManager, bytes: u64, place: Place) -> Result<ObjectId> {
        let code: i64 = match place {
            Place::Fast => -1,
            Place::Slow => -2,
            Place::Auto => -3,
            Place::Device(d) => d as i64,
        };
        let out = self.call(m, "alloc", |py| {
            Ok(vec![
                bytes.into_pyobject(py)?.into_any(),
                code.into_pyobject(py)?.into_any(),
            ])
        })?;
        let id = ids(out)?.ok_or_else(|| Error::Policy {
            policy: self.name.clone(),
            message: "alloc returned None instead of an object id".into(),
        })?;
        m.object(id)?;
        Ok(id)
    }

    fn prefetch(&mut self, m: &mut DataManager, id: ObjectId, force: bool) -> Result<()> {
        self.flag_hook(m, "prefetch", id, force, |m, id| {
            mechanism::prefetch_object(m, id, 0, force, None).map(|_| ())
        })
    }

    hook!(evict, mechanism::evict_object);
    hook!(softevict, |_m: &mut DataManager, _id| Ok(()));
    hook!(read_use, |_m: &mut DataManager, _id| Ok(()));
    hook!(write_use, |_m: &mut DataManager, _id| Ok(()));
    hook!(unsafe_free, |m: &mut DataManager, id| m.destroy_object(id));

    fn before_access(&mut self, m: &mut DataManager, id: ObjectId, write: bool) -> Result<()> {
        self.flag_hook(m, "before_access", id, write, mechanism::stage_in)
    }

    fn after_access(&mut self, m: &mut DataManager, id: ObjectId, write: bool) -> Result<()> {
        self.flag_hook(m, "after_access", id, write, |_, _| Ok(()))
    }
}

/// The data-manager API (thesis Table 4.4) handed to Python policies. Valid only during the
/// policy call it was passed to; using it afterwards raises `GuardError`.
#[pyclass(module = "tiermem._tiermem", unsendable)]
pub struct DataApi {
    ptr: Cell<*mut DataManager>,
}

impl DataApi {
    fn with<T>(&self, f: impl FnOnce(&mut DataManager) -> Result<T>) -> PyResult<T> {
        let p = self.ptr.get();
        if p.is_null() {
            return Err(to_py(Error::Guard(
                "this DataApi was used after the policy call it was passed to returned".into(),
            )));
        }
        // SAFETY: `ptr` is non-null only while `PyPolicy::call` is on the stack holding the
        // exclusive borrow it was made from; that frame does not touch the data manager until
        // the Python call returns, and the class is unsendable, so only this thread reaches it.
        // A nested `evict_from` callback swaps in the pointer of its own reborrow and restores
        // this one afterwards.
        let m = unsafe { &mut *p };
        f(m).map_err(to_py)
    }
}

#[pymethods]
impl DataApi {
    /// Device names, fastest first.
    fn devices(&self) -> PyResult<Vec<String>> {
        self.with(|m| Ok(m.devices().iter().map(|d| d.name.clone()).collect()))
    }
    /// Create an object of `nbytes` with its primary on `device`; None when full.
    fn create_object(&self, device: usize, nbytes: u64) -> PyResult<Option<u64>> {
        self.with(|m| m.create_object(device, nbytes))
    }
    /// Free an object and all its regions without writing anything back.
    fn destroy_object(&self, id: u64) -> PyResult<()> {
        self.with(|m| m.destroy_object(id))
    }
    fn primary(&self, id: u64) -> PyResult<u64> {
        self.with(|m| m.primary(id))
    }
    fn set_primary(&self, id: u64, region: u64) -> PyResult<()> {
        self.with(|m| m.set_primary(id, region))
    }
    fn allocate(&self, device: usize, nbytes: u64, id: u64) -> PyResult<Option<u64>> {
        self.with(|m| m.allocate(device, nbytes, id))
    }
    fn free(&self, region: u64) -> PyResult<()> {
        self.with(|m| m.free(region))
    }
    fn link(&self, a: u64, b: u64) -> PyResult<()> {
        self.with(|m| m.link(a, b))
    }
    fn unlink(&self, a: u64, b: u64) -> PyResult<()> {
        self.with(|m| m.unlink(a, b))
    }
    fn copyto(&self, dst: u64, src: u64) -> PyResult<()> {
        self.with(|m| m.copy(dst, src))
    }
    fn sizeof(&self, region: u64) -> PyResult<u64> {
        self.with(|m| Ok(m.region(region)?.size))
    }
    fn getlinked(&self, region: u64, device: usize) -> PyResult<Option<u64>> {
        self.with(|m| m.getlinked(region, device))
    }
    fn device_of(&self, region: u64) -> PyResult<usize> {
        self.with(|m| m.device_of(region))
    }
    fn markdirty(&self, region: u64) -> PyResult<()> {
        self.with(|m| m.set_dirty(region, true))
    }
    fn markclean(&self, region: u64) -> PyResult<()> {
        self.with(|m| m.set_dirty(region, false))
    }
    fn isdirty(&self, region: u64) -> PyResult<bool> {
        self.with(|m| Ok(m.region(region)?.dirty))
    }
    fn parent(&self, region: u64) -> PyResult<u64> {
        self.with(|m| m.parent(region))
    }
    fn offset(&self, region: u64) -> PyResult<u64> {
        self.with(|m| Ok(m.region(region)?.offset))
    }
    fn pins(&self, id: u64) -> PyResult<u32> {
        self.with(|m| Ok(m.object(id)?.pins))
    }
    fn fits(&self, device: usize, nbytes: u64) -> PyResult<bool> {
        self.with(|m| Ok(m.fits(device, nbytes)))
    }
    /// Listing 4.1: move the object to the nearest slower device.
    fn evict_object(&self, id: u64) -> PyResult<()> {
        self.with(|m| mechanism::evict_object(m, id))
    }
    /// Listing 4.2: bring the object to `device`; True if it is there now.
    #[pyo3(signature = (id, device = 0, force = false))]
    fn prefetch_object(&self, id: u64, device: usize, force: bool) -> PyResult<bool> {
        self.with(|m| {
            Ok(mechanism::prefetch_object(m, id, device, force, None)?
                == mechanism::Prefetched::Done)
        })
    }
    /// Fig. 4.3: walk `device` from byte `start`, calling `callback(region)` for each occupied
    /// region until `nbytes` contiguous bytes are free. The callback must move the region's
    /// data away and free it (or leave it). Returns the free span's offset or None.
    fn evict_from(
        &self,
        py: Python<'_>,
        device: usize,
        start: u64,
        nbytes: u64,
        callback: Py<PyAny>,
    ) -> PyResult<Option<u64>> {
        let outer = self.ptr.get();
        let r = self.with(|m| {
            m.evict_from(device, start, nbytes, &mut |inner, region| {
                self.ptr.set(inner as *mut DataManager);
                let res = callback.call1(py, (region,));
                self.ptr.set(outer);
                res.map(|_| ()).map_err(|e| Error::Policy {
                    policy: "python evict_from callback".into(),
                    message: python_error_text(py, &e),
                })
            })
        });
        self.ptr.set(outer);
        r
    }
}
