"""``SingleAgentEnvRunner``: samples N copies of a gymnasium env with a torch policy.

Semantics follow RLlib 2.60's ``SingleAgentEnvRunner``; the per-step work is native: one
call records the step of the sub-envs that stepped into their episodes
(``single_agent_record_vector_step``) and the next inference batch is the backend's own
observation array (gymnasium's vector layout). The loop is the base class's.
"""

from __future__ import annotations

import collections
import contextlib
import time
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from fastrollout._core import single_agent_record_vector_step
from fastrollout.core import DEFAULT_MODULE_ID, Columns
from fastrollout.core.tree import leaves, set_rows, take, tree_map
from fastrollout.env.check import space_mismatch
from fastrollout.episodes import SingleAgentEpisode
from fastrollout.errors import SpaceMismatchError
from fastrollout.modules import MultiRLModule
from fastrollout.runners import _rllib, keys
from fastrollout.runners._config import OBSERVATION_BLOCK_ROWS, cfg, smoothing_window
from fastrollout.runners.env_runner import EnvRunner
from fastrollout.runners.sub_envs import StepResults

__all__ = ["SingleAgentEnvRunner"]


def _stacks(space: gym.Space[Any], observation: Any) -> bool:
    """Whether gymnasium's vector envs can stack ``observation`` into a batch of ``space``.

    Args:
        space: A sub-env's observation space.
        observation: One sub-env's observation.

    Returns:
        False where stacking it alone fails as it failed in the vector env's ``step``.
    """
    from gymnasium.vector.utils import concatenate, create_empty_array

    try:
        concatenate(space, [observation], create_empty_array(space, n=1))
    except (ValueError, TypeError, KeyError, IndexError):
        return False
    return True


def _rows_without(ids: Any, failed: Mapping[int, BaseException], n: int) -> np.ndarray | None:
    """The rows of a lockstep batch whose sub-env did not fail (None: all rows).

    Args:
        ids: The batch's sub-envs (None: all N, in order; else every row is good).
        failed: The failed sub-envs.
        n: N.

    Returns:
        The good rows' sub-env indices, or None when every row is good.
    """
    if ids is not None:
        return np.asarray(ids, np.int64)
    if not failed:
        return None
    return np.array([i for i in range(n) if i not in failed], np.int64)


def _take_infos(infos: Any, rows: np.ndarray) -> Any:
    """Rows of a vector env's infos (gymnasium's dict of arrays, or a list of dicts)."""
    if isinstance(infos, dict):
        return take(infos, rows)
    return [infos[i] for i in rows]


def _is_batch(value: Any) -> bool:
    """Whether an extra model output is batched (else a constant for every row).

    Batched: an array with a batch axis, or a dict/tuple of such arrays (a recurrent
    state), as the native record tells them apart.
    """
    if isinstance(value, (dict, tuple)):
        parts = list(leaves(value))
        return bool(parts) and all(isinstance(x, np.ndarray) and x.ndim > 0 for x in parts)
    return isinstance(value, np.ndarray) and value.ndim > 0


def _take_extras(extras: dict[str, Any], rows: np.ndarray) -> dict[str, Any]:
    """Rows of the extra model outputs (constants, such as the weights' number, stay)."""
    return {k: take(v, rows) if _is_batch(v) else v for k, v in extras.items()}


def _copy_batch(batch: Any) -> Any:
    """A writable copy of a batch (nested dicts/tuples of arrays)."""
    if isinstance(batch, dict):
        return {k: _copy_batch(v) for k, v in batch.items()}
    if isinstance(batch, tuple):
        return tuple(_copy_batch(v) for v in batch)
    return np.array(batch)


def _batched_resets(space: gym.Space[Any], results: StepResults) -> StepResults:
    """Remote sub-envs' resets as one batch, as a vector env's reset returns them."""
    from gymnasium.vector.utils import concatenate, create_empty_array

    ids = [r[0] for r in results.resets]
    out = create_empty_array(space, len(ids))
    obs = concatenate(space, [r[1] for r in results.resets], out) if ids else out
    m = len(ids)
    return StepResults(
        np.asarray(ids, np.int64),
        obs,
        np.zeros(m),
        np.zeros(m, bool),
        np.zeros(m, bool),
        [r[2] for r in results.resets],
        failed=results.failed,
    )


def _set_row(buffer: Any, j: int, value: Any, key: str) -> None:
    """Writes ``value`` into row ``j`` of a nested batch of extras (same nesting).

    Raises:
        ValueError: If ``value`` is not nested as ``buffer`` (naming ``key``).
    """

    def put(b: np.ndarray, x: Any) -> None:
        b[j] = x

    try:
        tree_map(put, buffer, value)
    except (KeyError, TypeError, ValueError, IndexError) as err:
        raise ValueError(
            f"the simulator's own {key!r} is not nested as the module's ({err})"
        ) from None


def _same_layout(buffer: Any, batch: Any) -> bool:
    """Whether ``batch``'s rows fit ``buffer`` (same nesting, leaf dtypes and row shapes)."""
    try:
        fits = tree_map(
            lambda b, x: b.dtype == x.dtype and b.shape[1:] == x.shape[1:], buffer, batch
        )
    except (KeyError, TypeError, ValueError):
        return False
    return all(leaves(fits))


def _concatenate_rows(*parts: Any) -> Any:
    """One batch of the rows of several (torch tensors or numpy arrays)."""
    if isinstance(parts[0], np.ndarray):
        return np.concatenate(parts)
    import torch

    return torch.cat(parts)


# The numpy kind of a Python number's array (what np.full makes of it).
_NUMBER_KINDS = {int: "i", float: "f", bool: "b"}


class _PendingRows:
    """The actions and extra model outputs of steps in flight, by sub-env.

    Remote sub-envs finish their steps in any order and groups: the rows sent to each
    are kept in arrays of N rows, written and read with fancy indexing.

    Args:
        n: The number of sub-envs.
    """

    def __init__(self, n: int) -> None:
        self._n = n
        self._actions: Any = None
        self._extras: dict[str, Any] = {}
        # The extras' keys sent to each sub-env (random actions have none of the
        # module's): a row is read back with its own keys only.
        self._keys: list[frozenset[str]] = [frozenset()] * n

    def _buffer_like(self, batch: Any) -> Any:
        if isinstance(batch, dict):
            return {k: self._buffer_like(v) for k, v in batch.items()}
        if isinstance(batch, tuple):
            return tuple(self._buffer_like(v) for v in batch)
        a = np.asarray(batch)
        return np.zeros((self._n, *a.shape[1:]), a.dtype)

    def put(self, ids: np.ndarray, actions: Any, extras: dict[str, Any]) -> None:
        """Keeps the rows sent to sub-envs ``ids``."""
        if self._actions is None:
            self._actions = self._buffer_like(actions)
        set_rows(self._actions, ids, actions)
        for k, v in extras.items():
            buf = self._extras.get(k)
            # The common extras (a batch, or a number of the buffer's kind): written
            # without the general path's tree walks (a tenth of a remote turn).
            if isinstance(buf, np.ndarray) and (
                (
                    isinstance(v, np.ndarray)
                    and v.ndim
                    and v.dtype == buf.dtype
                    and v.shape[1:] == buf.shape[1:]
                )
                or (buf.ndim == 1 and _NUMBER_KINDS.get(type(v)) == buf.dtype.kind)
            ):
                buf[ids] = v
                continue
            if not _is_batch(v):
                v = np.full(len(ids), v)
            v = tree_map(np.asarray, v)
            if buf is None or not _same_layout(buf, v):
                buf = self._extras[k] = self._buffer_like(v)
            set_rows(buf, ids, v)
        sent = frozenset(extras)
        for i in ids:
            self._keys[i] = sent

    def take(self, ids: np.ndarray) -> tuple[Any, dict[str, Any]]:
        """The rows sent to sub-envs ``ids``: actions, and the extras all of them got.

        A sub-env never sent anything (an external episode's first row, a reset) does not
        narrow the extras: its row is a reset, whose extras the record ignores.
        """
        sent = [self._keys[i] for i in ids if self._keys[i]]
        wanted = frozenset.intersection(*sent) if sent else ()
        extras = {
            k: buf[ids] if isinstance(buf := self._extras[k], np.ndarray) else take(buf, ids)
            for k in wanted
        }
        return take(self._actions, ids), extras


class SingleAgentEnvRunner(EnvRunner[SingleAgentEpisode]):
    """Samples ``num_envs_per_env_runner`` copies of a gymnasium env (sync or async).

    Args:
        config: The runner config (``fastrollout.RunnerConfig``).
        worker_index: The runner's index (0: the local runner).
        num_workers: The number of remote runners.
        **kwargs: Ignored.

    Raises:
        ValueError: If the config names no env.
    """

    def __init__(
        self,
        *,
        config: Any,
        worker_index: int | None = None,
        num_workers: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            config=config, worker_index=worker_index, num_workers=num_workers, **kwargs
        )
        self._obs: Any = None
        # The actions and extras of the last lockstep send, and those of steps in flight
        # by sub-env (remote sub-envs).
        self._sent: tuple[Any, dict[str, Any]] = (None, {})
        self._pending = _PendingRows(0)
        self._cached_to_module: dict[str, Any] | None = None
        # The lengths of the last episodes that ended; their longest is the record's
        # guess for new chunks (their columns reserve room up to it).
        self._recent_lengths: collections.deque[int] = collections.deque(maxlen=8)
        # A blank episode with the env's spaces, copied for each new one (_new_episode).
        self._blank_episode: SingleAgentEpisode | None = None
        self._expected_len: int | None = None
        if self._wants_env():
            self.make_env()
        self.make_module()

    # -- env and module ----------------------------------------------------------

    def _envs_created(self, creator: Any) -> None:
        self._pending = _PendingRows(self.num_envs)
        if self._sub_envs.external:
            # An external episode's first row may come before any action was sent.
            from gymnasium.vector.utils import create_empty_array

            ids = np.arange(self.num_envs)
            # (No extras: the rows count as never sent, see _PendingRows.take.)
            self._pending.put(ids, create_empty_array(self.env.single_action_space, len(ids)), {})
        self._callback(
            "on_environment_created",
            env_runner=self,
            metrics_logger=self.metrics,
            env=self.env.unwrapped,
            env_context=creator.env_context(0) if hasattr(creator, "env_context") else None,
        )

    def get_spaces(self) -> dict[str, Any]:
        """The spaces: ``"__env__"`` (batched), ``"__env_single__"`` and the module's.

        Returns:
            ``{name: (observation_space, action_space)}``.
        """
        if self.env is None:
            return dict(self.spaces)
        single = (self.env.single_observation_space, self.env.single_action_space)
        return {
            "__env__": (self.env.observation_space, self.env.action_space),
            "__env_single__": single,
            DEFAULT_MODULE_ID: single,
        }

    @property
    def module(self) -> Any:
        """The runner's RLModule, as RLlib's ``SingleAgentEnvRunner.module`` (or None).

        Setting it takes an RLModule (or a ``MultiRLModule`` with the default module id).
        """
        return None if self._module is None else self._module[DEFAULT_MODULE_ID]

    @module.setter
    def module(self, module: Any) -> None:
        if module is None or isinstance(module, MultiRLModule):
            self._module = module
        else:
            self._module = MultiRLModule(rl_modules={DEFAULT_MODULE_ID: module})

    def _module_state(self, **kwargs: Any) -> Any:
        # RLlib's single-agent runner gives its one module's state, not keyed by id.
        assert self._module is not None
        return self._module[DEFAULT_MODULE_ID].get_state(**kwargs)

    def make_module(self) -> None:
        """Builds the module and connectors (as the base does) and the batch's row map."""
        super().make_module()
        # Row i of the module batch is sub-env i (no agent ids in a single-agent runner).
        # (No env: no rows; such a runner does not sample.)
        self._agent_rows = {DEFAULT_MODULE_ID: [(i, None) for i in range(self.num_envs)]}

    # -- sampling ------------------------------------------------------------------

    def _new_episode(self, i: int) -> None:
        obs_space = self.env.single_observation_space
        act_space = self.env.single_action_space
        blank = self._blank_episode
        if (
            blank is None
            or blank.observation_space is not obs_space
            or blank.action_space is not act_space
        ):
            # Copied for each new episode (its spaces' layouts made once); made again
            # when the env's spaces are other objects.
            episode_cls = _rllib.RLlibSingleAgentEpisode if self._rllib else SingleAgentEpisode
            blank = self._blank_episode = episode_cls(
                observation_space=obs_space, action_space=act_space
            )
            if cfg(self.config, "compress_observations", False):
                # (Observations kept as Python objects are stored as they are.)
                with contextlib.suppress(ValueError):
                    blank._set_compression("observations", OBSERVATION_BLOCK_ROWS)
        self._episodes[i] = blank._blank_like()
        self._states.drop((i,))
        self._episode_callback("on_episode_created", i)

    def _state_slots(self, batch: dict[Any, Any]) -> dict[Any, list[Any]]:
        # Row j of the batch is the j-th sub-env that waits (all of them, in order).
        ids = self._ready
        return {DEFAULT_MODULE_ID: list(range(self.num_envs)) if ids is None else ids.tolist()}

    def _callback_env(self, i: int) -> Any:
        # RLlib passes the whole vector env's ``unwrapped`` for every sub-env.
        return self.env.unwrapped

    def _episode_ended(self, episode: Any) -> None:
        self._recent_lengths.append(episode.t)
        self._expected_len = max(self._recent_lengths)

    def _reset_all(self) -> None:
        n = self.num_envs
        self._held = {}
        self._episodes = [None] * n  # type: ignore[list-item]
        for i in range(n):
            self._new_episode(i)
        self._ongoing_episodes_for_metrics.clear()
        with self.metrics.log_time(keys.ENV_RESET_TIMER):
            results = self._sub_envs.reset_all(self._seed if self._needs_initial_reset else None)
        self._needs_initial_reset = False
        if results.resets:
            # Resets from actors, one per sub-env: batched as a vector env's.
            results = _batched_resets(self.env.single_observation_space, results)
        ids = results.env_ids
        rows = _rows_without(ids, results.failed, n)
        obs, infos = results.observations, results.infos
        if rows is not None and ids is None:
            # A lockstep batch with failed rows (backends that name their rows return
            # only the good ones).
            obs, infos = take(obs, rows), _take_infos(infos, rows)
        m = n if rows is None else len(rows)
        # A reset is recorded like a step of never-reset episodes (their reset rows).
        single_agent_record_vector_step(
            self._episodes,
            obs,
            np.zeros(m, np.int64),
            np.zeros(m),
            np.zeros(m, bool),
            np.zeros(m, bool),
            infos,
            None,
            env_indices=rows,
        )
        self._obs = results.observations
        self._ready = ids
        self._run_env_to_module(self._call.explore)
        for i in range(n) if rows is None else rows:
            self._episode_callback("on_episode_start", int(i))
        for i, err in results.failed.items():
            self._sub_env_failed(i, err)

    def _act_and_send(self) -> None:
        call = self._call
        ids = self._ready
        if call.random_actions:
            space = (
                self.env.action_space
                if ids is None
                else gym.vector.utils.batch_space(self.env.single_action_space, len(ids))
            )
            actions = env_actions = space.sample()
            extras: dict[str, Any] = {}
        else:
            actions, env_actions, extras = self._compute_actions(call.explore, call.env_steps)
        if self._sub_envs.external:
            logged = self._sub_envs.logged_actions(ids)
            if logged:
                actions, env_actions, extras = self._with_logged(
                    logged, ids, actions, env_actions, extras
                )
        extras[keys.WEIGHTS_SEQ_NO] = self._weights_seq_no
        self._sub_envs.send(ids, env_actions)
        if ids is None:  # every sub-env, in lockstep
            self._sent = (actions, extras)
        else:
            self._pending.put(ids, actions, extras)
            self._ready = np.zeros(0, np.int64)

    def _with_logged(
        self,
        logged: list[tuple[int, Any, Any]],
        ids: np.ndarray,
        actions: Any,
        env_actions: Any,
        extras: dict[str, Any],
    ) -> tuple[Any, Any, dict[str, Any]]:
        """Puts actions a simulator took itself into the batch (``log_action``).

        The logged action replaces the module's in its row (it is what the env did), its
        ``action_logp`` becomes the module's log-probability of it where the module's
        ``action_dist_inputs`` define one, and the simulator's own outputs for the step
        replace the module's. A stateful module's state advanced with its forward pass
        on the step's observation (as RLlib's runners advance it for off-policy
        actions), unless the simulator gave its own ``STATE_OUT``: that one is recorded
        and the next step starts from it.

        Args:
            logged: ``(row, action, simulator outputs or None)`` per logged row.
            ids: The sub-env (slot) of each row.
            actions: The module's actions, batched.
            env_actions: The actions for the env, batched.
            extras: The module's extra outputs, batched.

        Returns:
            The actions, the actions for the env, and the extras.

        Raises:
            ValueError: If a simulator's ``STATE_OUT`` is not shaped as the module's
                state, or another of its outputs as the module's.
        """
        from gymnasium.vector.utils import concatenate, create_empty_array

        rows = np.array([j for j, _, _ in logged], np.int64)
        space = self.env.single_action_space
        given = concatenate(space, [a for _, a, _ in logged], create_empty_array(space, len(rows)))
        actions = _copy_batch(actions)
        set_rows(actions, rows, given)
        if env_actions is not actions:
            env_actions = _copy_batch(env_actions)
            set_rows(env_actions, rows, given)
        extras = {k: tree_map(np.array, v) if _is_batch(v) else v for k, v in extras.items()}
        dist_inputs = extras.get(Columns.ACTION_DIST_INPUTS)
        if isinstance(dist_inputs, np.ndarray) and Columns.ACTION_LOGP in extras:
            logp = self._logp_of(DEFAULT_MODULE_ID, dist_inputs[rows], given, self._call.explore)
            if logp is not None:
                extras[Columns.ACTION_LOGP][rows] = logp
        stateful = DEFAULT_MODULE_ID in self._states
        for j, _, own in logged:
            for k, v in (own or {}).items():
                try:
                    if k == Columns.STATE_OUT and stateful:
                        v = self._states.set_state(DEFAULT_MODULE_ID, int(ids[j]), v)
                    buffer = extras.get(k)
                    if isinstance(buffer, np.ndarray):
                        buffer[j] = v
                    elif isinstance(buffer, (dict, tuple)):
                        _set_row(buffer, j, v, k)
                except ValueError as err:
                    episode = self._episodes[int(ids[j])].id_
                    raise ValueError(f"episode {episode}: log_action's outputs: {err}") from None
        return actions, env_actions, extras

    def _poll(self, wait_s: float) -> StepResults:
        try:
            return self._sub_envs.poll(wait_s)
        except Exception as err:
            mismatch = self._step_failed(err)
            if mismatch is None:
                raise
            raise mismatch from err

    def _record_steps(self, results: StepResults) -> list[int]:
        call = self._call
        n = self.num_envs
        ids = results.env_ids
        obs, rewards, terminateds, truncateds, infos = (
            results.observations,
            results.rewards,
            results.terminateds,
            results.truncateds,
            results.infos,
        )
        if ids is None:
            actions, extras = self._sent
            rows = _rows_without(None, results.failed, n) if results.failed else None
            if rows is not None:
                # Failed sub-envs' rows hold no step: leave them out of the record.
                obs, rewards, terminateds, truncateds = (
                    take(x, rows) for x in (obs, rewards, terminateds, truncateds)
                )
                infos = _take_infos(infos, rows)
                actions, extras = take(actions, rows), _take_extras(extras, rows)
        else:
            rows = ids
            if not len(ids):
                self._ready = ids
                return []
            actions, extras = self._pending.take(ids)
        m = n if rows is None else len(rows)
        started, done = single_agent_record_vector_step(
            self._episodes,
            obs,
            actions,
            rewards,
            terminateds,
            truncateds,
            infos,
            extras,
            self._expected_len,
            # The vector steps this call takes after this one, plus two (next-step
            # resets add about one per episode length): a chunk's reservation stops
            # about where the call cuts it, which to_numpy then need not move.
            None
            if call.num_timesteps is None
            else (call.num_timesteps - call.env_steps + n - 1) // n + 1,
            env_indices=rows,
        )
        if started and self._states:
            # The action a reset row ignored came from a forward pass on the previous
            # episode's last observation: its state is not the new episode's.
            self._states.drop(started)
        call.env_steps += m - len(started) - results.untrained_steps
        call.untrained_steps += results.untrained_steps
        self._sub_envs_stepped(rows, started)
        self._obs = results.observations
        self._ready = ids
        self._run_env_to_module(call.explore)
        if call.left is not None:
            self._count_fragments(rows, started)
        if self._per_step_callbacks:
            started_set = set(started)
            for i in range(n) if rows is None else rows:
                self._episode_callback(
                    "on_episode_start" if i in started_set else "on_episode_step", int(i)
                )
        return done  # type: ignore[no-any-return]

    def _count_fragments(self, rows: Any, started: list[int]) -> None:
        """``sample_fragments``: counts the recorded steps, holds sub-envs that took theirs.

        The env-to-module pipeline has run on every new observation (as RLlib's old stack
        filters each one when it arrives); a held sub-env keeps its row of that batch and
        is left out of the next turns, and the next call acts for it first, with the
        weights of then (``_release_held``).
        """
        left = self._call.left
        assert left is not None
        stepped = np.arange(self.num_envs) if rows is None else np.asarray(rows, np.int64)
        if started:
            stepped = np.setdiff1d(stepped, started)
        left[stepped] -= 1
        if self._ready is None:
            # A lockstep batch: row i is sub-env i. Failed sub-envs are left out: once the
            # turns name their sub-envs, a restarted one is sent its own step.
            ready = np.arange(self.num_envs) if rows is None else np.asarray(rows, np.int64)
            rows_of = ready
        else:
            ready = self._ready
            rows_of = np.arange(len(ready))
        done = left[ready] <= 0
        if not done.any() and (self._ready is not None or rows is None):
            return
        batch = self._cached_to_module
        for j in np.flatnonzero(done).tolist():
            r = int(rows_of[j])
            self._held[int(ready[j])] = (
                take(self._obs, r),
                None if batch is None else tree_map(lambda x, r=r: x[r : r + 1], batch),
            )
        keep = rows_of[np.flatnonzero(~done)]
        self._ready = ready[np.flatnonzero(~done)]
        self._obs = take(self._obs, keep)
        if batch is not None:
            # (numpy arrays and torch tensors alike take an int64 array of rows.)
            self._cached_to_module = tree_map(lambda x: x[keep], batch) if len(keep) else None

    def _release_held(self) -> None:
        held, self._held = self._held, {}
        ids = sorted(held)
        if self._ready is not None and len(self._ready):
            raise RuntimeError("internal error: sub-envs held while others wait")
        from gymnasium.vector.utils import concatenate, create_empty_array

        space = self.env.single_observation_space
        rows = [held[i][0] for i in ids]
        self._obs = concatenate(space, rows, create_empty_array(space, len(rows)))
        batches = [held[i][1] for i in ids]
        self._cached_to_module = (
            None if batches[0] is None else tree_map(_concatenate_rows, *batches)
        )
        if self._sub_envs.lockstep and len(ids) == self.num_envs:
            self._ready = None  # all of them: the lockstep turn again
        else:
            self._ready = np.array(ids, np.int64)

    def _record_reset(self, i: int, obs: Any, infos: Any) -> None:
        # Single-agent sub-envs reset on their next step (every backend autoresets); only
        # reset_all resets them otherwise.
        raise RuntimeError(f"internal error: a single-agent sub-env ({i}) reset on its own")

    def _restart_sub_env(self, i: int) -> None:
        # The recreated sub-env resets on its next step (its action ignored): a lockstep
        # turn steps it with the others; else it is sent a step now.
        self._held.pop(i, None)
        if self._sub_envs.lockstep and self._ready is None:
            return
        action = gym.vector.utils.batch_space(self.env.single_action_space, 1).sample()
        ids = np.array([i], np.int64)
        self._sub_envs.send(ids, action)
        # No extras: its row is a reset, and a row with fewer keys would narrow the extras
        # of the rows that come back with it (see _PendingRows.take).
        self._pending.put(ids, action, {})

    def _run_env_to_module(self, explore: bool) -> None:
        """Runs the env-to-module pipeline on the latest observations (cached).

        As RLlib does, this runs right after a step is recorded and before done episodes
        are replaced, so connectors that rewrite episodes (the observation filter) see each
        episode's last observation, the terminal one included.
        """
        if self._module is None:
            # No module (RLlib's base config): random actions only, nothing to infer.
            return
        ids = self._ready
        self._shared_data["agent_rows"] = (
            self._agent_rows if ids is None else {DEFAULT_MODULE_ID: [(int(i), None) for i in ids]}
        )
        start = time.perf_counter()
        self._cached_to_module = self._observations_to_module(
            {DEFAULT_MODULE_ID: self._obs}, explore
        )
        self._log_time_since(keys.ENV_TO_MODULE_CONNECTOR, start)

    def _step_failed(self, err: Exception) -> SpaceMismatchError | None:
        """Handles an error of the vector env's ``step``, on that error path alone.

        gymnasium's vector envs stack the sub-envs' observations into one batch, and an
        observation of the wrong shape fails there with numpy's message only; the step
        itself checks nothing per sub-env, so the sub-env is found here. A
        ``SyncVectorEnv`` still holds each sub-env's observation of the failed step: each
        is stacked alone as the env stacked them all, and the first that fails is named
        with its shape. An ``AsyncVectorEnv`` has shut down the worker of each sub-env
        that failed (whatever the error), which names it; its message has the shapes
        (flattened: the worker writes observations into shared memory flat). Such an env
        cannot step or reset again: it is closed, and the runner refuses to sample until
        ``make_env()``.

        Args:
            err: What the vector env's ``step`` raised.

        Returns:
            The ``SpaceMismatchError`` to raise instead, or None to raise ``err``.
        """
        env = self.env
        space = env.single_observation_space
        lost: list[int] = []
        if isinstance(env, gym.vector.AsyncVectorEnv):
            lost = [i for i, pipe in enumerate(env.parent_pipes) if pipe is None]
        if lost:
            self._close_env_quietly()
            self._stopped = (
                f"its AsyncVectorEnv lost the worker process of sub-env "
                f"{', '.join(map(str, lost))} to an error in its step ({type(err).__name__}),"
                " and was closed"
            )
        if not isinstance(err, ValueError):
            return None
        sub_obs = getattr(env, "_env_obs", None)
        if isinstance(env, gym.vector.SyncVectorEnv) and sub_obs is not None:
            for i, o in enumerate(sub_obs):
                if not _stacks(space, o):
                    return SpaceMismatchError(
                        f"sub-env {i} returned an observation that does not fit the "
                        f"observation space: {space_mismatch(space, o)}"
                    )
            return None
        text = str(err)
        if "broadcast" not in text and "shape" not in text:
            return None
        if lost:
            return SpaceMismatchError(
                f"sub-env {lost[0]} returned an observation that does not fit the "
                f"observation space {space}: {text} (the shapes flattened, as gymnasium's "
                "worker writes observations into shared memory); gymnasium shut the "
                "sub-env's worker down: call make_env() before sampling again"
            )
        return SpaceMismatchError(
            "a sub-env returned an observation that does not fit the observation space "
            f"{space}: {text}"
        )

    def _compute_actions(self, explore: bool, ts: int) -> tuple[Any, Any, dict[str, Any]]:
        batch = self._cached_to_module
        self._cached_to_module = None
        if batch is None:
            raise RuntimeError("internal error: no env-to-module batch for this step")
        out, start = self._act(batch, explore, ts)
        to_env = out[DEFAULT_MODULE_ID]
        actions = to_env.pop(Columns.ACTIONS)
        env_actions = to_env.pop(Columns.ACTIONS_FOR_ENV, actions)
        self._log_time_since(keys.MODULE_TO_ENV_CONNECTOR, start)
        return actions, env_actions, to_env

    # -- metrics -------------------------------------------------------------------

    def get_metrics(self) -> dict[str, Any]:
        """The metrics since the last call, reduced (RLlib's keys).

        Episode length, return and duration count the chunks of an episode returned by
        earlier ``sample`` calls.

        Returns:
            The reduced metrics dict.
        """
        win = smoothing_window(self.config)
        m = self.metrics
        for e in self._done_episodes_for_metrics:
            length, ret, sec = len(e), float(e.get_return()), e.get_duration_s()
            for prev in self._ongoing_episodes_for_metrics.pop(e.id_, []):
                length += len(prev)
                ret += float(prev.get_return())
                sec += prev.get_duration_s()
            self._log_episode_end(length, ret, sec, win)
            m.log_value((keys.SA_AGENT_RETURN_MEAN, keys.DEFAULT_AGENT_ID), ret, window=win)
            m.log_value((keys.SA_MODULE_RETURN_MEAN, DEFAULT_MODULE_ID), ret, window=win)
        self._done_episodes_for_metrics.clear()
        return self._reduced_metrics()
