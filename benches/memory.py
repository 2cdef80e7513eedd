"""Memory: bytes held per stored step against the raw bytes of the data; RSS over sampling.

Usage::

    python benches/memory.py [--steps-rss 1000000] [--skip-rss] [--cases scene] [--json out.json]

1. **Bytes per stored step.** Each case runs in a fresh child process: it measures the
   process's memory, builds many finished episodes and holds them (after ``to_numpy``),
   and measures again. The growth divided by the steps held is compared with the raw bytes
   of the data: the ``nbytes`` of the numpy arrays the episodes hand out (observations
   including the reset one, actions, rewards, every extra model output). Two growths:
   **RSS** (what the OS sees; it also counts the free holes the C heap keeps between live
   blocks, which depend on everything else the process allocated meanwhile) and **live**
   bytes (blocks in use: glibc's ``mallinfo2``, Python's small-object allocator, which
   takes its arenas from ``mmap``, and fastrollout's native allocator, mimalloc, which
   counts its own; the three do not overlap). Cases: CartPole
   episodes from fastrollout's runner, episodes recorded by hand (``add_env_step``) with
   CartPole and 84x84x4 uint8 observations, each with RLlib 2.60's episode alongside; and
   the runner on ``SyntheticImageEnv(frames="scene")`` (84x84x4 uint8 frame stacks of the
   moving-shapes scene, 2 sub-envs, random actions) with and without
   ``compress_observations``: done 100-step episodes (``sample(num_episodes=2)``) and
   50-step chunks of 1000-step episodes (``sample(num_timesteps=100)``). For those the
   table also gives the observations' stored bytes per step (``_stored_bytes``: the
   compressed blocks plus the items kept uncompressed), and the growths are what dropping
   the held episodes frees, live bytes only (the runner's own buffers would blur a growth
   over sampling; the allocators keep most freed memory, so RSS cannot tell a drop). The
   "through pickle" cases hold what a remote runner's ``sample()`` becomes on the driver:
   each call's list of chunks pickled and unpickled, as Ray moves it; the table adds the
   pickled bytes per step.
   ``--cases`` runs only the cases whose name contains the given text.
2. **RSS over sampling.** fastrollout's ``SingleAgentEnvRunner`` (CartPole-v1, 8 sub-envs)
   samples ``--steps-rss`` env steps in calls of 1000, dropping the episodes and reducing
   the metrics every 20 calls, as a training loop does; RSS is printed every 10 % of the
   way. Flat means: no growth after the warm-up beyond allocator noise.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time
import warnings
from typing import Any

import numpy as np

CASES = {
    "runner CartPole-v1 (fastrollout runner, 8 sub-envs, 200k steps)": "runner",
    "CartPole obs, add_env_step x200 per episode, 2000 episodes: fastrollout": "sa_fr",
    "CartPole obs, add_env_step x200 per episode, 2000 episodes: RLlib 2.60": "sa_rllib",
    "84x84x4 uint8 obs, add_env_step x100 per episode, 50 episodes: fastrollout": "img_fr",
    "84x84x4 uint8 obs, add_env_step x100 per episode, 50 episodes: RLlib 2.60": "img_rllib",
    "scene runner, done 100-step episodes x20: uncompressed": "scene_done_plain",
    "scene runner, done 100-step episodes x20: compress_observations": "scene_done_packed",
    "scene runner, 50-step chunks x40: uncompressed": "scene_chunks_plain",
    "scene runner, 50-step chunks x40: compress_observations": "scene_chunks_packed",
    "scene runner, 50-step chunks x40 through pickle: uncompressed": "scene_chunks_plain_pickled",
    "scene runner, 50-step chunks x40 through pickle: compress_observations": (
        "scene_chunks_packed_pickled"
    ),
}


def rss_bytes() -> int:
    """The resident set size of this process.

    Returns:
        Bytes.
    """
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def live_bytes() -> int | None:
    """Bytes in live heap blocks: the C heap's (glibc), Python's small-object allocator's
    and fastrollout's native allocator's.

    Returns:
        Bytes, or None where glibc's ``mallinfo2`` is not available.
    """
    import ctypes
    import tempfile

    class _MallInfo2(ctypes.Structure):
        _fields_ = [
            (name, ctypes.c_size_t)
            for name in [
                "arena",
                "ordblks",
                "smblks",
                "hblks",
                "hblkhd",
                "usmblks",
                "fsmblks",
                "uordblks",
                "fordblks",
                "keepcost",
            ]
        ]

    try:
        mallinfo2 = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return None
    mallinfo2.restype = _MallInfo2
    info = mallinfo2()
    # sys._debugmallocstats() prints pymalloc's totals on the C stderr.
    with tempfile.TemporaryFile(mode="w+") as out:
        saved = os.dup(2)
        try:
            sys.stderr.flush()
            os.dup2(out.fileno(), 2)
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        out.seek(0)
        stats = out.read()
    line = next(x for x in stats.splitlines() if x.startswith("# bytes in allocated blocks"))
    # fastrollout's own blocks come from its allocator (mimalloc), which keeps the count.
    from fastrollout._core import native_heap_bytes

    pymalloc = int(line.split("=")[1].replace(",", ""))
    return info.uordblks + info.hblkhd + pymalloc + native_heap_bytes()


def _raw_bytes(episode: Any) -> int:
    """The bytes of the data an episode hands out as numpy (no bookkeeping, no look-back)."""
    total = np.asarray(episode.get_observations()).nbytes
    total += np.asarray(episode.get_actions()).nbytes
    total += np.asarray(episode.get_rewards()).nbytes
    for key in episode.extra_model_outputs:
        total += np.asarray(episode.get_extra_model_outputs(key)).nbytes
    return total


def _by_hand(cls: Any, obs_shape: tuple[int, ...], dtype: Any, episodes: int, steps: int):
    import gymnasium as gym

    if np.issubdtype(dtype, np.integer):
        space = gym.spaces.Box(0, 255, obs_shape, dtype)
    else:
        space = gym.spaces.Box(-1.0, 1.0, obs_shape, dtype)
    rng = np.random.default_rng(0)
    frames = [rng.integers(0, 255, obs_shape).astype(dtype) for _ in range(8)]
    held = []
    for _ in range(episodes):
        e = cls(observation_space=space, action_space=gym.spaces.Discrete(2))
        e.add_env_reset(observation=frames[0])
        for t in range(steps):
            e.add_env_step(
                frames[(t + 1) % 8],
                t % 2,
                1.0,
                truncated=t == steps - 1,
                extra_model_outputs={"action_logp": np.float32(-0.69)},
            )
        held.append(e.to_numpy())
    return held


def _runner_episodes(steps: int):
    import torch

    import fastrollout as fr

    torch.set_num_threads(1)
    c = fr.RunnerConfig().environment("CartPole-v1").resources(device="cpu").debugging(seed=0)
    runner = fr.SingleAgentEnvRunner(config=c.env_runners(num_envs_per_env_runner=8))
    runner.sample(num_timesteps=1000)
    gc.collect()
    before = rss_bytes(), live_bytes()
    held = []
    while sum(len(e) for e in held) < steps:
        held.extend(runner.sample(num_timesteps=1000))
        runner.get_metrics()
    return held, before


def _scene_episodes(chunks: bool, compress: bool, pickled: bool = False):
    """Episodes of the moving-shapes scene from the runner: 20 done 100-step episodes, or
    40 chunks of 50 steps (``sample`` cuts 1000-step episodes); with ``pickled``, each
    ``sample()`` list through pickle (as from a remote runner), and the pickled bytes."""
    import pickle

    import torch

    import fastrollout as fr
    from fastrollout.env.examples import SyntheticImageEnv

    torch.set_num_threads(1)
    env_config = {"frames": "scene", "episode_len": 1000 if chunks else 100}
    c = (
        fr.RunnerConfig()
        .environment(SyntheticImageEnv, env_config=env_config)
        .resources(device="cpu")
        .debugging(seed=0)
        .env_runners(num_envs_per_env_runner=2, compress_observations=compress)
    )
    runner = fr.SingleAgentEnvRunner(config=c)

    def sample() -> list[Any]:
        if chunks:
            return runner.sample(num_timesteps=100, random_actions=True)  # type: ignore[no-any-return]
        return runner.sample(num_episodes=2, random_actions=True)  # type: ignore[no-any-return]

    sample()
    runner.get_metrics()
    gc.collect()
    before = rss_bytes(), live_bytes()
    held: list[Any] = []
    pickled_bytes = 0
    while len(held) < (40 if chunks else 20):
        batch = sample()
        if pickled:
            data = pickle.dumps(batch)
            pickled_bytes += len(data)
            batch = pickle.loads(data)
        held.extend(batch)
        # Drop the metrics' references to the episodes (a training loop reduces them).
        runner.get_metrics()
    return held, before, pickled_bytes


def child(case: str) -> dict[str, Any]:
    """Measures one case (in a fresh process).

    Args:
        case: A value of ``CASES``.

    Returns:
        ``{"steps", "held_bytes", "live_bytes", "raw_bytes", "stored_obs_bytes",
        "pickled_bytes"}`` (``live_bytes`` None where it cannot be measured;
        ``stored_obs_bytes`` and, as RSS cannot tell a drop, not ``held_bytes``, for the
        scene cases; ``pickled_bytes`` for the cases through pickle).
    """
    warnings.simplefilter("ignore")
    import fastrollout as fr

    pickled = None
    if case == "runner":
        held, before = _runner_episodes(200_000)
    elif case.startswith("scene"):
        held, before, pickled = _scene_episodes(
            "chunks" in case, "packed" in case, case.endswith("pickled")
        )
    else:
        if case.endswith("rllib"):
            from ray.rllib.env.single_agent_episode import SingleAgentEpisode as cls
        else:
            cls = fr.SingleAgentEpisode
        # Import and warm up first, so that the measurement sees only the episodes.
        _by_hand(cls, (4,), np.float32, 2, 10)
        gc.collect()
        before = rss_bytes(), live_bytes()
        if case.startswith("img"):
            held = _by_hand(cls, (84, 84, 4), np.uint8, 50, 100)
        else:
            held = _by_hand(cls, (4,), np.float32, 2000, 200)
    gc.collect()
    after = rss_bytes(), live_bytes()
    steps = sum(len(e) for e in held)
    raw = sum(_raw_bytes(e) for e in held)
    stored = None
    if case.startswith("scene"):
        stored = sum(e._stored_bytes("observations") for e in held)
        # The runner's own buffers change between the two measurements by about as much
        # as compressed episodes hold: measure instead what dropping the episodes frees.
        del held
        gc.collect()
        before = rss_bytes(), live_bytes()
    live = None if after[1] is None or before[1] is None else after[1] - before[1]
    return {
        "steps": steps,
        # Allocators keep most freed memory: RSS tells nothing about a drop.
        "held_bytes": None if stored is not None else after[0] - before[0],
        "live_bytes": live,
        "raw_bytes": raw,
        "stored_obs_bytes": stored,
        "pickled_bytes": pickled or None,
    }


def rss_over_sampling(total: int) -> list[tuple[int, int]]:
    """RSS while fastrollout's runner samples ``total`` env steps.

    Args:
        total: Env steps to sample.

    Returns:
        ``(steps so far, RSS bytes)`` every 10 % of the way (the first after 1 %).
    """
    import torch

    import fastrollout as fr

    torch.set_num_threads(1)
    c = fr.RunnerConfig().environment("CartPole-v1").resources(device="cpu").debugging(seed=0)
    runner = fr.SingleAgentEnvRunner(config=c.env_runners(num_envs_per_env_runner=8))
    done, calls, points = 0, 0, []
    marks = [total // 100] + [total * k // 10 for k in range(1, 11)]
    t0 = time.perf_counter()
    while done < total:
        episodes = runner.sample(num_timesteps=1000)
        done += sum(len(e) for e in episodes)
        del episodes
        calls += 1
        if calls % 20 == 0:
            runner.get_metrics()
        while marks and done >= marks[0]:
            marks.pop(0)
            gc.collect()
            points.append((done, rss_bytes()))
            print(
                f"  {done:>9} steps  RSS {points[-1][1] / 2**20:8.1f} MiB  "
                f"({time.perf_counter() - t0:.0f} s)",
                flush=True,
            )
    return points


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--steps-rss", type=int, default=1_000_000)
    parser.add_argument("--skip-rss", action="store_true")
    parser.add_argument("--cases", default="", help="only the cases whose name contains this")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child)))
        return 0
    out: dict[str, Any] = {"bytes_per_step": {}}
    print(
        "| case | steps held | raw bytes / step | RSS bytes / step | RSS / raw "
        "| live bytes / step | live / raw | obs stored bytes / step | pickled bytes / step |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, case in CASES.items():
        if args.cases not in name:
            continue
        res = subprocess.run(
            [sys.executable, __file__, "--child", case],
            check=True,
            capture_output=True,
            text=True,
        )
        r = json.loads(res.stdout.strip().splitlines()[-1])
        raw = r["raw_bytes"] / r["steps"]
        out["bytes_per_step"][name] = r
        live = "| - | - |"
        if r["live_bytes"] is not None:
            per_step = r["live_bytes"] / r["steps"]
            live = f"| {per_step:.1f} | {per_step / raw:.2f} |"
        stored = r.get("stored_obs_bytes")
        stored_cell = "-" if stored is None else f"{stored / r['steps']:.1f}"
        pickled = r.get("pickled_bytes")
        stored_cell += " | " + ("-" if pickled is None else f"{pickled / r['steps']:.1f}")
        rss = "| - | -"
        if r["held_bytes"] is not None:
            held = r["held_bytes"] / r["steps"]
            rss = f"| {held:.1f} | {held / raw:.2f}"
        print(
            f"| {name} | {r['steps']} | {raw:.1f} {rss} {live} {stored_cell} |",
            flush=True,
        )
    if not args.skip_rss:
        print(f"\nRSS while fastrollout samples {args.steps_rss} env steps (CartPole-v1, 8 envs):")
        points = rss_over_sampling(args.steps_rss)
        out["rss"] = points
        (n0, first), (n1, last) = points[1], points[-1]
        print(
            f"growth from {n0} to {n1} steps: {(last - first) / 2**20:+.2f} MiB "
            f"({(last - first) / (n1 - n0):.3f} bytes per step)"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
