"""The callable that creates one sub-env of a runner, from the runner's config."""

from __future__ import annotations

from typing import Any

from fastrollout.env.registry import EnvCreator
from fastrollout.runners._config import cfg
from fastrollout.runners._rllib import is_rllib_config

__all__ = ["make_sub_env_creator"]


def make_sub_env_creator(
    config: Any, worker_index: int, num_workers: int, *, multi_agent: bool | None = None
) -> EnvCreator:
    """The callable that creates one sub-env: ``creator(vector_index) -> env``.

    Uses ``fastrollout.env.make_env_creator`` (registered names, gymnasium ids, classes,
    creators; the env check unless ``disable_env_checking``). An ``"envpool:<task>"`` id
    gives an :class:`~fastrollout.runners.sub_envs.envpool_backend.EnvPoolSpec` instead,
    which ``make_sub_envs`` turns into an EnvPool.

    Args:
        config: The runner config (``env``, ``env_config``, ``disable_env_checking``).
        worker_index: The runner's index.
        num_workers: The number of remote runners.
        multi_agent: The kind of env the runner samples (None: either); an env of the
            other kind is refused with a ``TypeError`` that names the runner to use.

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
    from fastrollout.runners.sub_envs.envpool_backend import EnvPoolSpec, envpool_task

    task = envpool_task(env)
    if task is not None:
        # EnvPool makes its envs itself: the backend gets the task and its kwargs.
        return EnvPoolSpec(task, cfg(config, "env_config", {}), worker_index)  # type: ignore[return-value]
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
        multi_agent=multi_agent,
    )
