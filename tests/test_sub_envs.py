"""Sub-env backends: remote sub-envs with dynamic batching, and faults on every backend.

Every backend (in-process sync, gymnasium ``AsyncVectorEnv``, the multi-agent list, Ray
actors single- and multi-agent) runs through the runners' one loop. ``SlowEnv``'s
observation names its sub-env and step, so the tests check that every episode's steps come
from one sub-env, in order, whatever the interleaving.
"""

from __future__ import annotations

import itertools
import os
import pathlib
import signal
import sys
import time
from collections import Counter
from typing import Any

import numpy as np
import pytest

import fastrollout as fr
from fastrollout.env import make_multi_agent
from fastrollout.env.examples import CrashingEnv, EnvCrash, SlowEnv

EPISODE_LEN = 20


@pytest.fixture(scope="module", autouse=True)
def _pickle_this_module_by_value() -> None:
    # The env creators below travel to Ray actors, which cannot import this test module.
    cloudpickle = pytest.importorskip("ray.cloudpickle")
    cloudpickle.register_pickle_by_value(sys.modules[__name__])


def slow_config(step_ms: Any, n: int, **runners: Any) -> fr.RunnerConfig:
    return (
        fr.RunnerConfig()
        .environment(SlowEnv, env_config={"step_ms": step_ms, "episode_len": EPISODE_LEN})
        .env_runners(num_envs_per_env_runner=n, **runners)
        .debugging(seed=3)
        .resources(device="cpu")
    )


def assert_exact(episodes: list[Any]) -> None:
    """Each episode's observations come from one sub-env, one step apart, in order."""
    for e in episodes:
        obs = np.asarray(e.get_observations())
        assert (obs[:, 1] == obs[0, 1]).all(), f"an episode mixes sub-envs: {obs[:, 1]}"
        np.testing.assert_allclose(np.diff(obs[:, 0]), 1 / EPISODE_LEN, atol=1e-6)
        assert len(e.get_actions()) == len(e) == len(e.get_rewards())


def steps(episodes: list[Any]) -> int:
    return sum(len(e) for e in episodes)


# -- remote sub-envs -------------------------------------------------------------------


@pytest.mark.parametrize("wait_ms", [0, 3])
def test_remote_single_agent_episodes_are_exact_and_counts_hold(ray_local, wait_ms):
    r = fr.SingleAgentEnvRunner(
        config=slow_config(
            [0, 1, 2, 4], 4, remote_worker_envs=True, remote_env_batch_wait_ms=wait_ms
        )
    )
    try:
        assert r.env.num_envs == 4 and len(r.env.get_sub_environments()) == 4
        chunks: dict[str, list[Any]] = {}
        for _ in range(3):
            eps = r.sample(num_timesteps=150)
            assert steps(eps) >= 150
            assert_exact(eps)
            for e in eps:
                chunks.setdefault(e.id_, []).append(e)
        # Chunks of one episode continue one another: the in-flight steps at a call's
        # end are recorded in the next call, none lost.
        for parts in chunks.values():
            for a, b in itertools.pairwise(parts):
                assert b.t_started == a.t_started + len(a)
                assert b.get_observations(0)[0] == pytest.approx(
                    a.get_observations(-1)[0], abs=1e-6
                )
        done = r.sample(num_episodes=5)
        assert len(done) == 5 and all(e.is_done and len(e) == EPISODE_LEN for e in done)
        assert_exact(done)
    finally:
        r.stop()


def test_remote_sub_envs_step_at_their_own_speed(ray_local):
    """The fast sub-envs are not held back by the slow one (dynamic batching)."""
    r = fr.SingleAgentEnvRunner(
        config=slow_config([0, 0, 0, 40], 4, remote_worker_envs=True, remote_env_batch_wait_ms=0)
    )
    try:
        eps = r.sample(num_timesteps=300)
        per_env = Counter()
        for e in eps:
            per_env[int(e.get_observations(0)[1])] += len(e)
        # In lockstep each sub-env would take 75 steps; here the slow one takes far fewer.
        assert per_env[3] * 2 < min(per_env[0], per_env[1], per_env[2]), per_env
    finally:
        r.stop()


def slow_multi_agent(ctx: Any) -> Any:
    return make_multi_agent(lambda c: SlowEnv(c))(ctx)


def test_remote_multi_agent_episodes_are_exact(ray_local):
    c = (
        fr.RunnerConfig()
        .environment(
            slow_multi_agent,
            env_config={"num_agents": 2, "step_ms": [0, 1, 3], "episode_len": EPISODE_LEN},
        )
        .env_runners(num_envs_per_env_runner=3, remote_worker_envs=True)
        .debugging(seed=1)
        .resources(device="cpu")
    )
    r = fr.MultiAgentEnvRunner(config=c)
    try:
        for _ in range(2):
            eps = r.sample(num_timesteps=100)
            assert sum(len(e) for e in eps) >= 100
            for e in eps:
                assert_exact(list(e.agent_episodes.values()))
        done = r.sample(num_episodes=4)
        assert len(done) == 4 and all(e.is_done for e in done)
        assert all(len(e) == EPISODE_LEN for e in done)
    finally:
        r.stop()


def test_remote_sub_envs_need_ray_named_in_the_error(monkeypatch):
    import fastrollout.runners.ray_host as host

    def no_ray(feature: str) -> Any:
        raise ImportError(f"{feature} needs ray: pip install 'fastrollout[ray]'")

    monkeypatch.setattr(host, "require_ray", no_ray)
    with pytest.raises(ImportError, match=r"remote_worker_envs needs ray.*fastrollout\[ray\]"):
        fr.SingleAgentEnvRunner(config=slow_config(0, 2, remote_worker_envs=True))


def test_config_checks_the_remote_settings():
    with pytest.raises(TypeError, match="remote_worker_envs"):
        fr.RunnerConfig().env_runners(remote_worker_envs=1)
    with pytest.raises(ValueError, match="remote_env_batch_wait_ms"):
        fr.RunnerConfig().env_runners(remote_env_batch_wait_ms=-1)
    with pytest.raises(ValueError, match="sub_env_step_timeout_s"):
        fr.RunnerConfig().fault_tolerance(sub_env_step_timeout_s=-0.5)
    c = fr.RunnerConfig().env_runners(remote_worker_envs=True, remote_env_batch_wait_ms=5)
    assert (c.remote_worker_envs, c.remote_env_batch_wait_ms) == (True, 5)


# -- faults, on every backend -------------------------------------------------------------


def crashy(ctx: Any) -> Any:
    """SlowEnv whose steps raise with probability 2%; every fifth instance made raises in
    the env check's step (so a recreated sub-env's check fails now and then).

    Instances are numbered through files in ``ctx["instances"]`` (they are made in other
    processes too), which also seeds each one's crashes.
    """
    folder = pathlib.Path(ctx["instances"])
    k = len(list(folder.iterdir()))
    (folder / f"{k}-{os.getpid()}-{time.monotonic_ns()}").touch()
    return CrashingEnv(
        SlowEnv(ctx),
        p_crash_step=ctx.get("p_crash", 0.02),
        crash_on_step=[1] if k % 5 == 4 else [],
        seed=k,
    )


def crashy_multi_agent(ctx: Any) -> Any:
    return make_multi_agent(crashy)(ctx)


BACKENDS = {
    "sync": {},
    "async": {"gym_env_vectorize_mode": "async"},
    "remote": {"remote_worker_envs": True},
    "shared_memory": {"sub_env_backend": "shared_memory", "num_sub_env_workers": 2},
}


def crash_config(
    env: Any, n: int, folder: Any = None, p_crash: float = 0.02, **runners: Any
) -> fr.RunnerConfig:
    env_config = {"step_ms": 0, "episode_len": EPISODE_LEN, "num_agents": 2, "p_crash": p_crash}
    if folder is not None:
        env_config["instances"] = str(folder)
    return (
        fr.RunnerConfig()
        .environment(env, env_config=env_config)
        .env_runners(num_envs_per_env_runner=n, **runners)
        .fault_tolerance(
            restart_failed_sub_environments=True, max_sub_environment_restart_attempts=10
        )
        .resources(device="cpu")
    )


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_single_agent_crashes_restart_one_sub_env_and_keep_the_counts(request, tmp_path, backend):
    if backend == "remote":
        request.getfixturevalue("ray_local")
    # Each recreated actor is a new process (which imports torch): seconds on a small
    # machine; fewer crashes there.
    p_crash, calls, per_call = (0.01, 2, 100) if backend == "remote" else (0.02, 5, 200)
    c = crash_config(crashy, 3, tmp_path, p_crash, **BACKENDS[backend])
    r = fr.SingleAgentEnvRunner(config=c)
    try:
        total = 0
        for _ in range(calls):
            eps = r.sample(num_timesteps=per_call)
            # Dropped episodes' steps do not count: each call has what it asked for.
            assert per_call <= steps(eps) < per_call + 3
            assert_exact(eps)
            for e in eps:
                instances = {i.get("env_instance") for i in e.get_infos()} - {None}
                assert len(instances) <= 1, "an episode mixes two env instances"
            total += steps(eps)
        m = r.get_metrics()
        assert m["num_env_step_failures_lifetime"].peek() > 0
        assert m["num_env_restarts_lifetime"].peek() > 0
        assert total >= calls * per_call
        # Instances 4, 9, ... failed their env check: one more attempt each, not fatal.
        if backend != "remote":
            assert len(list(tmp_path.iterdir())) >= 5
    finally:
        r.stop()


@pytest.mark.parametrize("backend", ["list", "remote", "shared_memory"])
def test_multi_agent_crashes_restart_one_sub_env_and_keep_the_counts(request, tmp_path, backend):
    runners = BACKENDS.get(backend, {})
    if backend == "remote":
        request.getfixturevalue("ray_local")
    c = crash_config(crashy_multi_agent, 2, tmp_path, 0.01 if runners else 0.02, **runners)
    r = fr.MultiAgentEnvRunner(config=c)
    try:
        for _ in range(2):
            eps = r.sample(num_timesteps=100)
            assert 100 <= sum(len(e) for e in eps) < 100 + 2
            for e in eps:
                assert_exact(list(e.agent_episodes.values()))
        assert r.get_metrics()["num_env_restarts_lifetime"].peek() > 0
    finally:
        r.stop()


def test_without_restarts_a_crash_raises_the_sub_envs_error(tmp_path):
    c = crash_config(crashy, 2, tmp_path).fault_tolerance(restart_failed_sub_environments=False)
    r = fr.SingleAgentEnvRunner(config=c)
    try:
        with pytest.raises(EnvCrash):
            for _ in range(20):
                r.sample(num_timesteps=100)
    finally:
        r.stop()


def never_steps(ctx: Any) -> Any:
    return CrashingEnv(SlowEnv(ctx), crash_on_step=range(1, 10**4))


def test_restarts_give_up_after_the_attempts_in_a_row():
    c = crash_config(never_steps, 2).fault_tolerance(max_sub_environment_restart_attempts=3)
    r = fr.SingleAgentEnvRunner(config=c.environment(disable_env_checking=True))
    try:
        with pytest.raises(EnvCrash) as info:
            r.sample(num_timesteps=200)
        assert "failed 4 times in a row (max_sub_environment_restart_attempts=3)" in str(
            info.value.__notes__
        )
    finally:
        r.stop()


@pytest.mark.parametrize("dead_before_the_step", [False, True])
def test_a_killed_async_worker_is_replaced_alone(dead_before_the_step):
    """Killed while the runner waits, or already gone when the next step is sent (the
    send then fails on the closed pipe, which is that sub-env's failure, not the runner's)."""
    r = fr.SingleAgentEnvRunner(config=crash_config(SlowEnv, 3, gym_env_vectorize_mode="async"))
    try:
        first = r.sample(num_timesteps=30)
        pid = r.env.processes[1].pid
        os.kill(pid, signal.SIGKILL)
        if dead_before_the_step:
            r.env.processes[1].join(timeout=10)
            assert not r.env.processes[1].is_alive()
        second = r.sample(num_timesteps=60)
        assert steps(second) >= 60
        assert_exact(second)
        assert r.env.processes[1].pid != pid and r.env.processes[0].is_alive()
        # Sub-envs 0 and 2 continued their episodes; sub-env 1's was dropped.
        kept = {e.id_ for e in first} & {e.id_ for e in second}
        assert len(kept) == 2
    finally:
        r.stop()


def test_a_killed_shared_memory_worker_fails_only_its_sub_envs():
    runners = {"sub_env_backend": "shared_memory", "num_sub_env_workers": 2}
    r = fr.SingleAgentEnvRunner(config=crash_config(SlowEnv, 4, **runners))
    try:
        first = r.sample(num_timesteps=40)
        workers = r.env._workers
        victim, other = workers[1].process, workers[0].process
        os.kill(victim.pid, signal.SIGKILL)
        second = r.sample(num_timesteps=80)
        assert steps(second) >= 80
        assert_exact(second)
        assert workers[1].process.pid != victim.pid and workers[0].process is other
        # Worker 0's sub-envs (0 and 1) continued their episodes; worker 1's were dropped.
        kept = {e.id_ for e in first} & {e.id_ for e in second}
        assert len(kept) == 2
        assert r.get_metrics()["num_env_restarts_lifetime"].peek() == 2
    finally:
        r.stop()


def test_a_killed_remote_sub_env_is_replaced_alone(ray_local):
    r = fr.SingleAgentEnvRunner(config=crash_config(SlowEnv, 3, remote_worker_envs=True))
    try:
        first = r.sample(num_timesteps=30)
        victim = r.env.get_sub_environments()[1]
        ray_local.kill(victim, no_restart=True)
        second = r.sample(num_timesteps=60)
        assert steps(second) >= 60
        assert_exact(second)
        assert r.env.get_sub_environments()[1] != victim
        kept = {e.id_ for e in first} & {e.id_ for e in second}
        assert len(kept) >= 1
        assert r.get_metrics()["num_env_restarts_lifetime"].peek() == 1
    finally:
        r.stop()


class HangsOnce(SlowEnv):
    """Sub-env 1's first instance hangs on its 5th step (a marker file remembers it)."""

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self._marker = pathlib.Path(config["marker"])
        self._n = 0

    def step(self, action: Any) -> Any:
        self._n += 1
        if self.vector_index == 1 and self._n == 5 and not self._marker.exists():
            self._marker.write_text("hung")
            time.sleep(60)
        return super().step(action)


@pytest.mark.parametrize("backend", ["async", "remote", "shared_memory"])
def test_a_hung_sub_env_times_out_and_is_replaced(request, tmp_path, backend):
    if backend == "remote":
        request.getfixturevalue("ray_local")
    runners = BACKENDS[backend]
    c = (
        crash_config(HangsOnce, 2, **runners)
        .environment(
            HangsOnce,
            # Steps of 20 ms: the other sub-env alone takes longer than the timeout to
            # make the call's steps (remote sub-envs are not held back by the hung one).
            env_config={"step_ms": 20, "episode_len": EPISODE_LEN, "marker": str(tmp_path / "m")},
            disable_env_checking=True,
        )
        .fault_tolerance(sub_env_step_timeout_s=1.0)
    )
    r = fr.SingleAgentEnvRunner(config=c)
    try:
        start = time.monotonic()
        eps = r.sample(num_timesteps=100)
        assert time.monotonic() - start < 30
        assert steps(eps) >= 100
        assert_exact(eps)
        assert (tmp_path / "m").exists()
        assert r.get_metrics()["num_env_restarts_lifetime"].peek() == 1
    finally:
        r.stop()


def test_a_hung_remote_sub_env_without_restarts_raises_a_timeout(ray_local, tmp_path):
    c = slow_config(0, 2, remote_worker_envs=True).environment(
        HangsOnce,
        env_config={"step_ms": 20, "episode_len": EPISODE_LEN, "marker": str(tmp_path / "m")},
        disable_env_checking=True,
    )
    r = fr.SingleAgentEnvRunner(config=c.fault_tolerance(sub_env_step_timeout_s=0.5))
    try:
        with pytest.raises(TimeoutError, match=r"sub-env 1: its step took longer than 0\.5 s"):
            r.sample(num_timesteps=200)
    finally:
        r.stop()


_FIRST_CREATIONS_FAIL = itertools.count()


def _fails_twice_then_cartpole(ctx: Any) -> Any:
    import gymnasium as gym

    if next(_FIRST_CREATIONS_FAIL) < 2:
        raise OSError("the simulator's licence server did not answer")
    return gym.make("CartPole-v1")


def test_sub_envs_that_fail_to_be_created_are_made_again_with_restarts() -> None:
    """A first creation failure counts as a failed attempt, as a recreation's does."""
    global _FIRST_CREATIONS_FAIL
    base = fr.RunnerConfig().environment(_fails_twice_then_cartpole)
    _FIRST_CREATIONS_FAIL = itertools.count()
    with pytest.raises(OSError, match="licence server"):
        fr.SingleAgentEnvRunner(config=base)
    _FIRST_CREATIONS_FAIL = itertools.count()
    runner = fr.SingleAgentEnvRunner(
        config=base.fault_tolerance(restart_failed_sub_environments=True)
    )
    assert runner.sample(num_timesteps=4)
    runner.stop()
    _FIRST_CREATIONS_FAIL = itertools.count()
    with pytest.raises(OSError, match="licence server"):
        fr.SingleAgentEnvRunner(
            config=base.fault_tolerance(
                restart_failed_sub_environments=True, max_sub_environment_restart_attempts=1
            )
        )
