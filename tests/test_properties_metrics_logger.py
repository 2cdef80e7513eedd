"""Hypothesis properties of MetricsLogger's reductions, merging and state."""

from __future__ import annotations

import math
import pickle

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from fastrollout import MetricsLogger

finite = st.floats(-1e6, 1e6, allow_nan=False)
maybe_nan = st.one_of(finite, st.just(float("nan")))
values = st.lists(maybe_nan, min_size=1, max_size=60)
windows = st.integers(1, 20)


def same(a: float, b: float) -> bool:
    if math.isnan(b):
        return math.isnan(a)
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-6)


def np_reduce(fn, xs):
    xs = np.asarray(xs, dtype=np.float64)
    xs = xs[~np.isnan(xs)]
    return float(fn(xs)) if xs.size else float("nan")


@given(values, windows)
def test_window_reductions_equal_numpy_over_the_last_values(xs, w):
    m = MetricsLogger()
    for reduce in ("mean", "min", "max", "sum"):
        for x in xs:
            m.log_value(reduce, x, reduce=reduce, window=w)
    tail = xs[-w:]
    assert same(m.peek("mean"), np_reduce(np.mean, tail))
    assert same(m.peek("min"), np_reduce(np.min, tail))
    assert same(m.peek("max"), np_reduce(np.max, tail))
    assert same(m.peek("sum"), np_reduce(np.sum, tail))


@given(values)
def test_unwindowed_reductions_equal_numpy_over_everything(xs):
    m = MetricsLogger()
    for reduce in ("mean", "min", "max", "sum"):
        for x in xs:
            m.log_value(reduce, x, reduce=reduce)
    assert same(m.peek("mean"), np_reduce(np.mean, xs))
    assert same(m.peek("min"), np_reduce(np.min, xs))
    assert same(m.peek("max"), np_reduce(np.max, xs))
    assert same(m.peek("sum"), np_reduce(np.sum, xs))


@given(st.lists(finite, min_size=1, max_size=60), windows, st.lists(st.floats(0, 100), max_size=5))
def test_percentiles_equal_numpy_linear(xs, w, ps):
    m = MetricsLogger()
    for x in xs:
        m.log_value("p", x, reduce="percentiles", window=w, percentiles=ps or None)
    got = m.peek("p")
    tail = xs[-w:]
    for p, v in got.items():
        assert math.isclose(v, float(np.percentile(tail, p)), rel_tol=1e-9, abs_tol=1e-6)


@given(values, st.floats(0.001, 1.0))
def test_ema_is_the_recurrence(xs, c):
    m = MetricsLogger()
    want = float("nan")
    for x in xs:
        m.log_value("e", x, reduce="ema", ema_coeff=c)
        if not math.isnan(x):
            want = x if math.isnan(want) else c * x + (1 - c) * want
    assert same(m.peek("e"), want)


@given(st.lists(st.lists(finite, max_size=8), min_size=1, max_size=6))
def test_lifetime_sums_survive_reduce_and_aggregation(batches):
    root = MetricsLogger(root=True)
    runner = MetricsLogger()
    total = 0.0
    for batch in batches:
        for x in batch:
            runner.log_value("n", x, reduce="lifetime_sum")
            total += x
        root.aggregate([runner.reduce()])
        assert runner.peek("n", default=0.0) == 0.0
        assert math.isclose(root.peek("n", default=0.0), total, rel_tol=1e-9, abs_tol=1e-6)
        root.reduce()
        assert math.isclose(root.peek("n", default=0.0), total, rel_tol=1e-9, abs_tol=1e-6)


@given(st.lists(st.lists(finite, max_size=10), min_size=1, max_size=5), st.integers(1, 30))
def test_merged_means_are_the_mean_of_all_windowed_values(per_runner, w):
    root = MetricsLogger(root=True)
    results, pooled = [], []
    for xs in per_runner:
        r = MetricsLogger()
        for x in xs:
            r.log_value("m", x, window=w)
        pooled += xs[-w:]
        results.append(r.reduce())
    root.aggregate(results)
    want = float(np.mean(pooled)) if pooled else float("nan")
    assert same(root.peek("m", default=float("nan")), want)


class LoggerMachine(RuleBasedStateMachine):
    """Random logging and reducing; state round trips and pickles never change a peek."""

    def __init__(self):
        super().__init__()
        self.logger = MetricsLogger()

    @rule(
        key=st.sampled_from(["a", ("g", "b"), ("g", 3)]),
        x=maybe_nan,
        reduce=st.sampled_from(["mean", "min", "max", "sum", "ema", "lifetime_sum"]),
        window=st.one_of(st.none(), windows),
    )
    def log(self, key, x, reduce, window):
        if reduce in ("ema", "lifetime_sum"):
            window = None
        self.logger.log_value(key, x, reduce=reduce, window=window)

    @rule(x=finite)
    def log_percentile(self, x):
        self.logger.log_value("p", x, reduce="percentiles", window=5)

    @rule(item=st.one_of(st.integers(), st.text(max_size=3)))
    def log_item(self, item):
        self.logger.log_value("s", item, reduce="item_series", window=4)

    @rule()
    def reduce(self):
        self.logger.reduce()

    @rule()
    def restore(self):
        before = repr(self.logger.peek())
        fresh = MetricsLogger()
        fresh.set_state(self.logger.get_state())
        assert repr(fresh.peek()) == before
        self.logger = fresh

    @invariant()
    def pickles(self):
        assert repr(pickle.loads(pickle.dumps(self.logger)).peek()) == repr(self.logger.peek())


TestLoggerMachine = LoggerMachine.TestCase
