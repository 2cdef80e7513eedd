"""python -m fastrollout evaluate, and the episodes that sample --output records for it."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from tests._helpers import restore_cli_threads  # noqa: F401 (a fixture)

import fastrollout as fr
from fastrollout.cli import build_parser, main, run_evaluate
from fastrollout.cli.evaluate import EPISODES_DIR, render_estimates
from fastrollout.offline import estimate, read_episodes

# sample sets torch's threads and the thread variables: each test puts them back.
pytestmark = pytest.mark.usefixtures("restore_cli_threads")


def _exit_status(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exit_:
        return int(exit_.code or 0)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ``sample --output`` folder (CartPole, 2,000 env steps, seed 0)."""
    out = tmp_path_factory.mktemp("run")
    argv = ["sample", "--timesteps", "2000", "--num-envs", "2", "--seed", "0"]
    argv += ["--no-progress", "--json", "--num-threads", "1", "--output", str(out)]
    assert main(argv) == 0
    return out


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A runner checkpoint whose module differs from the one that sampled."""
    runner = fr.SingleAgentEnvRunner(
        config=fr.RunnerConfig().environment("CartPole-v1").debugging(seed=1)
    )
    path = Path(runner.save_to_path(tmp_path_factory.mktemp("ckpt")))
    runner.stop()
    return path


def test_sample_output_records_episodes_with_their_log_probabilities(recorded: Path) -> None:
    episodes = read_episodes(recorded / EPISODES_DIR)
    assert sum(len(e) for e in episodes) == 2000
    assert all("action_logp" in e.extra_model_outputs for e in episodes)


def test_evaluate_behavior_prints_a_table_with_gain_one(
    recorded: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _exit_status(["evaluate", str(recorded)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("fastrollout evaluate: the behaviour policy on ")
    assert lines[1].split() == [
        "method",
        "v_behavior",
        "v_target",
        "±",
        "ste",
        "v_gain",
        "±",
        "ste",
        "episodes",
    ]
    rows = {line.split()[0]: line.split() for line in lines[3:]}
    assert sorted(rows) == ["is", "wis"]
    assert rows["is"][4] == "1" and rows["wis"][4] == "1"  # v_gain


def test_evaluate_json_with_a_checkpoint_matches_estimate(recorded: Path, checkpoint: Path) -> None:
    args = build_parser().parse_args(
        [
            *["evaluate", str(recorded), "--module", str(checkpoint)],
            *["--methods", "is,wis", "--gamma", "0.9", "--json"],
        ]
    )
    out = io.StringIO()
    run_evaluate(args, out=out)
    printed = json.loads(out.getvalue())
    runner = fr.SingleAgentEnvRunner(config=fr.RunnerConfig().environment("CartPole-v1"))
    runner.restore_from_path(checkpoint)
    expected = estimate(read_episodes(recorded), runner.module, ["is", "wis"], gamma=0.9)
    assert sorted(printed) == ["is", "wis"]
    for method, values in expected.items():
        assert printed[method] == pytest.approx(values)
    assert printed["is"]["v_gain"] != pytest.approx(1.0, abs=1e-6)


def test_evaluate_dm_and_dr_with_a_checkpoint(recorded: Path, checkpoint: Path) -> None:
    args = build_parser().parse_args(
        [
            *["evaluate", str(recorded), "--module", str(checkpoint)],
            *["--methods", "dm,dr", "--fqe-iters", "5", "--json"],
        ]
    )
    out = io.StringIO()
    results = run_evaluate(args, out=out)
    assert sorted(results) == ["dm", "dr"]
    assert all(r["v_target"] == r["v_target"] for r in results.values())  # not NaN
    assert json.loads(out.getvalue())["dr"]["q_loss"] == pytest.approx(results["dr"]["q_loss"])


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--methods", "dm"], "need a target module"),
        (["--module", "no/such/checkpoint"], "EnvRunner.save_to_path"),
        (["--fqe-iters", "0", "--module", "x"], "--fqe-iters must be at least 1"),
    ],
)
def test_configuration_errors_exit_2_with_one_line(
    recorded: Path, extra: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _exit_status(["evaluate", str(recorded), *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("python -m fastrollout evaluate: error: ")
    assert message in err and "\n" not in err


def test_a_folder_without_episodes_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _exit_status(["evaluate", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert _exit_status(["evaluate", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("python -m fastrollout evaluate: error: ") and "\n" not in err


def test_malformed_methods_and_gamma_exit_2(recorded: Path) -> None:
    assert _exit_status(["evaluate", str(recorded), "--methods", "is,snips"]) == 2
    assert _exit_status(["evaluate", str(recorded), "--gamma", "1.5"]) == 2


def test_render_estimates_columns() -> None:
    row = {
        "v_behavior": 20.0,
        "v_target": 25.0,
        "v_target_ste": 1.5,
        "v_gain": 1.25,
        "v_gain_ste": 0.075,
        "num_episodes": 10.0,
    }
    text = render_estimates({"is": row}, title="t")
    assert text.splitlines()[3].split() == ["is", "20", "25", "1.5", "1.25", "0.075", "10"]
