"""Differential test: ``MultiAgentEpisode.cut``'s general path and ``slice`` (the core's
plans, which copy each agent's kept rows) against the rebuild from the per-env-step reads
through the constructor (``_cut_from_reads``, ``_slice_from_reads``: what both do where
the core has no plan, and did before it planned them; the oracle).

Random episodes come from ``_ma_scripts.Planner`` (turn-based, simultaneous and random
movers, agents joining late and finishing at any step, hanging actions and rewards, extra
model outputs), after earlier cuts and concats, numpy'd or not, cut with look-backs from 0
on. Compared: every getter, the state with every dict's key order, each agent episode's
field look-backs, the types of the hanging values, and the same after further env steps.
"""

from __future__ import annotations

import builtins
import copy
from typing import Any

import numpy as np
from hypothesis import given, note
from hypothesis import strategies as st

from _helpers import MAEpisode, assert_same, count, fastrollout_only
from _ma_scripts import Planner, ScriptConfig, assert_same_ma

SEEDS = st.integers(0, 2**32 - 1)


def rebuilt_cut(ep: Any, len_lookback_buffer: int) -> Any:
    """The successor rebuilt from the per-env-step reads through the constructor (the
    oracle: the general path where the core has no plan)."""
    return ep._cut_from_reads(len_lookback_buffer)


def rebuilt_slice(ep: Any, slice_: builtins.slice, len_lookback_buffer: int | None = None) -> Any:
    """The slice rebuilt from the per-env-step reads (the oracle), after ``slice``'s own
    checks and bounds."""
    return ep._slice_from_reads(*ep._slice_bounds(slice_, len_lookback_buffer))


def _outcome(fn: Any) -> Any:
    try:
        return fn()
    except Exception as e:  # (the two paths must fail alike)
        return (type(e), str(e))


def _typed(value: Any) -> Any:
    """A value with the types of its parts (numpy scalars, arrays, floats) spelled out."""
    if isinstance(value, dict):
        return [(k, _typed(v)) for k, v in value.items()]
    if isinstance(value, np.ndarray):
        return ("array", value.dtype.str, value.shape, value.tolist())
    return (type(value).__name__, value)


def _books(ep: Any) -> dict:
    """The episode's books with every dict's key order and the types of hanging values."""
    agents = {}
    for aid, eps in ep.agent_episodes.items():
        keys = eps._extra_keys()
        agents[aid] = {
            "class": type(eps).__name__,
            "lookbacks": [eps._lookback(f) for f in ("observations", "infos", "actions", "rewards")]
            + [eps._lookback("extra_model_outputs", k) for k in keys],
            "lengths": [eps._field_len(f) for f in ("observations", "infos", "actions", "rewards")]
            + [eps._field_len("extra_model_outputs", k) for k in keys],
            "keys": list(keys),
            "finalized": eps._is_finalized("observations"),
            "is_numpy": eps.is_numpy,
            "rewards float32 fills": eps._rewards_have_space(),
            "identity": (eps.id_, eps.agent_id, eps.module_id, eps.multi_agent_episode_id),
            "spaces": (eps.observation_space, eps.action_space),
            "times": (eps.t_started, eps.t, eps.is_terminated, eps.is_truncated),
        }
    return {
        "agents": list(agents.items()),
        "maps": [(a, list(m.data), m.lookback) for a, m in ep.env_t_to_agent_t.items()],
        "agent_t_started": list(ep.agent_t_started.items()),
        "modules": list(ep._agent_to_module_mapping.items()),
        "hanging actions": [(a, _typed(v)) for a, v in ep._hanging_actions_end.items()],
        "hanging extras": [(a, _typed(v)) for a, v in ep._hanging_extra_model_outputs_end.items()],
        "hanging rewards end": [(a, _typed(v)) for a, v in ep._hanging_rewards_end.items()],
        "hanging rewards begin": [(a, _typed(v)) for a, v in ep._hanging_rewards_begin.items()],
        "dict kinds": [
            type(d).__name__
            for d in (
                ep.env_t_to_agent_t,
                ep.agent_t_started,
                ep._hanging_actions_end,
                ep._hanging_extra_model_outputs_end,
                ep._hanging_rewards_end,
                ep._hanging_rewards_begin,
            )
        ],
        "dropped": sorted(ep._dropped_agents, key=str),
        "counters": (ep.env_t_started, ep.env_t, ep._len_lookback_buffers),
        "flags": (ep.is_terminated, ep.is_truncated),
        "id": ep.id_,
        "custom": ep._custom_data,
    }


def _extra_keys(ep: Any) -> tuple[str, ...]:
    keys = {k for eps in ep.agent_episodes.values() for k in eps._extra_keys()}
    return tuple(sorted(keys))


def _assert_same_successors(expected: Any, actual: Any, *, ids: bool = True) -> None:
    assert_same(
        _books(expected) if ids else _without_ids(_books(expected)),
        _books(actual) if ids else _without_ids(_books(actual)),
        "books",
    )
    assert_same_ma(expected, actual, _extra_keys(expected), ids=ids)


def _without_ids(books: dict) -> dict:
    for _, agent in books["agents"]:
        agent["identity"] = agent["identity"][1:]
    return books


def _assert_go_on_alike(planner: Planner, expected: Any, actual: Any, more: int) -> None:
    """Both episodes take up to `more` further env steps alike (or refuse one alike)."""
    for _ in range(more):
        if planner.done or expected.is_done:
            break
        data = planner.step()
        mine = copy.deepcopy(data)
        e = _outcome(lambda d=data: expected.add_env_step(**d))
        a = _outcome(lambda d=mine: actual.add_env_step(**d))
        assert (e is None) == (a is None), (e, a)
        if e is not None:
            assert e == a
            return
    # Agents that join now get random episode ids.
    _assert_same_successors(expected, actual, ids=False)


def _reset_episode(cfg_seed: int, plan_seed: int, id_: str) -> tuple[Planner, Any]:
    """A random script's planner and a new episode that took its reset."""
    cfg = ScriptConfig.draw(np.random.default_rng(cfg_seed))
    note(f"config: {cfg.describe()}")
    planner = Planner(cfg, np.random.default_rng(plan_seed))
    ep = MAEpisode(id_=id_, **cfg.space_kwargs())
    observations, infos = planner.reset()
    ep.add_env_reset(observations=observations, infos=infos)
    return planner, ep


def _drive(planner: Planner, ep: Any, steps: int) -> Any:
    for _ in range(steps):
        if planner.done:
            break
        ep.add_env_step(**planner.step())
    return ep


@fastrollout_only
@given(
    cfg_seed=SEEDS,
    plan_seed=SEEDS,
    before=st.lists(st.tuples(st.integers(0, 6), st.integers(0, 3), st.booleans()), max_size=3),
    steps=st.integers(0, 10),
    k=st.integers(0, 5),
    numpy=st.sampled_from([False, False, False, True]),
    custom=st.booleans(),
    more=st.integers(0, 4),
)
def test_planned_cut_equals_the_rebuilt_cut(
    cfg_seed: int,
    plan_seed: int,
    before: list[tuple[int, int, bool]],
    steps: int,
    k: int,
    numpy: bool,
    custom: bool,
    more: int,
) -> None:
    """The general path's successor is the rebuilt one, and both go on alike."""
    planner, ep = _reset_episode(cfg_seed, plan_seed, "cut-core")
    # Earlier chunks: cut after some steps, then either go on with the successor or
    # step the successor and append it again.
    for n, lookback, concat in before:
        _drive(planner, ep, n)
        if planner.done or ep.is_done:
            return
        successor = ep.cut(len_lookback_buffer=lookback)
        if concat:
            _drive(planner, successor, 2)
            ep.concat_episode(successor)
        else:
            ep = successor
    _drive(planner, ep, steps)
    if planner.done or ep.is_done:
        return
    if custom:
        ep.custom_data["note"] = {"n": [1]}
    if numpy:
        ep.to_numpy()
    from fastrollout._core import StepMap

    lookback = StepMap._cut_lookback(
        k, [ep.env_t_to_agent_t[aid] for aid in ep._hanging_actions_end]
    )
    # Each path cuts its own copy: the reads leave their marks on the episode too.
    theirs, ep = copy.deepcopy(ep), copy.deepcopy(ep)
    planned = copy.deepcopy(ep)._cut_books(type(ep).__new__(type(ep)), lookback)
    count("cuts planned by the core" if planned else "cuts rebuilt from the reads")
    if planned:
        for what, seen in (
            ("done agents", any(e.is_done for e in ep.agent_episodes.values())),
            ("hanging actions", bool(ep._hanging_actions_end)),
            ("look-back 0", lookback == 0),
            ("look-back past the chunk", lookback > len(ep)),
            ("earlier concats", any(c for _, _, c in before)),
        ):
            if seen:
                count(f"planned cuts with {what}")
    expected = _outcome(lambda: rebuilt_cut(theirs, lookback))
    actual = _outcome(lambda: ep._cut_rebuilt(lookback))
    assert_same(_books(theirs), _books(ep), "the episode that was cut")
    if isinstance(expected, tuple) or isinstance(actual, tuple):
        assert expected == actual
        return
    note(f"planned: {planned}, look-back {lookback}")
    _assert_same_successors(expected, actual)
    if custom:
        assert actual.custom_data is not ep.custom_data
        assert actual.custom_data["note"] is not ep.custom_data["note"]
    _assert_go_on_alike(planner, expected, actual, more)


@fastrollout_only
def test_turn_based_cut_is_planned() -> None:
    """A turn-based chunk (one agent's action hangs at each cut) takes the core's plan."""
    ep = MAEpisode(id_="turns")
    ep.add_env_reset(observations={"a": 0})
    for t in range(1, 11):
        me, other = ("b", "a") if t % 2 else ("a", "b")
        ep.add_env_step(
            observations={me: t},
            actions={other: t % 3},
            rewards={other: float(t)},
            extra_model_outputs={other: {"logp": -float(t)}},
        )
    for k in (0, 1, 3):
        successor = ep._cut_rebuilt(k)
        assert ep._cut_books(type(ep).__new__(type(ep)), k)
        _assert_same_successors(rebuilt_cut(ep, k), successor)


@fastrollout_only
def test_subclass_constructors_run_in_a_cut() -> None:
    """Subclasses with constructors of their own get the rebuild, which runs them."""
    import fastrollout

    made = []

    class Counted(fastrollout.SingleAgentEpisode):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            made.append(kwargs.get("agent_id"))
            super().__init__(*args, **kwargs)

    class Episode(fastrollout.MultiAgentEpisode):
        _agent_episode_cls = Counted

    ep = Episode(id_="counted")
    ep.add_env_reset(observations={"a": 0})
    ep.add_env_step(observations={"b": 1}, actions={"a": 0}, rewards={"a": 1.0})
    made.clear()
    successor = ep.cut(len_lookback_buffer=1)
    assert sorted(made) == ["a", "b"]
    assert all(type(e) is Counted for e in successor.agent_episodes.values())


@fastrollout_only
@given(
    cfg_seed=SEEDS,
    plan_seed=SEEDS,
    cut_at=st.one_of(st.none(), st.tuples(st.integers(0, 6), st.integers(0, 3))),
    steps=st.integers(0, 10),
    bounds=st.tuples(
        st.one_of(st.none(), st.integers(-8, 8)), st.one_of(st.none(), st.integers(-8, 8))
    ),
    lookback=st.one_of(st.none(), st.integers(0, 5)),
    numpy=st.sampled_from([False, False, False, True]),
    more=st.integers(0, 4),
)
def test_planned_slice_equals_the_rebuilt_slice(
    cfg_seed: int,
    plan_seed: int,
    cut_at: tuple[int, int] | None,
    steps: int,
    bounds: tuple[int | None, int | None],
    lookback: int | None,
    numpy: bool,
    more: int,
) -> None:
    """``slice`` (the core's plan where it has one) gives the rebuilt slice."""
    planner, ep = _reset_episode(cfg_seed, plan_seed, "slice-core")
    if cut_at is not None:
        _drive(planner, ep, cut_at[0])
        if planner.done or ep.is_done:
            return
        ep = ep.cut(len_lookback_buffer=cut_at[1])
    _drive(planner, ep, steps)
    if numpy:
        ep.to_numpy()
    slice_ = builtins.slice(*bounds)
    theirs, ep = copy.deepcopy(ep), copy.deepcopy(ep)
    expected = _outcome(lambda: rebuilt_slice(theirs, slice_, lookback))
    actual = _outcome(lambda: ep.slice(slice_, len_lookback_buffer=lookback))
    if isinstance(actual, tuple) and actual[0] is ValueError:
        return  # (look-backs that differ: both refuse the slice)
    assert_same(_books(theirs), _books(ep), "the episode that was sliced")
    if isinstance(expected, tuple) or isinstance(actual, tuple):
        assert expected == actual
        return
    count("slices compared")
    if ep.agent_episodes and ep.is_numpy is False:
        n = len(ep)
        start, stop, _ = slice_.indices(n)
        probe = copy.deepcopy(theirs)
        lb = actual._len_lookback_buffers
        planned = probe._slice_books(
            type(ep).__new__(type(ep)), start, stop, lb, probe._agent_to_module_mapping
        )
        count("slices planned by the core" if planned else "slices rebuilt from the reads")
        if planned and actual._hanging_actions_end and stop < n:
            count("planned slices with actions hanging inside the chunk")
    _assert_same_successors(expected, actual)
    _assert_go_on_alike(planner, expected, actual, more)
