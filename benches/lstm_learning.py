"""RLlib's LSTM PPO on StatelessCartPole: iterations to a mean return of 100, per runner.

Usage::

    python benches/lstm_learning.py [--target 100] [--max-iters 60] [--seed 0]
        [--runner both|fastrollout|rllib] [--num-env-runners 0]

RLlib 2.60's PPO with its default LSTM module (``use_lstm=True``, ``max_seq_len=20``)
learns RLlib's ``StatelessCartPole`` (CartPole without the velocities, so only a policy
with memory does well). The only difference between the two runs is
``env_runner_cls=fastrollout.SingleAgentEnvRunner``; the seed and every setting are the
same. Each run prints the iterations and wall-clock seconds it took to reach the target.
This is a measure, not a test: the two runners draw different random numbers, so the
counts differ by chance as two seeds of one runner do.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def build(use_fastrollout: bool, seed: int, num_env_runners: int):
    """RLlib's PPO with an LSTM on StatelessCartPole, with one side's runner."""
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
    from ray.rllib.examples.envs.classes.stateless_cartpole import StatelessCartPole

    import fastrollout

    config = (
        PPOConfig()
        .environment(StatelessCartPole)
        .env_runners(num_env_runners=num_env_runners, num_envs_per_env_runner=4)
        .training(lr=0.0005, num_epochs=6, vf_loss_coeff=0.01, train_batch_size_per_learner=2000)
        .rl_module(
            model_config=DefaultModelConfig(use_lstm=True, max_seq_len=20, lstm_cell_size=64)
        )
        .debugging(seed=seed)
    )
    if use_fastrollout:
        config = config.env_runners(env_runner_cls=fastrollout.SingleAgentEnvRunner)
    return config.build_algo()


def run(use_fastrollout: bool, args: argparse.Namespace) -> tuple[int | None, float, float]:
    """Trains until the target; (iterations or None, seconds, the best mean return)."""
    algo = build(use_fastrollout, args.seed, args.num_env_runners)
    start = time.perf_counter()
    best = float("-inf")
    try:
        for i in range(1, args.max_iters + 1):
            ret = algo.train()["env_runners"].get("episode_return_mean")
            if ret is not None:
                best = max(best, float(ret))
                if ret >= args.target:
                    return i, time.perf_counter() - start, best
    finally:
        algo.stop()
    return None, time.perf_counter() - start, best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", type=float, default=100.0)
    parser.add_argument("--max-iters", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--runner", choices=["both", "fastrollout", "rllib"], default="both")
    parser.add_argument("--num-env-runners", type=int, default=0)
    args = parser.parse_args()
    import ray
    import torch

    torch.set_num_threads(1)
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    sides = ["fastrollout", "rllib"] if args.runner == "both" else [args.runner]
    for side in sides:
        iters, seconds, best = run(side == "fastrollout", args)
        reached = f"{iters} iterations" if iters is not None else f"not in {args.max_iters}"
        print(
            f"{side:12s} mean return {args.target:g}: {reached}, {seconds:.0f} s "
            f"(best {best:.1f}, seed {args.seed})",
            flush=True,
        )
    ray.shutdown()


if __name__ == "__main__":
    main()
