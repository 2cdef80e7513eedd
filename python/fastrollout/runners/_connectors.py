"""The runner's two connector pipelines around the native gather and scatter."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import torch

from fastrollout.runners._config import cfg
from fastrollout.runners.keys import (
    COMPONENT_ENV_TO_MODULE_CONNECTOR,
    COMPONENT_MODULE_TO_ENV_CONNECTOR,
)

__all__ = ["Connectors"]


class Connectors:
    """The runner's two connector pipelines around the native gather and scatter.

    env-to-module: ``[*user pieces, NumpyToTensor]`` on the gathered
    ``{module_id: {obs: ndarray}}`` batch; module-to-env: ``[*user pieces, GetActions,
    TensorToNumpy, NormalizeAndClipActions]`` (``fastrollout.connectors``' defaults, or
    only the user's pieces where the config turns the defaults off).

    Args:
        config: The runner config.
        env: The env (passed to the user's connector factories).
        spaces: The runner's spaces (passed to the factories).
        observation_spaces: Module id -> observation space.
        action_spaces: Module id -> action space.
        device: The modules' device.
    """

    def __init__(
        self,
        *,
        config: Any,
        env: Any,
        spaces: Mapping[str, Any],
        observation_spaces: Mapping[str, gym.Space],
        action_spaces: Mapping[str, gym.Space],
        device: torch.device,
    ) -> None:
        from fastrollout.connectors import (
            EnvToModulePipeline,
            ModuleToEnvPipeline,
            default_env_to_module_pipeline,
            default_module_to_env_pipeline,
        )

        obs = dict(observation_spaces)
        act = dict(action_spaces)
        e2m = _pieces(cfg(config, "env_to_module_connector"), env, spaces, device)
        m2e = _pieces(cfg(config, "module_to_env_connector"), env, spaces)
        if cfg(config, "add_default_connectors_to_env_to_module_pipeline", True):
            self.env_to_module = default_env_to_module_pipeline(
                input_observation_space=obs, input_action_space=act, device=device, connectors=e2m
            )
        else:
            self.env_to_module = EnvToModulePipeline(obs, act, connectors=e2m)
        if cfg(config, "add_default_connectors_to_module_to_env_pipeline", True):
            self.module_to_env = default_module_to_env_pipeline(
                input_observation_space=obs,
                input_action_space=act,
                normalize_actions=bool(cfg(config, "normalize_actions", True)),
                clip_actions=bool(cfg(config, "clip_actions", False)),
                connectors=m2e,
            )
        else:
            self.module_to_env = ModuleToEnvPipeline(obs, act, connectors=m2e)

    def get_state(self) -> dict[str, Any]:
        """Both pipelines' states.

        Returns:
            ``{"env_to_module_connector": ..., "module_to_env_connector": ...}``.
        """
        return {
            COMPONENT_ENV_TO_MODULE_CONNECTOR: self.env_to_module.get_state(),
            COMPONENT_MODULE_TO_ENV_CONNECTOR: self.module_to_env.get_state(),
        }

    def set_state(self, which: str, state: Any) -> None:
        """Loads one pipeline's state.

        Args:
            which: ``"env_to_module_connector"`` or ``"module_to_env_connector"``.
            state: The state, as ``get_state`` returns it.
        """
        pipeline = (
            self.env_to_module if which == COMPONENT_ENV_TO_MODULE_CONNECTOR else self.module_to_env
        )
        pipeline.set_state(state)


def _pieces(factory: Any, *args: Any) -> list[Any]:
    """The connectors a config's factory builds (a connector, a list, or None)."""
    if factory is None:
        return []
    made = factory(*args)
    if made is None:
        return []
    return list(made) if isinstance(made, (list, tuple)) else [made]
