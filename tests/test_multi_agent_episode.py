"""Unit tests for every public method and property of ``MultiAgentEpisode``.

Expectations are written out by hand from RLlib 2.60's semantics (the spec, quirks
included: each quirk is named where a test pins it); running the file with
``FR_DIFF_SUBJECT=rllib`` checks them against RLlib itself. Tests marked
``fastrollout_only`` pin fastrollout's own contract (input validation, error messages,
``finalize``), which RLlib does not have.
"""

from __future__ import annotations

import contextlib
import copy
import io
import pickle
import re
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from _helpers import (
    IS_FASTROLLOUT,
    MAEpisode,
    assert_same,
    assert_same_outcome,
    fastrollout_only,
    ma_env_errors,
)
from _ma_scripts import agent_data, assert_same_ma, ma_snapshot

F = np.float32

# --------------------------------------------------------------------------------------
# Builders.
# --------------------------------------------------------------------------------------


def turn_episode(**kwargs: Any) -> Any:
    """a0 and a1 take turns; a0's action 101 hangs at the end.

    env t:   0     1      2     3
    a0 obs:  0            1
    a1 obs:        10           11
    actions: a0:100 a1:110 a0:101 (hanging)
    rewards: a0 1.0, a1 0.5 (before its first observation) | a0 2.0, a1 3.0 | a0 4.0, a1 5.0
    a0's step 0 -100-> 1 earns 1.0 + 2.0; a1's step 10 -110-> 11 earns 3.0 + 5.0.
    """
    kw: dict[str, Any] = {"id_": "turns"}
    kw.update(kwargs)
    ep = MAEpisode(**kw)
    ep.add_env_reset(observations={"a0": 0}, infos={"a0": {"t": 0}})
    ep.add_env_step({"a1": 10}, {"a0": 100}, {"a0": 1.0, "a1": 0.5}, {"a1": {"t": 1}})
    ep.add_env_step({"a0": 1}, {"a1": 110}, {"a0": 2.0, "a1": 3.0}, {"a0": {"t": 2}})
    ep.add_env_step({"a1": 11}, {"a0": 101}, {"a0": 4.0, "a1": 5.0}, {"a1": {"t": 3}})
    return ep


OBS_SPACES = {"a0": gym.spaces.Discrete(5), "a1": gym.spaces.Box(-1.0, 1.0, (2,), np.float32)}
ACT_SPACES = {"a0": gym.spaces.Discrete(3), "a1": gym.spaces.Box(-1.0, 1.0, (2,), np.float32)}


def vec(x: float) -> np.ndarray:
    return np.array([x, -x], np.float32)


def sim_episode(n: int = 3, **kwargs: Any) -> Any:
    """a0 (Discrete obs/actions) and a1 (Box) act every step, with extras and infos.

    a0: obs t % 5, action t % 3, reward t, extras logp=-t; a1: obs vec(t/10), action
    vec(t/20), reward 10 t, extras logp=-10 t.
    """
    kw: dict[str, Any] = {
        "id_": "sim",
        "observation_space": OBS_SPACES,
        "action_space": ACT_SPACES,
    }
    kw.update(kwargs)
    ep = MAEpisode(**kw)
    ep.add_env_reset(observations={"a0": 0, "a1": vec(0.0)}, infos={"a0": {"t": 0}})
    for t in range(1, n + 1):
        sim_step(ep, t)
    return ep


def sim_step(ep: Any, t: int, **kwargs: Any) -> None:
    ep.add_env_step(
        {"a0": t % 5, "a1": vec(t / 10)},
        {"a0": t % 3, "a1": vec(t / 20)},
        {"a0": float(t), "a1": 10.0 * t},
        {"a0": {"t": t}, "a1": {"t": t}},
        extra_model_outputs={"a0": {"logp": F(-t)}, "a1": {"logp": F(-10 * t)}},
        **kwargs,
    )


def stdout_of(fn: Callable[[], Any]) -> str:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        fn()
    return buf.getvalue()


def assert_unchanged(ep: Any, fn: Callable[[], Any], exc: Any, **kw: Any) -> pytest.ExceptionInfo:
    """``fn`` raises ``exc`` and leaves everything observable about ``ep`` as it was."""
    before = ma_snapshot(ep, ("logp",))
    with pytest.raises(exc, **kw) as info:
        fn()
    after = ma_snapshot(ep, ("logp",))
    for key, value in before.items():
        assert_same_outcome(value, after[key], f"after the error: {key}")
    return info


# --------------------------------------------------------------------------------------
# Constructor.
# --------------------------------------------------------------------------------------


def test_default_constructor() -> None:
    ep = MAEpisode()
    assert isinstance(ep.id_, str) and re.fullmatch(r"[0-9a-f]{32}", ep.id_)
    assert MAEpisode().id_ != ep.id_
    assert (len(ep), ep.env_t, ep.env_t_started) == (0, 0, 0)
    assert ep.agent_ids == set() and ep.agent_episodes == {} and ep.agent_episode_ids == {}
    assert not ep.is_reset and not ep.is_done
    assert not ep.is_terminated and not ep.is_truncated
    assert ep.observation_space == {} and ep.action_space == {}
    assert ep.custom_data == {}
    assert ep.get_duration_s() == 0.0
    assert (ep.env_steps(), ep.agent_steps(), ep.get_return()) == (0, 0, 0)
    assert ep.get_observations() == {} and ep.get_agents_to_act() == set()
    assert ep.get_terminateds() == {"__all__": False}
    # RLlib 2.60's is_numpy looks at the first agent episode and raises StopIteration
    # when there is none; with no agent episodes nothing is numpy'd.
    if IS_FASTROLLOUT:
        assert ep.is_numpy is False
    else:
        with pytest.raises(StopIteration):
            _ = ep.is_numpy


def constructed(**kwargs: Any) -> Any:
    """Env steps 0..3 of a turn-based episode passed to the constructor as lists."""
    kw: dict[str, Any] = {
        "id_": "built",
        "observations": [{"a0": 0, "a1": 10}, {"a0": 1}, {"a1": 11}, {"a0": 2, "a1": 12}],
        "actions": [{"a0": 100, "a1": 110}, {"a0": 101}, {"a1": 111}],
        "rewards": [{"a0": 1.0, "a1": 2.0}, {"a0": 3.0, "a1": 4.0}, {"a0": 5.0, "a1": 6.0}],
        "infos": [{"a0": {"i": 0}}, {}, {"a1": {"i": 2}}, {}],
        "extra_model_outputs": [
            {"a0": {"logp": F(0)}, "a1": {"logp": F(10)}},
            {"a0": {"logp": F(1)}},
            {"a1": {"logp": F(11)}},
        ],
    }
    kw.update(kwargs)
    return MAEpisode(**kw)


def test_constructor_data_without_lookback() -> None:
    ep = constructed(len_lookback_buffer=0)
    assert (len(ep), ep.env_t_started, ep.env_t) == (3, 0, 3)
    data = agent_data(ep)
    # a0 acts at t=1 and observes again at t=3: that step sums the rewards 3.0 + 5.0.
    assert data["a0"]["observations"] == [0, 1, 2] and data["a0"]["actions"] == [100, 101]
    assert data["a0"]["rewards"] == [1.0, 8.0]
    assert data["a1"]["observations"] == [10, 11, 12] and data["a1"]["actions"] == [110, 111]
    assert data["a1"]["rewards"] == [6.0, 6.0]
    assert data["a0"]["infos"] == [{"i": 0}, {}, {}]
    assert ep.get_observations(return_list=True) == [
        {"a0": 0, "a1": 10},
        {"a0": 1},
        {"a1": 11},
        {"a0": 2, "a1": 12},
    ]
    assert_same([F(0), F(1)], ep.agent_episodes["a0"].get_extra_model_outputs("logp"))
    assert ep.get_agents_to_act() == {"a0", "a1"}


def test_constructor_auto_lookback_puts_all_data_in_the_lookback() -> None:
    ep = constructed()  # len_lookback_buffer="auto"
    assert (len(ep), ep.env_t_started, ep.env_t) == (0, 0, 0)
    assert ep.get_observations() == {"a0": [2], "a1": [12]}
    assert ep.get_observations(-1, neg_index_as_lookback=True) == {"a1": 11}
    assert ep.get_observations(slice(-2, 1), neg_index_as_lookback=True) == {
        "a0": [1, 2],
        "a1": [11, 12],
    }
    assert ep.get_actions() == {} and ep.agent_steps() == 0


def test_constructor_len_lookback_buffer_and_t_started() -> None:
    ep = constructed(len_lookback_buffer=1, env_t_started=7, agent_t_started={"a0": 2, "a1": 2})
    assert (len(ep), ep.env_t_started, ep.env_t) == (2, 7, 9)
    assert ep.get_observations() == {"a0": [1, 2], "a1": [11, 12]}
    assert ep.get_observations(-1, neg_index_as_lookback=True) == {"a0": 0, "a1": 10}
    assert ep.get_actions(env_steps=False) == {"a0": [101], "a1": [111]}
    assert ep.agent_episodes["a0"].t_started == 2 and ep.agent_t_started["a0"] == 2
    assert ep.agent_episodes["a1"].t == 3


@pytest.mark.parametrize("flags", ["bool", "dict"])
def test_constructor_done_flags(flags: str) -> None:
    if flags == "bool":
        # (RLlib 2.60 takes a bool only without data: with data it crashes.)
        ep = MAEpisode(terminateds=True)
        assert ep.is_terminated and ep.is_done and not ep.is_truncated
        assert MAEpisode(truncateds=True).is_truncated
    else:
        ep = constructed(len_lookback_buffer=0, truncateds={"a1": True, "__all__": True})
        assert ep.is_truncated and ep.is_done
        assert ep.agent_episodes["a1"].is_truncated
        assert not ep.agent_episodes["a0"].is_done


def test_constructor_ids_and_modules() -> None:
    ep = constructed(
        len_lookback_buffer=0,
        agent_episode_ids={"a0": "eid0", "a1": "eid1"},
        agent_module_ids={"a0": "pinned"},
        agent_to_module_mapping_fn=lambda aid, episode: f"m_{aid}",
    )
    assert ep.agent_episode_ids == {"a0": "eid0", "a1": "eid1"}
    assert ep.agent_episodes["a0"].module_id == "pinned" and ep.module_for("a0") == "pinned"
    assert ep.agent_episodes["a1"].module_id == "m_a1" and ep.module_for("a1") == "m_a1"
    assert ep.agent_episodes["a1"].agent_id == "a1"
    assert ep.agent_episodes["a1"].multi_agent_episode_id == "built"


def test_constructor_spaces_go_to_the_agents() -> None:
    ep = sim_episode(1)
    assert ep.observation_space == OBS_SPACES and ep.action_space == ACT_SPACES
    assert ep.agent_episodes["a0"].observation_space == OBS_SPACES["a0"]
    assert ep.agent_episodes["a1"].action_space == ACT_SPACES["a1"]
    gym_dict = MAEpisode(observation_space=gym.spaces.Dict(OBS_SPACES))
    gym_dict.add_env_reset(observations={"a0": 1})
    assert gym_dict.agent_episodes["a0"].observation_space == OBS_SPACES["a0"]


@fastrollout_only
def test_agents_get_the_layouts_of_their_own_spaces() -> None:
    import fastrollout

    # Agent episodes are copied from one blank episode per pair of space objects: each new
    # space object (one per loop, so its id may be a freed one's) still gets its own layout.
    for shape in [(2,), (3,), (2,), (5,)]:
        space = gym.spaces.Box(-1.0, 1.0, shape, np.float32)
        acts = gym.spaces.Discrete(3)
        ep = MAEpisode(
            id_="m", observation_space={"a": space, "b": space}, action_space={"a": acts, "b": acts}
        )
        ep.add_env_reset(observations={"a": np.zeros(shape, np.float32)})
        with pytest.raises(fastrollout.errors.SpaceMismatchError, match="agent 'a'"):
            ep.add_env_step({"a": np.zeros(7, np.float32)}, {"a": 0}, {"a": 1.0})
        ep.add_env_step(
            {"a": np.ones(shape, np.float32), "b": np.ones(shape, np.float32)}, {"a": 2}, {"a": 1.0}
        )
        a, b = ep.agent_episodes["a"], ep.agent_episodes["b"]
        assert a.observation_space is space and a.action_space is acts
        assert (a.agent_id, b.agent_id, a.multi_agent_episode_id) == ("a", "b", "m")
        assert a.module_id == ep.module_for("a")
        assert a.id_ != b.id_
        assert ep.get_observations(-1)["a"].shape == shape


@fastrollout_only
def test_an_agent_episode_subclass_constructor_runs_for_every_agent() -> None:
    import fastrollout

    made = []

    class Counted(fastrollout.SingleAgentEpisode):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            made.append(kwargs.get("agent_id"))
            super().__init__(*args, **kwargs)

    class Episode(fastrollout.MultiAgentEpisode):
        _agent_episode_cls = Counted

    ep = Episode(observation_space=OBS_SPACES, action_space=ACT_SPACES)
    ep.add_env_reset(
        observations={"a0": OBS_SPACES["a0"].sample(), "a1": OBS_SPACES["a1"].sample()}
    )
    assert sorted(made) == ["a0", "a1"]
    assert all(type(e) is Counted for e in ep.agent_episodes.values())


# --------------------------------------------------------------------------------------
# Reset and steps.
# --------------------------------------------------------------------------------------


def test_add_env_reset() -> None:
    ep = MAEpisode(id_="r")
    ep.add_env_reset(observations={"a0": 0, "a1": 10}, infos={"a1": {"x": 1}})
    assert ep.is_reset and ep.agent_ids == {"a0", "a1"}
    assert (len(ep), ep.env_t) == (0, 0)
    assert ep.get_observations() == {"a0": [0], "a1": [10]}
    assert ep.get_infos() == {"a0": [{}], "a1": [{"x": 1}]}
    assert ep.get_agents_to_act() == {"a0", "a1"} == ep.get_agents_that_stepped()
    assert ep.get_duration_s() == 0.0


def test_add_env_reset_twice_raises() -> None:
    ep = MAEpisode()
    ep.add_env_reset(observations={"a0": 0})
    with pytest.raises(AssertionError):
        ep.add_env_reset(observations={"a0": 1})
    stepped = turn_episode()
    with pytest.raises(AssertionError):
        stepped.add_env_reset(observations={"a0": 1})


def test_simultaneous_steps() -> None:
    ep = sim_episode(2)
    assert (len(ep), ep.env_t, ep.env_steps(), ep.agent_steps()) == (2, 2, 2, 4)
    assert ep.get_observations(agent_ids="a0") == {"a0": [0, 1, 2]}
    assert ep.get_actions(agent_ids="a0") == {"a0": [1, 2]}
    assert ep.get_rewards() == {"a0": [1.0, 2.0], "a1": [10.0, 20.0]}
    assert ep.get_infos(agent_ids="a0") == {"a0": [{"t": 0}, {"t": 1}, {"t": 2}]}
    assert ep.get_infos(agent_ids="a1") == {"a1": [{}, {"t": 1}, {"t": 2}]}
    assert_same({"a0": [F(-1), F(-2)], "a1": [F(-10), F(-20)]}, ep.get_extra_model_outputs("logp"))
    assert ep.get_agents_to_act() == {"a0", "a1"}
    assert ep.get_return() == 33.0
    assert ep.get_duration_s() >= 0.0 and isinstance(ep.get_duration_s(), float)


@fastrollout_only  # RLlib's validate rejects an extra key that appears mid-episode
@pytest.mark.parametrize("odd_one", ["a", "b", "c"])
def test_an_agent_off_the_row_path_leaves_the_others_steps_whole(odd_one: str) -> None:
    # The native record converts every agent's step into one shared list of rows before it
    # stores any; an agent whose step goes in only through the general path (an extra
    # model output it never had, found after its observation, action, reward and log-prob
    # were converted) must give back what it added, or the next agent's step would start
    # with its leftovers.
    agents = ["a", "b", "c"]
    ep = MAEpisode(
        observation_space={a: gym.spaces.Box(-10.0, 10.0, (2,), np.float32) for a in agents},
        action_space={a: gym.spaces.Discrete(2) for a in agents},
    )
    ep.add_env_reset(observations={a: np.zeros(2, F) for a in agents})
    for t in (1, 2):
        extras: dict = {a: {"logp": F(-10 * t - i)} for i, a in enumerate(agents)}
        if t == 2:
            extras[odd_one]["new"] = F(7)
        ep.add_env_step(
            {a: np.full(2, 10 * t + i, F) for i, a in enumerate(agents)},
            {a: i % 2 for i, a in enumerate(agents)},
            {a: float(i) for i, a in enumerate(agents)},
            extra_model_outputs=extras,
        )
    for i, a in enumerate(agents):
        observations = [np.zeros(2, F), np.full(2, 10 + i, F), np.full(2, 20 + i, F)]
        assert_same(observations, ep.get_observations(agent_ids=a)[a])
        assert [int(x) for x in ep.get_actions(agent_ids=a)[a]] == [i % 2, i % 2]
        assert ep.get_rewards(agent_ids=a)[a] == [float(i), float(i)]
        assert_same([F(-10 - i), F(-20 - i)], ep.get_extra_model_outputs("logp", agent_ids=a)[a])


def test_turn_based_steps_hang_actions_and_rewards() -> None:
    ep = turn_episode()
    assert (len(ep), ep.env_steps(), ep.agent_steps()) == (3, 3, 2)
    a0, a1 = ep.agent_episodes["a0"], ep.agent_episodes["a1"]
    assert (a0.get_observations(), a0.get_actions(), a0.get_rewards()) == ([0, 1], [100], [3.0])
    assert (a1.get_observations(), a1.get_actions(), a1.get_rewards()) == ([10, 11], [110], [8.0])
    # a0's action 101 (reward 4.0 so far) hangs until its next observation; a1's reward
    # before its first observation (0.5) hangs at the beginning.
    assert ep.get_return() == 11.0
    assert ep.get_return(include_hanging_rewards=True) == 15.5
    assert ep.get_agents_to_act() == {"a1"} == ep.get_agents_that_stepped()
    ep.add_env_step({"a0": 2}, {"a1": 111}, {"a0": 6.0, "a1": 7.0})
    assert a0.get_actions() == [100, 101] and a0.get_rewards() == [3.0, 10.0]
    assert ep.get_agents_to_act() == {"a0"}
    assert ep.get_return(include_hanging_rewards=True) == 11.0 + 10.0 + 7.0 + 0.5


def test_rewards_before_the_first_observation_hang_at_the_beginning() -> None:
    ep = MAEpisode()
    ep.add_env_reset(observations={"a0": 0})
    ep.add_env_step({"a0": 1}, {"a0": 100}, {"a0": 1.0, "a1": 5.0})
    assert ep.agent_ids == {"a0"}
    assert (ep.get_return(), ep.get_return(include_hanging_rewards=True)) == (1.0, 6.0)
    ep.add_env_step({"a0": 2, "a1": 20}, {"a0": 101}, {"a0": 1.0, "a1": 2.0})
    assert ep.agent_ids == {"a0", "a1"}
    assert ep.agent_episodes["a1"].get_rewards() == []  # never counted for a1's steps
    assert (ep.get_return(), ep.get_return(include_hanging_rewards=True)) == (2.0, 9.0)
    assert ep.get_observations(return_list=True) == [{"a0": 0}, {"a0": 1}, {"a0": 2, "a1": 20}]


def test_agents_leave_and_the_episode_ends_when_all_are_done() -> None:
    ep = MAEpisode()
    ep.add_env_reset(observations={"a0": 0, "a1": 10})
    ep.add_env_step({"a0": 1}, {"a0": 100, "a1": 110}, {"a0": 1.0}, terminateds={"a0": True})
    assert ep.agent_episodes["a0"].is_terminated and not ep.is_done
    assert ep.get_terminateds() == {"a0": True, "a1": False, "__all__": False}
    assert ep.get_agents_to_act() == set() and ep.get_agents_that_stepped() == {"a0"}
    ep.add_env_step({"a1": 11}, {}, {"a1": 1.0}, truncateds={"a1": True})
    # RLlib 2.60: every agent done (a mix of terminated and truncated) -> the episode is
    # terminated, not truncated, and so is the agent whose flag ended it (a1 is
    # terminated and truncated); get_truncateds()["__all__"] reports is_terminated.
    assert ep.is_terminated and not ep.is_truncated and ep.is_done
    assert ep.get_terminateds() == {"a0": True, "a1": True, "__all__": True}
    # RLlib 2.60 reports is_terminated under "__all__" (a KNOWN_RLLIB_BUGS entry);
    # fastrollout reports is_truncated.
    all_truncated = ep.is_terminated if not IS_FASTROLLOUT else ep.is_truncated
    assert ep.get_truncateds() == {"a0": False, "a1": True, "__all__": all_truncated}
    assert ep.agent_episodes["a1"].get_rewards() == [1.0]


def test_termination_without_observation_repeats_the_last_observation() -> None:
    ep = turn_episode()
    ep.add_env_step({"a1": 12}, {"a1": 111}, {"a1": 1.0, "a0": 6.0}, terminateds={"a0": True})
    a0 = ep.agent_episodes["a0"]
    assert a0.is_terminated
    assert a0.get_observations() == [0, 1, 1]
    assert a0.get_actions() == [100, 101] and a0.get_rewards() == [3.0, 10.0]
    # RLlib 2.60: the env-step map gets both a skip tag and agent step 2 for that env step, so a0
    # also counts as "stepped" at the last env step.
    assert ep.get_agents_that_stepped() == {"a0", "a1"}
    assert ep.get_agents_to_act() == {"a1"}


@pytest.mark.parametrize("end", ["terminateds", "truncateds"])
def test_all_flag_ends_the_episode_for_every_agent(end: str) -> None:
    ep = sim_episode(1)
    sim_step(ep, 2, **{end: {"__all__": True}})
    assert ep.is_done
    assert (ep.is_terminated, ep.is_truncated) == (end == "terminateds", end == "truncateds")
    for sa in ep.agent_episodes.values():
        assert sa.is_done and (sa.is_terminated if end == "terminateds" else sa.is_truncated)
    assert ep.get_agents_to_act() == set()


def test_an_agent_done_with_its_first_observation_never_joins() -> None:
    ep = MAEpisode()
    ep.add_env_reset(observations={"a0": 0})
    ep.add_env_step({"a0": 1, "a1": 10}, {"a0": 100}, {"a0": 1.0}, terminateds={"a1": True})
    assert ep.agent_ids == {"a0"}


def test_step_errors_of_rllib() -> None:
    errors = ma_env_errors()
    ep = turn_episode()
    # a1 acts and observes, but gets no reward.
    with pytest.raises(errors):
        copy.deepcopy(ep).add_env_step({"a1": 12}, {"a1": 111}, {})
    # a1 acts, then is truncated without an observation.
    with pytest.raises(errors):
        copy.deepcopy(ep).add_env_step({}, {"a1": 111}, {}, truncateds={"a1": True})
    # Data for an agent that is already done.
    done = MAEpisode()
    done.add_env_reset(observations={"a0": 0, "a1": 10})
    done.add_env_step(
        {"a0": 1, "a1": 11}, {"a0": 1, "a1": 1}, {"a0": 1.0, "a1": 1.0}, terminateds={"a1": True}
    )
    with pytest.raises(errors):
        done.add_env_step({"a0": 2, "a1": 12}, {"a0": 1}, {"a0": 1.0})


def test_step_after_the_end_raises_and_changes_nothing() -> None:
    ep = sim_episode(2)
    sim_step(ep, 3, truncateds={"__all__": True})
    assert_unchanged(ep, lambda: sim_step(ep, 4), ma_env_errors(), match="done")


def test_agent_to_module_mapping_fn_is_called_once_per_agent() -> None:
    calls: list[Any] = []

    def mapping(agent_id: Any, episode: Any) -> str:
        calls.append(agent_id)
        return f"m_{agent_id}"

    ep = turn_episode(agent_to_module_mapping_fn=mapping)
    ep.add_env_step({"a0": 2}, {"a1": 111}, {"a0": 1.0, "a1": 1.0})
    for _ in range(3):
        assert ep.module_for("a0") == "m_a0" and ep.module_for("a1") == "m_a1"
    assert sorted(calls) == ["a0", "a1"]
    assert ep.agent_episodes["a1"].module_id == "m_a1"
    # An agent mapped before it joins keeps that module (and is not mapped again).
    assert ep.module_for("a7") == "m_a7"
    assert sorted(calls) == ["a0", "a1", "a7"]
    ep.add_env_step({"a7": 70}, {"a0": 102}, {"a0": 1.0})
    assert ep.agent_episodes["a7"].module_id == "m_a7"
    assert sorted(calls) == ["a0", "a1", "a7"]


def test_agent_module_ids_pin_modules() -> None:
    ep = turn_episode(agent_module_ids={"a1": "pinned"})
    assert ep.module_for("a1") == "pinned" and ep.agent_episodes["a1"].module_id == "pinned"
    assert ep.module_for("a0") == "default_policy"


def test_default_module_is_default_policy() -> None:
    assert turn_episode().agent_episodes["a0"].module_id == "default_policy"


# --------------------------------------------------------------------------------------
# Properties.
# --------------------------------------------------------------------------------------


def test_ids_and_counters() -> None:
    ep = turn_episode()
    assert ep.id_ == "turns"
    assert ep.agent_ids == {"a0", "a1"}
    ids = ep.agent_episode_ids
    assert set(ids) == {"a0", "a1"} and ids["a0"] == ep.agent_episodes["a0"].id_
    assert ids["a0"] != ids["a1"]
    assert (ep.env_t, ep.env_t_started, len(ep)) == (3, 0, 3)
    assert ep.agent_t_started.get("a0", 0) == 0 and ep.agent_t_started.get("a1", 0) == 0
    assert (ep.is_reset, ep.is_done, ep.is_terminated, ep.is_truncated) == (
        True,
        False,
        False,
        False,
    )
    assert ep.is_numpy is False


@fastrollout_only
def test_bookkeeping_attributes_are_the_native_base_classs_shared_objects() -> None:
    """The bookkeeping lives in the native base class, under RLlib's attribute names: its
    dicts are the very objects Python code reads and mutates (the native step sees the
    mutation), a dict subclass assigned keeps its type, and a value of the wrong type is
    refused without replacing the old one."""
    from collections import defaultdict

    import fastrollout.errors

    ep = turn_episode()
    maps = ep.env_t_to_agent_t
    assert ep.env_t_to_agent_t is maps and isinstance(maps, defaultdict)
    hanging = ep._hanging_actions_end
    assert hanging == {"a0": 101}
    # Without its hanging action, a0 observing again has not acted on its last observation.
    hanging.pop("a0")
    with pytest.raises(fastrollout.errors.EpisodeStateError, match="observed again without"):
        ep.add_env_step({"a0": 2}, {"a1": 111}, {"a0": 1.0, "a1": 1.0})
    assert ep.env_t == 3
    hanging["a0"] = 101
    ep.add_env_step({"a0": 2}, {"a1": 111}, {"a0": 1.0, "a1": 1.0})
    assert ep.env_t == 4 and maps["a0"].data == [0, "S", 1, "S", 2]
    assert list(ep.agent_episodes["a0"].get_actions()) == [100, 101]
    started = defaultdict(int, ep.agent_t_started)
    ep.agent_t_started = started
    assert ep.agent_t_started is started
    episodes = ep.agent_episodes
    # A refused value's error names the attribute; the old value stays.
    with pytest.raises(TypeError, match=r"MultiAgentEpisode\.agent_episodes: .*dict"):
        ep.agent_episodes = [episodes["a0"]]
    with pytest.raises(TypeError, match=r"MultiAgentEpisode\.env_t: "):
        ep.env_t = "4"
    with pytest.raises(TypeError, match=r"MultiAgentEpisode\._start_time: "):
        ep._start_time = "now"
    with pytest.raises(OverflowError, match=r"MultiAgentEpisode\._len_lookback_buffers: "):
        ep._len_lookback_buffers = -1
    assert ep.agent_episodes is episodes and ep.env_t == 4
    assert ep._start_time is not None and ep._len_lookback_buffers == 0
    ep.is_terminated = np.bool_(True)
    assert ep.is_terminated is True and ep.is_done


@fastrollout_only
def test_an_episode_in_a_reference_cycle_through_its_dicts_is_collected() -> None:
    """The native fields take part in garbage collection: an episode reachable only from
    its own hanging extra outputs is freed by the cycle collector."""
    import gc
    import weakref

    ep = turn_episode()
    ep._hanging_extra_model_outputs_end["a0"] = {"owner": ep}
    ref = weakref.ref(ep)
    del ep
    gc.collect()
    assert ref() is None


def test_per_agent_returns_are_the_agents_own() -> None:
    # (ray#45543 was about RLlib's MultiAgentEnvRunner metrics; the episode's own
    # per-agent returns are each agent's rewards only, before and after a cut.)
    ep = sim_episode(3)
    assert ep.agent_episodes["a0"].get_return() == 6.0
    assert ep.agent_episodes["a1"].get_return() == 60.0
    successor = ep.cut(1)
    sim_step(successor, 4)
    sim_step(successor, 5)
    assert successor.agent_episodes["a0"].get_return() == 9.0
    assert successor.agent_episodes["a1"].get_return() == 90.0
    assert successor.get_return() == 99.0


def test_custom_data_is_a_mutable_dict() -> None:
    ep = MAEpisode()
    ep.custom_data["x"] = 1
    ep.custom_data.setdefault("y", []).append(2)
    assert ep.custom_data == {"x": 1, "y": [2]}


# --------------------------------------------------------------------------------------
# Getters.
# --------------------------------------------------------------------------------------

# (call, expected) on `turn_episode()`, in env steps unless env_steps=False.
TURN_READS: list[tuple[str, Any]] = [
    ("get_observations()", {"a0": [0, 1], "a1": [10, 11]}),
    # Env-step action/reward reads include a hanging action and its rewards so far.
    ("get_actions()", {"a0": [100, 101], "a1": [110]}),
    ("get_rewards()", {"a0": [3.0, 4.0], "a1": [8.0]}),
    ("get_infos()", {"a0": [{"t": 0}, {"t": 2}], "a1": [{"t": 1}, {"t": 3}]}),
    ("get_observations(env_steps=False)", {"a0": [0, 1], "a1": [10, 11]}),
    ("get_actions(env_steps=False)", {"a0": [100], "a1": [110]}),
    ("get_rewards(env_steps=False)", {"a0": [3.0], "a1": [8.0]}),
    # ... but an int index past the agent's last step reads the hanging action.
    ("get_actions(-1, env_steps=False)", {"a0": 101, "a1": 110}),
    ("get_rewards(-1, env_steps=False)", {"a0": 4.0, "a1": 8.0}),
    ("get_actions(0, env_steps=False)", {"a0": 100, "a1": 110}),
    ("get_observations(return_list=True)", [{"a0": 0}, {"a1": 10}, {"a0": 1}, {"a1": 11}]),
    ("get_actions(return_list=True)", [{"a0": 100}, {"a1": 110}, {"a0": 101}]),
    ("get_rewards(return_list=True)", [{"a0": 3.0}, {"a1": 8.0}, {"a0": 4.0}]),
    (
        "get_infos(return_list=True)",
        [{"a0": {"t": 0}}, {"a1": {"t": 1}}, {"a0": {"t": 2}}, {"a1": {"t": 3}}],
    ),
    # fill: skipped env steps (and steps outside the data) become the fill value.
    ("get_observations(fill=-1)", {"a0": [0, -1, 1, -1], "a1": [-1, 10, -1, 11]}),
    ("get_actions(fill=-1)", {"a0": [100, -1, 101], "a1": [-1, 110, -1]}),
    (
        "get_infos(fill={})",
        {"a0": [{"t": 0}, {}, {"t": 2}, {}], "a1": [{}, {"t": 1}, {}, {"t": 3}]},
    ),
    (
        "get_actions(slice(0, 5), fill=-1)",
        {"a0": [100, -1, 101, -1, -1], "a1": [-1, 110, -1, -1, -1]},
    ),
    ("get_actions(slice(0, 5))", {"a0": [100, 101], "a1": [110]}),
    ("get_observations(slice(2, 6), fill=-1)", {"a0": [1, -1, -1, -1], "a1": [-1, 11, -1, -1]}),
    ("get_observations(slice(-6, 1), fill=-1)", {"a0": [-1, -1, 0], "a1": [-1, -1, -1]}),
    # Single env steps: only the agents that stepped there.
    ("get_observations(-1)", {"a1": 11}),
    ("get_observations(0)", {"a0": 0}),
    ("get_observations(1)", {"a1": 10}),
    ("get_observations(3)", {"a1": 11}),
    ("get_observations(4)", IndexError),
    ("get_actions(-1)", {"a0": 101}),
    ("get_actions(1)", {"a1": 110}),
    ("get_rewards(-1)", {"a0": 4.0}),
    ("get_observations(-1, agent_ids='a0')", {}),
    ("get_observations(-1, 'a0', fill=-1)", {"a0": -1}),
    ("get_observations([0, -1])", {"a0": [0], "a1": [11]}),
    ("get_observations(slice(1, 3))", {"a0": [1], "a1": [10]}),
    ("get_observations(slice(1, 3), fill=-1)", {"a0": [-1, 1], "a1": [10, -1]}),
    ("get_observations(agent_ids='a1')", {"a1": [10, 11]}),
    ("get_observations(agent_ids=['a0', 'zz'])", {"a0": [0, 1]}),
    ("get_observations([-1], return_list=True)", [{"a1": 11}]),
    ("get_observations(return_list=True, env_steps=False)", ValueError),
    # RLlib 2.60: return_list needs a list or a slice of indices.
    ("get_observations(-1, return_list=True)", AssertionError),
]


@pytest.mark.parametrize(("call", "expected"), TURN_READS, ids=[c for c, _ in TURN_READS])
def test_turn_episode_reads(call: str, expected: Any) -> None:
    ep = turn_episode()
    if isinstance(expected, type):
        with pytest.raises(expected):
            eval(f"ep.{call}", {"ep": ep})
        return
    assert_same(expected, eval(f"ep.{call}", {"ep": ep}), call)


def test_reward_fill_values_are_float32() -> None:
    # RLlib 2.60: a filled reward is a 0-d float32 array (the rewards buffer's space).
    out = turn_episode().get_rewards(fill=-1)
    assert_same(
        out,
        {
            "a0": [3.0, np.array(-1, np.float32), 4.0],
            "a1": [np.array(-1, np.float32), 8.0, np.array(-1, np.float32)],
        },
    )


def test_lookback_reads_after_a_cut() -> None:
    successor = sim_episode(3).cut(2)
    sim_step(successor, 4)
    assert successor.get_observations(agent_ids="a0") == {"a0": [3, 4]}
    assert successor.get_observations(-1, "a0", neg_index_as_lookback=True) == {"a0": 2}
    assert successor.get_observations(slice(-2, 1), "a0", neg_index_as_lookback=True) == {
        "a0": [1, 2, 3]
    }
    # (Discrete fill values come as 0-d arrays of the space's dtype, Box ones in its shape.)
    assert_same(
        successor.get_actions(slice(-3, 0), "a0", neg_index_as_lookback=True, fill=9),
        {"a0": [np.array(9), 2, 0]},
    )
    assert_same(
        successor.get_actions(slice(-3, 0), "a1", neg_index_as_lookback=True, fill=9),
        {"a1": [np.full(2, 9, np.float32), vec(0.1), vec(0.15)]},
    )
    assert successor.get_rewards(-1, "a0", env_steps=False, neg_index_as_lookback=True) == {
        "a0": 3.0
    }
    with pytest.raises(IndexError):
        successor.get_observations(-3, "a0", neg_index_as_lookback=True)


@pytest.mark.parametrize("numpy", [False, True], ids=["list", "numpy"])
def test_one_hot_discrete(numpy: bool) -> None:
    ep = sim_episode(2)
    if numpy:
        ep.to_numpy()
    out = ep.get_observations(agent_ids="a0", one_hot_discrete=True)
    expected = np.eye(5, dtype=np.float32)[[0, 1, 2]]
    if numpy:
        assert_same({"a0": expected}, out)
    else:
        assert_same({"a0": list(expected)}, out)
    acts = ep.get_actions(-1, agent_ids="a0", one_hot_discrete=True)
    assert_same({"a0": np.eye(3, dtype=np.float32)[2]}, acts)
    # Box spaces are left as they are.
    assert_same({"a1": vec(0.1)}, ep.get_actions(-1, "a1", one_hot_discrete=True))
    # Without a space, one-hot is an error.
    with pytest.raises(ValueError):
        turn_episode().get_observations(one_hot_discrete=True)


def test_extra_model_outputs_reads() -> None:
    ep = sim_episode(2)
    assert_same({"a0": F(-2), "a1": F(-20)}, ep.get_extra_model_outputs("logp", -1))
    assert_same({"a1": [F(-10)]}, ep.get_extra_model_outputs("logp", [0], "a1"))
    assert_same(
        ep.get_extra_model_outputs("logp", return_list=True),
        [{"a0": F(-1), "a1": F(-10)}, {"a0": F(-2), "a1": F(-20)}],
    )
    assert_same(
        ep.get_extra_model_outputs(indices=-1),
        {"a0": {"logp": F(-2)}, "a1": {"logp": F(-20)}},
    )
    with pytest.raises(KeyError):
        ep.get_extra_model_outputs("no-such-key")


def test_chunk_reads_in_agent_steps_and_lists() -> None:
    # (The dict-returning env-step reads of actions in such chunks are where RLlib 2.60
    # and fastrollout differ: see test_rllib_deviations_multi_agent.)
    successor = sim_episode(3).cut(2)
    sim_step(successor, 4)
    assert successor.get_actions(env_steps=False, agent_ids="a0") == {"a0": [1]}
    assert_same([{"a0": 1, "a1": vec(0.2)}], successor.get_actions(return_list=True))
    assert successor.get_rewards(return_list=True) == [{"a0": 4.0, "a1": 40.0}]


def test_terminateds_and_truncateds() -> None:
    ep = turn_episode()
    assert ep.get_terminateds() == {"a0": False, "a1": False, "__all__": False}
    assert ep.get_truncateds() == {"a0": False, "a1": False, "__all__": False}


# --------------------------------------------------------------------------------------
# Setters.
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("numpy", [False, True], ids=["list", "numpy"])
def test_setters_write_agent_steps(numpy: bool) -> None:
    ep = sim_episode(3)
    if numpy:
        ep.to_numpy()
    ep.set_observations(new_data={"a0": 4}, at_indices=0)
    ep.set_actions(new_data={"a0": 2}, at_indices=-1)
    ep.set_rewards(new_data={"a1": 7.0}, at_indices=1)
    ep.set_extra_model_outputs(key="logp", new_data={"a0": F(5)}, at_indices=0)
    assert ep.agent_episodes["a0"].get_observations(0) == 4
    assert ep.agent_episodes["a0"].get_actions(-1) == 2
    assert ep.agent_episodes["a1"].get_rewards(1) == 7.0
    assert ep.agent_episodes["a0"].get_extra_model_outputs("logp", 0) == F(5)
    # Untouched agents and items stay as they were.
    assert ep.agent_episodes["a1"].get_observations(0).tolist() == [0.0, 0.0]
    for setter in ("set_observations", "set_actions", "set_rewards"):
        with pytest.raises(KeyError):
            getattr(ep, setter)(new_data={"zz": 1}, at_indices=0)


def test_setters_with_lookback_and_slices() -> None:
    ep = sim_episode(3).cut(2)
    ep.set_rewards(new_data={"a0": [8.0, 9.0]}, at_indices=slice(-2, 0), neg_index_as_lookback=True)
    assert ep.agent_episodes["a0"].get_rewards(slice(-2, 0), neg_index_as_lookback=True) == [
        8.0,
        9.0,
    ]
    with pytest.raises(IndexError):
        ep.set_rewards(new_data={"a0": [1.0]}, at_indices=slice(-2, 0), neg_index_as_lookback=True)


# --------------------------------------------------------------------------------------
# cut, slice, concat_episode.
# --------------------------------------------------------------------------------------


def test_cut_without_lookback() -> None:
    ep = sim_episode(3)
    ep.custom_data["k"] = [1]
    successor = ep.cut()
    assert successor.id_ == ep.id_
    assert (len(successor), successor.env_t_started, successor.env_t) == (0, 3, 3)
    assert successor.agent_episode_ids == ep.agent_episode_ids
    assert_same({"a0": [3], "a1": [vec(0.3)]}, successor.get_observations())
    assert successor.get_actions() == {} and successor.agent_steps() == 0
    assert successor.agent_episodes["a0"].t_started == 3
    assert successor.agent_t_started["a0"] == 3
    assert successor.get_agents_to_act() == {"a0", "a1"}
    assert successor.custom_data == {"k": [1]}
    successor.custom_data["k"].append(2)
    assert ep.custom_data == {"k": [1]}
    assert successor.observation_space == OBS_SPACES
    assert successor.agent_episodes["a1"].module_id == ep.agent_episodes["a1"].module_id


@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_cut_with_lookback(k: int) -> None:
    ep = sim_episode(3)
    successor = ep.cut(k)
    assert (len(successor), successor.env_t_started) == (0, 3)
    lookback = min(k, 3)
    assert successor.get_observations(slice(-lookback, 1), "a0", neg_index_as_lookback=True) == {
        "a0": [t % 5 for t in range(3 - lookback, 4)]
    }
    assert successor.get_actions(-1, "a0", env_steps=False, neg_index_as_lookback=True) == {"a0": 0}


def test_cut_moves_a_hanging_action_into_the_successor() -> None:
    # (len_lookback_buffer=1: see test_rllib_deviations_multi_agent for 0.)
    successor = turn_episode().cut(1)
    assert successor.agent_ids == {"a0", "a1"}
    assert successor.get_agents_to_act() == {"a1"}
    successor.add_env_step({"a0": 2}, {"a1": 111}, {"a0": 6.0, "a1": 7.0})
    a0 = successor.agent_episodes["a0"]
    assert (a0.get_observations(), a0.get_actions(), a0.get_rewards()) == ([1, 2], [101], [10.0])
    # RLlib 2.60: the successor's hanging rewards at the beginning repeat the
    # predecessor's hanging rewards at the end.
    assert successor.get_return(include_hanging_rewards=True) == 10.0 + 7.0 + 4.0


def test_cut_of_a_done_episode_raises() -> None:
    ep = sim_episode(2)
    sim_step(ep, 3, terminateds={"__all__": True})
    with pytest.raises(RuntimeError):
        ep.cut()


def test_cut_then_concat_gives_back_the_episode() -> None:
    ep = sim_episode(2)
    whole = copy.deepcopy(ep)
    successor = ep.cut(1)
    sim_step(successor, 3)
    sim_step(successor, 4)
    whole.concat_episode(successor)
    uncut = sim_episode(4)
    assert_same_ma(uncut, whole, ("logp",), ids=False)
    assert whole.custom_data == {}


def test_concat_episode_errors() -> None:
    ep = sim_episode(2)
    other = sim_episode(2, id_="other").cut()
    with pytest.raises(AssertionError):
        ep.concat_episode(other)
    successor = ep.cut()
    sim_step(ep, 3)
    with pytest.raises(AssertionError):
        ep.concat_episode(successor)  # ep.env_t is no longer successor.env_t_started
    done = sim_episode(2)
    late = done.cut()
    sim_step(done, 3, terminateds={"__all__": True})
    with pytest.raises(AssertionError):
        done.concat_episode(late)


def test_concat_episode_merges_custom_data() -> None:
    ep = sim_episode(1)
    ep.custom_data.update({"a": 1, "b": 1})
    successor = ep.cut()
    successor.custom_data["b"] = 2
    ep.concat_episode(successor)
    assert ep.custom_data == {"a": 1, "b": 2}


def test_slice_and_getitem() -> None:
    ep = turn_episode()
    chunk = ep[1:3]
    assert (len(chunk), chunk.env_t_started, chunk.env_t) == (2, 1, 3)
    assert chunk.id_ == ep.id_ and chunk.agent_episode_ids == ep.agent_episode_ids
    assert chunk.get_observations() == {"a0": [1], "a1": [10, 11]}
    assert chunk.get_observations(return_list=True) == [{"a1": 10}, {"a0": 1}, {"a1": 11}]
    assert chunk.get_actions(return_list=True) == [{"a1": 110}, {"a0": 101}]
    assert chunk.agent_episodes["a1"].get_actions() == [110]
    assert chunk.agent_episodes["a0"].get_actions() == []  # 101 hangs
    assert chunk.get_return(include_hanging_rewards=True) == 8.0 + 4.0
    # A slice ending where an agent has no observation keeps its action hanging.
    head = ep.slice(slice(0, 1))
    assert head.get_observations() == {"a0": [0], "a1": [10]}
    assert head.get_actions() == {"a0": [100]}
    assert head.agent_episodes["a0"].get_actions() == []
    # RLlib 2.60: slices do not carry infos (every agent's infos become {}).
    assert chunk.get_infos() == {"a0": [{}], "a1": [{}, {}]}
    assert_same(ep[:].get_observations(), ep.get_observations())


def test_slice_lookback_and_errors() -> None:
    ep = sim_episode(4)
    chunk = ep.slice(slice(2, 4), len_lookback_buffer=1)
    assert chunk.get_observations(agent_ids="a0") == {"a0": [2, 3, 4]}
    assert chunk.get_observations(-1, "a0", neg_index_as_lookback=True) == {"a0": 1}
    with pytest.raises(NotImplementedError):
        ep.slice(slice(0, 4, 2))
    with pytest.raises(NotImplementedError):
        ep[1]
    assert ep.to_numpy()[1:3].is_numpy


# --------------------------------------------------------------------------------------
# to_numpy, finalize.
# --------------------------------------------------------------------------------------


def test_to_numpy() -> None:
    ep = sim_episode(3)
    assert ep.to_numpy() is ep
    assert ep.is_numpy and all(sa.is_numpy for sa in ep.agent_episodes.values())
    assert_same({"a0": np.array([0, 1, 2, 3])}, ep.get_observations(agent_ids="a0"))
    assert_same(
        ep.get_actions(agent_ids="a1"),
        {"a1": np.stack([vec(t / 20) for t in (1, 2, 3)])},
    )
    assert_same({"a0": np.array([1.0, 2.0, 3.0])}, ep.get_rewards(env_steps=False, agent_ids="a0"))
    # Infos stay lists.
    assert ep.get_infos(agent_ids="a0") == {"a0": [{"t": 0}, {"t": 1}, {"t": 2}, {"t": 3}]}
    before = ma_snapshot(ep, ("logp",))
    assert ep.to_numpy() is ep
    after = ma_snapshot(ep, ("logp",))
    for key in before:
        assert_same_outcome(before[key], after[key], key)
    # Steps go on after to_numpy.
    sim_step(ep, 4)
    assert_same({"a0": 4.0, "a1": 40.0}, ep.get_rewards(-1))


def test_new_agent_after_to_numpy_mixes_list_and_numpy_agents() -> None:
    ep = turn_episode().to_numpy()
    ep.add_env_step({"a0": 2, "a9": 90}, {"a1": 111}, {"a0": 1.0})
    # RLlib 2.60: the new agent's episode is not numpy'd, and is_numpy refuses to answer.
    assert ep.agent_episodes["a9"].is_numpy is False
    with pytest.raises(RuntimeError):
        _ = ep.is_numpy


@fastrollout_only
@pytest.mark.parametrize("drop", [False, True])
def test_finalize(drop: bool) -> None:
    ep = MAEpisode(id_="fin")
    ep.add_env_reset(observations={"a0": 0, "a1": 10})
    ep.add_env_step({"a0": 1}, {"a0": 100, "a1": 110}, {"a0": 1.0})
    ep.add_env_step({"a0": 2, "a2": 20}, {"a0": 101}, {"a0": 1.0})
    # a1 (action hanging) and a2 (just joined) have agent episodes of length 0.
    reference = copy.deepcopy(ep).to_numpy()
    assert ep.finalize(drop_zero_len_single_agent_episodes=drop) is ep
    assert ep.is_numpy
    if drop:
        assert ep.agent_ids == {"a0"} and set(ep.agent_episodes) == {"a0"}
        assert set(ep.get_observations()) == {"a0"}
    else:
        assert_same_ma(reference, ep)
    assert_same({"a0": np.array([0, 1, 2])}, ep.get_observations(agent_ids="a0"))
    assert_same(np.array([100, 101]), ep.agent_episodes["a0"].get_actions())
    plain = MAEpisode(id_="plain")
    plain.add_env_reset(observations={"a0": 0})
    assert plain.finalize() is plain and plain.is_numpy


# --------------------------------------------------------------------------------------
# Round trips, repr, print, validate.
# --------------------------------------------------------------------------------------


ROUND_TRIPS = {
    "state": lambda ep: type(ep).from_state(ep.get_state()),
    "pickle": lambda ep: pickle.loads(pickle.dumps(ep)),
    "copy": copy.copy,
    "deepcopy": copy.deepcopy,
}


@pytest.mark.parametrize("numpy", [False, True], ids=["list", "numpy"])
@pytest.mark.parametrize("how", list(ROUND_TRIPS))
def test_round_trips_preserve_every_getter(how: str, numpy: bool) -> None:
    ep = sim_episode(2).cut(1)
    sim_step(ep, 3)
    ep.custom_data["k"] = [1]
    if numpy:
        ep.to_numpy()
    clone = ROUND_TRIPS[how](ep)
    assert_same_ma(ep, clone, ("logp",))
    turn = turn_episode()
    assert_same_ma(turn, ROUND_TRIPS[how](turn))


@pytest.mark.parametrize("how", list(ROUND_TRIPS))
def test_round_trips_keep_equal_env_step_maps(how: str) -> None:
    stepped = sim_episode(3).cut(2)
    sim_step(stepped, 4)
    for ep in (turn_episode(), turn_episode().cut(1), sim_episode(3), stepped):
        clone = ROUND_TRIPS[how](ep)
        assert clone.env_t_to_agent_t == ep.env_t_to_agent_t
    if how in ("state", "copy") and not IS_FASTROLLOUT:
        # RLlib's from_state and copy.copy share the original's maps: stepping one moves both.
        return
    moved = turn_episode()
    other = ROUND_TRIPS[how](moved)
    other.add_env_step({"a0": 2}, {"a1": 111}, {"a0": 6.0, "a1": 7.0})
    assert other.env_t_to_agent_t != moved.env_t_to_agent_t


@fastrollout_only
def test_step_map_value_equality_and_repr() -> None:
    from fastrollout._core import StepMap

    a = StepMap([0, "S", 1], 1)
    assert a == StepMap([0, "S", 1], 1)
    assert (a != StepMap([0, "S", 1], 1)) is False
    assert a != StepMap([0, "S", 1], 0), "the look-back counts"
    assert a != StepMap([0, 1, "S"], 1), "so do the skips' places"
    assert a != [0, "S", 1] and a != "S" and a is not None
    assert a == a.copy() == pickle.loads(pickle.dumps(a))
    with pytest.raises(TypeError, match="unhashable"):
        hash(a)
    assert repr(a) == "StepMap([0, 'S', 1], lookback=1)"
    assert eval(repr(a), {"StepMap": StepMap}) == a


@pytest.mark.parametrize("how", ["pickle", "deepcopy"])
def test_copies_are_independent_and_continue(how: str) -> None:
    ep = turn_episode()
    before = ma_snapshot(ep)
    clone = ROUND_TRIPS[how](ep)
    clone.add_env_step({"a0": 2}, {"a1": 111}, {"a0": 6.0, "a1": 7.0})
    clone.custom_data["x"] = 1
    assert clone.agent_episodes["a0"].get_actions() == [100, 101]
    after = ma_snapshot(ep)
    for key in before:
        assert_same_outcome(before[key], after[key], key)


def test_get_state_holds_the_episode() -> None:
    state = turn_episode().get_state()
    assert isinstance(state, dict)
    restored = MAEpisode.from_state(pickle.loads(pickle.dumps(state)))
    assert restored.id_ == "turns" and len(restored) == 3
    restored.add_env_step({"a0": 2}, {"a1": 111}, {"a0": 6.0, "a1": 7.0})
    assert restored.agent_episodes["a0"].get_actions() == [100, 101]


def test_repr() -> None:
    assert repr(turn_episode()) == "MAEps(len=3 done=False Rs={'a0': 3.0, 'a1': 8.0} id_=turns)"


def test_print() -> None:
    ep = turn_episode()
    assert stdout_of(ep.print) == "ts  0   1   2   3\na0   x       x\na1       x       x\n"
    # The look-back of a cut shows as negative env steps.
    assert stdout_of(ep.cut(1).print) == "ts  -1   0\na0   x\na1       x\n"


def test_validate() -> None:
    assert turn_episode().validate() is None
    assert MAEpisode().validate() is None


# --------------------------------------------------------------------------------------
# fastrollout's error contract: rejected calls name the agent and change nothing.
# --------------------------------------------------------------------------------------


def _errors() -> tuple[type[BaseException], ...]:
    import fastrollout.errors

    return (fastrollout.errors.EpisodeStateError, *ma_env_errors())


@fastrollout_only
def test_error_classes() -> None:
    import fastrollout.errors

    assert issubclass(fastrollout.errors.EpisodeStateError, AssertionError)
    assert issubclass(fastrollout.errors.SpaceMismatchError, ValueError)


@fastrollout_only
@pytest.mark.parametrize(
    ("what", "step"),
    [
        # a9 never got an observation.
        ("a9", ({"a1": 12}, {"a1": 111, "a9": 1}, {"a1": 1.0})),
        # a0's action hangs: it was not asked to act again.
        ("a0", ({"a1": 12}, {"a1": 111, "a0": 102}, {"a1": 1.0})),
    ],
    ids=["never-observed", "hanging"],
)
def test_action_for_an_agent_not_asked_to_act(what: str, step: tuple) -> None:
    ep = turn_episode()
    info = assert_unchanged(ep, lambda: ep.add_env_step(*step), _errors())
    assert what in str(info.value)
    ep.add_env_step({"a0": 2}, {"a1": 111}, {"a0": 6.0, "a1": 7.0})  # still works


@fastrollout_only
def test_action_for_a_done_agent() -> None:
    ep = MAEpisode()
    ep.add_env_reset(observations={"a0": 0, "a1": 10})
    ep.add_env_step(
        {"a0": 1, "a1": 11}, {"a0": 1, "a1": 1}, {"a0": 1.0, "a1": 1.0}, terminateds={"a1": True}
    )
    info = assert_unchanged(
        ep, lambda: ep.add_env_step({"a0": 2}, {"a0": 1, "a1": 2}, {"a0": 1.0}), _errors()
    )
    assert "a1" in str(info.value)


@fastrollout_only
@pytest.mark.parametrize(
    "step",
    [
        ({"a0": 2, "a1": 12}, {"a0": 1}, {"a0": 1.0}),  # an observation
        ({"a0": 2}, {"a0": 1}, {"a0": 1.0, "a1": 1.0}),  # a reward
    ],
    ids=["observation", "reward"],
)
def test_data_for_a_done_agent(step: tuple) -> None:
    ep = MAEpisode()
    ep.add_env_reset(observations={"a0": 0, "a1": 10})
    ep.add_env_step(
        {"a0": 1, "a1": 11}, {"a0": 1, "a1": 1}, {"a0": 1.0, "a1": 1.0}, truncateds={"a1": True}
    )
    info = assert_unchanged(ep, lambda: ep.add_env_step(*step), _errors())
    assert "a1" in str(info.value)
    ep.add_env_step({"a0": 2}, {"a0": 1}, {"a0": 1.0})


@fastrollout_only
def test_step_after_the_end_names_the_episode_state() -> None:
    ep = sim_episode(1)
    sim_step(ep, 2, terminateds={"__all__": True})
    info = assert_unchanged(ep, lambda: sim_step(ep, 3), _errors())
    assert "done" in str(info.value)


@fastrollout_only
@pytest.mark.parametrize(
    ("observations", "agent"),
    [
        ({"a0": 1, "a1": np.zeros(3, np.float32)}, "a1"),
        ({"a0": np.zeros(2, np.float32), "a1": vec(0.5)}, "a0"),
    ],
    ids=["box-shape", "discrete-array"],
)
def test_observation_not_fitting_the_agent_space(observations: dict, agent: str) -> None:
    import fastrollout.errors

    ep = sim_episode(1)
    info = assert_unchanged(
        ep,
        lambda: ep.add_env_step(observations, {"a0": 1, "a1": vec(0.1)}, {"a0": 1.0, "a1": 1.0}),
        fastrollout.errors.SpaceMismatchError,
    )
    message = str(info.value)
    assert agent in message
    if agent == "a1":
        assert "(2,)" in message and "(3,)" in message
    sim_step(ep, 2)
    assert len(ep) == 2
    # A bad reset observation is rejected too, and leaves the episode un-reset.
    fresh = MAEpisode(observation_space=OBS_SPACES)
    with pytest.raises(fastrollout.errors.SpaceMismatchError, match="a1"):
        fresh.add_env_reset(observations={"a0": 0, "a1": np.zeros(3, np.float32)})
    assert not fresh.is_reset and fresh.agent_ids == set()


def test_subject_is_the_configured_class() -> None:
    cls = MAEpisode.resolve()
    assert cls.__name__ == "MultiAgentEpisode"
    if IS_FASTROLLOUT:
        assert cls.__module__.startswith("fastrollout")


def _fresh_key(aid: str) -> str:
    """An agent id equal to `aid` but another object (what an env may build each step)."""
    return "".join(list(aid))


@pytest.mark.parametrize("ordering", ["fresh keys", "reversed dicts", "int ids"])
def test_add_env_step_finds_agents_by_equality_not_identity_or_position(ordering: str) -> None:
    """The native step matches each dict's agents to each other by key equality: equal
    ids that are other objects, or dicts listing agents in other orders, record the same
    episode as dicts sharing one key object per agent in one order."""
    ids: list[Any] = [1000, 1001, 1002] if ordering == "int ids" else ["a0", "a1", "a2"]

    def key(aid: Any) -> Any:
        if ordering == "fresh keys":
            return _fresh_key(aid)
        if ordering == "int ids":
            return int(str(aid))  # equal ints, built anew (not the small-int cache)
        return aid

    def dicts(step: int, shuffled: bool) -> dict[str, Any]:
        acting = ids if step % 3 else ids[:2]  # ids[2] waits every third step
        order = list(reversed(acting)) if shuffled and ordering == "reversed dicts" else acting
        k = key if shuffled else (lambda a: a)
        all_key = _fresh_key("__all__") if shuffled else "__all__"
        return {
            "observations": {k(a): np.full(2, step + ids.index(a), np.float32) for a in order},
            "actions": {k(a): step for a in (reversed(order) if shuffled else order)},
            "rewards": {k(a): float(step) for a in order},
            "infos": {k(a): {"s": step} for a in order},
            "terminateds": {all_key: False, k(ids[0]): False},
            "truncateds": {all_key: False},
            "extra_model_outputs": {k(a): {"logp": np.float32(-step)} for a in order},
        }

    episodes = []
    for shuffled in (False, True):
        ep = MAEpisode(id_="keys", agent_episode_ids={a: f"sa-{a}" for a in ids})
        ep.add_env_reset(observations={a: np.zeros(2, np.float32) for a in ids})
        for step in range(1, 7):
            ep.add_env_step(**dicts(step, shuffled))
        episodes.append(ep)
    plain, other = episodes
    assert_same_ma(plain, other, ("logp",), ids=False)
    assert_same(plain.env_t_to_agent_t[ids[2]].data, other.env_t_to_agent_t[ids[2]].data)
    assert other.env_t_to_agent_t[ids[2]].data.count("S") == 2


@fastrollout_only
def test_agent_steps_store_what_single_agent_episodes_store() -> None:
    """Each agent's steps hold what a ``SingleAgentEpisode`` given the same values holds,
    whether they take the typed-row path (every field of the agent already typed) or the
    general one: an extra output key that appears late, an extra whose values stop
    converting (its column turns into objects), float64 observations cast into a float32
    space, and a value that does not fit the space (raises, naming the agent, and
    stores nothing)."""
    from fastrollout import SingleAgentEpisode
    from fastrollout.errors import SpaceMismatchError

    obs_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    act_space = gym.spaces.Discrete(3)
    ma = MAEpisode(
        observation_space={"a": obs_space, "b": obs_space},
        action_space={"a": act_space, "b": act_space},
    )
    spaces = {"observation_space": obs_space, "action_space": act_space}
    sa = {aid: SingleAgentEpisode(**spaces) for aid in "ab"}
    first = {"a": vec(0.0), "b": vec(0.5)}
    ma.add_env_reset(observations=first)
    for aid, e in sa.items():
        e.add_env_reset(observation=first[aid])
    for t in range(1, 8):
        obs = {"a": vec(t / 10), "b": vec(t / 10).astype(np.float64)}
        extras: dict[str, dict[str, Any]] = {
            aid: {"logp": np.float32(-t), "vf": float(t)} for aid in "ab"
        }
        if t >= 3:
            extras["a"]["late"] = np.arange(2, dtype=np.int64) * t
        if t >= 5:
            extras["b"]["vf"] = f"not a number {t}"
        actions = {"a": t % 3, "b": np.int64((t + 1) % 3)}
        rewards = {"a": float(t), "b": np.float32(t / 2)}
        ma.add_env_step(obs, actions, rewards, extra_model_outputs=extras)
        for aid, e in sa.items():
            e.add_env_step(obs[aid], actions[aid], rewards[aid], extra_model_outputs=extras[aid])
        if t == 6:
            with pytest.raises(SpaceMismatchError, match="'a'"):
                ma.add_env_step(
                    {"a": np.zeros(3, np.float32), "b": vec(0.0)},
                    {"a": 0, "b": 0},
                    {"a": 0.0, "b": 0.0},
                )
    for aid, e in sa.items():
        agent = ma.agent_episodes[aid]
        assert_same(e.get_observations(), agent.get_observations(), f"{aid} observations")
        assert_same(e.get_actions(), agent.get_actions(), f"{aid} actions")
        assert_same(e.get_rewards(), agent.get_rewards(), f"{aid} rewards")
        for key in e.extra_model_outputs:
            assert_same(
                e.get_extra_model_outputs(key),
                agent.get_extra_model_outputs(key),
                f"{aid} extra {key}",
            )
        assert len(agent) == 7
