"""Running count, mean and M2 of a stream of arrays: the statistics behind mean-std filters.

The runner's ``MeanStdFilter`` connector and the old stack's observation filters
(:mod:`fastrollout.evaluation.filters`) keep their statistics in :class:`RunningStat`, in
float64, merged with Chan et al.'s parallel formula, so the statistics merged from any
split of a stream equal one pass over it (to floating-point rounding).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

import numpy as np

__all__ = ["SMALL_NUMBER", "RunningStat", "leaf_shape"]

# Added to the standard deviation before dividing (RLlib's ``SMALL_NUMBER``).
SMALL_NUMBER = 1e-6


# The keys of a RunningStat's state: RLlib's old-stack filter's and the runner connector's.
_RLLIB_STATE_KEYS = ("num_pushes", "mean_array", "sum_sq_diff_array")
_CONNECTOR_STATE_KEYS = ("count", "mean", "m2")

_RS = TypeVar("_RS", bound="RunningStat")


class RunningStat:
    """Count, mean and sum of squared deviations (M2) of a stream of arrays of one shape.

    Single values are added with Welford's update, batches and other ``RunningStat`` s with
    Chan et al.'s parallel combination; both in float64.

    Args:
        shape: The shape of every value pushed.

    >>> rs = RunningStat(())
    >>> for x in (1.0, 2.0, 3.0):
    ...     rs.push(x)
    >>> rs.n, float(rs.mean), float(rs.var)
    (3, 2.0, 1.0)
    """

    __slots__ = ("mean_array", "num_pushes", "sum_sq_diff_array")

    def __init__(self, shape: tuple[int, ...] = ()) -> None:
        leaf = leaf_shape(shape)
        if leaf is None:
            raise ValueError("RunningStat needs a shape (a tuple of ints), not None")
        self.num_pushes = 0
        self.mean_array = np.zeros(leaf, dtype=np.float64)
        self.sum_sq_diff_array = np.zeros(leaf, dtype=np.float64)

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape of the values."""
        return tuple(self.mean_array.shape)

    @property
    def n(self) -> int:
        """The number of values seen."""
        return self.num_pushes

    @property
    def mean(self) -> np.ndarray:
        """The mean of the values seen (zeros before the first)."""
        return self.mean_array

    @property
    def var(self) -> np.ndarray:
        """The sample variance ``M2 / (n - 1)`` (zeros for ``n <= 1``), float64."""
        if self.num_pushes <= 1:
            return np.zeros_like(self.mean_array)
        return self.sum_sq_diff_array / (self.num_pushes - 1)

    @property
    def std(self) -> np.ndarray:
        """The square root of :attr:`var`."""
        return np.sqrt(np.maximum(self.var, 0.0))

    def push(self, x: Any) -> None:
        """Adds one value.

        Raises:
            ValueError: ``x`` does not have the stat's shape.
        """
        arr = np.asarray(x, dtype=np.float64)
        if arr.shape != self.mean_array.shape:
            raise ValueError(f"RunningStat.push: value of shape {arr.shape}, expected {self.shape}")
        self.num_pushes += 1
        delta = arr - self.mean_array
        self.mean_array = self.mean_array + delta / self.num_pushes
        self.sum_sq_diff_array = self.sum_sq_diff_array + delta * (arr - self.mean_array)

    def push_batch(self, xs: Any) -> None:
        """Adds every row of ``xs`` (shape ``(B, *shape)``) in one vectorised merge.

        Raises:
            ValueError: the rows do not have the stat's shape.
        """
        arr = np.asarray(xs, dtype=np.float64)
        if arr.shape[1:] != self.mean_array.shape or arr.ndim != self.mean_array.ndim + 1:
            raise ValueError(
                f"RunningStat.push_batch: batch of shape {arr.shape}, expected (B, *{self.shape})"
            )
        if arr.shape[0] == 0:
            return
        mean = arr.mean(axis=0)
        m2 = ((arr - mean) ** 2).sum(axis=0)
        self._combine(arr.shape[0], mean, m2)

    def update(self, other: RunningStat) -> None:
        """Merges all of ``other`` 's values into this stat (exact, order-free).

        Raises:
            ValueError: the shapes differ.
        """
        if other.shape != self.shape:
            raise ValueError(f"RunningStat.update: shapes differ ({self.shape} vs {other.shape})")
        self._combine(other.num_pushes, other.mean_array, other.sum_sq_diff_array)

    def _combine(self, n_b: int, mean_b: np.ndarray, m2_b: np.ndarray) -> None:
        # Chan et al. (1979): M2 = M2_a + M2_b + delta^2 * n_a * n_b / n.
        n_a = self.num_pushes
        n = n_a + n_b
        if n_b == 0:
            return
        delta = mean_b - self.mean_array
        self.mean_array = self.mean_array + delta * (n_b / n)
        self.sum_sq_diff_array = (
            self.sum_sq_diff_array + m2_b + delta * delta * (float(n_a) * float(n_b) / n)
        )
        self.num_pushes = n

    def copy(self: _RS) -> _RS:
        """An independent copy."""
        other = type(self).__new__(type(self))
        other.num_pushes = self.num_pushes
        other.mean_array = self.mean_array.copy()
        other.sum_sq_diff_array = self.sum_sq_diff_array.copy()
        return other

    def to_state(self) -> dict[str, Any]:
        """The stat as plain numbers and float64 arrays."""
        return {
            "num_pushes": self.num_pushes,
            "mean_array": self.mean_array.copy(),
            "sum_sq_diff_array": self.sum_sq_diff_array.copy(),
        }

    @classmethod
    def from_state(cls: type[_RS], state: Mapping[str, Any]) -> _RS:
        """Rebuilds a stat from :meth:`to_state` 's output.

        Reads either key set: RLlib's ``num_pushes``/``mean_array``/``sum_sq_diff_array``
        or the runner connector's ``count``/``mean``/``m2``.

        Raises:
            ValueError: a key is missing, the arrays' shapes differ or the count is negative.
        """
        keys = _RLLIB_STATE_KEYS if "num_pushes" in state else _CONNECTOR_STATE_KEYS
        missing = [k for k in keys if k not in state]
        if missing:
            raise ValueError(f"RunningStat state lacks {missing[0]!r}")
        n_key, mean_key, m2_key = keys
        mean = np.array(state[mean_key], dtype=np.float64)
        m2 = np.array(state[m2_key], dtype=np.float64)
        n = int(state[n_key])
        if mean.shape != m2.shape or n < 0:
            raise ValueError(
                f"RunningStat state: mean shape {mean.shape}, M2 shape {m2.shape}, n={n}"
            )
        rs = cls(tuple(mean.shape))
        rs.num_pushes, rs.mean_array, rs.sum_sq_diff_array = n, mean, m2
        return rs

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RunningStat):
            return NotImplemented
        return (
            self.num_pushes == other.num_pushes
            and np.array_equal(self.mean_array, other.mean_array)
            and np.array_equal(self.sum_sq_diff_array, other.sum_sq_diff_array)
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"RunningStat(shape={self.shape}, n={self.n})"


def leaf_shape(shape: Any) -> tuple[int, ...] | None:
    """``shape`` as a tuple of ints, ``None`` for None; raises for anything else."""
    if shape is None:
        return None
    if isinstance(shape, (int, np.integer)) and not isinstance(shape, bool):
        return (int(shape),)
    if isinstance(shape, np.ndarray) and shape.dtype.kind in "iu" and shape.ndim <= 1:
        return tuple(int(s) for s in shape.reshape(-1))
    if isinstance(shape, (tuple, list)) and all(
        isinstance(s, (int, np.integer)) and not isinstance(s, bool) for s in shape
    ):
        return tuple(int(s) for s in shape)
    raise ValueError(f"not a shape (a tuple of ints or None): {shape!r}")
