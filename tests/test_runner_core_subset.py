"""The runner's native hot path on a subset of sub-envs (``env_indices``): the vector-step
record, the multi-agent record and the per-module gather/scatter take the rows of the
sub-envs that stepped, with the runner's full list of episodes."""

from __future__ import annotations

from collections import Counter

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests._helpers import assert_same_episode, assert_same_outcome, snapshot

from fastrollout import MultiAgentEpisode, SingleAgentEpisode
from fastrollout._core import (
    ModuleBatcher,
    multi_agent_record_steps,
    single_agent_record_vector_step,
)
from fastrollout.errors import EpisodeStateError, MultiAgentEnvError, SpaceMismatchError

OBS = gym.spaces.Box(-10.0, 10.0, (3,), np.float32)
ACT = gym.spaces.Discrete(4)
EXTRAS = ("action_logp", "weights_seq_no")


def _episode(id_: str | None = None) -> SingleAgentEpisode:
    return SingleAgentEpisode(id_=id_, observation_space=OBS, action_space=ACT)


def _twins(n: int) -> tuple[list[SingleAgentEpisode], list[SingleAgentEpisode]]:
    """Two lists of n new episodes, pairwise with the same id."""
    a = [_episode() for _ in range(n)]
    return a, [_episode(e.id_) for e in a]


def _as(indices: list[int], form: str) -> object:
    """``indices`` in one of the forms env_indices takes."""
    if form == "list":
        return list(indices)
    if form == "tuple":
        return tuple(indices)
    if form == "range" and indices == list(range(len(indices))):
        return range(len(indices))
    if form == "strided":
        # A non-contiguous int64 view.
        return np.repeat(np.asarray(indices, np.int64), 2)[::2]
    return np.asarray(indices, dtype=form if form not in ("range", "strided") else np.int64)


_FORMS = st.sampled_from(["list", "tuple", "range", "int64", "int32", "uint8", "strided"])


def _subsets(n: int) -> st.SearchStrategy[list[int]]:
    """Distinct sub-env indices of n, in any order, from none to all."""
    return st.permutations(list(range(n))).flatmap(
        lambda p: st.integers(0, n).map(lambda k: list(p[:k]))
    )


def _step(rng: np.random.Generator, m: int, t: int) -> dict:
    """A random vector step of m rows (flags, vector infos with masks, extras)."""
    term = rng.random(m) < 0.2
    return {
        "observations": rng.normal(size=(m, 3)).astype(np.float32),
        "actions": rng.integers(0, 4, m),
        "rewards": rng.normal(size=m),
        "terminateds": term,
        "truncateds": (rng.random(m) < 0.2) & ~term,
        "infos": {"x": np.arange(m) + 10 * t, "_x": rng.random(m) < 0.5},
        "extra_model_outputs": {
            "action_logp": rng.normal(size=m).astype(np.float32),
            "weights_seq_no": t,
        },
    }


def _row(step: dict, j: int) -> dict:
    """Row j of a vector step, as a one-row vector step."""

    def cut(v):
        if isinstance(v, dict):
            return {k: cut(x) for k, x in v.items()}
        return v[j : j + 1] if isinstance(v, np.ndarray) else v

    return {k: cut(v) for k, v in step.items()}


# --------------------------------------------------------------------------------------
# single_agent_record_vector_step
# --------------------------------------------------------------------------------------


@settings(max_examples=80, deadline=None)
@given(n=st.integers(1, 6), steps=st.integers(1, 8), seed=st.integers(0, 2**16), data=st.data())
def test_subset_record_equals_recording_each_row_alone(n, steps, seed, data):
    """A record of any subset of sub-envs (any order, any form of env_indices) leaves each
    episode as recording its row alone does, through resets, first steps, later steps and
    dones; started/done are the episode indices, in row order."""
    rng = np.random.default_rng(seed)
    subset, alone = _twins(n)
    finished: list[tuple[SingleAgentEpisode, SingleAgentEpisode]] = []
    for t in range(steps):
        idx = data.draw(_subsets(n), label=f"env_indices of step {t}")
        form = data.draw(_FORMS, label="form")
        step = _step(rng, len(idx), t)
        started, done = single_agent_record_vector_step(subset, **step, env_indices=_as(idx, form))
        want_started, want_done = [], []
        for j, i in enumerate(idx):
            s, d = single_agent_record_vector_step([alone[i]], **_row(step, j))
            want_started += [i] * len(s)
            want_done += [i] * len(d)
        assert (started, done) == (want_started, want_done)
        for i in done:
            finished.append((alone[i], subset[i]))
            alone[i] = _episode()
            subset[i] = _episode(alone[i].id_)
    for a, b in finished + list(zip(alone, subset, strict=True)):
        assert_same_episode(a, b, EXTRAS)


def test_env_indices_of_every_sub_env_in_order_equal_no_env_indices():
    rng = np.random.default_rng(1)
    given_, default = _twins(4)
    finished = []
    for t in range(8):
        step = _step(rng, 4, t)
        out = single_agent_record_vector_step(given_, **step, env_indices=np.arange(4))
        assert out == single_agent_record_vector_step(default, **step)
        for i in out[1]:
            finished.append((default[i], given_[i]))
            default[i] = _episode()
            given_[i] = _episode(default[i].id_)
    assert finished
    for a, b in finished + list(zip(default, given_, strict=True)):
        assert_same_episode(a, b, EXTRAS)


def test_started_and_done_are_episode_indices_in_row_order():
    n = 8
    eps = [_episode() for _ in range(n)]
    z = np.zeros(n, bool)
    single_agent_record_vector_step(
        eps, np.zeros((n, 3), np.float32), np.zeros(n, np.int64), np.zeros(n), z, z
    )
    eps[2] = _episode()  # a new episode (next-step autoreset): its row is its reset
    started, done = single_agent_record_vector_step(
        eps,
        np.ones((4, 3), np.float32),
        np.array([1, 2, 3, 0]),
        np.array([1.0, 2.0, 3.0, 4.0]),
        np.array([False, False, True, False]),
        np.array([True, False, False, False]),
        [{"r": 0}, {"r": 1}, {"r": 2}, {"r": 3}],
        env_indices=[7, 2, 5, 0],
    )
    assert (started, done) == ([2], [7, 5])
    assert [len(e) for e in eps] == [1, 0, 0, 0, 0, 1, 0, 1]
    assert eps[2].is_reset and eps[2].get_infos(-1) == {"r": 1}
    assert eps[7].is_truncated and eps[7].get_actions(-1) == 1 and eps[7].get_infos(-1) == {"r": 0}
    assert eps[5].is_terminated and eps[5].get_return() == 3.0
    assert eps[0].get_rewards(-1) == 4.0 and not eps[0].is_done
    # None of the sub-envs: nothing happens.
    assert single_agent_record_vector_step(
        eps,
        np.zeros((0, 3), np.float32),
        np.zeros(0, np.int64),
        np.zeros(0),
        np.zeros(0, bool),
        np.zeros(0, bool),
        env_indices=[],
    ) == ([], [])


def _reset_all(n: int) -> list[SingleAgentEpisode]:
    eps = [_episode() for _ in range(n)]
    z = np.zeros(n, bool)
    single_agent_record_vector_step(
        eps, np.zeros((n, 3), np.float32), np.zeros(n, np.int64), np.zeros(n), z, z
    )
    return eps


def _lens(eps: list) -> list[tuple[int, int, bool]]:
    return [(len(e), len(e.get_observations()), e.is_done) for e in eps]


@pytest.mark.parametrize(
    ("env_indices", "error", "match"),
    [
        ([1, 8], ValueError, r"env_indices\[1\] is 8, not a sub-env index.*sub-envs 0 to 7"),
        (np.array([-1, 0]), ValueError, r"env_indices\[0\] is -1"),
        ([3, 1, 3], ValueError, r"sub-env 3 twice \(entries 0 and 2\)"),
        (np.array([2, 2, 0], np.int32), ValueError, r"sub-env 2 twice"),
        ([0, 2**70, 1], ValueError, r"env_indices\[1\] is 1180591620717411303424"),
        ([0, 1.0, 2], TypeError, r"env_indices\[1\] is 1.0, not an int"),
        ([0, True, 2], TypeError, r"env_indices\[1\] is True, not an int"),
        (np.array([True, False, True]), TypeError, r"dtype bool"),
        (np.array([0.0, 1.0, 2.0]), TypeError, r"dtype float64"),
        (np.array([[0, 1, 2]]), TypeError, r"shape \[1, 3\]"),
        (5, TypeError, r"got a int"),
    ],
)
def test_bad_env_indices_name_the_value_and_store_nothing(env_indices, error, match):
    eps = _reset_all(8)
    before = _lens(eps)
    m = 3
    z = np.zeros(m, bool)
    with pytest.raises(error, match=match):
        single_agent_record_vector_step(
            eps,
            np.ones((m, 3), np.float32),
            np.ones(m, np.int64),
            np.ones(m),
            z,
            z,
            env_indices=env_indices,
        )
    assert _lens(eps) == before


@pytest.mark.parametrize(
    ("field", "match"),
    [
        ("observations", r"observations: 4 rows, but env_indices has 3 entries"),
        ("actions", r"actions: 4 rows, but env_indices has 3 entries"),
        ("rewards", r"rewards: 4 rows"),
        ("extra", r"extra model output \"action_logp\": 4 rows"),
        ("dict_obs", r"observations: 4 rows"),
        ("terminateds", r"terminateds: expected 3 flags \(one per entry of env_indices\), got 4"),
        ("truncateds", r"truncateds: expected 3 flags \(one per entry of env_indices\), got 4"),
        ("infos", r"infos: expected 3 info dicts \(one per entry of env_indices\), got 4"),
    ],
)
def test_batches_without_one_row_per_entry_are_refused_before_anything_is_stored(field, match):
    """A batch of 4 rows (e.g. every sub-env's) with 3 env indices is an error, also where
    the rows would fit the episodes one by one (resets included)."""
    eps = _reset_all(8)
    eps[6] = _episode()
    before = _lens(eps)
    m = 3
    args = {
        "observations": np.ones((m, 3), np.float32),
        "actions": np.ones(m, np.int64),
        "rewards": np.ones(m),
        "terminateds": np.zeros(m, bool),
        "truncateds": np.zeros(m, bool),
        "infos": [{}] * m,
        "extra_model_outputs": {"action_logp": np.zeros(m, np.float32), "weights_seq_no": 1},
    }
    if field == "extra":
        args["extra_model_outputs"]["action_logp"] = np.zeros(m + 1, np.float32)
    elif field == "dict_obs":
        args["observations"] = {"a": np.ones((m + 1, 3), np.float32)}
    elif field == "infos":
        args["infos"] = [{}] * (m + 1)
    else:
        args[field] = np.ones((m + 1, *np.shape(args[field])[1:]), args[field].dtype)
    with pytest.raises(ValueError, match=match):
        single_agent_record_vector_step(eps, **args, env_indices=[6, 1, 4])
    assert _lens(eps) == before


def test_extra_constants_are_not_batches_with_env_indices():
    """An extra model output that is not a numpy array (a list, a dict, a number) is given
    to every row as it is, whatever its length: only arrays must have one row per entry."""
    subset, alone = _twins(5)
    idx = [3, 0]
    reset = _step(np.random.default_rng(0), 2, 0)
    single_agent_record_vector_step(subset, **reset, env_indices=idx)
    for j, i in enumerate(idx):
        single_agent_record_vector_step([alone[i]], **_row(reset, j))
    constants = {"l": [1.0, 2.0, 3.0], "d": {"a": np.zeros(4)}, "s": "x", "seq": 7}
    z = np.zeros(2, bool)
    single_agent_record_vector_step(
        subset,
        np.ones((2, 3), np.float32),
        np.array([1, 2]),
        np.ones(2),
        z,
        z,
        None,
        constants,
        env_indices=idx,
    )
    for j, i in enumerate(idx):
        single_agent_record_vector_step(
            [alone[i]],
            np.ones((1, 3), np.float32),
            np.array([1, 2])[j : j + 1],
            np.ones(1),
            z[:1],
            z[:1],
            None,
            constants,
        )
    for a, b in zip(alone, subset, strict=True):
        assert_same_episode(a, b, (*EXTRAS, *constants))
    assert subset[3].get_extra_model_outputs("l", -1) == pytest.approx([1.0, 2.0, 3.0])


def test_row_errors_name_the_sub_env_by_its_episode_index_and_store_nothing():
    eps = _reset_all(8)
    eps[5].add_env_step(np.zeros(3, np.float32), 0, 0.0, terminated=True)
    # A new episode whose observations have another shape than the batch's rows.
    eps[3] = SingleAgentEpisode(
        observation_space=gym.spaces.Box(-1.0, 1.0, (2,), np.float32), action_space=ACT
    )
    before = _lens(eps)
    z = np.zeros(3, bool)
    obs, act, rew = np.ones((3, 3), np.float32), np.ones(3, np.int64), np.ones(3)
    # A done episode (fast-path row) ...
    with pytest.raises(EpisodeStateError, match=r"^sub-env 5: .*done"):
        single_agent_record_vector_step(eps, obs, act, rew, z, z, env_indices=[1, 5, 3])
    assert _lens(eps) == before
    # ... and a reset observation that does not fit its episode's space.
    with pytest.raises(SpaceMismatchError, match=r"^sub-env 3: .*\(2,\)"):
        single_agent_record_vector_step(eps, obs, act, rew, z, z, env_indices=[1, 2, 3])
    assert _lens(eps) == before


# --------------------------------------------------------------------------------------
# multi_agent_record_steps
# --------------------------------------------------------------------------------------


def _mapping(aid, episode):
    return "even" if aid % 2 == 0 else "odd"


def _ma_twins(n: int) -> tuple[list[MultiAgentEpisode], list[MultiAgentEpisode]]:
    a = [MultiAgentEpisode(agent_to_module_mapping_fn=_mapping) for _ in range(n)]
    b = [MultiAgentEpisode(id_=e.id_, agent_to_module_mapping_fn=_mapping) for e in a]
    for x, y in zip(a, b, strict=True):
        for e in (x, y):
            e.add_env_reset(observations={0: np.zeros(3, np.float32), 1: np.zeros(3, np.float32)})
    return a, b


def _assert_same_ma(a: MultiAgentEpisode, b: MultiAgentEpisode) -> None:
    assert (a.env_t, a.is_done, a.is_terminated, a.get_return()) == (
        b.env_t,
        b.is_done,
        b.is_terminated,
        b.get_return(),
    )
    assert list(a.agent_episodes) == list(b.agent_episodes)
    for aid, ae in a.agent_episodes.items():
        # (Agent episodes get ids of their own.)
        sa, sb = snapshot(ae, ("logp",)), snapshot(b.agent_episodes[aid], ("logp",))
        del sa["id_"], sb["id_"]
        assert_same_outcome(sa, sb)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 5), steps=st.integers(1, 6), seed=st.integers(0, 2**16), data=st.data())
def test_multi_agent_subset_record_equals_recording_each_sub_env_alone(n, steps, seed, data):
    rng = np.random.default_rng(seed)
    subset, alone = _ma_twins(n)
    counts_subset: tuple[Counter, Counter] = (Counter(), Counter())
    counts_alone: tuple[Counter, Counter] = (Counter(), Counter())
    for _ in range(steps):
        live = [i for i in range(n) if not subset[i].is_done]
        idx = data.draw(
            st.permutations(live).flatmap(lambda p: st.just(list(p[: len(p) // 2 + 1])))
        )
        form = data.draw(_FORMS, label="form")
        rows = []
        for _ in idx:
            agents = [a for a in (0, 1) if rng.random() < 0.8] or [0]
            end = bool(rng.random() < 0.15)
            rows.append(
                (
                    {a: rng.normal(size=3).astype(np.float32) for a in agents},
                    {a: int(rng.integers(0, 4)) for a in agents},
                    {a: float(rng.normal()) for a in agents},
                    None,
                    {"__all__": end, **{a: end for a in agents}} if end else None,
                    None,
                    {a: {"logp": float(rng.normal())} for a in agents},
                )
            )
        columns = [list(c) for c in zip(*rows, strict=True)] if rows else [[] for _ in range(7)]
        done = multi_agent_record_steps(
            subset,
            *columns,
            agent_steps=counts_subset[0],
            module_steps=counts_subset[1],
            env_indices=_as(idx, form),
        )
        want = []
        for j, i in enumerate(idx):
            d = multi_agent_record_steps(
                [alone[i]],
                *[[c[j]] for c in columns],
                agent_steps=counts_alone[0],
                module_steps=counts_alone[1],
            )
            want += [i] * len(d)
        assert done == want
    assert counts_subset == counts_alone
    for a, b in zip(alone, subset, strict=True):
        _assert_same_ma(a, b)


def test_multi_agent_subset_record_returns_episode_indices_and_names_them_in_errors():
    eps, _ = _ma_twins(6)
    ob = np.zeros(3, np.float32)
    done = multi_agent_record_steps(
        eps,
        [{0: ob}, {0: ob, 1: ob}],
        [{0: 1, 1: 2}, {0: 3, 1: 0}],
        [{0: 1.0}, {0: 2.0, 1: 3.0}],
        [None, None],
        [None, {"__all__": True}],
        [None, None],
        [None, None],
        env_indices=np.array([4, 1]),
    )
    assert done == [1]
    assert [e.env_t for e in eps] == [0, 1, 0, 0, 1, 0]
    assert eps[1].is_terminated and eps[4].get_return() == 1.0
    before = [(e.env_t, e.is_done) for e in eps]
    # A done episode: the error names it by its index in the runner's list.
    with pytest.raises(MultiAgentEnvError, match=r"^sub-env 1: .*already done"):
        multi_agent_record_steps(
            eps, [{0: ob}], [{0: 1}], [{0: 1.0}], [None], [None], [None], [None], env_indices=[1]
        )
    for env_indices, error, match in [
        ([0, 6], ValueError, r"env_indices\[1\] is 6"),
        ([2, 2], ValueError, r"sub-env 2 twice"),
        ([0, -3], ValueError, r"env_indices\[1\] is -3"),
        (
            [0],
            ValueError,
            r"observations: expected 1 dicts \(one per entry of env_indices\), got 2",
        ),
        (["0", 1], TypeError, r"env_indices\[0\] is '0', not an int"),
    ]:
        with pytest.raises(error, match=match):
            multi_agent_record_steps(
                eps,
                [{0: ob}, {0: ob}],
                [{0: 1}, {0: 1}],
                [{0: 1.0}, {0: 1.0}],
                *[[None, None]] * 4,
                env_indices=env_indices,
            )
        assert [(e.env_t, e.is_done) for e in eps] == before


# --------------------------------------------------------------------------------------
# ModuleBatcher.gather / index_map / scatter
# --------------------------------------------------------------------------------------


def _ma_episodes(n: int) -> list[MultiAgentEpisode]:
    return [MultiAgentEpisode(agent_to_module_mapping_fn=_mapping) for _ in range(n)]


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 6),
    data=st.data(),
)
def test_gather_of_a_subset_is_the_gather_of_its_episodes_with_episode_indices(n, data):
    """Gathering rows of sub-envs ``idx`` of the full list gives the batches that gathering
    the same rows with just those episodes gives; the index map says which episode each
    row is (a value of idx), and the scatter has one entry per row, entry j for idx[j],
    every agent getting back the action computed from its own observation."""
    idx = data.draw(_subsets(n), label="env_indices")
    obs_values = data.draw(
        st.lists(
            st.one_of(
                st.none(),
                st.dictionaries(st.integers(0, 5), st.floats(-5, 5, width=32), max_size=4),
            ),
            min_size=len(idx),
            max_size=len(idx),
        ),
        label="observations",
    )
    done_agents = data.draw(
        st.lists(st.sets(st.integers(0, 5), max_size=2), min_size=len(idx), max_size=len(idx)),
        label="terminated agents",
    )
    form = data.draw(_FORMS, label="form")
    eps = _ma_episodes(n)
    obs = [
        None if d is None else {a: np.full(3, v + 10 * a, np.float32) for a, v in d.items()}
        for d in obs_values
    ]
    terminateds = [{a: True for a in s} for s in done_agents]
    full, alone = ModuleBatcher({"even": OBS, "odd": OBS}), ModuleBatcher({"even": OBS, "odd": OBS})
    got = full.gather(eps, obs, terminateds, None, env_indices=_as(idx, form))
    want = alone.gather([eps[i] for i in idx], obs, terminateds)
    assert list(got) == list(want)
    for mid in got:
        np.testing.assert_array_equal(got[mid], want[mid])
        assert full.index_map(mid) == [(idx[j], aid) for j, aid in alone.index_map(mid)]
    per_row = full.scatter({mid: {"actions": b[:, 0].copy()} for mid, b in got.items()})
    assert len(per_row) == len(idx)
    for j, d in enumerate(obs):
        acting = {a: o[0] for a, o in (d or {}).items() if a not in done_agents[j]}
        assert per_row[j][0] == acting and per_row[j][1] == acting


def test_gather_subset_errors_name_the_episode_index():
    b = ModuleBatcher({"even": OBS})
    eps = _ma_episodes(8)
    ok = {0: np.zeros(3, np.float32)}
    with pytest.raises(SpaceMismatchError, match=r"^sub-env 5: observation of agent 0"):
        b.gather(eps, [ok, {0: np.zeros(2, np.float32)}], env_indices=[2, 5])
    with pytest.raises(KeyError, match=r"sub-env 6: agent 1 maps to module \"odd\""):
        b.gather(eps, [{1: np.zeros(3, np.float32)}], env_indices=[6])
    for kwargs, error, match in [
        ({"env_indices": [2, 8]}, ValueError, r"env_indices\[1\] is 8"),
        ({"env_indices": [3, 3]}, ValueError, r"sub-env 3 twice"),
        ({"env_indices": [3]}, ValueError, r"one observation dict per entry of env_indices"),
        ({"env_indices": [3, 4], "terminateds": [None]}, ValueError, r"terminateds: expected 2"),
        ({"env_indices": [3, 4], "truncateds": [None] * 3}, ValueError, r"truncateds: expected 2"),
        ({"env_indices": {"a": 1}}, TypeError, r"env_indices\[0\] is 'a', not an int"),
    ]:
        with pytest.raises(error, match=match):
            b.gather(eps, [ok, ok], **kwargs)
    # Without env_indices, one observation dict per episode, as before.
    with pytest.raises(ValueError, match="one episode per sub-env: 8 episodes, 2"):
        b.gather(eps, [ok, ok])


def test_gather_scatter_record_of_a_subset_steps_only_those_sub_envs():
    """The runner's step on the ready sub-envs: gather, scatter and record with the same
    env_indices; the other episodes are left as they are."""
    n = 6
    eps = _ma_episodes(n)
    ob = [np.full(3, i, np.float32) for i in range(n)]
    for i, e in enumerate(eps):
        e.add_env_reset(observations={0: ob[i], 1: ob[i]})
    b = ModuleBatcher({"even": OBS, "odd": OBS})
    ready = np.array([4, 0, 3])
    gathered = b.gather(eps, [{0: ob[i], 1: ob[i]} for i in ready], env_indices=ready)
    assert b.index_map("even") == [(4, 0), (0, 0), (3, 0)]
    outputs = {
        mid: {"actions": np.arange(3) + 10 * k, "action_logp": batch[:, 0] * -1.0}
        for k, (mid, batch) in enumerate(gathered.items())
    }
    per_row = b.scatter(outputs, extra_constants={"weights_seq_no": 1}, extras_as_rows=True)
    assert [p[1] for p in per_row] == [{0: 0, 1: 10}, {0: 1, 1: 11}, {0: 2, 1: 12}]
    done = multi_agent_record_steps(
        eps,
        [{0: ob[i] + 1, 1: ob[i] + 1} for i in ready],
        [p[1] for p in per_row],
        [{0: 1.0, 1: float(i)} for i in ready],
        [None] * 3,
        [None, None, {"__all__": True}],
        [None] * 3,
        [p[2] for p in per_row],
        env_indices=ready,
    )
    assert done == [3]
    assert [e.env_t for e in eps] == [1, 0, 0, 1, 1, 0]
    for j, i in enumerate(ready):
        ae = eps[i].agent_episodes[0]
        assert ae.get_actions(-1) == j
        assert ae.get_extra_model_outputs("action_logp", -1) == -float(i)
        assert ae.get_extra_model_outputs("weights_seq_no", -1) == 1
