"""fastrollout: fast, correct RL experience collection with RLlib's episode API.

The episode buffers, their cut/finalize and the metric reductions live in a Rust core
(``fastrollout._core``); this package is the thin Python layer on top of it.
"""

from fastrollout._core import __version__
from fastrollout.callbacks import Callbacks
from fastrollout.config import RunnerConfig
from fastrollout.env import register_env
from fastrollout.episodes import MultiAgentEpisode, SingleAgentEpisode
from fastrollout.errors import EpisodeStateError, MultiAgentEnvError, SpaceMismatchError
from fastrollout.evaluation import RolloutWorker
from fastrollout.metrics import MetricsLogger
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
]
