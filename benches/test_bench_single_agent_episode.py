"""SingleAgentEpisode side by side with RLlib 2.60: add_env_step + cut + to_numpy.

Run with ``make bench-python``. Each benchmark records one 200-step CartPole-shaped
episode chunk (float32[4] observations, Discrete(2) actions, float rewards, one extra model
output), cuts it with look-back 1 as a runner does at a rollout boundary, and turns the
finished chunk to numpy.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from ray.rllib.env.single_agent_episode import SingleAgentEpisode as RLlibEpisode

from fastrollout import SingleAgentEpisode

STEPS = 200
OBS_SPACE = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
ACT_SPACE = gym.spaces.Discrete(2)
IMG_SPACE = gym.spaces.Box(0, 255, (84, 84, 4), np.uint8)

IMPLS = {"rllib": RLlibEpisode, "fastrollout": SingleAgentEpisode}


def _data(space: gym.Space, n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    if space.dtype == np.uint8:
        return [rng.integers(0, 255, space.shape, np.uint8) for _ in range(n)]
    return [rng.standard_normal(space.shape).astype(space.dtype) for _ in range(n)]


def _record(cls, space, obs):
    ep = cls(observation_space=space, action_space=ACT_SPACE)
    ep.add_env_reset(obs[0])
    for t in range(1, STEPS + 1):
        ep.add_env_step(obs[t], t & 1, 1.0, extra_model_outputs={"action_logp": np.float32(-0.69)})
    successor = ep.cut(len_lookback_buffer=1)
    ep.to_numpy()
    return ep, successor


@pytest.mark.parametrize("impl", list(IMPLS))
@pytest.mark.benchmark(group="episode add_env_step x200 + cut + to_numpy (cartpole)")
def test_cartpole_chunk(benchmark, impl):
    obs = _data(OBS_SPACE, STEPS + 1)
    ep, _ = benchmark(_record, IMPLS[impl], OBS_SPACE, obs)
    assert len(ep) == STEPS and ep.is_numpy


@pytest.mark.parametrize("impl", list(IMPLS))
@pytest.mark.benchmark(group="episode add_env_step x200 + cut + to_numpy (84x84x4 uint8)")
def test_image_chunk(benchmark, impl):
    obs = _data(IMG_SPACE, STEPS + 1)
    ep, _ = benchmark(_record, IMPLS[impl], IMG_SPACE, obs)
    assert ep.get_observations().shape == (STEPS + 1, 84, 84, 4)


@pytest.mark.parametrize("impl", list(IMPLS))
@pytest.mark.benchmark(group="episode add_env_step (single call)")
def test_add_env_step(benchmark, impl):
    obs = _data(OBS_SPACE, 2)
    ep = IMPLS[impl](observation_space=OBS_SPACE, action_space=ACT_SPACE)
    ep.add_env_reset(obs[0])
    extra = {"action_logp": np.float32(-0.69)}

    def step():
        ep.add_env_step(obs[1], 1, 1.0, extra_model_outputs=extra)

    benchmark(step)


@pytest.mark.parametrize("impl", list(IMPLS))
@pytest.mark.benchmark(group="episode get_observations after to_numpy")
def test_read_after_to_numpy(benchmark, impl):
    ep, _ = _record(IMPLS[impl], OBS_SPACE, _data(OBS_SPACE, STEPS + 1))
    out = benchmark(ep.get_observations, slice(-5, None))
    assert out.shape == (5, 4)
