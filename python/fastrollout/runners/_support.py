"""Pieces the runners share.

Config access, metric keys, env creation and restarts, and the default connector steps
around the native gather.

The runners read their configuration by RLlib 2.60's attribute names (``config.env``,
``config.num_envs_per_env_runner``, ``config.callbacks_on_episode_start``, ...), which
``fastrollout.RunnerConfig`` keeps; anything with those attributes works.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from fastrollout.core import DEFAULT_MODULE_ID, Columns

__all__ = [
    "DEFAULT_AGENT_ID",
    "cfg",
    "make_metrics_logger",
    "make_sub_env_creator",
]

DEFAULT_AGENT_ID = "default_agent"

# Metric keys, as RLlib 2.60 spells them (ray.rllib.utils.metrics).
NUM_ENV_STEPS_SAMPLED = "num_env_steps_sampled"
NUM_ENV_STEPS_SAMPLED_LIFETIME = "num_env_steps_sampled_lifetime"
NUM_AGENT_STEPS_SAMPLED = "num_agent_steps_sampled"
NUM_AGENT_STEPS_SAMPLED_LIFETIME = "num_agent_steps_sampled_lifetime"
NUM_MODULE_STEPS_SAMPLED = "num_module_steps_sampled"
NUM_MODULE_STEPS_SAMPLED_LIFETIME = "num_module_steps_sampled_lifetime"
NUM_EPISODES = "num_episodes"
NUM_EPISODES_LIFETIME = "num_episodes_lifetime"
EPISODE_LEN_MEAN = "episode_len_mean"
EPISODE_LEN_MIN = "episode_len_min"
EPISODE_LEN_MAX = "episode_len_max"
EPISODE_RETURN_MEAN = "episode_return_mean"
EPISODE_RETURN_MIN = "episode_return_min"
EPISODE_RETURN_MAX = "episode_return_max"
EPISODE_DURATION_SEC_MEAN = "episode_duration_sec_mean"
EPISODE_AGENT_RETURN_MEAN = "agent_episode_returns_mean"
EPISODE_MODULE_RETURN_MEAN = "module_episode_returns_mean"
EPISODE_AGENT_STEPS = "agent_steps"
WEIGHTS_SEQ_NO = "weights_seq_no"
SAMPLE_TIMER = "sample"
TIME_BETWEEN_SAMPLING = "time_between_sampling"
ENV_RESET_TIMER = "env_reset_timer"
ENV_STEP_TIMER = "env_step_timer"
ENV_TO_MODULE_CONNECTOR = "env_to_module_connector"
RLMODULE_INFERENCE_TIMER = "rlmodule_inference_timer"
MODULE_TO_ENV_CONNECTOR = "module_to_env_connector"
NUM_ENV_STEP_FAILURES_LIFETIME = "num_env_step_failures_lifetime"
# fastrollout's own: sub-envs recreated after a crash (RLlib has no such counter).
NUM_ENV_RESTARTS_LIFETIME = "num_env_restarts_lifetime"

# State keys, as RLlib 2.60 spells them.
COMPONENT_RL_MODULE = "rl_module"
COMPONENT_ENV_TO_MODULE_CONNECTOR = "env_to_module_connector"
COMPONENT_MODULE_TO_ENV_CONNECTOR = "module_to_env_connector"

# Key in a sub-env's infos that tells the runner the sub-env was recreated this step.
RESTARTED_KEY = "__fastrollout_env_restarted__"

_MISSING = object()


def cfg(config: Any, name: str, default: Any = None) -> Any:
    """Reads a config attribute by RLlib's name (``default`` if the config lacks it).

    Args:
        config: A ``RunnerConfig`` (or anything with RLlib's attribute names).
        name: The attribute.
        default: Returned if the attribute is missing or None.

    Returns:
        The value.
    """
    value = getattr(config, name, _MISSING)
    if value is _MISSING or value is None:
        return default
    return value


def smoothing_window(config: Any) -> int:
    """The per-runner window of episode metrics, as RLlib splits it over runners.

    Args:
        config: The runner config.

    Returns:
        ``ceil(metrics_num_episodes_for_smoothing / max(num_env_runners, 1))``, at least 1.
    """
    n = int(cfg(config, "metrics_num_episodes_for_smoothing", 100))
    runners = int(cfg(config, "num_env_runners", 0)) or 1
    return max(1, math.ceil(n / runners))


# ---------------------------------------------------------------------------- metrics


class _Stat:
    __slots__ = ("ema", "lifetime", "reduce", "values", "window")

    def __init__(self, reduce: str, window: int | None) -> None:
        self.reduce = reduce
        self.window = window
        self.values: list[float] = []
        self.lifetime = 0.0
        self.ema: float | None = None


class _FallbackMetricsLogger:
    """A stand-in for ``fastrollout.metrics.MetricsLogger`` while it is not installed.

    It covers the subset of RLlib's MetricsLogger API the runners use.
    """

    def __init__(self) -> None:
        self._stats: dict[tuple, _Stat] = {}

    @staticmethod
    def _key(key: Any) -> tuple:
        return tuple(key) if isinstance(key, (tuple, list)) else (key,)

    def log_value(
        self,
        key: Any,
        value: Any,
        reduce: str = "mean",
        window: int | None = None,
        ema_coeff: float | None = None,
        clear_on_reduce: bool = False,
        with_throughput: bool = False,
    ) -> None:
        k = self._key(key)
        stat = self._stats.get(k)
        if stat is None:
            stat = self._stats[k] = _Stat(reduce, window)
        v = float(value)
        if stat.reduce == "lifetime_sum":
            stat.lifetime += v
        elif stat.reduce == "mean" and stat.window is None:
            c = 0.01 if ema_coeff is None else ema_coeff
            stat.ema = v if stat.ema is None else (1 - c) * stat.ema + c * v
        else:
            stat.values.append(v)
            if stat.window is not None and len(stat.values) > stat.window:
                del stat.values[: len(stat.values) - stat.window]

    def log_dict(self, stats: Mapping[str, Any], *, key: Any = None, **kwargs: Any) -> None:
        prefix = self._key(key) if key is not None else ()
        for k, v in stats.items():
            if isinstance(v, Mapping):
                self.log_dict(v, key=(*prefix, k), **kwargs)
            else:
                self.log_value((*prefix, k), v, **kwargs)

    @contextlib.contextmanager
    def log_time(self, key: Any, **kwargs: Any) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.log_value(key, time.perf_counter() - start, **kwargs)

    def peek(self, key: Any, default: Any = None) -> Any:
        stat = self._stats.get(self._key(key))
        return default if stat is None else self._value(stat)

    @staticmethod
    def _value(stat: _Stat) -> Any:
        if stat.reduce == "lifetime_sum":
            return stat.lifetime
        if stat.reduce == "mean" and stat.window is None:
            return stat.ema
        if not stat.values:
            return float("nan")
        if stat.reduce == "sum":
            return sum(stat.values)
        if stat.reduce == "min":
            return min(stat.values)
        if stat.reduce == "max":
            return max(stat.values)
        return sum(stat.values) / len(stat.values)

    def reduce(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, stat in self._stats.items():
            d = out
            for part in k[:-1]:
                d = d.setdefault(part, {})
            d[k[-1]] = self._value(stat)
            if stat.reduce == "sum":
                stat.values.clear()
        return out

    def get_state(self) -> dict[str, Any]:
        return {"stats": {k: vars_of(s) for k, s in self._stats.items()}}

    def set_state(self, state: Mapping[str, Any]) -> None:
        self._stats = {}
        for k, v in state["stats"].items():
            s = _Stat(v["reduce"], v["window"])
            s.values, s.lifetime, s.ema = list(v["values"]), v["lifetime"], v["ema"]
            self._stats[tuple(k)] = s


def vars_of(stat: _Stat) -> dict[str, Any]:
    """The fields of a fallback stat (for state dicts).

    Args:
        stat: The stat.

    Returns:
        Its fields.
    """
    return {s: getattr(stat, s) for s in _Stat.__slots__}


def make_metrics_logger() -> Any:
    """A new ``fastrollout.metrics.MetricsLogger`` (a small stand-in if not installed).

    Returns:
        The logger.
    """
    try:
        from fastrollout.metrics import MetricsLogger  # type: ignore[attr-defined]
    except ImportError:
        return _FallbackMetricsLogger()
    return MetricsLogger()


# ---------------------------------------------------------------------------- envs


def _fallback_creator(env: Any, env_config: Mapping[str, Any], worker_index: int, num_workers: int):
    def create(vector_index: int = 0) -> Any:
        ctx = dict(env_config)
        if isinstance(env, str):
            return gym.make(env, **ctx)
        try:
            from fastrollout.env import EnvContext  # type: ignore[attr-defined]

            ctx = EnvContext(
                ctx, worker_index=worker_index, vector_index=vector_index, num_workers=num_workers
            )
        except ImportError:
            pass
        return env(ctx)

    return create


def make_sub_env_creator(config: Any, worker_index: int, num_workers: int) -> Callable[[int], Any]:
    """The callable that creates one sub-env: ``creator(vector_index) -> env``.

    Uses ``fastrollout.env.make_env_creator`` (registered names, gymnasium ids, classes,
    creators; the env check unless ``disable_env_checking``).

    Args:
        config: The runner config (``env``, ``env_config``, ``disable_env_checking``).
        worker_index: The runner's index.
        num_workers: The number of remote runners.

    Returns:
        The creator.

    Raises:
        ValueError: If the config names no env.
    """
    env = cfg(config, "env")
    if env is None:
        raise ValueError(
            "no env configured: call config.environment(env=...) with a gymnasium id, a "
            "registered name, an env class or a creator"
        )
    env_config = dict(cfg(config, "env_config", {}))
    try:
        from fastrollout.env import make_env_creator  # type: ignore[attr-defined]
    except ImportError:
        return _fallback_creator(env, env_config, worker_index, num_workers)
    creator: Callable[[int], Any] = make_env_creator(
        env,
        env_config,
        worker_index=worker_index,
        num_workers=num_workers,
        disable_env_checking=bool(cfg(config, "disable_env_checking", False)),
    )
    return creator


class RestartingEnv(gym.Wrapper):  # type: ignore[type-arg]
    """A sub-env that recreates itself when its ``step`` or ``reset`` raises.

    On a crash in ``step`` the env is recreated (up to ``max_attempts`` tries in a row)
    and reset; the step then returns the new env's reset observation, reward 0, not done,
    and ``infos[RESTARTED_KEY] = number of recreations``. The runner reads that flag,
    drops the crashed episode, and starts a new one from the observation. A crash in
    ``reset`` is retried the same way. The retries are a loop with a bound, never
    recursion.

    Args:
        create: ``create() -> env``, a fresh env.
        max_attempts: Recreations in a row before the last error is raised.
    """

    def __init__(self, create: Callable[[], Any], max_attempts: int = 10) -> None:
        self._create = create
        self._max_attempts = max_attempts
        super().__init__(create())

    def _recreate(self) -> None:
        with contextlib.suppress(Exception):
            self.env.close()
        self.env = self._create()

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> Any:
        restarts = 0
        while True:
            try:
                obs, infos = self.env.reset(seed=seed, options=options)
            except Exception:
                restarts += 1
                if restarts > self._max_attempts:
                    raise
                self._recreate()
                continue
            if restarts:
                infos = dict(infos)
                infos[RESTARTED_KEY] = restarts
            return obs, infos

    def step(self, action: Any) -> Any:
        try:
            return self.env.step(action)
        except Exception:
            self._recreate()
            obs, infos = self.reset()
            infos = dict(infos)
            infos[RESTARTED_KEY] = infos.get(RESTARTED_KEY, 0) + 1
            return obs, 0.0, False, False, infos


# ---------------------------------------------------------------------------- connectors


def to_torch(batch: Any, device: torch.device) -> Any:
    """Numpy (nested in dicts/tuples) to torch tensors on ``device``.

    Args:
        batch: The batch.
        device: The target device.

    Returns:
        The same structure with tensors.
    """
    if isinstance(batch, np.ndarray):
        if batch.dtype == np.float64:
            batch = batch.astype(np.float32)
        t = torch.from_numpy(np.ascontiguousarray(batch))
        if device.type != "cpu":
            t = t.pin_memory().to(device, non_blocking=True)
        return t
    if isinstance(batch, Mapping):
        return {k: to_torch(v, device) for k, v in batch.items()}
    if isinstance(batch, tuple):
        return tuple(to_torch(v, device) for v in batch)
    if isinstance(batch, list):
        return [to_torch(v, device) for v in batch]
    return batch


def to_numpy(value: Any) -> Any:
    """Torch tensors (nested) to numpy arrays on the host.

    Args:
        value: The value.

    Returns:
        The same structure with numpy arrays.
    """
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    if isinstance(value, Mapping):
        return {k: to_numpy(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(to_numpy(v) for v in value)
    return value


def actions_for_env(actions: Any, space: gym.Space, normalize: bool, clip: bool) -> Any:
    """The actions to send to the env (Box actions unsquashed or clipped to the bounds).

    Box actions are unsquashed from [-1, 1] to the space's bounds (``normalize``), or
    clipped to them (``clip``), as RLlib's defaults do.

    Args:
        actions: Batched actions (numpy), nested as the space.
        space: The (single) action space.
        normalize: Unsquash (then clip) bounded float Box actions.
        clip: Clip Box actions to the bounds.

    Returns:
        The actions for the env (the input where nothing applies).
    """
    if isinstance(space, gym.spaces.Dict):
        return {k: actions_for_env(actions[k], s, normalize, clip) for k, s in space.spaces.items()}
    if isinstance(space, gym.spaces.Tuple):
        return tuple(
            actions_for_env(a, s, normalize, clip)
            for a, s in zip(actions, space.spaces, strict=True)
        )
    if not isinstance(space, gym.spaces.Box):
        return actions
    if normalize and np.issubdtype(space.dtype, np.floating) and space.is_bounded("both"):
        a = space.low + (np.asarray(actions) + 1.0) * (space.high - space.low) / 2.0
        return np.clip(a, space.low, space.high).astype(space.dtype, copy=False)
    if clip:
        return np.clip(actions, space.low, space.high).astype(space.dtype, copy=False)
    return actions


class DefaultConnectors:
    """The runner's connector work around the native gather and scatter.

    env-to-module: the user's connectors (from ``config.env_to_module_connector``) on the
    gathered ``{module_id: {obs: ndarray}}`` batch, then numpy to torch on the device.
    module-to-env: the user's connectors (``config.module_to_env_connector``), then
    actions sampled from ``action_dist_inputs`` (or the module's own ``actions``),
    ``action_logp`` when exploring, torch to numpy, and ``actions_for_env`` for Box
    action spaces.

    Args:
        env_to_module: User connectors run before numpy-to-torch.
        module_to_env: User connectors run on the module outputs first.
        device: The modules' device.
        action_spaces: Module id -> single action space.
        normalize_actions: Unsquash Box actions from [-1, 1] to the bounds.
        clip_actions: Clip Box actions to the bounds.
    """

    def __init__(
        self,
        *,
        env_to_module: list[Any],
        module_to_env: list[Any],
        device: torch.device,
        action_spaces: Mapping[str, gym.Space],
        normalize_actions: bool,
        clip_actions: bool,
    ) -> None:
        self.env_to_module = env_to_module
        self.module_to_env = module_to_env
        self.device = device
        self.action_spaces = dict(action_spaces)
        self.normalize_actions = normalize_actions
        self.clip_actions = clip_actions

    def run_env_to_module(
        self,
        batch: dict,
        *,
        rl_module: Any,
        episodes: list,
        explore: bool,
        shared_data: dict,
        metrics: Any,
    ) -> dict:
        """Runs the env-to-module side on a gathered batch.

        Args:
            batch: ``{module_id: {obs: ndarray}}``.
            rl_module: The MultiRLModule.
            episodes: The ongoing episodes (for connectors that read them).
            explore: Whether the runner explores.
            shared_data: Data shared by the connectors of one step.
            metrics: The runner's MetricsLogger.

        Returns:
            The batch with torch tensors on the device.
        """
        for c in self.env_to_module:
            batch = c(
                rl_module=rl_module,
                batch=batch,
                episodes=episodes,
                explore=explore,
                shared_data=shared_data,
                metrics=metrics,
            )
        return {mid: to_torch(b, self.device) for mid, b in batch.items()}

    def run_module_to_env(
        self,
        batch: dict,
        *,
        rl_module: Any,
        episodes: list,
        explore: bool,
        shared_data: dict,
        metrics: Any,
    ) -> dict:
        """Runs the module-to-env side on module outputs.

        Args:
            batch: ``{module_id: {column: tensor}}`` from the forward pass.
            rl_module: The MultiRLModule.
            episodes: The ongoing episodes.
            explore: Whether to sample (else the distribution's deterministic action).
            shared_data: Data shared by the connectors of one step.
            metrics: The runner's MetricsLogger.

        Returns:
            ``{module_id: {column: ndarray}}`` with ``actions`` and ``actions_for_env``.

        Raises:
            KeyError: If a module returned neither ``actions`` nor ``action_dist_inputs``.
        """
        for c in self.module_to_env:
            batch = c(
                rl_module=rl_module,
                batch=batch,
                episodes=episodes,
                explore=explore,
                shared_data=shared_data,
                metrics=metrics,
            )
        out = {}
        for mid, cols in batch.items():
            cols = dict(cols)
            if Columns.ACTIONS not in cols:
                if Columns.ACTION_DIST_INPUTS not in cols:
                    raise KeyError(
                        f"module {mid!r} returned neither {Columns.ACTIONS!r} nor "
                        f"{Columns.ACTION_DIST_INPUTS!r} (got {sorted(cols)})"
                    )
                module = rl_module[mid]
                dist_cls = (
                    module.get_exploration_action_dist_cls()
                    if explore
                    else module.get_inference_action_dist_cls()
                )
                dist = dist_cls.from_logits(cols[Columns.ACTION_DIST_INPUTS])
                if not explore:
                    dist = dist.to_deterministic()
                actions = dist.sample()
                cols[Columns.ACTIONS] = actions
                if explore and Columns.ACTION_LOGP not in cols:
                    cols[Columns.ACTION_LOGP] = dist.logp(actions)
            cols = to_numpy(cols)
            space = self.action_spaces.get(mid)
            if space is not None and Columns.ACTIONS_FOR_ENV not in cols:
                env_actions = actions_for_env(
                    cols[Columns.ACTIONS], space, self.normalize_actions, self.clip_actions
                )
                if env_actions is not cols[Columns.ACTIONS]:
                    cols[Columns.ACTIONS_FOR_ENV] = env_actions
            out[mid] = cols
        return out

    def get_state(self) -> dict[str, Any]:
        """The user connectors' states.

        Returns:
            ``{"env_to_module": [...], "module_to_env": [...]}``.
        """
        return {
            COMPONENT_ENV_TO_MODULE_CONNECTOR: [_state_of(c) for c in self.env_to_module],
            COMPONENT_MODULE_TO_ENV_CONNECTOR: [_state_of(c) for c in self.module_to_env],
        }

    def set_state(self, which: str, states: list[Any]) -> None:
        """Loads the user connectors' states of one side.

        Args:
            which: ``"env_to_module_connector"`` or ``"module_to_env_connector"``.
            states: One state per connector, as ``get_state`` returns them.

        Raises:
            ValueError: If the number of states is not the number of connectors.
        """
        conns = (
            self.env_to_module if which == COMPONENT_ENV_TO_MODULE_CONNECTOR else self.module_to_env
        )
        if len(states) != len(conns):
            raise ValueError(f"{which}: {len(states)} states for {len(conns)} connectors")
        for c, s in zip(conns, states, strict=True):
            if s is not None and hasattr(c, "set_state"):
                c.set_state(s)


def _state_of(connector: Any) -> Any:
    get = getattr(connector, "get_state", None)
    return get() if get is not None else None


def user_connectors(factory: Any, env: Any, spaces: Any, device: torch.device) -> list[Any]:
    """The connectors a config's factory builds (RLlib's ``fn(env, spaces, device)``).

    Args:
        factory: ``config.env_to_module_connector`` / ``module_to_env_connector`` (or None).
        env: The env.
        spaces: The runner's spaces.
        device: The device.

    Returns:
        A list of connectors (callables with the ConnectorV2 call signature).
    """
    if factory is None:
        return []
    made = factory(env, spaces, device)
    if made is None:
        return []
    return list(made) if isinstance(made, (list, tuple)) else [made]


def default_module_id() -> str:
    """The single-agent runner's module id.

    Returns:
        ``DEFAULT_MODULE_ID``.
    """
    return DEFAULT_MODULE_ID
