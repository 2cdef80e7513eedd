"""PettingZoo adapters: tiny AEC and parallel envs written here, RLlib's adapters as reference."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from pettingzoo import AECEnv, ParallelEnv
from pettingzoo.utils import AgentSelector, parallel_to_aec
from ray.rllib.env.wrappers.pettingzoo_env import ParallelPettingZooEnv as RLlibParallel
from ray.rllib.env.wrappers.pettingzoo_env import PettingZooEnv as RLlibAEC

from fastrollout import MultiAgentEpisode
from fastrollout.env import ParallelPettingZooEnv, PettingZooEnv, check_env, is_multi_agent_env

OBS = gym.spaces.Box(0.0, 100.0, (2,), np.float32)


class RaceAEC(AECEnv):  # type: ignore[misc]
    """Two players alternate adding 0/1/2 to their score; the first to reach ``goal`` wins.

    The mover gets its action as reward and, on winning, +10 while the other gets -10. After
    ``max_moves`` moves without a winner both are truncated (or, with ``mixed_end``, the
    first is terminated and the second truncated).
    """

    metadata = {"name": "race_v0", "render_modes": ["rgb_array"]}  # noqa: RUF012

    def __init__(self, goal: int = 4, max_moves: int = 20, mixed_end: bool = False) -> None:
        super().__init__()
        self.goal, self.max_moves, self.mixed_end = goal, max_moves, mixed_end
        self.possible_agents = ["p0", "p1"]
        self.render_mode = "rgb_array"

    def observation_space(self, agent: str) -> gym.Space[Any]:
        return OBS

    def action_space(self, agent: str) -> gym.Space[Any]:
        return gym.spaces.Discrete(3)

    def observe(self, agent: str) -> np.ndarray:
        other = "p1" if agent == "p0" else "p0"
        return np.array([self.score[agent], self.score[other]], np.float32)

    def reset(self, seed: Any = None, options: Any = None) -> None:
        self.agents = list(self.possible_agents)
        self.score = dict.fromkeys(self.agents, 0)
        self.rewards = dict.fromkeys(self.agents, 0.0)
        self._cumulative_rewards = dict.fromkeys(self.agents, 0.0)
        self.terminations = dict.fromkeys(self.agents, False)
        self.truncations = dict.fromkeys(self.agents, False)
        self.infos = {a: {"seed": seed} for a in self.agents}
        self.moves = 0
        self._selector = AgentSelector(self.agents)
        self.agent_selection = self._selector.next()

    def step(self, action: Any) -> None:
        agent = self.agent_selection
        if self.terminations[agent] or self.truncations[agent]:
            self._was_dead_step(action)
            return
        self._cumulative_rewards[agent] = 0.0
        self._clear_rewards()
        other = "p1" if agent == "p0" else "p0"
        self.score[agent] += int(action)
        self.rewards[agent] = float(action)
        self.moves += 1
        if self.score[agent] >= self.goal:
            self.rewards[agent] += 10.0
            self.rewards[other] = -10.0
            self.terminations = dict.fromkeys(self.agents, True)
        elif self.moves >= self.max_moves:
            self.truncations = dict.fromkeys(self.agents, True)
            if self.mixed_end:
                self.terminations["p0"], self.truncations["p0"] = True, False
        self._accumulate_rewards()
        self.agent_selection = self._selector.next()

    def render(self) -> np.ndarray:
        return np.zeros((2, 2, 3), np.uint8)

    def close(self) -> None:
        self.closed = True


class ShrinkParallel(ParallelEnv):  # type: ignore[misc]
    """Three agents; ``c`` leaves after step 1; ``a`` and ``b`` end after ``length`` steps.

    Each agent's reward is its action. At the end ``a`` is terminated and ``b`` truncated
    (``mixed_end``) or both terminated.
    """

    metadata = {"name": "shrink_v0"}  # noqa: RUF012

    def __init__(self, length: int = 3, mixed_end: bool = True) -> None:
        self.possible_agents = ["a", "b", "c"]
        self.length, self.mixed_end = length, mixed_end
        self.render_mode = None

    def observation_space(self, agent: str) -> gym.Space[Any]:
        return OBS

    def action_space(self, agent: str) -> gym.Space[Any]:
        return gym.spaces.Discrete(3)

    def reset(self, seed: Any = None, options: Any = None) -> Any:
        self.agents = list(self.possible_agents)
        self.t = 0
        return (
            {a: np.array([0, i], np.float32) for i, a in enumerate(self.agents)},
            {a: {"seed": seed} for a in self.agents},
        )

    def step(self, actions: dict[str, Any]) -> Any:
        self.t += 1
        obs = {a: np.array([self.t, i], np.float32) for i, a in enumerate(actions)}
        rewards = {a: float(act) for a, act in actions.items()}
        terminations = dict.fromkeys(actions, False)
        truncations = dict.fromkeys(actions, False)
        if "c" in actions and self.t == 1:
            terminations["c"] = True
        if self.t >= self.length:
            terminations["a"] = True
            if self.mixed_end:
                truncations["b"] = True
            else:
                terminations["b"] = True
        self.agents = [a for a in self.agents if not (terminations[a] or truncations[a])]
        return obs, rewards, terminations, truncations, {a: {} for a in actions}

    def render(self) -> Any:
        return "frame"

    def close(self) -> None:
        self.closed = True


# ----------------------------------------------------------------------------- AEC


def _play_aec(env: Any, moves: list[int]) -> list[Any]:
    out = [env.reset(seed=1)]
    for move in moves:
        mover = next(iter(out[-1][0]))
        result = env.step({mover: move})
        out.append(result)
        if result[2]["__all__"] or result[3]["__all__"]:
            break
    return out


def test_aec_adapter_turns_rewards_and_spaces() -> None:
    env = PettingZooEnv(RaceAEC(goal=4))
    assert is_multi_agent_env(env)
    assert env.possible_agents == ["p0", "p1"] and env.agents == ["p0", "p1"]
    assert env.get_observation_space("p1") == OBS
    assert env.action_space == gym.spaces.Dict({a: gym.spaces.Discrete(3) for a in ("p0", "p1")})
    check_env(env)
    out = _play_aec(env, [2, 1, 2])
    assert out[0] == ({"p0": pytest.approx(np.zeros(2))}, {"p0": {"seed": 1}})
    assert list(out[1][0]) == ["p1"] and out[1][1] == {"p1": 0.0}
    assert list(out[2][0]) == ["p0"] and out[2][1] == {"p0": 2.0}
    obs, rewards, terminateds, truncateds, _ = out[3]
    # p0 reached the goal: both players' last data come in this step, with exact rewards.
    assert list(obs) == ["p1", "p0"]
    assert rewards == {"p1": 1.0 - 10.0, "p0": 2.0 + 10.0}
    assert terminateds == {"p1": True, "p0": True, "__all__": True}
    assert truncateds == {"p1": False, "p0": False, "__all__": False}
    assert env.agents == []


def test_aec_adapter_records_exact_returns_in_an_episode() -> None:
    env = PettingZooEnv(RaceAEC(goal=3))
    obs, infos = env.reset()
    episode = MultiAgentEpisode()
    episode.add_env_reset(observations=obs, infos=infos)
    terms: dict[str, bool] = {}
    while not episode.is_done:
        actions = {next(a for a in obs if not terms.get(a)): 1}
        obs, rewards, terms, truncs, infos = env.step(actions)
        episode.add_env_step(obs, actions, rewards, infos, terminateds=terms, truncateds=truncs)
    # p0 moves 1,1,1 (3 reward + 10 win); p1 moves 1,1 then loses.
    returns = {a: sum(e.get_rewards()) for a, e in episode.agent_episodes.items()}
    assert returns == {"p0": 13.0, "p1": 2.0 - 10.0}


def test_aec_adapter_matches_rllib_on_a_decided_game() -> None:
    ours = _play_aec(PettingZooEnv(RaceAEC(goal=4)), [2, 1, 2])
    ref = _play_aec(RLlibAEC(RaceAEC(goal=4)), [2, 1, 2])
    assert len(ours) == len(ref)
    for o_step, r_step in zip(ours[1:], ref[1:], strict=True):
        for o, r in zip(o_step, r_step, strict=True):
            assert list(o) == list(r)
            for key in o:
                np.testing.assert_array_equal(o[key], r[key])
    # Reset infos: fastrollout's are per agent; RLlib returns PettingZoo's reset() result,
    # which is None, as {}.
    assert ref[0][1] == {} and ours[0][1] == {"p0": {"seed": 1}}


def test_aec_adapter_mixed_ending_ends_the_episode_unlike_rllib() -> None:
    moves = [0, 0, 0, 0]
    ours = _play_aec(PettingZooEnv(RaceAEC(max_moves=4, mixed_end=True)), moves)
    ref = _play_aec(RLlibAEC(RaceAEC(max_moves=4, mixed_end=True)), moves)
    _, _, terminateds, truncateds, _ = ours[-1]
    assert terminateds == {"p0": True, "p1": False, "__all__": True}
    assert truncateds == {"p0": False, "p1": True, "__all__": False}
    # RLlib: all agents gone, but neither "__all__" flag is set, so the episode never ends.
    _, _, r_terms, r_truncs, _ = ref[-1]
    assert r_terms["__all__"] is False and r_truncs["__all__"] is False


def test_aec_adapter_all_truncated() -> None:
    out = _play_aec(PettingZooEnv(RaceAEC(max_moves=2)), [0, 0])
    _, _, terminateds, truncateds, _ = out[-1]
    assert (terminateds["__all__"], truncateds["__all__"]) == (False, True)


def test_aec_adapter_errors_render_close() -> None:
    inner = RaceAEC()
    env = PettingZooEnv(inner)
    env.reset()
    with pytest.raises(ValueError, match=r"the turn of agent 'p0'; .* got actions for \['p1'\]"):
        env.step({"p1": 0})
    with pytest.raises(ValueError, match=r"got actions for \['p0', 'p1'\]"):
        env.step({"p0": 0, "p1": 0})
    assert env.render().shape == (2, 2, 3)
    # RLlib passes a render_mode argument PettingZoo's render() does not take.
    with pytest.raises(TypeError):
        RLlibAEC(RaceAEC()).render()
    assert env.get_sub_environments() is inner
    env.close()
    assert inner.closed


def test_possible_agents_keep_pettingzoo_order() -> None:
    class Many(RaceAEC):
        def __init__(self) -> None:
            super().__init__()
            self.possible_agents = [f"agent_{i}" for i in range(12)]

    env = PettingZooEnv(Many())
    assert env.possible_agents == [f"agent_{i}" for i in range(12)]


# ----------------------------------------------------------------------------- parallel


def test_parallel_adapter_agents_leave_and_mixed_ending() -> None:
    env = ParallelPettingZooEnv(ShrinkParallel(length=3, mixed_end=True))
    assert env.possible_agents == ["a", "b", "c"]
    assert env.get_action_space("c") == gym.spaces.Discrete(3)
    obs, infos = env.reset(seed=4)
    assert set(obs) == {"a", "b", "c"} and infos["a"] == {"seed": 4}
    _, rewards, terms, truncs, _ = env.step({"a": 1, "b": 2, "c": 0})
    assert rewards == {"a": 1.0, "b": 2.0, "c": 0.0}
    assert terms == {"a": False, "b": False, "c": True, "__all__": False}
    assert env.agents == ["a", "b"]
    env.step({"a": 0, "b": 0})
    _, _, terms, truncs, _ = env.step({"a": 0, "b": 0})
    assert terms == {"a": True, "b": False, "__all__": True}
    assert truncs == {"a": False, "b": True, "__all__": False}
    assert env.agents == []


def test_parallel_adapter_matches_rllib_except_mixed_ending() -> None:
    for mixed in (False, True):
        ours = ParallelPettingZooEnv(ShrinkParallel(mixed_end=mixed))
        ref = RLlibParallel(ShrinkParallel(mixed_end=mixed))
        o_obs, _ = ours.reset(seed=0)
        r_obs, _ = ref.reset(seed=0)
        assert set(o_obs) == set(r_obs)
        steps = [{"a": 1, "b": 2, "c": 0}, {"a": 0, "b": 1}, {"a": 2, "b": 2}]
        for actions in steps:
            o = ours.step(actions)
            r = ref.step(dict(actions))
            assert o[1] == r[1]
        if mixed:
            # RLlib: the episode is over (no agents left) yet neither flag is set.
            assert (r[2]["__all__"], r[3]["__all__"]) == (False, False)
            assert (o[2]["__all__"], o[3]["__all__"]) == (True, False)
        else:
            assert o[2] == r[2] and o[3] == r[3]


def test_parallel_adapter_does_not_share_dicts_and_checks() -> None:
    par = ShrinkParallel()
    env = ParallelPettingZooEnv(par)
    check_env(env)
    env.reset()
    terms = env.step({"a": 0, "b": 0, "c": 0})[2]
    assert "__all__" in terms
    assert env.render() == "frame"
    assert env.get_sub_environments() is par
    env.close()
    assert par.closed


def test_parallel_to_aec_conversion_through_the_aec_adapter() -> None:
    env = PettingZooEnv(parallel_to_aec(ShrinkParallel(mixed_end=False)))
    obs, _ = env.reset(seed=0)
    assert list(obs) == ["a"]
    terms: dict[str, bool] = {}
    returns: dict[str, float] = {}
    while not terms.get("__all__"):
        mover = next(a for a in obs if not terms.get(a))
        obs, rewards, terms, truncs, _ = env.step({mover: 1})
        for agent, r in rewards.items():
            returns[agent] = returns.get(agent, 0.0) + r
    assert not truncs["__all__"]
    # c acted once; a and b three times, 1.0 each.
    assert returns == {"a": 3.0, "b": 3.0, "c": 1.0}
    assert env.agents == []
