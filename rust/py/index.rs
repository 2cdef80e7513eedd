//! Python index arguments (`None`, int, list of ints, slice) to the core's [`Index`].

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyList, PySlice, PyTuple};

use super::errors::index_error;
use crate::column::{Geometry, Index, Pos, Resolved};

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

/// Resolves `indices` (RLlib's index forms) against a buffer of `total` items whose first
/// `lookback` are look-back: the absolute positions, `None` where `fill` applies. An int
/// index gives one position, the other forms a list.
///
/// Raises `IndexError` for an int outside the data without `fill`.
#[pyfunction]
#[pyo3(signature = (total, lookback, indices=None, neg_index_as_lookback=false, fill=false))]
pub fn resolve_index(
    py: Python<'_>,
    total: usize,
    lookback: usize,
    indices: Option<&Bound<'_, PyAny>>,
    neg_index_as_lookback: bool,
    fill: bool,
) -> PyResult<Py<PyAny>> {
    let to_py = |p: &Pos| match p {
        Pos::At(p) => Some(*p),
        Pos::Fill => None,
    };
    let index = to_index(indices)?;
    match Geometry::new(total, lookback)
        .resolve(&index, neg_index_as_lookback, fill)
        .map_err(|e| index_error(&e))?
    {
        Resolved::One(p) => Ok(to_py(&p).into_pyobject(py)?.into_any().unbind()),
        Resolved::Many(v) => {
            Ok(v.iter().map(to_py).collect::<Vec<_>>().into_pyobject(py)?.into_any().unbind())
        }
    }
}
