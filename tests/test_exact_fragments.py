"""Exact fragments: each sub-env takes exactly ``rollout_fragment_length`` env steps per call.

``SingleAgentEnvRunner.sample_fragments`` (and the ``RolloutWorker`` under
``truncate_episodes``, as RLlib's old stack) lets every sub-env stop at its own fragment,
whatever its resets, on every backend that can step some of its sub-envs only.
"""

from __future__ import annotations

import itertools
from collections import Counter
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fastrollout as fr


class RandomLengthEnv(gym.Env):
    """Episodes of 1..``max_len`` steps (drawn per episode); obs ``[t, vector_index]``."""

    def __init__(self, config: Any = None) -> None:
        config = config or {}
        self.max_len = int(config.get("max_len", 6))
        self.vector_index = int(getattr(config, "vector_index", 0) or 0)
        self.observation_space = gym.spaces.Box(-1e6, 1e6, (2,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self._t = 0
        self._len = 1

    def _obs(self) -> np.ndarray:
        return np.array([self._t, self.vector_index], np.float32)

    def reset(self, *, seed: Any = None, options: Any = None) -> Any:
        super().reset(seed=seed)
        self._t = 0
        self._len = int(self.np_random.integers(1, self.max_len + 1))
        return self._obs(), {}

    def step(self, action: Any) -> Any:
        self._t += 1
        return self._obs(), 1.0, self._t >= self._len, False, {}


def config(n: int, fragment: int, max_len: int = 6, **runners: Any) -> Any:
    return (
        fr.RunnerConfig()
        .environment(RandomLengthEnv, env_config={"max_len": max_len})
        .env_runners(num_envs_per_env_runner=n, rollout_fragment_length=fragment, **runners)
        .debugging(seed=1)
        .resources(device="cpu")
    )


def per_sub_env(episodes: list[Any]) -> Counter:
    out: Counter = Counter()
    for e in episodes:
        out[int(e.get_observations(0)[1])] += len(e)
    return out


def check_chunks(calls: list[list[Any]]) -> None:
    """Every episode is one sub-env's steps in order; chunks continue their predecessors."""
    parts: dict[str, list[Any]] = {}
    for eps in calls:
        for e in eps:
            obs = np.asarray(e.get_observations())
            assert (obs[:, 1] == obs[0, 1]).all()
            np.testing.assert_array_equal(np.diff(obs[:, 0]), 1)
            parts.setdefault(e.id_, []).append(e)
    for chunks in parts.values():
        for a, b in itertools.pairwise(chunks):
            assert b.t_started == a.t_started + len(a)


BACKENDS = {
    "sync": {},
    "shared_memory": {"sub_env_backend": "shared_memory", "num_sub_env_workers": 2},
}


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(1, 4),
    fragment=st.integers(1, 12),
    max_len=st.integers(1, 9),
    backend=st.sampled_from(list(BACKENDS)),
)
def test_each_sub_env_takes_exactly_its_fragment(n, fragment, max_len, backend):
    r = fr.SingleAgentEnvRunner(config=config(n, fragment, max_len, **BACKENDS[backend]))
    try:
        calls = []
        for _ in range(4):
            eps = r.sample_fragments()
            assert sum(len(e) for e in eps) == n * fragment
            assert per_sub_env(eps) == dict.fromkeys(range(n), fragment)
            calls.append(eps)
        check_chunks(calls)
        # A plain sample() after them acts for every sub-env again.
        assert sum(len(e) for e in r.sample(num_timesteps=3 * n)) >= 3 * n
    finally:
        r.stop()


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 4), fragment=st.integers(1, 20), max_len=st.integers(1, 9))
def test_rollout_worker_batches_hold_exactly_fragment_times_envs(n, fragment, max_len):
    c = config(n, fragment, max_len)
    worker = fr.RolloutWorker(env_creator=lambda ctx: RandomLengthEnv(ctx), config=c)
    try:
        for _ in range(3):
            assert worker.sample().env_steps() == n * fragment
    finally:
        worker.stop()


def test_sub_envs_that_step_only_together_are_refused_by_name():
    r = fr.SingleAgentEnvRunner(config=config(2, 5, gym_env_vectorize_mode="async"))
    try:
        with pytest.raises(ValueError, match="steps all its sub-envs together"):
            r.sample_fragments()
        with pytest.raises(ValueError, match="at least 1"):
            fr.SingleAgentEnvRunner.sample_fragments(r, 0)
    finally:
        r.stop()


def test_restarted_sub_envs_still_take_exactly_their_fragment():
    from fastrollout.env.examples import CrashingEnv

    def crashy(ctx: Any) -> Any:
        return CrashingEnv(RandomLengthEnv(ctx), p_crash_step=0.05, seed=ctx.vector_index)

    c = (
        fr.RunnerConfig()
        .environment(crashy, env_config={"max_len": 5}, disable_env_checking=True)
        .env_runners(num_envs_per_env_runner=3, rollout_fragment_length=10)
        .fault_tolerance(
            restart_failed_sub_environments=True, max_sub_environment_restart_attempts=10
        )
        .resources(device="cpu")
    )
    r = fr.SingleAgentEnvRunner(config=c)
    try:
        for _ in range(5):
            eps = r.sample_fragments()
            assert per_sub_env(eps) == {0: 10, 1: 10, 2: 10}
        assert r.get_metrics()["num_env_restarts_lifetime"].peek() > 0
    finally:
        r.stop()
