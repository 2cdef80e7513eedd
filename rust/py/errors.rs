//! Python exceptions, and the one place where core errors become them.
//!
//! Custom exceptions extend the builtin that RLlib raises in the same situation, so code
//! written against RLlib (`except AssertionError`, `except ValueError`) keeps working.

use pyo3::create_exception;
use pyo3::exceptions::{PyAssertionError, PyIndexError, PyKeyError, PyValueError};
use pyo3::types::PyAnyMethods;
use pyo3::{PyErr, Python};

use crate::column::{ColumnError, IndexError};
use crate::episode::EpisodeError;

create_exception!(
    _core,
    EpisodeStateError,
    PyAssertionError,
    "An episode operation that its state does not allow (a second reset, a step after done, \
     a cut of a done episode, a concat of a non-continuation, inconsistent lengths)."
);
create_exception!(
    _core,
    SpaceMismatchError,
    PyValueError,
    "A value that does not fit its space: wrong shape, or a dtype that cannot be cast safely."
);

pub fn index_error(e: &IndexError) -> PyErr {
    match e {
        IndexError::ZeroStep => PyValueError::new_err(e.to_string()),
        IndexError::OutOfRange { .. } => PyIndexError::new_err(e.to_string()),
    }
}

pub fn episode_error(e: &EpisodeError) -> PyErr {
    match e {
        EpisodeError::Index(i) => index_error(i),
        EpisodeError::Column(c) => column_error(c),
        EpisodeError::DoesNotFit { .. } => SpaceMismatchError::new_err(e.to_string()),
        EpisodeError::MissingKey(key) => PyKeyError::new_err(key.clone()),
        EpisodeError::PopOutOfRange { .. } => PyIndexError::new_err(e.to_string()),
        EpisodeError::NoObservations | EpisodeError::NoData { .. } | EpisodeError::NoTypedColumn { .. } => {
            PyValueError::new_err(e.to_string())
        }
        _ => EpisodeStateError::new_err(e.to_string()),
    }
}

impl From<EpisodeError> for PyErr {
    fn from(e: EpisodeError) -> PyErr {
        episode_error(&e)
    }
}

pub fn column_error(e: &ColumnError) -> PyErr {
    match e {
        ColumnError::Index(i) => index_error(i),
        ColumnError::SetLength { .. } => PyIndexError::new_err(e.to_string()),
        ColumnError::ItemSize { .. } | ColumnError::LeafCount { .. } => {
            SpaceMismatchError::new_err(e.to_string())
        }
        ColumnError::Packed(_) => PyValueError::new_err(e.to_string()),
    }
}

/// `err` again, of the same exception type, its message prefixed with `prefix` (what it
/// concerns: a sub-env, an agent, an attribute); `err` as it was if the type cannot be
/// built from a message.
pub fn with_prefix(py: Python<'_>, prefix: &str, err: PyErr) -> PyErr {
    let message = format!("{prefix}: {}", err.value(py));
    match err.get_type(py).call1((message,)) {
        Ok(value) => PyErr::from_value(value),
        Err(_) => err,
    }
}
