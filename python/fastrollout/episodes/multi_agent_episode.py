"""The multi-agent episode: RLlib 2.60's ``MultiAgentEpisode`` over native agent episodes.

One :class:`~fastrollout.SingleAgentEpisode` (native storage) holds each agent's data; this
class keeps the multi-agent bookkeeping: which env step each agent step belongs to (agents
act only on some steps), actions and rewards that wait for an agent's next observation
("hanging" data), agents that join late or leave early, and the agent-to-module mapping.

The bookkeeping (env-step counters, done flags, step times, and the dicts of agent
episodes, env-step maps and hanging data) lives in the native base class
(``fastrollout._core.MultiAgentEpisodeCore``), under RLlib's attribute names. Recording an
env step is its native ``add_env_step``, one call: the per-agent decisions come from the
Rust core, and the agents' data goes straight into their native episodes and env-step
maps (``fastrollout._core.StepMap``). ``concat_episode``, ``cut`` and ``slice`` apply
the core's plans to the books the same way (a cut or slice the plan does not cover is
rebuilt from the per-env-step reads). Reads are composed here from the agents' native
reads.
"""

from __future__ import annotations

import builtins
import copy
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import numpy as np

from fastrollout._core import MultiAgentEpisodeCore, StepMap, multi_agent_add_env_reset
from fastrollout.core import DEFAULT_MODULE_ID
from fastrollout.core.spaces import shared_space
from fastrollout.episodes._ids import new_episode_id
from fastrollout.episodes.single_agent_episode import SingleAgentEpisode
from fastrollout.errors import (
    EpisodeDoneError,
    EpisodeStateError,
    IndexFormError,
)

SKIP = "S"  # An env step at which an agent did not step (RLlib's skip tag).


def default_agent_to_module_mapping_fn(agent_id: Any, episode: Any) -> str:
    """Maps every agent to the one default module (RLlib's default)."""
    return DEFAULT_MODULE_ID


def _agent_list(agent_ids: Any) -> list:
    if agent_ids is None:
        return []
    if isinstance(agent_ids, list | tuple | set | frozenset):
        return list(agent_ids)
    return [agent_ids]


class MultiAgentEpisode(MultiAgentEpisodeCore):
    """A chunk of a multi-agent episode, with look-back, following RLlib 2.60's API.

    Args:
        id_: Unique id; a random hex string when not given.
        observations: Initial observations, one dict (agent -> obs) per env step.
        observation_space: Per-agent observation spaces (dict).
        infos: Initial infos, one dict per env step.
        actions: Initial actions, one dict per env step.
        action_space: Per-agent action spaces (dict).
        rewards: Initial rewards, one dict per env step.
        terminateds: Per-agent (and ``"__all__"``) terminated flags, or one bool.
        truncateds: Per-agent (and ``"__all__"``) truncated flags, or one bool.
        extra_model_outputs: Initial extra model outputs, one dict per env step.
        env_t_started: The env step at which this chunk starts.
        agent_t_started: Per agent, the agent step at which this chunk starts.
        len_lookback_buffer: How many initial env steps are look-back ("auto": all).
        agent_episode_ids: Per agent, the id of its single-agent episode.
        agent_module_ids: Per agent, its module id (skips the mapping function).
        agent_to_module_mapping_fn: ``fn(agent_id, episode) -> module_id``, called once
            per agent per episode.

    Raises:
        EpisodeStateError: If the initial data's lengths do not fit together.
    """

    #: The class of the agents' episodes (a subclass keeps its own kind for them).
    _agent_episode_cls: type[SingleAgentEpisode] = SingleAgentEpisode

    #: The env's declared agents (its ``possible_agents``, as dict keys: ordered, O(1)
    #: lookups), which a runner sets on its episodes; an agent outside them that
    #: observes raises ``MultiAgentEnvError``. None: any agent may join (RLlib's episode).
    _declared_agents: dict[Any, None] | None = None

    SKIP_ENV_TS_TAG = SKIP

    def __init__(
        self,
        id_: str | None = None,
        *,
        observations: list[dict] | None = None,
        observation_space: Any = None,
        infos: list[dict] | None = None,
        actions: list[dict] | None = None,
        action_space: Any = None,
        rewards: list[dict] | None = None,
        terminateds: dict | bool = False,
        truncateds: dict | bool = False,
        extra_model_outputs: list[dict] | None = None,
        env_t_started: int | None = None,
        agent_t_started: dict | None = None,
        len_lookback_buffer: int | str = "auto",
        agent_episode_ids: dict | None = None,
        agent_module_ids: dict | None = None,
        agent_to_module_mapping_fn: Callable[[Any, Any], str] | None = None,
    ) -> None:
        self.id_: str = id_ or new_episode_id()
        self.agent_to_module_mapping_fn = (
            agent_to_module_mapping_fn or default_agent_to_module_mapping_fn
        )
        self._agent_to_module_mapping: dict = dict(agent_module_ids) if agent_module_ids else {}
        self.observation_space = observation_space or {}
        self.action_space = action_space or {}
        self._custom_data: dict = {}
        if (
            observations is None
            and rewards is None
            and len_lookback_buffer == "auto"
            and not env_t_started
            and not agent_t_started
            and not terminateds
            and not truncateds
        ):
            # A blank chunk (what runners and users make): counters and flags at 0, and
            # nothing to validate unless a subclass checks more or the books hold agents.
            self._blank_counters()
            if self.agent_episodes or type(self).validate is not MultiAgentEpisode.validate:
                self.validate()
            return
        if len_lookback_buffer == "auto":
            len_lookback_buffer = len(rewards or [])
        self._len_lookback_buffers = int(len_lookback_buffer)
        terminateds = terminateds or {}
        truncateds = truncateds or {}
        self.env_t_started = env_t_started or 0
        self.env_t = (
            (len(rewards) if rewards is not None else 0)
            - self._len_lookback_buffers
            + self.env_t_started
        )
        # The native constructor made the bookkeeping's containers (empty).
        if agent_t_started:
            self.agent_t_started.update(agent_t_started)
        self.is_terminated = bool(
            terminateds if isinstance(terminateds, bool) else terminateds.get("__all__", False)
        )
        self.is_truncated = bool(
            truncateds if isinstance(truncateds, bool) else truncateds.get("__all__", False)
        )
        if observations is not None:  # (an episode without initial data has none to load)
            self._init_agent_episodes(
                agent_module_ids=agent_module_ids,
                agent_episode_ids=agent_episode_ids,
                observations=observations,
                infos=infos,
                actions=actions,
                rewards=rewards,
                terminateds=terminateds,
                truncateds=truncateds,
                extra_model_outputs=extra_model_outputs,
            )
        self.validate()

    # ------------------------------------------------------------------ recording

    # _new_agent_episode (the episode of an agent that observes for the first time in
    # this chunk: declared-agents check, agent episode class, blank layouts, module) is
    # native (MultiAgentEpisodeCore).

    def add_env_reset(self, *, observations: dict, infos: dict | None = None) -> None:
        """Records the reset observations (and infos) of the agents that got one.

        Args:
            observations: Agent id -> observation.
            infos: Agent id -> infos.

        Raises:
            EpisodeStateError: If the episode is done or was already reset.
            SpaceMismatchError: If an observation does not fit its agent's space (the
                message names the agent); nothing is recorded then.
        """
        # The checks (done, env_t), the record and the start time are native.
        multi_agent_add_env_reset(self, observations, infos)

    def validate(self) -> None:
        """Checks every agent episode's lengths.

        Raises:
            EpisodeStateError: If an agent episode's fields do not fit together.
        """
        for eps in self.agent_episodes.values():
            eps.validate()

    # ------------------------------------------------------------------ state flags

    @property
    def custom_data(self) -> dict:
        """Free-form per-episode data for callbacks and connectors."""
        return self._custom_data

    @property
    def is_reset(self) -> bool:
        """Whether any agent has an observation in this chunk."""
        return any(eps.is_reset for eps in self.agent_episodes.values())

    @property
    def is_numpy(self) -> bool:
        """Whether the agent episodes were turned to numpy.

        Raises:
            RuntimeError: If only some of them were.
        """
        # Each agent's is_numpy, as in RLlib, except for an agent without steps whose
        # observations were numpy'd: to_numpy leaves its rewards flag unset (RLlib 2.60
        # then raises for the mix), so it has no say; if no agent has one, the
        # observations tell.
        episodes = self.agent_episodes.values()
        flags = {
            eps.is_numpy
            for eps in episodes
            if len(eps) > 0 or not eps._is_finalized("observations")
        } or {eps._is_finalized("observations") for eps in episodes}
        if len(flags) > 1:
            raise RuntimeError(f"only some agent episodes of {self} are numpy'd")
        return flags.pop() if flags else False

    # is_done (whether the episode is terminated or truncated, ``__all__``) is native.

    @property
    def agent_ids(self) -> set:
        """The agents that have an episode in this chunk."""
        return set(self.agent_episodes)

    @property
    def agent_episode_ids(self) -> dict:
        """Agent id -> id of its single-agent episode."""
        return {aid: eps.id_ for aid, eps in self.agent_episodes.items()}

    def module_for(self, agent_id: Any) -> str | None:
        """The module that acts for `agent_id` (the mapping function runs once per agent).

        Args:
            agent_id: The agent.

        Returns:
            Its module id.
        """
        if agent_id not in self._agent_to_module_mapping:
            self._agent_to_module_mapping[agent_id] = self.agent_to_module_mapping_fn(
                agent_id, self
            )
        return self._agent_to_module_mapping[agent_id]

    def to_numpy(self) -> MultiAgentEpisode:
        """Turns every agent episode to numpy.

        Returns:
            This episode.
        """
        self._agents_to_numpy()
        return self

    def _seal(self) -> None:
        """Compresses every compressed observation of every agent, none kept raw.

        For a chunk that receives no more steps (runners call it on the episodes they
        hand out); reads are unchanged and later steps still work.
        """
        for eps in self.agent_episodes.values():
            eps._seal()

    def finalize(self, drop_zero_len_single_agent_episodes: bool = False) -> MultiAgentEpisode:
        """The seed-era name of :meth:`to_numpy`.

        Args:
            drop_zero_len_single_agent_episodes: Remove agent episodes with no step in
                this chunk first.

        Returns:
            This episode.
        """
        if drop_zero_len_single_agent_episodes:
            for agent_id in [aid for aid, eps in self.agent_episodes.items() if len(eps) == 0]:
                del self.agent_episodes[agent_id]
        return self.to_numpy()

    # ------------------------------------------------------------------ chunks

    def concat_episode(self, other: MultiAgentEpisode) -> None:
        """Appends `other`, the chunk that continues this episode.

        Args:
            other: A chunk with the same id starting at this one's ``env_t``.

        Raises:
            EpisodeStateError: If `other` does not continue this episode or this one is
                done.
        """
        if other.id_ != self.id_:
            raise EpisodeStateError(f"concat_episode: ids differ ({other.id_!r} vs {self.id_!r})")
        if self.is_done:
            raise EpisodeStateError("concat_episode: this episode is done")
        if self.env_t != other.env_t_started:
            raise EpisodeStateError(
                f"concat_episode: this episode ends at env_t={self.env_t} but the other "
                f"starts at env_t_started={other.env_t_started}"
            )
        other.validate()
        # The core's plan: per agent its episode (taken over or continued), its env-step
        # map (which keeps covering every env step; RLlib 2.60 leaves the maps of done or
        # absent agents behind: ray issue 45542) and what hangs at its end; then the
        # rewards before first observations, which add up over the chunks (except those
        # the cut already carried over), and what the other chunk dropped or finished.
        self._concat_books(other, list(self.agent_ids | other.agent_ids))
        self.env_t = other.env_t
        # Both flags (RLlib 2.60 keeps only the termination where both are set).
        self.is_terminated = self.is_terminated or other.is_terminated
        self.is_truncated = self.is_truncated or other.is_truncated
        self._custom_data.update(other.custom_data)
        # Agents taken over from `other` keep this episode's observation compression.
        self._observation_compression = self._observation_compression
        self.validate()

    def cut(self, len_lookback_buffer: int = 0) -> MultiAgentEpisode:
        """Returns the successor chunk, which continues this episode from ``env_t``.

        Args:
            len_lookback_buffer: How many env steps the successor keeps as look-back
                (more if an agent's hanging action needs its last observation).

        Returns:
            The successor; this episode is left unchanged.

        Raises:
            EpisodeStateError: If the episode is done or `len_lookback_buffer` < 0.
        """
        if len_lookback_buffer < 0:
            raise EpisodeStateError(
                f"cut: len_lookback_buffer must be >= 0, got {len_lookback_buffer}"
            )
        if self.is_done:
            raise EpisodeDoneError("cut: the multi-agent episode is done")
        # Chunks whose live agents all stepped at each kept env step, with nothing hanging
        # (a runner's usual chunks): the native shortcut, which makes the whole successor.
        successor = self._cut_simultaneous(len_lookback_buffer)
        if successor is not None:
            return successor
        # Agents whose action hangs keep the observation it came from in the look-back
        # (RLlib 2.60 loses them for len_lookback_buffer=0: ray issue 44677).
        len_lookback_buffer = StepMap._cut_lookback(
            len_lookback_buffer,
            [self.env_t_to_agent_t[aid] for aid in self._hanging_actions_end],
        )
        successor = self._cut_rebuilt(len_lookback_buffer)
        if self._declared_agents is not None:
            successor._declared_agents = self._declared_agents
        successor._observation_compression = self._observation_compression
        return successor

    def _cut_rebuilt(self, len_lookback_buffer: int) -> MultiAgentEpisode:
        """``cut`` in general: the successor that the per-env-step reads rebuild.

        The core plans it from the structure of the kept env steps (which agent has an
        observation, action or reward at each) and copies each agent's kept rows; where
        the rebuild would be no such selection (numpy'd agents, data that does not line
        up), the successor is rebuilt from the reads. So is that of a subclass whose own
        constructor (or whose agent episode class's) must run.
        """
        cls = type(self)
        if (
            cls.__init__ is not MultiAgentEpisode.__init__
            or cls._agent_episode_cls.__init__ is not SingleAgentEpisode.__init__
        ):
            return self._cut_from_reads(len_lookback_buffer)
        successor = cls.__new__(cls)
        successor.id_ = self.id_
        successor.agent_to_module_mapping_fn = self.agent_to_module_mapping_fn
        successor.observation_space = self.observation_space
        successor.action_space = self.action_space
        if not self._cut_books(successor, len_lookback_buffer):
            return self._cut_from_reads(len_lookback_buffer)
        successor._custom_data = copy.deepcopy(self._custom_data) if self._custom_data else {}
        return successor

    def _cut_from_reads(self, len_lookback_buffer: int) -> MultiAgentEpisode:
        """``cut`` in general: the successor rebuilt from the per-env-step reads."""
        # Agents that finish exactly at this env step stay in the successor as done agent
        # episodes that start at their last step (RLlib 2.60 drops them, or restarts them
        # at t=0: ray issue 61602). They are cut like live agents, then marked done.
        stepped = self.get_agents_that_stepped() if self.is_reset else set()
        finished = {
            aid: (self.agent_episodes[aid].is_terminated, self.agent_episodes[aid].is_truncated)
            for aid in stepped
            if self.agent_episodes[aid].is_done
        }
        terminateds = self.get_terminateds()
        truncateds = self.get_truncateds()
        for aid in finished:
            terminateds[aid] = truncateds[aid] = False
        obs_and_infos = builtins.slice(-len_lookback_buffer - 1, None)
        rest = (
            builtins.slice(-len_lookback_buffer, None)
            if len_lookback_buffer > 0
            else builtins.slice(None, 0)
        )
        successor = type(self)(
            id_=self.id_,
            observations=self.get_observations(indices=obs_and_infos, return_list=True),
            observation_space=self.observation_space,
            infos=self.get_infos(indices=obs_and_infos, return_list=True),
            actions=self.get_actions(indices=rest, return_list=True),
            action_space=self.action_space,
            rewards=self.get_rewards(indices=rest, return_list=True),
            extra_model_outputs=self.get_extra_model_outputs(
                key=None, indices=rest, return_list=True
            ),
            terminateds=terminateds,
            truncateds=truncateds,
            env_t_started=self.env_t,
            agent_t_started={
                aid: eps.t
                for aid, eps in self.agent_episodes.items()
                if not eps.is_done or aid in finished
            },
            agent_episode_ids=self.agent_episode_ids,
            agent_module_ids={aid: eps.module_id for aid, eps in self.agent_episodes.items()},
            agent_to_module_mapping_fn=self.agent_to_module_mapping_fn,
            len_lookback_buffer="auto",
        )
        for aid, (terminated, truncated) in finished.items():
            successor.agent_episodes[aid].is_terminated = terminated
            successor.agent_episodes[aid].is_truncated = truncated
        # An agent that finished before the last env step has no part in the successor,
        # however far its look-back reaches: it is left out as when its one observation is
        # the first one kept (the constructor drops that one). RLlib 2.60 brings such an
        # agent back when the look-back holds two or more of its observations: with
        # t_started=0 and an env-step map shorter than the others', so that it shows up in
        # get_agents_that_stepped() and get_observations(-1).
        for aid, eps in self.agent_episodes.items():
            if eps.is_done and aid not in finished and aid in successor.agent_episodes:
                successor._del_agent(aid)
        successor._hanging_rewards_begin = self._hanging_rewards_end.copy()
        successor._custom_data = copy.deepcopy(self._custom_data) if self._custom_data else {}
        return successor

    def slice(
        self, slice_: builtins.slice, *, len_lookback_buffer: int | None = None
    ) -> MultiAgentEpisode:
        """Returns the env steps selected by `slice_` as a new episode.

        Args:
            slice_: Which env steps (step 1 only).
            len_lookback_buffer: How many env steps before the start to keep as look-back.

        Returns:
            The new episode.

        Raises:
            NotImplementedError: For a step other than 1.
            ValueError: If the agent episodes' look-backs differ.
        """
        start, stop, lb = self._slice_bounds(slice_, len_lookback_buffer)
        cls = type(self)
        if (
            cls.__init__ is MultiAgentEpisode.__init__
            and cls._agent_episode_cls.__init__ is SingleAgentEpisode.__init__
        ):
            # The core's plan: each agent's rows of the slice (where it has none, the
            # slice is rebuilt from the per-env-step reads: `_slice_from_reads`).
            sliced = cls.__new__(cls)
            sliced.id_ = self.id_
            sliced.agent_to_module_mapping_fn = self.agent_to_module_mapping_fn
            sliced.observation_space = self.observation_space
            sliced.action_space = self.action_space
            if self._slice_books(sliced, start, stop, lb, self._agent_to_module_mapping):
                sliced._custom_data = {}
                sliced._observation_compression = self._observation_compression
                return sliced
        return self._slice_from_reads(start, stop, lb)

    def _slice_bounds(
        self, slice_: builtins.slice, len_lookback_buffer: int | None
    ) -> tuple[int, int, int]:
        """``slice``'s env steps ``start:stop`` (resolved) and its look-back.

        Raises:
            NotImplementedError: For a step other than 1.
            ValueError: If the agent episodes' look-backs differ.
        """
        if slice_.step not in (1, None):
            raise NotImplementedError(
                f"MultiAgentEpisode.slice supports only step 1, not {slice_.step}"
            )
        n = len(self)
        start, stop = slice_.start, slice_.stop
        start = 0 if start is None else (max(n + start, 0) if start < 0 else min(start, n))
        stop = n if stop is None else (max(n + stop, 0) if stop < 0 else min(stop, n))
        lookbacks = set()
        for eps in self.agent_episodes.values():
            lookbacks.add(eps._lookback("observations"))
            lookbacks.add(eps._lookback("actions"))
            lookbacks.add(eps._lookback("rewards"))
            lookbacks.update(eps._lookback("extra_model_outputs", k) for k in eps._extra_keys())
        if len(lookbacks) > 1:
            raise ValueError(
                "can only slice a MultiAgentEpisode whose look-back buffers all have the "
                f"same size (got {sorted(lookbacks)})"
            )
        ref_lookback = lookbacks.pop() if lookbacks else 0
        lb = len_lookback_buffer if len_lookback_buffer is not None else ref_lookback
        if start - lb < 0 and ref_lookback < lb - start:
            lb = ref_lookback + start
        return start, stop, lb

    def _slice_from_reads(self, start: int, stop: int, lb: int) -> MultiAgentEpisode:
        """``slice`` rebuilt from the per-env-step reads.

        Args:
            start: The first env step (resolved by ``_slice_bounds``).
            stop: The env step after the last.
            lb: The env steps of look-back before ``start``.

        Returns:
            The new episode.
        """
        terminateds: dict = {}
        truncateds: dict = {}
        agent_t_started: dict = {}
        for aid, eps in self.agent_episodes.items():
            mapping = self.env_t_to_agent_t[aid]
            if stop < len(mapping) and mapping.get(stop) != SKIP and len(eps) == mapping.get(stop):
                terminateds[aid] = eps.is_terminated
                truncateds[aid] = eps.is_truncated
            if start < len(mapping):
                for i in range(start, len(mapping)):
                    if mapping.get(i) != SKIP:
                        agent_t_started[aid] = mapping.get(i)
                        break
        terminateds["__all__"] = all(terminateds.get(aid) for aid in self.agent_episodes)
        truncateds["__all__"] = all(truncateds.get(aid) for aid in self.agent_episodes)
        sliced = type(self)(
            id_=self.id_,
            observations=self.get_observations(
                builtins.slice(start - lb, stop + 1), neg_index_as_lookback=True, return_list=True
            ),
            observation_space=self.observation_space,
            actions=self.get_actions(
                builtins.slice(start - lb, stop), neg_index_as_lookback=True, return_list=True
            ),
            action_space=self.action_space,
            rewards=self.get_rewards(
                builtins.slice(start - lb, stop), neg_index_as_lookback=True, return_list=True
            ),
            extra_model_outputs=self.get_extra_model_outputs(
                indices=builtins.slice(start - lb, stop),
                neg_index_as_lookback=True,
                return_list=True,
            ),
            terminateds=terminateds,
            truncateds=truncateds,
            len_lookback_buffer=lb,
            env_t_started=self.env_t_started + start,
            agent_episode_ids={aid: eps.id_ for aid, eps in self.agent_episodes.items()},
            agent_t_started=agent_t_started,
            agent_module_ids=self._agent_to_module_mapping,
            agent_to_module_mapping_fn=self.agent_to_module_mapping_fn,
        )
        if self.is_numpy:
            sliced.to_numpy()
        sliced._observation_compression = self._observation_compression
        return sliced

    def __getitem__(self, item: builtins.slice) -> MultiAgentEpisode:
        """``episode[a:b]`` is ``episode.slice(slice(a, b))``.

        Raises:
            NotImplementedError: For anything but a slice.
        """
        if isinstance(item, builtins.slice):
            return self.slice(item)
        raise NotImplementedError(
            f"MultiAgentEpisode supports only slices (episode[a:b]), not {item!r}"
        )

    # ------------------------------------------------------------------ getters

    def get_observations(
        self,
        indices: Any = None,
        agent_ids: Any = None,
        *,
        env_steps: bool = True,
        neg_index_as_lookback: bool = False,
        fill: Any = None,
        one_hot_discrete: bool = False,
        return_list: bool = False,
    ) -> Any:
        """Reads observations by env step (default) or agent step.

        Args:
            indices: None, an int, a list of ints or a slice (env steps, or agent steps
                with ``env_steps=False``).
            agent_ids: One agent or a collection (default: all).
            env_steps: Index by env steps (True) or each agent's own steps (False).
            neg_index_as_lookback: Negative indices reach into the look-back.
            fill: Value for env steps where an agent has no data.
            one_hot_discrete: One-hot encode discrete parts.
            return_list: Return one dict per index (env steps only).

        Returns:
            Agent id -> data, or a list of such dicts.

        Raises:
            ValueError: For ``env_steps=False`` with ``return_list=True``.
        """
        return self._get(
            "observations",
            indices,
            agent_ids,
            env_steps,
            neg_index_as_lookback,
            fill,
            one_hot_discrete,
            return_list,
        )

    def get_infos(
        self,
        indices: Any = None,
        agent_ids: Any = None,
        *,
        env_steps: bool = True,
        neg_index_as_lookback: bool = False,
        fill: Any = None,
        return_list: bool = False,
    ) -> Any:
        """Reads infos; arguments as in :meth:`get_observations`.

        Returns:
            Agent id -> infos, or a list of such dicts.
        """
        return self._get(
            "infos", indices, agent_ids, env_steps, neg_index_as_lookback, fill, False, return_list
        )

    def get_actions(
        self,
        indices: Any = None,
        agent_ids: Any = None,
        *,
        env_steps: bool = True,
        neg_index_as_lookback: bool = False,
        fill: Any = None,
        one_hot_discrete: bool = False,
        return_list: bool = False,
    ) -> Any:
        """Reads actions (hanging ones included); arguments as in :meth:`get_observations`.

        Returns:
            Agent id -> actions, or a list of such dicts.
        """
        return self._get(
            "actions",
            indices,
            agent_ids,
            env_steps,
            neg_index_as_lookback,
            fill,
            one_hot_discrete,
            return_list,
        )

    def get_rewards(
        self,
        indices: Any = None,
        agent_ids: Any = None,
        *,
        env_steps: bool = True,
        neg_index_as_lookback: bool = False,
        fill: Any = None,
        return_list: bool = False,
    ) -> Any:
        """Reads rewards (hanging ones included); arguments as in :meth:`get_observations`.

        Returns:
            Agent id -> rewards, or a list of such dicts.
        """
        return self._get(
            "rewards",
            indices,
            agent_ids,
            env_steps,
            neg_index_as_lookback,
            fill,
            False,
            return_list,
        )

    def get_extra_model_outputs(
        self,
        key: str | None = None,
        indices: Any = None,
        agent_ids: Any = None,
        *,
        env_steps: bool = True,
        neg_index_as_lookback: bool = False,
        fill: Any = None,
        return_list: bool = False,
    ) -> Any:
        """Reads extra model outputs (one key, or all as dicts with ``key=None``).

        Returns:
            Agent id -> data, or a list of such dicts.
        """
        return self._get(
            "extra_model_outputs",
            indices,
            agent_ids,
            env_steps,
            neg_index_as_lookback,
            fill,
            False,
            return_list,
            key,
        )

    def get_terminateds(self) -> dict:
        """Agent id -> terminated, plus ``"__all__"``."""
        out = {aid: self.agent_episodes[aid].is_terminated for aid in self.agent_ids}
        out["__all__"] = self.is_terminated
        return out

    def get_truncateds(self) -> dict:
        """Agent id -> truncated, plus ``"__all__"``.

        RLlib 2.60 reports ``is_terminated`` under ``"__all__"`` here; this is
        ``is_truncated``.
        """
        out = {aid: self.agent_episodes[aid].is_truncated for aid in self.agent_ids}
        out["__all__"] = self.is_truncated
        return out

    def _get(
        self,
        what: str,
        indices: Any,
        agent_ids: Any,
        env_steps: bool,
        neg: bool,
        fill: Any,
        one_hot: bool,
        return_list: bool,
        key: str | None = None,
    ) -> Any:
        wanted = set(_agent_list(agent_ids)) or self.agent_ids
        if not env_steps:
            if return_list:
                raise ValueError(
                    f"get_{what}() cannot take both env_steps=False and return_list=True"
                )
            return self._get_by_agent_steps(what, indices, wanted, neg, fill, one_hot, key)
        if return_list:
            if isinstance(indices, int) and any(aid in wanted for aid in self.agent_episodes):
                raise IndexFormError(
                    f"get_{what}(return_list=True) takes None, a slice or a list of ints as "
                    f"indices (one dict per env step), not the int {indices}"
                )
            return self._get_by_env_steps_as_list(what, indices, wanted, neg, fill, one_hot, key)
        return self._get_by_env_steps(what, indices, wanted, neg, fill, one_hot, key)

    @staticmethod
    def _require_key(eps: SingleAgentEpisode, what: str, key: str | None, agent_id: Any) -> None:
        """Fails for an extra model output key the agent has not stored.

        RLlib reads the key of every selected agent; a key whose only value hangs fails
        too (a read of all keys shows it).
        """
        if what == "extra_model_outputs" and key is not None and key not in eps._extra_keys():
            raise KeyError(f"agent {agent_id!r} has no extra model output {key!r}")

    def _hanging(self, what: str, agent_id: Any) -> Any:
        if what == "actions":
            return self._hanging_actions_end.get(agent_id)
        if what == "extra_model_outputs":
            return self._hanging_extra_model_outputs_end.get(agent_id)
        if what == "rewards":
            return self._hanging_rewards_end.get(agent_id)
        return None

    @staticmethod
    def _read(
        eps: SingleAgentEpisode,
        what: str,
        key: str | None,
        indices: Any,
        neg: bool,
        fill: Any,
        one_hot: bool,
        add_last: Any = None,
    ) -> Any:
        """One agent's data with RLlib's "hanging value appended" view."""
        return eps._get_ext(what, key, indices, neg, fill, one_hot, add_last, False)

    def _extra_keys(self, eps: SingleAgentEpisode, hanging: Any) -> list:
        keys = list(eps._extra_keys())
        if not keys and isinstance(hanging, dict):
            keys = list(hanging)
        return keys

    def _get_by_agent_steps(self, what, indices, wanted, neg, fill, one_hot, key) -> dict:
        out = {}
        for agent_id, eps in self.agent_episodes.items():
            if agent_id not in wanted:
                continue
            self._require_key(eps, what, key, agent_id)
            hanging = self._hanging(what, agent_id)
            if what == "extra_model_outputs" and key is None:
                value = {
                    k: self._read(
                        eps,
                        what,
                        k,
                        indices,
                        neg,
                        fill,
                        one_hot,
                        None if hanging is None or indices is None else hanging.get(k),
                    )
                    for k in self._extra_keys(eps, hanging)
                }
            else:
                if key is not None and isinstance(hanging, dict):
                    hanging = hanging.get(key)
                value = self._read(
                    eps,
                    what,
                    key,
                    indices,
                    neg,
                    fill,
                    one_hot,
                    None if indices is None else hanging,
                )
            if value is None or (isinstance(value, list) and value == []):
                continue
            if what == "extra_model_outputs" and key is None:
                value = _without_empty_reads(value)
                if not value:
                    continue  # nothing to report for this agent
            out[agent_id] = value
        return out

    def _agent_view_len(
        self, eps: SingleAgentEpisode, what: str, key: str | None, hanging: Any
    ) -> int:
        """Items (look-back included) of an agent's field as the env-step getters see it."""
        if what == "extra_model_outputs":
            keys = [key] if key is not None else list(eps._extra_keys())
            if not keys:
                return -1
            k = keys[0]
            n = _field_lookback(eps, what, k) + _field_len(eps, what, k)
        else:
            n = eps._lookback(what) + eps._field_len(what)
        return n + (hanging is not None)

    def _agent_index(self, agent_id: Any, eps: SingleAgentEpisode, what: str, key, hanging, index):
        """Env-step map entry -> position in the agent's field (look-back included)."""
        if index == SKIP:
            return SKIP
        position = index - self.agent_t_started[agent_id] + eps._lookback("observations")
        # The env step an agent just observed at has no action or reward yet (unless one
        # is hanging): for those fields it reads as a skip.
        ignore_last = what not in ("observations", "infos")
        if ignore_last and position == self._agent_view_len(eps, what, key, hanging):
            return SKIP
        return position

    def _get_one(self, eps, what, key, position, fill, one_hot, hanging) -> Any:
        """One agent's item at `position` (look-back included), or the fill/None for SKIP."""
        if position == SKIP:
            if fill is None:
                return None
            return self._fill_value(eps, what, key, fill, one_hot, hanging)
        if what == "extra_model_outputs" and key is None:
            # All keys: {key: that key's item}, like a read per key.
            return {
                k: self._get_one(eps, what, k, position, fill, one_hot, hanging)
                for k in self._extra_keys(eps, hanging)
            }
        if what == "extra_model_outputs" and isinstance(hanging, dict):
            hanging = hanging.get(key)
        lookback = _field_lookback(eps, what, key)
        return self._read(eps, what, key, position - lookback, True, fill, one_hot, hanging)

    def _fill_value(self, eps, what, key, fill, one_hot, hanging) -> Any:
        """The agent's fill item (RLlib reads it at an index far past the data)."""
        if what == "extra_model_outputs" and key is None:
            return {
                k: self._fill_value(eps, what, k, fill, one_hot, hanging)
                for k in self._extra_keys(eps, hanging)
            }
        return eps._get_ext(what, key, 1_000_000_000_000, False, fill, one_hot, None, False)

    def _get_by_env_steps(self, what, indices, wanted, neg, fill, one_hot, key) -> dict:
        ignore_last = what not in ("observations", "infos")
        out = {}
        for agent_id, eps in self.agent_episodes.items():
            if agent_id not in wanted:
                continue
            hanging = self._hanging(what, agent_id)
            # The env-step map is read first: an index outside it fails even for an agent
            # that has nothing to report (as in RLlib).
            mapped = self.env_t_to_agent_t[agent_id].get(
                indices, neg_index_as_lookback=neg, fill=fill is not None, ignore_last=ignore_last
            )
            if (
                what == "extra_model_outputs"
                and key is None
                and not eps._extra_keys()
                and hanging is None
            ):
                continue
            self._require_key(eps, what, key, agent_id)
            if isinstance(mapped, list):
                positions = [
                    self._agent_index(agent_id, eps, what, key, hanging, i) for i in mapped
                ]
                values = self._get_many(eps, what, key, positions, fill, one_hot, hanging)
                if len(values) > 0:
                    out[agent_id] = values
            else:
                position = self._agent_index(agent_id, eps, what, key, hanging, mapped)
                value = self._get_one(eps, what, key, position, fill, one_hot, hanging)
                if value is not None:
                    out[agent_id] = value
        return out

    def _get_many(self, eps, what, key, positions, fill, one_hot, hanging) -> Any:
        if what == "extra_model_outputs" and key is None:
            filled = fill is not None and SKIP in positions
            if not filled and all(p == SKIP for p in positions):
                # Nothing to read: the agent is left out, as for any other field.
                return []
            # All keys: {key: that key's read}, like a read per key.
            return _without_empty_reads(
                {
                    k: self._get_many(eps, what, k, positions, fill, one_hot, hanging)
                    for k in self._extra_keys(eps, hanging)
                }
            )
        if what == "extra_model_outputs" and isinstance(hanging, dict):
            hanging = hanging.get(key)
        lookback = _field_lookback(eps, what, key)
        if SKIP in positions and fill is not None:
            fill_value = self._fill_value(eps, what, key, fill, one_hot, hanging)
            values = [
                fill_value
                if p == SKIP
                else self._read(eps, what, key, p - lookback, True, fill, one_hot, hanging)
                for p in positions
            ]
            # Infos stay lists of dicts, as in the agent episodes (RLlib 2.60 tries to
            # batch them here and fails).
            if self.is_numpy and what != "infos":
                return _batch(values)
            return values
        wanted = [p - lookback for p in positions if p != SKIP]
        if not wanted:
            return []
        return self._read(eps, what, key, wanted, True, fill, one_hot, hanging)

    def _get_by_env_steps_as_list(self, what, indices, wanted, neg, fill, one_hot, key) -> list:
        ignore_last = what not in ("observations", "infos")
        per_agent = {}
        for agent_id in self.agent_episodes:
            if agent_id not in wanted:
                continue
            mapped = self.env_t_to_agent_t[agent_id].get(
                indices, neg_index_as_lookback=neg, fill=True, ignore_last=ignore_last
            )
            if not isinstance(mapped, list):
                mapped = [mapped]
            per_agent[agent_id] = mapped
        if not per_agent:
            return []
        out = []
        for i in range(len(next(iter(per_agent.values())))):
            row = {}
            for agent_id, mapped in per_agent.items():
                eps = self.agent_episodes[agent_id]
                entry = mapped[i]  # an agent with fewer entries fails here, as in RLlib
                self._require_key(eps, what, key, agent_id)
                hanging = self._hanging(what, agent_id)
                # RLlib skips agents without extra outputs here even when an
                # empty dict of them hangs (unlike the single-dict read).
                if what == "extra_model_outputs" and not eps._extra_keys() and not hanging:
                    continue
                position = self._agent_index(agent_id, eps, what, key, hanging, entry)
                value = self._get_one(eps, what, key, position, fill, one_hot, hanging)
                if value is not None:
                    row[agent_id] = value
            out.append(row)
        return out

    # ------------------------------------------------------------------ setters

    def _set(self, setter: str, new_data: dict, **kwargs: Any) -> None:
        for agent_id, agent_data in new_data.items():
            if agent_id not in self.agent_episodes:
                raise KeyError(f"agent {agent_id!r} is not in this episode")
            getattr(self.agent_episodes[agent_id], setter)(new_data=agent_data, **kwargs)

    def set_observations(
        self, *, new_data: dict, at_indices: Any = None, neg_index_as_lookback: bool = False
    ) -> None:
        """Overwrites observations per agent (agent steps).

        Raises:
            KeyError: For an agent that is not in the episode.
        """
        self._set(
            "set_observations",
            new_data,
            at_indices=at_indices,
            neg_index_as_lookback=neg_index_as_lookback,
        )

    def set_actions(
        self, *, new_data: dict, at_indices: Any = None, neg_index_as_lookback: bool = False
    ) -> None:
        """Overwrites actions per agent (agent steps).

        Raises:
            KeyError: For an agent that is not in the episode.
        """
        self._set(
            "set_actions",
            new_data,
            at_indices=at_indices,
            neg_index_as_lookback=neg_index_as_lookback,
        )

    def set_rewards(
        self, *, new_data: dict, at_indices: Any = None, neg_index_as_lookback: bool = False
    ) -> None:
        """Overwrites rewards per agent (agent steps).

        Raises:
            KeyError: For an agent that is not in the episode.
        """
        self._set(
            "set_rewards",
            new_data,
            at_indices=at_indices,
            neg_index_as_lookback=neg_index_as_lookback,
        )

    def set_extra_model_outputs(
        self,
        *,
        key: str,
        new_data: dict,
        at_indices: Any = None,
        neg_index_as_lookback: bool = False,
    ) -> None:
        """Overwrites one extra model output per agent (agent steps).

        Raises:
            KeyError: For an agent that is not in the episode.
        """
        self._set(
            "set_extra_model_outputs",
            new_data,
            key=key,
            at_indices=at_indices,
            neg_index_as_lookback=neg_index_as_lookback,
        )

    # ------------------------------------------------------------------ summaries

    def get_return(self, include_hanging_rewards: bool = False) -> float:
        """The sum of all agents' rewards in this chunk.

        Args:
            include_hanging_rewards: Also count rewards still waiting for an agent's
                (first or next) observation.

        Returns:
            The return.
        """
        total = sum(eps.get_return() for eps in self.agent_episodes.values())
        if include_hanging_rewards:
            total += sum(self._hanging_rewards_begin.values())
            total += sum(self._hanging_rewards_end.values())
        return total

    def get_agents_to_act(self) -> set:
        """The agents that observed at the last env step and are not done."""
        return {aid for aid in self.get_observations(-1) if not self.agent_episodes[aid].is_done}

    def get_agents_that_stepped(self) -> set:
        """The agents that observed at the last env step."""
        return set(self.get_observations(-1))

    def get_duration_s(self) -> float:
        """Seconds between the reset and the last step (0.0 before a step)."""
        if self._last_step_time is None or self._start_time is None:
            return 0.0
        return self._last_step_time - self._start_time

    def env_steps(self) -> int:
        """Env steps in the chunk."""
        return len(self)

    def agent_steps(self) -> int:
        """Agent steps in the chunk, summed over agents."""
        return sum(len(eps) for eps in self.agent_episodes.values())

    def __len__(self) -> int:
        return self.env_t - self.env_t_started

    def __repr__(self) -> str:
        returns = {aid: eps.get_return() for aid, eps in self.agent_episodes.items()}
        return f"MAEps(len={len(self)} done={self.is_done} Rs={returns} id_={self.id_})"

    def print(self) -> None:
        """Prints which agents stepped at which env step (an ``x`` per agent step)."""
        maps = self.env_t_to_agent_t
        max_ts = max(len(m.data) for m in maps.values())
        lookback = next(iter(maps.values())).lookback
        width = max(len(str(aid)) for aid in self.agent_ids)
        header = (
            "ts" + " " * width + "   ".join(str(i) for i in range(-lookback, max_ts - lookback))
        )
        rows = []
        for agent, step_map in maps.items():
            row = f"{agent}  " + " " * (width - len(str(agent)))
            row += "".join("    " if t == SKIP else " x  " for t in step_map.data)
            rows.append(row.rstrip())
        print(header + "\n" + "\n".join(rows))

    # ------------------------------------------------------------------ state

    def get_state(self) -> dict:
        """All of the episode as plain data (for checkpoints and Ray).

        Returns:
            A dict that :meth:`from_state` turns back into an equal episode.
        """
        return self._state(packed=False)

    def _state(self, *, packed: bool) -> dict:
        """The episode's state (:meth:`get_state`).

        With ``packed``, compressed observations keep their stored blocks (for pickling
        and copies; a checkpoint or an offline file gets their items).
        """
        return {
            "id_": self.id_,
            "agent_to_module_mapping_fn": self.agent_to_module_mapping_fn,
            "_agent_to_module_mapping": dict(self._agent_to_module_mapping),
            "observation_space": self.observation_space,
            "action_space": self.action_space,
            "env_t_started": self.env_t_started,
            "env_t": self.env_t,
            "agent_t_started": dict(self.agent_t_started),
            "env_t_to_agent_t": {
                aid: {"data": list(m.data), "lookback": m.lookback}
                for aid, m in self.env_t_to_agent_t.items()
            },
            "_hanging_actions_end": dict(self._hanging_actions_end),
            "_hanging_extra_model_outputs_end": dict(self._hanging_extra_model_outputs_end),
            "_hanging_rewards_end": dict(self._hanging_rewards_end),
            "_hanging_rewards_begin": dict(self._hanging_rewards_begin),
            "_dropped_agents": set(self._dropped_agents),
            "is_terminated": self.is_terminated,
            "is_truncated": self.is_truncated,
            # The agents' states keep their space objects (no serialization per agent).
            "agent_episodes": [
                (aid, eps._state(rllib=False, packed=packed))
                for aid, eps in self.agent_episodes.items()
            ],
            "_start_time": self._start_time,
            "_last_step_time": self._last_step_time,
            "custom_data": self._custom_data,
            # Items per compressed block of the agents' observations (the states hold
            # them uncompressed).
            "_observation_compression": self._observation_compression,
        }

    @classmethod
    def from_state(cls, state: dict) -> MultiAgentEpisode:
        """Rebuilds an episode from :meth:`get_state`'s dict.

        Args:
            state: The dict.

        Returns:
            The episode.
        """
        episode = cls(id_=state["id_"])
        episode.agent_to_module_mapping_fn = state["agent_to_module_mapping_fn"]
        episode._agent_to_module_mapping = dict(state["_agent_to_module_mapping"])
        episode.observation_space = _shared_spaces(state["observation_space"])
        episode.action_space = _shared_spaces(state["action_space"])
        episode.env_t_started = state["env_t_started"]
        episode.env_t = state["env_t"]
        # Into the (empty) containers the native constructor made.
        episode.agent_t_started.update(state["agent_t_started"])
        episode.env_t_to_agent_t.update(
            {
                aid: StepMap(list(m["data"]), m["lookback"])
                for aid, m in state["env_t_to_agent_t"].items()
            }
        )
        episode._hanging_actions_end.update(state["_hanging_actions_end"])
        episode._hanging_extra_model_outputs_end.update(state["_hanging_extra_model_outputs_end"])
        episode._hanging_rewards_end.update(state["_hanging_rewards_end"])
        episode._hanging_rewards_begin.update(state["_hanging_rewards_begin"])
        episode._dropped_agents.update(state.get("_dropped_agents", ()))
        episode.is_terminated = state["is_terminated"]
        episode.is_truncated = state["is_truncated"]
        episode.agent_episodes.update(
            (aid, cls._agent_episode_cls.from_state(s)) for aid, s in state["agent_episodes"]
        )
        episode._start_time = state["_start_time"]
        episode._last_step_time = state["_last_step_time"]
        episode._custom_data = state.get("custom_data", {})
        episode._observation_compression = state.get("_observation_compression")
        if episode.is_done:
            # A done episode keeps nothing raw (its agents' done steps sealed theirs).
            episode._seal()
        episode.validate()
        return episode

    def __reduce__(self) -> tuple:
        return (type(self).from_state, (self._state(packed=True),))

    def __copy__(self) -> MultiAgentEpisode:
        return type(self).from_state(self._state(packed=True))

    def __deepcopy__(self, memo: dict) -> MultiAgentEpisode:
        return type(self).from_state(copy.deepcopy(self._state(packed=True), memo))

    # ------------------------------------------------------------------ internals

    def _del_hanging(self, agent_id: Any) -> None:
        self._hanging_rewards_begin.pop(agent_id, None)
        self._hanging_actions_end.pop(agent_id, None)
        self._hanging_extra_model_outputs_end.pop(agent_id, None)
        self._hanging_rewards_end.pop(agent_id, None)

    def _del_agent(self, agent_id: Any) -> None:
        self._del_hanging(agent_id)
        self.agent_episodes.pop(agent_id, None)
        self.env_t_to_agent_t.pop(agent_id, None)
        self._agent_to_module_mapping.pop(agent_id, None)
        self.agent_t_started.pop(agent_id, None)

    def _init_agent_episodes(
        self,
        *,
        agent_module_ids,
        agent_episode_ids,
        observations,
        actions,
        rewards,
        infos,
        terminateds,
        truncateds,
        extra_model_outputs,
    ) -> None:
        if actions is None:
            actions, rewards, extra_model_outputs = [], [], []
        if infos is None:
            infos = [{} for _ in observations]
        if extra_model_outputs is None:
            extra_model_outputs = [{} for _ in actions]
        rewards = rewards or []
        obs_per_agent: defaultdict = defaultdict(list)
        infos_per_agent: defaultdict = defaultdict(list)
        actions_per_agent: defaultdict = defaultdict(list)
        rewards_per_agent: defaultdict = defaultdict(list)
        extras_per_agent: defaultdict = defaultdict(list)
        done_per_agent: defaultdict = defaultdict(bool)
        lookback_per_agent: defaultdict = defaultdict(lambda: self._len_lookback_buffers)
        all_agent_ids = set(agent_episode_ids or ())
        agent_module_ids = agent_module_ids or {}
        lookback_obs: defaultdict = defaultdict(int)
        total_obs: defaultdict = defaultdict(int)
        for idx, obs in enumerate(observations):
            for agent_id in obs:
                total_obs[agent_id] += 1
                if idx < self._len_lookback_buffers:
                    lookback_obs[agent_id] += 1
        current_t = {}
        for agent_id, n_lookback in lookback_obs.items():
            if total_obs[agent_id] - n_lookback > 0:
                current_t[agent_id] = self.agent_t_started[agent_id] - n_lookback
            else:
                current_t[agent_id] = self.agent_t_started[agent_id] - n_lookback + 1
        for idx, (obs, inf) in enumerate(zip(observations, infos, strict=False)):
            act = actions[idx] if len(actions) > idx else {}
            extras = extra_model_outputs[idx] if len(extra_model_outputs) > idx else {}
            rew = rewards[idx] if len(rewards) > idx else {}
            for agent_id, agent_obs in obs.items():
                all_agent_ids.add(agent_id)
                obs_per_agent[agent_id].append(agent_obs)
                infos_per_agent[agent_id].append(inf.get(agent_id, {}))
                if len(obs_per_agent[agent_id]) > 1:
                    actions_per_agent[agent_id].append(self._hanging_actions_end.pop(agent_id))
                    extras_per_agent[agent_id].append(
                        self._hanging_extra_model_outputs_end.pop(agent_id)
                    )
                    rewards_per_agent[agent_id].append(self._hanging_rewards_end.pop(agent_id))
                elif agent_id not in self.env_t_to_agent_t:
                    self.env_t_to_agent_t[agent_id].extend([SKIP] * idx)
                    lookback_per_agent[agent_id] -= idx
                if agent_id in act:
                    self._hanging_actions_end[agent_id] = act[agent_id]
                    self._hanging_extra_model_outputs_end[agent_id] = extras.get(agent_id, {})
                    self._hanging_rewards_end[agent_id] += rew.get(agent_id, 0.0)
                elif terminateds.get(agent_id) or truncateds.get(agent_id):
                    done_per_agent[agent_id] = True
                elif idx < len(observations) - 1:
                    done_per_agent[agent_id] = terminateds[agent_id] = True
                if agent_id not in current_t:
                    current_t[agent_id] = self.agent_t_started.get(agent_id, 0)
                self.env_t_to_agent_t[agent_id].append(current_t[agent_id])
                current_t[agent_id] += 1
            for agent_id in all_agent_ids:
                if agent_id not in obs and agent_id not in done_per_agent:
                    self.env_t_to_agent_t[agent_id].append(SKIP)
                    if len(self.env_t_to_agent_t[agent_id].data) - self._len_lookback_buffers <= 0:
                        lookback_per_agent[agent_id] -= 1
                    self._hanging_rewards_end[agent_id] += rew.get(agent_id, 0.0)
        for agent_id in list(self.env_t_to_agent_t):
            if agent_id not in obs_per_agent:
                del self.env_t_to_agent_t[agent_id]
                continue
            self.env_t_to_agent_t[agent_id].lookback = self._len_lookback_buffers
        for agent_id, agent_obs in obs_per_agent.items():
            if len(agent_obs) == 1 and done_per_agent.get(agent_id):
                self._del_agent(agent_id)
                continue
            module_id = agent_module_ids.get(agent_id) or self.agent_to_module_mapping_fn(
                agent_id, self
            )
            agent_extras = extras_per_agent[agent_id]
            self.agent_episodes[agent_id] = self._agent_episode_cls(
                (agent_episode_ids or {}).get(agent_id),
                agent_id=agent_id,
                module_id=module_id,
                multi_agent_episode_id=self.id_,
                observations=agent_obs,
                observation_space=self.observation_space.get(agent_id),
                infos=infos_per_agent[agent_id],
                actions=actions_per_agent[agent_id],
                action_space=self.action_space.get(agent_id),
                rewards=rewards_per_agent[agent_id],
                extra_model_outputs=(
                    {k: [e[k] for e in agent_extras] for k in agent_extras[0]}
                    if agent_extras
                    else None
                ),
                terminated=terminateds.get(agent_id, False),
                truncated=truncateds.get(agent_id, False),
                t_started=self.agent_t_started[agent_id],
                len_lookback_buffer=max(lookback_per_agent[agent_id], 0),
            )


def _shared_spaces(spaces: Any) -> Any:
    """A state's spaces (one, or agent id -> space), each shared (see ``shared_space``)."""
    if isinstance(spaces, dict):
        return {aid: shared_space(space) for aid, space in spaces.items()}
    return shared_space(spaces)


def _without_empty_reads(per_key: dict) -> dict:
    """A read of all extra output keys without the keys whose read is empty ([]).

    As if each key were read on its own: a read that finds nothing leaves the agent out.
    """
    return {k: v for k, v in per_key.items() if not (isinstance(v, list) and v == [])}


def _field_lookback(eps: SingleAgentEpisode, what: str, key: str | None) -> int:
    """Look-back of an agent's field.

    An extra model output key the agent has not stored yet (it only hangs) is an empty
    field without look-back, as RLlib reads it.
    """
    if what != "extra_model_outputs":
        return eps._lookback(what)
    return eps._lookback(what, key) if key in eps._extra_keys() else 0


def _field_len(eps: SingleAgentEpisode, what: str, key: str | None) -> int:
    """Length of an agent's field (0 for an extra model output key not stored yet)."""
    if what != "extra_model_outputs":
        return eps._field_len(what)
    return eps._field_len(what, key) if key in eps._extra_keys() else 0


def _batch(values: list) -> Any:
    """RLlib's ``batch`` of items: stack leaves of dicts/tuples, arrays, or scalars."""
    first = values[0]
    if isinstance(first, dict):
        return {k: _batch([v[k] for v in values]) for k in first}
    if isinstance(first, tuple):
        return tuple(_batch([v[i] for v in values]) for i in range(len(first)))
    if isinstance(first, np.ndarray):
        out = np.empty((len(values), *first.shape), dtype=first.dtype)
        for i, v in enumerate(values):
            out[i] = v
        return out
    return np.array(values)


__all__ = ["MultiAgentEpisode", "default_agent_to_module_mapping_fn"]
