"""``RolloutWorker``: RLlib's old-stack worker API (once ``PolicyEvaluator``) on fastrollout.

The worker samples with a :class:`~fastrollout.SingleAgentEnvRunner` (one policy) or a
:class:`~fastrollout.MultiAgentEnvRunner` (several), turns the runner's episode chunks into
a :class:`~fastrollout.batches.SampleBatch` / :class:`~fastrollout.batches.MultiAgentBatch`
with the old stack's columns, and post-processes each policy's rows as RLlib's
``PPOTorchPolicy`` does (value estimates, GAE). Each policy is a
:class:`~fastrollout.evaluation.TorchPolicy`: the full torch module and PPO's loss; the
runner acts with an inference copy, refreshed whenever the policy's weights change.

>>> import gymnasium as gym
>>> from fastrollout import RunnerConfig
>>> config = RunnerConfig().env_runners(rollout_fragment_length=8).debugging(seed=0)
>>> worker = RolloutWorker(env_creator=lambda ctx: gym.make("CartPole-v1"), config=config)
>>> batch = worker.sample()
>>> batch.count, "advantages" in batch
(8, True)
>>> worker.stop()
"""

from __future__ import annotations

import collections
import hashlib
import pathlib
import pickle
import queue
import threading
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any, NamedTuple

import numpy as np

from fastrollout.batches import (
    MultiAgentBatch,
    SampleBatch,
    concat_samples,
    episode_to_sample_batch,
)
from fastrollout.checkpoints import (
    Checkpointable,
    check_component,
    read_module_states,
    read_tree,
    write_module_states,
    write_tree,
)
from fastrollout.config import BATCH_MODES, OBSERVATION_FILTERS, RunnerConfig
from fastrollout.core import DEFAULT_MODULE_ID
from fastrollout.core.tree import as_list, tree_map
from fastrollout.env import EnvContext
from fastrollout.evaluation.env_wrappers import wrap_for_worker
from fastrollout.evaluation.filters import Filter, clip_reward, get_filters, sync_filters
from fastrollout.evaluation.observation_filters import (
    ObservationFilters,
    observation_shape,
    with_mean_std_connector,
)
from fastrollout.evaluation.policy import TorchPolicy
from fastrollout.evaluation.recurrent import add_recurrent_columns
from fastrollout.learners.ppo import PPOConfig
from fastrollout.runners.keys import WEIGHTS_SEQ_NO

__all__ = ["RolloutMetrics", "RolloutWorker"]


class RolloutMetrics(NamedTuple):
    """One finished episode's metrics (RLlib's old-stack ``RolloutMetrics`` fields)."""

    episode_length: int = 0
    episode_reward: float = 0.0
    agent_rewards: dict[Any, float] = {}  # noqa: RUF012
    custom_metrics: dict[str, Any] = {}  # noqa: RUF012
    perf_stats: dict[str, Any] = {}  # noqa: RUF012
    hist_data: dict[str, Any] = {}  # noqa: RUF012
    media: dict[str, Any] = {}  # noqa: RUF012
    episode_faulty: bool = False
    connector_metrics: dict[str, Any] = {}  # noqa: RUF012


class _IOContext(NamedTuple):
    """What input and output creators receive (RLlib's ``IOContext`` fields)."""

    log_dir: str | None
    config: Any
    worker_index: int
    worker: Any


# The keys of RLlib's old-stack model dict that fastrollout's default module takes.
_RLLIB_MODEL_KEYS = ("fcnet_hiddens", "fcnet_activation", "vf_share_layers")
# ... and those of its LSTM wrapper (use_lstm=True: fastrollout's DefaultLSTMModule).
_RLLIB_LSTM_KEYS = ("use_lstm", "max_seq_len", "lstm_cell_size")
# RLlib's PPO settings that PPOConfig has under the same names.
_RLLIB_PPO_KEYS = (
    "gamma",
    "lambda_",
    "lr",
    "clip_param",
    "vf_clip_param",
    "vf_loss_coeff",
    "entropy_coeff",
    "grad_clip",
)


def _runner_config_from_rllib(config: Any) -> tuple[RunnerConfig, PPOConfig]:
    """A RunnerConfig and PPOConfig with the settings of RLlib's old-stack AlgorithmConfig."""
    out = RunnerConfig()
    out.env_config = dict(getattr(config, "env_config", {}) or {})
    policies = getattr(config, "policies", None) or {DEFAULT_MODULE_ID: None}
    ids = sorted(policies) if isinstance(policies, set | frozenset) else list(policies)
    out.multi_agent(policies=ids)
    if getattr(config, "policy_mapping_fn", None) is not None and (
        len(ids) > 1 or ids != [DEFAULT_MODULE_ID]
    ):
        out.policy_mapping_fn = config.policy_mapping_fn
    out.policies_to_train = getattr(config, "policies_to_train", None)
    for name in (
        "num_envs_per_env_runner",
        "rollout_fragment_length",
        "batch_mode",
        "remote_worker_envs",
        "remote_env_batch_wait_ms",
        "observation_filter",
        "clip_rewards",
        "clip_actions",
        "normalize_actions",
        "compress_observations",
        "sample_async",
        "observation_fn",
        "fake_sampler",
        "seed",
        "count_steps_by",
    ):
        if hasattr(config, name):
            setattr(out, name, getattr(config, name))
    model = dict(getattr(config, "model", {}) or {})
    keys = _RLLIB_MODEL_KEYS + (_RLLIB_LSTM_KEYS if model.get("use_lstm") else ())
    out.rl_module(model_config={k: model[k] for k in keys if k in model})
    ppo = {}
    for name in _RLLIB_PPO_KEYS:
        value = getattr(config, name, None)
        if value is not None and not callable(value):
            ppo[name] = value
    return out, PPOConfig(**ppo)


class RolloutWorker(Checkpointable):
    """Collects experience from copies of an env with one or several policies.

    Args:
        env_creator: ``env_creator(env_context) -> env`` (gymnasium or multi-agent); the
            :class:`~fastrollout.env.EnvContext` carries ``worker_index``,
            ``vector_index`` and ``num_workers``.
        validate_env: Called with each new sub-env and its context (RLlib's hook).
        config: A :class:`~fastrollout.RunnerConfig` or RLlib's old-stack
            ``AlgorithmConfig``: env settings, ``num_envs_per_env_runner``,
            ``rollout_fragment_length``, ``batch_mode``, ``policies`` /
            ``policy_mapping_fn`` / ``policies_to_train``, ``observation_filter``,
            ``clip_rewards``, ``clip_actions``, ``episode_horizon``, ``soft_horizon``,
            ``no_done_at_end``, ``observation_fn``, ``compress_observations``,
            ``sample_async``, ``fake_sampler``, callbacks, ``seed``. The worker uses a copy.
        worker_index: 0 for the local worker, 1.. for remote ones.
        num_workers: The number of remote workers.
        policy_config: PPO's hyperparameters: a ``PPOConfig`` (or a dict of its fields)
            for every policy, or ``{policy_id: PPOConfig}``; taken from an RLlib config
            when one is given.
        loss_fn: The policies' loss, ``fn(module, batch, config) -> (loss, stats)``, or
            ``{policy_id: fn}`` (default: PPO's); see ``TorchPolicy``.
        loss_columns: The columns the custom loss reads (checked in ``learn_on_batch``).
        default_policy_class: Accepted for RLlib's signature; RLlib's ``PPOTorchPolicy``
            (or None) means fastrollout's PPO policy; other policy classes are refused.
        input_creator: ``fn(io_context) -> reader`` whose ``next()`` returns batches;
            ``sample()`` then reads from it instead of the envs.
        output_creator: ``fn(io_context) -> writer`` whose ``write(batch)`` receives every
            sampled batch.
        input_evaluation: Off-policy estimators (``"is"``, ``"wis"``) run on each input
            batch; their estimates appear in ``get_metrics()``'s ``custom_metrics``.
        **kwargs: RLlib's other arguments (``recreated_worker``, ``log_dir``, ``spaces``,
            ``dataset_shards``) are accepted and ignored.

    Raises:
        ValueError: An unknown ``batch_mode``, ``observation_filter`` or policy class
            (named), or an invalid config.
    """

    def __init__(
        self,
        *,
        env_creator: Callable[[Any], Any],
        validate_env: Callable[[Any, Any], None] | None = None,
        config: Any = None,
        worker_index: int = 0,
        num_workers: int | None = None,
        policy_config: PPOConfig | Mapping[str, Any] | None = None,
        loss_fn: Callable[..., Any] | Mapping[str, Callable[..., Any]] | None = None,
        loss_columns: Collection[str] | None = None,
        default_policy_class: Any = None,
        input_creator: Callable[[Any], Any] | None = None,
        output_creator: Callable[[Any], Any] | None = None,
        input_evaluation: Collection[str] | None = None,
        **kwargs: Any,
    ) -> None:
        if default_policy_class is not None and getattr(
            default_policy_class, "__name__", ""
        ) not in ("PPOTorchPolicy", "TorchPolicy"):
            raise ValueError(
                f"default_policy_class {default_policy_class!r} is not supported: fastrollout's "
                "RolloutWorker trains torch RLModules with PPO's loss (TorchPolicy)"
            )
        # What from_checkpoint builds the worker with (the config as given, copied).
        self._ctor_kwargs: dict[str, Any] = {
            "env_creator": env_creator,
            "validate_env": validate_env,
            "config": config.copy(copy_frozen=False)
            if isinstance(config, RunnerConfig)
            else config,
            "worker_index": worker_index,
            "num_workers": num_workers,
            "policy_config": policy_config,
            "loss_fn": loss_fn,
            "loss_columns": loss_columns,
            "default_policy_class": default_policy_class,
            "input_creator": input_creator,
            "output_creator": output_creator,
            "input_evaluation": input_evaluation,
            **kwargs,
        }
        config = RunnerConfig() if config is None else config
        if isinstance(config, RunnerConfig):
            config = config.copy(copy_frozen=False)
            ppo = PPOConfig()
        else:
            config, ppo = _runner_config_from_rllib(config)
        per_policy: dict[str, PPOConfig] = {}
        if isinstance(policy_config, PPOConfig):
            ppo = policy_config
        elif policy_config and all(isinstance(v, PPOConfig) for v in policy_config.values()):
            per_policy = dict(policy_config)
        elif policy_config is not None:
            ppo = PPOConfig(**dict(policy_config))
        _check_setting(getattr(config, "batch_mode", None), "batch_mode", BATCH_MODES)
        _check_setting(
            getattr(config, "observation_filter", None), "observation_filter", OBSERVATION_FILTERS
        )
        self.worker_index = int(worker_index)
        self.num_workers = int(num_workers or 0)
        self.batch_mode: str = config.batch_mode
        self.clip_rewards = config.clip_rewards
        self.no_done_at_end = bool(config.no_done_at_end)
        self.compress_observations = config.compress_observations
        self.fake_sampler = bool(config.fake_sampler)
        self.observation_filter: str = config.observation_filter
        self.global_vars: dict[str, Any] = {"timestep": 0}
        self.weights_seq_no: int | None = None
        self.env_creator = env_creator
        self.policy_map: dict[str, TorchPolicy] = {}
        self._validate_env = validate_env
        self._unroll_id = 0
        self._last_batch: SampleBatch | MultiAgentBatch | None = None
        self._metrics: list[RolloutMetrics] = []
        # Episode id -> (length, return, agent returns) of chunks returned earlier.
        self._partial: dict[str, tuple[int, float, dict[Any, float]]] = {}
        # complete_episodes: finished episodes beyond a batch's size, for the next calls.
        self._done_episodes: collections.deque[Any] = collections.deque()
        self._lock = threading.RLock()
        self._ready = False

        config.environment(env=self._make_sub_env_creator(config))
        config.compress_observations = False  # the batch is compressed, not the episodes
        if self.observation_filter == "MeanStdFilter":
            config.env_runners(
                env_to_module_connector=with_mean_std_connector(config.env_to_module_connector)
            )
        config.validate()
        self.config = config
        self._runner = self._make_runner(config)
        self._build_policies(ppo, per_policy, loss_fn, loss_columns)
        self._push_weights()
        self._filters = ObservationFilters(
            self.observation_filter,
            {pid: observation_shape(p.observation_space) for pid, p in self.policy_map.items()},
            self._filter_connector(),
        )
        # observation_fn sees the policies from now on (not during the env check).
        self._ready = True
        # on_sample_end gets the batch from the worker (the old stack's call), not the
        # runner's episodes.
        self._runner._callback_fns["on_sample_end"] = []
        io = _IOContext(kwargs.get("log_dir"), config, self.worker_index, self)
        self.input_reader = None if input_creator is None else input_creator(io)
        self.output_writer = None if output_creator is None else output_creator(io)
        self.input_evaluation = list(input_evaluation or [])
        for pid, policy in self.policy_map.items():
            self._callback("on_create_policy", policy_id=pid, policy=policy)
        self._async: _AsyncSampler | None = None
        if config.sample_async:
            self._async = _AsyncSampler(self)

    # -- construction ------------------------------------------------------------------

    def _make_sub_env_creator(self, config: RunnerConfig) -> Callable[[Any], Any]:
        user_creator = self.env_creator
        validate = self._validate_env
        horizon, soft = config.episode_horizon, bool(config.soft_horizon)
        observation_fn = config.observation_fn
        # Sub-envs in Ray actors get their creator pickled: they cannot hold the worker.
        worker = None if config.remote_worker_envs or observation_fn is None else self

        def create(ctx: EnvContext) -> Any:
            env = user_creator(ctx)
            if validate is not None:
                validate(env, ctx)
            return wrap_for_worker(
                env, horizon=horizon, soft=soft, observation_fn=observation_fn, worker=worker
            )

        return create

    def _make_runner(self, config: RunnerConfig) -> Any:
        from fastrollout.runners import MultiAgentEnvRunner, SingleAgentEnvRunner

        self.multi_agent = bool(config.is_multi_agent)
        cls = MultiAgentEnvRunner if self.multi_agent else SingleAgentEnvRunner
        return cls(config=config, worker_index=self.worker_index, num_workers=self.num_workers)

    def _build_policies(
        self,
        ppo: PPOConfig,
        per_policy: Mapping[str, PPOConfig],
        loss_fn: Callable[..., Any] | Mapping[str, Callable[..., Any]] | None,
        loss_columns: Collection[str] | None,
    ) -> None:
        import dataclasses

        from fastrollout.modules import RLModuleSpec

        modules = self._runner._module
        for given in (per_policy, loss_fn if isinstance(loss_fn, Mapping) else {}):
            unknown = sorted(set(given) - set(modules))
            if unknown:
                raise KeyError(f"no policies {unknown} (policies: {sorted(modules)})")
        for pid in modules:
            spec = RLModuleSpec.from_module(modules[pid])
            full = dataclasses.replace(spec, inference_only=False).build()
            full.to(self._runner._device)
            fn = loss_fn.get(pid) if isinstance(loss_fn, Mapping) else loss_fn
            self.policy_map[pid] = TorchPolicy(
                pid,
                full,
                per_policy.get(pid, ppo),
                loss_fn=fn,
                loss_columns=loss_columns if fn is not None else None,
            )

    def _push_weights(self, policy_ids: Iterable[str] | None = None) -> None:
        """Loads the policies' weights into the runner's acting copies."""
        ids = list(self.policy_map) if policy_ids is None else list(policy_ids)
        weights = {pid: self.policy_map[pid].model.get_state(inference_only=True) for pid in ids}
        with self._lock:
            self._runner.set_weights(weights, weights_seq_no=0)

    def _filter_connector(self) -> Any:
        from fastrollout.connectors.env_to_module.mean_std_filter import MeanStdFilter

        for piece in self._runner._connectors.env_to_module.connectors:
            if isinstance(piece, MeanStdFilter):
                return piece
        return None

    @property
    def filters(self) -> dict[str, Filter]:
        """The policies' observation filters (live: RLlib's driver merges into these)."""
        return self._filters.filters

    def _callback(self, name: str, **kwargs: Any) -> None:
        # The runner's callback objects and config functions (base-class no-ops skipped).
        for fn in self._runner._callback_list(name):
            fn(**kwargs)

    # -- properties --------------------------------------------------------------------

    @property
    def env(self) -> Any:
        """The runner's env (a gymnasium vector env, or the list of multi-agent envs)."""
        return self._runner.env

    @property
    def num_envs(self) -> int:
        """Sub-envs stepped together."""
        return int(self._runner.num_envs)

    @property
    def runner(self) -> Any:
        """The fastrollout runner that samples."""
        return self._runner

    @property
    def total_rollout_fragment_length(self) -> int:
        """Env steps per ``sample()``: ``rollout_fragment_length * num_envs``."""
        return int(self.config.get_rollout_fragment_length(self.worker_index)) * self.num_envs

    # -- sampling ----------------------------------------------------------------------

    def sample(self, **kwargs: Any) -> SampleBatch | MultiAgentBatch:
        """Samples one batch.

        ``"truncate_episodes"``: exactly ``rollout_fragment_length * num_envs`` env steps
        (each sub-env stops at its own fragment; gymnasium's ``AsyncVectorEnv`` and
        natively vectorized envs, which step all sub-envs together, may go up to
        ``num_envs - 1`` over), ongoing episodes cut and continued by the next call.
        ``"complete_episodes"``: whole episodes only, at least that many steps. With an
        ``input_creator``, the reader's next batches instead.

        Returns:
            A ``SampleBatch`` (one policy, ``default_policy``) or a ``MultiAgentBatch``,
            post-processed (``vf_preds``, ``advantages``, ``value_targets``).
        """
        if self.fake_sampler and self._last_batch is not None:
            return self._last_batch
        batch = self._async.get() if self._async is not None else self._sample_now()
        if self.fake_sampler:
            self._last_batch = batch
        return batch

    def sample_with_count(self) -> tuple[SampleBatch | MultiAgentBatch, int]:
        """Samples one batch; returns it with its env-step count."""
        batch = self.sample()
        return batch, batch.env_steps()

    def _sample_now(self) -> SampleBatch | MultiAgentBatch:
        with self._lock:
            if self.input_reader is not None:
                batch = self._read_input()
            else:
                self._filters.before_sample()
                try:
                    episodes = self._collect()
                finally:
                    self._filters.after_sample()
                batch = self._to_batch(episodes)
        self._callback("on_sample_end", worker=self, samples=batch)
        if self.output_writer is not None:
            self.output_writer.write(batch)
        if self.compress_observations:
            batch.compress(
                bulk=self.compress_observations == "bulk",
                columns={SampleBatch.OBS, SampleBatch.NEXT_OBS},
            )
        return batch

    def _collect(self) -> list[Any]:
        target = self.total_rollout_fragment_length
        if self.batch_mode == "truncate_episodes":
            runner = self._runner
            if not runner._multi_agent and runner._sub_envs.steps_subsets:
                # Each sub-env stops at its own fragment: exactly the old stack's count.
                fragment = target // self.num_envs
                return list(runner.sample_fragments(fragment))
            # (Multi-agent lists reset a done sub-env at once: each turn steps every
            # sub-env once, so the count is exact too; sub-envs that step only all
            # together may go up to num_envs - 1 steps over.)
            return list(runner.sample(num_timesteps=target))
        episodes: list[Any] = []
        steps = 0
        # As RLlib: episodes until the batch reaches its size, the rest kept for later.
        while steps < target:
            if not self._done_episodes:
                self._done_episodes.extend(self._runner.sample(num_episodes=self.num_envs))
            episode = self._done_episodes.popleft()
            episodes.append(episode)
            steps += len(episode)
        return episodes

    def _read_input(self) -> SampleBatch | MultiAgentBatch:
        assert self.input_reader is not None
        batches = [self.input_reader.next()]
        while sum(b.count for b in batches) < self.total_rollout_fragment_length:
            batches.append(self.input_reader.next())
        batch = concat_samples(batches)
        if self.input_evaluation:
            self._estimate(batch)
        return batch

    def _estimate(self, batch: Any) -> None:
        from fastrollout.evaluation.io import batch_to_episodes
        from fastrollout.offline import estimate

        policy = self.policy_map[DEFAULT_MODULE_ID]
        estimates = estimate(
            batch_to_episodes(batch),
            policy.model,
            self.input_evaluation,
            gamma=policy.config.gamma,
        )
        self._metrics.append(RolloutMetrics(custom_metrics={"off_policy_estimation": estimates}))

    # -- batches -----------------------------------------------------------------------

    def _to_batch(self, episodes: list[Any]) -> SampleBatch | MultiAgentBatch:
        per_policy: dict[str, list[SampleBatch]] = collections.defaultdict(list)
        env_steps = 0
        for episode in episodes:
            env_steps += len(episode)
            self._record_metrics(episode)
            agents = episode.agent_episodes if self.multi_agent else {None: episode}
            for agent_index, chunk in enumerate(agents.values()):
                if len(chunk) == 0:
                    continue
                pid = chunk.module_id if self.multi_agent else DEFAULT_MODULE_ID
                part = episode_to_sample_batch(
                    chunk,
                    unroll_id=self._unroll_id,
                    agent_index=agent_index,
                    eps_id=_int_episode_id(episode.id_),
                )
                # The runner's per-step record of the weights' version: no old-stack column.
                part.pop(WEIGHTS_SEQ_NO, None)
                policy = self.policy_map[pid]
                if policy.is_recurrent():
                    add_recurrent_columns(
                        part, chunk, policy.initial_state, policy.max_seq_len, policy_id=pid
                    )
                self._unroll_id += 1
                per_policy[pid].append(part)
        batches = {pid: self._policy_batch(pid, parts) for pid, parts in per_policy.items()}
        if not self.multi_agent:
            return batches.get(DEFAULT_MODULE_ID) or SampleBatch()
        return MultiAgentBatch(batches, env_steps)

    def _policy_batch(self, pid: str, parts: list[SampleBatch]) -> SampleBatch:
        ends = np.cumsum([p.count for p in parts])
        batch = concat_samples(parts)
        assert isinstance(batch, SampleBatch)
        if self.clip_rewards:
            batch[SampleBatch.REWARDS] = clip_reward(
                batch[SampleBatch.REWARDS], self.clip_rewards
            ).astype(np.float32, copy=False)
        if self.no_done_at_end:
            batch[SampleBatch.TERMINATEDS] = np.zeros(batch.count, dtype=bool)
        policy = self.policy_map[pid]
        policy.postprocess(batch, ends)
        batch.num_grad_updates = float(policy.num_grad_updates)
        if policy.is_recurrent():
            batch.max_seq_len = policy.max_seq_len
        return batch

    def _record_metrics(self, episode: Any) -> None:
        length, ret, agents = self._partial.pop(episode.id_, (0, 0.0, {}))
        length += len(episode)
        ret += float(episode.get_return())
        if self.multi_agent:
            agents = dict(agents)
            for aid, chunk in episode.agent_episodes.items():
                key = (aid, chunk.module_id)
                agents[key] = agents.get(key, 0.0) + float(np.sum(chunk.get_rewards()))
        if episode.is_done:
            self._metrics.append(
                RolloutMetrics(episode_length=length, episode_reward=ret, agent_rewards=agents)
            )
        else:
            self._partial[episode.id_] = (length, ret, agents)

    # -- learning ----------------------------------------------------------------------

    def _policy_batches(self, batch: Any) -> dict[str, SampleBatch]:
        if isinstance(batch, MultiAgentBatch):
            return dict(batch.policy_batches)
        return {DEFAULT_MODULE_ID: batch}

    def _check_policy(self, pid: str, what: str) -> TorchPolicy:
        policy = self.policy_map.get(pid)
        if policy is None:
            raise KeyError(f"{what}: no policy {pid!r} (policies: {sorted(self.policy_map)})")
        return policy

    def _trains(self, pid: str, batch: Any = None) -> bool:
        rule = self.config.policies_to_train
        if rule is None:
            return True
        if callable(rule):
            return bool(rule(pid, batch))
        return pid in rule

    def learn_on_batch(self, samples: SampleBatch | MultiAgentBatch) -> dict[str, Any]:
        """One gradient step per trainable policy on its rows of ``samples``.

        Args:
            samples: A post-processed batch (from ``sample()``).

        Returns:
            ``{policy_id: info}`` with RLlib's keys (``learner_stats``, ...).

        Raises:
            KeyError: A batch of an unknown policy, or one without the loss's columns.
        """
        info = {}
        for pid, batch in self._policy_batches(samples).items():
            policy = self._check_policy(pid, "learn_on_batch")
            if not self._trains(pid, samples):
                continue
            info[pid] = policy.learn_on_batch(batch)
            self._callback("on_learn_on_batch", policy=policy, train_batch=batch, result=info[pid])
        self._push_weights(info)
        return info

    def sample_and_learn(
        self,
        expected_batch_size: int | None = None,
        num_sgd_iter: int = 1,
        sgd_minibatch_size: int | None = None,
        standardize_fields: Collection[str] = ("advantages",),
    ) -> tuple[dict[str, Any], int]:
        """Samples a batch and learns on it (RLlib's signature).

        Args:
            expected_batch_size: Unused (the config sets the batch size).
            num_sgd_iter: Passes over the batch.
            sgd_minibatch_size: Rows per gradient step (None: the whole batch).
            standardize_fields: Columns scaled to mean 0, std 1 first.

        Returns:
            ``(info, count)``: the last step's info per policy and the batch's env steps.
        """
        batch = self.sample()
        info: dict[str, Any] = {}
        for _ in range(num_sgd_iter):
            for pid, policy_batch in self._policy_batches(batch).items():
                for mb in _minibatches(policy_batch, sgd_minibatch_size, standardize_fields):
                    info.update(self.learn_on_batch(MultiAgentBatch({pid: mb}, mb.count)))
        return info, batch.env_steps()

    def compute_gradients(
        self, samples: SampleBatch | MultiAgentBatch, single_agent: bool | None = None
    ) -> tuple[Any, Any]:
        """PPO's gradients per trainable policy (not applied).

        Args:
            samples: A post-processed batch.
            single_agent: Return one policy's ``(grads, info)`` (default: when
                ``samples`` is a ``SampleBatch``).

        Returns:
            ``(grads, info)``; for several policies ``({pid: grads}, {pid: info})``.
        """
        grads, infos = {}, {}
        for pid, batch in self._policy_batches(samples).items():
            policy = self._check_policy(pid, "compute_gradients")
            if self._trains(pid, samples):
                grads[pid], infos[pid] = policy.compute_gradients(batch)
        if single_agent is None:
            single_agent = isinstance(samples, SampleBatch)
        if single_agent:
            return grads.get(DEFAULT_MODULE_ID), infos.get(DEFAULT_MODULE_ID, {})
        return grads, infos

    def apply_gradients(self, grads: Any) -> None:
        """Applies gradients: ``{policy_id: grads}``, or one list for ``default_policy``.

        Raises:
            KeyError: Gradients for an unknown policy.
        """
        per_policy = grads if isinstance(grads, Mapping) else {DEFAULT_MODULE_ID: grads}
        for pid, g in per_policy.items():
            self._check_policy(pid, "apply_gradients").apply_gradients(g)
        self._push_weights(per_policy)

    # -- weights, global vars, filters ---------------------------------------------------

    def get_weights(
        self, policies: Collection[str] | None = None, inference_only: bool = False
    ) -> dict[str, Any]:
        """The policies' weights, ``{policy_id: {name: array}}``.

        Args:
            policies: Only these ids (None: all).
            inference_only: Only what acting needs.
        """
        ids = list(self.policy_map) if policies is None else as_list(policies)
        return {
            pid: self._check_policy(pid, "get_weights").model.get_state(
                inference_only=inference_only
            )
            for pid in ids
        }

    def set_weights(
        self,
        weights: Mapping[str, Any],
        global_vars: Mapping[str, Any] | None = None,
        weights_seq_no: int | None = None,
    ) -> None:
        """Loads ``{policy_id: weights}`` unless ``weights_seq_no`` equals the current one.

        Args:
            weights: The weights by policy id (Ray object refs are fetched).
            global_vars: Passed to :meth:`set_global_vars`.
            weights_seq_no: The weights' version (None: always load).

        Raises:
            KeyError: Weights for an unknown policy (RLlib logs and skips them).
        """
        if weights_seq_no is None or weights_seq_no != self.weights_seq_no:
            weights = _fetch_refs(weights)
            for pid in weights:
                self._check_policy(pid, "set_weights")
            for pid, w in weights.items():
                self.policy_map[pid].set_weights(w)
            self._push_weights(weights)
        self.weights_seq_no = weights_seq_no
        if global_vars:
            self.set_global_vars(global_vars)

    def get_global_vars(self) -> dict[str, Any]:
        """RLlib's global variables (``timestep``, ...)."""
        return dict(self.global_vars)

    def set_global_vars(
        self,
        global_vars: Mapping[str, Any],
        policy_ids: Collection[str] | None = None,
    ) -> None:
        """Updates the global variables and passes them to the policies.

        Args:
            global_vars: ``{"timestep": n, ...}``.
            policy_ids: Only these policies (None: all).
        """
        self.global_vars.update(global_vars)
        for pid in list(self.policy_map) if policy_ids is None else as_list(policy_ids):
            self._check_policy(pid, "set_global_vars").on_global_var_update(self.global_vars)

    def get_filters(self, flush_after: bool = False) -> dict[str, Filter]:
        """Copies of the observation filters, ``{policy_id: filter}``.

        A ``MeanStdFilter``'s ``running_stats`` hold everything it normalised with
        (synchronised statistics included), its ``buffer`` what this worker saw since
        the last flush.

        Args:
            flush_after: Empty the buffers afterwards.
        """
        with self._lock:
            return get_filters(self._filters.filters, flush_after=flush_after)

    def sync_filters(self, new_filters: Mapping[str, Filter]) -> None:
        """Copies each policy's filter state from ``new_filters`` (RLlib's ``sync``).

        ``fastrollout.evaluation.filters.synchronize`` sends filters with empty buffers, so a
        worker's buffer then holds only what it sees afterwards.

        Raises:
            KeyError: ``new_filters`` lacks one of the worker's policies (named).
        """
        with self._lock:
            sync_filters(self._filters.filters, new_filters)

    # -- policies and envs ---------------------------------------------------------------

    def get_policy(self, policy_id: str = DEFAULT_MODULE_ID) -> TorchPolicy | None:
        """The policy of ``policy_id`` (None if there is none, as RLlib)."""
        return self.policy_map.get(policy_id)

    def for_policy(
        self, func: Callable[..., Any], policy_id: str = DEFAULT_MODULE_ID, **kwargs: Any
    ) -> Any:
        """``func(policy, **kwargs)`` for one policy.

        Raises:
            KeyError: An unknown policy id.
        """
        return func(self._check_policy(policy_id, "for_policy"), **kwargs)

    def foreach_policy(self, func: Callable[..., Any], **kwargs: Any) -> list[Any]:
        """``func(policy, policy_id, **kwargs)`` for every policy."""
        return [func(p, pid, **kwargs) for pid, p in self.policy_map.items()]

    def foreach_policy_to_train(self, func: Callable[..., Any], **kwargs: Any) -> list[Any]:
        """``func(policy, policy_id, **kwargs)`` for every policy in ``policies_to_train``."""
        return [func(p, pid, **kwargs) for pid, p in self.policy_map.items() if self._trains(pid)]

    foreach_trainable_policy = foreach_policy_to_train

    def get_policies_to_train(self) -> set[str]:
        """The ids of the policies ``learn_on_batch`` trains."""
        return {pid for pid in self.policy_map if self._trains(pid)}

    def _sub_envs(self) -> list[Any]:
        sub_envs = self._runner._sub_envs
        envs = [sub_envs.sub_env(i) for i in range(self.num_envs)]
        if any(e is None for e in envs):
            raise NotImplementedError(
                "foreach_env needs sub-envs in this process (gym_env_vectorize_mode='sync', "
                "remote_worker_envs=False)"
            )
        return envs

    def foreach_env(self, func: Callable[[Any], Any]) -> list[Any]:
        """``func(sub_env)`` for every sub-env, in order.

        Raises:
            NotImplementedError: The sub-envs are in other processes.
        """
        return [func(e) for e in self._sub_envs()]

    def foreach_env_with_context(self, func: Callable[[Any, EnvContext], Any]) -> list[Any]:
        """``func(sub_env, env_context)`` for every sub-env (``vector_index`` set).

        Raises:
            NotImplementedError: The sub-envs are in other processes.
        """
        out = []
        for i, env in enumerate(self._sub_envs()):
            ctx = EnvContext(
                dict(self.config.env_config),
                worker_index=self.worker_index,
                vector_index=i,
                num_workers=self.num_workers,
            )
            out.append(func(env, ctx))
        return out

    def get_spaces(self) -> dict[str, tuple[Any, Any]]:
        """``{policy_id: (observation_space, action_space)}``."""
        return {pid: (p.observation_space, p.action_space) for pid, p in self.policy_map.items()}

    # -- metrics, state, checkpoints -----------------------------------------------------

    def get_metrics(self) -> list[RolloutMetrics]:
        """The episodes finished since the last call, as ``RolloutMetrics``."""
        out, self._metrics = self._metrics, []
        return out

    def get_state(
        self,
        components: str | Collection[str] | None = None,
        *,
        not_components: str | Collection[str] | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """Policies (weights, optimizer, counters), filters and global vars, as plain data.

        The filters' buffers are flushed, as RLlib's ``get_state`` does.

        Args:
            components: Only these of ``"policy_states"``, ``"filters"``,
                ``"global_vars"`` (``"policy_ids"`` is always there).
            not_components: Leave these out.
            **kwargs: Ignored.

        Returns:
            ``{"policy_ids", "policy_states", "filters", "global_vars"}``.
        """
        state: dict[str, Any] = {"policy_ids": list(self.policy_map)}
        if check_component("policy_states", components, not_components):
            state["policy_states"] = {pid: p.get_state() for pid, p in self.policy_map.items()}
        if check_component("filters", components, not_components):
            filters = self.get_filters(flush_after=True)
            state["filters"] = {pid: f.get_state() for pid, f in filters.items()}
        if check_component("global_vars", components, not_components):
            state["global_vars"] = dict(self.global_vars)
        return state

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Restores :meth:`get_state`'s output (the parts it has).

        Raises:
            KeyError: A state of a policy this worker does not have.
        """
        from fastrollout.evaluation.filters import filter_from_state

        policy_states = state.get("policy_states", {})
        for pid, policy_state in policy_states.items():
            self._check_policy(pid, "set_state").set_state(policy_state)
        if policy_states:
            self._push_weights(policy_states)
        filters = {pid: filter_from_state(s) for pid, s in state.get("filters", {}).items()}
        if filters:
            self.sync_filters(filters)
        self.global_vars = dict(state.get("global_vars", self.global_vars))

    # -- checkpoints (fastrollout.checkpoints.Checkpointable) ---------------------------

    def get_ctor_args_and_kwargs(self) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The constructor's arguments as given (the env creator must pickle).

        Returns:
            ``((), kwargs)``.
        """
        return (), dict(self._ctor_kwargs)

    def get_checkpointable_components(self) -> list[tuple[str, Any]]:
        """The policies (weights as ``.npz``, optimizer states) and the filters.

        Returns:
            ``[("policy_states", policy map), ("filters", filters)]``.
        """
        return [("policy_states", self.policy_map), ("filters", self._filters)]

    def _write_component(self, name: str, state: Any, path: pathlib.Path) -> str:
        """Policy weights as one ``.npz`` per policy, the rest as a state tree."""
        if name != "policy_states":
            return super()._write_component(name, state, path)
        write_module_states(path, {pid: s["weights"] for pid, s in state.items()})
        rest = {pid: {k: v for k, v in s.items() if k != "weights"} for pid, s in state.items()}
        return write_tree(path, self.STATE_FILE_NAME, rest)

    def _read_component(self, name: str, path: pathlib.Path) -> Any:
        """Reads what :meth:`_write_component` wrote."""
        if name != "policy_states":
            return super()._read_component(name, path)
        weights = read_module_states(path)
        rest = read_tree(path, self.STATE_FILE_NAME)
        return {pid: {"weights": w, **rest.get(pid, {})} for pid, w in weights.items()}

    def save(self) -> bytes:
        """The worker's state, pickled (RLlib's old ``save``)."""
        return pickle.dumps(self.get_state())

    def restore(self, objs: bytes) -> None:
        """Restores a state from :meth:`save`."""
        self.set_state(pickle.loads(objs))

    def export_policy_model(
        self,
        export_dir: str | pathlib.Path,
        policy_id: str = DEFAULT_MODULE_ID,
        onnx: int | None = None,
    ) -> pathlib.Path:
        """Writes one policy's module as TorchScript (or ONNX) that runs without fastrollout.

        Args:
            export_dir: The folder.
            policy_id: The policy.
            onnx: An ONNX opset version; None for TorchScript.

        Returns:
            The model file.

        Raises:
            KeyError: An unknown policy id.
        """
        return self._check_policy(policy_id, "export_policy_model").export_model(
            export_dir, onnx=onnx
        )

    def export_policy_checkpoint(
        self, export_dir: str | pathlib.Path, policy_id: str = DEFAULT_MODULE_ID
    ) -> pathlib.Path:
        """Writes one policy's state and its module's description to ``export_dir``.

        Args:
            export_dir: The folder (created if missing).
            policy_id: The policy.

        Returns:
            The folder; ``policy_state.pkl`` in it restores with :meth:`set_state`.

        Raises:
            KeyError: An unknown policy id.
        """
        policy = self._check_policy(policy_id, "export_policy_checkpoint")
        path = pathlib.Path(export_dir)
        path.mkdir(parents=True, exist_ok=True)
        state = {
            "policy_id": policy_id,
            "policy_state": policy.get_state(),
            "module_class": type(policy.model).__qualname__,
            "observation_space": policy.observation_space,
            "action_space": policy.action_space,
        }
        with open(path / "policy_state.pkl", "wb") as f:
            pickle.dump(state, f)
        return path

    def stop(self) -> None:
        """Stops the background sampler (if any) and closes the envs."""
        if self._async is not None:
            self._async.stop()
        with self._lock:
            self._runner.stop()
        close = getattr(self.output_writer, "close", None)
        if close is not None:
            close()

    @classmethod
    def as_remote(
        cls,
        num_cpus: float | None = None,
        num_gpus: float | None = None,
        memory: float | None = None,
        resources: dict[str, float] | None = None,
    ) -> Any:
        """The worker class as a Ray actor class with the given resources.

        Raises:
            ImportError: Without ray (``pip install 'fastrollout[ray]'``).
        """
        from fastrollout.runners.ray_host import require_ray

        ray = require_ray("RolloutWorker.as_remote")
        options: dict[str, Any] = {
            "num_cpus": num_cpus,
            "num_gpus": num_gpus,
            "memory": memory,
            "resources": resources,
        }
        return ray.remote(**{k: v for k, v in options.items() if v is not None})(cls)

    def apply(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``func(self, *args, **kwargs)`` (for remote workers)."""
        return func(self, *args, **kwargs)

    def assert_healthy(self) -> None:
        """Raises if the worker cannot sample (no envs and no input)."""
        if self.input_reader is None and self._runner.env is None:
            raise RuntimeError("RolloutWorker has no envs and no input reader")

    def ping(self) -> str:
        """``"pong"`` (a health check for remote workers)."""
        return "pong"


class _AsyncSampler:
    """Samples the next batch in a background thread, at most one batch ahead."""

    def __init__(self, worker: RolloutWorker) -> None:
        self._worker = worker
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=1)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="RolloutWorker-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                item: Any = self._worker._sample_now()
            except BaseException as err:  # handed to the caller of sample()
                item = err
            while not self._stop.is_set():
                try:
                    self._queue.put(item, timeout=0.1)
                    break
                except queue.Full:
                    continue
            if isinstance(item, BaseException):
                return

    def get(self) -> Any:
        item = self._queue.get()
        if isinstance(item, BaseException):
            raise RuntimeError("the background sampler failed") from item
        return item

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


def _int_episode_id(episode_id: str) -> int:
    """A stable non-negative int64 for an episode id (RLlib's ``eps_id`` dtype)."""
    digest = hashlib.blake2b(str(episode_id).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def _check_setting(value: Any, name: str, choices: Collection[str]) -> None:
    if value not in choices:
        raise ValueError(f"unknown {name} {value!r}; expected one of {', '.join(choices)}")


def _fetch_refs(weights: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(weights)
    refs = [pid for pid, w in out.items() if type(w).__name__ == "ObjectRef"]
    if refs:
        import ray

        for pid, w in zip(refs, ray.get([out[pid] for pid in refs]), strict=True):
            out[pid] = w
    return out


def _minibatches(
    batch: SampleBatch, size: int | None, standardize: Collection[str]
) -> Iterable[SampleBatch]:
    batch = batch.copy(shallow=True)
    for key in standardize:
        if key in batch:
            x = np.asarray(batch[key], dtype=np.float32)
            batch[key] = (x - x.mean()) / max(float(x.std()), 1e-4)
    if not size or size >= batch.count:
        yield batch
        return
    if SampleBatch.SEQ_LENS in batch:
        # A recurrent policy's rows stay in their sequences: whole sequences, shuffled,
        # about ``size`` rows per minibatch (RLlib's old stack does the same).
        yield from _sequence_minibatches(batch, size)
        return
    shuffled = batch.shuffle()
    for start in range(0, shuffled.count - size + 1, size):
        yield shuffled.slice(start, start + size)


def _sequence_minibatches(batch: SampleBatch, size: int) -> Iterable[SampleBatch]:
    """Minibatches of whole sequences (random order), each of at least ``size`` rows.

    The sequences left over after the last full minibatch are dropped, as the row-wise
    minibatches drop their remainder.
    """
    seq_lens = np.asarray(batch[SampleBatch.SEQ_LENS])
    starts = np.cumsum(seq_lens) - seq_lens
    order = np.random.permutation(len(seq_lens))
    chosen: list[int] = []
    rows = 0
    for s in order.tolist():
        chosen.append(s)
        rows += int(seq_lens[s])
        if rows >= size:
            yield _take_sequences(batch, np.array(chosen), starts, seq_lens)
            chosen, rows = [], 0


def _take_sequences(
    batch: SampleBatch, seqs: np.ndarray, starts: np.ndarray, seq_lens: np.ndarray
) -> SampleBatch:
    """The batch of the given sequences, in that order (rows, ``state_in_*``, ``seq_lens``)."""
    lens = seq_lens[seqs]
    rows = np.repeat(starts[seqs] - np.cumsum(lens) + lens, lens) + np.arange(int(lens.sum()))
    data: dict[str, Any] = {}
    for key, value in batch.items():
        if key == SampleBatch.SEQ_LENS:
            data[key] = lens
        elif key.startswith("state_in_"):
            data[key] = np.asarray(value)[seqs]
        elif isinstance(value, list):
            data[key] = [value[i] for i in rows]
        else:
            data[key] = tree_map(lambda x: x[rows], value)
    out = SampleBatch(data, _num_grad_updates=batch.num_grad_updates)
    out.max_seq_len = batch.max_seq_len
    return out
