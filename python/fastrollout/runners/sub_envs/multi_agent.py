"""Multi-agent sub-envs in this process: a list of ``MultiAgentEnv`` objects."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import numpy as np

from fastrollout.runners.sub_envs.base import StepResults, SubEnvs

__all__ = ["MultiAgentListSubEnvs"]


class MultiAgentListSubEnvs(SubEnvs):
    """``num_envs`` multi-agent envs stepped one after another in this process.

    ``send`` keeps the actions and ``poll`` steps the named sub-envs, so that the
    runner's ``env_step_timer`` (around ``poll``) measures their steps; each sub-env's
    error is caught and reported in the results (the runner restarts the sub-env or raises
    the error). ``reset`` is immediate.

    Args:
        creator: ``creator(vector_index) -> MultiAgentEnv``.
        num_envs: The number of sub-envs.
    """

    multi_agent = True

    def __init__(self, creator: Callable[[int], Any], num_envs: int) -> None:
        self._creator = creator
        self.envs = [creator(i) for i in range(num_envs)]
        self.num_envs = num_envs
        # The sub-envs and actions of the step that send() started, for poll().
        self._pending: tuple[np.ndarray | None, Any] | None = None

    @property
    def env(self) -> Any:
        """See :attr:`SubEnvs.env`."""
        return self.envs

    def sub_env(self, i: int) -> Any:
        """See :meth:`SubEnvs.sub_env`."""
        return self.envs[i]

    def reset_all(self, seed: int | None) -> StepResults:
        """See :meth:`SubEnvs.reset_all`."""
        resets: list[tuple[int, Any, Any]] = []
        failed: dict[int, BaseException] = {}
        for i, env in enumerate(self.envs):
            try:
                obs, infos = env.reset(seed=None if seed is None else seed + i)
            except Exception as err:  # the runner decides: restart or raise
                failed[i] = err
                continue
            resets.append((i, obs, infos))
        return StepResults(None, [], [], [], [], [], resets=resets, failed=failed)

    def send(self, env_ids: np.ndarray | None, actions: Any) -> None:
        """See :meth:`SubEnvs.send`."""
        self._pending = (env_ids, actions)

    def poll(self, wait_s: float) -> StepResults:
        """See :meth:`SubEnvs.poll`: steps the sub-envs of the last ``send``."""
        pending, self._pending = self._pending, None
        if pending is None:
            return StepResults(np.zeros(0, np.int64), [], [], [], [], [])
        env_ids, actions = pending
        envs = self.envs if env_ids is None else [self.envs[i] for i in env_ids]
        n = len(envs)
        obs: list[Any] = [None] * n
        rew: list[Any] = [None] * n
        term: list[Any] = [None] * n
        trunc: list[Any] = [None] * n
        infos: list[Any] = [None] * n
        failed: dict[int, BaseException] = {}
        for j, env in enumerate(envs):
            try:
                obs[j], rew[j], term[j], trunc[j], infos[j] = env.step(actions[j])
            except Exception as err:
                failed[j if env_ids is None else int(env_ids[j])] = err
        return StepResults(env_ids, obs, rew, term, trunc, infos, failed=failed)

    def reset(self, i: int, seed: int | None = None) -> tuple[Any, Any]:
        """See :meth:`SubEnvs.reset`."""
        return self.envs[i].reset(seed=seed)  # type: ignore[no-any-return]

    def recreate(self, i: int) -> None:
        """See :meth:`SubEnvs.recreate`."""
        with contextlib.suppress(Exception):
            self.envs[i].close()
        self.envs[i] = self._creator(i)

    def close(self) -> None:
        """See :meth:`SubEnvs.close`."""
        for env in self.envs:
            env.close()
