"""``SingleAgentEnvRunner``: samples a gymnasium vector env with a torch policy.

Semantics follow RLlib 2.60's ``SingleAgentEnvRunner``; the per-step work is native: one
call records the vector step into all sub-envs' episodes (``single_agent_record_vector_step``)
and the next inference batch is the env's own observation array.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections import defaultdict
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from fastrollout._core import single_agent_record_vector_step
from fastrollout.core import DEFAULT_MODULE_ID, Columns
from fastrollout.episodes import SingleAgentEpisode
from fastrollout.errors import SpaceMismatchError
from fastrollout.runners import _support as s
from fastrollout.runners.env_runner import EnvRunner

__all__ = ["SingleAgentEnvRunner"]

_RESTART_KEYS = (s.RESTARTED_KEY, "_" + s.RESTARTED_KEY)


class SingleAgentEnvRunner(EnvRunner):
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
        self, *, config: Any, worker_index: int = 0, num_workers: int | None = None, **kwargs: Any
    ) -> None:
        super().__init__(
            config=config, worker_index=worker_index, num_workers=num_workers, **kwargs
        )
        self.num_envs = 0
        self._needs_initial_reset = True
        self._episodes: list[SingleAgentEpisode] = []
        self._obs: Any = None
        self._done_episodes_for_metrics: list[SingleAgentEpisode] = []
        self._ongoing_episodes_for_metrics: defaultdict[str, list[SingleAgentEpisode]] = (
            defaultdict(list)
        )
        self._shared_data: dict[str, Any] = {}
        self._time_after_sampling: float | None = None
        self._conn: s.Connectors | None = None
        self._cached_to_module: dict[str, Any] | None = None
        self.make_env()
        self.make_module()

    @property
    def _connectors(self) -> s.Connectors:
        assert self._conn is not None
        return self._conn

    # -- env and module ----------------------------------------------------------

    def make_env(self) -> None:
        """Creates the vector env (closing an existing one) and schedules a reset.

        Raises:
            ValueError: If the config names no env or an unknown vectorize mode.
        """
        if self.env is not None:
            with contextlib.suppress(Exception):
                self.env.close()
        creator = s.make_sub_env_creator(self.config, self.worker_index, self.num_workers)
        n = int(s.cfg(self.config, "num_envs_per_env_runner", 1))
        restart = bool(s.cfg(self.config, "restart_failed_sub_environments", False))
        attempts = int(s.cfg(self.config, "max_sub_environment_restart_attempts", 5))
        fns = []
        for i in range(n):
            make = functools.partial(creator, i)
            fns.append(functools.partial(s.RestartingEnv, make, attempts) if restart else make)
        mode = str(s.cfg(self.config, "gym_env_vectorize_mode", "sync")).lower()
        mode = getattr(mode, "value", mode)
        if mode == "sync":
            self.env = gym.vector.SyncVectorEnv(fns)
        elif mode == "async":
            self.env = gym.vector.AsyncVectorEnv(fns)
        else:
            raise ValueError(f"gym_env_vectorize_mode must be 'sync' or 'async', got {mode!r}")
        self.num_envs = self.env.num_envs
        self._needs_initial_reset = True
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
        single = (self.env.single_observation_space, self.env.single_action_space)
        return {
            "__env__": (self.env.observation_space, self.env.action_space),
            "__env_single__": single,
            DEFAULT_MODULE_ID: single,
        }

    def make_module(self) -> None:
        """Builds the module and the connectors around it."""
        super().make_module()
        spaces = self.get_spaces()
        single = (self.env.single_observation_space, self.env.single_action_space)
        self._conn = s.Connectors(
            config=self.config,
            env=self.env,
            spaces=spaces,
            observation_spaces={DEFAULT_MODULE_ID: single[0]},
            action_spaces={DEFAULT_MODULE_ID: single[1]},
            device=self._device,
        )
        # Row i of the module batch is sub-env i (no agent ids in a single-agent runner).
        self._agent_rows = {DEFAULT_MODULE_ID: [(i, None) for i in range(self.num_envs)]}

    # -- sampling ------------------------------------------------------------------

    def sample(
        self,
        *,
        num_timesteps: int | None = None,
        num_episodes: int | None = None,
        explore: bool | None = None,
        random_actions: bool = False,
        force_reset: bool = False,
    ) -> list[SingleAgentEpisode]:
        """Samples ``num_timesteps`` env steps or ``num_episodes`` done episodes.

        With neither given: ``rollout_fragment_length * num_envs`` timesteps under
        ``batch_mode="truncate_episodes"``, ``num_envs`` episodes under
        ``"complete_episodes"``. Timesteps: done episodes plus the chunks of the
        ongoing ones, which the next call continues (same ``id_``, ``t_started`` at the
        chunk's end, ``episode_lookback_horizon`` steps of look-back); between
        ``num_timesteps`` and ``num_timesteps + num_envs - 1`` steps. Episodes: exactly
        ``num_episodes`` done episodes, from freshly reset envs. Returned episodes are
        numpy'ized.

        Args:
            num_timesteps: Env steps to sample.
            num_episodes: Done episodes to return.
            explore: Sample actions (``forward_exploration``) or act greedily
                (``forward_inference``); default ``config.explore``.
            random_actions: Sample actions from the action space instead.
            force_reset: Reset all sub-envs first (always so with ``num_episodes``).

        Returns:
            The episodes.

        Raises:
            ValueError: If both ``num_timesteps`` and ``num_episodes`` are given or one
                is negative.
        """
        if num_timesteps is not None and num_episodes is not None:
            raise ValueError("give num_timesteps or num_episodes, not both")
        for name, v in (("num_timesteps", num_timesteps), ("num_episodes", num_episodes)):
            if v is not None and v < 0:
                raise ValueError(f"{name} must be >= 0, got {v}")
        if self._time_after_sampling is not None:
            self.metrics.log_value(
                s.TIME_BETWEEN_SAMPLING, time.perf_counter() - self._time_after_sampling
            )
        self.metrics.log_value(s.WEIGHTS_SEQ_NO, self._weights_seq_no, window=1)
        with self.metrics.log_time(s.SAMPLE_TIMER):
            if explore is None:
                explore = bool(s.cfg(self.config, "explore", True))
            batch_mode = s.cfg(self.config, "batch_mode", "truncate_episodes")
            if num_timesteps is None and num_episodes is None:
                if batch_mode == "truncate_episodes":
                    fragment = s.cfg(self.config, "rollout_fragment_length", 200)
                    if fragment == "auto":
                        fragment = 200
                    num_timesteps = int(fragment) * self.num_envs
                else:
                    num_episodes = self.num_envs
            samples = self._sample(
                num_timesteps=num_timesteps,
                num_episodes=num_episodes,
                explore=explore,
                random_actions=random_actions,
                force_reset=force_reset,
            )
            self._callback(
                "on_sample_end", env_runner=self, metrics_logger=self.metrics, samples=samples
            )
        self._time_after_sampling = time.perf_counter()
        return samples

    def _new_episode(self, i: int) -> None:
        self._episodes[i] = SingleAgentEpisode(
            observation_space=self.env.single_observation_space,
            action_space=self.env.single_action_space,
        )
        self._episode_callback("on_episode_created", i)

    def _episode_callback(self, which: str, i: int) -> None:
        if not self._callback_fns[which]:
            return
        kwargs = {
            "episode": self._episodes[i],
            "env_runner": self,
            "metrics_logger": self.metrics,
            "env": self.env.unwrapped,
            "rl_module": self.module,
            "env_index": i,
        }
        if which == "on_episode_end":
            kwargs["prev_episode_chunks"] = self._ongoing_episodes_for_metrics[
                self._episodes[i].id_
            ]
        self._callback(which, **kwargs)

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
        self._env_to_module(explore)
        for i in range(n):
            self._episode_callback("on_episode_start", i)

    def _count_restarts(self, infos: Any) -> np.ndarray | None:
        mask = infos.get("_" + s.RESTARTED_KEY) if isinstance(infos, dict) else None
        if mask is None or not mask.any():
            return None
        counts = infos[s.RESTARTED_KEY]
        self.metrics.log_value(
            s.NUM_ENV_RESTARTS_LIFETIME, int(np.sum(counts[mask])), reduce="lifetime_sum"
        )
        self.metrics.log_value(
            s.NUM_ENV_STEP_FAILURES_LIFETIME, int(np.sum(counts[mask])), reduce="lifetime_sum"
        )
        return np.flatnonzero(mask)

    def _env_to_module(self, explore: bool) -> None:
        """Runs the env-to-module pipeline on the latest observations (cached).

        As RLlib does, this runs right after a step is recorded and before done episodes
        are replaced, so connectors that rewrite episodes (the observation filter) see each
        episode's last observation, the terminal one included.
        """
        assert self.module is not None
        shared = self._shared_data
        shared["agent_rows"] = self._agent_rows
        with self.metrics.log_time(s.ENV_TO_MODULE_CONNECTOR):
            self._cached_to_module = self._connectors.env_to_module(
                batch={DEFAULT_MODULE_ID: {Columns.OBS: self._obs}},
                rl_module=self.module,
                episodes=self._episodes,
                explore=explore,
                shared_data=shared,
                metrics=self.metrics,
            )

    def _compute_actions(self, explore: bool, ts: int) -> tuple[Any, Any, dict[str, Any]]:
        assert self.module is not None
        conn = self._connectors
        shared = self._shared_data
        batch = self._cached_to_module
        self._cached_to_module = None
        if batch is None:
            raise RuntimeError("internal error: no env-to-module batch for this step")
        with self.metrics.log_time(s.RLMODULE_INFERENCE_TIMER), torch.no_grad():
            if explore:
                runners = int(s.cfg(self.config, "num_env_runners", 0)) or 1
                t = (self.num_env_steps_sampled_lifetime // runners + ts) * runners
                out = self.module.forward_exploration(batch, t=t)
            else:
                out = self.module.forward_inference(batch)
        with self.metrics.log_time(s.MODULE_TO_ENV_CONNECTOR):
            to_env = conn.module_to_env(
                batch=out,
                rl_module=self.module,
                episodes=self._episodes,
                explore=explore,
                shared_data=shared,
                metrics=self.metrics,
            )[DEFAULT_MODULE_ID]
        actions = to_env.pop(Columns.ACTIONS)
        env_actions = to_env.pop(Columns.ACTIONS_FOR_ENV, actions)
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
        while (ts < num_timesteps) if num_timesteps is not None else (eps < (num_episodes or 0)):
            if random_actions:
                actions = env_actions = self.env.action_space.sample()
                extras: dict[str, Any] = {}
            else:
                actions, env_actions, extras = self._compute_actions(explore, ts)
            extras[s.WEIGHTS_SEQ_NO] = self._weights_seq_no
            try:
                with self.metrics.log_time(s.ENV_STEP_TIMER):
                    obs, rewards, terminateds, truncateds, infos = self.env.step(env_actions)
            except ValueError as err:
                # The vector env stacks the sub-envs' observations into its buffer; an
                # observation of the wrong shape fails there with numpy's message only.
                if "broadcast" in str(err) or "shape" in str(err):
                    raise SpaceMismatchError(
                        f"a sub-env returned an observation that does not fit the "
                        f"observation space {self.env.single_observation_space}: {err}"
                    ) from err
                raise
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
                self._episodes, obs, actions, rewards, terminateds, truncateds, infos, extras
            )
            ts += self.num_envs - len(started)
            self._obs = obs
            self._env_to_module(explore)
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
                done_out.append(e.to_numpy() if to_numpy else e)
                self._new_episode(i)
                if num_episodes is not None and eps >= num_episodes:
                    break
        self._done_episodes_for_metrics.extend(done_out)
        ongoing_out: list[SingleAgentEpisode] = []
        if num_timesteps is not None:
            horizon = int(s.cfg(self.config, "episode_lookback_horizon", 1))
            continuations = [e.cut(len_lookback_buffer=horizon) for e in self._episodes]
            for e in self._episodes:
                if len(e) == 0:
                    continue
                e.validate()
                self._ongoing_episodes_for_metrics[e.id_].append(e)
                ongoing_out.append(e.to_numpy() if to_numpy else e)
            self._episodes = continuations
        self._increase_sampled_metrics(ts, len(done_out))
        return done_out + ongoing_out

    # -- metrics -------------------------------------------------------------------

    def _increase_sampled_metrics(self, num_steps: int, num_episodes: int) -> None:
        m = self.metrics
        self.num_env_steps_sampled_lifetime += num_steps
        m.log_value(s.NUM_ENV_STEPS_SAMPLED, num_steps, reduce="sum")
        m.log_value((s.NUM_AGENT_STEPS_SAMPLED, s.DEFAULT_AGENT_ID), num_steps, reduce="sum")
        m.log_value((s.NUM_MODULE_STEPS_SAMPLED, DEFAULT_MODULE_ID), num_steps, reduce="sum")
        m.log_value(s.NUM_EPISODES, num_episodes, reduce="sum")
        m.log_value(s.NUM_ENV_STEPS_SAMPLED_LIFETIME, num_steps, reduce="lifetime_sum")
        m.log_value(
            (s.NUM_AGENT_STEPS_SAMPLED_LIFETIME, s.DEFAULT_AGENT_ID),
            num_steps,
            reduce="lifetime_sum",
        )
        m.log_value(
            (s.NUM_MODULE_STEPS_SAMPLED_LIFETIME, DEFAULT_MODULE_ID),
            num_steps,
            reduce="lifetime_sum",
        )
        m.log_value(s.NUM_EPISODES_LIFETIME, num_episodes, reduce="lifetime_sum")

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
            m.log_value(s.EPISODE_LEN_MEAN, length, window=win)
            m.log_value(s.EPISODE_RETURN_MEAN, ret, window=win)
            m.log_value(s.EPISODE_DURATION_SEC_MEAN, sec, window=win)
            m.log_value((s.SA_AGENT_RETURN_MEAN, s.DEFAULT_AGENT_ID), ret, window=win)
            m.log_value((s.SA_MODULE_RETURN_MEAN, DEFAULT_MODULE_ID), ret, window=win)
            m.log_value(s.EPISODE_LEN_MIN, length, reduce="min", window=win)
            m.log_value(s.EPISODE_RETURN_MIN, ret, reduce="min", window=win)
            m.log_value(s.EPISODE_LEN_MAX, length, reduce="max", window=win)
            m.log_value(s.EPISODE_RETURN_MAX, ret, reduce="max", window=win)
        self._done_episodes_for_metrics.clear()
        return m.reduce()
