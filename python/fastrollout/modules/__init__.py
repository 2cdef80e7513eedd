"""Torch RL modules, action distributions and device placement (RLlib 2.60's API)."""

from fastrollout.modules import distributions
from fastrollout.modules.cnn import DefaultCNNModule
from fastrollout.modules.default import DEFAULT_MODEL_CONFIG, DefaultMLPModule
from fastrollout.modules.device import resolve_device, to_device
from fastrollout.modules.distributions import (
    TorchCategorical,
    TorchDeterministic,
    TorchDiagGaussian,
    TorchDistribution,
    TorchMultiCategorical,
    get_action_dist_cls,
)
from fastrollout.modules.multi_rl_module import MultiRLModule, MultiRLModuleSpec
from fastrollout.modules.recurrent import LSTM_MODEL_CONFIG, DefaultLSTMModule
from fastrollout.modules.rl_module import RLModule, RLModuleSpec

__all__ = [
    "DEFAULT_MODEL_CONFIG",
    "DefaultCNNModule",
    "DefaultLSTMModule",
    "DefaultMLPModule",
    "LSTM_MODEL_CONFIG",
    "MultiRLModule",
    "MultiRLModuleSpec",
    "RLModule",
    "RLModuleSpec",
    "TorchCategorical",
    "TorchDeterministic",
    "TorchDiagGaussian",
    "TorchDistribution",
    "TorchMultiCategorical",
    "distributions",
    "get_action_dist_cls",
    "resolve_device",
    "to_device",
]
