"""Compressed observation columns read exactly as uncompressed ones.

``compress_observations`` (``RunnerConfig.env_runners``) stores an episode's typed
observations in LZ4 blocks in the core (``rust/column/packed.rs``); these properties drive
an episode with and without compression through the same steps and compare every read.
Blocks of 1-4 steps make short episodes seal many blocks. A chunk that takes no more steps
(a done episode, or one a runner hands out: ``_seal``) keeps no item uncompressed; it
reads the same and still takes later steps.
"""

from __future__ import annotations

import copy
import pickle

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import event, given, note, settings
from hypothesis import strategies as st

from _ma_scripts import Planner, ScriptConfig, assert_same_ma
from fastrollout import RunnerConfig
from fastrollout.episodes import MultiAgentEpisode, SingleAgentEpisode
from fastrollout.errors import SpaceMismatchError
from test_properties_multi_agent_episode import SEEDS, extra_keys

SPACES = {
    "image": gym.spaces.Box(0, 255, (6, 5, 2), np.uint8),
    "dict": gym.spaces.Dict(
        {"pos": gym.spaces.Box(-1.0, 1.0, (3,), np.float32), "id": gym.spaces.Discrete(5)}
    ),
}


def _pair(space_name: str, rows: int, n: int, lookback: int, seed: int, end: str = "open"):
    """The same ``n`` steps in an uncompressed and a compressed episode; with
    ``end="done"`` the last step terminates it, with ``"sealed"`` the compressed one is
    sealed as a runner seals the chunks it hands out."""
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
            ep.add_env_step(obs[t + 1], t % 2, float(t), terminated=end == "done" and t == n - 1)
        eps.append(ep)
    plain, packed = eps
    if end == "sealed":
        packed._seal()
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
    st.sampled_from(["open", "sealed", "done"]),
)


@settings(max_examples=60, deadline=None)
@given(episodes)
def test_reads_cut_slice_and_numpy_agree(args) -> None:
    plain, packed, lookback = _pair(*args)
    n = len(plain)
    _same(_reads(packed, n), _reads(plain, n))
    if not plain.is_done:
        cp, cq = plain.cut(len_lookback_buffer=lookback), packed.cut(len_lookback_buffer=lookback)
        assert cq._compression("observations") == args[1], "the successor stays compressed"
        _same(_reads(cq, 0), _reads(cp, 0))
        # The successor and the chunk cut from (sealed or not) both take more steps.
        for ep in (plain, packed, cp, cq):
            ep.add_env_step(ep.get_observations(0), 1, 0.5)
        _same(_reads(cq, 1), _reads(cp, 1))
        _same(_reads(packed, n + 1), _reads(plain, n + 1))
        n += 1
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


@settings(max_examples=40, deadline=None)
@given(episodes, st.booleans())
def test_pickles_and_copies_arrive_compressed_as_they_were(args, numpy_first: bool) -> None:
    """A compressed chunk travels as its blocks (a runner's chunks reach the driver through
    pickle): the copy holds the same bytes, sealed as the original, and reads the same."""
    plain, packed, _ = _pair(*args)
    if numpy_first:
        plain.to_numpy()
        packed.to_numpy()
    for back in (pickle.loads(pickle.dumps(packed)), copy.deepcopy(packed), copy.copy(packed)):
        assert back._compression("observations") == packed._compression("observations")
        assert back._stored_bytes("observations") == packed._stored_bytes("observations")
        assert back._is_finalized("observations") == packed._is_finalized("observations")
        _same(_reads(back, len(plain)), _reads(plain, len(plain)))
        if not back.is_done:
            # It takes more steps as the original does.
            twin = copy.deepcopy(plain)
            obs = plain.get_observations(-1)
            for ep in (back, twin):
                ep.add_env_step(obs, 1, 0.5)
            _same(_reads(back, len(twin)), _reads(twin, len(twin)))
        note(f"{len(pickle.dumps(packed))} bytes pickled")


def test_a_sealed_chunk_pickles_as_its_blocks() -> None:
    """A sealed 50-step chunk of moving 84x84x4 frames pickles to a small fraction of its
    raw frames, and a broken packed state is refused with a clear error."""
    space = gym.spaces.Box(0, 255, (84, 84, 4), np.uint8)
    ep = SingleAgentEpisode(observation_space=space, action_space=gym.spaces.Discrete(2))
    ep._set_compression("observations", 32)
    frame = np.zeros((84, 84, 4), np.uint8)
    ep.add_env_reset(frame)
    for t in range(50):
        frame = np.roll(frame, 1, axis=1)
        frame[t % 84] = 200
        ep.add_env_step(frame.copy(), 1, 1.0)
    ep._seal()
    raw = 51 * 84 * 84 * 4
    state = ep._state(rllib=False, packed=True)
    # (The spaces pickle once per batch of episodes; the observations are what scale.)
    observations = len(pickle.dumps(state["observations"]))
    assert observations * 50 < raw, observations
    back = pickle.loads(pickle.dumps(ep))
    assert back._stored_bytes("observations") == ep._stored_bytes("observations")
    np.testing.assert_array_equal(back.get_observations(), ep.get_observations())
    # get_state() (checkpoints, offline files) holds the items themselves.
    assert "data" in ep._state(rllib=False)["observations"]
    state["observations"]["packed"]["blocks"][0][0] = b"\x00" * 8
    with pytest.raises(ValueError, match="does not decompress"):
        SingleAgentEpisode.from_state(state)
    state["observations"]["packed"]["total"] += 1
    with pytest.raises(SpaceMismatchError, match="bytes"):
        SingleAgentEpisode.from_state(state)


def test_episodes_that_arrive_by_pickle_share_their_box_spaces() -> None:
    """Each pickle brings its own copy of the spaces; the rebuilt episodes share one live
    Box per distinct Box (a frame Box is about as big as 50 compressed frames)."""
    space = gym.spaces.Box(0, 255, (84, 84, 4), np.uint8)
    near = gym.spaces.Box(0, 254, (84, 84, 4), np.uint8)

    def chunk(obs_space: gym.Space) -> SingleAgentEpisode:
        ep = SingleAgentEpisode(observation_space=obs_space, action_space=gym.spaces.Discrete(2))
        ep.add_env_reset(obs_space.sample())
        return ep

    first = pickle.loads(pickle.dumps([chunk(space), chunk(space)]))
    second = pickle.loads(pickle.dumps(chunk(space)))
    other = pickle.loads(pickle.dumps(chunk(near)))
    assert first[0].observation_space is first[1].observation_space
    assert second.observation_space is first[0].observation_space
    assert second.observation_space == space and second.observation_space is not space
    assert (
        other.observation_space is not second.observation_space and other.observation_space == near
    )
    ma = MultiAgentEpisode(
        observation_space={"a": space}, action_space={"a": gym.spaces.Discrete(2)}
    )
    ma.add_env_reset(observations={"a": space.sample()})
    back = pickle.loads(pickle.dumps(ma))
    assert back.observation_space["a"] is first[0].observation_space
    assert back.agent_episodes["a"].observation_space is first[0].observation_space


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


def test_a_new_space_keeps_the_compression() -> None:
    """``_set_space`` on a field with no data yet lays it out anew, compressed as before."""
    box = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    ep = SingleAgentEpisode(observation_space=box)
    ep._set_compression("observations", 2)
    ep._set_space("observations", gym.spaces.Box(-1.0, 1.0, (4,), np.float32))
    assert ep._compression("observations") == 2
    ep._set_space("observations", None)
    ep._set_space("observations", box)
    assert ep._compression("observations") == 2


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


@pytest.mark.parametrize(
    ("what", "to_numpy"), [("episodes", True), ("chunks", True), ("chunks", False)]
)
def test_runner_hands_out_chunks_that_keep_nothing_raw(what: str, to_numpy: bool) -> None:
    """Done 100-step episodes and 50-step chunks (of 1000-step episodes) of the
    moving-shapes scene, as ``sample`` returns them: at least 4x fewer stored bytes than
    uncompressed (a chunk of 50 steps would otherwise keep every item raw), the same
    observations, and the successors go on as uncompressed ones do."""
    import fastrollout as fr
    from fastrollout.env.examples import SyntheticImageEnv

    episode_len = 100 if what == "episodes" else 1000
    cfg = (
        RunnerConfig()
        .environment(SyntheticImageEnv, env_config={"frames": "scene", "episode_len": episode_len})
        .env_runners(num_envs_per_env_runner=2, episodes_to_numpy=to_numpy)
        .debugging(seed=0)
    )
    runs, stored = [], []
    for compress in (False, True):
        runner = fr.SingleAgentEnvRunner(config=cfg.env_runners(compress_observations=compress))
        eps = []
        for _ in range(2):
            if what == "episodes":
                eps += runner.sample(num_episodes=2, random_actions=True)
            else:
                eps += runner.sample(num_timesteps=100, random_actions=True)
        runner.stop()
        assert [len(e) for e in eps] == [100 if what == "episodes" else 50] * 4
        assert all(e.is_done for e in eps) is (what == "episodes")
        runs.append([(e.t_started, e.get_observations(), e.get_observations(-1)) for e in eps])
        stored.append(sum(e._stored_bytes("observations") for e in eps))
    for (t0, a, a_last), (t1, b, b_last) in zip(*runs, strict=True):
        assert t0 == t1
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a_last, b_last)
    assert stored[1] * 4 <= stored[0], stored


# --------------------------------------------------------------------------------------
# Multi-agent episodes: every agent's observations, agents that join late included.
# --------------------------------------------------------------------------------------


def _ma_compressed(ep, rows: int) -> None:
    """Every agent episode of ``ep`` stores its (typed) observations in blocks of ``rows``."""
    assert ep._observation_compression == rows
    for aid, sa in ep.agent_episodes.items():
        assert sa._compression("observations") == rows, aid


def _ma_same(plain, packed, rows: int) -> None:
    keys = extra_keys(plain)
    assert_same_ma(plain, packed, keys, ids=False)
    assert plain.env_t_to_agent_t == packed.env_t_to_agent_t
    _ma_compressed(packed, rows)


@settings(max_examples=40, deadline=None)
@given(
    config_seed=SEEDS,
    planner_seed=SEEDS,
    rows=st.integers(1, 4),
    steps=st.integers(0, 16),
    cuts=st.dictionaries(st.integers(1, 12), st.integers(0, 3), min_size=1, max_size=4),
    numpy=st.booleans(),
    seal=st.booleans(),
)
def test_multi_agent_episodes_read_the_same_compressed(
    config_seed: int,
    planner_seed: int,
    rows: int,
    steps: int,
    cuts: dict[int, int],
    numpy: bool,
    seal: bool,
) -> None:
    """Random valid multi-agent steps (agents joining late and leaving, hanging actions,
    cuts before the steps in ``cuts``) recorded into an uncompressed and a compressed
    episode: every chunk, its ``to_numpy``, the chunks joined by ``concat_episode``, a
    ``slice``, ``get_state``/``from_state`` and pickling read the same, and the compressed
    side keeps every agent compressed. With ``seal``, each compressed chunk is sealed once
    its successor is cut, as the runner hands it out."""
    cfg = ScriptConfig.draw(np.random.default_rng(config_seed))
    planner = Planner(cfg, np.random.default_rng(planner_seed))
    note(f"config: {cfg.describe()}")
    sides = {}
    for compressed in (False, True):
        ep = MultiAgentEpisode(id_="same", **cfg.space_kwargs())
        if compressed:
            ep._observation_compression = rows
        sides[compressed] = [ep]
    observations, infos = planner.reset()
    for chunks in sides.values():
        chunks[0].add_env_reset(
            observations=copy.deepcopy(observations), infos=copy.deepcopy(infos)
        )
    for i in range(steps):
        if planner.done:
            break
        if i in cuts:
            for chunks in sides.values():
                chunks.append(chunks[-1].cut(len_lookback_buffer=cuts[i]))
            if seal:
                sides[True][-2]._seal()
        kwargs = planner.step()
        for chunks in sides.values():
            chunks[-1].add_env_step(**copy.deepcopy(kwargs))
    plain, packed = sides[False], sides[True]
    if seal:
        packed[-1]._seal()
    for p, q in zip(plain, packed, strict=True):
        _ma_same(p, q, rows)
    if numpy:
        for p, q in zip(plain, packed, strict=True):
            p.to_numpy()
            q.to_numpy()
            _ma_same(p, q, rows)
    last_p, last_q = plain[-1], packed[-1]
    # State and pickle round trips of the last chunk (deepcopy goes through the state too).
    _ma_same(
        MultiAgentEpisode.from_state(last_p.get_state()),
        MultiAgentEpisode.from_state(last_q.get_state()),
        rows,
    )
    _ma_same(pickle.loads(pickle.dumps(last_p)), pickle.loads(pickle.dumps(last_q)), rows)
    whole_p, whole_q = copy.deepcopy(plain[0]), copy.deepcopy(packed[0])
    for p, q in zip(plain[1:], packed[1:], strict=True):
        whole_p.concat_episode(copy.deepcopy(p))
        whole_q.concat_episode(copy.deepcopy(q))
        _ma_same(whole_p, whole_q, rows)
    n = len(whole_p)
    for a, b in ((0, n), (n // 3, max(n // 3 + 1, n - 1)), (1, None)):
        got = {}
        for name, ep in (("plain", whole_p), ("packed", whole_q)):
            try:
                got[name] = ep.slice(slice(a, b))
            except ValueError as err:  # agents with look-backs of different sizes
                got[name] = type(err)
        if isinstance(got["plain"], type):
            assert got["packed"] is got["plain"]
            continue
        event("slices compared")
        _ma_same(got["plain"], got["packed"], rows)


def test_multi_agent_setting_reaches_every_agent() -> None:
    """Setting ``_observation_compression`` applies it to the agents there are, agents that
    join later get it with their first observation, and ``None`` unpacks them all; agents
    whose observations are Python objects stay as they are."""
    box = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    ep = MultiAgentEpisode(observation_space={"a": box})
    ep.add_env_reset(observations={"a": np.zeros(3, np.float32), "text": "hello"})
    assert ep._observation_compression is None
    assert ep.agent_episodes["a"]._compression("observations") is None
    ep._observation_compression = 2
    assert ep.agent_episodes["a"]._compression("observations") == 2
    assert ep.agent_episodes["text"]._compression("observations") is None
    for t in range(1, 8):
        obs = {"a": np.full(3, t / 10, np.float32), "text": f"t={t}"}
        if t >= 3:
            obs["late"] = np.full((2, 2), t, np.int64)  # no space: typed by its first value
        acts = {aid: 0 for aid in ("a", "text", "late") if aid in ep.get_agents_to_act()}
        ep.add_env_step(obs, acts, dict.fromkeys(acts, 1.0))
    assert ep.agent_episodes["late"]._compression("observations") == 2
    assert ep.agent_episodes["late"]._stored_bytes("observations") > 0
    np.testing.assert_array_equal(
        ep.agent_episodes["late"].get_observations(),
        np.stack([np.full((2, 2), t) for t in range(3, 8)]),
    )
    ep._observation_compression = None
    assert all(sa._compression("observations") is None for sa in ep.agent_episodes.values())
    with pytest.raises(TypeError, match="_observation_compression"):
        ep._observation_compression = "32"
    assert ep._observation_compression is None


@pytest.mark.parametrize("what", ["episodes", "chunks"])
def test_multi_agent_runner_config_key(what: str) -> None:
    """Whole 200-step episodes and 50-step chunks: every agent's observations read the
    same and take at least 4x fewer bytes (nothing is kept raw in what ``sample``
    returns)."""
    import fastrollout as fr
    from fastrollout.env.examples import SyntheticImageEnv
    from fastrollout.env.multi_agent_env import make_multi_agent

    cfg = (
        RunnerConfig()
        .environment(
            make_multi_agent(SyntheticImageEnv),
            env_config={"num_agents": 2, "frames": "scene", "episode_len": 200},
        )
        .env_runners(num_envs_per_env_runner=2)
        .debugging(seed=3)
    )
    runs, stored = [], []
    for compress in (False, True):
        runner = fr.MultiAgentEnvRunner(config=cfg.env_runners(compress_observations=compress))
        if what == "episodes":
            eps = runner.sample(num_episodes=2, random_actions=True)
        else:
            eps = runner.sample(num_timesteps=100, random_actions=True)
            eps += runner.sample(num_timesteps=100, random_actions=True)
            assert {len(sa) for e in eps for sa in e.agent_episodes.values()} == {50}
        runs.append(
            [
                (aid, sa.t_started, sa.get_observations())
                for e in eps
                for aid, sa in sorted(e.agent_episodes.items())
            ]
        )
        stored.append(
            sum(sa._stored_bytes("observations") for e in eps for sa in e.agent_episodes.values())
        )
        if compress:
            assert all(e._observation_compression == 32 for e in eps)
        runner.stop()
    assert len(runs[0]) == len(runs[1]) > 0
    for (a0, t0, x), (a1, t1, y) in zip(*runs, strict=True):
        assert (a0, t0) == (a1, t1)
        np.testing.assert_array_equal(x, y)
    assert stored[1] * 4 <= stored[0], stored
