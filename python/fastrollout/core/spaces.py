"""Spaces as plain dicts: RLlib 2.60's ``gym_space_to_dict`` form, read and written without Ray.

Episode states (``get_state()`` with RLlib's layout, the offline files) carry spaces in this
form; reading it needs only gymnasium and numpy, so a state written where RLlib runs loads
where it does not. Spaces of kinds outside gymnasium's own (RLlib's ``Simplex``,
``Repeated``...) go through RLlib's serializer, where it is installed.
"""

from __future__ import annotations

import base64
import io
import weakref
import zlib
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np

__all__ = ["is_space_dict", "shared_space", "space_from_dict", "space_to_dict"]

# Live Box spaces by (shape, dtype), as weak references: what shared_space hands out again.
_SHARED_BOXES: dict[tuple[Any, ...], list[weakref.ref[gym.spaces.Box]]] = {}


def shared_space(space: Any) -> Any:
    """One live object per Box space: `space`, or a live Box equal to it bit for bit.

    Every episode that arrives by pickle (a remote runner's chunks crossing Ray) brings
    its own copy of its spaces, and a Box holds four arrays of its shape (an 84x84x4 frame
    Box about 113 kB, as much as 50 compressed frames): episodes rebuilt from a state share
    one instead. Only Box spaces are shared (the big ones); anything else comes back as it
    is. Shared spaces are the same object, as a runner's own episodes' are.

    Args:
        space: A space, or anything else.

    Returns:
        The space to keep.
    """
    if type(space) is not gym.spaces.Box:
        return space
    key = (space.shape, np.dtype(space.dtype).str)
    live = [r for r in _SHARED_BOXES.get(key, ()) if r() is not None]
    low, high = space.low.tobytes(), space.high.tobytes()
    for ref in live:
        other = ref()
        if other is not None and other.low.tobytes() == low and other.high.tobytes() == high:
            return other
    _SHARED_BOXES[key] = [*live, weakref.ref(space)]
    return space


def _ndarray_text(array: np.ndarray) -> str:
    # RLlib's form: np.save bytes, zlib, base64.
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return base64.b64encode(zlib.compress(buf.getvalue())).decode("ascii")


def _text_ndarray(text: str) -> np.ndarray:
    # allow_pickle=False: files are data, never code.
    return np.load(io.BytesIO(zlib.decompress(base64.b64decode(text))), allow_pickle=False)


def space_to_dict(space: gym.Space | None) -> dict[str, Any] | None:
    """A space in RLlib's ``gym_space_to_dict`` form (without importing RLlib).

    Raises:
        TypeError: A space of a kind outside gymnasium's Box, Discrete, MultiBinary,
            MultiDiscrete, Tuple, Dict and Text, where RLlib is not installed.
    """
    if space is None:
        return None
    if isinstance(space, gym.spaces.Box):
        return {
            "space": "box",
            "low": _ndarray_text(space.low),
            "high": _ndarray_text(space.high),
            "shape": tuple(space.shape),
            "dtype": np.dtype(space.dtype).str,
        }
    if isinstance(space, gym.spaces.Discrete):
        return {"space": "discrete", "n": int(space.n), "start": int(space.start)}
    if isinstance(space, gym.spaces.MultiBinary):
        return {"space": "multi-binary", "n": space.n}
    if isinstance(space, gym.spaces.MultiDiscrete):
        return {
            "space": "multi-discrete",
            "nvec": _ndarray_text(space.nvec),
            "dtype": np.dtype(space.dtype).str,
        }
    if isinstance(space, gym.spaces.Tuple):
        return {"space": "tuple", "spaces": [space_to_dict(s) for s in space.spaces]}
    if isinstance(space, gym.spaces.Dict):
        return {"space": "dict", "spaces": {k: space_to_dict(s) for k, s in space.items()}}
    if isinstance(space, gym.spaces.Text):
        return {
            "space": "text",
            "min_length": space.min_length,
            "max_length": space.max_length,
            "charset": space.character_set,
        }
    try:
        from ray.rllib.utils.serialization import gym_space_to_dict
    except ImportError:
        raise TypeError(f"cannot write a space of type {type(space).__name__}") from None
    return gym_space_to_dict(space)  # type: ignore[no-any-return]


def space_from_dict(d: Mapping[str, Any] | None) -> gym.Space | None:
    """The space of :func:`space_to_dict`'s (or RLlib's) dict."""
    if d is None:
        return None
    kind = d["space"]
    if kind == "box":
        return gym.spaces.Box(
            low=_text_ndarray(d["low"]),
            high=_text_ndarray(d["high"]),
            shape=tuple(d["shape"]),
            dtype=np.dtype(d["dtype"]),
        )
    if kind == "discrete":
        return gym.spaces.Discrete(d["n"], start=d.get("start", 0))
    if kind == "multi-binary":
        n = d["n"]
        return gym.spaces.MultiBinary(list(n) if isinstance(n, list | tuple) else n)
    if kind == "multi-discrete":
        return gym.spaces.MultiDiscrete(_text_ndarray(d["nvec"]), dtype=np.dtype(d["dtype"]))
    if kind == "tuple":
        return gym.spaces.Tuple([space_from_dict(s) for s in d["spaces"]])  # type: ignore[misc]
    if kind == "dict":
        return gym.spaces.Dict(
            {k: space_from_dict(s) for k, s in d["spaces"].items()}  # type: ignore[misc]
        )
    if kind == "text":
        return gym.spaces.Text(
            min_length=d["min_length"], max_length=d["max_length"], charset=d["charset"]
        )
    try:
        from ray.rllib.utils.serialization import gym_space_from_dict
    except ImportError:
        raise ValueError(f"unknown space kind {kind!r} (RLlib is not installed)") from None
    return gym_space_from_dict(dict(d))  # type: ignore[no-any-return]


def is_space_dict(value: Any) -> bool:
    """Whether ``value`` is a space in :func:`space_to_dict`'s form."""
    return isinstance(value, Mapping) and isinstance(value.get("space"), str)
