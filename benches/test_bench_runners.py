"""Env runners side by side with RLlib 2.60: sample() throughput on CartPole.

Run with ``make bench-python``. Each benchmark samples ``STEPS`` env steps with exploration
from a warmed-up runner (default MLP module, hidden (256, 256), tanh, on the CPU, torch
with one thread): CartPole-v1 with 1 and 8 sub-envs, and multi-agent CartPole with 2
agents (two modules) and 1 or 8 sub-envs. Divide a round's time by ``STEPS`` for the cost
per env step.
"""

from __future__ import annotations

import pytest
import torch

import fastrollout as fr

STEPS = 1000


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _mapping(aid, episode, **kwargs):
    return f"p{aid}"


def _fastrollout(n, agents):
    c = fr.RunnerConfig().resources(device="cpu").debugging(seed=0)
    c = c.env_runners(num_envs_per_env_runner=n)
    if agents:
        c = c.environment(fr.env.make_multi_agent("CartPole-v1"), env_config={"num_agents": agents})
        c = c.multi_agent(policies={f"p{i}" for i in range(agents)}, policy_mapping_fn=_mapping)
        return fr.MultiAgentEnvRunner(config=c)
    return fr.SingleAgentEnvRunner(config=c.environment("CartPole-v1"))


def _rllib(n, agents):
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.env.multi_agent_env_runner import MultiAgentEnvRunner
    from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner
    from ray.rllib.examples.envs.classes.multi_agent import MultiAgentCartPole

    c = PPOConfig().debugging(seed=0).env_runners(num_envs_per_env_runner=n)
    if agents:
        c = c.environment(MultiAgentCartPole, env_config={"num_agents": agents})
        c = c.multi_agent(policies={f"p{i}" for i in range(agents)}, policy_mapping_fn=_mapping)
        return MultiAgentEnvRunner(config=c)
    return SingleAgentEnvRunner(config=c.environment("CartPole-v1"))


IMPLS = {"rllib": _rllib, "fastrollout": _fastrollout}


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("impl", list(IMPLS))
@pytest.mark.parametrize(("n", "agents"), [(1, 0), (8, 0), (1, 2), (8, 2)])
@pytest.mark.benchmark(group="runner sample(1000 env steps), CartPole")
def test_sample(benchmark, impl, n, agents):
    runner = IMPLS[impl](n, agents)
    runner.sample(num_timesteps=200)  # warm-up
    benchmark.group = (
        f"runner sample({STEPS} env steps), CartPole, {n} sub-env(s), {agents or 1} agent(s)"
    )
    episodes = benchmark.pedantic(
        runner.sample, kwargs={"num_timesteps": STEPS}, rounds=5, iterations=1
    )
    assert sum(e.env_steps() if agents else len(e) for e in episodes) >= STEPS
    runner.stop()
