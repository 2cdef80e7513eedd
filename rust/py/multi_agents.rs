//! The episodes of agents that observe for the first time in a multi-agent chunk, made
//! with what the chunk's episode holds (its declared agents, agent episode class, spaces,
//! module mapping and id) read once per reset or env step instead of once per agent.
//!
//! Agents with the same spaces copy one blank episode's layouts instead of reading them
//! from the spaces again (about 10 µs per agent and chunk): the blanks are kept here, per
//! agent episode class and spaces, the oldest dropped past [`MAX_BLANKS`].

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyList, PyString, PyTuple};

use super::multi::multi_agent_env_error;
use super::single::SingleAgentEpisodePy;

/// Blank agent episodes kept at most.
const MAX_BLANKS: usize = 64;

/// (agent episode class, id of the observation space, id of the action space) -> a blank
/// agent episode with those spaces (it holds them, so the ids stay theirs), oldest first.
fn blanks(py: Python<'_>) -> &Bound<'_, PyDict> {
    static BLANKS: PyOnceLock<Py<PyDict>> = PyOnceLock::new();
    BLANKS.get_or_init(py, || PyDict::new(py).unbind()).bind(py)
}

/// What makes a multi-agent episode's new agent episodes (its `_new_agent_episode`).
pub(crate) struct AgentEpisodeMaker<'py> {
    episode: Bound<'py, PyAny>,
    /// The env's declared agents (`_declared_agents`), if any.
    declared: Option<Bound<'py, PyAny>>,
    /// `_agent_episode_cls`, and whether it has a constructor of its own (which then
    /// runs for every agent).
    class: Bound<'py, PyAny>,
    own_init: bool,
    /// Whether the class makes its blank copies with `SingleAgentEpisode._blank_like`
    /// (done here then, without the Python call), and its successors with
    /// `SingleAgentEpisode._successor` (both then in one call, `_blank_for_agent`).
    base_blank_like: bool,
    base_successor: bool,
    observation_spaces: Bound<'py, PyAny>,
    action_spaces: Bound<'py, PyAny>,
    /// `_agent_to_module_mapping` and the mapping function, where the episode's
    /// `module_for` is `MultiAgentEpisode.module_for` and the mapping a dict (that method
    /// is then done here, without the Python call; `None`: it is called).
    modules: Option<(Bound<'py, PyDict>, Bound<'py, PyAny>)>,
    id: Bound<'py, PyAny>,
}

/// `name` of `class` is the same object as `name` of `base` (a method not overridden).
fn inherited(
    class: &Bound<'_, PyAny>,
    base: &Bound<'_, PyAny>,
    name: &Bound<'_, PyString>,
) -> PyResult<bool> {
    Ok(class.getattr(name)?.is(&base.getattr(name)?))
}

impl<'py> AgentEpisodeMaker<'py> {
    /// The maker of `episode`'s new agent episodes.
    pub(crate) fn new(episode: &Bound<'py, PyAny>) -> PyResult<Self> {
        static SINGLE: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
        static MULTI: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
        let py = episode.py();
        let single = SINGLE.import(py, "fastrollout.episodes.single_agent_episode", "SingleAgentEpisode")?;
        let multi = MULTI.import(py, "fastrollout.episodes.multi_agent_episode", "MultiAgentEpisode")?;
        let class = episode.getattr(intern!(py, "_agent_episode_cls"))?;
        let modules = if inherited(&episode.get_type(), multi, intern!(py, "module_for"))? {
            let mapping =
                episode.getattr(intern!(py, "_agent_to_module_mapping"))?.cast_into::<PyDict>().ok();
            mapping
                .map(|m| Ok::<_, PyErr>((m, episode.getattr(intern!(py, "agent_to_module_mapping_fn"))?)))
                .transpose()?
        } else {
            None
        };
        Ok(AgentEpisodeMaker {
            declared: Some(episode.getattr(intern!(py, "_declared_agents"))?).filter(|d| !d.is_none()),
            own_init: !inherited(&class, single, intern!(py, "__init__"))?,
            base_blank_like: inherited(&class, single, intern!(py, "_blank_like"))?,
            base_successor: inherited(&class, single, intern!(py, "_successor"))?
                && inherited(&class, single, intern!(py, "_blank_for_agent"))?,
            class,
            observation_spaces: episode.getattr(intern!(py, "observation_space"))?,
            action_spaces: episode.getattr(intern!(py, "action_space"))?,
            modules,
            id: episode.getattr(intern!(py, "id_"))?,
            episode: episode.clone(),
        })
    }

    /// The new (empty) episode of `aid`, its observations compressed in blocks of
    /// `compression` items (`None`: uncompressed).
    pub(crate) fn make_compressed(
        &self,
        aid: &Bound<'py, PyAny>,
        compression: Option<usize>,
    ) -> PyResult<Bound<'py, SingleAgentEpisodePy>> {
        let eps = self.make(aid)?;
        if compression.is_some() {
            eps.try_borrow_mut()?.set_observation_compression(compression);
        }
        Ok(eps)
    }

    /// The new (empty) episode of `aid`; `MultiAgentEnvError` if the episode has declared
    /// agents and `aid` is not among them.
    pub(crate) fn make(&self, aid: &Bound<'py, PyAny>) -> PyResult<Bound<'py, SingleAgentEpisodePy>> {
        let py = aid.py();
        if let Some(declared) = &self.declared {
            if !declared.contains(aid)? {
                let listed = py.get_type::<PyList>().call1((declared,))?;
                return Err(multi_agent_env_error(
                    py,
                    format!(
                        "the env returned an observation for agent {}, which is not one of its \
                         possible_agents {}: list every agent the env may return data for in \
                         possible_agents",
                        aid.repr()?,
                        listed.str()?
                    ),
                ));
            }
        }
        let obs_space = space_of(&self.observation_spaces, aid)?;
        let act_space = space_of(&self.action_spaces, aid)?;
        if self.own_init {
            // A subclass's own constructor runs for every agent.
            let kwargs = PyDict::new(py);
            kwargs.set_item(intern!(py, "agent_id"), aid)?;
            kwargs.set_item(intern!(py, "module_id"), self.module(aid)?)?;
            kwargs.set_item(intern!(py, "multi_agent_episode_id"), &self.id)?;
            kwargs.set_item(intern!(py, "observation_space"), &obs_space)?;
            kwargs.set_item(intern!(py, "action_space"), &act_space)?;
            return Ok(self.class.call((), Some(&kwargs))?.cast_into::<SingleAgentEpisodePy>()?);
        }
        let blank = self.blank(&obs_space, &act_space)?;
        if self.base_blank_like && self.base_successor {
            // `_blank_like` with the agent's identity, in one Python call (its slots are
            // cheaper to set there than with attribute calls from here).
            let args = (super::ids::next_id(py)?, aid, self.module(aid)?, &self.id);
            return Ok(blank.call_method1(intern!(py, "_blank_for_agent"), args)?.cast_into()?);
        }
        let episode = if self.base_blank_like {
            // `SingleAgentEpisode._blank_like`: its successor, with a new id and its layouts.
            let episode =
                blank.call_method0(intern!(py, "_successor"))?.cast_into::<SingleAgentEpisodePy>()?;
            episode.setattr(intern!(py, "id_"), super::ids::next_id(py)?)?;
            blank.cast::<SingleAgentEpisodePy>()?.try_borrow()?.blank_into(&episode)?;
            episode.into_any()
        } else {
            blank.call_method0(intern!(py, "_blank_like"))?
        };
        episode.setattr(intern!(py, "agent_id"), aid)?;
        episode.setattr(intern!(py, "module_id"), self.module(aid)?)?;
        episode.setattr(intern!(py, "multi_agent_episode_id"), &self.id)?;
        Ok(episode.cast_into::<SingleAgentEpisodePy>()?)
    }

    /// The kept blank episode of the class with these spaces (made and kept if there is
    /// none).
    fn blank(
        &self,
        obs_space: &Bound<'py, PyAny>,
        act_space: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = obs_space.py();
        let key = PyTuple::new(
            py,
            [self.class.clone(), (obs_space.as_ptr() as usize).into_pyobject(py)?.into_any(), {
                (act_space.as_ptr() as usize).into_pyobject(py)?.into_any()
            }],
        )?;
        let blanks = blanks(py);
        if let Some(blank) = blanks.get_item(&key)? {
            if blank.getattr(intern!(py, "_observation_space"))?.is(obs_space)
                && blank.getattr(intern!(py, "_action_space"))?.is(act_space)
            {
                return Ok(blank);
            }
        }
        let kwargs = PyDict::new(py);
        kwargs.set_item(intern!(py, "observation_space"), obs_space)?;
        kwargs.set_item(intern!(py, "action_space"), act_space)?;
        let blank = self.class.call((), Some(&kwargs))?;
        if blanks.len() >= MAX_BLANKS {
            if let Some((oldest, _)) = blanks.iter().next() {
                blanks.del_item(oldest)?;
            }
        }
        blanks.set_item(key, &blank)?;
        Ok(blank)
    }

    /// The module of `aid` (the episode's `module_for`: the mapping function runs once
    /// per agent).
    fn module(&self, aid: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let Some((mapping, mapping_fn)) = &self.modules else {
            return self.episode.call_method1(intern!(aid.py(), "module_for"), (aid,));
        };
        if let Some(module) = mapping.get_item(aid)? {
            return Ok(module);
        }
        let module = mapping_fn.call1((aid, &self.episode))?;
        mapping.set_item(aid, &module)?;
        Ok(module)
    }
}

/// The space of `aid` in an episode's spaces (their `get`; a dict's directly).
fn space_of<'py>(spaces: &Bound<'py, PyAny>, aid: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    match spaces.cast_exact::<PyDict>() {
        Ok(d) => Ok(d.get_item(aid)?.unwrap_or_else(|| aid.py().None().into_bound(aid.py()))),
        Err(_) => spaces.call_method1(intern!(aid.py(), "get"), (aid,)),
    }
}
