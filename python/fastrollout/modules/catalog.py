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

    As RLlib's catalog: a 3-D ``Box`` (an image, height x width x channels) gets
    :class:`~fastrollout.modules.cnn.DefaultCNNModule`; every other space that
    :class:`~fastrollout.modules.DefaultMLPModule` encodes gets that one (RLlib takes only
    1-D Boxes there).

    Args:
        observation_space: The module's observation space.
        action_space: The module's action space.
        model_config: The module's model config (RLlib's ``DefaultModelConfig`` keys).

    Returns:
        The RLModule subclass to build: :class:`DefaultLSTMModule` where
        ``model_config["use_lstm"]`` is true, :class:`DefaultCNNModule` for image (3-D
        Box) observations, else :class:`DefaultMLPModule`.

    Raises:
        TypeError: For an observation space no default module encodes (the message names
            ``rl_module_spec``, through which a module of one's own is given).
    """
    from fastrollout.modules.default import DefaultMLPModule, obs_preprocessor

    own_module = (
        "give a module class of your own with config.rl_module(rl_module_spec="
        "RLModuleSpec(module_class=...))"
    )
    image = isinstance(observation_space, gym.spaces.Box) and len(observation_space.shape) == 3
    if model_config and model_config.get("use_lstm"):
        if image:
            raise TypeError(
                f"no default recurrent module for image observations {observation_space} "
                f"(RLlib's CNN-tokenized LSTM is not built here): {own_module}"
            )
        from fastrollout.modules.recurrent import DefaultLSTMModule

        return DefaultLSTMModule
    if image:
        from fastrollout.modules.cnn import DefaultCNNModule

        return DefaultCNNModule
    try:
        obs_preprocessor(observation_space)
    except TypeError as err:
        raise TypeError(
            f"no default module for the observation space {observation_space} ({err}); "
            f"{own_module}, or turn the observations into a supported space with an "
            "env-to-module connector"
        ) from None
    return DefaultMLPModule
