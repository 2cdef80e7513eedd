"""``EnvRunnerGroup``: a local runner plus ``num_env_runners`` runners in Ray actors.

RLlib 2.60's ``EnvRunnerGroup`` API (method names, arguments and semantics where RLlib has
them) for trainers that drive runners themselves, without RLlib's ``Algorithm``:

>>> group = EnvRunnerGroup(config=config)            # doctest: +SKIP
>>> episodes = group.sample(num_timesteps=4000)       # doctest: +SKIP
>>> group.sync_weights(from_worker_or_learner_group=learner)  # doctest: +SKIP
>>> group.sync_env_runner_states()                    # doctest: +SKIP
>>> metrics = group.get_metrics()                     # doctest: +SKIP

The remote runners are Ray actors (``num_cpus_per_env_runner``,
``num_gpus_per_env_runner``); every call goes through Ray (``ray.put``, ``ray.wait``). Ray is
an optional extra: a group with ``num_env_runners=0`` samples in the local runner and never
imports it.

Fault tolerance (``config.fault_tolerance(restart_failed_env_runners=...,
max_num_env_runner_restarts=..., ignore_env_runner_failures=...)``, RLlib's settings and
defaults): a runner whose actor dies (or whose call raises) is taken out of service and Ray
restarts its actor; the group pings it, sends it the group's latest state (the weights at
the latest ``weights_seq_no`` and the merged connector states) and only then lets it sample
again. Calls return what the healthy runners produced instead of raising.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fastrollout.checkpoints import Checkpointable, check_component, subcomponents
from fastrollout.core import DEFAULT_MODULE_ID
from fastrollout.metrics import MetricsLogger
from fastrollout.modules import MultiRLModule, RLModule
from fastrollout.runners import keys
from fastrollout.runners.env_runner import EnvRunner
from fastrollout.runners.ray_host import NeedsState, RunnerHost, require_ray

__all__ = ["EnvRunnerGroup", "split_count"]

logger = logging.getLogger(__name__)

#: The group's component in its state and checkpoints: the local runner (RLlib's name).
COMPONENT_ENV_RUNNER = "env_runner"

_CONNECTOR_COMPONENTS = (
    keys.COMPONENT_ENV_TO_MODULE_CONNECTOR,
    keys.COMPONENT_MODULE_TO_ENV_CONNECTOR,
)


class _FromConfig:
    """Marks a timeout argument that defaults to the config's value."""

    def __repr__(self) -> str:
        return "<from config>"


_FROM_CONFIG: Any = _FromConfig()


def split_count(total: int, parts: int) -> list[int]:
    """Splits ``total`` into ``parts`` shares that differ by at most one, larger ones first.

    Args:
        total: The count to split (>= 0).
        parts: The number of shares (>= 1).

    Returns:
        The shares; they add up to ``total``.

    >>> split_count(10, 3)
    [4, 3, 3]
    """
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


@dataclass
class _Remote:
    """What the group knows about one remote runner."""

    handle: Any
    healthy: bool = True
    # Permanently gone (Ray will not restart it): no more probes.
    dead: bool = False
    # A sample request of an earlier call that timed out; its episodes come with the next
    # call, and the runner gets no new sample request until then.
    pending_sample: Any = None
    # An outstanding health probe (RunnerHost.process_id) while unhealthy.
    probe: Any = None
    # The id of the runner's process, as its last restore answered (None: unknown).
    pid: int | None = None
    # The process ended with ray.kill after a call raised in it: its answers to probes
    # do not count (the kill takes effect a moment later).
    stale_pid: int | None = None


class EnvRunnerGroup(Checkpointable):
    """A local env runner plus ``num_env_runners`` remote runners (Ray actors).

    With remote runners, ``sample`` runs on them in parallel and the local runner does not
    sample (as RLlib's ``synchronous_parallel_sample``); it holds the group's reference
    state (the latest weights and merged connector states) that restarted runners get.
    With ``num_env_runners=0`` the local runner samples and Ray is not needed.

    Args:
        config: A ``fastrollout.RunnerConfig`` (copied and frozen; validated).
            ``env_runners(num_env_runners=..., num_cpus_per_env_runner=...,
            num_gpus_per_env_runner=..., sample_timeout_s=...,
            max_requests_in_flight_per_env_runner=...)`` and ``fault_tolerance(...)``
            configure the group; ``env_runner_cls`` the runners (default: the
            multi-agent runner if ``is_multi_agent`` or the env is a ``MultiAgentEnv``
            class, else the single-agent one).
        num_env_runners: Overrides ``config.num_env_runners``.

    Raises:
        ImportError: If remote runners are asked for and Ray is not installed (the message
            names the ``fastrollout[ray]`` extra).
        ValueError: If the config is invalid, or the Ray cluster has fewer CPUs/GPUs in
            total than the remote runners ask for.
        RuntimeError: If a remote runner fails to start.
    """

    def __init__(self, *, config: Any, num_env_runners: int | None = None) -> None:
        config = config.copy(copy_frozen=False)
        if num_env_runners is not None:
            config.env_runners(num_env_runners=num_env_runners)
        config.validate()
        config.freeze()
        self.config = config
        n = int(config.num_env_runners)
        self.env_runner_cls: type = config.env_runner_cls or _default_runner_cls(config)
        self._ray: Any = require_ray(f"EnvRunnerGroup with {n} remote env runners") if n else None
        self._restart = bool(config.restart_failed_env_runners)
        # RLlib: failures are tolerated when runners are restarted or failures ignored.
        self._fault_tolerant = self._restart or bool(config.ignore_env_runner_failures)
        self._remotes: dict[int, _Remote] = {}
        self._async_reqs: dict[Any, tuple[int, str | None]] = {}
        # Fire-and-forget calls (state pushes) whose errors are looked at later.
        self._unchecked: dict[Any, int] = {}
        self._pending_metrics: dict[Any, int] = {}
        self._restored_since_probe: list[int] = []
        self._num_restored = 0
        self._weights_seq_no = 0
        self._stopped = False
        self._config_ref: Any = None
        self.metrics = MetricsLogger(root=True)
        # The local runner first: a config error surfaces here, in the driver, with its
        # own exception type.
        self._local: EnvRunner = self.env_runner_cls(config=config, worker_index=0, num_workers=n)
        if n:
            try:
                self._start_remotes(n)
            except BaseException:
                self.stop()
                raise

    # ------------------------------------------------------------------ set-up

    def _start_remotes(self, n: int) -> None:
        ray = self._ray
        cfg = self.config
        _check_cluster_resources(ray, n, cfg.num_cpus_per_env_runner, cfg.num_gpus_per_env_runner)
        actor_cls = ray.remote(
            num_cpus=cfg.num_cpus_per_env_runner,
            num_gpus=cfg.num_gpus_per_env_runner,
            max_restarts=int(cfg.max_num_env_runner_restarts) if self._restart else 0,
            # Never re-run a call on a restarted actor: it would sample before the group
            # has sent it the latest state.
            max_task_retries=0,
        )(RunnerHost)
        registered = _registered_envs(cfg.env)
        # Ray restarts an actor with its constructor's arguments. Small ones travel inside
        # the actor's creation task, which Ray keeps for restarts; large ones would go to
        # the object store (Ray then logs an error that a restart may find them gone), so
        # those the group puts there itself, once for all actors, and keeps referenced.
        args: tuple[Any, Any] = (cfg, registered)
        if _pickled_size(args) > _INLINE_ARGS_LIMIT:
            self._config_ref = args = (ray.put(cfg), ray.put(registered))
        for index in range(1, n + 1):
            handle = actor_cls.remote(self.env_runner_cls, args[0], index, n, args[1])
            self._remotes[index] = _Remote(handle)
        # Every runner starts from the local runner's state, so all act with the same
        # policy (each runner seeds its module apart) and may then sample (RunnerHost).
        # Its weights_seq_no 0 is a forced load that keeps the runners' number at 0.
        state_ref = ray.put(self._local.get_state())
        calls = {r.handle.restore.remote(state_ref): i for i, r in self._remotes.items()}
        while calls:
            # Actors wait for free CPUs/GPUs as long as it takes (as in RLlib); say so
            # every 30 s instead of waiting silently.
            ready, _ = ray.wait(list(calls), num_returns=len(calls), timeout=30.0)
            if len(ready) < len(calls):
                logger.warning(
                    "EnvRunnerGroup: %d of %d remote env runners not started after 30 s; "
                    "each needs %g CPUs and %g GPUs, Ray has %s available",
                    len(calls),
                    n,
                    cfg.num_cpus_per_env_runner,
                    cfg.num_gpus_per_env_runner,
                    ray.available_resources(),
                )
            for ref in ready:
                index = calls.pop(ref)
                try:
                    self._remotes[index].pid = ray.get(ref)
                except ray.exceptions.RayError as err:
                    raise RuntimeError(f"remote env runner {index} failed to start: {err}") from err

    # ------------------------------------------------------------------ properties

    @property
    def local_env_runner(self) -> EnvRunner:
        """The local runner (worker index 0)."""
        return self._local

    @property
    def weights_seq_no(self) -> int:
        """The sequence number of the weights last sent by ``sync_weights``."""
        return self._weights_seq_no

    def healthy_env_runner_ids(self) -> list[int]:
        """The ids (worker indices, from 1) of the remote runners in service.

        Returns:
            The ids, ascending.
        """
        return [i for i, r in self._remotes.items() if r.healthy]

    def healthy_worker_ids(self) -> list[int]:
        """Old name of :meth:`healthy_env_runner_ids` (as in RLlib).

        Returns:
            The ids.
        """
        return self.healthy_env_runner_ids()

    def num_remote_env_runners(self) -> int:
        """The number of remote runners, healthy or not.

        Returns:
            The number.
        """
        return len(self._remotes)

    def num_remote_workers(self) -> int:
        """Old name of :meth:`num_remote_env_runners` (as in RLlib).

        Returns:
            The number.
        """
        return self.num_remote_env_runners()

    def num_healthy_remote_env_runners(self) -> int:
        """The number of remote runners in service.

        Returns:
            The number.
        """
        return len(self.healthy_env_runner_ids())

    def num_healthy_remote_workers(self) -> int:
        """Old name of :meth:`num_healthy_remote_env_runners` (as in RLlib).

        Returns:
            The number.
        """
        return self.num_healthy_remote_env_runners()

    def num_healthy_env_runners(self) -> int:
        """The runners in service, the local one included.

        Returns:
            ``1 + num_healthy_remote_env_runners()``.
        """
        return 1 + self.num_healthy_remote_env_runners()

    def num_in_flight_async_reqs(self, tag: str | None = None) -> int:
        """The ``foreach_env_runner_async`` requests not fetched yet.

        Args:
            tag: Only those with this tag (None: all).

        Returns:
            The number.
        """
        return sum(1 for _, t in self._async_reqs.values() if tag is None or t == tag)

    def num_remote_worker_restarts(self) -> int:
        """How many times remote runners were brought back into service after a failure.

        Returns:
            The number, over the group's life.
        """
        return self._num_restored

    def get_spaces(self) -> dict[str, Any]:
        """The env's and the modules' spaces (from the local runner).

        Returns:
            ``{name: (observation_space, action_space)}``.
        """
        return self._local.get_spaces()

    # ------------------------------------------------------------------ sampling

    def sample(
        self,
        *,
        num_timesteps: int | None = None,
        num_episodes: int | None = None,
        explore: bool | None = None,
        random_actions: bool = False,
        force_reset: bool = False,
        sample_timeout_s: float | None = _FROM_CONFIG,
    ) -> list[Any]:
        """Samples on all runners and returns the episodes of all.

        Without remote runners the local runner samples (``EnvRunner.sample``). With
        remote runners only they sample, in parallel, and the counts are split over the
        healthy ones that are not still busy with a timed-out request: each gets
        ``total // n`` and the first ``total % n`` one more; a runner whose share is 0 is
        not asked. Each runner keeps its own contract (timesteps: at least its share, up
        to ``num_envs_per_env_runner - 1`` more; episodes: exactly its share), so the
        group returns at least ``num_timesteps`` (exactly ``num_episodes``) unless a
        runner failed or timed out. With neither count, each runner samples its own
        default (as ``EnvRunner.sample()`` without counts: its fragment per sub-env, or one
        episode per sub-env under ``complete_episodes``).

        Failures: a runner that fails is taken out of service (and restarted by Ray when
        ``restart_failed_env_runners``); the call returns what the others produced. A
        runner that Ray restarted is brought up to date (weights, connector states)
        before it samples again. A request that outlives ``sample_timeout_s`` is kept:
        its episodes come with the next call, so nothing a runner samples is dropped.

        Args:
            num_timesteps: Env steps to sample in all.
            num_episodes: Done episodes to return in all.
            explore: Passed to each runner (default ``config.explore``).
            random_actions: Passed to each runner.
            force_reset: Passed to each runner.
            sample_timeout_s: How long to wait for the remote runners (default
                ``config.sample_timeout_s``; None waits as long as it takes).

        Returns:
            The episodes, runner by runner (ascending ids).

        Raises:
            ValueError: If both counts are given or one is negative.
            RuntimeError: If the group was stopped.
            ray.exceptions.RayError: If a runner fails and the config tolerates no
                failures (``restart_failed_env_runners=False`` and
                ``ignore_env_runner_failures=False``).
        """
        self._check_running()
        if num_timesteps is not None and num_episodes is not None:
            raise ValueError("give num_timesteps or num_episodes, not both")
        for name, v in (("num_timesteps", num_timesteps), ("num_episodes", num_episodes)):
            if v is not None and v < 0:
                raise ValueError(f"{name} must be >= 0, got {v}")
        kwargs: dict[str, Any] = {
            "explore": explore,
            "random_actions": random_actions,
            "force_reset": force_reset,
        }
        if not self._remotes:
            return self._local.sample(
                num_timesteps=num_timesteps, num_episodes=num_episodes, **kwargs
            )
        ray = self._ray
        self._check_unchecked()
        self._poll_probes()
        timeout = (
            self.config.sample_timeout_s if sample_timeout_s is _FROM_CONFIG else sample_timeout_s
        )
        refs: dict[Any, int] = {}
        requests: dict[int, dict[str, Any]] = {}
        fresh: list[int] = []
        for index in self.healthy_env_runner_ids():
            remote = self._remotes[index]
            if remote.pending_sample is not None:
                refs[remote.pending_sample] = index
                remote.pending_sample = None
            else:
                fresh.append(index)
        count_key, total = (
            ("num_timesteps", num_timesteps)
            if num_episodes is None
            else ("num_episodes", num_episodes)
        )
        shares: list[int | None] = (
            [None] * len(fresh) if total is None else list(split_count(total, max(len(fresh), 1)))
        )
        for index, share in zip(fresh, shares, strict=False):
            if share == 0:
                continue
            requests[index] = {**kwargs, count_key: share}
            refs[self._remotes[index].handle.sample.remote(**requests[index])] = index
        if not refs:
            logger.warning(
                "EnvRunnerGroup.sample: no healthy remote env runner to sample with "
                "(%d of %d out of service); returning no episodes",
                len(self._remotes) - self.num_healthy_remote_env_runners(),
                len(self._remotes),
            )
            return []
        deadline = None if timeout is None else time.monotonic() + float(timeout)
        episodes: dict[int, list[Any]] = {}
        asked_again: set[int] = set()
        while refs:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _ = ray.wait(list(refs), num_returns=1, timeout=remaining)
            if not ready:
                break
            for ref in ready:
                index = refs.pop(ref)
                ok, value = self._get(ref, index)
                if not ok:
                    continue
                if isinstance(value, NeedsState):
                    # Ray restarted the runner between calls, unnoticed until now: bring
                    # it up to date and ask again (the restore runs first on the actor).
                    self._restore(index, value.pid)
                    if index in requests and index not in asked_again:
                        asked_again.add(index)
                        refs[self._remotes[index].handle.sample.remote(**requests[index])] = index
                    continue
                episodes.setdefault(index, []).extend(value)
        for ref, index in refs.items():
            self._remotes[index].pending_sample = ref
        if refs:
            logger.warning(
                "EnvRunnerGroup.sample: remote env runner(s) %s did not answer within "
                "sample_timeout_s=%s; their episodes come with the next sample() call",
                sorted(refs.values()),
                timeout,
            )
        return [e for index in sorted(episodes) for e in episodes[index]]

    # ------------------------------------------------------------------ metrics

    def get_metrics(self, timeout_seconds: float | None = _FROM_CONFIG) -> dict[str, Any]:
        """Aggregates every sampling runner's ``get_metrics()`` into the group's root logger.

        Each runner reduces its own metrics; the results are merged into ``self.metrics``
        (a root ``fastrollout.MetricsLogger``: lifetime sums add up over the group's
        life, means are weighted by the values behind them), which is then reduced. A
        runner still busy with a timed-out sample, or whose metrics arrive late, is
        counted in a later call; nothing is dropped.

        Args:
            timeout_seconds: How long to wait for the remote runners (default
                ``config.sample_timeout_s``; None: as long as it takes).

        Returns:
            The root logger's ``reduce()``: a nested dict of ``StatsSnapshot`` with
            RLlib's keys (``MetricsLogger.peek_results`` turns it into numbers).

        Raises:
            RuntimeError: If the group was stopped.
        """
        self._check_running()
        if not self._remotes:
            results = [self._local.get_metrics()]
        else:
            self._check_unchecked()
            refs = dict(self._pending_metrics)
            self._pending_metrics.clear()
            busy = set(refs.values())
            for index in self.healthy_env_runner_ids():
                remote = self._remotes[index]
                if remote.pending_sample is None and index not in busy:
                    refs[remote.handle.call.remote("get_metrics")] = index
            timeout = (
                self.config.sample_timeout_s if timeout_seconds is _FROM_CONFIG else timeout_seconds
            )
            done, late = self._wait(refs, timeout)
            self._pending_metrics.update(late)
            results = [value for _, value in sorted(done, key=lambda item: item[0])]
        if results:
            self.metrics.aggregate(results)
        return self.metrics.reduce()

    # ------------------------------------------------------------------ weights and states

    def sync_weights(
        self,
        policies: Collection[str] | None = None,
        from_worker_or_learner_group: Any = None,
        to_worker_indices: Sequence[int] | None = None,
        global_vars: Any = None,
        timeout_seconds: float | None = 0.0,
        inference_only: bool = True,
    ) -> None:
        """Sends new weights to every runner, with the next (rising) ``weights_seq_no``.

        The weights go into Ray's object store once (one ``ray.put``) and every remote
        runner loads them from there; the local runner loads them too, first, so a state
        that does not fit the modules raises here before anything is sent. Ray runs an
        actor's calls in order, so a runner's next ``sample`` uses these weights.

        Args:
            policies: Only these module ids (None: all).
            from_worker_or_learner_group: Where the weights come from: None (the local
                runner's modules), an ``EnvRunner``, an ``RLModule`` or ``MultiRLModule``,
                a learner with ``get_weights(inference_only=...)`` (e.g.
                ``fastrollout.learners.PPOLearner``), the weights
                ``{module_id: {name: array}}``, or a runner state with ``"rl_module"`` (and
                optionally ``"weights_seq_no"``, which the new number is at least).
            to_worker_indices: Only these remote runners (None: all healthy ones).
            global_vars: Must be None (RLlib's old-stack argument).
            timeout_seconds: How long to wait for the remote runners to load them: 0.0
                (RLlib's default) does not wait (errors are looked at by later calls),
                None waits as long as it takes.
            inference_only: Take only what acting needs from a module or learner (the
                runners' modules are inference-only; RLlib's default is False).

        Raises:
            ValueError: If ``global_vars`` is given, or the weights do not fit the modules.
            TypeError: If the source is none of the kinds above.
            RuntimeError: If the group was stopped.
        """
        self._check_running()
        if global_vars is not None:
            raise ValueError("global_vars is not supported (RLlib's new stack has none either)")
        weights, given_seq_no = self._weights_from(from_worker_or_learner_group, inference_only)
        if policies is not None:
            unknown = [m for m in policies if m not in weights]
            if unknown:
                raise ValueError(
                    f"sync_weights: no weights for module(s) {unknown} in the source "
                    f"(it has {sorted(map(str, weights))})"
                )
            weights = {m: weights[m] for m in policies}
        seq_no = max(self._weights_seq_no + 1, int(given_seq_no or 0))
        state = {keys.COMPONENT_RL_MODULE: weights, keys.WEIGHTS_SEQ_NO: seq_no}
        self._local.set_state(state)
        self._weights_seq_no = seq_no
        if self._remotes:
            targets = self._targets(to_worker_indices)
            if targets:
                self._push("set_state", self._ray.put(state), targets, timeout_seconds)

    def sync_env_runner_states(
        self,
        *,
        config: Any = None,
        from_worker: EnvRunner | None = None,
        env_steps_sampled: int | None = None,
        connector_states: list[dict[str, Any]] | None = None,
        rl_module_state: dict[str, Any] | None = None,
        env_runner_indices_to_update: Sequence[int] | None = None,
        env_to_module: Any = None,
        module_to_env: Any = None,
        timeout_seconds: float | None = 10.0,
    ) -> None:
        """Merges the remote runners' connector states and sends the result to every runner.

        Connector states (e.g. ``MeanStdFilter``'s running statistics) are gathered from
        the healthy remote runners, merged with the pipelines' ``merge_states`` (exact for
        ``MeanStdFilter``: every runner's data since the last sync counts once), loaded
        into ``from_worker`` (the local runner) and sent to the runners they were
        gathered from, in one ``ray.put``. A runner that is busy (a timed-out sample, an
        async request) or does not answer in ``timeout_seconds`` keeps its state; it is
        merged at a later sync, so no statistics are lost. Without remote runners, only
        ``env_steps_sampled`` and ``rl_module_state`` are loaded into the local runner.

        Args:
            config: Unused (RLlib reads its merge/broadcast switches from it; this group
                always merges and broadcasts).
            from_worker: The runner whose pipelines merge and that takes the merged state
                (default: the local runner).
            env_steps_sampled: The group's total env steps, set as every runner's
                ``num_env_steps_sampled_lifetime``.
            connector_states: The states to merge instead of gathering them (each
                ``{"env_to_module_connector": ..., "module_to_env_connector": ...}``).
            rl_module_state: Weights to send along (``{"rl_module": ...,
                "weights_seq_no": ...}``).
            env_runner_indices_to_update: Only these remote runners (default: all).
            env_to_module: The pipeline that merges env-to-module states (default:
                ``from_worker``'s).
            module_to_env: The pipeline that merges module-to-env states (default:
                ``from_worker``'s).
            timeout_seconds: How long to wait for the remote runners' states.

        Raises:
            RuntimeError: If the group was stopped.
        """
        del config
        self._check_running()
        target = from_worker or self._local
        extra: dict[str, Any] = {}
        if env_steps_sampled is not None:
            extra[keys.NUM_ENV_STEPS_SAMPLED_LIFETIME] = int(env_steps_sampled)
        if rl_module_state:
            extra.update(rl_module_state)
            given = rl_module_state.get(keys.WEIGHTS_SEQ_NO)
            if given is not None:
                self._weights_seq_no = max(self._weights_seq_no, int(given))
        targets = self._targets(env_runner_indices_to_update)
        idle = [
            i for i in targets if self._remotes[i].pending_sample is None and not self._has_async(i)
        ]
        gathered: list[int] = []
        if connector_states is None:
            refs = {
                self._remotes[i].handle.call.remote(
                    "get_state", components=list(_CONNECTOR_COMPONENTS)
                ): i
                for i in idle
            }
            done, _ = self._wait(refs, timeout_seconds)
            done.sort(key=lambda item: item[0])
            gathered = [i for i, _ in done]
            connector_states = [state for _, state in done]
        else:
            gathered = idle
        pipelines = _pipelines(target)
        merged: dict[str, Any] = {}
        for component, given_pipeline in zip(
            _CONNECTOR_COMPONENTS, (env_to_module, module_to_env), strict=True
        ):
            parts = [st[component] for st in connector_states if component in st]
            if parts:
                pipeline = given_pipeline or pipelines[component]
                merged[component] = pipeline.merge_states(parts)
        state = {**merged, **extra}
        if state:
            target.set_state(state)
        if gathered and state:
            self._push("set_state", self._ray.put(state), gathered, timeout_seconds=0.0)
        # Runners whose connector states were not merged keep them (merged at a later
        # sync); the weights and the step count go to them all the same.
        others = [i for i in targets if i not in gathered]
        if others and extra:
            self._push("set_state", self._ray.put(extra), others, timeout_seconds=0.0)

    # ------------------------------------------------------------------ state

    def get_state(
        self,
        components: str | Collection[str] | None = None,
        *,
        not_components: str | Collection[str] | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """The group's state: its local runner's state and ``weights_seq_no``.

        The local runner holds the group's reference state. The remote runners'
        connector data since the last ``sync_env_runner_states`` is not in it: call that
        first to merge it into the local runner.

        Args:
            components: Only these (``"env_runner"``, or ``"env_runner/rl_module"`` and
                the like for part of the runner's state).
            not_components: Leave these out.
            **kwargs: Passed to the local runner's ``get_state``.

        Returns:
            ``{"env_runner": runner state, "weights_seq_no": int}``.
        """
        state: dict[str, Any] = {keys.WEIGHTS_SEQ_NO: self._weights_seq_no}
        if check_component(COMPONENT_ENV_RUNNER, components, not_components):
            state[COMPONENT_ENV_RUNNER] = self._local.get_state(
                subcomponents(COMPONENT_ENV_RUNNER, components), **kwargs
            )
        return state

    def set_state(self, state: dict[str, Any]) -> None:
        """Loads a state from ``get_state`` into the local runner and the remote runners.

        The runners follow ``EnvRunner.set_state``'s rules (weights older than theirs are
        not loaded); the group's ``weights_seq_no`` only moves forward.

        Args:
            state: The state.

        Raises:
            RuntimeError: If the group was stopped.
        """
        self._check_running()
        runner_state = state.get(COMPONENT_ENV_RUNNER)
        if runner_state is not None:
            self._local.set_state(runner_state)
        if keys.WEIGHTS_SEQ_NO in state:
            self._weights_seq_no = max(self._weights_seq_no, int(state[keys.WEIGHTS_SEQ_NO]))
        if runner_state is not None and self._remotes:
            targets = self._targets(None)
            if targets:
                self._push("set_state", self._ray.put(runner_state), targets, None)

    def get_ctor_args_and_kwargs(self) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The constructor's arguments (the group's config, with its ``num_env_runners``).

        Returns:
            ``((), {"config": config})``.
        """
        return (), {"config": self.config}

    def get_checkpointable_components(self) -> list[tuple[str, Any]]:
        """The local runner, written as a runner checkpoint in ``env_runner/``.

        Returns:
            ``[("env_runner", local runner)]``.
        """
        return [(COMPONENT_ENV_RUNNER, self._local)]

    def _set_restored_state(self, state: dict[str, Any]) -> None:
        """Loads a checkpoint into the local runner, then into every healthy remote one.

        The saved weights and ``weights_seq_no`` load also where older than theirs.
        """
        self._check_running()
        runner_state = state.get(COMPONENT_ENV_RUNNER)
        if runner_state is not None:
            self._local._set_restored_state(runner_state)
        if keys.WEIGHTS_SEQ_NO in state:
            self._weights_seq_no = int(state[keys.WEIGHTS_SEQ_NO])
        if runner_state is not None and self._remotes:
            targets = self._targets(None)
            if targets:
                full = self._local.get_state()
                self._push("_set_restored_state", self._ray.put(full), targets, None)

    # ------------------------------------------------------------------ foreach

    def foreach_env_runner(
        self,
        func: Callable[[Any], Any] | str,
        *,
        kwargs: Mapping[str, Any] | None = None,
        local_env_runner: bool = True,
        healthy_only: bool = True,
        remote_worker_ids: Sequence[int] | None = None,
        timeout_seconds: float | None = None,
        return_obj_refs: bool = False,
        mark_healthy: bool = False,
    ) -> list[Any]:
        """Calls ``func(runner, **kwargs)`` on the runners and returns the results.

        Args:
            func: A function of the runner, or the name of a runner method.
            kwargs: Keyword arguments for ``func`` (or the method); unlike RLlib, also
                passed to the local runner.
            local_env_runner: Call it on the local runner too (its result first).
            healthy_only: Only runners in service.
            remote_worker_ids: Only these remote runners (None: all).
            timeout_seconds: How long to wait for the remote runners (None: as long as
                it takes); runners that do not answer in time are left out of the result.
            return_obj_refs: Return the remote calls' ``ObjectRef`` objects instead of results
                (needs ``local_env_runner=False``).
            mark_healthy: Bring runners that were out of service and answer back into
                service (after sending them the group's latest state).

        Returns:
            The results: the local runner's first, then the remote runners' by id.

        Raises:
            ValueError: If ``return_obj_refs`` is combined with ``local_env_runner``.
            RuntimeError: If the group was stopped.
            Exception: What ``func`` raises on the local runner, or on a remote runner
                when the config tolerates no failures.
        """
        self._check_running()
        if return_obj_refs and local_env_runner:
            raise ValueError("return_obj_refs=True needs local_env_runner=False")
        out: list[Any] = []
        if local_env_runner:
            out.append(_call_local(self._local, func, kwargs))
        ids = self._select(remote_worker_ids, healthy_only)
        if not ids:
            return out
        self._check_unchecked()
        refs = {self._submit(i, func, kwargs): i for i in ids}
        if return_obj_refs:
            return out + list(refs)
        done, late = self._wait(refs, timeout_seconds, mark_healthy=mark_healthy)
        if late:
            logger.warning(
                "foreach_env_runner: remote env runner(s) %s did not answer within %s s",
                sorted(late.values()),
                timeout_seconds,
            )
        return out + [value for _, value in sorted(done, key=lambda item: item[0])]

    def foreach_env_runner_async(
        self,
        func: Callable[[Any], Any] | str,
        tag: str | None = None,
        *,
        kwargs: Mapping[str, Any] | None = None,
        healthy_only: bool = True,
        remote_worker_ids: Sequence[int] | None = None,
    ) -> int:
        """Starts ``func(runner, **kwargs)`` on the remote runners without waiting.

        Fetch the results with :meth:`fetch_ready_async_reqs`. A runner that already has
        ``max_requests_in_flight_per_env_runner`` requests with this tag in flight gets
        no new one.

        Args:
            func: A function of the runner, or the name of a runner method.
            tag: A tag to fetch these results by.
            kwargs: Keyword arguments for ``func``.
            healthy_only: Only runners in service.
            remote_worker_ids: Only these remote runners (None: all).

        Returns:
            The number of requests started.

        Raises:
            RuntimeError: If the group was stopped.
        """
        self._check_running()
        limit = int(self.config.max_requests_in_flight_per_env_runner)
        started = 0
        for index in self._select(remote_worker_ids, healthy_only):
            in_flight = sum(1 for i, t in self._async_reqs.values() if i == index and t == tag)
            if in_flight >= limit:
                continue
            self._async_reqs[self._submit(index, func, kwargs)] = (index, tag)
            started += 1
        return started

    def fetch_ready_async_reqs(
        self,
        *,
        tags: str | Sequence[str] | None = None,
        timeout_seconds: float | None = 0.0,
        return_obj_refs: bool = False,
        mark_healthy: bool = False,
    ) -> list[tuple[int, Any]]:
        """Returns the results of ``foreach_env_runner_async`` requests that are done.

        Args:
            tags: Only requests with this tag (or these tags); None: all.
            timeout_seconds: How long to wait for requests to finish (0.0: only those
                done already; None: all of them).
            return_obj_refs: Return the requests' ``ObjectRef`` objects instead of results.
            mark_healthy: Bring runners that were out of service and answer back into
                service (after sending them the group's latest state).

        Returns:
            ``(runner id, result)`` pairs; failed requests are left out (their runner is
            taken out of service) unless the config tolerates no failures.

        Raises:
            RuntimeError: If the group was stopped.
        """
        self._check_running()
        wanted = None if tags is None else ({tags} if isinstance(tags, str) else set(tags))
        refs = {
            ref: index
            for ref, (index, tag) in self._async_reqs.items()
            if wanted is None or tag in wanted
        }
        if not refs:
            return []
        ready, _ = self._ray.wait(list(refs), num_returns=len(refs), timeout=timeout_seconds)
        out: list[tuple[int, Any]] = []
        for ref in ready:
            if self._async_reqs.pop(ref, None) is None:
                continue  # dropped meanwhile: its runner failed
            index = refs[ref]
            if return_obj_refs:
                out.append((index, ref))
                continue
            ok, value = self._get(ref, index, mark_healthy=mark_healthy)
            if ok:
                out.append((index, value))
        return out

    # ------------------------------------------------------------------ health

    def probe_unhealthy_env_runners(self, timeout_seconds: float | None = None) -> list[int]:
        """Pings the runners out of service and brings those that answer back into service.

        A runner that answers (Ray has restarted its actor) first gets the group's latest
        state (the local runner's: weights with their ``weights_seq_no``, merged
        connector states), then counts as healthy. RLlib's group only pings; its
        ``Algorithm`` sends the state; this group does both.

        Args:
            timeout_seconds: How long to wait for answers (default
                ``config.env_runner_health_probe_timeout_s``).

        Returns:
            The ids brought back into service, by this call or, since the previous call,
            by ``sample`` (which does the same without waiting).

        Raises:
            RuntimeError: If the group was stopped.
        """
        self._check_running()
        if timeout_seconds is None:
            timeout_seconds = float(self.config.env_runner_health_probe_timeout_s)
        deadline = time.monotonic() + timeout_seconds
        while True:
            self._poll_probes()
            waiting = [r for r in self._remotes.values() if not r.healthy and not r.dead]
            remaining = deadline - time.monotonic()
            if not waiting or remaining <= 0:
                break
            probes = [r.probe for r in waiting if r.probe is not None]
            if probes:
                self._ray.wait(probes, num_returns=1, timeout=min(remaining, 0.5))
            # A runner that Ray is still restarting answers at once with an error; do
            # not ping it again in a busy loop.
            time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
        restored, self._restored_since_probe = self._restored_since_probe, []
        return restored

    def stop(self) -> None:
        """Stops every runner (closes their envs) and ends the remote runners' actors."""
        if self._stopped:
            return
        self._stopped = True
        ray = self._ray
        if self._remotes:
            refs = [r.handle.call.remote("stop") for r in self._remotes.values() if not r.dead]
            if refs:
                # Bounded: a hung runner must not keep the group from stopping.
                ray.wait(refs, num_returns=len(refs), timeout=5.0)
            for remote in self._remotes.values():
                try:
                    ray.kill(remote.handle, no_restart=True)
                except Exception as err:
                    logger.debug("EnvRunnerGroup.stop: ray.kill failed: %s", err)
            self._remotes.clear()
        self._async_reqs.clear()
        self._unchecked.clear()
        self._pending_metrics.clear()
        self._config_ref = None
        self._local.stop()

    def __enter__(self) -> EnvRunnerGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return (
            f"EnvRunnerGroup({self.env_runner_cls.__name__}, local runner + "
            f"{len(self._remotes)} remote ({self.num_healthy_remote_env_runners()} healthy), "
            f"weights_seq_no={self._weights_seq_no}{', stopped' if self._stopped else ''})"
        )

    # ------------------------------------------------------------------ internals

    def _check_running(self) -> None:
        if self._stopped:
            raise RuntimeError("this EnvRunnerGroup was stopped; build a new one")

    def _targets(self, indices: Sequence[int] | None) -> list[int]:
        """The healthy remote runners among ``indices`` (None: all)."""
        healthy = self.healthy_env_runner_ids()
        if indices is None:
            return healthy
        self._check_ids(indices)
        return [i for i in healthy if i in set(indices)]

    def _select(self, indices: Sequence[int] | None, healthy_only: bool) -> list[int]:
        if indices is not None:
            self._check_ids(indices)
        ids = list(self._remotes) if indices is None else sorted(set(indices))
        return [
            i
            for i in ids
            if not self._remotes[i].dead and (self._remotes[i].healthy or not healthy_only)
        ]

    def _check_ids(self, indices: Iterable[int]) -> None:
        unknown = [i for i in indices if i not in self._remotes]
        if unknown:
            raise ValueError(
                f"unknown remote env runner id(s) {unknown}; the group's are {list(self._remotes)}"
            )

    def _has_async(self, index: int) -> bool:
        return any(i == index for i, _ in self._async_reqs.values())

    def _submit(self, index: int, func: Callable[[Any], Any] | str, kwargs: Any) -> Any:
        handle = self._remotes[index].handle
        if isinstance(func, str):
            return handle.call.remote(func, **(kwargs or {}))
        return handle.apply.remote(func, **(kwargs or {}))

    def _push(
        self, method: str, arg: Any, indices: list[int], timeout_seconds: float | None
    ) -> None:
        """Calls ``method(arg)`` on runners; waits ``timeout_seconds``, checks the rest later."""
        refs = {self._remotes[i].handle.call.remote(method, arg): i for i in indices}
        if timeout_seconds is not None and timeout_seconds <= 0:
            self._unchecked.update(refs)
            return
        _, late = self._wait(refs, timeout_seconds)
        self._unchecked.update(late)

    def _wait(
        self, refs: dict[Any, int], timeout: float | None, *, mark_healthy: bool = False
    ) -> tuple[list[tuple[int, Any]], dict[Any, int]]:
        """Waits for calls; returns the results of those that succeeded, and those not done."""
        if not refs:
            return [], {}
        ready, _ = self._ray.wait(list(refs), num_returns=len(refs), timeout=timeout)
        done = []
        for ref in ready:
            index = refs[ref]
            ok, value = self._get(ref, index, mark_healthy=mark_healthy)
            if ok:
                done.append((index, value))
        ready_set = set(ready)
        return done, {ref: i for ref, i in refs.items() if ref not in ready_set}

    def _get(self, ref: Any, index: int, *, mark_healthy: bool = False) -> tuple[bool, Any]:
        """A finished call's result; a failure takes the runner out of service (or raises)."""
        ray = self._ray
        try:
            value = ray.get(ref)
        except ray.exceptions.RayError as err:
            self._on_failure(index, err)
            return False, None
        remote = self._remotes.get(index)
        if mark_healthy and remote is not None and not remote.healthy:
            self._restore(index, None)
        return True, value

    def _on_failure(self, index: int, err: Exception) -> None:
        """Takes a runner out of service after a failed call, or raises without tolerance."""
        ray = self._ray
        remote = self._remotes.get(index)
        if remote is None:
            return
        if not self._fault_tolerant:
            raise err
        if remote.healthy:
            logger.warning(
                "remote env runner %d failed and is out of service%s: %s",
                index,
                " until Ray has restarted it" if self._restart else "",
                err,
            )
        remote.healthy = False
        remote.pending_sample = None
        remote.probe = None
        for ref, (i, _) in list(self._async_reqs.items()):
            if i == index:
                del self._async_reqs[ref]
        # Calls still out to the failed process would only fail too.
        for calls in (self._unchecked, self._pending_metrics):
            for ref, i in list(calls.items()):
                if i == index:
                    del calls[ref]
        if not isinstance(err, ray.exceptions.RayActorError):
            # The call raised inside a live runner, whose state may now be broken: as
            # RLlib does, end the process, which Ray restarts when restarts are on.
            remote.stale_pid = remote.pid
            try:
                ray.kill(remote.handle, no_restart=not self._restart)
            except Exception as kill_err:
                logger.debug("ray.kill of env runner %d failed: %s", index, kill_err)

    def _check_unchecked(self) -> None:
        """Looks at the fire-and-forget calls that have finished (errors, results dropped)."""
        if not self._unchecked:
            return
        refs = dict(self._unchecked)
        ready, _ = self._ray.wait(list(refs), num_returns=len(refs), timeout=0)
        for ref in ready:
            index = self._unchecked.pop(ref, None)
            if index is not None:
                self._get(ref, index)

    def _poll_probes(self) -> None:
        """Sends pings to runners out of service and restores those that answered, no waiting."""
        if not self._remotes:
            return
        ray = self._ray
        unavailable = getattr(ray.exceptions, "ActorUnavailableError", ())
        for index, remote in self._remotes.items():
            if remote.healthy or remote.dead:
                continue
            if remote.probe is None:
                remote.probe = remote.handle.process_id.remote()
                continue
            ready, _ = ray.wait([remote.probe], timeout=0)
            if not ready:
                continue
            probe, remote.probe = remote.probe, None
            try:
                pid = ray.get(probe)
            except unavailable:
                continue  # Ray is still restarting it: ping again next time
            except ray.exceptions.RayActorError as err:
                remote.dead = True
                logger.warning(
                    "remote env runner %d is gone for good (restarts %s): %s",
                    index,
                    "exhausted" if self._restart else "off",
                    err,
                )
                continue
            if pid == remote.stale_pid:
                continue  # the ended process, still answering: not restarted yet
            remote.stale_pid = None
            self._restore(index, pid)

    def _restore(self, index: int, pid: int | None) -> None:
        """Sends the local runner's state to a restarted runner and puts it in service.

        Args:
            index: The runner.
            pid: Its new process's id, if known.
        """
        remote = self._remotes[index]
        state_ref = self._ray.put(self._local.get_state())
        self._unchecked[remote.handle.restore.remote(state_ref)] = index
        remote.healthy = True
        remote.probe = None
        remote.pid = pid
        self._num_restored += 1
        self._restored_since_probe.append(index)
        logger.info("remote env runner %d is back in service", index)

    def _weights_from(self, source: Any, inference_only: bool) -> tuple[dict[str, Any], int | None]:
        """The weights ``{module_id: {name: array}}`` of a source, and its seq no if it has one."""
        if source is None:
            source = self._local
        if isinstance(source, EnvRunner):
            module = source.module
            if module is None:
                raise ValueError(f"{type(source).__name__} has no module to take weights from")
            return module.get_state(inference_only=inference_only), None
        if isinstance(source, MultiRLModule):
            return source.get_state(inference_only=inference_only), None
        if isinstance(source, RLModule):
            return {DEFAULT_MODULE_ID: source.get_state(inference_only=inference_only)}, None
        if isinstance(source, Mapping):
            if keys.COMPONENT_RL_MODULE in source:
                return dict(source[keys.COMPONENT_RL_MODULE]), source.get(keys.WEIGHTS_SEQ_NO)
            return dict(source), None
        get_weights = getattr(source, "get_weights", None)
        if callable(get_weights):
            try:
                return dict(get_weights(inference_only=inference_only)), None
            except TypeError:
                return dict(get_weights()), None
        raise TypeError(
            "sync_weights takes weights from None (the local runner), an EnvRunner, an "
            "RLModule or MultiRLModule, a learner with get_weights(), or a dict of weights "
            f"or of a runner state; got {type(source).__name__}"
        )


# ---------------------------------------------------------------------- helpers


def _default_runner_cls(config: Any) -> type:
    """The runner class for a config without ``env_runner_cls``.

    RLlib's rule (``is_multi_agent``: more than one module, or one that is not
    ``default_policy``), and also the multi-agent runner for a ``MultiAgentEnv`` class
    with the one default module (where RLlib would pick the single-agent runner, which
    cannot step it).
    """
    from fastrollout.env import is_multi_agent_env
    from fastrollout.runners.multi_agent_env_runner import MultiAgentEnvRunner
    from fastrollout.runners.single_agent_env_runner import SingleAgentEnvRunner

    env = config.env
    multi = config.is_multi_agent or (isinstance(env, type) and is_multi_agent_env(env))
    return MultiAgentEnvRunner if multi else SingleAgentEnvRunner


# Below Ray's limit for arguments passed inside a task (RAY_max_direct_call_object_size,
# 100 KiB by default), with room for the other arguments and pickling differences.
_INLINE_ARGS_LIMIT = 64 * 1024


def _pickled_size(obj: Any) -> int:
    """The size of ``obj`` pickled as Ray pickles task arguments (cloudpickle)."""
    from ray import cloudpickle

    return len(cloudpickle.dumps(obj))


def _registered_envs(env: Any) -> dict[str, Callable[..., Any]]:
    """The driver's registered creator for a config's env name (none for other specs)."""
    from fastrollout.env import get_registered_env

    if not isinstance(env, str):
        return {}
    creator = get_registered_env(env)
    return {} if creator is None else {env: creator}


def _check_cluster_resources(ray: Any, n: int, cpus: float, gpus: float) -> None:
    """Raises when the cluster can never hold the remote runners (instead of hanging)."""
    total = ray.cluster_resources()
    for name, per_runner, setting in (
        ("CPU", cpus, "num_cpus_per_env_runner"),
        ("GPU", gpus, "num_gpus_per_env_runner"),
    ):
        needed = n * float(per_runner)
        have = float(total.get(name, 0.0))
        if needed > have + 1e-9:
            raise ValueError(
                f"{n} remote env runners x {setting}={per_runner} need {needed:g} {name}s, "
                f"the Ray cluster has {have:g} in all; lower num_env_runners or {setting}, "
                f"or give Ray more (ray.init(num_{name.lower()}s=...))"
            )


def _pipelines(runner: Any) -> dict[str, Any]:
    """A runner's two connector pipelines, by state component (RLlib's attribute names)."""
    return {
        keys.COMPONENT_ENV_TO_MODULE_CONNECTOR: runner._env_to_module,
        keys.COMPONENT_MODULE_TO_ENV_CONNECTOR: runner._module_to_env,
    }


def _call_local(runner: Any, func: Callable[[Any], Any] | str, kwargs: Any) -> Any:
    if isinstance(func, str):
        return getattr(runner, func)(**(kwargs or {}))
    return func(runner, **(kwargs or {}))
