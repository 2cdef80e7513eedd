"""``NormalizeAndClipActions``: ``Columns.ACTIONS_FOR_ENV`` fitted to the Box bounds."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from fastrollout.connectors.connector_v2 import ConnectorV2
from fastrollout.core import Columns

__all__ = ["NormalizeAndClipActions", "clip_action", "unsquash_action"]


def unsquash_action(action: Any, space: gym.Space) -> Any:
    """Maps actions from about ``[-1, 1]`` to a space's bounds (batched or not).

    Float Box components bounded on both sides are rescaled from ``[-1, 1]`` to
    ``[low, high]`` and clipped to them; integer Box components are shifted by ``low``;
    other components are returned unchanged (RLlib's ``unsquash_action``).

    Args:
        action: The action (or batch of actions); dicts/tuples for nested spaces.
        space: The action space.

    Returns:
        The env-ready action (a new array where something changed).
    """
    if isinstance(space, gym.spaces.Dict):
        return {k: unsquash_action(action[k], s) for k, s in space.spaces.items()}
    if isinstance(space, gym.spaces.Tuple):
        return tuple(unsquash_action(a, s) for a, s in zip(action, space.spaces, strict=True))
    if isinstance(space, gym.spaces.Box) and space.is_bounded("both"):
        if np.issubdtype(space.dtype, np.floating):
            scaled = space.low + (np.asarray(action) + 1.0) * (space.high - space.low) / 2.0
            return np.clip(scaled, space.low, space.high)
        if np.issubdtype(space.dtype, np.integer):
            return space.low + np.asarray(action)
    return action


def clip_action(action: Any, space: Any) -> Any:
    """Clips Box components of an action (or batch) to the space's bounds.

    Args:
        action: The action (or batch of actions); dicts/tuples for nested spaces.
        space: The action space, or its components nested in dicts/tuples (RLlib's
            ``get_base_struct_from_space``).

    Returns:
        The clipped action (other components unchanged).

    Raises:
        ValueError: The action is not nested like the space (the message names where).
    """
    return _clip(action, space, "")


def _clip(action: Any, space: Any, path: str) -> Any:
    if isinstance(space, gym.spaces.Box):
        return np.clip(action, space.low, space.high)
    if isinstance(space, gym.spaces.Dict | Mapping):
        subspaces = space.spaces if isinstance(space, gym.spaces.Dict) else space
        if not isinstance(action, Mapping) or action.keys() != subspaces.keys():
            raise ValueError(
                f"clip_action: {path or 'action'} should be a dict with keys "
                f"{sorted(map(str, subspaces))}, got {action!r}"
            )
        return {k: _clip(action[k], s, f"{path}[{k!r}]") for k, s in subspaces.items()}
    if isinstance(space, gym.spaces.Tuple | tuple | list):
        components = space.spaces if isinstance(space, gym.spaces.Tuple) else space
        if not isinstance(action, tuple | list) or len(action) != len(components):
            raise ValueError(
                f"clip_action: {path or 'action'} should be a tuple of "
                f"{len(components)} components, got {action!r}"
            )
        return tuple(
            _clip(a, s, f"{path}[{i}]")
            for i, (a, s) in enumerate(zip(action, components, strict=True))
        )
    return action


class NormalizeAndClipActions(ConnectorV2):
    """Sets ``Columns.ACTIONS_FOR_ENV`` for every module batch; ``ACTIONS`` stays as is.

    With ``normalize_actions`` the module's actions are taken to be in about ``[-1, 1]``
    and unsquashed to the Box bounds (:func:`unsquash_action`); else with
    ``clip_actions`` they are clipped to them (:func:`clip_action`); with neither,
    ``ACTIONS_FOR_ENV`` is ``ACTIONS`` itself (RLlib then leaves the column out; setting
    it always lets runners read one column). Episodes record ``ACTIONS``; the env gets
    ``ACTIONS_FOR_ENV``. Works on whole numpy module batches.

    The action space of a module is taken from ``input_action_space`` (a space or
    ``{module_id: space}``) if given, else from the module.

    Args:
        normalize_actions: Unsquash (RLlib's default: True).
        clip_actions: Clip (RLlib's default: False).
        **kwargs: Passed to ``ConnectorV2``.
    """

    def __init__(
        self, *, normalize_actions: bool = True, clip_actions: bool = False, **kwargs: Any
    ) -> None:
        self.normalize_actions = normalize_actions
        self.clip_actions = clip_actions
        super().__init__(**kwargs)

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
        """Adds ``ACTIONS_FOR_ENV`` to every module batch that has ``ACTIONS``.

        Args:
            rl_module: The MultiRLModule (action spaces).
            batch: ``{module_id: {Columns.ACTIONS: numpy (B, ...)}}``.
            episodes: Unused.
            explore: Unused.
            shared_data: Unused.
            metrics: Unused.
            **kwargs: Unused.

        Returns:
            The batch.

        Raises:
            ValueError: If a module has no action space to fit the actions to.
        """
        for module_id, out in batch.items():
            self.fit_module(rl_module, module_id, out)
        return batch

    def fit_module(self, rl_module: Any, module_id: Any, out: dict[str, Any]) -> None:
        """Adds ``ACTIONS_FOR_ENV`` to one module's outputs, if they have ``ACTIONS``.

        Args:
            rl_module: The MultiRLModule (action spaces).
            module_id: The module whose outputs ``out`` are.
            out: ``{Columns.ACTIONS: numpy (B, ...), ...}``, changed in place.

        Raises:
            ValueError: If the module has no action space to fit the actions to.
        """
        if Columns.ACTIONS not in out:
            return
        actions = out[Columns.ACTIONS]
        if not (self.normalize_actions or self.clip_actions):
            out[Columns.ACTIONS_FOR_ENV] = actions
            return
        space = self.space_for(self.input_action_space, module_id)
        if space is None:
            space = getattr(rl_module[module_id], "action_space", None)
        if space is None:
            raise ValueError(f"no action space known for module {module_id!r}")
        fit = unsquash_action if self.normalize_actions else clip_action
        out[Columns.ACTIONS_FOR_ENV] = fit(actions, space)

    def __repr__(self) -> str:
        return (
            f"NormalizeAndClipActions(normalize_actions={self.normalize_actions}, "
            f"clip_actions={self.clip_actions})"
        )
