"""fastrollout's runners against RLlib 2.60's on the same envs and seeds."""

from __future__ import annotations

import numpy as np
import pytest

import _runner_envs
import fastrollout as fr
from _runner_envs import LongEnv, SeededLengthEnv, crash_first_sub_env_once
from fastrollout.metrics import MetricsLogger

pytest.importorskip("ray.rllib")

# Keys RLlib's env-to-module pipeline logs about episode lengths that connectors add or
# remove; fastrollout's runner does not log them (its pipeline adds no look-back).
RLLIB_ONLY_KEYS = {"env_to_module_sum_episodes_length_in", "env_to_module_sum_episodes_length_out"}


def rllib_runner(env, n, restart=False, **runners):
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner

    c = PPOConfig().environment(env).env_runners(num_envs_per_env_runner=n, **runners)
    c = c.fault_tolerance(restart_failed_sub_environments=restart)
    return SingleAgentEnvRunner(config=c.debugging(seed=3))


def fr_runner(env, n, restart=False, **runners):
    c = fr.RunnerConfig().environment(env).env_runners(num_envs_per_env_runner=n, **runners)
    c = c.fault_tolerance(restart_failed_sub_environments=restart)
    return fr.SingleAgentEnvRunner(config=c.debugging(seed=3).resources(device="cpu"))


def summary(episodes):
    return [(len(e), e.t_started, bool(e.is_done), float(e.get_return())) for e in episodes]


def test_same_seed_same_episodes_and_metric_keys():
    ours, theirs = (
        fr_runner(SeededLengthEnv, 2, rollout_fragment_length=5),
        rllib_runner(SeededLengthEnv, 2, rollout_fragment_length=5),
    )
    for kwargs in (
        {"num_episodes": 5, "random_actions": True},
        {"num_timesteps": 13, "random_actions": True},
        {"num_timesteps": 9, "random_actions": True},
        {"random_actions": True},
    ):
        a, b = ours.sample(**kwargs), theirs.sample(**kwargs)
        assert summary(a) == summary(b), kwargs
        for x, y in zip(a, b, strict=True):
            np.testing.assert_array_equal(x.get_observations(), y.get_observations())
            np.testing.assert_array_equal(x.get_rewards(), y.get_rewards())
            assert x.get_infos() == y.get_infos()
    mine = ours.get_metrics()
    root = MetricsLogger(root=True)
    root.aggregate([mine])
    compiled = root.compile()
    from ray.rllib.utils.metrics.metrics_logger import MetricsLogger as RLlibMetricsLogger

    rllib_root = RLlibMetricsLogger(root=True)
    rllib_root.aggregate([theirs.get_metrics()])
    rllib = rllib_root.compile()
    assert set(compiled) == set(rllib) - RLLIB_ONLY_KEYS
    for key in ("num_env_steps_sampled", "num_episodes", "episode_len_mean", "episode_return_max"):
        assert compiled[key] == pytest.approx(rllib[key]), key


# RLlib re-registers its env under one name on every make_env (gymnasium warns).
@pytest.mark.filterwarnings("ignore:.*Overriding environment:UserWarning")
def test_a_crash_keeps_the_other_sub_envs_episodes_rllib_drops_them():
    """Ray issue 47608: RLlib recreates all sub-envs and drops every ongoing episode."""
    n = 2
    results = {}
    for name, make in (("fastrollout", fr_runner), ("rllib", rllib_runner)):
        _runner_envs._created[0] = False
        runner = make(crash_first_sub_env_once, n, restart=True, rollout_fragment_length=10)
        LongEnv.steps = 0
        episodes = runner.sample(num_timesteps=20)
        results[name] = (LongEnv.steps, episodes)
    steps, eps = results["fastrollout"]
    # Only the crashed sub-env's 4 steps (before its 5th, failing one) are dropped; the
    # recreated env's check took 1 step that no episode records. The dropped steps do
    # not count: the call still returns the 20 it was asked for. The other sub-env's
    # episode keeps all its 13 steps; the new one (reset on the turn after the crash)
    # has 7.
    assert sum(len(e) for e in eps) == steps - 4 - 1 == 20
    assert sorted((len(e), e.t_started) for e in eps) == [(7, 0), (13, 0)]
    steps, eps = results["rllib"]
    # RLlib starts every episode over: the other sub-env's steps are lost as well.
    assert all(e.t_started == 0 for e in eps)
    assert sum(len(e) for e in eps) < steps - 5


def test_multi_agent_same_seed_same_episodes_on_an_rllib_env():
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.env.multi_agent_env_runner import MultiAgentEnvRunner

    env = _runner_envs.rllib_turn_env_class()

    def mapping(aid, episode, **kwargs):
        return f"p_{aid}"

    theirs = MultiAgentEnvRunner(
        config=PPOConfig()
        .environment(env)
        .env_runners(num_envs_per_env_runner=2, rollout_fragment_length=4)
        .multi_agent(policies={"p_a", "p_b"}, policy_mapping_fn=mapping)
        .debugging(seed=5)
    )
    ours = fr.MultiAgentEnvRunner(
        config=fr.RunnerConfig()
        .environment(env)
        .env_runners(num_envs_per_env_runner=2, rollout_fragment_length=4)
        .multi_agent(policies={"p_a", "p_b"}, policy_mapping_fn=mapping)
        .debugging(seed=5)
        .resources(device="cpu")
    )

    def ma_summary(eps):
        return sorted(
            (
                len(e),
                bool(e.is_done),
                float(e.get_return()),
                tuple(
                    sorted((a, len(x), float(x.get_return())) for a, x in e.agent_episodes.items())
                ),
            )
            for e in eps
        )

    a = ours.sample(num_episodes=5, random_actions=True)
    b = theirs.sample(num_episodes=5, random_actions=True)
    assert ma_summary(a) == ma_summary(b)
    root = MetricsLogger(root=True)
    root.aggregate([ours.get_metrics()])
    mine, rllib = root.compile(), theirs.get_metrics()
    # RLlib's multi-agent runner also counts an episode that ended in the same step as the
    # last one returned, which it then drops (its single-agent runner counts returned ones).
    assert mine["num_episodes"] == len(a) == 5
    assert rllib["num_episodes"].peek() == 6
    for key in ("episode_len_mean", "episode_return_mean", "num_env_steps_sampled"):
        assert mine[key] == pytest.approx(rllib[key].peek()), key
    assert mine["num_agent_steps_sampled"] == {
        k: v.peek() for k, v in rllib["num_agent_steps_sampled"].items()
    }
    assert mine["module_episode_returns_mean"] == pytest.approx(
        {k: v.peek() for k, v in rllib["module_episode_returns_mean"].items()}
    )
