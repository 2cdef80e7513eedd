"""EnvRunnerGroup throughput on an env-bound workload, and the bytes a sampled batch costs.

    python benches/group.py                       # 1 against 2 remote runners, 1 ms env steps
    python benches/group.py --runners 0 1 2 --calls 8 --rounds 3

Each remote runner steps ``--num-envs`` sub-envs of an env whose ``step`` sleeps
``--sleep-ms`` (an env-bound workload: the sleeping costs no CPU, so the runners scale with
their number, not with the machine's cores). One ``sample()`` call gives every runner
``--fragment`` steps per sub-env. The groups for each runner count are built once, in one
local Ray instance, and measured in alternation (``--rounds`` times ``--calls`` calls
each, after one warm-up call), so that the machine's load falls on all of them alike. The
ratio is the env steps per second of the last group against the first.

The second table is what a sampled batch costs to send from an actor: ``pickle.dumps``
of the episodes one remote ``sample()`` returns (what Ray ships), against the bytes of the
numpy arrays in them.

Not a test: it prints numbers (docs/runner_groups.md shows them).
"""

from __future__ import annotations

import argparse
import os
import pickle
import platform
import statistics
import sys
import time
from typing import Any

import gymnasium as gym
import numpy as np


class SleepyEnv(gym.Env):  # type: ignore[type-arg]
    """Four float observations, two actions, reward 1; ``step`` sleeps ``sleep_ms``.

    Episodes last ``len`` steps (default 200). Defined here (pickled by value to the
    actors: this script is ``__main__``) rather than in ``fastrollout.env.examples``.
    """

    def __init__(self, config: Any = None) -> None:
        config = config or {}
        self.sleep_s = float(config.get("sleep_ms", 1.0)) / 1000.0
        self.length = int(config.get("len", 200))
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.t = 0

    def reset(self, *, seed: int | None = None, options: Any = None) -> Any:
        super().reset(seed=seed)
        self.t = 0
        return self.np_random.uniform(-1, 1, 4).astype(np.float32), {}

    def step(self, action: Any) -> Any:
        time.sleep(self.sleep_s)
        self.t += 1
        obs = self.np_random.uniform(-1, 1, 4).astype(np.float32)
        return obs, 1.0, self.t >= self.length, False, {}


def array_bytes(value: Any) -> int:
    """The bytes of every numpy array in a nested structure (the raw data)."""
    if isinstance(value, np.ndarray):
        return int(value.nbytes)
    if isinstance(value, dict):
        return sum(array_bytes(v) for v in value.values())
    if isinstance(value, list | tuple):
        return sum(array_bytes(v) for v in value)
    return 0


def batch_cost(runner: Any) -> dict[str, int]:
    """Samples once in ``runner`` and measures the returned episodes' pickled bytes."""
    episodes = runner.sample()
    start = time.perf_counter()
    pickled = pickle.dumps(episodes, protocol=pickle.HIGHEST_PROTOCOL)
    dump_us = (time.perf_counter() - start) * 1e6
    return {
        "episodes": len(episodes),
        "env_steps": sum(len(e) for e in episodes),
        "pickled_bytes": len(pickled),
        "array_bytes": sum(array_bytes(e.get_state()) for e in episodes),
        "dump_us": int(dump_us),
    }


def config(args: argparse.Namespace, num_env_runners: int, env: Any = None) -> Any:
    import fastrollout as fr

    if env is None:
        env_settings: dict[str, Any] = {"env": SleepyEnv, "env_config": {"sleep_ms": args.sleep_ms}}
    else:
        env_settings = {"env": env}
    return (
        fr.RunnerConfig()
        .environment(**env_settings)
        .env_runners(
            num_env_runners=num_env_runners,
            num_envs_per_env_runner=args.num_envs,
            rollout_fragment_length=args.fragment,
            num_cpus_per_env_runner=1,
            sample_timeout_s=None,
        )
        .resources(device="cpu")
        .debugging(seed=0)
    )


def machine() -> str:
    from side_by_side import cpu_model

    return f"{cpu_model()}, {os.cpu_count()} logical CPUs, {platform.system()} {platform.release()}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runners", type=int, nargs="+", default=[1, 2], help="remote runner counts")
    p.add_argument("--num-envs", type=int, default=4, help="sub-envs per runner (default 4)")
    p.add_argument("--fragment", type=int, default=250, help="steps per sub-env per call")
    p.add_argument("--sleep-ms", type=float, default=1.0, help="sleep per env step (default 1)")
    p.add_argument("--calls", type=int, default=5, help="timed sample() calls per round")
    p.add_argument("--rounds", type=int, default=3, help="alternations of the groups")
    args = p.parse_args(argv)

    import ray

    import fastrollout as fr

    # Logical CPUs: every group holds 1 per runner while all are alive; only one group
    # samples at a time, and sleeping env steps use no CPU.
    ray.init(
        address="local",
        num_cpus=max(os.cpu_count() or 1, sum(args.runners)),
        include_dashboard=False,
        log_to_driver=False,
    )
    print(f"machine: {machine()}; python {sys.version.split()[0]}, ray {ray.__version__}")
    print(
        f"workload: {args.num_envs} sub-envs per runner x {args.fragment} steps per call, "
        f"env step sleeps {args.sleep_ms} ms; {args.rounds} rounds x {args.calls} calls"
    )
    groups = {n: fr.EnvRunnerGroup(config=config(args, n)) for n in args.runners}
    rates: dict[int, list[float]] = {n: [] for n in args.runners}
    try:
        for group in groups.values():
            group.sample()  # warm-up: resets, first forward passes
        for _ in range(args.rounds):
            for n, group in groups.items():
                steps = 0
                start = time.perf_counter()
                for _ in range(args.calls):
                    steps += sum(len(e) for e in group.sample())
                    group.get_metrics()
                rates[n].append(steps / (time.perf_counter() - start))
        print()
        print(f"{'remote runners':>14}  {'env steps/s (median of rounds)':>30}  {'rounds':>24}")
        for n in args.runners:
            rounds = " ".join(f"{r:,.0f}" for r in rates[n])
            print(f"{n:>14}  {statistics.median(rates[n]):>30,.0f}  {rounds:>24}")
        first, last = args.runners[0], args.runners[-1]
        ratio = statistics.median(rates[last]) / statistics.median(rates[first])
        print(f"\n{last} against {first} remote runner(s): {ratio:.2f}x env steps per second")

        # The byte costs: in a remote runner of the last group, then (its CPUs freed) in
        # a one-runner group on CartPole (4 float32 observations too, 500-step episodes).
        costs = {
            "SleepyEnv": groups[last].foreach_env_runner(
                batch_cost, local_env_runner=False, remote_worker_ids=[1]
            )[0]
        }
        for group in groups.values():
            group.stop()
        with fr.EnvRunnerGroup(config=config(args, 1, "CartPole-v1")) as cartpole:
            cartpole.sample()  # past the first, short episodes
            costs["CartPole"] = cartpole.foreach_env_runner(batch_cost, local_env_runner=False)[0]
        print("\nbytes of one sampled batch sent from an actor (pickle.dumps of the episodes):")
        print(f"{'env':>10} {'episodes':>9} {'env steps':>10} {'pickled':>10} {'arrays':>10} "
              f"{'ratio':>6} {'dump us':>8}")  # fmt: skip
        for name, cost in costs.items():
            print(
                f"{name:>10} {cost['episodes']:>9} {cost['env_steps']:>10} "
                f"{cost['pickled_bytes']:>10,} {cost['array_bytes']:>10,} "
                f"{cost['pickled_bytes'] / cost['array_bytes']:>6.2f} {cost['dump_us']:>8,}"
            )
    finally:
        for group in groups.values():
            group.stop()
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
