"""``side_by_side.py`` for two builds of fastrollout, alternating, in one run.

Usage::

    python benches/before_after.py --before DIR [--rounds N] [side_by_side options ...]

``DIR`` holds the earlier build's ``fastrollout`` package (with its built ``_core``
extension); for example, for a revision REV built once with ``make build``::

    git archive REV python | tar -x -C DIR   # then copy REV's python/fastrollout/_core*.so
                                             # into DIR/python/fastrollout/

Each round runs ``side_by_side.py`` once with ``DIR`` first on ``PYTHONPATH`` (the earlier
build) and once with this checkout, one after the other, so that the machine's slow phases
fall on both. The table gives, per workload, the median over the rounds of each build's
fastrollout / bare-loop ratio and RLlib / fastrollout ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def _run(pythonpath: str, argv: list[str], out: str) -> list[dict[str, Any]]:
    env = dict(os.environ)
    extra = env.get("PYTHONPATH")
    env["PYTHONPATH"] = pythonpath + (os.pathsep + extra if extra else "")
    cmd = [sys.executable, os.path.join(HERE, "side_by_side.py"), *argv, "--json", out]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"side_by_side.py failed ({pythonpath}):\n{done.stdout}{done.stderr}")
    with open(out) as f:
        return json.load(f)["results"]  # type: ignore[no-any-return]


def _median(values: list[Any]) -> float | None:
    xs = [float(v) for v in values if isinstance(v, (int, float))]
    return statistics.median(xs) if xs else None


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}x"


def main(argv: list[str] | None = None) -> int:
    """Runs the rounds and prints the table.

    Args:
        argv: Command-line arguments (default ``sys.argv[1:]``).

    Returns:
        The exit status.
    """
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", required=True, help="directory of the earlier build")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds")
    args, rest = parser.parse_known_args(argv)
    before = os.path.join(os.path.abspath(args.before), "python")
    if not os.path.isdir(os.path.join(before, "fastrollout")):
        parser.error(f"{before} holds no fastrollout package")
    after = os.path.join(ROOT, "python")
    runs: dict[str, list[list[dict[str, Any]]]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.rounds):
            for name, path in (("before", before), ("after", after)):
                runs[name].append(_run(path, rest, os.path.join(tmp, f"{name}{i}.json")))
                print(f"[{i + 1}/{args.rounds}] {name} done", file=sys.stderr, flush=True)
    names = [r["name"] for r in runs["after"][0]]
    print("| workload | fastrollout / bare, before | after | RLlib / fastrollout, before | after |")
    print("|---|---:|---:|---:|---:|")
    for name in names:
        cells = []
        for key in ("fastrollout/bare", "rllib/fastrollout"):
            for which in ("before", "after"):
                vals = [r.get(key) for run in runs[which] for r in run if r["name"] == name]
                cells.append(_fmt(_median(vals)))
        print(f"| {name} | {cells[0]} | {cells[1]} | {cells[2]} | {cells[3]} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
