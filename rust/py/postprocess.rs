//! `crate::postprocess`'s GAE on numpy arrays (the RolloutWorker's batch post-processing).

use numpy::{PyArray1, PyArrayMethods, PyReadonlyArray1, PyUntypedArrayMethods};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;

use crate::postprocess::gae_segments as gae;

/// The advantages and value targets, as numpy arrays.
type Gae<'py> = (Bound<'py, PyArray1<f32>>, Bound<'py, PyArray1<f32>>);

/// GAE over consecutive episode chunks of one batch, in one call.
///
/// `rewards`, `values` (float32, one per row), `lengths` (int64, the rows of each chunk,
/// in order) and `bootstraps` (float32, each chunk's value after its last row, 0 after a
/// terminal step). Returns `(advantages, value_targets)`, float32. Raises `ValueError`
/// for lengths that do not fit (named), `TypeError` for non-contiguous arrays.
#[pyfunction]
#[pyo3(signature = (rewards, values, lengths, bootstraps, gamma, lambda_))]
pub fn gae_segments<'py>(
    py: Python<'py>,
    rewards: PyReadonlyArray1<'py, f32>,
    values: PyReadonlyArray1<'py, f32>,
    lengths: PyReadonlyArray1<'py, i64>,
    bootstraps: PyReadonlyArray1<'py, f32>,
    gamma: f64,
    lambda_: f64,
) -> PyResult<Gae<'py>> {
    let not_contiguous =
        |what: &str| PyTypeError::new_err(format!("gae_segments: {what} must be C-contiguous"));
    let r = rewards.as_slice().map_err(|_| not_contiguous("rewards"))?;
    let v = values.as_slice().map_err(|_| not_contiguous("values"))?;
    let b = bootstraps.as_slice().map_err(|_| not_contiguous("bootstraps"))?;
    let lens = lengths.as_slice().map_err(|_| not_contiguous("lengths"))?;
    let advantages = PyArray1::<f32>::zeros(py, rewards.len(), false);
    let targets = PyArray1::<f32>::zeros(py, rewards.len(), false);
    {
        let mut a_rw = advantages.readwrite();
        let mut t_rw = targets.readwrite();
        let (Ok(a), Ok(t)) = (a_rw.as_slice_mut(), t_rw.as_slice_mut()) else {
            unreachable!("new one-dimensional arrays are contiguous");
        };
        gae(r, v, lens, b, gamma, lambda_, a, t)
            .map_err(|e| PyValueError::new_err(format!("gae_segments: {e}")))?;
    }
    Ok((advantages, targets))
}
