"""``ExternalEnv`` and ``ExternalMultiAgentEnv``: simulators that drive themselves.

A simulator that cannot be stepped (a game engine, a robot, a trading system) runs its own
loop and asks for actions. Subclass :class:`ExternalEnv` (RLlib 2.60's API), put the loop
in ``run()``, and call ``start_episode`` / ``get_action`` or ``log_action`` /
``log_returns`` / ``end_episode`` from it, for as many episodes at once as the simulator
runs. A runner built with such an env starts the thread and samples it like any other:
every turn it acts, in one forward pass per module, for all episodes that wait.

The env is the meeting point of two sides. The simulator's threads call the methods
above; each call that carries an observation becomes an *event* in its episode's queue,
with the rewards logged since the previous action. The runner's thread (through
``fastrollout.runners.sub_envs.external.ExternalSubEnvs``) takes the events, one per
episode per turn, and answers the actions. One lock guards both sides.
"""

from __future__ import annotations

import collections
import threading
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from fastrollout.env.check import space_mismatch

__all__ = ["ExternalEnv", "ExternalEnvClosedError", "ExternalEnvCreated", "ExternalMultiAgentEnv"]

#: Episodes served at once by default (the rows of one forward pass at most).
DEFAULT_MAX_CONCURRENT = 64


class ExternalEnvCreated(Exception):
    """An env creator made an ``ExternalEnv``: its runner serves it instead of stepping it.

    Raised by the creator a runner's sub-env backend calls, and caught where the
    backend is chosen (``fastrollout.runners.sub_envs.make_sub_envs``).

    Args:
        env: The external env.
    """

    def __init__(self, env: ExternalEnv) -> None:
        super().__init__(
            f"the env creator made an ExternalEnv ({type(env).__name__}), which a runner "
            "serves rather than steps"
        )
        self.env = env


class ExternalEnvClosedError(RuntimeError):
    """The runner closed the env (or the episode was truncated) before it acted."""


def conform(space: gym.Space[Any], value: Any) -> Any:
    """``value`` as an element of ``space``: numbers and lists cast to its dtype.

    Args:
        space: A gymnasium space.
        value: A value meant for it (numpy arrays, numbers, lists, dicts, tuples).

    Returns:
        The value, cast where the space has a dtype.

    Raises:
        ValueError: If the value is not in the space (the message names what differs).
    """
    if type(value) is np.ndarray and type(space) is gym.spaces.Box:
        # The common case (a float array for a Box) in about 1.3 us instead of 5.5.
        fast = _box_check(space)
        if fast(value):
            return value
    out = _cast(space, value)
    if not space.contains(out):
        why = space_mismatch(space, out) or f"{value!r} is not in {space}"
        raise ValueError(why)
    return out


def conform_value(
    value: Any, what: str, space: gym.Space[Any] | Callable[[Any], gym.Space[Any]]
) -> Any:
    """An observation or action :func:`conform`-ed to its space; errors name ``what``.

    Args:
        value: The value (multi-agent: a dict agent id -> value).
        what: What the value is (``"observation"``, ``"action"``), for messages.
        space: Its space, or (multi-agent) ``agent id -> that agent's space``, which
            raises ``ValueError`` for an unknown agent.

    Returns:
        The value, cast where the space has a dtype (multi-agent: a new dict).

    Raises:
        ValueError: If the value (or an agent's) is not in its space, or a multi-agent
            value is not a dict.
    """
    if isinstance(space, gym.Space):
        try:
            return conform(space, value)
        except ValueError as err:
            raise ValueError(f"{what} outside the {what} space: {err}") from None
    if not isinstance(value, Mapping):
        raise ValueError(f"expected a dict agent id -> {what}, got {type(value).__name__}")
    out = {}
    for aid, v in value.items():
        agent_space = space(aid)
        try:
            out[aid] = conform(agent_space, v)
        except ValueError as err:
            raise ValueError(f"agent {aid!r}: {what} outside its space: {err}") from None
    return out


_BOX_CHECKS: dict[int, tuple[gym.spaces.Box, Callable[[np.ndarray], bool]]] = {}


def _box_check(space: gym.spaces.Box) -> Callable[[np.ndarray], bool]:
    """A check of arrays of ``space``'s dtype and shape against its bounds.

    True only where ``space.contains`` is True; False sends the value through the full
    check (which also casts and explains).
    """
    cached = _BOX_CHECKS.get(id(space))
    if cached is not None and cached[0] is space:
        return cached[1]
    dtype, shape, low, high = space.dtype, space.shape, space.low, space.high
    lo, hi = low.min(initial=np.inf), high.max(initial=-np.inf)
    minimum, maximum = np.minimum.reduce, np.maximum.reduce
    if (low == lo).all() and (high == hi).all() and dtype is not None and dtype.kind == "f":
        lo_f, hi_f = float(lo), float(hi)

        def check(a: np.ndarray) -> bool:
            # (NaN fails both comparisons, as it fails contains.)
            if a.dtype != dtype or a.shape != shape:
                return False
            return a.size == 0 or (lo_f <= minimum(a, axis=None) and maximum(a, axis=None) <= hi_f)
    else:

        def check(a: np.ndarray) -> bool:
            return a.dtype == dtype and a.shape == shape and bool(space.contains(a))

    _BOX_CHECKS[id(space)] = (space, check)
    return check


def _cast(space: gym.Space[Any], value: Any) -> Any:
    try:
        if isinstance(space, gym.spaces.Dict) and isinstance(value, Mapping):
            if set(value) != set(space.spaces):
                return value
            return {k: _cast(s, value[k]) for k, s in space.spaces.items()}
        if isinstance(space, gym.spaces.Tuple) and isinstance(value, (list, tuple)):
            if len(value) != len(space.spaces):
                return tuple(value)
            return tuple(_cast(s, v) for s, v in zip(space.spaces, value, strict=True))
        if isinstance(space, gym.spaces.Discrete):
            if isinstance(value, (bool, np.bool_)):
                return value
            return np.int64(value) if np.ndim(value) == 0 else value
        if isinstance(space, (gym.spaces.Box, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary)):
            a = np.asarray(value)
            if a.dtype == space.dtype or a.dtype.kind not in "biuf":
                return a
            cast = a.astype(space.dtype)
            # Only a cast that keeps every value (0.5 into an int space stays refused).
            return cast if np.array_equal(cast, a) or a.dtype.kind == "f" == cast.dtype.kind else a
    except (TypeError, ValueError):
        return value
    return value


class ExternalEnvEvent:
    """One observation of an episode with what came with it, in the runner's order."""

    __slots__ = (
        "action",
        "extras",
        "first",
        "info",
        "last",
        "logged",
        "observation",
        "on_action",
        "reward",
        "terminated",
        "truncated",
    )

    def __init__(
        self,
        observation: Any,
        reward: Any,
        info: Any,
        *,
        first: bool,
        last: bool = False,
        terminated: Any = False,
        truncated: Any = False,
        on_action: Callable[[Any], None] | None = None,
        logged: bool = False,
        action: Any = None,
        extras: dict[str, Any] | None = None,
    ) -> None:
        self.observation = observation
        self.reward = reward
        self.info = info
        self.first = first
        self.terminated = terminated
        self.truncated = truncated
        self.on_action = on_action
        self.logged = logged
        self.action = action
        self.extras = extras
        # Whether the event ends its episode (the flags may be per-agent dicts).
        self.last = last


class ExternalEnvEpisode:
    """An episode between ``start_episode`` and its end, on the simulator's side."""

    __slots__ = (
        "done_agents",
        "events",
        "id",
        "info",
        "last_observation",
        "observed",
        "reward",
        "slot",
        "training_enabled",
        "with_runner",
    )

    def __init__(self, episode_id: str, training_enabled: bool, multi_agent: bool) -> None:
        self.id = episode_id
        self.training_enabled = training_enabled
        self.events: collections.deque[ExternalEnvEvent] = collections.deque()
        # Rewards and infos logged since the last observation (per agent: dicts).
        self.reward: Any = {} if multi_agent else 0.0
        self.info: Any = {}
        self.done_agents: dict[Any, bool] = {}
        self.last_observation: Any = None
        self.observed = False
        # The runner's sub-env row this episode runs in (None: not given one yet).
        self.slot: int | None = None
        # The runner holds this episode's latest event and has not answered it yet.
        self.with_runner = False


class ExternalEnv(threading.Thread):
    """An environment whose simulator runs its own loop and asks for actions.

    Override ``run()`` with the simulator's loop. It calls ``start_episode`` for each
    episode (many may run at once, each from one thread at a time), then per step
    ``get_action`` (the policy's action, on-policy) or ``log_action`` (an action the
    simulator chose itself, off-policy), ``log_returns`` for the rewards, and
    ``end_episode`` with the last observation. The runner starts the thread when it
    builds its sub-envs and acts for every episode that waits, in one batched forward
    pass. Semantics follow RLlib 2.60's ``ExternalEnv``.

    Unlike RLlib's, observations and actions are checked against the spaces (a
    ``ValueError`` names what does not fit), ``log_action`` does not wait for the runner,
    and ``max_concurrent`` (which RLlib 2.60 refuses) is the number of episodes the runner
    serves at once; episodes beyond it wait for one of them to end.

    Args:
        action_space: The action space.
        observation_space: The observation space.
        max_concurrent: Episodes served at once (default 64).

    Examples:
        >>> class Sim(ExternalEnv):
        ...     def run(self):
        ...         while True:
        ...             eid = self.start_episode()
        ...             obs = self.observation_space.sample()
        ...             for _ in range(10):
        ...                 action = self.get_action(eid, obs)
        ...                 self.log_returns(eid, 1.0)
        ...             self.end_episode(eid, obs)
    """

    #: Multi-agent: observations, actions and rewards are per-agent dicts.
    multi_agent = False

    #: Once one episode waits for the policy, how long the runner waits for the others
    #: that run before it acts (it acts as soon as all of them wait): more episodes per
    #: forward pass against a little latency. The runner's ``remote_env_batch_wait_ms``
    #: replaces it where set (> 0).
    batch_wait_s = 0.001

    def __init__(
        self,
        action_space: gym.Space[Any],
        observation_space: gym.Space[Any],
        max_concurrent: int | None = None,
    ) -> None:
        threading.Thread.__init__(self, name=type(self).__name__, daemon=True)
        self.action_space = action_space
        self.observation_space = observation_space
        self.max_concurrent = int(max_concurrent or DEFAULT_MAX_CONCURRENT)
        if self.max_concurrent < 1:
            raise ValueError(f"max_concurrent must be >= 1, got {max_concurrent}")
        self._cond = threading.Condition()
        self._episodes: dict[str, ExternalEnvEpisode] = {}
        self._finished: set[str] = set()
        # Episodes whose next event the runner may take (FIFO: no episode starves).
        self._deliverable: collections.deque[ExternalEnvEpisode] = collections.deque()
        self._closed: str | None = None
        # An event wakes the runner only once this many episodes have one waiting (0: the
        # runner does not wait): a wake-up per event while it collects a batch would cost
        # both threads the GIL.
        self._wake_at = 0
        # What run() raised (the runner raises it instead of waiting forever).
        self._run_error: BaseException | None = None
        self._run_done = False
        self._weights: tuple[int, dict[str, Any], dict[str, Any]] | None = None

    # -- the simulator's side --------------------------------------------------------

    def run(self) -> None:
        """The simulator's loop: override it (see the class docstring).

        Raises:
            NotImplementedError: Always, here.
        """
        raise NotImplementedError(f"{type(self).__name__} must override run()")

    def start_episode(self, episode_id: str | None = None, training_enabled: bool = True) -> str:
        """Starts an episode.

        Args:
            episode_id: Its id (a new random hex id if None).
            training_enabled: Whether its experience is returned for training; if False
                it is served and counted in metrics only.

        Returns:
            The episode id.

        Raises:
            ValueError: If the id is already running or has completed.
        """
        if episode_id is None:
            episode_id = uuid.uuid4().hex
        episode_id = str(episode_id)
        with self._cond:
            self._check_open()
            if episode_id in self._finished:
                raise ValueError(f"Episode {episode_id} has already completed.")
            if episode_id in self._episodes:
                raise ValueError(f"Episode {episode_id} is already started")
            self._episodes[episode_id] = ExternalEnvEpisode(
                episode_id, bool(training_enabled), self.multi_agent
            )
        return episode_id

    def get_action(self, episode_id: str, observation: Any) -> Any:
        """Records an observation and waits for the policy's action (on-policy).

        Args:
            episode_id: The episode.
            observation: The current observation (per-agent dict, multi-agent).

        Returns:
            The action (per-agent dict, multi-agent).

        Raises:
            ValueError: For an unknown or finished episode, or an observation outside
                the observation space.
            RuntimeError: If the runner closed the env before it acted.
        """
        done = threading.Event()
        box: list[Any] = []

        def answer(action: Any) -> None:
            box.append(action)
            done.set()

        self.request_action(episode_id, observation, answer)
        done.wait()
        if isinstance(box[0], BaseException):
            raise box[0]
        return box[0]

    def request_action(
        self, episode_id: str, observation: Any, on_action: Callable[[Any], None]
    ) -> None:
        """Records an observation; ``on_action(action)`` gets the policy's action later.

        The non-blocking form of ``get_action`` (a server uses it to answer many
        simulators from one thread). ``on_action`` runs on the runner's thread, or gets
        an exception instance if the env is closed or the episode truncated first; it
        must return quickly.

        Args:
            episode_id: The episode.
            observation: The current observation.
            on_action: Called with the action (or an exception instance).

        Raises:
            ValueError: For an unknown or finished episode, or an observation outside
                the observation space.
        """
        obs = self._conform_observation(observation)
        with self._cond:
            self._push(self._get(episode_id), obs, on_action=on_action)

    def log_action(
        self,
        episode_id: str,
        observation: Any,
        action: Any,
        extra_model_outputs: dict[str, Any] | None = None,
    ) -> None:
        """Records an observation and the action the simulator took itself (off-policy).

        The runner records the action as given, with the module's log-probability of it
        (``action_logp``) where the module's outputs define one; ``extra_model_outputs``
        (the acting policy's own outputs, such as ``action_logp``) replace the module's.
        Does not wait for the runner.

        Args:
            episode_id: The episode.
            observation: The current observation.
            action: The action taken.
            extra_model_outputs: The acting policy's outputs for this step.

        Raises:
            ValueError: For an unknown or finished episode, or an observation or action
                outside its space.
        """
        obs = self._conform_observation(observation)
        act = self._conform_action(action)
        with self._cond:
            self._push(
                self._get(episode_id),
                obs,
                logged=True,
                action=act,
                extras=dict(extra_model_outputs) if extra_model_outputs else None,
            )

    def log_returns(
        self, episode_id: str, reward: float, info: dict[str, Any] | None = None
    ) -> None:
        """Adds a reward for the last action (rewards add up until the next action).

        Rewards logged before an episode's first action count toward its first step.

        Args:
            episode_id: The episode.
            reward: The reward.
            info: An info dict for the step (the latest one given before the next
                observation is recorded).

        Raises:
            ValueError: For an unknown or finished episode, or a reward that is not a
                number.
        """
        r = _reward(reward, episode_id)
        with self._cond:
            episode = self._get(episode_id)
            episode.reward += r
            if info:
                episode.info = dict(info)

    def end_episode(self, episode_id: str, observation: Any) -> None:
        """Ends an episode (terminated) with its last observation.

        Args:
            episode_id: The episode.
            observation: The last observation.

        Raises:
            ValueError: For an unknown or finished episode, or an observation outside
                the observation space.
        """
        obs = self._conform_observation(observation)
        with self._cond:
            episode = self._get(episode_id)
            self._push(episode, obs, terminated=True)
            del self._episodes[episode_id]
            self._finished.add(episode_id)

    def truncate_episode(self, episode_id: str) -> None:
        """Ends an episode as truncated at its last observation (a lost simulator).

        The last observation is recorded again as the final one, with the rewards logged
        since the last action; an episode that observed nothing yet is dropped. The id
        may be started again (a simulator that reconnects goes on under its id).

        Args:
            episode_id: The episode.

        Raises:
            ValueError: For an unknown or finished episode.
        """
        with self._cond:
            episode = self._get(episode_id)
            del self._episodes[episode_id]
            if episode.observed:
                self._push(episode, episode.last_observation, truncated=True)

    def close(self) -> None:
        """Closes the env: calls still waiting for an action raise ``RuntimeError``.

        The runner calls it when it closes its envs. Subclasses that hold resources
        (sockets) override it and call this one.
        """
        with self._cond:
            if self._closed is not None:
                return
            self._closed = "the env was closed"
            waiting = [
                ev.on_action
                for ep in self._episodes.values()
                for ev in ep.events
                if ev.on_action is not None
            ]
            self._cond.notify_all()
        self._fail_waiting(waiting)

    def _fail_waiting(self, on_actions: list[Callable[[Any], None]]) -> None:
        """Answers calls that wait for an action with the closed env's error."""
        err = ExternalEnvClosedError(
            f"{type(self).__name__} was closed before the policy acted (the runner stopped)"
        )
        for fn in on_actions:
            fn(err)

    # -- for servers (local inference) -----------------------------------------------

    def weights_snapshot(self) -> tuple[int, dict[str, Any], dict[str, Any]] | None:
        """The runner's latest module weights, for simulators that act themselves.

        Returns:
            None before a runner samples this env; else ``(weights_seq_no, modules,
            weights)``: per module id, ``{"class": "pkg.module:Class", "model_config":
            dict, "observation_space": space, "action_space": space}`` and
            ``{parameter name: ndarray}``.
        """
        return self._weights

    def _set_weights_snapshot(self, snapshot: tuple[int, dict[str, Any], dict[str, Any]]) -> None:
        self._weights = snapshot

    # -- the runner's side --------------------------------------------------------------

    @property
    def unwrapped(self) -> ExternalEnv:
        """The env itself (gymnasium's attribute, which callbacks read)."""
        return self

    @property
    def single_observation_space(self) -> gym.Space[Any]:
        """The observation space (the name a runner reads on vector envs)."""
        return self.observation_space

    @property
    def single_action_space(self) -> gym.Space[Any]:
        """The action space (the name a runner reads on vector envs)."""
        return self.action_space

    def _run_guarded(self) -> None:
        """``run()``, with what it raises kept for the runner (the thread's target)."""
        try:
            # The class's run(): the instance's ``run`` attribute is this guard.
            type(self).run(self)
        except BaseException as err:  # handed to the runner, which raises it
            self._run_error = err
        finally:
            with self._cond:
                self._run_done = True
                self._cond.notify_all()

    # -- internals ---------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed is not None:
            raise ExternalEnvClosedError(f"{type(self).__name__}: {self._closed}")

    def _get(self, episode_id: str) -> ExternalEnvEpisode:
        self._check_open()
        episode = self._episodes.get(episode_id)
        if episode is None:
            if episode_id in self._finished:
                raise ValueError(f"Episode {episode_id} has already completed.")
            raise ValueError(f"Episode {episode_id} not found.")
        return episode

    def _push(
        self,
        episode: ExternalEnvEpisode,
        observation: Any,
        *,
        terminated: bool = False,
        truncated: bool = False,
        on_action: Callable[[Any], None] | None = None,
        logged: bool = False,
        action: Any = None,
        extras: dict[str, Any] | None = None,
    ) -> None:
        """Queues an observation event (the lock held)."""
        first = not episode.observed
        last = terminated or truncated
        if first and last:
            # Ended before any action: no step to record, nothing for the runner.
            return
        if first:
            # Rewards before the first action stay for the first step.
            reward: Any = {} if self.multi_agent else 0.0
            info = episode.info
        else:
            reward, info = episode.reward, episode.info
            episode.reward = {} if self.multi_agent else 0.0
        episode.info = {}
        term: Any = terminated
        trunc: Any = truncated
        if self.multi_agent:
            if not first:
                # An observing agent with no reward logged gets 0.0 (as a single agent does).
                reward = {**dict.fromkeys(observation, 0.0), **reward}
            term = {**episode.done_agents, "__all__": terminated}
            trunc = {"__all__": truncated}
            episode.done_agents = {}
        episode.events.append(
            ExternalEnvEvent(
                observation,
                reward,
                info,
                first=first,
                last=last,
                terminated=term,
                truncated=trunc,
                on_action=on_action,
                logged=logged,
                action=action,
                extras=extras,
            )
        )
        episode.observed = True
        episode.last_observation = observation
        if not episode.with_runner and len(episode.events) == 1:
            self._deliverable.append(episode)
            if self._wake_at and len(self._deliverable) >= self._wake_at:
                self._cond.notify()

    def _conform_observation(self, observation: Any) -> Any:
        return self._conform(observation, "observation", self.observation_space)

    def _conform_action(self, action: Any) -> Any:
        return self._conform(action, "action", self.action_space)

    def _conform(
        self, value: Any, what: str, space: gym.Space[Any] | Callable[[Any], gym.Space[Any]]
    ) -> Any:
        """:func:`conform_value`, its errors prefixed with the env's class name."""
        try:
            return conform_value(value, what, space)
        except ValueError as err:
            raise ValueError(f"{type(self).__name__}: {err}") from None


class ExternalMultiAgentEnv(ExternalEnv):
    """An :class:`ExternalEnv` with several agents: per-agent dicts in and out.

    ``get_action(episode_id, observation_dict)`` returns an action for each agent in the
    dict; ``log_returns(episode_id, reward_dict, info_dict=None,
    multiagent_done_dict=None)`` adds rewards per agent and can mark agents done (their
    episode part is then terminated). The spaces are either gymnasium ``Dict`` spaces
    keyed by agent id (the agents are those keys) or one space every agent shares.

    Args:
        action_space: The action space(s).
        observation_space: The observation space(s).
        max_concurrent: Episodes served at once (default 64).

    Raises:
        ValueError: If per-agent action and observation spaces name different agents.
    """

    multi_agent = True

    def __init__(
        self,
        action_space: gym.Space[Any],
        observation_space: gym.Space[Any],
        max_concurrent: int | None = None,
    ) -> None:
        super().__init__(action_space, observation_space, max_concurrent)
        per_agent = [isinstance(s, gym.spaces.Dict) for s in (action_space, observation_space)]
        if all(per_agent) and action_space.keys() != observation_space.keys():  # type: ignore[attr-defined]
            raise ValueError(
                "Agent ids disagree for action space and obs space dict: "
                f"{list(action_space.keys())} {list(observation_space.keys())}"  # type: ignore[attr-defined]
            )
        self._per_agent = all(per_agent)

    @property
    def possible_agents(self) -> list[Any]:
        """The agents (the keys of per-agent spaces; empty for one shared space)."""
        return list(self.observation_space.keys()) if self._per_agent else []  # type: ignore[attr-defined]

    @property
    def shared_spaces(self) -> tuple[gym.Space[Any], gym.Space[Any]] | None:
        """``(observation space, action space)`` every agent has; None if per agent."""
        return None if self._per_agent else (self.observation_space, self.action_space)

    def get_observation_space(self, agent_id: Any) -> gym.Space[Any]:
        """Agent ``agent_id``'s observation space.

        Raises:
            KeyError: For an agent the per-agent spaces do not name.
        """
        return self.observation_space[agent_id] if self._per_agent else self.observation_space  # type: ignore[index]

    def get_action_space(self, agent_id: Any) -> gym.Space[Any]:
        """Agent ``agent_id``'s action space.

        Raises:
            KeyError: For an agent the per-agent spaces do not name.
        """
        return self.action_space[agent_id] if self._per_agent else self.action_space  # type: ignore[index]

    def log_returns(  # type: ignore[override]
        self,
        episode_id: str,
        reward_dict: Mapping[Any, float],
        info_dict: Mapping[Any, Any] | None = None,
        multiagent_done_dict: Mapping[Any, bool] | None = None,
    ) -> None:
        """Adds rewards per agent (they add up until the agent's next action).

        Args:
            episode_id: The episode.
            reward_dict: Agent id -> reward.
            info_dict: Agent id -> info dict, for the step (the latest one given
                before the next observation is recorded).
            multiagent_done_dict: Agent id -> whether the agent is done (terminated at
                the next observation). RLlib 2.60 fails on this argument
                (``AttributeError``: it writes a dict its episodes no longer have).

        Raises:
            ValueError: For an unknown or finished episode, an unknown agent, or a
                reward that is not a number.
        """
        rewards = {aid: _reward(r, episode_id, aid) for aid, r in reward_dict.items()}
        for aid in rewards:
            self._check_agent(aid)
        with self._cond:
            episode = self._get(episode_id)
            for aid, r in rewards.items():
                episode.reward[aid] = episode.reward.get(aid, 0.0) + r
            if multiagent_done_dict:
                for aid, d in multiagent_done_dict.items():
                    self._check_agent(aid)
                    episode.done_agents[aid] = bool(d)
            if info_dict:
                episode.info = {aid: dict(i) for aid, i in info_dict.items()}

    def _check_agent(self, agent_id: Any) -> None:
        why = self._unknown_agent(agent_id)
        if why is not None:
            raise ValueError(f"{type(self).__name__}: {why}")

    def _unknown_agent(self, agent_id: Any) -> str | None:
        """Why ``agent_id`` is not an agent of the per-agent spaces (None: it is one)."""
        if self._per_agent and agent_id not in self.observation_space.spaces:  # type: ignore[attr-defined]
            return f"unknown agent {agent_id!r} (the agents are {self.possible_agents})"
        return None

    def _conform(
        self, value: Any, what: str, space: gym.Space[Any] | Callable[[Any], gym.Space[Any]]
    ) -> Any:
        assert isinstance(space, gym.Space)

        def space_of(agent_id: Any) -> gym.Space[Any]:
            why = self._unknown_agent(agent_id)
            if why is not None:
                raise ValueError(why)
            return space[agent_id] if self._per_agent else space  # type: ignore[index]

        return super()._conform(value, what, space_of)


def _reward(value: Any, episode_id: str, agent: Any = None) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        who = f" of agent {agent!r}" if agent is not None else ""
        raise ValueError(
            f"Episode {episode_id}: reward{who} must be a number, got {type(value).__name__}"
        ) from None
