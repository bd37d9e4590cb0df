//! Plain data from the crates (anything `serde` serialises) as Python objects: dicts, lists,
//! strings, ints, floats, bools and `None`. What the binding returns instead of JSON text.

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use serde_json::Value;

/// `v` as a Python object.
pub fn to_object<T: serde::Serialize>(py: Python<'_>, v: &T) -> PyResult<Py<PyAny>> {
    let value = serde_json::to_value(v).map_err(|e| {
        pyo3::exceptions::PyValueError::new_err(format!("cannot convert to Python: {e}"))
    })?;
    value_to_object(py, &value)
}

/// JSON text (a policy's own statistics) as a Python object.
pub fn json_to_object(py: Python<'_>, text: &str) -> PyResult<Py<PyAny>> {
    let value: Value = serde_json::from_str(text).map_err(|e| {
        pyo3::exceptions::PyValueError::new_err(format!("malformed statistics JSON: {e}"))
    })?;
    value_to_object(py, &value)
}

fn value_to_object(py: Python<'_>, v: &Value) -> PyResult<Py<PyAny>> {
    Ok(match v {
        Value::Null => py.None(),
        Value::Bool(b) => b.into_pyobject(py)?.to_owned().into_any().unbind(),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                i.into_pyobject(py)?.into_any().unbind()
            } else if let Some(u) = n.as_u64() {
                u.into_pyobject(py)?.into_any().unbind()
            } else {
                n.as_f64()
                    .unwrap_or(f64::NAN)
                    .into_pyobject(py)?
                    .into_any()
                    .unbind()
            }
        }
        Value::String(s) => s.into_pyobject(py)?.into_any().unbind(),
        Value::Array(a) => {
            let l = PyList::empty(py);
            for x in a {
                l.append(value_to_object(py, x)?)?;
            }
            l.into_any().unbind()
        }
        Value::Object(o) => {
            let d = PyDict::new(py);
            for (k, x) in o {
                d.set_item(k, value_to_object(py, x)?)?;
            }
            d.into_any().unbind()
        }
    })
}
