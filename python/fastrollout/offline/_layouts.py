"""The on-disk forms of episodes: RLlib 2.60's two parquet layouts, and their codecs.

Episodes layout (``output_write_episodes=True``): one row per episode chunk, in a binary
column ``item`` that holds the chunk's ``get_state()`` packed with msgpack, numpy arrays
in msgpack-numpy's form (``{b"nd": True, b"type", b"kind", b"shape", b"data"}``) and
spaces in RLlib's ``gym_space_to_dict`` form, exactly what RLlib's
``OfflineSingleAgentEnvRunner`` writes and what RLlib's ``OfflinePreLearner`` unpacks
(``msgpack.unpackb(item, object_hook=msgpack_numpy.decode)`` then
``SingleAgentEpisode.from_state``). A multi-agent chunk is one row too: its
``MultiAgentEpisode.get_state()`` with the agents' states inside (fastrollout's layout;
RLlib records only single-agent episodes).

Columns layout (``output_write_episodes=False``): one row per (agent) step in RLlib's
column names (``eps_id``, ``agent_id``, ``module_id``, ``obs``, ``actions``, ``rewards``,
``new_obs``, ``terminateds``, ``truncateds``, one column per extra model output) plus
``t`` (the env step of ``obs``; RLlib's reader ignores it). What rows cannot hold (infos,
look-back items, spaces, ids and times) goes, per chunk, into the file's key-value
metadata under ``fastrollout.chunks``, which RLlib's reader ignores; with it the chunks
come back whole.

Only the codec lives here (no pyarrow import): the writer and the reader build tables.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from fastrollout._extras import require_extra
from fastrollout.core.spaces import is_space_dict, space_from_dict, space_to_dict

#: Metadata key of a file fastrollout wrote: a JSON object with ``version``,
#: ``layout`` (``"episodes"`` or ``"columns"``) and ``multi_agent``.
META_KEY = b"fastrollout"
#: Metadata key of the columns layout's per-chunk remainders (msgpack list).
CHUNKS_KEY = b"fastrollout.chunks"
VERSION = 1

# RLlib's column names (ray.rllib.core.columns.Columns).
EPS_ID, AGENT_ID, MODULE_ID = "eps_id", "agent_id", "module_id"
OBS, NEXT_OBS, ACTIONS, REWARDS = "obs", "new_obs", "actions", "rewards"
TERMINATEDS, TRUNCATEDS, T, INFOS = "terminateds", "truncateds", "t", "infos"
ROW_COLUMNS = (EPS_ID, AGENT_ID, MODULE_ID, OBS, ACTIONS, REWARDS, NEXT_OBS)
# Columns RLlib's reader treats as known (the rest become extra model outputs).
KNOWN_COLUMNS = frozenset(
    (*ROW_COLUMNS, TERMINATEDS, TRUNCATEDS, T, INFOS, "agent_index", "dones", "unroll_id")
)


# ------------------------------------------------------------------------- spaces


def _decode_space(value: Any) -> Any:
    """A space, or a mapping of spaces (multi-agent), from the packed form."""
    if value is None or isinstance(value, gym.Space):
        return value
    if is_space_dict(value):
        return space_from_dict(value)
    if isinstance(value, Mapping):
        return {k: _decode_space(v) for k, v in value.items()}
    return value


# ------------------------------------------------------------------------- msgpack


def _encode(obj: Any) -> Any:
    """The msgpack hook for what msgpack cannot pack itself (msgpack-numpy's form)."""
    if isinstance(obj, np.ndarray):
        if obj.dtype.kind in "OV":
            raise TypeError(f"cannot write a numpy array of dtype {obj.dtype}")
        return {
            b"nd": True,
            b"type": obj.dtype.str,
            b"kind": b"",
            b"shape": obj.shape,
            b"data": np.ascontiguousarray(obj).tobytes(),
        }
    if isinstance(obj, np.bool_ | np.number):
        return {b"nd": False, b"type": obj.dtype.str, b"data": obj.tobytes()}
    if isinstance(obj, gym.Space):
        return space_to_dict(obj)
    if isinstance(obj, set | frozenset):
        return sorted(obj, key=repr)
    if isinstance(obj, complex):
        return {b"complex": True, b"data": repr(obj)}
    raise TypeError(f"cannot write an object of type {type(obj).__name__}")


def _decode(obj: dict[Any, Any]) -> Any:
    """The msgpack object hook: arrays in msgpack-numpy's form back to numpy."""
    nd = obj.get(b"nd")
    if nd is True:
        if obj.get(b"kind", b"") in (b"O", b"V"):
            # msgpack-numpy pickles object arrays: never unpickle file data.
            raise ValueError("object or structured numpy arrays are not read (pickled data)")
        dtype = np.dtype(obj[b"type"])
        # A copy: np.ndarray over the msgpack bytes would be read-only.
        return np.frombuffer(obj[b"data"], dtype=dtype).reshape(obj[b"shape"]).copy()
    if nd is False:
        return np.frombuffer(obj[b"data"], dtype=np.dtype(obj[b"type"]))[0]
    if obj.get(b"complex") is True:
        return complex(obj[b"data"])
    return obj


def packb(state: Any) -> bytes:
    """Packs an episode state (msgpack, numpy in msgpack-numpy's form)."""
    msgpack = require_extra("msgpack", extra="offline", purpose="fastrollout.offline")
    return msgpack.packb(state, default=_encode, use_bin_type=True)  # type: ignore[no-any-return]


def unpackb(data: bytes) -> Any:
    """Unpacks :func:`packb`'s bytes (and RLlib's: msgpack-numpy's arrays)."""
    msgpack = require_extra("msgpack", extra="offline", purpose="fastrollout.offline")
    return msgpack.unpackb(data, object_hook=_decode, raw=False, strict_map_key=False)


# ------------------------------------------------------------------------- states


def _convert_sa_spaces(state: dict[str, Any], convert: Callable[[Any], Any]) -> None:
    """Replaces each space of a single-agent state by ``convert(space)`` (in place)."""
    for name in ("_observation_space", "_action_space"):
        state[name] = convert(state.get(name))
    for field in _sa_fields(state):
        if "space" in field:
            field["space"] = convert(field["space"])


def sa_state_for_disk(state: dict[str, Any]) -> dict[str, Any]:
    """A single-agent state with its spaces in RLlib's dict form (in place)."""
    _convert_sa_spaces(state, _space_for_disk)
    return state


def _space_for_disk(space: Any) -> Any:
    if isinstance(space, gym.Space):
        return space_to_dict(space)
    return space


def _sa_fields(state: Mapping[str, Any]) -> list[dict[str, Any]]:
    fields = [state[f] for f in ("observations", "actions", "rewards", "infos")]
    fields += list((state.get("extra_model_outputs") or {}).values())
    return [f for f in fields if isinstance(f, dict)]


def sa_state_from_disk(state: dict[str, Any]) -> dict[str, Any]:
    """A single-agent state read from disk, its spaces rebuilt (in place)."""
    _convert_sa_spaces(state, _decode_space)
    for field in _sa_fields(state):
        if isinstance(field.get("data"), tuple):
            field["data"] = list(field["data"])
    # RLlib's episodes keep None for "no extra model outputs".
    if state.get("extra_model_outputs") is None:
        state["extra_model_outputs"] = {}
    return state


def ma_state_for_disk(state: dict[str, Any]) -> dict[str, Any]:
    """A multi-agent state ready to pack (in place): no mapping function, spaces as dicts."""
    state["agent_to_module_mapping_fn"] = None
    for name in ("observation_space", "action_space"):
        space = state.get(name)
        if isinstance(space, Mapping):
            state[name] = {"per_agent": [[k, _space_for_disk(v)] for k, v in space.items()]}
        else:
            state[name] = _space_for_disk(space)
    state["_agent_to_module_mapping"] = [
        [k, v] for k, v in state["_agent_to_module_mapping"].items()
    ]
    state["agent_episodes"] = [[aid, sa_state_for_disk(s)] for aid, s in state["agent_episodes"]]
    return state


def _agent_key(aid: Any) -> Any:
    # msgpack turns tuple agent ids into lists; hashable again as tuples.
    return tuple(_agent_key(a) for a in aid) if isinstance(aid, list) else aid


def ma_state_from_disk(state: dict[str, Any]) -> dict[str, Any]:
    """A multi-agent state read from disk, spaces and agent ids rebuilt (in place)."""
    for name in ("observation_space", "action_space"):
        space = state.get(name)
        if isinstance(space, Mapping) and "per_agent" in space:
            state[name] = {_agent_key(k): _decode_space(v) for k, v in space["per_agent"]}
        else:
            state[name] = _decode_space(space)
    state["_agent_to_module_mapping"] = {
        _agent_key(k): v for k, v in state["_agent_to_module_mapping"]
    }
    state["agent_episodes"] = [
        (_agent_key(aid), sa_state_from_disk(s)) for aid, s in state["agent_episodes"]
    ]
    for name in (
        "agent_t_started",
        "env_t_to_agent_t",
        "_hanging_actions_end",
        "_hanging_extra_model_outputs_end",
        "_hanging_rewards_end",
        "_hanging_rewards_begin",
    ):
        state[name] = {_agent_key(k): v for k, v in state.get(name, {}).items()}
    state["_dropped_agents"] = {_agent_key(a) for a in state.get("_dropped_agents", ())}
    return state


def is_ma_state(state: Mapping[str, Any]) -> bool:
    """Whether a packed state is a multi-agent episode's."""
    return "agent_episodes" in state


# ------------------------------------------------------------------------- columns


def _as_rows(data: Any, what: str) -> tuple[np.ndarray, bool]:
    """A field's data as one array (items along axis 0), and whether it was a list."""
    if isinstance(data, np.ndarray):
        return data, False
    if isinstance(data, list):
        try:
            arr = np.asarray(data)
        except ValueError:
            arr = None
        if arr is not None and arr.dtype.kind not in "OUSV":
            return arr, True
    raise TypeError(
        f"the columns layout writes array {what} only (got {type(data).__name__} data, "
        "e.g. from a Dict or Tuple space); use output_write_episodes=True"
    )


def split_sa_state(state: dict[str, Any]) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Splits a single-agent state into RLlib's step rows and the remainder.

    Returns:
        ``(columns, remainder)``: ``columns`` maps RLlib's column names to arrays with
        one item per step of the chunk; ``remainder`` is the state without those items
        (look-back items, infos, spaces, ids), with ``rows`` (the step count).
    """
    obs_f, act_f = state["observations"], state["actions"]
    act, act_list = _as_rows(act_f["data"], "actions")
    n = len(act) - act_f["lookback"]
    rem = dict(state)
    cols: dict[str, np.ndarray] = {}

    def take(field: dict[str, Any], name: str, what: str, extra: int = 0) -> dict[str, Any]:
        data, was_list = _as_rows(field["data"], what)
        lb = field["lookback"]
        cols[name] = data[lb : lb + n]
        kept = data[:lb] if n > 0 else data
        return {**field, "data": kept, "as_list": was_list}

    rem["observations"] = take(obs_f, OBS, "observations")
    obs, _ = _as_rows(obs_f["data"], "observations")
    lb = obs_f["lookback"]
    cols[NEXT_OBS] = obs[lb + 1 : lb + 1 + n]
    rem["actions"] = take(act_f, ACTIONS, "actions")
    rem["actions"]["as_list"] = act_list
    rem["rewards"] = take(state["rewards"], REWARDS, "rewards")
    rem["extra_model_outputs"] = {
        k: take(f, k, f"extra model output {k!r}")
        for k, f in (state.get("extra_model_outputs") or {}).items()
    }
    t0 = state["t_started"]
    cols[T] = np.arange(t0, t0 + n, dtype=np.int64)
    cols[TERMINATEDS] = np.zeros(n, dtype=bool)
    cols[TRUNCATEDS] = np.zeros(n, dtype=bool)
    if n:
        cols[TERMINATEDS][-1] = bool(state["is_terminated"])
        cols[TRUNCATEDS][-1] = bool(state["is_truncated"])
    rem["rows"] = n
    return cols, rem


def join_sa_state(cols: Mapping[str, np.ndarray], rem: dict[str, Any]) -> dict[str, Any]:
    """The inverse of :func:`split_sa_state`: ``cols`` holds exactly this chunk's rows."""
    n = rem.pop("rows")
    state = dict(rem)

    def put(field: dict[str, Any], rows: np.ndarray, tail: np.ndarray | None = None) -> Any:
        field = dict(field)
        as_list = field.pop("as_list", False)
        if n > 0:
            kept = np.asarray(field["data"])
            parts = [rows] if tail is None else [rows, tail]
            if kept.size or len(kept):
                parts.insert(0, kept.astype(rows.dtype, copy=False).reshape(-1, *rows.shape[1:]))
            data = np.concatenate(parts)
        else:
            data = np.asarray(field["data"])
        field["data"] = list(data) if as_list else data
        return field

    state["observations"] = put(rem["observations"], cols[OBS], cols[NEXT_OBS][-1:])
    state["actions"] = put(rem["actions"], cols[ACTIONS])
    state["rewards"] = put(rem["rewards"], cols[REWARDS])
    state["extra_model_outputs"] = {
        k: put(f, cols[k]) for k, f in rem["extra_model_outputs"].items()
    }
    return state
