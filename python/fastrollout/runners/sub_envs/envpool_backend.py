"""Sub-envs in an EnvPool (native env engine), stepped through its own async API.

An env id ``"envpool:<task>"`` (``"envpool:Pong-v5"``, ``"envpool:CartPole-v1"``) runs the
task's ``num_envs_per_env_runner`` envs in EnvPool's C++ threads: ``send`` hands EnvPool
the actions of the sub-envs the runner acted for (EnvPool's ``env_id`` is the sub-env
index) and ``poll`` is EnvPool's ``recv``, which returns as soon as ``sub_env_batch_size``
of them have stepped, so the runner infers for one batch while the others step. The
config's ``env_config`` holds EnvPool's own keyword arguments (``img_height``,
``stack_num``, ``episodic_life``, ...); one more key is fastrollout's: ``channels_last``
turns image observations from EnvPool's ``(C, H, W)`` into ``(H, W, C)``, the layout of
RLlib's (and fastrollout's) default CNN.

EnvPool resets a finished env on its next step (its action ignored), as gymnasium's
next-step autoreset, which the single-agent runner records. Sub-env ``i`` of a pool made
with seed ``s`` is seeded ``s + i`` by EnvPool, as the other backends seed theirs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

import numpy as np

from fastrollout._extras import require_extra
from fastrollout.runners.sub_envs.base import StepResults, SubEnvs

__all__ = [
    "ENVPOOL_PREFIX",
    "EnvPoolSpec",
    "EnvPoolSubEnvs",
    "envpool_task",
]

#: The prefix of an env id that runs on EnvPool.
ENVPOOL_PREFIX = "envpool:"
# EnvPool's info key for multi-player tasks (its player ids), not the env's infos.
_OWN_INFO_KEYS = ("players",)


def envpool_task(env: Any) -> str | None:
    """The EnvPool task an env id names (``"envpool:Pong-v5"`` -> ``"Pong-v5"``), or None.

    Args:
        env: The config's ``env``.

    Returns:
        The task id, or None for any other env.
    """
    if isinstance(env, str) and env.startswith(ENVPOOL_PREFIX):
        return env[len(ENVPOOL_PREFIX) :]
    return None


class EnvPoolSpec:
    """What a runner needs to make an EnvPool: the task, EnvPool's kwargs, our options.

    It stands in for the env creator of the other backends (the runner passes it to
    ``make_sub_envs``).

    Args:
        task: EnvPool's task id.
        env_config: EnvPool's keyword arguments, plus ``channels_last`` (fastrollout's).
        worker_index: The runner's index (the pool's seed is offset by it, as RLlib
            offsets its runners' seeds).

    Raises:
        TypeError: If ``env_config`` is not a dict.
    """

    def __init__(self, task: str, env_config: Mapping[str, Any], worker_index: int = 0) -> None:
        if not isinstance(env_config, Mapping):
            raise TypeError(f"env_config must be a dict, got {type(env_config).__name__}")
        kwargs = dict(env_config)
        self.task = task
        self.channels_last = bool(kwargs.pop("channels_last", False))
        self.kwargs = kwargs
        self.worker_index = worker_index


class EnvPoolSubEnvs(SubEnvs):
    """``num_envs`` sub-envs of one EnvPool task, stepped in batches of ``batch_size``.

    This object is the runner's ``env``: it has a vector env's
    ``single_observation_space``/``single_action_space``, their batched forms and
    ``num_envs``; ``pool`` is the EnvPool itself.

    Args:
        spec: The task and its kwargs.
        num_envs: The sub-envs.
        batch_size: Sub-envs per ``poll`` (None: half of them, rounded up).

    Raises:
        ImportError: Without envpool (naming the extra).
        ValueError: For a batch out of range, or an unknown task (EnvPool's message).
    """

    autoresets = True
    lockstep = False

    def __init__(self, spec: EnvPoolSpec, num_envs: int, batch_size: int | None) -> None:
        self._envpool = require_extra(
            "envpool", extra="envpool", purpose="an 'envpool:<task>' env", name="EnvPool"
        )
        if batch_size is not None and not 1 <= batch_size <= num_envs:
            raise ValueError(
                f"sub_env_batch_size must be between 1 and the sub-envs per runner "
                f"(num_envs_per_env_runner={num_envs}), got {batch_size}"
            )
        self.spec = spec
        self.num_envs = num_envs
        self.batch_size = batch_size if batch_size is not None else -(-num_envs // 2)
        self.pool: Any = None
        self._seed: int | None = None
        # Sub-envs EnvPool has not answered yet (sent, or reset and not received).
        self._inflight = np.zeros(num_envs, bool)
        self._make(seed=None)
        from gymnasium.vector.utils import batch_space

        pool: Any = self.pool  # (made by _make)
        obs_space = pool.observation_space
        if spec.channels_last:
            obs_space = _channels_last_space(obs_space)
        self.single_observation_space = obs_space
        self.single_action_space = pool.action_space
        self.observation_space = batch_space(obs_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)

    def _make(self, seed: int | None) -> None:
        """(Re)makes the pool, its sub-env ``i`` seeded ``seed + i`` (EnvPool's rule)."""
        if self.pool is not None:
            with contextlib.suppress(Exception):
                self.pool.close()
        kwargs = dict(self.spec.kwargs)
        if seed is not None:
            kwargs["seed"] = int(seed)
        try:
            self.pool = self._envpool.make(
                self.spec.task,
                env_type="gymnasium",
                num_envs=self.num_envs,
                batch_size=self.batch_size,
                **kwargs,
            )
        except Exception as err:
            raise ValueError(f"envpool:{self.spec.task}: EnvPool could not make it: {err}") from err
        self._seed = seed
        self._inflight[:] = False

    @property
    def env(self) -> Any:
        """See :attr:`SubEnvs.env`."""
        return self

    @property
    def unwrapped(self) -> EnvPoolSubEnvs:
        """The object itself (as a vector env's ``unwrapped``)."""
        return self

    def reset_all(self, seed: int | None) -> StepResults:
        """See :meth:`SubEnvs.reset_all`.

        Resets every sub-env (a new seed makes a new pool) and returns the first batch of
        resets; the others' first observations come with later ``poll`` calls, as rows of
        episodes that have not started (the runner records them as their resets).
        """
        if seed is not None and seed != self._seed:
            self._make(seed)
        else:
            self._drain()
        self.pool.async_reset()
        self._inflight[:] = True
        results = self.poll(0.0)
        obs, ids = results.observations, results.env_ids
        assert ids is not None
        resets = [(int(i), obs[j], results.infos[j]) for j, i in enumerate(ids)]
        return StepResults(None, [], [], [], [], [], resets=resets)

    def _drain(self) -> None:
        """Receives every step in flight, so that the pool can be reset.

        EnvPool answers in batches of exactly ``batch_size``: idle sub-envs are sent an
        action (its result dropped) until the steps in flight fill whole batches.
        """
        short = -int(self._inflight.sum()) % self.batch_size
        if short:
            idle = np.flatnonzero(~self._inflight)[:short]
            self._send(idle, self.action_space.sample()[: len(idle)])
        while self._inflight.any():
            *_, info = self.pool.recv()
            self._inflight[info["env_id"]] = False

    def send(self, env_ids: np.ndarray | None, actions: Any) -> None:
        """See :meth:`SubEnvs.send`."""
        ids = np.arange(self.num_envs) if env_ids is None else np.asarray(env_ids)
        if len(ids):
            self._send(ids, actions)

    def _send(self, ids: np.ndarray, actions: Any) -> None:
        self.pool.send(np.asarray(actions), ids.astype(np.int32))
        self._inflight[ids] = True

    def poll(self, wait_s: float) -> StepResults:
        """See :meth:`SubEnvs.poll`: EnvPool's ``recv`` (a batch of ``batch_size``)."""
        obs, rewards, terminateds, truncateds, info = self.pool.recv()
        ids = np.asarray(info["env_id"], np.int64)
        self._inflight[ids] = False
        # In sub-env order, as the lockstep backends return them.
        order = np.argsort(ids, kind="stable")
        ids = ids[order]
        obs = obs[order]
        if self.spec.channels_last:
            obs = np.ascontiguousarray(np.moveaxis(obs, 1, -1))
        keys = [k for k in info if k not in _OWN_INFO_KEYS]
        infos = [{k: info[k][j] for k in keys} for j in order]
        return StepResults(
            ids,
            obs,
            np.asarray(rewards, np.float64)[order],
            np.asarray(terminateds, bool)[order],
            np.asarray(truncateds, bool)[order],
            infos,
        )

    def reset(self, i: int, seed: int | None = None) -> None:
        """EnvPool resets a sub-env on its own (on its next step after its episode ended).

        Raises:
            RuntimeError: Always: the runner never resets one EnvPool sub-env.
        """
        raise RuntimeError(f"an EnvPool sub-env ({i}) cannot be reset alone")

    def recreate(self, i: int) -> None:
        """EnvPool cannot make one of its envs again.

        Raises:
            RuntimeError: Always (the config refuses restarts with EnvPool before this).
        """
        raise RuntimeError(f"EnvPool cannot make its sub-env {i} again")

    def close(self) -> None:
        """See :meth:`SubEnvs.close`."""
        if self.pool is not None:
            with contextlib.suppress(Exception):
                self.pool.close()
            self.pool = None


def _channels_last_space(space: Any) -> Any:
    """A ``(C, H, W)`` Box as ``(H, W, C)``."""
    import gymnasium as gym

    if not (isinstance(space, gym.spaces.Box) and len(space.shape) == 3):
        raise ValueError(f"channels_last needs a 3-D Box observation space, got {space}")
    return gym.spaces.Box(
        np.moveaxis(space.low, 0, -1),
        np.moveaxis(space.high, 0, -1),
        dtype=space.dtype,  # type: ignore[arg-type]
    )
