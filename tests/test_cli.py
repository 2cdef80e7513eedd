"""python -m fastrollout: argument parsing, metrics table rendering, and a short end-to-end run."""

from __future__ import annotations

import io
import math
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

from fastrollout.cli import (
    build_parser,
    config_from_args,
    flatten_metrics,
    main,
    render_table,
    run_sample,
)
from fastrollout.env import is_multi_agent_env


def _parse(*argv: str) -> Any:
    return build_parser().parse_args(["sample", *argv])


def test_defaults() -> None:
    args = _parse()
    assert (args.env, args.num_envs, args.timesteps) == ("CartPole-v1", 8, 100_000)
    assert (args.multi_agent, args.device, args.seed) == (None, "auto", None)
    assert args.num_env_runners == 0
    assert (args.rollout_fragment_length, args.vectorize_mode) == (64, "sync")
    assert not args.no_explore and not args.no_progress


def test_every_option() -> None:
    args = _parse(
        "--env", "Pendulum-v1", "--num-envs", "3", "--timesteps", "500", "--multi-agent", "2",
        "--device", "cpu", "--seed", "9", "--rollout-fragment-length", "16",
        "--vectorize-mode", "async", "--no-explore", "--no-progress", "--num-env-runners", "3",
    )  # fmt: skip
    assert (args.env, args.num_envs, args.timesteps, args.multi_agent) == ("Pendulum-v1", 3, 500, 2)
    assert (args.device, args.seed, args.rollout_fragment_length) == ("cpu", 9, 16)
    assert args.vectorize_mode == "async" and args.no_explore and args.no_progress
    assert args.num_env_runners == 3 and config_from_args(args).num_env_runners == 3
    assert config_from_args(args).num_cpus_per_env_runner == 1.0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--num-envs", "0"], "argument --num-envs: expected an int >= 1, got 0"),
        (["--timesteps", "ten"], "argument --timesteps: expected an int, got 'ten'"),
        (["--seed", "-1"], "argument --seed: expected a seed >= 0, got -1"),
        (["--seed", "x"], "argument --seed: expected an int seed, got 'x'"),
        (["--multi-agent", "0"], "argument --multi-agent: expected an int >= 1"),
        (["--num-env-runners", "-1"], "argument --num-env-runners: expected an int >= 0"),
        (["--num-cpus-per-env-runner", "0"], "--num-cpus-per-env-runner: expected a number > 0"),
        (["--vectorize-mode", "threads"], "argument --vectorize-mode: invalid choice"),
        (["--device", "tpu"], "device must be 'auto', 'cpu', 'cuda', 'cuda:N'"),
    ],
)
def test_bad_arguments_exit_2_with_a_message(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main(["sample", *argv])
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_a_command_is_required(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main([])
    assert "required: command" in capsys.readouterr().err


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


class _Snapshot:
    def __init__(self, value: float) -> None:
        self.value = value

    def peek(self) -> float:
        return self.value


def test_flatten_metrics_nests_and_peeks() -> None:
    flat = flatten_metrics({"a": 1, "b": {"c": _Snapshot(2.5), "d": {"e": "x"}}, 3: 4})
    assert flat == {"a": 1, "b/c": 2.5, "b/d/e": "x", "3": 4}


def test_render_table_exact() -> None:
    table = render_table(
        {
            "episode_return_mean": 21.73712,
            "num_env_steps_sampled_lifetime": 100000,
            "module": {"default_policy": np.float32(0.5)},
            "timer": 0.0001234,
            "big": 12345678.9,
            "missing": float("nan"),
            "flag": True,
            "name": "x" * 50,
        },
        title="T",
    )
    assert table.splitlines() == [
        "T",
        "metric                                                             value",
        "------------------------------  ----------------------------------------",
        "big                                                            1.235e+07",
        "episode_return_mean                                               21.737",
        "flag                                                                True",
        "missing                                                              nan",
        "module/default_policy                                              0.500",
        "name                            xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx...",
        "num_env_steps_sampled_lifetime                                   100,000",
        "timer                                                          1.234e-04",
    ]
    assert render_table({}) == "metric  value\n------  -----"


def _quick(*extra: str) -> Any:
    return _parse(
        "--num-envs", "2", "--timesteps", "300", "--rollout-fragment-length", "20",
        "--seed", "0", "--device", "cpu", "--no-progress", *extra,
    )  # fmt: skip


# The merged runners pass clear_on_reduce to the metrics logger, which deprecates it; that
# warning belongs to the runners/metrics integration, not to the CLI under test here.
_RUNNER_WARNING = "ignore:clear_on_reduce is deprecated:DeprecationWarning"


@pytest.mark.filterwarnings(_RUNNER_WARNING)
def test_end_to_end_single_agent() -> None:
    out = io.StringIO()
    metrics = run_sample(_quick(), out=out)
    assert metrics["cli"]["env_steps"] >= 300
    assert metrics["cli"]["episodes_done"] >= 1
    assert metrics["episode_return_mean"] > 0 and not math.isnan(metrics["episode_return_mean"])
    text = out.getvalue()
    assert text.startswith("fastrollout sample: CartPole-v1, 2 sub-envs,")
    assert "episode_return_mean" in text and "cli/env_steps_per_s" in text


@pytest.mark.filterwarnings(_RUNNER_WARNING)
def test_end_to_end_with_the_envs_own_vector_env() -> None:
    out = io.StringIO()
    metrics = run_sample(_quick("--vectorize-mode", "vector_entry_point"), out=out)
    assert metrics["cli"]["env_steps"] >= 300
    assert metrics["cli"]["episodes_done"] >= 1
    assert metrics["episode_return_mean"] > 0


@pytest.mark.filterwarnings(_RUNNER_WARNING)
def test_end_to_end_multi_agent() -> None:
    out = io.StringIO()
    metrics = run_sample(_quick("--multi-agent", "2"), out=out)
    assert metrics["cli"]["env_steps"] >= 300
    assert "x2 agents" in out.getvalue()
    assert metrics["cli"]["episodes_done"] >= 1


@pytest.mark.filterwarnings(_RUNNER_WARNING)
def test_end_to_end_with_remote_runners(ray_local: Any) -> None:
    out = io.StringIO()
    metrics = run_sample(
        _quick("--num-env-runners", "2", "--num-cpus-per-env-runner", "0.5"), out=out
    )
    assert metrics["cli"]["env_steps"] >= 300
    assert metrics["cli"]["episodes_done"] >= 1
    # Aggregated over both runners at the group's root logger: the lifetime sum is all.
    assert metrics["num_env_steps_sampled_lifetime"] == metrics["cli"]["env_steps"]
    assert "2 sub-envs x 2 remote runners" in out.getvalue()
    assert ray_local.is_initialized()  # the session's Ray was used, not shut down


def test_remote_runners_without_ray_exit_2_naming_the_extra(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(SystemExit) as info:
        main(["sample", "--num-env-runners", "2"])
    assert info.value.code == 2
    assert "pip install 'fastrollout[ray]'" in capsys.readouterr().err


def test_python_dash_m_entry_point() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "fastrollout", "sample", "--help"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0
    assert "--multi-agent N" in result.stdout
