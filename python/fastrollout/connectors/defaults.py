"""The default pipelines the runners build.

Env-to-module: ``[*user pieces, NumpyToTensor]`` (the runner's native gather has already
built ``{module_id: {Columns.OBS: contiguous batch}}``). Module-to-env:
``[*user pieces, GetActions, TensorToNumpy, NormalizeAndClipActions]``; the runner
scatters ``ACTIONS_FOR_ENV`` to the sub-envs and records ``ACTIONS`` (and the other
outputs, e.g. ``ACTION_LOGP``) in the episodes. Every default piece works on whole module
batches: no per-agent Python work.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from fastrollout.connectors.connector_v2 import ConnectorV2
from fastrollout.connectors.env_to_module.numpy_to_tensor import NumpyToTensor
from fastrollout.connectors.module_to_env.get_actions import GetActions
from fastrollout.connectors.module_to_env.normalize_and_clip_actions import (
    NormalizeAndClipActions,
)
from fastrollout.connectors.module_to_env.tensor_to_numpy import TensorToNumpy
from fastrollout.connectors.pipeline import EnvToModulePipeline, ModuleToEnvPipeline

__all__ = ["default_env_to_module_pipeline", "default_module_to_env_pipeline"]


def default_env_to_module_pipeline(
    *,
    input_observation_space: Any = None,
    input_action_space: Any = None,
    device: str | torch.device | None = None,
    connectors: Sequence[ConnectorV2] = (),
) -> EnvToModulePipeline:
    """The env-to-module pipeline: user pieces, then numpy to torch on the device.

    Args:
        input_observation_space: The env's observation space(s).
        input_action_space: The env's action space(s).
        device: Where tensors go (None: each module's device).
        connectors: User pieces, run first (in order).

    Returns:
        The pipeline.
    """
    return EnvToModulePipeline(
        input_observation_space,
        input_action_space,
        connectors=[*connectors, NumpyToTensor(device=device)],
    )


def default_module_to_env_pipeline(
    *,
    input_observation_space: Any = None,
    input_action_space: Any = None,
    normalize_actions: bool = True,
    clip_actions: bool = False,
    connectors: Sequence[ConnectorV2] = (),
) -> ModuleToEnvPipeline:
    """The module-to-env pipeline: user pieces, actions, numpy, env-ready actions.

    Args:
        input_observation_space: The observation space(s) (for the pieces' spaces).
        input_action_space: The env's action space(s) (None: each module's).
        normalize_actions: Unsquash Box actions from [-1, 1] to the bounds.
        clip_actions: Clip Box actions to the bounds (if not normalising).
        connectors: User pieces, run first (in order).

    Returns:
        The pipeline.
    """
    return ModuleToEnvPipeline(
        input_observation_space,
        input_action_space,
        connectors=[
            *connectors,
            GetActions(),
            TensorToNumpy(),
            NormalizeAndClipActions(normalize_actions=normalize_actions, clip_actions=clip_actions),
        ],
    )
