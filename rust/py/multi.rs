//! Multi-agent bindings: the native env-step map, the native part of a
//! `fastrollout.MultiAgentEpisode` ([`MultiAgentEpisodeCore`]), the one native call that
//! records an env step of such an episode for all its agents, and the books' part of
//! `concat_episode`.
//!
//! The episode's containers (agent episodes, step maps, hanging values) are Python dicts
//! held in native fields and exposed under RLlib's attribute names, so that the Python
//! layer reads them as RLlib's users do while the native step reaches them without
//! attribute lookups; the decisions come from the pure core (which agents a step
//! mentions, [`Mentions`]; each agent's part, [`plan_env_step`]; [`plan_concat`]), which
//! this module applies to the dicts.

use pyo3::exceptions::PyValueError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyInt, PyList, PySet, PyString, PyTuple};
use pyo3::{PyTraverseError, PyVisit};

use super::dict_walk::for_each_item;
use super::errors::{index_error, with_prefix};
use super::index::to_index;
use super::multi_agents::AgentEpisodeMaker;
use super::object::PyObj;
use super::outputs::AgentOutputsPy;
use super::single::{
    info_or_absent, perf_counter, ExtraOutputs, PreparedReset, PreparedStep, RowSteps, SingleAgentEpisodePy,
};
use super::spec;
use crate::episode::multi::{
    plan_concat, plan_env_step_into, AgentIds, AgentOutcome, AgentPlan, AgentStep, AgentStepError,
    AgentStepInput, AgentVec, BeginReward, Books, ConcatAgent, ConcatBooks, ConcatInput, EnvStep,
    EnvStepPlan, MapRead, Mention, Mentions, Slot, Source, StepMap,
};

/// RLlib's skip tag in env-step maps.
const SKIP_TAG: &str = "S";

fn step_to_py(py: Python<'_>, step: Option<i64>) -> PyResult<Py<PyAny>> {
    Ok(match step {
        Some(t) => t.into_pyobject(py)?.into_any().unbind(),
        None => intern!(py, "S").clone().into_any().unbind(),
    })
}

fn step_from_py(value: &Bound<'_, PyAny>) -> PyResult<Option<i64>> {
    if let Ok(s) = value.cast::<PyString>() {
        if s.to_str()? == SKIP_TAG {
            return Ok(None);
        }
    }
    value.extract::<i64>().map(Some).map_err(|_| {
        PyValueError::new_err(format!(
            "an env-step map holds agent steps (ints) or the skip tag {SKIP_TAG:?}, not {}",
            value.repr().map(|r| r.to_string()).unwrap_or_default()
        ))
    })
}

/// `__reduce__`'s answer: the class and its constructor arguments.
type Reduced<'py> = (Bound<'py, PyAny>, (Bound<'py, PyList>, usize));

/// One agent's env-step -> agent-step map, with look-back (`"S"` where it did not step).
#[pyclass(name = "StepMap", module = "fastrollout._core")]
#[derive(Clone, Default)]
pub struct StepMapPy {
    pub(crate) map: StepMap,
}

#[pymethods]
impl StepMapPy {
    #[new]
    #[pyo3(signature = (data=None, lookback=0))]
    fn new(data: Option<&Bound<'_, PyAny>>, lookback: usize) -> PyResult<Self> {
        let steps = match data {
            Some(d) => d.try_iter()?.map(|v| step_from_py(&v?)).collect::<PyResult<Vec<_>>>()?,
            None => Vec::new(),
        };
        Ok(StepMapPy { map: StepMap::new(steps, lookback) })
    }

    /// All entries, look-back included (a new list).
    #[getter]
    fn data<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let items = self.map.steps().iter().map(|s| step_to_py(py, *s)).collect::<PyResult<Vec<_>>>()?;
        PyList::new(py, items)
    }

    #[getter]
    fn lookback(&self) -> usize {
        self.map.lookback()
    }

    #[setter]
    fn set_lookback(&mut self, lookback: usize) {
        self.map.set_lookback(lookback);
    }

    fn __len__(&self) -> usize {
        self.map.len()
    }

    fn append(&mut self, value: &Bound<'_, PyAny>) -> PyResult<()> {
        self.map.push(step_from_py(value)?);
        Ok(())
    }

    fn extend(&mut self, values: &Bound<'_, PyAny>) -> PyResult<()> {
        let steps = values.try_iter()?.map(|v| step_from_py(&v?)).collect::<PyResult<Vec<_>>>()?;
        self.map.extend(steps);
        Ok(())
    }

    /// The look-back a cut keeps: at least `requested`, and back to the observation each
    /// hanging action (`hanging`: those agents' maps) was computed from.
    #[staticmethod]
    #[pyo3(name = "_cut_lookback")]
    fn cut_lookback(requested: usize, hanging: Vec<PyRef<'_, StepMapPy>>) -> usize {
        StepMap::cut_lookback(requested, hanging.iter().map(|m| &m.map))
    }

    /// Entries at `indices` (RLlib's index semantics; `fill`: out-of-range reads as "S";
    /// `ignore_last`: without the last entry).
    #[pyo3(signature = (indices=None, *, neg_index_as_lookback=false, fill=false, ignore_last=false))]
    fn get(
        &self,
        py: Python<'_>,
        indices: Option<&Bound<'_, PyAny>>,
        neg_index_as_lookback: bool,
        fill: bool,
        ignore_last: bool,
    ) -> PyResult<Py<PyAny>> {
        let index = to_index(indices)?;
        match self.map.get(&index, neg_index_as_lookback, fill, ignore_last).map_err(|e| index_error(&e))? {
            MapRead::One(s) => step_to_py(py, s),
            MapRead::Many(v) => {
                let items = v.iter().map(|s| step_to_py(py, *s)).collect::<PyResult<Vec<_>>>()?;
                Ok(PyList::new(py, items)?.into_any().unbind())
            }
        }
    }

    /// `map[i]` is `map.get(i)` (relative to the look-back, as RLlib's buffers index).
    fn __getitem__(&self, py: Python<'_>, index: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        self.get(py, Some(index), false, false, false)
    }

    fn copy(&self) -> StepMapPy {
        self.clone()
    }

    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<Reduced<'py>> {
        let this = slf.borrow();
        Ok((slf.get_type().into_any(), (this.data(slf.py())?, this.map.lookback())))
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(format!("StepMap({}, lookback={})", self.data(py)?.repr()?, self.map.lookback()))
    }

    /// Value equality: the same entries (skips included) and the same look-back, so that
    /// an episode restored from its state compares equal to the original. Another type
    /// is `NotImplemented` (Python then falls back to identity). Step maps are mutable,
    /// so they are not hashable.
    fn __eq__(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> Py<PyAny> {
        match other.cast::<StepMapPy>() {
            // Borrowing fails only while the other map is being changed (never while
            // this thread runs Python code here); such a map is not equal.
            Ok(o) => o
                .try_borrow()
                .is_ok_and(|o| o.map == self.map)
                .into_pyobject(py)
                .map_or_else(|_| py.NotImplemented(), |b| b.to_owned().into_any().unbind()),
            Err(_) => py.NotImplemented(),
        }
    }
}

/// The bookkeeping of a `fastrollout.MultiAgentEpisode` that its native env step reads and
/// writes: env-step counters, done flags, step times and the per-agent dicts.
///
/// `fastrollout.MultiAgentEpisode` subclasses it. Every field is an attribute with RLlib's
/// name (the dicts are the very objects Python code reads and mutates), and `add_env_step`
/// is a native method, so a recorded step reaches them without attribute lookups.
#[pyclass(name = "MultiAgentEpisodeCore", module = "fastrollout._core", subclass)]
pub struct MultiAgentEpisodeCore {
    /// The env step this chunk is at (counted from the episode's start).
    #[pyo3(get)]
    pub(crate) env_t: i64,
    /// The env step at which this chunk starts.
    #[pyo3(get)]
    pub(crate) env_t_started: i64,
    #[pyo3(get)]
    pub(crate) is_terminated: bool,
    #[pyo3(get)]
    pub(crate) is_truncated: bool,
    /// Env steps of look-back at the start of this chunk.
    #[pyo3(get, name = "_len_lookback_buffers")]
    pub(crate) len_lookback_buffers: usize,
    /// `time.perf_counter()` values of the first and the last step.
    #[pyo3(get, name = "_start_time")]
    start_time: Option<f64>,
    #[pyo3(get, name = "_last_step_time")]
    last_step_time: Option<f64>,
    /// Agent id -> its `SingleAgentEpisode`.
    #[pyo3(get)]
    pub(crate) agent_episodes: Py<PyDict>,
    /// Agent id -> its `StepMap` (env step -> agent step).
    #[pyo3(get)]
    pub(crate) env_t_to_agent_t: Py<PyDict>,
    /// Agent id -> the agent step at which this chunk starts.
    #[pyo3(get)]
    pub(crate) agent_t_started: Py<PyDict>,
    /// Agent id -> the action it was asked for and has not been rewarded for yet.
    #[pyo3(get, name = "_hanging_actions_end")]
    pub(crate) hanging_actions_end: Py<PyDict>,
    /// Agent id -> the extra model outputs of its hanging action.
    #[pyo3(get, name = "_hanging_extra_model_outputs_end")]
    pub(crate) hanging_extra_model_outputs_end: Py<PyDict>,
    /// Agent id -> rewards collected since its hanging action.
    #[pyo3(get, name = "_hanging_rewards_end")]
    pub(crate) hanging_rewards_end: Py<PyDict>,
    /// Agent id -> rewards collected before its first observation.
    #[pyo3(get, name = "_hanging_rewards_begin")]
    pub(crate) hanging_rewards_begin: Py<PyDict>,
    /// Agents whose hanging data a step of this chunk dropped (done with nothing to
    /// record), so that `concat_episode` drops what the chunk before holds for them too:
    /// an agent with rewards before its first observation that arrives done leaves none.
    #[pyo3(get, name = "_dropped_agents")]
    dropped_agents: Py<PySet>,
    /// Items per compressed block of every agent's observations (`None`: uncompressed;
    /// `env_runners(compress_observations=True)`). Setting it applies it to the agents
    /// there are; agents that join later get it when they are made.
    #[pyo3(get, name = "_observation_compression")]
    observation_compression: Option<usize>,
}

/// Sets `slot` from a Python value assigned to the attribute `name`; on a value that does
/// not convert, raises the conversion's error type with a message that names the attribute
/// and keeps the old value.
fn set_named<'a, 'py, T>(slot: &mut T, value: &'a Bound<'py, PyAny>, name: &str) -> PyResult<()>
where
    T: FromPyObject<'a, 'py>,
{
    *slot = value
        .extract::<T>()
        .map_err(|e| with_prefix(value.py(), &format!("MultiAgentEpisode.{name}"), e.into()))?;
    Ok(())
}

/// An empty `defaultdict(factory)`: the type's `tp_new` (dict's) and its writable
/// `default_factory`, without `defaultdict.__init__`'s argument parsing (half the cost of
/// the call; a new episode makes five).
fn new_defaultdict<'py>(
    defaultdict: &Bound<'py, pyo3::types::PyType>,
    factory: &Bound<'py, pyo3::types::PyType>,
) -> PyResult<Bound<'py, PyDict>> {
    let obj = super::multi_cut::new_object(defaultdict)?;
    obj.setattr(intern!(defaultdict.py(), "default_factory"), factory)?;
    Ok(obj.cast_into::<PyDict>()?)
}

/// The episode's containers (shared with Python: RLlib's dicts under its names).
struct Dicts<'py> {
    agent_episodes: Bound<'py, PyDict>,
    step_maps: Bound<'py, PyDict>,
    t_started: Bound<'py, PyDict>,
    hanging_actions: Bound<'py, PyDict>,
    hanging_extras: Bound<'py, PyDict>,
    rewards_end: Bound<'py, PyDict>,
    rewards_begin: Bound<'py, PyDict>,
    dropped: Bound<'py, PySet>,
}

impl<'py> Dicts<'py> {
    fn slot(&self, slot: Slot) -> &Bound<'py, PyDict> {
        match slot {
            Slot::Action => &self.hanging_actions,
            Slot::ExtraOutputs => &self.hanging_extras,
            Slot::RewardEnd => &self.rewards_end,
            Slot::RewardBegin => &self.rewards_begin,
        }
    }

    /// Removes the agent's entry of `slot` (nothing if it has none).
    fn remove(&self, aid: &Bound<'py, PyAny>, slot: Slot) -> PyResult<()> {
        let d = self.slot(slot);
        if !d.is_empty() && d.contains(aid)? {
            d.del_item(aid)?;
        }
        Ok(())
    }

    /// Adds `reward` to the agent's hanging reward of `slot` (0 if it has none).
    fn add_reward(&self, aid: &Bound<'py, PyAny>, slot: Slot, reward: f64) -> PyResult<()> {
        let d = self.slot(slot);
        let old = d.get_item(aid)?.map(|v| v.extract::<f64>()).transpose()?.unwrap_or(0.0);
        d.set_item(aid, old + reward)
    }
}

/// The episode's containers and counters as one env step reads them.
struct EpisodeState<'py> {
    dicts: Dicts<'py>,
    env_t: i64,
    env_t_started: i64,
    lookback: usize,
    is_done: bool,
    compression: Option<usize>,
}

impl MultiAgentEpisodeCore {
    fn state<'py>(&self, py: Python<'py>) -> EpisodeState<'py> {
        EpisodeState {
            dicts: Dicts {
                agent_episodes: self.agent_episodes.bind(py).clone(),
                step_maps: self.env_t_to_agent_t.bind(py).clone(),
                t_started: self.agent_t_started.bind(py).clone(),
                hanging_actions: self.hanging_actions_end.bind(py).clone(),
                hanging_extras: self.hanging_extra_model_outputs_end.bind(py).clone(),
                rewards_end: self.hanging_rewards_end.bind(py).clone(),
                rewards_begin: self.hanging_rewards_begin.bind(py).clone(),
                dropped: self.dropped_agents.bind(py).clone(),
            },
            env_t: self.env_t,
            env_t_started: self.env_t_started,
            lookback: self.len_lookback_buffers,
            is_done: self.done(),
            compression: self.observation_compression,
        }
    }

    fn dicts(&self) -> [&Py<PyDict>; 7] {
        [
            &self.agent_episodes,
            &self.env_t_to_agent_t,
            &self.agent_t_started,
            &self.hanging_actions_end,
            &self.hanging_extra_model_outputs_end,
            &self.hanging_rewards_end,
            &self.hanging_rewards_begin,
        ]
    }

    /// Whether the episode is terminated or truncated.
    pub fn done(&self) -> bool {
        self.is_terminated || self.is_truncated
    }

    /// Sets the compression of every agent's observations (see `_observation_compression`).
    fn apply_observation_compression(&mut self, py: Python<'_>, compression: Option<usize>) -> PyResult<()> {
        self.observation_compression = compression;
        for eps in self.agent_episodes.bind(py).values() {
            eps.cast::<SingleAgentEpisodePy>()?.try_borrow_mut()?.set_observation_compression(compression);
        }
        Ok(())
    }
}

#[pymethods]
impl MultiAgentEpisodeCore {
    /// An empty episode core: counters at 0, and the containers RLlib's episode starts
    /// with (`agent_t_started` a `defaultdict(int)`, `env_t_to_agent_t` a
    /// `defaultdict(StepMap)`, the hanging extra outputs and rewards `defaultdict(dict)`
    /// and `defaultdict(float)`, the others plain dicts), so that the Python subclass's
    /// `__init__` and `cut` fill them instead of making them again. Arguments are accepted
    /// and ignored here so that subclasses can take any.
    #[new]
    #[pyo3(signature = (*_args, **_kwargs))]
    fn new(
        py: Python<'_>,
        _args: &Bound<'_, PyTuple>,
        _kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        static DEFAULTDICT: PyOnceLock<Py<pyo3::types::PyType>> = PyOnceLock::new();
        let defaultdict = DEFAULTDICT.import(py, "collections", "defaultdict")?;
        let with_default = |factory: Bound<'_, pyo3::types::PyType>| -> PyResult<Py<PyDict>> {
            Ok(new_defaultdict(defaultdict, &factory)?.unbind())
        };
        Ok(MultiAgentEpisodeCore {
            env_t: 0,
            env_t_started: 0,
            is_terminated: false,
            is_truncated: false,
            len_lookback_buffers: 0,
            start_time: None,
            last_step_time: None,
            agent_episodes: PyDict::new(py).unbind(),
            env_t_to_agent_t: with_default(py.get_type::<StepMapPy>())?,
            agent_t_started: with_default(py.get_type::<PyInt>())?,
            hanging_actions_end: PyDict::new(py).unbind(),
            hanging_extra_model_outputs_end: with_default(py.get_type::<PyDict>())?,
            hanging_rewards_end: with_default(py.get_type::<pyo3::types::PyFloat>())?,
            hanging_rewards_begin: with_default(py.get_type::<pyo3::types::PyFloat>())?,
            dropped_agents: PySet::empty(py)?.unbind(),
            observation_compression: None,
        })
    }

    /// Whether the episode is terminated or truncated (`__all__`).
    #[getter]
    fn is_done(&self) -> bool {
        self.done()
    }

    /// Turns every agent episode to numpy (each one's `to_numpy`; that of the native
    /// class without a Python call).
    ///
    /// Raises:
    ///     EpisodeStateError: If an agent episode's lengths do not fit.
    ///     ValueError: If an agent episode holds no observation at all.
    #[pyo3(name = "_agents_to_numpy")]
    fn agents_to_numpy(&self, py: Python<'_>) -> PyResult<()> {
        static SINGLE: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
        let single = SINGLE.import(py, "fastrollout.episodes.single_agent_episode", "SingleAgentEpisode")?;
        // A copy of the values: a subclass's `to_numpy` may change the dict.
        let episodes = self.agent_episodes.bind(py).values();
        for eps in episodes.iter() {
            if eps.get_type().is(single) {
                eps.cast::<SingleAgentEpisodePy>()?.try_borrow_mut()?.finalize_core()?;
            } else {
                eps.call_method0(intern!(py, "to_numpy"))?;
            }
        }
        Ok(())
    }

    /// Sets the counters, the look-back and the done flags of a blank chunk (0 and False).
    #[pyo3(name = "_blank_counters")]
    fn blank_counters(&mut self) {
        (self.env_t, self.env_t_started, self.len_lookback_buffers) = (0, 0, 0);
        (self.is_terminated, self.is_truncated) = (false, false);
    }

    // Setters (the getters are the fields' own): a value of the wrong type is refused
    // with an error that names the attribute, and the old value is kept.
    #[setter]
    fn set_env_t(&mut self, value: &Bound<'_, PyAny>) -> PyResult<()> {
        set_named(&mut self.env_t, value, "env_t")
    }

    #[setter]
    fn set_env_t_started(&mut self, value: &Bound<'_, PyAny>) -> PyResult<()> {
        set_named(&mut self.env_t_started, value, "env_t_started")
    }

    #[setter]
    fn set_is_terminated(&mut self, value: &Bound<'_, PyAny>) -> PyResult<()> {
        set_named(&mut self.is_terminated, value, "is_terminated")
    }

    #[setter]
    fn set_is_truncated(&mut self, value: &Bound<'_, PyAny>) -> PyResult<()> {
        set_named(&mut self.is_truncated, value, "is_truncated")
    }

    #[setter(_len_lookback_buffers)]
    fn set_len_lookback_buffers(&mut self, value: &Bound<'_, PyAny>) -> PyResult<()> {
        set_named(&mut self.len_lookback_buffers, value, "_len_lookback_buffers")
    }

    #[setter(_start_time)]
    fn set_start_time(&mut self, value: &Bound<'_, PyAny>) -> PyResult<()> {
        set_named(&mut self.start_time, value, "_start_time")
    }

    #[setter(_last_step_time)]
    fn set_last_step_time(&mut self, value: &Bound<'_, PyAny>) -> PyResult<()> {
        set_named(&mut self.last_step_time, value, "_last_step_time")
    }

    #[setter]
    fn set_agent_episodes(&mut self, value: &Bound<'_, PyAny>) -> PyResult<()> {
        set_named(&mut self.agent_episodes, value, "agent_episodes")
    }

    #[setter]
    fn set_env_t_to_agent_t(&mut self, value: &Bound<'_, PyAny>) -> PyResult<()> {
        set_named(&mut self.env_t_to_agent_t, value, "env_t_to_agent_t")
    }

    #[setter]
    fn set_agent_t_started(&mut self, value: &Bound<'_, PyAny>) -> PyResult<()> {
        set_named(&mut self.agent_t_started, value, "agent_t_started")
    }

    #[setter(_hanging_actions_end)]
    fn set_hanging_actions_end(&mut self, value: &Bound<'_, PyAny>) -> PyResult<()> {
        set_named(&mut self.hanging_actions_end, value, "_hanging_actions_end")
    }

    #[setter(_hanging_extra_model_outputs_end)]
    fn set_hanging_extra_model_outputs_end(&mut self, value: &Bound<'_, PyAny>) -> PyResult<()> {
        set_named(&mut self.hanging_extra_model_outputs_end, value, "_hanging_extra_model_outputs_end")
    }

    #[setter(_hanging_rewards_end)]
    fn set_hanging_rewards_end(&mut self, value: &Bound<'_, PyAny>) -> PyResult<()> {
        set_named(&mut self.hanging_rewards_end, value, "_hanging_rewards_end")
    }

    #[setter(_hanging_rewards_begin)]
    fn set_hanging_rewards_begin(&mut self, value: &Bound<'_, PyAny>) -> PyResult<()> {
        set_named(&mut self.hanging_rewards_begin, value, "_hanging_rewards_begin")
    }
    #[setter(_dropped_agents)]
    fn set_dropped_agents(&mut self, value: &Bound<'_, PyAny>) -> PyResult<()> {
        set_named(&mut self.dropped_agents, value, "_dropped_agents")
    }

    /// Sets the compression of every agent's observations (items per LZ4 block, at least
    /// 1; `None`: uncompressed) and applies it to the agents there are; reads are unchanged
    /// either way. Agents whose observations are Python objects stay as they are.
    #[setter(_observation_compression)]
    fn set_observation_compression(&mut self, value: &Bound<'_, PyAny>) -> PyResult<()> {
        let mut compression = self.observation_compression;
        set_named(&mut compression, value, "_observation_compression")?;
        self.apply_observation_compression(value.py(), compression)
    }

    /// Appends the books of `other`, the chunk that continues this episode, as the core's
    /// plan of `concat_episode` says: per agent its episode (taken over or continued), its
    /// env-step map and what hangs at its end; then the other chunk's dropped agents,
    /// rewards before first observations and done agents. The caller checks first that
    /// `other` continues this episode, and sets the counters and flags after.
    ///
    /// Args:
    ///     other: The chunk that continues this episode.
    ///     agents: The agents with an episode in either chunk, in the order their parts
    ///         are applied.
    ///
    /// Raises:
    ///     EpisodeStateError: From an agent episode's `concat_episode`.
    #[pyo3(name = "_concat_books")]
    fn concat_books(
        &self,
        other: &Bound<'_, MultiAgentEpisodeCore>,
        agents: Vec<Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let py = other.py();
        let ours = self.state(py);
        let theirs = other.try_borrow()?.state(py);
        let mut books =
            ConcatDicts { ours: &ours.dicts, theirs: &theirs.dicts, index: PyDict::new(py), aids: agents };
        for (i, aid) in books.aids.iter().enumerate() {
            books.index.set_item(aid, i)?;
        }
        let is_done = |eps: Bound<'_, PyAny>| eps.getattr(intern!(py, "is_done"))?.is_truthy();
        let facts = books
            .aids
            .iter()
            .map(|aid| {
                Ok(ConcatAgent {
                    ours: ours.dicts.agent_episodes.get_item(aid)?.map(is_done).transpose()?,
                    theirs: theirs.dicts.agent_episodes.contains(aid)?,
                    our_map: ours.dicts.step_maps.contains(aid)?,
                    their_map: theirs.dicts.step_maps.contains(aid)?,
                    their_action_hangs: theirs.dicts.hanging_actions.contains(aid)?,
                })
            })
            .collect::<PyResult<Vec<_>>>()?;
        let their_dropped =
            theirs.dicts.dropped.iter().map(|a| books.index_of(a)).collect::<PyResult<Vec<_>>>()?;
        let their_begin = (theirs.dicts.rewards_begin.iter())
            .map(|(aid, reward)| {
                Ok(BeginReward {
                    hung_at_cut: ours.dicts.rewards_end.contains(&aid)?,
                    reward: reward.extract()?,
                    agent: books.index_of(aid)?,
                })
            })
            .collect::<PyResult<Vec<_>>>()?;
        let mut their_done = Vec::new();
        for (aid, eps) in theirs.dicts.agent_episodes.iter() {
            if is_done(eps)? {
                their_done.push(books.index_of(aid)?);
            }
        }
        let first_map = ours.dicts.step_maps.values().into_iter().next();
        let map_lookback = first_map.map(|m| Ok::<_, PyErr>(m.cast::<StepMapPy>()?.borrow().map.lookback()));
        let plan = plan_concat(&ConcatInput {
            agents: &facts,
            their_dropped: &their_dropped,
            their_begin: &their_begin,
            their_done: &their_done,
            ours: (ours.env_t_started, ours.env_t),
            theirs: (theirs.env_t_started, theirs.env_t),
            map_lookback: map_lookback.transpose()?,
            episode_lookback: ours.lookback,
        });
        plan.apply(&mut books)
    }

    /// Fills `successor`, a new episode object (made with `__new__`, its id, spaces and
    /// mapping function set), with the chunk that `cut` returns when it keeps `lookback`
    /// env steps of look-back, as the core's plan says: each agent's episode the rows it
    /// keeps (a new object of its class, which must be `successor._agent_episode_cls`),
    /// its env-step map, what hangs at its end, `agent_t_started`, the module mapping,
    /// the begin rewards and the counters.
    ///
    /// Args:
    ///     successor: The new episode object.
    ///     lookback: The look-back `cut` decided on.
    ///
    /// Returns:
    ///     False, with nothing written, where the successor is no selection of the
    ///     agents' rows (the caller then rebuilds it from the per-env-step reads).
    #[pyo3(name = "_cut_books")]
    fn cut_books(&self, successor: &Bound<'_, MultiAgentEpisodeCore>, lookback: usize) -> PyResult<bool> {
        self.cut_into(successor, lookback)
    }

    /// The episode of an agent that observes for the first time in this chunk.
    ///
    /// `add_env_reset` and `add_env_step` make their new agents' episodes this way
    /// while they check the step, before they store anything, so that the check of the
    /// env's declared agents costs one lookup per agent and chunk, nothing per step. An
    /// agent episode class with a constructor of its own is constructed through it.
    ///
    /// Args:
    ///     agent_id: The agent.
    ///
    /// Returns:
    ///     Its new (empty) episode.
    ///
    /// Raises:
    ///     MultiAgentEnvError: If the episode has declared agents (a runner's) and
    ///         `agent_id` is not among them; nothing of the step is stored then.
    #[pyo3(name = "_new_agent_episode")]
    fn new_agent_episode<'py>(
        slf: &Bound<'py, Self>,
        agent_id: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, SingleAgentEpisodePy>> {
        AgentEpisodeMaker::new(slf.as_any())?.make(agent_id)
    }

    /// The successor `cut` returns when it keeps `requested` env steps of look-back, on
    /// the simultaneous path (the core's `plan_simultaneous_cut`): where nothing hangs, no
    /// agent is numpy'd and every live agent stepped at each kept env step, a new object of
    /// this episode's class (made with `__new__`) holding each kept agent's cut episode,
    /// its env-step map (a run of agent steps), `agent_t_started`, the module mapping, the
    /// begin rewards, the counters, and this episode's id, spaces, mapping function,
    /// declared agents, observation compression and (a deep copy of its) custom data.
    ///
    /// Args:
    ///     requested: The look-back `cut` was asked for (nothing hangs on this path, so
    ///         it is the look-back kept).
    ///
    /// Returns:
    ///     The successor, or None where the path does not apply (the caller then takes
    ///     the general one).
    ///
    /// Raises:
    ///     EpisodeStateError: From an agent episode's cut.
    #[pyo3(name = "_cut_simultaneous")]
    fn cut_simultaneous<'py>(
        slf: &Bound<'py, Self>,
        requested: usize,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let Some(successor) = slf.try_borrow()?.simultaneous_successor(slf, requested)? else {
            return Ok(None);
        };
        let py = slf.py();
        let shared = ["id_", "agent_to_module_mapping_fn", "observation_space", "action_space"];
        for name in shared.map(|n| PyString::intern(py, n)) {
            successor.setattr(&name, slf.getattr(&name)?)?;
        }
        let custom = slf.getattr(intern!(py, "_custom_data"))?;
        let custom =
            if custom.is_truthy()? { py_deepcopy(py)?.call1((custom,))? } else { PyDict::new(py).into_any() };
        successor.setattr(intern!(py, "_custom_data"), custom)?;
        let declared = slf.getattr(intern!(py, "_declared_agents"))?;
        if !declared.is_none() {
            successor.setattr(intern!(py, "_declared_agents"), declared)?;
        }
        let compression = slf.try_borrow()?.observation_compression;
        successor.try_borrow_mut()?.apply_observation_compression(py, compression)?;
        Ok(Some(successor.into_any()))
    }

    /// Fills `sliced`, a new episode object (made with `__new__`, its id, spaces and
    /// mapping function set), with the episode `slice` returns for the env steps
    /// `start:stop` (resolved, step 1) with `lookback` env steps of look-back, as the
    /// core's plan says (see `_cut_books`).
    ///
    /// Args:
    ///     sliced: The new episode object.
    ///     start: The first env step of the slice (0 = this chunk's first).
    ///     stop: The env step after its last.
    ///     lookback: The look-back `slice` decided on.
    ///     modules: The module mapping the agents' module ids come from.
    ///
    /// Returns:
    ///     False, with nothing written, where the slice is no selection of the agents'
    ///     rows (the caller then rebuilds it from the per-env-step reads).
    #[pyo3(name = "_slice_books")]
    fn slice_books(
        &self,
        sliced: &Bound<'_, MultiAgentEpisodeCore>,
        start: usize,
        stop: usize,
        lookback: usize,
        modules: &Bound<'_, PyDict>,
    ) -> PyResult<bool> {
        self.slice_into(sliced, start, stop, lookback, modules)
    }

    /// Records one env step of all agents, in one native call (the runner's per-sub-env
    /// record calls it too).
    ///
    /// Everything is checked and converted first (agent by agent, with RLlib's rules);
    /// only then is anything stored, so an error leaves the episode as it was.
    ///
    /// Args:
    ///     observations: Agent id -> observation, for the agents that observe now.
    ///     actions: Agent id -> the action it took (agents that were asked to act).
    ///     rewards: Agent id -> reward (may include agents without an observation).
    ///     infos: Agent id -> infos.
    ///     terminateds: Agent id (and `"__all__"`) -> terminated.
    ///     truncateds: Agent id (and `"__all__"`) -> truncated.
    ///     extra_model_outputs: Agent id -> dict of extra model outputs.
    ///
    /// Raises:
    ///     MultiAgentEnvError: If the episode is done, an agent that is done gets data,
    ///         an agent acted and observed without a reward, or an agent acted and was
    ///         truncated without a last observation. The message names the agent.
    ///     SpaceMismatchError: If a value does not fit its agent's space (the message
    ///         names the agent). Nothing is recorded then.
    #[pyo3(signature = (observations, actions, rewards, infos=None, *, terminateds=None, truncateds=None, extra_model_outputs=None))]
    #[allow(clippy::too_many_arguments, clippy::too_many_lines)]
    pub(crate) fn add_env_step<'py>(
        slf: &Bound<'py, Self>,
        observations: &Bound<'py, PyDict>,
        actions: &Bound<'py, PyDict>,
        rewards: &Bound<'py, PyDict>,
        infos: Option<&Bound<'py, PyAny>>,
        terminateds: Option<&Bound<'py, PyAny>>,
        truncateds: Option<&Bound<'py, PyAny>>,
        extra_model_outputs: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<()> {
        let py = slf.py();
        let episode = slf;
        let infos = as_dict(infos)?;
        let terminateds = as_dict(terminateds)?;
        let truncateds = as_dict(truncateds)?;
        let extras = as_dict(extra_model_outputs)?;
        // Shared borrow released at once: agents that join call back into Python code, which
        // may read the episode's attributes.
        let EpisodeState { dicts, env_t, env_t_started, lookback, is_done, compression } =
            episode.try_borrow()?.state(py);
        let Dicts {
            agent_episodes, step_maps, t_started, hanging_actions, hanging_extras, rewards_end, ..
        } = &dicts;

        if is_done {
            return Err(multi_agent_env_error(
                py,
                "add_env_step: the multi-agent episode is already done".into(),
            ));
        }

        // The agents this env step mentions, with what each dict holds for them (the
        // core's rules; the dicts are walked here, in the order the core reads them).
        let mut ids = PyIds { all: AllKey::new(py)?, index: None };
        let mut rows: Rows<'py> = Mentions::default();
        let given = |v: Bound<'py, PyAny>| Some(v).filter(|v| !v.is_none());
        for_each_item(observations, |_, aid, obs| {
            rows.observation(&mut ids, &aid, given(obs))?;
            Ok(true)
        })?;
        for_each_item(actions, |i, aid, action| {
            rows.action(&mut ids, &aid, i, given(action))?;
            Ok(true)
        })?;
        for_each_item(rewards, |i, aid, reward| {
            rows.reward(&mut ids, &aid, i, given(reward))?;
            Ok(true)
        })?;
        for (flags, truncated) in [(terminateds.as_ref(), false), (truncateds.as_ref(), true)] {
            let Some(flags) = flags else { continue };
            for_each_item(flags, |i, aid, value| {
                let on = !value.is_none() && value.is_truthy()?;
                rows.flag(&mut ids, &aid, i, on, truncated)?;
                Ok(true)
            })?;
        }
        if rows.all_flagged() {
            for (i, aid) in agent_episodes.keys().iter().enumerate() {
                rows.named(&mut ids, &aid, i)?;
            }
        }
        if let Some(infos) = &infos {
            for_each_item(infos, |i, aid, info| {
                rows.info(&mut ids, &aid, i, given(info))?;
                Ok(true)
            })?;
        }
        if let Some(extras) = &extras {
            for_each_item(extras, |i, aid, extra| {
                rows.extra(&mut ids, &aid, i, given(extra))?;
                Ok(true)
            })?;
        }
        let (all, all_flagged) = (ids.all, rows.all_flagged());

        // Each mentioned agent's episode, and whether any agent joins now; its step map
        // and `agent_t_started` entry (converted where the plan reads them).
        let mut episode_type = std::ptr::null_mut();
        let walked = read_in_dict_order(agent_episodes, &mut rows.rows, |row, eps| {
            row.host.episode = Some(cast_episode(eps, &mut episode_type)?);
            Ok(())
        })?;
        let joins = rows.rows.iter().any(|row| row.host.episode.is_none());
        read_in_dict_order(step_maps, &mut rows.rows, |row, map| {
            row.host.step_map = Some(map);
            Ok(())
        })?;
        read_in_dict_order(t_started, &mut rows.rows, |row, t| {
            row.host.t_started = Some(t);
            Ok(())
        })?;

        // The agents with an episode, in its order: the first rows where the walk above
        // matched every entry (their episodes are at hand), the dict otherwise. (Two calls:
        // one iterator chaining both sources cost 0.9% of a 2-agent step.)
        let flagged =
            |aid: &Bound<'py, PyAny>| Ok(flag(terminateds.as_ref(), aid)? || flag(truncateds.as_ref(), aid)?);
        let (is_terminated, is_truncated) = if walked == agent_episodes.len() {
            let done = |r: &Row<'py>| r.host.episode.as_ref().is_some_and(|e| e.borrow().done());
            rows.episode_ends::<PyIds<'py>, PyErr>(
                rows.rows[..walked].iter().map(|r| Ok((r.id.clone(), done(r)))),
                flagged,
            )?
        } else {
            rows.episode_ends::<PyIds<'py>, PyErr>(
                agent_episodes
                    .iter()
                    .map(|(aid, eps)| Ok((aid, eps.cast::<SingleAgentEpisodePy>()?.borrow().done()))),
                flagged,
            )?
        };
        let rows = &mut rows.rows;

        // Agents that join take their place in `agent_episodes` in the order RLlib visits
        // them: that of the Python set it builds from the same dicts with the same set
        // operations (reads that combine agents, e.g. `return_list`, depend on the order).
        // Only then is that set built (about 1 µs); otherwise the order changes nothing.
        let order: Option<Vec<usize>> = if joins {
            let empty = PyDict::new(py);
            let sources = [
                observations,
                actions,
                rewards,
                terminateds.as_ref().unwrap_or(&empty),
                truncateds.as_ref().unwrap_or(&empty),
                if all_flagged { agent_episodes } else { &empty },
            ];
            let key_set = |d: &Bound<'py, PyDict>| PySet::new(py, d.keys());
            let mut set = key_set(sources[0])?.into_any();
            for d in &sources[1..] {
                set = set.call_method1(intern!(py, "__or__"), (key_set(d)?,))?;
            }
            let set = set.call_method1(intern!(py, "__sub__"), (PySet::new(py, [&all.key])?,))?;
            let position = PyDict::new(py);
            for (i, row) in rows.iter().enumerate() {
                if !position.contains(&row.id)? {
                    position.set_item(&row.id, i)?;
                }
            }
            let mut order = Vec::with_capacity(rows.len());
            for aid in set.try_iter()? {
                if let Some(i) = position.get_item(aid?)? {
                    order.push(i.extract::<usize>()?);
                }
            }
            Some(order)
        } else {
            None
        };

        // The plan: each mentioned agent's part, by RLlib's rules, checked whole before
        // any value is converted or stored.
        let n = order.as_ref().map_or(rows.len(), Vec::len);
        let at = |k: usize| order.as_ref().map_or(k, |o| o[k]);
        let have_hanging_actions = !hanging_actions.is_empty();
        let mut steps: AgentVec<AgentStep> = AgentVec::new();
        let mut rewards: AgentVec<f64> = AgentVec::new();
        let mut parts: AgentVec<Part<'py>> = AgentVec::new();
        let mut observed_with_map = 0usize;
        for k in 0..n {
            let row = &mut rows[at(k)];
            // One shared borrow of an agent's episode serves its plan input and its step's
            // conversion (each borrow and release is an atomic read-modify-write).
            let held_episode = row.host.episode.as_ref().map(Bound::try_borrow).transpose()?;
            let (has_episode, episode_done, agent_len) =
                held_episode.as_ref().map_or((false, false, 0), |e| (true, e.done(), e.chunk_len()));
            let step_map = row.host.step_map.take().map(Bound::cast_into::<StepMapPy>).transpose()?;
            let aid = &row.id;
            if row.observation.is_some() && step_map.is_some() {
                observed_with_map += 1;
            }
            let hanging_action = if have_hanging_actions {
                hanging_actions.get_item(aid)?.filter(|v| !v.is_none())
            } else {
                None
            };
            steps.push(AgentStep {
                input: row.step_input(AgentStepInput {
                    has_episode,
                    episode_done,
                    has_step_map: step_map.is_some(),
                    has_hanging_action: hanging_action.is_some(),
                    ..AgentStepInput::default()
                }),
                agent_len,
                t_started: row.host.t_started.as_ref().map(spec::extract_i64).transpose()?,
            });
            rewards.push(match &row.reward {
                Some(r) => r.extract::<f64>().map_err(|_| {
                    pyo3::exceptions::PyTypeError::new_err(format!(
                        "the reward of agent {} must be a real number, got {}",
                        aid.repr().map(|r| r.to_string()).unwrap_or_default(),
                        r.repr().map(|r| r.to_string()).unwrap_or_default()
                    ))
                })?,
                None => 0.0,
            });
            parts.push(Part { map: step_map, held: held_episode, hanging: hanging_action, prepared: None });
        }
        let mut plan = EnvStepPlan::default();
        plan_env_step_into(
            &EnvStep {
                agents: &steps,
                terminated: is_terminated,
                truncated: is_truncated,
                env_t,
                env_t_started,
                lookback,
            },
            &rewards,
            &mut plan,
        )
        .map_err(|(k, e)| agent_error(&rows[at(k)].id, e))?;

        // The values each part records, converted; nothing is stored yet.
        let mut new_agent_episode: Option<Bound<'py, PyAny>> = None;
        let mut row_steps = RowSteps::default();
        let none = py.None().into_bound(py);
        for ((k, outcome), part) in plan.agents.iter().enumerate().zip(&mut parts) {
            let row = &rows[at(k)];
            let aid = &row.id;
            let existing = &row.host.episode;
            let reward = rewards[k];
            let hanging_action = &part.hanging;
            // Every shared borrow is released by the end of this loop, before the episodes
            // are written.
            let mut held_episode = part.held.take();
            let mut agent_episode = || -> PyResult<Bound<'py, SingleAgentEpisodePy>> {
                match existing {
                    Some(e) => Ok(e.clone()),
                    None => joining_episode(episode, &mut new_agent_episode, aid, compression),
                }
            };
            let prepared = match outcome.plan {
                AgentPlan::Step { observation, action: action_src, extra_model_outputs, .. } => {
                    let eps = agent_episode()?;
                    // The values are borrowed from the step's rows where they come from there.
                    let last;
                    let (obs_value, info_value) = if observation == Source::Last {
                        held_episode = None;
                        last = eps.borrow_mut().last_observation_and_infos(py)?;
                        (&last.0, Some(&last.1))
                    } else {
                        (row.observation.as_ref().unwrap_or(&none), row.info.as_ref())
                    };
                    let action_value = match action_src {
                        Source::Hanging => hanging_action.as_ref().unwrap_or(&none),
                        _ => row.action.as_ref().unwrap_or(&none),
                    };
                    let hanging_extras_value;
                    let extras_value = match extra_model_outputs {
                        Source::Hanging => {
                            hanging_extras_value = hanging_extras.get_item(aid)?;
                            hanging_extras_value.as_ref()
                        }
                        _ => row.extra.as_ref(),
                    };
                    // The runner's scatter hands an agent's row of its module's outputs (a
                    // plain dict is told apart first, without the subtype walk).
                    let extras_rows = extras_value
                        .filter(|v| !v.is_exact_instance_of::<PyDict>())
                        .and_then(|v| v.cast::<AgentOutputsPy>().ok());
                    let extras_dict = if extras_rows.is_some() { None } else { dict_ref(extras_value)? };
                    let hanging_reward = if outcome.add_hanging_reward {
                        rewards_end.get_item(aid)?.map(|v| v.extract::<f64>()).transpose()?.unwrap_or(0.0)
                    } else {
                        0.0
                    };
                    // This step's own values (not the agent's last observation or its hanging
                    // ones) go straight into the columns where they fit them.
                    let given = observation == Source::Given
                        && action_src == Source::Given
                        && extra_model_outputs == Source::Given;
                    let row_step = if given {
                        let extras = match (extras_rows, extras_dict) {
                            (Some(r), _) => Some(ExtraOutputs::Rows(r.get())),
                            (None, Some(d)) => Some(ExtraOutputs::Dict(d)),
                            (None, None) => None,
                        };
                        let fresh;
                        let e = if let Some(e) = &held_episode {
                            e
                        } else {
                            fresh = eps.try_borrow()?;
                            &fresh
                        };
                        e.prepare_row_step(
                            &mut row_steps,
                            obs_value,
                            action_value,
                            hanging_reward + reward,
                            extras,
                        )?
                    } else {
                        None
                    };
                    let step = if let Some(row_step) = row_step {
                        StepData::Rows { row: row_step, info: info_or_absent(info_value) }
                    } else {
                        let rows_dict;
                        let extras_dict = match extras_rows {
                            Some(r) => {
                                rows_dict = r.get().to_dict(py)?;
                                Some(&rows_dict)
                            }
                            None => extras_dict,
                        };
                        let total = (hanging_reward + reward).into_pyobject(py)?.into_any();
                        let step = eps
                            .borrow()
                            .prepare_step(obs_value, action_value, &total, info_value, extras_dict)
                            .map_err(|e| for_agent(py, aid, e))?;
                        StepData::Items(Box::new(step))
                    };
                    Prepared::Step { episode: eps, step, is_new: existing.is_none() }
                }
                AgentPlan::Join => {
                    let eps = agent_episode()?;
                    let obs_value = row.observation.clone().unwrap_or_else(|| none.clone());
                    let reset = eps.borrow().prepare_reset(&obs_value).map_err(|e| for_agent(py, aid, e))?;
                    Prepared::Join { episode: eps, reset: Box::new(reset), infos: row.info.clone() }
                }
                AgentPlan::Hang => Prepared::Hang {
                    action: row.action.clone().unwrap_or_else(|| none.clone()),
                    extras: match row.extra.as_ref().map(|v| v.cast::<AgentOutputsPy>()) {
                        Some(Ok(r)) => r.get().to_dict(py)?.into_any(),
                        _ => row.extra.clone().unwrap_or_else(|| none.clone()),
                    },
                },
                AgentPlan::AddReward { .. } | AgentPlan::Drop => Prepared::Nothing,
            };
            part.prepared = Some(prepared);
        }

        // The step's time, for `get_duration_s` (the clock of Python's `time.perf_counter`),
        // of the episode and of the agents that step.
        let now = perf_counter();
        let mut books = DictBooks {
            dicts: &dicts,
            observations,
            rows,
            order: order.as_deref(),
            parts: &mut parts,
            row_steps: &row_steps,
            observed_with_map,
            now,
        };
        plan.apply(&mut books)?;
        let env_t = plan.env_t;
        let mut e = episode.try_borrow_mut()?;
        e.env_t = env_t;
        e.is_terminated = is_terminated;
        e.is_truncated = is_truncated;
        e.last_step_time = Some(now);
        e.start_time.get_or_insert(now);
        Ok(())
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        for d in self.dicts() {
            visit.call(d)?;
        }
        visit.call(&self.dropped_agents)
    }

    fn __clear__(&mut self) {
        // Fresh empty dicts replace the old ones (which other objects may still hold).
        Python::attach(|py| {
            for d in [
                &mut self.agent_episodes,
                &mut self.env_t_to_agent_t,
                &mut self.agent_t_started,
                &mut self.hanging_actions_end,
                &mut self.hanging_extra_model_outputs_end,
                &mut self.hanging_rewards_end,
                &mut self.hanging_rewards_begin,
            ] {
                *d = PyDict::new(py).unbind();
            }
            if let Ok(set) = PySet::empty(py) {
                self.dropped_agents = set.unbind();
            }
        });
    }
}

/// An agent's step, prepared: as rows of its typed columns (the common case: `row` is
/// the step's index in the call's [`RowSteps`]) or as the general path's items.
enum StepData<'py> {
    Rows { row: usize, info: Option<PyObj> },
    Items(Box<PreparedStep<'py>>),
}

/// The values one agent's part of the plan records, converted before anything is stored.
enum Prepared<'py> {
    Step {
        episode: Bound<'py, SingleAgentEpisodePy>,
        step: StepData<'py>,
        /// The episode was made for this step (the agent had none).
        is_new: bool,
    },
    Join {
        episode: Bound<'py, SingleAgentEpisodePy>,
        reset: Box<PreparedReset<'py>>,
        infos: Option<Bound<'py, PyAny>>,
    },
    Hang {
        action: Bound<'py, PyAny>,
        extras: Bound<'py, PyAny>,
    },
    /// Rewards and drops store no values of their own.
    Nothing,
}

/// One agent of an env step's plan, as the binding carries it from the plan's input to
/// the plan's application.
struct Part<'py> {
    /// The agent's step map, if it had one (made when the plan writes it otherwise).
    map: Option<Bound<'py, StepMapPy>>,
    /// The shared borrow of the agent's episode for the plan and the conversion (taken
    /// and released during the conversion).
    held: Option<PyRef<'py, SingleAgentEpisodePy>>,
    /// Its hanging action, if any.
    hanging: Option<Bound<'py, PyAny>>,
    /// The values its record stores, converted.
    prepared: Option<Prepared<'py>>,
}

/// RLlib's dicts on the Python episode as one env step's plan writes them (the core's
/// [`Books`]): agent `i` is the row `order[i]` (`i` without an order), with its part.
struct DictBooks<'a, 'py> {
    dicts: &'a Dicts<'py>,
    observations: &'a Bound<'py, PyDict>,
    rows: &'a [Row<'py>],
    order: Option<&'a [usize]>,
    parts: &'a mut AgentVec<Part<'py>>,
    row_steps: &'a RowSteps<'py>,
    /// Agents that observe now and have a map: when that is every map, no map needs a skip.
    observed_with_map: usize,
    now: f64,
}

impl<'a, 'py> DictBooks<'a, 'py> {
    fn aid(&self, i: usize) -> &'a Bound<'py, PyAny> {
        &self.rows[self.order.map_or(i, |o| o[i])].id
    }

    #[inline]
    fn map(&mut self, i: usize) -> PyResult<Bound<'py, StepMapPy>> {
        if let Some(m) = &self.parts[i].map {
            return Ok(m.clone());
        }
        let aid = self.aid(i);
        let m = step_map_of(aid.py(), &self.dicts.step_maps, aid)?;
        self.parts[i].map = Some(m.clone());
        Ok(m)
    }
}

impl Books for DictBooks<'_, '_> {
    type Error = PyErr;

    fn skip_unobserved(&mut self) -> PyResult<()> {
        if self.observed_with_map != self.dicts.step_maps.len() {
            for (aid, map) in self.dicts.step_maps.iter() {
                if !self.observations.contains(&aid)? {
                    map.cast::<StepMapPy>()?.borrow_mut().map.push(None);
                }
            }
        }
        Ok(())
    }

    #[inline]
    fn record(&mut self, i: usize, outcome: &AgentOutcome) -> PyResult<()> {
        let aid = self.aid(i);
        let py = aid.py();
        match self.parts[i].prepared.take() {
            Some(Prepared::Step { episode: eps, step, is_new }) => {
                let mut e = eps.borrow_mut();
                match step {
                    StepData::Rows { row, info } => {
                        self.row_steps.apply(
                            row,
                            &mut e,
                            info,
                            outcome.terminated,
                            outcome.truncated,
                            self.now,
                        )?;
                    }
                    StepData::Items(step) => {
                        e.apply_step(py, *step, outcome.terminated, outcome.truncated)?;
                    }
                }
                drop(e);
                if is_new && self.dicts.agent_episodes.get_item(aid)?.is_none() {
                    self.dicts.agent_episodes.set_item(aid, &eps)?;
                }
            }
            Some(Prepared::Join { episode: eps, reset, infos }) => {
                eps.borrow_mut().apply_reset(py, *reset, infos.as_ref())?;
                self.dicts.agent_episodes.set_item(aid, &eps)?;
            }
            Some(Prepared::Hang { action, extras }) => {
                self.dicts.hanging_actions.set_item(aid, action)?;
                self.dicts.hanging_extras.set_item(aid, extras)?;
            }
            Some(Prepared::Nothing) | None => {}
        }
        Ok(())
    }

    #[inline]
    fn push_map(&mut self, i: usize, step: Option<i64>, count: usize) -> PyResult<()> {
        let map = &mut self.map(i)?.borrow_mut().map;
        // One entry (every step of an agent) without the iterator's reserve.
        if count == 1 {
            map.push(step);
        } else {
            map.extend(std::iter::repeat_n(step, count));
        }
        Ok(())
    }

    fn set_map_lookback(&mut self, i: usize, lookback: usize) -> PyResult<()> {
        self.map(i)?.borrow_mut().map.set_lookback(lookback);
        Ok(())
    }

    fn set_t_started(&mut self, i: usize, t: i64) -> PyResult<()> {
        self.dicts.t_started.set_item(self.aid(i), t)
    }

    fn remove(&mut self, i: usize, slot: Slot) -> PyResult<()> {
        self.dicts.remove(self.aid(i), slot)
    }

    fn set_reward(&mut self, i: usize, slot: Slot, reward: f64) -> PyResult<()> {
        self.dicts.slot(slot).set_item(self.aid(i), reward)
    }

    fn add_reward(&mut self, i: usize, slot: Slot, reward: f64) -> PyResult<()> {
        self.dicts.add_reward(self.aid(i), slot, reward)
    }

    fn mark_dropped(&mut self, i: usize) -> PyResult<()> {
        self.dicts.dropped.add(self.aid(i))
    }
}

/// The books of two chunks as a [`ConcatPlan`] writes them: ours, with the other
/// chunk's read; agent `i` is `aids[i]` (`index` finds an agent's index, adding the agents
/// that only the other chunk's hanging data names).
struct ConcatDicts<'a, 'py> {
    ours: &'a Dicts<'py>,
    theirs: &'a Dicts<'py>,
    index: Bound<'py, PyDict>,
    aids: Vec<Bound<'py, PyAny>>,
}

impl<'py> ConcatDicts<'_, 'py> {
    fn index_of(&mut self, aid: Bound<'py, PyAny>) -> PyResult<usize> {
        if let Some(i) = self.index.get_item(&aid)? {
            return i.extract();
        }
        self.index.set_item(&aid, self.aids.len())?;
        self.aids.push(aid);
        Ok(self.aids.len() - 1)
    }

    /// The agent's map in `dicts`, if it has one.
    fn map(dicts: &Dicts<'py>, aid: &Bound<'py, PyAny>) -> PyResult<Option<Bound<'py, StepMapPy>>> {
        dicts.step_maps.get_item(aid)?.map(|m| m.cast_into::<StepMapPy>().map_err(Into::into)).transpose()
    }
}

impl ConcatBooks for ConcatDicts<'_, '_> {
    type Error = PyErr;

    fn adopt(&mut self, i: usize) -> PyResult<()> {
        let aid = &self.aids[i];
        self.ours.agent_episodes.set_item(aid, self.theirs.agent_episodes.as_any().get_item(aid)?)?;
        self.ours.t_started.set_item(aid, self.theirs.t_started.as_any().get_item(aid)?)
    }

    fn continue_episode(&mut self, i: usize) -> PyResult<()> {
        let aid = &self.aids[i];
        let ours = self.ours.agent_episodes.as_any().get_item(aid)?;
        let theirs = self.theirs.agent_episodes.as_any().get_item(aid)?;
        ours.call_method1(intern!(aid.py(), "concat_episode"), (theirs,))?;
        Ok(())
    }

    fn append_map(&mut self, i: usize, theirs: bool, new_steps: usize) -> PyResult<()> {
        let aid = &self.aids[i];
        let ours = self.ours.step_maps.as_any().get_item(aid)?.cast_into::<StepMapPy>()?;
        let theirs = if theirs { Self::map(self.theirs, aid)?.map(|m| m.borrow().map.clone()) } else { None };
        ours.try_borrow_mut()?.map.append_chunk(theirs.as_ref(), new_steps);
        Ok(())
    }

    fn join_map(&mut self, i: usize, new_steps: usize, steps_before: usize, lookback: usize) -> PyResult<()> {
        let aid = &self.aids[i];
        let theirs = Self::map(self.theirs, aid)?;
        let theirs = theirs.as_ref().map(Bound::borrow);
        let map = StepMap::joined(theirs.as_deref().map(|m| &m.map), new_steps, steps_before, lookback);
        self.ours.step_maps.set_item(aid, StepMapPy { map })
    }

    fn copy_end(&mut self, i: usize) -> PyResult<()> {
        let aid = &self.aids[i];
        let deepcopy = py_deepcopy(aid.py())?;
        for slot in [Slot::Action, Slot::RewardEnd, Slot::ExtraOutputs] {
            let value = self.theirs.slot(slot).as_any().get_item(aid)?;
            let value = if slot == Slot::RewardEnd { value } else { deepcopy.call1((value,))? };
            self.ours.slot(slot).set_item(aid, value)?;
        }
        Ok(())
    }

    fn remove(&mut self, i: usize, slot: Slot) -> PyResult<()> {
        self.ours.remove(&self.aids[i], slot)
    }

    fn add_reward(&mut self, i: usize, slot: Slot, reward: f64) -> PyResult<()> {
        self.ours.add_reward(&self.aids[i], slot, reward)
    }

    fn mark_dropped(&mut self, i: usize) -> PyResult<()> {
        self.ours.dropped.add(&self.aids[i])
    }
}

/// `copy.deepcopy`.
fn py_deepcopy(py: Python<'_>) -> PyResult<&Bound<'_, PyAny>> {
    static DEEPCOPY: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    DEEPCOPY.import(py, "copy", "deepcopy")
}

fn get_opt<'py>(
    d: Option<&Bound<'py, PyDict>>,
    key: &Bound<'py, PyAny>,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    match d {
        Some(d) => Ok(d.get_item(key)?.filter(|v| !v.is_none())),
        None => Ok(None),
    }
}

fn flag(d: Option<&Bound<'_, PyDict>>, key: &Bound<'_, PyAny>) -> PyResult<bool> {
    match get_opt(d, key)? {
        Some(v) => v.is_truthy(),
        None => Ok(false),
    }
}

/// `fastrollout.errors.MultiAgentEnvError` (defined in Python, next to RLlib's name for it).
pub(crate) fn multi_agent_env_error(py: Python<'_>, message: String) -> PyErr {
    static ERR: PyOnceLock<Py<pyo3::types::PyType>> = PyOnceLock::new();
    match ERR.import(py, "fastrollout.errors", "MultiAgentEnvError") {
        Ok(cls) => PyErr::from_type(cls.clone(), message),
        Err(err) => err,
    }
}

fn agent_error(agent: &Bound<'_, PyAny>, e: AgentStepError) -> PyErr {
    let who = agent.repr().map(|r| r.to_string()).unwrap_or_default();
    let message = format!("agent {who} {e}");
    match e {
        AgentStepError::ObservedWithoutActing => super::errors::EpisodeStateError::new_err(message),
        _ => multi_agent_env_error(agent.py(), message),
    }
}

/// `value` as a dict, borrowed (`None` for None).
fn dict_ref<'a, 'py>(value: Option<&'a Bound<'py, PyAny>>) -> PyResult<Option<&'a Bound<'py, PyDict>>> {
    match value {
        Some(v) if !v.is_none() => Ok(Some(v.cast::<PyDict>()?)),
        _ => Ok(None),
    }
}

/// [`dict_ref`], owned.
fn as_dict<'py>(value: Option<&Bound<'py, PyAny>>) -> PyResult<Option<Bound<'py, PyDict>>> {
    Ok(dict_ref(value)?.cloned())
}

/// What the record keeps for an agent the env step mentions: its episode, step map and
/// `agent_t_started` entry before the step, where it has them (read after the step's dicts).
#[derive(Default)]
struct Held<'py> {
    episode: Option<Bound<'py, SingleAgentEpisodePy>>,
    step_map: Option<Bound<'py, PyAny>>,
    t_started: Option<Bound<'py, PyAny>>,
}

/// One agent an env step mentions ([`Mention`]), with what the record keeps for it.
type Row<'py> = Mention<Bound<'py, PyAny>, Bound<'py, PyAny>, Held<'py>>;

/// The agents an env step mentions ([`Mentions`]).
type Rows<'py> = Mentions<Bound<'py, PyAny>, Bound<'py, PyAny>, Held<'py>>;

/// Calls `found(row, dict[row.id])` for each of `rows` whose agent `dict` holds, in row
/// order (`found` must not run Python code). The dict is walked while its keys are the
/// rows' very ids in the same order (the usual case: an episode's dicts list its agents in
/// the order its steps do), which costs about half a lookup; the rows from the first that
/// differs are looked up. Returns how many rows the walk matched (the dict's first entries).
fn read_in_dict_order<'py>(
    dict: &Bound<'py, PyDict>,
    rows: &mut [Row<'py>],
    mut found: impl FnMut(&mut Row<'py>, Bound<'py, PyAny>) -> PyResult<()>,
) -> PyResult<usize> {
    let py = dict.py();
    let mut walked = 0;
    let mut pos: pyo3::ffi::Py_ssize_t = 0;
    let (mut key, mut value) = (std::ptr::null_mut(), std::ptr::null_mut());
    // The C-API walk: only pointers are compared, without the references and size checks
    // of pyo3's iterator (no Python code runs during the walk, so the dict cannot change).
    while let Some(row) = rows.get_mut(walked) {
        // SAFETY: `dict` is a live dict and the out-pointers are valid locals; the key and
        // value it sets are borrowed references, valid while the dict is not changed.
        if unsafe { pyo3::ffi::PyDict_Next(dict.as_ptr(), &raw mut pos, &raw mut key, &raw mut value) } == 0
            || key != row.id.as_ptr()
        {
            break;
        }
        // SAFETY: `value` is a borrowed reference the dict holds (see above); a new
        // reference is taken.
        found(row, unsafe { Bound::from_borrowed_ptr(py, value) })?;
        walked += 1;
    }
    for row in &mut rows[walked..] {
        if let Some(value) = dict.get_item(&row.id)? {
            found(row, value)?;
        }
    }
    Ok(walked)
}

/// `obj` as an agent episode, its type checked once per type in a walk (`seen`: the last
/// type that passed; an episode's agents usually share one class, and the check of a
/// Python subclass walks its bases). The caller keeps the objects that passed alive, and
/// with them their types, for as long as it passes the same `seen`.
fn cast_episode<'py>(
    obj: Bound<'py, PyAny>,
    seen: &mut *mut pyo3::ffi::PyTypeObject,
) -> PyResult<Bound<'py, SingleAgentEpisodePy>> {
    let ty = obj.get_type_ptr();
    if ty == *seen {
        // SAFETY: an object of this very type (alive: the caller keeps it) passed the check
        // below, so this one is a `SingleAgentEpisodePy` too.
        return Ok(unsafe { obj.cast_into_unchecked() });
    }
    let episode = obj.cast_into::<SingleAgentEpisodePy>()?;
    *seen = ty;
    Ok(episode)
}

/// Python agent ids told apart for [`Mentions`]: by identity first (no call), then by
/// Python's key equality through a dict from id to row, made on first use.
struct PyIds<'py> {
    all: AllKey<'py>,
    index: Option<Bound<'py, PyDict>>,
}

impl<'py> AgentIds<Bound<'py, PyAny>> for PyIds<'py> {
    type Error = PyErr;

    #[inline]
    fn same(a: &Bound<'py, PyAny>, b: &Bound<'py, PyAny>) -> bool {
        a.is(b)
    }

    #[inline]
    fn is_all(&mut self, id: &Bound<'py, PyAny>) -> PyResult<bool> {
        self.all.matches(id)
    }

    #[inline(never)]
    fn find<V, H>(
        &mut self,
        rows: &[Mention<Bound<'py, PyAny>, V, H>],
        id: &Bound<'py, PyAny>,
    ) -> PyResult<Option<usize>> {
        let index = if let Some(d) = &self.index {
            d
        } else {
            let d = PyDict::new(id.py());
            for (i, r) in rows.iter().enumerate() {
                // The first row of equal keys wins, as with `dict.setdefault`.
                if !d.contains(&r.id)? {
                    d.set_item(&r.id, i)?;
                }
            }
            self.index.insert(d)
        };
        index.get_item(id)?.map(|v| v.extract::<usize>()).transpose()
    }

    fn added(&mut self, id: &Bound<'py, PyAny>, at: usize) -> PyResult<()> {
        match &self.index {
            Some(d) => d.set_item(id, at),
            None => Ok(()),
        }
    }
}

/// The key `"__all__"` with its hash, to tell agent ids from it.
struct AllKey<'py> {
    key: Bound<'py, PyAny>,
    hash: isize,
}

impl<'py> AllKey<'py> {
    fn new(py: Python<'py>) -> PyResult<Self> {
        let key = intern!(py, "__all__").clone().into_any();
        let hash = key.hash()?;
        Ok(AllKey { key, hash })
    }

    /// Whether `key` is `"__all__"` (identity, then for a `str` its cached hash and text,
    /// for an `int` no: no rich compare for the usual str and int agent ids).
    #[inline]
    fn matches(&self, key: &Bound<'_, PyAny>) -> PyResult<bool> {
        if key.is(&self.key) {
            return Ok(true);
        }
        if let Ok(s) = key.cast_exact::<PyString>() {
            // A dict key's hash is cached in the str object: reading it rules out every
            // other id (reading the text of ids as long as "__all__" cost a twentieth of
            // the record of an 8-agent step). -1: not computed yet.
            // SAFETY: `s` is an exact `str` object, whose header is a `PyASCIIObject`.
            #[cfg(not(feature = "abi3"))]
            let hash = unsafe { (*s.as_ptr().cast::<pyo3::ffi::PyASCIIObject>()).hash };
            // The stable ABI hides the field: a call.
            #[cfg(feature = "abi3")]
            let hash = s.hash()?;
            return Ok((hash == -1 || hash == self.hash) && s.to_str().is_ok_and(|s| s == "__all__"));
        }
        // Int agent ids (a rich comparison with a str each, per dict and agent, cost about a
        // twentieth of the record).
        if key.is_exact_instance_of::<PyInt>() {
            return Ok(false);
        }
        key.eq(&self.key)
    }
}

/// Records the reset observations of a `MultiAgentEpisode`'s agents in one call and sets
/// its start time: the episode must be neither done nor past env step 0; every observation
/// is checked and converted first, then all are stored (errors name the agent and leave
/// the episode unchanged).
///
/// Raises:
///     EpisodeStateError: If the episode is done or was already reset.
///     SpaceMismatchError: If an observation does not fit its agent's space.
#[pyfunction]
#[pyo3(signature = (episode, observations, infos=None))]
pub fn multi_agent_add_env_reset<'py>(
    py: Python<'py>,
    episode: &Bound<'py, MultiAgentEpisodeCore>,
    observations: &Bound<'py, PyAny>,
    infos: Option<&Bound<'py, PyAny>>,
) -> PyResult<()> {
    {
        let e = episode.try_borrow()?;
        crate::episode::multi::check_reset(e.done(), e.env_t, e.env_t_started)
            .map_err(|err| super::errors::EpisodeStateError::new_err(err.to_string()))?;
    }
    // Converted after the checks, as the Python method did.
    let observations = observations.cast::<PyDict>().map_err(|e| {
        pyo3::impl_::extract_argument::argument_extraction_error(py, "observations", e.into())
    })?;
    let infos = as_dict(infos)?;
    let EpisodeState { dicts: Dicts { agent_episodes, step_maps, .. }, compression, .. } =
        episode.try_borrow()?.state(py);
    let mut maker = None;
    let mut prepared = Vec::with_capacity(observations.len());
    for (aid, obs) in observations.iter() {
        let eps = if let Some(e) = agent_episodes.get_item(&aid)? {
            e.cast_into::<SingleAgentEpisodePy>()?
        } else {
            let maker = match &maker {
                Some(m) => m,
                None => maker.insert(AgentEpisodeMaker::new(episode.as_any())?),
            };
            maker.make_compressed(&aid, compression)?
        };
        let reset = eps.borrow().prepare_reset(&obs).map_err(|e| for_agent(py, &aid, e))?;
        let info = get_opt(infos.as_ref(), &aid)?;
        prepared.push((aid, eps, reset, info));
    }
    for (aid, eps, reset, info) in prepared {
        step_map_of(py, &step_maps, &aid)?.borrow_mut().map.push(Some(0));
        eps.borrow_mut().apply_reset(py, reset, info.as_ref())?;
        if agent_episodes.get_item(&aid)?.is_none() {
            agent_episodes.set_item(&aid, &eps)?;
        }
    }
    episode.try_borrow_mut()?.start_time = Some(perf_counter());
    Ok(())
}

/// The episode of an agent that has none yet: from the episode's `_new_agent_episode`,
/// looked up once per step (`make`) and only when an agent joins (a bound method per lookup).
#[inline(never)]
fn joining_episode<'py>(
    episode: &Bound<'py, MultiAgentEpisodeCore>,
    make: &mut Option<Bound<'py, PyAny>>,
    aid: &Bound<'py, PyAny>,
    compression: Option<usize>,
) -> PyResult<Bound<'py, SingleAgentEpisodePy>> {
    let make = match &*make {
        Some(f) => f,
        None => make.insert(episode.getattr(intern!(episode.py(), "_new_agent_episode"))?),
    };
    make_agent_episode(make, aid, compression)
}

/// A new agent episode from the episode's `_new_agent_episode` (`make`), its observations
/// compressed as the episode's (`compression`; without a space they keep the setting until
/// their first observation types them). New agent episodes are uncompressed otherwise.
fn make_agent_episode<'py>(
    make: &Bound<'py, PyAny>,
    aid: &Bound<'py, PyAny>,
    compression: Option<usize>,
) -> PyResult<Bound<'py, SingleAgentEpisodePy>> {
    let eps = make.call1((aid,))?.cast_into::<SingleAgentEpisodePy>()?;
    if compression.is_some() {
        eps.try_borrow_mut()?.set_observation_compression(compression);
    }
    Ok(eps)
}

/// `err` (from an agent episode) again, its message prefixed with the agent's id.
fn for_agent(py: Python<'_>, aid: &Bound<'_, PyAny>, err: PyErr) -> PyErr {
    let who = aid.repr().map(|r| r.to_string()).unwrap_or_default();
    with_prefix(py, &format!("agent {who}"), err)
}

/// The agent's step map, created (empty) if it has none yet.
fn step_map_of<'py>(
    py: Python<'py>,
    maps: &Bound<'py, PyDict>,
    aid: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, StepMapPy>> {
    if let Some(m) = maps.get_item(aid)? {
        return Ok(m.cast_into::<StepMapPy>()?);
    }
    let m = Bound::new(py, StepMapPy::default())?;
    maps.set_item(aid, &m)?;
    Ok(m)
}
