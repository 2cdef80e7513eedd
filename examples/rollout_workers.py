"""RLlib's classic RolloutWorker training loop, with fastrollout's ``RolloutWorker``.

    python examples/rollout_workers.py --num-workers 2 --seed 0

Each iteration the local worker's weights go to the remote workers (one ``ray.put``, a
rising ``weights_seq_no``), every remote worker samples a batch, the batches are joined
with ``concat_samples``, and the local worker learns on them with PPO: several passes of
shuffled minibatches, one ``learn_on_batch`` (one gradient step, as in RLlib's old stack)
per minibatch. The loop stops when the mean return of the last 100 episodes reaches
``--target`` (exit code 0) or after ``--max-iterations`` (exit code 1).

This is the loop of RLlib's ``RolloutWorker`` docstring::

    workers = [RolloutWorker.as_remote().remote(env_creator=..., config=...) for _ in range(2)]
    while True:
        weights = ray.put(local.get_weights())
        for w in workers:
            w.set_weights.remote(weights)
        batch = concat_samples(ray.get([w.sample.remote() for w in workers]))
        local.learn_on_batch(batch)

Ray starts a new local instance (``--num-workers`` CPUs) unless ``RAY_ADDRESS`` names a
cluster.
"""

from __future__ import annotations

import argparse
import collections
import math
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from fastrollout import RolloutWorker, RunnerConfig
from fastrollout.batches import SampleBatch, concat_samples
from fastrollout.learners import PPOConfig


def env_creator(ctx: Any) -> gym.Env:
    """One CartPole per sub-env (``ctx`` is the ``EnvContext``: worker and vector index)."""
    return gym.make("CartPole-v1")


def make_config(args: argparse.Namespace) -> RunnerConfig:
    """The workers' config: ``num_envs x rollout_fragment_length`` steps per ``sample()``."""
    return (
        RunnerConfig()
        .env_runners(
            num_envs_per_env_runner=args.num_envs,
            rollout_fragment_length=args.rollout_fragment_length,
            batch_mode="truncate_episodes",
        )
        .rl_module(model_config={"fcnet_hiddens": [64, 64], "fcnet_activation": "tanh"})
        .debugging(seed=args.seed)
    )


def make_policy_config(args: argparse.Namespace) -> PPOConfig:
    """PPO's loss settings (the SGD loop itself is :func:`learn`)."""
    return PPOConfig(
        lr=args.lr,
        gamma=0.99,
        lambda_=0.95,
        clip_param=0.2,
        vf_loss_coeff=0.5,
        entropy_coeff=0.0,
        grad_clip=None,
    )


def learn(local: Any, batch: SampleBatch, num_sgd_iter: int, minibatch_size: int) -> dict:
    """PPO's update on the local worker: standardized advantages, shuffled minibatches.

    Returns:
        The last ``learn_on_batch`` info of the default policy (``learner_stats``, ...).
    """
    batch = batch.copy(shallow=True)
    adv = np.asarray(batch["advantages"], dtype=np.float32)
    batch["advantages"] = (adv - adv.mean()) / max(float(adv.std()), 1e-4)
    info: dict = {}
    for _ in range(num_sgd_iter):
        batch.shuffle()
        for start in range(0, batch.count - minibatch_size + 1, minibatch_size):
            info = local.learn_on_batch(batch.slice(start, start + minibatch_size))
    return info.get("default_policy", {})


def init_ray(num_cpus: int) -> Any:
    """Ray: a new local instance with ``num_cpus`` unless ``RAY_ADDRESS`` names a cluster."""
    import ray

    if not ray.is_initialized():
        address = os.environ.get("RAY_ADDRESS")
        if address and address != "local":
            ray.init(address=address)
        else:
            ray.init(
                address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=True
            )
    return ray


def train(args: argparse.Namespace) -> dict[str, float]:
    """The training loop; returns the last iteration's ``iteration``, ``env_steps``,
    ``return_mean`` and ``time_s``."""
    torch.set_num_threads(1)
    np.random.seed(args.seed)  # SampleBatch.shuffle() draws from numpy's global generator
    start = time.perf_counter()
    ray = init_ray(max(1, math.ceil(args.num_workers * args.num_cpus_per_worker)))
    config = make_config(args)
    policy_config = make_policy_config(args)
    local = RolloutWorker(
        env_creator=env_creator,
        config=config,
        worker_index=0,
        num_workers=args.num_workers,
        policy_config=policy_config,
    )
    remote_cls = RolloutWorker.as_remote(num_cpus=args.num_cpus_per_worker)
    workers = [
        remote_cls.remote(
            env_creator=env_creator,
            config=config,
            worker_index=i,
            num_workers=args.num_workers,
            policy_config=policy_config,
        )
        for i in range(1, args.num_workers + 1)
    ]
    returns: collections.deque[float] = collections.deque(maxlen=100)
    record = {"iteration": 0.0, "env_steps": 0.0, "return_mean": math.nan, "time_s": 0.0}
    env_steps = 0
    try:
        for iteration in range(1, args.max_iterations + 1):
            # Broadcast: one object in Ray's store, fetched by every worker.
            weights = ray.put(local.get_weights())
            for w in workers:
                w.set_weights.remote(weights, weights_seq_no=iteration)
            batch = concat_samples(ray.get([w.sample.remote() for w in workers]))
            env_steps += batch.env_steps()
            stats = learn(local, batch, args.num_sgd_iter, args.minibatch_size)
            for metrics in ray.get([w.get_metrics.remote() for w in workers]):
                returns.extend(m.episode_reward for m in metrics)
            return_mean = sum(returns) / len(returns) if returns else math.nan
            elapsed = time.perf_counter() - start
            record = {
                "iteration": float(iteration),
                "env_steps": float(env_steps),
                "return_mean": return_mean,
                "time_s": elapsed,
            }
            learner_stats = stats.get("learner_stats", {})
            print(
                f"iter {iteration:3d}  env steps {env_steps:7,}  return_mean {return_mean:6.1f}"
                f"  vf_loss {learner_stats.get('vf_loss', math.nan):7.2f}"
                f"  kl {learner_stats.get('mean_kl', math.nan):.4f}  {elapsed:5.1f} s",
                flush=True,
            )
            if len(returns) > 0 and return_mean >= args.target:
                break
    finally:
        for w in workers:
            w.stop.remote()
        local.stop()
    return record


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--num-workers", type=int, default=2, help="remote RolloutWorkers")
    p.add_argument(
        "--num-cpus-per-worker", type=float, default=1.0, help="CPUs Ray reserves per worker"
    )
    p.add_argument("--num-envs", type=int, default=4, help="sub-envs per worker")
    p.add_argument(
        "--rollout-fragment-length", type=int, default=128, help="steps per sub-env per sample"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--num-sgd-iter", type=int, default=10, help="passes over each batch")
    p.add_argument("--minibatch-size", type=int, default=128)
    p.add_argument("--target", type=float, default=150.0, help="mean return to stop at")
    p.add_argument("--max-iterations", type=int, default=100)
    args = p.parse_args(argv)
    if args.num_workers < 1:
        p.error("--num-workers must be >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    record = train(args)
    reached = record["return_mean"] >= args.target
    print(
        f"{'reached' if reached else 'did not reach'} {args.target:g}: "
        f"{int(record['iteration'])} iterations, {int(record['env_steps']):,} env steps, "
        f"mean return {record['return_mean']:.1f}, {record['time_s']:.1f} s"
    )
    return 0 if reached else 1


if __name__ == "__main__":
    sys.exit(main())
