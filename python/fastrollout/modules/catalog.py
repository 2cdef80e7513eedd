"""Which default module a spec without a module class builds (RLlib's catalog's choice).

``RLModuleSpec.build`` asks :func:`default_module_class` when the spec names no class;
every default module (feed-forward, recurrent, image) is chosen here and nowhere else.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym

__all__ = ["default_module_class"]


def default_module_class(
    observation_space: gym.Space[Any],
    action_space: gym.Space[Any],
    model_config: Mapping[str, Any] | None,
) -> type[Any]:
    """The default module class for these spaces and model config.

    Args:
        observation_space: The module's observation space.
        action_space: The module's action space.
        model_config: The module's model config (RLlib's ``DefaultModelConfig`` keys).

    Returns:
        The RLModule subclass to build: :class:`DefaultLSTMModule` where
        ``model_config["use_lstm"]`` is true, else :class:`DefaultMLPModule`.
    """
    if model_config and model_config.get("use_lstm"):
        from fastrollout.modules.recurrent import DefaultLSTMModule

        return DefaultLSTMModule
    from fastrollout.modules.default import DefaultMLPModule

    return DefaultMLPModule
