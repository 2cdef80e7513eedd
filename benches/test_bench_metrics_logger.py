"""MetricsLogger side by side with RLlib 2.60: log_value per reduction, reduce, aggregate.

Run with ``make bench-python``. log_value benchmarks log 100 values per round into an
existing key (the steady state of a runner); reduce benchmarks reduce a logger holding the
metrics an env runner keeps (RLlib's SingleAgentEnvRunner set, 100 episodes' worth) and
aggregate merges the reductions of 8 such runners into a root logger.
"""

from __future__ import annotations

import warnings

import pytest
from ray.rllib.utils.metrics.metrics_logger import MetricsLogger as RLlibLogger

from fastrollout import MetricsLogger

IMPLS = {"rllib": RLlibLogger, "fastrollout": MetricsLogger}
VALUES = [float(i % 17) * 0.5 for i in range(100)]


# One loop per reduction, with the options written out at the call site as runners do
# (`**opts` would add a dict unpacking per call to both sides).
def _ema(log):
    for v in VALUES:
        log("key", v)


def _mean_window(log):
    for v in VALUES:
        log("key", v, reduce="mean", window=100)


def _mean(log):
    for v in VALUES:
        log("key", v, reduce="mean")


def _min_window(log):
    for v in VALUES:
        log("key", v, reduce="min", window=100)


def _max(log):
    for v in VALUES:
        log("key", v, reduce="max")


def _sum(log):
    for v in VALUES:
        log("key", v, reduce="sum")


def _lifetime_sum(log):
    for v in VALUES:
        log("key", v, reduce="lifetime_sum")


def _percentiles_window(log):
    for v in VALUES:
        log("key", v, reduce="percentiles", window=100)


def _item(log):
    for v in VALUES:
        log("key", v, reduce="item")


LOOPS = {
    "ema": _ema,
    "mean window=100": _mean_window,
    "mean": _mean,
    "min window=100": _min_window,
    "max": _max,
    "sum": _sum,
    "lifetime_sum": _lifetime_sum,
    "percentiles window=100": _percentiles_window,
    "item": _item,
}


@pytest.mark.parametrize("impl", list(IMPLS))
@pytest.mark.parametrize("reduction", list(LOOPS))
def test_log_value(benchmark, impl, reduction):
    benchmark.group = f"metrics log_value x100 ({reduction})"
    logger = IMPLS[impl]()
    loop = LOOPS[reduction]
    loop(logger.log_value)  # creates the key
    benchmark(loop, logger.log_value)
    assert "key" in logger


def _runner(cls, episodes: int = 100):
    m = cls()
    for e in range(episodes):
        ret, length = float(e % 37), 200 + e % 11
        m.log_value("episode_return_mean", ret, window=100)
        m.log_value("episode_return_min", ret, reduce="min", window=100)
        m.log_value("episode_return_max", ret, reduce="max", window=100)
        m.log_value("episode_len_mean", length, window=100)
        m.log_value("episode_duration_sec_mean", 0.01, window=100)
        m.log_value(("agent_episode_return_mean", "agent0"), ret, window=100)
        m.log_value(("module_episode_return_mean", "default_policy"), ret, window=100)
    m.log_value("num_env_steps_sampled", 4000, reduce="sum", with_throughput=True)
    m.log_value("num_env_steps_sampled_lifetime", 4000, reduce="lifetime_sum")
    m.log_value("num_episodes", episodes, reduce="sum")
    m.log_value("sample_time", 0.5)
    m.log_value("episode_len_percentiles", 200, reduce="percentiles", window=100)
    return m


@pytest.mark.parametrize("impl", list(IMPLS))
@pytest.mark.benchmark(group="metrics reduce (a runner's 12 metrics, 100 episodes)")
def test_reduce(benchmark, impl):
    out = benchmark.pedantic(
        lambda m: m.reduce(), setup=lambda: ((_runner(IMPLS[impl]),), {}), rounds=200
    )
    assert "episode_return_mean" in out


@pytest.mark.parametrize("impl", list(IMPLS))
@pytest.mark.benchmark(group="metrics aggregate (8 runners) + peek")
def test_aggregate(benchmark, impl):
    cls = IMPLS[impl]
    results = [_runner(cls).reduce() for _ in range(8)]

    def run():
        root = cls(root=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            root.aggregate(results)
            return root.peek()

    out = benchmark(run)
    # Eight identical runners: the weighted and the plain mean of means agree.
    assert out["episode_return_mean"] == pytest.approx(sum(e % 37 for e in range(100)) / 100)
