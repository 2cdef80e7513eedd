"""Unit tests for every public method and property of ``SingleAgentEpisode``.

Expectations are written out by hand from RLlib 2.60's semantics (the spec); running the
file with ``FR_DIFF_SUBJECT=rllib`` checks them against RLlib itself. Tests marked
``fastrollout_only`` pin down fastrollout's documented additions (input validation, error
classes, ``finalize``), which RLlib does not have.
"""

from __future__ import annotations

import copy
import os
import pickle
import re
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from _helpers import (
    Episode,
    EpisodeStateError,
    SpaceMismatchError,
    assert_same,
    assert_same_episode,
    assert_same_outcome,
    fastrollout_only,
    snapshot,
)

# --------------------------------------------------------------------------------------
# Builders.
# --------------------------------------------------------------------------------------

OBS_SPACE = gym.spaces.Discrete(8)
ACT_SPACE = gym.spaces.Discrete(20)


def indexed_episode(*, numpy: bool = False, **kwargs: Any) -> Any:
    """An episode whose items equal their position in the buffer, lookback 2.

    observations 0..7, infos {"i": 0..7}, actions 10..16, rewards 0.0, 0.5, .., 3.0 and
    extra "v" float32 0..6. The first two of each form the lookback buffer, so the chunk
    is observations 2..7, actions 12..16, rewards 1.0..3.0 (len 5).
    """
    kw: dict[str, Any] = {
        "id_": "indexed",
        "observations": list(range(8)),
        "infos": [{"i": i} for i in range(8)],
        "actions": list(range(10, 17)),
        "rewards": [i / 2 for i in range(7)],
        "extra_model_outputs": {"v": [np.float32(i) for i in range(7)]},
        "len_lookback_buffer": 2,
        "observation_space": OBS_SPACE,
        "action_space": ACT_SPACE,
    }
    kw.update(kwargs)
    ep = Episode(**kw)
    if numpy:
        ep.to_numpy()
    return ep


BOX3 = gym.spaces.Box(-10.0, 10.0, (3,), np.float32)
BOX2 = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)


def obs_at(i: int) -> np.ndarray:
    return np.full(3, i, np.float32)


def act_at(i: int) -> np.ndarray:
    return np.array([i / 10, -i / 10], np.float32)


def stepped_episode(n: int = 5, *, end: str | None = None, **kwargs: Any) -> Any:
    """A Box episode built with add_env_reset/add_env_step: o0..on, a1..an, r = i."""
    kw: dict[str, Any] = {"id_": "stepped", "observation_space": BOX3, "action_space": BOX2}
    kw.update(kwargs)
    ep = Episode(**kw)
    ep.add_env_reset(obs_at(0), {"reset": True})
    for i in range(1, n + 1):
        ep.add_env_step(
            obs_at(i),
            act_at(i),
            float(i),
            {"i": i},
            terminated=end == "terminated" and i == n,
            truncated=end == "truncated" and i == n,
            extra_model_outputs={"logp": np.float32(-i), "h": np.full(2, i, np.float32)},
        )
    return ep


EXTRAS = ("logp", "h")

# --------------------------------------------------------------------------------------
# Result checks.
# --------------------------------------------------------------------------------------


def check_batch(result: Any, expected: list, numpy: bool) -> None:
    """A batch: a python list before to_numpy, one ndarray after; values as expected."""
    if numpy:
        assert isinstance(result, np.ndarray), type(result)
    else:
        assert isinstance(result, list), type(result)
    assert len(result) == len(expected)
    if expected:
        np.testing.assert_array_equal(np.stack([np.asarray(x) for x in result]), expected)


def check_item(result: Any, expected: Any) -> None:
    """A single item (no batch axis): not a list, and the expected value."""
    assert not isinstance(result, list)
    np.testing.assert_array_equal(np.asarray(result), expected)


def check_query(get: Callable[..., Any], indices: Any, kwargs: dict, expected: Any, numpy: bool):
    if isinstance(expected, type) and issubclass(expected, Exception):
        with pytest.raises(expected):
            get(indices, **kwargs)
    elif isinstance(indices, (list, slice)) or indices is None:
        check_batch(get(indices, **kwargs), expected, numpy)
    else:
        check_item(get(indices, **kwargs), expected)


NEG = {"neg_index_as_lookback": True}
FILL = {"fill": -5}
ONE_HOT = {"one_hot_discrete": True}


def oh(k: int, n: int = 8) -> np.ndarray:
    return np.eye(n, dtype=np.float32)[k]


Z8 = np.zeros(8, np.float32)

# (indices, kwargs, expected) on `indexed_episode` observations, valid before and after
# to_numpy. Values equal buffer positions; the chunk starts at position 2.
OBS_CASES: list[tuple[Any, dict, Any]] = [
    (None, {}, [2, 3, 4, 5, 6, 7]),
    (0, {}, 2),
    (5, {}, 7),
    (6, {}, IndexError),
    (-1, {}, 7),
    (-6, {}, 2),
    # Plain negative indices count back from the end, across the lookback buffer.
    (-8, {}, 0),
    (-9, {}, IndexError),
    (-9, FILL, -5),
    (6, FILL, -5),
    (-1, NEG, 1),
    (-2, NEG, 0),
    (0, NEG, 2),
    (3, NEG, 5),
    (-3, {**NEG, **FILL}, -5),
    ([0, 2], {}, [2, 4]),
    ([-1, 0], {}, [7, 2]),
    ([-1], NEG, [1]),
    ([0, 9], {}, IndexError),
    ([0, 9], FILL, [2, -5]),
    (slice(None, 2), {}, [2, 3]),
    (slice(-2, None), {}, [6, 7]),
    (slice(1, 4), {}, [3, 4, 5]),
    (slice(-2, None), NEG, [0, 1, 2, 3, 4, 5, 6, 7]),
    (slice(-2, 1), NEG, [0, 1, 2]),
    # Without fill, a range reaching past the data is clipped; with fill it is padded.
    (slice(-4, 1), NEG, [0, 1, 2]),
    (slice(-4, 1), {**NEG, **FILL}, [-5, -5, 0, 1, 2]),
    (slice(4, 9), {}, [6, 7]),
    (slice(4, 9), FILL, [6, 7, -5, -5, -5]),
    (slice(7, 9), FILL, [-5, -5]),
    (slice(-12, -10), FILL, [-5, -5]),
    (slice(-10, 2), {}, [0, 1, 2, 3]),
    (slice(-10, 2), FILL, [-5, -5, 0, 1, 2, 3]),
    (slice(None, None, 2), {}, [2, 4, 6]),
    (slice(1, 6, 2), {}, [3, 5, 7]),
    (slice(4, 0, -1), {}, [6, 5, 4, 3]),
    # A reversed slice without bounds runs from the chunk start to the end: empty.
    (slice(None, None, -1), {}, []),
    (slice(5, 2), {}, []),
    (slice(3, 3), {}, []),
    (2, ONE_HOT, oh(4)),
    (slice(0, 2), ONE_HOT, [oh(2), oh(3)]),
    (-3, {**NEG, "fill": 0, **ONE_HOT}, Z8),
    (slice(-3, 0), {**NEG, "fill": 0, **ONE_HOT}, [Z8, oh(0), oh(1)]),
]


def _case_id(case: tuple) -> str:
    indices, kwargs, _ = case
    flags = ",".join(f"{k[:3]}={v}" for k, v in kwargs.items())
    idx = (
        f"{indices.start}:{indices.stop}:{indices.step}" if isinstance(indices, slice) else indices
    )
    return f"{idx}|{flags}"


@pytest.mark.parametrize("numpy", [False, True], ids=["list", "numpy"])
@pytest.mark.parametrize("case", OBS_CASES, ids=[_case_id(c) for c in OBS_CASES])
def test_get_observations_index_forms(case: tuple, numpy: bool) -> None:
    ep = indexed_episode(numpy=numpy)
    check_query(ep.get_observations, *case, numpy)


def test_get_observations_neg_index_past_lookback_raises_before_to_numpy() -> None:
    # (After to_numpy, RLlib 2.60 wraps such an index around to the end of the data; the
    # differential test holds fastrollout to whatever KNOWN_RLLIB_BUGS says about that.)
    ep = indexed_episode()
    with pytest.raises(IndexError):
        ep.get_observations(-3, neg_index_as_lookback=True)
    with pytest.raises(IndexError):
        ep.get_observations([-3], neg_index_as_lookback=True)


def test_get_observations_empty_index_list_before_to_numpy() -> None:
    assert indexed_episode().get_observations([]) == []


ACT_CASES: list[tuple[Any, dict, Any]] = [
    (None, {}, [12, 13, 14, 15, 16]),
    (0, {}, 12),
    (4, {}, 16),
    (5, {}, IndexError),
    (-1, {}, 16),
    (-1, NEG, 11),
    (-2, NEG, 10),
    ([0, -1], {}, [12, 16]),
    (slice(1, 3), {}, [13, 14]),
    (slice(-3, 1), {**NEG, "fill": 0}, [0, 10, 11, 12]),
    (slice(3, 7), FILL, [15, 16, -5, -5]),
    (0, ONE_HOT, oh(12, 20)),
    (slice(-1, 1), {**NEG, **ONE_HOT}, [oh(11, 20), oh(12, 20)]),
]


@pytest.mark.parametrize("numpy", [False, True], ids=["list", "numpy"])
@pytest.mark.parametrize("case", ACT_CASES, ids=[_case_id(c) for c in ACT_CASES])
def test_get_actions_index_forms(case: tuple, numpy: bool) -> None:
    ep = indexed_episode(numpy=numpy)
    check_query(ep.get_actions, *case, numpy)


REW_CASES: list[tuple[Any, dict, Any]] = [
    (None, {}, [1.0, 1.5, 2.0, 2.5, 3.0]),
    (0, {}, 1.0),
    (-1, {}, 3.0),
    (-1, NEG, 0.5),
    ([1, 3], {}, [1.5, 2.5]),
    (slice(3, 7), {"fill": 0.0}, [2.5, 3.0, 0.0, 0.0]),
    (slice(-4, 0), {**NEG, "fill": 0.0}, [0.0, 0.0, 0.0, 0.5]),
    (7, {}, IndexError),
    (7, {"fill": -1}, -1.0),
]


@pytest.mark.parametrize("numpy", [False, True], ids=["list", "numpy"])
@pytest.mark.parametrize("case", REW_CASES, ids=[_case_id(c) for c in REW_CASES])
def test_get_rewards_index_forms(case: tuple, numpy: bool) -> None:
    ep = indexed_episode(numpy=numpy)
    check_query(ep.get_rewards, *case, numpy)


EXTRA_CASES: list[tuple[Any, dict, Any]] = [
    (None, {}, [2, 3, 4, 5, 6]),
    (0, {}, 2),
    (-1, {}, 6),
    (-1, NEG, 1),
    ([0, 4], {}, [2, 6]),
    (slice(3, 7), {"fill": 0.0}, [5, 6, 0, 0]),
    (slice(-3, 1), {**NEG, "fill": -1}, [-1, 0, 1, 2]),
    (5, {}, IndexError),
]


@pytest.mark.parametrize("numpy", [False, True], ids=["list", "numpy"])
@pytest.mark.parametrize("case", EXTRA_CASES, ids=[_case_id(c) for c in EXTRA_CASES])
def test_get_extra_model_outputs_index_forms(case: tuple, numpy: bool) -> None:
    ep = indexed_episode(numpy=numpy)
    check_query(lambda *a, **k: ep.get_extra_model_outputs("v", *a, **k), *case, numpy)


@pytest.mark.parametrize("numpy", [False, True], ids=["list", "numpy"])
def test_get_infos_index_forms(numpy: bool) -> None:
    ep = indexed_episode(numpy=numpy)
    # Infos are never numpy'ized: always dicts, batches always python lists.
    assert ep.get_infos() == [{"i": i} for i in range(2, 8)]
    assert ep.get_infos(0) == {"i": 2}
    assert ep.get_infos(-1) == {"i": 7}
    assert ep.get_infos(-1, neg_index_as_lookback=True) == {"i": 1}
    assert ep.get_infos([0, -1]) == [{"i": 2}, {"i": 7}]
    assert ep.get_infos(slice(1, 3)) == [{"i": 3}, {"i": 4}]
    assert ep.get_infos(slice(-3, 1), neg_index_as_lookback=True, fill={"f": 0}) == [
        {"f": 0},
        {"i": 0},
        {"i": 1},
        {"i": 2},
    ]
    assert ep.get_infos(slice(4, 8), fill={"f": 1}) == [{"i": 6}, {"i": 7}, {"f": 1}, {"f": 1}]
    assert ep.get_infos(9, fill={"f": 2}) == {"f": 2}
    with pytest.raises(IndexError):
        ep.get_infos(6)


def test_to_numpy_dtypes_and_containers() -> None:
    ep = indexed_episode(numpy=True)
    obs, act, rew = ep.get_observations(), ep.get_actions(), ep.get_rewards()
    assert isinstance(obs, np.ndarray) and obs.dtype == np.int64
    assert isinstance(act, np.ndarray) and act.dtype == np.int64
    assert isinstance(rew, np.ndarray) and rew.dtype == np.float64  # python floats
    assert ep.get_extra_model_outputs("v").dtype == np.float32
    assert isinstance(ep.get_infos(), list)
    assert isinstance(ep.get_observations(0), np.int64)
    assert isinstance(ep.get_rewards(0), np.float64)
    box = stepped_episode(3).to_numpy()
    assert_same(box.get_observations(), np.stack([obs_at(i) for i in range(4)]))
    assert_same(box.get_actions(), np.stack([act_at(i) for i in range(1, 4)]))
    assert_same(box.get_rewards(), np.array([1.0, 2.0, 3.0]))
    assert_same(box.get_extra_model_outputs("logp"), np.array([-1, -2, -3], np.float32))
    assert_same(
        box.get_extra_model_outputs("h"),
        np.repeat(np.arange(1, 4, dtype=np.float32), 2).reshape(3, 2),
    )


def test_get_without_space_fill_returns_the_fill_value() -> None:
    ep = indexed_episode(observation_space=None, action_space=None)
    assert ep.get_observations(20, fill=-3) == -3
    assert ep.get_actions(slice(4, 7), fill=0) == [16, 0, 0]


def test_one_hot_without_space_raises_value_error() -> None:
    ep = indexed_episode(observation_space=None, action_space=None)
    with pytest.raises(ValueError):
        ep.get_observations(0, one_hot_discrete=True)
    with pytest.raises(ValueError):
        ep.get_actions(slice(0, 2), one_hot_discrete=True)
    ep.to_numpy()
    with pytest.raises(ValueError):
        ep.get_actions(0, one_hot_discrete=True)


def test_one_hot_on_box_space_is_a_no_op() -> None:
    ep = stepped_episode(2)
    assert_same(ep.get_observations(1, one_hot_discrete=True), obs_at(1))


def test_unknown_extra_model_output_key_raises_key_error() -> None:
    for ep in (indexed_episode(), indexed_episode(numpy=True), Episode()):
        with pytest.raises(KeyError):
            ep.get_extra_model_outputs("nope")


# --------------------------------------------------------------------------------------
# Constructor, properties.
# --------------------------------------------------------------------------------------


def test_default_constructor() -> None:
    ep = Episode()
    assert len(ep) == 0 and ep.t == 0 and ep.t_started == 0
    assert not ep.is_reset and not ep.is_done and not ep.is_numpy
    assert not ep.is_terminated and not ep.is_truncated
    assert isinstance(ep.id_, str) and re.fullmatch(r"[0-9a-f]{32}", ep.id_)
    assert Episode().id_ != ep.id_
    assert ep.agent_id is None and ep.module_id is None and ep.multi_agent_episode_id is None
    assert ep.observation_space is None and ep.action_space is None
    assert ep.custom_data == {}
    assert ep.get_observations() == [] and ep.get_actions() == [] and ep.get_rewards() == []
    assert ep.get_infos() == []
    assert ep.get_return() == 0
    assert ep.get_duration_s() == 0.0
    assert ep.env_steps() == 0 and ep.agent_steps() == 0
    assert ep.validate() is None


def test_constructor_ids_and_spaces() -> None:
    ep = Episode(
        id_="e1",
        agent_id="agent_0",
        module_id="policy",
        multi_agent_episode_id="ma-7",
        observation_space=OBS_SPACE,
        action_space=ACT_SPACE,
    )
    assert ep.id_ == "e1"
    assert ep.agent_id == "agent_0"
    assert ep.module_id == "policy"
    assert ep.multi_agent_episode_id == "ma-7"
    assert ep.observation_space == OBS_SPACE
    assert ep.action_space == ACT_SPACE


def test_constructor_auto_lookback_puts_all_data_in_the_lookback() -> None:
    ep = Episode(observations=[0, 1, 2, 3], actions=[1, 2, 3], rewards=[1.0, 2.0, 3.0])
    assert len(ep) == 0 and ep.t == 0 and ep.t_started == 0 and ep.is_reset
    assert ep.get_observations() == [3]
    assert ep.get_actions() == [] and ep.get_rewards() == []
    assert ep.get_observations(slice(-3, None), neg_index_as_lookback=True) == [0, 1, 2, 3]
    assert ep.get_actions(-1, neg_index_as_lookback=True) == 3
    assert ep.get_infos() == [{}]
    assert ep.get_return() == 0


@pytest.mark.parametrize(("lookback", "length"), [(0, 3), (1, 2), (3, 0), (10, 0)])
def test_constructor_len_lookback_buffer(lookback: int, length: int) -> None:
    ep = Episode(
        observations=[0, 1, 2, 3],
        actions=[1, 2, 3],
        rewards=[1.0, 2.0, 3.0],
        infos=[{"k": i} for i in range(4)],
        extra_model_outputs={"x": [0.1, 0.2, 0.3]},
        len_lookback_buffer=lookback,
    )
    lb = min(lookback, 3)
    assert len(ep) == length and ep.t == length and ep.t_started == 0
    assert ep.get_observations() == [0, 1, 2, 3][lb:]
    assert ep.get_actions() == [1, 2, 3][lb:]
    assert ep.get_rewards() == [1.0, 2.0, 3.0][lb:]
    assert ep.get_infos() == [{"k": i} for i in range(lb, 4)]
    assert ep.get_extra_model_outputs("x") == [0.1, 0.2, 0.3][lb:]
    assert ep.get_return() == sum([1.0, 2.0, 3.0][lb:])
    if lb:
        assert ep.get_actions(-1, neg_index_as_lookback=True) == lb
    else:
        with pytest.raises(IndexError):
            ep.get_actions(-1, neg_index_as_lookback=True)


def test_constructor_t_started() -> None:
    ep = Episode(
        observations=[0, 1, 2, 3],
        actions=[1, 2, 3],
        rewards=[1.0, 2.0, 3.0],
        t_started=10,
        len_lookback_buffer=1,
    )
    assert ep.t_started == 10 and ep.t == 12 and len(ep) == 2
    ep.add_env_step(4, 4, 4.0)
    assert ep.t == 13 and len(ep) == 3 and ep.env_steps() == 3 and ep.agent_steps() == 3


@pytest.mark.parametrize("flag", ["terminated", "truncated"])
def test_constructor_done_flags(flag: str) -> None:
    ep = Episode(
        observations=[0, 1], actions=[0], rewards=[1.0], len_lookback_buffer=0, **{flag: True}
    )
    assert ep.is_done
    assert ep.is_terminated == (flag == "terminated")
    assert ep.is_truncated == (flag == "truncated")
    with pytest.raises(EpisodeStateError):
        ep.add_env_step(2, 0, 1.0)


def test_constructor_rejects_inconsistent_lengths() -> None:
    with pytest.raises(AssertionError):
        Episode(observations=[0, 1, 2], actions=[0], rewards=[1.0], len_lookback_buffer=0)
    with pytest.raises(AssertionError):
        Episode(
            observations=[0, 1],
            actions=[0],
            rewards=[1.0],
            extra_model_outputs={"x": [1, 2]},
            len_lookback_buffer=0,
        )


# --------------------------------------------------------------------------------------
# add_env_reset / add_env_step / validate.
# --------------------------------------------------------------------------------------


def test_add_env_reset() -> None:
    ep = Episode()
    ep.add_env_reset(5)
    assert ep.is_reset and len(ep) == 0 and ep.t == 0
    assert ep.get_observations() == [5] and ep.get_infos() == [{}]
    ep2 = Episode()
    ep2.add_env_reset(obs_at(1), {"seed": 3})
    assert_same(ep2.get_observations(), [obs_at(1)])
    assert ep2.get_infos(0) == {"seed": 3}
    assert ep2.validate() is None


def test_add_env_step_records_everything() -> None:
    ep = stepped_episode(3)
    assert len(ep) == 3 and ep.t == 3 and ep.t_started == 0
    assert ep.is_reset and not ep.is_done and not ep.is_numpy
    assert_same(ep.get_observations(), [obs_at(i) for i in range(4)])
    assert_same(ep.get_actions(), [act_at(i) for i in range(1, 4)])
    assert ep.get_rewards() == [1.0, 2.0, 3.0]
    assert ep.get_infos() == [{"reset": True}, {"i": 1}, {"i": 2}, {"i": 3}]
    assert_same(
        ep.get_extra_model_outputs("logp"), [np.float32(-1), np.float32(-2), np.float32(-3)]
    )
    assert_same(ep.get_extra_model_outputs("h", -1), np.full(2, 3, np.float32))
    assert ep.get_return() == 6.0
    assert ep.env_steps() == ep.agent_steps() == 3
    assert ep.validate() is None


def test_add_env_step_infos_default_to_empty_dict() -> None:
    ep = Episode()
    ep.add_env_reset(0)
    ep.add_env_step(1, 0, 1.0)
    ep.add_env_step(2, 0, 1.0, None)
    assert ep.get_infos() == [{}, {}, {}]


@pytest.mark.parametrize("flag", ["terminated", "truncated"])
def test_add_env_step_done_flags(flag: str) -> None:
    ep = stepped_episode(2, end=flag)
    assert ep.is_done
    assert ep.is_terminated == (flag == "terminated")
    assert ep.is_truncated == (flag == "truncated")


def test_add_env_step_after_to_numpy_appends() -> None:
    ep = stepped_episode(2).to_numpy()
    ep.add_env_step(
        obs_at(3),
        act_at(3),
        3.0,
        extra_model_outputs={"logp": np.float32(-3), "h": np.full(2, 3, np.float32)},
    )
    assert ep.is_numpy and len(ep) == 3 and ep.t == 3
    assert_same(ep.get_observations(), np.stack([obs_at(i) for i in range(4)]))
    assert_same(ep.get_rewards(), np.array([1.0, 2.0, 3.0]))
    assert_same(ep.get_extra_model_outputs("logp"), np.array([-1, -2, -3], np.float32))


def test_get_duration_s() -> None:
    ep = Episode()
    assert ep.get_duration_s() == 0.0
    ep.add_env_reset(0)
    ep.add_env_step(1, 0, 1.0)
    ep.add_env_step(2, 0, 1.0)
    d = ep.get_duration_s()
    assert isinstance(d, float) and d >= 0.0


def test_get_return_excludes_the_lookback() -> None:
    ep = indexed_episode()
    assert ep.get_return() == pytest.approx(10.0)
    assert indexed_episode(numpy=True).get_return() == pytest.approx(10.0)
    assert ep.cut(3).get_return() == 0


# --------------------------------------------------------------------------------------
# Error contract: the right exception, and all data recorded before it stays intact.
# --------------------------------------------------------------------------------------


def assert_rejected(
    ep: Any,
    exc: type[BaseException],
    fn: Callable[[], Any],
    *,
    match: str | None = None,
    extra_keys: tuple[str, ...] = EXTRAS,
) -> pytest.ExceptionInfo:
    before = snapshot(ep, extra_keys)
    with pytest.raises(exc, match=match) as info:
        fn()
    after = snapshot(ep, extra_keys)
    for key, value in before.items():
        assert_same_outcome(value, after[key], f"after the error: {key}")
    return info


@fastrollout_only
def test_error_classes_extend_the_builtins() -> None:
    assert issubclass(EpisodeStateError, AssertionError)
    assert issubclass(SpaceMismatchError, ValueError)


def test_add_env_reset_twice_raises() -> None:
    ep = stepped_episode(0)
    info = assert_rejected(ep, EpisodeStateError, lambda: ep.add_env_reset(obs_at(9)))
    assert isinstance(info.value, AssertionError)
    ep = stepped_episode(2)
    assert_rejected(ep, AssertionError, lambda: ep.add_env_reset(obs_at(9)))


@pytest.mark.parametrize("flag", ["terminated", "truncated"])
def test_add_env_step_after_done_raises(flag: str) -> None:
    ep = stepped_episode(2, end=flag)
    info = assert_rejected(
        ep, EpisodeStateError, lambda: ep.add_env_step(obs_at(9), act_at(9), 1.0)
    )
    assert isinstance(info.value, AssertionError)


def test_cut_of_done_episode_raises() -> None:
    ep = stepped_episode(3, end="terminated")
    assert_rejected(ep, EpisodeStateError, ep.cut)
    assert_rejected(ep, AssertionError, lambda: ep.cut(len_lookback_buffer=2))


def test_concat_episode_with_other_id_raises() -> None:
    ep = stepped_episode(3)
    other = stepped_episode(3, id_="other").cut()
    other_before = snapshot(other, EXTRAS)
    assert_rejected(ep, EpisodeStateError, lambda: ep.concat_episode(other))
    for key, value in other_before.items():
        assert_same_outcome(value, snapshot(other, EXTRAS)[key], key)


def test_concat_episode_with_mismatching_t_raises() -> None:
    ep = stepped_episode(3)
    succ = ep.cut()
    ep.add_env_step(
        obs_at(4),
        act_at(4),
        4.0,
        extra_model_outputs={"logp": np.float32(0), "h": np.zeros(2, np.float32)},
    )
    info = assert_rejected(ep, EpisodeStateError, lambda: ep.concat_episode(succ))
    assert isinstance(info.value, AssertionError)


def test_concat_episode_onto_done_episode_raises() -> None:
    ep = stepped_episode(3, end="truncated")
    succ = Episode(id_=ep.id_, observations=[obs_at(3)], t_started=ep.t)
    assert_rejected(ep, AssertionError, lambda: ep.concat_episode(succ))


@fastrollout_only
@pytest.mark.parametrize(
    ("space", "bad_obs", "mentions"),
    [
        (gym.spaces.Box(-1.0, 1.0, (4,), np.float32), np.zeros(3, np.float32), ["(4,)", "(3,)"]),
        (
            gym.spaces.Box(-1.0, 1.0, (2, 2), np.float32),
            np.zeros(4, np.float32),
            ["(2, 2)", "(4,)"],
        ),
        (gym.spaces.Discrete(4), np.float32(1.5), ["int64", "float32"]),
        (gym.spaces.Discrete(4), np.array([0.5, 1.0]), ["float64"]),
        (gym.spaces.Box(0, 10, (2,), np.int32), np.zeros(2, np.float64), ["int32", "float64"]),
    ],
)
def test_observation_not_fitting_the_space_raises(
    space: gym.Space, bad_obs: Any, mentions: list
) -> None:
    space.seed(0)
    good = space.sample()
    ep = Episode(observation_space=space)
    # A bad reset observation is rejected too, and leaves the episode un-reset.
    info = assert_rejected(ep, SpaceMismatchError, lambda: ep.add_env_reset(bad_obs), extra_keys=())
    assert not ep.is_reset and isinstance(info.value, ValueError)
    ep.add_env_reset(good)
    ep.add_env_step(good, 0, 1.0)
    info = assert_rejected(
        ep, SpaceMismatchError, lambda: ep.add_env_step(bad_obs, 0, 1.0), extra_keys=()
    )
    message = str(info.value)
    assert isinstance(info.value, ValueError)
    assert "observation" in message
    for text in mentions:
        assert text in message, (text, message)
    ep.add_env_step(good, 1, 2.0)  # The episode still works.
    assert len(ep) == 2


@fastrollout_only
def test_action_not_fitting_the_space_raises() -> None:
    ep = Episode(action_space=gym.spaces.Box(-1.0, 1.0, (4,), np.float32))
    ep.add_env_reset(0)
    info = assert_rejected(
        ep,
        SpaceMismatchError,
        lambda: ep.add_env_step(1, np.zeros(3, np.float32), 1.0),
        extra_keys=(),
    )
    message = str(info.value)
    assert isinstance(info.value, ValueError)
    assert "action" in message and "(4,)" in message and "(3,)" in message
    ep2 = Episode(action_space=gym.spaces.Discrete(3))
    ep2.add_env_reset(0)
    info = assert_rejected(
        ep2,
        SpaceMismatchError,
        lambda: ep2.add_env_step(1, np.array([0.5, 0.5]), 1.0),
        extra_keys=(),
    )
    assert "action" in str(info.value)


@fastrollout_only
def test_safe_casts_are_accepted() -> None:
    # A python int for a float Box and a float64 array for a float32 Box are cast.
    scalar_box = gym.spaces.Box(-5.0, 5.0, (), np.float32)
    ep = Episode(observation_space=scalar_box, action_space=gym.spaces.Discrete(3))
    ep.add_env_reset(3)
    ep.add_env_step(np.float32(1.5), 2, 1.0)
    ep.add_env_step(-2, np.int64(1), 1)  # int reward is numeric too
    ep.to_numpy()
    assert_same(ep.get_observations(), np.array([3.0, 1.5, -2.0], np.float32))
    assert_same(ep.get_actions(), np.array([2, 1]))
    ep = Episode(observation_space=BOX3)
    ep.add_env_reset(np.zeros(3, np.float64))
    ep.add_env_step(np.array([0.25, 0.5, 1.0]), 0, 1.0)
    ep.to_numpy()
    assert_same(ep.get_observations(), np.array([[0, 0, 0], [0.25, 0.5, 1.0]], np.float32))


@fastrollout_only
@pytest.mark.parametrize("bad_reward", ["a", None, {"r": 1}])
def test_non_numeric_reward_raises_type_error(bad_reward: Any) -> None:
    ep = stepped_episode(2)
    info = assert_rejected(
        ep,
        TypeError,
        lambda: ep.add_env_step(
            obs_at(3),
            act_at(3),
            bad_reward,
            extra_model_outputs={"logp": np.float32(0), "h": np.zeros(2, np.float32)},
        ),
    )
    assert "reward" in str(info.value)


def test_index_out_of_range_raises_index_error() -> None:
    for numpy in (False, True):
        ep = stepped_episode(3)
        if numpy:
            ep.to_numpy()
        for get in (ep.get_observations, ep.get_actions, ep.get_rewards, ep.get_infos):
            with pytest.raises(IndexError):
                get(10)
            with pytest.raises(IndexError):
                get(-10)
            with pytest.raises(IndexError):
                get([0, 10])
        with pytest.raises(IndexError):
            ep.get_extra_model_outputs("logp", 3)


# --------------------------------------------------------------------------------------
# to_numpy / finalize / is_numpy.
# --------------------------------------------------------------------------------------


def test_to_numpy_returns_self_and_is_idempotent() -> None:
    ep = stepped_episode(3)
    assert not ep.is_numpy
    assert ep.to_numpy() is ep
    assert ep.is_numpy
    first = snapshot(ep, EXTRAS)
    assert ep.to_numpy() is ep
    second = snapshot(ep, EXTRAS)
    for key, value in first.items():
        assert_same_outcome(value, second[key], key)


def test_to_numpy_of_zero_length_episode() -> None:
    # Only the observations get converted: is_numpy (which follows the rewards) stays
    # False, and actions/rewards stay empty lists.
    ep = Episode()
    ep.add_env_reset(obs_at(0))
    ep.to_numpy()
    assert not ep.is_numpy
    assert_same(ep.get_observations(), obs_at(0)[None])
    assert ep.get_actions() == [] and ep.get_rewards() == [] and ep.get_infos() == [{}]


@fastrollout_only
def test_finalize_is_to_numpy() -> None:
    for n in (0, 3):
        a, b = stepped_episode(n), stepped_episode(n)
        assert a.finalize() is a
        assert b.to_numpy() is b
        assert_same_episode(b, a, EXTRAS)
        assert a.finalize() is a
        assert_same_episode(b, a, EXTRAS)


# --------------------------------------------------------------------------------------
# Spaces: Box dtypes, MultiDiscrete, MultiBinary, nested Dict/Tuple.
# --------------------------------------------------------------------------------------

BOX_DTYPES = [
    np.uint8,
    np.int8,
    np.int16,
    np.int32,
    np.int64,
    np.uint16,
    np.float16,
    np.float32,
    np.float64,
    np.bool_,
]


@pytest.mark.parametrize("dtype", BOX_DTYPES, ids=lambda d: np.dtype(d).name)
def test_box_dtypes_survive_to_numpy(dtype: type) -> None:
    if dtype is np.bool_:
        space = gym.spaces.Box(0, 1, (2,), np.bool_)
    elif np.issubdtype(dtype, np.unsignedinteger):
        space = gym.spaces.Box(0, 9, (2,), dtype)
    else:
        space = gym.spaces.Box(-9, 9, (2,), dtype)
    space.seed(0)
    items = [space.sample() for _ in range(4)]
    ep = Episode(observation_space=space, action_space=space)
    ep.add_env_reset(items[0])
    for i in range(1, 4):
        ep.add_env_step(items[i], items[i - 1], 1.0)
    assert_same(ep.get_observations(2), items[2])
    ep.to_numpy()
    assert_same(ep.get_observations(), np.stack(items))
    assert_same(ep.get_actions(), np.stack(items[:3]))
    padded = ep.get_observations(slice(-2, 2), neg_index_as_lookback=True, fill=0)
    assert padded.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(
        padded, np.concatenate([np.zeros((2, 2), dtype), np.stack(items[:2])])
    )
    assert_same(ep.get_observations(-1), items[3])


def test_multi_discrete_space() -> None:
    space = gym.spaces.MultiDiscrete([2, 3])
    items = [np.array([0, 2]), np.array([1, 0]), np.array([1, 1])]
    for numpy in (False, True):
        ep = Episode(observation_space=space)
        ep.add_env_reset(items[0])
        ep.add_env_step(items[1], 0, 1.0)
        ep.add_env_step(items[2], 0, 1.0)
        if numpy:
            ep.to_numpy()
            assert_same(ep.get_observations(), np.stack(items))
        assert_same(
            ep.get_observations(0, one_hot_discrete=True), np.array([1, 0, 0, 0, 1], np.float32)
        )
        got = ep.get_observations(slice(1, 4), one_hot_discrete=True, fill=0)
        expected = [
            np.array([0, 1, 1, 0, 0], np.float32),
            np.array([0, 1, 0, 1, 0], np.float32),
            np.zeros(5, np.float32),
        ]
        check_batch(got, expected, numpy)


def test_multi_binary_space() -> None:
    space = gym.spaces.MultiBinary(3)
    items = [np.array([0, 1, 1], np.int8), np.array([1, 0, 0], np.int8)]
    ep = Episode(observation_space=space)
    ep.add_env_reset(items[0])
    ep.add_env_step(items[1], 0, 1.0)
    ep.to_numpy()
    assert_same(ep.get_observations(), np.stack(items))
    assert_same(ep.get_observations(5, fill=0), np.zeros(3, np.int8))


NESTED = gym.spaces.Dict(
    {
        "a": gym.spaces.Discrete(3),
        "b": gym.spaces.Tuple(
            (gym.spaces.Box(-1.0, 1.0, (2,), np.float32), gym.spaces.MultiDiscrete([2, 2]))
        ),
    }
)


def nested_obs(i: int) -> dict:
    return {"a": i % 3, "b": (np.full(2, i / 10, np.float32), np.array([i % 2, (i + 1) % 2]))}


def test_nested_dict_and_tuple_space() -> None:
    ep = Episode(observation_space=NESTED, action_space=NESTED)
    ep.add_env_reset(nested_obs(0))
    for i in range(1, 4):
        ep.add_env_step(nested_obs(i), nested_obs(i + 10), float(i))
    assert_same(ep.get_observations(2), nested_obs(2))
    assert_same(ep.get_observations(slice(0, 2)), [nested_obs(0), nested_obs(1)])
    one_hot = ep.get_observations(1, one_hot_discrete=True)
    assert_same(
        one_hot,
        {"a": oh(1, 3), "b": (np.full(2, 0.1, np.float32), np.array([0, 1, 1, 0], np.float32))},
    )
    ep.to_numpy()
    obs = ep.get_observations()
    assert_same(
        obs,
        {
            "a": np.array([0, 1, 2, 0]),
            "b": (
                np.stack([np.full(2, i / 10, np.float32) for i in range(4)]),
                np.array([[0, 1], [1, 0], [0, 1], [1, 0]]),
            ),
        },
    )
    item = ep.get_observations(1)
    assert isinstance(item, dict) and isinstance(item["b"], tuple)
    np.testing.assert_array_equal(item["b"][1], [1, 0])
    assert item["a"] == 1
    acts = ep.get_actions(slice(0, 2))
    np.testing.assert_array_equal(acts["a"], [11 % 3, 12 % 3])
    padded = ep.get_observations(slice(3, 6), fill=0)
    np.testing.assert_array_equal(padded["a"], [0, 0, 0])
    np.testing.assert_array_equal(
        padded["b"][0], np.stack([np.full(2, 0.3, np.float32), np.zeros(2), np.zeros(2)])
    )
    hot = ep.get_observations(slice(0, 2), one_hot_discrete=True)
    np.testing.assert_array_equal(hot["a"], [oh(0, 3), oh(1, 3)])
    np.testing.assert_array_equal(hot["b"][1], [[1, 0, 0, 1], [0, 1, 1, 0]])


# --------------------------------------------------------------------------------------
# set_*.
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("numpy", [False, True], ids=["list", "numpy"])
def test_set_observations(numpy: bool) -> None:
    ep = indexed_episode(numpy=numpy)

    def batch(values: list) -> Any:
        return np.array(values) if numpy else values

    ep.set_observations(new_data=7, at_indices=0)
    check_item(ep.get_observations(0), 7)
    ep.set_observations(new_data=batch([6, 5]), at_indices=[1, -1])
    check_batch(ep.get_observations(), [7, 6, 4, 5, 6, 5], numpy)
    ep.set_observations(new_data=batch([0, 1]), at_indices=slice(2, 4))
    check_batch(ep.get_observations(), [7, 6, 0, 1, 6, 5], numpy)
    ep.set_observations(new_data=batch([1, 1, 1, 1, 1, 1]))
    check_batch(ep.get_observations(), [1] * 6, numpy)
    ep.set_observations(new_data=3, at_indices=-1, neg_index_as_lookback=True)
    check_item(ep.get_observations(-1, neg_index_as_lookback=True), 3)
    ep.set_observations(new_data=batch([4, 4]), at_indices=slice(-2, 0), neg_index_as_lookback=True)
    check_batch(ep.get_observations(slice(-2, 1), neg_index_as_lookback=True), [4, 4, 1], numpy)
    check_batch(ep.get_observations(), [1] * 6, numpy)


@pytest.mark.parametrize("numpy", [False, True], ids=["list", "numpy"])
def test_set_actions_rewards_extras(numpy: bool) -> None:
    ep = indexed_episode(numpy=numpy)

    def batch(values: list, dtype: Any = None) -> Any:
        return np.array(values, dtype) if numpy else values

    ep.set_actions(new_data=19, at_indices=-1)
    ep.set_actions(new_data=batch([0, 1]), at_indices=slice(0, 2))
    check_batch(ep.get_actions(), [0, 1, 14, 15, 19], numpy)
    ep.set_rewards(new_data=9.0, at_indices=2)
    ep.set_rewards(new_data=batch([-1.0, -2.0]), at_indices=[0, 1])
    check_batch(ep.get_rewards(), [-1.0, -2.0, 9.0, 2.5, 3.0], numpy)
    assert ep.get_return() == pytest.approx(11.5)
    ep.set_rewards(new_data=batch([0.0] * 5))
    assert ep.get_return() == 0
    ep.set_extra_model_outputs(key="v", new_data=np.float32(42), at_indices=0)
    ep.set_extra_model_outputs(
        key="v", new_data=batch([7, 8], np.float32), at_indices=slice(-2, None)
    )
    check_batch(ep.get_extra_model_outputs("v"), [42, 3, 4, 7, 8], numpy)
    ep.set_extra_model_outputs(
        key="v",
        new_data=batch([5], np.float32),
        at_indices=slice(-1, 0),
        neg_index_as_lookback=True,
    )
    check_item(ep.get_extra_model_outputs("v", -1, neg_index_as_lookback=True), 5)


@pytest.mark.parametrize("numpy", [False, True], ids=["list", "numpy"])
def test_set_with_wrong_length_raises_index_error(numpy: bool) -> None:
    ep = indexed_episode(numpy=numpy)

    def batch(values: list, dtype: Any = None) -> Any:
        return np.array(values, dtype) if numpy else values

    keys = ("v",)
    assert_rejected(
        ep,
        IndexError,
        lambda: ep.set_observations(new_data=batch([1, 2, 3]), at_indices=slice(0, 2)),
        extra_keys=keys,
    )
    assert_rejected(
        ep,
        IndexError,
        lambda: ep.set_actions(new_data=batch([1]), at_indices=slice(0, 2)),
        extra_keys=keys,
    )
    assert_rejected(
        ep, IndexError, lambda: ep.set_rewards(new_data=batch([1.0, 2.0])), extra_keys=keys
    )
    assert_rejected(
        ep,
        IndexError,
        lambda: ep.set_extra_model_outputs(
            key="v", new_data=batch([1, 2, 3], np.float32), at_indices=slice(3, None)
        ),
        extra_keys=keys,
    )
    assert_rejected(
        ep, IndexError, lambda: ep.set_observations(new_data=1, at_indices=6), extra_keys=keys
    )


def test_set_a_value_that_does_not_fit_the_inferred_layout() -> None:
    # Without spaces the layouts come from the first items (ints); a float set later is
    # stored as add_env_step stores one, and what was recorded before reads as it did.
    ep = Episode(
        observations=[100, 101, 102],
        actions=[1, 2],
        rewards=[0.1, 0.2],
        extra_model_outputs={"n": [3, 4]},
        len_lookback_buffer=1,
    )
    ep.set_observations(new_data=7353.0, at_indices=0)
    assert_same(ep.get_observations(), [7353.0, 102])
    assert_same(ep.get_observations(-1, neg_index_as_lookback=True), 100)
    ep.set_actions(new_data=[0.5], at_indices=slice(0, 1))
    ep.set_extra_model_outputs(key="n", new_data=np.float32(0.25), at_indices=-1)
    assert_same(ep.get_actions(), [0.5])
    assert_same(ep.get_extra_model_outputs("n"), [np.float32(0.25)])
    assert_same(ep.get_actions(slice(-2, None), neg_index_as_lookback=True), [1, 0.5])
    # A batch (an array) of floats into the rewards' float column needs no change; into
    # the ints, it goes in item by item.
    ep.set_observations(new_data=np.array([0.5, 1.5]), at_indices=[0, 1])
    assert_same(ep.get_observations(), [np.float64(0.5), np.float64(1.5)])
    ep.add_env_step(0.75, 3, 0.3, extra_model_outputs={"n": 5})
    assert_same(ep.get_observations(), [np.float64(0.5), np.float64(1.5), 0.75])
    ep.to_numpy()
    np.testing.assert_array_equal(ep.get_observations(), [0.5, 1.5, 0.75])
    np.testing.assert_array_equal(ep.get_actions(), [0.5, 3])
    np.testing.assert_array_equal(ep.get_extra_model_outputs("n"), [0.25, 5])


@fastrollout_only
def test_set_a_value_that_does_not_fit_keeps_everything_on_errors() -> None:
    # A wrong number of values changes nothing, also where the field would change kind.
    ep = Episode(observations=[100, 101, 102], actions=[1, 2], rewards=[0.1, 0.2])
    assert_rejected(
        ep,
        IndexError,
        lambda: ep.set_observations(new_data=[0.5, 1.5], at_indices=slice(-3, None)),
        extra_keys=(),
    )
    assert_rejected(
        ep,
        IndexError,
        lambda: ep.set_observations(new_data=np.array([0.5, 1.5, 2.5])),
        extra_keys=(),
    )
    assert_same(ep.get_observations(), [102])
    # With a space, a value that does not fit it is an error, as in add_env_step.
    spaced = Episode(
        observations=[1, 2],
        observation_space=gym.spaces.Discrete(8),
        actions=[1],
        action_space=gym.spaces.Discrete(4),
        rewards=[0.1],
    )
    assert_rejected(
        spaced,
        SpaceMismatchError,
        lambda: spaced.set_observations(new_data=7353.0, at_indices=0),
        match="observation: expected shape \\(\\) and dtype int64, got 7353.0",
        extra_keys=(),
    )
    assert_rejected(
        spaced,
        SpaceMismatchError,
        lambda: spaced.set_actions(new_data=[0.5], at_indices=[-1]),
        match="action",
        extra_keys=(),
    )
    with pytest.raises(SpaceMismatchError):
        spaced.add_env_step(0.5, 1, 1.0)


# --------------------------------------------------------------------------------------
# cut / concat_episode.
# --------------------------------------------------------------------------------------


def test_cut_without_lookback() -> None:
    ep = stepped_episode(4)
    ep.custom_data["note"] = {"seen": [1]}
    succ = ep.cut()
    assert succ.id_ == ep.id_
    assert len(succ) == 0 and succ.t == succ.t_started == ep.t == 4
    assert succ.is_reset and not succ.is_done and not succ.is_numpy
    assert_same(succ.get_observations(), [obs_at(4)])
    assert succ.get_infos() == [{"i": 4}]
    assert succ.get_actions() == [] and succ.get_rewards() == []
    with pytest.raises(IndexError):
        succ.get_actions(-1, neg_index_as_lookback=True)
    with pytest.raises(IndexError):
        succ.get_observations(-1, neg_index_as_lookback=True)
    assert succ.observation_space == BOX3 and succ.action_space == BOX2
    assert succ.get_return() == 0
    # custom_data is deep-copied.
    assert succ.custom_data == {"note": {"seen": [1]}}
    succ.custom_data["note"]["seen"].append(2)
    succ.custom_data["new"] = True
    assert ep.custom_data == {"note": {"seen": [1]}}


@pytest.mark.parametrize("k", [1, 2, 3, 10])
def test_cut_with_lookback(k: int) -> None:
    ep = stepped_episode(3)
    succ = ep.cut(len_lookback_buffer=k)
    lb = min(k, 3)
    assert len(succ) == 0 and succ.t == succ.t_started == 3
    assert_same(
        succ.get_observations(slice(-lb, None), neg_index_as_lookback=True),
        [obs_at(i) for i in range(3 - lb, 4)],
    )
    assert_same(
        succ.get_actions(slice(-lb, 0), neg_index_as_lookback=True),
        [act_at(i) for i in range(4 - lb, 4)],
    )
    assert succ.get_rewards(slice(-lb, 0), neg_index_as_lookback=True) == [
        float(i) for i in range(4 - lb, 4)
    ]
    assert_same(
        succ.get_extra_model_outputs("logp", slice(-lb, 0), neg_index_as_lookback=True),
        [np.float32(-i) for i in range(4 - lb, 4)],
    )
    all_infos = [{"reset": True}, {"i": 1}, {"i": 2}, {"i": 3}]
    assert succ.get_infos(slice(-lb, None), neg_index_as_lookback=True) == all_infos[3 - lb :]
    with pytest.raises(IndexError):
        succ.get_actions(-lb - 1, neg_index_as_lookback=True)
    succ.add_env_step(
        obs_at(4),
        act_at(4),
        4.0,
        extra_model_outputs={"logp": np.float32(-4), "h": np.zeros(2, np.float32)},
    )
    assert len(succ) == 1 and succ.t == 4 and succ.t_started == 3
    assert succ.get_rewards() == [4.0] and succ.get_return() == 4.0


def test_cut_of_numpy_episode_gives_numpy_successor() -> None:
    ep = stepped_episode(3).to_numpy()
    succ = ep.cut(2)
    assert succ.is_numpy
    assert_same(
        succ.get_actions(slice(-2, 0), neg_index_as_lookback=True), np.stack([act_at(2), act_at(3)])
    )
    succ.add_env_step(
        obs_at(4),
        act_at(4),
        4.0,
        extra_model_outputs={"logp": np.float32(-4), "h": np.zeros(2, np.float32)},
    )
    assert_same(succ.get_rewards(), np.array([4.0]))


@pytest.mark.parametrize("k", [0, 1, 2, 3])
@pytest.mark.parametrize("end", [None, "terminated", "truncated"])
@pytest.mark.parametrize("numpy_successor", [False, True])
def test_cut_then_concat_is_the_whole_episode(
    k: int, end: str | None, numpy_successor: bool
) -> None:
    whole = stepped_episode(6, end=end)
    first = stepped_episode(3)
    first.custom_data.update({"a": 1, "b": 1})
    succ = first.cut(len_lookback_buffer=k)
    for i in range(4, 7):
        succ.add_env_step(
            obs_at(i),
            act_at(i),
            float(i),
            {"i": i},
            terminated=end == "terminated" and i == 6,
            truncated=end == "truncated" and i == 6,
            extra_model_outputs={"logp": np.float32(-i), "h": np.full(2, i, np.float32)},
        )
    succ.custom_data.update({"b": 2, "c": 3})
    if numpy_successor:
        succ.to_numpy()
    assert first.concat_episode(succ) is None
    assert first.custom_data == {"a": 1, "b": 2, "c": 3}
    first.custom_data.clear()
    assert_same_episode(whole, first, EXTRAS, strict_dtype=False)
    whole.to_numpy()
    first.to_numpy()
    assert_same_episode(whole, first, EXTRAS)


# --------------------------------------------------------------------------------------
# slice / __getitem__.
# --------------------------------------------------------------------------------------


def test_slice_basic() -> None:
    ep = stepped_episode(5, end="terminated")
    chunk = ep[1:3]
    assert chunk.id_ == ep.id_
    assert len(chunk) == 2 and chunk.t_started == 1 and chunk.t == 3
    assert_same(chunk.get_observations(), [obs_at(1), obs_at(2), obs_at(3)])
    assert_same(chunk.get_actions(), [act_at(2), act_at(3)])
    assert chunk.get_rewards() == [2.0, 3.0]
    assert chunk.get_infos() == [{"i": 1}, {"i": 2}, {"i": 3}]
    assert_same(chunk.get_extra_model_outputs("logp"), [np.float32(-2), np.float32(-3)])
    assert not chunk.is_done  # the slice does not reach the end
    tail = ep[-2:]
    assert tail.is_terminated and len(tail) == 2 and tail.t_started == 3
    assert ep[:2].t_started == 0 and not ep[:2].is_terminated
    assert_same(ep.slice(slice(1, 3)).get_actions(), chunk.get_actions())


def test_slice_lookback() -> None:
    ep = stepped_episode(5)
    chunk = ep.slice(slice(2, 4), len_lookback_buffer=1)
    assert_same(chunk.get_observations(-1, neg_index_as_lookback=True), obs_at(1))
    assert_same(chunk.get_actions(-1, neg_index_as_lookback=True), act_at(2))
    assert chunk.get_rewards(-1, neg_index_as_lookback=True) == 2.0
    assert_same(chunk.get_observations(), [obs_at(2), obs_at(3), obs_at(4)])
    # Default: as much lookback as `ep` has (none here).
    with pytest.raises(IndexError):
        ep[2:4].get_actions(-1, neg_index_as_lookback=True)
    no_lb = ep.slice(slice(2, 4), len_lookback_buffer=0)
    with pytest.raises(IndexError):
        no_lb.get_observations(-1, neg_index_as_lookback=True)
    # A lookback longer than the data before the slice is shortened.
    long_lb = ep.slice(slice(1, 3), len_lookback_buffer=5)
    assert_same(
        long_lb.get_observations(slice(-1, None), neg_index_as_lookback=True),
        [obs_at(i) for i in range(4)],
    )


def test_slice_of_numpy_episode() -> None:
    ep = stepped_episode(4).to_numpy()
    chunk = ep[1:3]
    assert chunk.is_numpy
    assert_same(chunk.get_observations(), np.stack([obs_at(1), obs_at(2), obs_at(3)]))
    assert_same(chunk.get_rewards(), np.array([2.0, 3.0]))


@pytest.mark.parametrize("item", [0, -1, "a", (1, 2), None])
def test_getitem_non_slice_raises_not_implemented(item: Any) -> None:
    ep = stepped_episode(3)
    with pytest.raises(NotImplementedError):
        ep[item]


# --------------------------------------------------------------------------------------
# State, pickle, copy.
# --------------------------------------------------------------------------------------


def rich_episode(numpy: bool) -> Any:
    ep = stepped_episode(4, agent_id="a0", module_id="m0", multi_agent_episode_id="ma")
    ep = ep.cut(2)
    for i in range(5, 8):
        ep.add_env_step(
            obs_at(i),
            act_at(i),
            float(i),
            {"i": i},
            extra_model_outputs={"logp": np.float32(-i), "h": np.full(2, i, np.float32)},
        )
    ep.custom_data["k"] = [1, 2]
    if numpy:
        ep.to_numpy()
    return ep


@pytest.mark.parametrize("numpy", [False, True], ids=["list", "numpy"])
@pytest.mark.parametrize(
    "how",
    [
        lambda ep: type(ep).from_state(ep.get_state()),
        lambda ep: pickle.loads(pickle.dumps(ep)),
        copy.copy,
        copy.deepcopy,
    ],
    ids=["state", "pickle", "copy", "deepcopy"],
)
def test_round_trips_preserve_every_getter(how: Callable[[Any], Any], numpy: bool) -> None:
    ep = rich_episode(numpy)
    clone = how(ep)
    assert_same_episode(ep, clone, EXTRAS)
    # Also the details of the lookback and the padded views.
    for get in ("get_observations", "get_actions", "get_rewards", "get_infos"):
        for kwargs in ({"neg_index_as_lookback": True}, {"neg_index_as_lookback": True, "fill": 0}):
            assert_same(
                getattr(clone, get)(slice(-3, 2), **kwargs),
                getattr(ep, get)(slice(-3, 2), **kwargs),
                get,
            )


# (Not from_state(get_state()): RLlib's state holds the episode's own lists, so a restored
# episode shares them with the original until it is pickled.)
@pytest.mark.parametrize(
    "how",
    [copy.deepcopy, lambda ep: pickle.loads(pickle.dumps(ep))],
    ids=["deepcopy", "pickle"],
)
def test_round_trip_copies_are_independent_and_continue(how: Callable[[Any], Any]) -> None:
    ep = rich_episode(False)
    before = snapshot(ep, EXTRAS)
    clone = how(ep)
    clone.add_env_step(
        obs_at(9),
        act_at(9),
        9.0,
        extra_model_outputs={"logp": np.float32(-9), "h": np.zeros(2, np.float32)},
    )
    clone.custom_data["k"].append(3)
    assert len(clone) == len(ep) + 1 and clone.t == ep.t + 1
    for key, value in before.items():
        assert_same_outcome(value, snapshot(ep, EXTRAS)[key], key)


def test_custom_data_is_a_mutable_dict() -> None:
    ep = Episode()
    ep.custom_data["x"] = 1
    ep.custom_data.setdefault("y", []).append(2)
    assert ep.custom_data == {"x": 1, "y": [2]}


def test_episode_ids_are_random_uuid4_hex():
    """Single- and multi-agent episodes get RLlib's id format (``uuid.uuid4().hex``):
    32 hex digits of a version-4, RFC 4122 UUID; distinct per episode."""
    import uuid

    from fastrollout import MultiAgentEpisode, SingleAgentEpisode

    # (more than one batch of the random bytes drawn 256 ids at a time)
    ids = [SingleAgentEpisode().id_ for _ in range(300)] + [
        MultiAgentEpisode().id_ for _ in range(300)
    ]
    assert len(set(ids)) == len(ids)
    for i in ids:
        u = uuid.UUID(hex=i)
        assert u.hex == i and u.version == 4 and u.variant == uuid.RFC_4122


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_process_draws_its_own_episode_ids():
    """The ids' random bytes are drawn ahead; a forked child must not repeat its parent's."""
    from fastrollout.episodes._ids import new_episode_id

    new_episode_id()  # (the parent holds drawn bytes now)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        os.close(read)
        os.write(write, "".join(new_episode_id() for _ in range(3)).encode())
        os._exit(0)
    os.close(write)
    child = os.read(read, 1024).decode()
    os.close(read)
    os.waitpid(pid, 0)
    parent = "".join(new_episode_id() for _ in range(3))
    assert len(child) == len(parent) == 96 and child != parent
