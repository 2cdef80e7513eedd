"""``FrameStackingEnvToModule``: the last ``num_frames`` observations, from episode look-back."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from fastrollout.connectors.connector_v2 import ConnectorV2
from fastrollout.core import Columns

__all__ = ["FrameStackingEnvToModule"]


class FrameStackingEnvToModule(ConnectorV2):
    """Replaces each row's observation by its last ``num_frames`` observations.

    The frames come from the row's episode (its look-back included; before the episode
    start they are zeros, as RLlib fills them) and are concatenated along the last axis,
    oldest first: an ``(84, 84, 1)`` observation becomes ``(84, 84, num_frames)`` as in
    RLlib, a ``(4,)`` one becomes ``(4 * num_frames,)``. Runners should keep at least
    ``num_frames - 1`` steps of look-back in episode chunks.

    Args:
        num_frames: How many observations to stack (>= 1).
        multi_agent: Accepted for RLlib compatibility (rows name their agents).
        **kwargs: Passed to ``ConnectorV2``.

    Raises:
        ValueError: If ``num_frames`` < 1.
    """

    def __init__(self, *, num_frames: int = 1, multi_agent: bool = False, **kwargs: Any) -> None:
        if num_frames < 1:
            raise ValueError(f"num_frames must be >= 1, got {num_frames}")
        self.num_frames = int(num_frames)
        super().__init__(**kwargs)

    def recompute_output_observation_space(
        self, input_observation_space: gym.Space, input_action_space: gym.Space
    ) -> gym.Space:
        """The Box with ``num_frames`` copies of the bounds along the last axis.

        Args:
            input_observation_space: A Box with at least one axis.
            input_action_space: Unused.

        Returns:
            The stacked Box.

        Raises:
            TypeError: If the space is not a Box with at least one axis.
        """
        space = input_observation_space
        if not isinstance(space, gym.spaces.Box) or not space.shape:
            raise TypeError(
                f"frame stacking needs a Box observation space with an axis, got {space}"
            )
        low = np.concatenate([space.low] * self.num_frames, axis=-1)
        high = np.concatenate([space.high] * self.num_frames, axis=-1)
        return gym.spaces.Box(low, high, low.shape, space.dtype)  # type: ignore[arg-type]

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
        """Stacks each row's frames from its episode.

        Args:
            rl_module: Unused.
            batch: ``{module_id: {Columns.OBS: (B, ...)}}``.
            episodes: The runner's episodes.
            explore: Unused.
            shared_data: ``agent_rows``.
            metrics: Unused.
            **kwargs: Unused.

        Returns:
            The batch with stacked observations.

        Raises:
            KeyError: If ``agent_rows`` is missing for a module.
        """
        for module_id, module_batch in batch.items():
            if Columns.OBS not in module_batch:
                continue
            rows = self.row_episodes(module_id, episodes, shared_data)
            stacked = []
            for episode in rows:
                frames = np.asarray(
                    episode.get_observations(indices=slice(-self.num_frames, None), fill=0.0)
                )
                stacked.append(np.concatenate(list(frames), axis=-1))
            module_batch[Columns.OBS] = np.stack(stacked)
        return batch
