"""MultiAgentEpisode side by side with RLlib 2.60: add_env_step + cut + to_numpy, 2 and 8 agents.

Run with ``make bench-python``. Each benchmark records 100 env steps of N simultaneous
agents (float32[4] observations, Discrete(2) actions, one extra model output each), cuts
with look-back 1 as a runner does at a rollout boundary, and turns the chunk to numpy.
A second group times one turn-based env step (only the mover observes; the others' actions
and rewards hang).
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from ray.rllib.env.multi_agent_episode import MultiAgentEpisode as RLlibEpisode

from fastrollout import MultiAgentEpisode

IMPLS = {"rllib": RLlibEpisode, "fastrollout": MultiAgentEpisode}
STEPS = 100


def setup_agents(n_agents: int):
    """The row's agents, spaces and one env step's values (the same every step)."""
    agents = [f"agent_{i}" for i in range(n_agents)]
    obs_space = {a: gym.spaces.Box(-1.0, 1.0, (4,), np.float32) for a in agents}
    act_space = {a: gym.spaces.Discrete(2) for a in agents}
    obs = {a: np.zeros(4, np.float32) for a in agents}
    actions = {a: 1 for a in agents}
    rewards = {a: 1.0 for a in agents}
    extras = {a: {"action_logp": np.float32(-0.69)} for a in agents}
    return agents, obs_space, act_space, obs, actions, rewards, extras


def chunk_recorder(cls: type, n_agents: int):
    """The row: records 100 env steps of `n_agents` in a new episode of `cls` (fastrollout's
    or RLlib's ``MultiAgentEpisode``), cuts it and turns the chunk to numpy."""
    _, obs_space, act_space, obs, actions, rewards, extras = setup_agents(n_agents)

    def record():
        ep = cls(observation_space=obs_space, action_space=act_space)
        ep.add_env_reset(observations=obs)
        for _ in range(STEPS):
            ep.add_env_step(obs, actions, rewards, extra_model_outputs=extras)
        successor = ep.cut(len_lookback_buffer=1)
        ep.to_numpy()
        return ep, successor

    return record


@pytest.mark.parametrize("impl", list(IMPLS))
@pytest.mark.parametrize("n_agents", [2, 8])
@pytest.mark.benchmark(group="multi-agent add_env_step x100 + cut + to_numpy")
def test_chunk(benchmark, impl, n_agents):
    ep, _ = benchmark(chunk_recorder(IMPLS[impl], n_agents))
    assert len(ep) == STEPS and ep.agent_steps() == STEPS * n_agents


@pytest.mark.parametrize("impl", list(IMPLS))
@pytest.mark.parametrize("n_agents", [2, 8])
@pytest.mark.benchmark(group="multi-agent add_env_step (one simultaneous step)")
def test_one_step(benchmark, impl, n_agents):
    _, obs_space, act_space, obs, actions, rewards, extras = setup_agents(n_agents)
    ep = IMPLS[impl](observation_space=obs_space, action_space=act_space)
    ep.add_env_reset(observations=obs)
    benchmark(lambda: ep.add_env_step(obs, actions, rewards, extra_model_outputs=extras))


@pytest.mark.parametrize("impl", list(IMPLS))
@pytest.mark.benchmark(group="multi-agent add_env_step (turn-based, 2 agents)")
def test_turn_based(benchmark, impl):
    ep = IMPLS[impl]()
    ep.add_env_reset(observations={"a": 0})
    state = {"mover": "a"}

    def step():
        mover = state["mover"]
        other = "b" if mover == "a" else "a"
        ep.add_env_step({other: 1}, {mover: 0}, {mover: 1.0, other: 0.5})
        state["mover"] = other

    benchmark(step)
