"""python -m fastrollout: arguments, threads, summary and table, output files, exit status."""

from __future__ import annotations

import io
import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from tests._helpers import restore_cli_threads  # noqa: F401 (a fixture)

from fastrollout.cli import (
    build_parser,
    config_from_args,
    flatten_metrics,
    main,
    render_table,
    run_sample,
)
from fastrollout.cli import threads as _cli_threads
from fastrollout.cli.report import JSONL_NAME, PLOT_NAME, RunLog, render_summary, summarize
from fastrollout.env import is_multi_agent_env, register_env

# sample sets torch's threads and the thread variables: each test puts them back.
pytestmark = pytest.mark.usefixtures("restore_cli_threads")


def _parse(*argv: str) -> Any:
    return build_parser().parse_args(["sample", *argv])


def _exit_status(argv: list[str]) -> int:
    """main's exit status, whether argparse exits (malformed argument) or main returns."""
    try:
        return main(argv)
    except SystemExit as exit_:
        return int(exit_.code or 0)


def test_defaults() -> None:
    args = _parse()
    assert (args.env, args.num_envs, args.timesteps) == ("CartPole-v1", 8, 100_000)
    assert (args.multi_agent, args.device, args.seed) == (None, "auto", None)
    assert args.num_env_runners == 0 and args.num_threads is None
    assert (args.rollout_fragment_length, args.vectorize_mode) == (64, "sync")
    assert args.output is None and not args.json
    assert not args.no_explore and not args.no_progress


def test_every_option() -> None:
    args = _parse(
        "--env", "Pendulum-v1", "--num-envs", "3", "--timesteps", "500", "--multi-agent", "2",
        "--device", "cpu", "--seed", "9", "--rollout-fragment-length", "16",
        "--vectorize-mode", "async", "--no-explore", "--no-progress", "--num-env-runners", "3",
        "--num-threads", "2", "--output", "out", "--json",
    )  # fmt: skip
    assert (args.env, args.num_envs, args.timesteps, args.multi_agent) == ("Pendulum-v1", 3, 500, 2)
    assert (args.device, args.seed, args.rollout_fragment_length) == ("cpu", 9, 16)
    assert args.vectorize_mode == "async" and args.no_explore and args.no_progress
    assert (args.num_threads, args.output, args.json) == (2, Path("out"), True)
    assert args.num_env_runners == 3 and config_from_args(args).num_env_runners == 3
    assert config_from_args(args).num_cpus_per_env_runner == 1.0


@pytest.mark.parametrize(
    ("text", "value"),
    [("1e5", 100_000), ("100000.0", 100_000), ("1.5e3", 1_500), ("2E2", 200), ("100_000", 100_000)],
)
def test_whole_numbers_in_float_notation_are_ints(text: str, value: int) -> None:
    args = _parse("--timesteps", text, "--num-envs", text, "--seed", text)
    assert (args.timesteps, args.num_envs, args.seed) == (value, value, value)
    assert isinstance(args.timesteps, int)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--num-envs", "0"], "argument --num-envs: expected an int >= 1, got 0"),
        (["--timesteps", "ten"], "argument --timesteps: expected an int, got 'ten'"),
        (["--timesteps", "1.5"], "argument --timesteps: expected an int, got '1.5'"),
        (["--timesteps", "1e-3"], "argument --timesteps: expected an int, got '1e-3'"),
        (["--timesteps", "inf"], "argument --timesteps: expected an int, got 'inf'"),
        (["--timesteps", "nan"], "argument --timesteps: expected an int, got 'nan'"),
        (["--seed", "-1"], "argument --seed: expected an int seed >= 0, got -1"),
        (["--seed", "x"], "argument --seed: expected an int seed, got 'x'"),
        (["--multi-agent", "0"], "argument --multi-agent: expected an int >= 1"),
        (["--num-env-runners", "-1"], "argument --num-env-runners: expected an int >= 0"),
        (["--num-threads", "-1"], "argument --num-threads: expected an int >= 0, got -1"),
        (["--num-cpus-per-env-runner", "0"], "--num-cpus-per-env-runner: expected a number > 0"),
        (["--vectorize-mode", "threads"], "argument --vectorize-mode: invalid choice"),
    ],
)
def test_malformed_arguments_exit_2_with_a_message(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _exit_status(["sample", *argv]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--device", "tpu"], "device must be 'auto', 'cpu', 'cuda', 'cuda:N'"),
        (["--env", "NoSuchEnv-v0"], "gymnasium: Environment `NoSuchEnv` doesn't exist."),
        (["--env", "CartPol-v1"], "Environment `CartPol` doesn't exist. Did you mean: `CartPole`?"),
        (["--env", "CartPole-v9"], "It provides versioned environments: [ `v0`, `v1` ]."),
        (["--env", "ALE/Pong-v5"], "Namespace ALE not found. Have you installed the proper"),
        (["--env", "CartPol-v1", "--multi-agent", "2"], "Did you mean: `CartPole`?"),
    ],
)
def test_configuration_errors_exit_2_with_one_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _exit_status(["sample", "--no-progress", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("python -m fastrollout sample: error: ")
    assert message in captured.err and captured.err.count("\n") == 1


def test_an_env_that_cannot_be_made_exits_2_with_gymnasiums_message(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def missing_dependency(ctx: Any) -> Any:
        raise gym.error.DependencyNotInstalled('Box2D is not installed, run `pip install "x"`')

    register_env("_test_cli_missing_dependency", missing_dependency)
    argv = ["sample", "--no-progress", "--env", "_test_cli_missing_dependency"]
    assert _exit_status(argv) == 2
    assert capsys.readouterr().err == (
        "python -m fastrollout sample: error: the env could not be made: Box2D is not "
        'installed, run `pip install "x"`\n'
    )


def test_cuda_without_a_gpu_exits_2_with_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert _exit_status(["sample", "--no-progress", "--device", "cuda"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "python -m fastrollout sample: error: device 'cuda' was asked for, but CUDA is not "
        "available\n"
    )


def test_a_command_is_required(capsys: pytest.CaptureFixture[str]) -> None:
    assert _exit_status([]) == 2
    assert "required: command" in capsys.readouterr().err


def test_help_shows_defaults_and_the_thread_measurements(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert _exit_status(["sample", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps at the terminal width
    for default in (
        "(default: CartPole-v1)",
        "(default: 8)",
        "(default: 100000)",
        "(default: 0)",
        "(default: 1.0)",
        "(default: auto)",
        "(default: 64)",
        "(default: sync)",
        "(default: random)",
        "(default: 1, or what OMP_NUM_THREADS sets; see below)",
    ):
        assert default in text
    assert "(default: False)" not in text and "(default: None)" not in text
    assert "Measured on a 2-core machine" in text and "8 sub-envs 27,100 vs 13,900" in text
    assert "pip install 'fastrollout[plot]'" in text


def test_config_from_args_single_and_multi_agent() -> None:
    config = config_from_args(_parse("--num-envs", "3", "--seed", "4", "--no-explore"))
    assert config.env == "CartPole-v1" and config.num_envs_per_env_runner == 3
    assert (config.seed, config.explore, config.device) == (4, False, "auto")
    assert config.rollout_fragment_length == 64
    multi = config_from_args(_parse("--multi-agent", "3", "--device", "cpu"))
    assert is_multi_agent_env(multi.env) and multi.env_config == {"num_agents": 3}
    env = multi.env(dict(multi.env_config))
    assert env.possible_agents == [0, 1, 2]
    assert multi.device == "cpu"


# -- threads ------------------------------------------------------------------------


def _openblas_threads() -> int | None:
    """The running OpenBLAS's thread count (None where there is none to ask)."""
    import ctypes

    try:
        with open("/proc/self/maps", encoding="utf-8") as maps:
            paths = sorted({line.split()[-1] for line in maps if "openblas" in line.lower()})
    except OSError:
        return None
    for path in paths:
        lib = ctypes.CDLL(path, mode=getattr(os, "RTLD_NOLOAD", 0))
        for symbol in ("openblas_get_num_threads", "scipy_openblas_get_num_threads64_"):
            getter = getattr(lib, symbol, None)
            if getter is not None:
                return int(getter())
    return None


def test_threads_default_to_one_for_torch_blas_and_child_processes() -> None:
    settings = _cli_threads.apply_num_threads(None)
    assert (settings.num_threads, settings.source, settings.torch_threads) == (1, "default", 1)
    assert torch.get_num_threads() == 1
    assert all(os.environ[name] == "1" for name in _cli_threads.THREAD_ENV_VARS)
    if _openblas_threads() is not None:
        assert settings.blas in ("threadpoolctl", "openblas") and _openblas_threads() == 1
    assert settings.describe() == "1 thread (default)"


def test_threads_given_are_set() -> None:
    settings = _cli_threads.apply_num_threads(2)
    assert (settings.num_threads, settings.source, torch.get_num_threads()) == (
        2,
        "--num-threads",
        2,
    )
    assert os.environ["OPENBLAS_NUM_THREADS"] == "2"
    if _openblas_threads() is not None:
        assert _openblas_threads() == 2
    assert settings.describe() == "2 threads (--num-threads)"


def test_the_users_omp_num_threads_and_zero_leave_the_libraries_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    torch.set_num_threads(2)
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    settings = _cli_threads.apply_num_threads(None)
    assert (settings.num_threads, settings.source, settings.blas) == (
        None,
        "OMP_NUM_THREADS",
        "not set",
    )
    assert torch.get_num_threads() == 2 and "OPENBLAS_NUM_THREADS" not in os.environ
    assert _cli_threads.apply_num_threads(1).num_threads == 1  # the option still wins
    monkeypatch.delenv("OMP_NUM_THREADS")
    torch.set_num_threads(2)
    zero = _cli_threads.apply_num_threads(0)
    assert (zero.num_threads, zero.source, torch.get_num_threads()) == (
        None,
        "library defaults",
        2,
    )
    assert zero.describe() == "2 torch threads (library defaults)"


# -- the report ------------------------------------------------------------------------


class _Snapshot:
    def __init__(self, value: float) -> None:
        self.value = value

    def peek(self) -> float:
        return self.value


def test_flatten_metrics_nests_and_peeks() -> None:
    flat = flatten_metrics({"a": 1, "b": {"c": _Snapshot(2.5), "d": {"e": "x"}}, 3: 4})
    assert flat == {"a": 1, "b/c": 2.5, "b/d/e": "x", "3": 4}


def test_render_table_sections_and_units_exact() -> None:
    table = render_table(
        {
            "episode_return_mean": 21.73712,
            "num_env_steps_sampled_lifetime": 100000.0,
            "num_env_steps_sampled": 512.0,
            "num_agent_steps_sampled": {"default_agent": 512.0},
            "module": {"default_policy": np.float32(0.5)},
            "env_step_timer": 0.0001234,
            "sample": 0.0125,
            "episode_duration_sec_mean": 0.25,
            "cli": {"env_steps_per_s": 37512.25, "wall_time_s": 2.5},
            "big": 12345678.9,
            "missing": float("nan"),
            "flag": True,
            "name": "x" * 50,
        },
        title="T",
    )
    assert table.splitlines() == [
        "T",
        "metric                                                                      value  unit",
        "---------------------------------------  ---------------------------------------"
        "-  --------------------",
        "this run",
        "  cli/env_steps_per_s                                                  37,512.25"
        "0  env steps/s",
        "  cli/wall_time_s                                                           2.500  s",
        "lifetime: the runners' totals since they were built",
        "  num_env_steps_sampled_lifetime                                          100,000",
        "the last sample() call only",
        "  num_agent_steps_sampled/default_agent                                       512",
        "  num_env_steps_sampled                                                       512",
        "episodes: those the last get_metrics() call reported",
        "  episode_duration_sec_mean                                                 0.250  s",
        "  episode_return_mean                                                      21.737",
        "timers: moving averages, over all sub-envs of one runner",
        "  env_step_timer                                                          123.40"
        "0  µs per vector step",
        "  sample                                                                   12.50"
        "0  ms per sample() call",
        "other",
        "  big                                                                   1.235e+07",
        "  flag                                                                       True",
        "  missing                                                                     nan",
        "  module/default_policy                                                     0.500",
        "  name                                   xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx...",
    ]
    assert render_table({}) == "metric  value  unit\n------  -----  ----"


class _Chunk:
    """What RunLog reads of an episode chunk."""

    def __init__(self, id_: str, length: int, ret: float, done: bool, agents: int = 0) -> None:
        self.id_, self._len, self._ret, self.is_done = id_, length, ret, done
        if agents:
            self.agent_steps = lambda: agents * length

    def __len__(self) -> int:
        return self._len

    def get_return(self) -> float:
        return self._ret


def test_run_log_counts_whole_episodes_across_calls_and_writes_a_line_per_call() -> None:
    lines = io.StringIO()
    log = RunLog(num_envs=2, num_samplers=1, jsonl=lines)
    log.add_call(
        [_Chunk("a", 3, 3.0, False), _Chunk("b", 5, 5.0, True)],
        call_s=0.5,
        metrics={"env_step_timer": 0.001, "episode_return_mean": 5.0},
    )
    # "a" ends in the second call: its return is both chunks' (3 + 4).
    first = json.loads(lines.getvalue())
    record = log.add_call(
        [_Chunk("a", 4, 4.0, True), _Chunk("c", 4, 1.0, False)],
        call_s=0.25,
        metrics={"env_step_timer": 0.002, "episode_return_mean": math.nan},
    )
    assert (log.env_steps, log.agent_steps, log.episodes) == (16, 16, 2)
    assert (log.return_sum, log.return_min, log.return_max) == (12.0, 5.0, 7.0)
    assert log.latest["episode_return_mean"] == 5.0  # NaN keeps the last number
    # env_step_timer x vector steps: 0.001 x 8 / 2 + 0.002 x 8 / 2.
    assert log.stage_s["env_step"] == pytest.approx(0.012)
    assert first["sample_call"] == 1 and first["call_episode_return_mean"] == 5.0
    assert record["call_episode_return_mean"] == 7.0 and record["env_steps_per_s"] == 32.0
    assert lines.getvalue().count("\n") == 2
    second = json.loads(lines.getvalue().splitlines()[1])
    assert second["metrics"]["episode_return_mean"] is None  # NaN is written as null
    summary = summarize(log, 1.0)
    assert (summary["episodes"], summary["episode_return_mean"]) == (2, 6.0)
    assert (summary["episode_return_min"], summary["episode_return_max"]) == (5.0, 7.0)
    # The timers' 12 ms of 750 ms sampled, the rest of sample() 738 ms, 250 ms outside.
    assert summary["time_share"]["env_step"] == pytest.approx(0.012)
    assert summary["time_share"]["rest_of_sample"] == pytest.approx(0.738)
    assert summary["time_share"]["outside_sample"] == pytest.approx(0.25)
    multi = RunLog(num_envs=1, num_samplers=1)
    multi.add_call([_Chunk("m", 5, 2.0, True, agents=2)], call_s=1.0, metrics={})
    assert (multi.env_steps, multi.agent_steps) == (5, 10)


def test_summary_scales_timers_that_add_up_to_more_than_the_time_measured() -> None:
    log = RunLog(num_envs=1, num_samplers=1)
    log.add_call(
        [_Chunk("a", 100, 1.0, False)],
        call_s=0.1,
        metrics={"env_step_timer": 0.003, "rlmodule_inference_timer": 0.001},
    )
    summary = summarize(log, 0.1)
    assert summary["time_share"]["env_step"] == pytest.approx(0.75)
    assert summary["time_share"]["forward"] == pytest.approx(0.25)
    assert summary["time_share"]["rest_of_sample"] == 0.0
    assert math.isnan(summary["episode_return_mean"])
    assert "none finished, so no return yet" in render_summary(
        summary, title="T", multi_agent=False
    )


def _quick_argv(*extra: str) -> list[str]:
    return [
        "--num-envs", "2", "--timesteps", "3e2", "--rollout-fragment-length", "20",
        "--seed", "0", "--device", "cpu", "--no-progress", *extra,
    ]  # fmt: skip


def _quick(*extra: str) -> Any:
    return _parse(*_quick_argv(*extra))


# The merged runners pass clear_on_reduce to the metrics logger, which deprecates it; that
# warning belongs to the runners/metrics integration, not to the CLI under test here.
_RUNNER_WARNING = "ignore:clear_on_reduce is deprecated:DeprecationWarning"


def _check_summary(summary: dict[str, Any]) -> None:
    assert summary["env_steps"] >= 300 and summary["episodes"] >= 1
    assert summary["env_steps_per_s"] == pytest.approx(
        summary["env_steps"] / summary["wall_time_s"]
    )
    assert summary["episode_return_min"] <= summary["episode_return_mean"]
    assert summary["episode_return_mean"] <= summary["episode_return_max"]
    # The parts of an env step's time add up to the whole (1 / throughput).
    us = summary["time_per_env_step_us"]
    assert set(us) == {
        "env_to_module", "forward", "module_to_env", "env_step", "rest_of_sample",
        "outside_sample",
    }  # fmt: skip
    assert all(v >= 0 for v in us.values()) and us["env_step"] > 0 and us["forward"] > 0
    assert sum(us.values()) == pytest.approx(1e6 / summary["env_steps_per_s"])
    assert sum(summary["time_share"].values()) == pytest.approx(1.0)


@pytest.mark.filterwarnings(_RUNNER_WARNING)
def test_end_to_end_single_agent_summary_first_then_the_table() -> None:
    out = io.StringIO()
    summary = run_sample(_quick(), out=out)
    _check_summary(summary)
    assert summary["agent_steps"] == summary["env_steps"]
    assert (summary["num_threads"], summary["threads"]) == (1, "1 thread (default)")
    metrics = summary["metrics"]
    assert metrics["cli/env_steps"] == summary["env_steps"]
    assert metrics["num_env_steps_sampled_lifetime"] == summary["env_steps"]
    assert not math.isnan(metrics["episode_return_mean"])
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("fastrollout sample: CartPole-v1, 2 sub-envs, ")
    assert lines[0].endswith(" env steps, 1 thread (default)")
    assert lines[1].startswith("  throughput  ") and " env steps/s  (" in lines[1]
    assert "agent steps/s" not in lines[1]
    assert lines[2].startswith("  episodes    ") and " done, return mean " in lines[2]
    assert lines[3].startswith("  time per env step: ") and lines[3].endswith(" µs")
    assert [line.split("  ")[2] for line in lines[4:10]] == [
        "env-to-module connector",
        "forward pass (RLModule)",
        "module-to-env connector",
        "env.step",
        "record, cut, rest of sample()",
        "get_metrics and the CLI",
    ]
    assert all(line.endswith("%") and " µs " in line for line in lines[4:10])
    table = "\n".join(lines[11:])
    assert lines[11] == "all metrics (RLlib's names)"
    assert "lifetime: the runners' totals since they were built" in table
    assert "the last sample() call only" in table
    assert "µs per vector step" in table and "ms per sample() call" in table


@pytest.mark.filterwarnings(_RUNNER_WARNING)
def test_end_to_end_with_the_envs_own_vector_env() -> None:
    summary = run_sample(_quick("--vectorize-mode", "vector_entry_point"), out=io.StringIO())
    _check_summary(summary)


@pytest.mark.filterwarnings(_RUNNER_WARNING)
def test_end_to_end_multi_agent_shows_agent_steps() -> None:
    out = io.StringIO()
    summary = run_sample(_quick("--multi-agent", "2"), out=out)
    _check_summary(summary)
    assert summary["num_agents"] == 2
    # Two CartPoles as agents: each env step is one or two agent steps.
    assert summary["env_steps"] < summary["agent_steps"] <= 2 * summary["env_steps"]
    assert summary["agent_steps_per_s"] > summary["env_steps_per_s"]
    text = out.getvalue()
    assert "x2 agents" in text.splitlines()[0]
    assert "agent steps/s" in text.splitlines()[1]


@pytest.mark.filterwarnings(_RUNNER_WARNING)
def test_end_to_end_with_remote_runners(ray_local: Any) -> None:
    out = io.StringIO()
    summary = run_sample(
        _quick("--num-env-runners", "2", "--num-cpus-per-env-runner", "0.5"), out=out
    )
    assert summary["env_steps"] >= 300 and summary["episodes"] >= 1
    # Aggregated over both runners at the group's root logger: the lifetime sum is all.
    assert summary["metrics"]["num_env_steps_sampled_lifetime"] == summary["env_steps"]
    assert "2 sub-envs x 2 remote runners" in out.getvalue()
    assert ray_local.is_initialized()  # the session's Ray was used, not shut down


def test_remote_runners_without_ray_exit_2_naming_the_extra(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)
    assert _exit_status(["sample", "--num-env-runners", "2"]) == 2
    assert "pip install 'fastrollout[ray]'" in capsys.readouterr().err


# -- output files and JSON -------------------------------------------------------------


def _check_jsonl(path: Path, summary: dict[str, Any]) -> None:
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert len(records) == summary["metrics"]["cli/sample_calls"] >= 2
    assert [r["sample_call"] for r in records] == list(range(1, len(records) + 1))
    steps = [r["env_steps"] for r in records]
    assert steps == sorted(steps) and steps[-1] == summary["env_steps"]
    assert steps == list(np.cumsum([r["call_env_steps"] for r in records]))
    walls = [r["wall_time_s"] for r in records]
    assert walls == sorted(walls) and walls[0] > 0
    assert all(r["call_time_s"] > 0 and r["env_steps_per_s"] > 0 for r in records)
    last = records[-1]["metrics"]
    assert last["num_env_steps_sampled_lifetime"] == summary["env_steps"]
    assert "env_step_timer" in last


@pytest.mark.filterwarnings(_RUNNER_WARNING)
def test_output_writes_json_lines_and_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out_dir = tmp_path / "run" / "cartpole"  # made with its parents
    summary = run_sample(_quick("--output", str(out_dir)), out=io.StringIO())
    _check_jsonl(out_dir / JSONL_NAME, summary)
    png = (out_dir / PLOT_NAME).read_bytes()
    assert len(png) > 1000 and png.startswith(b"\x89PNG\r\n\x1a\n")


@pytest.mark.filterwarnings(_RUNNER_WARNING)
def test_output_without_matplotlib_says_so_in_one_line_and_writes_json_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    summary = run_sample(_quick("--output", str(tmp_path)), out=io.StringIO())
    _check_jsonl(tmp_path / JSONL_NAME, summary)
    assert not (tmp_path / PLOT_NAME).exists()
    err = capsys.readouterr().err.splitlines()
    assert err[0] == (
        "python -m fastrollout sample: no plot written: it needs matplotlib "
        f"(pip install 'fastrollout[plot]'); the metrics are in {tmp_path / JSONL_NAME}"
    )
    assert err[1].startswith(f"python -m fastrollout sample: wrote {JSONL_NAME}, episodes/ (")
    assert len(err) == 2


def test_output_that_is_a_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert _exit_status(["sample", "--no-progress", "--output", str(blocker / "d")]) == 2
    assert capsys.readouterr().err.startswith("python -m fastrollout sample: error: --output ")


class _PrintingCartPole(gym.Wrapper):  # type: ignore[type-arg]
    """CartPole that prints on every reset, as some envs do."""

    def __init__(self) -> None:
        super().__init__(gym.make("CartPole-v1"))

    def reset(self, **kwargs: Any) -> Any:
        print("an env's own print")
        return self.env.reset(**kwargs)


@pytest.mark.filterwarnings(_RUNNER_WARNING)
def test_json_keeps_what_else_prints_off_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    register_env("_test_cli_printing_cartpole", lambda ctx: _PrintingCartPole())
    argv = ["--env", "_test_cli_printing_cartpole", "--json"]
    assert main(["sample", *_quick_argv(*argv)]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["env_steps"] >= 300 and captured.out.count("\n") == 1
    assert "an env's own print" in captured.err


def _run_module(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in _cli_threads.THREAD_ENV_VARS}
    return subprocess.run(
        [sys.executable, "-m", "fastrollout", *argv],
        capture_output=True,
        text=True,
        check=False,
        env=env,
        timeout=120,
    )


def test_json_prints_only_the_summary_on_stdout() -> None:
    result = _run_module(
        "sample", "--timesteps", "3e2", "--num-envs", "2", "--rollout-fragment-length", "20",
        "--seed", "0", "--device", "cpu", "--json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)  # all of stdout is the one JSON object
    assert result.stdout.count("\n") == 1
    assert summary["env"] == "CartPole-v1" and summary["env_steps"] >= 300
    assert summary["num_threads"] == 1 and summary["episodes"] >= 1
    assert summary["env_steps_per_s"] > 0 and summary["episode_return_mean"] > 0
    assert set(summary["time_per_env_step_us"]) == set(summary["time_share"])
    assert summary["metrics"]["cli/env_steps"] == summary["env_steps"]
    assert "it/s" not in result.stdout and "step/s" in result.stderr  # the progress bar


def test_python_dash_m_exit_status_2_on_an_unknown_env() -> None:
    result = _run_module("sample", "--env", "CartPol-v1")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.splitlines() == [
        "python -m fastrollout sample: error: unknown env 'CartPol-v1' (not a name given to "
        "fastrollout.register_env, registered: [], nor an importable 'module.Class' path); "
        "gymnasium: Environment `CartPol` doesn't exist. Did you mean: `CartPole`?"
    ]


# -- what the terminal shows: Ray's log, pipes, the progress bar, output files ------------


@pytest.mark.filterwarnings(_RUNNER_WARNING)
def test_remote_runners_make_ray_log_no_error_about_their_actors(
    ray_local: Any, capfd: pytest.CaptureFixture[str]
) -> None:
    run_sample(
        _quick("--num-env-runners", "2", "--num-cpus-per-env-runner", "0.5"), out=io.StringIO()
    )
    err = capfd.readouterr().err
    # Ray's core worker logs this (level E) for actors that may restart and whose
    # constructor arguments sit in the object store.
    assert "max_restarts" not in err and "RunnerHost" not in err, err


def test_a_reader_that_goes_away_ends_the_command_quietly() -> None:
    env = {k: v for k, v in os.environ.items() if k not in _cli_threads.THREAD_ENV_VARS}
    argv = ["sample", *_quick_argv()]
    proc = subprocess.Popen(
        [sys.executable, "-m", "fastrollout", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    assert proc.stdout is not None
    proc.stdout.close()  # as `| head -0`: whatever the command prints finds no reader
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 141, err.decode()  # 128 + SIGPIPE, as a shell reports it
    assert b"Traceback" not in err and b"BrokenPipeError" not in err, err.decode()


class _SlowCartPole(gym.Wrapper):  # type: ignore[type-arg]
    """CartPole whose steps take 5 ms, so that the progress bar redraws on each update."""

    def __init__(self) -> None:
        super().__init__(gym.make("CartPole-v1"))

    def step(self, action: Any) -> Any:
        time.sleep(0.005)
        return self.env.step(action)


@pytest.mark.filterwarnings(_RUNNER_WARNING)
@pytest.mark.parametrize("timesteps", [120, 100])
def test_the_progress_bar_ends_with_one_line_at_100_percent(
    capsys: pytest.CaptureFixture[str], timesteps: int
) -> None:
    register_env("_test_cli_slow_cartpole", lambda ctx: _SlowCartPole())
    argv = [
        "--env", "_test_cli_slow_cartpole", "--num-envs", "3", "--timesteps", str(timesteps),
        "--rollout-fragment-length", "10", "--seed", "0", "--device", "cpu",
    ]  # fmt: skip
    summary = run_sample(_parse(*argv), out=io.StringIO())
    steps = summary["env_steps"]  # may be a few more than asked: whole vector steps
    frames = [f for f in re.split(r"[\r\n]", capsys.readouterr().err) if f.strip()]
    final = [f for f in frames if f"| {steps}/" in f or f.startswith(f"{steps}step")]
    assert len(final) == 1, frames
    assert final[0].startswith("100%") and f"| {steps}/{steps} [" in final[0]
    assert final[0] == frames[-1]


@pytest.mark.filterwarnings(_RUNNER_WARNING)
def test_output_says_where_it_wrote_and_makes_one_episode_file_per_runner(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("pyarrow")
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # no plot: faster
    summary = run_sample(_quick("--output", str(tmp_path)), out=io.StringIO())
    assert summary["metrics"]["cli/sample_calls"] >= 8
    files = list((tmp_path / "episodes").rglob("*.parquet"))
    assert len(files) == 1  # not one per sample() call
    size = files[0].stat().st_size
    last = capsys.readouterr().err.splitlines()[-1]
    assert last == (
        f"python -m fastrollout sample: wrote metrics.jsonl, episodes/ (1 parquet file, "
        f"{size / 1024:.3g} KiB) in {tmp_path}"
    )
    from fastrollout.offline import read_episodes

    assert sum(len(e) for e in read_episodes(tmp_path / "episodes")) == summary["env_steps"]
