"""Env-to-module connector pieces."""

from fastrollout.connectors.env_to_module.flatten_observations import FlattenObservations
from fastrollout.connectors.env_to_module.frame_stacking import FrameStackingEnvToModule
from fastrollout.connectors.env_to_module.mean_std_filter import MeanStdFilter, RunningStats
from fastrollout.connectors.env_to_module.numpy_to_tensor import NumpyToTensor
from fastrollout.connectors.env_to_module.prev_actions_prev_rewards import PrevActionsPrevRewards

__all__ = [
    "FlattenObservations",
    "FrameStackingEnvToModule",
    "MeanStdFilter",
    "NumpyToTensor",
    "PrevActionsPrevRewards",
    "RunningStats",
]
