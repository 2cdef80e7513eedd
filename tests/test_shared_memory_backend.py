"""The shared-memory sub-env backend: worker processes that step in the background.

Its faults (a step that raises, a killed worker, a hung one) run in ``test_sub_envs.py``
with the other backends. Here: the episodes against the sync backend's, exactness with
any batch, the settings, the layouts that travel through shared memory or the pipes,
RLlib's config and remote runners, and the native wait.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fastrollout as fr
from fastrollout._core import wait_ready
from fastrollout.env import make_multi_agent
from fastrollout.env.examples import SlowEnv
from fastrollout.runners.sub_envs.shared_memory import SharedMemorySubEnvs, default_num_workers

EPISODE_LEN = 7


def config(env: Any = SlowEnv, n: int = 4, env_config: Any = None, **runners: Any) -> Any:
    return (
        fr.RunnerConfig()
        .environment(
            env,
            env_config={"step_ms": 0, "episode_len": EPISODE_LEN}
            if env_config is None
            else env_config,
        )
        .env_runners(num_envs_per_env_runner=n, **runners)
        .debugging(seed=5)
        .resources(device="cpu")
    )


def shm(**kw: Any) -> dict[str, Any]:
    return {"sub_env_backend": "shared_memory", **kw}


def assert_exact(episodes: list[Any], episode_len: int = EPISODE_LEN) -> None:
    """Each episode's observations come from one sub-env, one step apart, in order."""
    for e in episodes:
        obs = np.asarray(e.get_observations())
        assert (obs[:, 1] == obs[0, 1]).all(), f"an episode mixes sub-envs: {obs[:, 1]}"
        np.testing.assert_allclose(np.diff(obs[:, 0]), 1 / episode_len, atol=1e-6)
        assert len(e.get_actions()) == len(e) == len(e.get_rewards())


def summary(episodes: list[Any]) -> list[tuple[Any, ...]]:
    """What a single-agent episode holds, comparable across runs (ids left out)."""
    return [
        (
            e.t_started,
            np.asarray(e.get_observations()).tobytes(),
            np.asarray(e.get_actions()).tobytes(),
            np.asarray(e.get_rewards()).tobytes(),
            e.is_terminated,
            e.is_truncated,
            np.asarray(e.get_extra_model_outputs("action_logp")).round(5).tobytes(),
        )
        for e in episodes
    ]


def sample_calls(make: Any, calls: list[int]) -> list[list[Any]]:
    """Builds a runner and samples: one runner at a time, as each seeds torch's generator."""
    runner = make()
    try:
        return [runner.sample(num_timesteps=k) for k in calls]
    finally:
        runner.stop()


# -- episodes ------------------------------------------------------------------------------


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(1, 5),
    workers=st.integers(1, 3),
    calls=st.lists(st.integers(1, 40), min_size=1, max_size=3),
)
def test_a_batch_of_all_sub_envs_samples_the_sync_backends_episodes(n, workers, calls):
    """Same seed, same calls: the same episodes as the in-process lockstep backend."""
    env_config = {"step_ms": 0, "episode_len": 9}
    sync = lambda: fr.SingleAgentEnvRunner(config=config(n=n, env_config=env_config))  # noqa: E731
    ours = lambda: fr.SingleAgentEnvRunner(  # noqa: E731
        config=config(
            n=n, env_config=env_config, **shm(num_sub_env_workers=workers, sub_env_batch_size=n)
        )
    )
    for a, b in zip(sample_calls(sync, calls), sample_calls(ours, calls), strict=True):
        assert summary(a) == summary(b)


def test_cartpole_episodes_equal_the_sync_backends_with_a_batch_of_all():
    """An env whose dynamics follow the actions: the draws too are the sync backend's."""
    cartpole = dict(n=3, env_config={})
    sync = lambda: fr.SingleAgentEnvRunner(config=config(**cartpole).environment("CartPole-v1"))  # noqa: E731
    ours = lambda: fr.SingleAgentEnvRunner(  # noqa: E731
        config=config(**cartpole, **shm(sub_env_batch_size=3)).environment(
            "CartPole-v1", env_config={}
        )
    )
    for a, b in zip(sample_calls(sync, [150, 60]), sample_calls(ours, [150, 60]), strict=True):
        assert summary(a) == summary(b)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(2, 6),
    workers=st.integers(1, 3),
    batch=st.integers(1, 6),
    episode_len=st.integers(1, 12),
    step_ms=st.lists(st.sampled_from([0, 0, 1, 2]), min_size=1, max_size=3),
)
def test_any_batch_keeps_every_episode_exact_and_chunks_continue(
    n, workers, batch, episode_len, step_ms
):
    batch = min(batch, n)
    r = fr.SingleAgentEnvRunner(
        config=config(
            n=n,
            env_config={"step_ms": step_ms, "episode_len": episode_len},
            **shm(num_sub_env_workers=workers, sub_env_batch_size=batch),
        )
    )
    try:
        chunks: dict[str, list[Any]] = {}
        for k in (30, 17, 25):
            eps = r.sample(num_timesteps=k)
            assert sum(len(e) for e in eps) >= k
            assert_exact(eps, episode_len)
            for e in eps:
                chunks.setdefault(e.id_, []).append(e)
        # A chunk continues its predecessor: no step lost or doubled across calls.
        for parts in chunks.values():
            for a, b in itertools.pairwise(parts):
                assert b.t_started == a.t_started + len(a)
                np.testing.assert_allclose(b.get_observations(0), a.get_observations(-1), atol=1e-6)
        done = r.sample(num_episodes=3)
        assert len(done) == 3
        assert all(e.is_done and len(e) == episode_len for e in done)
        assert_exact(done, episode_len)
        m = r.get_metrics()
        assert m["num_episodes_lifetime"].peek() >= 3
    finally:
        r.stop()


def test_sleeping_sub_envs_step_at_their_own_speed():
    """One worker per sub-env, a batch of one: the fast sub-envs are not held back."""
    r = fr.SingleAgentEnvRunner(
        config=config(
            n=4,
            env_config={"step_ms": [0, 0, 0, 30], "episode_len": 20},
            **shm(num_sub_env_workers=4, sub_env_batch_size=1),
        )
    )
    try:
        eps = r.sample(num_timesteps=300)
        per_env: dict[int, int] = {}
        for e in eps:
            i = int(e.get_observations(0)[1])
            per_env[i] = per_env.get(i, 0) + len(e)
        # In lockstep each would take 75 steps; the slow one takes far fewer here.
        assert per_env.get(3, 0) * 2 < min(per_env[0], per_env[1], per_env[2]), per_env
    finally:
        r.stop()


def slow_multi_agent(ctx: Any) -> Any:
    return make_multi_agent(lambda c: SlowEnv(c))(ctx)


def multi_agent_summary(episodes: list[Any]) -> list[Any]:
    return [
        (
            e.env_t_started,
            len(e),
            sorted(e.agent_episode_ids),
            summary(list(e.agent_episodes.values())),
        )
        for e in episodes
    ]


@pytest.mark.parametrize("batch", [1, 3])
def test_multi_agent_episodes_are_exact(batch):
    env_config = {"num_agents": 2, "step_ms": [0, 1, 0], "episode_len": EPISODE_LEN}
    r = fr.MultiAgentEnvRunner(
        config=config(
            slow_multi_agent, 3, env_config, **shm(num_sub_env_workers=2, sub_env_batch_size=batch)
        )
    )
    try:
        for _ in range(2):
            eps = r.sample(num_timesteps=40)
            assert sum(len(e) for e in eps) >= 40
            for e in eps:
                assert_exact(list(e.agent_episodes.values()))
        done = r.sample(num_episodes=4)
        assert len(done) == 4 and all(e.is_done and len(e) == EPISODE_LEN for e in done)
    finally:
        r.stop()


def test_multi_agent_episodes_equal_the_list_backends_with_a_batch_of_all():
    env_config = {"num_agents": 2, "step_ms": 0, "episode_len": 5}
    a = lambda: fr.MultiAgentEnvRunner(config=config(slow_multi_agent, 3, env_config))  # noqa: E731
    b = lambda: fr.MultiAgentEnvRunner(  # noqa: E731
        config=config(
            slow_multi_agent, 3, env_config, **shm(num_sub_env_workers=2, sub_env_batch_size=3)
        )
    )
    for x, y in zip(sample_calls(a, [20, 13]), sample_calls(b, [20, 13]), strict=True):
        key = lambda eps: sorted(multi_agent_summary(eps), key=repr)  # noqa: E731
        assert [s[:2] for s in key(x)] == [s[:2] for s in key(y)]
        assert [s[3] for s in key(x)] == [s[3] for s in key(y)]


# -- layouts ---------------------------------------------------------------------------------


class DictObsEnv(gym.Env):
    """Dict observations (a nested layout in the shared block) and Box actions."""

    def __init__(self, config: Any = None) -> None:
        self.observation_space = gym.spaces.Dict(
            {
                "pos": gym.spaces.Box(-10, 10, (2,), np.float32),
                "k": gym.spaces.Discrete(5),
                "pair": gym.spaces.Tuple(
                    (gym.spaces.MultiBinary(3), gym.spaces.Box(0, 1, (), np.float64))
                ),
            }
        )
        self.action_space = gym.spaces.Box(-1, 1, (2,), np.float32)
        self._t = 0

    def _obs(self) -> Any:
        t = self._t
        return {
            "pos": np.array([t, -t], np.float32) / 10,
            "k": t % 5,
            "pair": (np.array([t % 2, 1, 0], np.int8), np.float64(t / 10)),
        }

    def reset(self, *, seed: Any = None, options: Any = None) -> Any:
        super().reset(seed=seed)
        self._t = 0
        return self._obs(), {"t": 0}

    def step(self, action: Any) -> Any:
        assert np.shape(action) == (2,)
        self._t += 1
        return self._obs(), float(np.sum(action)), False, self._t >= 6, {"t": self._t}


def test_nested_observations_and_box_actions_travel_through_the_block():
    base = fr.RunnerConfig().environment(DictObsEnv).env_runners(num_envs_per_env_runner=2)
    base = base.debugging(seed=1).resources(device="cpu")
    sync = lambda: fr.SingleAgentEnvRunner(config=base)  # noqa: E731
    ours = lambda: fr.SingleAgentEnvRunner(  # noqa: E731
        config=base.copy().env_runners(**shm(sub_env_batch_size=2))
    )
    a, b = sample_calls(sync, [20]), sample_calls(ours, [20])
    for x, y in zip(a[0], b[0], strict=True):
        assert x.get_infos() == y.get_infos()
        for k in ("pos", "k"):
            np.testing.assert_array_equal(x.get_observations()[k], y.get_observations()[k])
        np.testing.assert_array_equal(
            x.get_observations()["pair"][0], y.get_observations()["pair"][0]
        )
        np.testing.assert_array_equal(x.get_actions(), y.get_actions())
        np.testing.assert_array_equal(x.get_rewards(), y.get_rewards())


class TextObsEnv(gym.Env):
    """Observations no shared array can hold."""

    observation_space = gym.spaces.Text(8)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, config: Any = None) -> None:
        pass

    def reset(self, *, seed: Any = None, options: Any = None) -> Any:
        return "a", {}

    def step(self, action: Any) -> Any:
        return "b", 0.0, False, False, {}


def test_observations_without_a_numeric_layout_are_refused_by_name():
    c = fr.RunnerConfig().environment(TextObsEnv, disable_env_checking=True)
    with pytest.raises(TypeError, match=r"shared_memory' needs observations of numeric .* Text"):
        fr.SingleAgentEnvRunner(config=c.env_runners(num_envs_per_env_runner=2, **shm()))


class WrongShapeEnv(SlowEnv):
    def step(self, action: Any) -> Any:
        obs, *rest = super().step(action)
        return (obs[:1] if self._t == 3 else obs), *rest


def test_an_observation_of_the_wrong_shape_names_its_sub_env():
    r = fr.SingleAgentEnvRunner(config=config(WrongShapeEnv, 2, **shm()))
    try:
        with pytest.raises(
            fr.SpaceMismatchError,
            match=r"sub-env \d returned an observation .*: \(1,\), expected \(2,\)",
        ):
            r.sample(num_timesteps=20)
    finally:
        r.stop()


# -- settings --------------------------------------------------------------------------------


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match="num_sub_env_workers"):
        fr.RunnerConfig().env_runners(num_sub_env_workers=0)
    with pytest.raises(ValueError, match="sub_env_batch_size"):
        fr.RunnerConfig().env_runners(sub_env_batch_size=0)
    with pytest.raises(TypeError, match="sub_env_batch_size"):
        fr.RunnerConfig().env_runners(sub_env_batch_size=1.5)
    with pytest.raises(ValueError, match="sub_env_backend must be one of"):
        fr.RunnerConfig().env_runners(sub_env_backend="threads")
    with pytest.raises(ValueError, match=r"sub_env_batch_size must be between 1 and .*=2\), got 3"):
        fr.SingleAgentEnvRunner(config=config(n=2, **shm(sub_env_batch_size=3)))
    with pytest.raises(ValueError, match="remote_worker_envs"):
        fr.SingleAgentEnvRunner(config=config(n=2, remote_worker_envs=True, **shm()))


def test_defaults_need_no_tuning():
    r = fr.SingleAgentEnvRunner(config=config(n=5, **shm()))
    try:
        env = r.env
        assert isinstance(env, SharedMemorySubEnvs)
        assert env.batch_size == 3  # half of 5, rounded up
        assert env.num_workers == default_num_workers(5)
        cores = len(os.sched_getaffinity(0))
        assert default_num_workers(5) == max(1, min(cores - 1, 5))
        assert default_num_workers(1) == 1
        assert env.single_observation_space == SlowEnv().observation_space
    finally:
        r.stop()


def test_stop_ends_the_workers_and_frees_the_block():
    r = fr.SingleAgentEnvRunner(config=config(n=3, **shm(num_sub_env_workers=3)))
    r.sample(num_timesteps=10)
    processes = [w.process for w in r.env._workers]
    name = r.env._block.shm.name
    r.stop()
    assert not any(p.is_alive() for p in processes)
    with pytest.raises(FileNotFoundError):
        from multiprocessing import shared_memory

        shared_memory.SharedMemory(name=name)


def test_a_sub_env_that_cannot_be_made_fails_the_runner_with_its_error():
    def broken(ctx: Any) -> Any:
        if ctx.vector_index == 1:
            raise OSError("no licence for sub-env 1")
        return SlowEnv(ctx)

    with pytest.raises(OSError, match="no licence for sub-env 1"):
        fr.SingleAgentEnvRunner(config=config(broken, 2, **shm()))


# -- RLlib's config, remote runners ----------------------------------------------------------


def test_an_rllib_config_switches_the_backend_on_with_sub_env_backend():
    pytest.importorskip("ray.rllib")
    from ray.rllib.algorithms.ppo import PPOConfig

    c = (
        PPOConfig()
        .environment("CartPole-v1")
        .env_runners(num_envs_per_env_runner=4, env_runner_cls=fr.SingleAgentEnvRunner)
    )
    fr.sub_env_backend(c, "shared_memory", num_workers=2, batch_size=2)
    # The settings travel with RLlib's copies of the config (to its remote runners).
    c = c.copy(copy_frozen=False)
    assert (c.sub_env_backend, c.num_sub_env_workers, c.sub_env_batch_size) == (
        "shared_memory",
        2,
        2,
    )
    r = fr.SingleAgentEnvRunner(config=c)
    try:
        assert isinstance(r.env, SharedMemorySubEnvs) and r.env.num_workers == 2
        eps = r.sample(num_timesteps=100)
        assert sum(len(e) for e in eps) >= 100
        assert "episode_return_mean" in r.get_metrics()
    finally:
        r.stop()
    with pytest.raises(ValueError, match="sub_env_backend"):
        fr.sub_env_backend(PPOConfig(), "ray")


def test_remote_runners_of_a_group_use_the_backend(ray_local):
    c = config(n=2, **shm(num_sub_env_workers=1)).env_runners(num_env_runners=1)
    group = fr.EnvRunnerGroup(config=c)
    try:
        eps = group.sample(num_timesteps=40)
        assert sum(len(e) for e in eps) >= 40
        assert_exact(eps)
        backends = group.foreach_env_runner(lambda r: type(r.env).__name__, local_env_runner=False)
        assert backends == ["SharedMemorySubEnvs"]
    finally:
        group.stop()


# -- the native wait -------------------------------------------------------------------------


def test_wait_ready_releases_the_gil_and_returns_pipes_as_they_become_ready():
    (r1, w1), (r2, w2) = os.pipe(), os.pipe()
    ticks = []
    stop = threading.Event()

    def ticker() -> None:
        while not stop.is_set():
            ticks.append(1)
            time.sleep(0.001)

    def writer() -> None:
        time.sleep(0.05)
        os.write(w2, b"x")

    threads = [threading.Thread(target=ticker), threading.Thread(target=writer)]
    for t in threads:
        t.start()
    try:
        start = time.monotonic()
        assert wait_ready([r1, r2], [3, 1], 1, 5.0) == [1]
        assert time.monotonic() - start >= 0.04
        # Python threads ran while the wait blocked.
        assert len(ticks) > 10
        # A timeout returns what is ready; a closed pipe counts as ready (a dead worker).
        assert wait_ready([r1, r2], [1, 1], 2, 0.02) == [1]
        os.close(w1)
        assert sorted(wait_ready([r1, r2], [1, 1], 2, 1.0)) == [0, 1]
    finally:
        stop.set()
        for t in threads:
            t.join()
        for fd in (r1, r2, w2):
            os.close(fd)
    with pytest.raises(ValueError, match="2 fds but 1 weights"):
        wait_ready([0, 1], [1], 1)
    with pytest.raises(ValueError, match="timeout_s"):
        wait_ready([], [], 0, -1.0)
