//! Writes: Python values converted into a field's items as the core's `Conversion` says
//! (a first item's spec inferred from it here), and steps and resets checked and converted
//! before they are stored; `_extend` and `_set` (in the class) use them.

use std::sync::Arc;

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};

use super::{info_or_absent, to_object, FieldName, PyField, SingleAgentEpisodePy};
use crate::column::ColumnError;
use crate::episode::{perf_counter, Conversion, Field, Item, Step};
use crate::py::errors::{column_error, episode_error};
use crate::py::object::PyObj;
use crate::py::spec::{self, LeafBytes, Spec};

/// One value converted for a field (a first item carries the spec inferred from it).
pub(super) type PyItem<'py> = Item<PyObj, LeafBytes<'py>, Spec>;

/// Converts one value for `field` as the core's [`Conversion`] says.
pub(super) fn prepare<'py>(
    value: &Bound<'py, PyAny>,
    field: &PyField,
    name: FieldName<'_>,
) -> PyResult<PyItem<'py>> {
    convert(value, field.conversion(), name)
}

/// Converts one value as `conversion` says (`name`: the field, for messages).
pub(super) fn convert<'py>(
    value: &Bound<'py, PyAny>,
    conversion: Conversion<'_, Spec>,
    name: FieldName<'_>,
) -> PyResult<PyItem<'py>> {
    let object = || Item::Object(PyObj(value.clone().unbind()));
    let views = |spec: &Spec| spec::to_leaf_views(spec, value, None, &|| name.label());
    match conversion {
        Conversion::Object => Ok(object()),
        Conversion::Bytes { spec, strict } => match views(spec) {
            Ok(leaves) => Ok(Item::Bytes(leaves)),
            Err(e) if strict => Err(e),
            Err(_) => Ok(object()),
        },
        Conversion::First(spec) => Ok(Item::FirstTyped {
            schema: spec.schema(),
            leaves: views(spec)?,
            host_scalars: false,
            spec: None,
        }),
        Conversion::Infer => match spec::infer(value)? {
            Some((spec, host_scalars)) => match views(&spec) {
                Ok(leaves) => {
                    Ok(Item::FirstTyped { schema: spec.schema(), leaves, host_scalars, spec: Some(spec) })
                }
                Err(_) => Ok(object()),
            },
            None => Ok(object()),
        },
    }
}

/// A value for one field of a step: a Python object, or a row of a batch already laid out
/// by the field's spec (see `SingleAgentEpisodePy::row_spec`), stored without conversion.
pub enum Input<'py> {
    Object(Bound<'py, PyAny>),
    Row(Vec<LeafBytes<'py>>),
    /// The first item of a field that infers its spec (see
    /// [`SingleAgentEpisodePy::infers_spec`]): a row laid out by the spec its value infers,
    /// as [`prepare`] would infer and convert it.
    FirstRow {
        leaves: Vec<LeafBytes<'py>>,
        spec: Arc<Spec>,
        host_scalars: bool,
    },
}

/// [`prepare`] for an [`Input`]: a row goes in as it is (the core checks its size).
pub(super) fn prepare_input<'py>(
    value: Input<'py>,
    field: &PyField,
    name: FieldName<'_>,
) -> PyResult<PyItem<'py>> {
    match value {
        Input::Object(v) => prepare(&v, field, name),
        Input::Row(leaves) => Ok(Item::Bytes(leaves.into())),
        Input::FirstRow { leaves, spec, host_scalars } => match field.conversion() {
            Conversion::Infer => Ok(Item::FirstTyped {
                schema: spec.schema(),
                leaves: leaves.into(),
                host_scalars,
                spec: Some(spec),
            }),
            _ => Err(PyValueError::new_err(format!(
                "internal error: a first row for the {}, which does not infer its spec",
                name.label()
            ))),
        },
    }
}

/// The rows of a batch: an array's first axis, or the rows of a dict/tuple of batches
/// put back together as dicts/tuples.
pub(super) fn split_rows<'py>(data: &Bound<'py, PyAny>) -> PyResult<Vec<Bound<'py, PyAny>>> {
    let py = data.py();
    if let Ok(d) = data.cast::<PyDict>() {
        let mut columns = Vec::with_capacity(d.len());
        for (k, v) in d.iter() {
            columns.push((k, split_rows(&v)?));
        }
        let n = columns.first().map_or(0, |(_, rows)| rows.len());
        return (0..n)
            .map(|i| {
                let row = PyDict::new(py);
                for (k, rows) in &columns {
                    row.set_item(k, rows.get(i).ok_or_else(|| ragged(i))?)?;
                }
                Ok(row.into_any())
            })
            .collect();
    }
    if let Ok(t) = data.cast::<pyo3::types::PyTuple>() {
        let columns = t.iter().map(|v| split_rows(&v)).collect::<PyResult<Vec<_>>>()?;
        let n = columns.first().map_or(0, Vec::len);
        return (0..n)
            .map(|i| {
                let row = columns
                    .iter()
                    .map(|rows| rows.get(i).cloned().ok_or_else(|| ragged(i)))
                    .collect::<PyResult<Vec<_>>>()?;
                Ok(pyo3::types::PyTuple::new(py, row)?.into_any())
            })
            .collect();
    }
    data.try_iter()?.collect()
}

pub(super) fn ragged(row: usize) -> PyErr {
    crate::py::errors::SpaceMismatchError::new_err(format!(
        "the batch's parts have different lengths (no row {row} in all of them)"
    ))
}

pub(super) fn is_number(value: &Bound<'_, PyAny>) -> PyResult<bool> {
    let py = value.py();
    if value.is_instance_of::<pyo3::types::PyFloat>() || value.is_instance_of::<pyo3::types::PyInt>() {
        return Ok(true);
    }
    static NUMBER_TYPES: pyo3::sync::PyOnceLock<(Py<PyAny>, Py<PyAny>)> = pyo3::sync::PyOnceLock::new();
    let (number, bool_) = NUMBER_TYPES.get_or_try_init(py, || -> PyResult<_> {
        let np = spec::numpy(py)?;
        Ok((np.getattr("number")?.unbind(), np.getattr("bool_")?.unbind()))
    })?;
    if value.is_instance(number.bind(py))? || value.is_instance(bool_.bind(py))? {
        return Ok(true);
    }
    if let Ok(a) = value.cast::<numpy::PyUntypedArray>() {
        use numpy::PyUntypedArrayMethods;
        return Ok(a.ndim() == 0
            && matches!(numpy::PyArrayDescrMethods::kind(&a.dtype()), b'b' | b'i' | b'u' | b'f'));
    }
    Ok(false)
}

/// `IndexError` unless a set gives one value per selected position.
pub(super) fn check_set_len(selected: usize, given: usize) -> PyResult<()> {
    ColumnError::check_set_len(selected, given).map_err(|e| column_error(&e))
}

/// The bytes a set writes into a typed field laid out by `spec`: one buffer per leaf with
/// `selected` items, from `values` (one Python value per position) or, where the caller
/// did not split them, from `new_data` as a batch.
pub(super) fn typed_set_leaves(
    spec: &Spec,
    values: Option<&[Bound<'_, PyAny>]>,
    new_data: &Bound<'_, PyAny>,
    selected: usize,
    name: FieldName<'_>,
) -> PyResult<Vec<Vec<u8>>> {
    if let Some(vals) = values {
        let mut acc = vec![Vec::new(); spec.schema.leaves.len()];
        for v in vals {
            for (a, b) in acc.iter_mut().zip(spec::to_leaves(spec, v, None, &|| name.label())?) {
                a.extend_from_slice(&b);
            }
        }
        return Ok(acc);
    }
    let leaves = spec::to_leaves(spec, new_data, Some(None), &|| name.label())?;
    if let Some(l) = spec.schema.leaves.first() {
        check_set_len(
            selected,
            if l.item_bytes() == 0 { selected } else { leaves[0].len() / l.item_bytes() },
        )?;
    }
    Ok(leaves)
}

/// One step's values, converted and checked against an episode, not yet stored.
pub struct PreparedStep<'py> {
    observation: PyItem<'py>,
    action: PyItem<'py>,
    reward: PyItem<'py>,
    info: Option<PyObj>,
    /// Extra model output keys and items, apart: the stored step borrows the keys' text
    /// while it takes the items.
    extra_keys: Vec<Bound<'py, PyString>>,
    extra_items: Vec<PyItem<'py>>,
}

/// A reset observation, converted and checked against an episode, not yet stored.
pub struct PreparedReset<'py>(PyItem<'py>);

impl SingleAgentEpisodePy {
    /// Checks and converts a reset observation (nothing is stored).
    pub fn prepare_reset<'py>(&self, observation: &Bound<'py, PyAny>) -> PyResult<PreparedReset<'py>> {
        self.core.check_reset().map_err(|e| episode_error(&e))?;
        Ok(PreparedReset(prepare(observation, &self.core.observations, FieldName::Observations)?))
    }

    /// Stores a prepared reset observation.
    pub fn apply_reset(
        &mut self,
        py: Python<'_>,
        prepared: PreparedReset<'_>,
        infos: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        self.core
            .add_reset(prepared.0, info_or_absent(infos), |t| to_object(py, t))
            .map_err(|e| episode_error(&e))?;
        self.times.reset(perf_counter());
        Ok(())
    }

    /// Checks and converts one step's values against this episode (nothing is stored), so
    /// that a caller recording several episodes can check all of them first.
    pub fn prepare_step<'py>(
        &self,
        observation: &Bound<'py, PyAny>,
        action: &Bound<'py, PyAny>,
        reward: &Bound<'py, PyAny>,
        infos: Option<&Bound<'py, PyAny>>,
        extra_model_outputs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<PreparedStep<'py>> {
        let mut extras = Vec::new();
        if let Some(d) = extra_model_outputs {
            for (k, v) in d.iter() {
                let k = k.cast_into::<PyString>().map_err(|e| {
                    PyTypeError::new_err(format!(
                        "extra_model_outputs keys must be str, got {}",
                        e.into_inner().repr().map(|r| r.to_string()).unwrap_or_default()
                    ))
                })?;
                extras.push((k, Input::Object(v)));
            }
        }
        self.prepare_step_inputs(
            Input::Object(observation.clone()),
            Input::Object(action.clone()),
            Input::Object(reward.clone()),
            infos,
            extras,
        )
    }

    /// [`Self::prepare_step`] for values that may be rows of batches (a vector env's step).
    pub fn prepare_step_inputs<'py>(
        &self,
        observation: Input<'py>,
        action: Input<'py>,
        reward: Input<'py>,
        infos: Option<&Bound<'py, PyAny>>,
        extra_model_outputs: Vec<(Bound<'py, PyString>, Input<'py>)>,
    ) -> PyResult<PreparedStep<'py>> {
        self.core.check_step().map_err(|e| episode_error(&e))?;
        if let Input::Object(reward) = &reward {
            if !is_number(reward)? {
                return Err(PyTypeError::new_err(format!(
                    "reward must be a real number (a Python or numpy scalar), got {} of type {}",
                    reward.repr()?,
                    reward.get_type().name()?
                )));
            }
        }
        let observation = prepare_input(observation, &self.core.observations, FieldName::Observations)?;
        let action = prepare_input(action, &self.core.actions, FieldName::Actions)?;
        let reward = prepare_input(reward, &self.core.rewards, FieldName::Rewards)?;
        let mut extra_keys = Vec::with_capacity(extra_model_outputs.len());
        let mut extra_items = Vec::with_capacity(extra_model_outputs.len());
        let untyped = Field::untyped();
        for (k, v) in extra_model_outputs {
            let key = k.to_str()?;
            extra_items.push(prepare_input(
                v,
                self.core.extra(key).unwrap_or(&untyped),
                FieldName::Extra(key),
            )?);
            extra_keys.push(k);
        }
        Ok(PreparedStep { observation, action, reward, info: info_or_absent(infos), extra_keys, extra_items })
    }

    /// Stores a prepared step (checked again by the core; nothing is stored on error).
    pub fn apply_step(
        &mut self,
        py: Python<'_>,
        prepared: PreparedStep<'_>,
        terminated: bool,
        truncated: bool,
    ) -> PyResult<()> {
        let PreparedStep { observation, action, reward, info, extra_keys, extra_items } = prepared;
        let mut extra_model_outputs = Vec::with_capacity(extra_items.len());
        for (k, item) in extra_keys.iter().zip(extra_items) {
            extra_model_outputs.push((k.to_str()?, item));
        }
        let step = Step { observation, action, reward, info, extra_model_outputs, terminated, truncated };
        self.core.add_step(step, |t| to_object(py, t)).map_err(|e| episode_error(&e))?;
        self.stamp_step(perf_counter());
        Ok(())
    }

    /// Records `now` as the last step's time (and the start's, at the first step).
    pub(super) fn stamp_step(&mut self, now: f64) {
        self.times.step(now);
    }
}
