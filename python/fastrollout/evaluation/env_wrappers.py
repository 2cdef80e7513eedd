"""The old stack's per-env settings as env wrappers: episode horizons and ``observation_fn``.

RLlib's old sampler cut episodes at ``horizon`` (optionally without a reset,
``soft_horizon``) and passed multi-agent observations through ``observation_fn``; here
each sub-env a ``RolloutWorker`` creates is wrapped, so the runner below it samples the
resulting episodes as any others.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym

from fastrollout.env import MultiAgentEnv, is_multi_agent_env

__all__ = ["HorizonWrapper", "MultiAgentWorkerWrapper", "wrap_for_worker"]


class _Horizon:
    """The horizon of both wrappers: step counting and a soft horizon's carried start."""

    def __init__(self, horizon: int | None, soft: bool) -> None:
        self.horizon = horizon
        self.soft = soft
        self.t = 0
        # (observations, infos) a soft reset starts the next episode from.
        self._carried: tuple[Any, Any] | None = None

    def start(self) -> tuple[Any, Any] | None:
        """A new episode: the carried ``(obs, infos)`` after a soft horizon, else None."""
        self.t = 0
        carried, self._carried = self._carried, None
        return carried

    def stepped(self, done: bool, last: tuple[Any, Any]) -> bool:
        """Counts one step; whether the horizon truncates the episode here.

        A soft horizon then keeps ``last``, the step's ``(obs, infos)``, for :meth:`start`.
        """
        self.t += 1
        if self.horizon is None or self.t < self.horizon or done:
            return False
        if self.soft:
            self._carried = last
        return True


class HorizonWrapper(gym.Wrapper):  # type: ignore[type-arg]
    """Truncates episodes after ``horizon`` steps; ``soft`` continues without a reset.

    Args:
        env: A single-agent gymnasium env.
        horizon: Steps per episode (None: no limit).
        soft: At the horizon, the next ``reset()`` returns the last observation and
            info instead of resetting the env (RLlib's ``soft_horizon``).
    """

    def __init__(self, env: gym.Env, horizon: int | None, soft: bool = False) -> None:  # type: ignore[type-arg]
        super().__init__(env)
        self._h = _Horizon(horizon, soft)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        """Resets the env, or (after a soft horizon) starts from the last observation."""
        carried = self._h.start()
        return carried if carried is not None else self.env.reset(seed=seed, options=options)

    def step(self, action: Any) -> Any:
        """Steps the env; truncates at the horizon."""
        obs, reward, terminated, truncated, info = self.env.step(action)
        if self._h.stepped(bool(terminated or truncated), (obs, info)):
            truncated = True
        return obs, reward, terminated, truncated, info


class MultiAgentWorkerWrapper(MultiAgentEnv):
    """A multi-agent env with a horizon and/or ``observation_fn`` applied.

    Args:
        env: The multi-agent env.
        horizon: Env steps per episode (None: no limit).
        soft: Continue from the last observations at the horizon (no reset).
        observation_fn: ``fn(agent_obs=..., worker=..., base_env=..., policies=...,
            episode=None) -> agent_obs`` applied to every observation dict.
        worker: The ``RolloutWorker`` passed to ``observation_fn``.
    """

    def __init__(
        self,
        env: Any,
        *,
        horizon: int | None = None,
        soft: bool = False,
        observation_fn: Callable[..., Any] | None = None,
        worker: Any = None,
    ) -> None:
        self.env = env
        self.observation_spaces = getattr(env, "observation_spaces", None)
        self.action_spaces = getattr(env, "action_spaces", None)
        if self.observation_spaces is None:
            self.observation_space = env.observation_space
        if self.action_spaces is None:
            self.action_space = env.action_space
        super().__init__()
        self.possible_agents = list(getattr(env, "possible_agents", None) or [])
        self._h = _Horizon(horizon, soft)
        self._observation_fn = observation_fn
        self._worker = worker

    @property  # type: ignore[override]
    def agents(self) -> list[Any]:
        """The wrapped env's current agents."""
        return list(getattr(self.env, "agents", []) or [])

    @agents.setter
    def agents(self, value: Any) -> None:
        # The base class assigns its class attribute at construction; the env's rules.
        pass

    @property
    def unwrapped(self) -> Any:
        """The innermost env."""
        return getattr(self.env, "unwrapped", self.env)

    def get_observation_space(self, agent_id: Any) -> gym.Space[Any]:
        """The wrapped env's space for ``agent_id``."""
        return self.env.get_observation_space(agent_id)  # type: ignore[no-any-return]

    def get_action_space(self, agent_id: Any) -> gym.Space[Any]:
        """The wrapped env's space for ``agent_id``."""
        return self.env.get_action_space(agent_id)  # type: ignore[no-any-return]

    def _observe(self, obs: dict[Any, Any]) -> dict[Any, Any]:
        if self._observation_fn is None or not obs or not getattr(self._worker, "_ready", True):
            return obs
        policies = getattr(self._worker, "policy_map", None)
        return self._observation_fn(  # type: ignore[no-any-return]
            agent_obs=obs, worker=self._worker, base_env=self.env, policies=policies, episode=None
        )

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        """Resets the env (or continues after a soft horizon); observations transformed."""
        carried = self._h.start()
        if carried is not None:
            return carried
        obs, infos = self.env.reset(seed=seed, options=options)
        return self._observe(obs), infos

    def step(self, action_dict: dict[Any, Any]) -> Any:
        """Steps the env; at the horizon every agent still there is truncated."""
        obs, rewards, terminateds, truncateds, infos = self.env.step(action_dict)
        obs = self._observe(obs)
        done = bool(terminateds.get("__all__", False) or truncateds.get("__all__", False))
        if self._h.stepped(done, (obs, infos)):
            truncateds = {**truncateds, **dict.fromkeys(obs, True), "__all__": True}
        return obs, rewards, terminateds, truncateds, infos

    def render(self) -> Any:
        """The wrapped env's rendering."""
        return self.env.render()

    def close(self) -> None:
        """Closes the wrapped env."""
        close = getattr(self.env, "close", None)
        if close is not None:
            close()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "env":
            raise AttributeError(name)
        return getattr(self.env, name)


def wrap_for_worker(
    env: Any,
    *,
    horizon: int | None,
    soft: bool,
    observation_fn: Callable[..., Any] | None,
    worker: Any,
) -> Any:
    """Wraps one sub-env for a worker's settings (returns ``env`` when none applies).

    Args:
        env: The env the user's creator made.
        horizon: ``episode_horizon``.
        soft: ``soft_horizon``.
        observation_fn: The multi-agent ``observation_fn``.
        worker: The worker.

    Returns:
        The env to sample.

    Raises:
        ValueError: ``observation_fn`` for a single-agent env.
    """
    if is_multi_agent_env(env):
        if horizon is None and observation_fn is None:
            return env
        return MultiAgentWorkerWrapper(
            env, horizon=horizon, soft=soft, observation_fn=observation_fn, worker=worker
        )
    if observation_fn is not None:
        raise ValueError("observation_fn applies to multi-agent envs; this env is single-agent")
    if horizon is None:
        return env
    return HorizonWrapper(env, horizon, soft)
