"""``PrevActionsPrevRewards``: adds each row's last actions and rewards to its observation."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from fastrollout.connectors.connector_v2 import ConnectorV2
from fastrollout.core import Columns

__all__ = ["PrevActionsPrevRewards"]


class PrevActionsPrevRewards(ConnectorV2):
    """Turns each module's observations into ``{"_orig_obs", "prev_n_actions", "prev_n_rewards"}``.

    As RLlib's piece (same keys): ``prev_n_actions`` holds the row's last
    ``n_prev_actions`` actions (Discrete ones one-hot, all flattened and concatenated,
    zeros before the episode start), ``prev_n_rewards`` its last ``n_prev_rewards``
    rewards. The values come from the row's episode look-back. Unlike RLlib this piece
    does not rewrite the episodes' observations (their columns are typed by the env's
    observation space); the module sees the dict, the episodes keep what the env sent.

    Args:
        n_prev_actions: How many previous actions (0: none).
        n_prev_rewards: How many previous rewards (0: none).
        multi_agent: Accepted for RLlib compatibility (rows name their agents).
        **kwargs: Passed to ``ConnectorV2``.

    Raises:
        ValueError: If a count is negative.
    """

    ORIG_OBS_KEY = "_orig_obs"
    PREV_ACTIONS_KEY = "prev_n_actions"
    PREV_REWARDS_KEY = "prev_n_rewards"

    def __init__(
        self,
        *,
        n_prev_actions: int = 1,
        n_prev_rewards: int = 1,
        multi_agent: bool = False,
        **kwargs: Any,
    ) -> None:
        if n_prev_actions < 0 or n_prev_rewards < 0:
            raise ValueError(
                f"n_prev_actions and n_prev_rewards must be >= 0, got {n_prev_actions}, "
                f"{n_prev_rewards}"
            )
        self.n_prev_actions = int(n_prev_actions)
        self.n_prev_rewards = int(n_prev_rewards)
        super().__init__(**kwargs)

    def recompute_output_observation_space(
        self, input_observation_space: gym.Space, input_action_space: gym.Space
    ) -> gym.Space:
        """A Dict of the original space and Boxes for the previous actions and rewards.

        Args:
            input_observation_space: The incoming observation space.
            input_action_space: The action space (Discrete or Box).

        Returns:
            The Dict space.

        Raises:
            TypeError: If previous actions are asked for and the action space is neither
                Discrete nor Box.
        """
        parts: dict[str, gym.Space] = {self.ORIG_OBS_KEY: input_observation_space}
        if self.n_prev_actions:
            act = input_action_space
            if isinstance(act, gym.spaces.Discrete):
                size, low, high = int(act.n), 0.0, 1.0
                parts[self.PREV_ACTIONS_KEY] = gym.spaces.Box(
                    low, high, (size * self.n_prev_actions,), np.float32
                )
            elif isinstance(act, gym.spaces.Box):
                lo = np.concatenate([act.low.reshape(-1)] * self.n_prev_actions)
                hi = np.concatenate([act.high.reshape(-1)] * self.n_prev_actions)
                parts[self.PREV_ACTIONS_KEY] = gym.spaces.Box(lo, hi, lo.shape, np.float32)
            else:
                raise TypeError(f"previous actions need a Discrete or Box action space, got {act}")
        if self.n_prev_rewards:
            parts[self.PREV_REWARDS_KEY] = gym.spaces.Box(
                -np.inf, np.inf, (self.n_prev_rewards,), np.float32
            )
        return gym.spaces.Dict(parts)

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
        """Builds the dict observations from each row's episode.

        Args:
            rl_module: Unused.
            batch: ``{module_id: {Columns.OBS: (B, ...)}}``.
            episodes: The runner's episodes.
            explore: Unused.
            shared_data: ``agent_rows``.
            metrics: Unused.
            **kwargs: Unused.

        Returns:
            The batch with dict observations.

        Raises:
            KeyError: If ``agent_rows`` is missing for a module.
        """
        for module_id, module_batch in batch.items():
            if Columns.OBS not in module_batch:
                continue
            rows = self.row_episodes(module_id, episodes, shared_data)
            obs: dict[str, Any] = {self.ORIG_OBS_KEY: module_batch[Columns.OBS]}
            if self.n_prev_actions:
                actions = [
                    np.asarray(
                        e.get_actions(
                            indices=slice(-self.n_prev_actions, None),
                            fill=0.0,
                            one_hot_discrete=True,
                        ),
                        np.float32,
                    ).reshape(-1)
                    for e in rows
                ]
                obs[self.PREV_ACTIONS_KEY] = np.stack(actions) if actions else np.zeros((0, 0))
            if self.n_prev_rewards:
                rewards = [
                    np.asarray(
                        e.get_rewards(indices=slice(-self.n_prev_rewards, None), fill=0.0),
                        np.float32,
                    ).reshape(-1)
                    for e in rows
                ]
                obs[self.PREV_REWARDS_KEY] = (
                    np.stack(rewards) if rewards else np.zeros((0, self.n_prev_rewards))
                )
            module_batch[Columns.OBS] = obs
        return batch
