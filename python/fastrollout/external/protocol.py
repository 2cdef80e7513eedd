"""The policy server's wire format (docs/protocol.md): frames, msgpack, arrays, spaces, values.

A frame is a 4-byte big-endian length and a msgpack body (one map with a string
``"type"``). Arrays travel as msgpack extension type 1 (``[dtype, shape, data]``, C order,
little-endian); spaces as plain maps; observations and actions as the values of their
space. Nothing is pickled: unpacking takes only str/bytes map keys, decodes strings as
UTF-8, and refuses every extension type but 1 (msgpack's reserved type -1, its timestamp,
decodes to a plain ``msgpack.Timestamp`` value, which no space accepts).

msgpack is an optional dependency (``pip install 'fastrollout[server]'``), imported on
first use.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from fastrollout._extras import require_extra

__all__ = [
    "ARRAY_EXT_TYPE",
    "DEFAULT_MAX_FRAME_BYTES",
    "DTYPES",
    "HEADER",
    "PROTOCOL_VERSION",
    "UNPACK_OPTIONS",
    "ValueSpace",
    "FrameError",
    "decode_array",
    "decode_value",
    "encode_array",
    "encode_frame",
    "encode_value",
    "msgpack_module",
    "pack",
    "space_from_wire",
    "space_to_wire",
    "per_agent_spaces",
    "unpack",
]

#: The protocol version this package speaks.
PROTOCOL_VERSION = 1
#: The msgpack extension type of an n-dimensional array.
ARRAY_EXT_TYPE = 1
#: The server's default limit on the frames it reads.
DEFAULT_MAX_FRAME_BYTES = 16 << 20
#: A frame's length prefix: u32, big-endian.
HEADER = struct.Struct(">I")
#: The array dtypes the protocol knows (numpy names).
DTYPES = frozenset(
    {
        "float32",
        "float64",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "bool",
    }
)
#: How every msgpack body from the network is unpacked: text keys only (no arbitrary
#: hashable keys), strings as str, arrays as lists. Extension types go through
#: ``_ext_hook``, which takes only arrays.
UNPACK_OPTIONS: dict[str, Any] = {"raw": False, "strict_map_key": True, "use_list": True}

_msgpack: Any = None


class FrameError(ValueError):
    """A frame body that is not valid msgpack of the protocol (malformed, unknown ext)."""


def package_version() -> str:
    """The package's version, for the handshake (``"unknown"`` in a tree without it)."""
    try:
        from fastrollout import __version__

        return str(__version__)
    except ImportError:  # pragma: no cover - (a source tree without the built core)
        return "unknown"


def msgpack_module() -> Any:
    """The ``msgpack`` module, imported on first use.

    Returns:
        The module.

    Raises:
        ImportError: If msgpack is not installed (the message names the extra).
    """
    global _msgpack
    if _msgpack is None:  # cached: this runs for every frame packed or unpacked
        _msgpack = require_extra("msgpack", extra="server", purpose="the policy server protocol")
    return _msgpack


# -- arrays ---------------------------------------------------------------------------


def encode_array(array: np.ndarray) -> Any:
    """An array as msgpack extension type 1.

    Args:
        array: A numpy array of one of :data:`DTYPES`.

    Returns:
        A ``msgpack.ExtType``.

    Raises:
        TypeError: For a dtype the protocol does not know.
    """
    mp = msgpack_module()
    name = array.dtype.name
    if name not in DTYPES:
        raise TypeError(f"cannot send an array of dtype {array.dtype} (known: {sorted(DTYPES)})")
    data = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()
    payload = mp.packb([name, list(array.shape), data], use_bin_type=True)
    return mp.ExtType(ARRAY_EXT_TYPE, payload)


def decode_array(payload: bytes) -> np.ndarray:
    """The array of an extension-type-1 payload (a new, writable, native-order array).

    Args:
        payload: The extension's bytes.

    Returns:
        The array.

    Raises:
        FrameError: If the payload is not ``[dtype, shape, data]`` with a known dtype,
            a shape of non-negative ints and ``prod(shape) * itemsize`` bytes of data.
    """
    try:
        items = msgpack_module().unpackb(payload, ext_hook=_no_ext, **UNPACK_OPTIONS)
    except Exception as err:
        raise FrameError(f"array: malformed payload ({err})") from None
    if not (isinstance(items, list) and len(items) == 3):
        raise FrameError("array: the payload must be [dtype, shape, data]")
    name, shape, data = items
    if not isinstance(name, str) or name not in DTYPES:
        raise FrameError(f"array: unknown dtype {name!r} (known: {sorted(DTYPES)})")
    if not (
        isinstance(shape, list)
        and all(type(n) is int and n >= 0 for n in shape)
        and len(shape) <= 32
    ):
        raise FrameError(f"array: the shape must be a list of at most 32 ints >= 0, got {shape!r}")
    if not isinstance(data, bytes):
        raise FrameError(f"array: data must be bin, got {type(data).__name__}")
    dtype = np.dtype(name)
    expected = math.prod(shape) * dtype.itemsize
    if len(data) != expected:
        raise FrameError(
            f"array: {name}{tuple(shape)} needs {expected} bytes of data, got {len(data)}"
        )
    flat = np.frombuffer(data, dtype=dtype.newbyteorder("<"))
    if dtype == np.bool_ and flat.size and flat.view(np.uint8).max() > 1:
        raise FrameError("array: a bool array holds bytes other than 0 and 1")
    return flat.astype(dtype).reshape(shape)


def _no_ext(code: int, data: bytes) -> Any:
    raise FrameError(f"unknown msgpack extension type {code} (only arrays, type 1, are sent)")


def _ext_hook(code: int, data: bytes) -> Any:
    if code == ARRAY_EXT_TYPE:
        return decode_array(data)
    return _no_ext(code, data)


def _default(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        return encode_array(obj)
    if isinstance(obj, np.bool_):
        return bool(obj)
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.floating):
        return float(obj)
    raise TypeError(f"cannot send a value of type {type(obj).__name__}: {obj!r:.100}")


# -- bodies and frames ----------------------------------------------------------------


def pack(obj: Any) -> bytes:
    """A msgpack body: numpy arrays as extension type 1, numpy scalars as numbers.

    Args:
        obj: Plain data (dicts with str keys, lists, tuples, numbers, str, bytes, None,
            numpy arrays and scalars).

    Returns:
        The body.

    Raises:
        TypeError: For anything else (the message names the type).
    """
    return msgpack_module().packb(obj, default=_default, use_bin_type=True)


def unpack(body: bytes) -> Any:
    """Decodes a body from the network (untrusted: see :data:`UNPACK_OPTIONS`).

    Args:
        body: The frame's body.

    Returns:
        The value, with arrays as numpy arrays.

    Raises:
        FrameError: If the body is not one valid msgpack value of the protocol.
    """
    try:
        return msgpack_module().unpackb(body, ext_hook=_ext_hook, **UNPACK_OPTIONS)
    except FrameError:
        raise
    except ImportError:
        raise
    except Exception as err:  # msgpack's ExtraData, StackError, FormatError, ...
        raise FrameError(f"not a msgpack value ({type(err).__name__}: {err})") from None


def encode_frame(obj: Any) -> bytes:
    """A whole frame: the length prefix and the body.

    Args:
        obj: The message (a dict with a ``"type"``).

    Returns:
        The frame's bytes.
    """
    body = pack(obj)
    return HEADER.pack(len(body)) + body


# -- spaces ---------------------------------------------------------------------------


def space_to_wire(space: gym.Space[Any]) -> dict[str, Any]:
    """A space as the protocol's map.

    Args:
        space: A Box, Discrete, MultiDiscrete, MultiBinary, or a Dict/Tuple of those
            (Dict keys must be str).

    Returns:
        The map.

    Raises:
        TypeError: For another kind of space or a Box of a dtype the protocol does not know.
    """
    if isinstance(space, gym.spaces.Box):
        if space.dtype is None or space.dtype.name not in DTYPES:
            raise TypeError(f"cannot send a Box of dtype {space.dtype}")
        return {
            "type": "Box",
            "shape": list(space.shape),
            "dtype": space.dtype.name,
            "low": np.broadcast_to(space.low, space.shape),
            "high": np.broadcast_to(space.high, space.shape),
        }
    if isinstance(space, gym.spaces.Discrete):
        return {"type": "Discrete", "n": int(space.n), "start": int(space.start)}
    if isinstance(space, gym.spaces.MultiDiscrete):
        return {
            "type": "MultiDiscrete",
            "nvec": np.asarray(space.nvec, dtype=np.int64),
            "start": np.asarray(space.start, dtype=np.int64),
        }
    if isinstance(space, gym.spaces.MultiBinary):
        return {"type": "MultiBinary", "n": np.asarray(space.n, dtype=np.int64).tolist()}
    if isinstance(space, gym.spaces.Dict):
        for key in space.spaces:
            if not isinstance(key, str):
                raise TypeError(f"cannot send a Dict space with the non-str key {key!r}")
        return {"type": "Dict", "spaces": {k: space_to_wire(s) for k, s in space.spaces.items()}}
    if isinstance(space, gym.spaces.Tuple):
        return {"type": "Tuple", "spaces": [space_to_wire(s) for s in space.spaces]}
    raise TypeError(
        f"cannot send the space {space} (the protocol has Box, Discrete, MultiDiscrete, "
        "MultiBinary, Dict and Tuple)"
    )


def space_from_wire(obj: Any, path: str = "space") -> gym.Space[Any]:
    """The space of a protocol map.

    Args:
        obj: The map.
        path: How errors name it (nested spaces add their keys).

    Returns:
        The gymnasium space (a MultiDiscrete's dtype is int64).

    Raises:
        ValueError: If the map is not a valid space (the message names where).
    """
    if not isinstance(obj, Mapping) or not isinstance(obj.get("type"), str):
        raise ValueError(f"{path}: expected a map with a str 'type', got {obj!r:.200}")
    kind = obj["type"]
    try:
        if kind == "Box":
            dtype = obj["dtype"]
            if dtype not in DTYPES:
                raise ValueError(f"unknown dtype {dtype!r}")
            shape = tuple(_ints(obj["shape"], "shape"))
            low, high = np.asarray(obj["low"]), np.asarray(obj["high"])
            return gym.spaces.Box(low, high, shape, np.dtype(dtype))  # type: ignore[arg-type]
        if kind == "Discrete":
            return gym.spaces.Discrete(
                _int(obj["n"], "n"), start=_int(obj.get("start", 0), "start")
            )
        if kind == "MultiDiscrete":
            nvec = np.asarray(obj["nvec"], dtype=np.int64)
            start = np.asarray(obj.get("start", np.zeros_like(nvec)), dtype=np.int64)
            return gym.spaces.MultiDiscrete(nvec, start=start)
        if kind == "MultiBinary":
            n = obj["n"]
            return gym.spaces.MultiBinary(
                _int(n, "n") if not isinstance(n, list) else _ints(n, "n")
            )
        if kind == "Dict":
            spaces = obj["spaces"]
            if not isinstance(spaces, Mapping):
                raise ValueError("'spaces' must be a map")
            return gym.spaces.Dict(
                {k: space_from_wire(s, f"{path}[{k!r}]") for k, s in spaces.items()}
            )
        if kind == "Tuple":
            spaces = obj["spaces"]
            if not isinstance(spaces, list):
                raise ValueError("'spaces' must be an array")
            return gym.spaces.Tuple(
                [space_from_wire(s, f"{path}[{i}]") for i, s in enumerate(spaces)]
            )
    except KeyError as err:
        raise ValueError(f"{path}: a {kind} space needs the key {err}") from None
    except (TypeError, ValueError, AssertionError, RecursionError) as err:
        if str(err).startswith(path):
            raise
        raise ValueError(f"{path}: invalid {kind} space: {err}") from None
    raise ValueError(f"{path}: unknown space type {kind!r}")


def _int(value: Any, name: str) -> int:
    if type(value) is not int:
        raise ValueError(f"{name!r} must be an int, got {value!r:.100}")
    return value


def _ints(value: Any, name: str) -> list[int]:
    if not isinstance(value, list):
        raise ValueError(f"{name!r} must be an array of ints, got {value!r:.100}")
    return [_int(v, name) for v in value]


# -- values ---------------------------------------------------------------------------

_ARRAY_SPACES = (gym.spaces.Box, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary)


def encode_value(space: gym.Space[Any], value: Any) -> Any:
    """A value of ``space`` as the protocol sends it (numbers cast to the space's dtype).

    Box, MultiDiscrete and MultiBinary values become arrays of the space's dtype (numbers
    and lists too); Discrete values ints; Dict values maps; Tuple values arrays. A value
    that does not fit is passed on as it is (the receiver checks it against the space).

    Args:
        space: The value's space.
        value: The value.

    Returns:
        Data :func:`pack` takes.
    """
    if isinstance(space, _ARRAY_SPACES):
        array = np.asarray(value)
        if array.dtype.kind in "biuf" and array.dtype != space.dtype:
            cast = array.astype(space.dtype)
            if array.dtype.kind == "f" == cast.dtype.kind or np.array_equal(cast, array):
                array = cast
        return array
    if isinstance(space, gym.spaces.Discrete):
        if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
            return int(value)
        if isinstance(value, np.ndarray) and value.ndim == 0 and value.dtype.kind in "iu":
            return int(value)
        return value
    if isinstance(space, gym.spaces.Dict) and isinstance(value, Mapping):
        return {
            k: encode_value(space.spaces[k], v) if k in space.spaces else v
            for k, v in value.items()
        }
    if isinstance(space, gym.spaces.Tuple) and isinstance(value, (list, tuple)):
        if len(value) != len(space.spaces):
            return list(value)
        return [encode_value(s, v) for s, v in zip(space.spaces, value, strict=True)]
    return value


def decode_value(space: gym.Space[Any], obj: Any, path: str = "value") -> Any:
    """A value of ``space`` from the protocol: plain numbers and lists become arrays.

    Arrays of Box, MultiDiscrete and MultiBinary spaces stay as sent; numbers and nested
    lists are converted to the space's dtype (a conversion that changes a value, such as
    0.5 into an int space, is refused). Discrete values become ``np.int64``, Tuple values
    tuples. Whether the value is inside the space is the receiver's check.

    Args:
        space: The value's space.
        obj: The decoded msgpack data.
        path: How errors name the value.

    Returns:
        The value.

    Raises:
        ValueError: If the data has the wrong form for the space (the message names where).
    """
    if isinstance(space, _ARRAY_SPACES):
        if isinstance(obj, np.ndarray):
            return obj
        if isinstance(obj, (int, float, list)) and not isinstance(obj, bool):
            try:
                array = np.asarray(obj)
            except ValueError as err:  # ragged nested lists
                raise ValueError(f"{path}: not an array ({err})") from None
            if array.dtype.kind not in "biuf":
                raise ValueError(f"{path}: expected numbers, got {obj!r:.200}")
            cast = array.astype(space.dtype)
            if not (array.dtype.kind == "f" == cast.dtype.kind or np.array_equal(cast, array)):
                raise ValueError(f"{path}: {obj!r:.200} does not fit dtype {space.dtype}")
            return cast
        raise ValueError(f"{path}: expected an array for {space}, got {type(obj).__name__}")
    if isinstance(space, gym.spaces.Discrete):
        if type(obj) is int:
            return np.int64(obj)
        if isinstance(obj, np.ndarray) and obj.ndim == 0 and obj.dtype.kind in "iu":
            return np.int64(obj)
        raise ValueError(f"{path}: expected an int for {space}, got {obj!r:.200}")
    if isinstance(space, gym.spaces.Dict):
        if not isinstance(obj, Mapping):
            raise ValueError(f"{path}: expected a map for a Dict space, got {type(obj).__name__}")
        if set(obj) != set(space.spaces):
            raise ValueError(f"{path}: expected the keys {sorted(space.spaces)}, got {sorted(obj)}")
        return {k: decode_value(s, obj[k], f"{path}[{k!r}]") for k, s in space.spaces.items()}
    if isinstance(space, gym.spaces.Tuple):
        if not isinstance(obj, list) or len(obj) != len(space.spaces):
            raise ValueError(
                f"{path}: expected an array of {len(space.spaces)} values for a Tuple space"
            )
        return tuple(
            decode_value(s, v, f"{path}[{i}]")
            for i, (s, v) in enumerate(zip(space.spaces, obj, strict=True))
        )
    return obj


class ValueSpace:
    """The space of observations or of actions as a server and its clients see it.

    Single-agent: one space. Multi-agent: values are agent dicts, and the space is either
    a ``Dict`` keyed by agent id (``per_agent``: ``ExternalMultiAgentEnv``'s rule when both
    spaces are such Dicts with the same keys) or one space every agent shares.

    Args:
        space: The space.
        multi_agent: Whether values are agent dicts.
        per_agent: (multi-agent) Whether ``space`` is a Dict of one space per agent.
    """

    __slots__ = ("multi_agent", "per_agent", "space")

    def __init__(self, space: gym.Space[Any], multi_agent: bool, per_agent: bool) -> None:
        self.space = space
        self.multi_agent = multi_agent
        self.per_agent = multi_agent and per_agent

    def of(self, agent_id: Any) -> gym.Space[Any]:
        """The space of one agent (multi-agent).

        Raises:
            ValueError: For an agent the per-agent spaces do not name.
        """
        if not self.per_agent:
            return self.space
        spaces = self.space.spaces  # type: ignore[attr-defined]
        if agent_id not in spaces:
            raise ValueError(f"unknown agent {agent_id!r} (the agents are {list(spaces)})")
        return spaces[agent_id]

    def to_wire(self) -> dict[str, Any]:
        """What the welcome sends: a space, or (per agent) a map agent -> space."""
        if self.per_agent:
            return {a: space_to_wire(s) for a, s in self.space.spaces.items()}  # type: ignore[attr-defined]
        return space_to_wire(self.space)

    @classmethod
    def from_wire(cls, obj: Any, multi_agent: bool, path: str) -> ValueSpace:
        """The space a welcome names (a map with a str ``"type"`` is one space).

        Raises:
            ValueError: If ``obj`` is neither a space nor (multi-agent) a map agent -> space.
        """
        if not multi_agent or (isinstance(obj, Mapping) and isinstance(obj.get("type"), str)):
            return cls(space_from_wire(obj, path), multi_agent, per_agent=False)
        if not isinstance(obj, Mapping):
            raise ValueError(f"{path}: expected a space or a map agent -> space")
        spaces = {a: space_from_wire(s, f"{path}[{a!r}]") for a, s in obj.items()}
        return cls(gym.spaces.Dict(spaces), multi_agent, per_agent=True)

    def encode(self, value: Any) -> Any:
        """A value (multi-agent: an agent dict) as the protocol sends it.

        Raises:
            TypeError: (multi-agent) For a value that is not a dict with str agent ids.
        """
        if not self.multi_agent:
            return encode_value(self.space, value)
        if not isinstance(value, Mapping):
            raise TypeError(f"expected a dict agent id -> value, got {type(value).__name__}")
        out = {}
        for agent_id, v in value.items():
            if not isinstance(agent_id, str):
                raise TypeError(f"agent ids on the wire are str, got {agent_id!r}")
            out[agent_id] = encode_value(self.of(agent_id), v)
        return out

    def decode(self, obj: Any, path: str) -> Any:
        """A value (multi-agent: an agent dict) from the protocol (:func:`decode_value`).

        Raises:
            ValueError: If ``obj`` has the wrong form or names an unknown agent.
        """
        if not self.multi_agent:
            return decode_value(self.space, obj, path)
        if not isinstance(obj, Mapping):
            raise ValueError(f"{path}: expected a map agent id -> value, got {type(obj).__name__}")
        return {a: decode_value(self.of(a), v, f"{path}[{a!r}]") for a, v in obj.items()}


def per_agent_spaces(observation_space: gym.Space[Any], action_space: gym.Space[Any]) -> bool:
    """Whether a multi-agent env's spaces are per agent (Dicts with the same keys)."""
    return (
        isinstance(observation_space, gym.spaces.Dict)
        and isinstance(action_space, gym.spaces.Dict)
        and observation_space.keys() == action_space.keys()
    )
