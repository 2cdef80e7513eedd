"""Nested values (observations of Dict/Tuple spaces): dicts and tuples of arrays.

One leaf-wise map serves the batches, learners, estimators, the policy client, the sub-env
backends and the RolloutWorker's policies; dicts and tuples are nodes, anything else is a
leaf.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["as_list", "concat", "leaves", "set_rows", "take", "to_tensor", "tree_map"]


def tree_map(fn: Callable[..., Any], *trees: Any) -> Any:
    """Applies ``fn`` leaf-wise across trees of the same nesting.

    Args:
        fn: Called with the leaves at one position, one per tree.
        *trees: Values nested in dicts and tuples alike.

    Returns:
        A tree of the first one's nesting holding ``fn``'s results.
    """
    first = trees[0]
    if isinstance(first, Mapping):
        return {k: tree_map(fn, *(t[k] for t in trees)) for k in first}
    if isinstance(first, tuple):
        return tuple(tree_map(fn, *parts) for parts in zip(*trees, strict=True))
    return fn(*trees)


def leaves(tree: Any) -> Iterator[Any]:
    """The leaves of a tree, in order."""
    if isinstance(tree, Mapping):
        for v in tree.values():
            yield from leaves(v)
    elif isinstance(tree, tuple):
        for v in tree:
            yield from leaves(v)
    else:
        yield tree


def concat(parts: Sequence[Any]) -> Any:
    """Concatenates trees of arrays leaf-wise along the first axis."""
    return tree_map(lambda *xs: np.concatenate([np.asarray(x) for x in xs], axis=0), *parts)


def take(tree: Any, index: Any) -> Any:
    """``leaf[index]`` of every leaf (rows of arrays or tensors)."""
    return tree_map(lambda x: x[index], tree)


def set_rows(batch: Any, rows: Any, values: Any) -> None:
    """Writes ``values`` (batched) into rows ``rows`` of ``batch`` (nested dicts/tuples).

    Args:
        batch: A batched array, or a dict/tuple of them (gymnasium's vector layout).
        rows: Row indices (or one index, with ``values`` one item).
        values: The rows' values, laid out as ``batch``.
    """
    if isinstance(batch, dict):
        for k, v in batch.items():
            set_rows(v, rows, values[k])
    elif isinstance(batch, tuple):
        for b, v in zip(batch, values, strict=True):
            set_rows(b, rows, v)
    else:
        batch[rows] = values


def to_tensor(tree: Any, device: Any) -> Any:
    """Every leaf as a torch tensor on ``device`` (arrays made contiguous first)."""
    import torch

    return tree_map(lambda x: torch.as_tensor(np.ascontiguousarray(x), device=device), tree)


def as_list(value: Any) -> list[Any]:
    """One value or a collection of them, as a list (RLlib's ``force_list``).

    >>> as_list(None), as_list("p0"), as_list(("p0", "p1"))
    ([], ['p0'], ['p0', 'p1'])
    """
    if value is None:
        return []
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        return [value]
    return list(value)
