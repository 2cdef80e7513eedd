"""The old stack's observation filters, re-exported from :mod:`fastrollout.evaluation.filters`.

``fastrollout.filters`` is the name the guides use; the code lives with the RolloutWorker.
"""

from fastrollout.evaluation.filters import (
    SMALL_NUMBER,
    ConcurrentMeanStdFilter,
    Filter,
    MeanStdFilter,
    NoFilter,
    RunningStat,
    clip_reward,
    filter_from_state,
    get_filter,
    get_filters,
    sync_filters,
    synchronize,
)

__all__ = [
    "SMALL_NUMBER",
    "ConcurrentMeanStdFilter",
    "Filter",
    "MeanStdFilter",
    "NoFilter",
    "RunningStat",
    "clip_reward",
    "filter_from_state",
    "get_filter",
    "get_filters",
    "sync_filters",
    "synchronize",
]
