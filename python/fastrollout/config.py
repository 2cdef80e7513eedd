"""``RunnerConfig``: the settings of env runners, built like RLlib 2.60's ``AlgorithmConfig``.

The builder methods (``environment``, ``env_runners``, ``multi_agent``, ``rl_module``,
``callbacks``, ``debugging``, ``resources``, ``reporting``, ``fault_tolerance``,
``training``, ``learners``) take RLlib's argument names and defaults for everything that
matters to sampling, so RLlib code that builds a config keeps working with
``RunnerConfig`` in place of ``PPOConfig`` for these calls. Each setter checks its
arguments at once; :meth:`RunnerConfig.validate` checks the whole config (also values
assigned directly to attributes). After :meth:`RunnerConfig.freeze`, setting anything
raises.

>>> config = (
...     RunnerConfig()
...     .environment("CartPole-v1")
...     .env_runners(num_envs_per_env_runner=4, rollout_fragment_length=64)
...     .debugging(seed=0)
... )
>>> config.validate()
>>> config.num_envs_per_env_runner, config.is_multi_agent
(4, False)
"""

from __future__ import annotations

import copy
import numbers
import os
from collections.abc import Callable, Collection, KeysView, Mapping
from collections.abc import Set as AbstractSet
from typing import Any

import gymnasium as gym

from fastrollout.callbacks import CALLBACK_NAMES, Callbacks
from fastrollout.core import DEFAULT_MODULE_ID
from fastrollout.core.tree import as_list

__all__ = ["SUB_ENV_BACKENDS", "NotProvided", "RunnerConfig", "sub_env_backend"]

#: The values of ``sub_env_backend``.
SUB_ENV_BACKENDS = ("default", "shared_memory")


class _NotProvided:
    """Marks an argument that was not passed (None is a meaningful value for several)."""

    _instance: _NotProvided | None = None

    def __new__(cls) -> _NotProvided:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "NotProvided"

    def __deepcopy__(self, memo: dict[int, Any]) -> _NotProvided:
        return self

    def __reduce__(self) -> str:
        return "NotProvided"


NotProvided: Any = _NotProvided()

BATCH_MODES = ("truncate_episodes", "complete_episodes")
COUNT_STEPS_BY = ("env_steps", "agent_steps")
OBSERVATION_FILTERS = ("NoFilter", "MeanStdFilter")


def default_policy_mapping_fn(agent_id: Any, episode: Any = None, **kwargs: Any) -> str:
    """Maps every agent to the default module (RLlib's default mapping).

    Args:
        agent_id: The agent.
        episode: The episode (unused).
        **kwargs: Unused.

    Returns:
        ``"default_policy"``.
    """
    return DEFAULT_MODULE_ID


def _vectorize_modes() -> set[Any]:
    modes: set[Any] = set()
    for mode in gym.VectorizeMode:
        modes.update((mode, mode.value))
    return modes


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


class _CheckedMapping:
    """The configured ``policy_mapping_fn``, raising a clear error for an unknown module id."""

    def __init__(self, fn: Callable[..., Any], module_ids: Collection[str]) -> None:
        self.fn = fn
        self.module_ids = frozenset(module_ids)

    def __call__(self, agent_id: Any, episode: Any = None, **kwargs: Any) -> str:
        module_id = self.fn(agent_id, episode, **kwargs)
        if module_id not in self.module_ids:
            raise ValueError(
                f"policy_mapping_fn mapped agent {agent_id!r} to module {module_id!r}, which "
                f"is not a configured module (modules: {sorted(self.module_ids)}); add it to "
                ".multi_agent(policies=...)"
            )
        return module_id  # type: ignore[no-any-return]


class RunnerConfig:
    """Builder for the settings of ``SingleAgentEnvRunner`` and ``MultiAgentEnvRunner``.

    Attributes have RLlib's names (``env``, ``env_config``, ``num_envs_per_env_runner``,
    ``rollout_fragment_length``, ``batch_mode``, ``policies``, ``policy_mapping_fn``,
    ``callbacks_on_episode_start``, ...). Set them through the builder methods, which
    return ``self`` for chaining.
    """

    def __init__(self) -> None:
        # environment()
        self.env: Any = None
        self.env_config: dict[str, Any] = {}
        self.observation_space: gym.Space[Any] | None = None
        self.action_space: gym.Space[Any] | None = None
        self.normalize_actions = True
        self.clip_actions = False
        self.clip_rewards: bool | float | None = None
        self.disable_env_checking = False
        # env_runners()
        self.env_runner_cls: type | None = None
        self.num_env_runners = 0
        self.num_envs_per_env_runner = 1
        self.gym_env_vectorize_mode: Any = "sync"
        self.remote_worker_envs = False
        self.remote_env_batch_wait_ms: float = 0
        self.num_cpus_per_env_runner: float = 1
        self.num_gpus_per_env_runner: float = 0
        self.sample_timeout_s: float | None = 60.0
        self.max_requests_in_flight_per_env_runner = 1
        self.rollout_fragment_length: int | str = 200
        self.batch_mode = "truncate_episodes"
        self.explore = True
        self.episode_lookback_horizon = 1
        self.episodes_to_numpy = True
        self.compress_observations: bool | str = False
        # RolloutWorker (the old stack's worker) only.
        self.observation_filter = "NoFilter"
        self.sample_async = False
        self.episode_horizon: int | None = None
        self.soft_horizon = False
        self.no_done_at_end = False
        self.fake_sampler = False
        self._env_to_module_connector: Callable[..., Any] | None = None
        self._module_to_env_connector: Callable[..., Any] | None = None
        self.add_default_connectors_to_env_to_module_pipeline = True
        self.add_default_connectors_to_module_to_env_pipeline = True
        # fault_tolerance()
        self.restart_failed_sub_environments = False
        self.max_sub_environment_restart_attempts = 5
        self.sub_env_step_timeout_s: float | None = None
        # Where the sub-envs step (fastrollout's own settings; see sub_env_backend()).
        self.sub_env_backend = "default"
        self.num_sub_env_workers: int | None = None
        self.sub_env_batch_size: int | None = None
        self.restart_failed_env_runners = True
        self.ignore_env_runner_failures = False
        self.max_num_env_runner_restarts = 1000
        self.env_runner_health_probe_timeout_s = 30.0
        # multi_agent()
        self.policies: dict[str, Any] = {DEFAULT_MODULE_ID: None}
        self._policies_set = False
        self.policy_mapping_fn: Callable[..., Any] = default_policy_mapping_fn
        self.policies_to_train: Collection[str] | Callable[..., bool] | None = None
        self.count_steps_by = "env_steps"
        self.observation_fn: Callable[..., Any] | None = None
        # rl_module()
        self._rl_module_spec: Any = None
        self._model_config: dict[str, Any] = {}
        # training() / learners(): only for rollout_fragment_length="auto".
        self.train_batch_size: int | None = None
        self._train_batch_size_per_learner: int | None = None
        self.num_learners = 0
        # callbacks()
        self.callbacks_class: Any = Callbacks
        self.callbacks_on_environment_created: Any = None
        self.callbacks_on_episode_created: Any = None
        self.callbacks_on_episode_start: Any = None
        self.callbacks_on_episode_step: Any = None
        self.callbacks_on_episode_end: Any = None
        self.callbacks_on_sample_end: Any = None
        # debugging(), resources(), reporting()
        self.seed: int | None = None
        self.log_level = "WARN"
        self.device: Any = "auto"
        self.metrics_num_episodes_for_smoothing = 100
        # offline_data()
        self.output: str | os.PathLike[str] | None = None
        self.output_write_episodes = True
        self.output_max_rows_per_file: int | None = None
        self.output_max_file_size: int | None = None
        self._is_frozen = False

    # ---------------------------------------------------------------- frozen state

    def __setattr__(self, key: str, value: Any) -> None:
        if getattr(self, "_is_frozen", False) and key != "_is_frozen":
            raise AttributeError(
                f"cannot set {key!r}: this RunnerConfig is frozen (use .copy(copy_frozen=False)"
                " for an editable copy)"
            )
        super().__setattr__(key, value)

    def freeze(self) -> None:
        """Makes the config read-only: every later setter or attribute assignment raises.

        Runners freeze the config they are given so that it cannot change under them.
        Like RLlib's, freezing does not make nested dicts (``env_config``) immutable.
        """
        self._is_frozen = True

    @property
    def is_frozen(self) -> bool:
        """Whether :meth:`freeze` was called."""
        return self._is_frozen

    def copy(self, copy_frozen: bool | None = None) -> RunnerConfig:
        """Returns a deep copy, frozen or not.

        Args:
            copy_frozen: True for a frozen copy, False for an editable one, None to keep
                this config's state.

        Returns:
            The copy.
        """
        cp = copy.deepcopy(self)
        if copy_frozen is not None:
            object.__setattr__(cp, "_is_frozen", bool(copy_frozen))
        return cp

    # ---------------------------------------------------------------- builders

    def environment(
        self,
        env: Any = NotProvided,
        *,
        env_config: dict[str, Any] | None = NotProvided,
        observation_space: gym.Space[Any] | None = NotProvided,
        action_space: gym.Space[Any] | None = NotProvided,
        normalize_actions: bool = NotProvided,
        clip_actions: bool = NotProvided,
        clip_rewards: bool | float | None = NotProvided,
        disable_env_checking: bool = NotProvided,
    ) -> RunnerConfig:
        """Sets the environment.

        Args:
            env: A gymnasium id, a name given to ``fastrollout.register_env``, a
                ``gymnasium.Env`` or ``MultiAgentEnv`` class (called with the
                ``EnvContext``), a creator callable taking the ``EnvContext``, or a
                ``"module.Class"`` path.
            env_config: Config dict passed to the env (as ``EnvContext``); merged
                recursively into the current one, as RLlib does.
            observation_space: The modules' observation space, if not the env's.
            action_space: The modules' action space, if not the env's.
            normalize_actions: Whether modules act in a normalized Box space that the
                module-to-env connector unsquashes to the env's bounds.
            clip_actions: Whether the module-to-env connector clips actions to the env's
                Box bounds.
            clip_rewards: ``RolloutWorker`` only: ``True`` clips the batch's rewards to
                their sign, a positive number to ``[-value, value]``; None or False
                leaves them.
            disable_env_checking: Skip the env check at creation
                (``fastrollout.env.check_env``).

        Returns:
            self.

        Raises:
            TypeError: ``env`` or ``env_config`` of the wrong type, or a flag that is not
                a bool.
        """
        if env is not NotProvided:
            _check_env_spec(env)
            self.env = env
        if env_config is not NotProvided:
            if env_config is not None and not isinstance(env_config, Mapping):
                raise TypeError(f"env_config must be a dict, got {type(env_config).__name__}")
            merged = copy.deepcopy(self.env_config)
            _deep_update(merged, dict(env_config or {}))
            self.env_config = merged
        if observation_space is not NotProvided:
            _check_space(observation_space, "observation_space")
            self.observation_space = observation_space
        if action_space is not NotProvided:
            _check_space(action_space, "action_space")
            self.action_space = action_space
        self._set_flags(
            ("normalize_actions", normalize_actions),
            ("clip_actions", clip_actions),
            ("disable_env_checking", disable_env_checking),
        )
        if clip_rewards is not NotProvided:
            _check_clip_rewards(clip_rewards)
            self.clip_rewards = clip_rewards
        return self

    def env_runners(
        self,
        *,
        env_runner_cls: type | None = NotProvided,
        num_env_runners: int = NotProvided,
        num_envs_per_env_runner: int = NotProvided,
        gym_env_vectorize_mode: Any = NotProvided,
        remote_worker_envs: bool = NotProvided,
        remote_env_batch_wait_ms: float = NotProvided,
        num_cpus_per_env_runner: float = NotProvided,
        num_gpus_per_env_runner: float = NotProvided,
        sample_timeout_s: float | None = NotProvided,
        max_requests_in_flight_per_env_runner: int = NotProvided,
        env_to_module_connector: Callable[..., Any] | None = NotProvided,
        module_to_env_connector: Callable[..., Any] | None = NotProvided,
        add_default_connectors_to_env_to_module_pipeline: bool = NotProvided,
        add_default_connectors_to_module_to_env_pipeline: bool = NotProvided,
        episode_lookback_horizon: int = NotProvided,
        rollout_fragment_length: int | str = NotProvided,
        batch_mode: str = NotProvided,
        explore: bool = NotProvided,
        episodes_to_numpy: bool = NotProvided,
        compress_observations: bool | str = NotProvided,
        observation_filter: str = NotProvided,
        sample_async: bool = NotProvided,
        episode_horizon: int | None = NotProvided,
        soft_horizon: bool = NotProvided,
        no_done_at_end: bool = NotProvided,
        restart_failed_sub_environments: bool = NotProvided,
        max_sub_environment_restart_attempts: int = NotProvided,
        sub_env_step_timeout_s: float | None = NotProvided,
        sub_env_backend: str = NotProvided,
        num_sub_env_workers: int | None = NotProvided,
        sub_env_batch_size: int | None = NotProvided,
    ) -> RunnerConfig:
        """Sets how runners sample.

        Args:
            env_runner_cls: The runner class to use (default: chosen by
                ``is_multi_agent``).
            num_env_runners: Number of remote runners (Ray actors) that
                ``fastrollout.EnvRunnerGroup`` starts besides its local runner; 0 samples
                in the local runner only. A runner built directly from this config
                (``SingleAgentEnvRunner(config=...)``) is, as in RLlib, the group's local
                runner (``worker_index=0``): it samples its own sub-envs only; build an
                ``EnvRunnerGroup`` to sample with the remote runners.
            num_envs_per_env_runner: Sub-envs stepped together by one runner (batched
                forward passes).
            gym_env_vectorize_mode: ``"sync"``, ``"async"`` (sub-processes) or
                ``"vector_entry_point"`` (the env's own vectorized implementation, for
                example CartPole's numpy one) for single-agent vector envs; a
                ``gymnasium.VectorizeMode`` also works. The multi-agent runner steps its
                sub-envs in this process (or remotely, see ``remote_worker_envs``).
            remote_worker_envs: Run each sub-env in its own Ray actor (no CPU reserved)
                and step the sub-envs as they become ready: each turn the runner acts, in
                one forward pass, for the sub-envs whose step has finished, so a slow
                sub-env does not hold back the others. Single- and multi-agent; needs ray
                (the ``ray`` extra) and replaces ``gym_env_vectorize_mode``.
            remote_env_batch_wait_ms: With ``remote_worker_envs``: once one sub-env is
                ready, how long to wait for more before acting (0: act at once for those
                that are ready). Larger batches, fewer forward passes; slower turns.
            num_cpus_per_env_runner: CPUs reserved per remote runner.
            num_gpus_per_env_runner: GPUs reserved per remote runner.
            sample_timeout_s: How long ``EnvRunnerGroup.sample()`` waits for the remote
                runners (None: as long as it takes); what comes later arrives with the
                next call.
            max_requests_in_flight_per_env_runner: Requests with one tag that
                ``EnvRunnerGroup.foreach_env_runner_async`` keeps in flight per remote
                runner (more are not started).
            env_to_module_connector: Callable ``(env, spaces, device)`` -> connector or
                list of connectors, prepended to the default env-to-module pipeline.
            module_to_env_connector: Callable ``(env, spaces)`` -> connector or list of
                connectors, prepended to the default module-to-env pipeline.
            add_default_connectors_to_env_to_module_pipeline: Whether the default
                env-to-module pieces are added after the user's.
            add_default_connectors_to_module_to_env_pipeline: Whether the default
                module-to-env pieces are added after the user's.
            episode_lookback_horizon: Steps of look-back kept when an ongoing episode is
                cut into a chunk.
            rollout_fragment_length: Env steps per sub-env per ``sample()`` call
                (truncate_episodes), or ``"auto"`` to derive it from the train batch size.
            batch_mode: ``"truncate_episodes"`` or ``"complete_episodes"``.
            explore: Whether ``sample(explore=None)`` explores.
            episodes_to_numpy: Whether returned episodes are numpy'ized.
            compress_observations: Whether episodes (every agent's, in multi-agent
                ones) store their (typed) observations compressed in the native core
                (LZ4 blocks of 32 steps, the newest steps uncompressed); reads are
                unchanged (docs/compression.md). A ``RolloutWorker`` also compresses
                its batches' ``obs``/``new_obs`` columns (``"bulk"``: one blob per column).
            observation_filter: ``RolloutWorker`` only: ``"NoFilter"`` or
                ``"MeanStdFilter"`` (running mean/std per policy, applied before the
                policy acts).
            sample_async: ``RolloutWorker`` only: a background thread samples the next
                batch while the caller learns (at most one batch ahead).
            episode_horizon: ``RolloutWorker`` only: episodes end (truncated) after this
                many env steps; None: the env's own limit only.
            soft_horizon: With ``episode_horizon``: an episode ends at the horizon but the
                env is not reset; the next episode starts from the last observation.
            no_done_at_end: ``RolloutWorker`` only: the batch's ``terminateds`` stay
                False at episodes' ends, so learners bootstrap from the last observation.
            restart_failed_sub_environments: Whether a sub-env whose ``reset``/``step``
                raises is recreated (and its episode dropped) instead of failing the
                runner. RLlib 2.60 sets this in ``fault_tolerance()``; both work here.
            max_sub_environment_restart_attempts: How many times in a row a runner tries
                to recreate and reset a failed sub-env before giving up (fastrollout's
                own setting; RLlib retries without bound).
            sub_env_step_timeout_s: A step (or reset) of a sub-env in another process
                (``remote_worker_envs``, or ``gym_env_vectorize_mode="async"`` with
                restarts) that takes longer counts as that sub-env's failure, so one hung
                simulator cannot hang the runner; None (default): no limit.
                fastrollout's own setting.
            sub_env_backend: ``"default"`` (as ``gym_env_vectorize_mode`` and
                ``remote_worker_envs`` say) or ``"shared_memory"``: worker processes step
                the sub-envs in the background and the runner infers for one batch while
                the others step (see :func:`sub_env_backend`). An ``"envpool:<task>"``
                env id always runs on EnvPool. fastrollout's own setting.
            num_sub_env_workers: Worker processes of the ``"shared_memory"`` backend
                (None: one per CPU core but the runner's own; at least one, at most one
                per sub-env).
            sub_env_batch_size: Sub-envs the runner acts for per turn with the
                ``"shared_memory"`` and EnvPool backends (None: half the sub-envs,
                rounded up; all of them: lockstep).

        Returns:
            self.

        Raises:
            ValueError: A value out of range (the message names the argument).
            TypeError: A value of the wrong type.
        """
        _set_sub_env_backend(
            self,
            backend=sub_env_backend,
            num_workers=num_sub_env_workers,
            batch_size=sub_env_batch_size,
        )
        if env_runner_cls is not NotProvided:
            if env_runner_cls is not None and not isinstance(env_runner_cls, type):
                raise TypeError(f"env_runner_cls must be a class, got {env_runner_cls!r}")
            self.env_runner_cls = env_runner_cls
        if num_env_runners is not NotProvided:
            _check_int(num_env_runners, "num_env_runners", 0)
            self.num_env_runners = num_env_runners
        if num_envs_per_env_runner is not NotProvided:
            _check_int(num_envs_per_env_runner, "num_envs_per_env_runner", 1)
            self.num_envs_per_env_runner = num_envs_per_env_runner
        if gym_env_vectorize_mode is not NotProvided:
            _check_vectorize_mode(gym_env_vectorize_mode)
            self.gym_env_vectorize_mode = gym_env_vectorize_mode
        self._set_flags(("remote_worker_envs", remote_worker_envs))
        if remote_env_batch_wait_ms is not NotProvided:
            _check_number(remote_env_batch_wait_ms, "remote_env_batch_wait_ms", 0)
            self.remote_env_batch_wait_ms = remote_env_batch_wait_ms
        if num_cpus_per_env_runner is not NotProvided:
            _check_number(num_cpus_per_env_runner, "num_cpus_per_env_runner", 0)
            self.num_cpus_per_env_runner = num_cpus_per_env_runner
        if num_gpus_per_env_runner is not NotProvided:
            _check_number(num_gpus_per_env_runner, "num_gpus_per_env_runner", 0)
            self.num_gpus_per_env_runner = num_gpus_per_env_runner
        if sample_timeout_s is not NotProvided:
            if sample_timeout_s is not None:
                _check_number(sample_timeout_s, "sample_timeout_s", 0)
            self.sample_timeout_s = sample_timeout_s
        if max_requests_in_flight_per_env_runner is not NotProvided:
            _check_int(
                max_requests_in_flight_per_env_runner, "max_requests_in_flight_per_env_runner", 1
            )
            self.max_requests_in_flight_per_env_runner = max_requests_in_flight_per_env_runner
        if env_to_module_connector is not NotProvided:
            _check_optional_callable(env_to_module_connector, "env_to_module_connector")
            self._env_to_module_connector = env_to_module_connector
        if module_to_env_connector is not NotProvided:
            _check_optional_callable(module_to_env_connector, "module_to_env_connector")
            self._module_to_env_connector = module_to_env_connector
        self._set_flags(
            (
                "add_default_connectors_to_env_to_module_pipeline",
                add_default_connectors_to_env_to_module_pipeline,
            ),
            (
                "add_default_connectors_to_module_to_env_pipeline",
                add_default_connectors_to_module_to_env_pipeline,
            ),
            ("explore", explore),
            ("episodes_to_numpy", episodes_to_numpy),
            ("sample_async", sample_async),
            ("soft_horizon", soft_horizon),
            ("no_done_at_end", no_done_at_end),
        )
        if compress_observations is not NotProvided:
            _check_compress_observations(compress_observations)
            self.compress_observations = compress_observations
        if observation_filter is not NotProvided:
            _check_choice(observation_filter, "observation_filter", OBSERVATION_FILTERS)
            self.observation_filter = observation_filter
        if episode_horizon is not NotProvided:
            if episode_horizon is not None:
                _check_int(episode_horizon, "episode_horizon", 1)
            self.episode_horizon = episode_horizon
        if episode_lookback_horizon is not NotProvided:
            _check_int(episode_lookback_horizon, "episode_lookback_horizon", 0)
            self.episode_lookback_horizon = episode_lookback_horizon
        if rollout_fragment_length is not NotProvided:
            _check_rollout_fragment_length(rollout_fragment_length)
            self.rollout_fragment_length = rollout_fragment_length
        if batch_mode is not NotProvided:
            _check_choice(batch_mode, "batch_mode", BATCH_MODES)
            self.batch_mode = batch_mode
        self._set_restarts(
            restart_failed_sub_environments,
            max_sub_environment_restart_attempts,
            sub_env_step_timeout_s,
        )
        return self

    def _set_flags(self, *flags: tuple[str, Any]) -> None:
        """Sets each ``(name, value)`` flag that was given, after checking it is a bool."""
        for name, value in flags:
            if value is not NotProvided:
                _check_bool(value, name)
                setattr(self, name, value)

    def fault_tolerance(
        self,
        *,
        restart_failed_sub_environments: bool = NotProvided,
        max_sub_environment_restart_attempts: int = NotProvided,
        sub_env_step_timeout_s: float | None = NotProvided,
        restart_failed_env_runners: bool = NotProvided,
        ignore_env_runner_failures: bool = NotProvided,
        max_num_env_runner_restarts: int = NotProvided,
        env_runner_health_probe_timeout_s: float = NotProvided,
    ) -> RunnerConfig:
        """Sets how failing sub-envs and remote runners are handled (RLlib 2.60's names).

        Args:
            restart_failed_sub_environments: See :meth:`env_runners`.
            max_sub_environment_restart_attempts: See :meth:`env_runners`.
            sub_env_step_timeout_s: See :meth:`env_runners`.
            restart_failed_env_runners: Whether Ray restarts a remote runner whose actor
                died (or whose call raised) in an ``EnvRunnerGroup``; the group sends it
                the latest weights and connector states before it samples again.
            ignore_env_runner_failures: Without restarts, whether the group goes on
                with the remaining runners (True) or raises the failure (False).
            max_num_env_runner_restarts: How often Ray restarts one remote runner.
            env_runner_health_probe_timeout_s: How long
                ``EnvRunnerGroup.probe_unhealthy_env_runners`` waits for failed runners
                to answer.

        Returns:
            self.

        Raises:
            ValueError: A value out of range.
            TypeError: A value of the wrong type.
        """
        self._set_restarts(
            restart_failed_sub_environments,
            max_sub_environment_restart_attempts,
            sub_env_step_timeout_s,
        )
        self._set_flags(
            ("restart_failed_env_runners", restart_failed_env_runners),
            ("ignore_env_runner_failures", ignore_env_runner_failures),
        )
        if max_num_env_runner_restarts is not NotProvided:
            _check_int(max_num_env_runner_restarts, "max_num_env_runner_restarts", 0)
            self.max_num_env_runner_restarts = max_num_env_runner_restarts
        if env_runner_health_probe_timeout_s is not NotProvided:
            _check_number(env_runner_health_probe_timeout_s, "env_runner_health_probe_timeout_s", 0)
            self.env_runner_health_probe_timeout_s = env_runner_health_probe_timeout_s
        return self

    def _set_restarts(self, restart: Any, attempts: Any, timeout: Any) -> None:
        if timeout is not NotProvided:
            if timeout is not None:
                _check_number(timeout, "sub_env_step_timeout_s", 0)
            self.sub_env_step_timeout_s = timeout
        if restart is not NotProvided:
            _check_bool(restart, "restart_failed_sub_environments")
            self.restart_failed_sub_environments = restart
        if attempts is not NotProvided:
            _check_int(attempts, "max_sub_environment_restart_attempts", 1)
            self.max_sub_environment_restart_attempts = attempts

    def multi_agent(
        self,
        *,
        policies: Collection[str] | Mapping[str, Any] = NotProvided,
        policy_mapping_fn: Callable[..., str] = NotProvided,
        policies_to_train: Collection[str] | Callable[..., bool] | None = NotProvided,
        count_steps_by: str = NotProvided,
        observation_fn: Callable[..., Any] | None = NotProvided,
    ) -> RunnerConfig:
        """Sets the modules of a multi-agent setup and which agent each one steers.

        Args:
            policies: The module ids: a collection of ids, or a dict id -> module spec
                (an ``RLModuleSpec``, or None to infer it; RLlib's ``PolicySpec`` is
                accepted and treated as None). A set's ids are kept sorted (its own order
                changes with ``PYTHONHASHSEED``); runners build and run the modules in
                sorted order, so a seed samples the same episodes in every process.
            policy_mapping_fn: ``fn(agent_id, episode, **kwargs) -> module_id``, called
                once per agent per episode.
            policies_to_train: Ids of the modules a trainer updates (a subset of
                ``policies``), a callable ``(module_id, batch) -> bool``, or None for all.
            count_steps_by: ``"env_steps"`` or ``"agent_steps"``: what
                ``rollout_fragment_length`` and the multi-agent runner's
                ``sample(num_timesteps=...)`` count. An agent step is one agent's
                observation in one sub-env step, summed over agents and sub-envs, so
                ``rollout_fragment_length * num_envs_per_env_runner`` agent steps per
                ``sample()``, as RLlib counts them.
            observation_fn: ``RolloutWorker`` only: ``fn(agent_obs, worker, base_env,
                policies, episode) -> agent_obs``, called on every multi-agent
                observation dict before the policies see it (RLlib's old-stack hook).

        Returns:
            self.

        Raises:
            ValueError: Empty ``policies``, or a bad ``count_steps_by``.
            TypeError: Ids that are not str, or arguments of the wrong type.
        """
        if policies is not NotProvided:
            self.policies = _normalize_policies(policies)
            self._policies_set = True
        if policy_mapping_fn is not NotProvided:
            if not callable(policy_mapping_fn):
                raise TypeError(
                    "policy_mapping_fn must be callable (agent_id, episode, **kwargs) -> "
                    f"module_id, got {type(policy_mapping_fn).__name__}"
                )
            self.policy_mapping_fn = policy_mapping_fn
        if policies_to_train is not NotProvided:
            self.policies_to_train = _check_policies_to_train(policies_to_train)
        if count_steps_by is not NotProvided:
            _check_choice(count_steps_by, "count_steps_by", COUNT_STEPS_BY)
            self.count_steps_by = count_steps_by
        if observation_fn is not NotProvided:
            _check_optional_callable(observation_fn, "observation_fn")
            self.observation_fn = observation_fn
        return self

    def rl_module(
        self,
        *,
        rl_module_spec: Any = NotProvided,
        model_config: Mapping[str, Any] | None = NotProvided,
    ) -> RunnerConfig:
        """Sets the module(s) the runner builds.

        Args:
            rl_module_spec: An ``RLModuleSpec`` (one spec for every module), a
                ``MultiRLModuleSpec`` (a spec per module id; the ids must match
                ``policies`` when those are set), or an ``RLModule`` class (shorthand for
                ``RLModuleSpec(module_class=cls)``); fastrollout's or RLlib's, mixed
                freely. A spec's ``module_class`` is built (an RLlib module class builds
                RLlib's module); None builds the default module for the observation
                space (an MLP, or a CNN for images). None for the default module
                everywhere. Anything else fails :meth:`validate` with a ``TypeError``.
            model_config: Dict passed to each module as ``model_config`` (e.g.
                ``{"fcnet_hiddens": [64, 64]}``), unless its spec has its own.

        Returns:
            self.

        Raises:
            TypeError: ``model_config`` is not a dict.
        """
        if rl_module_spec is not NotProvided:
            self._rl_module_spec = rl_module_spec
        if model_config is not NotProvided:
            if model_config is not None and not isinstance(model_config, Mapping):
                raise TypeError(f"model_config must be a dict, got {type(model_config).__name__}")
            self._model_config = dict(model_config or {})
        return self

    def training(
        self,
        *,
        train_batch_size: int | None = NotProvided,
        train_batch_size_per_learner: int | None = NotProvided,
    ) -> RunnerConfig:
        """Sets the train batch size, which ``rollout_fragment_length="auto"`` derives from.

        Args:
            train_batch_size: Env steps per training iteration across all learners.
            train_batch_size_per_learner: Env steps per learner (takes precedence).

        Returns:
            self.

        Raises:
            ValueError: A size < 1.
        """
        if train_batch_size is not NotProvided:
            if train_batch_size is not None:
                _check_int(train_batch_size, "train_batch_size", 1)
            self.train_batch_size = train_batch_size
        if train_batch_size_per_learner is not NotProvided:
            if train_batch_size_per_learner is not None:
                _check_int(train_batch_size_per_learner, "train_batch_size_per_learner", 1)
            self._train_batch_size_per_learner = train_batch_size_per_learner
        return self

    def learners(self, *, num_learners: int = NotProvided) -> RunnerConfig:
        """Sets the number of learners (only used by the ``"auto"`` fragment length rule).

        Args:
            num_learners: Number of learner workers (0: one local learner).

        Returns:
            self.
        """
        if num_learners is not NotProvided:
            _check_int(num_learners, "num_learners", 0)
            self.num_learners = num_learners
        return self

    def callbacks(
        self,
        callbacks_class: Any = NotProvided,
        *,
        on_environment_created: Any = NotProvided,
        on_episode_created: Any = NotProvided,
        on_episode_start: Any = NotProvided,
        on_episode_step: Any = NotProvided,
        on_episode_end: Any = NotProvided,
        on_sample_end: Any = NotProvided,
    ) -> RunnerConfig:
        """Sets the callbacks: a class (or list of classes) and/or plain callables per hook.

        Runners call, for each hook, the methods of the class instances first, then the
        callables, each in the order given (``fastrollout.callbacks.make_callback``).

        Args:
            callbacks_class: A ``fastrollout.Callbacks`` (or RLlib ``RLlibCallback``)
                subclass or a list of them; None resets to the no-op base class.
            on_environment_created: A callable or list of callables (keyword arguments
                ``env_runner``, ``metrics_logger``, ``env``, ``env_context``).
            on_episode_created: Likewise (``episode``, ``env_runner``, ``metrics_logger``,
                ``env``, ``rl_module``, ``env_index``).
            on_episode_start: Likewise.
            on_episode_step: Likewise.
            on_episode_end: Likewise (also ``prev_episode_chunks``).
            on_sample_end: Likewise (``env_runner``, ``metrics_logger``, ``samples``).

        Returns:
            self.

        Raises:
            TypeError: A class or callable that is not callable.
        """
        if callbacks_class is not NotProvided:
            if callbacks_class is None:
                callbacks_class = Callbacks
            _check_callbacks_class(callbacks_class)
            self.callbacks_class = callbacks_class
        hook_values = (
            on_environment_created,
            on_episode_created,
            on_episode_start,
            on_episode_step,
            on_episode_end,
            on_sample_end,
        )
        for hook, value in zip(CALLBACK_NAMES, hook_values, strict=True):
            if value is not NotProvided:
                _check_callables(value, hook)
                setattr(self, f"callbacks_{hook}", value)
        return self

    def debugging(
        self,
        *,
        seed: int | None = NotProvided,
        log_level: str = NotProvided,
        fake_sampler: bool = NotProvided,
    ) -> RunnerConfig:
        """Sets the seed (and log level).

        Args:
            seed: Base seed: runner ``i`` seeds its sub-env ``j`` and its module from it,
                so identical configs sample identically. None: not seeded.
            log_level: ``"DEBUG"``, ``"INFO"``, ``"WARN"`` or ``"ERROR"``.
            fake_sampler: ``RolloutWorker`` only: every ``sample()`` after the first
                returns the first batch again (infinitely fast; for tests).

        Returns:
            self.

        Raises:
            TypeError: A seed that is not an int.
            ValueError: An unknown log level.
        """
        if seed is not NotProvided:
            if seed is not None:
                _check_int(seed, "seed", 0)
            self.seed = seed
        if log_level is not NotProvided:
            _check_choice(log_level, "log_level", ("DEBUG", "INFO", "WARN", "ERROR"))
            self.log_level = log_level
        self._set_flags(("fake_sampler", fake_sampler))
        return self

    def resources(self, *, device: Any = NotProvided) -> RunnerConfig:
        """Sets where modules run (fastrollout's setting; RLlib derives it from GPU counts).

        Args:
            device: ``"auto"`` (a GPU when there is one), ``"cpu"``, ``"cuda"``,
                ``"cuda:N"`` or a ``torch.device``.

        Returns:
            self.

        Raises:
            ValueError: Another device string.
        """
        if device is not NotProvided:
            _check_device(device)
            self.device = device
        return self

    def reporting(self, *, metrics_num_episodes_for_smoothing: int = NotProvided) -> RunnerConfig:
        """Sets how metrics are reported.

        Args:
            metrics_num_episodes_for_smoothing: Episodes in the window over which
                episode return/length/duration means, mins and maxes are computed.

        Returns:
            self.
        """
        if metrics_num_episodes_for_smoothing is not NotProvided:
            _check_int(metrics_num_episodes_for_smoothing, "metrics_num_episodes_for_smoothing", 1)
            self.metrics_num_episodes_for_smoothing = metrics_num_episodes_for_smoothing
        return self

    def offline_data(
        self,
        *,
        output: str | os.PathLike[str] | None = NotProvided,
        output_write_episodes: bool = NotProvided,
        output_max_rows_per_file: int | None = NotProvided,
        output_max_file_size: int | None = NotProvided,
    ) -> RunnerConfig:
        """Sets where sampled episodes are recorded (RLlib's recording settings).

        With ``output`` set, every ``sample()`` call's episodes are written to parquet
        files under it, off the sampling thread (see :mod:`fastrollout.offline` and
        ``docs/offline.md``); ``fastrollout.offline.read_episodes`` reads them back.
        Needs pyarrow (``pip install 'fastrollout[offline]'``).

        Args:
            output: The folder to write to (None: record nothing).
            output_write_episodes: One row per episode chunk holding its state (RLlib's
                default), or one row per step in RLlib's column names.
            output_max_rows_per_file: Rows per file (None: no limit on rows).
            output_max_file_size: Bytes per file, counted before parquet's compression
                (None: no limit on bytes). Without either limit, one file per
                ``sample()`` call, as RLlib writes them. RLlib 2.60's default is 64 MiB,
                but only its old stack's JSON writer reads it; here it is None.

        Returns:
            self.

        Raises:
            TypeError: A value of the wrong type.
            ValueError: ``output_max_rows_per_file`` or ``output_max_file_size`` below 1.
        """
        if output is not NotProvided:
            _check_output(output)
            self.output = output
        if output_write_episodes is not NotProvided:
            _check_bool(output_write_episodes, "output_write_episodes")
            self.output_write_episodes = output_write_episodes
        if output_max_rows_per_file is not NotProvided:
            if output_max_rows_per_file is not None:
                _check_int(output_max_rows_per_file, "output_max_rows_per_file", 1)
            self.output_max_rows_per_file = output_max_rows_per_file
        if output_max_file_size is not NotProvided:
            if output_max_file_size is not None:
                _check_int(output_max_file_size, "output_max_file_size", 1)
            self.output_max_file_size = output_max_file_size
        return self

    # ---------------------------------------------------------------- derived values

    @property
    def is_multi_agent(self) -> bool:
        """Whether the config describes a multi-agent setup.

        True when more than one module is configured or the only one is not
        ``"default_policy"`` (RLlib's rule), counting the ids of a ``MultiRLModuleSpec``.
        """
        ids = self.module_ids
        return len(ids) > 1 or DEFAULT_MODULE_ID not in ids

    @property
    def module_ids(self) -> list[str]:
        """The configured module ids: ``policies``, else a ``MultiRLModuleSpec``'s ids."""
        multi = _multi_spec_ids(self._rl_module_spec)
        if not self._policies_set and multi is not None:
            return list(multi)
        return list(self.policies)

    @property
    def agent_to_module_mapping_fn(self) -> Callable[..., str]:
        """``policy_mapping_fn``, checked: an id that is not a configured module raises.

        Runners hand this to their multi-agent episodes, so a mapping to an unknown
        module fails at once with a message naming the agent and the module.
        """
        return _CheckedMapping(self.policy_mapping_fn, self.module_ids)

    @property
    def env_to_module_connector(self) -> Callable[..., Any] | None:
        """The user's env-to-module connector factory (None when not set)."""
        return self._env_to_module_connector

    @property
    def module_to_env_connector(self) -> Callable[..., Any] | None:
        """The user's module-to-env connector factory (None when not set)."""
        return self._module_to_env_connector

    @property
    def rl_module_spec(self) -> Any:
        """The spec (or module class) given to :meth:`rl_module`, or None."""
        return self._rl_module_spec

    @property
    def model_config(self) -> dict[str, Any]:
        """The model config dict given to :meth:`rl_module` (empty by default)."""
        return self._model_config

    @property
    def train_batch_size_per_learner(self) -> int:
        """The train batch size per learner: explicit, or ``train_batch_size / learners``.

        Raises:
            ValueError: Neither batch size is set.
        """
        if self._train_batch_size_per_learner is not None:
            return self._train_batch_size_per_learner
        if self.train_batch_size is None:
            raise ValueError(
                "rollout_fragment_length='auto' needs a train batch size: set "
                ".training(train_batch_size=...) or .training(train_batch_size_per_learner=...)"
            )
        return self.train_batch_size // (self.num_learners or 1)

    @property
    def total_train_batch_size(self) -> int:
        """``train_batch_size_per_learner`` times the number of learners (at least 1)."""
        return self.train_batch_size_per_learner * (self.num_learners or 1)

    def get_rollout_fragment_length(self, worker_index: int = 0) -> int:
        """Returns the env steps per sub-env that runner ``worker_index`` samples per call.

        With ``"auto"``, the total train batch size is split over
        ``num_envs_per_env_runner * max(num_env_runners, 1)`` sub-envs; when it does not
        divide evenly, the first runners take one step more per sub-env so that the
        fragments add up to at least the batch size (RLlib's rule; values below 1 become 1).

        Args:
            worker_index: The runner's index (0 local, 1..n remote).

        Returns:
            The fragment length.

        Raises:
            ValueError: ``"auto"`` without a train batch size.
        """
        if self.rollout_fragment_length != "auto":
            return int(self.rollout_fragment_length)
        num_sub_envs = self.num_envs_per_env_runner * (self.num_env_runners or 1)
        total = self.total_train_batch_size
        base, remainder = divmod(total, num_sub_envs)
        if remainder and (worker_index - 1) * self.num_envs_per_env_runner < remainder:
            return base + 1
        return base or 1

    def build_callbacks(self) -> list[Any]:
        """Instantiates ``callbacks_class`` (each class of a list).

        Returns:
            The callbacks objects, in order.
        """
        return [cls() for cls in as_list(self.callbacks_class)]

    def callbacks_functions(self, hook: str) -> list[Callable[..., Any]]:
        """Returns the plain callables registered for one hook.

        Args:
            hook: E.g. ``"on_episode_start"``.

        Returns:
            The callables, in order (empty when none).

        Raises:
            ValueError: An unknown hook name.
        """
        if hook not in CALLBACK_NAMES:
            raise ValueError(f"unknown callback hook {hook!r}; hooks are {list(CALLBACK_NAMES)}")
        return as_list(getattr(self, f"callbacks_{hook}"))

    def make_env_creator(self, worker_index: int = 0) -> Any:
        """Returns the creator of runner ``worker_index``'s envs (see ``fastrollout.env``).

        Args:
            worker_index: The runner's index (0 local, 1..n remote).

        Returns:
            A ``fastrollout.env.EnvCreator``: ``creator(vector_index)`` returns a new env,
            checked unless ``disable_env_checking``.

        Raises:
            ValueError: No env set, or an unknown env name.
            TypeError: An env spec of the wrong type.
        """
        from fastrollout.env.registry import make_env_creator

        return make_env_creator(
            self.env,
            self.env_config,
            worker_index=worker_index,
            num_workers=self.num_env_runners,
            disable_env_checking=self.disable_env_checking,
        )

    # ---------------------------------------------------------------- validation

    def validate(self) -> None:
        """Checks the whole config, including values assigned directly to attributes.

        Raises:
            ValueError: A value out of range or inconsistent with another (the message
                names the setting and, where it applies, the module id).
            TypeError: A value of the wrong type.
        """
        if self.env is not None:
            _check_env_spec(self.env)
        if not isinstance(self.env_config, Mapping):
            raise TypeError(f"env_config must be a dict, got {type(self.env_config).__name__}")
        _check_space(self.observation_space, "observation_space")
        _check_space(self.action_space, "action_space")
        for name in (
            "normalize_actions",
            "clip_actions",
            "disable_env_checking",
            "explore",
            "episodes_to_numpy",
            "add_default_connectors_to_env_to_module_pipeline",
            "add_default_connectors_to_module_to_env_pipeline",
            "restart_failed_sub_environments",
            "restart_failed_env_runners",
            "ignore_env_runner_failures",
            "sample_async",
            "soft_horizon",
            "no_done_at_end",
            "fake_sampler",
        ):
            _check_bool(getattr(self, name), name)
        _check_int(self.num_env_runners, "num_env_runners", 0)
        _check_number(self.num_cpus_per_env_runner, "num_cpus_per_env_runner", 0)
        _check_number(self.num_gpus_per_env_runner, "num_gpus_per_env_runner", 0)
        if self.sample_timeout_s is not None:
            _check_number(self.sample_timeout_s, "sample_timeout_s", 0)
        _check_int(
            self.max_requests_in_flight_per_env_runner, "max_requests_in_flight_per_env_runner", 1
        )
        _check_int(self.max_num_env_runner_restarts, "max_num_env_runner_restarts", 0)
        _check_number(
            self.env_runner_health_probe_timeout_s, "env_runner_health_probe_timeout_s", 0
        )
        _check_int(self.num_envs_per_env_runner, "num_envs_per_env_runner", 1)
        _check_vectorize_mode(self.gym_env_vectorize_mode)
        _check_int(self.episode_lookback_horizon, "episode_lookback_horizon", 0)
        _check_int(
            self.max_sub_environment_restart_attempts, "max_sub_environment_restart_attempts", 1
        )
        _check_rollout_fragment_length(self.rollout_fragment_length)
        if self.rollout_fragment_length == "auto":
            self.get_rollout_fragment_length()  # raises when no train batch size is set
        _check_choice(self.batch_mode, "batch_mode", BATCH_MODES)
        _check_choice(self.count_steps_by, "count_steps_by", COUNT_STEPS_BY)
        _check_clip_rewards(self.clip_rewards)
        _check_compress_observations(self.compress_observations)
        _check_choice(self.observation_filter, "observation_filter", OBSERVATION_FILTERS)
        if self.episode_horizon is not None:
            _check_int(self.episode_horizon, "episode_horizon", 1)
        _check_optional_callable(self.observation_fn, "observation_fn")
        _check_optional_callable(self._env_to_module_connector, "env_to_module_connector")
        _check_optional_callable(self._module_to_env_connector, "module_to_env_connector")
        self._validate_modules()
        _check_callbacks_class(self.callbacks_class)
        for hook in CALLBACK_NAMES:
            _check_callables(getattr(self, f"callbacks_{hook}"), hook)
        if self.seed is not None:
            _check_int(self.seed, "seed", 0)
        _check_device(self.device)
        _check_int(self.metrics_num_episodes_for_smoothing, "metrics_num_episodes_for_smoothing", 1)
        _check_output(self.output)
        _check_bool(self.output_write_episodes, "output_write_episodes")
        if self.output_max_rows_per_file is not None:
            _check_int(self.output_max_rows_per_file, "output_max_rows_per_file", 1)
        if self.output_max_file_size is not None:
            _check_int(self.output_max_file_size, "output_max_file_size", 1)

    def _validate_modules(self) -> None:
        policies = _normalize_policies(self.policies)
        if not callable(self.policy_mapping_fn):
            raise TypeError("policy_mapping_fn must be callable")
        multi = _multi_spec_ids(self._rl_module_spec)
        if multi is not None and self._policies_set and set(multi) != set(policies):
            raise ValueError(
                "the MultiRLModuleSpec's module ids "
                f"{sorted(multi)} differ from .multi_agent(policies=...) {sorted(policies)}: "
                f"missing specs for {sorted(set(policies) - set(multi))}, specs without a "
                f"policy: {sorted(set(multi) - set(policies))}"
            )
        if self._rl_module_spec is not None or any(s is not None for s in policies.values()):
            # (imported here: a config without module specs never loads torch)
            from fastrollout.modules.specs import check_rl_module_spec

            check_rl_module_spec(self._rl_module_spec, policies)
        _check_policies_to_train(self.policies_to_train)
        if isinstance(self.policies_to_train, Collection) and not isinstance(
            self.policies_to_train, str
        ):
            unknown = [m for m in self.policies_to_train if m not in self.module_ids]
            if unknown:
                raise ValueError(
                    f"policies_to_train names modules {unknown} that are not configured "
                    f"(modules: {self.module_ids})"
                )

    # ---------------------------------------------------------------- dict form

    def to_dict(self) -> dict[str, Any]:
        """Returns the settings as a dict keyed by RLlib's names (values not copied).

        Returns:
            ``{"env": ..., "env_config": ..., "num_envs_per_env_runner": ..., ...}``;
            :meth:`from_dict` rebuilds an equal config.
        """
        out = {}
        for key, value in self.__dict__.items():
            if key in ("_is_frozen", "_policies_set"):
                continue
            out[key.lstrip("_")] = value
        return out

    @classmethod
    def from_dict(cls, config_dict: Mapping[str, Any]) -> RunnerConfig:
        """Builds a config from :meth:`to_dict`'s form (all keys optional).

        Args:
            config_dict: Settings keyed by name.

        Returns:
            A new, validated, unfrozen config.

        Raises:
            ValueError: An unknown key (named) or an invalid value.
        """
        config = cls()
        config.update_from_dict(config_dict)
        return config

    def update_from_dict(self, config_dict: Mapping[str, Any]) -> RunnerConfig:
        """Sets the settings named in a dict (as :meth:`to_dict` names them), then validates.

        Args:
            config_dict: Settings keyed by name.

        Returns:
            self.

        Raises:
            ValueError: An unknown key (named) or an invalid value.
        """
        known = {key.lstrip("_"): key for key in self.__dict__ if key != "_is_frozen"}
        known.pop("policies_set", None)
        unknown = [k for k in config_dict if k not in known]
        if unknown:
            raise ValueError(f"unknown RunnerConfig settings {unknown}")
        for key, value in config_dict.items():
            if key == "policies":
                self.multi_agent(policies=value)
            elif key == "env_config":
                setattr(self, known[key], dict(value or {}))
            else:
                setattr(self, known[key], value)
        self.validate()
        return self

    def __repr__(self) -> str:
        return (
            f"RunnerConfig(env={self.env!r}, num_envs_per_env_runner="
            f"{self.num_envs_per_env_runner}, batch_mode={self.batch_mode!r}, "
            f"modules={self.module_ids}{', frozen' if self._is_frozen else ''})"
        )


# -------------------------------------------------------------------- checks


def sub_env_backend(
    config: Any,
    backend: str = "shared_memory",
    *,
    num_workers: int | None = None,
    batch_size: int | None = None,
) -> Any:
    """Chooses where a runner config's sub-envs step, on any config (RLlib's too).

    RLlib's ``AlgorithmConfig`` has no such settings (it checks
    ``gym_env_vectorize_mode`` against gymnasium's modes), so an RLlib user who samples
    with ``env_runner_cls=fastrollout.SingleAgentEnvRunner`` switches the backend on
    with this function; the attributes it sets travel with the config to remote runners.

    Args:
        config: A ``RunnerConfig`` or an RLlib ``AlgorithmConfig`` (not frozen).
        backend: ``"shared_memory"`` (worker processes stepping the sub-envs in the
            background, observations in shared memory) or ``"default"``.
        num_workers: Worker processes (None: one per CPU core but the runner's own; at
            least one, at most one per sub-env).
        batch_size: Sub-envs the runner acts for per turn (None: half of them, rounded
            up; ``num_envs_per_env_runner``: lockstep).

    Returns:
        The config.

    Raises:
        ValueError: For an unknown backend or a count below 1.
        TypeError: For a count that is not an int.
    """
    _set_sub_env_backend(config, backend=backend, num_workers=num_workers, batch_size=batch_size)
    return config


def _set_sub_env_backend(config: Any, *, backend: Any, num_workers: Any, batch_size: Any) -> None:
    """Checks and sets the given sub-env backend settings (``NotProvided``: left alone)."""
    if backend is not NotProvided:
        _check_choice(backend, "sub_env_backend", SUB_ENV_BACKENDS)
        config.sub_env_backend = backend
    for name, value in (("num_sub_env_workers", num_workers), ("sub_env_batch_size", batch_size)):
        if value is not NotProvided:
            if value is not None:
                _check_int(value, name, 1)
            setattr(config, name, value)


def _deep_update(original: dict[str, Any], new: Mapping[str, Any]) -> None:
    for key, value in new.items():
        if isinstance(value, Mapping) and isinstance(original.get(key), dict):
            _deep_update(original[key], value)
        else:
            original[key] = copy.deepcopy(value)


def _check_env_spec(env: Any) -> None:
    if env is None or isinstance(env, str) or callable(env):
        return
    if isinstance(env, gym.Env):
        raise TypeError(
            f"env must be a name, a class or a creator, not an env instance "
            f"({type(env).__name__}); pass its class or a lambda ctx: ... instead"
        )
    raise TypeError(
        "env must be a gymnasium id or registered name (str), an env class or a creator "
        f"callable, got {type(env).__name__}"
    )


def _check_space(space: Any, name: str) -> None:
    if space is not None and not isinstance(space, gym.spaces.Space):
        raise TypeError(f"{name} must be a gymnasium space, got {type(space).__name__}")


def _check_bool(value: Any, name: str) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {value!r}")


def _check_output(value: Any) -> None:
    if value is not None and not isinstance(value, str | os.PathLike):
        raise TypeError(f"output must be a folder path (str or os.PathLike), got {value!r}")


def _check_int(value: Any, name: str, minimum: int) -> None:
    if not _is_int(value):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


def _check_number(value: Any, name: str, minimum: float) -> None:
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        raise TypeError(f"{name} must be a number, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


def _check_choice(value: Any, name: str, choices: Collection[str]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}, got {value!r}")


def _check_clip_rewards(value: Any) -> None:
    if value is None or isinstance(value, bool):
        return
    if not isinstance(value, numbers.Real) or not float(value) > 0:
        raise ValueError(f"clip_rewards must be None, a bool or a number > 0, got {value!r}")


def _check_compress_observations(value: Any) -> None:
    if not isinstance(value, bool) and value != "bulk":
        raise ValueError(f"compress_observations must be a bool or 'bulk', got {value!r}")


def _check_rollout_fragment_length(value: Any) -> None:
    if value == "auto":
        return
    if not _is_int(value) or value < 1:
        raise ValueError(f"rollout_fragment_length must be 'auto' or an int >= 1, got {value!r}")


def _check_vectorize_mode(value: Any) -> None:
    allowed = _vectorize_modes()
    try:
        ok = value in allowed
    except TypeError:  # unhashable
        ok = False
    if not ok:
        names = sorted(m for m in allowed if isinstance(m, str))
        raise ValueError(f"gym_env_vectorize_mode must be one of {names}, got {value!r}")


def _check_optional_callable(value: Any, name: str) -> None:
    if value is not None and not callable(value):
        raise TypeError(f"{name} must be callable or None, got {type(value).__name__}")


def _check_callbacks_class(value: Any) -> None:
    for cls in as_list(value):
        if not callable(cls):
            raise TypeError(f"callbacks_class must be a class or a list of classes, got {cls!r}")


def _check_callables(value: Any, hook: str) -> None:
    for fn in as_list(value):
        if not callable(fn):
            raise TypeError(
                f"callbacks({hook}=...) must be a callable or a list of callables, "
                f"got {type(fn).__name__}"
            )


def _check_device(device: Any) -> None:
    if type(device).__name__ == "device" and type(device).__module__ == "torch":
        return
    if isinstance(device, str):
        if device in ("auto", "cpu", "cuda"):
            return
        prefix, _, index = device.partition(":")
        if prefix == "cuda" and index.isdigit():
            return
    raise ValueError(
        f"device must be 'auto', 'cpu', 'cuda', 'cuda:N' or a torch.device, got {device!r}"
    )


def _normalize_policies(policies: Any) -> dict[str, Any]:
    """``policies`` as an ordered dict module id -> spec (None: inferred).

    The order is the modules' build order (their weights' initialization draws) and the
    order of their forward passes (their action draws). A dict or a sequence keeps its
    order; a set, whose order changes with ``PYTHONHASHSEED``, is sorted, so that a seed
    gives the same modules and episodes in every process.

    Args:
        policies: A collection of module ids, or a mapping module id -> spec.

    Returns:
        The ordered dict.

    Raises:
        TypeError: If ``policies`` is not a collection (or is a str), or an id is not a str.
        ValueError: If it names no module.
    """
    if isinstance(policies, str) or not isinstance(policies, Collection):
        raise TypeError(
            "policies must be a collection of module ids or a dict module id -> spec, got "
            f"{policies!r}"
        )
    if isinstance(policies, Mapping):
        items = dict(policies)
    else:
        for module_id in policies:
            if not isinstance(module_id, str):
                raise TypeError(f"module ids in policies must be str, got {module_id!r}")
        unordered = isinstance(policies, AbstractSet) and not isinstance(policies, KeysView)
        items = dict.fromkeys(sorted(policies) if unordered else policies)
    if not items:
        raise ValueError("policies must name at least one module")
    for module_id, spec in items.items():
        if not isinstance(module_id, str):
            raise TypeError(f"module ids in policies must be str, got {module_id!r}")
        if type(spec).__name__ == "PolicySpec":
            # RLlib's old-stack per-policy spec: its spaces/classes do not apply to modules.
            items[module_id] = None
    return items


def _check_policies_to_train(value: Any) -> Any:
    if value is None or callable(value):
        return value
    if isinstance(value, str) or not isinstance(value, Collection):
        raise TypeError(
            "policies_to_train must be a list/set/tuple of module ids, a callable "
            f"(module_id, batch) -> bool, or None; got {value!r}"
        )
    return value


def _multi_spec_ids(spec: Any) -> list[str] | None:
    """The module ids of a ``MultiRLModuleSpec`` (duck-typed), else None."""
    specs = getattr(spec, "rl_module_specs", None)
    if isinstance(specs, Mapping):
        return list(specs)
    return None
