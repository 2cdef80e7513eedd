"""RolloutWorker on Ray: as a remote actor, and with remote sub-envs."""

from __future__ import annotations

import sys
from typing import Any

import gymnasium as gym
import numpy as np

from fastrollout import RolloutWorker, RunnerConfig
from fastrollout.batches import SampleBatch, concat_samples
from fastrollout.filters import synchronize


def cartpole(ctx: Any) -> gym.Env:
    return gym.make("CartPole-v1")


def config(**env_runners: Any) -> RunnerConfig:
    c = RunnerConfig().env_runners(**env_runners).debugging(seed=0)
    return c.rl_module(model_config={"fcnet_hiddens": [16]})


def test_remote_workers_sample_sync_weights_and_filters(ray_local: Any) -> None:
    ray = ray_local
    # The actors unpickle this module's env creator by value (tests/ is not importable).
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    cfg = config(rollout_fragment_length=10, observation_filter="MeanStdFilter")
    Remote = RolloutWorker.as_remote(num_cpus=0)
    remotes = [
        Remote.remote(env_creator=cartpole, config=cfg, worker_index=i + 1, num_workers=2)
        for i in range(2)
    ]
    local = RolloutWorker(env_creator=cartpole, config=cfg)
    try:
        weights = ray.put(local.get_weights())
        ray.get([w.set_weights.remote(weights, weights_seq_no=1) for w in remotes])
        batches = ray.get([w.sample.remote() for w in remotes])
        assert all(isinstance(b, SampleBatch) and b.count == 10 for b in batches)
        joined = concat_samples(batches)
        local.learn_on_batch(joined)
        # The remote workers act with the broadcast weights.
        remote_weights = ray.get(remotes[0].get_weights.remote())["default_policy"]
        sent = ray.get(weights)["default_policy"]
        assert all(np.array_equal(remote_weights[k], sent[k]) for k in sent)
        merged = synchronize(
            local.filters, ray.get([w.get_filters.remote(flush_after=True) for w in remotes])
        )
        ray.get([w.sync_filters.remote(merged) for w in remotes])
        n = local.filters["default_policy"].running_stats.n
        assert n == 2 * 11  # each remote saw its reset and 10 step observations
        assert ray.get(remotes[1].get_filters.remote())["default_policy"].running_stats.n == n
        assert ray.get(remotes[0].apply.remote(lambda w: w.worker_index)) == 1
    finally:
        ray.get([w.stop.remote() for w in remotes])
        local.stop()


def test_remote_sub_envs_with_batch_wait(ray_local: Any) -> None:
    cfg = config(
        rollout_fragment_length=8,
        num_envs_per_env_runner=2,
        remote_worker_envs=True,
        remote_env_batch_wait_ms=1,
    )
    worker = RolloutWorker(env_creator=cartpole, config=cfg)
    try:
        batch = worker.sample()
        assert 16 <= batch.count <= 17
        assert "advantages" in batch
    finally:
        worker.stop()
