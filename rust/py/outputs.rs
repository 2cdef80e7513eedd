//! A module's extra outputs handed from the runner's scatter to its record as rows of the
//! module's batch arrays, not as per-agent numpy scalars and views.
//!
//! The scatter of a vector step made, for every agent and extra output (`action_logp`,
//! `action_dist_inputs`, ...), a numpy scalar or row view and a dict to hold them, and the
//! record then read each back and converted it. With `extras_as_rows`, the scatter instead
//! gives each agent one [`AgentOutputsPy`]: its row index into the module's arrays, which
//! the record copies straight into the agent's columns where their layout is the arrays'
//! (the usual case). Everywhere else (an episode's first step, which makes the columns; a
//! hanging action; any other layout) the record takes [`AgentOutputsPy::to_dict`], the
//! same dict the scatter would have made.

use std::sync::Arc;

use numpy::{PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};

use super::spec::{dtype_of, LeafBytes, Spec, Tree};
use crate::schema::Leaf;

/// One batched extra output of a module: a C-contiguous numpy array with a row per agent.
pub struct OutputColumn {
    pub name: Py<PyString>,
    array: Py<PyUntypedArray>,
    /// The layout of one row: the array's dtype (in native byte order) and its shape
    /// without the first axis.
    row: Leaf,
}

impl OutputColumn {
    /// The column for `array` if it is a C-contiguous numpy array of at least one axis, of
    /// a plain dtype in native byte order (rows are then byte ranges of its buffer, laid
    /// out as a column of that dtype lays out items); `None` otherwise.
    pub fn new(name: &Bound<'_, PyString>, array: &Bound<'_, PyAny>) -> Option<Self> {
        let array = array.cast::<PyUntypedArray>().ok()?;
        let shape = array.shape();
        if shape.is_empty() || !array.is_c_contiguous() {
            return None;
        }
        let descr = array.dtype();
        if descr.is_native_byteorder() == Some(false) {
            return None;
        }
        let row = Leaf::new(dtype_of(&descr)?, shape[1..].to_vec());
        Some(OutputColumn { name: name.clone().unbind(), array: array.clone().unbind(), row })
    }
}

/// The extra outputs of one module in one scatter call, shared by its agents' rows.
pub struct ModuleOutputs {
    pub columns: Vec<OutputColumn>,
    /// Values the same for every agent (the runner's weights sequence number), after the
    /// columns in each agent's dict.
    pub constants: Option<Py<PyDict>>,
}

/// One agent's extra outputs: its row of its module's output arrays.
#[pyclass(frozen, module = "fastrollout._core", name = "AgentOutputs")]
pub struct AgentOutputsPy {
    outputs: Arc<ModuleOutputs>,
    row: usize,
}

impl AgentOutputsPy {
    pub fn new(outputs: Arc<ModuleOutputs>, row: usize) -> Self {
        AgentOutputsPy { outputs, row }
    }

    pub fn columns(&self) -> &[OutputColumn] {
        &self.outputs.columns
    }

    pub fn constants<'py>(&self, py: Python<'py>) -> Option<&Bound<'py, PyDict>> {
        self.outputs.constants.as_ref().map(|c| c.bind(py))
    }

    /// This agent's row of column `column` as the bytes of a column of `spec`, or `None`
    /// where `spec` lays the item out otherwise (the caller then converts the value).
    pub fn row_bytes(
        &self,
        py: Python<'_>,
        column: &OutputColumn,
        spec: &Spec,
    ) -> Option<LeafBytes<'static>> {
        let (Tree::Leaf(0), [leaf]) = (&spec.tree, spec.schema.leaves.as_slice()) else { return None };
        // Compared field by field: a shape compared as a slice is a `memcmp` call, several
        // times the cost of these few words.
        // (The column's items are in its spec's byte order; the rows are native.)
        if leaf.dtype != column.row.dtype
            || !leaf.shape.iter().eq(column.row.shape.iter())
            || spec.descrs[0].bind(py).is_native_byteorder() == Some(false)
        {
            return None;
        }
        // (`LeafBytes::row` reads the array's layout again: a buffer changed since the
        // scatter gives no row rather than a read past it.)
        LeafBytes::Array(column.array.bind(py).clone()).row(self.row, column.row.item_bytes())
    }
}

#[pymethods]
impl AgentOutputsPy {
    /// The agent's outputs as a dict: each column's row (as indexing the array gives it:
    /// a numpy scalar or a view), then the constants.
    ///
    /// Returns:
    ///     ``{name: value}``, the dict the scatter makes without ``extras_as_rows``.
    pub fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for c in &self.outputs.columns {
            d.set_item(c.name.bind(py), c.array.bind(py).get_item(self.row)?)?;
        }
        if let Some(c) = self.constants(py) {
            d.update(c.as_mapping())?;
        }
        Ok(d)
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(format!("AgentOutputs(row={}, {})", self.row, self.to_dict(py)?.repr()?))
    }
}
