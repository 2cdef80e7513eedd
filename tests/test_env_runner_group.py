"""EnvRunnerGroup: a local runner plus runners in Ray actors (RLlib 2.60's group API).

Without Ray: the import stays Ray-free, a group without remote runners samples locally,
and asking for remote runners without Ray names the extra to install. With Ray (one local
instance per session, ``ray_local``): sampling split over the runners, metrics aggregated
at a root logger, weights sent in one ``ray.put`` with a rising ``weights_seq_no``,
``MeanStdFilter`` states merged exactly, foreach/async calls, and faults: a runner killed
mid-sample, one restarted between calls, a call that times out, a runner gone for good.
Every wait is bounded. The groups are module-scoped: a runner actor costs about 2 s to
start on the 2-core test machine.
"""

from __future__ import annotations

import copy
import math
import pickle
import subprocess
import sys
import threading
import time
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

import fastrollout as fr
from fastrollout.config import RunnerConfig
from fastrollout.connectors.env_to_module.mean_std_filter import MeanStdFilter, RunningStats
from fastrollout.core import DEFAULT_MODULE_ID
from fastrollout.metrics import MetricsLogger
from fastrollout.runners.env_runner_group import EnvRunnerGroup, split_count

EPISODE_LEN = 20
NUM_ENVS = 2


class SleepyEnv(gym.Env):
    """Random float observations, reward 1 per step, ``len`` steps; each step sleeps."""

    def __init__(self, config: Any = None) -> None:
        config = config or {}
        self.sleep = float(config.get("sleep", 0.001))
        self.length = int(config.get("len", EPISODE_LEN))
        self.observation_space = gym.spaces.Box(-10.0, 10.0, (3,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.t = 0

    def reset(self, *, seed: int | None = None, options: Any = None) -> Any:
        super().reset(seed=seed)
        self.t = 0
        return self.np_random.normal(size=3).astype(np.float32), {}

    def step(self, action: Any) -> Any:
        time.sleep(self.sleep)
        self.t += 1
        obs = self.np_random.normal(size=3).astype(np.float32)
        return obs, 1.0, self.t >= self.length, False, {}


def _mean_std(env: Any, spaces: Any = None, device: Any = None) -> Any:
    return MeanStdFilter()


def _config(**env_runners: Any) -> RunnerConfig:
    settings = {
        "num_envs_per_env_runner": NUM_ENVS,
        "rollout_fragment_length": 10,
        "env_to_module_connector": _mean_std,
        **env_runners,
    }
    return (
        RunnerConfig()
        .environment(SleepyEnv, env_config={"sleep": 0.001})
        .env_runners(**settings)
        .rl_module(model_config={"fcnet_hiddens": [8]})
        .resources(device="cpu")
        .debugging(seed=0)
    )


def _steps(episodes: list[Any]) -> int:
    return sum(len(e) for e in episodes)


def _seq_nos(episodes: list[Any]) -> set[int]:
    return {int(x) for e in episodes for x in e.get_extra_model_outputs("weights_seq_no")}


def _lifetime_steps(group: EnvRunnerGroup) -> list[int]:
    return group.foreach_env_runner(
        lambda r: r.num_env_steps_sampled_lifetime, local_env_runner=False, timeout_seconds=30
    )


def _filter_state(runner: Any) -> dict[str, Any]:
    return runner._env_to_module.get_state()["MeanStdFilter"][DEFAULT_MODULE_ID]


def _heal(group: EnvRunnerGroup) -> None:
    """Brings every restartable runner back (bounded), so later tests see a full group."""
    deadline = time.monotonic() + 45
    while group.num_healthy_remote_env_runners() < group.num_remote_env_runners():
        assert time.monotonic() < deadline, "runners did not come back in 45 s"
        group.probe_unhealthy_env_runners(timeout_seconds=5)


# ---------------------------------------------------------------------- without Ray


def test_split_count() -> None:
    assert split_count(10, 3) == [4, 3, 3]
    assert split_count(2, 3) == [1, 1, 0]
    assert split_count(0, 2) == [0, 0]
    assert sum(split_count(1001, 7)) == 1001


def test_import_fastrollout_does_not_import_ray() -> None:
    code = (
        "import sys, fastrollout\n"
        "from fastrollout.runners import env_runner_group\n"
        "fastrollout.EnvRunnerGroup\n"
        "print('ray' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "False", out.stderr


def test_remote_runners_without_ray_name_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(ImportError, match=r"pip install 'fastrollout\[ray\]'") as info:
        EnvRunnerGroup(config=_config(num_env_runners=2))
    assert "EnvRunnerGroup with 2 remote env runners needs Ray" in str(info.value)


def test_local_group_samples_in_the_local_runner_without_ray(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)
    config = _config().environment(env_config={"sleep": 0.0})
    with EnvRunnerGroup(config=config) as group:
        assert group.num_remote_env_runners() == 0 and group.healthy_env_runner_ids() == []
        assert group.num_healthy_env_runners() == 1
        assert isinstance(group.local_env_runner, fr.SingleAgentEnvRunner)
        episodes = group.sample(num_timesteps=30)
        assert 30 <= _steps(episodes) < 30 + NUM_ENVS
        assert len(group.sample(num_episodes=3)) == 3
        metrics = MetricsLogger.peek_results(group.get_metrics())
        sampled = group.local_env_runner.num_env_steps_sampled_lifetime
        assert metrics["num_env_steps_sampled"] == sampled >= _steps(episodes) + 3 * EPISODE_LEN
        group.sync_weights()
        assert group.weights_seq_no == 1 and group.local_env_runner._weights_seq_no == 1
        assert group.foreach_env_runner(lambda r, k: r.worker_index + k, kwargs={"k": 5}) == [5]
        assert group.foreach_env_runner("get_spaces")[0] == group.get_spaces()
        group.sync_env_runner_states(env_steps_sampled=123)
        assert group.local_env_runner.num_env_steps_sampled_lifetime == 123
        assert group.probe_unhealthy_env_runners(timeout_seconds=0) == []
    assert "stopped" in repr(group)
    with pytest.raises(RuntimeError, match="EnvRunnerGroup was stopped"):
        group.sample()


def test_group_validates_the_config() -> None:
    config = _config()
    config.sample_timeout_s = -1.0
    with pytest.raises(ValueError, match="sample_timeout_s must be >= 0"):
        EnvRunnerGroup(config=config)


def test_fault_tolerance_settings_have_rllibs_names_and_defaults() -> None:
    rllib = pytest.importorskip("ray.rllib.algorithms.algorithm_config")
    ours, ref = RunnerConfig(), rllib.AlgorithmConfig()
    for name in (
        "restart_failed_env_runners",
        "ignore_env_runner_failures",
        "max_num_env_runner_restarts",
        "env_runner_health_probe_timeout_s",
        "max_requests_in_flight_per_env_runner",
        "sample_timeout_s",
        "num_cpus_per_env_runner",
        "num_gpus_per_env_runner",
    ):
        assert getattr(ours, name) == getattr(ref, name), name
    ours.fault_tolerance(
        restart_failed_env_runners=False,
        ignore_env_runner_failures=True,
        max_num_env_runner_restarts=3,
        env_runner_health_probe_timeout_s=5,
    ).env_runners(max_requests_in_flight_per_env_runner=2)
    assert (ours.restart_failed_env_runners, ours.ignore_env_runner_failures) == (False, True)
    assert ours.max_num_env_runner_restarts == 3 and ours.env_runner_health_probe_timeout_s == 5
    assert ours.max_requests_in_flight_per_env_runner == 2
    ours.validate()
    with pytest.raises(TypeError, match="restart_failed_env_runners must be a bool"):
        RunnerConfig().fault_tolerance(restart_failed_env_runners=1)
    with pytest.raises(ValueError, match="max_num_env_runner_restarts must be >= 0"):
        RunnerConfig().fault_tolerance(max_num_env_runner_restarts=-1)
    with pytest.raises(ValueError, match="max_requests_in_flight_per_env_runner must be >= 1"):
        RunnerConfig().env_runners(max_requests_in_flight_per_env_runner=0)


def test_a_runner_built_directly_is_the_local_runner_of_the_group() -> None:
    # As in RLlib: no warning; worker 0 of a config with remote runners is the local
    # runner and samples its own sub-envs only (the group samples with the others).
    runner = fr.SingleAgentEnvRunner(config=_config(num_env_runners=3))
    try:
        assert (runner.worker_index, runner.num_workers) == (0, 3)
        assert 10 * NUM_ENVS <= _steps(runner.sample()) < 10 * NUM_ENVS + NUM_ENVS
    finally:
        runner.stop()


# ---------------------------------------------------------------------- with Ray


@pytest.fixture(scope="module")
def group(ray_local: Any) -> Any:
    from ray import cloudpickle

    # The actors unpickle the config's env class and connector factory from this module,
    # which is not importable there: ship them by value.
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    g = EnvRunnerGroup(
        config=_config(
            num_env_runners=2, num_cpus_per_env_runner=0.5, sample_timeout_s=30.0
        ).fault_tolerance(env_runner_health_probe_timeout_s=30.0)
    )
    yield g
    g.stop()


def test_remote_runners_start_with_the_local_runners_state(group: EnvRunnerGroup) -> None:
    assert group.num_remote_env_runners() == group.num_remote_workers() == 2
    assert group.healthy_env_runner_ids() == group.healthy_worker_ids() == [1, 2]
    assert group.num_healthy_remote_workers() == 2 and group.num_healthy_env_runners() == 3
    assert group.foreach_env_runner(lambda r: (r.worker_index, r.num_workers)) == [
        (0, 2),
        (1, 2),
        (2, 2),
    ]
    # Every runner seeds its module apart; the group starts them all with the local one's.
    local = group.local_env_runner.get_weights()[DEFAULT_MODULE_ID]
    for weights in group.foreach_env_runner(
        lambda r: r.get_weights()[DEFAULT_MODULE_ID], local_env_runner=False
    ):
        assert weights.keys() == local.keys()
        for key, value in local.items():
            np.testing.assert_array_equal(weights[key], value, err_msg=key)
    assert "2 remote (2 healthy)" in repr(group)


def test_sample_splits_timesteps_over_the_remote_runners(group: EnvRunnerGroup) -> None:
    before = _lifetime_steps(group)
    local_before = group.local_env_runner.num_env_steps_sampled_lifetime
    episodes = group.sample(num_timesteps=41)
    gained = [b - a for a, b in zip(before, _lifetime_steps(group), strict=True)]
    for share, n in zip((21, 20), gained, strict=True):
        assert share <= n < share + NUM_ENVS
    assert _steps(episodes) == sum(gained)
    # With remote runners the local runner does not sample (RLlib's rule).
    assert group.local_env_runner.num_env_steps_sampled_lifetime == local_before
    # num_timesteps=1: the second runner's share is 0 and it is not asked.
    before = _lifetime_steps(group)
    group.sample(num_timesteps=1)
    gained = [b - a for a, b in zip(before, _lifetime_steps(group), strict=True)]
    assert gained[1] == 0 and 1 <= gained[0] <= NUM_ENVS


def test_sample_episodes_and_default_counts(group: EnvRunnerGroup) -> None:
    episodes = group.sample(num_episodes=3)
    assert len(episodes) == 3 and all(e.is_done and len(e) == EPISODE_LEN for e in episodes)
    # Without counts each runner samples its fragment: 10 steps x 2 sub-envs.
    assert 2 * 20 <= _steps(group.sample()) < 2 * 20 + 2 * NUM_ENVS
    with pytest.raises(ValueError, match="not both"):
        group.sample(num_timesteps=1, num_episodes=1)
    with pytest.raises(ValueError, match="num_episodes must be >= 0"):
        group.sample(num_episodes=-1)


def test_remote_runners_chunks_arrive_compressed_and_sealed(ray_local: Any) -> None:
    """With ``compress_observations``, the chunks a remote runner hands out cross Ray as
    their compressed blocks: they arrive compressed, with nothing left raw."""
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    g = EnvRunnerGroup(
        config=_config(num_env_runners=1, num_cpus_per_env_runner=0.5, compress_observations=True)
    )
    try:
        episodes = g.sample(num_timesteps=40)
    finally:
        g.stop()
    assert _steps(episodes) >= 40
    for ep in episodes:
        assert ep._compression("observations") == 32
        sealed = copy.deepcopy(ep)
        sealed._seal()
        assert ep._stored_bytes("observations") == sealed._stored_bytes("observations")


def test_get_metrics_aggregates_every_runner_at_the_root(group: EnvRunnerGroup) -> None:
    group.get_metrics()  # start from a clean reduce cycle
    lifetime = MetricsLogger.peek_results(group.get_metrics()).get(
        "num_env_steps_sampled_lifetime", 0.0
    )
    before = _lifetime_steps(group)
    # Episodes first (fresh envs), so that every episode done later started after it and
    # its earlier chunks count toward its return.
    first = group.sample(num_episodes=2)  # the other sub-envs' steps count too
    second = group.sample(num_timesteps=60)
    gained = sum(b - a for a, b in zip(before, _lifetime_steps(group), strict=True))
    metrics = MetricsLogger.peek_results(group.get_metrics())
    assert metrics["num_env_steps_sampled"] == gained >= _steps(first) + _steps(second)
    assert metrics["num_episodes"] == sum(e.is_done for e in first + second)
    # The root's lifetime sum keeps growing over reduce cycles.
    assert metrics["num_env_steps_sampled_lifetime"] == lifetime + gained
    assert metrics["episode_return_mean"] == EPISODE_LEN
    assert (
        group.metrics.peek("num_env_steps_sampled_lifetime")
        == (metrics["num_env_steps_sampled_lifetime"])
    )


def test_sync_weights_one_put_rising_seq_no(
    group: EnvRunnerGroup, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ray

    puts = []
    real_put = ray.put
    monkeypatch.setattr(ray, "put", lambda value, **kw: puts.append(value) or real_put(value, **kw))
    seq = group.weights_seq_no
    new = {k: v + 1.0 for k, v in group.local_env_runner.get_weights()[DEFAULT_MODULE_ID].items()}
    group.sync_weights(from_worker_or_learner_group={DEFAULT_MODULE_ID: new})
    assert len(puts) == 1 and group.weights_seq_no == seq + 1
    for weights, runner_seq in group.foreach_env_runner(
        lambda r: (r.get_weights()[DEFAULT_MODULE_ID], r._weights_seq_no), timeout_seconds=30
    ):
        assert runner_seq == seq + 1
        for key, value in new.items():
            np.testing.assert_array_equal(weights[key], value, err_msg=key)
    assert _seq_nos(group.sample(num_timesteps=20)) == {seq + 1}
    # A module, a state with its own (higher) number, and a bad state.
    group.sync_weights(from_worker_or_learner_group=group.local_env_runner.module)
    assert group.weights_seq_no == seq + 2
    state = {"rl_module": {DEFAULT_MODULE_ID: new}, "weights_seq_no": seq + 10}
    group.sync_weights(from_worker_or_learner_group=state, timeout_seconds=None)
    assert group.weights_seq_no == seq + 10
    puts.clear()
    bad = {DEFAULT_MODULE_ID: {k: np.zeros(3) for k in new}}
    with pytest.raises(ValueError, match="has shape"):
        group.sync_weights(from_worker_or_learner_group=bad)
    assert puts == [] and group.weights_seq_no == seq + 10  # nothing sent
    with pytest.raises(TypeError, match="sync_weights takes weights from"):
        group.sync_weights(from_worker_or_learner_group=3)
    with pytest.raises(ValueError, match=r"no weights for module\(s\) \['nope'\]"):
        group.sync_weights(policies=["nope"])


def test_sync_env_runner_states_merges_mean_std_filters_exactly(group: EnvRunnerGroup) -> None:
    group.sync_env_runner_states()
    group.sample(num_timesteps=80)
    states = group.foreach_env_runner(_filter_state, local_env_runner=False)
    expected = RunningStats.from_state(states[0]["base"])
    base_count = expected.count
    for state in states:
        assert state["base"]["count"] == base_count  # synced before: one base
        assert state["delta"]["count"] > 0
        expected.merge(RunningStats.from_state(state["delta"]))
    group.sync_env_runner_states(env_steps_sampled=1000)
    after = group.foreach_env_runner(_filter_state, timeout_seconds=30)
    for state in after:  # local and remote runners alike
        assert state["base"]["count"] == expected.count and state["delta"]["count"] == 0
        np.testing.assert_allclose(state["base"]["mean"], expected.mean, rtol=1e-12)
        np.testing.assert_allclose(state["base"]["m2"], expected.m2, rtol=1e-12)
    assert _lifetime_steps(group) == [1000, 1000]


def test_foreach_env_runner(group: EnvRunnerGroup) -> None:
    index = lambda r, add: r.worker_index + add  # noqa: E731
    assert group.foreach_env_runner(index, kwargs={"add": 10}) == [10, 11, 12]
    assert group.foreach_env_runner(index, kwargs={"add": 0}, local_env_runner=False) == [1, 2]
    assert group.foreach_env_runner(
        index, kwargs={"add": 0}, local_env_runner=False, remote_worker_ids=[2]
    ) == [2]
    spaces = group.foreach_env_runner("get_spaces")
    assert len(spaces) == 3 and all(sp.keys() == spaces[0].keys() for sp in spaces)
    refs = group.foreach_env_runner(
        lambda r: r.worker_index, local_env_runner=False, return_obj_refs=True
    )
    assert sorted(group._ray.get(refs, timeout=30)) == [1, 2]
    with pytest.raises(ValueError, match="return_obj_refs=True needs local_env_runner=False"):
        group.foreach_env_runner("get_spaces", return_obj_refs=True)
    with pytest.raises(ValueError, match=r"unknown remote env runner id\(s\) \[7\]"):
        group.foreach_env_runner("get_spaces", remote_worker_ids=[7])


def test_foreach_env_runner_async_and_fetch(group: EnvRunnerGroup) -> None:
    assert group.foreach_env_runner_async(lambda r: r.worker_index, tag="a") == 2
    # One request per runner and tag in flight (RLlib's default limit) until fetched.
    assert group.foreach_env_runner_async(lambda r: r.worker_index, tag="a") == 0
    assert group.foreach_env_runner_async("get_spaces", tag="b", remote_worker_ids=[1]) == 1
    assert group.num_in_flight_async_reqs() == 3 and group.num_in_flight_async_reqs("a") == 2
    got = group.fetch_ready_async_reqs(tags="a", timeout_seconds=30)
    assert sorted(got) == [(1, 1), (2, 2)]
    assert group.num_in_flight_async_reqs("a") == 0
    (only,) = group.fetch_ready_async_reqs(tags=["b"], timeout_seconds=30)
    assert only[0] == 1 and DEFAULT_MODULE_ID in only[1]
    assert group.fetch_ready_async_reqs() == []


def test_runner_killed_during_sample_is_restarted_and_brought_up_to_date(
    group: EnvRunnerGroup,
) -> None:
    ray = group._ray
    restarts = group.num_remote_worker_restarts()
    before = _lifetime_steps(group)
    victim = group._remotes[1].handle
    # 300 steps per runner take about 0.3 s (1 ms per sub-env step): the kill lands
    # mid-sample; Ray restarts the actor (no_restart=False), as after a crash.
    killer = threading.Timer(0.1, lambda: ray.kill(victim, no_restart=False))
    killer.start()
    try:
        episodes = group.sample(num_timesteps=600)
    finally:
        killer.join()
    # What the healthy runner produced, nothing raised.
    assert 300 <= _steps(episodes) < 300 + NUM_ENVS
    assert group.healthy_env_runner_ids() == [2]
    (after,) = _lifetime_steps(group)  # the healthy runner only
    assert after - before[1] == _steps(episodes)
    # New weights and merged connector states while runner 1 is out of service.
    group.sync_weights()
    group.sync_env_runner_states()
    assert group.probe_unhealthy_env_runners(timeout_seconds=30) == [1]
    assert group.num_remote_worker_restarts() == restarts + 1
    local_weights = group.local_env_runner.get_weights()[DEFAULT_MODULE_ID]
    local_filter = _filter_state(group.local_env_runner)
    (seq, weights, filt) = group.foreach_env_runner(
        lambda r: (r._weights_seq_no, r.get_weights()[DEFAULT_MODULE_ID], _filter_state(r)),
        local_env_runner=False,
        remote_worker_ids=[1],
        timeout_seconds=30,
    )[0]
    assert seq == group.weights_seq_no
    for key, value in local_weights.items():
        np.testing.assert_array_equal(weights[key], value, err_msg=key)
    assert filt["base"]["count"] == local_filter["base"]["count"] > 0
    np.testing.assert_array_equal(filt["base"]["mean"], local_filter["base"]["mean"])
    episodes = group.sample(num_timesteps=40)
    assert _seq_nos(episodes) == {group.weights_seq_no}
    assert 40 <= _steps(episodes) < 40 + 2 * NUM_ENVS


def test_runner_restarted_between_calls_never_samples_with_stale_weights(
    group: EnvRunnerGroup,
) -> None:
    _heal(group)
    group.sync_weights()
    group._ray.kill(group._remotes[2].handle, no_restart=False)
    # Runner 2's sample either fails (the actor is still restarting: out of service) or
    # reaches the restarted runner, which asks for the group's state first (restored and
    # asked again). Either way no step is sampled with the fresh actor's own weights.
    episodes = group.sample(num_timesteps=40)
    assert episodes and _seq_nos(episodes) == {group.weights_seq_no}
    _heal(group)
    episodes = group.sample(num_timesteps=40)
    assert _seq_nos(episodes) == {group.weights_seq_no}


def test_an_error_inside_a_runner_restarts_it(group: EnvRunnerGroup) -> None:
    _heal(group)

    def fail(runner: Any) -> None:
        raise ValueError("broken runner")

    # As RLlib: the runner's state may be broken, so its actor is ended and restarted.
    assert group.foreach_env_runner(fail, local_env_runner=False, remote_worker_ids=[1]) == []
    assert group.healthy_env_runner_ids() == [2]
    _heal(group)
    assert group.foreach_env_runner(lambda r: r.worker_index, local_env_runner=False) == [1, 2]


def test_sample_timeout_returns_what_is_ready_and_keeps_the_rest(group: EnvRunnerGroup) -> None:
    _heal(group)
    group.get_metrics()
    before = _lifetime_steps(group)
    start = time.monotonic()
    early = group.sample(num_timesteps=2000, sample_timeout_s=0.1)  # about 1 s per runner
    assert time.monotonic() - start < 0.8
    # The runners still sampling give no metrics yet; nothing is lost.
    nothing = MetricsLogger.peek_results(group.get_metrics()).get("num_env_steps_sampled", 0)
    assert nothing == 0 or math.isnan(nothing)
    # Busy runners keep their connector states (merged at a later sync) but take weights.
    seq = group.weights_seq_no + 1
    weights = group.local_env_runner.get_weights()
    group.sync_env_runner_states(rl_module_state={"rl_module": weights, "weights_seq_no": seq})
    assert group.weights_seq_no == seq
    late = group.sample(num_timesteps=2000, sample_timeout_s=30)
    gained = sum(b - a for a, b in zip(before, _lifetime_steps(group), strict=True))
    # The second call asked nothing new: the runners were busy with the first request.
    assert 2000 <= _steps(early + late) == gained < 2000 + 2 * NUM_ENVS
    metrics = MetricsLogger.peek_results(group.get_metrics())
    assert metrics["num_env_steps_sampled"] == gained
    for runner_seq, delta in group.foreach_env_runner(
        lambda r: (r._weights_seq_no, _filter_state(r)["delta"]["count"]), local_env_runner=False
    ):
        assert runner_seq == seq and delta >= 1000


def test_runner_gone_for_good_is_left_out(group: EnvRunnerGroup) -> None:
    _heal(group)
    group._ray.kill(group._remotes[1].handle, no_restart=True)
    episodes = group.sample(num_timesteps=40)
    assert 20 <= _steps(episodes) < 20 + NUM_ENVS  # runner 2's share
    assert group.probe_unhealthy_env_runners(timeout_seconds=10) == []
    assert group._remotes[1].dead and group.healthy_env_runner_ids() == [2]
    assert group.foreach_env_runner(
        lambda r: r.worker_index, local_env_runner=False, healthy_only=False
    ) == [2]
    group.stop()
    assert group.num_remote_env_runners() == 0
    with pytest.raises(RuntimeError, match="was stopped"):
        group.get_metrics()


def test_without_fault_tolerance_a_failure_raises(ray_local: Any) -> None:
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    config = _config(num_env_runners=1, num_cpus_per_env_runner=0.5).fault_tolerance(
        restart_failed_env_runners=False, ignore_env_runner_failures=False
    )
    with EnvRunnerGroup(config=config) as group:

        def fail(runner: Any) -> None:
            raise KeyError("no such thing")

        with pytest.raises(KeyError, match="no such thing"):
            group.foreach_env_runner(fail, local_env_runner=False)


def test_too_few_cpus_or_gpus_in_the_cluster_fail_fast(ray_local: Any) -> None:
    with pytest.raises(ValueError, match=r"3 remote env runners x num_cpus_per_env_runner=1"):
        EnvRunnerGroup(config=_config(num_env_runners=3))
    with pytest.raises(ValueError, match=r"need 1 GPUs, the Ray cluster has 0 in all"):
        EnvRunnerGroup(
            config=_config(
                num_env_runners=1, num_cpus_per_env_runner=0.5, num_gpus_per_env_runner=1
            )
        )


def test_sampled_episodes_pickle_close_to_their_raw_bytes(group_free_runner: Any) -> None:
    episodes = group_free_runner
    raw = sum(_array_bytes(e.get_state()) for e in episodes)
    pickled = len(pickle.dumps(episodes, protocol=5))
    # Arrays travel as their bytes; the rest is spaces, ids and small fields.
    assert pickled < 1.5 * raw + 3000 * len(episodes), (pickled, raw)


@pytest.fixture
def group_free_runner() -> Any:
    runner = fr.SingleAgentEnvRunner(
        config=_config(rollout_fragment_length=200).environment(env_config={"sleep": 0.0})
    )
    try:
        yield runner.sample()
    finally:
        runner.stop()


def _array_bytes(value: Any) -> int:
    if isinstance(value, np.ndarray):
        return value.nbytes
    if isinstance(value, dict):
        return sum(_array_bytes(v) for v in value.values())
    if isinstance(value, list | tuple):
        return sum(_array_bytes(v) for v in value)
    return 0


def test_ppo_example_trains_with_remote_runners(ray_local: Any) -> None:
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parents[1] / "examples" / "ppo.py"
    spec = importlib.util.spec_from_file_location("fastrollout_example_ppo_group", path)
    example = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = example
    spec.loader.exec_module(example)
    args = example.parse_args(
        ["--timesteps", "400", "--num-envs", "2", "--rollout-fragment-length", "25",
         "--hiddens", "8", "--seed", "1", "--device", "cpu", "--num-env-runners", "2",
         "--num-cpus-per-env-runner", "0.25", "--num-epochs", "1"]
    )  # fmt: skip
    history = example.train(args, log=None)
    # Each iteration: 25 steps x 2 sub-envs x 2 runners, then new weights everywhere.
    assert history[0]["env_steps"] >= 100 and history[-1]["env_steps"] >= 400
    assert len(history) == 4
