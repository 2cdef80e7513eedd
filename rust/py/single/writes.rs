//! Writes: Python values converted into a field's items (inferring its spec from a first
//! item), steps and resets checked before they are stored, appends and overwrites.

use std::sync::Arc;

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString};

use super::{
    field_name, info_or_absent, label, perf_counter, to_object, FieldName, PyField, SingleAgentEpisodePy,
};
use crate::episode::read::{self, WriteValues};
use crate::episode::{EpisodeError, Field, Item, Step, Storage};
use crate::py::errors::{column_error, episode_error, index_error};
use crate::py::index::to_index;
use crate::py::object::PyObj;
use crate::py::spec::{self, LeafBytes, Spec};

/// One value converted for a field, with the spec inferred from it if it was the first.
pub(super) type Prepared<'py> = (Item<PyObj, LeafBytes<'py>>, Option<Arc<Spec>>);

/// Converts one value for `field` (whose spec may be inferred now).
pub(super) fn prepare<'py>(
    value: &Bound<'py, PyAny>,
    field: &PyField,
    name: FieldName<'_>,
) -> PyResult<Prepared<'py>> {
    let spec = field.spec();
    let object = || (Item::Object(PyObj(value.clone().unbind())), None);
    match (&field.storage, spec) {
        (Storage::Objects { .. } | Storage::Sparse { .. }, _) | (Storage::Typed { .. }, None) => Ok(object()),
        (Storage::Typed { .. }, Some(spec)) => {
            match spec::to_leaf_views(spec, value, None, &|| label(name)) {
                Ok(leaves) => Ok((Item::Bytes(leaves), None)),
                Err(e) if spec.from_space => Err(e),
                Err(_) => Ok(object()),
            }
        }
        (Storage::Untyped { .. }, Some(spec)) => {
            let leaves = spec::to_leaf_views(spec, value, None, &|| label(name))?;
            Ok((Item::FirstTyped { schema: spec.schema(), leaves, host_scalars: false }, None))
        }
        (Storage::Untyped { .. }, None) => match spec::infer(value)? {
            Some((spec, host_scalars)) => match spec::to_leaf_views(&spec, value, None, &|| label(name)) {
                Ok(leaves) => {
                    Ok((Item::FirstTyped { schema: spec.schema(), leaves, host_scalars }, Some(spec)))
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
) -> PyResult<Prepared<'py>> {
    match value {
        Input::Object(v) => prepare(&v, field, name),
        Input::Row(leaves) => Ok((Item::Bytes(leaves.into()), None)),
        Input::FirstRow { leaves, spec: inferred, host_scalars } => match (&field.storage, field.spec()) {
            (Storage::Untyped { .. }, None) => Ok((
                Item::FirstTyped { schema: inferred.schema(), leaves: leaves.into(), host_scalars },
                Some(inferred),
            )),
            _ => Err(PyValueError::new_err(format!(
                "internal error: a first row for the {}, which does not infer its spec",
                label(name)
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
            for (a, b) in acc.iter_mut().zip(spec::to_leaves(spec, v, None, &|| label(name))?) {
                a.extend_from_slice(&b);
            }
        }
        return Ok(acc);
    }
    let leaves = spec::to_leaves(spec, new_data, Some(None), &|| label(name))?;
    if let Some(l) = spec.schema.leaves.first() {
        let n = if l.item_bytes() == 0 { selected } else { leaves[0].len() / l.item_bytes() };
        if n != selected {
            return Err(column_error(&crate::column::ColumnError::SetLength { selected, given: n }));
        }
    }
    Ok(leaves)
}

/// The values a set writes into a field of Python objects: `values` if the caller split
/// them already, else the items of `new_data`; exactly one per position.
pub(super) fn object_values<'py>(
    values: Option<Vec<Bound<'py, PyAny>>>,
    new_data: &Bound<'py, PyAny>,
    positions: usize,
) -> PyResult<Vec<Bound<'py, PyAny>>> {
    let vals = match values {
        Some(v) => v,
        None => new_data.try_iter()?.collect::<PyResult<Vec<_>>>()?,
    };
    if vals.len() != positions {
        return Err(column_error(&crate::column::ColumnError::SetLength {
            selected: positions,
            given: vals.len(),
        }));
    }
    Ok(vals)
}

/// One step's values, converted and checked against an episode, not yet stored.
pub struct PreparedStep<'py> {
    observation: Item<PyObj, LeafBytes<'py>>,
    action: Item<PyObj, LeafBytes<'py>>,
    reward: Item<PyObj, LeafBytes<'py>>,
    info: Option<PyObj>,
    /// Extra model output keys and items, apart: the stored step borrows the keys' text
    /// while it takes the items.
    extra_keys: Vec<Bound<'py, PyString>>,
    extra_items: Vec<Item<PyObj, LeafBytes<'py>>>,
    /// Specs inferred from first items, stored once the step is.
    specs: Vec<(SpecSlot, Arc<Spec>)>,
}

/// A reset observation, converted and checked against an episode, not yet stored.
pub struct PreparedReset<'py> {
    observation: Item<PyObj, LeafBytes<'py>>,
    spec: Option<Arc<Spec>>,
}

/// Which field an inferred spec belongs to (owned: it outlives the borrowed extra keys).
pub(super) enum SpecSlot {
    Observations,
    Actions,
    Rewards,
    Extra(String),
}

impl SingleAgentEpisodePy {
    /// Checks and converts a reset observation (nothing is stored).
    pub fn prepare_reset<'py>(&self, observation: &Bound<'py, PyAny>) -> PyResult<PreparedReset<'py>> {
        if self.core.is_done() {
            return Err(episode_error(&EpisodeError::Done { what: "add_env_reset" }));
        }
        if self.core.t_started != 0 {
            return Err(crate::py::errors::EpisodeStateError::new_err(format!(
                "add_env_reset: a reset starts at t=0, this episode starts at t_started={}",
                self.core.t_started
            )));
        }
        if self.core.is_reset() || self.core.t != self.core.t_started {
            return Err(episode_error(&EpisodeError::AlreadyReset));
        }
        let (observation, spec) = prepare(observation, &self.core.observations, FieldName::Observations)?;
        Ok(PreparedReset { observation, spec })
    }

    /// Stores a prepared reset observation.
    pub fn apply_reset(
        &mut self,
        py: Python<'_>,
        prepared: PreparedReset<'_>,
        infos: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        self.core
            .add_reset(prepared.observation, info_or_absent(infos), |t| to_object(py, t))
            .map_err(|e| episode_error(&e))?;
        if prepared.spec.is_some() {
            self.core.observations.spec = prepared.spec;
        }
        self.start_time = Some(perf_counter());
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
        if self.core.is_done() {
            return Err(episode_error(&EpisodeError::Done { what: "add_env_step" }));
        }
        if !self.core.is_reset() {
            return Err(episode_error(&EpisodeError::NotReset));
        }
        if let Input::Object(reward) = &reward {
            if !is_number(reward)? {
                return Err(PyTypeError::new_err(format!(
                    "reward must be a real number (a Python or numpy scalar), got {} of type {}",
                    reward.repr()?,
                    reward.get_type().name()?
                )));
            }
        }
        let mut specs = Vec::new();
        let mut keep = |slot: SpecSlot, s: Option<Arc<Spec>>| {
            if let Some(s) = s {
                specs.push((slot, s));
            }
        };
        let (observation, s) = prepare_input(observation, &self.core.observations, FieldName::Observations)?;
        keep(SpecSlot::Observations, s);
        let (action, s) = prepare_input(action, &self.core.actions, FieldName::Actions)?;
        keep(SpecSlot::Actions, s);
        let (reward, s) = prepare_input(reward, &self.core.rewards, FieldName::Rewards)?;
        keep(SpecSlot::Rewards, s);
        let mut extra_keys = Vec::with_capacity(extra_model_outputs.len());
        let mut extra_items = Vec::with_capacity(extra_model_outputs.len());
        let untyped = Field::untyped();
        for (k, v) in extra_model_outputs {
            let key = k.to_str()?;
            let name = FieldName::Extra(key);
            let field = self.core.extra(key).unwrap_or(&untyped);
            let (item, s) = prepare_input(v, field, name)?;
            if s.is_some() {
                keep(SpecSlot::Extra(key.to_string()), s);
            }
            extra_keys.push(k);
            extra_items.push(item);
        }
        Ok(PreparedStep {
            observation,
            action,
            reward,
            info: info_or_absent(infos),
            extra_keys,
            extra_items,
            specs,
        })
    }

    /// Stores a prepared step (checked again by the core; nothing is stored on error).
    pub fn apply_step(
        &mut self,
        py: Python<'_>,
        prepared: PreparedStep<'_>,
        terminated: bool,
        truncated: bool,
    ) -> PyResult<()> {
        let PreparedStep { observation, action, reward, info, extra_keys, extra_items, specs: new_specs } =
            prepared;
        let mut extra_model_outputs = Vec::with_capacity(extra_items.len());
        for (k, item) in extra_keys.iter().zip(extra_items) {
            extra_model_outputs.push((k.to_str()?, item));
        }
        let step = Step { observation, action, reward, info, extra_model_outputs, terminated, truncated };
        self.core.add_step(step, |t| to_object(py, t)).map_err(|e| episode_error(&e))?;
        for (slot, s) in new_specs {
            let name = match &slot {
                SpecSlot::Observations => FieldName::Observations,
                SpecSlot::Actions => FieldName::Actions,
                SpecSlot::Rewards => FieldName::Rewards,
                SpecSlot::Extra(key) => FieldName::Extra(key),
            };
            if let Some(field) = self.core.field_mut(name) {
                field.spec = Some(s);
            }
        }
        self.stamp_step(perf_counter());
        Ok(())
    }

    /// Records `now` as the last step's time (and the start's, at the first step).
    pub(super) fn stamp_step(&mut self, now: f64) {
        self.last_step_time = Some(now);
        self.start_time.get_or_insert(now);
    }

    /// Appends `data` to a field (see `_extend`).
    pub(super) fn extend_items(
        &mut self,
        py: Python<'_>,
        field: &str,
        data: &Bound<'_, PyAny>,
        key: Option<&str>,
    ) -> PyResult<()> {
        let name = field_name(field, key)?;
        if let FieldName::Extra(k) = name {
            self.core.extra_or_insert(k);
        }
        // A Python list holds items; anything else (an array, or a dict/tuple of arrays for
        // a nested space) is a batch with the items on its first axis, as RLlib's buffers
        // hold them once numpy'd.
        let is_list = data.cast::<PyList>().is_ok();
        let items: Vec<Bound<'_, PyAny>> =
            if is_list { data.try_iter()?.collect::<PyResult<_>>()? } else { split_rows(data)? };
        for item in &items {
            let f = self.field(name)?;
            let (it, s) = if name == FieldName::Infos {
                (Item::Object(PyObj(item.clone().unbind())), None)
            } else {
                prepare(item, f, name)?
            };
            let f = self.field_mut(name)?;
            if !f.push(it, |t| to_object(py, t)) {
                return Err(crate::py::errors::SpaceMismatchError::new_err(format!(
                    "{} does not fit its column",
                    label(name)
                )));
            }
            if s.is_some() {
                f.spec = s;
            }
        }
        if !is_list && name != FieldName::Infos {
            self.field_mut(name)?.finalized = true;
        }
        Ok(())
    }

    /// Makes `data` the extra model output `key` (see `_put_extra`).
    pub(super) fn put_extra_field(
        &mut self,
        py: Python<'_>,
        key: &str,
        data: &Bound<'_, PyAny>,
        lookback: usize,
    ) -> PyResult<()> {
        // Built in a scratch episode, with the same conversions as `_extend`'s.
        let mut scratch = SingleAgentEpisodePy::blank();
        scratch.extend(py, "extra_model_outputs", data, Some(key))?;
        let mut field = scratch.field(FieldName::Extra(key))?.clone();
        field.set_lookback(lookback);
        let steps = self.core.observations.len().saturating_sub(1);
        if field.len() != steps {
            return Err(crate::py::errors::EpisodeStateError::new_err(format!(
                "extra_model_outputs[{key:?}]: {} items after a look-back of {}, but the \
                 episode has {steps} steps",
                field.len(),
                field.lookback()
            )));
        }
        *self.core.extra_or_insert(key) = field;
        Ok(())
    }

    /// Overwrites items of a field (see `_set`).
    #[allow(clippy::too_many_lines)] // value form x storage kind x the fallback to objects
    pub(super) fn write_field(
        &mut self,
        field: &str,
        new_data: &Bound<'_, PyAny>,
        key: Option<&str>,
        at_indices: Option<&Bound<'_, PyAny>>,
        neg_index_as_lookback: bool,
    ) -> PyResult<()> {
        let name = field_name(field, key)?;
        let is_list = new_data.cast::<PyList>().is_ok();
        let plan =
            read::plan_write(self.field(name)?, &to_index(at_indices)?, neg_index_as_lookback, is_list)
                .map_err(|e| index_error(&e))?;
        let positions = plan.positions;
        // The new items, one Python value each (or one batch).
        let values: Option<Vec<Bound<'_, PyAny>>> = match plan.values {
            WriteValues::One => Some(vec![new_data.clone()]),
            WriteValues::PerItem => {
                let vals: Vec<Bound<'_, PyAny>> = (0..positions.len())
                    .map(|i| new_data.get_item(i))
                    .collect::<PyResult<_>>()
                    .map_err(|_| {
                        pyo3::exceptions::PyIndexError::new_err(format!(
                            "cannot set {} items from {}",
                            positions.len(),
                            new_data.repr().map(|r| r.to_string()).unwrap_or_default()
                        ))
                    })?;
                if let Ok(n) = new_data.len() {
                    if n != positions.len() {
                        return Err(column_error(&crate::column::ColumnError::SetLength {
                            selected: positions.len(),
                            given: n,
                        }));
                    }
                }
                Some(vals)
            }
            WriteValues::Batch => None,
        };
        let spec = self.field(name)?.spec.clone();
        let mut values = values;
        if let (Storage::Typed { .. }, Some(spec)) = (&self.field(name)?.storage, spec) {
            match typed_set_leaves(&spec, values.as_deref(), new_data, positions.len(), name) {
                Ok(leaves) => {
                    let Storage::Typed { column, .. } = &mut self.field_mut(name)?.storage else {
                        return Err(PyValueError::new_err("internal error: typed field changed"));
                    };
                    let refs: Vec<&[u8]> = leaves.iter().map(Vec::as_slice).collect();
                    return column.overwrite_many(&positions, &refs).map_err(|e| column_error(&e));
                }
                Err(e) if spec.from_space => return Err(e),
                Err(_) => {
                    // A value that does not fit the layout inferred from the first item
                    // (a float into ints, another shape): the field keeps Python objects
                    // from now on, as `add_env_step` does with such a value. The values
                    // are counted first: a wrong number of them changes nothing.
                    let vals = match values {
                        Some(v) => v,
                        None if is_list => new_data.try_iter()?.collect::<PyResult<Vec<_>>>()?,
                        None => split_rows(new_data)?,
                    };
                    if vals.len() != positions.len() {
                        return Err(column_error(&crate::column::ColumnError::SetLength {
                            selected: positions.len(),
                            given: vals.len(),
                        }));
                    }
                    let py = new_data.py();
                    self.field_mut(name)?.make_objects(|t| to_object(py, t));
                    values = Some(vals);
                }
            }
        }
        let f = self.field_mut(name)?;
        match &mut f.storage {
            Storage::Objects { items, .. } => {
                for (p, v) in positions.iter().zip(object_values(values, new_data, positions.len())?) {
                    items[*p] = PyObj(v.unbind());
                }
                Ok(())
            }
            Storage::Sparse { .. } => {
                for (p, v) in positions.iter().zip(object_values(values, new_data, positions.len())?) {
                    f.set_object(*p, PyObj(v.unbind()));
                }
                Ok(())
            }
            _ => {
                if positions.is_empty() {
                    Ok(())
                } else {
                    Err(PyValueError::new_err(format!(
                        "cannot set the {}: the field holds no data",
                        label(name)
                    )))
                }
            }
        }
    }
}
