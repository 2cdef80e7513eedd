"""Connector pieces, pipelines, state merging, and the default pipelines; clipping and
unsquashing differential against RLlib 2.60's ``clip_action``/``unsquash_action``."""

from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from fastrollout import MultiAgentEpisode, SingleAgentEpisode
from fastrollout.connectors import (
    ConnectorPipelineV2,
    ConnectorV2,
    EnvToModulePipeline,
    FlattenObservations,
    FrameStackingEnvToModule,
    GetActions,
    MeanStdFilter,
    ModuleToEnvPipeline,
    NormalizeAndClipActions,
    NumpyToTensor,
    PrevActionsPrevRewards,
    RunningStats,
    TensorToNumpy,
    clip_action,
    default_env_to_module_pipeline,
    default_module_to_env_pipeline,
    unsquash_action,
)
from fastrollout.core import DEFAULT_MODULE_ID, Columns
from fastrollout.modules import (
    DefaultMLPModule,
    MultiRLModule,
    MultiRLModuleSpec,
    RLModuleSpec,
    TorchCategorical,
)

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from ray.rllib.utils.spaces import space_utils as rl_space_utils

OBS = gym.spaces.Box(-10.0, 10.0, (2,), np.float32)
D = DEFAULT_MODULE_ID


def _multi(action_space=None, obs_space=OBS, ids=(D,)):
    action_space = action_space or gym.spaces.Discrete(3)
    specs = {
        mid: RLModuleSpec(
            observation_space=obs_space,
            action_space=action_space,
            model_config={"fcnet_hiddens": [8]},
        )
        for mid in ids
    }
    return MultiRLModuleSpec(rl_module_specs=specs).build()


def _episode(obs_list, actions=(), rewards=()):
    e = SingleAgentEpisode(observation_space=OBS, action_space=gym.spaces.Discrete(3))
    e.add_env_reset(np.asarray(obs_list[0], np.float32))
    for o, a, r in zip(obs_list[1:], actions, rewards, strict=True):
        e.add_env_step(np.asarray(o, np.float32), a, r)
    return e


class _Record(ConnectorV2):
    def __init__(self, tag, log, **kw):
        self.tag, self.log = tag, log
        super().__init__(**kw)

    def __call__(
        self, *, rl_module, batch, episodes, explore=None, shared_data=None, metrics=None, **kw
    ):
        self.log.append((self.tag, explore, shared_data.get("x"), metrics))
        batch.setdefault("seen", []).append(self.tag)
        return batch


class _Counter(ConnectorV2):
    def __init__(self, **kw):
        self.n = 0
        super().__init__(**kw)

    def __call__(self, *, rl_module, batch, episodes, **kw):
        self.n += 1
        return batch

    def get_state(self, *a, **k):
        return {"n": self.n}

    def set_state(self, state):
        self.n = state["n"]

    def merge_states(self, states):
        return {"n": sum(s["n"] for s in states)}


# -- pipelines ----------------------------------------------------------------------------


def test_pipeline_runs_in_order_and_edits():
    log = []
    a, b, c = _Record("a", log), _Record("b", log), _Record("c", log)
    pipe = ConnectorPipelineV2(connectors=[a, b])
    pipe.append(c)
    pipe.prepend(_Counter())
    out = pipe(
        rl_module=None, batch={}, episodes=[], explore=True, shared_data={"x": 1}, metrics="m"
    )
    assert out["seen"] == ["a", "b", "c"]
    assert log == [("a", True, 1, "m"), ("b", True, 1, "m"), ("c", True, 1, "m")]
    assert [p.name for p in pipe] == ["_Counter", "_Record", "_Record", "_Record"]
    assert pipe.insert_before("_Record", NumpyToTensor()) is a
    assert pipe.insert_after(NumpyToTensor, TensorToNumpy()) is pipe[1]
    assert [p.name for p in pipe][:4] == ["_Counter", "NumpyToTensor", "TensorToNumpy", "_Record"]
    assert pipe[_Record] is a and pipe[-1] is c and len(pipe) == 6
    assert pipe.remove("NumpyToTensor").name == "NumpyToTensor"
    assert pipe.remove(0).name == "_Counter"
    assert isinstance(pipe.remove(TensorToNumpy), TensorToNumpy)
    assert list(pipe) == [a, b, c]
    with pytest.raises(ValueError, match="no piece 'Nope'"):
        pipe.remove("Nope")
    with pytest.raises(ValueError, match="GetActions"):
        pipe.insert_after(GetActions, c)
    with pytest.raises(IndexError, match="index 9"):
        pipe[9]
    with pytest.raises(TypeError, match="ConnectorV2"):
        pipe.append(lambda **kw: kw)
    with pytest.raises(TypeError, match="ConnectorV2"):
        EnvToModulePipeline(connectors=[object()])
    assert pipe(rl_module=None, episodes=[])["seen"] == ["a", "b", "c"]  # batch None -> {}
    assert "ConnectorPipelineV2(" in repr(pipe)


def test_pipeline_state_get_set_merge_with_repeated_names():
    p1 = ModuleToEnvPipeline(connectors=[_Counter(), TensorToNumpy(), _Counter()])
    p2 = ModuleToEnvPipeline(connectors=[_Counter(), TensorToNumpy(), _Counter()])
    for _ in range(2):
        p1(rl_module=None, batch={}, episodes=[])
    p2(rl_module=None, batch={}, episodes=[])
    state = p1.get_state()
    assert state == {"_Counter": {"n": 2}, "_Counter_1": {"n": 2}}  # stateless left out
    assert p1.get_state(components="_Counter_1") == {"_Counter_1": {"n": 2}}
    assert p1.get_state(not_components=["_Counter"]) == {"_Counter_1": {"n": 2}}
    merged = p1.merge_states([state, p2.get_state()])
    assert merged == {"_Counter": {"n": 3}, "_Counter_1": {"n": 3}}
    p2.set_state(merged)
    assert p2.get_state() == merged
    with pytest.raises(KeyError, match="unknown pipeline piece"):
        p2.set_state({"Nope": {}})
    p2.reset_state()


def test_pipeline_spaces_chain_and_recompute_on_edit():
    dict_space = gym.spaces.Dict({"a": gym.spaces.Discrete(3), "b": gym.spaces.Box(-1, 1, (2,))})
    pipe = EnvToModulePipeline(
        dict_space, gym.spaces.Discrete(2), connectors=[FlattenObservations()]
    )
    assert pipe.observation_space.shape == (5,) and pipe.action_space == gym.spaces.Discrete(2)
    pipe.append(FrameStackingEnvToModule(num_frames=3))
    assert pipe.observation_space.shape == (15,)
    np.testing.assert_array_equal(pipe.observation_space.high[:5], [1, 1, 1, 1, 1])
    with pytest.raises(TypeError, match="Box observation space"):
        pipe.remove("FlattenObservations")  # stacking cannot take the Dict: edit undone
    assert [p.name for p in pipe] == ["FlattenObservations", "FrameStackingEnvToModule"]
    assert pipe.observation_space.shape == (15,)
    pipe.prepend(PrevActionsPrevRewards())  # Dict(obs 5, prev action 2, prev reward 1)
    assert pipe.observation_space.shape == (24,)
    pipe.remove(0)
    assert pipe.observation_space.shape == (15,)
    per_module = ConnectorPipelineV2(
        {"p": OBS, "q": gym.spaces.Box(0, 1, (3,))}, connectors=[MeanStdFilter()]
    )
    assert per_module.observation_space["q"] == gym.spaces.Box(-10, 10, (3,), np.float32)


# -- env-to-module pieces ---------------------------------------------------------------


def test_numpy_to_tensor_uses_module_device_or_given_device():
    multi = _multi(ids=("p", "q"))
    batch = {
        "p": {Columns.OBS: np.zeros((3, 2))},
        "q": {Columns.OBS: {"x": np.ones((1, 2), np.float32)}},
    }
    out = NumpyToTensor()(rl_module=multi, batch=batch, episodes=[])
    assert out["p"][Columns.OBS].dtype == torch.float32 and out["p"][Columns.OBS].shape == (3, 2)
    assert isinstance(out["q"][Columns.OBS]["x"], torch.Tensor)
    out = NumpyToTensor(device="cpu")(
        rl_module=None, batch={"p": {Columns.OBS: np.zeros(2)}}, episodes=[]
    )
    assert out["p"][Columns.OBS].device.type == "cpu"
    with pytest.raises(TypeError, match="'p/obs'"):
        NumpyToTensor(device="cpu")(
            rl_module=None, batch={"p": {Columns.OBS: np.array([None])}}, episodes=[]
        )


def test_flatten_observations_values():
    space = gym.spaces.Dict(
        {
            "d": gym.spaces.Discrete(3, start=1),
            "m": gym.spaces.MultiDiscrete([2, 2]),
            "t": gym.spaces.Tuple((gym.spaces.Box(-1, 1, (2, 1)), gym.spaces.MultiBinary(1))),
        }
    )
    piece = FlattenObservations(space)
    batch = {
        D: {
            Columns.OBS: {
                "d": np.array([1, 3]),
                "m": np.array([[0, 1], [1, 1]]),
                "t": (
                    np.array([[[0.5], [-0.5]], [[1.0], [0.0]]], np.float32),
                    np.array([[1], [0]]),
                ),
            }
        }
    }
    raw = dict(batch[D][Columns.OBS])
    out = piece(rl_module=None, batch=batch, episodes=[])[D][Columns.OBS]
    expected = [[1, 0, 0, 1, 0, 0, 1, 0.5, -0.5, 1], [0, 0, 1, 0, 1, 0, 1, 1.0, 0.0, 0]]
    np.testing.assert_array_equal(out, np.array(expected, np.float32))
    assert out.dtype == np.float32 and piece.observation_space.shape == (10,)
    with pytest.raises(ValueError, match=r"\[0, 3\)"):
        piece(
            rl_module=None,
            batch={D: {Columns.OBS: {**raw, "d": np.array([0, 1])}}},
            episodes=[],
        )
    with pytest.raises(ValueError, match="needs input_observation_space"):
        FlattenObservations()(
            rl_module=None, batch={D: {Columns.OBS: np.zeros((1, 2))}}, episodes=[]
        )
    with pytest.raises(TypeError, match="cannot flatten"):
        FlattenObservations(gym.spaces.Text(3))


def test_frame_stacking_from_episode_lookback():
    e0 = _episode([[1, 1], [2, 2], [3, 3]], actions=[0, 1], rewards=[1.0, 2.0])
    e1 = _episode([[7, 7]])
    piece = FrameStackingEnvToModule(num_frames=3, input_observation_space=OBS)
    batch = {D: {Columns.OBS: np.array([[3, 3], [7, 7]], np.float32)}}
    shared = {"agent_rows": {D: [(1, None), (0, None)]}}
    out = piece(rl_module=None, batch=batch, episodes=[e0, e1], shared_data=shared)[D][Columns.OBS]
    np.testing.assert_array_equal(out, [[0, 0, 0, 0, 7, 7], [1, 1, 2, 2, 3, 3]])
    assert piece.observation_space.shape == (6,)
    image = FrameStackingEnvToModule(
        num_frames=4, input_observation_space=gym.spaces.Box(0, 255, (84, 84, 1), np.uint8)
    )
    assert image.observation_space.shape == (84, 84, 4)  # as RLlib
    # The successor of a cut chunk still stacks from its look-back.
    successor = e0.cut(len_lookback_buffer=2)
    out = piece(
        rl_module=None,
        batch={D: {Columns.OBS: np.zeros((1, 2))}},
        episodes=[successor],
        shared_data={"agent_rows": {D: [(0, None)]}},
    )
    np.testing.assert_array_equal(out[D][Columns.OBS], [[1, 1, 2, 2, 3, 3]])
    with pytest.raises(KeyError, match="agent_rows"):
        piece(rl_module=None, batch=batch, episodes=[e0], shared_data={})
    with pytest.raises(IndexError, match="env index 1"):
        piece(rl_module=None, batch=batch, episodes=[e0], shared_data=shared)
    with pytest.raises(ValueError, match="num_frames"):
        FrameStackingEnvToModule(num_frames=0)


def test_prev_actions_prev_rewards_multi_agent_rows():
    ma = MultiAgentEpisode(
        observation_space=gym.spaces.Dict({"a": OBS, "b": OBS}),
        action_space=gym.spaces.Dict({"a": gym.spaces.Discrete(3), "b": gym.spaces.Discrete(3)}),
    )
    ma.add_env_reset(
        observations={"a": np.array([0, 0], np.float32), "b": np.array([5, 5], np.float32)}
    )
    ma.add_env_step(
        observations={"a": np.array([1, 1], np.float32), "b": np.array([6, 6], np.float32)},
        actions={"a": 2, "b": 0},
        rewards={"a": 1.5, "b": -1.0},
    )
    piece = PrevActionsPrevRewards(
        n_prev_actions=2,
        n_prev_rewards=2,
        input_observation_space=OBS,
        input_action_space=gym.spaces.Discrete(3),
    )
    batch = {"m": {Columns.OBS: np.array([[6, 6], [1, 1]], np.float32)}}
    shared = {"agent_rows": {"m": [(0, "b"), (0, "a")]}}
    obs = piece(rl_module=None, batch=batch, episodes=[ma], shared_data=shared)["m"][Columns.OBS]
    np.testing.assert_array_equal(obs["_orig_obs"], [[6, 6], [1, 1]])
    np.testing.assert_array_equal(obs["prev_n_actions"], [[0, 0, 0, 1, 0, 0], [0, 0, 0, 0, 0, 1]])
    np.testing.assert_array_equal(obs["prev_n_rewards"], [[0, -1.0], [0, 1.5]])
    space = piece.observation_space
    assert space["prev_n_actions"].shape == (6,) and space["prev_n_rewards"].shape == (2,)
    with pytest.raises(KeyError, match="agent 'z'"):
        piece(
            rl_module=None,
            batch=batch,
            episodes=[ma],
            shared_data={"agent_rows": {"m": [(0, "z"), (0, "a")]}},
        )
    with pytest.raises(ValueError, match=">= 0"):
        PrevActionsPrevRewards(n_prev_actions=-1)
    box = PrevActionsPrevRewards(
        n_prev_actions=2,
        n_prev_rewards=0,
        input_observation_space=OBS,
        input_action_space=gym.spaces.Box(-1, 1, (2,)),
    )
    assert (
        box.observation_space["prev_n_actions"].shape == (4,)
        and "prev_n_rewards" not in box.observation_space.spaces
    )
    with pytest.raises(TypeError, match="Discrete or Box"):
        PrevActionsPrevRewards(
            input_observation_space=OBS, input_action_space=gym.spaces.MultiBinary(2)
        )


# -- MeanStdFilter --------------------------------------------------------------------------


def test_mean_std_filter_normalizes_and_rewrites_episodes():
    episodes = [_episode([[1, 10]]), _episode([[3, 30]])]
    f = MeanStdFilter(input_observation_space=OBS)
    obs = np.array([[1, 10], [3, 30]], np.float32)
    out = f(
        rl_module=None,
        batch={D: {Columns.OBS: obs.copy()}},
        episodes=episodes,
        shared_data={"agent_rows": {D: [(0, None), (1, None)]}},
    )
    std = obs.std(0, ddof=1)
    expected = np.clip((obs - obs.mean(0)) / (std + 1e-6), -10, 10)
    np.testing.assert_allclose(out[D][Columns.OBS], expected, rtol=1e-5)
    assert out[D][Columns.OBS].dtype == np.float32
    np.testing.assert_allclose(episodes[0].get_observations(-1), expected[0], rtol=1e-5)
    np.testing.assert_allclose(episodes[1].get_observations(-1), expected[1], rtol=1e-5)
    assert f.observation_space == gym.spaces.Box(-10, 10, (2,), np.float32)
    stats = f.running_stats(D)
    assert stats.count == 2
    np.testing.assert_allclose(stats.mean, [2, 20])
    # First observation of all: zero after de-meaning (as RLlib's filter).
    g = MeanStdFilter()
    first = g(
        rl_module=None, batch={D: {Columns.OBS: np.array([[4.0, 5.0]], np.float32)}}, episodes=[]
    )
    np.testing.assert_array_equal(first[D][Columns.OBS], [[0.0, 0.0]])


def test_mean_std_filter_frozen_and_options_and_errors():
    f = MeanStdFilter(de_mean_to_zero=False, de_std_to_one=False, clip_by_value=1.5)
    out = f(
        rl_module=None, batch={D: {Columns.OBS: np.array([[3.0, -0.5]], np.float32)}}, episodes=[]
    )
    np.testing.assert_array_equal(out[D][Columns.OBS], [[1.5, -0.5]])
    frozen = MeanStdFilter(update_stats=False)
    frozen.set_state(f.get_state())
    frozen(rl_module=None, batch={D: {Columns.OBS: np.zeros((4, 2), np.float32)}}, episodes=[])
    assert frozen.running_stats(D).count == 1
    with pytest.raises(ValueError, match="update_stats=False"):
        frozen.reset_state()
    f.reset_state()
    with pytest.raises(KeyError, match="no statistics"):
        f.running_stats(D)
    with pytest.raises(TypeError, match="float numpy"):
        f(rl_module=None, batch={D: {Columns.OBS: np.zeros((1, 2), np.int64)}}, episodes=[])
    with pytest.raises(TypeError, match="before NumpyToTensor"):
        f(rl_module=None, batch={D: {Columns.OBS: torch.zeros(1, 2)}}, episodes=[])
    f(rl_module=None, batch={D: {Columns.OBS: np.zeros((1, 2), np.float32)}}, episodes=[])
    with pytest.raises(ValueError, match=r"shape \(3,\)"):
        f(rl_module=None, batch={D: {Columns.OBS: np.zeros((1, 3), np.float32)}}, episodes=[])
    with pytest.raises(KeyError, match="agent_rows"):
        f(
            rl_module=None,
            batch={D: {Columns.OBS: np.zeros((1, 2), np.float32)}},
            episodes=[_episode([[0, 0]])],
        )
    with pytest.raises(ValueError, match="'base' and 'delta'"):
        f.set_state({D: {"count": 1}})
    with pytest.raises(ValueError, match="lacks 'm2'"):
        RunningStats.from_state({"count": 1, "mean": np.zeros(2)})


chunks_st = st.lists(
    hnp.arrays(
        np.float32,
        st.tuples(st.integers(0, 6), st.just(3)),
        elements=st.floats(-100, 100, width=32),
    ),
    min_size=1,
    max_size=5,
)


@given(chunks=chunks_st)
def test_merged_filter_states_equal_one_filter_over_all_data(chunks):
    filters = [MeanStdFilter() for _ in chunks]
    for f, chunk in zip(filters, chunks, strict=True):
        f(rl_module=None, batch={D: {Columns.OBS: chunk}}, episodes=[])
    merged = filters[0].merge_states([f.get_state() for f in filters])
    everything = np.concatenate(chunks)
    if len(everything) == 0:
        return
    one = MeanStdFilter()
    one(rl_module=None, batch={D: {Columns.OBS: everything}}, episodes=[])
    target = MeanStdFilter()
    target.set_state(merged)
    got, want = target.running_stats(D), one.running_stats(D)
    assert got.count == want.count == len(everything)
    np.testing.assert_allclose(
        got.mean, everything.astype(np.float64).mean(0), rtol=1e-9, atol=1e-9
    )
    np.testing.assert_allclose(got.mean, want.mean, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(got.var, want.var, rtol=1e-7, atol=1e-7)
    if len(everything) > 1:
        np.testing.assert_allclose(
            got.var, everything.astype(np.float64).var(0, ddof=1), rtol=1e-7, atol=1e-6
        )


def test_filter_sync_rounds_count_nothing_twice():
    rng = np.random.default_rng(0)
    runners = [MeanStdFilter(), MeanStdFilter()]
    seen = []
    for _ in range(3):  # sample on every runner, merge, broadcast
        for r in runners:
            data = rng.normal(3.0, 2.0, (5, 2)).astype(np.float32)
            seen.append(data)
            r(rl_module=None, batch={D: {Columns.OBS: data}}, episodes=[])
        merged = runners[0].merge_states([r.get_state() for r in runners])
        for r in runners:
            r.set_state(merged)
    allx = np.concatenate(seen).astype(np.float64)
    for r in runners:
        s = r.running_stats(D)
        assert s.count == 30
        np.testing.assert_allclose(s.mean, allx.mean(0), rtol=1e-9)
        np.testing.assert_allclose(s.var, allx.var(0, ddof=1), rtol=1e-9)
    # A restarted runner (empty base) does not make the merge forget the synced data.
    fresh = MeanStdFilter()
    fresh(rl_module=None, batch={D: {Columns.OBS: np.ones((2, 2), np.float32)}}, episodes=[])
    merged = fresh.merge_states([fresh.get_state(), runners[0].get_state()])
    assert merged[D]["base"]["count"] == 32
    with pytest.raises(ValueError, match="different shapes"):
        fresh.merge_states(
            [
                fresh.get_state(),
                {
                    D: {
                        "base": RunningStats((3,)).to_state(),
                        "delta": RunningStats((3,)).to_state(),
                    }
                },
            ]
        )


# -- module-to-env pieces -----------------------------------------------------------------


def test_get_actions_explore_and_greedy():
    multi = _multi()
    logits = torch.tensor([[0.0, 5.0, 0.0], [3.0, 0.0, 0.0]])
    greedy = GetActions()(
        rl_module=multi, batch={D: {Columns.ACTION_DIST_INPUTS: logits}}, episodes=[], explore=False
    )
    assert greedy[D][Columns.ACTIONS].tolist() == [1, 0]
    # A greedy action is certain: log-probability 0, as RLlib records it.
    assert greedy[D][Columns.ACTION_LOGP].tolist() == [0.0, 0.0]
    torch.manual_seed(0)
    sampled = GetActions()(
        rl_module=multi, batch={D: {Columns.ACTION_DIST_INPUTS: logits}}, episodes=[], explore=True
    )[D]
    expected = TorchCategorical.from_logits(logits).logp(sampled[Columns.ACTIONS])
    torch.testing.assert_close(sampled[Columns.ACTION_LOGP], expected)
    given_actions = torch.tensor([2, 2])
    kept = GetActions()(
        rl_module=multi, batch={D: {Columns.ACTIONS: given_actions}}, episodes=[], explore=True
    )[D]
    assert kept[Columns.ACTIONS] is given_actions and Columns.ACTION_LOGP not in kept
    with pytest.raises(KeyError, match="neither"):
        GetActions()(rl_module=multi, batch={D: {"x": 1}}, episodes=[], explore=True)


def test_tensor_to_numpy():
    out = TensorToNumpy()(
        rl_module=None,
        batch={D: {"a": torch.ones(2), "b": {"c": [torch.zeros(1)]}, "d": 3}},
        episodes=[],
    )
    assert (
        isinstance(out[D]["a"], np.ndarray)
        and isinstance(out[D]["b"]["c"][0], np.ndarray)
        and out[D]["d"] == 3
    )


bounded_box = st.tuples(st.floats(-5, 5), st.floats(0.1, 5), st.integers(1, 3)).map(
    lambda t: gym.spaces.Box(np.float32(t[0]), np.float32(t[0] + t[1]), (t[2],), np.float32)
)


@given(space=bounded_box, data=st.data())
def test_unsquash_and_clip_equal_rllib(space, data):
    actions = data.draw(
        hnp.arrays(np.float32, (4, *space.shape), elements=st.floats(-3, 3, width=32))
    )
    for one in actions:
        np.testing.assert_allclose(
            unsquash_action(one, space), rl_space_utils.unsquash_action(one, space), rtol=1e-6
        )
        np.testing.assert_array_equal(
            clip_action(one, space), rl_space_utils.clip_action(one, space)
        )
    batched = unsquash_action(actions, space)
    np.testing.assert_allclose(
        batched, np.stack([rl_space_utils.unsquash_action(a, space) for a in actions]), rtol=1e-6
    )


def test_unsquash_and_clip_other_spaces_equal_rllib():
    int_box = gym.spaces.Box(2, 6, (2,), np.int64)
    half = gym.spaces.Box(np.array([0.0, -np.inf], np.float32), np.array([1.0, 1.0], np.float32))
    nested = gym.spaces.Dict(
        {"x": gym.spaces.Box(-1, 3, (1,), np.float32), "y": gym.spaces.Discrete(3)}
    )
    for space, action in [
        (int_box, np.array([0, 4])),
        (half, np.array([5.0, -9.0], np.float32)),
        (gym.spaces.Discrete(3), np.int64(2)),
        (nested, {"x": np.array([0.5], np.float32), "y": 2}),
    ]:
        for ours, ref in (
            (unsquash_action, rl_space_utils.unsquash_action),
            (clip_action, rl_space_utils.clip_action),
        ):
            struct = rl_space_utils.get_base_struct_from_space(space)
            got, want = ours(action, space), ref(action, struct)
            if isinstance(want, dict):
                assert got.keys() == want.keys()
                for k in want:
                    np.testing.assert_array_equal(got[k], want[k])
            else:
                np.testing.assert_array_equal(got, want)
    tup = gym.spaces.Tuple((gym.spaces.Box(0, 1, (1,), np.float32), gym.spaces.Discrete(2)))
    assert clip_action((np.array([2.0], np.float32), 1), tup)[0].tolist() == [1.0]
    assert unsquash_action((np.array([1.0], np.float32), 1), tup)[0].tolist() == [1.0]


def test_normalize_and_clip_actions_piece():
    space = gym.spaces.Box(-2.0, 2.0, (2,), np.float32)
    multi = _multi(action_space=space)
    actions = np.array([[0.5, -3.0], [1.0, 0.0]], np.float32)
    out = NormalizeAndClipActions()(
        rl_module=multi, batch={D: {Columns.ACTIONS: actions}}, episodes=[]
    )[D]
    np.testing.assert_allclose(out[Columns.ACTIONS_FOR_ENV], [[1.0, -2.0], [2.0, 0.0]])
    assert out[Columns.ACTIONS] is actions and actions[0, 1] == -3.0  # module's actions kept
    out = NormalizeAndClipActions(normalize_actions=False, clip_actions=True)(
        rl_module=multi, batch={D: {Columns.ACTIONS: actions}}, episodes=[]
    )[D]
    np.testing.assert_allclose(out[Columns.ACTIONS_FOR_ENV], [[0.5, -2.0], [1.0, 0.0]])
    out = NormalizeAndClipActions(normalize_actions=False)(
        rl_module=multi, batch={D: {Columns.ACTIONS: actions}}, episodes=[]
    )[D]
    assert out[Columns.ACTIONS_FOR_ENV] is actions
    piece = NormalizeAndClipActions(
        input_action_space={D: gym.spaces.Box(0.0, 1.0, (2,), np.float32)}
    )
    out = piece(rl_module=multi, batch={D: {Columns.ACTIONS: actions}}, episodes=[])[D]
    np.testing.assert_allclose(out[Columns.ACTIONS_FOR_ENV], [[0.75, 0.0], [1.0, 0.5]])

    class NoSpace:
        action_space = None

    with pytest.raises(ValueError, match="no action space"):
        NormalizeAndClipActions()(
            rl_module={D: NoSpace()}, batch={D: {Columns.ACTIONS: actions}}, episodes=[]
        )


# -- default pipelines end to end ---------------------------------------------------------


@pytest.mark.parametrize("explore", [True, False])
def test_default_pipelines_cartpole_like(explore):
    multi = _multi(
        action_space=gym.spaces.Discrete(2), obs_space=gym.spaces.Box(-5, 5, (4,), np.float32)
    )
    e2m = default_env_to_module_pipeline()
    m2e = default_module_to_env_pipeline()
    batch = e2m(
        rl_module=multi,
        batch={D: {Columns.OBS: np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32)}},
        episodes=[],
        explore=explore,
    )
    assert isinstance(batch[D][Columns.OBS], torch.Tensor)
    fwd = multi.forward_exploration if explore else multi.forward_inference
    out = m2e(rl_module=multi, batch=fwd(batch), episodes=[], explore=explore)[D]
    assert isinstance(out[Columns.ACTIONS], np.ndarray) and out[Columns.ACTIONS].shape == (8,)
    assert set(out[Columns.ACTIONS].tolist()) <= {0, 1}
    assert out[Columns.ACTIONS_FOR_ENV] is out[Columns.ACTIONS]  # Discrete: unchanged
    assert out[Columns.ACTION_LOGP].shape == (8,) and np.all(out[Columns.ACTION_LOGP] <= 0)
    if not explore:  # (greedy: certain)
        assert np.all(out[Columns.ACTION_LOGP] == 0)
    assert [p.name for p in m2e] == ["GetActions", "TensorToNumpy", "NormalizeAndClipActions"]


def test_default_pipelines_continuous_multi_module_with_user_pieces():
    space = gym.spaces.Box(np.array([-1.0, 0.0], np.float32), np.array([1.0, 10.0], np.float32))
    multi = _multi(action_space=space, ids=("p", "q"))
    f = MeanStdFilter()
    e2m = default_env_to_module_pipeline(device="cpu", connectors=[f])
    m2e = default_module_to_env_pipeline(normalize_actions=False, clip_actions=True)
    batch = {
        "p": {Columns.OBS: np.ones((3, 2), np.float32)},
        "q": {Columns.OBS: np.zeros((1, 2), np.float32)},
    }
    batch = e2m(rl_module=multi, batch=batch, episodes=[], explore=True)
    assert [p.name for p in e2m] == ["MeanStdFilter", "NumpyToTensor"]
    out = m2e(rl_module=multi, batch=multi.forward_exploration(batch), episodes=[], explore=True)
    for mid, n in (("p", 3), ("q", 1)):
        env_actions = out[mid][Columns.ACTIONS_FOR_ENV]
        assert env_actions.shape == (n, 2) and space.contains(env_actions[0].astype(np.float32))
    assert set(e2m.get_state()) == {"MeanStdFilter"} and set(e2m.get_state()["MeanStdFilter"]) == {
        "p",
        "q",
    }


class _Tag(ConnectorV2):
    """A user piece before the default tail: marks every module batch."""

    def __call__(self, *, rl_module, batch, episodes, **kwargs):
        for out in batch.values():
            out["tag"] = torch.ones(1)
        return batch


@pytest.mark.parametrize("explore", [True, False])
@pytest.mark.parametrize("with_logp", [False, True])
def test_default_tail_in_one_pass_gives_the_pieces_batch(explore, with_logp):
    """The module-to-env pipeline runs its default tail (GetActions, TensorToNumpy,
    NormalizeAndClipActions) as one pass: the same batch, value for value and dtype for
    dtype, as calling the pieces one by one, for categorical, Gaussian and
    multi-categorical modules, with a user piece first and with module-given logp."""
    spaces = {
        "c": gym.spaces.Discrete(3),
        "g": gym.spaces.Box(np.array([-1.0, 0.0], np.float32), np.array([1.0, 10.0], np.float32)),
        "m": gym.spaces.MultiDiscrete([2, 3]),
    }
    multi = MultiRLModuleSpec(
        rl_module_specs={
            mid: RLModuleSpec(
                observation_space=OBS, action_space=space, model_config={"fcnet_hiddens": [8]}
            )
            for mid, space in spaces.items()
        }
    ).build()
    obs = torch.as_tensor(np.random.default_rng(1).normal(size=(5, 2)).astype(np.float32))

    def module_out() -> dict:
        with torch.no_grad():
            out = multi.forward_exploration({mid: {Columns.OBS: obs} for mid in spaces})
        if with_logp:
            for o in out.values():
                o[Columns.ACTION_LOGP] = torch.zeros(5)
        return out

    fused = default_module_to_env_pipeline(connectors=[_Tag()])
    pieces = list(fused)
    torch.manual_seed(7)
    got = fused(rl_module=multi, batch=module_out(), episodes=[], explore=explore)
    torch.manual_seed(7)
    want = module_out()
    for piece in pieces:
        want = piece(rl_module=multi, batch=want, episodes=[], explore=explore)
    assert set(got) == set(want) == set(spaces)
    for mid in spaces:
        assert set(got[mid]) == set(want[mid])
        assert Columns.ACTIONS_FOR_ENV in got[mid] and "tag" in got[mid]
        for col, value in want[mid].items():
            assert isinstance(got[mid][col], np.ndarray), (mid, col)
            assert got[mid][col].dtype == value.dtype, (mid, col)
            np.testing.assert_array_equal(got[mid][col], value, err_msg=f"{mid}/{col}")

    # Not the exact default classes (a subclass): the pieces run one by one, same result.
    class MyGetActions(GetActions):
        pass

    custom = default_module_to_env_pipeline()
    custom.connectors[0] = MyGetActions()
    torch.manual_seed(7)
    out = custom(rl_module=multi, batch=module_out(), episodes=[], explore=explore)
    for mid in spaces:
        np.testing.assert_array_equal(out[mid][Columns.ACTIONS], got[mid][Columns.ACTIONS])


def test_connector_base_defaults():
    piece = TensorToNumpy(input_observation_space=OBS, input_action_space=gym.spaces.Discrete(2))
    assert piece.observation_space is OBS and piece.action_space == gym.spaces.Discrete(2)
    assert piece.get_state() == {} and piece.merge_states([{}, {}]) == {}
    piece.set_state({})
    piece.reset_state()
    assert repr(piece) == "TensorToNumpy()" and piece.name == "TensorToNumpy"
    piece.input_action_space = gym.spaces.Discrete(5)
    assert piece.action_space == gym.spaces.Discrete(5)
    assert ConnectorV2.space_for({"a": OBS}, "b") is None and ConnectorV2.space_for(OBS, "b") is OBS
    assert isinstance(MultiRLModule(), MultiRLModule)
    assert isinstance(DefaultMLPModule, type)


def test_env_to_module_pipeline_only_converts_with_only_numpy_to_tensor():
    """``only_converts`` holds for the default pipeline and for NumpyToTensor pieces
    alone, and not where a call could do more: another piece, a subclass of the piece,
    or a pipeline class with its own ``_run``."""

    class MyNumpyToTensor(NumpyToTensor):
        pass

    class MyPipeline(EnvToModulePipeline):
        def _run(self, pieces, call, batch):
            return super()._run(pieces, call, batch)

    assert default_env_to_module_pipeline().only_converts()
    assert EnvToModulePipeline(connectors=[NumpyToTensor(), NumpyToTensor()]).only_converts()
    assert not default_env_to_module_pipeline(connectors=[FlattenObservations()]).only_converts()
    assert not EnvToModulePipeline(connectors=[MyNumpyToTensor()]).only_converts()
    assert not MyPipeline(connectors=[NumpyToTensor()]).only_converts()


@pytest.mark.parametrize("pieces", [1, 2], ids=["one piece", "two pieces"])
def test_convert_observations_is_the_pipeline_call(pieces: int) -> None:
    """Where the pipeline only converts, ``convert_observations`` gives what a call gives
    (float64 observations become float32; a second piece converts the first's tensors);
    otherwise it gives None and the caller calls the pipeline."""
    multi = MultiRLModule(
        rl_modules={
            mid: DefaultMLPModule(observation_space=OBS, action_space=gym.spaces.Discrete(2))
            for mid in ("p0", "p1")
        }
    )
    pipeline = EnvToModulePipeline(connectors=[NumpyToTensor() for _ in range(pieces)])
    observations = {"p0": np.arange(8.0).reshape(2, 4), "p1": np.ones((3, 4), np.float32)}
    direct = pipeline.convert_observations(multi, observations)
    called = pipeline(
        rl_module=multi,
        batch={mid: {Columns.OBS: o} for mid, o in observations.items()},
        episodes=[],
    )
    assert direct is not None and list(direct) == list(called) == ["p0", "p1"]
    for mid in called:
        assert list(direct[mid]) == [Columns.OBS]
        a, b = direct[mid][Columns.OBS], called[mid][Columns.OBS]
        assert a.dtype == b.dtype == torch.float32 and torch.equal(a, b)
    assert (
        default_env_to_module_pipeline(connectors=[FlattenObservations()]).convert_observations(
            multi, observations
        )
        is None
    )
