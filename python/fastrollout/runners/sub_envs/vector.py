"""Single-agent sub-envs in a gymnasium vector env: in-process, native, or sub-processes.

One sub-process per sub-env is gymnasium's ``AsyncVectorEnv`` (observations in shared
memory, or through the pipes with restarts on).

All three step in lockstep and reset a finished sub-env on its next step (gymnasium's
next-step autoreset). With restarts on, a sub-env's failure is reported per sub-env
instead of failing the whole vector step: in-process, a thin wrapper catches the error of
each sub-env; in sub-processes, a worker that raised, died or hung is replaced alone.
"""

from __future__ import annotations

import contextlib
import functools
import multiprocessing
import time
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

import gymnasium as gym
import numpy as np

from fastrollout.runners.sub_envs.base import StepResults, SubEnvs

__all__ = ["GymVectorSubEnvs"]

_NO_FAILURES: dict[int, BaseException] = {}  # shared: never written to

# The info key under which a guarded in-process sub-env reports its step's error.
_FAILED = "__fastrollout_sub_env_error__"


class _Guarded(gym.Wrapper):  # type: ignore[type-arg]
    """A sub-env of a runner that restarts failed sub-envs.

    It reports an error of its ``step``/``reset`` in its infos instead of raising it (the
    failed call returns the last observation, so the vector env can stack it, reward 0,
    not done, and ``infos[_FAILED] = the error``), and it resets on its first ``step`` if
    it was not reset since it was created (a recreated sub-env: the action is ignored,
    as in gymnasium's next-step autoreset).

    Args:
        env: The env.
    """

    def __init__(self, env: gym.Env) -> None:  # type: ignore[type-arg]
        super().__init__(env)
        self._needs_reset = True
        self._last_obs: Any = None

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> Any:
        try:
            obs, infos = self.env.reset(seed=seed, options=options)
        except Exception as err:  # the runner restarts the sub-env
            return self._placeholder(), {_FAILED: err}
        self._needs_reset = False
        self._last_obs = obs
        return obs, infos

    def step(self, action: Any) -> Any:
        if self._needs_reset:
            obs, infos = self.reset()
            return obs, 0.0, False, False, infos
        try:
            obs, reward, terminated, truncated, infos = self.env.step(action)
        except Exception as err:
            return self._placeholder(), 0.0, False, False, {_FAILED: err}
        self._last_obs = obs
        return obs, reward, terminated, truncated, infos

    def _placeholder(self) -> Any:
        if self._last_obs is None:
            self._last_obs = self.env.observation_space.sample()
        return self._last_obs


def batch_space_of(space: Any, n: int) -> Any:
    """``gymnasium.vector.utils.batch_space(space, n)``, made once per space and size."""
    key = (id(space), n)
    cached = _BATCH_SPACES.get(key)
    if cached is None or cached[0] is not space:
        from gymnasium.vector.utils import batch_space

        cached = _BATCH_SPACES[key] = (space, batch_space(space, n))
    return cached[1]


_BATCH_SPACES: dict[tuple[int, int], tuple[Any, Any]] = {}


def _factory(creator: Callable[[int], Any], i: int, guard: bool) -> Callable[[], Any]:
    """``() -> sub-env i`` (guarded), picklable for gymnasium's sub-process workers."""
    return functools.partial(_make, creator, i, guard)


def _make(creator: Callable[[int], Any], i: int, guard: bool) -> Any:
    env = creator(i)
    return _Guarded(env) if guard else env


class GymVectorSubEnvs(SubEnvs):
    """Single-agent sub-envs in a gymnasium vector env.

    Args:
        creator: ``creator(vector_index) -> env``.
        num_envs: The number of sub-envs.
        mode: ``"sync"``, ``"async"`` or ``"vector_entry_point"``.
        guard: Report each sub-env's failure (restarts on) instead of raising.
        make_vector: ``make_vector(n) -> vector env`` for ``"vector_entry_point"``.
        step_timeout_s: (``"async"``, with ``guard``) A step that takes longer fails its
            sub-env; None: no limit.

    Raises:
        ValueError: For an unknown mode, or ``guard`` with ``"vector_entry_point"`` (a
            natively vectorized env cannot replace one sub-env).
    """

    autoresets = True

    def __init__(
        self,
        creator: Callable[[int], Any],
        num_envs: int,
        mode: str,
        *,
        guard: bool,
        make_vector: Callable[[int], Any] | None = None,
        step_timeout_s: float | None = None,
    ) -> None:
        self._creator = creator
        self._guard = guard
        self._step_timeout_s = step_timeout_s
        self._actions: Any = None
        # Steps of some sub-envs only (a sync vector env): (sub-envs, actions) per send.
        self._subset: list[tuple[np.ndarray, Any]] = []
        self._mode = mode
        if mode in ("sync", "async"):
            fns = [_factory(creator, i, guard) for i in range(num_envs)]
            if mode == "sync":
                self._vec: Any = gym.vector.SyncVectorEnv(fns)
            else:
                self._vec = (
                    # Replacing one worker needs its arguments, and gymnasium keeps no
                    # handle on its shared memory: with restarts, observations come
                    # through the workers' pipes.
                    _ResilientAsyncVectorEnv(fns, shared_memory=False)
                    if guard
                    else gym.vector.AsyncVectorEnv(fns)
                )
        elif mode == "vector_entry_point":
            if guard:
                raise ValueError(
                    "restart_failed_sub_environments needs gym_env_vectorize_mode 'sync' or "
                    "'async' (sub-envs created one by one), not 'vector_entry_point'"
                )
            assert make_vector is not None
            self._vec = make_vector(num_envs)
        else:
            raise ValueError(
                "gym_env_vectorize_mode must be 'sync', 'async' or 'vector_entry_point', "
                f"got {mode!r}"
            )
        self.num_envs = self._vec.num_envs

    @property
    def env(self) -> Any:
        """See :attr:`SubEnvs.env`."""
        return self._vec

    def sub_env(self, i: int) -> Any:
        """See :meth:`SubEnvs.sub_env`."""
        envs = getattr(self._vec, "envs", None)
        if envs is None:
            return None
        env = envs[i]
        return env.env if isinstance(env, _Guarded) else env

    def reset_all(self, seed: int | None) -> StepResults:
        """See :meth:`SubEnvs.reset_all`."""
        obs, infos = self._vec.reset(seed=seed)
        failed = self._failures(infos)
        return StepResults(
            env_ids=None,
            observations=obs,
            rewards=np.zeros(self.num_envs),
            terminateds=np.zeros(self.num_envs, bool),
            truncateds=np.zeros(self.num_envs, bool),
            infos=infos,
            failed=failed,
            resets=[],
        )

    @property
    def steps_subsets(self) -> bool:
        """Whether ``send`` takes some sub-envs only (in-process sync vector envs)."""
        return self._mode == "sync"

    def send(self, env_ids: np.ndarray | None, actions: Any) -> None:
        """See :meth:`SubEnvs.send`.

        Raises:
            ValueError: For some sub-envs only, where the vector env steps all of them
                (``"async"``, ``"vector_entry_point"``).
        """
        if env_ids is not None:
            if not self.steps_subsets:
                raise ValueError(
                    f"gym_env_vectorize_mode={self._mode!r} steps every sub-env together: it "
                    "cannot step some of them only"
                )
            self._subset.append((np.asarray(env_ids, np.int64), actions))
        elif isinstance(self._vec, _ResilientAsyncVectorEnv):
            self._vec.send_steps(actions)
        else:
            self._actions = actions

    def _step_subset(self) -> StepResults:
        """Steps the sub-envs of the last sends, as the sync vector env steps each one.

        Each sub-env resets instead of stepping where its episode ended (gymnasium's
        next-step autoreset, with the vector env's own flags); the rows come back in
        sub-env order, failed sub-envs (with restarts) left out.
        """
        from gymnasium.vector.utils import concatenate, create_empty_array, iterate

        pending, self._subset = self._subset, []
        vec = self._vec
        single = vec.single_action_space
        rows: list[tuple[int, Any, float, bool, bool, Any]] = []
        failed: dict[int, BaseException] = {}
        for ids, actions in pending:
            for i, action in zip(
                ids.tolist(), iterate(batch_space_of(single, len(ids)), actions), strict=True
            ):
                env = vec.envs[i]
                if vec._autoreset_envs[i]:
                    obs, info = env.reset()
                    rew, term, trunc = 0.0, False, False
                else:
                    obs, rew, term, trunc, info = env.step(action)
                vec._autoreset_envs[i] = bool(term or trunc)
                if self._guard and isinstance(info, dict) and _FAILED in info:
                    failed[i] = info[_FAILED]
                    continue
                rows.append((i, obs, float(rew), bool(term), bool(trunc), info))
        rows.sort(key=lambda r: r[0])
        space = vec.single_observation_space
        out = create_empty_array(space, len(rows))
        obs_batch = concatenate(space, [r[1] for r in rows], out) if rows else out
        return StepResults(
            np.array([r[0] for r in rows], np.int64),
            obs_batch,
            np.array([r[2] for r in rows], np.float64),
            np.array([r[3] for r in rows], bool),
            np.array([r[4] for r in rows], bool),
            [r[5] for r in rows],
            failed=failed or _NO_FAILURES,
        )

    def poll(self, wait_s: float) -> StepResults:
        """See :meth:`SubEnvs.poll`."""
        if self._subset:
            return self._step_subset()
        if isinstance(self._vec, _ResilientAsyncVectorEnv):
            obs, rewards, terminateds, truncateds, infos, failed = self._vec.wait_steps(
                self._step_timeout_s
            )
            more = self._failures(infos)
            if more:
                failed.update(more)
        else:
            actions, self._actions = self._actions, None
            obs, rewards, terminateds, truncateds, infos = self._vec.step(actions)
            failed = self._failures(infos)
        return StepResults(None, obs, rewards, terminateds, truncateds, infos, failed=failed)

    def _failures(self, infos: Any) -> dict[int, BaseException]:
        """Takes the guarded sub-envs' errors out of the vector infos."""
        if not self._guard or not isinstance(infos, dict) or _FAILED not in infos:
            return _NO_FAILURES
        mask = infos.pop("_" + _FAILED)
        errors = infos.pop(_FAILED)
        return {int(i): errors[i] for i in np.flatnonzero(mask)}

    def reset(self, i: int, seed: int | None = None) -> tuple[Any, Any]:
        """See :meth:`SubEnvs.reset`."""
        if isinstance(self._vec, _ResilientAsyncVectorEnv):
            return self._vec.reset_one(i, seed)
        env = self._vec.envs[i]
        obs, infos = env.reset(seed=seed)
        if isinstance(infos, dict) and _FAILED in infos:
            raise infos[_FAILED]
        # The vector env must not autoreset it again on its next step.
        autoreset = getattr(self._vec, "_autoreset_envs", None)
        if autoreset is not None:
            autoreset[i] = False
        return obs, infos

    def recreate(self, i: int) -> None:
        """See :meth:`SubEnvs.recreate`."""
        if isinstance(self._vec, _ResilientAsyncVectorEnv):
            self._vec.respawn(i)
            return
        old = self._vec.envs[i]
        with contextlib.suppress(Exception):
            old.close()
        self._vec.envs[i] = _make(self._creator, i, self._guard)

    def close(self) -> None:
        """See :meth:`SubEnvs.close`."""
        if isinstance(self._vec, _ResilientAsyncVectorEnv):
            # A worker ended after a failure has no pipe to say goodbye on.
            self._vec.close(terminate=True)
        else:
            self._vec.close()


class _ResilientAsyncVectorEnv(gym.vector.AsyncVectorEnv):
    """gymnasium's ``AsyncVectorEnv`` whose step reports each worker's failure.

    Its sub-envs are guarded (they report their errors in their infos). A worker that
    dies, ends with an error, or does not answer within the step timeout is ended;
    ``wait_steps`` returns those sub-envs as failed instead of raising, and ``respawn``
    starts a new worker (a new sub-env) in place of one.
    """

    #: The sub-envs whose step the last ``send_steps`` could not send (their worker died).
    _send_failed: Mapping[int, OSError] = MappingProxyType({})

    def send_steps(self, actions: Any) -> None:
        """Sends every sub-env its action.

        This is gymnasium's ``step_async`` without its checks of the state, which a
        replaced worker would upset.
        """
        from gymnasium.vector.utils import iterate

        # A worker that died since its last step closed its pipe: the send fails and
        # ``wait_steps`` reports that sub-env as failed.
        failed: dict[int, OSError] = {}
        for i, (pipe, action) in enumerate(
            zip(self.parent_pipes, iterate(self.action_space, actions), strict=True)
        ):
            try:
                pipe.send(("step", action))
            except OSError as err:
                failed[i] = err
        self._send_failed = failed

    def wait_steps(self, timeout_s: float | None) -> tuple[Any, ...]:
        """Receives every sub-env's step; failed ones are reported, not raised.

        Args:
            timeout_s: The longest a step may take (None: no limit).

        Returns:
            ``(obs, rewards, terminateds, truncateds, infos, failed)``.
        """
        from gymnasium.vector.utils import concatenate

        n = self.num_envs
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        rewards = np.zeros(n)
        terminateds = np.zeros(n, bool)
        truncateds = np.zeros(n, bool)
        infos: dict[str, Any] = {}
        items: list[Any] = []
        failed: dict[int, BaseException] = {}
        for i, pipe in enumerate(self.parent_pipes):
            try:
                if i in self._send_failed:
                    raise self._send_failed[i]
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                if left is not None and not pipe.poll(left):
                    raise TimeoutError(f"sub-env {i}: its step took longer than {timeout_s} s")
                result, ok = pipe.recv()
            except (EOFError, OSError, TimeoutError) as err:
                failed[i] = (
                    err
                    if isinstance(err, TimeoutError)
                    else ChildProcessError(f"sub-env {i}: its worker process died ({err!r})")
                )
                self._end_worker(i)
                items.append(self.single_observation_space.sample())
                continue
            if not ok:
                failed[i] = self._worker_error(i)
                self._end_worker(i)
                items.append(self.single_observation_space.sample())
                continue
            obs, rewards[i], terminateds[i], truncateds[i], info = result
            items.append(obs)
            infos = self._add_info(infos, info, i)
        from gymnasium.vector.utils import create_empty_array

        obs_batch = concatenate(
            self.single_observation_space,
            items,
            create_empty_array(self.single_observation_space, n),
        )
        return obs_batch, rewards, terminateds, truncateds, infos, failed

    def _worker_error(self, i: int) -> BaseException:
        """The error a worker ended with (gymnasium's worker puts it in the error queue).

        The guarded sub-envs report their own errors; a worker ends with one only when
        something outside them failed (sending a result that does not pickle, say).
        """
        found: BaseException | None = None
        with contextlib.suppress(Exception):
            while not self.error_queue.empty():
                index, exctype, value, _trace = self.error_queue.get_nowait()
                if index == i:
                    found = value if isinstance(value, BaseException) else exctype(value)
        return found or RuntimeError(f"sub-env {i}: its worker process ended with an error")

    def _end_worker(self, i: int) -> None:
        process = self.processes[i]
        with contextlib.suppress(Exception):
            self.parent_pipes[i].close()
        if process.is_alive():
            process.terminate()
        process.join(timeout=5)

    def respawn(self, i: int) -> None:
        """Starts a new worker (a new sub-env) for sub-env ``i``."""
        from gymnasium.vector.async_vector_env import _async_worker
        from gymnasium.vector.utils import CloudpickleWrapper

        old = self.processes[i]
        self._end_worker(i)
        parent, child = multiprocessing.Pipe()
        # gymnasium's worker, with its arguments (no shared memory, see GymVectorSubEnvs);
        # the process class carries the vector env's start method.
        args = (
            i,
            CloudpickleWrapper(self.env_fns[i]),
            child,
            parent,
            None,
            self.error_queue,
            self.autoreset_mode,
        )
        process = type(old)(target=_async_worker, name=old.name, args=args)
        process.daemon = old.daemon
        process.start()
        child.close()
        self.parent_pipes[i] = parent
        self.processes[i] = process

    def reset_one(self, i: int, seed: int | None) -> tuple[Any, Any]:
        """Resets sub-env ``i`` alone and waits for it.

        Raises:
            ChildProcessError: If its worker died (or failed to create its env).
            Exception: What the sub-env's reset raised (its worker then ends).
        """
        pipe = self.parent_pipes[i]
        try:
            pipe.send(("reset", {"seed": seed, "options": None}))
            result, ok = pipe.recv()
        except (EOFError, OSError) as err:
            self._end_worker(i)
            raise ChildProcessError(f"sub-env {i}: its worker process died ({err!r})") from err
        if not ok:
            error = self._worker_error(i)
            self._end_worker(i)
            raise error
        obs, infos = result
        return obs, infos
