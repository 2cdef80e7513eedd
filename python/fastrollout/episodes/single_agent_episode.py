"""The single-agent episode: RLlib 2.60's ``SingleAgentEpisode`` on native buffers.

All data lives in a :class:`fastrollout._core.SingleAgentBuffers` (typed Rust columns with
look-back); this class keeps identity and metadata and forwards every data operation in a
single native call, so recording a step costs one call whatever the data looks like.
"""

from __future__ import annotations

import copy
import time
import uuid
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from fastrollout._core import SingleAgentBuffers
from fastrollout.errors import EpisodeStateError

Index = int | list[int] | slice | None

_FIELDS = ("observations", "infos", "actions", "rewards")


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


class SingleAgentEpisode:
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

    Example:
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
        "_buffers",
        "_custom_data",
        "_last_step_time",
        "_observation_space",
        "_start_time",
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
        self.id_ = id_ or uuid.uuid4().hex
        self.agent_id = agent_id
        self.module_id = module_id
        self.multi_agent_episode_id = multi_agent_episode_id
        self._observation_space = observation_space
        self._action_space = action_space
        self._custom_data: dict[str, Any] = {}
        self._start_time: float | None = None
        self._last_step_time: float | None = None
        self._buffers = SingleAgentBuffers(observation_space, action_space)

        num_rewards = len(rewards) if rewards is not None else 0
        if len_lookback_buffer == "auto" or int(len_lookback_buffer) > num_rewards:
            lookback = num_rewards
        else:
            lookback = int(len_lookback_buffer)
        if not infos and observations is not None:
            infos = [{} for _ in range(len(observations))]
        buffers = self._buffers
        for field, data in zip(_FIELDS, (observations, infos, actions, rewards), strict=True):
            if data is not None:
                buffers.extend(field, data)
            buffers.set_lookback(field, lookback)
        for key, data in (extra_model_outputs or {}).items():
            buffers.extend("extra_model_outputs", data, key=key)
            buffers.set_lookback("extra_model_outputs", lookback, key=key)
        buffers.t_started = t_started or 0
        buffers.t = buffers.field_len("rewards") + buffers.t_started
        buffers.is_terminated = bool(terminated)
        buffers.is_truncated = bool(truncated)
        buffers.validate()

    @classmethod
    def _from_buffers(
        cls, source: SingleAgentEpisode, buffers: SingleAgentBuffers
    ) -> SingleAgentEpisode:
        """A new episode around `buffers`, with `source`'s identity and spaces."""
        episode = cls.__new__(cls)
        episode.id_ = source.id_
        episode.agent_id = source.agent_id
        episode.module_id = source.module_id
        episode.multi_agent_episode_id = source.multi_agent_episode_id
        episode._observation_space = source._observation_space
        episode._action_space = source._action_space
        episode._custom_data = {}
        episode._start_time = None
        episode._last_step_time = None
        episode._buffers = buffers
        return episode

    # ------------------------------------------------------------------ recording

    def add_env_reset(self, observation: Any, infos: dict | None = None) -> None:
        """Records the reset observation (and its infos).

        Args:
            observation: The observation returned by ``env.reset()``.
            infos: The infos returned with it.

        Raises:
            EpisodeStateError: If the episode already holds observations, is done, or
                does not start at t=0.
            SpaceMismatchError: If the observation does not fit the observation space.
        """
        if self.is_done:
            raise EpisodeStateError("add_env_reset: the episode is done")
        if self._buffers.t_started != 0:
            raise EpisodeStateError(
                f"add_env_reset: a reset starts at t=0, this episode starts at "
                f"t_started={self._buffers.t_started}"
            )
        self._buffers.add_reset(observation, infos or {})
        self._start_time = time.perf_counter()

    def add_env_step(
        self,
        observation: Any,
        action: Any,
        reward: Any,
        infos: dict | None = None,
        *,
        terminated: bool = False,
        truncated: bool = False,
        extra_model_outputs: dict[str, Any] | None = None,
    ) -> None:
        """Records one environment step (one native call for all fields).

        Args:
            observation: The observation after the step.
            action: The action that was taken.
            reward: The reward received.
            infos: The infos returned with the observation.
            terminated: Whether the episode terminated with this step.
            truncated: Whether the episode was truncated with this step.
            extra_model_outputs: Extra model outputs of the action, by key.

        Raises:
            EpisodeStateError: If the episode is done or was never reset.
            SpaceMismatchError: If the observation or action does not fit its space.
            TypeError: If the reward is not a real number.
        """
        self._buffers.add_step(
            observation,
            action,
            reward,
            infos or {},
            terminated,
            truncated,
            extra_model_outputs,
        )
        self._last_step_time = now = time.perf_counter()
        if self._start_time is None:
            self._start_time = now

    def validate(self) -> None:
        """Checks that the fields' lengths fit together.

        Raises:
            EpisodeStateError: Naming the field whose length is off.
        """
        self._buffers.validate()

    # ------------------------------------------------------------------ state flags

    @property
    def t(self) -> int:
        """The env step at the end of the chunk."""
        return self._buffers.t

    @t.setter
    def t(self, value: int) -> None:
        self._buffers.t = value

    @property
    def t_started(self) -> int:
        """The env step at which the chunk starts."""
        return self._buffers.t_started

    @t_started.setter
    def t_started(self, value: int) -> None:
        self._buffers.t_started = value

    @property
    def is_terminated(self) -> bool:
        """Whether the episode terminated."""
        return self._buffers.is_terminated

    @is_terminated.setter
    def is_terminated(self, value: bool) -> None:
        self._buffers.is_terminated = bool(value)

    @property
    def is_truncated(self) -> bool:
        """Whether the episode was truncated."""
        return self._buffers.is_truncated

    @is_truncated.setter
    def is_truncated(self, value: bool) -> None:
        self._buffers.is_truncated = bool(value)

    @property
    def is_done(self) -> bool:
        """Whether the episode is terminated or truncated."""
        return self._buffers.is_terminated or self._buffers.is_truncated

    @property
    def is_reset(self) -> bool:
        """Whether the chunk holds at least one observation."""
        return self._buffers.field_len("observations") > 0

    @property
    def is_numpy(self) -> bool:
        """Whether reads return batched numpy arrays (after :meth:`to_numpy`)."""
        return self._buffers.is_finalized("rewards")

    @property
    def custom_data(self) -> dict[str, Any]:
        """Free-form per-episode data for callbacks and connectors."""
        return self._custom_data

    @property
    def observation_space(self) -> gym.Space | None:
        """The observation space, if one was given."""
        return self._observation_space

    @observation_space.setter
    def observation_space(self, value: gym.Space | None) -> None:
        self._observation_space = value
        self._buffers.set_space("observations", value)

    @property
    def action_space(self) -> gym.Space | None:
        """The action space, if one was given."""
        return self._action_space

    @action_space.setter
    def action_space(self, value: gym.Space | None) -> None:
        self._action_space = value
        self._buffers.set_space("actions", value)

    # ------------------------------------------------------------------ numpy

    def to_numpy(self) -> SingleAgentEpisode:
        """Switches reads to batched numpy arrays (RLlib's ``to_numpy``).

        Observations always switch; actions, rewards and extra model outputs once the
        chunk has at least one step; infos stay a list of dicts.

        Returns:
            This episode.

        Raises:
            EpisodeStateError: If the fields' lengths do not fit together.
            ValueError: If the episode holds no observation at all.
        """
        self._buffers.to_numpy()
        return self

    def finalize(self) -> SingleAgentEpisode:
        """The seed-era name of :meth:`to_numpy`.

        Returns:
            This episode.
        """
        return self.to_numpy()

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
        if self.is_done:
            raise EpisodeStateError("concat_episode: this episode is done")
        if self.t != other.t_started:
            raise EpisodeStateError(
                f"concat_episode: this episode ends at t={self.t} but the other starts at "
                f"t_started={other.t_started}"
            )
        self.validate()
        other.validate()
        if not _same_item(other.get_observations(0), self.get_observations(-1)):
            raise EpisodeStateError(
                "concat_episode: the other chunk's first observation is not this one's last"
            )
        self._buffers.concat(other._buffers)
        self._custom_data.update(other.custom_data)

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
        successor = self._from_buffers(self, self._buffers.cut(len_lookback_buffer))
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
        buffers = self._buffers.slice(slice_.start, slice_.stop, slice_.step, len_lookback_buffer)
        return self._from_buffers(self, buffers)

    def __getitem__(self, item: slice) -> SingleAgentEpisode:
        """``episode[a:b]`` is ``episode.slice(slice(a, b))``.

        Raises:
            NotImplementedError: For anything but a slice.
        """
        if isinstance(item, slice):
            return self.slice(item)
        raise NotImplementedError(
            f"SingleAgentEpisode supports only slices (episode[a:b]), not {item!r}"
        )

    # ------------------------------------------------------------------ getters

    def get_observations(
        self,
        indices: Index = None,
        *,
        neg_index_as_lookback: bool = False,
        fill: Any = None,
        one_hot_discrete: bool = False,
    ) -> Any:
        """Reads observations.

        Args:
            indices: None (the whole chunk), an int, a list of ints or a slice; relative
                to the chunk start, negative ints from the end.
            neg_index_as_lookback: Negative indices reach into the look-back (-1 = the
                last item before the chunk).
            fill: Value for positions outside the stored data (instead of an error or
                clipping).
            one_hot_discrete: One-hot encode Discrete/MultiDiscrete parts (float32).

        Returns:
            One item, a list of items (before :meth:`to_numpy`) or batched arrays.

        Raises:
            IndexError: For an int index outside the data without `fill`.
            ValueError: For `one_hot_discrete` without an observation space.
        """
        return self._buffers.get(
            "observations", None, indices, neg_index_as_lookback, fill, one_hot_discrete
        )

    def get_infos(
        self, indices: Index = None, *, neg_index_as_lookback: bool = False, fill: Any = None
    ) -> Any:
        """Reads infos; arguments as in :meth:`get_observations`.

        Returns:
            One info dict or a list of them.

        Raises:
            IndexError: For an int index outside the data without `fill`.
        """
        return self._buffers.get("infos", None, indices, neg_index_as_lookback, fill, False)

    def get_actions(
        self,
        indices: Index = None,
        *,
        neg_index_as_lookback: bool = False,
        fill: Any = None,
        one_hot_discrete: bool = False,
    ) -> Any:
        """Reads actions; arguments as in :meth:`get_observations`.

        Returns:
            One action, a list of actions, or batched arrays.

        Raises:
            IndexError: For an int index outside the data without `fill`.
            ValueError: For `one_hot_discrete` without an action space.
        """
        return self._buffers.get(
            "actions", None, indices, neg_index_as_lookback, fill, one_hot_discrete
        )

    def get_rewards(
        self, indices: Index = None, *, neg_index_as_lookback: bool = False, fill: Any = None
    ) -> Any:
        """Reads rewards; arguments as in :meth:`get_observations`.

        Returns:
            One reward, a list of rewards, or an array.

        Raises:
            IndexError: For an int index outside the data without `fill`.
        """
        return self._buffers.get("rewards", None, indices, neg_index_as_lookback, fill, False)

    def get_extra_model_outputs(
        self,
        key: str,
        indices: Index = None,
        *,
        neg_index_as_lookback: bool = False,
        fill: Any = None,
    ) -> Any:
        """Reads one extra model output; arguments as in :meth:`get_observations`.

        Args:
            key: The extra model output's key.
            indices: See :meth:`get_observations`.
            neg_index_as_lookback: See :meth:`get_observations`.
            fill: See :meth:`get_observations`.

        Returns:
            One item, a list of items, or batched arrays.

        Raises:
            KeyError: If there is no extra model output under `key`.
            IndexError: For an int index outside the data without `fill`.
        """
        return self._buffers.get(
            "extra_model_outputs", key, indices, neg_index_as_lookback, fill, False
        )

    @property
    def extra_model_outputs(self) -> dict[str, Any]:
        """The extra model outputs of the chunk, by key (a read-only snapshot)."""
        return {k: self.get_extra_model_outputs(k) for k in self._buffers.extra_keys()}

    # ------------------------------------------------------------------ setters

    def set_observations(
        self, *, new_data: Any, at_indices: Index = None, neg_index_as_lookback: bool = False
    ) -> None:
        """Overwrites observations in place.

        Args:
            new_data: One item (int index), a list of items, or a batch.
            at_indices: None (the whole chunk), an int, a list of ints or a slice.
            neg_index_as_lookback: Negative indices reach into the look-back.

        Raises:
            IndexError: If an index is out of range or `new_data` has the wrong length.
            SpaceMismatchError: If a value does not fit the field's dtype and shape.
        """
        self._buffers.set("observations", new_data, None, at_indices, neg_index_as_lookback)

    def set_actions(
        self, *, new_data: Any, at_indices: Index = None, neg_index_as_lookback: bool = False
    ) -> None:
        """Overwrites actions in place; arguments as in :meth:`set_observations`.

        Raises:
            IndexError: If an index is out of range or `new_data` has the wrong length.
            SpaceMismatchError: If a value does not fit the field's dtype and shape.
        """
        self._buffers.set("actions", new_data, None, at_indices, neg_index_as_lookback)

    def set_rewards(
        self, *, new_data: Any, at_indices: Index = None, neg_index_as_lookback: bool = False
    ) -> None:
        """Overwrites rewards in place; arguments as in :meth:`set_observations`.

        Raises:
            IndexError: If an index is out of range or `new_data` has the wrong length.
            SpaceMismatchError: If a value does not fit the field's dtype and shape.
        """
        self._buffers.set("rewards", new_data, None, at_indices, neg_index_as_lookback)

    def set_extra_model_outputs(
        self,
        *,
        key: str,
        new_data: Any,
        at_indices: Index = None,
        neg_index_as_lookback: bool = False,
    ) -> None:
        """Overwrites one extra model output in place.

        Args:
            key: The extra model output's key.
            new_data: See :meth:`set_observations`.
            at_indices: See :meth:`set_observations`.
            neg_index_as_lookback: See :meth:`set_observations`.

        Raises:
            KeyError: If there is no extra model output under `key`.
            IndexError: If an index is out of range or `new_data` has the wrong length.
        """
        self._buffers.set("extra_model_outputs", new_data, key, at_indices, neg_index_as_lookback)

    # ------------------------------------------------------------------ summaries

    def get_return(self) -> float:
        """The sum of the chunk's rewards.

        Returns:
            The return of this chunk (look-back not counted).
        """
        return self._buffers.get_return()

    def get_duration_s(self) -> float:
        """Seconds between the first and the last recorded step.

        Returns:
            The wall-clock duration, 0.0 before the first step.
        """
        if self._last_step_time is None or self._start_time is None:
            return 0.0
        return self._last_step_time - self._start_time

    def env_steps(self) -> int:
        """Env steps in the chunk.

        Returns:
            ``len(self)``.
        """
        return len(self)

    def agent_steps(self) -> int:
        """Agent steps in the chunk (equal to env steps for a single agent).

        Returns:
            ``len(self)``.
        """
        return len(self)

    def __len__(self) -> int:
        return self._buffers.t - self._buffers.t_started

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
        data.update(self.extra_model_outputs)
        return data

    # ------------------------------------------------------------------ state

    def _field_state(self, field: str, key: str | None = None) -> dict[str, Any]:
        lookback = self._buffers.lookback(field, key)
        data = self._buffers.get(field, key, slice(-lookback, None), True, None, False)
        return {
            "data": data,
            "lookback": lookback,
            "finalized": self._buffers.is_finalized(field, key),
        }

    def get_state(self) -> dict[str, Any]:
        """All of the episode as plain Python/numpy data (for checkpoints and Ray).

        Returns:
            A dict that :meth:`from_state` turns back into an equal episode.
        """
        return {
            "id_": self.id_,
            "agent_id": self.agent_id,
            "module_id": self.module_id,
            "multi_agent_episode_id": self.multi_agent_episode_id,
            "observations": self._field_state("observations"),
            "actions": self._field_state("actions"),
            "rewards": self._field_state("rewards"),
            "infos": self._field_state("infos"),
            "extra_model_outputs": {
                k: self._field_state("extra_model_outputs", k) for k in self._buffers.extra_keys()
            },
            "is_terminated": self.is_terminated,
            "is_truncated": self.is_truncated,
            "t_started": self.t_started,
            "t": self.t,
            "_observation_space": self._observation_space,
            "_action_space": self._action_space,
            "_start_time": self._start_time,
            "_last_step_time": self._last_step_time,
            "custom_data": self._custom_data,
        }

    @staticmethod
    def from_state(state: dict[str, Any]) -> SingleAgentEpisode:
        """Rebuilds an episode from :meth:`get_state`'s dict.

        Args:
            state: The dict.

        Returns:
            The episode.
        """
        episode = SingleAgentEpisode(
            state["id_"],
            observation_space=state["_observation_space"],
            action_space=state["_action_space"],
            agent_id=state["agent_id"],
            module_id=state["module_id"],
            multi_agent_episode_id=state["multi_agent_episode_id"],
        )
        buffers = episode._buffers
        fields: list[tuple[str, str | None, dict[str, Any]]] = [
            (f, None, state[f]) for f in _FIELDS
        ]
        fields += [
            ("extra_model_outputs", k, s) for k, s in (state["extra_model_outputs"] or {}).items()
        ]
        for field, key, fstate in fields:
            buffers.extend(field, fstate["data"], key=key)
            buffers.set_lookback(field, fstate["lookback"], key=key)
        buffers.t_started = state["t_started"]
        buffers.t = state["t"]
        buffers.is_terminated = state["is_terminated"]
        buffers.is_truncated = state["is_truncated"]
        episode._start_time = state["_start_time"]
        episode._last_step_time = state["_last_step_time"]
        episode._custom_data = state.get("custom_data", {})
        episode.validate()
        return episode

    def __reduce__(self) -> tuple[Any, ...]:
        return (SingleAgentEpisode.from_state, (self.get_state(),))

    def __copy__(self) -> SingleAgentEpisode:
        return SingleAgentEpisode.from_state(self.get_state())

    def __deepcopy__(self, memo: dict[int, Any]) -> SingleAgentEpisode:
        return SingleAgentEpisode.from_state(copy.deepcopy(self.get_state(), memo))
