"""A worker's observation filters, kept in step with the runner's ``MeanStdFilter`` connector.

The old stack's filters (``fastrollout.evaluation.filters``) are what users read, merge and
sync; the runner normalises with its env-to-module ``MeanStdFilter`` connector, so the
policy acts on the filtered observations and the episodes record them. Before each sampling
call the filters' statistics become the connector's base; afterwards what the connector saw
is added to each filter's ``running_stats`` and ``buffer``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from fastrollout.evaluation.filters import (
    Filter,
    MeanStdFilter,
    NoFilter,
    RunningStat,
)

__all__ = ["ObservationFilters", "with_mean_std_connector"]

# RLlib's old-stack MeanStdFilter clips normalised observations to +-10.
_CLIP = 10.0


def with_mean_std_connector(user: Callable[..., Any] | None) -> Callable[..., list[Any]]:
    """An env-to-module factory: a ``MeanStdFilter`` connector, then the user's pieces.

    Args:
        user: The config's own ``env_to_module_connector`` factory, or None.

    Returns:
        The factory for ``RunnerConfig.env_runners(env_to_module_connector=...)``.
    """
    from fastrollout.connectors.env_to_module.mean_std_filter import MeanStdFilter as Connector

    # A worker's own config (reused for another worker) already holds such a factory.
    user = getattr(user, "user_factory", user)

    def factory(env: Any, spaces: Any = None, device: Any = None) -> list[Any]:
        pieces = [] if user is None else user(env, spaces, device)
        pieces = list(pieces) if isinstance(pieces, list | tuple) else [pieces]
        return [Connector(clip_by_value=_CLIP), *pieces]

    factory.user_factory = user  # type: ignore[attr-defined]
    return factory


class ObservationFilters:
    """The filters of a worker's policies and the runner connector that applies them.

    Args:
        kind: ``"NoFilter"`` or ``"MeanStdFilter"``.
        shapes: Policy id -> observation shape.
        connector: The runner's ``MeanStdFilter`` connector (None for ``NoFilter``).
    """

    def __init__(
        self, kind: str, shapes: Mapping[str, tuple[int, ...]], connector: Any = None
    ) -> None:
        self.connector = connector
        self.filters: dict[str, Filter] = {
            pid: MeanStdFilter(shape, clip=_CLIP) if kind == "MeanStdFilter" else NoFilter()
            for pid, shape in shapes.items()
        }

    def _mean_std(self) -> dict[str, MeanStdFilter]:
        return {pid: f for pid, f in self.filters.items() if isinstance(f, MeanStdFilter)}

    def before_sample(self) -> None:
        """Makes the filters' statistics the connector's (with nothing new seen yet)."""
        if self.connector is None:
            return
        state = {}
        for pid, f in self._mean_std().items():
            rs = f.running_stats
            state[pid] = {"base": rs.to_state(), "delta": RunningStat(rs.shape).to_state()}
        self.connector.set_state(state)

    def after_sample(self) -> None:
        """Adds what the connector saw to each filter's statistics and buffer."""
        if self.connector is None:
            return
        filters = self._mean_std()
        for pid, s in self.connector.get_state().items():
            delta = RunningStat.from_state(s["delta"])
            if delta.n and pid in filters:
                filters[pid].running_stats.update(delta)
                filters[pid].buffer.update(delta)


def observation_shape(space: Any) -> tuple[int, ...]:
    """The shape a MeanStdFilter keeps statistics of for an observation space."""
    return tuple(np.shape(space.sample())) if space.shape is None else tuple(space.shape)
