//! The categorical draw of `crate::dist` on numpy arrays (`TorchCategorical`'s CPU path).

use numpy::{PyArray1, PyReadonlyArray1, PyReadonlyArray2, PyUntypedArrayMethods};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;

use crate::dist::{categorical_draw as draw, DrawError};

/// The draws and their log-probabilities, as numpy arrays.
type Draws<'py> = (Bound<'py, PyArray1<i64>>, Bound<'py, PyArray1<f32>>);

/// Draws one category per row of `logits` (float32, `(rows, categories)`, C-contiguous)
/// with the uniforms `uniforms` (float64, one per row, in `[0, 1)`): the first category
/// whose cumulative probability exceeds the row's uniform.
///
/// Returns `(actions int64 (rows,), logp float32 (rows,))`. Raises `ValueError` naming the
/// first row with NaN or +inf logits or with every logit -inf, or sizes that do not fit;
/// `TypeError` for arrays that are not C-contiguous.
#[pyfunction]
pub fn categorical_draw<'py>(
    py: Python<'py>,
    logits: PyReadonlyArray2<'py, f32>,
    uniforms: PyReadonlyArray1<'py, f64>,
) -> PyResult<Draws<'py>> {
    let categories = logits.shape()[1];
    let not_contiguous =
        |what: &str| PyTypeError::new_err(format!("categorical_draw: {what} must be C-contiguous"));
    let values = logits.as_slice().map_err(|_| not_contiguous("logits"))?;
    let uniforms = uniforms.as_slice().map_err(|_| not_contiguous("uniforms"))?;
    let mut actions = vec![0i64; uniforms.len()];
    let mut logp = vec![0f32; uniforms.len()];
    draw(values, categories, uniforms, &mut actions, &mut logp)
        .map_err(|e: DrawError| PyValueError::new_err(e.to_string()))?;
    Ok((PyArray1::from_vec(py, actions), PyArray1::from_vec(py, logp)))
}
