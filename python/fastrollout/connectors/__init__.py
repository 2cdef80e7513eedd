"""Connector pipelines between env and module (RLlib 2.60's ConnectorV2 API).

See :mod:`fastrollout.connectors.connector_v2` for the batch and ``shared_data``
contract shared with the runners.
"""

from fastrollout.connectors.connector_v2 import ConnectorV2
from fastrollout.connectors.defaults import (
    default_env_to_module_pipeline,
    default_module_to_env_pipeline,
)
from fastrollout.connectors.env_to_module import (
    FlattenObservations,
    FrameStackingEnvToModule,
    MeanStdFilter,
    NumpyToTensor,
    PrevActionsPrevRewards,
    RunningStats,
)
from fastrollout.connectors.module_to_env import (
    GetActions,
    NormalizeAndClipActions,
    TensorToNumpy,
    clip_action,
    unsquash_action,
)
from fastrollout.connectors.pipeline import (
    ConnectorPipelineV2,
    EnvToModulePipeline,
    ModuleToEnvPipeline,
)

__all__ = [
    "ConnectorPipelineV2",
    "ConnectorV2",
    "EnvToModulePipeline",
    "FlattenObservations",
    "FrameStackingEnvToModule",
    "GetActions",
    "MeanStdFilter",
    "ModuleToEnvPipeline",
    "NormalizeAndClipActions",
    "NumpyToTensor",
    "PrevActionsPrevRewards",
    "RunningStats",
    "TensorToNumpy",
    "clip_action",
    "default_env_to_module_pipeline",
    "default_module_to_env_pipeline",
    "unsquash_action",
]
