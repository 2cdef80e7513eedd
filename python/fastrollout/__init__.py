"""fastrollout: fast, correct RL experience collection with RLlib's episode API.

The episode buffers, their cut/finalize and the metric reductions live in a Rust core
(``fastrollout._core``); this package is the thin Python layer on top of it.
"""

from fastrollout._core import __version__
from fastrollout.episodes import MultiAgentEpisode, SingleAgentEpisode
from fastrollout.errors import EpisodeStateError, MultiAgentEnvError, SpaceMismatchError
from fastrollout.metrics import MetricsLogger

__all__ = [
    "EpisodeStateError",
    "MetricsLogger",
    "MultiAgentEnvError",
    "MultiAgentEpisode",
    "SingleAgentEpisode",
    "SpaceMismatchError",
    "__version__",
]
