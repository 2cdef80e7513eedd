"""fastrollout's MultiAgentEnvRunner against RLlib 2.60's on the same envs, seeds and counts.

``count_steps_by="agent_steps"``: ``num_timesteps`` (and ``rollout_fragment_length *
num_envs_per_env_runner`` by default) counts every observation a stepped sub-env returned,
summed over the sub-envs, as RLlib's loop counts them.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest

import fastrollout as fr
from fastrollout.metrics import MetricsLogger

pytest.importorskip("ray.rllib")

from ray.rllib.env.multi_agent_env import MultiAgentEnv as RLlibMultiAgentEnv

# RLlib registers every runner's env under one name (gymnasium warns from the second on).
pytestmark = pytest.mark.filterwarnings("ignore:.*Overriding environment:UserWarning")


@pytest.fixture(autouse=True)
def _unregister_rllibs_env():
    """Leaves gymnasium's registry as it was, so later tests' RLlib runners do not warn."""
    names = set(gym.envs.registry)
    yield
    for name in set(gym.envs.registry) - names:
        del gym.envs.registry[name]


class SeededLifetimesEnv(RLlibMultiAgentEnv):
    """Agents live for lifetimes drawn from the reset seed's RNG; actions are ignored.

    "a" and "b" observe from the reset on, "c" joins at a drawn step; each agent observes
    every step until its own terminal step (reward 1 per step); the episode ends when the
    last one terminates. Runners seeded alike get the same episodes under any policy.
    """

    def __init__(self, config: Any = None) -> None:
        super().__init__()
        self.possible_agents = ["a", "b", "c"]
        self.agents = ["a", "b"]
        space = gym.spaces.Box(0.0, 100.0, (2,), np.float32)
        self.observation_spaces = dict.fromkeys(self.possible_agents, space)
        self.action_spaces = {a: gym.spaces.Discrete(2) for a in self.possible_agents}
        self._rng = np.random.default_rng()
        self._t = 0
        self._join = 0
        self._end: dict[str, int] = {}

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> Any:
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self._t = 0
        self._join = int(self._rng.integers(1, 4))
        self._end = {
            "a": int(self._rng.integers(2, 9)),
            "b": int(self._rng.integers(2, 9)),
            "c": self._join + int(self._rng.integers(1, 6)),
        }
        self.agents = ["a", "b"]
        return {a: self._obs(a) for a in self.agents}, {}

    def _obs(self, agent: str) -> np.ndarray:
        return np.array([self._t, self._end[agent]], np.float32)

    def step(self, action_dict: dict) -> Any:
        self._t += 1
        alive = [a for a in ("a", "b") if self._t <= self._end[a]]
        if self._join <= self._t <= self._end["c"]:
            alive.append("c")
        obs = {a: self._obs(a) for a in alive}
        rewards = dict.fromkeys(alive, 1.0)
        terminateds = {a: self._t == self._end[a] for a in alive}
        terminateds["__all__"] = self._t >= max(self._end.values())
        self.agents = [a for a in alive if not terminateds[a]]
        return obs, rewards, terminateds, {"__all__": False}, {}


def mapping(agent_id: Any, episode: Any, **kwargs: Any) -> str:
    return f"p_{agent_id}"


def runners(env: Any, n: int, policies: set[str], env_config: dict | None = None, **env_runners):
    """RLlib's and fastrollout's multi-agent runners from the same settings."""
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.env.multi_agent_env_runner import MultiAgentEnvRunner

    theirs = MultiAgentEnvRunner(
        config=PPOConfig()
        .environment(env, env_config=env_config or {})
        .env_runners(num_envs_per_env_runner=n, **env_runners)
        .multi_agent(policies=policies, policy_mapping_fn=mapping, count_steps_by="agent_steps")
        .debugging(seed=7)
    )
    ours = fr.MultiAgentEnvRunner(
        config=fr.RunnerConfig()
        .environment(env, env_config=env_config or {})
        .env_runners(num_envs_per_env_runner=n, **env_runners)
        .multi_agent(policies=policies, policy_mapping_fn=mapping, count_steps_by="agent_steps")
        .debugging(seed=7)
        .resources(device="cpu")
        .rl_module(model_config={"fcnet_hiddens": [16]})
    )
    return ours, theirs


def chunks(episodes: list[Any]) -> list[tuple[Any, ...]]:
    """What a sample returned: per episode (chunk) its lengths, start, end and returns."""
    return sorted(
        (
            len(e),
            e.env_t_started,
            bool(e.is_done),
            tuple(
                sorted((str(a), len(x), float(x.get_return())) for a, x in e.agent_episodes.items())
            ),
        )
        for e in episodes
    )


def agent_steps(episodes: list[Any]) -> int:
    return sum(len(x) for e in episodes for x in e.agent_episodes.values())


def test_cartpole_fragments_count_agent_steps():
    """4 agents, 4 sub-envs, fragment 20: each sub-env's chunk holds 20 agent steps."""
    from ray.rllib.examples.envs.classes.multi_agent import MultiAgentCartPole

    ours, theirs = runners(
        MultiAgentCartPole,
        4,
        {"p_0", "p_1", "p_2", "p_3"},
        env_config={"num_agents": 4},
        rollout_fragment_length=20,
    )
    # No CartPole pole falls within 5 steps, whatever the actions: the first sample is
    # the same in both, 5 env steps of 4 agents in each of the 4 sub-envs.
    a, b = ours.sample(), theirs.sample()
    assert chunks(a) == chunks(b)
    assert [(len(e), agent_steps([e])) for e in a] == [(5, 20)] * 4
    # Later samples depend on the actions (the modules differ): both stop at the first
    # vector step that reaches 80 agent steps, so each takes at most 16 more.
    for _ in range(3):
        for runner in (ours, theirs):
            steps = agent_steps(runner.sample())
            assert 80 <= steps < 80 + 16, type(runner).__module__
    # num_timesteps counts agent steps too.
    for runner in (ours, theirs):
        assert 30 <= agent_steps(runner.sample(num_timesteps=30)) < 30 + 16


def test_same_episodes_and_counts_with_agents_that_join_and_leave():
    """One sub-env (RLlib's reset step then counts nothing, like fastrollout's at once)."""
    ours, theirs = runners(SeededLifetimesEnv, 1, {"p_a", "p_b", "p_c"}, rollout_fragment_length=7)
    for kwargs in (
        {"random_actions": True},
        {"random_actions": True},
        {"num_timesteps": 11, "random_actions": True},
        {"random_actions": True},
        {"num_timesteps": 3},
        {"num_timesteps": 25},
        {},
    ):
        a, b = ours.sample(**kwargs), theirs.sample(**kwargs)
        assert chunks(a) == chunks(b), kwargs
    root = MetricsLogger(root=True)
    root.aggregate([ours.get_metrics()])
    mine, rllib = root.compile(), theirs.get_metrics()
    assert mine["num_env_steps_sampled"] == rllib["num_env_steps_sampled"].peek()
    for key in ("num_agent_steps_sampled", "num_module_steps_sampled"):
        assert mine[key] == {k: v.peek() for k, v in rllib[key].items()}, key
    for key in ("episode_len_mean", "episode_return_mean", "num_episodes"):
        assert mine[key] == pytest.approx(rllib[key].peek()), key


def test_env_steps_stay_the_default():
    runner = fr.MultiAgentEnvRunner(
        config=fr.RunnerConfig()
        .environment(SeededLifetimesEnv)
        .env_runners(num_envs_per_env_runner=2, rollout_fragment_length=4)
        .multi_agent(policies={"p_a", "p_b", "p_c"}, policy_mapping_fn=mapping)
        .debugging(seed=7)
        .resources(device="cpu")
    )
    eps = runner.sample(random_actions=True)
    # 4 env steps in each of the 2 sub-envs (a done sub-env is reset at once).
    assert sum(len(e) for e in eps) == 8
