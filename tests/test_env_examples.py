"""The test environments in fastrollout.env.examples: exact schedules and returns."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from fastrollout import MultiAgentEpisode
from fastrollout.env import check_env, create_env
from fastrollout.env.examples import (
    CrashingEnv,
    CrashingMultiAgentEnv,
    EnvCrash,
    HangingRewardsEnv,
    JoinLeaveEnv,
    StatelessCartPole,
    SyntheticImageEnv,
    TurnBasedEnv,
)


def _play(env: Any, policy: Any) -> tuple[list[Any], dict[Any, float], MultiAgentEpisode]:
    """Runs one episode, recording it; returns per-step observing agents, returns, episode."""
    obs, infos = env.reset()
    episode = MultiAgentEpisode()
    episode.add_env_reset(observations=obs, infos=infos)
    observers = [sorted(obs)]
    returns: dict[Any, float] = {}
    terminated: dict[Any, bool] = {}
    while True:
        actions = {a: policy(a, o) for a, o in obs.items() if not terminated.get(a)}
        obs, rewards, terminated, truncated, infos = env.step(actions)
        episode.add_env_step(
            observations=obs,
            actions=actions,
            rewards=rewards,
            infos=infos,
            terminateds=terminated,
            truncateds=truncated,
        )
        observers.append(sorted(obs))
        for agent, r in rewards.items():
            returns[agent] = returns.get(agent, 0.0) + r
        if terminated["__all__"] or truncated["__all__"]:
            return observers, returns, episode


def test_turn_based_only_mover_observes_and_returns_are_exact() -> None:
    env = TurnBasedEnv({"num_turns": 6})
    check_env(env)
    observers, returns, episode = _play(env, lambda agent, obs: int(obs[0] // 2) % 2)
    # Always the right action: 1.0 per own turn, -0.25 per opponent turn (but the first).
    assert returns == {"player_0": 3 * 1.0 - 3 * 0.25, "player_1": 3 * 1.0 - 2 * 0.25}
    assert observers == [["player_0"], ["player_1"], ["player_0"], ["player_1"], ["player_0"],
                         ["player_1"], ["player_0", "player_1"]]  # fmt: skip
    assert episode.is_terminated
    assert episode.get_return() == returns["player_0"] + returns["player_1"]
    for agent, ret in returns.items():
        assert sum(episode.agent_episodes[agent].get_rewards()) == ret


def test_turn_based_observation_and_wrong_inputs() -> None:
    env = TurnBasedEnv()
    obs, _ = env.reset()
    np.testing.assert_array_equal(obs["player_0"], [0.0, -1.0, -1.0])
    obs, rewards, *_ = env.step({"player_0": 1})
    np.testing.assert_array_equal(obs["player_1"], [1.0, -1.0, 1.0])
    assert rewards == {"player_0": 0.0}
    obs, rewards, *_ = env.step({"player_1": 0})
    assert rewards == {"player_1": 1.0, "player_0": -0.25}
    with pytest.raises(
        ValueError, match=r"turn 2 belongs to 'player_0'; got actions for \['player_1'\]"
    ):
        env.step({"player_1": 0})
    with pytest.raises(ValueError, match="action of 'player_0' must be 0 or 1, got 2"):
        env.step({"player_0": 2})
    env = TurnBasedEnv({"num_turns": 1})
    env.reset()
    env.step({"player_0": 0})
    with pytest.raises(ValueError, match="after the game ended"):
        env.step({"player_1": 0})
    with pytest.raises(ValueError, match=r"config\['num_turns'\] must be an int >= 1, got 0"):
        TurnBasedEnv({"num_turns": 0})


def test_join_leave_schedule_and_returns() -> None:
    env = JoinLeaveEnv({"num_agents": 3, "lifetime": 3, "stagger": 2})
    check_env(env)
    observers, returns, episode = _play(env, lambda agent, obs: 1 if agent == "agent_1" else 0)
    assert observers == [
        ["agent_0"],
        ["agent_0"],
        ["agent_0", "agent_1"],
        ["agent_0", "agent_1"],  # agent_0's last observation (terminated)
        ["agent_1", "agent_2"],
        ["agent_1", "agent_2"],
        ["agent_2"],
        ["agent_2"],
    ]
    assert returns == {"agent_0": 3.0, "agent_1": 6.0, "agent_2": 3.0}
    assert episode.is_terminated and len(episode) == 7
    assert episode.agent_episodes["agent_2"].t_started == 0
    assert len(episode.agent_episodes["agent_2"]) == 3


def test_join_leave_errors() -> None:
    env = JoinLeaveEnv()
    env.reset()
    with pytest.raises(ValueError, match=r"expected actions for \['agent_0'\], got \[\]"):
        env.step({})
    with pytest.raises(ValueError, match=r"stagger \(5\) must be <= lifetime \(4\)"):
        JoinLeaveEnv({"stagger": 5})
    env = JoinLeaveEnv({"num_agents": 1, "lifetime": 1, "stagger": 1})
    env.reset()
    env.step({"agent_0": 0})
    with pytest.raises(ValueError, match="no live agent"):
        env.step({})


def test_hanging_rewards_add_up_while_waiting() -> None:
    env = HangingRewardsEnv({"period": 3, "episode_len": 7})
    check_env(env)
    observers, returns, episode = _play(env, lambda agent, obs: 0)
    slow_steps = [i for i, agents in enumerate(observers) if "slow" in agents]
    assert slow_steps == [0, 3, 6, 7]
    assert returns == {"fast": 7.0, "slow": 0.5 * 7 * 8 / 2}
    slow = episode.agent_episodes["slow"]
    # slow's rewards are the sums over the steps it waited.
    assert slow.get_rewards() == [0.5 * (1 + 2 + 3), 0.5 * (4 + 5 + 6), 0.5 * 7]
    env2 = HangingRewardsEnv({"episode_len": 1})
    env2.reset()
    with pytest.raises(
        ValueError, match=r"expected actions for \['fast', 'slow'\], got \['fast'\]"
    ):
        env2.step({"fast": 0})
    env2.step({"fast": 0, "slow": 0})
    with pytest.raises(ValueError, match="after the episode ended"):
        env2.step({"fast": 0})


def test_synthetic_image_env() -> None:
    env = create_env(SyntheticImageEnv, {"episode_len": 5})
    assert env.observation_space == gym.spaces.Box(0, 255, (84, 84, 4), np.uint8)
    obs, _ = env.reset(seed=1)
    assert obs.shape == (84, 84, 4) and obs.dtype == np.uint8
    again, _ = SyntheticImageEnv().reset(seed=1)
    np.testing.assert_array_equal(obs, again)
    other, _ = SyntheticImageEnv().reset(seed=2)
    assert not np.array_equal(obs, other)
    rewards, truncated = [], False
    for t in range(5):
        obs, r, terminated, truncated, _ = env.step(t % 4 if t != 2 else 0)
        rewards.append(r)
        assert not terminated
    assert rewards == [1.0, 1.0, 0.0, 1.0, 1.0] and truncated
    small = SyntheticImageEnv({"shape": (2, 3), "num_actions": 2})
    assert small.reset()[0].shape == (2, 3) and small.action_space.n == 2


def test_crashing_env_schedule_tags_and_inner_state() -> None:
    env = CrashingEnv(gym.make("CartPole-v1"), crash_on_reset=[2], crash_on_step=[2, 4])
    _, info = env.reset(seed=0)
    assert info["env_instance"] == env.instance_id
    assert env.step(0)[4]["env_instance"] == env.instance_id
    with pytest.raises(EnvCrash, match=r"step\(\) call 2"):
        env.step(0)
    env.step(0)
    assert env.env._elapsed_steps == 2  # the crashed call did not step the inner env
    with pytest.raises(EnvCrash, match=r"step\(\) call 4"):
        env.step(0)
    with pytest.raises(EnvCrash, match=r"reset\(\) call 2"):
        env.reset()
    env.reset()
    other = CrashingEnv(gym.make("CartPole-v1"))
    assert other.instance_id != env.instance_id
    assert isinstance(EnvCrash("x"), RuntimeError)


def _crash_calls(seed: int) -> list[int]:
    env = CrashingEnv(gym.make("CartPole-v1"), p_crash_step=0.3, seed=seed)
    env.reset(seed=0)
    crashed = []
    for call in range(1, 41):
        try:
            _, _, terminated, truncated, _ = env.step(0)
        except EnvCrash:
            crashed.append(call)
            continue
        if terminated or truncated:
            env.reset()
    return crashed


def test_crashing_env_probability_is_seeded() -> None:
    assert _crash_calls(3) == _crash_calls(3)
    assert _crash_calls(3) != _crash_calls(4)
    assert 3 <= len(_crash_calls(3)) <= 25
    with pytest.raises(ValueError, match=r"p_crash_step must be within \[0, 1\], got 1.5"):
        CrashingEnv(gym.make("CartPole-v1"), p_crash_step=1.5)
    always = CrashingEnv(gym.make("CartPole-v1"), p_crash_reset=1.0)
    with pytest.raises(EnvCrash):
        always.reset()


def test_crashing_multi_agent_env() -> None:
    env = CrashingMultiAgentEnv(TurnBasedEnv({"num_turns": 2}), crash_on_step=[2])
    assert env.possible_agents == ["player_0", "player_1"]
    assert env.get_action_space("player_1") == gym.spaces.Discrete(2)
    _, infos = env.reset()
    assert infos == {"player_0": {"env_instance": env.instance_id}}
    _, _, _, _, infos = env.step({"player_0": 0})
    assert infos["player_1"]["env_instance"] == env.instance_id
    with pytest.raises(EnvCrash):
        env.step({"player_1": 0})
    _, _, terminated, _, infos = env.step({"player_1": 0})  # not stepped by the crash
    assert terminated["__all__"] and env.agents == []
    assert set(infos) == {"player_0", "player_1"}
    assert env.render() is None
    env.close()
    with pytest.raises(ValueError, match="p_crash_reset"):
        CrashingMultiAgentEnv(TurnBasedEnv(), p_crash_reset=-0.1)


def test_stateless_cartpole_is_cartpole_without_velocities():
    """Same seed, same actions: the positions of CartPole-v1's state, the same rewards
    and termination; a truncation at max_episode_steps."""
    env = StatelessCartPole()
    check_env(env)
    ref = gym.make("CartPole-v1").unwrapped
    obs, _ = env.reset(seed=5)
    state, _ = ref.reset(seed=5)
    assert obs.dtype == np.float32 and env.observation_space.contains(obs)
    np.testing.assert_array_equal(obs, state[[0, 2]])
    for t in range(200):
        action = t % 2
        obs, reward, terminated, truncated, _ = env.step(action)
        state, ref_reward, ref_terminated, _, _ = ref.step(action)
        np.testing.assert_array_equal(obs, state[[0, 2]])
        assert (reward, terminated, truncated) == (ref_reward, ref_terminated, False)
        if terminated:
            break
    assert terminated  # alternating pushes do not balance it for 200 steps
    short = StatelessCartPole({"max_episode_steps": 3})
    short.reset(seed=0)
    dones = [short.step(0)[2:4] for _ in range(3)]
    assert dones == [(False, False), (False, False), (False, True)]
