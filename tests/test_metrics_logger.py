"""MetricsLogger: every method, every reduction, the errors, and RLlib's bugs pinned."""

from __future__ import annotations

import math
import pickle
import threading
import time
import warnings

import numpy as np
import pytest
import torch
from ray.rllib.utils.metrics.metrics_logger import MetricsLogger as RLlibLogger

import fastrollout
from fastrollout import MetricsLogger
from fastrollout.metrics import StatsSnapshot


def nan(x) -> bool:
    return isinstance(x, float) and math.isnan(x)


def log_all(logger, key, values, **opts):
    for v in values:
        logger.log_value(key, v, **opts)


# --- reductions -----------------------------------------------------------------------


def test_exported():
    assert fastrollout.MetricsLogger is MetricsLogger
    assert "MetricsLogger" in fastrollout.__all__


def test_default_reduce_is_ema_with_coefficient_001():
    m = MetricsLogger()
    assert not m._is_root_logger
    log_all(m, "x", [10.0, 20.0, 30.0])
    want = 10.0
    for v in (20.0, 30.0):
        want = 0.01 * v + 0.99 * want
    assert m.peek("x") == pytest.approx(want)
    assert m.peek("x", compile=False) == [pytest.approx(want)]


def test_ema_coefficient_nan_and_reduce_keeps_value():
    m = MetricsLogger()
    log_all(m, "x", [float("nan"), 2.0, 4.0], reduce="ema", ema_coeff=0.5)
    assert m.peek("x") == 3.0
    out = m.reduce()
    assert out["x"].peek() == 3.0
    assert m.peek("x") == 3.0  # an EMA survives reduce
    m.log_value("x", 5.0)
    assert m.peek("x") == 4.0


def test_ema_without_values_is_nan():
    m = MetricsLogger()
    m.log_value("x", float("nan"))
    assert nan(m.peek("x"))


def test_window_gives_mean_by_default():
    m = MetricsLogger()
    log_all(m, "x", [1, 2, 3, 4, 5], window=3)
    assert m.peek("x") == 4.0
    assert m.reduce(compile=True) == {"x": 4.0}
    assert nan(m.peek("x"))  # series start over after reduce


def test_mean_without_window_is_the_mean_of_everything_since_reduce():
    m = MetricsLogger()
    log_all(m, "x", [1.0, 2.0, 3.0, 6.0, float("nan")], reduce="mean")
    assert m.peek("x") == 3.0
    snap = m.reduce()["x"]
    assert (snap.peek(), snap.count, snap.reduce_method) == (3.0, 4.0, "mean")


@pytest.mark.parametrize(
    ("reduce", "window", "want"),
    [
        ("min", None, -1.0),
        ("min", 3, 3.0),
        ("max", None, 7.0),
        ("max", 3, 4.0),
        ("sum", None, 18.0),
        ("sum", 3, 7.0),
        ("mean", 3, 3.5),
    ],
)
def test_min_max_sum_mean(reduce, window, want):
    m = MetricsLogger()
    log_all(
        m, "x", [5.0, -1.0, 7.0, float("nan"), 3.0, 4.0, float("nan")], reduce=reduce, window=window
    )
    assert m.peek("x") == want
    assert m.peek("x", compile=False) == [want]
    assert m.reduce(compile=True)["x"] == want
    assert nan(m.peek("x"))
    assert nan(m.reduce(compile=True)["x"])


def test_all_nan_window_is_nan():
    m = MetricsLogger()
    log_all(m, "x", [float("nan")] * 3, reduce="max", window=2)
    assert nan(m.peek("x"))


def test_lifetime_sum_resets_below_root_only():
    m = MetricsLogger()
    log_all(m, "n", [1, 2, float("nan")], reduce="lifetime_sum")
    assert m.peek("n") == 3.0
    assert m.reduce(compile=True) == {"n": 3.0}
    assert m.peek("n") == 0.0
    root = MetricsLogger(root=True)
    log_all(root, "n", [1, 2], reduce="lifetime_sum")
    root.reduce()
    root.log_value("n", 4)
    assert root.peek("n") == 7.0


def test_sum_with_clear_on_reduce_false_is_a_lifetime_sum():
    m = MetricsLogger(root=True)
    with pytest.deprecated_call():
        m.log_value("n", 2, reduce="sum", clear_on_reduce=False)
    m.reduce()
    with pytest.deprecated_call():
        m.log_value("n", 3, reduce="sum", clear_on_reduce=False)
    assert m.peek("n") == 5.0
    assert m.reduce()["n"].reduce_method == "lifetime_sum"


def test_percentiles():
    m = MetricsLogger()
    log_all(m, "p", range(1, 12), reduce="percentiles", window=10)  # keeps 2..11
    assert m.peek("p") == {
        0: 2.0,
        50: 6.5,
        75: 8.75,
        90: 10.1,
        95: 10.55,
        99: 10.91,
        100: 11.0,
    } or m.peek("p") == pytest.approx(
        {0: 2.0, 50: 6.5, 75: 8.75, 90: 10.1, 95: 10.55, 99: 10.91, 100: 11.0}
    )
    assert m.peek("p", compile=False) == [float(v) for v in range(2, 12)]
    log_all(m, "q", [3, 1, 2], reduce="percentiles", percentiles=[10, 99.5])
    assert list(m.peek("q")) == [10, 99.5]
    assert m.peek("q") == pytest.approx({10: 1.2, 99.5: 2.99})
    out = m.reduce(compile=True)
    assert out["q"] == pytest.approx({10: 1.2, 99.5: 2.99})
    assert m.peek("q") == {10: None, 99.5: None}
    with pytest.raises(ValueError, match="NaN"):
        m.log_value("q", float("nan"))


def test_percentiles_true_selects_the_defaults():
    # RLlib 2.60 documents percentiles=True but raises for it:
    with pytest.raises(ValueError, match="must be a list or None"):
        RLlibLogger().log_value("p", 1.0, reduce="percentiles", percentiles=True)
    m = MetricsLogger()
    m.log_value("p", 1.0, reduce="percentiles", percentiles=True)
    assert list(m.peek("p")) == [0, 50, 75, 90, 95, 99, 100]


def test_item():
    m = MetricsLogger()
    m.log_value("i", {"a": 1}, reduce="item")
    m.log_value("i", "last", reduce="item")
    assert m.peek("i") == "last"
    assert m.peek("i", compile=False) == ["last"]
    assert m.reduce(compile=True) == {"i": "last"}
    assert m.peek("i") is None
    m.log_value("i", torch.tensor(1.5))
    assert m.peek("i") == 1.5 and type(m.peek("i")) is float


def test_item_series():
    m = MetricsLogger()
    assert m.peek("s", default=0) == 0
    log_all(m, "s", ["a", 2, (3,), None], reduce="item_series", window=3)
    assert m.peek("s") == [2, (3,), None]
    assert m.reduce(compile=True) == {"s": [2, (3,), None]}
    assert nan(m.peek("s"))
    assert m.peek("s", compile=False) == []
    assert m.reduce(compile=True) == {"s": []}


def test_numbers_of_every_kind():
    m = MetricsLogger()
    for v in (
        1,
        2.5,
        np.float32(0.5),
        np.int64(3),
        np.bool_(True),
        torch.tensor(2.0),
        torch.tensor([4], dtype=torch.int32),
    ):
        m.log_value("x", v, reduce="sum")
    assert m.peek("x") == 14.0
    with pytest.raises(TypeError, match=r"log_value\('y'\).*str"):
        m.log_value("y", "abc", reduce="sum")
    with pytest.raises(TypeError, match="one-element"):
        m.log_value("z", torch.tensor([1.0, 2.0]), reduce="sum")


def test_float32_windows_reduce_in_float64():
    # RLlib (numpy) reduces an all-float32 window in float32; fastrollout in float64.
    vals = [np.float32(0.1)] * 3
    rl = RLlibLogger()
    for v in vals:
        rl.log_value("x", v, reduce="sum", window=3)
    assert rl.peek("x") == np.float32(0.3)
    m = MetricsLogger()
    log_all(m, "x", vals, reduce="sum", window=3)
    assert m.peek("x") == 3 * float(np.float32(0.1))


# --- keys -----------------------------------------------------------------------------


def test_nested_keys():
    m = MetricsLogger()
    m.log_value(("a", "b"), 1.0, reduce="sum")
    m.log_value(["a", ("c", 7)], 2.0, reduce="sum")
    m.log_value("z", 3.0, reduce="sum")
    m.log_value(("z",), 1.0)
    assert m.peek() == {"a": {"b": 1.0, "c": {7: 2.0}}, "z": 4.0}
    assert m.peek("a") == {"b": 1.0, "c": {7: 2.0}}
    assert m.peek(("a", "c", 7)) == 2.0
    assert ("a", "b") in m and "a" in m and ("a", "x") not in m
    with pytest.raises(ValueError, match=r"\('a', 'b'\) already holds a metric"):
        m.log_value(("a", "b", "c"), 1.0)
    with pytest.raises(ValueError, match="holds nested metrics"):
        m.log_value("a", 1.0)
    with pytest.raises(TypeError, match="str, int or tuples"):
        m.log_value(("a", 1.5), 1.0)
    with pytest.raises(ValueError, match="empty"):
        m.log_value((), 1.0)


def test_peek_missing_keys_and_defaults():
    m = MetricsLogger()
    assert m.peek() == {}
    with pytest.raises(KeyError):
        m.peek("nope")
    assert m.peek("nope", default=3) == 3
    m.log_value(("a", "b"), 1.0)
    m.delete("a", "b")
    assert m.peek("a", default=5) == 5  # an emptied group reads as missing


def test_peek_latest_merged_only_needs_an_aggregated_key():
    m = MetricsLogger()
    m.log_value("x", 1.0)
    with pytest.raises(ValueError, match="latest_merged_only"):
        m.peek("x", latest_merged_only=True)


def test_log_dict():
    m = MetricsLogger()
    m.log_dict({"a": 1.0, "g": {"b": 2.0, "l": [3.0, 5.0]}}, key="pre")
    m.log_dict({"a": 3.0, "g": {"b": 4.0, "l": [5.0, 7.0]}}, key="pre")
    assert m.peek("pre") == {"a": 2.0, "g": {"b": 3.0, "l": {0: 4.0, 1: 6.0}}}
    m.log_dict({"s": 1}, reduce="sum")
    m.log_dict({"s": 1}, reduce="sum")
    assert m.peek("s") == 2.0
    with pytest.raises(TypeError, match="takes a dict"):
        m.log_dict([1.0])  # type: ignore[arg-type]


# --- options --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("opts", "match"),
    [
        ({"reduce": "ema", "window": 3}, "window is not supported for reduce='ema'"),
        ({"reduce": "mean", "ema_coeff": 0.1}, "use reduce='ema'"),
        ({"reduce": "max", "ema_coeff": 0.1}, "ema_coeff is not supported"),
        ({"reduce": "ema", "ema_coeff": 0.0}, r"ema_coeff must be in \(0, 1\]"),
        ({"reduce": "mean", "percentiles": [50]}, "percentiles is only supported"),
        ({"reduce": "percentiles", "percentiles": [150]}, r"in \[0, 100\]"),
        ({"reduce": "mean", "with_throughput": True}, "with_throughput=True is only"),
        ({"reduce": "median"}, "invalid reduce method 'median'"),
        ({"window": 0}, "positive int"),
        ({"window": 2.5}, "positive int"),
        ({"reduce": "lifetime_sum", "window": 3}, "window is not supported"),
        ({"reduce": "item", "window": 3}, "window is not supported"),
        ({"throughput_ema_coeff": 0.1}, "throughput_ema_coeff"),
    ],
)
def test_invalid_options(opts, match):
    m = MetricsLogger()
    with pytest.raises(ValueError, match=match):
        m.log_value("x", 1.0, **opts)
    assert "x" not in m


def test_options_of_an_existing_key_are_ignored():
    m = MetricsLogger()
    m.log_value("x", 1.0, reduce="sum")
    m.log_value("x", 2.0, reduce="max", window=1)
    assert m.peek("x") == 3.0


def test_infinite_window_means_no_window():
    m = MetricsLogger()
    log_all(m, "x", range(100), window=float("inf"))
    assert m.peek("x") == 49.5


def test_deprecated_options_warn():
    m = MetricsLogger()
    with pytest.deprecated_call():
        m.log_value("x", 1.0, reduce="mean", clear_on_reduce=True)
    with pytest.deprecated_call():
        m.log_value("y", 1.0, reduce_per_index_on_aggregate=True)
    assert m.peek("x") == 1.0


# --- reduce / aggregate ---------------------------------------------------------------


def _runner(returns, steps):
    m = MetricsLogger()
    for r in returns:
        m.log_value("episode_return_mean", r, window=100)
        m.log_value("episode_return_max", r, reduce="max")
    m.log_value("num_env_steps", steps, reduce="sum")
    m.log_value("lifetime_steps", steps, reduce="lifetime_sum")
    m.log_value("loss_ema", steps / 10)
    return m


def test_aggregate_into_root():
    a, b = _runner([1, 2, 3, 4, 5], 100), _runner([15], 50)
    results = [a.reduce(), b.reduce()]
    assert isinstance(results[0]["episode_return_mean"], StatsSnapshot)
    root = MetricsLogger(root=True)
    root.aggregate(results)
    assert root.peek() == {
        "episode_return_mean": 5.0,  # the mean of all six returns
        "episode_return_max": 15.0,
        "num_env_steps": 150.0,
        "lifetime_steps": 150.0,
        "loss_ema": 7.5,  # EMAs merge as the mean of the EMAs, as in RLlib
    }
    root.reduce()
    root.aggregate([a.reduce()])  # nothing logged since: NaN series, zero lifetime sum
    peek = root.peek()
    assert nan(peek["episode_return_mean"]) and peek["lifetime_steps"] == 150.0
    assert root.peek("lifetime_steps", latest_merged_only=True) == 0.0


def test_rllib_averages_merged_means():
    # RLlib's root gives the mean of the runners' means: (3 + 15) / 2.
    runners = []
    for returns in ([1, 2, 3, 4, 5], [15]):
        rl = RLlibLogger()
        for r in returns:
            rl.log_value("ret", r, window=100)
        runners.append(rl.reduce())
    rl_root = RLlibLogger(root=True)
    rl_root.aggregate(runners)
    assert rl_root.peek("ret") == 9.0
    root = MetricsLogger(root=True)
    root.aggregate([_runner([1, 2, 3, 4, 5], 1).reduce(), _runner([15], 1).reduce()])
    assert root.peek("episode_return_mean") == 5.0


def test_aggregate_with_key_and_through_an_intermediate():
    mid, root = MetricsLogger(), MetricsLogger(root=True)
    mid.aggregate([_runner([1.0], 10).reduce(), _runner([3.0], 30).reduce()], key="runners")
    assert mid.peek(("runners", "num_env_steps")) == 40.0
    root.aggregate([mid.reduce()], key=("env", "group"))
    assert root.peek(("env", "group", "runners", "episode_return_mean")) == 2.0
    assert root.peek(("env", "group", "runners", "lifetime_steps")) == 40.0
    assert mid.peek(("runners", "lifetime_steps")) == 0.0  # not root: reset


def test_merge_and_log_n_dicts_is_the_deprecated_name():
    root = MetricsLogger(root=True)
    with pytest.deprecated_call():
        root.merge_and_log_n_dicts([_runner([2.0], 5).reduce()])
    assert root.peek("num_env_steps") == 5.0


def test_aggregate_errors():
    root = MetricsLogger(root=True)
    root.log_value("x", 1.0, reduce="sum")
    src = MetricsLogger()
    src.log_value("x", 1.0, reduce="sum")
    with pytest.raises(ValueError, match="logged to directly"):
        root.aggregate([src.reduce()])
    with pytest.raises(TypeError, match="reduce\\(\\)"):
        root.aggregate([{"y": 1.0}])
    with pytest.raises(TypeError, match="list of dicts"):
        root.aggregate([1.0])  # type: ignore[list-item]
    other = MetricsLogger()
    other.log_value("y", 1.0, reduce="max")
    root.aggregate([other.reduce()])
    with pytest.raises(ValueError, match="cannot log values"):
        root.log_value("y", 2.0)
    ema = MetricsLogger()
    ema.log_value("y", 1.0)
    with pytest.raises(ValueError, match=r"\('y',\).*different kind"):
        root.aggregate([ema.reduce()])
    items = [MetricsLogger(), MetricsLogger()]
    for it in items:
        it.log_value("i", 1, reduce="item")
    with pytest.raises(ValueError, match="exactly one logger"):
        root.aggregate([it.reduce() for it in items])
    assert "i" not in root  # a failing aggregate changes nothing
    good, bad = MetricsLogger(), MetricsLogger()
    good.log_value("n", 1.0, reduce="sum")
    bad.log_value(("y", "z"), 1.0, reduce="max")
    before = root.peek()
    with pytest.raises(ValueError, match="already holds a metric"):
        root.aggregate([good.reduce(), bad.reduce()])
    assert root.peek() == before


def test_snapshots_pickle_and_convert():
    m = MetricsLogger()
    log_all(m, "x", [1.0, 2.0], window=5)
    m.log_value("p", 1.0, reduce="percentiles")
    m.log_value("s", "a", reduce="item_series")
    res = m.reduce()
    back = pickle.loads(pickle.dumps(res))
    assert MetricsLogger.peek_results(back) == MetricsLogger.peek_results(res)
    assert float(back["x"]) == 1.5 and back["x"].count == 2.0 and back["p"].count is None
    assert "mean" in repr(back["x"])
    with pytest.raises(ValueError, match="not a single number"):
        float(back["p"])
    assert StatsSnapshot.from_state(res["s"].get_state()).peek() == ["a"]
    assert MetricsLogger.peek_results([res["x"], 3], compile=False) == [[1.5], 3]


# (log_value options, values) for one key each; reduce() leaves are compared with RLlib's.
SNAPSHOT_CASES = {
    "mean": ({"window": 3}, [1.0, 2.5, 4.0, 7.0]),
    "ema": ({"reduce": "ema", "ema_coeff": 0.5}, [1.0, 3.0]),
    "min": ({"reduce": "min"}, [4.0, -2.0]),
    "max": ({"reduce": "max", "window": 2}, [9.0, 1.0, 2.0]),
    "sum": ({"reduce": "sum", "with_throughput": True}, [1.5, 2.0]),
    "life": ({"reduce": "lifetime_sum"}, [3.0, 4.0]),
    "item": ({"reduce": "item"}, [7, 5]),
    "series": ({"reduce": "item_series"}, [1.0, 2.0]),
    "pct": ({"reduce": "percentiles", "percentiles": [50]}, [1.0, 2.0, 4.0]),
}


def _reduced_pair():
    fr, rl = MetricsLogger(), RLlibLogger()
    for key, (opts, values) in SNAPSHOT_CASES.items():
        log_all(fr, key, values, **opts)
        log_all(rl, key, values, **opts)
    return fr.reduce(), rl.reduce()


def test_snapshots_compare_and_convert_like_rllibs_reduced_stats():
    fr_res, rl_res = _reduced_pair()
    for key in ("mean", "ema", "min", "max", "sum", "life", "item"):
        s, r = fr_res[key], rl_res[key]
        v = float(r)
        assert float(s) == v and int(s) == int(r), key
        assert s == r and s == v and (s != v) is False and s == s, key  # by value, as RLlib's
        assert s < v + 1 and s <= v and s > v - 1 and s >= v and v + 1 > s, key
        assert (s + 1, 1 + s, s - 1, 1 - s, s * 2, 2 * s) == (
            v + 1,
            1 + v,
            v - 1,
            1 - v,
            2 * v,
            2 * v,
        )
        assert f"{s:.3f}" == f"{r:.3f}" and f"{s}" == f"{v}", key
        assert len(s) == len(r) == 1, key
        assert s.reduce() == v and s.reduce(compile=False) is s, key
        assert float(np.asarray(s)) == v, key
    assert int(fr_res["item"]) == 5 and type(int(fr_res["item"])) is int
    assert fr_res["min"] != 5.0 and fr_res["min"] != "x" and fr_res["min"] != None  # noqa: E711
    with pytest.raises(TypeError):
        hash(fr_res["mean"])  # equal by value, so not hashable
    with pytest.raises(TypeError):
        _ = fr_res["min"] < "x"
    # Results that are not one number: RLlib's len() and the value's own comparisons.
    series, pct = fr_res["series"], fr_res["pct"]
    assert len(series) == len(rl_res["series"]) == 2 and len(pct) == len(rl_res["pct"]) == 3
    assert series == [1.0, 2.0] and pct == {50: 2.0} and series != pct
    assert series.reduce() == [1.0, 2.0] and f"{series}" == "[1.0, 2.0]"
    for bad in (series, pct):
        with pytest.raises(ValueError, match="not a single number"):
            float(bad)
        with pytest.raises(ValueError, match="not a single number"):
            int(bad)
    with pytest.raises(TypeError):
        _ = series + 1
    empty = MetricsLogger()
    empty.log_value("s", 1, reduce="item_series")
    empty.reduce()
    nothing = empty.reduce()["s"]
    assert nan(nothing.peek()) and nothing.reduce() == [] and len(nothing) == 0
    with pytest.raises(ValueError, match="copy=False"):
        np.asarray(fr_res["mean"], copy=False)


def test_rllib_check_reads_reduce_results():
    from ray.rllib.utils.test_utils import check

    fr_res, rl_res = _reduced_pair()
    # RLlib's check cannot compare percentiles (dict minus dict), its own results neither.
    del fr_res["pct"], rl_res["pct"]
    check(fr_res, rl_res)
    check(fr_res, RLlibLogger.peek_results(rl_res))
    check(fr_res["mean"], 4.5)
    check(fr_res["series"], [1.0, 2.0])
    check(fr_res["mean"], 4.0, false=True)
    with pytest.raises(AssertionError):
        check(fr_res["mean"], 4.0)
    with pytest.raises(AssertionError):
        check(fr_res["series"], [1.0, 3.0])


def test_unwindowed_sum_of_only_nans_is_nan():
    # RLlib 2.60's running nansum makes two or more NaNs (and nothing else) 0.0, while one
    # NaN alone, or any number of them in a windowed sum, stays NaN; fastrollout gives NaN.
    fr, rl = MetricsLogger(), RLlibLogger()
    for logger in (fr, rl):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            log_all(logger, "s", [math.nan, math.nan], reduce="sum")
    assert rl.peek("s") == 0.0
    assert nan(fr.peek("s"))


# --- timing, set_value, delete, reset, state ------------------------------------------


def test_log_time():
    m = MetricsLogger()
    timer = m.log_time("t", reduce="sum")
    assert "t" in m
    for _ in range(2):
        with timer:
            time.sleep(0.002)
    assert 0.004 <= m.peek("t") < 5.0
    with m.log_time(("g", "t")):
        pass
    assert m.peek(("g", "t")) >= 0.0
    with pytest.deprecated_call():
        m.log_time("u", clear_on_reduce=True)


def test_set_value():
    # RLlib 2.60 removed set_value (it raises); fastrollout keeps its older meaning.
    with pytest.raises(ValueError, match="deprecated"):
        RLlibLogger().set_value("x", 1.0)
    m = MetricsLogger()
    log_all(m, "x", [1.0, 2.0, 3.0], reduce="max", window=3)
    m.set_value("x", 0.5)
    assert m.peek("x") == 0.5
    m.set_value("new", 2, reduce="sum")
    assert m.peek("new") == 2.0
    m.log_value("i", "a", reduce="item_series")
    m.set_value("i", "b")
    assert m.peek("i") == ["b"]


def test_delete_and_reset():
    m = MetricsLogger()
    m.log_value(("a", "b"), 1.0)
    m.log_value(("a", "c"), 1.0)
    m.log_value("d", 1.0)
    m.delete("a", "b")
    assert m.peek() == {"a": {"c": 1.0}, "d": 1.0}
    m.delete(("a",))
    assert m.peek() == {"d": 1.0}
    with pytest.raises(KeyError):
        m.delete("a")
    m.delete("a", key_error=False)
    m.log_value("d", 3.0, reduce="sum")  # a stale key cache must not resurrect old slots
    m.reset()
    assert m.peek() == {}
    m.log_value("d", 3.0, reduce="sum")
    assert m.peek("d") == 3.0


def test_state_round_trip_and_pickle():
    m = MetricsLogger(root=True)
    log_all(m, "w", [1.0, 2.0, 3.0], window=2)
    log_all(m, ("g", 1), [4.0, 5.0], reduce="ema", ema_coeff=0.5)
    m.log_value("l", 3, reduce="lifetime_sum", with_throughput=True)
    m.log_value("p", 3, reduce="percentiles", window=3)
    m.log_value("i", [1, 2], reduce="item")
    m.log_value("s", "x", reduce="item_series")
    root_agg = MetricsLogger(root=True)
    root_agg.aggregate([m.reduce()], key="agg")
    for logger in (m, root_agg):
        logger.log_value("w2", 1.0, window=2)
        state = logger.get_state()
        for restored in (pickle.loads(pickle.dumps(logger)), MetricsLogger(root=True)):
            if not restored.peek():
                restored.set_state(state)
            assert repr(restored.peek()) == repr(logger.peek())
            assert restored._is_root_logger
    m2 = pickle.loads(pickle.dumps(m))
    m.log_value("w2", 5.0)
    m2.log_value("w2", 5.0)
    assert m2.peek("w2") == m.peek("w2") == 3.0
    with pytest.raises(KeyError, match="state is missing"):
        MetricsLogger().set_state({"stats": [(("x",), {})]})


# --- throughput -----------------------------------------------------------------------


def test_throughputs():
    t0 = time.perf_counter()
    root = MetricsLogger(root=True)
    root.log_value("steps", 100, reduce="sum", with_throughput=True)
    root.log_value(("g", "life"), 50, reduce="lifetime_sum", with_throughput=True)
    root.log_value("plain", 1.0, reduce="sum")
    time.sleep(0.01)
    tp = root.peek("steps", throughput=True)
    elapsed = time.perf_counter() - t0
    assert 100 / elapsed <= tp <= 100 / 0.01
    life = root.peek(("g", "life"), throughput=True)
    # The bound's time is taken after this peek too: a pause of the VM between the first
    # peek and this one would otherwise make the measured rate lower than 50 / elapsed.
    elapsed = time.perf_counter() - t0
    assert set(life) == {"throughput_since_last_reduce", "throughput_since_last_restore"}
    assert 50 / elapsed <= life["throughput_since_last_reduce"] <= 50 / 0.01
    everything = root.peek(throughput=True)
    assert set(everything) == {"steps_throughput", "g"}
    assert set(everything["g"]) == {"life_throughput"}
    assert set(root.peek("g", throughput=True)) == {"life_throughput"}
    assert root.peek("nope", throughput=True, default=-1) == -1
    with pytest.raises(ValueError, match="does not track a throughput"):
        root.peek("plain", throughput=True)
    root.reduce()
    assert root.peek(("g", "life"), throughput=True)["throughput_since_last_reduce"] == 0.0
    compiled = root.compile()
    assert compiled["steps"] != compiled["steps"] and "steps_throughput" in compiled
    leaf = MetricsLogger()
    leaf.log_value("steps", 1, reduce="sum", with_throughput=True)
    with pytest.raises(ValueError, match="root logger"):
        leaf.peek("steps", throughput=True)
    compiled = leaf.compile()  # as RLlib, compile() adds throughputs in any logger
    assert compiled["steps"] == 1.0 and compiled["steps_throughput"] > 0


def test_group_throughputs_are_named_like_all_throughputs():
    # RLlib names them "<key>_throughputs" for a group key (and "<key>_throughput" for
    # peek(throughput=True) of everything), and drops the lifetime sums' dicts.
    rl = RLlibLogger(root=True)
    rl.log_value(("g", "l"), 2, reduce="lifetime_sum", with_throughput=True)
    rl.log_value(("g", "s"), 2, reduce="sum", with_throughput=True)
    assert set(rl.peek("g", throughput=True)) == {"s_throughputs"}
    m = MetricsLogger(root=True)
    m.log_value(("g", "l"), 2, reduce="lifetime_sum", with_throughput=True)
    m.log_value(("g", "s"), 2, reduce="sum", with_throughput=True)
    assert set(m.peek("g", throughput=True)) == {"l_throughput", "s_throughput"}
    assert m.peek("g", throughput=True).keys() == m.peek(throughput=True)["g"].keys()


def test_tensor_mode_is_a_no_op():
    m = MetricsLogger()
    m.activate_tensor_mode()
    m.deactivate_tensor_mode()
    assert m.peek() == {}


# --- threads --------------------------------------------------------------------------


def test_threads_lose_no_values():
    m = MetricsLogger()
    n, per = 4, 2000

    def work(i):
        for j in range(per):
            m.log_value("total", 1, reduce="sum")
            m.log_value(("per", i), j, reduce="max")
            if j % 500 == 0:
                m.peek()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(n)]
    with warnings.catch_warnings():
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert m.peek("total") == n * per
    assert m.peek("per") == {i: per - 1.0 for i in range(n)}


# --- torch tensors --------------------------------------------------------------------


def test_tensors_stay_unread_until_the_next_read():
    # As RLlib, mean/min/max/sum keep logged tensors (on their device) until a peek or
    # reduce, which moves them to the host in one transfer: no device sync per log_value.
    m = MetricsLogger()
    t = torch.tensor(1.0)
    m.log_value("x", t, reduce="mean", window=10)
    t.fill_(5.0)  # the logged tensor has not been read yet
    assert m.peek("x") == 5.0
    t.fill_(7.0)  # read now: later changes no longer matter
    assert m.peek("x") == 5.0


def test_tensors_and_numbers_keep_their_order():
    m = MetricsLogger()
    for v in (torch.tensor(1.0), 2.0, torch.tensor(3, dtype=torch.int64), torch.tensor([4.0])):
        m.log_value("w", v, reduce="mean", window=2)
        m.log_value("s", v, reduce="sum")
        m.log_value("e", v, reduce="ema", ema_coeff=0.5)
    assert m.peek("w") == 3.5
    assert m.peek("s") == 10.0
    assert m.peek("e") == 3.125
    m.log_value("w", torch.tensor(9.0))
    restored = pickle.loads(pickle.dumps(m))
    assert restored.peek("w") == 6.5
    m.log_value("w", torch.tensor(1.0))
    assert m.reduce(compile=True)["w"] == 5.0
    m.log_value("w", torch.tensor(1.0))
    m.reset()
    assert m.peek() == {}
    m.log_value("w", torch.tensor(2.0), window=3)
    m.set_value("w", 1.0)
    assert m.peek("w") == 1.0
    m.log_value("w", torch.tensor(2.0))
    m.delete("w")
    assert "w" not in m


def test_tensors_reach_throughputs_and_state():
    root = MetricsLogger(root=True)
    root.log_value("n", torch.tensor(4.0), reduce="sum", with_throughput=True)
    assert root.peek("n", throughput=True) > 0
    root.log_value("m", torch.tensor(4.0), reduce="max")
    state = root.get_state()
    fresh = MetricsLogger(root=True)
    fresh.set_state(state)
    assert fresh.peek("m") == 4.0


def test_deepcopy_and_subclasses():
    import copy

    class MyLogger(MetricsLogger):
        pass

    m = MyLogger(root=True)
    m.log_value("x", 2.0, reduce="sum")
    c = copy.deepcopy(m)
    assert type(c) is MyLogger and c._is_root_logger and c.peek("x") == 2.0
    c.log_value("x", 1.0)
    assert (m.peek("x"), c.peek("x")) == (2.0, 3.0)
