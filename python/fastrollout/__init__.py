"""fastrollout: fast, correct RL experience collection with RLlib's episode API.

The episode buffers, their cut/finalize and the metric reductions live in a Rust core
(``fastrollout._core``); this package is the thin Python layer on top of it.

Episodes, metrics, the config and env registration load with the package; the runners
and ``RolloutWorker`` load on first use, so that ``import fastrollout`` (and code that
only records episodes or reduces metrics) does not import torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from fastrollout._core import __version__
from fastrollout.callbacks import Callbacks
from fastrollout.config import RunnerConfig, sub_env_backend
from fastrollout.env import register_env
from fastrollout.episodes import MultiAgentEpisode, SingleAgentEpisode
from fastrollout.errors import EpisodeStateError, MultiAgentEnvError, SpaceMismatchError
from fastrollout.metrics import MetricsLogger

if TYPE_CHECKING:
    from fastrollout.evaluation import RolloutWorker
    from fastrollout.runners import EnvRunnerGroup, MultiAgentEnvRunner, SingleAgentEnvRunner

__all__ = [
    "Callbacks",
    "EnvRunnerGroup",
    "EpisodeStateError",
    "MetricsLogger",
    "MultiAgentEnvError",
    "MultiAgentEnvRunner",
    "MultiAgentEpisode",
    "RolloutWorker",
    "RunnerConfig",
    "SingleAgentEnvRunner",
    "SingleAgentEpisode",
    "SpaceMismatchError",
    "__version__",
    "register_env",
    "sub_env_backend",
]

# Public names that need torch -> the subpackage that defines them.
_LAZY = {
    "EnvRunnerGroup": "fastrollout.runners",
    "MultiAgentEnvRunner": "fastrollout.runners",
    "RolloutWorker": "fastrollout.evaluation",
    "SingleAgentEnvRunner": "fastrollout.runners",
}


def __getattr__(name: str) -> Any:
    where = _LAZY.get(name)
    if where is None:
        raise AttributeError(f"module 'fastrollout' has no attribute {name!r}")
    value = getattr(importlib.import_module(where), name)
    # Cached, so that later lookups are plain attribute reads.
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
