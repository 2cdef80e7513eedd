//! `SingleAgentEpisodePy`: the native storage behind `fastrollout.SingleAgentEpisode`.
//!
//! The Python class keeps identity and metadata (ids, spaces, custom data, timing); this
//! object holds the fields and does every per-step and per-read operation in one call.

use std::sync::Arc;

use pyo3::exceptions::{PyKeyError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString};
use smallvec::SmallVec;

use super::errors::{column_error, episode_error, index_error};
use super::index::to_index;
use super::object::PyObj;
use super::outputs::AgentOutputsPy;
use super::spec::{self, LeafBytes, Spec};
use crate::column::{Column, Pos, Resolved};
use crate::episode::read::{
    self, BatchFill, FillSpec, Form, LeafDtype, ReadArgs, ReadError, ReadPlan, WriteValues,
};
use crate::episode::{
    EpisodeError, Field, FieldName, Item, Leaves, SingleAgentCore, Step, Storage, TypedItem,
};
use crate::schema::DType;

/// The core episode with Python objects and numpy specs.
type Core = SingleAgentCore<PyObj, Spec>;
/// A field of [`Core`].
type PyField = Field<PyObj, Spec>;

fn field_name<'a>(field: &str, key: Option<&'a str>) -> PyResult<FieldName<'a>> {
    Ok(match (field, key) {
        ("observations", _) => FieldName::Observations,
        ("infos", _) => FieldName::Infos,
        ("actions", _) => FieldName::Actions,
        ("rewards", _) => FieldName::Rewards,
        ("extra_model_outputs", Some(k)) => FieldName::Extra(k),
        _ => return Err(PyValueError::new_err(format!("unknown episode field {field:?} (key {key:?})"))),
    })
}

fn label(name: FieldName<'_>) -> String {
    name.label()
}

/// The core's items as Python objects, for fields that turn into object storage: as they
/// read before (items given as Python scalars stay Python scalars, as in RLlib's lists).
fn to_object(py: Python<'_>, item: TypedItem<'_, Spec>) -> PyObj {
    let value =
        item.spec.and_then(|s| spec::item(py, s, item.column, item.pos, item.host_scalar, false).ok());
    PyObj(value.map_or_else(|| py.None(), Bound::unbind))
}

/// One value converted for a field, with the spec inferred from it if it was the first.
type Prepared<'py> = (Item<PyObj, LeafBytes<'py>>, Option<Arc<Spec>>);

/// Converts one value for `field` (whose spec may be inferred now).
fn prepare<'py>(value: &Bound<'py, PyAny>, field: &PyField, name: FieldName<'_>) -> PyResult<Prepared<'py>> {
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
fn prepare_input<'py>(value: Input<'py>, field: &PyField, name: FieldName<'_>) -> PyResult<Prepared<'py>> {
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
fn split_rows<'py>(data: &Bound<'py, PyAny>) -> PyResult<Vec<Bound<'py, PyAny>>> {
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

fn ragged(row: usize) -> PyErr {
    super::errors::SpaceMismatchError::new_err(format!(
        "the batch's parts have different lengths (no row {row} in all of them)"
    ))
}

/// The infos to record: RLlib records `infos or {}`, a fresh empty dict where none (or
/// a falsy value) was given. That dict is left absent (`None`) here and made when first
/// read (see `_get`): most envs give no infos, and a
/// dict per step would cost more than the step's data.
pub fn info_or_absent(infos: Option<&Bound<'_, PyAny>>) -> Option<PyObj> {
    match infos {
        Some(i) if i.is_truthy().unwrap_or(true) => Some(PyObj(i.clone().unbind())),
        _ => None,
    }
}

/// A fresh empty dict: the infos RLlib records for a step without any.
fn empty_info(py: Python<'_>) -> PyObj {
    PyObj(PyDict::new(py).into_any().unbind())
}

fn is_number(value: &Bound<'_, PyAny>) -> PyResult<bool> {
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

/// Native buffers of one single-agent episode (observations, actions, rewards, infos,
/// extra model outputs) with RLlib's look-back semantics.
///
/// `fastrollout.SingleAgentEpisode` subclasses it: the per-step and per-read methods with
/// RLlib's names are native, so a call goes straight from Python into Rust; the Python
/// class adds identity, spaces, custom data and state handling.
#[pyclass(name = "SingleAgentEpisodeCore", module = "fastrollout._core", subclass)]
pub struct SingleAgentEpisodePy {
    core: Core,
    /// `time.perf_counter()` values (CLOCK_MONOTONIC) of the first and the last step.
    start_time: Option<f64>,
    last_step_time: Option<f64>,
}

/// Seconds on the clock `time.perf_counter()` reads (CLOCK_MONOTONIC on Linux), so the
/// values stored in states compare with Python's.
pub fn perf_counter() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec into the valid, exclusively borrowed `ts`.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &raw mut ts) };
    if rc == 0 {
        ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
    } else {
        0.0
    }
}

impl SingleAgentEpisodePy {
    /// An episode core holding nothing (what `__new__` makes).
    fn blank() -> Self {
        SingleAgentEpisodePy { core: Core::default(), start_time: None, last_step_time: None }
    }

    /// The field `name`; `KeyError` for an extra model output key the episode lacks.
    fn field(&self, name: FieldName<'_>) -> PyResult<&PyField> {
        self.core.field(name).ok_or_else(|| missing_key(name))
    }

    fn field_mut(&mut self, name: FieldName<'_>) -> PyResult<&mut PyField> {
        self.core.field_mut(name).ok_or_else(|| missing_key(name))
    }

    /// Stores the observations compressed in blocks of `rows` items (`None`: uncompressed),
    /// as a multi-agent episode's setting asks of each agent. Observations without a
    /// typed column yet (no space and no data) get the setting with their first
    /// observation; Python objects are left as they are.
    pub fn set_observation_compression(&mut self, rows: Option<usize>) {
        self.core.observations.set_compression(rows);
    }

    /// Moves `core` into `target`, a fresh episode object.
    fn fill_target(target: &Bound<'_, SingleAgentEpisodePy>, core: Core) -> PyResult<()> {
        let mut t = target.try_borrow_mut()?;
        t.core = core;
        t.start_time = None;
        t.last_step_time = None;
        Ok(())
    }
}

#[pymethods]
impl SingleAgentEpisodePy {
    /// An empty episode core; the Python subclass's `__init__` fills it (arguments are
    /// accepted and ignored here so that subclasses can take any).
    #[new]
    #[pyo3(signature = (*_args, **_kwargs))]
    fn new(_args: &Bound<'_, pyo3::types::PyTuple>, _kwargs: Option<&Bound<'_, PyDict>>) -> Self {
        Self::blank()
    }

    /// Sets the space of `field` ("observations" or "actions"). Takes effect for the
    /// layout only while the field holds no data or the space's layout matches it;
    /// otherwise it is used for fills and one-hot encoding where it fits.
    #[pyo3(name = "_set_space")]
    fn set_space(&mut self, field: &str, space: &Bound<'_, PyAny>) -> PyResult<()> {
        let name = field_name(field, None)?;
        let new = if space.is_none() { None } else { spec::from_space(space)? };
        let f = self.field_mut(name)?;
        // The new storage keeps the field's compression setting.
        let compression = f.compression();
        match (&f.storage, &new) {
            (Storage::Untyped { .. }, Some(s)) => {
                f.storage = PyField::typed(s.schema(), false).storage;
                f.set_compression(compression);
            }
            (Storage::Typed { column, .. }, Some(s))
                if column.total() == 0 || *column.schema() == *s.schema =>
            {
                if column.total() == 0 {
                    f.storage = PyField::typed(s.schema(), false).storage;
                    f.set_compression(compression);
                }
            }
            (Storage::Typed { column, .. }, None) if column.total() == 0 => {
                f.storage = Storage::Untyped { compression };
            }
            _ => return Ok(()),
        }
        match new {
            Some(s) => f.spec = Some(s),
            None if matches!(name, FieldName::Observations | FieldName::Actions) => f.spec = None,
            None => {}
        }
        Ok(())
    }

    /// Records the reset observation (and its infos).
    ///
    /// Raises `EpisodeStateError` if the episode already holds observations, is done or
    /// does not start at t=0, and `SpaceMismatchError` if the observation does not fit.
    #[pyo3(signature = (observation, infos=None))]
    fn add_env_reset(
        &mut self,
        py: Python<'_>,
        observation: &Bound<'_, PyAny>,
        infos: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let prepared = self.prepare_reset(observation)?;
        self.apply_reset(py, prepared, infos)
    }

    /// Records one environment step, every field in one native call. Nothing is stored
    /// unless every value fits.
    ///
    /// Raises `EpisodeStateError` if the episode is done or was never reset,
    /// `SpaceMismatchError` if the observation or action does not fit its space, and
    /// `TypeError` if the reward is not a real number.
    #[pyo3(signature = (observation, action, reward, infos=None, *, terminated=false, truncated=false, extra_model_outputs=None))]
    #[allow(clippy::too_many_arguments)]
    fn add_env_step(
        &mut self,
        py: Python<'_>,
        observation: &Bound<'_, PyAny>,
        action: &Bound<'_, PyAny>,
        reward: &Bound<'_, PyAny>,
        infos: Option<&Bound<'_, PyAny>>,
        terminated: bool,
        truncated: bool,
        extra_model_outputs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<()> {
        let prepared = self.prepare_step(observation, action, reward, infos, extra_model_outputs)?;
        self.apply_step(py, prepared, terminated, truncated)
    }

    /// Appends `data` (a list of items, or a batch: an ndarray / dict of ndarrays with the
    /// items on the first axis) to a field; a batch also marks the field finalized, as
    /// RLlib's buffers do when built from arrays.
    #[pyo3(signature = (field, data, key=None))]
    #[pyo3(name = "_extend")]
    fn extend(
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
                return Err(super::errors::SpaceMismatchError::new_err(format!(
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

    /// Appends `n` infos that were not given: RLlib's fresh empty dicts, made when first
    /// read (see `info_or_absent`).
    #[pyo3(name = "_extend_empty_infos")]
    fn extend_empty_infos(&mut self, n: usize) {
        for _ in 0..n {
            self.core.infos.push_sparse(None);
        }
    }

    /// Sets how many of a field's stored items are look-back (capped at what is stored).
    #[pyo3(signature = (field, lookback, key=None))]
    #[pyo3(name = "_set_lookback")]
    fn set_lookback(&mut self, field: &str, lookback: usize, key: Option<&str>) -> PyResult<()> {
        self.field_mut(field_name(field, key)?)?.set_lookback(lookback);
        Ok(())
    }

    #[pyo3(signature = (field, key=None))]
    #[pyo3(name = "_lookback")]
    fn lookback(&self, field: &str, key: Option<&str>) -> PyResult<usize> {
        Ok(self.field(field_name(field, key)?)?.lookback())
    }

    /// Items in a field's chunk (look-back not counted).
    #[pyo3(signature = (field, key=None))]
    #[pyo3(name = "_field_len")]
    fn field_len(&self, field: &str, key: Option<&str>) -> PyResult<usize> {
        Ok(self.field(field_name(field, key)?)?.len())
    }

    #[pyo3(signature = (field, key=None))]
    #[pyo3(name = "_is_finalized")]
    fn is_finalized(&self, field: &str, key: Option<&str>) -> PyResult<bool> {
        Ok(self.field(field_name(field, key)?)?.finalized)
    }

    /// Stores a field's typed column compressed (`rows`: items per LZ4 block, at least 1)
    /// or, with `None`, uncompressed. Reads are unchanged either way.
    ///
    /// Raises:
    ///     ValueError: If the field holds no typed column (no space and no data yet, or
    ///         Python objects).
    ///     KeyError: For an unknown extra model output key.
    #[pyo3(signature = (field, rows, key=None))]
    #[pyo3(name = "_set_compression")]
    fn set_compression(&mut self, field: &str, rows: Option<usize>, key: Option<&str>) -> PyResult<()> {
        if let Storage::Typed { column, .. } = &mut self.field_mut(field_name(field, key)?)?.storage {
            column.set_compression(rows);
            return Ok(());
        }
        Err(PyValueError::new_err(format!(
            "_set_compression: the {field} field holds no typed column (give its space, or add data that fits one, first)"
        )))
    }

    /// Items per compressed block of a field, `None` if it is stored uncompressed.
    #[pyo3(signature = (field, key=None))]
    #[pyo3(name = "_compression")]
    fn compression(&self, field: &str, key: Option<&str>) -> PyResult<Option<usize>> {
        Ok(self.field(field_name(field, key)?)?.compression())
    }

    /// Bytes of a field's stored typed items (compressed blocks plus uncompressed items;
    /// 0 for fields of Python objects).
    #[pyo3(signature = (field, key=None))]
    #[pyo3(name = "_stored_bytes")]
    fn stored_bytes(&self, field: &str, key: Option<&str>) -> PyResult<usize> {
        Ok(match &self.field(field_name(field, key)?)?.storage {
            Storage::Typed { column, .. } => column.stored_bytes(),
            _ => 0,
        })
    }

    /// The keys of the extra model outputs, in the order they first appeared.
    #[pyo3(name = "_extra_keys")]
    fn extra_keys(&self) -> Vec<String> {
        self.core.extra_model_outputs.iter().map(|(k, _)| k.to_string()).collect()
    }

    /// Removes the item at `index` of a field (RLlib's `InfiniteLookbackBuffer.pop`): an
    /// index into all stored items, look-back included (negative: from the end). The
    /// look-back shrinks when the item was part of it.
    ///
    /// Raises:
    ///     IndexError: If there is no such item (nothing changes).
    ///     KeyError: For an unknown extra model output key.
    #[pyo3(name = "_pop", signature = (field, index=-1, key=None))]
    fn pop(&mut self, field: &str, index: i64, key: Option<&str>) -> PyResult<()> {
        let f = self.field_mut(field_name(field, key)?)?;
        let total = f.geometry().total;
        let pos = if index < 0 { i64::try_from(total).unwrap_or(i64::MAX) + index } else { index };
        match usize::try_from(pos) {
            Ok(pos) if pos < total => {
                f.remove(pos);
                Ok(())
            }
            _ => Err(pyo3::exceptions::PyIndexError::new_err(format!(
                "pop index {index} out of range for {total} stored items of the {field}"
            ))),
        }
    }

    /// Makes `data` (a list of items, or a batch: an array or a dict/tuple of arrays with
    /// the items on the first axis) the extra model output `key`, its first `lookback`
    /// items look-back: a new key goes last, an existing one is replaced in place. The
    /// layout is inferred from the data, as for a new episode's.
    ///
    /// Raises:
    ///     EpisodeStateError: If the items after the look-back are not one per step of
    ///         the episode. Nothing changes then, nor on any other error.
    #[pyo3(name = "_put_extra")]
    fn put_extra(
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
            return Err(super::errors::EpisodeStateError::new_err(format!(
                "extra_model_outputs[{key:?}]: {} items after a look-back of {}, but the \
                 episode has {steps} steps",
                field.len(),
                field.lookback()
            )));
        }
        *self.core.extra_or_insert(key) = field;
        Ok(())
    }

    /// Removes the extra model output `key`.
    ///
    /// Raises:
    ///     KeyError: If there is none.
    #[pyo3(name = "_del_extra")]
    fn del_extra(&mut self, key: &str) -> PyResult<()> {
        let Some(i) = self.core.extra_model_outputs.iter().position(|(k, _)| &**k == key) else {
            return Err(PyKeyError::new_err(key.to_string()));
        };
        self.core.extra_model_outputs.remove(i);
        Ok(())
    }

    /// Whether the rewards have RLlib's float32 reward space (its fills are float32):
    /// every episode's but a slice's, as in RLlib.
    #[pyo3(name = "_rewards_have_space")]
    fn rewards_have_space(&self) -> bool {
        self.core.rewards_fill_f32
    }

    #[getter]
    fn t(&self) -> i64 {
        self.core.t
    }
    #[setter]
    fn set_t(&mut self, t: i64) {
        self.core.t = t;
    }
    #[getter]
    fn t_started(&self) -> i64 {
        self.core.t_started
    }
    #[setter]
    fn set_t_started(&mut self, t: i64) {
        self.core.t_started = t;
    }
    #[getter]
    fn is_terminated(&self) -> bool {
        self.core.is_terminated
    }
    #[setter]
    fn set_is_terminated(&mut self, v: bool) {
        self.core.is_terminated = v;
    }
    #[getter]
    fn is_truncated(&self) -> bool {
        self.core.is_truncated
    }
    #[setter]
    fn set_is_truncated(&mut self, v: bool) {
        self.core.is_truncated = v;
    }

    /// RLlib's length checks; raises `EpisodeStateError` naming the mismatch.
    fn validate(&self) -> PyResult<()> {
        self.core.validate().map_err(|e| episode_error(&e))
    }

    /// Switches reads to batched numpy arrays (RLlib's `to_numpy`): observations always;
    /// actions, rewards and extra model outputs once the chunk has a step; infos never.
    /// Returns the episode.
    ///
    /// Raises `EpisodeStateError` if the lengths do not fit, `ValueError` if the episode
    /// holds no observation at all.
    #[allow(clippy::wrong_self_convention)] // RLlib's method name
    fn to_numpy(mut slf: PyRefMut<'_, Self>) -> PyResult<PyRefMut<'_, Self>> {
        if slf.core.observations.geometry().total == 0 {
            return Err(PyValueError::new_err(
                "to_numpy: the episode holds no observations (call add_env_reset first)",
            ));
        }
        slf.core.to_numpy().map_err(|e| episode_error(&e))?;
        Ok(slf)
    }

    /// The seed-era name of `to_numpy`.
    fn finalize(slf: PyRefMut<'_, Self>) -> PyResult<PyRefMut<'_, Self>> {
        Self::to_numpy(slf)
    }

    /// The sum of the chunk's rewards (look-back not counted).
    fn get_return(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        if let Some(r) = self.core.typed_return() {
            return Ok(r.into_pyobject(py)?.into_any().unbind());
        }
        let rewards = self.get(py, "rewards", None, None, false, None, false)?;
        Ok(py.import("builtins")?.getattr("sum")?.call1((rewards,))?.unbind())
    }

    /// Makes `target`, a fresh episode object, a copy of this episode while nothing is
    /// recorded in it yet: the same layouts and specs (those of its spaces), without
    /// inferring them from the spaces again (the runners' new episodes, about a
    /// microsecond less each).
    ///
    /// Raises:
    ///     EpisodeStateError: If this episode was already reset.
    #[pyo3(name = "_blank_into")]
    fn blank_into(&self, target: &Bound<'_, SingleAgentEpisodePy>) -> PyResult<()> {
        if self.core.is_reset() {
            return Err(super::errors::EpisodeStateError::new_err(
                "_blank_into: the episode holds data; only a blank episode is copied this way",
            ));
        }
        Self::fill_target(target, self.core.clone())
    }

    /// Writes the successor chunk of `cut(len_lookback_buffer)` into `target`, a fresh
    /// episode object. With `keep_done`, a done episode is cut as if it were not, and
    /// the successor gets its flags (a multi-agent cut's agent that finished at the last
    /// env step).
    #[pyo3(name = "_cut_into", signature = (target, len_lookback_buffer, keep_done=false))]
    fn cut_into(
        &mut self,
        py: Python<'_>,
        target: &Bound<'_, SingleAgentEpisodePy>,
        len_lookback_buffer: usize,
        keep_done: bool,
    ) -> PyResult<()> {
        let as_live = keep_done || !self.core.is_done();
        // RLlib's successor holds the very info dicts of its look-back: make the absent
        // ones here first, so both episodes share them (a handful per cut).
        if as_live {
            let shared = self.core.cut_info_positions(len_lookback_buffer).map_err(|e| episode_error(&e))?;
            self.core.infos.materialize(&shared, || empty_info(py));
        }
        let mut core = if keep_done {
            self.core.cut_as_live(len_lookback_buffer)
        } else {
            self.core.cut(len_lookback_buffer)
        }
        .map_err(|e| episode_error(&e))?;
        if keep_done {
            core.is_terminated = self.core.is_terminated;
            core.is_truncated = self.core.is_truncated;
        }
        Self::fill_target(target, core)
    }

    /// Writes the steps `start:stop:step` (with look-back) into `target`, a fresh episode
    /// object.
    #[pyo3(name = "_slice_into", signature = (target, start, stop, step, len_lookback_buffer=None))]
    fn slice_into(
        &mut self,
        py: Python<'_>,
        target: &Bound<'_, SingleAgentEpisodePy>,
        start: Option<i64>,
        stop: Option<i64>,
        step: Option<i64>,
        len_lookback_buffer: Option<usize>,
    ) -> PyResult<()> {
        if step == Some(0) {
            return Err(PyValueError::new_err("slice step cannot be zero"));
        }
        // The slice holds the very info dicts of this episode, as in RLlib: make the
        // absent ones first so both share them. An error is left to `slice` to report.
        if let Ok(shared) = self.core.slice_info_positions(start, stop, step, len_lookback_buffer) {
            self.core.infos.materialize(&shared, || empty_info(py));
        }
        let core = self.core.slice(start, stop, step, len_lookback_buffer).map_err(|e| episode_error(&e))?;
        Self::fill_target(target, core)
    }

    /// Appends `other`'s chunk (see `SingleAgentEpisode.concat_episode`).
    #[pyo3(name = "_concat")]
    fn concat(&mut self, py: Python<'_>, other: &Bound<'_, SingleAgentEpisodePy>) -> PyResult<()> {
        let mut other = other.try_borrow_mut()?;
        // This episode goes on with the other chunk's info dicts themselves, as in RLlib:
        // make its absent ones first so both share them.
        let g = other.core.infos.geometry();
        let chunk: Vec<usize> = (g.lookback..g.total).collect();
        other.core.infos.materialize(&chunk, || empty_info(py));
        self.core.concat(&other.core, |t| to_object(py, t)).map_err(|e| episode_error(&e))
    }

    /// Reads observations with RLlib's index semantics (see `SingleAgentEpisode`).
    #[pyo3(signature = (indices=None, *, neg_index_as_lookback=false, fill=None, one_hot_discrete=false))]
    fn get_observations<'py>(
        &self,
        py: Python<'py>,
        indices: Option<&Bound<'py, PyAny>>,
        neg_index_as_lookback: bool,
        fill: Option<&Bound<'py, PyAny>>,
        one_hot_discrete: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.get(py, "observations", None, indices, neg_index_as_lookback, fill, one_hot_discrete)
    }

    /// Reads infos with RLlib's index semantics.
    #[pyo3(signature = (indices=None, *, neg_index_as_lookback=false, fill=None))]
    fn get_infos<'py>(
        &mut self,
        py: Python<'py>,
        indices: Option<&Bound<'py, PyAny>>,
        neg_index_as_lookback: bool,
        fill: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.get_py(py, "infos", None, indices, neg_index_as_lookback, fill, false)
    }

    /// Reads actions with RLlib's index semantics.
    #[pyo3(signature = (indices=None, *, neg_index_as_lookback=false, fill=None, one_hot_discrete=false))]
    fn get_actions<'py>(
        &self,
        py: Python<'py>,
        indices: Option<&Bound<'py, PyAny>>,
        neg_index_as_lookback: bool,
        fill: Option<&Bound<'py, PyAny>>,
        one_hot_discrete: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.get(py, "actions", None, indices, neg_index_as_lookback, fill, one_hot_discrete)
    }

    /// Reads rewards with RLlib's index semantics.
    #[pyo3(signature = (indices=None, *, neg_index_as_lookback=false, fill=None))]
    fn get_rewards<'py>(
        &self,
        py: Python<'py>,
        indices: Option<&Bound<'py, PyAny>>,
        neg_index_as_lookback: bool,
        fill: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.get(py, "rewards", None, indices, neg_index_as_lookback, fill, false)
    }

    /// Reads one extra model output with RLlib's index semantics; `KeyError` for an
    /// unknown key.
    #[pyo3(signature = (key, indices=None, *, neg_index_as_lookback=false, fill=None))]
    fn get_extra_model_outputs<'py>(
        &self,
        py: Python<'py>,
        key: &str,
        indices: Option<&Bound<'py, PyAny>>,
        neg_index_as_lookback: bool,
        fill: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.get(py, "extra_model_outputs", Some(key), indices, neg_index_as_lookback, fill, false)
    }

    /// Overwrites observations in place (RLlib's `set_observations`).
    #[pyo3(signature = (*, new_data, at_indices=None, neg_index_as_lookback=false))]
    fn set_observations(
        &mut self,
        new_data: &Bound<'_, PyAny>,
        at_indices: Option<&Bound<'_, PyAny>>,
        neg_index_as_lookback: bool,
    ) -> PyResult<()> {
        self.set("observations", new_data, None, at_indices, neg_index_as_lookback)
    }

    /// Overwrites actions in place.
    #[pyo3(signature = (*, new_data, at_indices=None, neg_index_as_lookback=false))]
    fn set_actions(
        &mut self,
        new_data: &Bound<'_, PyAny>,
        at_indices: Option<&Bound<'_, PyAny>>,
        neg_index_as_lookback: bool,
    ) -> PyResult<()> {
        self.set("actions", new_data, None, at_indices, neg_index_as_lookback)
    }

    /// Overwrites rewards in place.
    #[pyo3(signature = (*, new_data, at_indices=None, neg_index_as_lookback=false))]
    fn set_rewards(
        &mut self,
        new_data: &Bound<'_, PyAny>,
        at_indices: Option<&Bound<'_, PyAny>>,
        neg_index_as_lookback: bool,
    ) -> PyResult<()> {
        self.set("rewards", new_data, None, at_indices, neg_index_as_lookback)
    }

    /// Overwrites one extra model output in place; `EpisodeStateError` (an
    /// `AssertionError`, as in RLlib) for an unknown key.
    #[pyo3(signature = (*, key, new_data, at_indices=None, neg_index_as_lookback=false))]
    fn set_extra_model_outputs(
        &mut self,
        key: &str,
        new_data: &Bound<'_, PyAny>,
        at_indices: Option<&Bound<'_, PyAny>>,
        neg_index_as_lookback: bool,
    ) -> PyResult<()> {
        if self.core.extra(key).is_none() {
            // RLlib asserts the key exists before setting (reads raise KeyError instead).
            return Err(super::errors::EpisodeStateError::new_err(format!(
                "set_extra_model_outputs: there is no extra model output {key:?} to set"
            )));
        }
        self.set("extra_model_outputs", new_data, Some(key), at_indices, neg_index_as_lookback)
    }

    /// Whether the episode is terminated or truncated.
    #[getter]
    fn is_done(&self) -> bool {
        self.core.is_done()
    }

    /// Whether the chunk holds at least one observation.
    #[getter]
    pub fn is_reset(&self) -> bool {
        self.core.is_reset()
    }

    /// Whether reads return batched numpy arrays (after `to_numpy`).
    #[getter]
    fn is_numpy(&self) -> bool {
        self.core.rewards.finalized
    }

    /// Env steps in the chunk.
    fn env_steps(&self) -> usize {
        self.core.len()
    }

    /// Agent steps in the chunk (equal to env steps for one agent).
    fn agent_steps(&self) -> usize {
        self.core.len()
    }

    fn __len__(&self) -> usize {
        self.core.len()
    }

    /// Seconds between the reset (or first step) and the last step; 0.0 before a step.
    fn get_duration_s(&self) -> f64 {
        match (self.start_time, self.last_step_time) {
            (Some(start), Some(last)) => last - start,
            _ => 0.0,
        }
    }

    #[getter(_start_time)]
    fn start_time(&self) -> Option<f64> {
        self.start_time
    }
    #[setter(_start_time)]
    fn set_start_time(&mut self, v: Option<f64>) {
        self.start_time = v;
    }
    #[getter(_last_step_time)]
    fn last_step_time(&self) -> Option<f64> {
        self.last_step_time
    }
    #[setter(_last_step_time)]
    fn set_last_step_time(&mut self, v: Option<f64>) {
        self.last_step_time = v;
    }

    /// Reads a field with RLlib's index semantics.
    // One match over storage kind x index form x finalized; splitting it would scatter
    // the RLlib rules it mirrors.
    #[allow(clippy::too_many_lines)]
    #[pyo3(signature = (field, key=None, indices=None, neg_index_as_lookback=false, fill=None, one_hot_discrete=false))]
    #[allow(clippy::too_many_arguments)]
    #[pyo3(name = "_get")]
    fn get_py<'py>(
        &mut self,
        py: Python<'py>,
        field: &str,
        key: Option<&str>,
        indices: Option<&Bound<'py, PyAny>>,
        neg_index_as_lookback: bool,
        fill: Option<&Bound<'py, PyAny>>,
        one_hot_discrete: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let name = field_name(field, key)?;
        let fill = fill.filter(|f| !f.is_none());
        let args = read_args(indices, neg_index_as_lookback, fill, one_hot_discrete)?;
        let plan = self.plan_read(name, self.field(name)?, &args)?;
        if name == FieldName::Infos {
            self.core.infos.materialize(&plan.stored_positions(), || empty_info(py));
        }
        Self::execute(py, self.field(name)?, &plan, fill)
    }

    /// `_get` on a view of the field with the last stored item left out
    /// (`ignore_last`), and/or with `add_last` appended as one more item: what RLlib's
    /// `_ignore_last_ts` / `_add_last_ts_value` do for the multi-agent episode, whose
    /// hanging actions and rewards belong after an agent's stored data. A missing extra
    /// model output key reads as an empty field.
    #[pyo3(signature = (field, key=None, indices=None, neg_index_as_lookback=false, fill=None, one_hot_discrete=false, add_last=None, ignore_last=false))]
    #[allow(clippy::too_many_arguments)]
    #[pyo3(name = "_get_ext")]
    fn get_ext<'py>(
        &mut self,
        py: Python<'py>,
        field: &str,
        key: Option<&str>,
        indices: Option<&Bound<'py, PyAny>>,
        neg_index_as_lookback: bool,
        fill: Option<&Bound<'py, PyAny>>,
        one_hot_discrete: bool,
        add_last: Option<&Bound<'py, PyAny>>,
        ignore_last: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let name = field_name(field, key)?;
        let add_last = add_last.filter(|v| !v.is_none());
        let fill = fill.filter(|f| !f.is_none());
        let args = read_args(indices, neg_index_as_lookback, fill, one_hot_discrete)?;
        if add_last.is_none() && !ignore_last {
            let untyped = Field::untyped();
            let stored = match name {
                FieldName::Extra(k) => self.core.extra(k).unwrap_or(&untyped),
                _ => self.field(name)?,
            };
            let plan = self.plan_read(name, stored, &args)?;
            if name == FieldName::Infos {
                self.core.infos.materialize(&plan.stored_positions(), || empty_info(py));
                return Self::execute(py, &self.core.infos, &plan, fill);
            }
            return Self::execute(py, stored, &plan, fill);
        }
        let mut view = self.view(py, name, add_last, ignore_last)?;
        let plan = self.plan_read(name, &view, &args)?;
        if name == FieldName::Infos {
            // The view's absent infos that the read returns are made in this episode
            // (positions past its items are skipped), then seen through a new view.
            self.core.infos.materialize(&plan.stored_positions(), || empty_info(py));
            view = self.view(py, name, add_last, ignore_last)?;
        }
        Self::execute(py, &view, &plan, fill)
    }

    /// Overwrites items of a field with RLlib's index semantics (`None` = the whole chunk).
    #[allow(clippy::too_many_lines)] // index form x storage kind, as in `get`
    #[pyo3(signature = (field, new_data, key=None, at_indices=None, neg_index_as_lookback=false))]
    #[pyo3(name = "_set")]
    fn set(
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

/// The `KeyError` for a field the episode lacks (only extra model outputs can be missing).
fn missing_key(name: FieldName<'_>) -> PyErr {
    match name {
        FieldName::Extra(k) => PyKeyError::new_err(k.to_string()),
        _ => PyKeyError::new_err(label(name)),
    }
}

/// The bytes a set writes into a typed field laid out by `spec`: one buffer per leaf with
/// `selected` items, from `values` (one Python value per position) or, where the caller
/// did not split them, from `new_data` as a batch.
fn typed_set_leaves(
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
fn object_values<'py>(
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

/// A read's arguments from Python (`fill`: `None` taken out already).
fn read_args(
    indices: Option<&Bound<'_, PyAny>>,
    neg_index_as_lookback: bool,
    fill: Option<&Bound<'_, PyAny>>,
    one_hot: bool,
) -> PyResult<ReadArgs> {
    Ok(ReadArgs { index: to_index(indices)?, neg_index_as_lookback, fill: fill.is_some(), one_hot })
}

fn read_error(e: &ReadError) -> PyErr {
    match e {
        ReadError::Index(i) => index_error(i),
        _ => PyValueError::new_err(e.to_string()),
    }
}

impl SingleAgentEpisodePy {
    /// RLlib's plan for a read of `f` (a field of this episode, or a view of one).
    fn plan_read(&self, name: FieldName<'_>, f: &PyField, args: &ReadArgs) -> PyResult<ReadPlan> {
        read::plan(f, name, self.core.rewards_fill_f32, args).map_err(|e| read_error(&e))
    }

    /// Field `name` seen with its last stored item left out (`ignore_last`) and/or with
    /// `add_last` appended (a missing extra model output key: an empty field).
    fn view(
        &self,
        py: Python<'_>,
        name: FieldName<'_>,
        add_last: Option<&Bound<'_, PyAny>>,
        ignore_last: bool,
    ) -> PyResult<PyField> {
        let mut view = match name {
            FieldName::Extra(k) => self.core.extra(k).cloned().unwrap_or_default(),
            _ => self.field(name)?.clone(),
        };
        if ignore_last {
            let total = view.geometry().total;
            if total > 0 {
                view.remove(total - 1);
            }
        }
        if let Some(value) = add_last {
            let (item, inferred) = prepare(value, &view, name)?;
            if !view.push(item, |t| to_object(py, t)) {
                return Err(super::errors::SpaceMismatchError::new_err(format!(
                    "{} does not fit its column",
                    label(name)
                )));
            }
            if inferred.is_some() {
                view.spec = inferred;
            }
        }
        Ok(view)
    }

    /// Reads a field of this episode with RLlib's index semantics (absent infos must have
    /// been made first: see `_get`).
    #[allow(clippy::too_many_arguments)]
    fn get<'py>(
        &self,
        py: Python<'py>,
        field: &str,
        key: Option<&str>,
        indices: Option<&Bound<'py, PyAny>>,
        neg_index_as_lookback: bool,
        fill: Option<&Bound<'py, PyAny>>,
        one_hot_discrete: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let name = field_name(field, key)?;
        let fill = fill.filter(|f| !f.is_none());
        let f = self.field(name)?;
        let plan =
            self.plan_read(name, f, &read_args(indices, neg_index_as_lookback, fill, one_hot_discrete)?)?;
        Self::execute(py, f, &plan, fill)
    }

    /// Carries out `plan` on `f`: its items (and `fill`) as Python values.
    fn execute<'py>(
        py: Python<'py>,
        f: &PyField,
        plan: &ReadPlan,
        fill: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let rewards_f32 = (plan.fill_spec == FillSpec::RewardsF32).then(|| spec::f32_scalar(py));
        let fill_spec = match plan.fill_spec {
            FillSpec::Own => f.spec(),
            FillSpec::RewardsF32 => rewards_f32.as_deref(),
            FillSpec::Raw => None,
        };
        let fill_value = || fill.ok_or_else(|| PyValueError::new_err("internal error: fill"));
        let fill_item = || -> PyResult<Bound<'py, PyAny>> {
            match fill_spec {
                Some(s) => spec::fill_item(py, s, fill_value()?, plan.one_hot),
                None => Ok(fill_value()?.clone()),
            }
        };
        if let Storage::Typed { column, .. } = &f.storage {
            let spec =
                f.spec().ok_or_else(|| PyValueError::new_err("internal error: typed field without spec"))?;
            let item = |p: &Pos| match p {
                Pos::At(p) => spec::item(py, spec, column, *p, plan.host_scalars, plan.one_hot),
                Pos::Fill => fill_item(),
            };
            return match (&plan.positions, &plan.form) {
                (Resolved::One(p), _) => item(p),
                (Resolved::Many(positions), Form::Batch(rule)) => {
                    batch(py, spec, column, positions, plan.one_hot, rule, fill, fill_spec)
                }
                (Resolved::Many(positions), _) => {
                    Ok(PyList::new(py, positions.iter().map(item).collect::<PyResult<Vec<_>>>()?)?.into_any())
                }
            };
        }
        let object_at = |p: &Pos| -> PyResult<Bound<'py, PyAny>> {
            match (p, &f.storage) {
                (Pos::At(p), Storage::Objects { items, .. }) => Ok(items[*p].0.bind(py).clone()),
                (Pos::At(p), Storage::Sparse { .. }) => match f.object(*p) {
                    Some(o) => Ok(o.0.bind(py).clone()),
                    // Reads of this episode's infos made them first; a view's absent
                    // item is a fresh empty dict, as RLlib's would be.
                    None => Ok(empty_info(py).0.into_bound(py)),
                },
                (Pos::Fill, _) => fill_item(),
                _ => Err(PyValueError::new_err("internal error: position in an empty field")),
            }
        };
        let positions = match &plan.positions {
            Resolved::One(p) => return object_at(p),
            Resolved::Many(positions) => positions,
        };
        match plan.form {
            Form::EmptyList => Ok(PyList::empty(py).into_any()),
            Form::ObjectArray => {
                let items = positions.iter().map(object_at).collect::<PyResult<Vec<_>>>()?;
                spec::numpy(py)?.getattr("array")?.call1((items,))
            }
            _ => {
                Ok(PyList::new(py, positions.iter().map(object_at).collect::<PyResult<Vec<_>>>()?)?
                    .into_any())
            }
        }
    }
}

/// A batch of typed items with fill rows as `rule` says (see [`read::BatchFill`]).
#[allow(clippy::too_many_arguments)]
fn batch<'py>(
    py: Python<'py>,
    spec: &Spec,
    column: &Column,
    positions: &[Pos],
    one_hot: bool,
    rule: &BatchFill,
    fill: Option<&Bound<'py, PyAny>>,
    fill_spec: Option<&Spec>,
) -> PyResult<Bound<'py, PyAny>> {
    let fill = || fill.ok_or_else(|| PyValueError::new_err("internal error: fill"));
    match rule {
        BatchFill::None => spec::batch(py, spec, column, positions, None, one_hot),
        BatchFill::Cast => {
            let bytes = spec::fill_leaves(py, spec, fill()?, one_hot)?;
            spec::batch(py, spec, column, positions, Some(&bytes), one_hot)
        }
        BatchFill::FillOnly => {
            let fills = PyList::new(py, std::iter::repeat_n(fill()?, positions.len()))?;
            spec::numpy(py)?.getattr("array")?.call1((fills,))
        }
        BatchFill::Promote { dtypes, rows } => {
            let np = spec::numpy(py)?;
            let fill = fill()?;
            let mut leaves = Vec::with_capacity(spec.schema.leaves.len());
            for (i, leaf) in spec.schema.leaves.iter().enumerate() {
                let mut shape = vec![positions.len()];
                shape.extend_from_slice(&leaf.shape);
                let descr = spec.descrs[i].bind(py);
                let mut array = spec::new_array_with(py, descr, &shape, |buf| {
                    column.gather_into(i, positions, None, false, buf)
                })?;
                let fill_dtype = match fill_spec.and_then(|s| s.descrs.get(i)) {
                    Some(d) => d.bind(py).clone().into_any(),
                    None => np.getattr("asarray")?.call1((fill,))?.getattr("dtype")?,
                };
                let out = match dtypes.get(i) {
                    Some(LeafDtype::Fill) => fill_dtype,
                    Some(LeafDtype::Stored) | None => descr.clone().into_any(),
                    Some(LeafDtype::Promoted) => np.getattr("result_type")?.call1((descr, fill_dtype))?,
                };
                if !out.eq(descr)? {
                    array = array.call_method1("astype", (out,))?;
                }
                array.set_item(PyList::new(py, rows)?, fill)?;
                leaves.push(Some(array));
            }
            spec::nest(py, &spec.tree, &mut leaves)
        }
    }
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

/// A runner's guess of how long its chunks get (see
/// [`SingleAgentEpisodePy::reserve_after_first_step`]).
#[derive(Clone, Copy, Debug)]
pub struct LengthGuess {
    /// The length of the episodes the runner saw end.
    pub expected_len: i64,
    /// The most steps a chunk can take before the runner cuts it (`usize::MAX`: no bound).
    pub steps_left: usize,
}

/// A step's extra model outputs for [`SingleAgentEpisodePy::prepare_row_step`]: a dict of
/// values, or the agent's row of its module's output arrays (the runner's scatter).
pub enum ExtraOutputs<'a, 'py> {
    Dict(&'a Bound<'py, PyDict>),
    Rows(&'a AgentOutputsPy),
}

/// Steps of several episodes (one env step's agents) as raw rows laid out like each
/// episode's typed columns (observation, action, reward, then its extras), for
/// [`SingleAgentEpisodePy::add_row_step`]: what [`SingleAgentEpisodePy::prepare_row_step`]
/// adds to.
///
/// All steps share the same lists of leaves and keys (the multi-agent record prepares
/// every agent's step before it stores any): lists per step cost a heap block each, and
/// moving a step with inline buffers through the record's plans cost as much, each about a
/// tenth of the record. The lists are inline up to eight agents' usual steps.
#[derive(Default)]
pub struct RowSteps<'py> {
    leaves: RowLeaves<'py>,
    keys: SmallVec<[Bound<'py, PyString>; 24]>,
    /// Per step, where its leaves and its extras' keys end.
    ends: SmallVec<[(usize, usize); 8]>,
}

/// [`RowSteps`]' leaves: room for eight steps of an observation, an action, a reward and
/// three one-leaf extras.
type RowLeaves<'py> = SmallVec<[LeafBytes<'py>; 48]>;

/// The most leaves and extra keys of one row step kept on the stack while it is stored.
const ROW_LEAVES: usize = 8;

impl RowSteps<'_> {
    /// Where the next step's leaves and keys start (for [`Self::finish`]).
    fn mark(&self) -> (usize, usize) {
        (self.leaves.len(), self.keys.len())
    }

    /// Ends the step begun at `mark`: kept (its index) where `added` is `Ok(true)`;
    /// otherwise what it added is taken back, so that the next step starts clean.
    fn finish(&mut self, mark: (usize, usize), added: PyResult<bool>) -> PyResult<Option<usize>> {
        if !matches!(added, Ok(true)) {
            self.leaves.truncate(mark.0);
            self.keys.truncate(mark.1);
            return added.map(|_| None);
        }
        self.ends.push(self.mark());
        Ok(Some(self.ends.len() - 1))
    }

    /// Where step `step`'s leaves and keys start.
    fn starts(&self, step: usize) -> (usize, usize) {
        step.checked_sub(1).map_or((0, 0), |p| self.ends[p])
    }

    /// Stores step `step` into `episode` (nothing is stored on error); `info` as
    /// [`info_or_absent`] gives it.
    pub fn apply(
        &self,
        step: usize,
        episode: &mut SingleAgentEpisodePy,
        info: Option<PyObj>,
        terminated: bool,
        truncated: bool,
        now: f64,
    ) -> PyResult<()> {
        let (l0, k0) = self.starts(step);
        let (l1, k1) = self.ends[step];
        let leaves: SmallVec<[&[u8]; ROW_LEAVES]> = self.leaves[l0..l1].iter().map(AsRef::as_ref).collect();
        let keys = self.keys[k0..k1]
            .iter()
            .map(|k| k.to_str())
            .collect::<PyResult<SmallVec<[&str; ROW_LEAVES]>>>()?;
        episode.add_row_step(&leaves, &keys, info, terminated, truncated, now)
    }
}

/// A reset observation, converted and checked against an episode, not yet stored.
pub struct PreparedReset<'py> {
    observation: Item<PyObj, LeafBytes<'py>>,
    spec: Option<Arc<Spec>>,
}

/// Which field an inferred spec belongs to (owned: it outlives the borrowed extra keys).
enum SpecSlot {
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
            return Err(super::errors::EpisodeStateError::new_err(format!(
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

    /// [`Self::prepare_step`] for the common step of an episode whose fields are all
    /// typed (every step after an agent's first): each value converted straight to the
    /// bytes of its column's layout, added to `steps` for [`RowSteps::apply`], without the
    /// per-field items of the general path. Returns the step's index in `steps`, or
    /// `None` (and `steps` as it was) wherever the general path does something else (a
    /// field or extra key without a typed column, a value that does not convert, a reward
    /// column that is not one f32/f64 scalar): the caller then takes that path, which also
    /// raises its errors.
    pub fn prepare_row_step<'py>(
        &self,
        steps: &mut RowSteps<'py>,
        observation: &Bound<'py, PyAny>,
        action: &Bound<'py, PyAny>,
        reward: f64,
        extra_model_outputs: Option<ExtraOutputs<'_, 'py>>,
    ) -> PyResult<Option<usize>> {
        let py = observation.py();
        let mark = steps.mark();
        // Ok(false): a value does not go in as a row; `finish` takes back what was added.
        let added = (|| -> PyResult<bool> {
            if self.core.is_done() || !self.core.is_reset() {
                return Ok(false);
            }
            let leaves = &mut steps.leaves;
            if !self.push_row_bytes(leaves, FieldName::Observations, observation)
                || !self.push_row_bytes(leaves, FieldName::Actions, action)
            {
                return Ok(false);
            }
            let Some(spec) = self.row_spec(FieldName::Rewards) else { return Ok(false) };
            match spec.schema.leaves.as_slice() {
                [leaf] if leaf.shape.is_empty() && leaf.dtype == DType::F64 => {
                    leaves.push(LeafBytes::scalar(&reward.to_ne_bytes()));
                }
                [leaf] if leaf.shape.is_empty() && leaf.dtype == DType::F32 => {
                    leaves.push(LeafBytes::scalar(&(reward as f32).to_ne_bytes()));
                }
                _ => return Ok(false),
            }
            let push_dict = |steps: &mut RowSteps<'py>, d: &Bound<'py, PyDict>| -> PyResult<bool> {
                for (k, v) in d.iter() {
                    let Ok(k) = k.cast_into::<PyString>() else { return Ok(false) };
                    if !self.push_row_bytes(&mut steps.leaves, FieldName::Extra(k.to_str()?), &v) {
                        return Ok(false);
                    }
                    steps.keys.push(k);
                }
                Ok(true)
            };
            match extra_model_outputs {
                None => Ok(true),
                Some(ExtraOutputs::Dict(d)) => push_dict(steps, d),
                Some(ExtraOutputs::Rows(r)) => {
                    for column in r.columns() {
                        let k = column.name.bind(py);
                        let Some(spec) = self.row_spec(FieldName::Extra(k.to_str()?)) else {
                            return Ok(false);
                        };
                        let Some(bytes) = r.row_bytes(py, column, spec) else { return Ok(false) };
                        steps.leaves.push(bytes);
                        steps.keys.push(k.clone());
                    }
                    r.constants(py).map_or(Ok(true), |c| push_dict(steps, c))
                }
            }
        })();
        steps.finish(mark, added)
    }

    /// Appends `value`'s bytes in the layout of `name`'s typed column; false (nothing
    /// appended) where the field has no such column or the value does not convert.
    fn push_row_bytes<'py>(
        &self,
        leaves: &mut RowLeaves<'py>,
        name: FieldName<'_>,
        value: &Bound<'py, PyAny>,
    ) -> bool {
        let Some(spec) = self.row_spec(name) else { return false };
        let Ok(views) = spec::to_leaf_views(spec, value, None, &|| label(name)) else { return false };
        match views {
            Leaves::One(view) => leaves.push(view),
            Leaves::Many(views) => leaves.extend(views),
        }
        true
    }

    /// The spec of `name` if the field stores typed items laid out by it, so that a row
    /// of a batch converted with this spec can be stored as it is ([`Input::Row`]).
    pub fn row_spec(&self, name: FieldName<'_>) -> Option<&Spec> {
        let field = self.core.field(name)?;
        match (&field.storage, field.spec()) {
            // The same schema object first: a column made from this spec shares it.
            (Storage::Typed { column, .. }, Some(spec))
                if std::ptr::eq(column.schema(), Arc::as_ptr(&spec.schema))
                    || column.schema().leaves == spec.schema.leaves =>
            {
                Some(spec)
            }
            _ => None,
        }
    }

    /// Whether the field `name` infers its spec from the next item stored (no items and
    /// no spec yet: [`prepare`]'s inference), which [`Input::FirstRow`] stands in for.
    pub fn infers_spec(&self, name: FieldName<'_>) -> bool {
        self.core.field(name).is_none_or(|f| matches!(f.storage, Storage::Untyped { .. }) && f.spec.is_none())
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
    fn stamp_step(&mut self, now: f64) {
        self.last_step_time = Some(now);
        self.start_time.get_or_insert(now);
    }

    /// Right after a chunk's first step (when every field has its column), reserves room
    /// in its typed columns for the steps left until the episode is `guess.expected_len`
    /// long, and no more than `guess.steps_left` (see
    /// [`crate::episode::SingleAgentCore::reserve_until`]); nothing otherwise.
    pub fn reserve_after_first_step(&mut self, guess: Option<LengthGuess>) {
        if let Some(g) = guess {
            if self.core.len() == 1 {
                self.core.reserve_until(g.expected_len, g.steps_left);
            }
        }
    }

    /// The last stored observation and infos (for an agent terminated right after acting).
    pub fn last_observation_and_infos<'py>(
        &mut self,
        py: Python<'py>,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
        let minus_one = (-1i64).into_pyobject(py)?.into_any();
        let obs = self.get(py, "observations", None, Some(&minus_one), false, None, false)?;
        let infos = self.get_py(py, "infos", None, Some(&minus_one), false, None, false)?;
        Ok((obs, infos))
    }

    /// Steps in the chunk.
    pub fn chunk_len(&self) -> usize {
        self.core.len()
    }

    pub fn done(&self) -> bool {
        self.core.is_done()
    }
}

/// The runners' fast path: a vector step whose fields all arrive as rows laid out like the
/// episode's columns (see `runner::FastStep`).
impl SingleAgentEpisodePy {
    /// Whether [`Self::add_row_step`] takes a step with these field layouts (observation,
    /// action, reward, then the extras `extra_keys`).
    pub fn fits_rows(&self, layouts: &[&crate::schema::Schema], extra_keys: &[&str]) -> bool {
        self.core.fits_rows(layouts, extra_keys)
    }

    /// Records one step from raw bytes, one slice per leaf of each field in
    /// [`Self::fits_rows`] order; `info` is [`info_or_absent`]'s (decided by the caller
    /// before any bytes are borrowed, since reading a value's truth may run Python code).
    /// Nothing is stored on error.
    pub fn add_row_step(
        &mut self,
        leaves: &[&[u8]],
        extra_keys: &[&str],
        info: Option<PyObj>,
        terminated: bool,
        truncated: bool,
        now: f64,
    ) -> PyResult<()> {
        self.core
            .add_row_step(leaves, extra_keys, info, terminated, truncated)
            .map_err(|e| episode_error(&e))?;
        self.stamp_step(now);
        Ok(())
    }
}
