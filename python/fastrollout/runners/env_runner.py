"""``EnvRunner``: the base of the single- and multi-agent runners (RLlib 2.60's API)."""

from __future__ import annotations

import abc
import contextlib
import logging
import pathlib
import pickle
import random
import sys
import time
import warnings
from collections import defaultdict
from collections.abc import Collection, Mapping
from typing import Any, Generic, TypeVar

import numpy as np
import torch

from fastrollout.checkpoints import Checkpointable, read_module_states, write_module_states
from fastrollout.connectors.pipeline import ConnectorPipelineV2
from fastrollout.core import DEFAULT_MODULE_ID, Columns
from fastrollout.errors import CheckpointError, RunnerStoppedError, SampleArgumentError
from fastrollout.metrics import MetricsLogger
from fastrollout.modules import MultiRLModule, resolve_device
from fastrollout.modules.grad import grad_off, grad_restore
from fastrollout.modules.specs import is_rllib_spec, resolve_module_specs
from fastrollout.runners import _rllib, keys
from fastrollout.runners._config import cfg
from fastrollout.runners._connectors import Connectors
from fastrollout.runners._default_act import DefaultAct
from fastrollout.runners.recurrent_states import RecurrentStates
from fastrollout.runners.sub_envs import StepResults, SubEnvs, make_sub_envs
from fastrollout.runners.sub_envs.creator import make_sub_env_creator

__all__ = ["EnvRunner"]

#: The episode class a runner's ``sample`` returns (``SingleAgentEpisode`` or
#: ``MultiAgentEpisode``; RLlib-flavoured subclasses of them under RLlib's config).
EpisodeT = TypeVar("EpisodeT")


class _SampleCall:
    """The counts of one ``sample`` call, which the loop's hooks update."""

    def __init__(
        self,
        *,
        num_timesteps: int | None,
        num_episodes: int | None,
        explore: bool,
        random_actions: bool,
        to_numpy: bool,
    ) -> None:
        self.num_timesteps = num_timesteps
        self.num_episodes = num_episodes
        self.explore = explore
        self.random_actions = random_actions
        self.to_numpy = to_numpy
        self.env_steps = 0
        self.episodes = 0
        self.done_out: list[Any] = []
        # Episodes of external simulators that do not train (training_enabled=False):
        # counted in metrics, never returned; likewise their steps.
        self.done_untrained: list[Any] = []
        self.untrained_steps = 0
        self.untrained_agent_steps = 0
        # Per sub-env, the env steps it still takes in this call (sample_fragments), or
        # None: the call counts steps summed over sub-envs.
        self.left: np.ndarray | None = None

    def finished(self, steps: int) -> bool:
        """Whether the call has its steps (``steps`` counted as configured) or episodes."""
        if self.left is not None:
            return not (self.left > 0).any()
        if self.num_timesteps is not None:
            return steps >= self.num_timesteps
        return self.episodes >= (self.num_episodes or 0)


def _is_base_hook(fn: Any, name: str) -> bool:
    """Whether ``fn`` is a callbacks base class's own (empty) hook ``name``.

    fastrollout's ``Callbacks`` and RLlib's ``RLlibCallback`` (the callbacks class of
    every RLlib config) define every hook as a no-op.
    """
    from fastrollout.callbacks import Callbacks

    if fn is getattr(Callbacks, name, None):
        return True
    return (
        getattr(fn, "__module__", "") == "ray.rllib.callbacks.callbacks"
        and getattr(fn, "__qualname__", "") == f"RLlibCallback.{name}"
    )


def _in_ray_actor() -> bool:
    """Whether this process is a Ray actor (never imports ray to answer)."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return False
    return ray.get_runtime_context().get_actor_id() is not None


def _rebuild_runner(cls: type[EnvRunner[Any]], kwargs: dict[str, Any], state: Any) -> Any:
    """Builds a runner and loads a state into it: what unpickling a runner does.

    Args:
        cls: The runner class.
        kwargs: Its constructor's arguments (config, worker_index, num_workers, spaces).
        state: ``get_state()`` of the pickled runner.

    Returns:
        The new runner.
    """
    runner = cls(**kwargs)
    runner.set_state(state)
    return runner


_CALLBACKS = (
    "on_environment_created",
    "on_episode_created",
    "on_episode_start",
    "on_episode_step",
    "on_episode_end",
    "on_sample_end",
)


class EnvRunner(Checkpointable, abc.ABC, Generic[EpisodeT]):
    """Steps environments with a torch policy and returns episodes.

    Subclasses implement ``make_env``, ``make_module``, ``_sample``, ``get_spaces`` and
    ``get_metrics``; this base holds what they share: the config, the MetricsLogger,
    the device, seeding, callbacks, the weights' sequence number, state handling, the
    ``sample`` entry point with its timers, the forward pass, and the sampled-step and
    episode metrics.

    A runner pickles as its config and state (see ``__reduce__``): unpickling builds a
    new runner with new envs.

    Args:
        config: The runner config (``fastrollout.RunnerConfig``).
        worker_index: The runner's index in its group (0: the local runner; None: not
            built by a group, as index 0).
        num_workers: The number of remote runners (default ``config.num_env_runners``).
        **kwargs: Ignored (RLlib's constructor takes more).
    """

    def __init__(
        self,
        *,
        config: Any,
        worker_index: int | None = None,
        num_workers: int | None = None,
        **kwargs: Any,
    ) -> None:
        self.config = config
        # None: built directly, not by a group (RLlib's runners then always make an env).
        self._in_group = worker_index is not None
        self.worker_index = int(worker_index or 0)
        self.num_workers = int(
            num_workers if num_workers is not None else cfg(config, "num_env_runners", 0)
        )
        self.metrics = MetricsLogger()
        self.env: Any = None
        # Set by make_env (None until then: a runner without env never samples).
        self._sub_envs: SubEnvs = None  # type: ignore[assignment]
        # The sub-envs that wait for an action (None: all of them).
        self._ready: Any = None
        self._failures_in_a_row: list[int] = []
        # Whether some sub-env's failure run is open (_failures_in_a_row not all 0).
        self._failing = False
        self._per_step_callbacks = False
        self._call: _SampleCall = _SampleCall(
            num_timesteps=0, num_episodes=None, explore=False, random_actions=False, to_numpy=True
        )
        # The modules as one MultiRLModule, which the loop and the connectors use;
        # ``module`` is what RLlib's runner of the same kind exposes.
        self._module: MultiRLModule | None = None
        # The live recurrent states of the stateful modules (empty: none is stateful), and
        # the module they were made for (a module set by hand gets new ones).
        self._states = RecurrentStates({})
        self._states_for: Any = None
        # Built from RLlib's own AlgorithmConfig (env_runner_cls inside RLlib's Algorithm).
        self._rllib = _rllib.is_rllib_config(config)
        self._device = (
            _rllib.device_for(config, self.worker_index)
            if self._rllib
            else resolve_device(cfg(config, "device", "auto"))
        )
        self._weights_seq_no = 0
        self.num_env_steps_sampled_lifetime = 0
        self._default_act: DefaultAct | None = None
        seed = cfg(config, "seed")
        # As RLlib: one seed per runner, evaluation runners a million apart.
        self._seed: int | None = (
            None
            if seed is None
            else int(seed)
            + self.worker_index
            + (1_000_000 if cfg(config, "in_evaluation", False) else 0)
        )
        if self._seed is not None:
            random.seed(self._seed)
            np.random.seed(self._seed % 2**32)
            torch.manual_seed(self._seed)
        self._callback_objects = self._make_callback_objects()
        self._callback_fns = {name: self._callback_list(name) for name in _CALLBACKS}
        self.num_envs = 0
        self._needs_initial_reset = True
        # Why the runner cannot sample until make_env() (None: it can); see stop().
        self._stopped: str | None = None
        # A sample() call raised: its envs stepped past what the episodes hold.
        self._interrupted = False
        self._episodes: list[Any] = []
        self._done_episodes_for_metrics: list[Any] = []
        # Done episodes of external simulators beyond a call's num_episodes: the next
        # calls return them first (such sub-envs cannot be reset to stop at a count).
        self._done_carried: list[Any] = []
        # sample_fragments: the steps each sub-env takes in the call being made, and the
        # sub-envs that took theirs and wait, with their latest observation, for the next.
        self._fragment_budget: int | None = None
        self._held: dict[int, Any] = {}
        # offline_data(output=...): the episode writer, made at the first sample() call.
        self._offline_writer: Any = None
        # Episode id -> the chunks of that episode returned by earlier ``sample`` calls.
        self._ongoing_episodes_for_metrics: defaultdict[str, list[Any]] = defaultdict(list)
        self._shared_data: dict[str, Any] = {}
        self._time_after_sampling: float | None = None
        # The per-step timers created in the current sample() call (_log_time_since).
        self._timers_ready: set[str] = set()
        self._conn: Connectors | None = None
        # RLlib's IMPALA/APPO set this to their EnvRunnerStateServer actor: the runner
        # pulls newer weights and connector states from it before each sample.
        self._env_runner_state_server: Any = None
        # The spaces RLlib's group hands a local runner that has no env of its own.
        self.spaces: dict[str, Any] = dict(kwargs.get("spaces") or {})

    # -- callbacks -------------------------------------------------------------------

    def _make_callback_objects(self) -> list[Any]:
        cls = cfg(self.config, "callbacks_class")
        if cls is None:
            return []
        classes = cls if isinstance(cls, (list, tuple)) else [cls]
        return [c() if isinstance(c, type) else c for c in classes]

    def _callback_list(self, name: str) -> list[Any]:
        fns = []
        for obj in self._callback_objects:
            fn = getattr(obj, name, None)
            # The base classes' hooks do nothing: skipping them keeps the per-step loop
            # over sub-envs out of the hot path when no callback needs it.
            if fn is not None and not _is_base_hook(getattr(type(obj), name, None), name):
                fns.append(fn)
        extra = cfg(self.config, f"callbacks_{name}")
        if extra is not None:
            fns.extend(extra if isinstance(extra, (list, tuple)) else [extra])
        return fns

    def _has_callbacks(self, name: str) -> bool:
        return bool(self._callback_fns[name])

    def _callback(self, name: str, **kwargs: Any) -> None:
        """Calls the callbacks of ``name`` with RLlib's keyword arguments."""
        for fn in self._callback_fns[name]:
            fn(**kwargs)

    def _episode_callback(self, which: str, i: int) -> None:
        """Calls an episode callback for sub-env ``i``'s current episode."""
        if not self._callback_fns[which]:
            return
        kwargs = {
            "episode": self._episodes[i],
            "env_runner": self,
            "metrics_logger": self.metrics,
            "env": self._callback_env(i),
            "rl_module": self.module,
            "env_index": i,
        }
        if which == "on_episode_end":
            kwargs["prev_episode_chunks"] = self._ongoing_episodes_for_metrics[
                self._episodes[i].id_
            ]
        self._callback(which, **kwargs)

    @abc.abstractmethod
    def _callback_env(self, i: int) -> Any:
        """The env that episode callbacks of sub-env ``i`` get (RLlib's ``env``)."""

    def _wants_env(self) -> bool:
        """Whether this runner creates its env(s) (RLlib's rule for its own configs).

        Built from RLlib's config, the local runner (``worker_index`` 0) of a group with
        remote runners has no env unless ``create_env_on_local_worker``: it only holds
        the modules and connectors, from the spaces the group gives it.
        """
        return not (
            self._rllib
            and self._in_group
            and self.worker_index == 0
            and int(cfg(self.config, "num_env_runners", 0)) > 0
            and not cfg(self.config, "create_env_on_local_worker", False)
        )

    # -- module --------------------------------------------------------------------

    @property
    def module(self) -> Any:
        """The runner's modules, a ``MultiRLModule`` (as RLlib's multi-agent runner's).

        None where the config builds no module (the runner then samples random actions).
        """
        return self._module

    @module.setter
    def module(self, module: Any) -> None:
        self._module = module

    # -- API -----------------------------------------------------------------------

    def make_env(self) -> None:
        """Creates the sub-envs (closing existing ones) and schedules a reset.

        The backend is the config's: one Ray actor per sub-env with
        ``remote_worker_envs=True``; else, multi-agent, a list of envs in this process;
        single-agent, the gymnasium vector env of ``gym_env_vectorize_mode``.

        Raises:
            ValueError: If the config names no env or an unknown vectorize mode.
            ImportError: For remote sub-envs without ray (naming the extra).
        """
        self._close_env_quietly()
        creator = make_sub_env_creator(
            self.config, self.worker_index, self.num_workers, multi_agent=self._multi_agent
        )
        self._sub_envs = make_sub_envs(self.config, creator, multi_agent=self._multi_agent)
        self.env = self._sub_envs.env
        self.num_envs = self._sub_envs.num_envs
        self._failures_in_a_row = [0] * self.num_envs
        self._envs_ready()
        self._envs_created(creator)

    def _envs_created(self, creator: Any) -> None:
        """Calls ``on_environment_created`` for new envs (once per vector env or sub-env)."""

    def sample(
        self,
        *,
        num_timesteps: int | None = None,
        num_episodes: int | None = None,
        explore: bool | None = None,
        random_actions: bool = False,
        force_reset: bool = False,
    ) -> list[EpisodeT]:
        """Samples ``num_timesteps`` env steps or ``num_episodes`` done episodes.

        With neither given: ``rollout_fragment_length * num_envs`` timesteps under
        ``batch_mode="truncate_episodes"``, ``num_envs`` episodes under
        ``"complete_episodes"``. Timesteps (env steps, summed over sub-envs): done
        episodes plus the chunks of the ongoing ones, which the next call continues (same
        ``id_``, ``t_started`` at the chunk's end, ``episode_lookback_horizon`` steps of
        look-back); between ``num_timesteps`` and ``num_timesteps + num_envs - 1`` steps
        (``sample_fragments`` takes exactly a fragment from every sub-env).
        Episodes: exactly ``num_episodes`` done episodes, from freshly reset envs.
        Returned episodes are numpy'ized (unless ``episodes_to_numpy`` is off). After a
        call that raised (an env's error), the next call resets every sub-env first: the
        envs stepped past what the episodes hold.

        Args:
            num_timesteps: Env steps to sample.
            num_episodes: Done episodes to return.
            explore: Sample actions (``forward_exploration``) or act greedily
                (``forward_inference``); default ``config.explore``.
            random_actions: Sample actions from the action space(s) instead.
            force_reset: Reset all sub-envs first (always so with ``num_episodes``).

        Returns:
            The episodes: ``SingleAgentEpisode`` objects from ``SingleAgentEnvRunner``,
            ``MultiAgentEpisode`` objects from ``MultiAgentEnvRunner``.

        Raises:
            SampleArgumentError: (a ``ValueError`` and an ``AssertionError``) If both
                ``num_timesteps`` and ``num_episodes`` are given or one is negative.
            RunnerStoppedError: (a ``RuntimeError``) If ``stop()`` closed the envs (or a
                sub-env's worker process was lost) and ``make_env()`` was not called since.
            RuntimeError: If the runner has no env (the local runner of a group with
                remote runners) or no module and ``random_actions`` is False.
        """
        if num_timesteps is not None and num_episodes is not None:
            raise SampleArgumentError("give num_timesteps or num_episodes, not both")
        for name, v in (("num_timesteps", num_timesteps), ("num_episodes", num_episodes)):
            if v is not None and v < 0:
                raise SampleArgumentError(f"{name} must be >= 0, got {v}")
        if self._stopped is not None:
            raise RunnerStoppedError(
                f"{type(self).__name__} cannot sample: {self._stopped}; call make_env() to "
                "create new envs, then sample again"
            )
        if self.env is None:
            raise RuntimeError(
                f"{type(self).__name__} has no env: it is the local runner of a group "
                "with remote runners (sample those, or set create_env_on_local_worker)"
            )
        if self._module is None and not random_actions:
            raise RuntimeError(
                f"{type(self).__name__} has no module (the config builds none): sample "
                "with random_actions=True, or configure an RLModule"
            )
        if self._time_after_sampling is not None:
            self.metrics.log_value(
                keys.TIME_BETWEEN_SAMPLING, time.perf_counter() - self._time_after_sampling
            )
        if self._env_runner_state_server is not None:
            self._pull_state()
        self.metrics.log_value(keys.WEIGHTS_SEQ_NO, self._weights_seq_no, window=1)
        with self.metrics.log_time(keys.SAMPLE_TIMER):
            self._timers_ready.clear()
            if explore is None:
                explore = bool(cfg(self.config, "explore", True))
            if self._module is not self._states_for:
                self._states = RecurrentStates(self._module or {})
                self._states_for = self._module
            # The default module and pieces' step in one pass (see _default_act); built
            # per call, as the module and the pipelines may change between calls.
            self._default_act = (
                DefaultAct.of(self._module, self._connectors.module_to_env, explore)
                if self._conn is not None
                else None
            )
            if num_timesteps is None and num_episodes is None:
                envs = self._sub_envs.fragment_envs()
                if cfg(self.config, "batch_mode", "truncate_episodes") == "truncate_episodes":
                    num_timesteps = self._fragment_length() * envs
                else:
                    num_episodes = envs
            if self._sub_envs.external and self._module is not None:
                self._publish_weights()
            try:
                samples = self._sample(
                    num_timesteps=num_timesteps,
                    num_episodes=num_episodes,
                    explore=explore,
                    random_actions=random_actions,
                    # After a call that raised, the envs are ahead of their episodes (or a
                    # sub-env is half-stepped): continuing would record a gap.
                    force_reset=force_reset or self._interrupted,
                )
            except BaseException:
                self._interrupted = True
                raise
            self._interrupted = False
            self._callback(
                "on_sample_end", env_runner=self, metrics_logger=self.metrics, samples=samples
            )
        self._time_after_sampling = time.perf_counter()
        if cfg(self.config, "output") is not None:  # offline_data(output=...): record them
            if self._offline_writer is None:
                from fastrollout.offline.writer import for_runner

                self._offline_writer = for_runner(self)
            self._offline_writer.write(samples)
        return samples

    def sample_fragments(
        self, fragment_length: int | None = None, *, explore: bool | None = None
    ) -> list[EpisodeT]:
        """Samples exactly ``fragment_length`` env steps from every sub-env.

        The count of RLlib's old stack (``RolloutWorker`` with ``truncate_episodes``):
        ``fragment_length * num_envs`` steps in all, each sub-env stopping at its own
        fragment (a sub-env that took its steps waits, its next action computed in the
        next call, while the others catch up on the steps their resets took). Chunks
        continue across calls as with ``sample``. fastrollout's own method.

        Args:
            fragment_length: Env steps per sub-env (default: the config's
                ``rollout_fragment_length``).
            explore: As in :meth:`sample`.

        Returns:
            The done episodes and the ongoing episodes' chunks, as :meth:`sample`.

        Raises:
            ValueError: If the fragment is below 1, or the sub-envs step only all together
                (gymnasium's ``AsyncVectorEnv``, natively vectorized envs).
        """
        if self._multi_agent:
            # (Its lockstep list of envs resets a sub-env at once: every turn steps each
            # sub-env once, so sample(num_timesteps=k * num_envs) is exact there.)
            raise NotImplementedError("sample_fragments: single-agent runners only")
        k = self._fragment_length() if fragment_length is None else int(fragment_length)
        if k < 1:
            raise ValueError(f"fragment_length must be at least 1, got {k}")
        if self._sub_envs is not None and not self._sub_envs.steps_subsets:
            raise ValueError(
                f"{type(self._sub_envs).__name__} steps all its sub-envs together, so each "
                "cannot stop at its own fragment: use sample(num_timesteps=...)"
            )
        self._fragment_budget = k
        try:
            return self.sample(num_timesteps=k * self.num_envs, explore=explore)
        finally:
            self._fragment_budget = None

    def _release_held(self) -> None:
        """Puts the sub-envs held by the last ``sample_fragments`` call back into the turns."""
        raise NotImplementedError  # pragma: no cover (single-agent runners hold sub-envs)

    def _pull_state(self) -> None:
        """Loads the state server's state if it is newer than this runner's weights.

        An unreachable server leaves the runner sampling with what it has (logged once).
        """
        import ray

        try:
            newer = ray.get(
                self._env_runner_state_server.pull_if_newer.remote(self._weights_seq_no)
            )
        except ray.exceptions.RayError as err:
            if not getattr(self, "_warned_state_server", False):
                self._warned_state_server = True
                logging.getLogger(__name__).warning(
                    "the EnvRunnerStateServer did not answer (%s); sampling with the "
                    "current weights",
                    type(err).__name__,
                )
            return
        if newer is not None:
            self.set_state(newer)

    def sample_get_state_and_metrics(self) -> tuple[Any, dict[str, Any], Any]:
        """``sample()``, then the connector states and metrics, in one call (RLlib's).

        RLlib's asynchronous algorithms (IMPALA, APPO) call this on their remote runners.

        Returns:
            The episodes put into Ray's object store (their reference), the runner's state
            without the module, and ``get_metrics()``.
        """
        import ray

        episodes = self.sample()
        states = self.get_state(not_components=keys.COMPONENT_RL_MODULE)
        return ray.put(episodes), states, self.get_metrics()

    def _fragment_length(self) -> int:
        """The env steps per sub-env of a ``sample()`` call without counts.

        The config's ``get_rollout_fragment_length(worker_index)`` where it has one
        (``RunnerConfig`` and RLlib's config: ``"auto"`` splits the train batch over all
        sub-envs of all runners), else ``rollout_fragment_length`` (200 for ``"auto"``).
        """
        get = getattr(self.config, "get_rollout_fragment_length", None)
        if callable(get):
            try:
                return max(1, int(get(self.worker_index)))
            except (ValueError, TypeError, AttributeError):  # "auto" with no batch size
                pass
        fragment = cfg(self.config, "rollout_fragment_length", 200)
        return 200 if fragment == "auto" else int(fragment)

    # -- the sampling loop -----------------------------------------------------------
    #
    # One loop for both runners and every sub-env backend. A turn: the sub-envs that wait
    # for an action get one (env-to-module, one forward pass per module, module-to-env),
    # the backend steps them, and the steps that finished are recorded in one native
    # call. The runners differ in the hooks: _reset_all, _act_and_send, _record_steps,
    # _record_reset, _restart_sub_env, _episode_ended.

    def _sample(
        self,
        *,
        num_timesteps: int | None,
        num_episodes: int | None,
        explore: bool,
        random_actions: bool,
        force_reset: bool,
    ) -> list[EpisodeT]:
        """Samples with the counts resolved (exactly one of them is given)."""
        self._call = _SampleCall(
            num_timesteps=num_timesteps,
            num_episodes=num_episodes,
            explore=explore,
            random_actions=random_actions,
            to_numpy=bool(cfg(self.config, "episodes_to_numpy", True)),
        )
        call = self._call
        if self._fragment_budget is not None:
            call.left = np.full(self.num_envs, self._fragment_budget, np.int64)
        if self._needs_initial_reset or (
            # External simulators' episodes cannot be reset: they go on across calls.
            (force_reset or num_episodes is not None) and not self._sub_envs.external
        ):
            self._reset_all()
        if num_episodes is not None and not self._sub_envs.external:
            self._needs_initial_reset = True
        if self._held:
            self._release_held()
        if self._done_carried:
            k = len(self._done_carried) if num_episodes is None else num_episodes
            call.done_out, self._done_carried = self._done_carried[:k], self._done_carried[k:]
            call.episodes = len(call.done_out)
        wait_s = float(cfg(self.config, "remote_env_batch_wait_ms", 0)) / 1000.0
        self._per_step_callbacks = self._has_callbacks("on_episode_start") or self._has_callbacks(
            "on_episode_step"
        )
        sub_envs = self._sub_envs
        while not call.finished(self._counted_steps()) and not sub_envs.exhausted:
            if self._ready is None or len(self._ready):
                self._act_and_send()
            start = time.perf_counter()
            results = self._poll(wait_s)
            self._log_time_since(keys.ENV_STEP_TIMER, start)
            if results.episode_ids:
                # Episodes named by their simulator keep its id.
                for i, eid in results.episode_ids.items():
                    self._episodes[i].id_ = eid
            done = self._record_steps(results)
            if results.resets:
                for i, obs, infos in results.resets:
                    self._record_reset(i, obs, infos)
            if results.failed:
                for i, err in results.failed.items():
                    self._sub_env_failed(i, err)
            if done:
                self._end_episodes(done)
        self._done_episodes_for_metrics.extend(call.done_out)
        self._done_episodes_for_metrics.extend(call.done_untrained)
        ongoing = self._cut_ongoing(call.to_numpy) if num_timesteps is not None else []
        # Counted before the error below: untrained episodes served in this call still
        # count in the metrics.
        self._increase_sampled_metrics(
            call.env_steps + call.untrained_steps,
            len(call.done_out) + len(call.done_untrained),
            *self._agent_and_module_steps(),
        )
        if sub_envs.exhausted and not (call.env_steps or call.done_out):
            raise RuntimeError(
                f"{type(sub_envs.env).__name__}.run() returned: no episode runs and no more "
                "can start"
            )
        return call.done_out + ongoing

    def _poll(self, wait_s: float) -> StepResults:
        """The sub-envs whose step finished (see ``SubEnvs.poll``)."""
        return self._sub_envs.poll(wait_s)

    def _publish_weights(self) -> None:
        """Gives an external env the modules' weights, for simulators that act themselves.

        Once per new ``weights_seq_no`` (and the first time): a policy server hands them
        to its local-inference clients.
        """
        env = self._sub_envs.env
        current = env.weights_snapshot()
        if current is not None and current[0] == self._weights_seq_no:
            return
        assert self._module is not None
        modules, weights = {}, {}
        for mid, m in self._module.items():
            cls = type(m)
            modules[mid] = {
                "class": f"{cls.__module__}:{cls.__qualname__}",
                "model_config": dict(m.model_config),
                "observation_space": m.observation_space,
                "action_space": m.action_space,
                "inference_only": True,
            }
            weights[mid] = m.get_state(inference_only=True)
        env._set_weights_snapshot((self._weights_seq_no, modules, weights))

    def _logp_of(self, module_id: Any, dist_inputs: Any, actions: Any, explore: bool) -> Any:
        """The module's log-probabilities of given actions (logged by a simulator).

        Args:
            module_id: The module.
            dist_inputs: Its ``action_dist_inputs`` rows for these actions.
            actions: The actions, batched.
            explore: Whether the distribution is the exploration one.

        Returns:
            A float32 array, or None where the module's distribution cannot say.
        """
        if self._module is None or module_id not in self._module:
            return None
        module = self._module[module_id]
        try:
            cls = (
                module.get_exploration_action_dist_cls()
                if explore
                else module.get_inference_action_dist_cls()
            )
            dist = cls.from_logits(torch.as_tensor(np.asarray(dist_inputs)))
            with torch.no_grad():
                logp = dist.logp(torch.as_tensor(np.asarray(actions)))
        except (NotImplementedError, TypeError, ValueError, RuntimeError, AttributeError):
            return None
        return logp.detach().cpu().numpy().astype(np.float32)

    def _counted_steps(self) -> int:
        """The steps ``num_timesteps`` counts (env steps; agent steps where configured)."""
        return self._call.env_steps

    def _agent_and_module_steps(self) -> tuple[Mapping[Any, int], Mapping[Any, int]]:
        """The steps per agent and per module of this call, for the sampled-step metrics."""
        n = self._call.env_steps
        return {keys.DEFAULT_AGENT_ID: n}, {DEFAULT_MODULE_ID: n}

    def _end_episodes(self, done: list[int]) -> None:
        """Returns the episodes that ended and starts their sub-envs' next ones."""
        call = self._call
        sub_envs = self._sub_envs
        for i in done:
            self._episode_callback("on_episode_end", i)
            episode = self._episodes[i]
            self._episode_ended(episode)
            enough = call.num_episodes is not None and call.episodes >= call.num_episodes
            if not sub_envs.trains(i):
                # Held for the metrics until get_metrics.
                episode._seal()
                call.done_untrained.append(episode)
            elif enough:
                # External episodes cannot be reset to stop here: the next call returns it.
                self._done_carried.append(self._episode_out(episode, call.to_numpy))
            else:
                call.episodes += 1
                call.done_out.append(self._episode_out(episode, call.to_numpy))
            self._new_episode(i)
            if (
                call.num_episodes is not None
                and call.episodes >= call.num_episodes
                # The next call resets the sub-envs; external episodes go on instead.
                and not sub_envs.external
            ):
                return
            if not sub_envs.autoresets:
                self._reset_sub_env(i, None)

    def _episode_ended(self, episode: Any) -> None:
        """Notes an episode that ended (before it is returned)."""

    def _reset_sub_env(self, i: int, seed: int | None) -> None:
        """Resets sub-env ``i`` into its new episode (recorded now, or when it finishes)."""
        start = time.perf_counter()
        try:
            result = self._sub_envs.reset(i, seed)
        except Exception as err:
            self._sub_env_failed(i, err)
            return
        self._log_time_since(keys.ENV_RESET_TIMER, start)
        if result is not None:
            self._record_reset(i, *result)

    def _sub_env_failed(self, i: int, err: BaseException) -> None:
        """A sub-env's step or reset raised, or its process or actor was lost.

        Without ``restart_failed_sub_environments`` the error is raised. With it, only
        this sub-env's episode is dropped (its steps in this call no longer count) and the
        sub-env is recreated; a failure to create it (its env check included) is one more
        failed attempt. More than ``max_sub_environment_restart_attempts`` failures of
        one sub-env in a row (without a step of it recorded in between) raise the last
        error.

        Raises:
            BaseException: ``err`` (or a later creation error), as described.
        """
        self.metrics.log_value(keys.NUM_ENV_STEP_FAILURES_LIFETIME, 1, reduce="lifetime_sum")
        if not cfg(self.config, "restart_failed_sub_environments", False):
            raise err
        max_attempts = int(cfg(self.config, "max_sub_environment_restart_attempts", 5))
        episode = self._episodes[i]
        self._ongoing_episodes_for_metrics.pop(episode.id_, None)
        self._drop_steps(episode)
        if self._call.left is not None:  # sample_fragments: its steps are taken again
            self._call.left[i] += len(episode)
        self._new_episode(i)
        self._failing = True
        while True:
            self._failures_in_a_row[i] += 1
            if self._failures_in_a_row[i] > max_attempts:
                err.add_note(
                    f"sub-env {i} failed {self._failures_in_a_row[i]} times in a row "
                    f"(max_sub_environment_restart_attempts={max_attempts})"
                )
                raise err
            try:
                self._sub_envs.recreate(i)
            except Exception as creation_err:
                err = creation_err
                continue
            self.metrics.log_value(keys.NUM_ENV_RESTARTS_LIFETIME, 1, reduce="lifetime_sum")
            break
        self._restart_sub_env(i)

    def _drop_steps(self, episode: Any) -> None:
        """Uncounts a dropped episode's steps in this call (they are not returned)."""
        self._call.env_steps -= len(episode)

    def _sub_envs_stepped(self, ids: Any, started: Any = ()) -> None:
        """Ends the failure runs of sub-envs that recorded a step.

        Args:
            ids: The sub-envs of the recorded rows (None: all).
            started: Those whose row was a reset, not a step.
        """
        if not self._failing:
            return
        runs = self._failures_in_a_row
        for i in range(self.num_envs) if ids is None else ids:
            if i not in started:
                runs[i] = 0
        self._failing = any(runs)

    @abc.abstractmethod
    def _reset_all(self) -> None:
        """Starts new episodes in every sub-env (with the runner's seed the first time)."""

    @abc.abstractmethod
    def _act_and_send(self) -> None:
        """Computes the actions of the sub-envs that wait for one, and sends them."""

    @abc.abstractmethod
    def _record_steps(self, results: StepResults) -> list[int]:
        """Records the finished steps (one native call).

        Returns:
            The sub-envs whose episode ended.
        """

    @abc.abstractmethod
    def _record_reset(self, i: int, obs: Any, infos: Any) -> None:
        """Records a finished reset of sub-env ``i`` into its (new) episode."""

    @abc.abstractmethod
    def _restart_sub_env(self, i: int) -> None:
        """Starts the recreated sub-env ``i`` into its new episode."""

    @abc.abstractmethod
    def _new_episode(self, i: int) -> None:
        """Makes sub-env ``i``'s new (empty) episode."""

    def _log_time_since(self, key: str, start: float) -> None:
        """Logs ``perf_counter() - start`` as the per-step timer ``key``.

        The hot loop times its stages with this (one native call) instead of ``log_time``
        blocks (a context object and a stat lookup per step: 1.2 vs 0.2 µs, four times per
        vector step). The stat is created as ``log_time`` creates it, once per ``sample``
        call and only for the stages that run (RLlib has no module timers when sampling
        random actions).
        """
        if key not in self._timers_ready:
            self.metrics.log_time(key)
            self._timers_ready.add(key)
        self.metrics.log_value(key, time.perf_counter() - start)

    def _connect(self, pipeline: Any, batch: dict[Any, Any], explore: bool) -> dict[Any, Any]:
        """Runs a connector pipeline with this runner's module, episodes and metrics.

        Args:
            pipeline: The env-to-module or module-to-env pipeline.
            batch: ``{module_id: {column: value}}``.
            explore: Whether the runner explores.

        Returns:
            The pipeline's output batch.
        """
        call = {
            "rl_module": self._module,
            "episodes": self._episodes,
            "explore": explore,
            "shared_data": self._shared_data,
            "metrics": self.metrics,
        }
        if type(pipeline).__call__ is ConnectorPipelineV2.__call__:
            # What __call__ runs, without packing these keywords into the same dict
            # (about 1 µs per call; the runners make two per vector step).
            return pipeline._run(pipeline.connectors, call, batch)
        return pipeline(batch=batch, **call)

    def _observations_to_module(
        self, observations: dict[Any, Any], explore: bool
    ) -> dict[Any, Any]:
        """Runs the env-to-module pipeline on ``{module_id: observations}``.

        A pipeline that only converts does so directly
        (``EnvToModulePipeline.convert_observations``); any other is called.

        Args:
            observations: The observations batched per module.
            explore: Whether the runner explores.

        Returns:
            ``{module_id: {column: tensor, ...}}``, the pipeline's output.
        """
        pipeline = self._connectors.env_to_module
        batch = pipeline.convert_observations(self._module, observations)
        if batch is not None:
            return batch
        batch = {mid: {Columns.OBS: obs} for mid, obs in observations.items()}
        return self._connect(pipeline, batch, explore)

    def _act(self, batch: Any, explore: bool, ts: int) -> tuple[dict[Any, Any], float]:
        """The module's forward pass and the module-to-env pipeline, without gradient.

        Args:
            batch: The env-to-module pipeline's output.
            explore: Explore (``forward_exploration``) or act greedily.
            ts: Env steps sampled so far in this ``sample`` call.

        Returns:
            The module-to-env pipeline's output, and the ``perf_counter`` time its stage
            started (the caller logs the stage's timer when its own part of the stage
            is done too).
        """
        grad_was_on = grad_off()
        try:
            states = self._states
            if not states:
                return self._act_with(batch, explore, ts)
            # Stateful modules: their STATE_IN (and a one-step time axis) go in, their
            # STATE_OUT is kept for the slots' next steps.
            slots = self._state_slots(batch)
            states.add_state_in(batch, slots)
            to_env, start = self._act_with(batch, explore, ts)
            states.store(to_env, slots)
            return to_env, start
        finally:
            grad_restore(grad_was_on)

    def _act_with(self, batch: Any, explore: bool, ts: int) -> tuple[dict[Any, Any], float]:
        """``_act``'s forward pass and module-to-env pipeline (the direct step where it applies)."""
        if self._default_act is not None:
            direct = self._default_act(self, batch, ts)
            if direct is not None:
                return direct
        out = self._forward(batch, explore, ts)
        if self._states:
            self._states.remove_time_axis(out)
        start = time.perf_counter()
        return self._connect(self._connectors.module_to_env, out, explore), start

    @abc.abstractmethod
    def _state_slots(self, batch: dict[Any, Any]) -> dict[Any, list[Any]]:
        """The recurrent-state slot of each row of each module's batch (see RecurrentStates)."""

    def _forward(self, batch: Any, explore: bool, ts: int) -> Any:
        """One forward pass of the module on an env-to-module batch.

        The caller has switched autograd off (once per vector step, see ``_act``).

        Args:
            batch: The env-to-module pipeline's output.
            explore: ``forward_exploration`` (else ``forward_inference``).
            ts: Env steps sampled so far in this ``sample`` call.

        Returns:
            The module's output.
        """
        assert self._module is not None
        start = time.perf_counter()
        if not explore:
            out = self._module.forward_inference(batch)
        else:
            out = self._module.forward_exploration(batch, t=self._exploration_t(ts))
        self._log_time_since(keys.RLMODULE_INFERENCE_TIMER, start)
        return out

    def _exploration_t(self, ts: int) -> int:
        """The global env step count passed to ``forward_exploration`` as ``t``.

        Exploration schedules read it; RLlib estimates it from this runner's count as if
        all runners sampled at the same rate.

        Args:
            ts: Env steps sampled so far in this ``sample`` call.

        Returns:
            The estimate.
        """
        runners = int(cfg(self.config, "num_env_runners", 0)) or 1
        return (self.num_env_steps_sampled_lifetime // runners + ts) * runners

    def _episode_out(self, episode: Any, to_numpy: bool) -> Any:
        """An episode (done or a chunk) as ``sample`` returns it.

        It receives no more steps here (a chunk's successor is cut first): compressed
        observations keep nothing raw.
        """
        episode._seal()
        return episode.to_numpy() if to_numpy else episode

    def _cut_ongoing(self, to_numpy: bool) -> list[Any]:
        """Returns the ongoing episodes' chunks and continues each in a successor.

        Args:
            to_numpy: Numpy'ize the returned chunks.

        Returns:
            The non-empty chunks (also kept for the episodes' metrics).
        """
        horizon = int(cfg(self.config, "episode_lookback_horizon", 1))
        continuations = [e.cut(len_lookback_buffer=horizon) for e in self._episodes]
        out = []
        trains = self._sub_envs.trains
        for i, e in enumerate(self._episodes):
            if len(e) == 0:
                continue
            e.validate()
            self._ongoing_episodes_for_metrics[e.id_].append(e)
            if trains(i):
                out.append(self._episode_out(e, to_numpy))
        self._episodes = continuations
        return out

    @abc.abstractmethod
    def get_spaces(self) -> dict[str, Any]:
        """The env's and each module's (observation space, action space)."""

    @abc.abstractmethod
    def get_metrics(self) -> dict[str, Any]:
        """The reduced metrics since the last call."""

    def _build_config_modules(self, spaces: dict[str, tuple[Any, Any]]) -> MultiRLModule:
        """The inference-only modules that a ``RunnerConfig``'s module settings describe.

        Each module's spec (``rl_module_spec``, ``policies``, ``model_config``) is resolved
        by :func:`~fastrollout.modules.specs.resolve_module_specs`; one whose module class is
        RLlib's builds as the modules of runners made from RLlib's config do.
        """
        multi_class, specs = resolve_module_specs(
            cfg(self.config, "rl_module_spec"),
            cfg(self.config, "policies"),
            cfg(self.config, "model_config"),
            spaces,
        )
        built = {
            mid: _rllib.build_from_spec(spec) if is_rllib_spec(spec) else spec.build()
            for mid, spec in specs.items()
        }
        return multi_class(rl_modules=built)

    #: Whether the runner samples multi-agent episodes (its modules are built as RLlib's
    #: multi-agent runner builds them).
    _multi_agent = False

    def make_module(self) -> None:
        """Builds the modules (inference-only, on the device) and the connectors.

        From fastrollout's ``RunnerConfig`` the modules are its ``rl_module`` specs (or
        the default MLP module); from RLlib's ``AlgorithmConfig`` they are what RLlib's
        runner of the same kind builds (none where that config has no module).
        """
        spaces = self.get_spaces()
        modules = {k: v for k, v in spaces.items() if not k.startswith("__")}
        if self._rllib:
            module = _rllib.build_modules(
                self.config,
                None if self.env is None else getattr(self.env, "unwrapped", self.env),
                spaces,
                multi_agent=self._multi_agent,
            )
        else:
            module = self._build_config_modules(modules)
        if module is not None:
            module.to(self._device)
            # A runner only samples: eval mode once here, so that forward passes need not
            # switch modes per call.
            for sub in module.values():
                sub.eval()
        self._module = module
        self._conn = Connectors(
            config=self.config,
            env=self.env,
            spaces=spaces,
            observation_spaces={mid: sp[0] for mid, sp in modules.items()},
            action_spaces={mid: sp[1] for mid, sp in modules.items()},
            device=self._device,
        )

    def __repr__(self) -> str:
        # A runner built from a config with remote runners is one runner of a group: the
        # local one (index 0), which samples its own sub-envs only.
        group = (
            f", runner {self.worker_index} of a group with {self.num_workers} remote runners"
            if self.num_workers
            else ""
        )
        env = "no env" if self.env is None else f"sub-envs: {self.num_envs}"
        return f"{type(self).__name__}({env}{group})"

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickles the runner as its config and state; unpickling builds a new runner.

        RLlib's runners are not pickled (they live in Ray actors); here
        ``pickle.loads(pickle.dumps(runner))`` is a runner of the same class built from
        the same config, worker index and spaces, with this runner's ``get_state()``
        loaded: module weights and ``weights_seq_no``, connector states and
        ``num_env_steps_sampled_lifetime``. Its envs are new and reset at its first
        ``sample`` (envs and ongoing episodes do not travel), its modules are built from
        the config (a module set on the runner by hand is not kept), and its
        MetricsLogger starts empty, so that metrics are not reported twice. The config
        must pickle: the callables in it (env creators, the policy mapping function)
        must be module-level functions or classes, not lambdas.

        Returns:
            The rebuild function and its arguments.
        """
        _, kwargs = self.get_ctor_args_and_kwargs()
        return _rebuild_runner, (type(self), kwargs, self.get_state())

    def ping(self) -> str:
        """Answers a health check (RLlib's ``FaultAwareApply.ping``).

        Returns:
            ``"pong"``.
        """
        return "pong"

    def apply(self, func: Any, *args: Any, **kwargs: Any) -> Any:
        """Calls ``func(self, *args, **kwargs)`` (RLlib's ``FaultAwareApply.apply``).

        RLlib's ``EnvRunnerGroup`` runs its remote calls through this. As in RLlib, a
        runner in a Ray actor whose ``func`` raised ends its process (the error logged),
        since ``func`` may have left it half-changed: Ray restarts the actor fresh where the
        config restarts failed runners. Outside an actor the error propagates.

        Args:
            func: The function.
            *args: Passed on.
            **kwargs: Passed on.

        Returns:
            What ``func`` returns.
        """
        try:
            return func(self, *args, **kwargs)
        except Exception:
            if not _in_ray_actor():
                raise
            logging.getLogger(__name__).exception("runner call failed; ending this actor")
            if cfg(self.config, "restart_failed_env_runners", False):
                time.sleep(float(cfg(self.config, "delay_between_env_runner_restarts_s", 0)))
            sys.exit(1)

    def assert_healthy(self) -> None:
        """Checks that the runner has its env(s) and module, and was not stopped.

        Raises:
            AssertionError: If the env or the module is missing, or the envs are closed.
        """
        assert self.env is not None, f"{type(self).__name__} has no env (call make_env())"
        assert self._stopped is None, (
            f"{type(self).__name__} cannot sample: {self._stopped} (call make_env())"
        )
        assert self._module is not None, f"{type(self).__name__} has no module"

    def stop(self) -> None:
        """Closes the env(s); the runner samples again only after ``make_env()``.

        A second call does nothing. The state, weights and metrics stay readable.
        """
        if self._stopped is not None:
            return
        self._stopped = "stop() closed its env(s)"
        if self._sub_envs is not None:
            self._sub_envs.close()
        if self._offline_writer is not None:  # flush and join the episode writer
            self._offline_writer.close()
            self._offline_writer = None

    def _envs_ready(self) -> None:
        """Marks new envs: ``make_env`` calls this once it has created them."""
        self._stopped = None
        self._interrupted = False
        self._needs_initial_reset = True
        self._done_carried = []
        self._held = {}

    def _close_env_quietly(self) -> None:
        """Closes existing sub-envs before they are replaced (errors ignored)."""
        if self._sub_envs is not None:
            with contextlib.suppress(Exception):
                self._sub_envs.close()

    # -- metrics -------------------------------------------------------------------

    def _increase_sampled_metrics(
        self,
        env_steps: int,
        episodes: int,
        agent_steps: Mapping[Any, int],
        module_steps: Mapping[str, int],
    ) -> None:
        """Logs the counts of one ``sample`` call and adds to the lifetime env steps."""
        m = self.metrics
        self.num_env_steps_sampled_lifetime += env_steps
        m.log_value(keys.NUM_ENV_STEPS_SAMPLED, env_steps, reduce="sum")
        m.log_value(
            keys.NUM_ENV_STEPS_SAMPLED_LIFETIME,
            env_steps,
            reduce="lifetime_sum",
            with_throughput=True,
        )
        m.log_value(keys.NUM_EPISODES, episodes, reduce="sum")
        m.log_value(keys.NUM_EPISODES_LIFETIME, episodes, reduce="lifetime_sum")
        for aid, k in agent_steps.items():
            m.log_value((keys.NUM_AGENT_STEPS_SAMPLED, str(aid)), k, reduce="sum")
            m.log_value((keys.NUM_AGENT_STEPS_SAMPLED_LIFETIME, str(aid)), k, reduce="lifetime_sum")
        for mid, k in module_steps.items():
            m.log_value((keys.NUM_MODULE_STEPS_SAMPLED, mid), k, reduce="sum")
            m.log_value((keys.NUM_MODULE_STEPS_SAMPLED_LIFETIME, mid), k, reduce="lifetime_sum")

    def _log_episode_end(self, length: int, ret: float, sec: float, win: int) -> None:
        """Logs a done episode's length, return and duration (all its chunks summed)."""
        m = self.metrics
        m.log_value(keys.EPISODE_LEN_MEAN, length, window=win)
        m.log_value(keys.EPISODE_RETURN_MEAN, ret, window=win)
        m.log_value(keys.EPISODE_DURATION_SEC_MEAN, sec, window=win)
        m.log_value(keys.EPISODE_LEN_MIN, length, reduce="min", window=win)
        m.log_value(keys.EPISODE_RETURN_MIN, ret, reduce="min", window=win)
        m.log_value(keys.EPISODE_LEN_MAX, length, reduce="max", window=win)
        m.log_value(keys.EPISODE_RETURN_MAX, ret, reduce="max", window=win)

    # -- state -----------------------------------------------------------------------

    def get_state(
        self,
        components: str | Collection[str] | None = None,
        *,
        not_components: str | Collection[str] | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """The runner's state.

        Module weights with ``weights_seq_no``, connector states, and the lifetime
        env-step count.

        Args:
            components: Only these components (``"rl_module"``,
                ``"env_to_module_connector"``, ``"module_to_env_connector"``).
            not_components: Leave these out.
            **kwargs: Passed to the module's ``get_state``.

        Returns:
            The state dict (RLlib's keys).
        """

        def wanted(c: str) -> bool:
            keep = {components} if isinstance(components, str) else components
            drop = {not_components} if isinstance(not_components, str) else not_components
            return (keep is None or c in keep) and (drop is None or c not in drop)

        state: dict[str, Any] = {
            keys.NUM_ENV_STEPS_SAMPLED_LIFETIME: self.num_env_steps_sampled_lifetime
        }
        if wanted(keys.COMPONENT_RL_MODULE) and self._module is not None:
            state[keys.COMPONENT_RL_MODULE] = self._module_state(**kwargs)
            state[keys.WEIGHTS_SEQ_NO] = self._weights_seq_no
        conn = self._connectors.get_state()
        for c in (keys.COMPONENT_ENV_TO_MODULE_CONNECTOR, keys.COMPONENT_MODULE_TO_ENV_CONNECTOR):
            if wanted(c):
                state[c] = conn[c]
        return state

    def _module_state(self, **kwargs: Any) -> Any:
        """The ``rl_module`` entry of ``get_state``: the states keyed by module id."""
        assert self._module is not None
        return self._module.get_state(**kwargs)

    def _reduced_metrics(self) -> dict[str, Any]:
        """``reduce()`` of the runner's logger, in RLlib's form when the config is RLlib's."""
        results = self.metrics.reduce()
        if not self._rllib:
            return results
        from fastrollout.metrics import to_rllib_results

        return to_rllib_results(results)

    def set_state(self, state: dict[str, Any]) -> None:
        """Loads a state from ``get_state`` (of this or another runner).

        Module weights are loaded only if ``state["weights_seq_no"]`` is 0 or missing
        (a forced update) or newer than this runner's, as RLlib does; the runner's number
        then becomes the newer one (unlike RLlib, an older number never replaces it). A
        state for a single module (not keyed by module id) is loaded into
        ``DEFAULT_MODULE_ID``.

        Args:
            state: The state.
        """
        for c in (keys.COMPONENT_ENV_TO_MODULE_CONNECTOR, keys.COMPONENT_MODULE_TO_ENV_CONNECTOR):
            if c in state:
                self._connectors.set_state(c, state[c])
        if keys.COMPONENT_RL_MODULE in state and self._module is not None:
            seq = int(state.get(keys.WEIGHTS_SEQ_NO, 0) or 0)
            if seq == 0 or self._weights_seq_no < seq:
                weights = state[keys.COMPONENT_RL_MODULE]
                if type(weights).__name__ == "ObjectRef":
                    # RLlib's group puts the weights into Ray's object store once for all.
                    import ray

                    weights = ray.get(weights)
                if not all(mid in self._module for mid in weights):
                    weights = {DEFAULT_MODULE_ID: weights}
                self._module.set_state(weights)
            # RLlib 2.60 takes any positive number, also an older one whose weights it
            # just refused, and then reports a version it does not hold; the number here
            # only moves forward (pinned in tests/test_single_agent_env_runner.py).
            if seq > self._weights_seq_no:
                self._weights_seq_no = seq
        if keys.NUM_ENV_STEPS_SAMPLED_LIFETIME in state:
            self.num_env_steps_sampled_lifetime = int(state[keys.NUM_ENV_STEPS_SAMPLED_LIFETIME])

    def get_weights(self, modules: Collection[str] | None = None) -> dict[str, Any]:
        """The modules' weights (``get_state(components="rl_module")["rl_module"]``).

        Args:
            modules: Only these module ids.

        Returns:
            ``{module_id: {key: ndarray}}``.
        """
        assert self._module is not None
        return self._module.get_state(components=modules)

    def set_weights(
        self, weights: dict[str, Any], global_vars: Any = None, weights_seq_no: int = 0
    ) -> None:
        """Loads module weights (``set_state`` with ``weights_seq_no``).

        Args:
            weights: ``{module_id: {key: array}}``.
            global_vars: Must be None (RLlib's old argument).
            weights_seq_no: The weights' sequence number (0: always load).

        Raises:
            ValueError: If ``global_vars`` is given.
        """
        if global_vars is not None:
            raise ValueError("global_vars is not supported (RLlib's new stack has none either)")
        self.set_state({keys.COMPONENT_RL_MODULE: weights, keys.WEIGHTS_SEQ_NO: weights_seq_no})

    # -- checkpoints (fastrollout.checkpoints.Checkpointable) -------------------------

    def get_ctor_args_and_kwargs(self) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The constructor's arguments: config, worker index, number of workers, spaces.

        Returns:
            ``((), kwargs)``.
        """
        kwargs: dict[str, Any] = {
            "config": self.config,
            # None: built directly, not by a group (see __init__).
            "worker_index": self.worker_index if self._in_group else None,
            "num_workers": self.num_workers,
        }
        if self.spaces:
            kwargs["spaces"] = self.spaces
        return (), kwargs

    def get_checkpointable_components(self) -> list[tuple[str, Any]]:
        """The modules and the two connector pipelines (RLlib's component names).

        Returns:
            ``[("rl_module", module), ("env_to_module_connector", pipeline),
            ("module_to_env_connector", pipeline)]`` (those the runner has).
        """
        out: list[tuple[str, Any]] = []
        if self._module is not None:
            out.append((keys.COMPONENT_RL_MODULE, self._module))
        if self._conn is not None:
            out.append((keys.COMPONENT_ENV_TO_MODULE_CONNECTOR, self._conn.env_to_module))
            out.append((keys.COMPONENT_MODULE_TO_ENV_CONNECTOR, self._conn.module_to_env))
        return out

    def _write_component(self, name: str, state: Any, path: pathlib.Path) -> str:
        """Module weights as one ``.npz`` per module; connector states as a state tree."""
        if name != keys.COMPONENT_RL_MODULE:
            return super()._write_component(name, state, path)
        module = self._module
        by_id = module is not None and all(
            mid in module and isinstance(w, Mapping) for mid, w in state.items()
        )
        # The single-agent runner's state is its one module's (RLlib's form): on disk it
        # is that module's directory all the same.
        write_module_states(path, state if by_id else {DEFAULT_MODULE_ID: state})
        return "npz"

    def _read_component(self, name: str, path: pathlib.Path) -> Any:
        """Reads what :meth:`_write_component` wrote."""
        if name != keys.COMPONENT_RL_MODULE:
            return super()._read_component(name, path)
        return read_module_states(path)

    def _set_restored_state(self, state: dict[str, Any]) -> None:
        """Loads a checkpoint's state: weights always, with the saved ``weights_seq_no``.

        ``set_state`` refuses weights older than the runner's; a restore goes back to
        the saved weights and their number.
        """
        forced = dict(state)
        if keys.COMPONENT_RL_MODULE in forced:
            forced[keys.WEIGHTS_SEQ_NO] = 0
        self.set_state(forced)
        if keys.COMPONENT_RL_MODULE in state and keys.WEIGHTS_SEQ_NO in state:
            self._weights_seq_no = int(state[keys.WEIGHTS_SEQ_NO] or 0)

    def _read_legacy(self, path: pathlib.Path) -> dict[str, Any] | None:
        """The state of a ``state.pkl`` written by fastrollout before checkpoint format 1."""
        file = path / "state.pkl"
        if not file.is_file():
            return None
        with open(file, "rb") as f:
            saved = pickle.load(f)
        if not isinstance(saved, dict) or "state" not in saved:
            raise CheckpointError(f"{str(file)!r} is not a fastrollout runner state")
        if saved.get("class") != type(self).__name__:
            raise CheckpointError(
                f"checkpoint {str(path)!r} is of class {saved.get('class')}; it does not load "
                f"into a {type(self).__name__}"
            )
        warnings.warn(
            f"{str(path)!r} is a state.pkl checkpoint of an older fastrollout, deprecated and "
            "read for now; save it again with save_to_path to write the current layout",
            FutureWarning,
            stacklevel=4,
        )
        return dict(saved["state"])

    @property
    def _env_to_module(self) -> Any:
        """The env-to-module pipeline, under the name RLlib's ``EnvRunnerGroup`` reads.

        RLlib's group merges the remote runners' connector states with the local
        runner's pipelines (``merge_states``).
        """
        return self._connectors.env_to_module

    @property
    def _module_to_env(self) -> Any:
        """The module-to-env pipeline, under the name RLlib's ``EnvRunnerGroup`` reads."""
        return self._connectors.module_to_env

    @property
    def _connectors(self) -> Connectors:
        assert self._conn is not None, "the connectors are built with the module"
        return self._conn

    def __del__(self) -> None:
        # Async vector envs hold sub-processes; close them with the runner.
        with contextlib.suppress(Exception):
            self.stop()
