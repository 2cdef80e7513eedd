//! The binding of [`crate::runner::ready::wait_ready`]: the wait runs with the GIL released.

use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;

/// Waits until worker pipes holding at least `need` sub-envs' answers are readable.
///
/// The GIL is released while waiting (in `poll(2)`), so other Python threads run and no
/// thread spins; a signal (Ctrl-C) interrupts the wait with its Python exception.
///
/// Args:
///     fds: The pipes' read ends (file descriptors), one per worker.
///     weights: Per pipe, the sub-envs its pending answer carries.
///     need: The sub-envs to wait for (capped at the sum of ``weights``; 0: only look).
///     timeout_s: The longest wait in seconds (None: no limit); on timeout, the pipes
///         found ready so far are returned.
///
/// Returns:
///     The indices into ``fds`` of the readable (or closed: a dead worker) pipes, in the
///     order they were found ready.
///
/// Raises:
///     ValueError: If ``fds`` and ``weights`` differ in length or ``timeout_s`` is negative.
///     OSError: If ``poll(2)`` fails.
#[pyfunction]
#[pyo3(signature = (fds, weights, need, timeout_s=None))]
pub fn wait_ready(
    py: Python<'_>,
    fds: Vec<i32>,
    weights: Vec<usize>,
    need: usize,
    timeout_s: Option<f64>,
) -> PyResult<Vec<usize>> {
    let timeout = crate::runner::ready::wait_args(fds.len(), weights.len(), timeout_s)
        .map_err(|e| PyValueError::new_err(format!("wait_ready: {e}")))?;
    // A Python exception raised by a signal handler, carried out of the GIL-free wait.
    let mut raised: Option<PyErr> = None;
    let result = py.detach(|| {
        crate::runner::ready::wait_ready(&fds, &weights, need, timeout, || {
            #[allow(clippy::redundant_closure_for_method_calls)] // the method is not general over lifetimes
            Python::attach(|py| py.check_signals()).map_err(|err| {
                raised = Some(err);
                std::io::Error::from(std::io::ErrorKind::Interrupted)
            })
        })
    });
    if let Some(err) = raised {
        return Err(err);
    }
    result.map_err(|err| PyOSError::new_err(format!("wait_ready: {err}")))
}
