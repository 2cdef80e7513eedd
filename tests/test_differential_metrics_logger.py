"""fastrollout's MetricsLogger against RLlib 2.60's, over random call sequences.

Several leaf loggers (runners) log values and dicts and reduce; an intermediate logger and
a root logger aggregate their results and reduce in turn; keys get deleted, and runners'
loggers get replaced by copies restored from their state. After every call, ``peek()`` of
every logger (compiled and not) and of every reduce result is compared between the two.

The reference is RLlib 2.60's MetricsLogger with one documented fix passed through its own
``stats_cls_lookup``: merged means are weighted by the number of values behind each mean
(``_WeightedMeanStats`` below). ``test_metrics_logger.py`` pins what unpatched RLlib does.
"""

from __future__ import annotations

import math
import random
import warnings
from collections import deque

import numpy as np
import pytest
import torch
from ray.rllib.utils.metrics.metrics_logger import DEFAULT_STATS_CLS_LOOKUP
from ray.rllib.utils.metrics.metrics_logger import MetricsLogger as RLlibLogger
from ray.rllib.utils.metrics.stats import MeanStats, StatsBase

from fastrollout import MetricsLogger
from fastrollout.metrics import StatsSnapshot


class _WeightedMeanStats(MeanStats):
    """RLlib's MeanStats, but merged means weigh as many as the values behind them."""

    def _weights(self, values=None):
        if values is not None:
            w = getattr(self, "_latest_w", None)
        else:
            values = self.values
            w = getattr(self, "_w", None)
        if w is None or len(w) != len(values):
            w = [1.0] * len(values)
        return list(values), w

    def window_reduce(self, values=None):
        vals, ws = self._weights(values)
        pairs = [(v, w) for v, w in zip(vals, ws, strict=True) if not np.isnan(v) and w > 0]
        if not pairs:
            return [np.nan]
        return [sum(v * w for v, w in pairs) / sum(w for _, w in pairs)]

    def reduce(self, compile=True):
        vals, ws = self._weights()
        count = sum(w for v, w in zip(vals, ws, strict=True) if not np.isnan(v))
        out = super().reduce(compile)
        self._w = None
        if not compile:
            out._w = [count]
        return out

    def merge(self, incoming_stats):
        _, base = self._weights()
        super().merge(incoming_stats)
        incoming = [w for s in incoming_stats for w in s._weights()[1]]
        self._w = base + incoming
        self._latest_w = incoming


LOOKUP = {**DEFAULT_STATS_CLS_LOOKUP, "mean": _WeightedMeanStats}

# Key -> log_value options. Each key keeps its options for the whole run.
CONFIGS = {
    "ema": {},
    "ema_fast": {"reduce": "ema", "ema_coeff": 0.3},
    "mean_w": {"window": 4},
    "mean_all": {"reduce": "mean"},
    "min_w": {"reduce": "min", "window": 3},
    "min_all": {"reduce": "min"},
    "max_w": {"reduce": "max", "window": 5},
    "max_all": {"reduce": "max"},
    "sum_w": {"reduce": "sum", "window": 3},
    "sum_all": {"reduce": "sum"},
    "life": {"reduce": "lifetime_sum"},
    "life_old": {"reduce": "sum", "clear_on_reduce": False},
    "pct": {"reduce": "percentiles", "window": 6, "percentiles": [0, 25, 50, 90, 100]},
    "pct_all": {"reduce": "percentiles"},
    "series": {"reduce": "item_series", "window": 3},
    ("nested", "a"): {"window": 2},
    ("nested", "b"): {"reduce": "sum"},
}
ITEM_KEY = "item"  # logged by leaf 0 only: RLlib merges an item from one logger only.


def _close(a, b, path):
    if isinstance(a, StatsSnapshot) or isinstance(b, StatsBase):
        raise AssertionError(f"{path}: unexpected stats object")
    if isinstance(b, dict):
        assert isinstance(a, dict), f"{path}: {a!r} vs {b!r}"
        assert set(a) == set(b), f"{path}: keys {set(a)} vs {set(b)}"
        for k in b:
            _close(a[k], b[k], (*path, k))
        return
    if isinstance(b, list | tuple | deque):
        assert isinstance(a, list | tuple) and len(a) == len(b), f"{path}: {a!r} vs {b!r}"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _close(x, y, (*path, i))
        return
    if b is None or isinstance(b, str):
        assert a == b, f"{path}: {a!r} vs {b!r}"
        return
    a, b = float(a), float(b)
    if math.isnan(b):
        assert math.isnan(a), f"{path}: {a} vs nan"
    else:
        assert math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9), f"{path}: {a} vs {b}"


def _rl(call, *args, **kwargs):
    # RLlib's reductions warn on all-NaN slices and its deprecated options log warnings.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return call(*args, **kwargs)


def _fr(call, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return call(*args, **kwargs)


def _value(rng: random.Random, key):
    opts = CONFIGS.get(key, {})
    if opts.get("reduce") == "item_series":
        return rng.choice(["a", "b", ("t", 1), 7])
    r = rng.random()
    if r < 0.08 and opts.get("reduce") != "percentiles":
        return float("nan")
    if r < 0.3:
        return rng.randint(-5, 20)
    if r < 0.4:
        # Not float32: numpy (NEP 50) then reduces the whole window in float32, python
        # floats included; fastrollout reduces in float64 (test_metrics_logger pins it).
        return rng.choice([np.float64, np.int64])(rng.randint(-12, 12))
    return rng.uniform(-100, 100)


class Pair:
    def __init__(self, root: bool):
        self.fr = MetricsLogger(root=root)
        self.rl = RLlibLogger(root=root, stats_cls_lookup=LOOKUP)

    def check(self, label):
        _close(self.fr.peek(), _rl(self.rl.peek), (label,))
        _close(self.fr.peek(compile=False), _rl(self.rl.peek, compile=False), (label, "raw"))


def _check_results(fr_res, rl_res, label):
    for compile_ in (True, False):
        _close(
            MetricsLogger.peek_results(fr_res, compile=compile_),
            _rl(RLlibLogger.peek_results, rl_res, compile=compile_),
            (label, "results", compile_),
        )


def run_program(seed: int, steps: int = 100) -> int:
    rng = random.Random(seed)
    leaves = [Pair(root=False) for _ in range(3)]
    mid = Pair(root=False)
    root = Pair(root=True)
    pending: list[tuple] = []
    mid_pending: list[tuple] = []
    keys = list(CONFIGS)
    checks = 0
    for step in range(steps):
        op = rng.random()
        i = rng.randrange(len(leaves))
        leaf = leaves[i]
        if op < 0.55:
            key = rng.choice(keys)
            v = _value(rng, key)
            _fr(leaf.fr.log_value, key, v, **CONFIGS[key])
            _rl(leaf.rl.log_value, key, v, **CONFIGS[key])
        elif op < 0.62 and i == 0:
            v = rng.choice(["x", 3, None, (1, 2)])
            leaf.fr.log_value(ITEM_KEY, v, reduce="item")
            _rl(leaf.rl.log_value, ITEM_KEY, v, reduce="item")
        elif op < 0.7:
            d = {"dict": {"x": _value(rng, None), "y": {"z": _value(rng, None)}}}
            leaf.fr.log_dict(d, key="ld")
            _rl(leaf.rl.log_dict, d, key="ld")
        elif op < 0.82:
            fr_res, rl_res = leaf.fr.reduce(), _rl(leaf.rl.reduce)
            _check_results(fr_res, rl_res, f"leaf{i} reduce")
            pending = [p for p in pending if p[0] != i] + [(i, fr_res, rl_res)]
        elif op < 0.9 and pending:
            target = mid if rng.random() < 0.5 else root
            target.fr.aggregate([p[1] for p in pending])
            _rl(target.rl.aggregate, [p[2] for p in pending])
            pending = []
        elif op < 0.95:
            fr_res, rl_res = mid.fr.reduce(), _rl(mid.rl.reduce)
            _check_results(fr_res, rl_res, "mid reduce")
            if fr_res:
                mid_pending = [(fr_res, rl_res)]
            if mid_pending and rng.random() < 0.7:
                root.fr.aggregate([mid_pending[0][0]], key="via_mid")
                _rl(root.rl.aggregate, [mid_pending[0][1]], key="via_mid")
                mid_pending = []
        elif op < 0.97:
            fr_res, rl_res = root.fr.reduce(), _rl(root.rl.reduce)
            _check_results(fr_res, rl_res, "root reduce")
        elif op < 0.985:
            target = rng.choice([*leaves, root])
            key = rng.choice(keys)
            target.fr.delete(key, key_error=False)
            _rl(target.rl.delete, key, key_error=False)
        else:
            # fastrollout's logger is swapped for a copy restored from its state.
            restored = MetricsLogger()
            restored.set_state(leaf.fr.get_state())
            leaf.fr = restored
        for n, p in enumerate([*leaves, mid, root]):
            p.check(f"seed {seed} step {step} logger {n}")
            checks += 1
    # The same final numbers after a state round trip.
    for p in [*leaves, mid, root]:
        restored = MetricsLogger(root=p.fr._is_root_logger)
        restored.set_state(p.fr.get_state())
        _close(restored.peek(), _rl(p.rl.peek), (seed, "restored"))
    return checks


@pytest.mark.parametrize("seed", range(16))
def test_random_programs_match_rllib(seed):
    assert run_program(seed) > 0


def test_latest_merged_only_matches_rllib():
    fr_root, rl_root = MetricsLogger(root=True), RLlibLogger(root=True, stats_cls_lookup=LOOKUP)
    for rnd in range(3):
        fr_res, rl_res = [], []
        for j in range(2):
            fr, rl = MetricsLogger(), RLlibLogger(stats_cls_lookup=LOOKUP)
            for key, opts in CONFIGS.items():
                for k in range(j + rnd + 1):
                    v = float(k * 3 - j) if opts.get("reduce") != "item_series" else k
                    fr.log_value(key, v, **opts) if "clear_on_reduce" not in opts else None
                    if "clear_on_reduce" not in opts:
                        _rl(rl.log_value, key, v, **opts)
            fr_res.append(fr.reduce())
            rl_res.append(_rl(rl.reduce))
        fr_root.aggregate(fr_res)
        _rl(rl_root.aggregate, rl_res)
        for key in CONFIGS:
            if "clear_on_reduce" in CONFIGS[key]:
                continue
            for compile_ in (True, False):
                _close(
                    fr_root.peek(key, compile=compile_, latest_merged_only=True),
                    _rl(rl_root.peek, key, compile=compile_, latest_merged_only=True),
                    (rnd, key, compile_),
                )


def test_torch_values_match_rllib():
    # RLlib reduces torch tensors in float32, hence the tolerance.
    fr, rl = MetricsLogger(), RLlibLogger()
    rng = np.random.default_rng(0)
    for reduce, opts in [("mean", {"window": 5}), ("sum", {}), ("ema", {}), ("max", {})]:
        for _ in range(7):
            v = torch.tensor(float(rng.normal()))
            fr.log_value(reduce, v, reduce=reduce, **opts)
            _rl(rl.log_value, reduce, v, reduce=reduce, **opts)
        a, b = fr.peek(reduce), float(_rl(rl.peek, reduce))
        assert math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-6), (reduce, a, b)
    fr.log_value("it", torch.tensor(2.5), reduce="item")
    _rl(rl.log_value, "it", torch.tensor(2.5), reduce="item")
    assert fr.peek("it") == rl.peek("it") == 2.5
    for v in (torch.tensor(1), torch.tensor([1.0, 2.0])):
        fr.log_value("its", v, reduce="item_series")
        _rl(rl.log_value, "its", v, reduce="item_series")
    assert fr.peek("its") == [1, [1.0, 2.0]]
