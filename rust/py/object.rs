//! Python objects as the core's host-object type.

use pyo3::prelude::*;

/// A Python object stored in a core object field. Cloning increments the reference count
/// (the core clones only while called from Python, so the thread is always attached).
pub struct PyObj(pub Py<PyAny>);

impl Clone for PyObj {
    fn clone(&self) -> Self {
        Python::attach(|py| PyObj(self.0.clone_ref(py)))
    }
}

impl std::fmt::Debug for PyObj {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PyObj")
    }
}

impl PartialEq for PyObj {
    /// Identity: the core never compares objects by value.
    fn eq(&self, other: &Self) -> bool {
        self.0.as_ptr() == other.0.as_ptr()
    }
}
