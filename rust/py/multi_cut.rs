//! The books' part of a multi-agent episode's `cut` and `slice`: the facts the core's
//! [`plan_simultaneous_cut`] (a simultaneous chunk's cut, tried first), [`plan_cut`] and
//! [`plan_slice`] read, gathered from the episode's dicts and agent episodes, and the plan
//! applied to a new episode object.

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyFloat, PySet, PyTuple, PyType};

use super::multi::{MultiAgentEpisodeCore, StepMapPy};
use super::single::SingleAgentEpisodePy;
use crate::episode::multi::{
    plan_cut, plan_simultaneous_cut, plan_slice, ActionSource, CutAgent, CutInput, CutPart, CutPlan,
    HangingExtras, OutputKeys, RewardSum, SimultaneousAgent, SimultaneousInput, SliceInput, StepMap,
};

/// An agent of the chunk, as the binding holds it.
struct Agent<'py> {
    aid: Bound<'py, PyAny>,
    episode: Bound<'py, SingleAgentEpisodePy>,
    map: Bound<'py, StepMapPy>,
}

/// A plan and the agents it numbers.
type Planned<'py> = (CutPlan, Vec<Agent<'py>>);

/// What a plan is made for.
enum Ask {
    Cut { lookback: usize },
    Slice { start: usize, stop: usize, lookback: usize },
}

/// The plan for `episode`, with its agents; `None` where there is none (the caller
/// rebuilds). `agent_class`: the class the rebuild makes agent episodes of (the plan
/// copies each agent's own, of that class only). `modules`: the module mapping the
/// rebuild takes module ids from (`None`: each agent episode's).
fn plan<'py>(
    py: Python<'py>,
    episode: &MultiAgentEpisodeCore,
    ask: &Ask,
    agent_class: &Bound<'py, PyAny>,
    modules: Option<&Bound<'py, PyDict>>,
) -> PyResult<Option<Planned<'py>>> {
    let episodes = episode.agent_episodes.bind(py);
    let maps = episode.env_t_to_agent_t.bind(py);
    let mut agents = Vec::with_capacity(episodes.len());
    for (aid, eps) in episodes.iter() {
        if !eps.get_type().is(agent_class) {
            return Ok(None);
        }
        let Ok(eps) = eps.cast_into::<SingleAgentEpisodePy>() else { return Ok(None) };
        let Some(map) = maps.get_item(&aid)? else { return Ok(None) };
        let Ok(map) = map.cast_into::<StepMapPy>() else { return Ok(None) };
        agents.push(Agent { aid, episode: eps, map });
    }
    let index = PyDict::new(py);
    for (i, a) in agents.iter().enumerate() {
        index.set_item(&a.aid, i)?;
    }
    // The rebuild walks the agents in the order of `set(agent_episode_ids)`.
    let set_order = py
        .get_type::<PySet>()
        .call1((episodes,))?
        .try_iter()?
        .map(|aid| index.as_any().get_item(aid?)?.extract::<usize>())
        .collect::<PyResult<Vec<_>>>()?;
    let t_started = episode.agent_t_started.bind(py);
    let hanging_actions = episode.hanging_actions_end.bind(py);
    let hanging_extras = episode.hanging_extra_model_outputs_end.bind(py);
    let rewards_end = episode.hanging_rewards_end.bind(py);
    let step_maps: Vec<PyRef<'_, StepMapPy>> =
        agents.iter().map(|a| a.map.try_borrow()).collect::<Result<_, _>>()?;
    let mut facts = Vec::with_capacity(agents.len());
    let mut lengths = Vec::with_capacity(agents.len());
    for (a, map) in agents.iter().zip(&step_maps) {
        let eps = a.episode.try_borrow()?;
        if eps.any_finalized() {
            // The rebuild turns numpy'd data back into lists.
            return Ok(None);
        }
        lengths.push(eps.chunk_len());
        let t = match t_started.get_item(&a.aid)? {
            None => None,
            Some(t) => match t.extract::<i64>() {
                Ok(t) => Some(t),
                Err(_) => return Ok(None),
            },
        };
        let extras = match hanging_extras.get_item(&a.aid)? {
            None => HangingExtras::Absent,
            Some(v) if v.is_none() => HangingExtras::Absent,
            Some(v) if !v.is_truthy()? => HangingExtras::Empty,
            Some(v) => {
                let Ok(v) = v.cast_into::<PyDict>() else { return Ok(None) };
                let mut all_keys = true;
                for key in eps.extra_key_names() {
                    all_keys &= v.contains(key)?;
                }
                HangingExtras::Holds { all_keys }
            }
        };
        let reward = match rewards_end.get_item(&a.aid)? {
            None => None,
            Some(v) if v.is_none() => None,
            Some(v) => match v.cast_exact::<PyFloat>() {
                Ok(r) => Some(r.value()),
                Err(_) => return Ok(None),
            },
        };
        let module = match modules {
            Some(m) => m.get_item(&a.aid)?,
            None => Some(a.episode.getattr(intern!(py, "module_id"))?),
        };
        facts.push(CutAgent {
            map: &map.map,
            t_started: t,
            is_reset: eps.is_reset(),
            episode: eps.sizes(),
            has_module: module.map(|m| m.is_truthy()).transpose()?.unwrap_or(false),
            hanging_action: hanging_actions.get_item(&a.aid)?.is_some_and(|v| !v.is_none()),
            hanging_extras: extras,
            hanging_reward: reward,
        });
    }
    let planned = match *ask {
        Ask::Cut { lookback } => {
            plan_cut(&CutInput { agents: facts, set_order, lookback, env_t: episode.env_t })
        }
        Ask::Slice { start, stop, lookback } => plan_slice(&SliceInput {
            agents: facts,
            set_order,
            env_t_started: episode.env_t_started,
            start,
            stop,
            lookback,
            lengths,
        }),
    };
    drop(step_maps);
    Ok(planned.map(|p| (p, agents)))
}

/// The empty hanging reward the rebuild leaves each agent that finished before the kept
/// env steps (`parts`: [`CutPart::Gone`]), in the order in which it visits the set of
/// agent ids (`episodes`' keys).
fn gone_rewards<'py>(
    episodes: &Bound<'py, PyDict>,
    agents: &[(Bound<'py, PyAny>, Bound<'py, SingleAgentEpisodePy>)],
    parts: &[CutPart],
    rewards_end: &Bound<'py, PyDict>,
) -> PyResult<()> {
    let py = episodes.py();
    for aid in py.get_type::<PySet>().call1((episodes,))?.try_iter()? {
        let aid = aid?;
        let mut gone = false;
        for ((a, _), part) in agents.iter().zip(parts) {
            if a.eq(&aid)? {
                gone = *part == CutPart::Gone;
                break;
            }
        }
        if gone {
            let old = rewards_end.get_item(&aid)?.map(|v| v.extract::<f64>()).transpose()?.unwrap_or(0.0);
            rewards_end.set_item(&aid, old + 0.0)?;
        }
    }
    Ok(())
}

/// Whether `d` is a `collections.defaultdict` (exactly) whose factory is `float`.
fn is_float_defaultdict(d: &Bound<'_, PyDict>) -> PyResult<bool> {
    static DEFAULTDICT: PyOnceLock<Py<PyType>> = PyOnceLock::new();
    let py = d.py();
    Ok(d.get_type().is(DEFAULTDICT.import(py, "collections", "defaultdict")?)
        && d.getattr(intern!(py, "default_factory"))?.is(py.get_type::<PyFloat>()))
}

/// A new object of `cls` from its `tp_new` without arguments: `cls.__new__(cls)` without
/// the attribute lookup and the call through `__new__`'s wrapper.
pub(crate) fn new_object<'py>(cls: &Bound<'py, PyType>) -> PyResult<Bound<'py, PyAny>> {
    let py = cls.py();
    let args = PyTuple::empty(py);
    // SAFETY: `cls` is a live type object; `Py_tp_new` is a slot every instantiable type
    // has (readable with `PyType_GetSlot` for static types since Python 3.10), a `newfunc`.
    unsafe {
        let slot = pyo3::ffi::PyType_GetSlot(cls.as_type_ptr(), pyo3::ffi::Py_tp_new);
        if slot.is_null() {
            return Err(pyo3::exceptions::PyTypeError::new_err(format!(
                "cannot create '{}' instances",
                cls.name()?
            )));
        }
        let new: pyo3::ffi::newfunc = std::mem::transmute(slot);
        Bound::from_owned_ptr_or_err(py, new(cls.as_type_ptr(), args.as_ptr(), std::ptr::null_mut()))
    }
}

/// Item `index` (with `neg_index_as_lookback`) of the agent's `field` (`key`) as the
/// rebuild reads it, `add_last` appended to the field (converted as its items are).
fn read_item<'py>(
    eps: &Bound<'py, SingleAgentEpisodePy>,
    field: &str,
    key: Option<&str>,
    index: i64,
    add_last: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    eps.try_borrow_mut()?.read_item(eps.py(), field, key, index, add_last)
}

/// The index (with `neg_index_as_lookback`) of the agent's `field` (`key`) that reads its
/// row `row` (absolute), or with `None` the item appended after its items.
fn index_of(
    eps: &Bound<'_, SingleAgentEpisodePy>,
    field: &str,
    key: Option<&str>,
    row: Option<usize>,
) -> PyResult<i64> {
    Ok(eps.try_borrow()?.field_geometry(field, key)?.index_of(row))
}

impl MultiAgentEpisodeCore {
    /// The successor of `slf` (this episode) that keeps `lookback` env steps, on the
    /// simultaneous path ([`plan_simultaneous_cut`]); `None`, with nothing made, where
    /// the path does not apply.
    pub(crate) fn simultaneous_successor<'py>(
        &self,
        slf: &Bound<'py, MultiAgentEpisodeCore>,
        lookback: usize,
    ) -> PyResult<Option<Bound<'py, MultiAgentEpisodeCore>>> {
        let py = slf.py();
        let episodes = self.agent_episodes.bind(py);
        let maps = self.env_t_to_agent_t.bind(py);
        let hanging = !self.hanging_actions_end.bind(py).is_empty()
            || !self.hanging_extra_model_outputs_end.bind(py).is_empty();
        if episodes.is_empty() || hanging {
            return Ok(None);
        }
        let mut agents = Vec::with_capacity(episodes.len());
        let mut step_maps = Vec::with_capacity(episodes.len());
        for (aid, eps) in episodes.iter() {
            let Ok(eps) = eps.cast_into::<SingleAgentEpisodePy>() else { return Ok(None) };
            let map = match maps.get_item(&aid)? {
                None => None,
                Some(m) => match m.cast_into::<StepMapPy>() {
                    Ok(m) => Some(m),
                    Err(_) => return Ok(None),
                },
            };
            step_maps.push(map);
            agents.push((aid, eps));
        }
        let borrowed: Vec<Option<PyRef<'_, StepMapPy>>> = step_maps
            .iter()
            .map(|m| m.as_ref().map(Bound::try_borrow).transpose())
            .collect::<Result<_, _>>()?;
        let mut facts = Vec::with_capacity(agents.len());
        let mut module_ids = Vec::with_capacity(agents.len());
        for ((_, eps), map) in agents.iter().zip(&borrowed) {
            let (done, numpy, has_extra_keys) = {
                let e = eps.try_borrow()?;
                let has_extra_keys = e.extra_key_names().next().is_some();
                (e.done(), e.any_finalized(), has_extra_keys)
            };
            // The module id is read only where the rest allows the path.
            let module =
                if map.is_some() && !numpy { Some(eps.getattr(intern!(py, "module_id"))?) } else { None };
            let has_module = module.as_ref().map(PyAnyMethods::is_truthy).transpose()?.unwrap_or(false);
            module_ids.push(module);
            facts.push(SimultaneousAgent {
                map: map.as_ref().map(|m| &m.map),
                done,
                numpy,
                has_module,
                has_extra_keys,
            });
        }
        let parts = plan_simultaneous_cut(&SimultaneousInput {
            agents: facts,
            maps: maps.len(),
            hanging,
            lookback,
            env_steps: self.env_t - self.env_t_started,
        });
        drop(borrowed);
        let Some(parts) = parts else { return Ok(None) };

        let successor = new_object(&slf.get_type())?.cast_into::<MultiAgentEpisodeCore>()?;
        let modules = PyDict::new(py);
        for (((aid, eps), part), module) in agents.iter().zip(&parts).zip(module_ids) {
            if *part != CutPart::Dropped {
                let module = match module {
                    Some(m) => m,
                    None => eps.getattr(intern!(py, "module_id"))?,
                };
                modules.set_item(aid, module)?;
            }
        }
        successor.setattr(intern!(py, "_agent_to_module_mapping"), modules)?;
        let rewards_end = {
            let mut s = successor.try_borrow_mut()?;
            s.len_lookback_buffers = lookback;
            (s.env_t_started, s.env_t) = (self.env_t, self.env_t);
            self.set_successor_begin_rewards(py, &mut s)?;
            s.hanging_rewards_end.clone_ref(py)
        };
        let s = successor.try_borrow()?;
        let (new_episodes, new_t_started, new_maps) =
            (s.agent_episodes.bind(py), s.agent_t_started.bind(py), s.env_t_to_agent_t.bind(py));
        for ((aid, eps), part) in agents.iter().zip(&parts) {
            let CutPart::Keep { finished_now } = *part else { continue };
            let agent = eps.call_method0(intern!(py, "_successor"))?.cast_into::<SingleAgentEpisodePy>()?;
            // An agent that finished now is cut as live and keeps its flags.
            eps.try_borrow_mut()?.cut_into(py, &agent, lookback, finished_now)?;
            let t = agent.try_borrow()?.t_started();
            new_episodes.set_item(aid, &agent)?;
            new_t_started.set_item(aid, t)?;
            new_maps.set_item(aid, StepMapPy { map: StepMap::run(t, lookback) })?;
        }
        if parts.contains(&CutPart::Gone) {
            gone_rewards(episodes, &agents, &parts, rewards_end.bind(py))?;
        }
        drop(s);
        Ok(Some(successor))
    }

    /// Fills `successor` (a new episode object) with this episode's cut that keeps
    /// `lookback` env steps as the core's plan says; `false`, with nothing written,
    /// where there is no plan.
    pub(crate) fn cut_into(
        &self,
        successor: &Bound<'_, MultiAgentEpisodeCore>,
        lookback: usize,
    ) -> PyResult<bool> {
        let py = successor.py();
        let agent_class = successor.getattr(intern!(py, "_agent_episode_cls"))?;
        let Some((plan, agents)) = plan(py, self, &Ask::Cut { lookback }, &agent_class, None)? else {
            return Ok(false);
        };
        {
            let mut s = successor.try_borrow_mut()?;
            s.set_counters(&plan);
            s.hanging_rewards_begin = self.successor_begin_rewards(py)?;
        }
        let modules = PyDict::new(py);
        for (i, a) in agents.iter().enumerate() {
            if !plan.gone.contains(&i) {
                modules.set_item(&a.aid, a.episode.getattr(intern!(py, "module_id"))?)?;
            }
        }
        self.apply(successor, &plan, &agents)?;
        successor.setattr(intern!(py, "_agent_to_module_mapping"), modules)?;
        Ok(true)
    }

    /// Fills `sliced` (a new episode object) with this episode's env steps `start:stop`
    /// (resolved) and `lookback` env steps before them, as the core's plan says; `false`,
    /// with nothing written, where there is no plan.
    pub(crate) fn slice_into(
        &self,
        sliced: &Bound<'_, MultiAgentEpisodeCore>,
        start: usize,
        stop: usize,
        lookback: usize,
        modules: &Bound<'_, PyDict>,
    ) -> PyResult<bool> {
        let py = sliced.py();
        let agent_class = sliced.getattr(intern!(py, "_agent_episode_cls"))?;
        let ask = Ask::Slice { start, stop, lookback };
        let Some((plan, agents)) = plan(py, self, &ask, &agent_class, Some(modules))? else {
            return Ok(false);
        };
        sliced.try_borrow_mut()?.set_counters(&plan);
        let mapping = modules.copy()?;
        for &i in &plan.gone {
            if mapping.contains(&agents[i].aid)? {
                mapping.del_item(&agents[i].aid)?;
            }
        }
        self.apply(sliced, &plan, &agents)?;
        // The agents' module ids are the mapping's (their episodes' may differ).
        for cut in &plan.agents {
            let aid = &agents[cut.agent].aid;
            let module = modules.as_any().get_item(aid)?;
            sliced
                .borrow()
                .agent_episodes
                .bind(py)
                .as_any()
                .get_item(aid)?
                .setattr(intern!(py, "module_id"), module)?;
        }
        sliced.setattr(intern!(py, "_agent_to_module_mapping"), mapping)?;
        Ok(true)
    }

    /// The begin rewards of this chunk's successor: a copy of what hangs at its end (the
    /// dict's own `copy`, so a defaultdict stays one).
    fn successor_begin_rewards(&self, py: Python<'_>) -> PyResult<Py<PyDict>> {
        let end = self.hanging_rewards_end.bind(py);
        Ok(end.call_method0(intern!(py, "copy"))?.cast_into::<PyDict>()?.unbind())
    }

    /// Sets `successor`'s begin rewards (a new episode object's, an empty
    /// `defaultdict(float)`) to a copy of what hangs at this chunk's end: its own where
    /// that is an empty `defaultdict(float)` too (the copy would be one).
    fn set_successor_begin_rewards(
        &self,
        py: Python<'_>,
        successor: &mut MultiAgentEpisodeCore,
    ) -> PyResult<()> {
        let end = self.hanging_rewards_end.bind(py);
        if end.is_empty()
            && is_float_defaultdict(end)?
            && is_float_defaultdict(successor.hanging_rewards_begin.bind(py))?
        {
            return Ok(());
        }
        successor.hanging_rewards_begin = self.successor_begin_rewards(py)?;
        Ok(())
    }

    /// Sets the new chunk's counters, flags and look-back from `plan`.
    fn set_counters(&mut self, plan: &CutPlan) {
        let c = plan.counters;
        (self.env_t_started, self.env_t, self.is_terminated, self.is_truncated) =
            (c.env_t_started, c.env_t, c.is_terminated, c.is_truncated);
        self.len_lookback_buffers = plan.len_lookback_buffers;
    }

    /// Writes the plan's books into `target`: each agent's episode of its rows, the
    /// env-step maps, `agent_t_started` and what hangs at the end (read from rows or
    /// from what hangs at this chunk's end); the agents the reads gave an
    /// `agent_t_started` entry get theirs here too.
    fn apply<'py>(
        &self,
        target: &Bound<'py, MultiAgentEpisodeCore>,
        plan: &CutPlan,
        agents: &[Agent<'py>],
    ) -> PyResult<()> {
        let py = target.py();
        let aid = |i: usize| &agents[i].aid;
        let our_t_started = self.agent_t_started.bind(py);
        for &i in &plan.t_started_read {
            our_t_started.set_item(aid(i), 0)?;
        }
        let s = target.try_borrow()?;
        let episodes = s.agent_episodes.bind(py);
        for cut in &plan.agents {
            let old = &agents[cut.agent].episode;
            let new = old.call_method0(intern!(py, "_successor"))?.cast_into::<SingleAgentEpisodePy>()?;
            old.try_borrow()?.select_rows_into(&new, cut)?;
            episodes.set_item(aid(cut.agent), new)?;
        }
        let maps = s.env_t_to_agent_t.bind(py);
        for (i, map) in &plan.maps {
            maps.set_item(aid(*i), StepMapPy { map: map.clone() })?;
        }
        let t_started = s.agent_t_started.bind(py);
        for &(i, t) in &plan.t_started {
            t_started.set_item(aid(i), t)?;
        }
        let (our_actions, our_extras) =
            (self.hanging_actions_end.bind(py), self.hanging_extra_model_outputs_end.bind(py));
        let (actions, extras) = (s.hanging_actions_end.bind(py), s.hanging_extra_model_outputs_end.bind(py));
        for &(i, source) in &plan.hanging {
            let (a, eps) = (aid(i), &agents[i].episode);
            let row = match source {
                ActionSource::Row(p) => Some(p),
                ActionSource::Hanging => None,
            };
            let hanging = |d: &Bound<'py, PyDict>| -> PyResult<Option<Bound<'py, PyAny>>> {
                Ok(if row.is_some() { None } else { d.get_item(a)?.filter(|h| !h.is_none()) })
            };
            let action = hanging(our_actions)?;
            actions.set_item(
                a,
                read_item(eps, "actions", None, index_of(eps, "actions", None, row)?, action.as_ref())?,
            )?;
            let outputs = PyDict::new(py);
            let stored: Vec<String> = eps.try_borrow()?.extra_key_names().map(str::to_owned).collect();
            let theirs = hanging(our_extras)?.filter(|h| h.is_truthy().unwrap_or(false));
            match source.output_keys(!stored.is_empty(), theirs.is_some()) {
                OutputKeys::Stored => {
                    for key in &stored {
                        let value = theirs.as_ref().map(|h| h.get_item(key)).transpose()?;
                        let index = index_of(eps, "extra_model_outputs", Some(key), row)?;
                        outputs.set_item(
                            key,
                            read_item(eps, "extra_model_outputs", Some(key), index, value.as_ref())?,
                        )?;
                    }
                }
                OutputKeys::Hanging => {
                    let theirs = theirs.as_ref().map(|h| h.cast::<PyDict>()).transpose()?;
                    for (key, value) in theirs.into_iter().flat_map(PyDictMethods::iter) {
                        let key: String = key.extract()?;
                        outputs.set_item(
                            &key,
                            read_item(eps, "extra_model_outputs", Some(&key), 0, Some(&value))?,
                        )?;
                    }
                }
                OutputKeys::None => {}
            }
            extras.set_item(a, outputs)?;
        }
        let rewards = s.hanging_rewards_end.bind(py);
        for &(i, sum) in &plan.hanging_rewards {
            let value = match sum {
                RewardSum::Known(x) => PyFloat::new(py, x).into_any(),
                RewardSum::Row(p) => {
                    let eps = &agents[i].episode;
                    let reward =
                        read_item(eps, "rewards", None, index_of(eps, "rewards", None, Some(p))?, None)?;
                    PyFloat::new(py, 0.0).add(reward)?
                }
            };
            rewards.set_item(aid(i), value)?;
        }
        Ok(())
    }
}
