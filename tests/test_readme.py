"""The code of README.md and of the docs pages runs as written, so they cannot drift.

Every ```python block of README.md and of docs/*.md runs on its own in a fresh
interpreter, with a temporary directory as its working directory and a time limit, except
a block whose fence is preceded by a line ``<!-- not run: why -->`` (a fragment that
continues an earlier block, or a loop that serves for ever). Blocks that use Ray do as
the README shows (a bare ``ray.init()``, or an RLlib algorithm that starts Ray itself):
every block runs with ``RAY_ADDRESS=local``, with which ``ray.init()`` starts a new local
instance (without it Ray joins whatever cluster an earlier run left in its temp files, or
hangs if that one is gone), and the instance ends with the block's process.

Of the ```bash blocks, the ``python -m fastrollout ...`` commands run too, each as written
except that ``sample`` commands get ``--timesteps 2000`` appended (the last value of an
option counts, so the README's own count, up to 100,000 env steps, is replaced by a small
one). The other bash lines do not run here: ``make test`` and ``make demo`` are what CI runs
(``.ci/run``); ``make wheel`` and the install of its wheel run in ``tests/test_install.py``
(``pip install .`` from PyPI, with torch's CUDA build, would take minutes and gigabytes);
``python examples/...`` and ``python benches/...`` commands train or measure for minutes.

The three blocks that start Ray take 18-25 s each, mostly waiting for Ray and its actors,
the others 2-5 s; they run side by side (see ``running``). On the 2-core development machine
while it ran other work (load average 4-10), the 25 blocks and commands took 3-6 minutes.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
# The pages whose code runs: the README and every page of the docs site.
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]

# A block's language tag, its text, and the fence lines around it (```lang ... ```); group 1
# is the line before the fence when that line says the block does not run.
_FENCE = re.compile(r"^(<!-- not run: [^\n]*-->\n)?```(\w*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)

# What starts Ray in a block or command: ray.init, an RLlib algorithm with remote runners,
# remote runners of a group or of the CLI.
_STARTS_RAY = re.compile(r"ray\.init\(|\.build_algo\(|num[-_]env[-_]runners[ =]+[1-9]")

# Small enough to keep every command at a few seconds, large enough for a done episode.
SAMPLE_TIMESTEPS = "2000"

# Per block: the ones that start Ray actors or train take 10-30 s on a quiet 2-core
# machine, and several times that beside other work (blocks run four at a time).
TIMEOUT_S = 420


def _blocks(lang: str, page: Path = README) -> list[tuple[int, str]]:
    """A page's fenced blocks of one language that run, with the line each starts on."""
    text = page.read_text(encoding="utf-8")
    return [
        (text.count("\n", 0, m.start(2)) + 2, m.group(3))
        for m in _FENCE.finditer(text)
        if m.group(2) == lang and m.group(1) is None
    ]


def _cli_commands(page: Path = README) -> list[tuple[int, list[str]]]:
    """The ``python -m fastrollout`` commands of a page's bash blocks, comments stripped."""
    commands = []
    for start, block in _blocks("bash", page):
        lines = block.splitlines()
        offset = 0
        while offset < len(lines):
            # A command continued with a trailing backslash is one command.
            first = offset
            command = lines[offset]
            while command.endswith("\\") and offset + 1 < len(lines):
                offset += 1
                command = command[:-1] + " " + lines[offset]
            offset += 1
            if command.startswith("python -m fastrollout"):
                commands.append((start + first, shlex.split(command, comments=True)[3:]))
    return commands


def _jobs() -> dict[str, tuple[list[str], str]]:
    """Every block and command to run: ``{test id: (python's arguments, what it is)}``."""
    jobs: dict[str, tuple[list[str], str]] = {}
    # A block or command that several pages show (the README's quickstarts are also the
    # getting-started page's) runs once, under the first page that shows it.
    seen: set[tuple[str, ...]] = set()

    def add(job: str, args: list[str], what: str) -> None:
        if tuple(args) not in seen:
            seen.add(tuple(args))
            jobs[job] = (args, what)

    for page in PAGES:
        name = page.relative_to(ROOT).as_posix()
        for start, code in _blocks("python", page):
            add(
                f"{name}-python-line{start}", ["-c", code], f"{name}'s python block at line {start}"
            )
        for line, args in _cli_commands(page):
            if args[:1] == ["sample"]:
                args = [*args, "--timesteps", SAMPLE_TIMESTEPS]
            add(
                f"{name}-cli-line{line}",
                ["-m", "fastrollout", *args],
                f"{name}'s command at line {line}",
            )
    return jobs


JOBS = _jobs()


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """Runs ``python ARGS`` in a fresh interpreter in ``cwd``."""
    env = {**os.environ, "RAY_ADDRESS": "local"}
    # One thread each for torch and numpy's BLAS, as the tests and benchmarks run them (their
    # threads spin and slow a 2-core machine down).
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )


@pytest.fixture(scope="module")
def running(request, tmp_path_factory):
    """The selected jobs, started together; ``{test id: Future of the finished process}``.

    Most of a Ray block's time is spent waiting for Ray and its actors to start, so the
    blocks run four at a time, those that start Ray first (one after another they took
    about two minutes on a 2-core machine).
    """
    selected = [
        item.callspec.params["job"]
        for item in request.session.items
        if item.module is request.module and hasattr(item, "callspec")
    ]
    selected.sort(key=lambda job: not _STARTS_RAY.search(" ".join(JOBS[job][0])))
    with ThreadPoolExecutor(max_workers=4) as pool:
        yield {
            job: pool.submit(_run, JOBS[job][0], tmp_path_factory.mktemp(job.replace("/", "-")))
            for job in selected
        }


def test_readme_has_snippets():
    # The parametrized test below passes vacuously if the fences stop matching.
    assert len(_blocks("python")) >= 2
    assert _cli_commands()
    getting_started = ROOT / "docs" / "getting_started.md"
    assert len(_blocks("python", getting_started)) >= 4


def test_not_run_marks_only_skip_their_block():
    text = "<!-- not run: a fragment -->\n```python\nx\n```\n\n```python\ny\n```\n"
    matches = [(m.group(1) is None, m.group(3)) for m in _FENCE.finditer(text)]
    assert matches == [(False, "x\n"), (True, "y\n")]


@pytest.mark.parametrize("job", list(JOBS))
def test_readme_code_runs(job, running):
    proc = running[job].result()
    if proc.returncode != 0:
        pytest.fail(
            f"{JOBS[job][1]} failed (exit {proc.returncode}):\n"
            f"{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
        )
