"""The runner's native hot path: batched vector-step record, per-module gather and scatter."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastrollout import MultiAgentEpisode, SingleAgentEpisode
from fastrollout._core import (
    ModuleBatcher,
    multi_agent_record_steps,
    single_agent_record_vector_step,
)
from fastrollout.errors import EpisodeStateError, SpaceMismatchError

OBS = gym.spaces.Box(-10.0, 10.0, (3,), np.float32)
ACT = gym.spaces.Discrete(4)


def _episodes(n: int) -> list[SingleAgentEpisode]:
    return [SingleAgentEpisode(observation_space=OBS, action_space=ACT) for _ in range(n)]


def _error_of(call) -> str | None:
    try:
        call()
    except Exception as e:  # the outcome is compared, whatever it is
        return f"{type(e).__name__}: {e}"
    return None


def _reset(eps: list[SingleAgentEpisode], obs: np.ndarray) -> tuple[list[int], list[int]]:
    n = len(eps)
    return single_agent_record_vector_step(
        eps, obs, np.zeros(n, np.int64), np.zeros(n), np.zeros(n, bool), np.zeros(n, bool)
    )


def test_vector_step_records_rows_like_add_env_step():
    n = 3
    native, reference = _episodes(n), _episodes(n)
    rng = np.random.default_rng(0)
    obs0 = rng.normal(size=(n, 3)).astype(np.float32)
    assert _reset(native, obs0) == ([0, 1, 2], [])
    for i, e in enumerate(reference):
        e.add_env_reset(observation=obs0[i], infos={})
    for t in range(5):
        obs = rng.normal(size=(n, 3)).astype(np.float32)
        act = rng.integers(0, 4, n)
        rew = rng.normal(size=n)
        logp = rng.normal(size=n).astype(np.float32)
        dist = rng.normal(size=(n, 4)).astype(np.float32)
        started, done = single_agent_record_vector_step(
            native,
            obs,
            act,
            rew,
            np.zeros(n, bool),
            np.array([False, False, t == 4]),
            {},
            {"action_logp": logp, "action_dist_inputs": dist, "weights_seq_no": 7},
        )
        assert started == []
        assert done == ([2] if t == 4 else [])
        for i, e in enumerate(reference):
            e.add_env_step(
                observation=obs[i],
                action=act[i],
                reward=rew[i],
                infos={},
                truncated=(t == 4 and i == 2),
                extra_model_outputs={
                    "action_logp": logp[i],
                    "action_dist_inputs": dist[i],
                    "weights_seq_no": 7,
                },
            )
    for a, b in zip(native, reference, strict=True):
        a.to_numpy()
        b.to_numpy()
        np.testing.assert_array_equal(a.get_observations(), b.get_observations())
        np.testing.assert_array_equal(a.get_actions(), b.get_actions())
        np.testing.assert_array_equal(a.get_rewards(), b.get_rewards())
        for k in ("action_logp", "action_dist_inputs", "weights_seq_no"):
            np.testing.assert_array_equal(
                a.get_extra_model_outputs(k), b.get_extra_model_outputs(k)
            )
        assert a.get_actions().dtype == b.get_actions().dtype
        assert (a.is_truncated, a.is_terminated, len(a)) == (
            b.is_truncated,
            b.is_terminated,
            len(b),
        )


def test_unreset_episode_takes_its_row_as_reset():
    eps = _episodes(2)
    _reset(eps, np.zeros((2, 3), np.float32))
    single_agent_record_vector_step(
        eps,
        np.ones((2, 3), np.float32),
        np.array([1, 2]),
        np.ones(2),
        np.array([True, False]),
        np.zeros(2, bool),
    )
    eps[0] = SingleAgentEpisode(observation_space=OBS, action_space=ACT)
    # gymnasium's next-step autoreset: the done sub-env's row is its reset observation.
    started, done = single_agent_record_vector_step(
        eps,
        np.full((2, 3), 2, np.float32),
        np.array([3, 3]),
        np.array([5.0, 1.0]),
        np.zeros(2, bool),
        np.zeros(2, bool),
    )
    assert (started, done) == ([0], [])
    assert len(eps[0]) == 0 and eps[0].is_reset
    np.testing.assert_array_equal(eps[0].get_observations(-1), np.full(3, 2, np.float32))
    assert len(eps[1]) == 2 and eps[1].get_return() == 2.0


def test_gymnasium_vector_infos_are_unbatched():
    eps = _episodes(3)
    infos = {
        "x": np.array([1, 2, 3]),
        "_x": np.array([True, False, True]),
        "y": np.array([7, 8, 9]),
    }
    _reset(eps, np.zeros((3, 3), np.float32))
    single_agent_record_vector_step(
        eps,
        np.zeros((3, 3), np.float32),
        np.zeros(3, np.int64),
        np.zeros(3),
        np.zeros(3, bool),
        np.zeros(3, bool),
        infos,
    )
    assert eps[0].get_infos(-1) == {"x": 1, "y": 7}
    assert eps[1].get_infos(-1) == {"y": 8}
    # A list of infos (one per sub-env) is taken as it is.
    single_agent_record_vector_step(
        eps,
        np.zeros((3, 3), np.float32),
        np.zeros(3, np.int64),
        np.zeros(3),
        np.zeros(3, bool),
        np.zeros(3, bool),
        [{"a": 1}, {}, {"c": 3}],
    )
    assert [e.get_infos(-1) for e in eps] == [{"a": 1}, {}, {"c": 3}]


def test_wrong_observation_shape_names_observation_and_space_and_stores_nothing():
    eps = _episodes(2)
    _reset(eps, np.zeros((2, 3), np.float32))
    with pytest.raises(SpaceMismatchError, match=r"observations.*shape \(3,\)"):
        single_agent_record_vector_step(
            eps,
            np.zeros((2, 4), np.float32),
            np.zeros(2, np.int64),
            np.zeros(2),
            np.zeros(2, bool),
            np.zeros(2, bool),
        )
    assert all(len(e) == 0 for e in eps)


def test_errors_leave_every_episode_unchanged():
    eps = _episodes(2)
    _reset(eps, np.zeros((2, 3), np.float32))
    done = SingleAgentEpisode(observation_space=OBS, action_space=ACT)
    done.add_env_reset(observation=np.zeros(3, np.float32))
    done.add_env_step(observation=np.zeros(3, np.float32), action=0, reward=0.0, terminated=True)
    with pytest.raises(EpisodeStateError, match=r"sub-env 2.*done"):
        single_agent_record_vector_step(
            [*eps, done],
            np.zeros((3, 3), np.float32),
            np.zeros(3, np.int64),
            np.zeros(3),
            np.zeros(3, bool),
            np.zeros(3, bool),
        )
    assert all(len(e) == 0 for e in eps)
    with pytest.raises(ValueError, match="terminateds: expected 2 flags"):
        single_agent_record_vector_step(
            eps,
            np.zeros((2, 3), np.float32),
            np.zeros(2, np.int64),
            np.zeros(2),
            np.zeros(3, bool),
            np.zeros(2, bool),
        )
    with pytest.raises(ValueError, match="infos: expected 2"):
        single_agent_record_vector_step(
            eps,
            np.zeros((2, 3), np.float32),
            np.zeros(2, np.int64),
            np.zeros(2),
            np.zeros(2, bool),
            np.zeros(2, bool),
            [{}],
        )
    with pytest.raises(TypeError, match="extra_model_outputs keys must be str"):
        single_agent_record_vector_step(
            eps,
            np.zeros((2, 3), np.float32),
            np.zeros(2, np.int64),
            np.zeros(2),
            np.zeros(2, bool),
            np.zeros(2, bool),
            None,
            {1: np.zeros(2)},
        )
    assert all(len(e) == 0 for e in eps)


def _ma_episodes(n: int) -> list[MultiAgentEpisode]:
    out = []
    for _ in range(n):
        e = MultiAgentEpisode(
            agent_to_module_mapping_fn=lambda aid, ep: "even" if aid % 2 == 0 else "odd"
        )
        out.append(e)
    return out


def test_gather_stacks_per_module_with_index_map():
    b = ModuleBatcher({"even": OBS, "odd": gym.spaces.Discrete(5)})
    assert b.module_ids == ["even", "odd"]
    eps = _ma_episodes(2)
    obs = [
        {0: np.full(3, 0.5, np.float32), 1: 3, 2: np.full(3, 2.0, np.float32)},
        {1: 4, 2: np.full(3, -1.0, np.float32)},
    ]
    out = b.gather(eps, obs)
    np.testing.assert_array_equal(
        out["even"], np.array([[0.5] * 3, [2.0] * 3, [-1.0] * 3], np.float32)
    )
    assert out["even"].flags.c_contiguous and out["even"].dtype == np.float32
    np.testing.assert_array_equal(out["odd"], np.array([3, 4]))
    assert b.index_map("even") == [(0, 0), (0, 2), (1, 2)]
    assert b.index_map("odd") == [(0, 1), (1, 1)]
    # Done agents do not act; a module without rows is left out.
    out = b.gather(eps, obs, [{1: True}, {1: True, "__all__": False}], [None, {2: False}])
    assert set(out) == {"even"}
    with pytest.raises(KeyError, match="nope"):
        b.index_map("nope")


def test_gather_errors_name_agent_module_and_space():
    b = ModuleBatcher({"even": OBS})
    eps = _ma_episodes(1)
    with pytest.raises(
        SpaceMismatchError, match=r"sub-env 0: observation of agent 0 \(module \"even\"\).*\(3,\)"
    ):
        b.gather(eps, [{0: np.zeros(2, np.float32)}])
    with pytest.raises(KeyError, match='agent 1 maps to module "odd"'):
        b.gather(eps, [{1: np.zeros(3, np.float32)}])
    with pytest.raises(ValueError, match="one episode per sub-env"):
        b.gather(eps, [None, None])
    with pytest.raises(ValueError, match="no fixed layout"):
        ModuleBatcher({"m": gym.spaces.Text(5)})
    with pytest.raises(TypeError, match="module ids must be str"):
        ModuleBatcher({1: OBS})


def test_scatter_splits_outputs_back_per_env_and_agent():
    b = ModuleBatcher({"even": OBS, "odd": gym.spaces.Discrete(5)})
    eps = _ma_episodes(2)
    b.gather(eps, [{0: np.zeros(3, np.float32), 1: 0}, {2: np.zeros(3, np.float32), 3: 1}])
    per_env = b.scatter(
        {
            "even": {"actions": np.array([10, 20]), "action_logp": np.array([-1.0, -2.0])},
            "odd": {"actions": np.array([11, 31]), "actions_for_env": np.array([111, 311])},
        },
        extra_constants={"weights_seq_no": 3},
    )
    assert len(per_env) == 2
    env_actions, actions, extras = per_env[0]
    assert env_actions == {0: 10, 1: 111}
    assert actions == {0: 10, 1: 11}
    assert extras == {0: {"action_logp": -1.0, "weights_seq_no": 3}, 1: {"weights_seq_no": 3}}
    assert per_env[1][0] == {2: 20, 3: 311}
    with pytest.raises(ValueError, match="has 3 rows, the batch has 2"):
        b.scatter({"even": {"actions": np.zeros(3)}})
    with pytest.raises(KeyError, match='no "actions" column'):
        b.scatter({"even": {"action_logp": np.zeros(2)}})
    with pytest.raises(KeyError, match="unknown module"):
        b.scatter({"x": {"actions": np.zeros(2)}})


@pytest.mark.parametrize("env_first", [False, True])
def test_scatter_reads_shared_env_actions_once_with_the_same_result(env_first):
    """When ``actions_for_env`` is the ``actions`` array itself (every Discrete module),
    the env gets the same actions as when it is an equal copy, in either column order."""
    b = ModuleBatcher({"even": OBS})
    eps = _ma_episodes(2)
    b.gather(eps, [{0: np.zeros(3, np.float32)}, {2: np.zeros(3, np.float32)}])
    acts = np.array([4, 6])

    def outputs(env_actions):
        cols = [("actions", acts), ("actions_for_env", env_actions), ("action_logp", acts * 0.5)]
        return {"even": dict(cols[::-1] if env_first else cols)}

    shared, copied = b.scatter(outputs(acts)), b.scatter(outputs(acts.copy()))
    assert [p[0] for p in shared] == [p[0] for p in copied] == [{0: 4}, {2: 6}]
    assert [p[1] for p in shared] == [p[1] for p in copied]
    assert (
        [p[2] for p in shared]
        == [p[2] for p in copied]
        == [
            {0: {"action_logp": 2.0}},
            {2: {"action_logp": 3.0}},
        ]
    )


def _same(a, b) -> bool:
    """Equal, with the same types (and dtypes) all the way down."""
    if type(a) is not type(b):
        return False
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
    if isinstance(a, np.generic):
        return a.dtype == b.dtype and a == b
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def _outputs(rows: dict[str, np.ndarray], logp_dtype=np.float32) -> dict:
    """Module outputs for a gathered batch: actions, 2-D dist inputs, 1-D log-probs."""
    out = {}
    for mid, batch in rows.items():
        n = len(batch)
        out[mid] = {
            "actions": np.arange(n) % 4,
            "action_dist_inputs": np.arange(2 * n, dtype=np.float32).reshape(n, 2) + batch[:, :1],
            "action_logp": (-np.arange(n) - batch[:, 0]).astype(logp_dtype),
        }
    return out


def test_scatter_extras_as_rows_give_the_dicts_scatter_makes():
    """With ``extras_as_rows`` each agent gets its row of the module's output arrays; its
    ``to_dict()`` is the dict the scatter makes without it (same keys, order and values,
    numpy scalars and row views alike). Outputs that are not C-contiguous arrays with a row
    axis, or a constant named like a column, get the per-agent dicts."""
    b = ModuleBatcher({"even": OBS, "odd": OBS})
    eps = _ma_episodes(2)
    obs = [{0: np.ones(3, np.float32), 1: np.zeros(3, np.float32)}, {2: np.full(3, 2, np.float32)}]
    rows = b.gather(eps, obs)
    outputs = _outputs(rows)
    constants = {"weights_seq_no": 7}
    as_rows = b.scatter(outputs, extra_constants=constants, extras_as_rows=True)
    as_dicts = b.scatter(outputs, extra_constants=constants)
    for (e1, a1, x1), (e2, a2, x2) in zip(as_rows, as_dicts, strict=True):
        assert _same(e1, e2) and _same(a1, a2)
        assert list(x1) == list(x2)
        assert all(type(v).__name__ == "AgentOutputs" for v in x1.values())
        assert all(_same(x1[aid].to_dict(), x2[aid]) for aid in x1)
    # Outputs the record cannot read rows of: the dicts, as without the flag.
    odd = {"actions": np.array([1])}
    for even in (
        {"actions": np.array([0, 1]), "action_logp": [-1.0, -2.0]},
        {"actions": np.array([0, 1]), "action_logp": np.array([[-1.0, 0], [-2.0, 0]])[:, 0]},
        {"actions": np.array([0, 1]), "weights_seq_no": np.array([1, 2])},
    ):
        got = b.scatter({"even": even, "odd": odd}, extra_constants=constants, extras_as_rows=True)
        want = b.scatter({"even": even, "odd": odd}, extra_constants=constants)
        got_extras = [p[2] for p in got]
        assert type(got_extras[0][0]) is dict and type(got_extras[1][2]) is dict
        # (Module "odd" has only the constant: its agent still gets a row.)
        got_extras[0][1] = got_extras[0][1].to_dict()
        assert _same(got_extras, [p[2] for p in want])


def test_records_from_rows_equal_records_from_dicts():
    """Recording the scatter's rows stores what recording its dicts stores, on every path:
    an agent's first step (the columns are made from the values), later steps (rows
    copied straight into the columns), an action left hanging by an agent the env did not
    observe and taken up when it observes again, and outputs whose dtype is not the
    columns' (converted as a dict's values are)."""
    b = ModuleBatcher({"even": OBS, "odd": OBS})
    sets = {"rows": _ma_episodes(2), "dicts": _ma_episodes(2)}

    def ob(v):
        return np.full(3, v, np.float32)

    # Agent 1 acts at step 2 but is not observed until step 4.
    present = [{0, 1}, {0, 1}, {0}, {0}, {0, 1}, {0, 1}, {0, 1}]
    for eps in sets.values():
        for i, e in enumerate(eps):
            e.add_env_reset(observations={2 * i: ob(0), 2 * i + 1: ob(0)})
    obs = [{0: ob(0), 1: ob(0)}, {2: ob(0), 3: ob(0)}]
    for t in range(1, len(present)):
        out = _outputs(b.gather(sets["rows"], obs), np.float64 if t == 5 else np.float32)
        consts = {"weights_seq_no": t}
        scattered = {
            "rows": b.scatter(out, extra_constants=consts, extras_as_rows=True),
            "dicts": b.scatter(out, extra_constants=consts),
        }
        obs = [{a: ob(t + a) for a in present[t]}, {2: ob(t + 2), 3: ob(t + 3)}]
        for name, eps in sets.items():
            per_env = scattered[name]
            multi_agent_record_steps(
                eps,
                obs,
                [p[1] for p in per_env],
                [{a: 1.0 for a in o} for o in obs],
                [None, None],
                [None, None],
                [None, None],
                [p[2] for p in per_env],
            )
        if t == 2:
            hanging = [e._hanging_extra_model_outputs_end for e in sets["rows"]]
            assert set(hanging[0]) == {1} and isinstance(hanging[0][1], dict)
    for er, ed in zip(sets["rows"], sets["dicts"], strict=True):
        sr, sd = er.get_state(), ed.get_state()
        for key in ("_hanging_actions_end", "_hanging_extra_model_outputs_end", "env_t"):
            assert _same(sr[key], sd[key]), key
        agents_r, agents_d = dict(sr["agent_episodes"]), dict(sd["agent_episodes"])
        assert list(agents_r) == list(agents_d)
        for aid, ar in agents_r.items():
            ad = agents_d[aid]
            for key in ("observations", "actions", "rewards", "extra_model_outputs", "t"):
                assert _same(ar[key], ad[key]), (aid, key)
        for aid, ae in er.agent_episodes.items():
            de = ed.agent_episodes[aid]
            for k in ("action_dist_inputs", "action_logp", "weights_seq_no"):
                assert _same(ae.get_extra_model_outputs(k), de.get_extra_model_outputs(k))


def test_rows_into_columns_of_another_byte_order_are_converted():
    """An extra-output column made from big-endian values keeps that layout; native rows
    recorded into it later are converted, not copied as they are (and big-endian output
    arrays are handed over as dicts)."""
    b = ModuleBatcher({"even": OBS})
    eps = _ma_episodes(1)
    eps[0].add_env_reset(observations={0: np.zeros(3, np.float32)})
    values = []
    for t, dtype in enumerate([">f4", "<f4", "<f4", ">f4"]):
        b.gather(eps, [{0: np.full(3, t, np.float32)}])
        logits = np.array([[t + 0.5, -t]], dtype=dtype)
        values.append(logits[0].astype(np.float32))
        (per_env,) = b.scatter(
            {"even": {"actions": np.array([1]), "action_dist_inputs": logits}},
            extras_as_rows=True,
        )
        assert (type(per_env[2][0]) is dict) == (dtype == ">f4")
        multi_agent_record_steps(
            eps,
            [{0: np.full(3, t + 1, np.float32)}],
            [per_env[1]],
            [{0: 1.0}],
            [None],
            [None],
            [None],
            [per_env[2]],
        )
    got = eps[0].agent_episodes[0].get_extra_model_outputs("action_dist_inputs")
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.stack(values))


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.dictionaries(st.integers(0, 6), st.floats(-5, 5, width=32), max_size=5),
        min_size=1,
        max_size=5,
    )
)
def test_gather_then_scatter_round_trips(obs_values):
    """Every acting agent's row goes out and comes back to its own sub-env and agent."""
    b = ModuleBatcher({"even": OBS, "odd": OBS})
    eps = _ma_episodes(len(obs_values))
    obs = [{a: np.full(3, v, np.float32) for a, v in d.items()} for d in obs_values]
    out = b.gather(eps, obs)
    # The module "computes" an action that encodes its input row.
    outputs = {mid: {"actions": arr[:, 0].copy()} for mid, arr in out.items()}
    per_env = b.scatter(outputs)
    for i, d in enumerate(obs_values):
        assert per_env[i][1] == pytest.approx({a: np.float32(v) for a, v in d.items()})
    assert sum(len(x) for x in out.values()) == sum(len(d) for d in obs_values)


def test_multi_agent_record_steps_counts_agent_and_module_steps():
    """Each observing agent counts one step for itself and one for its module (None where
    the episode maps it to none), added to the dicts given (Counters too)."""
    from collections import Counter

    eps = [
        MultiAgentEpisode(agent_to_module_mapping_fn=lambda aid, ep: f"m_{aid}") for _ in range(2)
    ]
    for e in eps:
        e.add_env_reset(observations={"a": 0, "b": 0})
    agents, modules = Counter({"a": 5}), {}
    multi_agent_record_steps(
        eps,
        [{"a": 1, "b": 1}, {"a": 2}],
        [{"a": 0, "b": 1}, {"a": 1, "b": 0}],
        [{"a": 1.0, "b": 2.0}, {"a": 3.0, "b": 4.0}],
        [None, None],
        [None, None],
        [None, None],
        [None, None],
        agent_steps=agents,
        module_steps=modules,
    )
    assert agents == {"a": 7, "b": 1}
    assert modules == {"m_a": 2, "m_b": 1}


def test_multi_agent_record_steps_records_each_sub_env():
    eps = [MultiAgentEpisode() for _ in range(2)]
    for e in eps:
        e.add_env_reset(observations={"a": 0, "b": 0})
    done = multi_agent_record_steps(
        eps,
        [{"a": 1, "b": 1}, {"a": 2}],
        [{"a": 0, "b": 1}, {"a": 1, "b": 0}],
        [{"a": 1.0, "b": 2.0}, {"a": 3.0, "b": 4.0}],
        [None, None],
        [None, {"__all__": True, "a": True, "b": True}],
        [None, None],
        [{"a": {"logp": 0.5}}, None],
    )
    assert done == [1]
    assert eps[0].get_return() == 3.0 and eps[1].get_return() == 7.0
    assert eps[1].is_terminated and not eps[0].is_done
    assert eps[0].agent_episodes["a"].get_extra_model_outputs("logp") == [0.5]
    with pytest.raises(ValueError, match="rewards: expected 2 dicts"):
        multi_agent_record_steps(
            eps, [{}, {}], [{}, {}], [{}], [None] * 2, [None] * 2, [None] * 2, [None] * 2
        )


@settings(max_examples=30, deadline=None)
@given(
    n=st.integers(1, 4),
    steps=st.lists(
        st.lists(st.tuples(st.booleans(), st.booleans()), min_size=4, max_size=4), max_size=12
    ),
    seed=st.integers(0, 2**16),
)
def test_vector_record_equals_per_episode_add_env_step(n, steps, seed):
    """Any step sequence with dones and next-step resets: same episodes either way."""
    rng = np.random.default_rng(seed)
    native, reference = _episodes(n), _episodes(n)
    done_native: list = []
    done_reference: list = []
    obs = rng.normal(size=(n, 3)).astype(np.float32)
    _reset(native, obs)
    for i, e in enumerate(reference):
        e.add_env_reset(observation=obs[i], infos={})
    for flags in steps:
        term = np.array([f[0] and f[1] for f in flags[:n]])
        trunc = np.array([f[1] and not f[0] for f in flags[:n]])
        obs = rng.normal(size=(n, 3)).astype(np.float32)
        act = rng.integers(0, 4, n)
        rew = rng.normal(size=n)
        logp = rng.normal(size=n).astype(np.float32)
        _, done = single_agent_record_vector_step(
            native, obs, act, rew, term, trunc, None, {"action_logp": logp}
        )
        for i in done:
            done_native.append(native[i])
            native[i] = SingleAgentEpisode(observation_space=OBS, action_space=ACT)
        for i, e in enumerate(reference):
            if not e.is_reset:
                e.add_env_reset(observation=obs[i], infos={})
                continue
            e.add_env_step(
                observation=obs[i],
                action=act[i],
                reward=rew[i],
                infos={},
                terminated=bool(term[i]),
                truncated=bool(trunc[i]),
                extra_model_outputs={"action_logp": logp[i]},
            )
            if e.is_done:
                done_reference.append(e)
                reference[i] = SingleAgentEpisode(observation_space=OBS, action_space=ACT)
    assert len(done_native) == len(done_reference)
    for a, b in zip(done_native + native, done_reference + reference, strict=True):
        assert (len(a), a.is_terminated, a.is_truncated, a.is_reset) == (
            len(b),
            b.is_terminated,
            b.is_truncated,
            b.is_reset,
        )
        if a.is_reset:
            np.testing.assert_array_equal(a.get_observations(), b.get_observations())
        if len(a):
            np.testing.assert_array_equal(a.get_actions(), b.get_actions())
            np.testing.assert_array_equal(a.get_rewards(), b.get_rewards())
            np.testing.assert_array_equal(
                a.get_extra_model_outputs("action_logp"), b.get_extra_model_outputs("action_logp")
            )


def test_dict_batches_record_rows_and_resets():
    space = gym.spaces.Dict(
        {"a": gym.spaces.Box(-1.0, 1.0, (2,), np.float32), "b": gym.spaces.Discrete(4)}
    )
    eps = [SingleAgentEpisode(observation_space=space, action_space=ACT) for _ in range(2)]
    obs = {"a": np.array([[0.1, 0.2], [0.3, 0.4]], np.float32), "b": np.array([1, 2])}
    z = np.zeros(2, bool)
    assert single_agent_record_vector_step(eps, obs, np.zeros(2, np.int64), np.zeros(2), z, z)[
        0
    ] == [0, 1]
    obs2 = {"a": np.array([[0.5, 0.6], [0.7, 0.8]], np.float32), "b": np.array([3, 0])}
    single_agent_record_vector_step(eps, obs2, np.array([1, 2]), np.ones(2), z, z)
    e = eps[1].to_numpy()
    np.testing.assert_array_equal(e.get_observations()["a"], np.float32([[0.3, 0.4], [0.7, 0.8]]))
    np.testing.assert_array_equal(e.get_observations()["b"], [2, 0])
    with pytest.raises(SpaceMismatchError, match="key 'b'"):
        single_agent_record_vector_step(
            eps[:1], {"a": obs2["a"][:1]}, np.array([1]), np.ones(1), z[:1], z[:1]
        )


@given(
    n=st.integers(1, 5),
    kinds=st.lists(st.sampled_from(["fast", "int32", "object", "late", "none"]), min_size=5),
    steps=st.integers(1, 4),
    seed=st.integers(0, 2**16),
)
def test_vector_record_mixes_raw_rows_and_converted_steps(n, kinds, steps, seed):
    """Episodes whose columns match the batches take their rows raw; the rest (another
    action dtype, an extra stored as objects or first seen now) are converted. Either way
    each episode ends up as per-episode add_env_step calls make it."""
    rng = np.random.default_rng(seed)
    native, reference = _episodes(n), _episodes(n)
    obs = rng.normal(size=(n, 3)).astype(np.float32)
    _reset(native, obs)
    for i, e in enumerate(reference):
        e.add_env_reset(observation=obs[i])
    # A first step per episode, recorded one by one, gives each its column layout.
    for i, (a, b) in enumerate(zip(native, reference, strict=True)):
        kind = kinds[i]
        o = rng.normal(size=3).astype(np.float32)
        act = np.int32(1) if kind == "int32" else np.int64(1)
        extras = {"seq": 3}
        if kind != "late":
            extras["logp"] = "text" if kind == "object" else np.float32(0.5)
        for e in (a, b):
            e.add_env_step(o, act, 1.0, extra_model_outputs=extras)
    for t in range(steps):
        obs = rng.normal(size=(n, 3)).astype(np.float32)
        act = rng.integers(0, 4, n)
        rew = rng.normal(size=n)
        logp = rng.normal(size=n).astype(np.float32)
        trunc = np.array([t == steps - 1 and i % 2 == 0 for i in range(n)])
        single_agent_record_vector_step(
            native, obs, act, rew, np.zeros(n, bool), trunc, None, {"logp": logp, "seq": 3}
        )
        for i, e in enumerate(reference):
            e.add_env_step(
                obs[i],
                act[i],
                rew[i],
                truncated=bool(trunc[i]),
                extra_model_outputs={"logp": logp[i], "seq": 3},
            )
    for a, b in zip(native, reference, strict=True):
        assert (len(a), a.is_truncated, a.t) == (len(b), b.is_truncated, b.t)
        assert a.get_infos() == b.get_infos()
        for x, y in (
            (a.get_observations(), b.get_observations()),
            (a.get_actions(), b.get_actions()),
            (a.get_rewards(), b.get_rewards()),
            (a.get_extra_model_outputs("logp"), b.get_extra_model_outputs("logp")),
            (a.get_extra_model_outputs("seq"), b.get_extra_model_outputs("seq")),
        ):
            assert len(x) == len(y)
            for u, v in zip(x, y, strict=True):
                assert type(u) is type(v)
                np.testing.assert_array_equal(u, v)
        # A key first seen mid-episode has no item for the earlier steps: to_numpy fails
        # alike (RLlib's rule); otherwise both give the same arrays.
        outcome = [_error_of(e.to_numpy) for e in (a, b)]
        assert outcome[0] == outcome[1]
        if outcome[0]:
            continue
        np.testing.assert_array_equal(a.get_actions(), b.get_actions())
        assert a.get_actions().dtype == b.get_actions().dtype
        np.testing.assert_array_equal(a.get_observations(), b.get_observations())


def test_vector_record_after_a_failed_fast_row_leaves_all_unchanged():
    """A bad row anywhere (here: a done episode) fails the whole call before any episode,
    raw-row or converted, has stored its step."""
    n = 3
    eps = _episodes(n)
    _reset(eps, np.zeros((n, 3), np.float32))
    z = np.zeros(n, bool)
    single_agent_record_vector_step(
        eps, np.ones((n, 3), np.float32), np.ones(n, np.int64), np.ones(n), z, z
    )
    eps[2].add_env_step(np.ones(3, np.float32), 1, 1.0, terminated=True)
    before = [
        (len(e), e.get_observations().tolist() if False else len(e.get_observations())) for e in eps
    ]
    with pytest.raises(EpisodeStateError, match="sub-env 2"):
        single_agent_record_vector_step(
            eps, np.full((n, 3), 2, np.float32), np.ones(n, np.int64), np.ones(n), z, z
        )
    assert [(len(e), len(e.get_observations())) for e in eps] == before


def test_a_scalar_where_a_batch_belongs_is_an_error_not_a_broadcast():
    """Only extra model outputs may be constants for all sub-envs (the weights' sequence
    number); a scalar reward is refused, also once every episode could take raw rows."""
    n = 2
    eps = _episodes(n)
    _reset(eps, np.zeros((n, 3), np.float32))
    z = np.zeros(n, bool)
    obs, act = np.ones((n, 3), np.float32), np.ones(n, np.int64)
    single_agent_record_vector_step(eps, obs, act, np.ones(n), z, z)
    with pytest.raises(SpaceMismatchError, match="rewards: expected a batch"):
        single_agent_record_vector_step(eps, obs, act, 1.0, z, z)
    assert [len(e) for e in eps] == [1, 1]


# Batches of a first step's fields: numpy dtypes whose rows infer one spec each (ints and
# floats in native byte order: the record lays the batch out once), and others that each
# row's own value decides (bools, complex, big-endian). (Object arrays are left out: the
# record refuses them once a first step typed their field, where `add_env_step` takes
# their Python numbers: a difference of its own, older than the first-step layout.)
_FIRST_STEP_DTYPES = st.sampled_from(
    ["f2", "f4", "f8", "i1", "i2", "i4", "i8", "u1", "u4", "u8", "?", "c8", ">f4", ">i8"]
)
_CONSTANTS = st.sampled_from([7, -1.5, True, np.float32(0.25), np.int8(3), {"a": 1.0}, "x", None])


@st.composite
def _first_step_batch(draw, n: int, scalar_only: bool = False) -> object:
    dtype = np.dtype(draw(_FIRST_STEP_DTYPES))
    shape = (n,) if scalar_only else (n, *draw(st.sampled_from([(), (2,), (2, 3)])))
    values = np.arange(np.prod(shape)).reshape(shape) % 5 + 1
    return values.astype(dtype)


@settings(max_examples=150, deadline=None)
@given(data=st.data(), n=st.integers(1, 3), steps=st.integers(1, 3))
def test_a_chunks_first_step_from_batches_infers_what_add_env_step_infers(data, n, steps):
    """The record lays a batch out once by the spec its row 0 infers for every episode
    whose field has no spec yet (numeric arrays, and constants given to every sub-env);
    the episodes equal those whose steps were added one by one with each row's value,
    before and after ``to_numpy``, whatever the dtypes (those the record does not lay out
    at once included)."""
    native = _episodes(n)
    reference = [
        SingleAgentEpisode(id_=e.id_, observation_space=OBS, action_space=ACT) for e in native
    ]
    obs = np.arange(n * 3, dtype=np.float32).reshape(n, 3)
    _reset(native, obs)
    for i, e in enumerate(reference):
        e.add_env_reset(observation=obs[i], infos={})
    keys = data.draw(st.lists(st.sampled_from(["a", "b", "c"]), max_size=3, unique=True))
    extras = {
        k: data.draw(st.one_of(_first_step_batch(n), _CONSTANTS), label=f"extra {k}") for k in keys
    }
    reward = data.draw(_first_step_batch(n, scalar_only=True), label="rewards")
    flags = np.zeros(n, bool)
    act = np.arange(n) % 4
    for _ in range(steps):
        native_out = _error_of(
            lambda: single_agent_record_vector_step(
                native, obs, act, reward, flags, flags, {}, extras, 10, None
            )
        )
        reference_out = None
        for i, e in enumerate(reference):
            row = {k: v[i] if isinstance(v, np.ndarray) else v for k, v in extras.items()}
            reference_out = reference_out or _error_of(
                lambda e=e, i=i, row=row: e.add_env_step(
                    observation=obs[i], action=act[i], reward=reward[i], infos={},
                    extra_model_outputs=row,
                )
            )  # fmt: skip
        assert (native_out is None) == (reference_out is None), (native_out, reference_out)
        if native_out is not None:
            # Nothing is stored by a record that raises: compare what was there before.
            return
    from tests._helpers import assert_same_episode

    def item_types(e: SingleAgentEpisode) -> list:
        # (assert_same_episode takes a Python scalar for a numpy one of the same value)
        fields = [e.get_rewards(), *(e.get_extra_model_outputs(k) for k in keys)]
        return [[type(x) for x in f] for f in fields]

    for a, b in zip(native, reference, strict=True):
        assert_same_episode(b, a, tuple(keys))
        assert item_types(a) == item_types(b)
        a.to_numpy()
        b.to_numpy()
        assert_same_episode(b, a, tuple(keys))
