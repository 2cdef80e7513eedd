"""``MeanStdFilter``: normalises observations with running mean and std, per module.

Statistics are kept as (count, mean, M2) per observation component and updated with whole
module batches with the exact parallel formula of Chan et al. (no per-row loop), so
merging the statistics of several runners gives exactly the statistics of all their data
together. To merge without counting anything twice, the state keeps the statistics at the
last synchronisation (``base``) apart from what was seen since (``delta``):
``merge_states`` adds every runner's delta to one base, and ``set_state`` of the merged
state starts a new delta.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from fastrollout.connectors.connector_v2 import ConnectorV2
from fastrollout.connectors.env_to_module.running_stat import SMALL_NUMBER, RunningStat
from fastrollout.core import Columns

__all__ = ["MeanStdFilter", "RunningStats"]


class RunningStats(RunningStat):
    """:class:`~fastrollout.connectors.env_to_module.running_stat.RunningStat`, connector names.

    ``count`` and ``m2`` read ``num_pushes`` and ``sum_sq_diff_array``, ``merge`` adds
    another stream's statistics, and the state is ``{"count", "mean", "m2"}`` (what
    runners' connector states hold; :meth:`from_state` reads RLlib's keys as well).

    Args:
        shape: The shape of one item.
    """

    __slots__ = ()

    @property
    def count(self) -> int:
        """The number of items seen."""
        return self.num_pushes

    @property
    def m2(self) -> np.ndarray:
        """The sum of squared deviations from the mean."""
        return self.sum_sq_diff_array

    def merge(self, other: RunningStat) -> None:
        """Adds another stream's statistics (exactly as if its items had been pushed).

        Args:
            other: Statistics of the same shape (or empty ones of any shape).
        """
        if other.num_pushes:
            self.update(other)

    def to_state(self) -> dict[str, Any]:
        """Plain data for checkpoints and transport.

        Returns:
            ``{"count", "mean", "m2"}``.
        """
        return {"count": self.count, "mean": self.mean.copy(), "m2": self.m2.copy()}


class _ModuleFilter:
    def __init__(self, shape: tuple[int, ...]) -> None:
        self.base = RunningStats(shape)
        self.delta = RunningStats(shape)
        self.total = RunningStats(shape)


class MeanStdFilter(ConnectorV2):
    """Normalises float observations: ``clip((obs - mean) / (std + 1e-6), +-clip)``.

    Statistics are kept per module id (RLlib keeps them per agent id; agents that share
    a module see the same normalisation here). Each call first adds the batch's
    observations to the statistics (if ``update_stats``), then normalises all rows with
    them (RLlib pushes and normalises episode by episode, so its rows within one step
    see slightly different statistics). The normalised observations replace the last
    observation in every row's episode, as RLlib's filter does, so that learners train
    on what the module saw.

    Args:
        de_mean_to_zero: Subtract the running mean.
        de_std_to_one: Divide by the running std.
        clip_by_value: Clip to ``[-clip_by_value, clip_by_value]`` (None: no clip).
        update_stats: Update the statistics with every call (False for frozen
            statistics, e.g. at evaluation).
        multi_agent: Accepted for RLlib compatibility (statistics are per module
            anyway).
        **kwargs: Passed to ``ConnectorV2``.
    """

    def __init__(
        self,
        *,
        de_mean_to_zero: bool = True,
        de_std_to_one: bool = True,
        clip_by_value: float | None = 10.0,
        update_stats: bool = True,
        multi_agent: bool = False,
        **kwargs: Any,
    ) -> None:
        self.de_mean_to_zero = de_mean_to_zero
        self.de_std_to_one = de_std_to_one
        self.clip_by_value = clip_by_value
        self.update_stats = update_stats
        self._filters: dict[Any, _ModuleFilter] = {}
        super().__init__(**kwargs)

    def recompute_output_observation_space(
        self, input_observation_space: gym.Space, input_action_space: gym.Space
    ) -> gym.Space:
        """A Box of the same shape and dtype, bounded by the clip value.

        Args:
            input_observation_space: The incoming space.
            input_action_space: Unused.

        Returns:
            The outgoing space (unchanged for non-Box spaces or without clipping).
        """
        space = input_observation_space
        if not isinstance(space, gym.spaces.Box) or self.clip_by_value is None:
            return space
        c = float(self.clip_by_value)
        return gym.spaces.Box(-c, c, space.shape, space.dtype)  # type: ignore[arg-type]

    def __call__(
        self,
        *,
        rl_module: Any,
        batch: dict[Any, Any],
        episodes: Sequence[Any],
        explore: bool | None = None,
        shared_data: dict[str, Any] | None = None,
        metrics: Any = None,
        **kwargs: Any,
    ) -> dict[Any, Any]:
        """Normalises every module's ``Columns.OBS`` and writes them to the episodes.

        Args:
            rl_module: Unused.
            batch: ``{module_id: {Columns.OBS: float array (B, ...)}}``.
            episodes: The runner's episodes (rewritten when non-empty).
            explore: Unused.
            shared_data: ``agent_rows`` (needed when episodes are given).
            metrics: Unused.
            **kwargs: Unused.

        Returns:
            The batch with normalised observations.

        Raises:
            TypeError: If a module's observations are not a float numpy array.
            ValueError: If their item shape differs from the statistics'.
        """
        for module_id, module_batch in batch.items():
            obs = module_batch.get(Columns.OBS)
            if obs is None:
                continue
            if not isinstance(obs, np.ndarray) or obs.dtype.kind != "f":
                raise TypeError(
                    f"MeanStdFilter normalises float numpy observations; module {module_id!r} "
                    f"has {type(obs).__name__}"
                    + (f" of dtype {obs.dtype}" if isinstance(obs, np.ndarray) else "")
                    + " (put it before NumpyToTensor; it does not filter Dict/Tuple or "
                    "integer observations)"
                )
            filt = self._filters.get(module_id)
            if filt is None:
                filt = self._filters[module_id] = _ModuleFilter(tuple(obs.shape[1:]))
            if filt.total.shape != tuple(obs.shape[1:]):
                raise ValueError(
                    f"module {module_id!r}: observations of shape {tuple(obs.shape[1:])}, "
                    f"the filter's statistics have shape {filt.total.shape}"
                )
            if self.update_stats:
                filt.delta.push_batch(obs)
                filt.total.push_batch(obs)
            normalized = self.normalize(obs, filt.total)
            module_batch[Columns.OBS] = normalized
            if episodes:
                rows = self.row_episodes(module_id, episodes, shared_data)
                for episode, row in zip(rows, normalized, strict=True):
                    episode.set_observations(new_data=row, at_indices=-1)
        return batch

    def normalize(self, obs: np.ndarray, stats: RunningStat) -> np.ndarray:
        """Applies the filter's transformation with given statistics.

        Args:
            obs: Shape ``(B, *shape)``.
            stats: The statistics.

        Returns:
            The normalised observations, with ``obs``'s dtype.
        """
        x = obs.astype(np.float64)
        if self.de_mean_to_zero:
            x = x - stats.mean
        if self.de_std_to_one:
            x = x / (stats.std + SMALL_NUMBER)
        if self.clip_by_value is not None:
            x = np.clip(x, -self.clip_by_value, self.clip_by_value)
        return x.astype(obs.dtype)

    def running_stats(self, module_id: Any) -> RunningStats:
        """The statistics used for a module (everything seen, merged ones included).

        Args:
            module_id: The module.

        Returns:
            A copy of the statistics.

        Raises:
            KeyError: If the filter has seen nothing for the module.
        """
        if module_id not in self._filters:
            raise KeyError(f"MeanStdFilter has no statistics for module {module_id!r}")
        return self._filters[module_id].total.copy()

    # -- state ----------------------------------------------------------------------

    def get_state(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """``{module_id: {"base": stats, "delta": stats}}`` of plain data.

        Args:
            *args: Ignored.
            **kwargs: Ignored.

        Returns:
            The state (``{}`` before the first call).
        """
        return {
            mid: {"base": f.base.to_state(), "delta": f.delta.to_state()}
            for mid, f in self._filters.items()
        }

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Takes over statistics; what is seen from now on is this runner's new delta.

        Args:
            state: A state from ``get_state`` or ``merge_states`` (its statistics in
                either of ``RunningStat.from_state`` 's key sets).

        Raises:
            ValueError: If a module's state is malformed.
        """
        filters = {}
        for mid, s in state.items():
            if not isinstance(s, Mapping) or "base" not in s or "delta" not in s:
                raise ValueError(f"MeanStdFilter state of module {mid!r} needs 'base' and 'delta'")
            total = RunningStats.from_state(s["base"])
            total.merge(RunningStat.from_state(s["delta"]))
            f = _ModuleFilter(total.shape)
            f.base, f.total = total.copy(), total
            filters[mid] = f
        self._filters.update(filters)

    def merge_states(self, states: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """Adds up the deltas of several filters onto their common base, exactly.

        Filters that were synchronised share their base; when bases differ (a runner
        that was restarted and has not synchronised yet), the base with the most items
        is used, so no runner's old data is counted twice.

        Args:
            states: States of several copies of this filter.

        Returns:
            The merged state (its delta is empty).

        Raises:
            ValueError: If a module's statistics have different shapes across states.
        """
        merged: dict[Any, dict[str, Any]] = {}
        module_ids = [mid for s in states for mid in s]
        for mid in dict.fromkeys(module_ids):
            parts = [s[mid] for s in states if mid in s]
            bases = [RunningStats.from_state(p["base"]) for p in parts]
            deltas = [RunningStats.from_state(p["delta"]) for p in parts]
            shapes = {b.shape for b in bases} | {d.shape for d in deltas if d.count}
            if len(shapes) > 1:
                raise ValueError(
                    f"MeanStdFilter states of module {mid!r} have different shapes {shapes}"
                )
            total = max(bases, key=lambda b: b.count).copy()
            for d in deltas:
                total.merge(d)
            merged[mid] = {
                "base": total.to_state(),
                "delta": RunningStats(total.shape).to_state(),
            }
        return merged

    def reset_state(self) -> None:
        """Forgets all statistics.

        Raises:
            ValueError: If ``update_stats`` is False (frozen statistics stay).
        """
        if not self.update_stats:
            raise ValueError("MeanStdFilter with update_stats=False keeps its statistics")
        self._filters = {}

    def __repr__(self) -> str:
        return (
            f"MeanStdFilter(de_mean_to_zero={self.de_mean_to_zero}, de_std_to_one="
            f"{self.de_std_to_one}, clip_by_value={self.clip_by_value}, update_stats="
            f"{self.update_stats})"
        )
