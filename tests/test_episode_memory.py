"""Memory-saving storage keeps RLlib's observable semantics.

Infos given as nothing (or as a falsy value) are not stored as one empty dict per step:
the dict is made when first read and stored then. These tests pin that the dicts a
caller reads behave as RLlib's stored ones (same object on every read, mutations stick,
shared between an episode and its cut/slice/concat partners as RLlib shares them), and
that ``to_numpy`` (which gives back the buffers' spare capacity) leaves every read and
later appends intact.
"""

from __future__ import annotations

import copy
import pickle
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ray.rllib.env.single_agent_episode import SingleAgentEpisode as RLlibEpisode

from fastrollout import SingleAgentEpisode

OBS_SPACE = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
ACT_SPACE = gym.spaces.Discrete(3)


def _episode(cls: Any, steps: int, infos: dict[int, dict[str, Any]] | None = None) -> Any:
    """An episode of `steps` steps; `infos` maps a time step (0 = reset) to its infos."""
    infos = infos or {}
    ep = cls(observation_space=OBS_SPACE, action_space=ACT_SPACE)
    ep.add_env_reset(observation=np.zeros(2, np.float32), infos=infos.get(0))
    for t in range(1, steps + 1):
        ep.add_env_step(
            np.full(2, t / 100, np.float32),
            t % 3,
            float(t),
            infos=infos.get(t),
            extra_model_outputs={"action_logp": np.float32(-t)},
        )
    return ep


@pytest.mark.parametrize("cls", [SingleAgentEpisode, RLlibEpisode])
def test_absent_infos_read_as_the_same_dict_every_time(cls: Any) -> None:
    ep = _episode(cls, 3)
    first = ep.get_infos(-1)
    assert first == {}
    assert ep.get_infos(-1) is first
    assert ep.get_infos(3) is first
    assert ep.get_infos()[-1] is first
    assert ep.get_infos([0, 3])[1] is first
    everything = ep.get_infos(slice(None))
    assert all(a is b for a, b in zip(everything, ep.get_infos(), strict=True))


@pytest.mark.parametrize("cls", [SingleAgentEpisode, RLlibEpisode])
def test_mutating_a_read_info_dict_persists(cls: Any) -> None:
    ep = _episode(cls, 4)
    ep.get_infos(1)["seen"] = True
    ep.get_infos()[2]["k"] = 7
    assert ep.get_infos() == [{}, {"seen": True}, {"k": 7}, {}, {}]
    ep.to_numpy()
    assert ep.get_infos(1) == {"seen": True}
    assert ep.get_state()["infos"]["data"][2] == {"k": 7}


@pytest.mark.parametrize("cls", [SingleAgentEpisode, RLlibEpisode])
def test_given_infos_are_stored_by_identity_and_empty_ones_replaced(cls: Any) -> None:
    given_info = {"x": 1}
    empty: dict[str, Any] = {}
    ep = _episode(cls, 2, {1: given_info, 2: empty})
    assert ep.get_infos(1) is given_info
    # RLlib records `infos or {}`: an empty dict given is replaced by a fresh one.
    assert ep.get_infos(2) == {} and ep.get_infos(2) is not empty


@pytest.mark.parametrize("cls", [SingleAgentEpisode, RLlibEpisode])
def test_fill_reads_and_lookback_reads_of_absent_infos(cls: Any) -> None:
    ep = _episode(cls, 3).cut(len_lookback_buffer=2)
    ep.add_env_step(np.zeros(2, np.float32), 0, 0.0)
    got = ep.get_infos(slice(-4, None), neg_index_as_lookback=True, fill={"f": 0})
    assert got == [{"f": 0}, {"f": 0}, {}, {}, {}, {}]
    lookback = ep.get_infos(-1, neg_index_as_lookback=True)
    assert got[3] is lookback
    with pytest.raises(IndexError):
        ep.get_infos(5)


@pytest.mark.parametrize("cls", [SingleAgentEpisode, RLlibEpisode])
def test_cut_shares_info_dicts_with_its_successor(cls: Any) -> None:
    ep = _episode(cls, 3)
    succ = ep.cut(len_lookback_buffer=1)
    # The successor's first info is the original's last one: one dict, two episodes.
    assert succ.get_infos(0) is ep.get_infos(-1)
    assert succ.get_infos(-1, neg_index_as_lookback=True) is ep.get_infos(-2)
    ep.get_infos(-1)["after_cut"] = 1
    assert succ.get_infos(0) == {"after_cut": 1}
    # Infos before the successor's look-back are not shared (nor made by the cut).
    assert ep.get_infos(0) == {}


@pytest.mark.parametrize("cls", [SingleAgentEpisode, RLlibEpisode])
def test_slice_shares_info_dicts(cls: Any) -> None:
    ep = _episode(cls, 6)
    sl = ep.slice(slice(2, 4), len_lookback_buffer=1)
    assert [d is e for d, e in zip(sl.get_infos(), ep.get_infos(slice(2, 5)), strict=True)] == [
        True
    ] * 3
    assert sl.get_infos(-1, neg_index_as_lookback=True) is ep.get_infos(1)


@pytest.mark.parametrize("cls", [SingleAgentEpisode, RLlibEpisode])
def test_concat_continues_with_the_other_chunks_info_dicts(cls: Any) -> None:
    ep = _episode(cls, 2, {0: {"reset": 1}})
    succ = ep.cut()
    for t in range(3):
        succ.add_env_step(
            np.zeros(2, np.float32),
            0,
            0.0,
            infos={"t": t} if t == 1 else None,
            extra_model_outputs={"action_logp": np.float32(0)},
        )
    ep.concat_episode(succ)
    assert ep.get_infos() == [{"reset": 1}, {}, {}, {}, {"t": 1}, {}]
    assert all(a is b for a, b in zip(ep.get_infos(slice(2, None)), succ.get_infos(), strict=True))


def test_state_pickle_and_copies_keep_infos() -> None:
    ep = _episode(SingleAgentEpisode, 5, {2: {"a": 1}})
    ep.get_infos(4)["late"] = 2
    expected = [{}, {}, {"a": 1}, {}, {"late": 2}, {}]
    # Independent copies: their info dicts are their own.
    for clone in (pickle.loads(pickle.dumps(ep)), copy.deepcopy(ep)):
        assert clone.get_infos() == expected
        clone.get_infos(0)["only_clone"] = 1
    assert ep.get_infos() == expected
    # A state holds the episode's dicts themselves (as RLlib's does), and so does an
    # episode built from it, or a shallow copy.
    state = ep.get_state()
    assert state["infos"]["data"][0] is ep.get_infos(0)
    for shallow in (SingleAgentEpisode.from_state(state), copy.copy(ep)):
        assert shallow.get_infos() == expected
        assert shallow.get_infos(1) is ep.get_infos(1)


def test_to_numpy_then_add_and_cut() -> None:
    ep = _episode(SingleAgentEpisode, 40).to_numpy()
    obs = ep.get_observations()
    assert obs.shape == (41, 2) and obs.dtype == np.float32
    ep.add_env_step(np.full(2, 0.5, np.float32), 1, 2.0, extra_model_outputs={"action_logp": -1})
    assert len(ep) == 41
    np.testing.assert_array_equal(ep.get_observations(-1), np.full(2, 0.5, np.float32))
    np.testing.assert_array_equal(ep.get_observations(slice(0, 41)), obs)
    assert ep.get_rewards()[-1] == 2.0 and ep.get_rewards()[:40].tolist() == list(
        map(float, range(1, 41))
    )
    assert ep.get_extra_model_outputs("action_logp")[-1] == -1
    succ = ep.cut(len_lookback_buffer=3)
    tail = succ.get_observations(slice(-4, None), neg_index_as_lookback=True)
    np.testing.assert_array_equal(tail, ep.get_observations()[-4:])
    assert ep.get_infos() == [{}] * 42


def test_episodes_share_specs_but_not_data() -> None:
    a = _episode(SingleAgentEpisode, 2)
    b = _episode(SingleAgentEpisode, 3)
    a.set_observations(new_data=np.ones(2, np.float32), at_indices=0)
    np.testing.assert_array_equal(b.get_observations(0), np.zeros(2, np.float32))
    # Specs are shared by layout only: a different space gives its own dtype and bounds.
    c = SingleAgentEpisode(observation_space=gym.spaces.Box(0, 9, (2,), np.int16))
    c.add_env_reset(observation=np.array([1, 2], np.int16))
    assert c.to_numpy().get_observations().dtype == np.int16


@settings(max_examples=60, deadline=None)
@given(
    steps=st.integers(0, 12),
    given_at=st.sets(st.integers(0, 12)),
    read_at=st.lists(st.integers(-13, 12), max_size=6),
    lookback=st.integers(0, 4),
    numpy=st.booleans(),
)
def test_infos_match_rllib(
    steps: int, given_at: set[int], read_at: list[int], lookback: int, numpy: bool
) -> None:
    """Infos read, mutated and cut the same on both sides, with identity preserved."""
    infos = {t: {"t": t} for t in given_at if t <= steps}
    sides = [_episode(cls, steps, infos) for cls in (SingleAgentEpisode, RLlibEpisode)]
    for ep in sides:
        if numpy:
            ep.to_numpy()
        for i in read_at:
            if -steps - 1 <= i <= steps:
                ep.get_infos(i).setdefault("reads", 0)
                ep.get_infos(i)["reads"] += 1
    ours, ref = sides
    assert ours.get_infos() == ref.get_infos()
    if steps and not numpy:
        succ = [ep.cut(len_lookback_buffer=lookback) for ep in sides]
        got = [s.get_infos(slice(-lookback - 1, None), neg_index_as_lookback=True) for s in succ]
        assert got[0] == got[1]
        for ep, s in zip(sides, succ, strict=True):
            assert s.get_infos(0) is ep.get_infos(-1)


def test_custom_data_is_made_on_first_use_and_kept() -> None:
    ep = _episode(SingleAgentEpisode, 2)
    fresh = ep.cut()
    assert fresh.custom_data == {}
    data = ep.custom_data
    assert ep.custom_data is data
    data["k"] = 1
    assert ep.custom_data == {"k": 1}
    assert ep.get_state()["custom_data"] is data
    # A cut of an episode without custom data gets its own (empty) dict.
    succ = ep.cut()
    assert succ.custom_data == {"k": 1} and succ.custom_data is not data
    untouched = _episode(SingleAgentEpisode, 1)
    later = untouched.cut()
    later.add_env_step(
        np.zeros(2, np.float32), 0, 0.0, extra_model_outputs={"action_logp": np.float32(0)}
    )
    untouched.concat_episode(later)
    assert untouched.custom_data == {}
    state = SingleAgentEpisode.from_state(untouched.get_state())
    assert state.custom_data == {}


def test_many_layouts_and_keys_past_the_shared_tables() -> None:
    """Specs, spec sets and keys are shared through bounded tables; past their size the
    oldest entries go, and episodes that still use them keep working."""
    episodes = []
    for n in range(1, 80):
        ep = SingleAgentEpisode(
            observation_space=gym.spaces.Box(0, 1, (n,), np.float32),
            action_space=gym.spaces.Discrete(n + 1),
        )
        ep.add_env_reset(observation=np.full(n, 0.5, np.float32))
        ep.add_env_step(
            np.ones(n, np.float32),
            n,
            float(n),
            extra_model_outputs={f"key_{n}_{i}": np.int16(i) for i in range(4)},
        )
        episodes.append(ep.to_numpy())
    for n, ep in enumerate(episodes, start=1):
        assert ep.get_observations().shape == (2, n)
        assert ep.get_actions().tolist() == [n]
        assert ep.get_actions(0, one_hot_discrete=True).shape == (n + 1,)
        assert sorted(ep.extra_model_outputs) == [f"key_{n}_{i}" for i in range(4)]
        assert ep.get_extra_model_outputs(f"key_{n}_3").dtype == np.int16
        succ = ep.cut(len_lookback_buffer=1)
        assert succ.get_extra_model_outputs(f"key_{n}_2", -1, neg_index_as_lookback=True) == 2


@pytest.mark.parametrize("cls", [SingleAgentEpisode, RLlibEpisode])
def test_constructor_without_infos_gives_one_dict_per_observation(cls: Any) -> None:
    obs = [np.zeros(2, np.float32), np.ones(2, np.float32), np.ones(2, np.float32)]
    ep = cls(observations=obs, actions=[0, 1], rewards=[1.0, 2.0], len_lookback_buffer=1)
    assert ep.get_infos() == [{}, {}]
    assert ep.get_infos(-1, neg_index_as_lookback=True) == {}
    ep.get_infos(0)["x"] = 1
    assert ep.get_infos() == [{"x": 1}, {}]
    assert ep.get_infos(0) is ep.get_infos()[0]
    given = cls(observations=obs[:1], infos=[None])
    assert given.get_infos() == [None]


def test_native_heap_bytes_count_the_episodes_columns() -> None:
    """The native allocator's count grows by at least the bytes an episode stores and
    falls back when the episode is freed (``benches/memory.py`` adds it to the C heap's
    and Python's counts, which do not see these blocks)."""
    import gc

    from fastrollout._core import native_heap_bytes

    space = gym.spaces.Box(0, 255, (84, 84, 4), np.uint8)
    frame = np.ones((84, 84, 4), np.uint8)
    gc.collect()
    before = native_heap_bytes()
    ep = SingleAgentEpisode(observation_space=space, action_space=ACT_SPACE)
    ep.add_env_reset(observation=frame)
    for t in range(20):
        ep.add_env_step(frame, t % 3, 1.0)
    ep.to_numpy()
    held = native_heap_bytes() - before
    assert 21 * frame.nbytes <= held < 21 * frame.nbytes * 1.25  # (size-class rounding)
    del ep
    gc.collect()
    assert native_heap_bytes() - before < frame.nbytes


@settings(max_examples=40, deadline=None)
@given(item_bytes=st.integers(1000, 40_000), steps=st.integers(0, 12))
def test_columns_keep_their_data_across_the_allocators_size_split(
    item_bytes: int, steps: int
) -> None:
    """Buffers that grow past 64 KiB move from the system allocator to mimalloc, and
    shrinking (``to_numpy``) may move them back (``rust/alloc.rs``): the data reads back
    the same, and every native byte is given back with the episode."""
    from fastrollout._core import native_heap_bytes

    space = gym.spaces.Box(0, 255, (item_bytes,), np.uint8)
    frames = [np.full(item_bytes, t % 251, np.uint8) for t in range(steps + 1)]
    before = native_heap_bytes()
    ep = SingleAgentEpisode(observation_space=space, action_space=ACT_SPACE)
    ep.add_env_reset(observation=frames[0])
    for t in range(1, steps + 1):
        ep.add_env_step(frames[t], t % 3, 1.0)
    ep.to_numpy()
    np.testing.assert_array_equal(ep.get_observations(), np.stack(frames))
    if steps:
        ep.add_env_step(frames[0], 0, 1.0)  # appending after the shrink grows again
        np.testing.assert_array_equal(ep.get_observations(-1), frames[0])
    del ep  # (no cycles: freed now)
    assert native_heap_bytes() == before


_REFILL_SCRIPT = """
import resource
import gymnasium as gym
import numpy as np
from fastrollout import SingleAgentEpisode

space = gym.spaces.Box(0, 255, (256 * 1024,), np.uint8)
frame = np.ones(256 * 1024, np.uint8)

def fill():
    ep = SingleAgentEpisode(observation_space=space, action_space=gym.spaces.Discrete(3))
    ep.add_env_reset(observation=frame)
    for _ in range(32):
        ep.add_env_step(frame, 0, 1.0)
    return ep

fill()  # its columns' pages are freed (and purged at once: MIMALLOC_PURGE_DELAY=0)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
ep = fill()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _refill_page_faults(**env: str) -> int:
    import os
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", _REFILL_SCRIPT],
        env={**os.environ, "MIMALLOC_PURGE_DELAY": "0", **env},
        capture_output=True,
        text=True,
        check=True,
    )
    return int(out.stdout.strip().splitlines()[-1])


def test_freed_column_pages_are_reused_without_page_faults() -> None:
    """The columns of dropped episodes are handed back to the kernel lazily
    (``MADV_FREE``, ``rust/alloc.rs``): the next episodes' columns reuse those pages without
    a fault each. With mimalloc's default (``MADV_DONTNEED``, chosen here through its
    environment variable, which the extension leaves alone) every page faults again."""
    pages = 33 * 256 * 1024 // 4096
    assert _refill_page_faults() < pages // 20
    assert _refill_page_faults(MIMALLOC_PURGE_DECOMMITS="1") > pages // 2
