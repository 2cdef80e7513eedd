//! Python index arguments (`None`, int, list of ints, slice) to the core's [`Index`].

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyList, PySlice, PyTuple};

use crate::column::Index;

fn opt_int(v: &Bound<'_, PyAny>) -> PyResult<Option<i64>> {
    if v.is_none() {
        Ok(None)
    } else {
        v.extract::<i64>().map(Some)
    }
}

/// Converts `indices` as RLlib accepts it.
pub fn to_index(indices: Option<&Bound<'_, PyAny>>) -> PyResult<Index> {
    let Some(obj) = indices else { return Ok(Index::All) };
    if obj.is_none() {
        return Ok(Index::All);
    }
    if let Ok(s) = obj.cast::<PySlice>() {
        return Ok(Index::Slice {
            start: opt_int(&s.getattr("start")?)?,
            stop: opt_int(&s.getattr("stop")?)?,
            step: opt_int(&s.getattr("step")?)?,
        });
    }
    if obj.cast::<PyList>().is_ok() || obj.cast::<PyTuple>().is_ok() {
        return Ok(Index::List(obj.extract::<Vec<i64>>()?));
    }
    if let Ok(i) = obj.extract::<i64>() {
        return Ok(Index::Int(i));
    }
    Err(PyTypeError::new_err(format!(
        "indices must be None, an int, a list of ints or a slice, not {}",
        obj.get_type().name()?
    )))
}
