//! `SingleAgentEpisodePy`: the native storage behind `fastrollout.SingleAgentEpisode`.
//!
//! The Python class keeps identity and metadata (ids, spaces, custom data, timing); this
//! object holds the fields and does every per-step and per-read operation in one call.
//! The rules are the core's (`crate::episode`: the episode's bookkeeping, its fields and
//! their specs, the read plan); here Python values are converted in and out: this file
//! holds the class and its simple methods, `reads` the reads, `writes` the conversions of
//! values into fields, `rows` the runners' row-step path.

mod reads;
mod rows;
mod writes;

pub use rows::{ExtraOutputs, LengthGuess, RowSteps};
pub use writes::{Input, PreparedReset, PreparedStep};

use pyo3::exceptions::{PyIndexError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};

use super::object::PyObj;
use super::spec::{self, Spec};
use crate::column::Geometry;
use crate::episode::packed;
pub use crate::episode::perf_counter;
use crate::episode::read::{self, WriteValues};
use crate::episode::{EpisodeError, Field, FieldName, SingleAgentCore, SplitBatch, StepTimes, TypedItem};
use crate::py::errors::{column_error, episode_error, index_error};
use crate::py::index::to_index;
use writes::{convert, split_rows, typed_set_leaves};

/// The core episode with Python objects and numpy specs.
type Core = SingleAgentCore<PyObj, Spec>;
/// A field of [`Core`].
type PyField = Field<PyObj, Spec>;

fn field_name<'a>(field: &str, key: Option<&'a str>) -> PyResult<FieldName<'a>> {
    FieldName::parse(field, key)
        .ok_or_else(|| PyValueError::new_err(format!("unknown episode field {field:?} (key {key:?})")))
}

/// The core's items as Python objects, for fields that turn into object storage: as they
/// read before (items given as Python scalars stay Python scalars, as in RLlib's lists).
fn to_object(py: Python<'_>, item: TypedItem<'_, Spec>) -> PyObj {
    let value =
        item.spec.and_then(|s| spec::item(py, s, item.column, item.pos, item.host_scalar, false).ok());
    PyObj(value.map_or_else(|| py.None(), Bound::unbind))
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

/// Native buffers of one single-agent episode (observations, actions, rewards, infos,
/// extra model outputs) with RLlib's look-back semantics.
///
/// `fastrollout.SingleAgentEpisode` subclasses it: the per-step and per-read methods with
/// RLlib's names are native, so a call goes straight from Python into Rust; the Python
/// class adds identity, spaces, custom data and state handling.
#[pyclass(name = "SingleAgentEpisodeCore", module = "fastrollout._core", subclass)]
pub struct SingleAgentEpisodePy {
    core: Core,
    /// `time.perf_counter()` values of the start and the last step (`_start_time`,
    /// `_last_step_time`).
    times: StepTimes,
}

impl SingleAgentEpisodePy {
    /// An episode core holding nothing (what `__new__` makes).
    fn blank() -> Self {
        SingleAgentEpisodePy { core: Core::default(), times: StepTimes::default() }
    }

    /// The field `name`; `KeyError` for an extra model output key the episode lacks.
    fn field(&self, name: FieldName<'_>) -> PyResult<&PyField> {
        Ok(self.core.require(name)?)
    }

    fn field_mut(&mut self, name: FieldName<'_>) -> PyResult<&mut PyField> {
        Ok(self.core.require_mut(name)?)
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
        t.times = StepTimes::default();
        Ok(())
    }

    /// The fields' sizes, `t` and done flags (what a multi-agent cut's plan reads).
    pub fn sizes(&self) -> crate::episode::EpisodeSizes {
        self.core.sizes()
    }

    /// Whether any field was turned to numpy (a multi-agent cut's rebuild turns them back
    /// into lists).
    pub fn any_finalized(&self) -> bool {
        self.core.rewards.finalized || self.core.observations.finalized
    }

    /// The extra model output keys, in the order they first appeared.
    pub fn extra_key_names(&self) -> impl Iterator<Item = &str> {
        self.core.extra_model_outputs.iter().map(|(k, _)| &**k)
    }

    /// Writes into `target`, a fresh episode object, the rows of this episode that a
    /// multi-agent cut keeps of it ([`crate::episode::SingleAgentCore::select_rows`]).
    pub fn select_rows_into(
        &self,
        target: &Bound<'_, SingleAgentEpisodePy>,
        cut: &crate::episode::multi::AgentCut,
    ) -> PyResult<()> {
        let mut core = self.core.select_rows(
            &cut.observations,
            &cut.actions,
            cut.extras,
            cut.infos,
            cut.lookback,
            cut.t_started,
        );
        (core.is_terminated, core.is_truncated) = (cut.terminated, cut.truncated);
        Self::fill_target(target, core)
    }

    /// Item `index` (with `neg_index_as_lookback`) of field `field` (`key`), with
    /// `add_last` appended to the field first: what `_get_ext` reads (the hanging values
    /// of a multi-agent cut or slice).
    pub fn read_item<'py>(
        &mut self,
        py: Python<'py>,
        field: &str,
        key: Option<&str>,
        index: i64,
        add_last: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let index = index.into_pyobject(py)?.into_any();
        self.get_ext(py, field, key, Some(&index), true, None, false, add_last, false)
    }

    /// A field's look-back and chunk length; `KeyError` for an extra model output key the
    /// episode lacks.
    pub fn field_geometry(&self, field: &str, key: Option<&str>) -> PyResult<Geometry> {
        Ok(self.field(field_name(field, key)?)?.geometry())
    }

    /// Steps in the chunk.
    pub fn chunk_len(&self) -> usize {
        self.core.len()
    }

    pub fn done(&self) -> bool {
        self.core.is_done()
    }

    /// `to_numpy` (a multi-agent episode's, for each of its agents).
    pub fn finalize_core(&mut self) -> PyResult<()> {
        self.core.to_numpy()?;
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
        self.field(name)?;
        self.core.set_space(name, new.map(|s| (s.schema(), s)));
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
        Ok(self.core.set_field_compression(field_name(field, key)?, rows)?)
    }

    /// A compressed field's items as they are stored, for pickling and copies: a dict of
    /// the compressed blocks and the uncompressed rest (see `_set_packed_state`); `None`
    /// where the field is not a compressed typed column of its space's layout.
    #[pyo3(signature = (field, key=None))]
    #[pyo3(name = "_packed_state")]
    fn packed_state<'py>(
        &self,
        py: Python<'py>,
        field: &str,
        key: Option<&str>,
    ) -> PyResult<Option<Bound<'py, PyDict>>> {
        let Some(p) = self.field(field_name(field, key)?)?.packed_parts() else { return Ok(None) };
        let bytes = |b: &Vec<u8>| PyBytes::new(py, b);
        let state = PyDict::new(py);
        for (name, entry) in packed::entries(&p) {
            match entry {
                packed::Entry::Count(n) => state.set_item(name, n)?,
                packed::Entry::Flag(b) => state.set_item(name, b)?,
                packed::Entry::Blocks(leaves) => {
                    let blocks: Vec<Vec<Bound<'py, PyBytes>>> =
                        leaves.iter().map(|l| l.iter().map(bytes).collect()).collect();
                    state.set_item(name, blocks)?;
                }
                packed::Entry::Raw(leaves) => {
                    state.set_item(name, leaves.iter().map(bytes).collect::<Vec<_>>())?;
                }
            }
        }
        Ok(Some(state))
    }

    /// Replaces a field's items by `_packed_state`'s dict of a field of the same space,
    /// and sets its finalized flag.
    ///
    /// Raises:
    ///     ValueError: If the field holds no typed column or the parts do not fit together.
    ///     SpaceMismatchError: If they are of another layout.
    ///     KeyError: If the dict lacks an entry.
    #[pyo3(signature = (field, state, finalized, key=None))]
    #[pyo3(name = "_set_packed_state")]
    fn set_packed_state(
        &mut self,
        field: &str,
        state: &Bound<'_, PyDict>,
        finalized: bool,
        key: Option<&str>,
    ) -> PyResult<()> {
        let parts = packed::from_state(&PackedDict(state))?;
        let f = self.field_mut(field_name(field, key)?)?;
        f.set_packed_parts(parts).map_err(|e| column_error(&e))?;
        f.finalized = finalized;
        Ok(())
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
        Ok(self.field(field_name(field, key)?)?.stored_bytes())
    }

    /// Compresses every item of the compressed fields, none kept raw for appends: for a
    /// chunk that receives no more steps (runners call it on the chunks they hand out; a
    /// done episode does it itself). Reads are unchanged; a later step still works.
    #[pyo3(name = "_seal")]
    fn seal(&mut self) {
        self.core.seal();
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
        self.core.pop(field_name(field, key)?, index)?;
        Ok(())
    }

    /// Removes the extra model output `key`.
    ///
    /// Raises:
    ///     KeyError: If there is none.
    #[pyo3(name = "_del_extra")]
    fn del_extra(&mut self, key: &str) -> PyResult<()> {
        if self.core.remove_extra(key) {
            Ok(())
        } else {
            Err(EpisodeError::MissingKey(key.to_string()).into())
        }
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
    pub(crate) fn t_started(&self) -> i64 {
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
        slf.core.to_numpy()?;
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
        let rewards = self.get(py, FieldName::Rewards, None, false, None, false)?;
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
    pub(crate) fn blank_into(&self, target: &Bound<'_, SingleAgentEpisodePy>) -> PyResult<()> {
        Self::fill_target(target, self.core.blank_copy()?)
    }

    /// Writes the successor chunk of `cut(len_lookback_buffer)` into `target`, a fresh
    /// episode object. With `keep_done`, a done episode is cut as if it were not, and
    /// the successor gets its flags (a multi-agent cut's agent that finished at the last
    /// env step).
    #[pyo3(name = "_cut_into", signature = (target, len_lookback_buffer, keep_done=false))]
    pub(crate) fn cut_into(
        &mut self,
        py: Python<'_>,
        target: &Bound<'_, SingleAgentEpisodePy>,
        len_lookback_buffer: usize,
        keep_done: bool,
    ) -> PyResult<()> {
        let core = self.core.cut_sharing_infos(len_lookback_buffer, keep_done, || empty_info(py));
        let core = core.map_err(|e| episode_error(&e))?;
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
        let core = self.core.slice_sharing_infos(start, stop, step, len_lookback_buffer, || empty_info(py));
        let core = core.map_err(|e| episode_error(&e))?;
        Self::fill_target(target, core)
    }

    /// Raises `EpisodeStateError` if `other` cannot be appended (the core's checks of
    /// `concat_episode`: not done, `t` continues, both valid, extra outputs line up).
    #[pyo3(name = "_check_concat")]
    fn check_concat(&self, other: &Bound<'_, SingleAgentEpisodePy>) -> PyResult<()> {
        self.core.check_concat(&other.try_borrow()?.core).map_err(|e| episode_error(&e))
    }

    /// Appends `other`'s chunk (see `SingleAgentEpisode.concat_episode`).
    #[pyo3(name = "_concat")]
    fn concat(&mut self, py: Python<'_>, other: &Bound<'_, SingleAgentEpisodePy>) -> PyResult<()> {
        let mut other = other.try_borrow_mut()?;
        other.core.share_chunk_infos(|| empty_info(py));
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
        self.get(py, FieldName::Observations, indices, neg_index_as_lookback, fill, one_hot_discrete)
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
        self.read(py, FieldName::Infos, indices, neg_index_as_lookback, fill, false, None)
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
        self.get(py, FieldName::Actions, indices, neg_index_as_lookback, fill, one_hot_discrete)
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
        self.get(py, FieldName::Rewards, indices, neg_index_as_lookback, fill, false)
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
        self.get(py, FieldName::Extra(key), indices, neg_index_as_lookback, fill, false)
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
        self.core.check_set_extra(key)?;
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
        self.times.duration_s()
    }

    #[getter(_start_time)]
    fn start_time(&self) -> Option<f64> {
        self.times.start
    }

    #[setter(_start_time)]
    fn set_start_time(&mut self, value: Option<f64>) {
        self.times.start = value;
    }

    #[getter(_last_step_time)]
    fn last_step_time(&self) -> Option<f64> {
        self.times.last_step
    }

    #[setter(_last_step_time)]
    fn set_last_step_time(&mut self, value: Option<f64>) {
        self.times.last_step = value;
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
        extend_core(&mut self.core, py, field_name(field, key)?, data)
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
        // Converted in a scratch episode, as `_extend` converts.
        let mut scratch = Core::default();
        extend_core(&mut scratch, py, FieldName::Extra(key), data)?;
        let field = std::mem::take(scratch.extra_or_insert(key));
        Ok(self.core.put_extra(key, field, lookback)?)
    }

    /// Reads a field with RLlib's index semantics.
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
        self.read(py, field_name(field, key)?, indices, neg_index_as_lookback, fill, one_hot_discrete, None)
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
        let ext = Some((add_last, ignore_last));
        self.read(py, name, indices, neg_index_as_lookback, fill, one_hot_discrete, ext)
    }

    /// Overwrites items of a field with RLlib's index semantics (`None` = the whole chunk).
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
        // The new items, one Python value each (or one batch), and how many the data holds
        // where it says.
        let (values, given): (Option<Vec<Bound<'_, PyAny>>>, Option<usize>) = match plan.values {
            WriteValues::One => (Some(vec![new_data.clone()]), None),
            WriteValues::PerItem => {
                let vals = (0..positions.len()).map(|i| new_data.get_item(i)).collect::<PyResult<Vec<_>>>();
                let vals = vals.map_err(|_| {
                    PyIndexError::new_err(format!(
                        "cannot set {} items from {}",
                        positions.len(),
                        new_data.repr().map(|r| r.to_string()).unwrap_or_default()
                    ))
                })?;
                (Some(vals), new_data.len().ok())
            }
            WriteValues::Batch => (None, None),
        };
        let py = new_data.py();
        let selected = positions.len();
        let typed = |spec: &Spec| typed_set_leaves(spec, values.as_deref(), new_data, selected, name);
        // Data that is not one value per position: a batch split into rows as `_extend`
        // splits it, or a sequence of items.
        let objects = |split: SplitBatch| -> PyResult<Vec<PyObj>> {
            let values = match (values.clone(), split) {
                (Some(v), _) => v,
                (None, SplitBatch::Rows) => split_rows(new_data)?,
                (None, SplitBatch::Items) => new_data.try_iter()?.collect::<PyResult<_>>()?,
            };
            Ok(values.into_iter().map(|v| PyObj(v.unbind())).collect())
        };
        self.core.set_items(name, &positions, given, typed, objects, |t| to_object(py, t))
    }
}

/// Appends `data` (a Python list of items, or a batch) to field `name` of `core`.
fn extend_core(
    core: &mut Core,
    py: Python<'_>,
    name: FieldName<'_>,
    data: &Bound<'_, PyAny>,
) -> PyResult<()> {
    // A Python list holds items; anything else (an array, or a dict/tuple of arrays for a
    // nested space) is a batch with the items on its first axis, as RLlib's buffers hold
    // them once numpy'd.
    let batch = data.cast::<PyList>().is_err();
    let values = || -> PyResult<Vec<Bound<'_, PyAny>>> {
        if batch {
            split_rows(data)
        } else {
            data.try_iter()?.collect()
        }
    };
    core.extend(name, batch, values, |v, c| convert(&v, c, name), |t| to_object(py, t))
}

/// A packed field's state as the dict `_packed_state` returns.
struct PackedDict<'a, 'py>(&'a Bound<'py, PyDict>);

impl PackedDict<'_, '_> {
    /// Entry `key`; `KeyError` if the dict lacks it.
    fn get<T: for<'a, 'py> FromPyObject<'a, 'py, Error = PyErr>>(&self, key: &str) -> PyResult<T> {
        self.0.as_any().get_item(key)?.extract()
    }
}

impl packed::State for PackedDict<'_, '_> {
    type Error = PyErr;
    fn count(&self, key: &'static str) -> PyResult<usize> {
        self.get(key)
    }
    fn flag(&self, key: &'static str) -> PyResult<bool> {
        self.get(key)
    }
    fn blocks(&self, key: &'static str) -> PyResult<Vec<Vec<Vec<u8>>>> {
        self.get(key)
    }
    fn raw(&self, key: &'static str) -> PyResult<Vec<Vec<u8>>> {
        self.get(key)
    }
}
