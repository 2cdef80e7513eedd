//! Episode ids: slices of a pool of random hex digits that `fastrollout.episodes._ids`
//! draws (256 ids at a time), handed out natively so that an episode made in Rust (an
//! agent's, a chunk's) gets its id without a Python call.

use std::sync::Mutex;

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyString;

/// Hex digits of one id.
const ID_LEN: usize = 32;

/// The drawn ids and the offset of the next one (`None`: none drawn in this process).
struct Pool {
    text: Option<Py<PyString>>,
    next: usize,
}

static POOL: Mutex<Pool> = Mutex::new(Pool { text: None, next: 0 });

/// The next id of the pool, if the pool has one left.
fn take(py: Python<'_>) -> Option<Bound<'_, PyString>> {
    let mut pool = POOL.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let start = pool.next;
    let text = pool.text.as_ref()?.bind(py).clone();
    let s = text.to_str().ok()?;
    let id = s.get(start..start + ID_LEN)?;
    pool.next = start + ID_LEN;
    Some(PyString::new(py, id))
}

/// A new random version-4 UUID as 32 hex digits (what `uuid.uuid4().hex` gives), from the
/// pool of random digits `fastrollout.episodes._ids._draw_pool` makes 256 ids at a time.
pub(crate) fn next_id(py: Python<'_>) -> PyResult<Bound<'_, PyString>> {
    if let Some(id) = take(py) {
        return Ok(id);
    }
    static DRAW: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    // Drawn without the lock held: the draw runs Python code, which may switch threads.
    let text =
        DRAW.import(py, "fastrollout.episodes._ids", "_draw_pool")?.call0()?.cast_into::<PyString>()?;
    let id = PyString::new(py, text.to_str()?.get(..ID_LEN).unwrap_or_default());
    let mut pool = POOL.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    (pool.text, pool.next) = (Some(text.unbind()), ID_LEN);
    Ok(id)
}

/// A new random version-4 UUID as 32 hex digits (what `uuid.uuid4().hex` gives).
///
/// Returns:
///     The id.
#[pyfunction]
pub fn new_episode_id(py: Python<'_>) -> PyResult<Bound<'_, PyString>> {
    next_id(py)
}

/// Forgets the drawn ids (a forked child draws its own: ids must not repeat across
/// processes).
#[pyfunction]
#[pyo3(name = "_forget_episode_ids")]
pub fn forget_episode_ids() {
    let mut pool = POOL.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    (pool.text, pool.next) = (None, 0);
}
