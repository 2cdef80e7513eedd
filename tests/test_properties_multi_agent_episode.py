"""Hypothesis properties of ``MultiAgentEpisode``.

- A state machine drives an episode with random valid multi-agent steps (simultaneous,
  turn-based and random movers, agents joining and leaving, hanging actions and rewards,
  ``__all__`` ends) and random cuts, keeping every chunk, next to an uncut episode fed the
  same steps. Invariant: every agent's data, chunk after chunk (each successor without its
  look-back and without the observation it shares with its predecessor), is exactly that
  agent's data in the uncut episode.
- get_state/from_state and pickle round trips preserve every getter.
- to_numpy twice changes nothing.
- The chunks of any cut sequence, joined with ``concat_episode``, read like the uncut
  episode.

Random scripts come from ``_ma_scripts.Planner``, seeded by hypothesis-drawn integers (so
examples are reproducible from the printed seeds).
"""

from __future__ import annotations

import copy
import dataclasses
import pickle
from typing import Any

import numpy as np
from hypothesis import given, note, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from _helpers import (
    IS_FASTROLLOUT,
    MAEpisode,
    assert_same,
    assert_same_outcome,
    count,
    snapshot,
)
from _ma_scripts import (
    EXTRA_KEYS,
    Planner,
    ScriptConfig,
    agent_data,
    assert_same_ma,
    fixed_cut,
)

SEEDS = st.integers(0, 2**32 - 1)


def cut(ep: Any, k: int) -> Any:
    """The subject's cut. RLlib itself breaks the chunk invariant through ray#44677 (it
    loses the step of an agent whose action hangs at the cut); with
    ``FR_DIFF_SUBJECT=rllib`` the machine cuts with RLlib's fixed model instead, so that
    the harness itself is still checked."""
    if IS_FASTROLLOUT:
        return ep.cut(len_lookback_buffer=k)
    return fixed_cut(ep, k)


def new_episode(cfg: ScriptConfig, episode_id: str) -> Any:
    return MAEpisode(id_=episode_id, **cfg.space_kwargs())


def concat_chunks(chunks: list[Any]) -> dict[Any, dict[str, list]]:
    """Every agent's observations/infos/actions/rewards, chunk after chunk.

    A successor's agent episode starts at its ``t_started`` with the observation its
    predecessor ended with: that one is checked and skipped.
    """
    out: dict[Any, dict[str, Any]] = {}
    for i, chunk in enumerate(chunks):
        for aid, data in agent_data(chunk).items():
            obs, infos = list(data["observations"]), list(data["infos"])
            acts, rews = list(data["actions"]), list(data["rewards"])
            if aid not in out:
                out[aid] = {"observations": obs, "infos": infos, "actions": acts, "rewards": rews}
                continue
            seen = out[aid]
            if (data["is_terminated"] or data["is_truncated"]) and data["len"] == 0:
                # A done agent carried over with no new step (RLlib 2.60 starts such an
                # agent at t=0 in a successor with look-back: t is not compared).
                assert_same(seen["observations"][-1], obs[-1], f"chunk {i}: {aid}'s last obs")
                continue
            assert data["t_started"] == len(seen["actions"]), (
                f"chunk {i}: {aid} starts at agent step {data['t_started']}, "
                f"but the chunks before hold {len(seen['actions'])} of its steps"
            )
            assert_same(seen["observations"][-1], obs[0], f"chunk {i}: {aid}'s first obs")
            seen["observations"] += obs[1:]
            seen["infos"] += infos[1:]
            seen["actions"] += acts
            seen["rewards"] += rews
    return out


class ChunkedEpisodeMachine(RuleBasedStateMachine):
    """Drives chunks (the subject, cut now and then) next to an uncut subject episode."""

    def __init__(self) -> None:
        super().__init__()
        self.cfg: ScriptConfig | None = None
        self.planner: Planner | None = None
        self.uncut: Any = None
        self.chunks: list[Any] = []

    @initialize(config_seed=SEEDS, planner_seed=SEEDS)
    def start(self, config_seed: int, planner_seed: int) -> None:
        self.cfg = ScriptConfig.draw(np.random.default_rng(config_seed))
        self.planner = Planner(self.cfg, np.random.default_rng(planner_seed))
        note(f"config: {self.cfg.describe()}")
        self.uncut = new_episode(self.cfg, "machine")
        self.chunks = [new_episode(self.cfg, "machine")]
        observations, infos = self.planner.reset()
        for ep in (self.uncut, self.chunks[-1]):
            ep.add_env_reset(observations=copy.deepcopy(observations), infos=copy.deepcopy(infos))

    def running(self) -> bool:
        return self.planner is not None and not self.planner.done

    @precondition(lambda self: self.running())
    @rule(n=st.integers(1, 4))
    def step(self, n: int) -> None:
        assert self.planner is not None
        for _ in range(n):
            if self.planner.done:
                return
            kwargs = self.planner.step()
            note(f"add_env_step({kwargs})")
            self.uncut.add_env_step(**copy.deepcopy(kwargs))
            self.chunks[-1].add_env_step(**copy.deepcopy(kwargs))
            assert self.chunks[-1].is_done == self.uncut.is_done == self.planner.done

    @precondition(lambda self: self.running())
    @rule(k=st.integers(0, 3))
    def cut_chunk(self, k: int) -> None:
        note(f"cut({k})")
        successor = cut(self.chunks[-1], k)
        assert len(successor) == 0
        assert successor.env_t_started == successor.env_t == self.uncut.env_t
        assert successor.id_ == self.uncut.id_
        self.chunks.append(successor)

    @precondition(lambda self: self.uncut is not None)
    @rule()
    def round_trip_last_chunk(self) -> None:
        """A pickled copy of the last chunk reads the same (and is what goes on)."""
        copied = pickle.loads(pickle.dumps(self.chunks[-1]))
        assert_same_ma(self.chunks[-1], copied)
        self.chunks[-1] = copied

    @invariant()
    def chunks_add_up_to_the_uncut_episode(self) -> None:
        if self.uncut is None:
            return
        assert sum(len(c) for c in self.chunks) == len(self.uncut)
        assert self.chunks[-1].env_t == self.uncut.env_t
        expected = concat_chunks([self.uncut])
        got = concat_chunks(self.chunks)
        assert sorted(got, key=str) == sorted(expected, key=str)
        for aid, data in expected.items():
            for what, items in data.items():
                assert_same(items, got[aid][what], f"{aid}.{what}")
        # Returns add up too: every reward is in exactly one chunk.
        total = sum(c.get_return() for c in self.chunks)
        assert abs(total - self.uncut.get_return()) < 1e-9, (total, self.uncut.get_return())
        for aid in self.uncut.agent_ids:
            own = sum(c.agent_episodes[aid].get_return() for c in self.chunks if aid in c.agent_ids)
            assert abs(own - self.uncut.agent_episodes[aid].get_return()) < 1e-9, aid


TestChunkedEpisodeMachine = ChunkedEpisodeMachine.TestCase


# --------------------------------------------------------------------------------------
# Cut chunks joined with concat_episode.
# --------------------------------------------------------------------------------------


# Two thirds of the profile's examples: 40 (about 3 s) in ci, more with HYPOTHESIS_PROFILE=dev.
@settings(max_examples=settings.default.max_examples * 2 // 3)
@given(
    config_seed=SEEDS,
    planner_seed=SEEDS,
    steps=st.integers(0, 14),
    cuts=st.dictionaries(st.integers(0, 13), st.integers(0, 4), max_size=4),
    numpy=st.booleans(),
)
def test_cut_chunks_joined_with_concat_episode_are_the_uncut_episode(
    config_seed: int, planner_seed: int, steps: int, cuts: dict[int, int], numpy: bool
) -> None:
    """A random script, cut before the steps in ``cuts`` (step -> len_lookback_buffer):
    the first chunk with every later one appended by ``concat_episode`` reads like the
    episode fed the same steps without cuts (every multi-agent getter, and each agent's
    own episode, look-back reads included). With ``numpy``, every chunk goes through
    ``to_numpy`` first, as a runner hands chunks out (the uncut episode too)."""
    if not IS_FASTROLLOUT:
        return  # RLlib's cut and concat_episode break this (ray#44677, ray#45542).
    cfg = ScriptConfig.draw(np.random.default_rng(config_seed))
    planner = Planner(cfg, np.random.default_rng(planner_seed))
    note(f"config: {cfg.describe()}")
    uncut = new_episode(cfg, "joined")
    chunks = [new_episode(cfg, "joined")]
    observations, infos = planner.reset()
    for ep in (uncut, chunks[0]):
        ep.add_env_reset(observations=copy.deepcopy(observations), infos=copy.deepcopy(infos))
    for i in range(steps):
        if planner.done:
            break
        if i in cuts:
            note(f"cut({cuts[i]}) before step {i}")
            chunks.append(chunks[-1].cut(len_lookback_buffer=cuts[i]))
        kwargs = planner.step()
        note(f"add_env_step({kwargs})")
        uncut.add_env_step(**copy.deepcopy(kwargs))
        chunks[-1].add_env_step(**copy.deepcopy(kwargs))
    count("cut sequences joined with concat_episode")
    count("cut sequences joined with concat_episode: chunks", len(chunks))
    if numpy:
        for ep in (uncut, *chunks):
            ep.to_numpy()
    whole = copy.deepcopy(chunks[0])
    for chunk in chunks[1:]:
        whole.concat_episode(copy.deepcopy(chunk))
    # (Agent episodes get random ids: the two episodes' agents have their own.)
    assert_same_ma(uncut, whole, extra_keys(uncut), ids=False)
    assert whole.env_t_to_agent_t == uncut.env_t_to_agent_t
    for aid, sa in uncut.agent_episodes.items():
        agent_keys = tuple(k for k in EXTRA_KEYS if k in sa.extra_model_outputs)
        expected = snapshot(sa, agent_keys)
        got = snapshot(whole.agent_episodes[aid], agent_keys)
        for what in expected.keys() - {"id_"}:
            assert_same_outcome(expected[what], got[what], f"{aid}: {what}")


# --------------------------------------------------------------------------------------
# Round trips and to_numpy.
# --------------------------------------------------------------------------------------


@st.composite
def episodes(draw: st.DrawFn) -> Any:
    """A subject episode after random valid steps, maybe a cut chunk of one."""
    cfg = ScriptConfig.draw(np.random.default_rng(draw(SEEDS)))
    planner = Planner(cfg, np.random.default_rng(draw(SEEDS)))
    note(f"config: {cfg.describe()}")
    ep = new_episode(cfg, "prop")
    observations, infos = planner.reset()
    ep.add_env_reset(observations=observations, infos=infos)
    cut_at = draw(st.one_of(st.none(), st.integers(0, 8)))
    k = draw(st.integers(0, 3))
    for i in range(draw(st.integers(0, 10))):
        if planner.done:
            break
        if i == cut_at:
            ep = cut(ep, k)
        ep.add_env_step(**planner.step())
    if draw(st.booleans()):
        ep.custom_data["note"] = {"n": [1, 2]}
    return ep


def extra_keys(ep: Any) -> tuple[str, ...]:
    present = {k for sa in ep.agent_episodes.values() for k in sa.extra_model_outputs}
    # Only keys every agent has: RLlib raises KeyError for an agent without the key.
    if all(set(EXTRA_KEYS) <= set(sa.extra_model_outputs) for sa in ep.agent_episodes.values()):
        return tuple(sorted(present))
    return ()


@given(ep=episodes(), numpy=st.booleans())
def test_state_round_trip_preserves_every_getter(ep: Any, numpy: bool) -> None:
    if numpy:
        ep.to_numpy()
    keys = extra_keys(ep)
    state = ep.get_state()
    assert_same_ma(ep, MAEpisode.from_state(pickle.loads(pickle.dumps(state))), keys)


@given(ep=episodes(), numpy=st.booleans())
def test_pickle_round_trip_preserves_every_getter(ep: Any, numpy: bool) -> None:
    if numpy:
        ep.to_numpy()
    assert_same_ma(ep, pickle.loads(pickle.dumps(ep)), extra_keys(ep))


@given(ep=episodes())
def test_to_numpy_twice_changes_nothing(ep: Any) -> None:
    assert ep.to_numpy() is ep
    keys = extra_keys(ep)
    once = copy.deepcopy(ep)
    assert ep.to_numpy() is ep
    assert_same_ma(once, ep, keys)


@given(ep=episodes())
def test_to_numpy_keeps_every_agents_items(ep: Any) -> None:
    before = agent_data(ep)
    after = agent_data(ep.to_numpy())
    for aid, data in before.items():
        for what in ("observations", "actions", "rewards"):
            items = data[what]
            got = after[aid][what]
            assert len(got) == len(items), (aid, what)
            for i, item in enumerate(items):
                np.testing.assert_array_equal(
                    np.asarray(got[i]), np.asarray(item), f"{aid}.{what}[{i}]"
                )
        assert after[aid]["infos"] == data["infos"]


# --------------------------------------------------------------------------------------
# The fast cut of simultaneous chunks against the general one.
# --------------------------------------------------------------------------------------


def _ordered_state(ep: Any) -> list:
    """``get_state`` without the random parts, with every dict's key order kept."""
    state = ep.get_state()
    state.pop("_start_time")
    state.pop("_last_step_time")
    return [(k, list(v.items()) if isinstance(v, dict) else v) for k, v in state.items()]


@given(
    cfg_seed=SEEDS,
    plan_seed=SEEDS,
    steps=st.integers(0, 8),
    k=st.integers(0, 4),
    simultaneous=st.sampled_from([True, True, True, False]),
    dones=st.booleans(),
    numpy=st.booleans(),
    more=st.integers(0, 3),
)
def test_fast_cut_equals_the_rebuilt_cut(
    cfg_seed: int,
    plan_seed: int,
    steps: int,
    k: int,
    simultaneous: bool,
    dones: bool,
    numpy: bool,
    more: int,
) -> None:
    """``cut`` takes a shortcut for chunks whose live agents all stepped at each kept env
    step (agents that finished before the last env step are left out); its successor is
    the one the general path rebuilds from per-env-step reads (same getters, same state
    in the same key order, same behaviour when stepped on)."""
    if not IS_FASTROLLOUT:
        return

    cfg = ScriptConfig.draw(np.random.default_rng(cfg_seed))
    if simultaneous:
        agents = {a: dataclasses.replace(s, late=False) for a, s in cfg.agents.items()}
        p_done = max(cfg.p_done, 0.15) if dones else 0.0
        cfg = dataclasses.replace(cfg, agents=agents, mode="simultaneous", p_done=p_done, p_end=0.0)
    note(f"config: {cfg.describe()}")
    planner = Planner(cfg, np.random.default_rng(plan_seed))
    ep = new_episode(cfg, "fast-cut")
    observations, infos = planner.reset()
    ep.add_env_reset(observations=observations, infos=infos)
    # Whether every live agent observed and acted at every step (an agent that finishes
    # does so with its last observation) and none finished in the last k + 1.
    alive = set(cfg.agents)
    everyone = set(observations) == alive
    last_finish = -1
    n = 0
    for _ in range(steps):
        if planner.done:
            break
        data = planner.step()
        n += 1
        terminateds, truncateds = data.get("terminateds") or {}, data.get("truncateds") or {}
        finished = {a for a in alive if terminateds.get(a) or truncateds.get(a)}
        everyone &= set(data["observations"]) == set(data["actions"]) == alive
        alive -= finished
        if finished:
            last_finish = n
        ep.add_env_step(**data)
    everyone &= last_finish < n - k
    if planner.done:
        return
    ep.custom_data["note"] = {"n": [1]}
    if numpy:
        ep.to_numpy()
    fast = ep._cut_simultaneous(k)
    if fast is None:
        # A chunk where every live agent observed and acted at every step takes it.
        assert not everyone or numpy or k > len(ep) or k == 0
        return
    count("fast cuts compared with rebuilt cuts")
    if any(e.is_done for e in ep.agent_episodes.values()):
        count("fast cuts with done agents compared with rebuilt cuts")
    rebuilt = ep._cut_rebuilt(k)
    keys = extra_keys(rebuilt)
    assert_same_ma(rebuilt, fast, keys)
    assert_same(_ordered_state(rebuilt), _ordered_state(fast), "state")
    assert list(fast.agent_episodes) == list(rebuilt.agent_episodes)
    assert list(fast.env_t_to_agent_t) == list(rebuilt.env_t_to_agent_t)
    for _ in range(more):
        if planner.done:
            break
        data = planner.step()
        fast.add_env_step(**copy.deepcopy(data))
        rebuilt.add_env_step(**data)
    # Agents that join now get random episode ids.
    assert_same_ma(rebuilt, fast, extra_keys(rebuilt), ids=False)
    assert_same_ma(rebuilt.to_numpy(), fast.to_numpy(), extra_keys(rebuilt), ids=False)


def _simultaneous_step(t: int, alive: list[str], finish: dict[str, tuple[int, bool]]) -> dict:
    """One env step of simultaneous agents: every live agent acts, observes and is
    rewarded; those whose finish step is ``t`` end (truncated or terminated)."""
    ends = {a: trunc for a, (f, trunc) in finish.items() if f == t and a in alive}
    return {
        "observations": {a: np.full(2, t + i, np.float32) for i, a in enumerate(alive)},
        "actions": {a: (t + i) % 3 for i, a in enumerate(alive)},
        "rewards": {a: float(t * 10 + i) for i, a in enumerate(alive)},
        "terminateds": {a: True for a, trunc in ends.items() if not trunc},
        "truncateds": {a: True for a, trunc in ends.items() if trunc},
        "extra_model_outputs": {a: {"logp": np.float32(-t - i)} for i, a in enumerate(alive)},
    }


@given(
    n_agents=st.integers(2, 5),
    finishes=st.lists(st.tuples(st.integers(1, 10), st.booleans()), min_size=5, max_size=5),
    never=st.lists(st.booleans(), min_size=5, max_size=5),
    steps=st.integers(1, 10),
    k=st.integers(0, 3),
)
def test_fast_cut_with_done_agents_equals_the_rebuilt_cut(
    n_agents: int,
    finishes: list[tuple[int, bool]],
    never: list[bool],
    steps: int,
    k: int,
) -> None:
    """Simultaneous agents, some of which finish: the shortcut applies exactly when every
    done agent finished before the kept env steps, at the first of them or at the last,
    and its successor is the rebuilt one (state, key order, and the steps that follow)."""
    if not IS_FASTROLLOUT:
        return
    agents = [f"a{i}" for i in range(n_agents)]
    finish = {a: f for a, f, skip in zip(agents, finishes, never, strict=False) if not skip}
    ep = MAEpisode(id_="done-agents")
    ep.add_env_reset(observations={a: np.zeros(2, np.float32) for a in agents})
    alive = list(agents)
    for t in range(1, steps + 1):
        ep.add_env_step(**_simultaneous_step(t, alive, finish))
        alive = [a for a in alive if finish.get(a, (0, False))[0] != t]
        if not alive:
            return  # (the episode is done)
    fast = ep._cut_simultaneous(k)
    # A done agent finished before the kept env steps (left out), at the first of them
    # (dropped), or at the last (kept, done); in between, the general path cuts.
    handled = all(
        f < steps - k or f == steps - k > 0 or f == steps for f, _ in finish.values() if f <= steps
    )
    assert (fast is not None) == (handled and 0 < k <= steps), (handled, k, steps)
    if fast is None:
        return
    done = len(alive) < len(agents)
    count("fast cuts with done agents" if done else "fast cuts without done agents")
    rebuilt = ep._cut_rebuilt(k)
    assert_same_ma(rebuilt, fast, extra_keys(rebuilt))
    assert_same(_ordered_state(rebuilt), _ordered_state(fast), "state")
    assert list(fast.agent_episodes) == list(rebuilt.agent_episodes)
    for t in range(steps + 1, steps + 3):
        data = _simultaneous_step(t, alive, {})
        fast.add_env_step(**copy.deepcopy(data))
        rebuilt.add_env_step(**data)
    assert_same_ma(rebuilt, fast, extra_keys(rebuilt), ids=False)
    assert_same_ma(rebuilt.to_numpy(), fast.to_numpy(), extra_keys(rebuilt), ids=False)
