"""Where fastrollout's MultiAgentEpisode deliberately differs from RLlib 2.60's.

Each issue has two tests: ``test_rllib_*`` shows what RLlib 2.60 does (so a fixed RLlib
makes it say so), and a ``fastrollout_only`` test pins what fastrollout does instead
(skipped with ``FR_DIFF_SUBJECT=rllib``, where it would fail by design). The differential
test excuses exactly these cases through its ``KNOWN_RLLIB_BUGS`` list.

- ray#61602: an agent that finishes exactly at a rollout boundary is dropped by ``cut``.
- An agent that finished before the cut comes back in the successor (restarted at agent
  step 0, misplaced in the env-step map) when the look-back reaches two of its
  observations.
- ray#44677: a cut while an agent holds a hanging action loses that agent's step.
- ray#45542: the env-step -> agent-step map is wrong after ``concat_episode``; it also
  keeps the rewards of an agent that the second chunk dropped, and loses the truncation
  of a chunk that ended terminated and truncated.
- RLlib's env-step reads of actions/rewards/extras lose items in chunks that start after
  agent step 0 (cut successors, slices).
- RLlib's crashes inside ``get_extra_model_outputs``.

ray#45543 (per-agent returns counted as the sum over all agents) was a metrics bug in
RLlib's MultiAgentEnvRunner; the episode's per-agent returns are the agent's own in RLlib
2.60 already, see ``test_multi_agent_episode.test_per_agent_returns_are_the_agents_own``.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest

from _helpers import MAEpisode, RLlibMAEpisode, assert_same, fastrollout_only, outcome
from _ma_scripts import assert_same_ma

# --------------------------------------------------------------------------------------
# ray#61602: an agent finishing exactly at the cut.
# --------------------------------------------------------------------------------------


def finishing_episode(cls: Any) -> Any:
    """a0 and a1 act together; a1 is terminated with its observation at env step 2."""
    ep = cls(id_="finish")
    ep.add_env_reset(observations={"a0": 0, "a1": 10})
    ep.add_env_step({"a0": 1, "a1": 11}, {"a0": 100, "a1": 110}, {"a0": 1.0, "a1": 2.0})
    ep.add_env_step(
        {"a0": 2, "a1": 12},
        {"a0": 101, "a1": 111},
        {"a0": 1.0, "a1": 2.0},
        terminateds={"a1": True},
    )
    return ep


def test_rllib_cut_drops_an_agent_that_finishes_at_the_boundary() -> None:
    ep = finishing_episode(RLlibMAEpisode)
    assert ep.get_agents_that_stepped() == {"a0", "a1"}
    successor = ep.cut()
    assert successor.agent_ids == {"a0"}
    assert successor.get_agents_that_stepped() == {"a0"}
    assert successor.get_terminateds() == {"a0": False, "__all__": False}
    # With a look-back, RLlib keeps it, but restarts its agent steps at 0 (its t is 2).
    successor = ep.cut(1)
    assert successor.agent_episodes["a1"].t_started == 0


@fastrollout_only
@pytest.mark.parametrize("k", [0, 1, 2])
def test_cut_keeps_an_agent_that_finishes_at_the_boundary(k: int) -> None:
    ep = finishing_episode(MAEpisode)
    successor = ep.cut(len_lookback_buffer=k)
    assert successor.agent_ids == {"a0", "a1"}
    a1 = successor.agent_episodes["a1"]
    assert (a1.is_terminated, a1.is_truncated, len(a1), a1.t_started, a1.t) == (
        True,
        False,
        0,
        2,
        2,
    )
    assert a1.get_observations() == [12]
    assert successor.agent_t_started["a1"] == 2
    assert successor.get_agents_that_stepped() == {"a0", "a1"}
    assert successor.get_agents_to_act() == {"a0"}
    assert successor.get_terminateds() == {"a0": False, "a1": True, "__all__": False}
    assert successor.agent_steps() == 0 and successor.get_return() == 0
    # The successor goes on without it; put back together, nothing is lost or doubled.
    successor.add_env_step({"a0": 3}, {"a0": 102}, {"a0": 1.0})
    assert successor.get_agents_that_stepped() == {"a0"}
    whole = copy.deepcopy(ep)
    whole.concat_episode(successor)
    assert whole.agent_episodes["a1"].get_observations() == [10, 11, 12]
    assert whole.agent_episodes["a1"].get_actions() == [110, 111]
    assert whole.agent_episodes["a0"].get_observations() == [0, 1, 2, 3]
    assert whole.get_return() == 7.0


# --------------------------------------------------------------------------------------
# An agent that finished before the cut, within reach of the successor's look-back.
# --------------------------------------------------------------------------------------


def finished_before_episode(cls: Any) -> Any:
    """b is terminated at env step 1; at env step 2 only a observes, c's action hangs
    (so a cut reaches back to c's observation at env step 0, and b's two with it; RLlib's
    cut(0) does not, see ray#44677).

    env t:  0    1    2
    a obs:  0    1    2
    b obs:  10   11 (terminated)
    c obs:  20        (action 0 hangs)
    """
    ep = cls(id_="finished-before")
    ep.add_env_reset(observations={"a": 0, "b": 10, "c": 20})
    ep.add_env_step(
        {"a": 1, "b": 11},
        {"a": 0, "b": 0, "c": 0},
        {"a": 1.0, "b": 1.0},
        terminateds={"b": True},
    )
    ep.add_env_step({"a": 2}, {"a": 1}, {"a": 1.0})
    return ep


@pytest.mark.parametrize("k", [1, 2])
def test_rllib_cut_brings_back_an_agent_that_finished_before(k: int) -> None:
    ep = finished_before_episode(RLlibMAEpisode)
    assert ep.get_agents_that_stepped() == {"a"}
    successor = ep.cut(k)
    # b is back: a done agent episode restarted at agent step 0 (it had two steps) ...
    b = successor.agent_episodes["b"]
    assert (b.t_started, b.t, b.is_terminated) == (0, 0, True)
    # ... whose env-step map is one entry short, so its last observation (env step 1)
    # reads as one of env step 2.
    assert (
        len(successor.env_t_to_agent_t["b"].data) == len(successor.env_t_to_agent_t["a"].data) - 1
    )
    assert successor.get_agents_that_stepped() == {"a", "b"}
    assert successor.get_observations(-1) == {"a": 2, "b": 11}
    # Without a look-back that reaches it, RLlib leaves it out.
    assert "b" not in finishing_lookback_free_cut(RLlibMAEpisode).agent_ids


def finishing_lookback_free_cut(cls: Any) -> Any:
    """The same episode without c's hanging action: cut(0) keeps only env step 2."""
    ep = cls(id_="finished-before")
    ep.add_env_reset(observations={"a": 0, "b": 10})
    ep.add_env_step(
        {"a": 1, "b": 11}, {"a": 0, "b": 0}, {"a": 1.0, "b": 1.0}, terminateds={"b": True}
    )
    ep.add_env_step({"a": 2}, {"a": 1}, {"a": 1.0})
    return ep.cut()


@fastrollout_only
@pytest.mark.parametrize("k", [0, 1, 2, 3])
def test_cut_leaves_out_an_agent_that_finished_before(k: int) -> None:
    ep = finished_before_episode(MAEpisode)
    successor = ep.cut(k)
    assert successor.agent_ids == {"a", "c"}
    assert "b" not in successor.env_t_to_agent_t and "b" not in successor.agent_t_started
    assert successor.get_agents_that_stepped() == {"a"}
    assert successor.get_agents_to_act() == {"a"}
    assert successor.get_observations(-1) == {"a": 2}
    assert successor.get_terminateds() == {"a": False, "c": False, "__all__": False}
    # c keeps its observation and hanging action; the step completes in the successor.
    c = successor.agent_episodes["c"]
    assert (c.t_started, c.t, c.get_observations()) == (0, 0, [20])
    successor.add_env_step({"a": 3, "c": 21}, {"a": 2}, {"a": 1.0, "c": 5.0})
    assert c.get_actions() == [0] and c.get_rewards() == [5.0]
    # Put back together, the chunks are the uncut episode.
    uncut = copy.deepcopy(ep)
    uncut.add_env_step({"a": 3, "c": 21}, {"a": 2}, {"a": 1.0, "c": 5.0})
    whole = copy.deepcopy(ep)
    whole.concat_episode(successor)
    assert_same_ma(uncut, whole)


# --------------------------------------------------------------------------------------
# ray#44677: a cut while an agent holds a hanging action.
# --------------------------------------------------------------------------------------


def turn_episode(cls: Any) -> Any:
    """a0 and a1 take turns; at the end a0 has acted (101) and waits for its observation.

    env t:  0    1    2    3
    a0 obs: 0         1
    a1 obs:      10        11
    a0 acts 100 at t=1 and 101 at t=3 (hanging, reward 4.0 so far).
    """
    ep = cls(id_="turns")
    ep.add_env_reset(observations={"a0": 0})
    ep.add_env_step({"a1": 10}, {"a0": 100}, {"a0": 1.0, "a1": 0.5})
    ep.add_env_step({"a0": 1}, {"a1": 110}, {"a0": 2.0, "a1": 3.0})
    ep.add_env_step({"a1": 11}, {"a0": 101}, {"a0": 4.0, "a1": 5.0})
    return ep


NEXT = ({"a0": 2}, {"a1": 111}, {"a0": 6.0, "a1": 7.0})


def test_rllib_cut_loses_the_step_of_a_hanging_action() -> None:
    ep = turn_episode(RLlibMAEpisode)
    successor = ep.cut()
    # a0 is gone from the successor, and with it its hanging action 101.
    assert successor.agent_ids == {"a1"}
    successor.add_env_step(*NEXT)
    # a0's next observation starts a new agent episode: the step 1 -101-> 2 is lost.
    a0 = successor.agent_episodes["a0"]
    assert a0.get_observations() == [2] and a0.get_actions() == [] and a0.t_started == 0
    with pytest.raises(AssertionError):
        copy.deepcopy(ep).concat_episode(successor)


def test_rllib_successor_loses_a_termination_without_observation() -> None:
    # (cut(1): RLlib's look-back extension works there.) a0 is terminated while its
    # action hangs: the uncut episode repeats a0's last observation to close the step,
    # the successor has no "last added observation" and drops the step and the flag.
    step = ({"a1": 12}, {"a1": 111}, {"a1": 1.0, "a0": 6.0})
    uncut = turn_episode(RLlibMAEpisode)
    successor = uncut.cut(1)
    uncut.add_env_step(*step, terminateds={"a0": True})
    successor.add_env_step(*step, terminateds={"a0": True})
    assert uncut.agent_episodes["a0"].is_terminated
    assert uncut.agent_episodes["a0"].get_actions() == [100, 101]
    a0 = successor.agent_episodes["a0"]
    assert not a0.is_terminated and len(a0) == 0 and a0.get_actions() == []


@fastrollout_only
def test_cut_keeps_the_step_of_a_hanging_action() -> None:
    ep = turn_episode(MAEpisode)
    successor = ep.cut()
    assert successor.agent_ids == {"a0", "a1"}
    assert successor.get_agents_to_act() == {"a1"}
    a0 = successor.agent_episodes["a0"]
    assert (len(a0), a0.t_started, a0.get_observations()) == (0, 1, [1])
    successor.add_env_step(*NEXT)
    # The step 1 -101-> 2 completes in the successor, with the reward from before the cut.
    assert a0.get_observations() == [1, 2]
    assert a0.get_actions() == [101]
    assert a0.get_rewards() == [10.0]
    whole = copy.deepcopy(ep)
    whole.concat_episode(successor)
    assert whole.agent_episodes["a0"].get_actions() == [100, 101]
    assert whole.agent_episodes["a0"].get_rewards() == [3.0, 10.0]
    assert whole.get_actions(return_list=True) == [
        {"a0": 100},
        {"a1": 110},
        {"a0": 101},
        {"a1": 111},  # a1's hanging action
    ]


@fastrollout_only
def test_successor_records_a_termination_without_observation() -> None:
    successor = turn_episode(MAEpisode).cut()
    successor.add_env_step(
        {"a1": 12}, {"a1": 111}, {"a1": 1.0, "a0": 6.0}, terminateds={"a0": True}
    )
    a0 = successor.agent_episodes["a0"]
    assert a0.is_terminated and len(a0) == 1
    assert a0.get_observations() == [1, 1]  # the last observation, repeated
    assert a0.get_actions() == [101] and a0.get_rewards() == [10.0]
    assert successor.get_terminateds()["a0"] is True


# --------------------------------------------------------------------------------------
# ray#45542: the env-step map after concat_episode.
# --------------------------------------------------------------------------------------


def early_finish_episode(cls: Any) -> Any:
    """a1 is terminated at env step 1; a0 goes on alone."""
    ep = cls(id_="concat")
    ep.add_env_reset(observations={"a0": 0, "a1": 10})
    ep.add_env_step(
        {"a0": 1, "a1": 11},
        {"a0": 100, "a1": 110},
        {"a0": 1.0, "a1": 2.0},
        terminateds={"a1": True},
    )
    ep.add_env_step({"a0": 2}, {"a0": 101}, {"a0": 1.0})
    return ep


LAST = ({"a0": 3}, {"a0": 102}, {"a0": 1.0})
UNCUT_OBSERVATIONS = [{"a0": 0, "a1": 10}, {"a0": 1, "a1": 11}, {"a0": 2}, {"a0": 3}]
UNCUT_ACTIONS = [{"a0": 100, "a1": 110}, {"a0": 101}, {"a0": 102}]


def test_rllib_concat_episode_breaks_the_env_step_map() -> None:
    uncut = early_finish_episode(RLlibMAEpisode)
    successor = uncut.cut()
    whole = copy.deepcopy(uncut)
    uncut.add_env_step(*LAST)
    successor.add_env_step(*LAST)
    whole.concat_episode(successor)
    assert uncut.get_observations(return_list=True) == UNCUT_OBSERVATIONS
    assert uncut.get_actions(return_list=True) == UNCUT_ACTIONS
    # a1 (done before the cut) is not extended over the successor's env steps.
    with pytest.raises(IndexError):
        whole.get_observations(return_list=True)
    with pytest.raises(IndexError):
        whole.get_actions(return_list=True)


@fastrollout_only
def test_concat_episode_keeps_the_env_step_map() -> None:
    uncut = early_finish_episode(MAEpisode)
    successor = uncut.cut()
    whole = copy.deepcopy(uncut)
    uncut.add_env_step(*LAST)
    successor.add_env_step(*LAST)
    whole.concat_episode(successor)
    assert whole.get_observations(return_list=True) == UNCUT_OBSERVATIONS
    assert whole.get_actions(return_list=True) == UNCUT_ACTIONS
    for kwargs in ({}, {"fill": -1}, {"neg_index_as_lookback": True}):
        for indices in (None, 1, -1, [0, 3], slice(1, 4), slice(-6, None)):
            for getter in ("get_observations", "get_actions", "get_rewards", "get_infos"):
                assert_same(
                    outcome(lambda g=getter, i=indices, kw=kwargs: getattr(uncut, g)(i, **kw)),
                    outcome(lambda g=getter, i=indices, kw=kwargs: getattr(whole, g)(i, **kw)),
                    f"{getter}({indices!r}, {kwargs})",
                )
    assert whole.get_agents_that_stepped() == {"a0"}
    assert len(whole) == 3 and whole.env_t == 3


# --------------------------------------------------------------------------------------
# Dict-returning env-step reads of actions/rewards in chunks.
# --------------------------------------------------------------------------------------


def chunk_episode(cls: Any) -> Any:
    """Successor (look-back 2) of 3 simultaneous steps of a0, then one more step: a0's
    actions 101, 102 | 103 and rewards 1.0, 2.0 | 3.0 (look-back | chunk)."""
    ep = cls(id_="chunk")
    ep.add_env_reset(observations={"a0": 0})
    for t in (1, 2, 3):
        ep.add_env_step({"a0": t}, {"a0": 100 + t}, {"a0": float(t)})
    successor = ep.cut(2)
    successor.add_env_step({"a0": 4}, {"a0": 104}, {"a0": 4.0})
    return successor


def test_rllib_chunk_action_reads_drop_actions() -> None:
    chunk = chunk_episode(RLlibMAEpisode)
    # The chunk's one completed step, in agent steps and as a list of env steps ...
    assert chunk.get_actions(env_steps=False) == {"a0": [104]}
    assert chunk.get_actions(return_list=True) == [{"a0": 104}]
    # ... but the dict read in env steps compares a0's absolute step 3 with the buffer
    # position and drops it.
    assert chunk.get_actions() == {}
    assert chunk.get_rewards() == {}
    assert chunk.get_actions(slice(-2, 1), neg_index_as_lookback=True) == {"a0": [102, 103]}


@fastrollout_only
def test_chunk_action_reads_keep_every_action() -> None:
    chunk = chunk_episode(MAEpisode)
    assert chunk.get_actions() == {"a0": [104]}
    assert chunk.get_rewards() == {"a0": [4.0]}
    assert chunk.get_actions(-1) == {"a0": 104}
    assert chunk.get_actions(slice(-2, 1), neg_index_as_lookback=True) == {"a0": [102, 103, 104]}
    assert chunk.get_actions(slice(0, 2), fill=0) == {"a0": [104, 0]}


# --------------------------------------------------------------------------------------
# get_extra_model_outputs where RLlib crashes.
# --------------------------------------------------------------------------------------


def extras_episode(cls: Any) -> Any:
    """Both agents act every step with extras {"logp", "v"}; at env step 3 only a0 gets
    its observation (a1's action 113 hangs)."""
    ep = cls(id_="extras")
    ep.add_env_reset(observations={"a0": 0, "a1": 10})
    for t in (1, 2, 3):
        ep.add_env_step(
            {"a0": t, "a1": 10 + t} if t < 3 else {"a0": t},
            {"a0": 100 + t, "a1": 110 + t},
            {"a0": 1.0, "a1": 2.0},
            extra_model_outputs={
                "a0": {"logp": np.float32(t), "v": np.float32(-t)},
                "a1": {"logp": np.float32(10 + t), "v": np.float32(-10 - t)},
            },
        )
    return ep


def test_rllib_get_extra_model_outputs_crashes() -> None:
    ep = extras_episode(RLlibMAEpisode)
    f = np.float32
    # Env-step reads include the hanging action's extras (a1: 13), like action reads.
    assert ep.get_extra_model_outputs("logp") == {
        "a0": [f(1), f(2), f(3)],
        "a1": [f(11), f(12), f(13)],
    }
    assert ep.get_actions() == {"a0": [101, 102, 103], "a1": [111, 112, 113]}
    with pytest.raises(AttributeError):
        ep.get_extra_model_outputs()  # all keys, all steps
    with pytest.raises(TypeError):
        ep.get_extra_model_outputs("logp", env_steps=False)
    with pytest.raises(AttributeError):
        ep.get_extra_model_outputs("logp", slice(0, 4), fill=0.0)


@fastrollout_only
def test_extra_model_outputs_where_rllib_crashes() -> None:
    # The answers of the action reads with the same arguments, with extras for actions.
    ep = extras_episode(MAEpisode)
    f = np.float32
    # All keys: {agent: {key: batch}} (as a single env step gives {agent: {key: item}}).
    assert_same(
        {
            "a0": {"logp": [f(1), f(2), f(3)], "v": [f(-1), f(-2), f(-3)]},
            "a1": {"logp": [f(11), f(12), f(13)], "v": [f(-11), f(-12), f(-13)]},
        },
        ep.get_extra_model_outputs(),
    )
    assert_same(
        {"a0": {"logp": f(3), "v": f(-3)}, "a1": {"logp": f(13), "v": f(-13)}},
        ep.get_extra_model_outputs(indices=-1),
    )
    # Agent steps: only completed steps (a1's hanging 113 is not one), like get_actions.
    assert ep.get_actions(env_steps=False) == {"a0": [101, 102, 103], "a1": [111, 112]}
    assert_same(
        {"a0": [f(1), f(2), f(3)], "a1": [f(11), f(12)]},
        ep.get_extra_model_outputs("logp", env_steps=False),
    )
    assert ep.get_actions(slice(0, 4), fill=0.0) == {
        "a0": [101, 102, 103, 0.0],
        "a1": [111, 112, 113, 0.0],
    }
    assert_same(
        {"a0": [f(1), f(2), f(3), 0.0], "a1": [f(11), f(12), f(13), 0.0]},
        ep.get_extra_model_outputs("logp", slice(0, 4), fill=0.0),
    )


# --------------------------------------------------------------------------------------
# get_truncateds()["__all__"] and agent-step reads of hanging values.
# --------------------------------------------------------------------------------------


def truncated_episode(cls: Any) -> Any:
    ep = cls(id_="trunc")
    ep.add_env_reset(observations={"a0": 0})
    ep.add_env_step({"a0": 1}, {"a0": 100}, {"a0": 1.0}, truncateds={"__all__": True})
    return ep


def test_rllib_get_truncateds_reports_termination() -> None:
    ep = truncated_episode(RLlibMAEpisode)
    assert ep.is_truncated and not ep.is_terminated
    assert ep.get_truncateds()["__all__"] is False


@fastrollout_only
def test_get_truncateds_reports_truncation() -> None:
    ep = truncated_episode(MAEpisode)
    assert ep.get_truncateds() == {"a0": True, "__all__": True}


def hanging_episode(cls: Any) -> Any:
    """a0 observes and acts; at env step 2 only a1 observes, so a0's action 101 hangs."""
    ep = cls(id_="hang")
    ep.add_env_reset(observations={"a0": 0, "a1": 10})
    ep.add_env_step({"a0": 1}, {"a0": 100, "a1": 110}, {"a0": 1.0, "a1": 0.5})
    ep.add_env_step({"a1": 11}, {"a0": 101}, {"a0": 2.0, "a1": 1.0})
    return ep


def test_rllib_agent_step_reads_flatten_the_hanging_value() -> None:
    ep = hanging_episode(RLlibMAEpisode)
    out = ep.get_actions(slice(0, None), env_steps=False)
    assert isinstance(out["a0"], np.ndarray)  # np.append turned the list into an array


@fastrollout_only
def test_agent_step_reads_append_the_hanging_value_as_an_item() -> None:
    ep = hanging_episode(MAEpisode)
    assert ep.get_actions(slice(0, None), env_steps=False) == {"a0": [100, 101], "a1": [110]}
    assert ep.get_rewards(slice(-1, None), env_steps=False)["a0"] == [2.0]


# --------------------------------------------------------------------------------------
# An agent that joins in a cut successor.
# --------------------------------------------------------------------------------------


def late_joiner_successor(cls: Any, lookback: int) -> Any:
    """a0 steps 3 times; the successor (look-back `lookback`) sees a1 join at env step 4
    (observation 100) and observe again at env step 5 (101)."""
    ep = cls(id_="join")
    ep.add_env_reset(observations={"a0": 0})
    for t in (1, 2, 3):
        ep.add_env_step({"a0": t}, {"a0": 0}, {"a0": 1.0})
    successor = ep.cut(lookback)
    successor.add_env_step({"a0": 4, "a1": 100}, {"a0": 0}, {"a0": 1.0})
    successor.add_env_step({"a0": 5, "a1": 101}, {"a0": 0, "a1": 0}, {"a0": 1.0, "a1": 1.0})
    return successor


def test_rllib_late_joiner_in_a_successor_is_misplaced() -> None:
    successor = late_joiner_successor(RLlibMAEpisode, 0)
    # RLlib starts a1's map with env_t (4) skips, counted from the episode's start: a1 is
    # read one env step late (index 1 is env step 4, where it joined).
    assert successor.get_observations(1) == {"a0": 4}
    assert successor.get_observations(slice(0, 3), return_list=True, fill=-1) == [
        {"a0": 3, "a1": -1},
        {"a0": 4, "a1": -1},
        {"a0": 5, "a1": -1},
    ]
    # With a look-back of 4 (more than the chunk's start, 3) the map is too short: a1 is
    # read one env step early.
    successor = late_joiner_successor(RLlibMAEpisode, 4)
    assert successor.get_observations(1) == {"a0": 4, "a1": 101}


@fastrollout_only
@pytest.mark.parametrize("lookback", [0, 1, 3, 4])
def test_late_joiner_in_a_successor_is_read_at_its_env_steps(lookback: int) -> None:
    successor = late_joiner_successor(MAEpisode, lookback)
    assert successor.get_observations(1) == {"a0": 4, "a1": 100}
    assert successor.get_observations(-1) == {"a0": 5, "a1": 101}
    assert successor.get_observations(slice(0, 3), return_list=True, fill=-1) == [
        {"a0": 3, "a1": -1},
        {"a0": 4, "a1": 100},
        {"a0": 5, "a1": 101},
    ]
    assert successor.get_actions(-1) == {"a0": 0, "a1": 0}
    # Every agent's map covers the chunk's env steps and its look-back, nothing more.
    for mapping in successor.env_t_to_agent_t.values():
        assert len(mapping.data) == mapping.lookback + len(successor) + 1


def test_concat_episode_with_two_agents_new_in_the_second_chunk() -> None:
    """Both joiners' maps are built from the first chunk's length as it was before the
    concat (the maps are extended one by one while concatenating)."""
    ep = MAEpisode(id_="two-new")
    ep.add_env_reset(observations={"a0": 0})
    ep.add_env_step({"a0": 1}, {"a0": 0}, {"a0": 1.0})
    uncut = copy.deepcopy(ep)
    successor = ep.cut()
    for e in (uncut, successor):
        e.add_env_step({"a0": 2, "a1": 20, "a2": 30}, {"a0": 0}, {"a0": 1.0})
        e.add_env_step(
            {"a0": 3, "a1": 21, "a2": 31},
            {"a0": 0, "a1": 1, "a2": 2},
            {"a0": 1.0, "a1": 2.0, "a2": 3.0},
        )
    ep.concat_episode(successor)
    for mapping in ep.env_t_to_agent_t.values():
        assert len(mapping.data) == len(ep) + 1
    for indices in (None, 2, -1, slice(1, 4)):
        assert ep.get_observations(indices, fill=-1) == uncut.get_observations(indices, fill=-1)
        assert ep.get_actions(indices, fill=-1) == uncut.get_actions(indices, fill=-1)


def hanging_consumed_in_successor(cls: Any) -> tuple[Any, Any]:
    """b acts at env step 1 without observing (its action hangs); the successor sees b
    observe and terminate at env step 2, which consumes the hanging action."""
    ep = cls(id_="hang")
    ep.add_env_reset(observations={"a": 0, "b": 10})
    ep.add_env_step({"a": 1}, {"a": 0, "b": 1}, {"a": 1.0})
    successor = ep.cut()
    successor.add_env_step(
        {"a": 2, "b": 12}, {"a": 0}, {"a": 1.0, "b": 2.0}, terminateds={"b": True}
    )
    whole = copy.deepcopy(ep)
    whole.concat_episode(successor)
    return whole, successor


def test_rllib_concat_episode_keeps_a_consumed_hanging_action() -> None:
    whole, successor = hanging_consumed_in_successor(RLlibMAEpisode)
    assert "b" not in successor._hanging_actions_end
    assert "b" in whole._hanging_actions_end  # stale: b's action was used in the successor


@fastrollout_only
def test_concat_episode_drops_a_consumed_hanging_action() -> None:
    whole, successor = hanging_consumed_in_successor(MAEpisode)
    assert "b" not in whole._hanging_actions_end
    assert (
        whole.get_return(include_hanging_rewards=True)
        == successor.get_return(include_hanging_rewards=True) + 1.0
    )  # a's first reward, from the first chunk
    assert list(whole.agent_episodes["b"].get_actions()) == [1]


def concat_with_hanging_rewards(cls: Any) -> tuple[Any, Any]:
    """c gets rewards before its first observation in both chunks; b's action hangs over
    the cut with a reward; returns (concatenated, uncut)."""
    ep = cls(id_="rewards")
    ep.add_env_reset(observations={"a": 0, "b": 10})
    ep.add_env_step({"a": 1}, {"a": 0, "b": 1}, {"a": 1.0, "b": 0.5, "c": 0.25})
    uncut = copy.deepcopy(ep)
    successor = ep.cut()
    for e in (uncut, successor):
        e.add_env_step({"a": 2, "b": 12}, {"a": 0}, {"a": 1.0, "b": 2.0, "c": 0.125})
        e.add_env_step({"a": 3, "c": 30}, {"a": 0, "b": 1}, {"a": 1.0})
    whole = copy.deepcopy(ep)
    whole.concat_episode(successor)
    return whole, uncut


def test_rllib_successor_copies_hanging_rewards_into_its_begin_cache() -> None:
    """RLlib's cut starts the successor's begin cache with the rewards that hang at the cut
    (b's 0.5), so concatenating chunks cannot simply add the begin caches (RLlib's own
    concat_episode fails on this script: SingleAgentEpisode ids differ)."""
    ep = RLlibMAEpisode(id_="rewards")
    ep.add_env_reset(observations={"a": 0, "b": 10})
    ep.add_env_step({"a": 1}, {"a": 0, "b": 1}, {"a": 1.0, "b": 0.5, "c": 0.25})
    successor = ep.cut()
    assert successor._hanging_rewards_begin["b"] == 0.5


@fastrollout_only
def test_concat_episode_counts_hanging_rewards_once() -> None:
    whole, uncut = concat_with_hanging_rewards(MAEpisode)
    assert whole.get_return() == uncut.get_return()
    assert whole.get_return(include_hanging_rewards=True) == pytest.approx(
        uncut.get_return(include_hanging_rewards=True)
    )


def agent_arrives_done_after_the_cut(cls: Any) -> tuple[Any, Any]:
    """b gets a reward before its first observation, then (after a cut) its first
    observation arrives as the episode ends: it never joins and its reward is dropped.
    Returns (concatenated, uncut)."""
    ep = cls(id_="arrives-done")
    ep.add_env_reset(observations={"a": 0})
    ep.add_env_step({"a": 1}, {"a": 0}, {"a": 1.0, "b": 0.5})
    uncut = copy.deepcopy(ep)
    successor = ep.cut()
    for e in (uncut, successor):
        e.add_env_step({"a": 2, "b": 20}, {"a": 1}, {"a": 1.0}, terminateds={"__all__": True})
    whole = copy.deepcopy(ep)
    whole.concat_episode(successor)
    return whole, uncut


def test_rllib_concat_episode_keeps_the_reward_of_an_agent_dropped_later() -> None:
    whole, uncut = agent_arrives_done_after_the_cut(RLlibMAEpisode)
    assert uncut._hanging_rewards_begin == {}
    assert uncut.get_return(include_hanging_rewards=True) == 2.0
    assert whole.get_return(include_hanging_rewards=True) == 2.5  # b's 0.5 still there


@fastrollout_only
def test_concat_episode_drops_the_reward_of_an_agent_dropped_later() -> None:
    whole, uncut = agent_arrives_done_after_the_cut(MAEpisode)
    assert uncut._dropped_agents == {"b"}
    assert dict(whole._hanging_rewards_begin) == {}
    assert whole.get_return(include_hanging_rewards=True) == 2.0
    assert_same_ma(uncut, whole)


def both_flags_at_the_end(cls: Any) -> tuple[Any, Any]:
    """The episode ends with __all__ terminated and truncated and a's own flags both set,
    after a cut. Returns (concatenated, uncut)."""
    ep = cls(id_="both-flags")
    ep.add_env_reset(observations={"a": 0})
    ep.add_env_step({"a": 1}, {"a": 0}, {"a": 1.0})
    uncut = copy.deepcopy(ep)
    successor = ep.cut()
    done = {"a": True, "__all__": True}
    for e in (uncut, successor):
        e.add_env_step({"a": 2}, {"a": 1}, {"a": 1.0}, terminateds=done, truncateds=done)
    whole = copy.deepcopy(ep)
    whole.concat_episode(successor)
    return whole, uncut


def test_rllib_concat_episode_loses_the_truncation_of_a_terminated_chunk() -> None:
    whole, uncut = both_flags_at_the_end(RLlibMAEpisode)
    assert (uncut.is_terminated, uncut.is_truncated) == (True, True)
    assert (uncut.agent_episodes["a"].is_terminated, uncut.agent_episodes["a"].is_truncated) == (
        True,
        True,
    )
    assert (whole.is_terminated, whole.is_truncated) == (True, False)
    assert (whole.agent_episodes["a"].is_terminated, whole.agent_episodes["a"].is_truncated) == (
        True,
        False,
    )


@fastrollout_only
def test_concat_episode_keeps_both_done_flags_of_the_agents() -> None:
    whole, uncut = both_flags_at_the_end(MAEpisode)
    assert (whole.is_terminated, whole.is_truncated) == (True, True)
    assert (whole.agent_episodes["a"].is_terminated, whole.agent_episodes["a"].is_truncated) == (
        True,
        True,
    )
    assert_same_ma(uncut, whole)
