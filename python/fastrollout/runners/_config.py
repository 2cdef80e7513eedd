"""Reading a runner config by RLlib 2.60's attribute names.

The runners read their configuration by RLlib's names (``config.env``,
``config.num_envs_per_env_runner``, ``config.callbacks_on_episode_start``, ...), which
``fastrollout.RunnerConfig`` keeps; anything with those attributes works.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["OBSERVATION_BLOCK_ROWS", "cfg", "smoothing_window"]

_MISSING = object()

#: Steps per compressed observation block with ``compress_observations`` (measured in
#: docs/compression.md; the core's ``DEFAULT_BLOCK_ROWS``).
OBSERVATION_BLOCK_ROWS = 32


def cfg(config: Any, name: str, default: Any = None) -> Any:
    """Reads a config attribute by RLlib's name (``default`` if the config lacks it).

    Args:
        config: A ``RunnerConfig`` (or anything with RLlib's attribute names).
        name: The attribute.
        default: Returned if the attribute is missing or None.

    Returns:
        The value.
    """
    value = getattr(config, name, _MISSING)
    if value is _MISSING or value is None:
        return default
    return value


def smoothing_window(config: Any) -> int:
    """The per-runner window of episode metrics, as RLlib splits it over runners.

    Args:
        config: The runner config.

    Returns:
        ``ceil(metrics_num_episodes_for_smoothing / max(num_env_runners, 1))``, at least 1.
    """
    n = int(cfg(config, "metrics_num_episodes_for_smoothing", 100))
    runners = int(cfg(config, "num_env_runners", 0)) or 1
    return max(1, math.ceil(n / runners))
