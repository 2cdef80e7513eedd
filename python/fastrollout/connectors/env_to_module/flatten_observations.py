"""``FlattenObservations``: nested or discrete observations become one flat float vector."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from fastrollout.connectors.connector_v2 import ConnectorV2
from fastrollout.core import Columns

__all__ = ["FlattenObservations"]

_Flattener = Callable[[Any], np.ndarray]


def _one_hot(idx: np.ndarray, n: int, what: str) -> np.ndarray:
    if idx.size and (idx.min() < 0 or idx.max() >= n):
        raise ValueError(f"{what}: values must lie in [0, {n}), got {idx.min()}..{idx.max()}")
    out = np.zeros((idx.shape[0], n), np.float32)
    out[np.arange(idx.shape[0]), idx] = 1.0
    return out


def _flattener(space: gym.Space, path: str) -> tuple[_Flattener, np.ndarray, np.ndarray]:
    """A batch flattener for ``space`` and the bounds of its output."""
    if isinstance(space, gym.spaces.Box):
        size = int(np.prod(space.shape, dtype=np.int64))

        def box(x: Any) -> np.ndarray:
            return np.asarray(x).reshape(len(x), size).astype(np.float32, copy=False)

        return (
            box,
            space.low.reshape(-1).astype(np.float32),
            space.high.reshape(-1).astype(np.float32),
        )
    if isinstance(space, gym.spaces.Discrete):
        n, start = int(space.n), int(space.start)

        def discrete(x: Any) -> np.ndarray:
            return _one_hot(np.asarray(x).reshape(-1).astype(np.int64) - start, n, path)

        return discrete, np.zeros(n, np.float32), np.ones(n, np.float32)
    if isinstance(space, gym.spaces.MultiDiscrete):
        nvec = space.nvec.reshape(-1).astype(np.int64)
        starts = space.start.reshape(-1).astype(np.int64)

        def multi_discrete(x: Any) -> np.ndarray:
            idx = np.asarray(x).reshape(len(x), -1).astype(np.int64) - starts
            parts = [_one_hot(idx[:, i], int(n), f"{path}[{i}]") for i, n in enumerate(nvec)]
            return np.concatenate(parts, axis=1)

        total = int(nvec.sum())
        return multi_discrete, np.zeros(total, np.float32), np.ones(total, np.float32)
    if isinstance(space, gym.spaces.MultiBinary):
        size = int(np.prod(space.shape, dtype=np.int64))
        return (
            lambda x: np.asarray(x).reshape(len(x), size).astype(np.float32),
            np.zeros(size, np.float32),
            np.ones(size, np.float32),
        )
    if isinstance(space, gym.spaces.Dict | gym.spaces.Tuple):
        items: list[tuple[Any, gym.Space]] = (
            list(space.spaces.items())
            if isinstance(space, gym.spaces.Dict)
            else list(enumerate(space.spaces))
        )
        subs = [(k, _flattener(s, f"{path}[{k!r}]")) for k, s in items]

        def nested(x: Any) -> np.ndarray:
            return np.concatenate([fn(x[k]) for k, (fn, _, _) in subs], axis=1)

        low = np.concatenate([lo for _, (_, lo, _) in subs])
        high = np.concatenate([hi for _, (_, _, hi) in subs])
        return nested, low, high
    raise TypeError(
        f"FlattenObservations cannot flatten {path} = {space}: supported are Box, Discrete, "
        "MultiDiscrete, MultiBinary and Dict/Tuple of those"
    )


class FlattenObservations(ConnectorV2):
    """Flattens every module's observations into float32 ``(B, D)`` arrays.

    Box components are flattened, Discrete and MultiDiscrete ones one-hot encoded,
    MultiBinary ones cast; Dict and Tuple parts are concatenated in the space's order
    (RLlib's FlattenObservations does the same per agent; this piece does it per module
    batch, in one pass). Works on numpy batches (put it before ``NumpyToTensor``).

    Args:
        input_observation_space: The observation space, or ``{module_id: space}``.
        input_action_space: The action space(s) (passed through).
        **kwargs: Passed to ``ConnectorV2``.
    """

    def __init__(
        self, input_observation_space: Any = None, input_action_space: Any = None, **kwargs: Any
    ) -> None:
        self._flatteners: dict[Any, _Flattener] = {}
        super().__init__(input_observation_space, input_action_space, **kwargs)

    def recompute_output_observation_space(
        self, input_observation_space: gym.Space, input_action_space: gym.Space
    ) -> gym.Space:
        """A 1-D float32 Box with the flattened bounds (one-hots in [0, 1]).

        Args:
            input_observation_space: The incoming space.
            input_action_space: Unused.

        Returns:
            The flat Box.
        """
        _, low, high = _flattener(input_observation_space, "obs")
        return gym.spaces.Box(low, high, low.shape, np.float32)

    def _recompute_spaces(self) -> None:
        self._flatteners = {}
        super()._recompute_spaces()

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
        """Flattens ``Columns.OBS`` of every module.

        Args:
            rl_module: Unused.
            batch: ``{module_id: {Columns.OBS: batched observations}}``.
            episodes: Unused.
            explore: Unused.
            shared_data: Unused.
            metrics: Unused.
            **kwargs: Unused.

        Returns:
            The batch with flat observations.

        Raises:
            ValueError: If no observation space is known for a module.
        """
        for module_id, module_batch in batch.items():
            if Columns.OBS not in module_batch:
                continue
            fn = self._flatteners.get(module_id)
            if fn is None:
                space = self.space_for(self.input_observation_space, module_id)
                if space is None:
                    raise ValueError(
                        "FlattenObservations needs input_observation_space for module "
                        f"{module_id!r}"
                    )
                fn = self._flatteners[module_id] = _flattener(space, "obs")[0]
            module_batch[Columns.OBS] = fn(module_batch[Columns.OBS])
        return batch
