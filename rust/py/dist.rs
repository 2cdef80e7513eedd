//! The categorical draw of `crate::dist` on numpy arrays (`TorchCategorical`'s CPU path).

use numpy::{PyArray1, PyArrayMethods, PyReadonlyArray1, PyReadonlyArray2, PyUntypedArrayMethods};
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
    // numpy allocates the outputs: its cache of small data blocks reuses them step after
    // step (arrays made from Rust vectors cost a capsule each and fragmented the heap
    // that episode columns grow in: 1.8x the bytes held per runner step).
    let actions = PyArray1::<i64>::zeros(py, uniforms.len(), false);
    let logp = PyArray1::<f32>::zeros(py, uniforms.len(), false);
    {
        let mut actions_rw = actions.readwrite();
        let mut logp_rw = logp.readwrite();
        let (Ok(a), Ok(l)) = (actions_rw.as_slice_mut(), logp_rw.as_slice_mut()) else {
            unreachable!("new one-dimensional arrays are contiguous");
        };
        draw(values, categories, uniforms, a, l)
            .map_err(|e: DrawError| PyValueError::new_err(e.to_string()))?;
    }
    Ok((actions, logp))
}
