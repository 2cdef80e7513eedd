"""Shared helpers for the episode tests.

- The subject switch: ``FR_DIFF_SUBJECT=rllib`` makes the suite run against RLlib's own
  ``SingleAgentEpisode`` (used to validate the harnesses themselves); the default,
  ``fastrollout``, tests our implementation.
- ``assert_same``: a strict deep comparison that names the path of the first difference.
- ``snapshot``: everything observable about an episode through its public getters, as one
  comparable structure (exceptions become ``Raised`` markers).
- ``MAEpisode`` / ``RLlibMAEpisode``: the same switch for ``MultiAgentEpisode`` (resolved on
  first use, so the multi-agent modules import before fastrollout has the class).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from ray.rllib.env.multi_agent_episode import MultiAgentEpisode as RLlibMAEpisode
from ray.rllib.env.single_agent_episode import SingleAgentEpisode as RLlibEpisode
from ray.rllib.utils.error import MultiAgentEnvError as RLlibMultiAgentEnvError

__all__ = [
    "IS_FASTROLLOUT",
    "REPORT",
    "MAEpisode",
    "RLlibMAEpisode",
    "RLlibMultiAgentEnvError",
    "SUBJECT",
    "Episode",
    "EpisodeStateError",
    "RLlibEpisode",
    "Raised",
    "SpaceMismatchError",
    "assert_same",
    "assert_same_episode",
    "assert_same_outcome",
    "count",
    "fastrollout_only",
    "ma_env_errors",
    "outcome",
    "same_error_kind",
    "snapshot",
]

SUBJECT = os.environ.get("FR_DIFF_SUBJECT", "fastrollout")
if SUBJECT not in ("fastrollout", "rllib"):
    raise RuntimeError(f"FR_DIFF_SUBJECT must be 'fastrollout' or 'rllib', not {SUBJECT!r}")

if SUBJECT == "rllib":
    Episode: Any = RLlibEpisode
    # RLlib raises the plain builtins where fastrollout raises its subclasses.
    EpisodeStateError: type[Exception] = AssertionError
    SpaceMismatchError: type[Exception] = ValueError
else:
    from fastrollout import SingleAgentEpisode as Episode
    from fastrollout.errors import EpisodeStateError, SpaceMismatchError

IS_FASTROLLOUT = SUBJECT == "fastrollout"

# Marks a test of behaviour that fastrollout documents beyond (or against) RLlib's.
fastrollout_only = pytest.mark.skipif(
    not IS_FASTROLLOUT, reason="fastrollout-specific contract (RLlib does not do this)"
)

# Counters that conftest's terminal summary prints (e.g. the differential comparisons).
REPORT: dict[str, int] = {}


def count(name: str, n: int = 1) -> None:
    REPORT[name] = REPORT.get(name, 0) + n


# --------------------------------------------------------------------------------------
# Deep comparison.
# --------------------------------------------------------------------------------------

_SCALARS = (bool, int, float, complex, np.generic)


def _kind(x: Any) -> str:
    if isinstance(x, np.ndarray):
        return f"ndarray(dtype={x.dtype}, shape={x.shape})"
    if isinstance(x, np.generic):
        return f"numpy scalar {x.dtype}"
    if isinstance(x, (list, tuple)):
        return f"{type(x).__name__}(len={len(x)})"
    return type(x).__name__


def _fail(path: str, msg: str) -> None:
    raise AssertionError(f"at {path}: {msg}")


def _is_nan(x: Any) -> bool:
    try:
        return bool(math.isnan(x))
    except (TypeError, ValueError):
        return False


def assert_same(expected: Any, actual: Any, path: str = "value", *, strict_dtype: bool = True):
    """Deeply compares ``actual`` to ``expected``; raises AssertionError naming the path.

    - numpy arrays: both must be arrays with the same shape; the dtype must be identical
      unless ``strict_dtype=False``; values are compared across dtype kinds (3 == 3.0) and
      NaN equals NaN. Object arrays are compared element by element.
    - lists, tuples and dicts are compared recursively; the container kind must match
      (a list is not a tuple, and neither is an ndarray). Dict key order is ignored.
    - scalars: a python scalar equals a numpy scalar of the same value; two numpy scalars
      must also have the same dtype (unless ``strict_dtype=False``). A 0-d array is an
      array, not a scalar.
    - anything else (None, str, gymnasium spaces, ...): same type and ``==``.
    """
    _same(expected, actual, path, strict_dtype)


def _same(a: Any, b: Any, path: str, strict: bool) -> None:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)):
            _fail(path, f"expected {_kind(a)}, got {_kind(b)}")
        if a.shape != b.shape:
            _fail(path, f"shape: expected {a.shape}, got {b.shape} ({_kind(a)} vs {_kind(b)})")
        if strict and a.dtype != b.dtype:
            _fail(path, f"dtype: expected {a.dtype}, got {b.dtype}")
        if a.dtype == object or b.dtype == object:
            for idx in np.ndindex(a.shape):
                _same(a[idx], b[idx], f"{path}[{', '.join(map(str, idx))}]", strict)
            return
        if a.dtype == b.dtype and np.array_equal(a, b):
            return
        try:
            np.testing.assert_array_equal(b, a)
        except AssertionError as e:
            _fail(path, f"values differ:\nexpected {a!r}\ngot      {b!r}\n{e}")
        return
    if isinstance(a, _SCALARS) or isinstance(b, _SCALARS):
        if not (isinstance(a, _SCALARS) and isinstance(b, _SCALARS)):
            _fail(path, f"expected scalar {a!r} ({_kind(a)}), got {_kind(b)}: {b!r}")
        if (
            strict
            and isinstance(a, np.generic)
            and isinstance(b, np.generic)
            and a.dtype != b.dtype
        ):
            _fail(path, f"scalar dtype: expected {a.dtype}, got {b.dtype}")
        if not (a == b or (_is_nan(a) and _is_nan(b))):
            _fail(path, f"expected {a!r}, got {b!r}")
        return
    if isinstance(a, Mapping) or isinstance(b, Mapping):
        if not (isinstance(a, Mapping) and isinstance(b, Mapping)):
            _fail(path, f"expected {_kind(a)}, got {_kind(b)}")
        if set(a.keys()) != set(b.keys()):
            _fail(path, f"keys: expected {sorted(map(repr, a))}, got {sorted(map(repr, b))}")
        for k in a:
            _same(a[k], b[k], f"{path}[{k!r}]", strict)
        return
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        for kind in (list, tuple):
            if isinstance(a, kind) != isinstance(b, kind):
                _fail(path, f"expected {_kind(a)}, got {_kind(b)}")
        if len(a) != len(b):
            _fail(path, f"length: expected {len(a)}, got {len(b)}\nexpected {a!r}\ngot {b!r}")
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same(x, y, f"{path}[{i}]", strict)
        return
    if a is None or b is None:
        if a is not b:
            _fail(path, f"expected {a!r}, got {b!r}")
        return
    if type(a) is not type(b):
        _fail(path, f"type: expected {type(a).__name__}, got {type(b).__name__}")
    if a != b:
        _fail(path, f"expected {a!r}, got {b!r}")


# --------------------------------------------------------------------------------------
# Outcomes and snapshots.
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Raised:
    """Stands for "this call raised an exception of this type" in a snapshot."""

    exc_type: type[BaseException]

    def __repr__(self) -> str:
        return f"Raised({self.exc_type.__name__})"


def outcome(fn: Callable[[], Any]) -> Any:
    """Returns ``fn()``, or a ``Raised`` marker with the type of the exception it raised."""
    try:
        return fn()
    except Exception as e:
        return Raised(type(e))


def assert_same_outcome(expected: Any, actual: Any, path: str = "value", **kw: Any) -> None:
    """Like ``assert_same``, but a ``Raised(T)`` expectation accepts any subclass of T."""
    if isinstance(expected, Raised) or isinstance(actual, Raised):
        if not (
            isinstance(expected, Raised)
            and isinstance(actual, Raised)
            and issubclass(actual.exc_type, expected.exc_type)
        ):
            _fail(path, f"expected {expected!r}, got {actual!r}")
        return
    assert_same(expected, actual, path, **kw)


# How far into the lookback buffer `snapshot` looks (the deepest lookback any test builds).
MAX_LOOKBACK_PROBE = 8


def episode_getters(ep: Any, extra_keys: Iterable[str] = ()) -> dict[str, Callable[..., Any]]:
    """The data getters of a single- or multi-agent episode by name (extras per key)."""
    getters: dict[str, Callable[..., Any]] = {
        "observations": ep.get_observations,
        "infos": ep.get_infos,
        "actions": ep.get_actions,
        "rewards": ep.get_rewards,
    }
    for key in extra_keys:
        getters[f"extra[{key}]"] = lambda *a, _k=key, **kw: ep.get_extra_model_outputs(_k, *a, **kw)
    return getters


def snapshot(ep: Any, extra_keys: tuple[str, ...] = (), *, deep: bool = True) -> dict:
    """Everything observable about ``ep`` through its public getters.

    With ``deep``, the lookback buffers are read too, item by item, with
    ``neg_index_as_lookback=True`` (items past the lookback come out as ``Raised``).
    """
    snap: dict[str, Any] = {
        "len": len(ep),
        "t": ep.t,
        "t_started": ep.t_started,
        "id_": ep.id_,
        "agent_id": ep.agent_id,
        "module_id": ep.module_id,
        "multi_agent_episode_id": ep.multi_agent_episode_id,
        "is_done": ep.is_done,
        "is_terminated": ep.is_terminated,
        "is_truncated": ep.is_truncated,
        "is_reset": ep.is_reset,
        "is_numpy": ep.is_numpy,
        "env_steps": ep.env_steps(),
        "agent_steps": ep.agent_steps(),
        "return": outcome(ep.get_return),
        "custom_data": dict(ep.custom_data),
        "observation_space": ep.observation_space,
        "action_space": ep.action_space,
    }
    for name, get in episode_getters(ep, extra_keys).items():
        snap[name] = outcome(get)
        if deep:
            for j in range(1, MAX_LOOKBACK_PROBE + 1):
                snap[f"{name}[-{j} lookback]"] = outcome(
                    lambda g=get, j=j: g(-j, neg_index_as_lookback=True)
                )
    return snap


def assert_same_episode(
    expected: Any, actual: Any, extra_keys: tuple[str, ...] = (), **kw: Any
) -> None:
    """Compares the snapshots of two episodes (see ``snapshot``)."""
    a = snapshot(expected, extra_keys)
    b = snapshot(actual, extra_keys)
    for key in a:
        assert_same_outcome(a[key], b[key], key, **kw)


# --------------------------------------------------------------------------------------
# Multi-agent: the subject's MultiAgentEpisode, looked up on first use.
# --------------------------------------------------------------------------------------


class _SubjectMAEpisode:
    """Stands for the subject's ``MultiAgentEpisode`` class, resolved on first use.

    The multi-agent test modules import while ``fastrollout`` has no ``MultiAgentEpisode``
    yet; using this stand-in then raises (so those tests fail, they are never skipped).
    Calling it constructs an episode; attributes (``from_state``, ...) are the class's.
    """

    def resolve(self) -> Any:
        if SUBJECT == "rllib":
            return RLlibMAEpisode
        import fastrollout

        cls = getattr(fastrollout, "MultiAgentEpisode", None)
        if cls is None:
            raise RuntimeError(
                "fastrollout has no MultiAgentEpisode: the multi-agent tests test it and "
                "fail until it exists (FR_DIFF_SUBJECT=rllib runs them against RLlib)"
            )
        return cls

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.resolve()(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.resolve(), name)

    def __repr__(self) -> str:
        return f"<the subject's MultiAgentEpisode ({SUBJECT})>"


MAEpisode: Any = _SubjectMAEpisode()


def ma_env_errors() -> tuple[type[BaseException], ...]:
    """The exception classes that stand for RLlib's ``MultiAgentEnvError`` on the subject.

    RLlib raises ``ray.rllib.utils.error.MultiAgentEnvError``; fastrollout (which does not
    depend on ray) raises its own ``fastrollout.errors.MultiAgentEnvError`` or a subclass
    of ray's.
    """
    classes: list[type[BaseException]] = [RLlibMultiAgentEnvError]
    if IS_FASTROLLOUT:
        import fastrollout.errors

        own = getattr(fastrollout.errors, "MultiAgentEnvError", None)
        if own is not None:
            classes.append(own)
    return tuple(classes)


def same_error_kind(expected: type[BaseException], actual: type[BaseException]) -> bool:
    """Whether the subject's exception ``actual`` stands for the reference's ``expected``.

    A subclass counts; RLlib's ``MultiAgentEnvError`` is also matched by any class in
    ``ma_env_errors()``.
    """
    if issubclass(actual, expected):
        return True
    return issubclass(expected, RLlibMultiAgentEnvError) and issubclass(actual, ma_env_errors())


# --------------------------------------------------------------------------------------
# Differential harness pieces shared by the single- and multi-agent tests.
# --------------------------------------------------------------------------------------


class Divergence(AssertionError):
    """The subject observably differs from the reference."""


def raised(out: Any, *types: type[BaseException]) -> bool:
    """Whether an ``outcome`` is a raise of one of ``types`` (or a subclass)."""
    return isinstance(out, Raised) and issubclass(out.exc_type, types)


def run_differential_batch(
    seeds: Any, make_run: Any, noun: str, *, prefix: str = "", after_run: Any = None
) -> None:
    """Runs ``make_run(seed).run()`` for every seed; fails naming every diverging seed and
    the first story (``Divergence``). Counts comparisons, scripts and divergences.

    Args:
        seeds: The seeds of this batch.
        make_run: Seed -> an object with ``run()`` and ``comparisons``.
        noun: What one seed drives, plural ("trajectories", "scripts").
        prefix: Prefix of the counters' names (e.g. "multi-agent ").
        after_run: Called with each run object after it ran (for more counters).
    """
    seeds = list(seeds)
    failures: dict[int, str] = {}
    comparisons = 0
    for seed in seeds:
        run = make_run(seed)
        try:
            run.run()
        except Divergence as e:
            failures[seed] = str(e)
        comparisons += run.comparisons
        if after_run is not None:
            after_run(run)
    count(f"{prefix}differential comparisons ({SUBJECT} vs rllib)", comparisons)
    count(f"{prefix}differential {noun} ({SUBJECT} vs rllib)", len(seeds))
    count(f"{prefix}differential divergent {noun} ({SUBJECT} vs rllib)", len(failures))
    if failures:
        first = next(iter(failures.values()))
        pytest.fail(
            f"{len(failures)} of {len(seeds)} {noun} diverged ({comparisons} comparisons), "
            f"seeds {sorted(failures)}; the first:\n{first}",
            pytrace=False,
        )


@pytest.fixture
def restore_cli_threads(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Puts back torch's threads and the thread variables that the CLI's sample sets.

    So that the rest of the session runs as it would without the CLI tests.
    """
    import torch

    from fastrollout.cli import threads as _cli_threads

    for name in _cli_threads.THREAD_ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)
