"""Sub-envs of different speeds: lockstep vector envs against remote sub-envs (Ray actors).

Usage::

    python benches/remote_envs.py [--quick] [--json F] [--rounds 3] [--seconds 5]
                                  [--wait-ms 0 2] [--only KEY ...]
                                  [--shm-workers 8] [--shm-batch-size 1]

One runner steps 8 sub-envs of ``fastrollout.env.examples.SlowEnv`` with
``env_config={"step_ms": [1, 2, 3, 4, 5, 6, 7, 8]}``: sub-env ``vector_index`` k sleeps
``step_ms[k % 8]`` ms per step (the sleep leaves the GIL and the CPU free, as a simulator
in another process would). The figure is env steps per second: transitions recorded
(reset observations are not counted), in ``sample()`` calls of ``--fragment`` steps per
sub-env (``8 * 25 = 200`` env steps per call by default).

Contenders (the key in brackets is what ``--only`` and the JSON use):

- **lockstep sync** [``fr_sync``]: fastrollout's ``SingleAgentEnvRunner``,
  ``gym_env_vectorize_mode="sync"``: the sub-envs step one after another in the runner's
  process, so a vector step takes the sum of the sub-envs' times (36 ms; at best
  8 / 36 ms = 222 steps/s).
- **lockstep async** [``fr_async``]: the same with ``gym_env_vectorize_mode="async"``
  (gymnasium's ``AsyncVectorEnv``, one process per sub-env): a vector step waits for the
  slowest sub-env (8 ms; at best 1000 steps/s).
- **fastrollout shared memory** [``fr_shm``]: ``env_runners(sub_env_backend=
  "shared_memory", num_sub_env_workers=8, sub_env_batch_size=1)`` (``--shm-workers``,
  ``--shm-batch-size``): worker processes step the sub-envs in the background and hand
  observations over in shared memory; with a worker per sub-env and batches of one, the
  runner acts for each sub-env as soon as its step returns, as with remote sub-envs, but
  without Ray. The settings are printed in the header and the row's name, and the line
  after the build names what stepped the sub-envs (the env's class: where the backend is
  not there, the setting is not used and it reads ``SyncVectorEnv``).
- **fastrollout remote W** [``fr_remote_wW``]: ``env_runners(remote_worker_envs=True,
  remote_env_batch_wait_ms=W)``: every sub-env a Ray actor; the runner acts for the
  sub-envs whose step has returned (waiting up to W ms for more of them) and sends them
  their next action while the others keep stepping. Left out, with the reason, where the
  config refuses the keys or the runner starts no sub-env actors.
- **RLlib remote W** [``rllib_remote_wW``]: RLlib 2.60's old API stack, a
  ``RolloutWorker`` (``PPOTorchPolicy``, built from ``PPOConfig().api_stack(False,
  False)``) with ``remote_worker_envs=True, remote_env_batch_wait_ms=W``: the reference
  for remote sub-envs (``RemoteBaseEnv``: one ``_RemoteSingleAgentEnv`` actor per
  sub-env, ``ray.wait`` over the pending ``reset``/``step`` calls).
  ``RolloutWorker.sample()`` returns a batch once ``--fragment`` steps of 8 sub-env
  fragments are built; the count is ``batch.env_steps()``.
- **RLlib lockstep** [``rllib_sync``]: the same worker with ``remote_worker_envs=False``
  (its ``VectorEnv`` steps the sub-envs one after another, as lockstep sync does).
- **ideal**: each sub-env at its own speed with no overhead: the sum over sub-envs of
  ``1000 / step_ms`` = 2718 steps/s for 1..8 ms. Only remote sub-envs can approach it.

The env is the same class in both libraries (RLlib's creator, registered with
``ray.tune.registry.register_env``, gets an ``EnvContext`` whose ``vector_index`` is the
sub-env's index, as fastrollout's does); observation column 1 is the ``vector_index``, from
which the script counts the steps of each sub-env and checks that all 8 stepped. Both
policies are the default PPO model of their library: a 256x256 tanh MLP, on torch with one
thread (``torch.set_num_threads(1)``, ``OPENBLAS_NUM_THREADS=1``), on the CPU.

Each contender is built once, warmed up with ``sample()`` calls until every sub-env has
stepped (remote sub-envs start a process each, which imports torch: 8 of them take about
25 s on 2 cores) and at least ``--warmup`` calls were made, then timed over ``--rounds``
windows of ``sample()`` calls lasting at least ``--seconds`` each (wall time of the whole
loop, including the ``get_metrics()`` call after each ``sample()``, which a training loop
makes too, so that remote sub-envs stepping between two calls are not free), and stopped
before the next one is built (so that no other contender's processes or actors are alive
meanwhile). The median over the windows is reported. The ratios are those of the medians;
"vs RLlib remote" compares a row that has a wait W with RLlib remote at the same W, every
other row with RLlib remote at the first W.
Ray runs in this process (``ray.init(address="local", num_cpus=2)``).

Not a test: it prints numbers (see ``docs/remote_envs.md``).
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
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# numpy's OpenBLAS threads spin after each BLAS call and would take a core of a 2-core
# machine from the sub-envs' processes; set before numpy is imported.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np
import torch

from _report import fmt, load_average, machine

NUM_ENVS = 8
RLLIB_ENV_NAME = "fastrollout_bench_slow_env"


@dataclass
class Sampler:
    """A built contender: one call samples, one reduces metrics, one stops it."""

    sample: Callable[[], tuple[int, np.ndarray]]  # -> (env steps, steps per sub-env)
    between: Callable[[], Any]
    stop: Callable[[], Any]
    actor_ids: Callable[[], set[str]] = field(default=lambda: set())
    backend: str | None = None  # what steps the sub-envs (fastrollout: the env's class)


@dataclass
class Contender:
    key: str
    name: str
    build: Callable[[], Sampler]
    wait_ms: int | None = None
    remote: bool = False
    rounds: list[float] = field(default_factory=list)
    by_sub_env: np.ndarray = field(default_factory=lambda: np.zeros(NUM_ENVS))
    seconds: float = 0.0
    error: str | None = None
    new_actors: int | None = None
    build_s: float | None = None
    warmup_s: float | None = None
    backend: str | None = None


def ideal_steps_per_s(step_ms: list[float]) -> float:
    """Steps per second of the sub-envs each stepping at its own speed, with no overhead.

    Args:
        step_ms: Each sub-env's step time, in ms.

    Returns:
        ``sum(1000 / ms)``.
    """
    return sum(1000.0 / ms for ms in step_ms)


def _live_actor_ids() -> set[str]:
    import ray

    # The GCS's actor table (works without the dashboard, which the state API needs):
    # actors not dead, alive or still starting.
    return {str(aid) for aid, a in ray._private.state.actors().items() if a.get("State") != "DEAD"}


def _counts(vector_indices: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    idx = np.asarray(vector_indices, dtype=np.int64)
    return np.bincount(idx, weights=weights, minlength=NUM_ENVS)[:NUM_ENVS].astype(np.float64)


# ---------------------------------------------------------------------------- fastrollout


def _fr_builder(
    args: argparse.Namespace,
    mode: str | None,
    wait_ms: int | None,
    shared_memory: bool = False,
) -> Callable[[], Sampler]:
    def build() -> Sampler:
        import fastrollout as fr
        from fastrollout.env.examples import SlowEnv

        c = fr.RunnerConfig().resources(device="cpu").debugging(seed=0)
        c = c.environment(SlowEnv, env_config={"step_ms": args.step_ms})
        kwargs: dict[str, Any] = {
            "num_envs_per_env_runner": NUM_ENVS,
            "rollout_fragment_length": args.fragment,
        }
        if mode is not None:
            kwargs["gym_env_vectorize_mode"] = mode
        if wait_ms is not None:
            kwargs.update(remote_worker_envs=True, remote_env_batch_wait_ms=wait_ms)
        if shared_memory:
            kwargs.update(
                sub_env_backend="shared_memory",
                num_sub_env_workers=args.shm_workers,
                sub_env_batch_size=args.shm_batch_size,
            )
        runner = fr.SingleAgentEnvRunner(config=c.env_runners(**kwargs))
        steps = args.fragment * NUM_ENVS

        def sample() -> tuple[int, np.ndarray]:
            episodes = runner.sample(num_timesteps=steps)
            lens = np.array([len(e) for e in episodes], np.float64)
            # The vector_index is constant within an episode: take it from any observation.
            idx = np.array([int(e.get_observations(-1)[1]) for e in episodes])
            return int(lens.sum()), _counts(idx, lens)

        env = runner.env
        backend = type(getattr(env, "unwrapped", env)).__name__
        return Sampler(sample=sample, between=runner.get_metrics, stop=runner.stop, backend=backend)

    return build


# ---------------------------------------------------------------------------- RLlib


def _rllib_builder(args: argparse.Namespace, wait_ms: int | None) -> Callable[[], Sampler]:
    def build() -> Sampler:
        from ray.rllib.algorithms.ppo import PPOConfig
        from ray.rllib.algorithms.ppo.ppo_torch_policy import PPOTorchPolicy
        from ray.rllib.evaluation.rollout_worker import RolloutWorker
        from ray.tune.registry import ENV_CREATOR, _global_registry

        remote = wait_ms is not None
        c = (
            PPOConfig()
            .api_stack(enable_rl_module_and_learner=False, enable_env_runner_and_connector_v2=False)
            .framework("torch")
            .environment(RLLIB_ENV_NAME, env_config={"step_ms": args.step_ms})
            .env_runners(
                num_env_runners=0,
                num_envs_per_env_runner=NUM_ENVS,
                remote_worker_envs=remote,
                remote_env_batch_wait_ms=wait_ms or 0,
                rollout_fragment_length=args.fragment,
                batch_mode="truncate_episodes",
            )
            .debugging(seed=0)
        )
        # What RLlib's own Algorithm hands its local worker for a registered env name.
        creator = _global_registry.get(ENV_CREATOR, RLLIB_ENV_NAME)
        worker = RolloutWorker(env_creator=creator, default_policy_class=PPOTorchPolicy, config=c)

        def sample() -> tuple[int, np.ndarray]:
            batch = worker.sample()
            policy_batch = (
                batch.policy_batches["default_policy"]
                if hasattr(batch, "policy_batches")
                else batch
            )
            obs = np.asarray(policy_batch["obs"])
            return int(batch.env_steps()), _counts(obs[:, 1])

        return Sampler(sample=sample, between=worker.get_metrics, stop=worker.stop)

    return build


def _register_rllib_env() -> None:
    from ray.tune.registry import register_env

    from fastrollout.env.examples import SlowEnv

    # The EnvContext carries vector_index (0..7 for the 8 sub-envs, also in the remote
    # actors, which RemoteBaseEnv creates with make_env(i)); SlowEnv reads it.
    register_env(RLLIB_ENV_NAME, lambda ctx: SlowEnv(ctx))


# ---------------------------------------------------------------------------- measuring


def contenders(args: argparse.Namespace) -> list[Contender]:
    """The contenders that ``--only`` keeps (all by default), in table order.

    Args:
        args: The parsed command line.

    Returns:
        The contenders, not yet built.
    """
    out = [
        Contender("fr_sync", "lockstep sync (fastrollout)", _fr_builder(args, "sync", None)),
        Contender("fr_async", "lockstep async (fastrollout)", _fr_builder(args, "async", None)),
    ]
    out.append(
        Contender(
            "fr_shm",
            f"fastrollout shared memory, {args.shm_workers} workers, batch {args.shm_batch_size}",
            _fr_builder(args, None, None, shared_memory=True),
        )
    )
    for w in args.wait_ms:
        out.append(
            Contender(
                f"fr_remote_w{w}",
                f"fastrollout remote, wait {w} ms",
                _fr_builder(args, None, w),
                wait_ms=w,
                remote=True,
            )
        )
    if not args.no_rllib:
        for w in args.wait_ms:
            out.append(
                Contender(
                    f"rllib_remote_w{w}",
                    f"RLlib 2.60 remote, wait {w} ms",
                    _rllib_builder(args, w),
                    wait_ms=w,
                    remote=True,
                )
            )
        out.append(Contender("rllib_sync", "RLlib 2.60 lockstep", _rllib_builder(args, None)))
    if args.only:
        out = [c for c in out if any(c.key.startswith(p) for p in args.only)]
    return out


def measure(c: Contender, args: argparse.Namespace) -> None:
    """Builds one contender, warms it up, times ``--rounds`` windows of ``--seconds``, stops it.

    Appends each window's steps per second to ``c.rounds``; sets ``c.error`` where the
    contender cannot run.

    Args:
        c: The contender.
        args: The parsed command line.
    """
    before = _live_actor_ids() if c.remote else set()
    t_build = time.perf_counter()
    try:
        s = c.build()
    except Exception as e:  # a contender that does not build is reported
        c.error = f"does not build: {type(e).__name__}: {str(e).splitlines()[0][:160]}"
        return
    try:
        # Warm up until every sub-env has stepped (remote sub-envs start one process each,
        # seconds apart on 2 cores) and at least --warmup calls were made.
        t_warm, seen, calls = time.perf_counter(), np.zeros(NUM_ENVS), 0
        while calls < args.warmup or (
            not seen.all() and time.perf_counter() - t_warm < args.max_warmup_s
        ):
            seen += s.sample()[1]
            s.between()
            calls += 1
        c.build_s = t_warm - t_build
        c.warmup_s = time.perf_counter() - t_warm
        c.backend = s.backend
        if not seen.all():
            c.error = f"sub-envs {np.flatnonzero(seen == 0).tolist()} never stepped in warm-up"
            return
        if c.remote:
            c.new_actors = len(_live_actor_ids() - before)
            if c.new_actors < NUM_ENVS:
                c.error = (
                    f"remote_worker_envs=True started {c.new_actors} actors for "
                    f"{NUM_ENVS} sub-envs (not remote)"
                )
                return
        stepped_by = f" (sub-envs stepped by {c.backend})" if c.backend else ""
        print(
            f"  {c.name}: built in {c.build_s:.1f} s, every sub-env stepped "
            f"{c.warmup_s:.1f} s later{stepped_by}",
            flush=True,
        )
        for r in range(args.rounds):
            steps, counts = 0, np.zeros(NUM_ENVS)
            t0 = time.perf_counter()
            while True:
                n, by = s.sample()
                s.between()
                steps += n
                counts += by
                elapsed = time.perf_counter() - t0
                if elapsed >= args.seconds:
                    break
            if counts.sum() != steps:
                raise AssertionError(f"{c.key}: {counts.sum()} steps by sub-env, {steps} in all")
            c.rounds.append(steps / elapsed)
            c.by_sub_env += counts
            c.seconds += elapsed
            print(f"    round {r + 1}: {c.rounds[-1]:,.0f} env steps/s", flush=True)
    except Exception as e:  # reported in the table, the other contenders still run
        c.error = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:160]}"
    finally:
        s.stop()


def median(c: Contender) -> float | None:
    return statistics.median(c.rounds) if c.rounds and not c.error else None


def ratios(
    c_value: float | None,
    row_wait: int | None,
    by_key: dict[str, Contender],
    args: argparse.Namespace,
) -> dict[str, float | None]:
    """The ratios of one row's steps/s against lockstep sync, async and RLlib remote.

    Args:
        c_value: The row's steps/s.
        row_wait: The row's wait in ms (None for rows without one).
        by_key: Every contender by key.
        args: The parsed command line.

    Returns:
        ``{"vs_sync": ..., "vs_async": ..., "vs_rllib_remote": ...}`` (None where a side
        is missing).
    """
    w = row_wait if row_wait is not None else (args.wait_ms[0] if args.wait_ms else None)

    def against(key: str) -> float | None:
        other = by_key.get(key)
        v = median(other) if other else None
        return c_value / v if c_value and v else None

    return {
        "vs_sync": against("fr_sync"),
        "vs_async": against("fr_async"),
        "vs_rllib_remote": against(f"rllib_remote_w{w}") if w is not None else None,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="1 round of 2 s per contender")
    p.add_argument("--json", metavar="F", help="write the results to F")
    p.add_argument("--rounds", type=int, default=3, help="timed windows per contender (3)")
    p.add_argument("--seconds", type=float, default=5.0, help="timed seconds per round (5)")
    p.add_argument("--warmup", type=int, default=1, help="untimed sample() calls (1)")
    p.add_argument(
        "--max-warmup-s",
        type=float,
        default=60.0,
        help="longest warm-up waiting for every sub-env to step (60)",
    )
    p.add_argument("--fragment", type=int, default=25, help="steps per sub-env per call (25)")
    p.add_argument("--wait-ms", type=int, nargs="*", default=[0, 2], help="waits (0 2)")
    p.add_argument(
        "--step-ms",
        type=float,
        nargs=NUM_ENVS,
        default=[1, 2, 3, 4, 5, 6, 7, 8],
        help="each sub-env's step time in ms (1 .. 8)",
    )
    p.add_argument(
        "--shm-workers",
        type=int,
        default=NUM_ENVS,
        help="worker processes of the shared-memory backend (8: one per sub-env)",
    )
    p.add_argument(
        "--shm-batch-size",
        type=int,
        default=1,
        help="sub-envs the runner acts for per turn with the shared-memory backend (1)",
    )
    p.add_argument("--no-rllib", action="store_true", help="leave RLlib out")
    p.add_argument("--only", nargs="+", metavar="KEY", help="contender keys (prefixes)")
    args = p.parse_args(argv)
    if args.shm_workers < 1 or args.shm_batch_size < 1:
        p.error("--shm-workers and --shm-batch-size must be at least 1")
    if args.quick:
        args.rounds, args.seconds = 1, 2.0

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    logging.getLogger("ray.rllib").setLevel(logging.ERROR)
    os.environ.setdefault("RAY_DEDUP_LOGS", "1")

    cs = contenders(args)
    by_key = {c.key: c for c in cs}
    needs_ray = any(c.remote or c.key.startswith("rllib") for c in cs)
    if needs_ray:
        import ray

        ray.init(address="local", num_cpus=2, include_dashboard=False)
        if any(c.key.startswith("rllib") for c in cs):
            _register_rllib_env()
    info = machine()
    ideal = ideal_steps_per_s(args.step_ms)
    print(
        f"machine: {info['cpu']}, {info['cores']} cores; python {info['python']}, torch "
        f"{info['torch']} ({info['torch threads']} thread), ray {info['ray']}, git {info['git']}; "
        f"load average {info['load average (1/5/15 min) at start']}"
    )
    print(
        f"{NUM_ENVS} SlowEnv sub-envs, step_ms {args.step_ms}; {args.fragment} steps per "
        f"sub-env per sample(); {args.rounds} window(s) of >= {args.seconds} s each; "
        f"shared memory: sub_env_backend='shared_memory', num_sub_env_workers="
        f"{args.shm_workers}, sub_env_batch_size={args.shm_batch_size}"
    )
    try:
        for c in cs:
            measure(c, args)
            if c.error:
                print(f"  {c.name}: {c.error}", flush=True)
    finally:
        if needs_ray:
            ray.shutdown()

    rows = []
    for c in cs:
        v = median(c)
        rows.append(
            {
                "key": c.key,
                "name": c.name,
                "steps_per_s": v,
                "rounds": c.rounds,
                "of_ideal": v / ideal if v else None,
                "steps_per_s_by_sub_env": (c.by_sub_env / c.seconds).tolist()
                if c.seconds
                else None,
                "sub_env_actors": c.new_actors,
                "build_s": c.build_s,
                "warmup_s": c.warmup_s,
                "backend": c.backend,
                "error": c.error,
                **ratios(v, c.wait_ms, by_key, args),
            }
        )
    rows.append(
        {
            "key": "ideal",
            "name": "ideal (each sub-env at its own speed)",
            "steps_per_s": ideal,
            "rounds": [],
            "of_ideal": 1.0,
            "steps_per_s_by_sub_env": [1000.0 / ms for ms in args.step_ms],
            "sub_env_actors": None,
            "error": None,
            **ratios(ideal, None, by_key, args),
        }
    )

    head = ["contender", "env steps/s", "of ideal", "vs sync", "vs async", "vs RLlib remote"]
    body = [
        [
            r["name"],
            fmt(r["steps_per_s"]) if not r["error"] else "n/a",
            f"{r['of_ideal']:.0%}" if r["of_ideal"] else "-",
            fmt(r["vs_sync"], True),
            fmt(r["vs_async"], True),
            fmt(r["vs_rllib_remote"], True),
        ]
        for r in rows
    ]
    widths = [max(len(x[i]) for x in [head, *body]) for i in range(len(head))]
    print()
    for line in [head, *body]:
        cells = [x.rjust(w) for x, w in zip(line, widths, strict=True)]
        cells[0] = line[0].ljust(widths[0])
        print("  ".join(cells))
    print()
    print("env steps/s by sub-env (step_ms " + " ".join(f"{m:g}" for m in args.step_ms) + "):")
    for r in rows:
        by = r["steps_per_s_by_sub_env"]
        if by and not r["error"]:
            print(f"  {r['name'].ljust(widths[0])}  " + " ".join(f"{x:5.0f}" for x in by))
    for r in rows:
        if r["error"]:
            print(f"left out: {r['name']}: {r['error']}")
    info["load average (1/5/15 min) at end"] = load_average()
    print(f"load average at end: {info['load average (1/5/15 min) at end']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"machine": info, "args": vars(args), "ideal": ideal, "rows": rows}, f, indent=2
            )
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
