"""Recording experience to disk: env steps per second with offline_data(output=...).

Usage::

    python benches/offline_write.py [--calls 5] [--steps 1000] [--envs 2] [--rounds 1]
                                    [--only KEY ...] [--json F]

CartPole-v1, ``num_envs_per_env_runner=--envs``, the default PPO module; each contender
makes one runner, samples once to warm up, then times ``--calls`` calls of
``sample(num_timesteps=--steps)`` plus ``stop()`` (which flushes what is still to be
written), and reports env steps recorded per second over that time.

Contenders (key in brackets):

- **fastrollout, none** [``fr_none``]: no recording (the ceiling).
- **fastrollout, episodes / columns** [``fr_episodes``, ``fr_columns``]: fastrollout's
  ``SingleAgentEnvRunner`` with ``offline_data(output=..., output_write_episodes=True /
  False)``: the writer thread packs and writes while the runner samples.
- **RLlib, episodes / columns** [``rllib_episodes``, ``rllib_columns``]: RLlib 2.60's
  ``OfflineSingleAgentEnvRunner`` built from ``PPOConfig().environment("CartPole-v1")
  .offline_data(output=..., output_write_episodes=...)``: it converts and writes in
  ``sample()`` through Ray Data (``ray.data.from_items(...).write_parquet``). Note that
  without ``output_max_rows_per_file`` it never empties its buffer, so each call rewrites
  every earlier episode too (files grow; what is timed is what it does).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import fastrollout as fr

KEYS = ("fr_none", "fr_episodes", "fr_columns", "rllib_episodes", "rllib_columns")


def _fr_runner(key: str, out: Path, envs: int) -> Any:
    config = (
        fr.RunnerConfig()
        .environment("CartPole-v1")
        .env_runners(num_envs_per_env_runner=envs)
        .debugging(seed=0)
    )
    if key != "fr_none":
        config.offline_data(output=str(out), output_write_episodes=key == "fr_episodes")
    return fr.SingleAgentEnvRunner(config=config)


def _rllib_runner(key: str, out: Path, envs: int) -> Any:
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.offline.offline_env_runner import OfflineSingleAgentEnvRunner

    config = (
        PPOConfig()
        .environment("CartPole-v1")
        .env_runners(num_env_runners=0, num_envs_per_env_runner=envs)
        .debugging(seed=0)
        .offline_data(output=str(out), output_write_episodes=key == "rllib_episodes")
    )
    return OfflineSingleAgentEnvRunner(config=config)


def measure(key: str, calls: int, steps: int, envs: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        make = _rllib_runner if key.startswith("rllib") else _fr_runner
        runner = make(key, out, envs)
        runner.sample(num_timesteps=steps)  # warm-up (and Ray Data's start for RLlib)
        recorded = 0
        start = time.perf_counter()
        for _ in range(calls):
            recorded += sum(len(e) for e in runner.sample(num_timesteps=steps))
        runner.stop()
        elapsed = time.perf_counter() - start
        size = sum(p.stat().st_size for p in out.rglob("*.parquet"))
    return {
        "key": key,
        "steps": recorded,
        "seconds": elapsed,
        "per_s": recorded / elapsed,
        "bytes_on_disk": size,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=5)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--envs", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--only", nargs="*", choices=KEYS)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results: dict[str, list[dict[str, Any]]] = {}
    for _ in range(args.rounds):
        for key in args.only or KEYS:
            results.setdefault(key, []).append(measure(key, args.calls, args.steps, args.envs))
    best = {k: max(v, key=lambda r: r["per_s"]) for k, v in results.items()}
    print("| runner | layout | env steps/s | recorded steps | seconds | on disk (KiB) |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for key, r in best.items():
        impl, layout = key.split("_")
        name = "fastrollout" if impl == "fr" else "RLlib 2.60"
        print(
            f"| {name} | {layout} | {r['per_s']:,.0f} | {r['steps']} | {r['seconds']:.2f} | "
            f"{r['bytes_on_disk'] / 1024:,.0f} |"
        )
    for layout in ("episodes", "columns"):
        ours, theirs = best.get(f"fr_{layout}"), best.get(f"rllib_{layout}")
        if ours and theirs:
            print(f"\n{layout}: fastrollout / RLlib = {ours['per_s'] / theirs['per_s']:.1f}x")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
