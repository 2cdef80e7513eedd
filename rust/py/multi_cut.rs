//! The books' part of a multi-agent episode's general `cut`: the facts the core's
//! [`plan_cut`] reads, gathered from the episode's dicts and agent episodes, and the plan
//! applied to a new episode object.

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyFloat, PySet};

use super::multi::{MultiAgentEpisodeCore, StepMapPy};
use super::single::SingleAgentEpisodePy;
use crate::episode::multi::{plan_cut, CutAgent, CutInput, CutPlan, HangingExtras};

/// An agent of the chunk that is cut, as the binding holds it.
struct Agent<'py> {
    aid: Bound<'py, PyAny>,
    episode: Bound<'py, SingleAgentEpisodePy>,
    map: Bound<'py, StepMapPy>,
}

/// The plan of `episode`'s cut keeping `lookback` env steps, with its agents; `None`
/// where there is none (the caller rebuilds). `agent_class`: the class the rebuild makes
/// agent episodes of (the plan copies each agent's own, of that class only).
fn plan<'py>(
    py: Python<'py>,
    episode: &MultiAgentEpisodeCore,
    lookback: usize,
    agent_class: &Bound<'py, PyAny>,
) -> PyResult<Option<(CutPlan, Vec<Agent<'py>>)>> {
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
    for (a, map) in agents.iter().zip(&step_maps) {
        let eps = a.episode.try_borrow()?;
        let f = eps.cut_facts();
        if f.finalized {
            // The rebuild turns numpy'd data back into lists.
            return Ok(None);
        }
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
        facts.push(CutAgent {
            map: &map.map,
            t_started: t,
            is_reset: eps.is_reset(),
            t: f.t,
            terminated: f.terminated,
            truncated: f.truncated,
            obs_lookback: f.obs_lookback,
            obs_total: f.obs_total,
            infos_total: f.infos_total,
            actions_total: f.actions_total,
            rewards_total: f.rewards_total,
            extra_totals: f.extra_totals,
            has_module: a.episode.getattr(intern!(py, "module_id"))?.is_truthy()?,
            hanging_action: hanging_actions.get_item(&a.aid)?.is_some_and(|v| !v.is_none()),
            hanging_extras: extras,
            hanging_reward: reward,
        });
    }
    let plan = plan_cut(&CutInput { agents: facts, set_order, lookback });
    drop(step_maps);
    Ok(plan.map(|p| (p, agents)))
}

/// The agent's hanging value of `field` (`key`) as the rebuild reads it: appended to the
/// agent's field (converted as its items are).
fn read_hanging<'py>(
    eps: &Bound<'py, SingleAgentEpisodePy>,
    field: &str,
    key: Option<&str>,
    value: &Bound<'py, PyAny>,
    at: Option<usize>,
) -> PyResult<Bound<'py, PyAny>> {
    let py = eps.py();
    let len = match at {
        Some(at) => at.into_pyobject(py)?.into_any(),
        None => eps.call_method1(intern!(py, "_field_len"), (field, key))?,
    };
    eps.call_method1(intern!(py, "_get_ext"), (field, key, len, true, py.None(), false, value, false))
}

impl MultiAgentEpisodeCore {
    /// Fills `successor` (a new episode object) as the plan of this episode's cut says;
    /// `false`, with nothing written, where there is no plan.
    pub(crate) fn cut_into(
        &self,
        successor: &Bound<'_, MultiAgentEpisodeCore>,
        lookback: usize,
    ) -> PyResult<bool> {
        let py = successor.py();
        let agent_class = successor.getattr(intern!(py, "_agent_episode_cls"))?;
        let Some((plan, agents)) = plan(py, self, lookback, &agent_class)? else { return Ok(false) };
        {
            let mut s = successor.try_borrow_mut()?;
            s.env_t = self.env_t;
            s.env_t_started = self.env_t;
            s.len_lookback_buffers = plan.len_lookback_buffers;
            s.hanging_rewards_begin = self
                .hanging_rewards_end
                .bind(py)
                .call_method0(intern!(py, "copy"))?
                .cast_into::<PyDict>()?
                .unbind();
        }
        let s = successor.try_borrow()?;
        let aid = |i: usize| &agents[i].aid;
        let our_t_started = self.agent_t_started.bind(py);
        for &i in &plan.t_started_read {
            our_t_started.set_item(aid(i), 0)?;
        }
        let episodes = s.agent_episodes.bind(py);
        for cut in &plan.agents {
            let old = &agents[cut.agent].episode;
            let new = old.call_method0(intern!(py, "_successor"))?.cast_into::<SingleAgentEpisodePy>()?;
            old.try_borrow()?.select_rows_into(&new, cut)?;
            episodes.set_item(aid(cut.agent), new)?;
        }
        let maps = s.env_t_to_agent_t.bind(py);
        for (i, map) in plan.maps {
            maps.set_item(aid(i), StepMapPy { map })?;
        }
        let t_started = s.agent_t_started.bind(py);
        for &(i, t) in &plan.t_started {
            t_started.set_item(aid(i), t)?;
        }
        let (our_actions, our_extras) =
            (self.hanging_actions_end.bind(py), self.hanging_extra_model_outputs_end.bind(py));
        let (actions, extras) = (s.hanging_actions_end.bind(py), s.hanging_extra_model_outputs_end.bind(py));
        for &i in &plan.hanging {
            let (a, eps) = (aid(i), &agents[i].episode);
            let action = our_actions.as_any().get_item(a)?;
            actions.set_item(a, read_hanging(eps, "actions", None, &action, None)?)?;
            // The outputs of the keys the agent stores (or, storing none, of those that
            // hang), each read as appended to its field.
            let outputs = PyDict::new(py);
            if let Some(theirs) = our_extras.get_item(a)?.filter(|h| !h.is_none()) {
                let mut keys: Vec<String> = eps.try_borrow()?.extra_key_names().map(str::to_owned).collect();
                let stored = !keys.is_empty();
                if !stored && theirs.is_truthy()? {
                    keys = theirs.cast::<PyDict>()?.keys().extract()?;
                }
                for key in keys {
                    let value = theirs.get_item(&key)?;
                    let at = if stored { None } else { Some(0) };
                    outputs
                        .set_item(&key, read_hanging(eps, "extra_model_outputs", Some(&key), &value, at)?)?;
                }
            }
            extras.set_item(a, outputs)?;
        }
        let rewards = s.hanging_rewards_end.bind(py);
        for &(i, r) in &plan.hanging_rewards {
            rewards.set_item(aid(i), r)?;
        }
        drop(s);
        let modules = PyDict::new(py);
        for &i in &plan.modules {
            modules.set_item(aid(i), agents[i].episode.getattr(intern!(py, "module_id"))?)?;
        }
        successor.setattr(intern!(py, "_agent_to_module_mapping"), modules)?;
        Ok(true)
    }
}
