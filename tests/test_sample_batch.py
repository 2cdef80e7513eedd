"""``fastrollout.batches``: SampleBatch, MultiAgentBatch, concat_samples, episode conversion.

Properties (concat then split gives the parts back, slices of slices, lossless
compression), then differential tests against RLlib 2.60's ``SampleBatch`` on the same
data, then the conversion of numpy'ized episodes into the old stack's training columns.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from fastrollout.batches import (
    CompressedArray,
    MultiAgentBatch,
    SampleBatch,
    concat_samples,
    episodes_to_multi_agent_batch,
    episodes_to_sample_batch,
)
from fastrollout.core.tree import tree_map
from fastrollout.episodes import SingleAgentEpisode

needs_rllib = pytest.mark.skipif(
    importlib.util.find_spec("ray") is None, reason="RLlib 2.60 not installed"
)


def make_batch(lengths: list[int], first_id: int = 0, offset: int = 0) -> SampleBatch:
    """Episodes of the given lengths back to back, with ids, dones, nested obs and infos."""
    n = sum(lengths)
    eps_id = np.repeat(np.arange(first_id, first_id + len(lengths)), lengths)
    terminateds = np.zeros(n, dtype=bool)
    terminateds[np.cumsum(lengths, dtype=np.int64) - 1] = True  # lengths are >= 1
    rows = np.arange(offset, offset + n)
    return SampleBatch(
        {
            "obs": rows.astype(np.float32)[:, None] * np.ones(3, np.float32),
            "actions": rows % 2,
            "rewards": rows.astype(np.float32) / 2,
            "terminateds": terminateds,
            "truncateds": np.zeros(n, dtype=bool),
            "eps_id": eps_id,
            "infos": [{"row": int(r)} for r in rows],
            "nested": {"a": rows.copy(), "b": (rows * 2, rows.astype(np.int8))},
        }
    )


def assert_same_batch(a: Any, b: Any) -> None:
    assert sorted(a.keys()) == sorted(b.keys())
    assert a.count == b.count
    for key in a:
        assert_same_value(a[key], b[key])


def assert_same_value(a: Any, b: Any) -> None:
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            assert_same_value(a[k], b[k])
    elif isinstance(a, tuple):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_same_value(x, y)
    elif isinstance(a, np.ndarray) and a.dtype != object:
        assert isinstance(b, np.ndarray)
        assert a.dtype == b.dtype and a.shape == b.shape
        assert a.tobytes() == b.tobytes()
    else:
        assert list(a) == list(b)


def as_arrays(value: Any) -> Any:
    """Every leaf of a (nested) row as a numpy array."""
    return tree_map(np.asarray, value)


lengths_st = st.lists(st.integers(1, 6), min_size=0, max_size=6)

# ------------------------------------------------------------------------------ basics


def test_columns_and_counts() -> None:
    b = SampleBatch({"obs": [[1, 2], [3, 4], [5, 6]], "infos": [{}, {}, {}]})
    assert b.count == len(b) == b.agent_steps() == b.env_steps() == 3
    assert isinstance(b["obs"], np.ndarray) and b["obs"].shape == (3, 2)
    assert isinstance(b["infos"], list)
    assert b.columns(["infos", "obs"])[0] == [{}, {}, {}]
    assert [r["obs"].tolist() for r in b.rows()] == [[1, 2], [3, 4], [5, 6]]
    assert SampleBatch().count == 0
    assert SampleBatch.OBS == "obs" and SampleBatch.NEXT_OBS == "new_obs"


def test_ragged_columns_and_dones_are_refused() -> None:
    with pytest.raises(ValueError, match="rows"):
        SampleBatch({"obs": np.zeros(3), "actions": np.zeros(2)})
    with pytest.raises(KeyError):
        SampleBatch({"dones": [True]})
    b = SampleBatch({"terminateds": [False, True]})
    with pytest.raises(KeyError):
        b["dones"] = np.zeros(2)
    assert b["dones"].tolist() == [False, True]


def test_copy_is_deep_unless_shallow() -> None:
    b = make_batch([2, 3])
    deep, shallow = b.copy(), b.copy(shallow=True)
    b["obs"][0, 0] = 99.0
    assert deep["obs"][0, 0] == 0.0
    assert shallow["obs"][0, 0] == 99.0


def test_slice_bounds() -> None:
    b = make_batch([5])
    assert b[2:100].count == 3
    assert b[:].count == 5
    assert_same_batch(b[1:4], b.slice(1, 4))
    with pytest.raises(ValueError):
        b[::2]
    with pytest.raises(ValueError):
        b[-2:]


@given(lengths_st)
def test_concat_then_split_gives_back_the_episodes(lengths: list[int]) -> None:
    parts = [make_batch([n], first_id=i, offset=10 * i) for i, n in enumerate(lengths)]
    joined = concat_samples(parts)
    assert isinstance(joined, SampleBatch)
    assert joined.count == sum(lengths)
    for key in (None, "eps_id", "dones"):
        split = joined.split_by_episode(key) if joined.count else []
        assert len(split) == len(parts)
        for got, want in zip(split, parts, strict=True):
            assert_same_batch(got, want)


@given(lengths_st, st.integers(0, 40), st.integers(0, 40), st.integers(0, 40), st.integers(0, 40))
def test_slice_of_slice(lengths: list[int], a: int, b: int, c: int, d: int) -> None:
    batch = make_batch(lengths)
    outer = batch[a : a + b]
    inner = outer[c : c + d]
    start = min(a, batch.count) + min(c, outer.count)
    want = batch[start : start + inner.count]
    assert inner.count == max(0, min(d, outer.count - c))
    assert_same_batch(inner, want)


@given(lengths_st, st.integers(0, 30))
def test_slices_concat_to_the_whole(lengths: list[int], cut: int) -> None:
    batch = make_batch(lengths)
    cut = min(cut, batch.count)
    joined = batch[:cut].concat(batch[cut:])
    if batch.count:
        assert_same_batch(joined, batch)
    else:
        assert joined.count == 0


def test_concat_averages_grad_updates_and_keeps_first_columns() -> None:
    a = SampleBatch({"x": np.zeros(1)}, _num_grad_updates=1.0)
    b = SampleBatch({"x": np.zeros(3), "y": np.zeros(3)}, _num_grad_updates=3.0)
    out = concat_samples([a, SampleBatch(), b])
    assert isinstance(out, SampleBatch)
    assert out.num_grad_updates == pytest.approx(2.5)
    assert list(out.keys()) == ["x"]
    with pytest.raises(KeyError):
        concat_samples([b, a])


# -------------------------------------------------------------------------- compression

arrays_st = hnp.arrays(
    dtype=st.one_of(
        hnp.floating_dtypes(),
        hnp.integer_dtypes(),
        hnp.boolean_dtypes(),
        hnp.complex_number_dtypes(),
    ),
    shape=hnp.array_shapes(min_dims=1, max_dims=3, min_side=0, max_side=5),
)


@given(arrays_st, st.booleans())
def test_compress_round_trips_exactly(obs: np.ndarray, bulk: bool) -> None:
    batch = SampleBatch({"obs": obs.copy(), "new_obs": obs.copy()})
    count = batch.count
    batch.compress(bulk=bulk)
    assert batch.count == count
    if obs.shape[0] and obs.size:
        assert not isinstance(batch["obs"], np.ndarray) or batch["obs"].dtype == object
    batch.decompress_if_needed()
    batch.decompress_if_needed()  # a second call leaves the data alone
    assert_same_value(batch["obs"], obs)
    assert_same_value(batch["new_obs"], obs)


def test_compress_per_row_keeps_slicing_and_concat() -> None:
    batch = make_batch([3, 4])
    packed = batch.copy().compress(columns={"obs", "nested"})
    assert isinstance(packed["obs"][0], CompressedArray)
    assert packed.size_bytes() != batch.size_bytes()
    joined = concat_samples([packed[:2], packed[2:]])
    assert isinstance(joined, SampleBatch)
    joined.decompress_if_needed(columns={"obs", "nested"})
    assert_same_batch(joined, batch)


def test_bulk_compressed_columns_refuse_slicing() -> None:
    batch = make_batch([3]).compress(bulk=True)
    assert batch.count == 3
    with pytest.raises(TypeError, match="decompress"):
        batch[:2]


def test_object_columns_are_not_compressed() -> None:
    batch = SampleBatch({"obs": np.array([{}, {}], dtype=object)})
    with pytest.raises(TypeError, match="object"):
        batch.compress(bulk=True)


# ----------------------------------------------------------------------- MultiAgentBatch


def test_multi_agent_counts_and_concat() -> None:
    ma = MultiAgentBatch({"p0": make_batch([2]), "p1": make_batch([3])}, env_steps=3)
    assert ma.count == len(ma) == ma.env_steps() == 3
    assert ma.agent_steps() == 5
    assert ma["p1"].count == 3
    out = concat_samples([ma, make_batch([4]), SampleBatch(), ma.copy()])
    assert isinstance(out, MultiAgentBatch)
    assert out.env_steps() == 10
    assert {k: v.count for k, v in out.policy_batches.items()} == {
        "p0": 4,
        "p1": 6,
        "default_policy": 4,
    }
    assert MultiAgentBatch.wrap_as_needed({"default_policy": make_batch([1])}, 1).count == 1
    with pytest.raises(TypeError):
        MultiAgentBatch({"p": {"obs": np.zeros(1)}}, 1)  # type: ignore[dict-item]


def test_multi_agent_compress_round_trip() -> None:
    ma = MultiAgentBatch({"p0": make_batch([2, 1]), "p1": make_batch([3])}, env_steps=3)
    packed = ma.copy()
    packed.compress(bulk=True)
    assert isinstance(packed["p0"]["obs"], CompressedArray)
    packed.decompress_if_needed()
    for pid in ma.policy_batches:
        assert_same_batch(packed[pid], ma[pid])


# ------------------------------------------------------------------ differential (RLlib)


def to_rllib(batch: SampleBatch) -> Any:
    from ray.rllib.policy.sample_batch import SampleBatch as RLlibBatch

    return RLlibBatch({k: v for k, v in dict.items(batch)})


@needs_rllib
def test_constants_match_rllib() -> None:
    from ray.rllib.policy.sample_batch import SampleBatch as RLlibBatch

    names = [n for n in vars(RLlibBatch) if n.isupper() and isinstance(getattr(RLlibBatch, n), str)]
    assert names
    for name in names:
        assert getattr(SampleBatch, name) == getattr(RLlibBatch, name), name


@needs_rllib
@given(lengths_st, st.integers(0, 30), st.integers(0, 30))
def test_concat_split_slice_match_rllib(lengths: list[int], a: int, b: int) -> None:
    from ray.rllib.policy.sample_batch import concat_samples as rllib_concat

    parts = [make_batch([n], first_id=i, offset=5 * i) for i, n in enumerate(lengths)]
    ours = concat_samples(parts)
    theirs = rllib_concat([to_rllib(p) for p in parts])
    assert_same_batch(ours, theirs)
    if not ours.count:
        return
    for key in (None, "dones"):
        got, want = ours.split_by_episode(key), theirs.split_by_episode(key)
        assert len(got) == len(want)
        for x, y in zip(got, want, strict=True):
            assert_same_batch(x, y)
    if a + b > 0:  # RLlib reads batch[0:0] as the whole batch (``stop or len``)
        assert_same_batch(ours[a : a + b], theirs[a : a + b])
    # RLlib's slice() maps into the info dicts (and fails on them): compare without infos.
    no_infos = SampleBatch({k: v for k, v in ours.items() if k != "infos"})
    assert_same_batch(no_infos.slice(a, a + b), to_rllib(no_infos).slice(a, a + b))
    ours_rows, their_rows = list(no_infos.rows()), list(to_rllib(no_infos).rows())
    assert len(ours_rows) == len(their_rows)
    for x, y in zip(ours_rows, their_rows, strict=True):
        assert sorted(x) == sorted(y)
        assert_same_value(as_arrays(x), as_arrays(y))
    assert ours.is_single_trajectory() == theirs.is_single_trajectory()


@needs_rllib
def test_split_by_dones_with_truncation_matches_rllib() -> None:
    data = {
        "x": np.arange(7),
        "terminateds": np.array([0, 1, 0, 0, 0, 0, 0], bool),
        "truncateds": np.array([0, 0, 0, 1, 0, 0, 1], bool),
    }
    ours, theirs = SampleBatch(dict(data)), to_rllib(SampleBatch(dict(data)))
    got, want = ours.split_by_episode(), theirs.split_by_episode()
    assert [s["x"].tolist() for s in got] == [s["x"].tolist() for s in want]


@needs_rllib
def test_multi_agent_concat_matches_rllib() -> None:
    from ray.rllib.policy.sample_batch import MultiAgentBatch as RLlibMA
    from ray.rllib.policy.sample_batch import concat_samples as rllib_concat

    p0, p1, single = make_batch([2, 1]), make_batch([3]), make_batch([4])
    ours = concat_samples([MultiAgentBatch({"p0": p0, "p1": p1}, 3), single])
    theirs = rllib_concat([RLlibMA({"p0": to_rllib(p0), "p1": to_rllib(p1)}, 3), to_rllib(single)])
    assert isinstance(ours, MultiAgentBatch)
    assert ours.env_steps() == theirs.env_steps()
    assert ours.agent_steps() == theirs.agent_steps()
    assert ours.policy_batches.keys() == theirs.policy_batches.keys()
    for pid in ours.policy_batches:
        assert_same_batch(ours[pid], theirs[pid])


# ---------------------------------------------------------------------------- episodes


def run_episodes(lengths: list[int], seed: int = 0) -> list[SingleAgentEpisode]:
    """CartPole chunks of at most the given lengths, numpy'ized, with model outputs.

    Chunk i continues an episode after i steps (``cut``), so it starts at ``t = i`` with
    look-back data before it.
    """
    env = gym.make("CartPole-v1")
    env.action_space.seed(seed)
    out = []
    for i, n in enumerate(lengths):
        ep = SingleAgentEpisode(
            observation_space=env.observation_space, action_space=env.action_space
        )
        obs, info = env.reset(seed=seed + i)
        ep.add_env_reset(obs, info)
        for t in range(i + n):
            if t == i:
                ep = ep.cut()
            action = env.action_space.sample()
            obs, reward, terminated, truncated, info = env.step(action)
            ep.add_env_step(
                obs,
                action,
                reward,
                info,
                terminated=terminated,
                truncated=truncated or (t == i + n - 1 and i % 2 == 1),
                extra_model_outputs={
                    "vf_preds": np.float32(t - i),
                    "action_logp": np.float32(-t),
                    "action_dist_inputs": np.full(2, t, np.float32),
                },
            )
            if ep.is_done:
                break
        out.append(ep.to_numpy())
    return out


# dtypes of RLlib 2.60's old-stack sampler (RolloutWorker + PPOTorchPolicy on CartPole-v1),
# except actions (RLlib: int32 from the torch policy; here the action space's int64) and
# eps_id (RLlib: a random int64; here the episode's id_).
OLD_STACK_DTYPES = {
    "obs": np.float32,
    "new_obs": np.float32,
    "rewards": np.float32,
    "terminateds": np.bool_,
    "truncateds": np.bool_,
    "infos": np.object_,
    "unroll_id": np.int64,
    "agent_index": np.int64,
    "t": np.int64,
    "vf_preds": np.float32,
    "action_logp": np.float32,
    "action_dist_inputs": np.float32,
}


@given(st.lists(st.integers(1, 30), min_size=1, max_size=4))
def test_episodes_to_sample_batch(lengths: list[int]) -> None:
    episodes = run_episodes(lengths)
    batch = episodes_to_sample_batch(episodes, unroll_id_start=7)
    assert batch.count == sum(len(e) for e in episodes)
    for key, dtype in OLD_STACK_DTYPES.items():
        assert batch[key].dtype == dtype, key
    parts = batch.split_by_episode()
    assert len(parts) == len(episodes)
    for i, (part, ep) in enumerate(zip(parts, episodes, strict=True)):
        n = len(ep)
        obs = ep.get_observations()
        np.testing.assert_array_equal(part["obs"], obs[:-1])
        np.testing.assert_array_equal(part["new_obs"], obs[1:])
        np.testing.assert_array_equal(part["actions"], ep.get_actions())
        np.testing.assert_array_equal(part["rewards"], ep.get_rewards())
        assert list(part["infos"]) == list(ep.get_infos()[:-1])
        assert part["terminateds"].tolist() == [False] * (n - 1) + [ep.is_terminated]
        assert part["truncateds"].tolist() == [False] * (n - 1) + [ep.is_truncated]
        assert part["t"].tolist() == list(range(ep.t_started, ep.t_started + n))
        assert set(part["eps_id"].tolist()) == {ep.id_}
        assert set(part["unroll_id"].tolist()) == {7 + i}
        assert set(part["agent_index"].tolist()) == {0}
        np.testing.assert_array_equal(part["vf_preds"], np.arange(n, dtype=np.float32))


def test_episodes_to_sample_batch_needs_numpy_episodes() -> None:
    ep = SingleAgentEpisode()
    ep.add_env_reset(np.zeros(2, np.float32))
    ep.add_env_step(np.ones(2, np.float32), 1, 0.5)
    with pytest.raises(ValueError, match="to_numpy"):
        episodes_to_sample_batch([ep])
    assert episodes_to_sample_batch([]).count == 0


def test_episodes_to_multi_agent_batch() -> None:
    episodes = run_episodes([5, 8, 3])
    ma = episodes_to_multi_agent_batch(episodes, ["a", "b", "a"])
    assert ma.env_steps() == max(len(e) for e in episodes)
    assert ma.agent_steps() == sum(len(e) for e in episodes)
    assert sorted(set(ma["a"]["agent_index"].tolist())) == [0, 2]
    assert ma["b"]["eps_id"][0] == episodes[1].id_
    assert episodes_to_multi_agent_batch(episodes, "p", env_steps=4).env_steps() == 4
    with pytest.raises(ValueError):
        episodes_to_multi_agent_batch(episodes, ["a"])


# ------------------------------------------------------------------- more batch methods


@given(lengths_st, st.integers(1, 8))
def test_timeslices_cover_the_batch(lengths: list[int], k: int) -> None:
    batch = make_batch(lengths)
    by_size = batch.timeslices(size=k)
    assert all(s.count == k for s in by_size[:-1])
    by_num = batch.timeslices(num_slices=k)
    assert len(by_num) == k
    assert max(s.count for s in by_num) - min(s.count for s in by_num) <= 1
    for parts in (by_size, by_num):
        joined = concat_samples(parts)
        assert joined.count == batch.count
        if batch.count:
            assert_same_batch(joined, batch)
    with pytest.raises(ValueError):
        batch.timeslices()


@given(lengths_st)
def test_shuffle_permutes_rows_together(lengths: list[int]) -> None:
    batch = make_batch(lengths)
    shuffled = batch.copy().shuffle()
    order = np.argsort(shuffled["nested"]["a"])
    assert_same_value(shuffled["obs"][order], batch["obs"])
    assert [shuffled["infos"][i] for i in order] == batch["infos"]
    assert_same_value(shuffled["nested"]["b"][1][order], batch["nested"]["b"][1])


def test_pickle_keeps_columns_and_attributes() -> None:
    import pickle

    batch = SampleBatch({"obs": np.arange(3), "infos": [{}, {}, {}]}, _num_grad_updates=2.0)
    batch.compress(columns={"obs"})
    back = pickle.loads(pickle.dumps(batch))
    assert back.count == 3 and back.num_grad_updates == 2.0
    assert_same_value(back.decompress_if_needed(columns={"obs"})["obs"], np.arange(3))


def test_episodes_with_dict_observations() -> None:
    space = gym.spaces.Dict(
        {"a": gym.spaces.Box(-1, 1, (2,), np.float32), "b": gym.spaces.Discrete(3)}
    )
    space.seed(0)
    ep = SingleAgentEpisode(observation_space=space, action_space=gym.spaces.Discrete(2))
    ep.add_env_reset(space.sample())
    for _ in range(4):
        ep.add_env_step(space.sample(), 1, 1.0)
    batch = episodes_to_sample_batch([ep.to_numpy()])
    obs = ep.get_observations()
    for key in ("a", "b"):
        np.testing.assert_array_equal(batch["obs"][key], obs[key][:-1])
        np.testing.assert_array_equal(batch["new_obs"][key], obs[key][1:])
    assert batch[1:3]["obs"]["a"].shape == (2, 2)
    packed = batch.copy().compress()
    packed.decompress_if_needed()
    assert_same_batch(packed, batch)


@needs_rllib
def test_columns_and_dtypes_match_rllib_old_stack_sampler() -> None:
    """RLlib's RolloutWorker (old stack, PPOTorchPolicy, CartPole): the same columns."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from ray.rllib.algorithms.ppo import PPOConfig
        from ray.rllib.algorithms.ppo.ppo_torch_policy import PPOTorchPolicy
        from ray.rllib.evaluation.rollout_worker import RolloutWorker

        config = (
            PPOConfig()
            .api_stack(enable_rl_module_and_learner=False, enable_env_runner_and_connector_v2=False)
            .environment("CartPole-v1")
            .env_runners(rollout_fragment_length=40, num_envs_per_env_runner=1)
        )
        worker = RolloutWorker(
            env_creator=lambda _: gym.make("CartPole-v1"),
            default_policy_class=PPOTorchPolicy,
            config=config,
        )
        theirs = worker.sample().policy_batches["default_policy"]
        worker.stop()
    ours = episodes_to_sample_batch(run_episodes([5, 40]))
    # PPO's postprocessing adds these; the sampler's own columns are the rest.
    postprocessed = {"advantages", "value_targets", "values_bootstrapped"}
    assert set(ours) == set(theirs) - postprocessed
    for key in ours:
        if key in ("actions", "eps_id"):  # documented deviations (see OLD_STACK_DTYPES)
            continue
        assert ours[key].dtype == theirs[key].dtype, key
        assert ours[key].shape[1:] == theirs[key].shape[1:], key
