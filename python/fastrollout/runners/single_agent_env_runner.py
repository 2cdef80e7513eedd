"""``SingleAgentEnvRunner``: samples a gymnasium vector env with a torch policy.

Semantics follow RLlib 2.60's ``SingleAgentEnvRunner``; the per-step work is native: one
call records the vector step into all sub-envs' episodes (``single_agent_record_vector_step``)
and the next inference batch is the env's own observation array.
"""

from __future__ import annotations

import collections
import functools
import time
from typing import Any

import gymnasium as gym
import numpy as np

from fastrollout._core import single_agent_record_vector_step
from fastrollout.core import DEFAULT_MODULE_ID, Columns
from fastrollout.env.check import space_mismatch
from fastrollout.episodes import SingleAgentEpisode
from fastrollout.errors import SpaceMismatchError
from fastrollout.modules import MultiRLModule
from fastrollout.runners import _rllib
from fastrollout.runners import _support as s
from fastrollout.runners.env_runner import EnvRunner

__all__ = ["SingleAgentEnvRunner"]

_RESTART_KEYS = (s.RESTARTED_KEY, "_" + s.RESTARTED_KEY)


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

    def make_env(self) -> None:
        """Creates the vector env (closing an existing one) and schedules a reset.

        Raises:
            ValueError: If the config names no env or an unknown vectorize mode.
        """
        self._close_env_quietly()
        creator = s.make_sub_env_creator(self.config, self.worker_index, self.num_workers)
        n = int(s.cfg(self.config, "num_envs_per_env_runner", 1))
        restart = bool(s.cfg(self.config, "restart_failed_sub_environments", False))
        attempts = int(s.cfg(self.config, "max_sub_environment_restart_attempts", 5))
        fns = []
        for i in range(n):
            make = functools.partial(creator, i)
            fns.append(functools.partial(s.RestartingEnv, make, attempts) if restart else make)
        mode = s.cfg(self.config, "gym_env_vectorize_mode", "sync")
        # gymnasium's VectorizeMode enum holds the name in its value.
        mode = str(getattr(mode, "value", mode)).lower()
        if mode == "sync":
            self.env = gym.vector.SyncVectorEnv(fns)
        elif mode == "async":
            self.env = gym.vector.AsyncVectorEnv(fns)
        elif mode == "vector_entry_point":
            if restart:
                # A natively vectorized env cannot recreate one crashed sub-env alone.
                raise ValueError(
                    "restart_failed_sub_environments needs gym_env_vectorize_mode 'sync' or "
                    "'async' (sub-envs created one by one), not 'vector_entry_point'"
                )
            self.env = creator.make_vector(n)
        else:
            raise ValueError(
                "gym_env_vectorize_mode must be 'sync', 'async' or 'vector_entry_point', "
                f"got {mode!r}"
            )
        self.num_envs = self.env.num_envs
        self._envs_ready()
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
        self._episodes[i] = blank._blank_like()
        self._episode_callback("on_episode_created", i)

    def _callback_env(self, i: int) -> Any:
        # RLlib passes the whole vector env's ``unwrapped`` for every sub-env.
        return self.env.unwrapped

    def _reset_envs(self, explore: bool) -> None:
        self._episodes = [None] * self.num_envs  # type: ignore[list-item]
        for i in range(self.num_envs):
            self._new_episode(i)
        self._ongoing_episodes_for_metrics.clear()
        with self.metrics.log_time(s.ENV_RESET_TIMER):
            obs, infos = self.env.reset(seed=self._seed if self._needs_initial_reset else None)
        self._count_restarts(infos)
        n = self.num_envs
        # A reset is recorded like a step of never-reset episodes (their reset rows).
        single_agent_record_vector_step(
            self._episodes,
            obs,
            np.zeros(n, np.int64),
            np.zeros(n),
            np.zeros(n, bool),
            np.zeros(n, bool),
            infos,
            None,
        )
        self._obs = obs
        self._needs_initial_reset = False
        self._run_env_to_module(explore)
        for i in range(n):
            self._episode_callback("on_episode_start", i)

    def _count_restarts(self, infos: Any) -> np.ndarray | None:
        mask = infos.get("_" + s.RESTARTED_KEY) if isinstance(infos, dict) else None
        if mask is None or not mask.any():
            return None
        # Each recreation follows a crash of the sub-env, so both counters grow alike.
        restarts = int(np.sum(infos[s.RESTARTED_KEY][mask]))
        self.metrics.log_value(s.NUM_ENV_RESTARTS_LIFETIME, restarts, reduce="lifetime_sum")
        self.metrics.log_value(s.NUM_ENV_STEP_FAILURES_LIFETIME, restarts, reduce="lifetime_sum")
        return np.flatnonzero(mask)

    def _run_env_to_module(self, explore: bool) -> None:
        """Runs the env-to-module pipeline on the latest observations (cached).

        As RLlib does, this runs right after a step is recorded and before done episodes
        are replaced, so connectors that rewrite episodes (the observation filter) see each
        episode's last observation, the terminal one included.
        """
        if self._module is None:
            # No module (RLlib's base config): random actions only, nothing to infer.
            return
        self._shared_data["agent_rows"] = self._agent_rows
        start = time.perf_counter()
        self._cached_to_module = self._observations_to_module(
            {DEFAULT_MODULE_ID: self._obs}, explore
        )
        self._log_time_since(s.ENV_TO_MODULE_CONNECTOR, start)

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
        self._log_time_since(s.MODULE_TO_ENV_CONNECTOR, start)
        return actions, env_actions, to_env

    def _sample(
        self,
        *,
        num_timesteps: int | None,
        num_episodes: int | None,
        explore: bool,
        random_actions: bool,
        force_reset: bool,
    ) -> list[SingleAgentEpisode]:
        to_numpy = bool(s.cfg(self.config, "episodes_to_numpy", True))
        done_out: list[SingleAgentEpisode] = []
        ts = 0
        eps = 0
        if force_reset or num_episodes is not None or self._needs_initial_reset:
            self._reset_envs(explore)
        if num_episodes is not None:
            self._needs_initial_reset = True
        per_step_callbacks = self._has_callbacks("on_episode_start") or self._has_callbacks(
            "on_episode_step"
        )
        n = self.num_envs
        while (ts < num_timesteps) if num_timesteps is not None else (eps < (num_episodes or 0)):
            if random_actions:
                actions = env_actions = self.env.action_space.sample()
                extras: dict[str, Any] = {}
            else:
                actions, env_actions, extras = self._compute_actions(explore, ts)
            extras[s.WEIGHTS_SEQ_NO] = self._weights_seq_no
            start = time.perf_counter()
            try:
                obs, rewards, terminateds, truncateds, infos = self.env.step(env_actions)
            except Exception as err:
                mismatch = self._step_failed(err)
                if mismatch is None:
                    raise
                raise mismatch from err
            self._log_time_since(s.ENV_STEP_TIMER, start)
            restarted = self._count_restarts(infos)
            if restarted is not None:
                # Better than RLlib (which drops every episode, ray issue 47608): only
                # the crashed sub-env's episode is dropped; its row is the new env's
                # reset observation and starts a new episode.
                for i in restarted:
                    self._ongoing_episodes_for_metrics.pop(self._episodes[i].id_, None)
                    self._new_episode(int(i))
                # The restart flag is the runner's, not the env's: keep it out of the
                # new episodes' infos.
                infos = {k: v for k, v in infos.items() if k not in _RESTART_KEYS}
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
                None if num_timesteps is None else (num_timesteps - ts + n - 1) // n + 1,
            )
            ts += n - len(started)
            self._obs = obs
            self._run_env_to_module(explore)
            if per_step_callbacks:
                started_set = set(started)
                for i in range(self.num_envs):
                    self._episode_callback(
                        "on_episode_start" if i in started_set else "on_episode_step", i
                    )
            for i in done:
                eps += 1
                self._episode_callback("on_episode_end", i)
                e = self._episodes[i]
                self._recent_lengths.append(e.t)
                self._expected_len = max(self._recent_lengths)
                done_out.append(self._episode_out(e, to_numpy))
                self._new_episode(i)
                if num_episodes is not None and eps >= num_episodes:
                    break
        self._done_episodes_for_metrics.extend(done_out)
        ongoing_out = self._cut_ongoing(to_numpy) if num_timesteps is not None else []
        self._increase_sampled_metrics(
            ts, len(done_out), {s.DEFAULT_AGENT_ID: ts}, {DEFAULT_MODULE_ID: ts}
        )
        return done_out + ongoing_out

    # -- metrics -------------------------------------------------------------------

    def get_metrics(self) -> dict[str, Any]:
        """The metrics since the last call, reduced (RLlib's keys).

        Episode length, return and duration count the chunks of an episode returned by
        earlier ``sample`` calls.

        Returns:
            The reduced metrics dict.
        """
        win = s.smoothing_window(self.config)
        m = self.metrics
        for e in self._done_episodes_for_metrics:
            length, ret, sec = len(e), float(e.get_return()), e.get_duration_s()
            for prev in self._ongoing_episodes_for_metrics.pop(e.id_, []):
                length += len(prev)
                ret += float(prev.get_return())
                sec += prev.get_duration_s()
            self._log_episode_end(length, ret, sec, win)
            m.log_value((s.SA_AGENT_RETURN_MEAN, s.DEFAULT_AGENT_ID), ret, window=win)
            m.log_value((s.SA_MODULE_RETURN_MEAN, DEFAULT_MODULE_ID), ret, window=win)
        self._done_episodes_for_metrics.clear()
        return self._reduced_metrics()
