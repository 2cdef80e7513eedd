"""The policy server under load: a runner's ``PolicyServerEnv`` against the ``BareServer``.

Usage::

    python benches/policy_server.py [--clients 1 16 64] [--seconds 5] [--warmup-s 1]
                                    [--obs-dim 4] [--episode-len 100] [--rounds 3]
                                    [--sample-timesteps 2000] [--batch-wait-ms 0]
                                    [--only policy bare] [--json F] [--profile DIR]

The load is ``examples/rust_client``'s ``loadgen`` (built here with ``cargo build
--release``): N threads, one TCP connection each, on 127.0.0.1. Each loops
``start_episode``, then ``--episode-len`` times ``get_action`` (an observation inside
``Box(-1, 1, (obs_dim,), float32)``) and ``log_returns``, then ``end_episode``; it times
every ``get_action`` round trip after ``--warmup-s`` and reports actions/s and the p50/p99
latency.

Servers, each in a process of its own, started fresh for every run (so that the load
generator, this harness and the server share no GIL):

- **policy**: ``fastrollout.external.PolicyServerEnv`` (``Discrete(2)`` actions) as the env
  of a ``SingleAgentEnvRunner`` with the default module (PPO's 256x256 tanh MLP, torch on
  the CPU, one thread), remote inference: the process's main thread keeps calling
  ``runner.sample(num_timesteps=--sample-timesteps)`` (``remote_env_batch_wait_ms`` =
  ``--batch-wait-ms``); every turn the runner acts, in one forward pass, for all episodes
  that wait. The server's I/O loop is the env's thread, in the same process.
- **bare**: ``fastrollout.external.BareServer``: the same I/O loop, answering each frame at
  once without a runner or inference: the ceiling for the protocol and I/O in Python.

Rounds alternate the two servers; the table gives each one's median run. The ratio is
policy / bare actions per second (the project's goal: at least 0.5 at 64 clients). A
second table gives each server thread's CPU share while the load ran (from
``/proc/self/task``): the policy server's threads share one GIL, so shares that add up to
about 1 mean the GIL bounds it. With ``--profile DIR`` every Python thread of each server
runs under cProfile (started per thread, since cProfile profiles only the thread that
enables it) and ``DIR/<server>_<clients>_r<round>_<thread>.pstats`` is written; the top
functions by own time are printed. A profiled run is slower (the heading says PROFILED).

On a 2-core machine the load generator's threads and the server share the CPUs: the
figures are those of both together, not of the server alone.

Not a test: it prints numbers (see ``docs/policy_server_bench.md``).
"""

from __future__ import annotations

import argparse
import datetime
import io
import json
import multiprocessing as mp
import os
import platform
import pstats
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

# OpenBLAS threads spin after each BLAS call and would take a core of a 2-core machine.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

ROOT = Path(__file__).resolve().parent.parent
CRATE = ROOT / "examples" / "rust_client"
TARGET = ROOT / "target" / "rust_client"
LOADGEN = TARGET / "release" / "loadgen"
START_TIMEOUT_S = 120


def build_loadgen() -> Path:
    """Builds ``examples/rust_client`` in release mode (a no-op when it is up to date)."""
    cargo = shutil.which("cargo")
    if cargo is None:
        sys.exit("cargo is not on PATH: the load generator (examples/rust_client) needs it")
    manifest = ["--manifest-path", str(CRATE / "Cargo.toml"), "--target-dir", str(TARGET)]
    subprocess.run(
        [cargo, "build", "--release", "--locked", "-q", *manifest], check=True, timeout=600
    )
    return LOADGEN


# ---------------------------------------------------------------------------- servers


def _profile_threads() -> list[tuple[str, Any]]:
    """Profiles every Python thread started from now on, and this one (cProfile is per
    thread): a thread's first profile event installs its own profiler."""
    import cProfile

    profilers: list[tuple[str, Any]] = []

    def install(frame: Any, event: str, arg: Any) -> None:
        p = cProfile.Profile()
        profilers.append((threading.current_thread().name, p))
        p.enable()

    threading.setprofile(install)
    main = cProfile.Profile()
    profilers.append(("main", main))
    main.enable()
    return profilers


def _thread_cpu_s() -> dict[str, float]:
    """CPU seconds (user + system) of each thread of this process, by thread name."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for task in Path("/proc/self/task").iterdir():
        stat = (task / "stat").read_text()
        fields = stat[stat.rindex(")") + 2 :].split()
        name = names.get(int(task.name), f"native-{task.name}")
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


def serve(kind: str, args: dict[str, Any], conn: Any) -> None:
    """A server process: sends its port, serves until told to stop, sends its counters.

    Args:
        kind: ``"policy"`` or ``"bare"``.
        args: ``obs_dim``, ``sample_timesteps``, ``batch_wait_ms``, ``profile`` (a file
            prefix or None).
        conn: One end of a pipe.
    """
    import gymnasium as gym
    import numpy as np
    import torch

    torch.set_num_threads(1)
    profilers = _profile_threads() if args["profile"] else []
    act_space = gym.spaces.Discrete(2)
    obs_space = gym.spaces.Box(-1.0, 1.0, (args["obs_dim"],), np.float32)
    counters: dict[str, Any] = {}
    if kind == "bare":
        from fastrollout.external import BareServer

        server = BareServer(act_space, obs_space, address="127.0.0.1", port=0)
        server.start()
        conn.send(server.port)
        cpu0, t0 = _thread_cpu_s(), time.perf_counter()
        conn.recv()
        cpu1, t1 = _thread_cpu_s(), time.perf_counter()
        server.close()
    else:
        import fastrollout as fr
        from fastrollout.external import PolicyServerEnv

        config = fr.RunnerConfig().resources(device="cpu").debugging(seed=0)
        config = config.env_runners(remote_env_batch_wait_ms=args["batch_wait_ms"])
        config = config.environment(
            lambda ctx: PolicyServerEnv(act_space, obs_space, address="127.0.0.1")
        )
        runner = fr.SingleAgentEnvRunner(config=config)
        counters.update(sample_calls=0, timesteps=0, sample_s=0.0, error=None)
        stop = threading.Event()
        marks: dict[str, Any] = {}

        def wait_for_stop() -> None:
            marks["start"] = _thread_cpu_s(), time.perf_counter()
            conn.recv()
            marks["end"] = _thread_cpu_s(), time.perf_counter()
            stop.set()
            runner.stop()  # (a sample() that waits for clients raises)

        conn.send(runner.env.port)
        stopper = threading.Thread(target=wait_for_stop, name="stopper", daemon=True)
        stopper.start()
        # The runner samples on the main thread, as a training loop does. torch's thread
        # settings are per thread: sampled from another thread, the module's tanh ran on
        # a second OpenMP thread that spun between calls (0.4-0.8 of a core).
        while not stop.is_set():
            t0 = time.perf_counter()
            try:
                episodes = runner.sample(num_timesteps=args["sample_timesteps"])
            except Exception as err:
                if not stop.is_set():
                    counters["error"] = repr(err)
                break
            counters["sample_s"] += time.perf_counter() - t0
            counters["sample_calls"] += 1
            counters["timesteps"] += sum(len(e) for e in episodes)
        stopper.join(timeout=30)
        (cpu0, t0), (cpu1, t1) = marks["start"], marks["end"]
    # Each thread's share of the wall time while the load ran (Linux only): threads of one
    # process whose shares add up to about 1 are bounded by the GIL.
    counters["wall_s"] = round(t1 - t0, 3)
    counters["cpu_share"] = {
        name: round((cpu1[name] - cpu0.get(name, 0.0)) / (t1 - t0), 2)
        for name in cpu1
        if cpu1[name] - cpu0.get(name, 0.0) > 0.01 * (t1 - t0)
    }
    if profilers:
        for name, p in profilers:
            p.snapshot_stats()
            if p.stats:
                p.dump_stats(f"{args['profile']}_{name}.pstats")
        counters["profiles"] = [name for name, p in profilers if p.stats]
    conn.send(counters)


class Server:
    """A server process (``serve``) and its port."""

    def __init__(self, kind: str, args: dict[str, Any]) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=serve, args=(kind, args, child), daemon=True)
        self.proc.start()
        if not self.conn.poll(START_TIMEOUT_S):
            self.proc.kill()
            raise RuntimeError(f"the {kind} server did not start in {START_TIMEOUT_S} s")
        self.port: int = self.conn.recv()

    def stop(self) -> dict[str, Any]:
        """Stops the server; returns its counters ({} if it did not answer in 30 s)."""
        counters: dict[str, Any] = {}
        try:
            self.conn.send("stop")
            if self.conn.poll(30):
                counters = self.conn.recv()
        except (BrokenPipeError, EOFError):
            pass
        self.proc.join(timeout=10)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()
        return counters


def run_loadgen(loadgen: Path, port: int, clients: int, a: argparse.Namespace) -> dict[str, Any]:
    """One ``loadgen`` run; its JSON object."""
    cmd = [str(loadgen), "--address", f"127.0.0.1:{port}", "--clients", str(clients)]
    cmd += ["--seconds", str(a.seconds), "--warmup-s", str(a.warmup_s)]
    cmd += ["--obs-dim", str(a.obs_dim), "--episode-len", str(a.episode_len), "--timeout-s", "30"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=a.seconds + a.warmup_s + 120)
    if proc.returncode != 0:
        raise RuntimeError(f"loadgen failed ({proc.returncode}): {proc.stderr.strip()}")
    return json.loads(proc.stdout)


def measure(
    loadgen: Path, kind: str, clients: int, r: int, a: argparse.Namespace
) -> dict[str, Any]:
    """One run: a fresh server of one kind, one ``loadgen``; its JSON with the server's
    counters under ``"server"``."""
    profile = str(Path(a.profile) / f"{kind}_{clients}_r{r}") if a.profile else None
    server = Server(
        kind,
        {
            "obs_dim": a.obs_dim,
            "sample_timesteps": a.sample_timesteps,
            "batch_wait_ms": a.batch_wait_ms,
            "profile": profile,
        },
    )
    try:
        out = run_loadgen(loadgen, server.port, clients, a)
    finally:
        counters = server.stop()
    out["server"] = counters
    print(
        f"  {kind:6s} clients={clients:3d} round {r}: {out['actions_per_s']:9.0f} actions/s "
        f"p50 {out['p50_us']:8.1f} us  p99 {out['p99_us']:8.1f} us  {counters}",
        file=sys.stderr,
        flush=True,
    )
    return out


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run of median throughput (its latencies are reported with it)."""
    run = dict(sorted(runs, key=lambda o: o["actions_per_s"])[(len(runs) - 1) // 2])
    run["rounds"] = [o["actions_per_s"] for o in runs]
    run["median_actions_per_s"] = statistics.median(run["rounds"])
    return run


def print_profiles(directory: str, top: int = 15) -> None:
    """The top functions by own time of each profiled server thread."""
    for path in sorted(Path(directory).glob("*.pstats")):
        if path.name.endswith("_main.pstats"):
            continue  # (the process's main thread waits on its pipe)
        s = io.StringIO()
        pstats.Stats(str(path), stream=s).sort_stats("tottime").print_stats(top)
        print(f"\n### {path.name}\n```\n{s.getvalue().strip()}\n```")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--clients", type=int, nargs="+", default=[1, 16, 64])
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--warmup-s", type=float, default=1.0)
    p.add_argument("--obs-dim", type=int, default=4)
    p.add_argument("--episode-len", type=int, default=100)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--sample-timesteps", type=int, default=2000)
    p.add_argument("--batch-wait-ms", type=float, default=0.0)
    p.add_argument("--only", choices=["policy", "bare"], nargs="+", default=["policy", "bare"])
    p.add_argument("--json", help="write the results to this file")
    p.add_argument("--profile", metavar="DIR", help="cProfile the server threads")
    a = p.parse_args()
    if a.profile:
        Path(a.profile).mkdir(parents=True, exist_ok=True)

    loadgen = build_loadgen()
    results: dict[int, dict[str, dict[str, Any]]] = {}
    for clients in a.clients:
        # Rounds alternate the servers, so that a slower minute of a shared machine does not
        # fall on one server only.
        runs: dict[str, list[dict[str, Any]]] = {kind: [] for kind in a.only}
        for r in range(a.rounds):
            for kind in a.only:
                runs[kind].append(measure(loadgen, kind, clients, r, a))
        results[clients] = {kind: median_run(runs[kind]) for kind in a.only}

    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    print(
        f"\n{datetime.date.today()}, commit {commit}, {platform.processor() or platform.machine()}"
        f", {os.cpu_count()} CPUs; {a.seconds:g} s per run after {a.warmup_s:g} s warm-up, "
        f"obs_dim {a.obs_dim}, episodes of {a.episode_len} actions, median of {a.rounds} "
        f"round(s){', PROFILED' if a.profile else ''}\n"
    )
    head = "| clients |"
    rule = "|--------:|"
    for kind in a.only:
        head += f" {kind} actions/s | {kind} p50 us | {kind} p99 us |"
        rule += "---:|---:|---:|"
    if len(a.only) == 2:
        head += " policy / bare |"
        rule += "---:|"
    print(head)
    print(rule)
    for clients, by_kind in results.items():
        row = f"| {clients} |"
        for kind in a.only:
            o = by_kind[kind]
            row += f" {o['median_actions_per_s']:,.0f} | {o['p50_us']:,.0f} | {o['p99_us']:,.0f} |"
        if len(a.only) == 2:
            ratio = (
                by_kind["policy"]["median_actions_per_s"] / by_kind["bare"]["median_actions_per_s"]
            )
            row += f" {ratio:.2f} |"
        print(row)
    print(
        "\nCPU share of each server thread during the load (1.0 = one core; the policy "
        "server's two threads share one GIL), in the median run:\n"
    )
    print("| clients | server | threads |")
    print("|--------:|--------|---------|")
    for clients, by_kind in results.items():
        for kind in a.only:
            shares = by_kind[kind]["server"].get("cpu_share", {})
            text = ", ".join(f"{name} {v:.2f}" for name, v in sorted(shares.items()))
            print(f"| {clients} | {kind} | {text} |")
    if a.json:
        Path(a.json).write_text(json.dumps({str(k): v for k, v in results.items()}, indent=1))
    if a.profile:
        print_profiles(a.profile)


if __name__ == "__main__":
    main()
