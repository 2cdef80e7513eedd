"""``MetricsLogger``: RLlib 2.60's metrics API over the native store.

The statistics, their windows and reductions live in the Rust core
(``fastrollout._core.MetricsStore``, which this class subclasses): ``log_value`` is the
native method itself, so logging a number costs one call into the core and no Python
frame. The methods here only adapt arguments and results to RLlib's forms.

Semantics follow RLlib 2.60 (`ray.rllib.utils.metrics.metrics_logger`), with these
deliberate differences:

- Merged means are weighted by the number of values behind each incoming mean. RLlib
  averages the incoming means, so a runner that finished one episode weighs as much as one
  that finished a hundred (its own docstring shows [1, 2, 3, 4, 5] and [15] merging to 9
  instead of 5). EMAs are still merged as the plain mean of the incoming EMAs, as in RLlib.
- ``percentiles=True`` selects the default percentiles, as RLlib documents (RLlib 2.60
  raises ``ValueError`` for it).
- ``set_value`` replaces what a key holds (RLlib 2.60 raises: it removed the method).
- An unwindowed sum of only NaNs is NaN (RLlib's running ``nansum`` makes it 0.0 from the
  second NaN on, while one NaN, or a windowed sum of NaNs, stays NaN there).
- Reduced numbers are Python floats (RLlib returns numpy or torch scalars, or the logged
  object itself when a single value was logged); percentile values are floats too.
- ``peek(group_key, throughput=True)`` names throughputs ``<key>_throughput`` and includes
  lifetime sums' throughput dicts, as ``peek(throughput=True)`` does for everything (RLlib
  uses ``_throughputs`` there and drops the lifetime sums). Peeking throughputs from a
  non-root logger raises ``ValueError`` (RLlib: ``AssertionError``).
- ``get_state()`` has its own format (keys as tuples, so int key parts survive);
  ``set_state()`` takes it and RLlib's (2.60 and legacy ``Stats`` states). A restored
  aggregated mean from RLlib weighs each mean it merged once (RLlib keeps no counts).
- Options that do not belong to a reduction raise ``ValueError`` naming the option (RLlib
  raises ``TypeError`` from inside a Stats constructor for some of them), and so does
  logging to a key that ``aggregate`` fills or aggregating into a directly logged key.
- Torch tensors logged to mean/min/max/sum stay unread on their device until the next read
  of the logger (``peek``, ``reduce``, ...), which moves each stat's tensors to the host in
  one transfer, as RLlib keeps them; for the other reductions they are read when logged
  (RLlib reads them then too, to check for NaN). Results are computed in float64 (RLlib
  reduces tensors in float32).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Mapping
from typing import Any

from fastrollout._core import MetricsStore, StatsSnapshot
from fastrollout.metrics.rllib_compat import stat_states_from_rllib

Key = str | int | tuple[Any, ...]


class MetricsLogger(MetricsStore):
    """Collects metrics under nested keys and reduces them (RLlib 2.60's ``MetricsLogger``).

    Parallel components (env runners, learners) each log into their own logger and send
    ``reduce()``'s result to one root logger, which merges them with ``aggregate()``.

    Args:
        root: Whether this is the root logger: its lifetime sums are never reset by
            ``reduce()`` and it reports throughputs.

    Examples:
        >>> logger = MetricsLogger()
        >>> logger.log_value("loss", 0.5, reduce="mean", window=10)
        >>> logger.log_value("loss", 1.5)
        >>> logger.peek("loss")
        1.0
    """

    # No instance __dict__: attribute lookups (every log_value call) skip it.
    __slots__ = ()

    def __init__(self, root: bool = False) -> None:
        # The native constructor took `root`; nothing else to set up.
        super().__init__()

    def __reduce__(self) -> tuple[Any, ...]:
        return (_restore, (type(self), self._is_root_logger, self.get_state()))

    def peek(
        self,
        key: Key | None = None,
        default: Any = None,
        compile: bool = True,
        throughput: bool = False,
        latest_merged_only: bool = False,
    ) -> Any:
        """Returns the reduced value(s) under ``key`` without reducing anything.

        Args:
            key: A key or nested key tuple; ``None`` for everything (a nested dict).
            default: Returned when ``key`` is missing. With ``default=None`` a missing key
                raises, as in RLlib.
            compile: If False, return the values as a list (RLlib's uncompiled form).
            throughput: Return the throughput instead of the value (root loggers only).
            latest_merged_only: Only consider what the latest ``aggregate`` merged in
                (keys filled by ``aggregate`` only).

        Returns:
            The value, or a nested dict of values for a group of keys.

        Raises:
            KeyError: If ``key`` is missing and ``default`` is None.
            ValueError: If ``throughput`` is requested from a non-root logger or for a key
                that does not track one, or ``latest_merged_only`` for a logged key.
        """
        if throughput:
            if not self._is_root_logger:
                raise ValueError("throughputs can only be peeked from a root logger")
            out = self._throughputs(key)
            return default if out is None else out
        try:
            out = self._peek(key, compile, latest_merged_only)
        except KeyError:
            if default is None:
                raise
            return default
        if key is not None and isinstance(out, dict) and not out:
            return default
        return out

    @staticmethod
    def peek_results(results: Any, compile: bool = True) -> Any:
        """Peeks every ``StatsSnapshot`` in a (nested) result of ``reduce()``.

        Args:
            results: A snapshot, or a nested dict/list of them (other leaves stay as they are).
            compile: See ``peek``.

        Returns:
            The same structure with each snapshot replaced by its value.
        """
        if isinstance(results, StatsSnapshot):
            return results.peek(compile)
        if isinstance(results, Mapping):
            return {k: MetricsLogger.peek_results(v, compile) for k, v in results.items()}
        if isinstance(results, list | tuple):
            return type(results)(MetricsLogger.peek_results(v, compile) for v in results)
        return results

    def log_dict(
        self,
        value_dict: Mapping[Any, Any],
        *,
        key: Key | None = None,
        reduce: str | None = "mean",
        window: int | float | None = None,
        ema_coeff: float | None = None,
        percentiles: list[float] | bool | None = None,
        clear_on_reduce: bool | None = None,
        with_throughput: bool | None = None,
    ) -> None:
        """Logs every leaf of a nested dict with ``log_value`` (RLlib: default ``"mean"``).

        Lists and tuples inside the dict are structures, as in RLlib: their items are
        logged under their index.

        Args:
            value_dict: The nested dict of values.
            key: An optional key (or key tuple) to prefix every leaf's path with.
            reduce: See ``log_value``.
            window: See ``log_value``.
            ema_coeff: See ``log_value``.
            percentiles: See ``log_value``.
            clear_on_reduce: See ``log_value``.
            with_throughput: See ``log_value``.

        Raises:
            TypeError: If ``value_dict`` is not a dict.
        """
        if not isinstance(value_dict, Mapping):
            raise TypeError(f"log_dict() takes a dict, got {type(value_dict).__name__}")
        opts: dict[str, Any] = {
            "reduce": reduce,
            "window": window,
            "ema_coeff": ema_coeff,
            "percentiles": percentiles,
            "with_throughput": with_throughput,
        }
        if clear_on_reduce is not None:
            opts["clear_on_reduce"] = clear_on_reduce
        prefix: tuple[Any, ...] = () if key is None else _as_tuple(key)
        self._log_tree(prefix, value_dict, opts)

    def _log_tree(self, path: tuple[Any, ...], value: Any, opts: dict[str, Any]) -> None:
        if isinstance(value, Mapping):
            for k, v in value.items():
                self._log_tree((*path, k), v, opts)
        elif isinstance(value, list | tuple):
            for i, v in enumerate(value):
                self._log_tree((*path, i), v, opts)
        else:
            self.log_value(path, value, **opts)

    def reduce(self, compile: bool = False) -> dict[Any, Any]:
        """Reduces every stat and starts a new reduce cycle.

        Windowed and unwindowed series, percentiles and item series start over empty, EMAs
        keep their value, lifetime sums start from zero except in a root logger.

        Args:
            compile: If True, return plain values instead of snapshots.

        Returns:
            A nested dict of ``StatsSnapshot`` (what ``aggregate`` takes), or of values.
        """
        return self._reduce(compile)

    def aggregate(self, stats_dicts: list[dict[Any, Any]], *, key: Key | None = None) -> None:
        """Merges the ``reduce()`` results of n loggers into this one.

        A key seen for the first time becomes an aggregating stat with the configuration of
        the incoming stats. Series keep everything merged until this logger's ``reduce()``:
        min/max/sum reduce over all incoming values, means are weighted by the number of
        values behind each (RLlib averages the means), EMAs are averaged, lifetime sums add
        up, percentiles are computed over all incoming values, item series concatenate.

        Args:
            stats_dicts: The results of ``reduce()`` of the loggers to merge.
            key: An optional key (or key tuple) to put everything under.

        Raises:
            TypeError: If an entry is not a result of ``reduce()``.
            ValueError: If a key is logged to directly in this logger, or the incoming stats
                under a key do not have the same reduction.
        """
        self._aggregate(stats_dicts, key)

    def merge_and_log_n_dicts(
        self, stats_dicts: list[dict[Any, Any]], *, key: Key | None = None
    ) -> None:
        """Deprecated name of ``aggregate`` (as in RLlib 2.60).

        Args:
            stats_dicts: See ``aggregate``.
            key: See ``aggregate``.
        """
        warnings.warn(
            "merge_and_log_n_dicts() is deprecated; use aggregate()",
            DeprecationWarning,
            stacklevel=2,
        )
        self.aggregate(stats_dicts, key=key)

    def log_time(
        self,
        key: Key,
        *,
        reduce: str = "ema",
        window: int | float | None = None,
        ema_coeff: float | None = None,
        percentiles: list[float] | bool | None = None,
        clear_on_reduce: bool | None = None,
        with_throughput: bool | None = None,
    ) -> _Timer:
        """Returns a context manager that logs the seconds its ``with`` block took.

        The stat is created right away (with these options) if it is missing.

        Args:
            key: The key (or key tuple) to log the time under.
            reduce: See ``log_value`` (default ``"ema"``, as in RLlib).
            window: See ``log_value``.
            ema_coeff: See ``log_value``.
            percentiles: See ``log_value``.
            clear_on_reduce: See ``log_value``.
            with_throughput: See ``log_value``.

        Returns:
            A context manager; each ``with`` block logs one duration.
        """
        if clear_on_reduce is not None:
            warnings.warn(
                "clear_on_reduce is deprecated (RLlib 2.60)", DeprecationWarning, stacklevel=2
            )
        self._ensure(
            key,
            reduce=reduce,
            window=window,
            ema_coeff=ema_coeff,
            percentiles=percentiles,
            with_throughput=with_throughput,
        )
        return _Timer(self, key)

    def delete(self, *key: Any, key_error: bool = True) -> None:
        """Deletes a stat or a group of stats.

        Args:
            *key: The key parts (``delete("a", "b")`` or ``delete(("a", "b"))``).
            key_error: Whether a missing key raises.

        Raises:
            KeyError: If the key is missing and ``key_error`` is True.
        """
        self._delete(key, key_error)

    def get_state(self) -> dict[str, Any]:
        """Returns the logger's state: every stat's configuration and content.

        Returns:
            ``{"stats": [(key_tuple, stat_state), ...]}`` of plain Python values.
        """
        return self._get_state()

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Replaces every stat by those in ``state``.

        Takes fastrollout's ``get_state()`` and RLlib's: RLlib 2.60's
        ``MetricsLogger.get_state()`` (``{"stats": {"a--b": stats_state}}``, each with its
        ``"stats_cls_identifier"``) and the states of RLlib's former ``Stats`` class, each
        read as RLlib 2.60 reads it, into the matching reduction with its settings and
        values. Throughput clocks restart at this call, as in RLlib.

        Args:
            state: A state from ``get_state``, or from RLlib's ``MetricsLogger.get_state``.

        Raises:
            TypeError: If ``state`` is not such a dict.
            KeyError: If ``state`` or a stat's state is missing a field.
            ValueError: If a stat's state is invalid.
        """
        if not isinstance(state, Mapping):
            raise TypeError(
                f"set_state() takes the dict that get_state() returns, got {type(state).__name__}"
            )
        if "stats" not in state:
            raise KeyError("set_state(): the state has no 'stats' entry")
        stats = state["stats"]
        if isinstance(stats, Mapping):
            # RLlib's format: flat "--"-joined keys -> Stats states.
            state = {"stats": stat_states_from_rllib(stats, root=self._is_root_logger)}
        self._set_state(state)

    def compile(self) -> dict[Any, Any]:
        """Reduces everything and adds the throughputs (``<key>_throughput``).

        Returns:
            A nested dict of values.
        """
        throughputs = self._throughputs(None)
        values = self.reduce(compile=True)
        if throughputs:
            _deep_update(values, throughputs)
        return values

    def activate_tensor_mode(self) -> None:
        """No-op, kept for RLlib compatibility (tensor mode is gone in RLlib 2.60)."""

    def deactivate_tensor_mode(self) -> None:
        """No-op, kept for RLlib compatibility (tensor mode is gone in RLlib 2.60)."""


class _Timer:
    """Context manager of ``MetricsLogger.log_time``: logs the duration of each block."""

    __slots__ = ("_key", "_logger", "_start")

    def __init__(self, logger: MetricsLogger, key: Key) -> None:
        self._logger = logger
        self._key = key
        self._start: float | None = None

    def __enter__(self) -> _Timer:
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._start is not None:
            self._logger.log_value(self._key, time.perf_counter() - self._start)
            self._start = None


def _as_tuple(key: Key) -> tuple[Any, ...]:
    return key if isinstance(key, tuple) else (key,)


def _deep_update(into: dict[Any, Any], new: Mapping[Any, Any]) -> None:
    for k, v in new.items():
        if isinstance(v, Mapping) and isinstance(into.get(k), dict):
            _deep_update(into[k], v)
        else:
            into[k] = v


def _restore(cls: type[MetricsLogger], root: bool, state: dict[str, Any]) -> MetricsLogger:
    logger = cls(root=root)
    logger.set_state(state)
    return logger
