"""examples/rollout_workers.py: RLlib's classic RolloutWorker loop learns CartPole.

The example runs in a subprocess with ``RAY_ADDRESS=local`` (a new local Ray instance of
two CPUs, as the session's ``ray_local`` fixture): its Ray actors unpickle the example's
env creator by value only when it is ``__main__``. The subprocess has its own session, so
a timeout ends it together with the Ray processes it started.
"""

from __future__ import annotations

import os
import pathlib
import re
import signal
import subprocess
import sys

import pytest

pytest.importorskip("ray")

EXAMPLE = pathlib.Path(__file__).resolve().parents[1] / "examples" / "rollout_workers.py"
MAX_ITERATIONS = 40
TIMEOUT_S = 170


def _run_example(*args: str) -> tuple[int, str]:
    env = {**os.environ, "RAY_ADDRESS": "local", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, str(EXAMPLE), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"the example ran past {TIMEOUT_S} s:\n{out[-4000:]}")
    return proc.returncode, out


def test_two_remote_workers_learn_cartpole() -> None:
    code, out = _run_example(
        "--num-workers",
        "2",
        "--seed",
        "0",
        "--target",
        "150",
        "--max-iterations",
        str(MAX_ITERATIONS),
    )
    assert code == 0, out[-4000:]
    done = re.search(
        r"reached 150: (\d+) iterations, ([\d,]+) env steps, mean return ([\d.]+)", out
    )
    assert done is not None, out[-4000:]
    iterations, env_steps = int(done[1]), int(done[2].replace(",", ""))
    assert iterations <= MAX_ITERATIONS
    assert float(done[3]) >= 150.0
    # Each iteration samples about 2 workers x 4 envs x 128 steps.
    assert 2 * 4 * 128 * iterations <= env_steps <= (2 * 4 * 128 + 2 * 3) * iterations
    # One progress line per iteration, the mean return rising to the target.
    lines = re.findall(r"^iter +(\d+) .*return_mean +([\d.]+)", out, flags=re.MULTILINE)
    assert [int(i) for i, _ in lines] == list(range(1, iterations + 1))
    assert float(lines[0][1]) < 50.0
