"""The part of ``EnvRunnerGroup`` that runs inside Ray: the actor that hosts one runner.

Nothing here imports Ray at module import (``import fastrollout`` stays free of it);
:func:`require_ray` imports it, with an error that names the extra to install.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any, NamedTuple

from fastrollout._extras import require_extra

__all__ = ["NeedsState", "RunnerHost", "require_ray"]


class NeedsState(NamedTuple):
    """What a runner's ``sample`` answers until the group has sent it the group's state."""

    pid: int


def require_ray(purpose: str) -> ModuleType:
    """Imports Ray, or raises an ``ImportError`` that names fastrollout's ``ray`` extra.

    Args:
        purpose: What needs Ray, for the message (e.g. ``"EnvRunnerGroup with 2 remote
            runners"``).

    Returns:
        The ``ray`` module.

    Raises:
        ImportError: If Ray is not installed (see :func:`fastrollout._extras.require_extra`).
    """
    return require_extra("ray", extra="ray", purpose=purpose, name="Ray")


class RunnerHost:
    """Builds one env runner inside a Ray actor and runs the group's calls on it.

    A new host's ``sample`` answers :class:`NeedsState` instead of sampling until the
    group has sent it the group's state (``restore``). The group does so when it starts
    the actor; Ray restarts a failed actor by running this constructor again, so a
    restarted runner (fresh weights and connector states) never samples with a stale
    policy, however and whenever its failure is noticed.

    Args:
        runner_cls: The runner class (``SingleAgentEnvRunner``, ``MultiAgentEnvRunner``).
        config: The runner config.
        worker_index: The runner's index in the group (1 for the first remote runner).
        num_workers: The number of remote runners in the group.
        registered_envs: Env creators registered by name in the driver
            (``fastrollout.register_env`` is per process); registered here again so that
            the config's env name resolves the same way.
    """

    def __init__(
        self,
        runner_cls: type,
        config: Any,
        worker_index: int,
        num_workers: int,
        registered_envs: Mapping[str, Callable[..., Any]],
    ) -> None:
        from fastrollout.env import register_env

        for name, creator in registered_envs.items():
            register_env(name, creator)
        self.runner = runner_cls(config=config, worker_index=worker_index, num_workers=num_workers)
        self.needs_state = True

    def ping(self) -> str:
        """Answers a health check (RLlib's ``ping``).

        Returns:
            ``"pong"``.
        """
        return "pong"

    def process_id(self) -> int:
        """Answers the group's health probe with this process's id.

        The group ends a runner whose call raised with ``ray.kill``, which takes effect
        a moment later: until then the old process may still answer, and its id (known
        from ``restore``) tells the group that this is not the restarted runner yet.

        Returns:
            ``os.getpid()``.
        """
        return os.getpid()

    def restore(self, state: Mapping[str, Any]) -> int:
        """Loads the group's state (weights and connector states); sampling may start.

        Args:
            state: A runner state (``EnvRunner.get_state()`` of the group's local runner).

        Returns:
            This process's id (see :meth:`process_id`).
        """
        self.runner.set_state(dict(state))
        self.needs_state = False
        return os.getpid()

    def sample(self, **kwargs: Any) -> Any:
        """The runner's ``sample``, unless the runner was restarted and not restored yet.

        Args:
            **kwargs: ``EnvRunner.sample``'s arguments.

        Returns:
            The episodes, or :class:`NeedsState`.
        """
        if self.needs_state:
            return NeedsState(os.getpid())
        return self.runner.sample(**kwargs)

    def apply(self, func: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Calls ``func(runner, *args, **kwargs)``.

        Args:
            func: The function.
            *args: Passed on.
            **kwargs: Passed on.

        Returns:
            What ``func`` returns.
        """
        return func(self.runner, *args, **kwargs)

    def call(self, method: str, /, *args: Any, **kwargs: Any) -> Any:
        """Calls the runner's method ``method``.

        Args:
            method: The method's name.
            *args: Passed on.
            **kwargs: Passed on.

        Returns:
            What the method returns.
        """
        return getattr(self.runner, method)(*args, **kwargs)
