//! Walks of Python dicts on the per-step paths.

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyDictMethods};

/// Calls `f(position, key, value)` for the entries of `dict` in its order, as pyo3's
/// iterator gives them (new references), until `f` returns `Ok(false)` or an error.
/// Returns whether `f` took every entry (`false`: it stopped the walk).
///
/// One `PyDict_Next` per entry: the iterator makes one more to find the end, about 50
/// instructions per walk (an env step walks each of its dicts and every agent's extra
/// outputs). Panics, as that iterator does, where `f` changes the dict's size.
#[inline]
pub(crate) fn for_each_item<'py>(
    dict: &Bound<'py, PyDict>,
    mut f: impl FnMut(usize, Bound<'py, PyAny>, Bound<'py, PyAny>) -> PyResult<bool>,
) -> PyResult<bool> {
    let py = dict.py();
    let n = dict.len();
    let mut pos: pyo3::ffi::Py_ssize_t = 0;
    let (mut key, mut value) = (std::ptr::null_mut(), std::ptr::null_mut());
    for i in 0..n {
        // SAFETY: `dict` is a live dict and the out-pointers are valid locals; the key and
        // value it sets are borrowed references, turned into new ones at once (before `f`
        // can run Python code that changes the dict).
        let (k, v) = unsafe {
            if pyo3::ffi::PyDict_Next(dict.as_ptr(), &raw mut pos, &raw mut key, &raw mut value) == 0 {
                break;
            }
            (Bound::from_borrowed_ptr(py, key), Bound::from_borrowed_ptr(py, value))
        };
        if !f(i, k, v)? {
            return Ok(false);
        }
        assert!(dict.len() == n, "dictionary changed size during iteration");
    }
    Ok(true)
}
