"""Pieces the runners share.

Config access, metric keys, env creation and restarts, and the default connector steps
around the native gather.

The runners read their configuration by RLlib 2.60's attribute names (``config.env``,
``config.num_envs_per_env_runner``, ``config.callbacks_on_episode_start``, ...), which
``fastrollout.RunnerConfig`` keeps; anything with those attributes works.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Mapping
from typing import Any

import gymnasium as gym
import torch

from fastrollout.env.registry import EnvCreator
from fastrollout.runners._rllib import is_rllib_config

__all__ = [
    "DEFAULT_AGENT_ID",
    "cfg",
    "make_metrics_logger",
    "make_sub_env_creator",
]

DEFAULT_AGENT_ID = "default_agent"

# Metric keys, as RLlib 2.60 spells them (ray.rllib.utils.metrics).
NUM_ENV_STEPS_SAMPLED = "num_env_steps_sampled"
NUM_ENV_STEPS_SAMPLED_LIFETIME = "num_env_steps_sampled_lifetime"
NUM_AGENT_STEPS_SAMPLED = "num_agent_steps_sampled"
NUM_AGENT_STEPS_SAMPLED_LIFETIME = "num_agent_steps_sampled_lifetime"
NUM_MODULE_STEPS_SAMPLED = "num_module_steps_sampled"
NUM_MODULE_STEPS_SAMPLED_LIFETIME = "num_module_steps_sampled_lifetime"
NUM_EPISODES = "num_episodes"
NUM_EPISODES_LIFETIME = "num_episodes_lifetime"
EPISODE_LEN_MEAN = "episode_len_mean"
EPISODE_LEN_MIN = "episode_len_min"
EPISODE_LEN_MAX = "episode_len_max"
EPISODE_RETURN_MEAN = "episode_return_mean"
EPISODE_RETURN_MIN = "episode_return_min"
EPISODE_RETURN_MAX = "episode_return_max"
EPISODE_DURATION_SEC_MEAN = "episode_duration_sec_mean"
EPISODE_AGENT_RETURN_MEAN = "agent_episode_returns_mean"
EPISODE_MODULE_RETURN_MEAN = "module_episode_returns_mean"
# RLlib 2.60's single-agent runner spells these two without the "s" (literal strings
# there, not the constants above, which its multi-agent runner uses).
SA_AGENT_RETURN_MEAN = "agent_episode_return_mean"
SA_MODULE_RETURN_MEAN = "module_episode_return_mean"
EPISODE_AGENT_STEPS = "agent_steps"
WEIGHTS_SEQ_NO = "weights_seq_no"
SAMPLE_TIMER = "sample"
TIME_BETWEEN_SAMPLING = "time_between_sampling"
ENV_RESET_TIMER = "env_reset_timer"
ENV_STEP_TIMER = "env_step_timer"
ENV_TO_MODULE_CONNECTOR = "env_to_module_connector"
RLMODULE_INFERENCE_TIMER = "rlmodule_inference_timer"
MODULE_TO_ENV_CONNECTOR = "module_to_env_connector"
NUM_ENV_STEP_FAILURES_LIFETIME = "num_env_step_failures_lifetime"
# fastrollout's own: sub-envs recreated after a crash (RLlib has no such counter).
NUM_ENV_RESTARTS_LIFETIME = "num_env_restarts_lifetime"

# State keys, as RLlib 2.60 spells them.
COMPONENT_RL_MODULE = "rl_module"
COMPONENT_ENV_TO_MODULE_CONNECTOR = "env_to_module_connector"
COMPONENT_MODULE_TO_ENV_CONNECTOR = "module_to_env_connector"

# Key in a sub-env's infos that tells the runner the sub-env was recreated this step.
RESTARTED_KEY = "__fastrollout_env_restarted__"

_MISSING = object()


def cfg(config: Any, name: str, default: Any = None) -> Any:
    """Reads a config attribute by RLlib's name (``default`` if the config lacks it).

    Args:
        config: A ``RunnerConfig`` (or anything with RLlib's attribute names).
        name: The attribute.
        default: Returned if the attribute is missing or None.

    Returns:
        The value.
    """
    value = getattr(config, name, _MISSING)
    if value is _MISSING or value is None:
        return default
    return value


def smoothing_window(config: Any) -> int:
    """The per-runner window of episode metrics, as RLlib splits it over runners.

    Args:
        config: The runner config.

    Returns:
        ``ceil(metrics_num_episodes_for_smoothing / max(num_env_runners, 1))``, at least 1.
    """
    n = int(cfg(config, "metrics_num_episodes_for_smoothing", 100))
    runners = int(cfg(config, "num_env_runners", 0)) or 1
    return max(1, math.ceil(n / runners))


def make_metrics_logger() -> Any:
    """A new ``fastrollout.metrics.MetricsLogger`` for a runner.

    Returns:
        The logger.
    """
    from fastrollout.metrics import MetricsLogger

    return MetricsLogger()


# ---------------------------------------------------------------------------- envs


def make_sub_env_creator(config: Any, worker_index: int, num_workers: int) -> EnvCreator:
    """The callable that creates one sub-env: ``creator(vector_index) -> env``.

    Uses ``fastrollout.env.make_env_creator`` (registered names, gymnasium ids, classes,
    creators; the env check unless ``disable_env_checking``).

    Args:
        config: The runner config (``env``, ``env_config``, ``disable_env_checking``).
        worker_index: The runner's index.
        num_workers: The number of remote runners.

    Returns:
        The creator.

    Raises:
        ValueError: If the config names no env.
    """
    env = cfg(config, "env")
    if env is None:
        raise ValueError(
            "no env configured: call config.environment(env=...) with a gymnasium id, a "
            "registered name, an env class or a creator"
        )
    from fastrollout.env import make_env_creator

    env_config = dict(cfg(config, "env_config", {}))
    return make_env_creator(
        env,
        env_config,
        worker_index=worker_index,
        num_workers=num_workers,
        # RLlib's runners check no env (its config's flag serves its old stack only): a
        # runner built from RLlib's config leaves the env unstepped until it samples.
        disable_env_checking=bool(cfg(config, "disable_env_checking", False))
        or is_rllib_config(config),
    )


class RestartingEnv(gym.Wrapper):  # type: ignore[type-arg]
    """A sub-env that recreates itself when its ``step`` or ``reset`` raises.

    On a crash in ``step`` the env is recreated (up to ``max_attempts`` tries in a row)
    and reset; the step then returns the new env's reset observation, reward 0, not done,
    and ``infos[RESTARTED_KEY] = number of recreations``. The runner reads that flag,
    drops the crashed episode, and starts a new one from the observation. A crash in
    ``reset`` is retried the same way. The retries are a loop with a bound, never
    recursion.

    Args:
        create: ``create() -> env``, a fresh env.
        max_attempts: Recreations in a row before the last error is raised.
    """

    def __init__(self, create: Callable[[], Any], max_attempts: int = 10) -> None:
        self._create = create
        self._max_attempts = max_attempts
        super().__init__(create())

    def _recreate(self) -> None:
        with contextlib.suppress(Exception):
            self.env.close()
        self.env = self._create()

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> Any:
        restarts = 0
        while True:
            try:
                obs, infos = self.env.reset(seed=seed, options=options)
            except Exception:
                restarts += 1
                if restarts > self._max_attempts:
                    raise
                self._recreate()
                continue
            if restarts:
                infos = dict(infos)
                infos[RESTARTED_KEY] = restarts
            return obs, infos

    def step(self, action: Any) -> Any:
        try:
            return self.env.step(action)
        except Exception:
            self._recreate()
            obs, infos = self.reset()
            infos = dict(infos)
            infos[RESTARTED_KEY] = infos.get(RESTARTED_KEY, 0) + 1
            return obs, 0.0, False, False, infos


# ---------------------------------------------------------------------------- connectors


class Connectors:
    """The runner's two connector pipelines around the native gather and scatter.

    env-to-module: ``[*user pieces, NumpyToTensor]`` on the gathered
    ``{module_id: {obs: ndarray}}`` batch; module-to-env: ``[*user pieces, GetActions,
    TensorToNumpy, NormalizeAndClipActions]`` (``fastrollout.connectors``' defaults, or
    only the user's pieces where the config turns the defaults off).

    Args:
        config: The runner config.
        env: The env (passed to the user's connector factories).
        spaces: The runner's spaces (passed to the factories).
        observation_spaces: Module id -> observation space.
        action_spaces: Module id -> action space.
        device: The modules' device.
    """

    def __init__(
        self,
        *,
        config: Any,
        env: Any,
        spaces: Mapping[str, Any],
        observation_spaces: Mapping[str, gym.Space],
        action_spaces: Mapping[str, gym.Space],
        device: torch.device,
    ) -> None:
        from fastrollout.connectors import (
            EnvToModulePipeline,
            ModuleToEnvPipeline,
            default_env_to_module_pipeline,
            default_module_to_env_pipeline,
        )

        obs = dict(observation_spaces)
        act = dict(action_spaces)
        e2m = _pieces(cfg(config, "env_to_module_connector"), env, spaces, device)
        m2e = _pieces(cfg(config, "module_to_env_connector"), env, spaces)
        if cfg(config, "add_default_connectors_to_env_to_module_pipeline", True):
            self.env_to_module = default_env_to_module_pipeline(
                input_observation_space=obs, input_action_space=act, device=device, connectors=e2m
            )
        else:
            self.env_to_module = EnvToModulePipeline(obs, act, connectors=e2m)
        if cfg(config, "add_default_connectors_to_module_to_env_pipeline", True):
            self.module_to_env = default_module_to_env_pipeline(
                input_observation_space=obs,
                input_action_space=act,
                normalize_actions=bool(cfg(config, "normalize_actions", True)),
                clip_actions=bool(cfg(config, "clip_actions", False)),
                connectors=m2e,
            )
        else:
            self.module_to_env = ModuleToEnvPipeline(obs, act, connectors=m2e)

    def get_state(self) -> dict[str, Any]:
        """Both pipelines' states.

        Returns:
            ``{"env_to_module_connector": ..., "module_to_env_connector": ...}``.
        """
        return {
            COMPONENT_ENV_TO_MODULE_CONNECTOR: self.env_to_module.get_state(),
            COMPONENT_MODULE_TO_ENV_CONNECTOR: self.module_to_env.get_state(),
        }

    def set_state(self, which: str, state: Any) -> None:
        """Loads one pipeline's state.

        Args:
            which: ``"env_to_module_connector"`` or ``"module_to_env_connector"``.
            state: The state, as ``get_state`` returns it.
        """
        pipeline = (
            self.env_to_module if which == COMPONENT_ENV_TO_MODULE_CONNECTOR else self.module_to_env
        )
        pipeline.set_state(state)


def _pieces(factory: Any, *args: Any) -> list[Any]:
    """The connectors a config's factory builds (a connector, a list, or None)."""
    if factory is None:
        return []
    made = factory(*args)
    if made is None:
        return []
    return list(made) if isinstance(made, (list, tuple)) else [made]
