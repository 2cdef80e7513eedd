"""fastrollout's metrics inside RLlib 2.60: reduce() results as RLlib Stats, RLlib states.

- ``to_rllib_results``: the same random values logged into N fastrollout loggers and N
  RLlib loggers; the converted fastrollout results and RLlib's own results are aggregated
  into two RLlib root loggers over several rounds, and everything they report (peek,
  compiled or not, throughputs on a frozen clock, root reduce) must be the same, as must
  the converted Stats' states.
- ``MetricsLogger.set_state`` with RLlib's ``get_state()`` (2.60 and legacy states): the
  restored fastrollout logger must report what the restored RLlib logger reports, then and
  after more values and merges.
"""

from __future__ import annotations

import math
import subprocess
import sys
import warnings
from collections import deque
from contextlib import contextmanager
from types import SimpleNamespace
from unittest import mock

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from ray.rllib.utils.metrics import metrics_logger as rl_metrics_logger
from ray.rllib.utils.metrics.metrics_logger import MetricsLogger as RLlibLogger
from ray.rllib.utils.metrics.stats import (
    EmaStats,
    ItemSeriesStats,
    ItemStats,
    LifetimeSumStats,
    MaxStats,
    MeanStats,
    MinStats,
    PercentilesStats,
    StatsBase,
    SumStats,
)
from ray.rllib.utils.metrics.stats import lifetime_sum as rl_lifetime_sum
from ray.rllib.utils.metrics.stats import sum as rl_sum

from fastrollout import MetricsLogger
from fastrollout.metrics import StatsSnapshot, to_rllib_results

# name -> log_value options, one per reduction and setting.
CONFIGS = {
    "mean_window": {"reduce": "mean", "window": 3},
    "mean_all": {"reduce": "mean"},
    "ema": {"reduce": "ema", "ema_coeff": 0.3},
    "ema_default": {},
    "min": {"reduce": "min"},
    "min_window": {"reduce": "min", "window": 2},
    "max": {"reduce": "max"},
    "max_window": {"reduce": "max", "window": 4},
    "sum": {"reduce": "sum"},
    "sum_window": {"reduce": "sum", "window": 3},
    "sum_throughput": {"reduce": "sum", "with_throughput": True},
    "lifetime_sum": {"reduce": "lifetime_sum"},
    "lifetime_sum_throughput": {"reduce": "lifetime_sum", "with_throughput": True},
    "percentiles": {"reduce": "percentiles"},
    "percentiles_window": {"reduce": "percentiles", "window": 5, "percentiles": [10, 50, 99.5]},
    "item": {"reduce": "item"},
    "item_series": {"reduce": "item_series"},
    "item_series_window": {"reduce": "item_series", "window": 2},
}
CLASSES = {
    "mean": MeanStats,
    "ema": EmaStats,
    "min": MinStats,
    "max": MaxStats,
    "sum": SumStats,
    "lifetime_sum": LifetimeSumStats,
    "percentiles": PercentilesStats,
    "item": ItemStats,
    "item_series": ItemSeriesStats,
}


def _reduce_name(opts):
    return opts.get("reduce", "ema")


def _values(opts):
    finite = st.floats(-1e3, 1e3, allow_nan=False, allow_infinity=False)
    if _reduce_name(opts) in ("percentiles", "item", "item_series"):
        return finite  # RLlib rejects NaN in percentiles
    return st.one_of(finite, st.integers(-5, 5), st.just(math.nan))


def nan_sum_quirk(opts, cycle):
    """Whether RLlib sums this reduce cycle's values to 0.0 where fastrollout gives NaN: an
    unwindowed sum of two or more values that are all NaN (RLlib's running nansum; one
    NaN alone stays NaN there too; test_metrics_logger pins the difference)."""
    return (
        _reduce_name(opts) == "sum"
        and opts.get("window") is None
        and len(cycle) >= 2
        and all(isinstance(v, float) and math.isnan(v) for v in cycle)
    )


@contextmanager
def quiet():
    # RLlib's nan-reductions warn on all-NaN slices; its deprecations log warnings.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


@contextmanager
def frozen_clock(t0=1000.0):
    """RLlib's throughput clock, set by hand: both root loggers read the same times."""
    clock = SimpleNamespace(t=t0)
    fake = SimpleNamespace(perf_counter=lambda: clock.t)
    with (
        mock.patch.object(rl_sum, "time", fake),
        mock.patch.object(rl_lifetime_sum, "time", fake),
        mock.patch.object(rl_metrics_logger, "time", fake),
    ):
        yield clock


def same(a, b, path=()):
    """Equal up to float tolerance, NaN == NaN, numpy scalars as floats, deques as lists."""
    assert not isinstance(a, StatsBase | StatsSnapshot), path
    if isinstance(b, dict):
        assert isinstance(a, dict), f"{path}: {a!r} vs {b!r}"
        assert set(a) == set(b), f"{path}: keys {sorted(map(str, a))} vs {sorted(map(str, b))}"
        for k in b:
            same(a[k], b[k], (*path, k))
    elif isinstance(b, list | tuple | deque):
        assert isinstance(a, list | tuple | deque), f"{path}: {a!r} vs {b!r}"
        assert len(a) == len(b), f"{path}: {a!r} vs {b!r}"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            same(x, y, (*path, i))
    elif b is None or isinstance(b, str | bool):
        assert a == b, f"{path}: {a!r} vs {b!r}"
    else:
        x, y = float(a), float(b)
        if math.isnan(y):
            assert math.isnan(x), f"{path}: {x} vs nan"
        else:
            assert math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-9), f"{path}: {x} vs {y}"


def comparable_state(stats):
    """A Stats object's state; NaN left out of value lists (RLlib's min/max without a
    window hold [] when nothing was logged and [nan] when only NaN was: both peek NaN)."""
    state = dict(stats.get_state())
    if "values" in state and state["stats_cls_identifier"] != "percentiles":
        state["values"] = [v for v in state["values"] if not math.isnan(v)]
    return state


# --- to_rllib_results -----------------------------------------------------------------


@pytest.mark.parametrize("name", list(CONFIGS))
@settings(max_examples=20)
@given(data=st.data())
def test_converted_results_aggregate_in_rllib_as_rllibs_own(name, data):
    opts = CONFIGS[name]
    reduce_name = _reduce_name(opts)
    # RLlib's ItemStats merges the item of exactly one logger.
    n = 1 if reduce_name == "item" else data.draw(st.integers(1, 3), label="runners")
    rounds = data.draw(
        st.lists(
            st.tuples(
                st.lists(st.lists(_values(opts), max_size=5), min_size=n, max_size=n),
                st.booleans(),  # whether the root reduces after this round
            ),
            min_size=1,
            max_size=4,
        ),
        label="rounds",
    )
    assume(not any(nan_sum_quirk(opts, vs) for per_runner, _ in rounds for vs in per_runner))
    key = ("group", name)
    with quiet(), frozen_clock() as clock:
        fr_runners = [MetricsLogger() for _ in range(n)]
        rl_runners = [RLlibLogger() for _ in range(n)]
        root_fr, root_rl = RLlibLogger(root=True), RLlibLogger(root=True)
        for r, (per_runner, root_reduces) in enumerate(rounds):
            clock.t += 1.0
            for fr, rl, values in zip(fr_runners, rl_runners, per_runner, strict=True):
                for v in values:
                    fr.log_value(key, v, **opts)
                    rl.log_value(key, v, **opts)
            converted = [to_rllib_results(fr.reduce()) for fr in fr_runners]
            own = [rl.reduce() for rl in rl_runners]
            for c, o in zip(converted, own, strict=True):
                assert set(c) == set(o)
                if o:
                    stats = c["group"][name]
                    assert type(stats) is CLASSES[reduce_name]
                    same(comparable_state(stats), comparable_state(o["group"][name]), (r,))
            root_fr.aggregate(converted, key="env_runners")
            root_rl.aggregate(own, key="env_runners")
            clock.t += 0.5
            for compile_ in (True, False):
                same(root_fr.peek(compile=compile_), root_rl.peek(compile=compile_), (r,))
            same(root_fr.peek(throughput=True), root_rl.peek(throughput=True), (r, "tp"))
            if root_reduces:
                same(root_fr.reduce(compile=True), root_rl.reduce(compile=True), (r, "red"))


def test_means_merge_as_in_rllib_inside_rllib():
    # Inside RLlib the root averages the runners' means (RLlib's semantics), while
    # fastrollout's own root weights them by their counts.
    runners = []
    for returns in ([1, 2, 3, 4, 5], [15]):
        m = MetricsLogger()
        for x in returns:
            m.log_value("ret", x, window=100)
        runners.append(m.reduce())
    rl_root = RLlibLogger(root=True)
    rl_root.aggregate([to_rllib_results(r) for r in runners])
    assert rl_root.peek("ret") == 9.0
    fr_root = MetricsLogger(root=True)
    fr_root.aggregate(runners)
    assert fr_root.peek("ret") == 5.0


def test_an_aggregating_loggers_results_convert_to_non_leaf_stats():
    runners = []
    for i in range(2):
        m = MetricsLogger()
        m.log_value("s", i + 1.0, reduce="sum", with_throughput=True)
        m.log_value("e", i + 1.0, reduce="ema")
        m.log_value("l", i + 1.0, reduce="lifetime_sum")
        runners.append(m.reduce())
    mid = MetricsLogger()
    mid.aggregate(runners)
    out = to_rllib_results(mid.reduce())
    for k in ("s", "e", "l"):
        assert (out[k].is_root, out[k].is_leaf) == (False, False)
        assert out[k].latest_merged is None
    root = RLlibLogger(root=True)
    with quiet():
        root.aggregate([out])
        assert root.peek() == {"s": 3.0, "e": 1.5, "l": 3.0}
    root_results = MetricsLogger(root=True)
    root_results.log_value("l", 2.0, reduce="lifetime_sum")
    converted = to_rllib_results(root_results.reduce())["l"]
    assert (converted.is_root, converted.is_leaf) == (True, True)


def test_percentile_keys_and_settings_survive():
    m = MetricsLogger()
    for v in range(10):
        m.log_value("p", float(v), reduce="percentiles", window=8, percentiles=[50, 99.9])
    stats = to_rllib_results(m.reduce()["p"])
    assert isinstance(stats, PercentilesStats)
    assert stats._percentiles == [50, 99.9] and type(stats._percentiles[0]) is int
    assert stats._window == 8 and list(stats.values) == [2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0]
    assert stats.peek() == {50: 5.5, 99.9: pytest.approx(8.993)}


def test_a_custom_stats_class_lookup():
    class MyMean(MeanStats):
        pass

    m = MetricsLogger()
    m.log_value("x", 2.0, window=5)
    m.log_value("y", 2.0, reduce="sum")
    lookup = {**rl_metrics_logger.DEFAULT_STATS_CLS_LOOKUP, "mean": MyMean}
    out = to_rllib_results(m.reduce(), stats_cls_lookup=lookup)
    assert type(out["x"]) is MyMean and type(out["y"]) is SumStats
    with pytest.raises(KeyError, match=r"no Stats class for reduce='sum'.*'y'"):
        to_rllib_results(m.reduce(), stats_cls_lookup={"mean": MyMean})


def test_errors_name_the_key():
    m = MetricsLogger()
    m.log_value(("a", "b"), 1.0)
    res = m.reduce()
    assert to_rllib_results({}) == {}
    with pytest.raises(TypeError, match=r"found a float under key \('a', 'c'\)"):
        to_rllib_results({"a": {"b": res["a"]["b"], "c": 1.0}})
    # RLlib Stats already converted stay as they are.
    done = to_rllib_results(res)
    assert to_rllib_results(done)["a"]["b"] is done["a"]["b"]


def test_importing_fastrollout_does_not_import_ray():
    code = (
        "import sys, fastrollout, fastrollout.metrics;"
        "from fastrollout.metrics import to_rllib_results;"
        "assert not [m for m in sys.modules if m == 'ray' or m.startswith('ray.')]"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_without_ray_the_error_names_the_extra(monkeypatch):
    for name in ("ray.rllib.utils.metrics.metrics_logger", "ray.rllib.utils.metrics.stats"):
        monkeypatch.setitem(sys.modules, name, None)
    m = MetricsLogger()
    m.log_value("x", 1.0)
    with pytest.raises(ImportError, match=r"pip install fastrollout\[rllib\]"):
        to_rllib_results(m.reduce())


# --- set_state with RLlib's states ----------------------------------------------------


def _rl_restored(state, root):
    rl = RLlibLogger(root=root)
    rl.set_state(state)
    return rl


def _check_same_loggers(fr, rl, label):
    with quiet():
        for compile_ in (True, False):
            same(fr.peek(compile=compile_), rl.peek(compile=compile_), (label, compile_))


@pytest.mark.parametrize("name", list(CONFIGS))
@settings(max_examples=15)
@given(data=st.data())
def test_set_state_reads_rllibs_state(name, data):
    opts = CONFIGS[name]
    values = st.lists(_values(opts), max_size=6)
    logged, more = data.draw(values, label="logged"), data.draw(values, label="more")
    assume(not nan_sum_quirk(opts, logged + more))
    assume(not any(nan_sum_quirk(opts, part) for part in (logged[::2], logged[1::2], more)))
    key = ("a", name)
    with quiet():
        # A runner's logger (leaf stats) and a root that aggregated two runners.
        rl = RLlibLogger()
        for v in logged:
            rl.log_value(key, v, **opts)
        runs = []
        for part in (logged[::2], logged[1::2])[: 1 if _reduce_name(opts) == "item" else 2]:
            r = RLlibLogger()
            for v in part:
                r.log_value(key, v, **opts)
            runs.append(r.reduce())
        root = RLlibLogger(root=True)
        root.aggregate(runs)
    for source, is_root in ((rl, False), (root, True)):
        state = source.get_state()
        fr = MetricsLogger(root=is_root)
        fr.set_state(state)
        rl_back = _rl_restored(state, is_root)
        _check_same_loggers(fr, rl_back, "restored")
        if not state["stats"]:
            continue
        if is_root:
            # More merges into the restored aggregating stats: one value per runner, so
            # fastrollout's weighted means merge as RLlib's means do (item: one runner).
            parts = [more] if _reduce_name(opts) == "item" else [[v] for v in more]
            rl_in, fr_in = [], []
            for part in parts:
                r, f = RLlibLogger(), MetricsLogger()
                for v in part:
                    with quiet():
                        r.log_value(key, v, **opts)
                    f.log_value(key, v, **opts)
                rl_in.append(r.reduce())
                fr_in.append(f.reduce())
            with quiet():
                rl_back.aggregate(rl_in)
            fr.aggregate(fr_in)
        else:
            for v in more:
                fr.log_value(key, v, **opts)
                with quiet():
                    rl_back.log_value(key, v, **opts)
        _check_same_loggers(fr, rl_back, "more")
        if opts.get("with_throughput"):
            assert not is_root or fr.peek(key, throughput=True) is not None
        with quiet():
            same(
                MetricsLogger.peek_results(fr.reduce()),
                RLlibLogger.peek_results(rl_back.reduce()),
                ("reduce",),
            )
        _check_same_loggers(fr, rl_back, "after reduce")


def test_set_state_of_a_mean_stats_state():
    stats = MeanStats(window=10)
    for v in (1.0, 2.0, 3.0):
        stats.push(v)
    m = MetricsLogger()
    m.set_state({"stats": {"m": stats.get_state()}})
    assert m.peek("m") == 2.0
    m.log_value("m", 6.0)
    assert m.peek("m") == 3.0


LEGACY = {
    "mean_window": {"reduce": "mean", "window": 10, "ema_coeff": None, "values": [1, 2, 3]},
    "mean_ema": {"reduce": "mean", "window": None, "ema_coeff": 0.01, "values": [1.0, 5.0]},
    "min": {"reduce": "min", "window": None, "ema_coeff": None, "values": [4.0, 2.0]},
    "max_window": {"reduce": "max", "window": 2, "ema_coeff": None, "values": [1.0, 7.0]},
    "sum": {"reduce": "sum", "window": None, "values": [1.0, np.float64(2.0)]},
    "sum_throughput": {
        "reduce": "sum",
        "window": None,
        "values": [3.0],
        "throughput_stats": {"values": [1.0]},
    },
    "lifetime": {
        "reduce": "sum",
        "window": None,
        "values": [3.0, 4.0],
        "clear_on_reduce": False,
        "throughput_stats": {"values": [1.0]},
    },
    "percentiles": {"reduce": None, "window": 5, "values": [3.0, 1.0, 2.0], "percentiles": [50]},
    "percentiles_named": {
        "reduce": "percentiles",
        "window": None,
        "values": [1.0, 9.0],
        "percentiles": [0, 100],
    },
}


@pytest.mark.parametrize("root", [False, True])
def test_set_state_reads_rllibs_legacy_states(root):
    state = {
        "stats": {
            f"legacy--{k}": {"clear_on_reduce": True, "percentiles": False, **v}
            for k, v in LEGACY.items()
        }
    }
    fr = MetricsLogger(root=root)
    fr.set_state(state)
    with quiet():
        rl = _rl_restored(state, root)
    _check_same_loggers(fr, rl, "legacy")
    assert fr.peek(("legacy", "mean_window")) == 2.0
    assert fr.peek(("legacy", "lifetime")) == (7.0 if root else 0.0)
    if root:
        assert set(fr.peek(("legacy",), throughput=True)) == {
            "sum_throughput_throughput",
            "lifetime_throughput",
        }
    # RLlib 2.60 cannot restore a leaf with window=inf (its deque wants an int).
    inf = {"reduce": "max", "window": float("inf"), "values": [1.0, 3.0, 2.0]}
    fr.set_state({"stats": {"inf": inf}})
    assert fr.peek("inf") == 3.0
    with pytest.warns(DeprecationWarning, match="clear_on_reduce=False"):
        MetricsLogger().set_state(
            {
                "stats": {
                    "m": {"reduce": "max", "window": None, "values": [1.0]}
                    | {"clear_on_reduce": False}
                }
            }
        )


def test_set_state_keeps_its_own_format_and_names_errors():
    m = MetricsLogger()
    m.log_value(("g", 1), 2.0, window=3)
    restored = MetricsLogger()
    restored.set_state(m.get_state())
    assert restored.peek(("g", 1)) == 2.0
    with pytest.raises(TypeError, match="takes the dict"):
        restored.set_state([1])  # type: ignore[arg-type]
    with pytest.raises(KeyError, match="no 'stats'"):
        restored.set_state({})
    bad_cls = {"stats_cls_identifier": "median", "is_root": False, "is_leaf": True}
    with pytest.raises(ValueError, match=r"'x'.*unknown Stats class 'median'"):
        restored.set_state({"stats": {"x": bad_cls}})
    with pytest.raises(KeyError, match="'x' is missing the field 'values'"):
        restored.set_state(
            {"stats": {"x": {"stats_cls_identifier": "mean", "is_root": False, "is_leaf": True}}}
        )
    bad_window = MeanStats(window=3).get_state() | {"window": 0}
    with pytest.raises(ValueError, match=r"'x'.*window must be a positive int"):
        restored.set_state({"stats": {"x": bad_window}})
    with pytest.raises(TypeError, match="expected a Stats state dict"):
        restored.set_state({"stats": {"x": 1.0}})
    with pytest.raises(ValueError, match=r"legacy .* reduce='median'"):
        restored.set_state({"stats": {"x": {"reduce": "median", "values": []}}})
    assert restored.peek(("g", 1)) == 2.0, "a failed set_state changes nothing"


def test_a_runners_metrics_in_rllibs_root_logger():
    # What RLlib's Algorithm does with each runner's get_metrics(): aggregate under
    # "env_runners", peek lifetime counters, compile the results.
    import fastrollout as fr

    config = (
        fr.RunnerConfig()
        .environment("CartPole-v1")
        .env_runners(num_envs_per_env_runner=2, rollout_fragment_length=60)
        .debugging(seed=0)
    )
    runner = fr.SingleAgentEnvRunner(config=config)
    rl_root, fr_root = RLlibLogger(root=True), MetricsLogger(root=True)
    try:
        for _ in range(2):
            runner.sample()
            results = runner.get_metrics()
            with quiet():
                rl_root.aggregate([to_rllib_results(results)], key="env_runners")
            fr_root.aggregate([results], key="env_runners")
            # One runner: fastrollout's weighted means equal RLlib's here.
            same(rl_root.peek(), fr_root.peek())
    finally:
        runner.stop()
    lifetime = ("env_runners", "num_env_steps_sampled_lifetime")
    steps = fr_root.peek(lifetime)
    assert steps >= 240 and rl_root.peek(lifetime) == steps
    with quiet():
        compiled = rl_root.compile()
    assert compiled["env_runners"]["num_env_steps_sampled_lifetime"] == steps
