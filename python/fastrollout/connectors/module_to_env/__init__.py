"""Module-to-env connector pieces."""

from fastrollout.connectors.module_to_env.get_actions import GetActions
from fastrollout.connectors.module_to_env.normalize_and_clip_actions import (
    NormalizeAndClipActions,
    clip_action,
    unsquash_action,
)
from fastrollout.connectors.module_to_env.tensor_to_numpy import TensorToNumpy, to_numpy

__all__ = [
    "GetActions",
    "NormalizeAndClipActions",
    "TensorToNumpy",
    "clip_action",
    "to_numpy",
    "unsquash_action",
]
