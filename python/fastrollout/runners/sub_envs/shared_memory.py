"""Sub-envs in worker processes that step in the background (the ``shared_memory`` backend).

W worker processes each own a contiguous group of the sub-envs, stepped in two halves. The
runner writes the actions of some sub-envs into one shared-memory block and sends their
worker a few bytes naming them; the worker steps them one after another, writes their
observations, rewards and flags into the block, then answers on its pipe (the infos, and
any failure). ``poll`` waits, in the native core with the GIL released, until the answers
hold at least ``sub_env_batch_size`` sub-envs, and returns those: the runner infers for
them while the other half, and the other workers' sub-envs, go on stepping (double
buffering with the default batch of half the sub-envs). Observations never travel through
pickles: the runner copies the ready rows out of the block once. Multi-agent sub-envs
return per-agent dicts, which travel through the pipes.

Each sub-env's steps stay in order and each episode holds exactly one sub-env's steps; with
a batch of all sub-envs the runner acts for every sub-env each turn, as the lockstep
backends do, and samples the same episodes. With smaller batches, which sub-envs share a
forward pass depends on timing, so the random draws (and thus the actions) differ from run
to run.

A step that raises is that sub-env's failure (its worker goes on); a worker that dies or
does not answer within ``sub_env_step_timeout_s`` fails all its sub-envs and is replaced
(its sub-envs made again) when the runner recreates them.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import pickle
import time
import traceback
from collections import deque
from collections.abc import Callable
from multiprocessing import shared_memory
from typing import Any

import numpy as np

from fastrollout.core.tree import set_rows, take
from fastrollout.runners.sub_envs.base import StepResults, SubEnvs
from fastrollout.runners.sub_envs.remote import SubEnvHost, _AgentSpaces

__all__ = ["SharedMemorySubEnvs", "default_num_workers"]

# Added to the step timeout for a worker's first answer (its process starting, its envs
# being made).
_STARTUP_ALLOWANCE_S = 60.0
# Byte alignment of each array in the shared block.
_ALIGN = 64


def default_num_workers(num_envs: int) -> int:
    """Worker processes when the config names none: one per CPU core but the runner's own.

    The runner's process infers (and records) on one core while the workers step the
    sub-envs on the others; at least one worker, at most one per sub-env.

    Args:
        num_envs: The sub-envs.

    Returns:
        The number of workers.
    """
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cores = os.cpu_count() or 1
    return max(1, min(cores - 1, num_envs))


def _leaves(tree: Any) -> list[np.ndarray]:
    """The arrays of a batch laid out as gymnasium's vector envs lay Dict/Tuple spaces out."""
    if isinstance(tree, dict):
        return [leaf for v in tree.values() for leaf in _leaves(v)]
    if isinstance(tree, tuple):
        return [leaf for v in tree for leaf in _leaves(v)]
    return [tree]


def _rebuild(tree: Any, leaves: list[np.ndarray]) -> Any:
    """``tree`` with its arrays replaced by ``leaves`` (in ``_leaves`` order)."""
    it = iter(leaves)

    def go(t: Any) -> Any:
        if isinstance(t, dict):
            return {k: go(v) for k, v in t.items()}
        if isinstance(t, tuple):
            return tuple(go(v) for v in t)
        return next(it)

    return go(tree)


class _Block:
    """The shared arrays of all sub-envs: observations and actions (if typed), rewards, flags.

    The runner makes it (``create``) and the workers attach to it by name (``attach``);
    its arrays are numpy views of the shared memory, one row per sub-env.

    Args:
        template: A batch of ``num_envs`` observations as gymnasium lays it out.
        action_template: The same for actions.
        num_envs: The sub-envs.
    """

    def __init__(self, template: Any, action_template: Any, num_envs: int) -> None:
        self.num_envs = num_envs
        self.template = template
        self.action_template = action_template
        specs: list[tuple[tuple[int, ...], np.dtype[Any]]] = []
        for t in (template, action_template):
            specs += [(a.shape, a.dtype) for a in _leaves(t)]
        # Rewards, terminateds, truncateds.
        specs += [((num_envs,), np.dtype(np.float64))] + [((num_envs,), np.dtype(bool))] * 2
        self.specs = specs
        offsets, size = [], 0
        for shape, dtype in specs:
            size = -(-size // _ALIGN) * _ALIGN
            offsets.append(size)
            size += int(np.prod(shape)) * dtype.itemsize
        self.offsets = offsets
        self.size = max(size, 1)
        self.shm: shared_memory.SharedMemory | None = None

    def create(self) -> None:
        self.shm = shared_memory.SharedMemory(create=True, size=self.size)
        self._make_views()

    def attach(self, name: str) -> None:
        # (The workers share the runner's resource tracker, started before them, whose
        # registry is a set: the block stays registered once, and the runner unlinks it.)
        self.shm = shared_memory.SharedMemory(name=name)
        self._make_views()

    def _make_views(self) -> None:
        assert self.shm is not None
        arrays = [
            np.ndarray(shape, dtype, buffer=self.shm.buf, offset=off)
            for (shape, dtype), off in zip(self.specs, self.offsets, strict=True)
        ]
        self.rewards, self.terminateds, self.truncateds = arrays[-3:]
        k = len(_leaves(self.template))
        self.observations = _rebuild(self.template, arrays[:k])
        self.actions = _rebuild(self.action_template, arrays[k:-3])
        # One sub-env's observation arrays, to check each observation's shapes against.
        self.row_template = take(self.template, 0)

    def release(self, unlink: bool) -> None:
        shm, self.shm = self.shm, None
        self.observations = self.actions = None
        self.rewards = self.terminateds = self.truncateds = None  # type: ignore[assignment]
        if shm is None:
            return
        with contextlib.suppress(Exception):
            shm.close()
        if unlink:
            with contextlib.suppress(Exception):
                shm.unlink()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.update(shm=None, observations=None, actions=None, row_template=None)
        for k in ("rewards", "terminateds", "truncateds"):
            state.pop(k, None)
        return state


def _portable_error(err: BaseException) -> BaseException:
    """``err`` if it pickles, else a ``RuntimeError`` with its type, text and traceback."""
    try:
        pickle.dumps(err)
        return err
    except Exception:
        text = "".join(traceback.format_exception(err)).rstrip()
        return RuntimeError(f"{type(err).__name__}: {err}\n{text}")


# The first byte of a command: a step whose actions are in the block (then the sub-envs as
# int32s), or any other command (then its pickle).
_STEP = b"S"
_PICKLED = b"P"


def _send_command(conn: Any, msg: tuple[Any, ...]) -> None:
    """Sends a worker a pickled command."""
    from multiprocessing.reduction import ForkingPickler

    conn.send_bytes(_PICKLED + bytes(ForkingPickler.dumps(msg)))


def _read_command(conn: Any) -> tuple[Any, ...]:
    """Reads a worker's next command (see ``_STEP``)."""
    raw = conn.recv_bytes()
    if raw[:1] == _STEP:
        return ("step", np.frombuffer(raw, np.int32, offset=1).tolist(), None)
    return pickle.loads(raw[1:])  # type: ignore[no-any-return]


def _check_obs(obs: Any, template_row: Any, i: int) -> None:
    """Refuses an observation whose arrays do not have the space's shapes (no broadcasting)."""
    from fastrollout.errors import SpaceMismatchError

    def fits(o: Any, t: Any) -> bool:
        if isinstance(t, dict):
            return isinstance(o, dict) and o.keys() == t.keys() and all(fits(o[k], t[k]) for k in t)
        if isinstance(t, tuple):
            return (
                isinstance(o, tuple)
                and len(o) == len(t)
                and all(fits(a, b) for a, b in zip(o, t, strict=True))
            )
        return bool(np.shape(o) == t.shape)

    if not fits(obs, template_row):
        raise SpaceMismatchError(
            f"sub-env {i} returned an observation that does not fit the observation space: "
            f"{_shapes(obs)}, expected {_shapes(template_row)}"
        )


def _shapes(tree: Any) -> Any:
    """The shapes of a (nested) observation, for messages."""
    if isinstance(tree, dict):
        return {k: _shapes(v) for k, v in tree.items()}
    if isinstance(tree, tuple):
        return tuple(_shapes(v) for v in tree)
    return np.shape(tree)


def _worker_main(
    conn: Any,
    creator: Any,
    ids: list[int],
    multi_agent: bool,
) -> None:
    """A worker process: makes its sub-envs, then answers commands until ``close``.

    Every command gets exactly one answer, in order: ``("ok", payload)``, or
    ``("failed", {sub-env: error})`` for the sub-envs that failed (the others' results in
    the payload).
    """
    hosts: dict[int, SubEnvHost | None] = {}
    block: _Block | None = None
    made: dict[int, BaseException] = {}
    for i in ids:
        try:
            hosts[i] = SubEnvHost(creator, i, autoreset=not multi_agent)
        except Exception as err:
            hosts[i] = None
            made[i] = _portable_error(err)
    spaces = None
    for h in hosts.values():
        if h is not None:
            try:
                spaces = h.spaces()
            except Exception as err:  # a space that does not pickle, say
                made[ids[0]] = _portable_error(err)
            break
    conn.send(("made", spaces, made))
    while True:
        try:
            msg = _read_command(conn)
        except (EOFError, OSError, KeyboardInterrupt):
            break
        kind = msg[0]
        if kind == "close":
            for h in hosts.values():
                if h is not None:
                    with contextlib.suppress(Exception):
                        h.close()
            if block is not None:
                block.release(unlink=False)
            with contextlib.suppress(Exception):
                conn.send(("ok", None, {}))
            break
        if kind == "attach":
            block = msg[1]
            assert block is not None
            block.attach(msg[2])
            conn.send(("ok", None, {}))
            continue
        failed: dict[int, BaseException] = {}
        payload: Any = None
        if kind == "step":
            _, sub_ids, actions = msg
            payload = _steps(hosts, block, sub_ids, actions, failed, multi_agent)
        elif kind == "reset":
            _, sub_ids, seeds = msg
            payload = []
            for i, seed in zip(sub_ids, seeds, strict=True):
                host = hosts.get(i)
                if host is None:
                    failed[i] = RuntimeError(f"sub-env {i} could not be made (see its last error)")
                    continue
                try:
                    obs, infos = host.reset(seed)
                    if block is not None:  # single-agent: into the block
                        _check_obs(obs, block.row_template, i)
                        set_rows(block.observations, i, obs)
                        obs = None
                    payload.append((i, obs, infos))
                except Exception as err:
                    failed[i] = _portable_error(err)
        elif kind == "recreate":
            i = msg[1]
            old = hosts.get(i)
            if old is not None:
                with contextlib.suppress(Exception):
                    old.close()
            try:
                hosts[i] = SubEnvHost(creator, i, autoreset=not multi_agent)
            except Exception as err:
                hosts[i] = None
                failed[i] = _portable_error(err)
        conn.send(("ok", payload, {i: _portable_error(e) for i, e in failed.items()}))


def _steps(
    hosts: dict[int, SubEnvHost | None],
    block: _Block | None,
    sub_ids: list[int],
    actions: Any,
    failed: dict[int, BaseException],
    multi_agent: bool,
) -> Any:
    """Steps the named sub-envs in a worker; results into the block (and the payload)."""
    rows: list[Any] = []

    for j, i in enumerate(sub_ids):
        host = hosts.get(i)
        if host is None:  # its creation failed (already reported): no row
            continue
        try:
            if multi_agent:
                action = actions[j]
            elif actions is None:  # in the block
                assert block is not None
                action = take(block.actions, i)
            else:
                action = take(actions, j)
            obs, rew, term, trunc, infos = host.step(action)
        except Exception as err:
            failed[i] = _portable_error(err)
            continue
        if multi_agent:
            rows.append((i, obs, rew, term, trunc, infos))
            continue
        assert block is not None
        try:
            _check_obs(obs, block.row_template, i)
            set_rows(block.observations, i, obs)
            block.rewards[i] = rew
        except Exception as err:
            failed[i] = _portable_error(err)
            continue
        block.terminateds[i] = term
        block.truncateds[i] = trunc
        rows.append((i, None, infos))
    return rows


class _Command:
    """A command a worker has not answered yet.

    Attributes:
        kind: ``"step"``, ``"reset"``, ``"recreate"``, ...
        ids: The sub-envs whose results its answer carries.
        gens: Per sub-env it concerns, the sub-env's generation when it was sent.
        deadline: When it times out (None: never).
    """

    __slots__ = ("deadline", "gens", "ids", "kind")

    def __init__(
        self, kind: str, ids: list[int], gens: dict[int, int], deadline: float | None
    ) -> None:
        self.kind = kind
        self.ids = ids
        self.gens = gens
        self.deadline = deadline


class _Worker:
    """The runner's handle on one worker process."""

    def __init__(self, index: int, ids: list[int]) -> None:
        self.index = index
        self.ids = ids
        self.process: Any = None
        self.conn: Any = None
        self.fd = -1
        self.pending: deque[_Command] = deque()
        self.alive = False
        # The worker's first answer also waits for its process to start (see _deadline).
        self.starting = True


class SharedMemorySubEnvs(SubEnvs):
    """``num_envs`` sub-envs stepped by worker processes, batches returned as they are ready.

    For a single-agent env this object is the runner's ``env``: it has a vector env's
    ``single_observation_space``/``single_action_space``, their batched forms and
    ``num_envs``.

    Args:
        creator: ``creator(vector_index) -> env`` (inherited by, or pickled to, the workers).
        num_envs: The number of sub-envs.
        multi_agent: The env is a ``MultiAgentEnv``.
        num_workers: Worker processes (None: :func:`default_num_workers`, one per core but
            the runner's own); at most one per sub-env. Each steps a contiguous group of
            the sub-envs in two halves, one command each, so that it steps one half while
            the runner infers for the other.
        batch_size: Sub-envs per batch (None: half of them, rounded up). A batch is made
            of whole workers' answers, so it may hold more.
        step_timeout_s: A worker whose answer takes longer fails all its sub-envs (it is
            ended); None: no limit.
        start_method: The multiprocessing start method (None: Python's default).

    Raises:
        ValueError: If ``batch_size`` or ``num_workers`` is below 1, or ``batch_size``
            is above ``num_envs``.
        Exception: What making sub-env 0 raised (its spaces are read from it).
    """

    lockstep = False

    def __init__(
        self,
        creator: Callable[[int], Any],
        num_envs: int,
        *,
        multi_agent: bool,
        num_workers: int | None = None,
        batch_size: int | None = None,
        step_timeout_s: float | None = None,
        start_method: str | None = None,
    ) -> None:
        if num_workers is not None and num_workers < 1:
            raise ValueError(f"num_sub_env_workers must be at least 1, got {num_workers}")
        if batch_size is not None and not 1 <= batch_size <= num_envs:
            raise ValueError(
                f"sub_env_batch_size must be between 1 and the sub-envs per runner "
                f"(num_envs_per_env_runner={num_envs}), got {batch_size}"
            )
        self.multi_agent = multi_agent
        self.autoresets = not multi_agent
        self.num_envs = num_envs
        self.batch_size = batch_size if batch_size is not None else -(-num_envs // 2)
        w = min(num_workers or default_num_workers(num_envs), num_envs)
        self.num_workers = w
        self._creator = creator
        self._step_timeout_s = step_timeout_s
        self._ctx = multiprocessing.get_context(start_method)
        groups = np.array_split(np.arange(num_envs), w)
        self._workers = [_Worker(k, [int(i) for i in g]) for k, g in enumerate(groups)]
        self._worker_of = np.concatenate([np.full(len(g), k) for k, g in enumerate(groups)])
        # Each worker's group in two halves, stepped by separate commands: while the
        # runner infers for one half, the worker steps the other (double buffering within
        # a worker, as Sample Factory's worker splits).
        self._half_of = np.concatenate(
            [2 * k + (np.arange(len(g)) >= -(-len(g) // 2)) for k, g in enumerate(groups)]
        )
        # Sub-envs whose worker was started again since they failed: recreating them is
        # done (see recreate).
        self._fresh: set[int] = set()
        # Each sub-env's generation, one more at each recreate: answers to commands sent
        # before (a step or reset in flight when the sub-env failed) are dropped.
        self._gen = [0] * num_envs
        self._block: _Block | None = None
        self._agent_spaces: _AgentSpaces | None = None
        self._closed = False
        spaces = None
        # Started before the workers, so that they share it (see _Block.attach).
        from multiprocessing import resource_tracker

        resource_tracker.ensure_running()
        try:
            for worker in self._workers:
                self._start(worker)
            for worker in self._workers:
                got, made = self._made(worker)
                spaces = spaces or got
                if made:
                    raise made[min(made)]
        except BaseException:
            self.close()
            raise
        if spaces is None:
            self.close()
            raise RuntimeError("no sub-env could be made")
        self._set_spaces(spaces)

    # -- workers ---------------------------------------------------------------------

    def _start(self, worker: _Worker) -> None:
        from gymnasium.vector.utils import CloudpickleWrapper

        parent, child = self._ctx.Pipe()
        creator: Any = self._creator
        if self._ctx.get_start_method() != "fork":
            creator = CloudpickleWrapper(creator)
        process = self._ctx.Process(  # type: ignore[attr-defined]
            target=_worker_entry,
            args=(child, creator, worker.ids, self.multi_agent),
            name=f"fastrollout-sub-envs-{worker.index}",
            daemon=True,
        )
        process.start()
        child.close()
        worker.process, worker.conn, worker.fd = process, parent, parent.fileno()
        worker.pending.clear()
        worker.alive = True
        worker.starting = True

    def _made(self, worker: _Worker) -> tuple[Any, dict[int, BaseException]]:
        """Waits for a started worker's first answer: the spaces, and envs it could not make."""
        timeout = self._step_timeout_s
        if timeout is not None:
            timeout += _STARTUP_ALLOWANCE_S
        if timeout is not None and not worker.conn.poll(timeout):
            self._end(worker)
            raise TimeoutError(f"sub-env worker {worker.index} did not start within {timeout} s")
        try:
            _, spaces, made = worker.conn.recv()
        except (EOFError, OSError) as err:
            self._end(worker)
            raise ChildProcessError(
                f"sub-env worker {worker.index} died while making its sub-envs "
                f"(exit code {worker.process.exitcode})"
            ) from err
        worker.starting = False
        if self._block is not None:
            self._attach(worker)
        return spaces, made

    def _attach(self, worker: _Worker) -> None:
        assert self._block is not None and self._block.shm is not None
        _send_command(worker.conn, ("attach", self._block, self._block.shm.name))
        worker.conn.recv()

    def _set_spaces(self, spaces: dict[str, Any]) -> None:
        if self.multi_agent:
            self._agent_spaces = _AgentSpaces(spaces)
            self._block = None
            return
        from gymnasium.vector.utils import batch_space, create_empty_array

        self.single_observation_space = spaces["observation_space"]
        self.single_action_space = spaces["action_space"]
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)

        def typed(space: Any, what: str) -> Any:
            t = create_empty_array(space, self.num_envs)
            if not all(isinstance(a, np.ndarray) and a.dtype.kind in "biuf" for a in _leaves(t)):
                raise TypeError(
                    f"sub_env_backend='shared_memory' needs {what} of numeric arrays (Box, "
                    f"Discrete, MultiDiscrete, MultiBinary, Dict/Tuple of them); got {space}"
                )
            return t

        self._block = _Block(
            typed(self.single_observation_space, "observations"),
            typed(self.single_action_space, "actions"),
            self.num_envs,
        )
        self._block.create()
        for worker in self._workers:
            self._attach(worker)

    def _end(self, worker: _Worker) -> None:
        """Ends a worker's process (a failure or a timeout): its answers are lost."""
        worker.alive = False
        worker.pending.clear()
        with contextlib.suppress(Exception):
            worker.conn.close()
        process = worker.process
        if process is not None and process.is_alive():
            process.terminate()
            process.join(timeout=5)
            if process.is_alive():
                process.kill()
                process.join(timeout=5)

    def _deadline(self, worker: _Worker) -> float | None:
        if self._step_timeout_s is None:
            return None
        allowance = _STARTUP_ALLOWANCE_S if worker.starting else 0.0
        worker.starting = False
        return time.monotonic() + self._step_timeout_s + allowance

    def _command(
        self, worker: _Worker, kind: str, ids: list[int], *args: Any, about: int | None = None
    ) -> None:
        if not worker.alive:
            return
        gen = self._gen
        gens = {i: gen[i] for i in ids} if about is None else {about: gen[about]}
        try:
            if kind == "step" and args[1] is None:
                # The common step (actions in the block): the sub-envs as int32s, no pickle.
                worker.conn.send_bytes(_STEP + np.asarray(ids, np.int32).tobytes())
            else:
                _send_command(worker.conn, (kind, *args))
        except (OSError, ValueError):  # its pipe broke: the next poll reports the worker
            worker.pending.append(_Command(kind, ids, gens, 0.0))
            return
        worker.pending.append(_Command(kind, ids, gens, self._deadline(worker)))

    def _current(self, cmd: _Command, i: int) -> bool:
        """Whether ``cmd`` was sent to sub-env ``i`` as it is now (not before a recreate)."""
        return cmd.gens.get(i, -1) == self._gen[i]

    # -- SubEnvs ---------------------------------------------------------------------

    @property
    def env(self) -> Any:
        """See :attr:`SubEnvs.env`."""
        if self.multi_agent:
            return [self.agent_spaces(i) for i in range(self.num_envs)]
        return self

    @property
    def unwrapped(self) -> SharedMemorySubEnvs:
        """The object itself (as a vector env's ``unwrapped``)."""
        return self

    def agent_spaces(self, i: int) -> Any:
        """See :meth:`SubEnvs.agent_spaces` (read from the workers once)."""
        return self._agent_spaces

    def reset_all(self, seed: int | None) -> StepResults:
        """See :meth:`SubEnvs.reset_all`: drops answers in flight, resets every sub-env."""
        failed: dict[int, BaseException] = {}
        for worker in self._workers:
            self._drain(worker, failed)
        for worker in self._workers:
            seeds = [None if seed is None else seed + i for i in worker.ids]
            self._command(worker, "reset", worker.ids, worker.ids, seeds)
        resets: list[tuple[int, Any, Any]] = []
        while any(w.pending for w in self._workers):
            got = self._collect(self.num_envs, failed)
            for _, _cmd, payload in got:
                for i, obs, infos in payload or []:
                    resets.append((i, self._observation(i, obs), infos))
        resets.sort(key=lambda r: r[0])
        return StepResults(None, [], [], [], [], [], resets=resets, failed=failed)

    def _observation(self, i: int, obs: Any) -> Any:
        """Sub-env ``i``'s observation from the block (a copy), or as the pipe brought it."""
        block = self._block
        if obs is not None or block is None:
            return obs
        return _copy_tree(take(block.observations, i))

    def _drain(self, worker: _Worker, failed: dict[int, BaseException]) -> None:
        """Waits for (and drops) a worker's answers in flight (before a reset of all)."""
        while worker.alive and worker.pending:
            cmd = worker.pending[0]
            left = None if cmd.deadline is None else max(0.0, cmd.deadline - time.monotonic())
            if left is not None and not worker.conn.poll(left):
                self._lose(worker, failed, TimeoutError)
                return
            try:
                worker.conn.recv()
            except (EOFError, OSError):
                self._lose(worker, failed, ChildProcessError)
                return
            worker.pending.popleft()

    def send(self, env_ids: np.ndarray | None, actions: Any) -> None:
        """See :meth:`SubEnvs.send`."""
        ids = np.arange(self.num_envs) if env_ids is None else np.asarray(env_ids)
        if not len(ids):
            return
        block = self._block
        if block is not None:
            # Written before the commands are sent (the pipe orders the two).
            set_rows(block.actions, ids, actions)
        halves = self._half_of[ids]
        first = halves[0]
        groups = [first] if len(ids) == 1 or (halves == first).all() else np.unique(halves)
        for h in groups:
            rows = np.flatnonzero(halves == h) if len(groups) > 1 else np.arange(len(ids))
            sub_ids = ids[rows].tolist()
            # (Single-agent actions are in the block.)
            part = [actions[j] for j in rows] if self.multi_agent else None
            self._command(self._workers[int(h) // 2], "step", sub_ids, sub_ids, part)

    def poll(self, wait_s: float) -> StepResults:
        """See :meth:`SubEnvs.poll`: waits for at least a batch of sub-envs (or all in flight)."""
        failed: dict[int, BaseException] = {}
        got = self._collect(self.batch_size, failed)
        if wait_s > 0 and any(w.pending for w in self._workers):
            got += self._collect(self.num_envs, failed, timeout_s=wait_s)
        ids: list[int] = []
        rows: list[Any] = []
        resets: list[tuple[int, Any, Any]] = []
        for _, cmd, payload in got:
            if cmd.kind == "reset":
                for i, obs, infos in payload or []:
                    if self._current(cmd, i):
                        resets.append((i, self._observation(i, obs), infos))
            elif cmd.kind == "step":
                for row in payload or []:
                    if self._current(cmd, row[0]):
                        ids.append(row[0])
                        rows.append(row)
        return self._results(ids, rows, resets, failed)

    def _collect(
        self, need: int, failed: dict[int, BaseException], timeout_s: float | None = None
    ) -> list[tuple[_Worker, _Command, Any]]:
        """Reads answers until they hold ``need`` sub-envs (or every answer in flight).

        Args:
            need: Sub-envs to wait for.
            failed: Filled with the failures the answers (or dead workers) report.
            timeout_s: Wait at most this long (None: as long as the step timeout allows).

        Returns:
            ``(worker, command, payload)`` per answer read.
        """
        from fastrollout._core import wait_ready

        out: list[tuple[_Worker, _Command, Any]] = []
        have = 0
        end = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            busy = [w for w in self._workers if w.pending]
            if not busy:
                return out
            left = need - have
            deadlines = [w.pending[0].deadline for w in busy if w.pending[0].deadline is not None]
            limit = None if not deadlines else max(0.0, min(deadlines) - time.monotonic())
            if end is not None:
                rest = max(0.0, end - time.monotonic())
                limit = rest if limit is None else min(limit, rest)
            ready = wait_ready(
                [w.fd for w in busy],
                [len(w.pending[0].ids) for w in busy],
                max(left, 1) if end is None else left,
                limit,
            )
            for j in ready:
                # One answer per ready worker (a further one is found by the next wait).
                worker = busy[j]
                cmd = worker.pending[0]
                try:
                    _, payload, errors = worker.conn.recv()
                except (EOFError, OSError):
                    self._lose(worker, failed, ChildProcessError)
                    continue
                worker.pending.popleft()
                if errors:
                    # (The failures of sub-envs made again since are stale.)
                    failed.update((i, e) for i, e in errors.items() if self._current(cmd, i))
                out.append((worker, cmd, payload))
                have += len(cmd.ids)
            if not ready:
                if end is not None and time.monotonic() >= end:
                    return out
                self._time_out(failed)
            if have >= need or (end is not None and time.monotonic() >= end):
                return out

    def _time_out(self, failed: dict[int, BaseException]) -> None:
        """Ends every worker whose oldest command is past its deadline."""
        now = time.monotonic()
        for worker in self._workers:
            deadline = worker.pending[0].deadline if worker.pending else None
            if deadline is not None and deadline <= now:
                self._lose(worker, failed, TimeoutError)

    def _lose(self, worker: _Worker, failed: dict[int, BaseException], why: type) -> None:
        """Ends a dead or hung worker and fails all its sub-envs."""
        code = worker.process.exitcode if worker.process is not None else None
        self._end(worker)
        for i in worker.ids:
            if why is TimeoutError:
                failed[i] = TimeoutError(
                    f"sub-env {i}: its worker process did not answer within "
                    f"{self._step_timeout_s} s (sub_env_step_timeout_s)"
                )
            else:
                failed[i] = ChildProcessError(
                    f"sub-env {i}: its worker process died (exit code {code})"
                )

    def _results(
        self,
        ids: list[int],
        rows: list[Any],
        resets: list[tuple[int, Any, Any]],
        failed: dict[int, BaseException],
    ) -> StepResults:
        # In sub-env order, as a lockstep backend returns them (the order of the rows in
        # the next forward pass, hence of the random draws).
        order = np.argsort(ids, kind="stable")
        env_ids = np.asarray(ids, np.int64)[order]
        if self.multi_agent:
            cols: list[list[Any]] = (
                [list(c) for c in zip(*[rows[j][1:] for j in order], strict=True)]
                if rows
                else [[]] * 5
            )
            return StepResults(env_ids, *cols, resets=resets, failed=failed)
        block = self._block
        assert block is not None
        return StepResults(
            env_ids,
            # The ready rows, copied out of the block (the workers write it again once
            # they get their next actions).
            take(block.observations, env_ids),
            block.rewards[env_ids],
            block.terminateds[env_ids],
            block.truncateds[env_ids],
            [rows[j][2] for j in order],
            resets=resets,
            failed=failed,
        )

    def reset(self, i: int, seed: int | None = None) -> tuple[Any, Any] | None:
        """See :meth:`SubEnvs.reset`.

        With a batch of all sub-envs the reset is waited for here, as a lockstep backend
        resets (so the sub-env acts in the next turn with the others, and the episodes
        are the lockstep backends'); else it is in flight and ``poll`` returns it.

        Raises:
            Exception: What the sub-env's reset raised, or the loss of its worker (a
                waited-for reset).
        """
        worker = self._workers[int(self._worker_of[i])]
        self._command(worker, "reset", [i], [i], [seed])
        if self.batch_size < self.num_envs:
            return None
        failed: dict[int, BaseException] = {}
        got: list[tuple[_Worker, _Command, Any]] = []
        while worker.pending and not failed:
            got += self._collect(self.num_envs, failed)
        if i in failed:
            raise failed[i]
        for _, cmd, payload in got:
            if cmd.kind == "reset" and payload:
                _, obs, infos = payload[0]
                return self._observation(i, obs), infos
        raise RuntimeError(f"internal error: no reset of sub-env {i} came back")  # pragma: no cover

    def recreate(self, i: int) -> None:
        """See :meth:`SubEnvs.recreate`.

        A live worker makes sub-env ``i`` again (an error doing so comes back from a later
        ``poll`` as the sub-env's failure); a worker that was lost is started again, which
        makes all its sub-envs again.

        Raises:
            Exception: What making the sub-envs of a restarted worker raised.
        """
        worker = self._workers[int(self._worker_of[i])]
        if i in self._fresh:
            self._fresh.discard(i)
            return
        if worker.alive:
            self._gen[i] += 1
            self._command(worker, "recreate", [], i, about=i)
            return
        for j in worker.ids:
            self._gen[j] += 1
        self._start(worker)
        _, made = self._made(worker)
        self._fresh.update(j for j in worker.ids if j != i)
        if made:
            raise made.get(i) or next(iter(made.values()))

    def close(self) -> None:
        """See :meth:`SubEnvs.close`: ends the workers and frees the shared block."""
        if self._closed:
            return
        self._closed = True
        for worker in self._workers:
            if worker.alive:
                with contextlib.suppress(Exception):
                    _send_command(worker.conn, ("close",))
        for worker in self._workers:
            if worker.process is not None:
                worker.process.join(timeout=2)
            self._end(worker)
        if self._block is not None:
            self._block.release(unlink=True)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


def _copy_tree(tree: Any) -> Any:
    if isinstance(tree, dict):
        return {k: _copy_tree(v) for k, v in tree.items()}
    if isinstance(tree, tuple):
        return tuple(_copy_tree(v) for v in tree)
    return np.array(tree)


def _worker_entry(conn: Any, creator: Any, ids: list[int], multi_agent: bool) -> None:
    """The worker process's entry point (unwraps a pickled creator)."""
    import signal

    # Ctrl-C goes to the runner, which ends the workers.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    fn = getattr(creator, "fn", creator)
    _worker_main(conn, fn, ids, multi_agent)
