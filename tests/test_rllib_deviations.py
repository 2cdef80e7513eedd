"""Where fastrollout deliberately differs from RLlib 2.60, because RLlib is wrong there.

Each test shows what RLlib 2.60 does (so a fixed RLlib makes the test say so) and pins what
fastrollout does instead. The differential test excuses exactly these cases through its
``KNOWN_RLLIB_BUGS`` list, which names the test for each.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from ray.rllib.env.single_agent_episode import SingleAgentEpisode as RLlibEpisode

from fastrollout import SingleAgentEpisode
from fastrollout.errors import EpisodeStateError

BOTH = pytest.mark.parametrize("cls", [RLlibEpisode, SingleAgentEpisode], ids=["rllib", "ours"])


def _episode(cls, steps=3, *, obs=None, obs_space=None, act_space=None, extras=False):
    ep = cls(observation_space=obs_space, action_space=act_space)
    make = obs or (lambda t: np.full(2, t, np.float32))
    ep.add_env_reset(make(0), {"t": 0})
    for t in range(1, steps + 1):
        ep.add_env_step(
            make(t),
            t % 2,
            float(t),
            {"t": t},
            extra_model_outputs={"logp": np.float32(-t)} if extras else None,
        )
    return ep


def test_lookback_index_past_the_lookback_raises_after_to_numpy():
    # Index -4 with neg_index_as_lookback reaches before the 1-step look-back.
    rllib = _episode(RLlibEpisode).cut(1)
    ours = _episode(SingleAgentEpisode).cut(1)
    for ep in (rllib, ours):
        ep.add_env_step(np.zeros(2, np.float32), 0, 0.0)
        with pytest.raises(IndexError):
            ep.get_observations(-4, neg_index_as_lookback=True)
    rllib.to_numpy()
    ours.to_numpy()
    # RLlib wraps around to some item at the end of the numpy data...
    assert rllib.get_observations(-4, neg_index_as_lookback=True).shape == (2,)
    # ...fastrollout keeps the meaning of the index.
    with pytest.raises(IndexError, match="out of range"):
        ours.get_observations(-4, neg_index_as_lookback=True)


def test_reversed_slice_on_empty_buffer():
    rllib, ours = RLlibEpisode(), SingleAgentEpisode()
    with pytest.raises(AssertionError):
        rllib.get_rewards(slice(5, -1), fill=-1)
    # Six fill items (positions 5 down to the missing item before the data) and no data.
    assert ours.get_rewards(slice(5, -1), fill=-1) == [np.float32(-1)] * 6
    assert ours.get_rewards(slice(5, -1)) == []


def test_fill_without_space_broadcasts_to_item_shape():
    rllib = _episode(RLlibEpisode, extras=True).to_numpy()
    ours = _episode(SingleAgentEpisode, extras=True).to_numpy()
    with pytest.raises(ValueError):
        rllib.get_observations(slice(-5, None), fill=0.0)
    out = ours.get_observations(slice(-5, None), fill=0.0)
    assert out.shape == (5, 2) and out.dtype == np.float64
    np.testing.assert_array_equal(out[0], [0.0, 0.0])
    np.testing.assert_array_equal(out[-1], [3.0, 3.0])


def test_fill_without_space_keeps_nesting():
    def obs(t):
        return {"id": t, "pos": np.full(2, t, np.float32)}

    rllib = _episode(RLlibEpisode, obs=obs).to_numpy()
    ours = _episode(SingleAgentEpisode, obs=obs).to_numpy()
    mixed = rllib.get_observations([-9, 0], fill=-1)
    assert mixed.dtype == object  # [-1, {...}]: neither a batch nor a dict
    out = ours.get_observations([-9, 0], fill=-1)
    np.testing.assert_array_equal(out["id"], [-1, 0])
    np.testing.assert_array_equal(out["pos"], [[-1, -1], [0, 0]])


@BOTH
def test_one_hot_of_empty_batch(cls):
    # The successor of a numpy'd episode is numpy'd; its chunk is still empty.
    ep = _episode(cls, act_space=gym.spaces.Discrete(2)).to_numpy().cut(2)
    if cls is RLlibEpisode:
        with pytest.raises(ValueError, match="zero-size"):
            ep.get_actions(one_hot_discrete=True)
    else:
        out = ep.get_actions(one_hot_discrete=True)
        assert out.shape == (0, 2) and out.dtype == np.float32


def test_empty_slice_keeps_infos_lookback():
    rllib = _episode(RLlibEpisode, steps=5).slice(slice(2, 0), len_lookback_buffer=2)
    ours = _episode(SingleAgentEpisode, steps=5).slice(slice(2, 0), len_lookback_buffer=2)
    # The observation look-back survives in both, the infos look-back only in ours.
    np.testing.assert_array_equal(
        ours.get_observations(-1, neg_index_as_lookback=True),
        rllib.get_observations(-1, neg_index_as_lookback=True),
    )
    with pytest.raises(IndexError):
        rllib.get_infos(-1)
    assert ours.get_infos(-1) == {"t": 0}


def test_cut_and_slice_of_numpy_dict_observations():
    def obs(t):
        return {"id": t, "pos": np.full(2, t, np.float32)}

    rllib = _episode(RLlibEpisode, obs=obs).to_numpy()
    ours = _episode(SingleAgentEpisode, obs=obs).to_numpy()
    with pytest.raises(AssertionError):
        rllib.cut(3)  # look-back capped at 2 (the number of keys), then validate fails
    successor = ours.cut(3)
    assert len(successor) == 0 and successor.t_started == 3
    lookback = successor.get_observations(slice(-3, 0), neg_index_as_lookback=True)
    np.testing.assert_array_equal(lookback["id"], [0, 1, 2])
    np.testing.assert_array_equal(successor.get_observations(0)["pos"], [3, 3])


def test_state_round_trip_of_lookback_only_chunk():
    rllib = _episode(RLlibEpisode, extras=True).cut(2)
    ours = _episode(SingleAgentEpisode, extras=True).cut(2)
    with pytest.raises((AssertionError, TypeError, KeyError)):
        RLlibEpisode.from_state(rllib.get_state())
    restored = SingleAgentEpisode.from_state(ours.get_state())
    np.testing.assert_array_equal(
        restored.get_extra_model_outputs("logp", slice(-2, None), neg_index_as_lookback=True),
        [np.float32(-2), np.float32(-3)],
    )
    assert restored.t_started == 3 and len(restored) == 0


def test_unknown_extra_key_after_round_trip():
    rllib = RLlibEpisode.from_state(_episode(RLlibEpisode, extras=True).get_state())
    ours = SingleAgentEpisode.from_state(_episode(SingleAgentEpisode, extras=True).get_state())
    assert rllib.get_extra_model_outputs("no-such-key") == []
    with pytest.raises(KeyError):
        ours.get_extra_model_outputs("no-such-key")


@BOTH
def test_cut_and_slice_keep_agent_and_module_ids(cls):
    ep = cls(agent_id="a0", module_id="m0", multi_agent_episode_id="ma0")
    ep.add_env_reset(0)
    ep.add_env_step(1, 0, 1.0)
    ids = [(e.agent_id, e.module_id, e.multi_agent_episode_id) for e in (ep.cut(), ep[0:1])]
    expected = (None, None, None) if cls is RLlibEpisode else ("a0", "m0", "ma0")
    assert ids == [expected, expected]


@BOTH
def test_set_after_to_numpy_takes_a_list(cls):
    ep = _episode(cls).to_numpy()
    if cls is RLlibEpisode:
        with pytest.raises(ValueError):
            ep.set_rewards(new_data=[7.0, 8.0], at_indices=slice(0, 2))
    else:
        ep.set_rewards(new_data=[7.0, 8.0], at_indices=slice(0, 2))
        np.testing.assert_array_equal(ep.get_rewards(), [7.0, 8.0, 3.0])


@BOTH
def test_set_nested_observations_after_to_numpy(cls):
    space = gym.spaces.Dict({"id": gym.spaces.Discrete(5), "pos": gym.spaces.Box(-9, 9, (2,))})

    def obs(t):
        return {"id": t, "pos": np.full(2, t, np.float32)}

    ep = _episode(cls, obs=obs, obs_space=space).to_numpy()
    new = {"id": 4, "pos": np.array([8, 8], np.float32)}
    if cls is RLlibEpisode:
        with pytest.raises(AssertionError):
            ep.set_observations(new_data=new, at_indices=0)
    else:
        ep.set_observations(new_data=new, at_indices=0)
        assert ep.get_observations(0)["id"] == 4
        np.testing.assert_array_equal(ep.get_observations(0)["pos"], [8, 8])


# concat_episode.


def _chunks(cls, *, numpy_first=False, numpy_second=False, first_steps=0, extras_later=True):
    """A chunk with ``first_steps`` steps (no extra outputs), cut, and a successor with one
    step (``logp`` extra output with ``extras_later``) that ends terminated and truncated."""
    ep = cls(id_="chunks")
    ep.add_env_reset(0)
    for t in range(1, first_steps + 1):
        ep.add_env_step(t, 0, 1.0)
    successor = ep.cut()
    extras = {"logp": np.float32(-1)} if extras_later else None
    successor.add_env_step(9, 1, 2.0, terminated=True, truncated=True, extra_model_outputs=extras)
    if numpy_first:
        ep.to_numpy()
    if numpy_second:
        successor.to_numpy()
    return ep, successor


@BOTH
def test_concat_episode_keeps_both_done_flags(cls):
    ep, successor = _chunks(cls, first_steps=1, extras_later=False)
    ep.concat_episode(successor)
    # RLlib keeps the termination only; fastrollout the chunk's flags as they are.
    assert (ep.is_terminated, ep.is_truncated) == (True, cls is SingleAgentEpisode)


@BOTH
def test_concat_episode_takes_a_key_first_used_in_the_second_chunk(cls):
    # An agent that first acts after a cut: its first chunk has no step, so no key yet.
    ep, successor = _chunks(cls)
    if cls is RLlibEpisode:
        with pytest.raises(AssertionError):
            ep.concat_episode(successor)
        return
    ep.concat_episode(successor)
    assert ep.get_extra_model_outputs("logp") == [np.float32(-1)]
    # With steps before it and none of the key, the key's items would not line up.
    ep, successor = _chunks(cls, first_steps=1)
    with pytest.raises(EpisodeStateError, match='"logp" is not in this episode'):
        ep.concat_episode(successor)
    assert len(ep) == 1 and ep._extra_keys() == []


@BOTH
def test_concat_of_numpy_chunks_reads_as_the_numpy_episode(cls):
    # The first chunk has no step when it is numpy'd: RLlib switches only its
    # observations, and the concatenation's actions and rewards stay lists.
    ep, successor = _chunks(cls, numpy_first=True, numpy_second=True, extras_later=False)
    ep.concat_episode(successor)
    if cls is RLlibEpisode:
        assert not ep.is_numpy and ep.get_rewards() == [2.0]
    else:
        assert ep.is_numpy
        np.testing.assert_array_equal(ep.get_rewards(), np.array([2.0], np.float32))
        np.testing.assert_array_equal(ep.get_actions(), [1])
    # A second chunk that was not numpy'd keeps the first one's step fields as they were.
    ep, successor = _chunks(cls, numpy_first=True, extras_later=False)
    ep.concat_episode(successor)
    assert not ep.is_numpy


# Setters.


@BOTH
def test_set_after_to_numpy_keeps_a_wider_value(cls):
    # No space: the layout is inferred (ints). A float set after to_numpy is stored as
    # add_env_step stores one (the batch becomes float); RLlib writes it into its int
    # array and cuts it to 7353.
    ep = cls(observations=[100, 101], actions=[1], rewards=[0.1]).to_numpy()
    ep.set_observations(new_data=7353.5, at_indices=0)
    expected = [7353] if cls is RLlibEpisode else [7353.5]
    np.testing.assert_array_equal(ep.get_observations(), expected)
    assert ep.get_observations(-1, neg_index_as_lookback=True) == 100
    ep.add_env_step(0.5, 1, 1.0)
    assert ep.get_observations().dtype == np.float64
