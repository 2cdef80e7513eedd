"""The single-agent episode: RLlib 2.60's ``SingleAgentEpisode`` on a native core.

The class subclasses :class:`fastrollout._core.SingleAgentEpisodeCore`, which holds all the
data (typed Rust columns with look-back) and implements every per-step and per-read method
natively: ``add_env_step``, the getters and setters, ``to_numpy``, ``len``... are one call
from Python straight into Rust. This module adds identity and metadata (ids, spaces,
custom data), construction from initial data, chunking (``cut``, ``slice``,
``concat_episode``) and state handling.
"""

from __future__ import annotations

import builtins
import copy
import functools
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from fastrollout._core import SingleAgentEpisodeCore
from fastrollout.core.spaces import is_space_dict, shared_space, space_from_dict
from fastrollout.episodes._ids import new_episode_id
from fastrollout.episodes.buffers import ExtraModelOutputsView, LookbackBufferView, space_state
from fastrollout.errors import EpisodeStateError

Index = int | list[int] | slice | None

_FIELDS = ("observations", "infos", "actions", "rewards")


def _same(value: Any) -> Any:
    return value


def _space_from_state(value: Any) -> gym.Space | None:
    """A state's space: itself or rebuilt from RLlib's dict form, shared (``shared_space``)."""
    # (A gymnasium Dict space is a Mapping too: the form is told by its "space" key.)
    if is_space_dict(value):
        return shared_space(space_from_dict(value))
    return shared_space(value)


def _same_item(a: Any, b: Any) -> bool:
    """Whether two (possibly nested) items hold equal data."""
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(_same_item(a[k], b[k]) for k in a)
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(_same_item(x, y) for x, y in zip(a, b, strict=True))
    try:
        return bool(np.array_equal(a, b))
    except (TypeError, ValueError):
        return bool(a == b)


class SingleAgentEpisode(SingleAgentEpisodeCore):
    """A chunk of one agent's trajectory, with look-back into what came before it.

    Observations and infos hold one item more than actions and rewards: the observation
    an action was computed from comes first (the reset observation, or the last one of
    the previous chunk). Items before the chunk start (the look-back) stay readable with
    negative indices and ``neg_index_as_lookback=True``.

    The API and semantics follow RLlib 2.60's ``SingleAgentEpisode``; see its docs for
    the meaning of every argument. Where this class differs on purpose, the docstring of
    the method says so.

    Args:
        id_: Unique id; a random hex string when not given.
        observations: Initial observations (list of items, or a batch array).
        observation_space: The observations' space; fixes their dtype and shape (values
            that do not fit raise :class:`~fastrollout.errors.SpaceMismatchError`).
        infos: Initial info dicts (default: ``{}`` per observation).
        actions: Initial actions.
        action_space: The actions' space.
        rewards: Initial rewards.
        terminated: Whether the episode has terminated.
        truncated: Whether the episode has been truncated.
        extra_model_outputs: Initial extra model outputs, a list of items per key.
        t_started: The env step at which this chunk starts.
        len_lookback_buffer: How many of the initial items are look-back ("auto": all of
            them, so the chunk starts empty).
        agent_id: The agent this episode belongs to (multi-agent).
        module_id: The RLModule that acts for the agent (multi-agent).
        multi_agent_episode_id: Id of the multi-agent episode this one belongs to.

    Raises:
        EpisodeStateError: If the initial data's lengths do not fit together.

    Examples:
        >>> import numpy as np
        >>> from fastrollout import SingleAgentEpisode
        >>> ep = SingleAgentEpisode()
        >>> ep.add_env_reset(np.zeros(2, np.float32))
        >>> ep.add_env_step(np.ones(2, np.float32), 1, 0.5)
        >>> len(ep), ep.get_return()
        (1, 0.5)
    """

    __slots__ = (
        "_action_space",
        "_custom_data",
        "_observation_space",
        "agent_id",
        "id_",
        "module_id",
        "multi_agent_episode_id",
    )

    def __init__(
        self,
        id_: str | None = None,
        *,
        observations: Any = None,
        observation_space: gym.Space | None = None,
        infos: Any = None,
        actions: Any = None,
        action_space: gym.Space | None = None,
        rewards: Any = None,
        terminated: bool = False,
        truncated: bool = False,
        extra_model_outputs: dict[str, Any] | None = None,
        t_started: int | None = None,
        len_lookback_buffer: int | str = "auto",
        agent_id: Any = None,
        module_id: str | None = None,
        multi_agent_episode_id: str | None = None,
    ) -> None:
        self.id_ = id_ or new_episode_id()
        self.agent_id = agent_id
        self.module_id = module_id
        self.multi_agent_episode_id = multi_agent_episode_id
        self._observation_space = observation_space
        self._action_space = action_space
        # Made on first use: most episodes never get custom data (a dict is 64 bytes).
        self._custom_data: dict[str, Any] | None = None
        if observation_space is not None:
            self._set_space("observations", observation_space)
        if action_space is not None:
            self._set_space("actions", action_space)

        num_rewards = len(rewards) if rewards is not None else 0
        if len_lookback_buffer == "auto" or int(len_lookback_buffer) > num_rewards:
            lookback = num_rewards
        else:
            lookback = int(len_lookback_buffer)
        if (
            observations is None
            and infos is None
            and actions is None
            and rewards is None
            and not extra_model_outputs
            and not (terminated or truncated)
        ):
            # A blank episode (the runners make one per episode): nothing to load, and an
            # empty episode always validates.
            self.t_started = self.t = t_started or 0
            return
        for field, data in zip(_FIELDS, (observations, infos, actions, rewards), strict=True):
            if field == "infos" and not infos:
                # RLlib's default: an empty dict per observation (made when first read).
                self._extend_empty_infos(len(observations) if observations is not None else 0)
            elif data is not None:
                self._extend(field, data)
            self._set_lookback(field, lookback)
        for key, data in (extra_model_outputs or {}).items():
            self._extend("extra_model_outputs", data, key=key)
            self._set_lookback("extra_model_outputs", lookback, key=key)
        self.t_started = t_started or 0
        self.t = self._field_len("rewards") + self.t_started
        self.is_terminated = bool(terminated)
        self.is_truncated = bool(truncated)
        self.validate()

    def _successor(self) -> SingleAgentEpisode:
        """A blank episode with this one's identity and spaces, for cut/slice to fill."""
        episode = type(self).__new__(type(self))
        episode.id_ = self.id_
        episode.agent_id = self.agent_id
        episode.module_id = self.module_id
        episode.multi_agent_episode_id = self.multi_agent_episode_id
        episode._observation_space = self._observation_space
        episode._action_space = self._action_space
        episode._custom_data = None
        return episode

    def _blank_for_agent(
        self, id_: str, agent_id: Any, module_id: Any, multi_agent_episode_id: str
    ) -> SingleAgentEpisode:
        """:meth:`_blank_like` with the given identity (a multi-agent episode's new agent).

        Args:
            id_: The new episode's id.
            agent_id: Its agent.
            module_id: Its module.
            multi_agent_episode_id: The id of the multi-agent episode it belongs to.

        Returns:
            The new blank episode.

        Raises:
            EpisodeStateError: If this episode holds data.
        """
        episode = type(self).__new__(type(self))
        episode.id_ = id_
        episode.agent_id = agent_id
        episode.module_id = module_id
        episode.multi_agent_episode_id = multi_agent_episode_id
        episode._observation_space = self._observation_space
        episode._action_space = self._action_space
        episode._custom_data = None
        self._blank_into(episode)
        return episode

    def _blank_like(self) -> SingleAgentEpisode:
        """A new blank episode (a new ``id_``) with this blank one's spaces and metadata.

        What the constructor makes with the same arguments, without inferring the
        layouts from the spaces again: the runners make one per episode.

        Raises:
            EpisodeStateError: If this episode holds data.
        """
        episode = self._successor()
        episode.id_ = new_episode_id()
        self._blank_into(episode)
        return episode

    # add_env_reset, add_env_step, validate, t, t_started, is_terminated, is_truncated,
    # is_done, is_reset and is_numpy are native (SingleAgentEpisodeCore).

    # ------------------------------------------------------------------ metadata

    @property
    def custom_data(self) -> dict[str, Any]:
        """Free-form per-episode data for callbacks and connectors."""
        if self._custom_data is None:
            self._custom_data = {}
        return self._custom_data

    @property
    def observation_space(self) -> gym.Space | None:
        """The observation space, if one was given."""
        return self._observation_space

    @observation_space.setter
    def observation_space(self, value: gym.Space | None) -> None:
        self._observation_space = value
        self._set_space("observations", value)

    @property
    def action_space(self) -> gym.Space | None:
        """The action space, if one was given."""
        return self._action_space

    @action_space.setter
    def action_space(self, value: gym.Space | None) -> None:
        self._action_space = value
        self._set_space("actions", value)

    # to_numpy and its seed-era name finalize are native.

    # ------------------------------------------------------------------ chunks

    def concat_episode(self, other: SingleAgentEpisode) -> None:
        """Appends `other`, the chunk that continues this episode.

        Args:
            other: A chunk with the same ``id_`` whose ``t_started`` is this one's ``t``
                and whose first observation is this one's last.

        Raises:
            EpisodeStateError: If `other` does not continue this episode, or this one is
                done.
        """
        if other.id_ != self.id_:
            raise EpisodeStateError(
                f"concat_episode: ids differ ({other.id_!r} continues no episode {self.id_!r})"
            )
        # The core's checks (done, t, lengths) before the observations are read.
        self._check_concat(other)
        if not _same_item(other.get_observations(0), self.get_observations(-1)):
            raise EpisodeStateError(
                "concat_episode: the other chunk's first observation is not this one's last"
            )
        self._concat(other)
        if other._custom_data:
            self.custom_data.update(other._custom_data)

    def cut(self, len_lookback_buffer: int = 0) -> SingleAgentEpisode:
        """Returns the successor chunk, which continues this episode from ``t``.

        The successor has the same ``id_``, starts at ``t_started = self.t`` with an
        empty chunk, and keeps the last `len_lookback_buffer` steps as look-back. This
        episode is left unchanged. Unlike RLlib 2.60, the successor keeps ``agent_id``,
        ``module_id`` and ``multi_agent_episode_id`` (it is the same agent's episode).

        Args:
            len_lookback_buffer: How many past steps the successor keeps as look-back.

        Returns:
            The successor chunk; ``custom_data`` is deep-copied into it.

        Raises:
            EpisodeStateError: If the episode is done or `len_lookback_buffer` < 0.
        """
        if len_lookback_buffer < 0:
            raise EpisodeStateError(
                f"cut: len_lookback_buffer must be >= 0, got {len_lookback_buffer}"
            )
        successor = self._successor()
        self._cut_into(successor, len_lookback_buffer)
        successor._custom_data = copy.deepcopy(self._custom_data)
        return successor

    def slice(self, slice_: slice, *, len_lookback_buffer: int | None = None) -> SingleAgentEpisode:
        """Returns the steps selected by `slice_` as a new episode.

        Args:
            slice_: Which steps (relative to the chunk start; negative bounds count from
                the end).
            len_lookback_buffer: How many steps before the slice start to keep as
                look-back (default: as many as this episode has).

        Returns:
            The new episode; it is done only if the slice reaches this one's end.

        Raises:
            EpisodeStateError: If a stepped slice leaves the fields' lengths inconsistent.
            ValueError: If the slice step is 0.
        """
        sliced = self._successor()
        self._slice_into(sliced, slice_.start, slice_.stop, slice_.step, len_lookback_buffer)
        return sliced

    def __getitem__(self, item: builtins.slice) -> SingleAgentEpisode:
        """``episode[a:b]`` is ``episode.slice(slice(a, b))``.

        Raises:
            NotImplementedError: For anything but a slice.
        """
        if isinstance(item, slice):
            return self.slice(item)
        raise NotImplementedError(
            f"SingleAgentEpisode supports only slices (episode[a:b]), not {item!r}"
        )

    # The getters (get_observations, get_infos, get_actions, get_rewards,
    # get_extra_model_outputs) and setters (set_observations, set_actions, set_rewards,
    # set_extra_model_outputs) are native.

    # ------------------------------------------------------------------ buffers

    @property
    def observations(self) -> LookbackBufferView:
        """The observations as RLlib's ``InfiniteLookbackBuffer`` (a live view)."""
        return LookbackBufferView(self, "observations")

    @property
    def infos(self) -> LookbackBufferView:
        """The infos as RLlib's ``InfiniteLookbackBuffer`` (a live view)."""
        return LookbackBufferView(self, "infos")

    @property
    def actions(self) -> LookbackBufferView:
        """The actions as RLlib's ``InfiniteLookbackBuffer`` (a live view)."""
        return LookbackBufferView(self, "actions")

    @property
    def rewards(self) -> LookbackBufferView:
        """The rewards as RLlib's ``InfiniteLookbackBuffer`` (a live view)."""
        return LookbackBufferView(self, "rewards")

    @property
    def extra_model_outputs(self) -> ExtraModelOutputsView:
        """The extra model outputs as RLlib's dict of buffers (key -> live view).

        Setting a key takes a buffer, a list or an array (see ExtraModelOutputsView).
        """
        return ExtraModelOutputsView(self)

    # get_return, get_duration_s, env_steps, agent_steps and __len__ are native.

    def __repr__(self) -> str:
        return f"SAEps(len={len(self)} done={self.is_done} R={self.get_return()} id_={self.id_})"

    def get_data_dict(self) -> dict[str, Any]:
        """The chunk as a dict of columns (RLlib's column names).

        Returns:
            ``obs`` (without the last observation), ``actions``, ``rewards``,
            ``terminateds``, ``truncateds``, ``t``, ``eps_id``, ``infos`` and the extra
            model outputs by key.
        """
        n = len(self)
        data: dict[str, Any] = {
            "terminateds": [False] * (n - 1) + [self.is_terminated],
            "truncateds": [False] * (n - 1) + [self.is_truncated],
            "t": list(range(self.t_started, self.t)),
            "eps_id": [self.id_] * n,
        }
        if self.is_numpy:
            data = {k: np.array(v) for k, v in data.items()}
        data["obs"] = self.get_observations(slice(None, -1))
        data["infos"] = self.get_infos(slice(None, -1))
        data["actions"] = self.get_actions()
        data["rewards"] = self.get_rewards()
        data.update((k, self.get_extra_model_outputs(k)) for k in self._extra_keys())
        return data

    # ------------------------------------------------------------------ state

    def _field_state(
        self, field: str, key: str | None = None, *, rllib: bool = False, packed: bool = False
    ) -> dict[str, Any]:
        if rllib:
            return LookbackBufferView(self, field, key).get_state()
        finalized = self._is_finalized(field, key)
        stored = self._packed_state(field, key) if packed else None
        if stored is not None:
            # Compressed observations travel as they are stored (a sealed chunk of frames
            # is a few kB instead of its raw megabytes) and arrive compressed.
            return {"packed": stored, "finalized": finalized}
        lookback = self._lookback(field, key)
        data = self._get(field, key, slice(-lookback, None), True, None, False)
        return {"data": data, "lookback": lookback, "finalized": finalized}

    def get_state(self) -> dict[str, Any]:
        """All of the episode as plain data, in the form of RLlib's ``get_state()``.

        For checkpoints and Ray. Where RLlib is installed, the spaces are serialized as
        RLlib serializes them (``gym_space_to_dict``) and each buffer's state carries its
        space, so that RLlib's ``SingleAgentEpisode.from_state`` (which RLlib's replay
        buffers' ``set_state`` calls) rebuilds the episode too; pickling and copies skip
        that serialization.

        Returns:
            A dict that :meth:`from_state` turns back into an equal episode.
        """
        return self._state(rllib=True)

    def _state(self, *, rllib: bool, packed: bool = False) -> dict[str, Any]:
        """The episode's state.

        With ``rllib``, in RLlib's form (see :meth:`get_state`); else with the space
        objects themselves, for pickling and copies (serializing a Box costs tens of
        microseconds). With ``packed``, compressed fields keep their stored blocks (for
        pickling and copies; a checkpoint or an offline file gets their items).
        """
        space = space_state if rllib else _same
        field_state = functools.partial(self._field_state, rllib=rllib, packed=packed)
        return {
            "id_": self.id_,
            "agent_id": self.agent_id,
            "module_id": self.module_id,
            "multi_agent_episode_id": self.multi_agent_episode_id,
            "observations": field_state("observations"),
            "actions": field_state("actions"),
            "rewards": field_state("rewards"),
            "infos": field_state("infos"),
            "extra_model_outputs": {
                k: field_state("extra_model_outputs", k) for k in self._extra_keys()
            },
            "is_terminated": self.is_terminated,
            "is_truncated": self.is_truncated,
            "t_started": self.t_started,
            "t": self.t,
            "_observation_space": space(self._observation_space),
            "_action_space": space(self._action_space),
            "_start_time": self._start_time,
            "_last_step_time": self._last_step_time,
            "custom_data": self.custom_data,
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> SingleAgentEpisode:
        """Rebuilds an episode from :meth:`get_state`'s dict, or from RLlib's episode's.

        Args:
            state: The dict.

        Returns:
            The episode.

        Raises:
            ValueError: For a serialized space of a kind outside gymnasium's (one of
                RLlib's own) where RLlib is not installed.
        """
        episode = cls(
            state["id_"],
            observation_space=_space_from_state(state["_observation_space"]),
            action_space=_space_from_state(state["_action_space"]),
            agent_id=state["agent_id"],
            module_id=state["module_id"],
            multi_agent_episode_id=state["multi_agent_episode_id"],
        )
        fields: list[tuple[str, str | None, dict[str, Any]]] = [
            (f, None, state[f]) for f in _FIELDS
        ]
        fields += [
            ("extra_model_outputs", k, s) for k, s in (state["extra_model_outputs"] or {}).items()
        ]
        for field, key, fstate in fields:
            if isinstance(fstate, dict) and "packed" in fstate:
                episode._set_packed_state(field, fstate["packed"], fstate["finalized"], key=key)
                continue
            if not isinstance(fstate, dict):
                # RLlib's get_state keeps a buffer without chunk items as the buffer itself.
                fstate = {"data": fstate.data, "lookback": fstate.lookback}
            episode._extend(field, fstate["data"], key=key)
            episode._set_lookback(field, fstate["lookback"], key=key)
        episode.t_started = state["t_started"]
        episode.t = state["t"]
        episode.is_terminated = state["is_terminated"]
        episode.is_truncated = state["is_truncated"]
        episode._start_time = state["_start_time"]
        episode._last_step_time = state["_last_step_time"]
        episode._custom_data = state.get("custom_data", {})
        episode.validate()
        return episode

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self).from_state, (self._state(rllib=False, packed=True),))

    def __copy__(self) -> SingleAgentEpisode:
        return type(self).from_state(self._state(rllib=False, packed=True))

    def __deepcopy__(self, memo: dict[int, Any]) -> SingleAgentEpisode:
        return type(self).from_state(copy.deepcopy(self._state(rllib=False, packed=True), memo))
