"""RLlib 2.60 interop for metrics: reduce() results as RLlib Stats, RLlib states in set_state.

``to_rllib_results`` turns what fastrollout's ``MetricsLogger.reduce()`` returns into what
RLlib's own ``MetricsLogger.reduce()`` returns, so fastrollout's runners can report their
metrics to RLlib's ``Algorithm`` (whose root logger merges the runners' results with
``MetricsLogger.aggregate``). It imports ray when called, never at import time.

``stat_states_from_rllib`` reads RLlib's ``MetricsLogger.get_state()`` (plain dicts, no ray
needed) into fastrollout's state entries; ``MetricsLogger.set_state`` uses it.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Mapping
from typing import Any

from fastrollout._core import StatsSnapshot

__all__ = ["stat_states_from_rllib", "to_rllib_results"]

_INSTALL_HINT = "pip install fastrollout[rllib]"

# RLlib's defaults (its PercentilesStats and EmaStats constructors).
_DEFAULT_PERCENTILES = (0, 50, 75, 90, 95, 99, 100)
_DEFAULT_EMA_COEFF = 0.01

_SERIES = ("mean", "min", "max", "sum")


def to_rllib_results(results: Any, *, stats_cls_lookup: Mapping[str, type] | None = None) -> Any:
    """Converts a result of fastrollout's ``MetricsLogger.reduce()`` into RLlib's form.

    Each ``StatsSnapshot`` becomes the RLlib 2.60 Stats object that RLlib's own non-root
    ``MetricsLogger.reduce()`` returns for the same logged values: same class, reduced
    values, window, EMA coefficient, percentiles, throughput setting and ``is_root`` /
    ``is_leaf``, built through the class's public API (constructor and value list, as
    RLlib's ``reduce()`` builds them, or ``from_state``). RLlib's root logger then
    merges them (``MetricsLogger.aggregate(..., key="env_runners")``) and gives the
    ``peek()`` results and throughputs it gives for its own runners' results.

    RLlib's semantics, not fastrollout's, hold inside RLlib: a mean becomes one reduced
    value, as RLlib's runners send it, and the number of values behind it is dropped, so
    RLlib's root averages the runners' means with equal weight (fastrollout's own root
    weights each mean by its count). EMAs, sums, lifetime sums, min/max, percentiles and
    items merge the same in both. A snapshot from an aggregating (non-leaf) logger carries
    fastrollout's weighted mean of what it merged.

    Env runners call it on their reduced metrics when they run inside an RLlib
    ``Algorithm``::

        return to_rllib_results(self.metrics.reduce())

    It costs about 3 us per stat, almost all of it in RLlib's Stats constructors: ~0.12 ms
    for a runner's 40 keys (CPython 3.11 on a 2-core VM), about what RLlib's own
    ``reduce()`` of those keys costs (0.12-0.3 ms there).

    Args:
        results: A nested dict of snapshots as ``MetricsLogger.reduce()`` returns it, or
            one snapshot. RLlib Stats already in it are kept as they are.
        stats_cls_lookup: The reduction name -> Stats class map, if the algorithm's config
            replaces RLlib's ``DEFAULT_STATS_CLS_LOOKUP``; each class is built with the
            constructor arguments and state of the built-in class it replaces.

    Returns:
        The same nested dict (new dicts, same keys) with RLlib Stats objects as leaves, or
        one Stats object for one snapshot.

    Raises:
        ImportError: If ray (RLlib 2.60) is not installed.
        TypeError: If a leaf is not a ``StatsSnapshot``; the error names its key.
        KeyError: If ``stats_cls_lookup`` has no class for a snapshot's reduction.
    """
    lookup, stats_base = _rllib_classes(stats_cls_lookup)
    return _convert(results, lookup, stats_base, ())


def _rllib_classes(custom: Mapping[str, type] | None) -> tuple[Mapping[str, type], type]:
    try:
        from ray.rllib.utils.metrics.metrics_logger import DEFAULT_STATS_CLS_LOOKUP
        from ray.rllib.utils.metrics.stats import StatsBase
    except ImportError as e:
        raise ImportError(
            f"to_rllib_results() needs RLlib 2.60 (ray[rllib]==2.60.0): {_INSTALL_HINT}"
        ) from e
    return (DEFAULT_STATS_CLS_LOOKUP if custom is None else custom), StatsBase


def _convert(node: Any, lookup: Mapping[str, type], stats_base: type, path: tuple[Any, ...]) -> Any:
    if isinstance(node, StatsSnapshot):
        return _to_stats(node, lookup, path)
    if isinstance(node, dict):
        return {k: _convert(v, lookup, stats_base, (*path, k)) for k, v in node.items()}
    if isinstance(node, stats_base):
        return node
    raise TypeError(
        "to_rllib_results() takes the nested dict of StatsSnapshot that "
        f"MetricsLogger.reduce() returns; found a {type(node).__name__} under key {path!r}"
    )


def _to_stats(snap: StatsSnapshot, lookup: Mapping[str, type], path: tuple[Any, ...]) -> Any:
    s = snap.get_state()
    reduce = s["reduce"]
    try:
        cls: Any = lookup[reduce]
    except KeyError:
        raise KeyError(
            f"stats_cls_lookup has no Stats class for reduce={reduce!r} (key {path!r})"
        ) from None
    where = {"is_root": s["is_root"], "is_leaf": s["is_leaf"]}
    # Series, percentiles and item series are built as RLlib's reduce() builds them: a
    # fresh object with the settings, then its public list of values. The others keep
    # their reduced value in private attributes, so they go through from_state.
    if reduce in _SERIES:
        value = s["value"]
        if reduce == "sum":
            stats = cls(window=s["window"], with_throughput=s["with_throughput"], **where)
        else:
            stats = cls(window=s["window"], **where)
        # RLlib's min/max without a window hold no value when nothing was logged (NaN
        # here); with a window, and for means and sums, the reduction of nothing is NaN.
        empty = reduce in ("min", "max") and s["window"] is None and math.isnan(value)
        stats.values = [] if empty else [value]
        return stats
    if reduce == "percentiles":
        # Whole numbers as ints, as RLlib's default list and users write them (the keys
        # of the dict that peek() returns).
        ps = [int(p) if float(p).is_integer() else p for p in s["percentiles"]]
        stats = cls(percentiles=ps, window=s["window"], **where)
        stats.values = s["values"]
        return stats
    if reduce == "item_series":
        stats = cls(window=s["window"], **where)
        stats.items = s["items"]
        return stats
    state = {"stats_cls_identifier": cls.stats_cls_identifier, **where}
    if not s["is_leaf"]:
        # A clone of an aggregating stat has not merged anything yet.
        state["latest_merged"] = None
    if reduce == "ema":
        state["ema_coeff"] = s["ema_coeff"]
        state["value"] = s["value"]
    elif reduce == "lifetime_sum":
        state["lifetime_sum"] = s["value"]
        state["track_throughputs"] = s["with_throughput"]
    else:  # item
        state["item"] = s["item"]
    return cls.from_state(state)


def stat_states_from_rllib(
    stats: Mapping[str, Any], *, root: bool
) -> list[tuple[tuple[str, ...], dict[str, Any]]]:
    """Reads the ``"stats"`` of RLlib's ``MetricsLogger.get_state()`` as fastrollout's entries.

    Takes RLlib 2.60's states (each with a ``"stats_cls_identifier"``: ``MeanStats``,
    ``EmaStats``, ..., ``ItemSeriesStats``) and the legacy states of RLlib's former single
    ``Stats`` class (with ``"reduce"``, read as RLlib 2.60 reads them). Flat keys are split
    at ``"--"``, as RLlib joins them. The weights of restored aggregated means are one per
    merged mean (RLlib keeps no counts).

    Args:
        stats: The ``"stats"`` dict of an RLlib ``MetricsLogger`` state.
        root: Whether the restoring logger is a root logger (legacy states only: RLlib
            2.60 states carry their own ``is_root``).

    Returns:
        ``(key_tuple, fastrollout_stat_state)`` pairs, as fastrollout's ``get_state()``
        lists them.

    Raises:
        TypeError: If a key is not a str or a state is not a dict.
        KeyError: If a state is missing a field (the error names the key and field).
        ValueError: If a state names an unknown Stats class or holds invalid settings.
    """
    out = []
    for flat_key, st in stats.items():
        if not isinstance(flat_key, str):
            raise TypeError(f"RLlib metrics state keys are str joined with '--', got {flat_key!r}")
        if not isinstance(st, Mapping):
            raise TypeError(
                f"RLlib metrics state {flat_key!r}: expected a Stats state dict, "
                f"got {type(st).__name__}"
            )
        try:
            if "stats_cls_identifier" in st:
                state = _from_stats_state(st)
            else:
                state = _from_legacy_state(st, root)
        except KeyError as e:
            raise KeyError(
                f"RLlib metrics state {flat_key!r} is missing the field {e.args[0]!r}"
            ) from None
        except (TypeError, ValueError) as e:
            raise type(e)(f"RLlib metrics state {flat_key!r}: {e}") from None
        out.append((tuple(flat_key.split("--")), state))
    return out


def _blank(reduce: str, is_root: bool, is_leaf: bool) -> dict[str, Any]:
    """A fastrollout stat state holding nothing yet (the fields that _set_state reads)."""
    return {
        "reduce": reduce,
        "window": None,
        "ema_coeff": _DEFAULT_EMA_COEFF,
        "percentiles": [],
        "with_throughput": False,
        "is_root": is_root,
        "is_leaf": is_leaf,
        "values": [],
        "value": math.nan,
        "count": 0.0,
        "merged": None,
        "item": None,
        "items": [],
    }


def _from_stats_state(st: Mapping[str, Any]) -> dict[str, Any]:
    ident = st["stats_cls_identifier"]
    is_leaf = bool(st["is_leaf"])
    out = _blank(ident, bool(st["is_root"]), is_leaf)
    if ident in _SERIES:
        _set_series(out, ident, st["values"], st["window"])
        if ident == "sum":
            out["with_throughput"] = bool(st["track_throughput"])
    elif ident == "ema":
        out["ema_coeff"] = float(st["ema_coeff"])
        out["value"] = float(st["value"])
        if not is_leaf:
            incoming = _floats(st.get("values_to_merge", ()))
            known = [v for v in incoming if not math.isnan(v)]
            out["merged"] = (float(len(incoming)), math.fsum(known), float(len(known)))
    elif ident == "lifetime_sum":
        out["value"] = float(st["lifetime_sum"])
        out["with_throughput"] = bool(st["track_throughputs"])
    elif ident == "percentiles":
        _set_percentiles(out, st["values"], st["window"], st["percentiles"])
    elif ident == "item":
        out["item"] = st["item"]
    elif ident == "item_series":
        out["window"] = _window(st["window"])
        out["items"] = list(st["items"])
    else:
        raise ValueError(
            f"unknown Stats class {ident!r}: fastrollout restores RLlib's built-in classes "
            "(mean, ema, min, max, sum, lifetime_sum, percentiles, item, item_series)"
        )
    return out


def _from_legacy_state(st: Mapping[str, Any], root: bool) -> dict[str, Any]:
    # RLlib 2.60 restores the former single Stats class's states as leaves (aggregating
    # stats in a root logger), turning uncleared sums into lifetime sums and mean EMAs into
    # EMAs; fastrollout does the same.
    reduce = st["reduce"]
    is_leaf = not root
    throughput = st.get("throughput_stats") is not None
    if st.get("clear_on_reduce", True) is False:
        if reduce == "sum":
            out = _blank("lifetime_sum", root, is_leaf)
            # Only a root keeps a lifetime sum's total (RLlib 2.60 restores 0 elsewhere).
            out["value"] = _nan_sum(_floats(st["values"])) if root else 0.0
            out["with_throughput"] = throughput
            return out
        warnings.warn(
            f"a legacy RLlib stat with reduce={reduce!r} and clear_on_reduce=False is "
            "restored as a stat that clears on reduce (as RLlib 2.60 does)",
            DeprecationWarning,
            stacklevel=4,
        )
    if reduce == "mean" and st.get("ema_coeff") is not None:
        out = _blank("ema", root, is_leaf)
        out["ema_coeff"] = float(st["ema_coeff"])
        known = [v for v in _floats(st["values"]) if not math.isnan(v)]
        out["value"] = math.fsum(known) / len(known) if known else math.nan
        if not is_leaf:
            out["merged"] = (0.0, 0.0, 0.0)
        return out
    if reduce in _SERIES:
        out = _blank(reduce, root, is_leaf)
        _set_series(out, reduce, st["values"], st["window"])
        out["with_throughput"] = reduce == "sum" and throughput
        return out
    percentiles = st.get("percentiles", False)
    if reduce == "percentiles" or (reduce is None and percentiles is not False):
        out = _blank("percentiles", root, is_leaf)
        _set_percentiles(out, st["values"], st["window"], percentiles)
        return out
    raise ValueError(f"legacy RLlib stats state with reduce={reduce!r} is not supported")


def _set_series(out: dict[str, Any], reduce: str, values: Iterable[Any], window: Any) -> None:
    out["window"] = _window(window)
    vals = _floats(values)
    if out["window"] is not None and out["is_leaf"]:
        out["values"] = vals
        return
    # No window, or an aggregating stat: a running reduction (mean: sum and count) over
    # the non-NaN values, as RLlib's nan-reductions of its list.
    known = [v for v in vals if not math.isnan(v)]
    if not known:
        out["value"], out["count"] = 0.0, 0.0
    elif reduce == "min":
        out["value"], out["count"] = min(known), float(len(known))
    elif reduce == "max":
        out["value"], out["count"] = max(known), float(len(known))
    else:
        out["value"], out["count"] = math.fsum(known), float(len(known))


def _set_percentiles(out: dict[str, Any], values: Iterable[Any], window: Any, ps: Any) -> None:
    out["window"] = _window(window)
    if ps is None or ps is True:
        ps = _DEFAULT_PERCENTILES
    if not isinstance(ps, Iterable):
        raise ValueError(f"percentiles must be a list of numbers in [0, 100], got {ps!r}")
    out["percentiles"] = pcts = [float(p) for p in ps]
    if any(not 0.0 <= p <= 100.0 for p in pcts):
        raise ValueError(f"percentiles must be in [0, 100], got {list(ps)!r}")
    out["values"] = _floats(values)


def _window(w: Any) -> int | None:
    if w is None or w == math.inf:
        return None
    if isinstance(w, bool) or not isinstance(w, int | float) or w < 1 or w != int(w):
        raise ValueError(f"window must be a positive int, None or float('inf'), got {w!r}")
    return int(w)


def _floats(values: Iterable[Any]) -> list[float]:
    # float() also reads numpy scalars and one-element tensors (RLlib keeps those).
    return [float(v) for v in values]


def _nan_sum(values: list[float]) -> float:
    return math.fsum(v for v in values if not math.isnan(v))
