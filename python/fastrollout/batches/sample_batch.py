"""RLlib 2.60's ``SampleBatch`` and ``MultiAgentBatch`` (old API stack), without Ray.

A :class:`SampleBatch` is a dict of columns that all hold one row per time step; a
:class:`MultiAgentBatch` maps policy ids to such batches and counts env steps apart from
agent steps. Column values are numpy arrays, lists (``infos``), or dicts/tuples of them
(nested observations). Recurrent-model columns (``seq_lens``, ``state_in_*``) are kept
out of the row count, as RLlib does, but slicing and splitting them is not supported.

:func:`episodes_to_sample_batch` builds the old stack's training columns from numpy'ized
:class:`~fastrollout.episodes.SingleAgentEpisode` chunks, one array operation per episode
and column.
"""

from __future__ import annotations

import itertools
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from fastrollout.core import DEFAULT_MODULE_ID
from fastrollout.core.tree import leaves, take, tree_map

if TYPE_CHECKING:
    from fastrollout.episodes import SingleAgentEpisode

__all__ = [
    "DEFAULT_POLICY_ID",
    "CompressedArray",
    "MultiAgentBatch",
    "SampleBatch",
    "concat_samples",
    "episode_to_sample_batch",
    "episodes_to_multi_agent_batch",
    "episodes_to_sample_batch",
]

#: RLlib's old-stack name for the module id of a single policy.
DEFAULT_POLICY_ID = DEFAULT_MODULE_ID

_DEFAULT_COMPRESS_COLUMNS = frozenset({"obs", "new_obs"})
# zlib level 1: observations are small floats that compress about as well at level 1 as
# at 6, and level 1 is several times faster.
_ZLIB_LEVEL = 1


def _is_recurrent_key(key: str) -> bool:
    return key.startswith(("state_in_", "state_out_"))


# ------------------------------------------------------------------------- compression


@dataclass(frozen=True)
class CompressedArray:
    """A numpy array packed losslessly: zlib of its raw bytes, with dtype and shape.

    Object arrays are refused (their bytes are pointers); everything else round-trips
    bit for bit, structured dtypes included.
    """

    descr: Any
    shape: tuple[int, ...]
    data: bytes

    @classmethod
    def pack(cls, array: Any) -> CompressedArray:
        """Packs one array (or anything ``np.asarray`` takes).

        Raises:
            TypeError: If the array holds Python objects.
        """
        arr = np.asarray(array)
        if arr.dtype.hasobject:
            raise TypeError("cannot compress an array of Python objects (dtype=object)")
        descr = np.lib.format.dtype_to_descr(arr.dtype)
        raw = np.ascontiguousarray(arr).tobytes()
        return cls(descr, arr.shape, zlib.compress(raw, _ZLIB_LEVEL))

    def unpack(self) -> np.ndarray:
        """The original array (a fresh, writable copy)."""
        dtype = np.lib.format.descr_to_dtype(self.descr)
        raw = zlib.decompress(self.data)
        return np.frombuffer(raw, dtype=dtype).reshape(self.shape).copy()

    def __len__(self) -> int:
        return self.shape[0] if self.shape else 0


def _is_compressed(value: Any) -> bool:
    if isinstance(value, CompressedArray):
        return True
    return (
        isinstance(value, np.ndarray)
        and value.dtype == object
        and value.ndim == 1
        and len(value) > 0
        and isinstance(value[0], CompressedArray)
    )


def _compress_leaf(value: Any, bulk: bool) -> Any:
    if _is_compressed(value):
        return value
    if bulk:
        return CompressedArray.pack(value)
    arr = np.asarray(value)
    if len(arr) == 0:
        # Per-row packing of no rows could not give the row shape back; keep as is.
        return value
    out = np.empty(len(arr), dtype=object)
    for i in range(len(arr)):
        out[i] = CompressedArray.pack(arr[i, ...])  # a 0-d view keeps the byte order
    return out


def _decompress_leaf(value: Any) -> Any:
    if isinstance(value, CompressedArray):
        return value.unpack()
    if _is_compressed(value):
        rows = [row.unpack() for row in value]
        # np.stack would turn a non-native byte order native; the first row's dtype holds.
        return np.stack(rows).astype(rows[0].dtype, copy=False)
    return value


# -------------------------------------------------------------------------- SampleBatch


def _leaf_len(value: Any) -> int | None:
    if isinstance(value, CompressedArray | np.ndarray | list):
        return len(value) if not (isinstance(value, np.ndarray) and value.ndim == 0) else None
    return None


def _slice_leaf(value: Any, start: int, stop: int) -> Any:
    if isinstance(value, CompressedArray):
        raise TypeError("cannot slice a bulk-compressed column: decompress_if_needed() first")
    return value[start:stop]


def _concat_leaves(*values: Any) -> Any:
    first = values[0]
    if isinstance(first, np.ndarray):
        return np.concatenate(values, axis=0)
    if isinstance(first, list):
        out: list[Any] = []
        for v in values:
            out.extend(v)
        return out
    if isinstance(first, CompressedArray):
        raise TypeError("cannot concatenate bulk-compressed columns: decompress first")
    raise TypeError(f"cannot concatenate column values of type {type(first).__name__}")


class SampleBatch(dict):  # type: ignore[type-arg]
    """A dict of columns with one row per time step (RLlib 2.60's ``SampleBatch``).

    Lists and scalars given as column values become numpy arrays (``infos`` stays as
    given). ``count`` is the number of rows: the length of the first countable column
    (not ``infos``, ``seq_lens`` or ``state_*``), or ``sum(seq_lens)`` when given.

    Args:
        *args: As for ``dict``: a mapping of column name to values.
        **kwargs: More columns, and RLlib's flags: ``_num_grad_updates`` (policy updates
            behind the data, averaged by concat) and ``_is_training`` (whether the batch
            is used for training); ``_time_major``, ``_max_seq_len`` and ``_zero_padded``
            are accepted and dropped.

    Raises:
        KeyError: If a ``dones`` column is given (RLlib's rule: use terminateds and
            truncateds).
        ValueError: If the countable columns differ in length.

    Examples:
        >>> import numpy as np
        >>> b = SampleBatch({"obs": np.arange(4), "eps_id": [7, 7, 8, 8]})
        >>> b.count, [s.count for s in b.split_by_episode()]
        (4, [2, 2])
    """

    OBS = "obs"
    NEXT_OBS = "new_obs"
    CUR_OBS = "obs"
    ACTIONS = "actions"
    REWARDS = "rewards"
    PREV_ACTIONS = "prev_actions"
    PREV_REWARDS = "prev_rewards"
    TERMINATEDS = "terminateds"
    TRUNCATEDS = "truncateds"
    DONES = "dones"
    INFOS = "infos"
    SEQ_LENS = "seq_lens"
    T = "t"
    EPS_ID = "eps_id"
    ENV_ID = "env_id"
    AGENT_INDEX = "agent_index"
    UNROLL_ID = "unroll_id"
    ACTION_DIST_INPUTS = "action_dist_inputs"
    ACTION_DIST = "action_dist"
    ACTION_PROB = "action_prob"
    ACTION_LOGP = "action_logp"
    VF_PREDS = "vf_preds"
    VALUES_BOOTSTRAPPED = "values_bootstrapped"
    OBS_EMBEDS = "obs_embeds"
    RETURNS_TO_GO = "returns_to_go"
    ATTENTION_MASKS = "attention_masks"

    count: int
    num_grad_updates: float | None
    #: A recurrent policy's rows per sequence (None without ``seq_lens``).
    max_seq_len: int | None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if self.DONES in kwargs:
            raise KeyError("SampleBatch takes terminateds and truncateds, not dones")
        self.num_grad_updates = kwargs.pop("_num_grad_updates", None)
        self._is_training = bool(kwargs.pop("_is_training", False))
        self.max_seq_len = kwargs.pop("_max_seq_len", None)
        for flag in ("_time_major", "_zero_padded"):
            kwargs.pop(flag, None)
        super().__init__(*args, **kwargs)
        if self.DONES in self:
            raise KeyError("SampleBatch takes terminateds and truncateds, not dones")
        for key, value in list(self.items()):
            if key == self.INFOS:
                continue
            if isinstance(value, list | int | float | bool | np.number | np.bool_):
                dict.__setitem__(self, key, np.array(value))
        seq_lens = self.get(self.SEQ_LENS)
        if seq_lens is None or len(seq_lens) == 0:
            self.pop(self.SEQ_LENS, None)
        self.count = self._count_rows()

    def _count_rows(self) -> int:
        seq_lens = dict.get(self, self.SEQ_LENS)
        if seq_lens is not None:
            return int(np.sum(seq_lens))
        count: int | None = None
        for key, value in self.items():
            if key in (self.INFOS, self.SEQ_LENS) or _is_recurrent_key(key):
                continue
            for leaf in leaves(value):
                n = _leaf_len(leaf)
                if n is None:
                    continue
                if count is None:
                    count = n
                elif n != count:
                    raise ValueError(f"column {key!r} has {n} rows, another column has {count}")
        return count or 0

    # ---------------------------------------------------------------- counts

    def __len__(self) -> int:
        return self.count

    def agent_steps(self) -> int:
        """The number of rows (one agent step each)."""
        return self.count

    def env_steps(self) -> int:
        """The number of rows (one env step each, in a single-agent batch)."""
        return self.count

    @property
    def is_training(self) -> bool:
        """Whether the batch is used for training."""
        return self._is_training

    def set_training(self, training: bool = True) -> None:
        """Sets :attr:`is_training`."""
        self._is_training = training

    def is_terminated_or_truncated(self) -> bool:
        """Whether the last row ends its episode."""
        done = bool(self[self.TERMINATEDS][-1])
        return done or (self.TRUNCATEDS in self and bool(self[self.TRUNCATEDS][-1]))

    def is_single_trajectory(self) -> bool:
        """Whether no row but the last ends an episode."""
        if np.any(self[self.TERMINATEDS][:-1]):
            return False
        return self.TRUNCATEDS not in self or not np.any(self[self.TRUNCATEDS][:-1])

    # ---------------------------------------------------------------- access

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, slice):
            return self._slice(key)
        if key == self.DONES:
            # RLlib's compatibility read: "dones" reads terminateds.
            return dict.__getitem__(self, self.TERMINATEDS)
        return dict.__getitem__(self, key)

    def __setitem__(self, key: str, value: Any) -> None:
        if key == self.DONES:
            raise KeyError("SampleBatch takes terminateds and truncateds, not dones")
        dict.__setitem__(self, key, value)

    def get(self, key: str, default: Any = None) -> Any:  # type: ignore[override]
        """A column, or ``default`` when absent."""
        try:
            return self[key]
        except KeyError:
            return default

    def columns(self, keys: Iterable[str]) -> list[Any]:
        """The values of the given columns, in the given order."""
        return [self[k] for k in keys]

    def rows(self) -> Iterator[dict[str, Any]]:
        """Yields one dict per row (``seq_lens`` reads 1 in every row)."""
        data = dict(self)
        has_seq_lens = self.SEQ_LENS in data
        for i in range(self.count):
            row = {k: take(v, i) for k, v in data.items() if k != self.SEQ_LENS}
            if has_seq_lens:
                row[self.SEQ_LENS] = 1
            yield row

    def size_bytes(self) -> int:
        """Bytes held by the array columns (``nbytes``; compressed data by its length)."""
        total = 0
        for value in self.values():
            for leaf in leaves(value):
                if isinstance(leaf, CompressedArray):
                    total += len(leaf.data)
                elif isinstance(leaf, np.ndarray):
                    total += leaf.nbytes
        return total

    def __repr__(self) -> str:
        return f"SampleBatch({self.count}: {list(self.keys())})"

    # ---------------------------------------------------------------- copies and slices

    def _new(self, data: dict[str, Any]) -> SampleBatch:
        return SampleBatch(
            data,
            _is_training=self._is_training,
            _num_grad_updates=self.num_grad_updates,
            _max_seq_len=self.max_seq_len,
        )

    def copy(self, shallow: bool = False) -> SampleBatch:  # type: ignore[override]
        """A copy; deep (new arrays) unless ``shallow``."""

        def copy_leaf(leaf: Any) -> Any:
            if shallow:
                return leaf
            if isinstance(leaf, np.ndarray):
                return leaf.copy()
            if isinstance(leaf, list):
                return list(leaf)
            return leaf

        return self._new({k: tree_map(copy_leaf, v) for k, v in self.items()})

    def _check_sliceable(self) -> None:
        if self.SEQ_LENS in self:
            raise NotImplementedError("slicing batches with seq_lens is not supported")

    def _slice(self, slice_: slice) -> SampleBatch:
        if slice_.step not in (None, 1):
            raise ValueError("SampleBatch slices take no step")
        start = slice_.start or 0
        stop = self.count if slice_.stop is None else slice_.stop
        if start < 0 or stop < 0:
            raise ValueError("SampleBatch slices take non-negative bounds")
        return self.slice(start, min(stop, self.count))

    def slice(self, start: int, end: int) -> SampleBatch:
        """Rows ``start`` to ``end`` (views on this batch's arrays, no copy).

        Raises:
            NotImplementedError: If the batch has ``seq_lens``.
        """
        self._check_sliceable()
        return self._new(
            {k: tree_map(lambda v: _slice_leaf(v, start, end), v) for k, v in self.items()}
        )

    def timeslices(
        self, size: int | None = None, num_slices: int | None = None
    ) -> list[SampleBatch]:
        """Consecutive slices of ``size`` rows, or ``num_slices`` slices of even length.

        With ``size`` the last slice may be shorter; with ``num_slices`` lengths differ
        by at most one, the shorter ones first.

        Raises:
            ValueError: Unless exactly one of ``size`` and ``num_slices`` is a positive int.
        """
        if (size is None) == (num_slices is None) or (size or num_slices or 0) <= 0:
            raise ValueError("timeslices takes one of size or num_slices, a positive int")
        if size is not None:
            bounds = [*range(0, self.count, size), self.count]
        else:
            assert num_slices is not None
            bounds, left = [0], self.count
            for i in range(num_slices):
                step = left // (num_slices - i)
                bounds.append(bounds[-1] + step)
                left -= step
        return [self.slice(a, b) for a, b in itertools.pairwise(bounds)]

    def shuffle(self) -> SampleBatch:
        """Permutes the rows in place (one random permutation for all columns).

        Returns:
            This batch.

        Raises:
            NotImplementedError: If the batch has ``seq_lens``.
        """
        self._check_sliceable()
        perm = np.random.permutation(self.count)

        def permute(leaf: Any) -> Any:
            if isinstance(leaf, list):
                return [leaf[i] for i in perm]
            if isinstance(leaf, CompressedArray):
                raise TypeError("cannot shuffle a bulk-compressed column: decompress first")
            return leaf[perm]

        for key, value in list(self.items()):
            dict.__setitem__(self, key, tree_map(permute, value))
        return self

    def split_by_episode(self, key: str | None = None) -> list[SampleBatch]:
        """Splits into one batch per run of equal ``eps_id`` (or per done, without ids).

        Args:
            key: ``"eps_id"`` or ``"dones"`` to force the rule; by default ``eps_id`` when
                present, else ``terminateds | truncateds``.

        Returns:
            The parts, in order (a trailing unfinished episode is a part too).

        Raises:
            KeyError: If ``key="eps_id"`` and there is no such column.
        """
        if key not in (None, self.EPS_ID, self.DONES):
            raise ValueError(f"split_by_episode(key={key!r}): use None, 'eps_id' or 'dones'")
        if key == self.EPS_ID and self.EPS_ID not in self:
            raise KeyError(f"{self!r} has no column 'eps_id'")
        if self.count == 0:
            return []
        if key != self.DONES and self.EPS_ID in self:
            ids = np.asarray(self[self.EPS_ID])
            cuts = np.flatnonzero(ids[1:] != ids[:-1]) + 1
        else:
            done = np.asarray(self[self.TERMINATEDS], dtype=bool)
            if self.TRUNCATEDS in self:
                done = done | np.asarray(self[self.TRUNCATEDS], dtype=bool)
            cuts = np.flatnonzero(done[:-1]) + 1
        bounds = [0, *cuts.tolist(), self.count]
        return [self.slice(a, b) for a, b in itertools.pairwise(bounds)]

    def concat(self, other: SampleBatch) -> SampleBatch:
        """A new batch: this one's rows, then ``other``'s."""
        out = concat_samples([self, other])
        assert isinstance(out, SampleBatch)
        return out

    def as_multi_agent(self, module_id: str | None = None) -> MultiAgentBatch:
        """A :class:`MultiAgentBatch` holding this batch as its only policy batch."""
        return MultiAgentBatch({module_id or DEFAULT_POLICY_ID: self}, self.count)

    # ---------------------------------------------------------------- compression

    def compress(
        self, bulk: bool = False, columns: Iterable[str] = _DEFAULT_COMPRESS_COLUMNS
    ) -> SampleBatch:
        """Compresses the given columns in place, losslessly.

        Args:
            bulk: One :class:`CompressedArray` per column; otherwise an object array of
                one per row, which can still be sliced and concatenated.
            columns: The columns to compress (those absent are skipped).

        Returns:
            This batch.
        """
        for key in set(columns) & self.keys():
            dict.__setitem__(self, key, tree_map(lambda v: _compress_leaf(v, bulk), self[key]))
        return self

    def decompress_if_needed(
        self, columns: Iterable[str] = _DEFAULT_COMPRESS_COLUMNS
    ) -> SampleBatch:
        """Decompresses the given columns in place where they are compressed.

        Returns:
            This batch.
        """
        for key in set(columns) & self.keys():
            dict.__setitem__(self, key, tree_map(_decompress_leaf, self[key]))
        return self


# ---------------------------------------------------------------------- MultiAgentBatch


class MultiAgentBatch:
    """Policy id -> :class:`SampleBatch`, with its own env-step count.

    Args:
        policy_batches: One batch per policy.
        env_steps: Env steps the data spans (at most the sum of the batches' rows).

    Raises:
        TypeError: If a value is not a :class:`SampleBatch`.
    """

    def __init__(self, policy_batches: dict[str, SampleBatch], env_steps: int) -> None:
        for pid, batch in policy_batches.items():
            if not isinstance(batch, SampleBatch):
                raise TypeError(f"policy batch {pid!r} is a {type(batch).__name__}")
        self.policy_batches = policy_batches
        self.count = env_steps

    def env_steps(self) -> int:
        """The env steps the batch spans."""
        return self.count

    def agent_steps(self) -> int:
        """The rows over all policy batches."""
        return sum(b.count for b in self.policy_batches.values())

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, policy_id: str) -> SampleBatch:
        return self.policy_batches[policy_id]

    def copy(self) -> MultiAgentBatch:
        """A deep copy."""
        return MultiAgentBatch({k: v.copy() for k, v in self.policy_batches.items()}, self.count)

    def size_bytes(self) -> int:
        """Bytes held over all policy batches."""
        return sum(b.size_bytes() for b in self.policy_batches.values())

    def compress(
        self, bulk: bool = False, columns: Iterable[str] = _DEFAULT_COMPRESS_COLUMNS
    ) -> None:
        """Compresses every policy batch in place (see :meth:`SampleBatch.compress`)."""
        for batch in self.policy_batches.values():
            batch.compress(bulk=bulk, columns=columns)

    def decompress_if_needed(
        self, columns: Iterable[str] = _DEFAULT_COMPRESS_COLUMNS
    ) -> MultiAgentBatch:
        """Decompresses every policy batch in place.

        Returns:
            This batch.
        """
        for batch in self.policy_batches.values():
            batch.decompress_if_needed(columns)
        return self

    def as_multi_agent(self) -> MultiAgentBatch:
        """Returns this batch itself (it is multi-agent already)."""
        return self

    @staticmethod
    def wrap_as_needed(
        policy_batches: dict[str, SampleBatch], env_steps: int
    ) -> SampleBatch | MultiAgentBatch:
        """The default policy's batch alone, else a :class:`MultiAgentBatch`."""
        if len(policy_batches) == 1 and DEFAULT_POLICY_ID in policy_batches:
            return policy_batches[DEFAULT_POLICY_ID]
        return MultiAgentBatch(policy_batches, env_steps)

    def __repr__(self) -> str:
        return f"MultiAgentBatch({self.policy_batches}, env_steps={self.count})"


# -------------------------------------------------------------------------- concatenation


def concat_samples(
    samples: Sequence[SampleBatch | MultiAgentBatch],
) -> SampleBatch | MultiAgentBatch:
    """Concatenates batches row-wise (RLlib's ``concat_samples``).

    Empty batches are skipped. When any input is a :class:`MultiAgentBatch`, plain
    batches count as the default policy's and the result is multi-agent, with the env
    steps summed. The columns are those of the first non-empty batch;
    ``num_grad_updates`` is averaged, weighted by rows.

    Raises:
        KeyError: If a later batch lacks a column of the first.
        TypeError: If an input is neither kind of batch.
    """
    if any(isinstance(s, MultiAgentBatch) for s in samples):
        return _concat_multi_agent(samples)
    parts: list[SampleBatch] = []
    for s in samples:
        if not isinstance(s, SampleBatch):
            raise TypeError(f"cannot concatenate a {type(s).__name__}")
        if s.count > 0:
            parts.append(s)
    if not parts:
        return SampleBatch()
    weighted = [(s.count, s.num_grad_updates) for s in parts if s.num_grad_updates is not None]
    rows = sum(n for n, _ in weighted)
    grad_updates = sum(n * g for n, g in weighted) / (rows or 1.0)
    data: dict[str, Any] = {}
    for key in parts[0]:
        if key == SampleBatch.SEQ_LENS:
            data[key] = np.concatenate([np.asarray(p[key]) for p in parts])
            continue
        data[key] = tree_map(_concat_leaves, *[dict.__getitem__(p, key) for p in parts])
    seq_lens = [p.max_seq_len for p in parts if p.max_seq_len is not None]
    return SampleBatch(
        data, _num_grad_updates=grad_updates, _max_seq_len=max(seq_lens) if seq_lens else None
    )


def _concat_multi_agent(samples: Sequence[SampleBatch | MultiAgentBatch]) -> MultiAgentBatch:
    per_policy: dict[str, list[SampleBatch]] = {}
    env_steps = 0
    for s in samples:
        if isinstance(s, SampleBatch):
            if s.count == 0:
                continue
            s = s.as_multi_agent()
        elif not isinstance(s, MultiAgentBatch):
            raise TypeError(f"cannot concatenate a {type(s).__name__}")
        for pid, batch in s.policy_batches.items():
            per_policy.setdefault(pid, []).append(batch)
        env_steps += s.env_steps()
    return MultiAgentBatch(_concat_per_policy(per_policy), env_steps)


def _concat_per_policy(per_policy: dict[str, list[SampleBatch]]) -> dict[str, SampleBatch]:
    out: dict[str, SampleBatch] = {}
    for pid, batches in per_policy.items():
        joined = concat_samples(batches)
        assert isinstance(joined, SampleBatch)
        out[pid] = joined
    return out


# ----------------------------------------------------------------------- from episodes


def _object_array(items: Sequence[Any]) -> np.ndarray:
    out = np.empty(len(items), dtype=object)
    for i, item in enumerate(items):
        out[i] = item
    return out


def _episode_columns(
    episode: SingleAgentEpisode, unroll_id: int, agent_index: int, eps_id: Any
) -> dict[str, Any]:
    n = len(episode)
    terminateds = np.zeros(n, dtype=bool)
    truncateds = np.zeros(n, dtype=bool)
    if n:
        terminateds[-1] = episode.is_terminated
        truncateds[-1] = episode.is_truncated
    columns: dict[str, Any] = {
        SampleBatch.OBS: episode.get_observations(slice(0, n)),
        SampleBatch.NEXT_OBS: episode.get_observations(slice(1, n + 1)),
        SampleBatch.ACTIONS: episode.get_actions(),
        SampleBatch.REWARDS: np.asarray(episode.get_rewards(), dtype=np.float32),
        SampleBatch.TERMINATEDS: terminateds,
        SampleBatch.TRUNCATEDS: truncateds,
        SampleBatch.INFOS: _object_array(episode.get_infos(slice(0, n))),
        SampleBatch.EPS_ID: np.full(n, episode.id_ if eps_id is None else eps_id),
        SampleBatch.UNROLL_ID: np.full(n, unroll_id, dtype=np.int64),
        SampleBatch.AGENT_INDEX: np.full(n, agent_index, dtype=np.int64),
        SampleBatch.T: np.arange(episode.t_started, episode.t_started + n, dtype=np.int64),
    }
    for key in episode._extra_keys():
        columns[key] = episode.get_extra_model_outputs(key)
    return columns


def episode_to_sample_batch(
    episode: SingleAgentEpisode,
    *,
    unroll_id: int = 0,
    agent_index: int = 0,
    eps_id: Any = None,
) -> SampleBatch:
    """One episode chunk's rows, as :func:`episodes_to_sample_batch` builds them.

    Args:
        episode: A numpy'ized chunk.
        unroll_id: Its ``unroll_id``.
        agent_index: Its ``agent_index``.
        eps_id: The ``eps_id`` of its rows (None: the episode's ``id_``).

    Returns:
        The chunk's rows (no copy beyond reading the episode's columns).

    Raises:
        ValueError: If the episode is not numpy'ized.
    """
    if not episode.is_numpy:
        raise ValueError(f"episode {episode.id_} is not numpy'ized: call to_numpy() first")
    return SampleBatch(_episode_columns(episode, unroll_id, agent_index, eps_id))


def episodes_to_sample_batch(
    episodes: Iterable[SingleAgentEpisode],
    *,
    unroll_id_start: int = 0,
    agent_index: int = 0,
) -> SampleBatch:
    """One :class:`SampleBatch` of the old stack's training columns from episode chunks.

    Per row: ``obs`` and ``new_obs`` (the observation before and after the action),
    ``actions``, ``rewards`` (float32), ``terminateds``/``truncateds`` (set on an
    episode's last row only), ``infos`` (object array of the infos seen with ``obs``),
    ``eps_id`` (the episode's ``id_``), ``unroll_id`` (int64, one per episode,
    counting up from ``unroll_id_start``), ``agent_index`` and ``t`` (int64), and each
    extra model output (``vf_preds``, ``action_logp``...) by its key.

    Args:
        episodes: numpy'ized chunks (``to_numpy()`` or ``finalize()`` done); empty
            chunks are skipped.
        unroll_id_start: The first episode's ``unroll_id``.
        agent_index: The ``agent_index`` of every row.

    Returns:
        The rows of all chunks, episode after episode.

    Raises:
        ValueError: If an episode is not numpy'ized.
    """
    parts = [
        episode_to_sample_batch(episode, unroll_id=unroll_id_start + i, agent_index=agent_index)
        for i, episode in enumerate(episodes)
    ]
    out = concat_samples(parts)
    assert isinstance(out, SampleBatch)
    return out


def episodes_to_multi_agent_batch(
    episodes: Iterable[SingleAgentEpisode],
    policy_ids: Sequence[str] | str,
    env_steps: int | None = None,
    *,
    unroll_id_start: int = 0,
) -> MultiAgentBatch:
    """A :class:`MultiAgentBatch` from per-agent episode chunks and their policies.

    Args:
        episodes: numpy'ized single-agent chunks (e.g. a multi-agent episode's agents).
        policy_ids: The policy of each episode, in order, or one for all.
        env_steps: Env steps the batch spans; by default the largest chunk length (the
            steps of agents that acted together).
        unroll_id_start: The first episode's ``unroll_id``.

    Returns:
        One policy batch per policy id, rows built as by
        :func:`episodes_to_sample_batch`; ``agent_index`` is each episode's position
        in ``episodes``.

    Raises:
        ValueError: If the numbers of episodes and policy ids differ.
    """
    episodes = list(episodes)
    ids = [policy_ids] * len(episodes) if isinstance(policy_ids, str) else list(policy_ids)
    if len(ids) != len(episodes):
        raise ValueError(f"{len(episodes)} episodes but {len(ids)} policy ids")
    per_policy: dict[str, list[SampleBatch]] = {}
    for i, (episode, pid) in enumerate(zip(episodes, ids, strict=True)):
        part = episodes_to_sample_batch(
            [episode], unroll_id_start=unroll_id_start + i, agent_index=i
        )
        if part.count:
            per_policy.setdefault(pid, []).append(part)
    if env_steps is None:
        env_steps = max((len(e) for e in episodes), default=0)
    return MultiAgentBatch(_concat_per_policy(per_policy), env_steps)
