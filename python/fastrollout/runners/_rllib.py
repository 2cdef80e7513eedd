"""Running inside RLlib: runners built from RLlib 2.60's own ``AlgorithmConfig``.

An RLlib user passes ``config.env_runners(env_runner_cls=fastrollout.SingleAgentEnvRunner)``
and RLlib's ``EnvRunnerGroup`` builds fastrollout's runner with RLlib's config. The
runners read the config by RLlib's attribute names either way; what differs when the
config is RLlib's is decided here:

- the modules are the ones RLlib's own runner would build (``config.get_rl_module_spec``),
  so the Learner's weights load into them. Where that is RLlib's default PPO module on an
  observation space fastrollout's :class:`~fastrollout.modules.DefaultMLPModule` encodes
  the same way, that module is built instead: it has RLlib's parameter names and computes
  the same outputs, and the runners' one-pass default step applies to it;
- ``get_metrics`` returns RLlib's Stats objects (``fastrollout.metrics.to_rllib_results``),
  which RLlib's root ``MetricsLogger`` aggregates;
- the episodes are :class:`RLlibSingleAgentEpisode` / :class:`RLlibMultiAgentEpisode`, which
  RLlib's ``isinstance`` checks (its learner connectors') take for its own classes.

Nothing here imports ray at module level: ``import fastrollout`` stays free of it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from fastrollout.episodes import MultiAgentEpisode, SingleAgentEpisode
from fastrollout.modules import MultiRLModule, RLModuleSpec

__all__ = [
    "RLlibMultiAgentEpisode",
    "RLlibSingleAgentEpisode",
    "build_from_spec",
    "build_modules",
    "is_rllib_config",
]

logger = logging.getLogger(__name__)


def is_rllib_config(config: Any) -> bool:
    """Whether ``config`` is (a subclass of) RLlib's ``AlgorithmConfig``.

    Decided by the class's module path, so that ray is never imported to answer.

    Args:
        config: A runner config.

    Returns:
        True for RLlib's config classes (``PPOConfig``, ``AlgorithmConfig``, ...).
    """
    return any(
        c.__name__ == "AlgorithmConfig" and c.__module__.startswith("ray.rllib.")
        for c in type(config).__mro__
    )


class RLlibSingleAgentEpisode(SingleAgentEpisode):
    """fastrollout's single-agent episode, seen by ``isinstance`` as RLlib's.

    RLlib's connectors tell single- from multi-agent data by
    ``isinstance(episodes[0], SingleAgentEpisode)`` against RLlib's class. Python's
    ``isinstance`` also consults ``__class__``: this subclass names RLlib's class there,
    and nothing else changes (``type()`` is still this class, which pickles as itself).
    """

    __slots__ = ()

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        from ray.rllib.env.single_agent_episode import SingleAgentEpisode as RLlibClass

        return RLlibClass


class RLlibMultiAgentEpisode(MultiAgentEpisode):
    """fastrollout's multi-agent episode, seen by ``isinstance`` as RLlib's.

    Its agents' episodes are :class:`RLlibSingleAgentEpisode`.
    """

    __slots__ = ()
    _agent_episode_cls = RLlibSingleAgentEpisode

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        from ray.rllib.env.multi_agent_episode import MultiAgentEpisode as RLlibClass

        return RLlibClass


def _is_rllib_default_ppo(spec: Any) -> bool:
    """Whether an RLlib spec builds RLlib's default PPO torch module."""
    from ray.rllib.algorithms.ppo.ppo_catalog import PPOCatalog
    from ray.rllib.algorithms.ppo.torch.default_ppo_torch_rl_module import (
        DefaultPPOTorchRLModule,
    )

    return spec.module_class is DefaultPPOTorchRLModule and spec.catalog_class in (
        None,
        PPOCatalog,
    )


def _same_encoding(obs_space: Any) -> bool:
    """Whether RLlib's default catalog encodes ``obs_space`` with an MLP, as fastrollout's does.

    RLlib's catalog takes a 1-D float Box (an MLP encoder); images get a CNN and other
    spaces are not encoded by its default models at all.
    """
    import gymnasium as gym
    import numpy as np

    return (
        isinstance(obs_space, gym.spaces.Box)
        and len(obs_space.shape) == 1
        and np.issubdtype(obs_space.dtype, np.floating)
    )


def _rllib_default_model_config() -> dict[str, Any]:
    """RLlib's ``DefaultModelConfig`` as a dict."""
    import dataclasses

    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    return dataclasses.asdict(DefaultModelConfig())


def build_from_spec(spec: Any) -> Any:
    """Builds one module of an RLlib ``RLModuleSpec``: fastrollout's twin or RLlib's own.

    Args:
        spec: RLlib's spec, with its spaces set.

    Returns:
        :class:`~fastrollout.modules.DefaultMLPModule` (images:
        :class:`~fastrollout.modules.DefaultCNNModule`; with ``use_lstm`` and shared
        value layers, :class:`~fastrollout.modules.DefaultLSTMModule`) where the spec
        builds RLlib's default PPO module on an observation space both encode alike, else
        ``spec.build()``.
    """
    import gymnasium as gym

    from fastrollout.modules.cnn import DefaultCNNModule
    from fastrollout.modules.default import DefaultMLPModule
    from fastrollout.modules.recurrent import DefaultLSTMModule

    obs_space = spec.observation_space
    image = isinstance(obs_space, gym.spaces.Box) and len(obs_space.shape) == 3
    if _is_rllib_default_ppo(spec) and (_same_encoding(obs_space) or image):
        # RLlib's catalog reads missing keys from its DefaultModelConfig (whose
        # vf_share_layers is True, where fastrollout's default is PPO's False).
        model_config = {**_rllib_default_model_config(), **dict(spec.model_config or {})}
        twin: type[Any] = DefaultCNNModule if image else DefaultMLPModule
        inference_only = True
        if model_config.get("use_lstm"):
            if image:  # no CNN+LSTM twin
                return spec.build()
            if not model_config.get("vf_share_layers"):
                # RLlib's acting weights leave the critic's LSTM out, whose state the
                # episodes still record: only RLlib's own module steps it as RLlib does.
                return spec.build()
            # (With its value head: RLlib's recurrent module keeps it when acting, and
            # its weights then load here.)
            twin, inference_only = DefaultLSTMModule, False
        try:
            return RLModuleSpec(
                module_class=twin,
                observation_space=spec.observation_space,
                action_space=spec.action_space,
                inference_only=inference_only,
                model_config=model_config,
            ).build()
        except (ValueError, TypeError, NotImplementedError) as err:
            # A model config or action space the twin does not implement: RLlib's own.
            logger.debug("RLlib's PPO module kept (%s)", err)
    return spec.build()


def build_modules(
    config: Any, env: Any, spaces: Mapping[str, Any], *, multi_agent: bool
) -> MultiRLModule | None:
    """The inference-only modules RLlib's runner of the same kind would build.

    Args:
        config: RLlib's ``AlgorithmConfig``.
        env: The runner's env (``unwrapped``), or None.
        spaces: The runner's spaces (``get_spaces()``).
        multi_agent: Build the multi-agent module set (else the single module).

    Returns:
        The modules keyed by module id, or None where RLlib's config has no module to
        build (its base ``AlgorithmConfig``: RLlib's runner then samples random actions
        only).
    """
    try:
        if multi_agent:
            multi_spec = config.get_multi_rl_module_spec(
                env=env, spaces=dict(spaces), inference_only=True
            )
            specs = dict(multi_spec.rl_module_specs)
        else:
            from ray.rllib.core import DEFAULT_MODULE_ID

            specs = {
                DEFAULT_MODULE_ID: config.get_rl_module_spec(
                    env=env, spaces=dict(spaces), inference_only=True
                )
            }
    except NotImplementedError:
        return None
    # Sorted: the build order draws the initial weights, which must not depend on the
    # hash order of a set of policy ids.
    return MultiRLModule(rl_modules={mid: build_from_spec(specs[mid]) for mid in sorted(specs)})


def device_for(config: Any, worker_index: int) -> Any:
    """The torch device RLlib's runner would use (GPUs only where the config gives some).

    Args:
        config: RLlib's ``AlgorithmConfig``.
        worker_index: The runner's index (0: the local runner).

    Returns:
        The ``torch.device``.
    """
    from ray.rllib.utils.framework import get_device

    gpus = 0 if not worker_index else config.num_gpus_per_env_runner
    return get_device(config, gpus)
