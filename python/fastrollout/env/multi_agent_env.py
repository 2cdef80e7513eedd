"""``MultiAgentEnv`` (RLlib 2.60's multi-agent env API) and ``make_multi_agent``."""

from __future__ import annotations

import copy
from collections.abc import Callable, Hashable, Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from fastrollout.env.env_context import EnvContext

__all__ = ["ALL", "MultiAgentEnv", "make_multi_agent"]

AgentID = Hashable
MultiAgentDict = dict[Any, Any]

# The key under which terminated/truncated dicts say whether the whole episode is over.
ALL = "__all__"


class MultiAgentEnv(gym.Env):  # type: ignore[type-arg]
    """An environment hosting several agents that observe, act and get rewards separately.

    The API is RLlib 2.60's, so an env written for RLlib works with fastrollout by
    changing its base class import (and RLlib ``MultiAgentEnv`` subclasses are accepted
    by fastrollout's runners as they are):

    - ``reset(*, seed=None, options=None) -> (obs, infos)``: dicts keyed by agent id, for
      the agents that act first;
    - ``step(action_dict) -> (obs, rewards, terminateds, truncateds, infos)``: dicts keyed
      by agent id; ``terminateds`` and ``truncateds`` carry the key ``"__all__"``, true when
      the whole episode is over;
    - ``possible_agents`` (every agent that may ever appear) and ``agents`` (those active
      now);
    - ``observation_spaces`` / ``action_spaces``: dicts agent id -> space, read through
      ``get_observation_space(agent_id)`` / ``get_action_space(agent_id)``, which
      subclasses may override instead.

    Subclasses set their attributes in ``__init__`` (calling ``super().__init__()``).
    ``observation_space`` and ``action_space`` default to ``gymnasium.spaces.Dict`` spaces
    built from the per-agent dicts; a subclass may assign them instead, as with RLlib's
    older API, in which case a ``Dict`` space keyed by agent id is used per agent and any
    other space is shared by all agents.
    """

    observation_spaces: dict[Any, gym.Space[Any]] | None = None
    action_spaces: dict[Any, gym.Space[Any]] | None = None
    # Class-level defaults as RLlib has them; __init__ gives each instance its own lists.
    agents: list[Any] = []  # noqa: RUF012
    possible_agents: list[Any] = []  # noqa: RUF012

    def __init__(self) -> None:
        super().__init__()
        # Copy so that instances never share (and mutate) the class-level list.
        self.agents = list(self.agents)
        if not self.possible_agents:
            self.possible_agents = list(self.agents)
        else:
            self.possible_agents = list(self.possible_agents)

    @property  # type: ignore[override]
    def observation_space(self) -> gym.Space[Any] | None:
        """All agents' observation space: an explicit one, or a Dict of the per-agent ones."""
        explicit = self.__dict__.get("_explicit_observation_space")
        if explicit is not None:
            return explicit  # type: ignore[no-any-return]
        if self.observation_spaces is not None:
            return gym.spaces.Dict(dict(self.observation_spaces))
        return None

    @observation_space.setter
    def observation_space(self, space: gym.Space[Any] | None) -> None:
        self.__dict__["_explicit_observation_space"] = space

    @property  # type: ignore[override]
    def action_space(self) -> gym.Space[Any] | None:
        """All agents' action space: an explicit one, or a Dict of the per-agent ones."""
        explicit = self.__dict__.get("_explicit_action_space")
        if explicit is not None:
            return explicit  # type: ignore[no-any-return]
        if self.action_spaces is not None:
            return gym.spaces.Dict(dict(self.action_spaces))
        return None

    @action_space.setter
    def action_space(self, space: gym.Space[Any] | None) -> None:
        self.__dict__["_explicit_action_space"] = space

    def reset(  # type: ignore[override]
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[MultiAgentDict, MultiAgentDict]:
        """Starts a new episode and returns the first observations of the agents that act.

        The base implementation only seeds ``self.np_random``; subclasses call it with
        ``super().reset(seed=seed)`` and return ``(observations, infos)``.

        Args:
            seed: Seeds ``self.np_random`` when given.
            options: Env-specific reset options.

        Returns:
            ``(observations, infos)``, dicts keyed by agent id.
        """
        super().reset(seed=seed, options=options)
        return {}, {}

    def step(  # type: ignore[override]
        self, action_dict: MultiAgentDict
    ) -> tuple[MultiAgentDict, MultiAgentDict, MultiAgentDict, MultiAgentDict, MultiAgentDict]:
        """Applies the agents' actions and returns what the next agents observe.

        Args:
            action_dict: Agent id -> action, for the agents that were asked to act.

        Returns:
            ``(observations, rewards, terminateds, truncateds, infos)``, dicts keyed by
            agent id; ``terminateds`` and ``truncateds`` also carry ``"__all__"``.

        Raises:
            NotImplementedError: Always in the base class.
        """
        raise NotImplementedError(f"{type(self).__name__} does not implement step()")

    def render(self) -> Any:
        """Renders the env; the base class renders nothing and returns None."""
        return None

    def get_observation_space(self, agent_id: AgentID) -> gym.Space[Any]:
        """Returns the observation space of one agent.

        Args:
            agent_id: The agent.

        Returns:
            ``observation_spaces[agent_id]`` if the env has that dict; otherwise the
            agent's entry of a ``Dict`` ``observation_space``, or that space itself
            when it is not keyed by agent.

        Raises:
            KeyError: The env's ``observation_spaces`` has no entry for the agent.
            ValueError: The env defines no observation space at all.
        """
        return _agent_space(self, agent_id, "observation")

    def get_action_space(self, agent_id: AgentID) -> gym.Space[Any]:
        """Returns the action space of one agent.

        Args:
            agent_id: The agent.

        Returns:
            ``action_spaces[agent_id]`` if the env has that dict; otherwise the agent's
            entry of a ``Dict`` ``action_space``, or that space itself when it is not
            keyed by agent.

        Raises:
            KeyError: The env's ``action_spaces`` has no entry for the agent.
            ValueError: The env defines no action space at all.
        """
        return _agent_space(self, agent_id, "action")

    @property
    def num_agents(self) -> int:
        """Number of agents active now (``len(agents)``)."""
        return len(self.agents)

    @property
    def max_num_agents(self) -> int:
        """Number of agents that may ever appear (``len(possible_agents)``)."""
        return len(self.possible_agents)

    def get_agent_ids(self) -> set[Any]:
        """Returns the ids of all possible agents (RLlib's older name for them).

        Returns:
            ``set(possible_agents)``, or ``set(agents)`` when that is empty.
        """
        return set(self.possible_agents or self.agents)


def _agent_space(env: Any, agent_id: AgentID, kind: str) -> gym.Space[Any]:
    per_agent = getattr(env, f"{kind}_spaces", None)
    if per_agent is not None:
        try:
            return per_agent[agent_id]  # type: ignore[no-any-return]
        except KeyError:
            raise KeyError(
                f"{type(env).__name__}.{kind}_spaces has no entry for agent {agent_id!r}; "
                f"it has {list(per_agent)}"
            ) from None
    whole = getattr(env, f"{kind}_space", None)
    if whole is None:
        raise ValueError(
            f"{type(env).__name__} defines neither {kind}_spaces nor {kind}_space, so "
            f"agent {agent_id!r} has no {kind} space"
        )
    if isinstance(whole, gym.spaces.Dict) and agent_id in whole.spaces:
        return whole[agent_id]  # type: ignore[no-any-return]
    return whole  # type: ignore[no-any-return]


def _agent_seed(seed: int | None, agent_index: int) -> int | None:
    """The reset seed of copy ``agent_index``: the given seed for copy 0, derived ones after."""
    if seed is None or agent_index == 0:
        return seed
    # A SeedSequence keyed by (seed, copy) gives well-separated, reproducible seeds that do
    # not collide with the seed + k a vector env gives its sub-envs.
    return int(np.random.SeedSequence(entropy=seed, spawn_key=(agent_index,)).generate_state(1)[0])


def make_multi_agent(
    env_name_or_creator: str | Callable[[EnvContext], gym.Env[Any, Any]],
) -> type[MultiAgentEnv]:
    """Returns a ``MultiAgentEnv`` class whose agents 0..n-1 each live in their own copy of an env.

    The class takes a config dict (or ``EnvContext``) whose key ``num_agents`` (default 1)
    sets n; the rest of the config goes to each copy: as keyword arguments of
    ``gymnasium.make`` for an env id, or as the ``EnvContext`` argument of a creator.

    The episode ends (``terminateds["__all__"]``) when every copy is terminated or
    truncated; ``truncateds["__all__"]`` is true when every copy is truncated. These are
    RLlib 2.60's rules. Where fastrollout deliberately differs from RLlib's
    ``make_multi_agent``:

    - ``reset(seed=s)`` seeds copy 0 with ``s`` and every other copy with a seed derived
      from ``(s, copy)``; RLlib seeds all copies with ``s``, so they start in the same
      state and, under the same policy, move in lockstep;
    - ``agents`` lists the agents whose copy is not done yet (RLlib never updates it), and
      an action for a done agent raises ``ValueError`` instead of stepping a finished env;
    - for an env id the remaining config keys reach ``gymnasium.make`` (RLlib drops them);
    - ``close()`` closes every copy.

    Args:
        env_name_or_creator: A gymnasium env id, or a callable taking the config
            (``EnvContext``) and returning a single-agent ``gymnasium.Env``.

    Returns:
        A ``MultiAgentEnv`` subclass, constructed as ``cls(config=None)``.

    >>> MultiCartPole = make_multi_agent("CartPole-v1")
    >>> env = MultiCartPole({"num_agents": 2})
    >>> sorted(env.reset(seed=0)[0])
    [0, 1]
    """

    class MultiEnv(MultiAgentEnv):
        """n copies of a single-agent env, as agents 0..n-1."""

        def __init__(self, config: Mapping[str, Any] | None = None) -> None:
            super().__init__()
            # Deep copy: num_agents is popped and vectorized runners reuse the config.
            config = copy.deepcopy(config) if config is not None else {}
            if not isinstance(config, EnvContext):
                config = EnvContext(config)
            num = config.pop("num_agents", 1)
            if not isinstance(num, int | np.integer) or isinstance(num, bool) or num < 1:
                raise ValueError(f"make_multi_agent: num_agents must be an int >= 1, got {num!r}")
            if isinstance(env_name_or_creator, str):
                self.envs = [gym.make(env_name_or_creator, **config) for _ in range(num)]
            else:
                self.envs = [env_name_or_creator(config) for _ in range(num)]
            self.observation_spaces = {i: e.observation_space for i, e in enumerate(self.envs)}
            self.action_spaces = {i: e.action_space for i, e in enumerate(self.envs)}
            self.possible_agents = list(range(num))
            self.agents = list(self.possible_agents)
            self.terminateds: set[int] = set()
            self.truncateds: set[int] = set()

        def reset(
            self, *, seed: int | None = None, options: dict[str, Any] | None = None
        ) -> tuple[MultiAgentDict, MultiAgentDict]:
            super().reset(seed=seed, options=options)
            self.terminateds = set()
            self.truncateds = set()
            self.agents = list(self.possible_agents)
            obs, infos = {}, {}
            for i, env in enumerate(self.envs):
                obs[i], infos[i] = env.reset(seed=_agent_seed(seed, i), options=options)
            return obs, infos

        def step(  # type: ignore[override]
            self, action_dict: MultiAgentDict
        ) -> tuple[MultiAgentDict, MultiAgentDict, MultiAgentDict, MultiAgentDict, MultiAgentDict]:
            if not action_dict:
                raise ValueError(
                    "make_multi_agent env: step() needs an action for at least one agent"
                )
            obs, rew, terminated, truncated, info = {}, {}, {}, {}, {}
            for i, action in action_dict.items():
                if i not in self.possible_agents:
                    raise ValueError(
                        f"make_multi_agent env: action for unknown agent {i!r}; "
                        f"agents are {self.possible_agents}"
                    )
                if i in self.terminateds or i in self.truncateds:
                    raise ValueError(
                        f"make_multi_agent env: action for agent {i!r}, whose env is done"
                    )
                obs[i], rew[i], terminated[i], truncated[i], info[i] = self.envs[i].step(action)
                if terminated[i]:
                    self.terminateds.add(i)
                if truncated[i]:
                    self.truncateds.add(i)
            done = self.terminateds | self.truncateds
            self.agents = [a for a in self.possible_agents if a not in done]
            terminated[ALL] = len(done) == len(self.envs)
            truncated[ALL] = len(self.truncateds) == len(self.envs)
            return obs, rew, terminated, truncated, info

        def render(self) -> Any:
            # Stack the copies' frames along the shorter side, so wide frames stack
            # vertically and tall ones side by side.
            frames: list[Any] = [e.render() for e in self.envs]
            if any(f is None for f in frames):
                return None
            axis = 0 if frames[0].shape[1] > frames[0].shape[0] else 1
            return np.concatenate(frames, axis=axis)

        def close(self) -> None:
            for env in self.envs:
                env.close()

    name = (
        env_name_or_creator
        if isinstance(env_name_or_creator, str)
        else getattr(env_name_or_creator, "__name__", "env")
    )
    MultiEnv.__qualname__ = MultiEnv.__name__ = f"MultiEnv[{name}]"
    return MultiEnv
