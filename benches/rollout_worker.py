"""``RolloutWorker.sample()`` side by side: fastrollout against RLlib 2.60's old API stack.

Usage::

    python benches/rollout_worker.py [--quick] [--json out.json] [--rounds 5] [--seconds 4]
                                     [--num-envs 1 8] [--fragment 200] [--warmup 2]
                                     [--leave-out fastrollout|rllib]

The figure is env steps per second of ``RolloutWorker.sample()`` on CartPole-v1, with 1 and
with 8 sub-envs (``num_envs_per_env_runner``), for two workers built in this process:

- **fastrollout**: ``fastrollout.RolloutWorker(env_creator=..., config=RunnerConfig()...)``
  with its default policy (``fastrollout.modules.DefaultMLPModule`` with PPO's loss).
- **RLlib**: RLlib 2.60's ``ray.rllib.evaluation.rollout_worker.RolloutWorker`` with
  ``default_policy_class=PPOTorchPolicy``, built from
  ``PPOConfig().api_stack(enable_rl_module_and_learner=False,
  enable_env_runner_and_connector_v2=False)`` (the old API stack, ``num_env_runners=0``).

Both get the same env creator (``lambda ctx: gym.make("CartPole-v1")``), the same
``rollout_fragment_length`` (``--fragment``, 200 by default: a ``sample()`` call returns
about ``fragment * num_envs`` env steps), ``batch_mode="truncate_episodes"``, seed 0 and
the same model size: a policy MLP and a separate value MLP, hidden (256, 256), tanh, set
explicitly on both sides (``fcnet_hiddens=[256, 256]``, ``fcnet_activation="tanh"``,
``vf_share_layers=False``), which is also each side's default (RLlib's old-stack
``MODEL_DEFAULTS`` with PPO's ``vf_share_layers=False``; fastrollout's
``DEFAULT_MODEL_CONFIG``). The script prints the linear layers of both models so that this
can be checked. Torch runs on one thread for both (``torch.set_num_threads(1)``), and
numpy's OpenBLAS too (``OPENBLAS_NUM_THREADS=1`` unless set), on the CPU.

Env steps are counted from what ``sample()`` returns: ``batch.env_steps()`` where the batch
has it (RLlib's old-stack worker returns a ``MultiAgentBatch`` even for a single policy,
whose ``count`` is env steps), else ``batch.count``. What RLlib's batch holds beyond the
sampler's columns (``PPOTorchPolicy.postprocess_trajectory``: GAE's ``advantages`` and
``value_targets``) is part of its ``sample()`` and so part of its time; the script lists
the columns each side returns.

Measurement: for each sub-env count both workers are built, each warmed up with
``--warmup`` untimed ``sample()`` calls, then ``--rounds`` rounds are run, alternating the
two workers within each round (fastrollout, RLlib, fastrollout, RLlib, ...). In a round a
worker makes ``sample()`` calls until ``--seconds`` of timed sampling have passed; only the
``sample()`` calls are timed. After each call ``get_metrics()`` runs, untimed, as a training
loop collects the metrics every iteration (RLlib's sampler queues a ``RolloutMetrics`` per
finished episode until it is asked). The table shows each side's median steps/s over the
rounds and the median over the rounds of the ratio of the two runs of the same round (runs
next to each other in time, so that the machine's slow phases move both sides alike), with
the lowest and highest per-round ratio.

Not a test: it prints numbers.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

# numpy's OpenBLAS threads spin after each BLAS call and take a core from whichever worker
# runs next; set before numpy is imported.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import gymnasium as gym
import numpy as np
import torch

from _report import fmt, load_average, machine

ENV_ID = "CartPole-v1"
#: The model both sides build (each side's default too).
MODEL = {"fcnet_hiddens": [256, 256], "fcnet_activation": "tanh", "vf_share_layers": False}


def _env_creator(ctx: Any) -> gym.Env:
    return gym.make(ENV_ID)


@dataclass
class Side:
    """One worker under test: ``sample() -> env steps``, plus what the table needs."""

    key: str
    name: str
    worker: Any
    columns: dict[str, str] = field(default_factory=dict)
    layers: list[str] = field(default_factory=list)
    batch_type: str = ""
    build_s: float = 0.0
    rounds: list[float] = field(default_factory=list)
    steps_per_call: list[int] = field(default_factory=list)

    def sample(self) -> int:
        """One ``sample()`` call; returns the env steps of its batch."""
        return _env_steps(self.worker.sample())

    def between(self) -> None:
        """What a training loop does between two calls (untimed): reduce the metrics."""
        self.worker.get_metrics()


def _env_steps(batch: Any) -> int:
    """Env steps in a batch: ``env_steps()`` where it has it (MultiAgentBatch), else count."""
    steps = getattr(batch, "env_steps", None)
    return int(steps() if callable(steps) else batch.count)


def _policy_columns(batch: Any) -> tuple[str, dict[str, str]]:
    """The batch's type and its (single) policy batch's columns as ``name: dtype shape``."""
    kind = type(batch).__name__
    if hasattr(batch, "policy_batches"):
        (inner,) = batch.policy_batches.values()
        kind += f" of {type(inner).__name__}"
        batch = inner
    cols = {}
    for k in sorted(batch.keys()):
        v = batch[k]
        a = np.asarray(v) if not isinstance(v, np.ndarray) else v
        cols[str(k)] = f"{a.dtype} {tuple(a.shape)}"
    return kind, cols


def _linear_layers(obj: Any) -> list[str]:
    """``in->out`` of every ``nn.Linear`` in the torch modules reachable from ``obj``."""
    seen: set[int] = set()
    found: list[torch.nn.Module] = []

    def visit(x: Any, depth: int) -> None:
        if id(x) in seen or depth > 3:
            return
        seen.add(id(x))
        if isinstance(x, torch.nn.Module):
            found.append(x)
            return
        for name in ("model", "module", "rl_module", "_module", "_model"):
            try:
                child = getattr(x, name, None)
            except Exception:  # a property may raise; this is only a probe
                child = None
            if child is not None:
                visit(child, depth + 1)

    visit(obj, 0)
    layers: list[str] = []
    for m in found:
        for name, sub in m.named_modules():
            if isinstance(sub, torch.nn.Linear):
                layers.append(f"{name}: {sub.in_features}->{sub.out_features}")
    return layers


# ---------------------------------------------------------------------------- the two sides


def build_fastrollout(num_envs: int, fragment: int) -> Side:
    """fastrollout's RolloutWorker with its default policy."""
    import fastrollout as fr

    config = (
        fr.RunnerConfig()
        .environment(ENV_ID)
        .env_runners(
            num_env_runners=0,
            num_envs_per_env_runner=num_envs,
            rollout_fragment_length=fragment,
            batch_mode="truncate_episodes",
        )
        .rl_module(model_config=MODEL)
        .debugging(seed=0)
    )
    t0 = time.perf_counter()
    worker = fr.RolloutWorker(env_creator=_env_creator, config=config)
    build_s = time.perf_counter() - t0
    try:
        policy = worker.get_policy()
    except Exception:  # only for the printed layer list
        policy = worker
    return Side(
        key="fastrollout",
        name="fastrollout",
        worker=worker,
        layers=_linear_layers(policy),
        build_s=build_s,
    )


def build_rllib(num_envs: int, fragment: int) -> Side:
    """RLlib 2.60's old-stack RolloutWorker with PPOTorchPolicy."""
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.algorithms.ppo.ppo_torch_policy import PPOTorchPolicy
    from ray.rllib.evaluation.rollout_worker import RolloutWorker

    config = (
        PPOConfig()
        .api_stack(enable_rl_module_and_learner=False, enable_env_runner_and_connector_v2=False)
        .framework("torch")
        .environment(ENV_ID)
        .env_runners(
            num_env_runners=0,
            num_envs_per_env_runner=num_envs,
            rollout_fragment_length=fragment,
            batch_mode="truncate_episodes",
        )
        .training(model=dict(MODEL))
        .debugging(seed=0)
    )
    t0 = time.perf_counter()
    worker = RolloutWorker(
        env_creator=_env_creator, default_policy_class=PPOTorchPolicy, config=config
    )
    build_s = time.perf_counter() - t0
    return Side(
        key="rllib",
        name="RLlib 2.60 old stack",
        worker=worker,
        layers=_linear_layers(worker.get_policy()),
        build_s=build_s,
    )


# ---------------------------------------------------------------------------- measuring


def warm_up(side: Side, calls: int) -> None:
    """Untimed calls; the first batch also gives the columns."""
    for i in range(max(1, calls)):
        batch = side.worker.sample()
        if i == 0:
            side.batch_type, side.columns = _policy_columns(batch)
        side.between()


def run_round(side: Side, seconds: float) -> float:
    """``sample()`` calls until ``seconds`` of timed sampling; returns env steps/s."""
    timed = 0.0
    steps = 0
    while timed < seconds:
        t0 = time.perf_counter()
        n = side.sample()
        timed += time.perf_counter() - t0
        steps += n
        side.steps_per_call.append(n)
        side.between()
    rate = steps / timed
    side.rounds.append(rate)
    return rate


def measure(num_envs: int, args: argparse.Namespace) -> dict[str, Any]:
    """Both sides at one sub-env count; returns the table row."""
    builders = {"fastrollout": build_fastrollout, "rllib": build_rllib}
    for key in args.leave_out:
        builders.pop(key)
    sides: dict[str, Side] = {}
    errors: dict[str, str] = {}
    for key, build in builders.items():
        try:
            side = build(num_envs, args.fragment)
        except Exception as e:
            errors[key] = f"{type(e).__name__}: {e}"
            print(f"  {key}: cannot build: {errors[key]}", flush=True)
            continue
        try:
            warm_up(side, args.warmup)
        except Exception as e:
            errors[key] = f"{type(e).__name__}: {e}"
            print(f"  {key}: warm-up failed: {errors[key]}", flush=True)
            side.worker.stop()
            continue
        sides[key] = side

    ratios: list[float] = []
    for r in range(args.rounds):
        line = [f"  envs={num_envs} round {r + 1}/{args.rounds}:"]
        rates = {}
        for key, side in sides.items():
            rates[key] = run_round(side, args.seconds)
            line.append(f"{key} {rates[key]:,.0f}")
        if "fastrollout" in rates and "rllib" in rates:
            ratios.append(rates["fastrollout"] / rates["rllib"])
            line.append(f"ratio {ratios[-1]:.2f}x")
        print("  ".join(line), flush=True)

    for side in sides.values():
        side.worker.stop()

    def med(key: str) -> float | None:
        s = sides.get(key)
        return statistics.median(s.rounds) if s and s.rounds else None

    return {
        "num_envs": num_envs,
        "fastrollout_steps_per_s": med("fastrollout"),
        "rllib_steps_per_s": med("rllib"),
        "ratio": statistics.median(ratios) if ratios else None,
        "ratio_min": min(ratios) if ratios else None,
        "ratio_max": max(ratios) if ratios else None,
        "ratios": ratios,
        "sides": {
            key: {
                "rounds_steps_per_s": s.rounds,
                "steps_per_call": sorted(set(s.steps_per_call)),
                "calls": len(s.steps_per_call),
                "build_s": s.build_s,
                "batch_type": s.batch_type,
                "columns": s.columns,
                "linear_layers": s.layers,
            }
            for key, s in sides.items()
        },
        "errors": errors,
    }


# ---------------------------------------------------------------------------- report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="2 rounds of 1 s, 1 warm-up call")
    p.add_argument("--json", metavar="F", help="write the results to F")
    p.add_argument("--rounds", type=int, default=5, help="rounds per sub-env count (5)")
    p.add_argument("--seconds", type=float, default=4.0, help="timed s per worker per round (4)")
    p.add_argument("--warmup", type=int, default=2, help="untimed sample() calls (2)")
    p.add_argument("--fragment", type=int, default=200, help="rollout_fragment_length (200)")
    p.add_argument("--num-envs", type=int, nargs="+", default=[1, 8], help="sub-envs (1 8)")
    p.add_argument(
        "--leave-out",
        nargs="+",
        default=[],
        choices=["fastrollout", "rllib"],
        help="sides not to run (the other alone)",
    )
    args = p.parse_args(argv)
    if args.quick:
        args.rounds, args.seconds, args.warmup = 2, 1.0, 1

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    logging.getLogger("ray.rllib").setLevel(logging.ERROR)
    logging.getLogger("ray").setLevel(logging.ERROR)

    info = machine()
    print(
        f"machine: {info['cpu']}, {info['cores']} cores; python {info['python']}, torch "
        f"{info['torch']} ({info['torch threads']} thread), ray {info['ray']}, "
        f"git {info['git']}; load average {info['load average (1/5/15 min) at start']}"
    )
    print(
        f"{ENV_ID}; rollout_fragment_length {args.fragment}, truncate_episodes; "
        f"{args.warmup} warm-up call(s); {args.rounds} round(s) of >= {args.seconds} s "
        f"timed sample() per worker, alternated",
        flush=True,
    )
    rows = [measure(n, args) for n in args.num_envs]

    first = rows[0]["sides"]
    for key, s in first.items():
        print(f"\n{key}: sample() returns {s['batch_type']}; linear layers: {s['linear_layers']}")
        print("  columns: " + ", ".join(f"{k} {v}" for k, v in s["columns"].items()))
    if len(first) == 2:
        a, b = (first[k]["columns"] for k in ("fastrollout", "rllib"))
        diff = [f"{k}: {a.get(k, 'absent')} vs {b.get(k, 'absent')}" for k in sorted({*a, *b})]
        diff = [d for d, k in zip(diff, sorted({*a, *b}), strict=True) if a.get(k) != b.get(k)]
        print("columns that differ (fastrollout vs RLlib): " + ("; ".join(diff) or "none"))
    for row in rows:
        for key, s in row["sides"].items():
            print(
                f"envs={row['num_envs']} {key}: built in {s['build_s']:.2f} s, "
                f"{s['calls']} timed calls of {s['steps_per_call']} env steps"
            )

    head = ["envs", "fastrollout steps/s", "RLlib steps/s", "ratio", "ratio min..max"]
    body = [
        [
            str(r["num_envs"]),
            fmt(r["fastrollout_steps_per_s"]),
            fmt(r["rllib_steps_per_s"]),
            fmt(r["ratio"], True),
            f"{fmt(r['ratio_min'], True)}..{fmt(r['ratio_max'], True)}" if r["ratios"] else "-",
        ]
        for r in rows
    ]
    widths = [max(len(x[i]) for x in [head, *body]) for i in range(len(head))]
    print()
    for line in [head, *body]:
        print("  ".join(x.rjust(w) for x, w in zip(line, widths, strict=True)))
    for r in rows:
        for key, err in r["errors"].items():
            print(f"left out: envs={r['num_envs']} {key}: {err}")
    info["load average (1/5/15 min) at end"] = load_average()
    print(f"load average at end: {info['load average (1/5/15 min) at end']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": info, "args": vars(args), "rows": rows}, f, indent=2)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
