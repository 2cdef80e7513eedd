"""The old stack's recurrent columns (``state_in_*``, ``state_out_*``, ``seq_lens``).

RLlib 2.60's old-stack worker gives a recurrent policy's rows these columns, per episode
chunk (one agent's rows of one episode in one batch):

- ``seq_lens`` (int32): the chunk cut into sequences of ``max_seq_len`` rows from its
  first row, the last one shorter;
- ``state_out_i``: one row per step, the i-th state leaf after the step;
- ``state_in_i``: one row per *sequence*, the i-th state leaf before its first step: the
  module's initial state at an episode's start, the previous step's ``state_out_i``
  otherwise (for a chunk's first sequence, the last state of the chunk before it).

A fastrollout module's state is nested (dicts and tuples); its leaves are numbered in
``dm-tree``'s order, as RLlib flattens nested data: dict keys sorted, tuples by position.

:class:`SequenceLayout` maps such rows into the zero-padded ``(num_sequences, T)`` form a
recurrent module trains on, and back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from fastrollout.core import Columns

__all__ = [
    "DEFAULT_MAX_SEQ_LEN",
    "SequenceLayout",
    "add_recurrent_columns",
    "flatten_state",
    "seq_lens_for",
    "state_paths",
    "unflatten_state",
]

#: RLlib's default ``model_config["max_seq_len"]``.
DEFAULT_MAX_SEQ_LEN = 20

_Path = tuple[Any, ...]


def state_paths(template: Any) -> list[_Path]:
    """The paths of a nested state's leaves, in the order ``state_in_i`` numbers them.

    Args:
        template: A state (dicts, tuples and leaves), e.g. ``get_initial_state()``.

    Returns:
        One path (keys and positions from the root) per leaf: dict keys sorted, tuple
        items in order.
    """
    if isinstance(template, dict):
        return [(k, *p) for k in sorted(template) for p in state_paths(template[k])]
    if isinstance(template, tuple | list):
        return [(i, *p) for i, v in enumerate(template) for p in state_paths(v)]
    return [()]


def _at(tree: Any, path: _Path) -> Any:
    for key in path:
        tree = tree[key]
    return tree


def flatten_state(state: Any, paths: Sequence[_Path]) -> list[Any]:
    """The leaves of ``state`` at ``paths`` (see :func:`state_paths`).

    Raises:
        ValueError: If ``state`` lacks one of the paths.
    """
    try:
        return [_at(state, p) for p in paths]
    except (KeyError, IndexError, TypeError) as err:
        raise ValueError(f"state {_describe(state)} lacks the leaf {err}") from err


def unflatten_state(flat: Sequence[Any], template: Any) -> Any:
    """The nested state of ``template``'s structure holding the leaves ``flat``.

    Args:
        flat: One value per leaf, in :func:`state_paths` order.
        template: A state of the structure to build.

    Returns:
        Dicts and tuples as in ``template``.

    Raises:
        ValueError: If the number of leaves differs.
    """
    paths = state_paths(template)
    if len(flat) != len(paths):
        raise ValueError(f"{len(flat)} state leaves for a state of {len(paths)}")
    by_path = dict(zip(paths, flat, strict=True))

    def build(node: Any, prefix: _Path) -> Any:
        if isinstance(node, dict):
            return {k: build(v, (*prefix, k)) for k, v in node.items()}
        if isinstance(node, tuple | list):
            return tuple(build(v, (*prefix, i)) for i, v in enumerate(node))
        return by_path[prefix]

    return build(template, ())


def _describe(state: Any) -> str:
    if isinstance(state, dict):
        return "{" + ", ".join(f"{k!r}: {_describe(v)}" for k, v in state.items()) + "}"
    if isinstance(state, tuple | list):
        return "(" + ", ".join(_describe(v) for v in state) + ")"
    return str(tuple(np.shape(state)))


def seq_lens_for(n: int, max_seq_len: int) -> np.ndarray:
    """``n`` rows as sequences of ``max_seq_len`` (the last one shorter), int32."""
    full, rest = divmod(int(n), int(max_seq_len))
    return np.array([max_seq_len] * full + ([rest] if rest else []), dtype=np.int32)


def add_recurrent_columns(
    batch: dict[str, Any],
    chunk: Any,
    initial_state: Any,
    max_seq_len: int,
    *,
    policy_id: str = "",
) -> None:
    """Replaces a chunk's nested ``state_out`` column with the old stack's columns.

    Args:
        batch: The chunk's rows (``episode_to_sample_batch``), changed in place: its
            ``state_out`` column goes, ``state_out_i``, ``state_in_i`` and ``seq_lens``
            come.
        chunk: The numpy'ized episode chunk the rows are of (its look-back holds the
            state a continuation starts from).
        initial_state: The module's initial state (numpy leaves, no batch axis).
        max_seq_len: Rows per sequence.
        policy_id: For messages.

    Raises:
        ValueError: If the chunk recorded no ``state_out`` (a stateful module's steps
            always do), or one of another structure than the initial state.
    """
    n = len(chunk)
    state_out = batch.pop(Columns.STATE_OUT, None)
    if state_out is None:
        raise ValueError(
            f"policy {policy_id!r} is recurrent, but episode {chunk.id_}'s steps recorded "
            f"no {Columns.STATE_OUT!r} (were its actions computed by the policy?)"
        )
    start = initial_state
    if chunk.t_started > 0:
        try:
            start = chunk.get_extra_model_outputs(Columns.STATE_OUT, -1, neg_index_as_lookback=True)
        except (IndexError, KeyError, ValueError):
            # No recorded state before the chunk (its predecessor's steps ran no module):
            # the runner started these steps from the initial state too.
            start = initial_state
    paths = state_paths(initial_state)
    try:
        outs = flatten_state(state_out, paths)
        firsts = flatten_state(start, paths)
    except ValueError as err:
        raise ValueError(
            f"policy {policy_id!r}: episode {chunk.id_}'s {Columns.STATE_OUT!r} does not "
            f"match the initial state {_describe(initial_state)}: {err}"
        ) from err
    # The previous step's state of each sequence's first row (row s*L - 1, or the start).
    before = np.arange(max_seq_len, n, max_seq_len) - 1
    for i, (out, first) in enumerate(zip(outs, firsts, strict=True)):
        out = np.asarray(out)
        first = np.asarray(first, dtype=out.dtype)
        batch[f"state_in_{i}"] = np.concatenate([first[None], out[before]])
        batch[f"state_out_{i}"] = out
    batch[Columns.SEQ_LENS] = seq_lens_for(n, max_seq_len)


class SequenceLayout:
    """Where each row of a batch with ``seq_lens`` sits in its zero-padded form.

    Rows are consecutive sequences; the padded form is ``(len(seq_lens), T)`` with ``T``
    the longest sequence (RLlib's dynamic max for recurrent nets) and zeros after each
    sequence's end; :attr:`mask` is true at the real rows.

    Args:
        seq_lens: The sequences' lengths (positive).
        max_seq_len: ``T``, if larger than the longest sequence.

    Raises:
        ValueError: If a length is not positive.
    """

    def __init__(self, seq_lens: Any, max_seq_len: int | None = None) -> None:
        lens = np.asarray(seq_lens, dtype=np.int64).reshape(-1)
        if lens.size == 0 or np.any(lens <= 0):
            raise ValueError(f"seq_lens must be positive lengths, got {lens.tolist()}")
        self.seq_lens = lens
        self.num_sequences = len(lens)
        self.max_seq_len = max(int(lens.max()), int(max_seq_len or 0))
        self.num_rows = int(lens.sum())
        seq = np.repeat(np.arange(self.num_sequences), lens)
        offsets = np.arange(self.num_rows) - np.repeat(np.cumsum(lens) - lens, lens)
        #: Each row's position in the flattened padded form.
        self.index = seq * self.max_seq_len + offsets
        mask = np.zeros(self.num_sequences * self.max_seq_len, dtype=bool)
        mask[self.index] = True
        self.mask = mask.reshape(self.num_sequences, self.max_seq_len)

    def pad(self, x: Any) -> Any:
        """Rows ``(N, ...)`` (tensor or array) as ``(num_sequences, T, ...)``, zero-padded.

        Raises:
            ValueError: If ``x`` does not have one row per row of the layout.
        """
        if len(x) != self.num_rows:
            raise ValueError(f"{len(x)} rows to pad, the seq_lens hold {self.num_rows}")
        shape = (self.num_sequences * self.max_seq_len, *tuple(x.shape[1:]))
        if hasattr(x, "new_zeros"):
            out = x.new_zeros(shape)
            out[self._index_like(x)] = x
        else:
            out = np.zeros(shape, dtype=np.asarray(x).dtype)
            out[self.index] = x
        return out.reshape(self.num_sequences, self.max_seq_len, *shape[1:])

    def unpad(self, y: Any) -> Any:
        """The real rows ``(N, ...)`` of a padded ``(num_sequences, T, ...)`` value."""
        flat = y.reshape(self.num_sequences * self.max_seq_len, *tuple(y.shape[2:]))
        return flat[self._index_like(y)] if hasattr(y, "new_zeros") else flat[self.index]

    def _index_like(self, tensor: Any) -> Any:
        import torch

        return torch.as_tensor(self.index, device=tensor.device)
