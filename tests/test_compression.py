"""Compressed observation columns read exactly as uncompressed ones.

``compress_observations`` (``RunnerConfig.env_runners``) stores an episode's typed
observations in LZ4 blocks in the core (``rust/column/packed.rs``); these properties drive
an episode with and without compression through the same steps and compare every read.
Blocks of 1-4 steps make short episodes seal many blocks.
"""

from __future__ import annotations

import pickle

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastrollout import RunnerConfig
from fastrollout.episodes import SingleAgentEpisode

SPACES = {
    "image": gym.spaces.Box(0, 255, (6, 5, 2), np.uint8),
    "dict": gym.spaces.Dict(
        {"pos": gym.spaces.Box(-1.0, 1.0, (3,), np.float32), "id": gym.spaces.Discrete(5)}
    ),
}


def _pair(space_name: str, rows: int, n: int, lookback: int, seed: int):
    space = SPACES[space_name]
    space.seed(seed)
    obs = [space.sample() for _ in range(n + 1)]
    eps = []
    for compressed in (False, True):
        ep = SingleAgentEpisode(observation_space=space, action_space=gym.spaces.Discrete(2))
        if compressed:
            ep._set_compression("observations", rows)
        ep.add_env_reset(obs[0])
        for t in range(n):
            ep.add_env_step(obs[t + 1], t % 2, float(t))
        eps.append(ep)
    plain, packed = eps
    assert packed._compression("observations") == rows
    return plain, packed, lookback


def _same(a, b) -> None:
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys()
        for k in a:
            _same(a[k], b[k])
    elif isinstance(a, list | tuple):
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _same(x, y)
    else:
        np.testing.assert_array_equal(a, b)
        assert np.asarray(a).dtype == np.asarray(b).dtype


def _reads(ep, n: int):
    out = [ep.get_observations()]
    for i in range(-n - 2, n + 2):
        out.append(ep.get_observations(i, fill=0))
        out.append(ep.get_observations(i, neg_index_as_lookback=True, fill=0))
    out.append(ep.get_observations(slice(1, None, 2)))
    out.append(ep.get_observations(list(range(0, n + 1, 3))))
    out.append(ep.get_observations(slice(-n - 3, 2), fill=0))
    return out


episodes = st.tuples(
    st.sampled_from(sorted(SPACES)),
    st.integers(1, 4),
    st.integers(0, 25),
    st.integers(0, 5),
    st.integers(0, 2**16),
)


@settings(max_examples=60, deadline=None)
@given(episodes)
def test_reads_cut_slice_and_numpy_agree(args) -> None:
    plain, packed, lookback = _pair(*args)
    n = len(plain)
    _same(_reads(packed, n), _reads(plain, n))
    cp, cq = plain.cut(len_lookback_buffer=lookback), packed.cut(len_lookback_buffer=lookback)
    assert cq._compression("observations") == args[1], "the successor stays compressed"
    _same(_reads(cq, 0), _reads(cp, 0))
    if n:
        a, b = n // 3, max(n // 3 + 1, n - 1)
        _same(_reads(packed.slice(slice(a, b)), b - a), _reads(plain.slice(slice(a, b)), b - a))
    plain.to_numpy()
    packed.to_numpy()
    _same(_reads(packed, n), _reads(plain, n))
    _same(packed.get_observations(), plain.get_observations())


@settings(max_examples=40, deadline=None)
@given(episodes, st.integers(1, 12))
def test_concat_state_and_pickle_agree(args, more: int) -> None:
    plain, packed, lookback = _pair(*args)
    if plain.is_done:
        return
    space = SPACES[args[0]]
    succ = []
    for ep in (plain, packed):
        s = ep.cut(len_lookback_buffer=lookback)
        for t in range(more):
            s.add_env_step(space.sample() if t else s.get_observations(-1), 0, 1.0)
        succ.append(s)
    # Same steps for both successors.
    for t in range(more):
        obs = succ[0].get_observations(t + 1)
        succ[1].set_observations(new_data=obs, at_indices=t + 1)
    plain.concat_episode(succ[0])
    packed.concat_episode(succ[1])
    _same(_reads(packed, len(plain)), _reads(plain, len(plain)))
    state_p, state_q = plain.get_state(), packed.get_state()
    _same(state_q["observations"], state_p["observations"]) if "observations" in state_p else None
    back_p = SingleAgentEpisode.from_state(state_p)
    back_q = SingleAgentEpisode.from_state(state_q)
    _same(_reads(back_q, len(plain)), _reads(back_p, len(plain)))
    _same(_reads(pickle.loads(pickle.dumps(packed)), len(plain)), _reads(plain, len(plain)))


def test_compression_holds_fewer_bytes_and_needs_a_typed_column() -> None:
    space = gym.spaces.Box(0, 255, (84, 84, 4), np.uint8)
    frames = np.zeros((200, 84, 84, 4), np.uint8)
    frames[:, 40:, :, :] = 90
    for t in range(200):
        frames[t, t % 70 : t % 70 + 10, 20:30] = 255
    eps = []
    for rows in (None, 32):
        ep = SingleAgentEpisode(observation_space=space, action_space=gym.spaces.Discrete(2))
        if rows:
            ep._set_compression("observations", rows)
        ep.add_env_reset(frames[0])
        for t in range(1, 200):
            ep.add_env_step(frames[t], 0, 0.0)
        eps.append(ep)
    raw, packed = (e._stored_bytes("observations") for e in eps)
    assert raw == 200 * 84 * 84 * 4
    assert packed * 4 < raw
    np.testing.assert_array_equal(eps[1].get_observations(), frames)
    with pytest.raises(ValueError, match="typed column"):
        SingleAgentEpisode()._set_compression("observations", 4)


def test_runner_config_key() -> None:
    from fastrollout.env.examples import SyntheticImageEnv

    cfg = (
        RunnerConfig()
        .environment(SyntheticImageEnv, env_config={"frames": "scene", "episode_len": 70})
        .env_runners(num_envs_per_env_runner=2, compress_observations=True)
    )
    assert cfg.compress_observations is True
    import fastrollout as fr

    runs = []
    for compress in (False, True):
        runner = fr.SingleAgentEnvRunner(config=cfg.env_runners(compress_observations=compress))
        eps = runner.sample(num_timesteps=200, random_actions=True)
        runs.append([(e.t_started, e.get_observations()) for e in eps])
        runner.stop()
    assert len(runs[0]) == len(runs[1]) > 0
    for (t0, a), (t1, b) in zip(*runs, strict=True):
        assert t0 == t1
        np.testing.assert_array_equal(a, b)
