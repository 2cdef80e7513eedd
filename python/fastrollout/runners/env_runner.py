"""``EnvRunner``: the base of the single- and multi-agent runners (RLlib 2.60's API)."""

from __future__ import annotations

import abc
import contextlib
import os
import pathlib
import pickle
import random
from collections.abc import Collection
from typing import Any

import numpy as np
import torch

from fastrollout.modules import MultiRLModule, MultiRLModuleSpec, RLModuleSpec, resolve_device
from fastrollout.runners import _support as s

__all__ = ["EnvRunner"]

_CALLBACKS = (
    "on_environment_created",
    "on_episode_created",
    "on_episode_start",
    "on_episode_step",
    "on_episode_end",
    "on_sample_end",
)


class EnvRunner(abc.ABC):
    """Steps environments with a torch policy and returns episodes.

    Subclasses implement ``make_env``, ``make_module``, ``sample``, ``get_spaces`` and
    ``get_metrics``; this base holds what they share: the config, the MetricsLogger,
    the device, seeding, callbacks, the weights' sequence number, and state handling.

    Args:
        config: The runner config (``fastrollout.RunnerConfig``).
        worker_index: The runner's index (0: the local runner).
        num_workers: The number of remote runners (default ``config.num_env_runners``).
        **kwargs: Ignored (RLlib's constructor takes more).
    """

    def __init__(
        self, *, config: Any, worker_index: int = 0, num_workers: int | None = None, **kwargs: Any
    ) -> None:
        self.config = config
        self.worker_index = int(worker_index)
        self.num_workers = int(
            num_workers if num_workers is not None else s.cfg(config, "num_env_runners", 0)
        )
        self.metrics = s.make_metrics_logger()
        self.env: Any = None
        self.module: MultiRLModule | None = None
        self._device = resolve_device(s.cfg(config, "device", "auto"))
        self._weights_seq_no = 0
        self.num_env_steps_sampled_lifetime = 0
        seed = s.cfg(config, "seed")
        self._seed: int | None = None if seed is None else int(seed) + self.worker_index
        if self._seed is not None:
            random.seed(self._seed)
            np.random.seed(self._seed % 2**32)
            torch.manual_seed(self._seed)
        self._callback_objects = self._make_callback_objects()
        self._callback_fns = {name: self._callback_list(name) for name in _CALLBACKS}

    # -- callbacks -------------------------------------------------------------------

    def _make_callback_objects(self) -> list[Any]:
        cls = s.cfg(self.config, "callbacks_class")
        if cls is None:
            return []
        classes = cls if isinstance(cls, (list, tuple)) else [cls]
        return [c() if isinstance(c, type) else c for c in classes]

    def _callback_list(self, name: str) -> list[Any]:
        from fastrollout.callbacks import Callbacks

        fns = []
        for obj in self._callback_objects:
            fn = getattr(obj, name, None)
            # The base class's hooks do nothing: skipping them keeps the per-step loop
            # over sub-envs out of the hot path when no callback needs it.
            if fn is not None and getattr(type(obj), name, None) is not getattr(Callbacks, name):
                fns.append(fn)
        extra = s.cfg(self.config, f"callbacks_{name}")
        if extra is not None:
            fns.extend(extra if isinstance(extra, (list, tuple)) else [extra])
        return fns

    def _has_callbacks(self, name: str) -> bool:
        return bool(self._callback_fns[name])

    def _callback(self, name: str, **kwargs: Any) -> None:
        """Calls the callbacks of ``name`` with RLlib's keyword arguments."""
        for fn in self._callback_fns[name]:
            fn(**kwargs)

    # -- API -----------------------------------------------------------------------

    @abc.abstractmethod
    def make_env(self) -> None:
        """Creates (or re-creates) the env(s) from the config."""

    @abc.abstractmethod
    def sample(
        self,
        *,
        num_timesteps: int | None = None,
        num_episodes: int | None = None,
        explore: bool | None = None,
        random_actions: bool = False,
        force_reset: bool = False,
    ) -> list[Any]:
        """Samples timesteps or episodes (see the subclasses)."""

    @abc.abstractmethod
    def get_spaces(self) -> dict[str, Any]:
        """The env's and each module's (observation space, action space)."""

    @abc.abstractmethod
    def get_metrics(self) -> dict[str, Any]:
        """The reduced metrics since the last call."""

    def _module_spec(self, spaces: dict[str, tuple[Any, Any]]) -> MultiRLModuleSpec:
        """The MultiRLModuleSpec to build, from the config and the modules' spaces."""
        spec = s.cfg(self.config, "rl_module_spec")
        model_config = s.cfg(self.config, "model_config")
        if isinstance(spec, MultiRLModuleSpec):
            specs = dict(spec.rl_module_specs)
        elif isinstance(spec, RLModuleSpec):
            specs = {mid: spec for mid in spaces}
        elif isinstance(spec, type):
            specs = {mid: RLModuleSpec(module_class=spec) for mid in spaces}
        else:
            specs = {}
        policies = s.cfg(self.config, "policies")
        if isinstance(policies, dict):
            for mid, p in policies.items():
                if isinstance(p, RLModuleSpec) and mid not in specs:
                    specs[mid] = p
        out = {}
        for mid, (obs_space, act_space) in spaces.items():
            base = specs.get(mid, RLModuleSpec())
            out[mid] = RLModuleSpec(
                module_class=base.module_class,
                observation_space=base.observation_space or obs_space,
                action_space=base.action_space or act_space,
                inference_only=True,
                model_config=base.model_config if base.model_config is not None else model_config,
                catalog_class=base.catalog_class,
            )
        return MultiRLModuleSpec(rl_module_specs=out, inference_only=True)

    def _build_module(self, spaces: dict[str, tuple[Any, Any]]) -> MultiRLModule:
        module = self._module_spec(spaces).build()
        module.to(self._device)
        return module

    def make_module(self) -> None:
        """Builds the MultiRLModule from the config (inference-only, on the device)."""
        spaces = {k: v for k, v in self.get_spaces().items() if not k.startswith("__")}
        self.module = self._build_module(spaces)

    def assert_healthy(self) -> None:
        """Checks that the runner has its env(s) and module.

        Raises:
            AssertionError: If the env or the module is missing.
        """
        assert self.env is not None, f"{type(self).__name__} has no env (call make_env())"
        assert self.module is not None, f"{type(self).__name__} has no module"

    def stop(self) -> None:
        """Closes the env(s)."""
        if self.env is not None:
            envs = self.env if isinstance(self.env, list) else [self.env]
            for env in envs:
                env.close()

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
            s.NUM_ENV_STEPS_SAMPLED_LIFETIME: self.num_env_steps_sampled_lifetime
        }
        if wanted(s.COMPONENT_RL_MODULE) and self.module is not None:
            state[s.COMPONENT_RL_MODULE] = self.module.get_state(**kwargs)
            state[s.WEIGHTS_SEQ_NO] = self._weights_seq_no
        conn = self._connectors.get_state()
        for c in (s.COMPONENT_ENV_TO_MODULE_CONNECTOR, s.COMPONENT_MODULE_TO_ENV_CONNECTOR):
            if wanted(c):
                state[c] = conn[c]
        return state

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
        for c in (s.COMPONENT_ENV_TO_MODULE_CONNECTOR, s.COMPONENT_MODULE_TO_ENV_CONNECTOR):
            if c in state:
                self._connectors.set_state(c, state[c])
        if s.COMPONENT_RL_MODULE in state and self.module is not None:
            seq = int(state.get(s.WEIGHTS_SEQ_NO, 0) or 0)
            if seq == 0 or self._weights_seq_no < seq:
                weights = state[s.COMPONENT_RL_MODULE]
                if not all(mid in self.module for mid in weights):
                    weights = {s.default_module_id(): weights}
                self.module.set_state(weights)
            # RLlib 2.60 takes any positive number, also an older one whose weights it
            # just refused, and then reports a version it does not hold; the number here
            # only moves forward (pinned in tests/test_single_agent_env_runner.py).
            if seq > self._weights_seq_no:
                self._weights_seq_no = seq
        if s.NUM_ENV_STEPS_SAMPLED_LIFETIME in state:
            self.num_env_steps_sampled_lifetime = int(state[s.NUM_ENV_STEPS_SAMPLED_LIFETIME])

    def get_weights(self, modules: Collection[str] | None = None) -> dict[str, Any]:
        """The modules' weights (``get_state(components="rl_module")["rl_module"]``).

        Args:
            modules: Only these module ids.

        Returns:
            ``{module_id: {key: ndarray}}``.
        """
        assert self.module is not None
        return self.module.get_state(components=modules)

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
        self.set_state({s.COMPONENT_RL_MODULE: weights, s.WEIGHTS_SEQ_NO: weights_seq_no})

    def save_to_path(self, path: str | os.PathLike[str] | None = None) -> str:
        """Writes the runner's state to a directory (``state.pkl`` in it).

        Args:
            path: The directory (created if missing; a temporary one if None).

        Returns:
            The directory's path.
        """
        if path is None:
            import tempfile

            path = tempfile.mkdtemp(prefix="fastrollout_runner_")
        p = pathlib.Path(path)
        p.mkdir(parents=True, exist_ok=True)
        with open(p / "state.pkl", "wb") as f:
            pickle.dump({"state": self.get_state(), "class": type(self).__name__}, f)
        return str(p)

    def restore_from_path(self, path: str | os.PathLike[str]) -> None:
        """Loads a state written by ``save_to_path`` (weights always loaded).

        Args:
            path: The directory.

        Raises:
            FileNotFoundError: If the directory has no saved state.
        """
        file = pathlib.Path(path) / "state.pkl"
        if not file.exists():
            raise FileNotFoundError(f"no runner state in {str(path)!r} (expected {file.name})")
        with open(file, "rb") as f:
            saved = pickle.load(f)
        state = dict(saved["state"])
        state[s.WEIGHTS_SEQ_NO] = 0
        seq = saved["state"].get(s.WEIGHTS_SEQ_NO, 0)
        self.set_state(state)
        self._weights_seq_no = int(seq or 0)

    @property
    def _connectors(self) -> s.Connectors:
        raise NotImplementedError

    def __del__(self) -> None:
        # Async vector envs hold sub-processes; close them with the runner.
        with contextlib.suppress(Exception):
            self.stop()
