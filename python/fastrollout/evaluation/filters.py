"""Observation filters, their cross-worker synchronisation, and reward clipping.

The API follows RLlib 2.60's old-stack ``ray.rllib.utils.filter`` (``NoFilter``,
``MeanStdFilter``, ``ConcurrentMeanStdFilter``, ``get_filter``) and the flow of
``FilterManager.synchronize`` with ``RolloutWorker.get_filters`` / ``sync_filters``, as
plain functions without Ray.

Statistics are a :class:`~fastrollout.connectors.env_to_module.running_stat.RunningStat`
per observation component, the runner's ``MeanStdFilter`` connector's too; merged from any
split of a stream they equal one pass over it (to floating-point rounding). Where RLlib
2.60 behaves differently (float32 variance, nested shapes and batched input that fail, a
driver's own data counted again on every sync) the tests in ``tests/test_filters.py`` pin
RLlib's behaviour next to ours.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Mapping
from typing import Any, TypeAlias

import numpy as np

from fastrollout.connectors.env_to_module.running_stat import SMALL_NUMBER, RunningStat, leaf_shape
from fastrollout.core.tree import tree_map

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

# A leaf shape is a tuple of ints (``()`` for scalars) or ``None`` (not normalised, e.g. a
# Discrete component); a shape structure nests leaves in dicts and tuples.
ShapeStruct: TypeAlias = Any

FILTER_NAMES = ("NoFilter", "MeanStdFilter", "ConcurrentMeanStdFilter")


# ----------------------------------------------------------------------------------------
# Shape structures
# ----------------------------------------------------------------------------------------


def _normalize_shape(shape: Any) -> ShapeStruct:
    """Dicts and tuples of leaf shapes, each leaf a tuple of ints or None."""
    if isinstance(shape, Mapping):
        return {k: _normalize_shape(v) for k, v in shape.items()}
    try:
        return leaf_shape(shape)
    except ValueError:
        pass
    if isinstance(shape, (tuple, list)):
        return tuple(_normalize_shape(s) for s in shape)
    raise ValueError(
        f"not an observation shape: {shape!r} (expected a tuple of ints, None, "
        "or a dict/tuple of those)"
    )


def _is_leaf(shape: ShapeStruct) -> bool:
    return shape is None or (isinstance(shape, tuple) and all(isinstance(s, int) for s in shape))


def _map_shape(fn: Callable[..., Any], shape: ShapeStruct, *structs: Any, path: str = "") -> Any:
    """Applies ``fn(leaf_shape, *leaves, path)`` over ``shape`` and structures shaped like it."""
    if _is_leaf(shape):
        return fn(shape, *structs, path=path or "observation")
    if isinstance(shape, dict):
        for s in structs:
            if not isinstance(s, Mapping) or set(s.keys()) != set(shape.keys()):
                got = sorted(map(str, s.keys())) if isinstance(s, Mapping) else type(s).__name__
                raise ValueError(
                    f"{path or 'observation'}: expected a dict with keys "
                    f"{sorted(map(str, shape.keys()))}, got {got}"
                )
        return {
            k: _map_shape(fn, sub, *(s[k] for s in structs), path=f"{path}[{k!r}]")
            for k, sub in shape.items()
        }
    for s in structs:
        if not isinstance(s, (tuple, list)) or len(s) != len(shape):
            got = f"length {len(s)}" if isinstance(s, (tuple, list)) else type(s).__name__
            raise ValueError(
                f"{path or 'observation'}: expected a tuple of {len(shape)} components, got {got}"
            )
    return tuple(
        _map_shape(fn, sub, *(s[i] for s in structs), path=f"{path}[{i}]")
        for i, sub in enumerate(shape)
    )


def _shape_to_plain(shape: ShapeStruct) -> Any:
    if _is_leaf(shape):
        return None if shape is None else list(shape)
    if isinstance(shape, dict):
        return {"dict": {k: _shape_to_plain(v) for k, v in shape.items()}}
    return {"tuple": [_shape_to_plain(v) for v in shape]}


def _shape_from_plain(plain: Any) -> ShapeStruct:
    if plain is None:
        return None
    if isinstance(plain, Mapping) and "dict" in plain:
        return {k: _shape_from_plain(v) for k, v in plain["dict"].items()}
    if isinstance(plain, Mapping) and "tuple" in plain:
        return tuple(_shape_from_plain(v) for v in plain["tuple"])
    return tuple(int(s) for s in plain)


# ----------------------------------------------------------------------------------------
# Filters
# ----------------------------------------------------------------------------------------


class Filter:
    """A (possibly stateful) transformation of observations, synchronised across workers."""

    is_concurrent = False

    def __call__(self, x: Any, update: bool = True) -> Any:
        """Filters ``x``; with ``update``, adds it to the statistics first."""
        raise NotImplementedError

    def apply_changes(self, other: Any, with_buffer: bool = False) -> None:
        """Merges ``other`` 's buffer (the data it saw since its last flush) into self."""
        raise NotImplementedError

    def copy(self) -> Filter:
        """A filter with the same state."""
        raise NotImplementedError

    def sync(self, other: Any) -> None:
        """Replaces all of self's state with ``other`` 's."""
        raise NotImplementedError

    def reset_buffer(self) -> None:
        """Forgets the data seen since the last flush (the running statistics stay)."""
        raise NotImplementedError

    def clear_buffer(self) -> None:
        """Same as :meth:`reset_buffer` (RLlib 2.60 raises here; it is deprecated there)."""
        self.reset_buffer()

    def as_serializable(self) -> Filter:
        """A copy that can be pickled and sent to another process."""
        raise NotImplementedError

    def get_state(self) -> dict[str, Any]:
        """The filter's state as plain numbers, strings, lists, dicts and numpy arrays."""
        raise NotImplementedError

    def __reduce__(self) -> tuple[Any, ...]:
        return (filter_from_state, (self.get_state(),))


class NoFilter(Filter):
    """Passes observations through (converting non-structured ones to arrays)."""

    is_concurrent = True

    def __call__(self, x: Any, update: bool = True) -> Any:
        """Returns arrays, dicts and tuples as they are, anything else as an array."""
        if isinstance(x, (np.ndarray, dict, tuple)):
            return x
        try:
            return np.asarray(x)
        except Exception as err:
            raise ValueError(f"NoFilter: cannot convert {x!r} to an array") from err

    def apply_changes(self, other: Any, with_buffer: bool = False) -> None:
        """Nothing to merge."""
        pass

    def copy(self) -> NoFilter:
        """Itself (a NoFilter has no state)."""
        return self

    def sync(self, other: Any) -> None:
        """Nothing to copy."""
        pass

    def reset_buffer(self) -> None:
        """Nothing to reset."""
        pass

    def as_serializable(self) -> NoFilter:
        """Itself."""
        return self

    def get_state(self) -> dict[str, Any]:
        """The filter's type."""
        return {"type": "NoFilter"}

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> NoFilter:
        """Rebuilds the filter from :meth:`get_state` 's output."""
        return cls()

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self)

    __hash__ = object.__hash__

    def __repr__(self) -> str:
        return "NoFilter()"


class MeanStdFilter(Filter):
    """Normalises observations by their running mean and standard deviation.

    ``y = clip((x - mean) / (std + SMALL_NUMBER), -clip, clip)`` computed with the
    statistics after ``x`` was added (``update=True``), cast back to ``x`` 's dtype. The
    statistics live in :attr:`running_stats`; the data seen since the last flush is kept in
    :attr:`buffer` as well, which is what other filters merge with :meth:`apply_changes`.

    Args:
        shape: The observation shape: a tuple of ints, ``None`` (passed through, e.g. a
            Discrete observation), or a dict/tuple nesting those for Dict/Tuple spaces.
        demean: Subtract the mean.
        destd: Divide by the standard deviation.
        clip: Clip the result to ``[-clip, clip]``; ``None`` or ``0`` for no clipping.

    Raises:
        ValueError: ``shape`` is not a shape or a nesting of shapes.

    >>> f = MeanStdFilter((2,))
    >>> _ = f([1.0, 2.0]); _ = f([3.0, 6.0])
    >>> f.running_stats.n, f.running_stats.mean.tolist()
    (2, [2.0, 4.0])
    """

    is_concurrent = False

    def __init__(
        self,
        shape: Any,
        demean: bool = True,
        destd: bool = True,
        clip: float | None = 10.0,
    ) -> None:
        self.shape: ShapeStruct = _normalize_shape(shape)
        self.demean = demean
        self.destd = destd
        self.clip = clip
        self.running_stats: Any = self._fresh_stats()
        self.buffer: Any = self._fresh_stats()

    def _fresh_stats(self) -> Any:
        return _map_shape(lambda s, path: None if s is None else RunningStat(s), self.shape)

    # -- filtering ----------------------------------------------------------------------

    def __call__(self, x: Any, update: bool = True) -> Any:
        """Filters one observation or a batch of them (leading batch axis).

        Raises:
            ValueError: ``x`` does not have the filter's shape (or structure).
        """
        return _map_shape(
            functools.partial(self._filter_leaf, update=update),
            self.shape,
            x,
            self.running_stats,
            self.buffer,
        )

    def _filter_leaf(
        self,
        shape: tuple[int, ...] | None,
        x: Any,
        rs: RunningStat | None,
        buf: RunningStat | None,
        *,
        path: str,
        update: bool,
    ) -> Any:
        x = np.asarray(x)
        if shape is None or rs is None or buf is None:
            return x
        if x.shape == shape:
            batched = False
        elif x.ndim == len(shape) + 1 and x.shape[1:] == shape:
            batched = True
        else:
            raise ValueError(
                f"{type(self).__name__}: {path} has shape {x.shape}, expected {shape} "
                f"or (batch, *{shape})"
            )
        if update:
            if batched:
                rs.push_batch(x)
                buf.push_batch(x)
            else:
                rs.push(x)
                buf.push(x)
        return self._normalize(x, rs)

    def _normalize(self, x: np.ndarray, rs: RunningStat) -> np.ndarray:
        y: np.ndarray = x
        if self.demean:
            y = y - rs.mean
        if self.destd:
            y = y / (rs.std + SMALL_NUMBER)
        if self.clip:
            y = np.clip(y, -self.clip, self.clip)
        return np.asarray(y).astype(x.dtype, copy=False)

    # -- synchronisation ----------------------------------------------------------------

    def _export(self) -> tuple[bool, bool, float | None, ShapeStruct, Any, Any]:
        """A consistent snapshot (copies) of the state, for other filters to read."""
        return (
            self.demean,
            self.destd,
            self.clip,
            self.shape,
            _copy_stats(self.running_stats),
            _copy_stats(self.buffer),
        )

    def _check_same_shape(self, shape: ShapeStruct, op: str) -> None:
        if shape != self.shape:
            raise ValueError(f"{type(self).__name__}.{op}: shapes differ ({self.shape} vs {shape})")

    def apply_changes(self, other: Any, with_buffer: bool = False) -> None:
        """Merges ``other.buffer`` into :attr:`running_stats`.

        Args:
            other: A ``MeanStdFilter`` of the same shape.
            with_buffer: Also replace self's buffer with a copy of ``other`` 's.

        Raises:
            ValueError: the shapes differ.
        """
        self._apply_snapshot(other._export(), with_buffer)

    def _apply_snapshot(self, snapshot: tuple[Any, ...], with_buffer: bool) -> None:
        _, _, _, shape, _, other_buffer = snapshot
        self._check_same_shape(shape, "apply_changes")
        _map_shape(
            lambda s, rs, b, path: None if rs is None else rs.update(b),
            self.shape,
            self.running_stats,
            other_buffer,
        )
        if with_buffer:
            self.buffer = other_buffer

    def sync(self, other: Any) -> None:
        """Copies all of ``other`` 's state (settings, statistics and buffer).

        Raises:
            ValueError: the shapes differ.
        """
        self._sync_snapshot(other._export())

    def _sync_snapshot(self, snapshot: tuple[Any, ...]) -> None:
        demean, destd, clip, shape, rs, buf = snapshot
        self._check_same_shape(shape, "sync")
        self.demean, self.destd, self.clip = demean, destd, clip
        self.running_stats, self.buffer = rs, buf

    def reset_buffer(self) -> None:
        """Starts a new, empty buffer."""
        self.buffer = self._fresh_stats()

    def copy(self) -> MeanStdFilter:
        """A filter of the same class with copies of the settings and statistics."""
        other = type(self)(self.shape)
        other.sync(self)
        return other

    def as_serializable(self) -> MeanStdFilter:
        """A copy."""
        return self.copy()

    # -- state --------------------------------------------------------------------------

    def get_state(self) -> dict[str, Any]:
        """Settings, shape, statistics and buffer as plain data (see :meth:`from_state`)."""
        demean, destd, clip, shape, rs, buf = self._export()
        return {
            "type": type(self).__name__,
            "shape": _shape_to_plain(shape),
            "demean": bool(demean),
            "destd": bool(destd),
            "clip": None if clip is None else float(clip),
            "running_stats": _stats_to_state(shape, rs),
            "buffer": _stats_to_state(shape, buf),
        }

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> MeanStdFilter:
        """Rebuilds a filter from :meth:`get_state` 's output.

        Raises:
            ValueError: the state's statistics do not match its shape.
        """
        shape = _shape_from_plain(state["shape"])
        f = cls(shape, demean=state["demean"], destd=state["destd"], clip=state["clip"])
        f.running_stats = _stats_from_state(shape, state["running_stats"])
        f.buffer = _stats_from_state(shape, state["buffer"])
        return f

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, MeanStdFilter):
            return NotImplemented
        return _states_equal(self.get_state(), other.get_state())

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(shape={self.shape}, demean={self.demean}, "
            f"destd={self.destd}, clip={self.clip})"
        )


class ConcurrentMeanStdFilter(MeanStdFilter):
    """A :class:`MeanStdFilter` whose every operation holds one re-entrant lock.

    Threads may filter, merge, sync, copy and snapshot it concurrently; each operation sees
    and leaves a consistent state.
    """

    is_concurrent = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._lock = threading.RLock()
        super().__init__(*args, **kwargs)

    def __call__(self, x: Any, update: bool = True) -> Any:
        """Filters ``x`` under the lock."""
        with self._lock:
            return super().__call__(x, update=update)

    def _export(self) -> tuple[bool, bool, float | None, ShapeStruct, Any, Any]:
        with self._lock:
            return super()._export()

    # Snapshots of the other filter are taken before this one's lock: no lock-order
    # deadlock when two concurrent filters sync from each other.
    def _apply_snapshot(self, snapshot: tuple[Any, ...], with_buffer: bool) -> None:
        with self._lock:
            super()._apply_snapshot(snapshot, with_buffer)

    def _sync_snapshot(self, snapshot: tuple[Any, ...]) -> None:
        with self._lock:
            super()._sync_snapshot(snapshot)

    def reset_buffer(self) -> None:
        """Starts a new, empty buffer under the lock."""
        with self._lock:
            super().reset_buffer()

    def as_serializable(self) -> MeanStdFilter:
        """A plain (non-concurrent) :class:`MeanStdFilter` with the same state."""
        other = MeanStdFilter(self.shape)
        other.sync(self)
        return other


def _copy_stats(stats: Any) -> Any:
    return tree_map(lambda rs: None if rs is None else rs.copy(), stats)


def _stats_to_state(shape: ShapeStruct, stats: Any) -> Any:
    return _map_shape(lambda s, rs, path: None if rs is None else rs.to_state(), shape, stats)


def _stats_from_state(shape: ShapeStruct, state: Any) -> Any:
    def leaf(s: tuple[int, ...] | None, st: Any, path: str) -> RunningStat | None:
        if s is None:
            return None
        rs = RunningStat.from_state(st)
        if rs.shape != s:
            raise ValueError(f"filter state: {path} has statistics of shape {rs.shape}, not {s}")
        return rs

    return _map_shape(leaf, shape, state)


def _states_equal(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return bool(np.array_equal(a, b))
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(_states_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_states_equal(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


_FILTER_TYPES: dict[str, type[Any]] = {
    "NoFilter": NoFilter,
    "MeanStdFilter": MeanStdFilter,
    "ConcurrentMeanStdFilter": ConcurrentMeanStdFilter,
}


def filter_from_state(state: Mapping[str, Any]) -> Filter:
    """Rebuilds any filter of this module from its ``get_state()``.

    Raises:
        ValueError: the state names no known filter type.
    """
    name = state.get("type")
    cls = _FILTER_TYPES.get(name) if isinstance(name, str) else None
    if cls is None:
        raise ValueError(f"filter state of unknown type {name!r}; known: {list(_FILTER_TYPES)}")
    result: Filter = cls.from_state(state)
    return result


def get_filter(filter_config: str | Callable[[Any], Filter], shape: Any) -> Filter:
    """Builds the observation filter that ``config.observation_filter`` names.

    As in RLlib, the mean/std filters built by name do not clip (``clip=None``).

    Args:
        filter_config: ``"NoFilter"``, ``"MeanStdFilter"``, ``"ConcurrentMeanStdFilter"``,
            or a callable taking the shape and returning a filter.
        shape: The observation shape (see :class:`MeanStdFilter`).

    Raises:
        ValueError: an unknown name (the message lists the known ones).

    >>> type(get_filter("MeanStdFilter", (3,))).__name__
    'MeanStdFilter'
    """
    if filter_config == "MeanStdFilter":
        return MeanStdFilter(shape, clip=None)
    if filter_config == "ConcurrentMeanStdFilter":
        return ConcurrentMeanStdFilter(shape, clip=None)
    if filter_config == "NoFilter":
        return NoFilter()
    if callable(filter_config):
        return filter_config(shape)
    raise ValueError(
        f"Unknown observation_filter {filter_config!r}; expected one of "
        f"{', '.join(map(repr, FILTER_NAMES))} or a callable taking the observation shape"
    )


# ----------------------------------------------------------------------------------------
# Synchronisation across workers (RolloutWorker.get_filters / sync_filters and
# FilterManager.synchronize, without Ray)
# ----------------------------------------------------------------------------------------


def get_filters(filters: Mapping[Any, Filter], flush_after: bool = False) -> dict[Any, Filter]:
    """Serializable copies of a worker's filters (with their buffers).

    Args:
        filters: The worker's filters by policy id.
        flush_after: Reset each filter's buffer after copying it, so the next call returns
            only the data seen from now on.
    """
    out = {}
    for k, f in filters.items():
        out[k] = f.as_serializable()
        if flush_after:
            f.reset_buffer()
    return out


def sync_filters(filters: Mapping[Any, Filter], new_filters: Mapping[Any, Filter]) -> None:
    """Sets each of a worker's filters to the state of the filter of the same policy.

    Raises:
        KeyError: ``new_filters`` lacks a policy that ``filters`` has.
    """
    missing = [k for k in filters if k not in new_filters]
    if missing:
        raise KeyError(f"sync_filters: no new filter for policies {missing}")
    for k, f in filters.items():
        f.sync(new_filters[k])


def synchronize(
    local_filters: Mapping[Any, Filter],
    remote_filter_deltas: list[Mapping[Any, Filter]],
    *,
    update_remote: bool = True,
    use_remote_data_for_update: bool = True,
) -> dict[Any, Filter] | None:
    """Merges the workers' new data into the driver's filters; returns what to send back.

    The flow of RLlib's ``FilterManager.synchronize``: each ``remote_filter_deltas`` entry
    is one worker's ``get_filters(flush_after=True)``; their buffers are merged into
    ``local_filters`` (exactly, in any order), and the returned copies are what each worker
    passes to :func:`sync_filters`.

    The copies go out with empty buffers: a worker's buffer then holds only what it sees
    after the sync. (RLlib sends the driver's buffer along, so data the driver's own filter
    saw is merged again on every later sync; ``tests/test_filters.py`` pins this.)

    Args:
        local_filters: The driver's filters by policy id (updated in place).
        remote_filter_deltas: One dict of filters per worker.
        update_remote: Return copies for the workers (else return ``None``).
        use_remote_data_for_update: Merge the workers' buffers (else discard them).

    Returns:
        The filters to pass to every worker's :func:`sync_filters`, or ``None``.

    Raises:
        KeyError: a worker lacks a filter for one of the driver's policies.
    """
    if use_remote_data_for_update:
        for i, remote in enumerate(remote_filter_deltas):
            missing = [k for k in local_filters if k not in remote]
            if missing:
                raise KeyError(f"synchronize: worker {i} has no filter for policies {missing}")
        for remote in remote_filter_deltas:
            for k, f in local_filters.items():
                f.apply_changes(remote[k], with_buffer=False)
    if not update_remote:
        return None
    copies = {}
    for k, f in local_filters.items():
        c = f.as_serializable()
        c.reset_buffer()
        copies[k] = c
    return copies


# ----------------------------------------------------------------------------------------
# Reward and action clipping
# ----------------------------------------------------------------------------------------


def clip_reward(reward: Any, clip_rewards: bool | float | None) -> Any:
    """Clips rewards as RLlib's ``clip_rewards`` setting does.

    Args:
        reward: A reward or an array of them.
        clip_rewards: ``True``: the sign (-1, 0, 1); a number ``c``: clip to ``[-|c|, |c|]``;
            ``None``/``False``/``0``: unchanged.

    >>> clip_reward([-3.0, 0.5, 2.0], True).tolist()
    [-1.0, 1.0, 1.0]
    >>> clip_reward([-3.0, 0.5, 2.0], 1.0).tolist()
    [-1.0, 0.5, 1.0]
    """
    if clip_rewards is True:
        return np.sign(reward)
    if clip_rewards is None or clip_rewards is False or not clip_rewards:
        return reward
    limit = abs(float(clip_rewards))
    return np.clip(reward, -limit, limit)
