"""Observation filters, their synchronisation, and reward/action clipping.

Properties (exact merges, the normalisation formula, state round trips), a differential
test against RLlib 2.60's ``MeanStdFilter``, and tests that pin where RLlib differs.
"""

from __future__ import annotations

import pickle
import threading
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from fastrollout.connectors import clip_action
from fastrollout.filters import (
    SMALL_NUMBER,
    ConcurrentMeanStdFilter,
    MeanStdFilter,
    NoFilter,
    RunningStat,
    clip_reward,
    filter_from_state,
    get_filter,
    get_filters,
    sync_filters,
    synchronize,
)

DIM = 3
finite = st.floats(-1e3, 1e3, allow_nan=False, allow_infinity=False)


def _data(min_rows: int = 1, max_rows: int = 40) -> st.SearchStrategy[np.ndarray]:
    return hnp.arrays(
        np.float64, st.tuples(st.integers(min_rows, max_rows), st.just(DIM)), elements=finite
    )


def _assert_stats_equal_one_pass(rs: RunningStat, data: np.ndarray) -> None:
    scale = max(1.0, float(np.abs(data).max()))
    assert rs.n == len(data)
    np.testing.assert_allclose(rs.mean, data.mean(axis=0), rtol=1e-9, atol=1e-9 * scale)
    if len(data) > 1:
        np.testing.assert_allclose(
            rs.var, data.var(axis=0, ddof=1), rtol=1e-9, atol=1e-9 * scale**2
        )


def _feed(f: Any, rows: np.ndarray, batched: bool) -> None:
    if batched:
        f(rows)
    else:
        for row in rows:
            f(row)


# ----------------------------------------------------------------------------------------
# Properties
# ----------------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(data=_data(), cuts=st.lists(st.integers(0, 40), max_size=5), batched=st.booleans())
def test_merging_any_split_equals_one_pass(data, cuts, batched):
    shards = np.split(data, sorted(c % (len(data) + 1) for c in cuts))
    driver = {"p": MeanStdFilter((DIM,))}
    workers = [{"p": MeanStdFilter((DIM,))} for _ in shards]
    for w, shard in zip(workers, shards, strict=True):
        _feed(w["p"], shard, batched and len(shard) > 0)
    copies = synchronize(driver, [get_filters(w, flush_after=True) for w in workers])
    _assert_stats_equal_one_pass(driver["p"].running_stats, data)
    assert copies is not None
    for w in workers:
        assert w["p"].buffer.n == 0
        sync_filters(w, copies)
        assert w["p"].running_stats == driver["p"].running_stats


@settings(max_examples=30, deadline=None)
@given(rounds=st.lists(st.lists(_data(0, 10), min_size=1, max_size=3), min_size=1, max_size=4))
def test_repeated_sync_rounds_count_every_row_once(rounds):
    n_workers = max(len(r) for r in rounds)
    driver = {"p": MeanStdFilter((DIM,))}
    workers = [{"p": MeanStdFilter((DIM,))} for _ in range(n_workers)]
    seen = []
    for shards in rounds:
        for w, shard in zip(workers, shards, strict=False):
            _feed(w["p"], shard, batched=False)
            seen.append(shard)
        copies = synchronize(driver, [get_filters(w, flush_after=True) for w in workers])
        assert copies is not None
        for w in workers:
            sync_filters(w, copies)
    all_data = np.concatenate(seen) if seen else np.zeros((0, DIM))
    if len(all_data):
        _assert_stats_equal_one_pass(driver["p"].running_stats, all_data)
        for w in workers:
            _assert_stats_equal_one_pass(w["p"].running_stats, all_data)


@settings(max_examples=60, deadline=None)
@given(
    data=_data(),
    clip=st.one_of(st.none(), st.floats(0.1, 5.0)),
    demean=st.booleans(),
    destd=st.booleans(),
)
def test_output_is_normalised_by_stats_including_x(data, clip, demean, destd):
    f = MeanStdFilter((DIM,), demean=demean, destd=destd, clip=clip)
    for i, x in enumerate(data):
        y = f(x)
        seen = data[: i + 1]
        expected = x.copy()
        if demean:
            expected = expected - seen.mean(axis=0)
        if destd:
            std = seen.std(axis=0, ddof=1) if i > 0 else np.zeros(DIM)
            expected = expected / (std + SMALL_NUMBER)
        if clip:
            expected = np.clip(expected, -clip, clip)
        # Rounding in the mean and std (~1e-12 of the data's scale) is amplified by
        # 1 / (std + eps), which is large for (nearly) constant data.
        scale = max(1.0, float(np.abs(seen).max()))
        amp = 1.0 / (std + SMALL_NUMBER) if destd else 1.0
        rtol = 1e-9 + (1e-12 * scale * amp if destd else 0.0)
        assert np.all(np.abs(y - expected) <= rtol * np.abs(expected) + 1e-12 * scale * amp)
        assert y.dtype == x.dtype


@settings(max_examples=40, deadline=None)
@given(data=_data(1, 20))
def test_batch_equals_rows_one_by_one(data):
    a, b = MeanStdFilter((DIM,)), MeanStdFilter((DIM,))
    out = a(data)
    for row in data:
        b(row)
    _assert_stats_equal_one_pass(a.running_stats, data)
    # The batch mean and the row-by-row mean differ by rounding, amplified by 1 / (std + eps).
    amp = 1.0 / (data.std(axis=0, ddof=1 if len(data) > 1 else 0) + SMALL_NUMBER)
    atol = 1e-12 * max(1.0, float(np.abs(data).max())) * amp
    assert np.all(np.abs(out - b(data, update=False)) <= atol + 1e-9 * np.abs(out))


def test_update_false_leaves_stats_alone():
    f = MeanStdFilter((2,))
    f([1.0, 2.0])
    before = f.get_state()
    f([5.0, 5.0], update=False)
    assert MeanStdFilter.from_state(before) == f


def test_apply_changes_with_buffer_copies_the_buffer():
    a, b = MeanStdFilter(()), MeanStdFilter(())
    a(1.0)
    a(2.0)
    b(10.0)
    a.apply_changes(b, with_buffer=False)
    assert (a.running_stats.n, a.buffer.n) == (3, 2)
    assert float(a.running_stats.mean) == pytest.approx(13 / 3)
    a.apply_changes(b, with_buffer=True)
    assert (a.running_stats.n, a.buffer.n) == (4, 1)
    assert float(a.running_stats.mean) == pytest.approx(23 / 4)


def test_sync_copies_everything_and_clear_buffer_resets():
    a, b = MeanStdFilter((2,)), MeanStdFilter((2,), clip=None, demean=False)
    a([1.0, 1.0])
    b([4.0, 4.0])
    b([6.0, 6.0])
    a.sync(b)
    assert a == b and a.clip is None and a.demean is False
    b([7.0, 7.0])
    assert a.running_stats.n == 2  # a holds copies
    a.clear_buffer()
    assert a.buffer.n == 0 and a.running_stats.n == 2


# ----------------------------------------------------------------------------------------
# Nested shapes
# ----------------------------------------------------------------------------------------

NESTED = {"pos": (2,), "rest": ((3,), None)}


def _nested_obs(rng: np.random.Generator) -> dict:
    return {"pos": rng.normal(size=2), "rest": (rng.normal(size=3), int(rng.integers(4)))}


def test_nested_shapes_keep_one_stat_per_component():
    rng = np.random.default_rng(0)
    f = MeanStdFilter(NESTED)
    obs = [_nested_obs(rng) for _ in range(20)]
    outs = [f(o) for o in obs]
    assert set(outs[-1]) == {"pos", "rest"}
    assert outs[-1]["rest"][1] == obs[-1]["rest"][1]  # None component passes through
    _assert_stats_equal_one_pass(f.running_stats["pos"], np.stack([o["pos"] for o in obs]))
    assert f.running_stats["rest"][1] is None
    g = MeanStdFilter.from_state(f.get_state())
    assert g == f and pickle.loads(pickle.dumps(f)) == f
    h = MeanStdFilter(NESTED)
    h.apply_changes(f)
    assert h.running_stats["rest"][0] == f.running_stats["rest"][0]


def test_nested_structure_mismatch_is_a_clear_error():
    f = MeanStdFilter(NESTED)
    with pytest.raises(ValueError, match=r"keys \['pos', 'rest'\]"):
        f({"pos": np.zeros(2)})
    with pytest.raises(ValueError, match=r"\['rest'\]: expected a tuple of 2"):
        f({"pos": np.zeros(2), "rest": (np.zeros(3),)})
    with pytest.raises(ValueError, match=r"\['rest'\]\[0\] has shape \(4,\)"):
        f({"pos": np.zeros(2), "rest": (np.zeros(4), 1)})


# ----------------------------------------------------------------------------------------
# Save/restore, pickling, bad input
# ----------------------------------------------------------------------------------------


def _plain(x: Any) -> bool:
    if isinstance(x, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in x.items())
    if isinstance(x, list):
        return all(_plain(v) for v in x)
    return x is None or isinstance(x, (bool, int, float, str, np.ndarray))


@pytest.mark.parametrize("cls", [MeanStdFilter, ConcurrentMeanStdFilter])
def test_state_and_pickle_round_trip(cls):
    rng = np.random.default_rng(1)
    f = cls((DIM,), clip=3.0)
    for _ in range(7):
        f(rng.normal(size=DIM))
    f.reset_buffer()
    f(rng.normal(size=DIM))
    state = f.get_state()
    assert _plain(state)
    for g in (cls.from_state(state), filter_from_state(state), pickle.loads(pickle.dumps(f))):
        assert type(g) is cls and g == f
        x = rng.normal(size=DIM)
        np.testing.assert_array_equal(g(x), f.copy()(x))
    nf = NoFilter()
    assert filter_from_state(nf.get_state()) == nf == pickle.loads(pickle.dumps(nf))


def test_running_stat_state_reads_rllib_and_connector_keys():
    """One ``RunningStat`` backs both the old-stack filters and the runner connector."""
    from fastrollout.connectors.env_to_module.mean_std_filter import RunningStats

    rs = RunningStat((DIM,))
    rs.push_batch(np.random.default_rng(3).normal(size=(5, DIM)))
    connector = RunningStats.from_state(rs.to_state())
    assert connector.to_state().keys() == {"count", "mean", "m2"}
    assert connector.count == rs.n == 5
    np.testing.assert_array_equal(connector.m2, rs.sum_sq_diff_array)
    assert RunningStat.from_state(connector.to_state()) == rs == connector
    with pytest.raises(ValueError, match="lacks 'sum_sq_diff_array'"):
        RunningStat.from_state({"num_pushes": 1, "mean_array": np.zeros(DIM)})


def test_concurrent_filter_counts_every_push_from_threads():
    f = ConcurrentMeanStdFilter((DIM,))
    rng = np.random.default_rng(2)
    chunks = [rng.normal(size=(300, DIM)) for _ in range(4)]

    def work(chunk: np.ndarray) -> None:
        for row in chunk:
            f(row)

    threads = [threading.Thread(target=work, args=(c,)) for c in chunks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    _assert_stats_equal_one_pass(f.running_stats, np.concatenate(chunks))
    assert type(f.as_serializable()) is MeanStdFilter
    assert type(f.copy()) is ConcurrentMeanStdFilter


def test_get_filter():
    assert isinstance(get_filter("NoFilter", (2,)), NoFilter)
    m = get_filter("MeanStdFilter", (2,))
    assert type(m) is MeanStdFilter and m.clip is None
    c = get_filter("ConcurrentMeanStdFilter", (2,))
    assert type(c) is ConcurrentMeanStdFilter and c.clip is None
    assert get_filter(lambda s: MeanStdFilter(s, clip=1.0), (2,)).clip == 1.0
    with pytest.raises(ValueError, match=r"'MeanStd'.*'NoFilter', 'MeanStdFilter'"):
        get_filter("MeanStd", (2,))


def test_bad_input_raises_clear_errors():
    f = MeanStdFilter((3,))
    with pytest.raises(ValueError, match=r"shape \(4,\), expected \(3,\)"):
        f(np.zeros(4))
    with pytest.raises(ValueError, match=r"shapes differ"):
        f.apply_changes(MeanStdFilter((2,)))
    with pytest.raises(ValueError, match=r"shapes differ"):
        f.sync(MeanStdFilter((2,)))
    with pytest.raises(ValueError, match="not an observation shape"):
        MeanStdFilter("abc")
    with pytest.raises(ValueError, match=r"RunningStat.push: value of shape \(2,\)"):
        RunningStat((3,)).push([1.0, 2.0])
    state = f.get_state()
    state["running_stats"]["mean_array"] = np.zeros(5)
    with pytest.raises(ValueError, match="RunningStat state"):
        MeanStdFilter.from_state(state)
    with pytest.raises(ValueError, match="unknown type 'Bogus'"):
        filter_from_state({"type": "Bogus"})
    with pytest.raises(KeyError, match=r"worker 0 has no filter for policies \['p'\]"):
        synchronize({"p": MeanStdFilter(())}, [{"q": MeanStdFilter(())}])
    with pytest.raises(KeyError, match="no new filter"):
        sync_filters({"p": MeanStdFilter(())}, {})


def test_no_filter_passes_through():
    nf = NoFilter()
    x = np.arange(3)
    assert nf(x) is x and nf.copy() is nf
    assert nf({"a": 1}) == {"a": 1}
    np.testing.assert_array_equal(nf([1, 2]), np.array([1, 2]))


def test_synchronize_flags():
    driver = {"p": MeanStdFilter(())}
    w = MeanStdFilter(())
    w(1.0)
    assert synchronize(driver, [{"p": w}], update_remote=False) is None
    assert driver["p"].running_stats.n == 1
    copies = synchronize(driver, [{"p": w}], use_remote_data_for_update=False)
    assert driver["p"].running_stats.n == 1 and copies is not None
    assert copies["p"].buffer.n == 0 and copies["p"].running_stats.n == 1


# ----------------------------------------------------------------------------------------
# Clipping
# ----------------------------------------------------------------------------------------


@given(rewards=hnp.arrays(np.float64, st.integers(0, 20), elements=finite), c=st.floats(0.1, 50))
def test_clip_reward(rewards, c):
    np.testing.assert_array_equal(clip_reward(rewards, True), np.sign(rewards))
    np.testing.assert_array_equal(clip_reward(rewards, c), np.clip(rewards, -c, c))
    np.testing.assert_array_equal(clip_reward(rewards, -c), np.clip(rewards, -c, c))
    for off in (None, False):
        assert clip_reward(rewards, off) is rewards
    assert clip_reward(-7.5, True) == -1.0 and clip_reward(7.5, 2.0) == 2.0


def _space() -> gym.spaces.Dict:
    return gym.spaces.Dict(
        {
            "move": gym.spaces.Box(-1.0, 1.0, (2,), np.float32),
            "aux": gym.spaces.Tuple(
                (
                    gym.spaces.Discrete(3),
                    gym.spaces.Box(np.array([0.0, -5.0]), np.array([2.0, 5.0]), dtype=np.float64),
                )
            ),
        }
    )


def test_clip_action_matches_rllib():
    from ray.rllib.utils.spaces.space_utils import clip_action as rllib_clip_action
    from ray.rllib.utils.spaces.space_utils import get_base_struct_from_space

    space = _space()
    rng = np.random.default_rng(3)
    for _ in range(20):
        a = {
            "move": rng.normal(scale=3, size=2).astype(np.float32),
            "aux": (int(rng.integers(3)), rng.normal(scale=6, size=2)),
        }
        ours = clip_action(a, space)
        theirs = rllib_clip_action(a, get_base_struct_from_space(space))
        np.testing.assert_array_equal(ours["move"], theirs["move"])
        assert ours["aux"][0] == theirs["aux"][0]
        np.testing.assert_array_equal(ours["aux"][1], theirs["aux"][1])
        assert clip_action(a, get_base_struct_from_space(space))["aux"][0] == a["aux"][0]
    with pytest.raises(ValueError, match=r"\['aux'\] should be a tuple of 2"):
        clip_action({"move": np.zeros(2), "aux": (1,)}, space)


# ----------------------------------------------------------------------------------------
# RLlib 2.60: differential test and pinned deviations
# ----------------------------------------------------------------------------------------


def _rllib():
    from ray.rllib.utils import filter as rllib_filter

    return rllib_filter


@pytest.mark.parametrize("clip", [10.0, None, 0.5])
def test_differential_against_rllib_mean_std_filter(clip):
    rf = _rllib()
    rng = np.random.default_rng(4)
    theirs, ours = rf.MeanStdFilter((DIM,), clip=clip), MeanStdFilter((DIM,), clip=clip)
    for i in range(200):
        x = rng.normal(loc=3.0, scale=2.0, size=DIM).astype(np.float32 if i % 2 else np.float64)
        a, b = theirs(x), ours(x)
        assert a.dtype == b.dtype == x.dtype
        # RLlib's variance is float32 (see the pin below): outputs agree to its precision.
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)
        assert theirs.running_stats.n == ours.running_stats.n
    np.testing.assert_allclose(ours.running_stats.mean, theirs.running_stats.mean, rtol=1e-12)
    np.testing.assert_allclose(ours.running_stats.var, theirs.running_stats.var, rtol=1e-6)
    # Integer observations come back truncated to ints in both.
    np.testing.assert_array_equal(theirs(np.array([5, 1, 3])), ours(np.array([5, 1, 3])))


def test_rllib_merge_of_buffers_is_exact_but_its_variance_is_float32():
    """RLlib's ``RunningStat.update`` on buffers is Chan's formula (exact); ``var`` is cast
    to float32, so its std carries ~1e-7 relative error. Ours keeps float64."""
    rf = _rllib()
    rng = np.random.default_rng(5)
    data = rng.normal(loc=1e3, scale=1.0, size=(300, DIM))
    shards = np.split(data, [17, 120, 121])
    driver = rf.MeanStdFilter((DIM,))
    for shard in shards:
        w = rf.MeanStdFilter((DIM,))
        for row in shard:
            w(row)
        driver.apply_changes(w.as_serializable())
    np.testing.assert_allclose(driver.running_stats.mean, data.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(
        driver.running_stats.sum_sq_diff_array / (len(data) - 1),
        data.var(axis=0, ddof=1),
        rtol=1e-9,
    )
    assert driver.running_stats.var.dtype == np.float32
    assert RunningStat((DIM,)).var.dtype == np.float64


def test_rllib_counts_the_drivers_own_data_again_on_every_sync():
    """RLlib sends the driver's buffer along with the synced filters, so rows the driver's
    filter saw come back in every worker's next buffer. ``synchronize`` sends empty ones."""
    rf = _rllib()
    d0, w1, w2 = np.ones((5, 1)), np.zeros((3, 1)), np.zeros((4, 1))

    def run(make, sync_round):
        driver, worker = make(), make()
        for rows, f in ((d0, driver), (w1, worker)):
            for r in rows:
                f(r)
        sync_round(driver, worker)
        for r in w2:
            worker(r)
        sync_round(driver, worker)
        return driver.running_stats.n

    def rllib_round(driver, worker):  # FilterManager.synchronize, one worker
        delta = worker.as_serializable()
        worker.reset_buffer()
        driver.apply_changes(delta, with_buffer=False)
        worker.sync(driver.as_serializable())

    def our_round(driver, worker):
        copies = synchronize({"p": driver}, [get_filters({"p": worker}, flush_after=True)])
        assert copies is not None
        sync_filters({"p": worker}, copies)

    assert run(lambda: rf.MeanStdFilter((1,)), rllib_round) == 5 + 3 + 5 + 4
    assert run(lambda: MeanStdFilter((1,)), our_round) == 5 + 3 + 4


def test_rllib_fails_on_batches_nested_shapes_none_and_clear_buffer():
    """Pins RLlib 2.60 failures that fastrollout handles."""
    rf = _rllib()
    # A batch: RLlib iterates ``range(x.shape)`` (a tuple). Ours pushes every row.
    with pytest.raises(TypeError):
        rf.MeanStdFilter((DIM,))(np.zeros((4, DIM)))
    assert MeanStdFilter((DIM,))(np.zeros((4, DIM))).shape == (4, DIM)
    # Dict/Tuple shapes: RLlib's nested check never matches, so it builds np.array(shape).
    with pytest.raises(TypeError):
        rf.MeanStdFilter({"a": (2,), "b": (1,)})
    with pytest.raises(TypeError):
        rf.MeanStdFilter(((2,), (3,)))
    # shape=None (Discrete): RLlib calls np.zeros(None). Ours passes observations through.
    with pytest.raises(TypeError):
        rf.MeanStdFilter(None)
    assert MeanStdFilter(None)(np.array(2)) == 2
    # clear_buffer: deprecated with error=True in RLlib; ours resets the buffer.
    with pytest.raises(ValueError, match="deprecated"):
        rf.MeanStdFilter(()).clear_buffer()
    # Unknown name: RLlib raises a bare Exception; ours a ValueError listing the names.
    with pytest.raises(Exception, match="Unknown observation_filter") as info:
        rf.get_filter("Bogus", ())
    assert type(info.value) is Exception


def test_rllib_concurrent_filter_lock_is_never_taken():
    """RLlib's ConcurrentMeanStdFilter assigns a locking ``__getattribute__`` on the
    instance, which Python never consults (it looks attribute access up on the type)."""
    rf = _rllib()
    f = rf.ConcurrentMeanStdFilter((1,))
    assert "__getattribute__" in vars(f)
    assert type(f).__getattribute__ is object.__getattribute__
