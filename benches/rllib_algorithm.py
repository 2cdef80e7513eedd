"""Inside RLlib's PPO: the algorithm's runner, fastrollout's against RLlib's own.

Usage::

    python benches/rllib_algorithm.py [--rounds 7] [--num-envs 8] [--iters-between 0] [--lstm]

Two PPO algorithms on CartPole-v1 with ``num_env_runners=0`` and ``--num-envs`` sub-envs
(RLlib's default module, 256x256 tanh, and PPO's default batch: 4000 env steps per
``sample`` call), one with ``env_runners(env_runner_cls=fastrollout.SingleAgentEnvRunner)``,
one with RLlib's runner. Per round, each algorithm's runner does what ``training_step``
asks of it, ``sample()`` then ``get_metrics()``, timed together; the two take turns in
one process, and the ratio is the median over the rounds of the two runs of a round.
With ``--iters-between N`` each algorithm trains N iterations before every round, so the
policies (and the episodes' lengths) move on as in training. With ``--lstm`` the env is
RLlib's ``StatelessCartPole`` (CartPole without the velocities) and the module RLlib's
default LSTM (``use_lstm=True``, ``max_seq_len=20``, 256 cells): a recurrent policy,
whose state both runners carry per sub-env.

Torch and OpenBLAS run on one thread (as in ``side_by_side.py``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import torch


def build(use_fastrollout: bool, num_envs: int, lstm: bool = False):
    """A PPO algorithm with the runner of one side."""
    from ray.rllib.algorithms.ppo import PPOConfig

    import fastrollout

    env = "CartPole-v1"
    if lstm:
        from ray.rllib.examples.envs.classes.stateless_cartpole import StatelessCartPole

        env = StatelessCartPole
    config = (
        PPOConfig()
        .environment(env)
        .env_runners(num_env_runners=0, num_envs_per_env_runner=num_envs)
        .debugging(seed=0)
    )
    if lstm:
        from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

        config = config.rl_module(model_config=DefaultModelConfig(use_lstm=True, max_seq_len=20))
    if use_fastrollout:
        config = config.env_runners(env_runner_cls=fastrollout.SingleAgentEnvRunner)
    return config.build_algo()


def timed_sample(algo) -> tuple[float, int]:
    """One ``sample()`` + ``get_metrics()`` on the algorithm's runner: (seconds, env steps)."""
    runner = algo.env_runner
    start = time.perf_counter()
    episodes = runner.sample()
    runner.get_metrics()
    elapsed = time.perf_counter() - start
    return elapsed, sum(len(e) for e in episodes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--iters-between", type=int, default=0)
    parser.add_argument("--lstm", action="store_true", help="StatelessCartPole, LSTM module")
    args = parser.parse_args()
    torch.set_num_threads(1)

    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    algos = {
        "rllib": build(False, args.num_envs, args.lstm),
        "fastrollout": build(True, args.num_envs, args.lstm),
    }
    for algo in algos.values():  # warm-up
        timed_sample(algo)
    per_step: dict[str, list[float]] = {name: [] for name in algos}
    ratios = []
    for _ in range(args.rounds):
        for algo in algos.values():
            for _ in range(args.iters_between):
                algo.train()
        round_times = {}
        for name, algo in algos.items():
            seconds, steps = timed_sample(algo)
            round_times[name] = seconds / steps
            per_step[name].append(seconds / steps * 1e6)
        ratios.append(round_times["rllib"] / round_times["fastrollout"])
    for name, values in per_step.items():
        print(f"{name:12s} {statistics.median(values):8.1f} us per env step (sample + get_metrics)")
    print(
        f"RLlib / fastrollout: {statistics.median(ratios):.2f}x "
        f"(rounds: {min(ratios):.2f}-{max(ratios):.2f}), {args.num_envs} sub-envs, "
        f"{args.rounds} rounds{', LSTM on StatelessCartPole' if args.lstm else ''}"
    )
    for algo in algos.values():
        algo.stop()
    ray.shutdown()


if __name__ == "__main__":
    main()
