//! Arrays from Python through the buffer protocol, checked here for element type,
//! C-contiguity and writability: the one place the binding reads Python memory.

use pyo3::buffer::{Element, PyBuffer};
use pyo3::prelude::*;
use tiermem_core::Error;

use crate::error::to_py;

/// A checked, contiguous buffer: kept alive (exported) while the address is used.
pub struct View<T: Element> {
    _buf: PyBuffer<T>,
    addr: usize,
    /// Items in the buffer.
    pub len: usize,
}

pub fn view<T: Element>(obj: &Bound<'_, PyAny>, what: &str, write: bool) -> PyResult<View<T>> {
    let bad = |m: String| to_py(Error::InvalidArgument(format!("{what}: {m}")));
    let b = PyBuffer::<T>::get(obj).map_err(|e| bad(e.to_string()))?;
    if !b.is_c_contiguous() {
        return Err(bad("must be C-contiguous".into()));
    }
    if write && b.readonly() {
        return Err(bad("must be writable".into()));
    }
    Ok(View {
        addr: b.buf_ptr() as usize,
        len: b.item_count(),
        _buf: b,
    })
}

impl<T: Element> View<T> {
    /// # Safety
    /// The buffer is alive (held by `self`) and nothing else writes it during the call.
    pub unsafe fn slice<'a>(&self) -> &'a [T] {
        // SAFETY: the exporter guarantees `len` contiguous items at `addr` while exported;
        // empty buffers may have a dangling but non-null pointer.
        unsafe { std::slice::from_raw_parts(self.addr as *const T, self.len) }
    }

    /// # Safety
    /// As `slice`, and no other live reference to the buffer exists.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slice_mut<'a>(&self) -> &'a mut [T] {
        // SAFETY: checked writable and contiguous in `view`; the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.addr as *mut T, self.len) }
    }
}
