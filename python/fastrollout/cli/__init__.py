"""``python -m fastrollout``: sample an env and show the metrics; evaluate a module off-policy.

``sample`` samples with a default policy; ``evaluate`` estimates a module's value on the
episodes ``sample --output`` recorded.

Example::

    python -m fastrollout sample --env CartPole-v1 --num-envs 8 --timesteps 1e5
    python -m fastrollout sample --env CartPole-v1 --multi-agent 4 --device cpu --seed 0
    python -m fastrollout sample --env CartPole-v1 --num-env-runners 2   # Ray actors
    python -m fastrollout sample --output runs/cartpole --json > summary.json
    python -m fastrollout evaluate runs/cartpole --module behavior

A progress bar (tqdm, on stderr) shows env steps per second and the running mean episode
return. Then a summary (throughput, episodes and returns, where the time went) and the
runners' metrics (RLlib's names, aggregated over the runners by an ``EnvRunnerGroup``),
or with ``--json`` only the summary as JSON. ``--output DIR`` also writes every
``sample`` call's metrics as JSON lines and a plot, and records the episodes (parquet,
``DIR/episodes/``, each runner's in files of up to 64 MiB), which ``evaluate DIR`` reads
(see ``fastrollout.cli.evaluate``); a last line on stderr says what it wrote.

Exit status: 0 on success, 2 on a configuration error (bad arguments, an unknown env, a
device this machine lacks), with a one-line message on stderr; 141 (as for SIGPIPE),
without a traceback, when the reader of stdout goes away (``| head``).
"""

from __future__ import annotations

import argparse
import contextlib
import decimal
import math
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any, TextIO

from fastrollout._extras import require_extra
from fastrollout.cli.evaluate import EPISODES_DIR, add_evaluate_parser, run_evaluate
from fastrollout.cli.report import (
    JSONL_NAME,
    PLOT_NAME,
    RunLog,
    flatten_metrics,
    render_summary,
    render_table,
    summarize,
    to_json,
    write_plot,
)
from fastrollout.cli.threads import DEFAULT_NUM_THREADS, apply_num_threads

__all__ = [
    "ConfigurationError",
    "build_parser",
    "check_config",
    "config_from_args",
    "flatten_metrics",
    "main",
    "render_table",
    "run_sample",
]

PROG = "python -m fastrollout"

# --output's episode files: each runner buffers its episodes up to this size (before
# compression) per file, instead of RLlib's one file per sample() call, which makes
# hundreds of small files for a run of 1e5 steps.
OUTPUT_FILE_SIZE = 64 * 1024 * 1024

# The measurements behind --num-threads' default: medians of 8 (8 sub-envs) and 4 (256)
# paired runs in one process that switches between 1 and 2 threads, on a 2-core machine
# that other work kept at a load average of 4-8; "busy": one more `python -c "while 1:
# pass"`. The CLI gives the same picture: `python -m fastrollout sample --no-progress
# --timesteps 1e5 --json --num-threads N` gave 30,000 and 28,300 (busy) env steps/s with
# 1 thread, 10,500 and 710 (busy) with 2.
_THREADS_EPILOG = """\
threads: torch and OpenBLAS start one thread per core. On a sampling loop's small batches
those threads mostly wait for each other, and far longer when another process holds a
core. Measured on a 2-core machine (CartPole-v1, env steps/s, 1 thread vs 2; busy: with
one more process spinning): 8 sub-envs 27,100 vs 13,900, busy 26,700 vs 1,150; 256
sub-envs (vector_entry_point) 212,600 vs 7,400, busy 90,500 vs 4,800. Hence the default,
1 thread: the option sets torch.set_num_threads, the running OpenBLAS, and
OMP/OPENBLAS/MKL_NUM_THREADS for the processes the run starts. Without the option and
with OMP_NUM_THREADS set, the libraries keep what they read from it; 0 keeps the
libraries' own defaults. Remote runners (Ray actors) inherit the variables from a Ray the
run starts; otherwise Ray sets OMP_NUM_THREADS to each runner's CPUs.
"""


class ConfigurationError(ValueError):
    """A configuration the run cannot start with (exit status 2, one line on stderr)."""


def _whole_number(text: str) -> int:
    """Parses an int, also one written as a float or in scientific notation (``1e5``).

    Raises:
        argparse.ArgumentTypeError: If the text is not a whole number.
    """
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = decimal.Decimal(text.strip())
    except decimal.InvalidOperation:
        raise argparse.ArgumentTypeError(f"expected an int, got {text!r}") from None
    # Decimal, not float: "1e20" is exactly 10**20, and "1.5e3" is 1500 without rounding.
    if not value.is_finite() or value != value.to_integral_value():
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}")
    return int(value)


def _int_at_least(minimum: int, what: str = "an int") -> Callable[[str], int]:
    """An argparse type: a whole number of at least ``minimum``."""

    def parse(text: str) -> int:
        try:
            value = _whole_number(text)
        except argparse.ArgumentTypeError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected {what} >= {minimum}, got {value}")
        return value

    return parse


_positive_int = _int_at_least(1)


def _json_dict(text: str) -> dict[str, Any]:
    """A JSON object (``--env-config``)."""
    import json

    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise argparse.ArgumentTypeError(f"not JSON: {err}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value


_non_negative_int = _int_at_least(0)
_seed = _int_at_least(0, "an int seed")


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {value}")
    return value


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each option's default.

    Flags (default False) and options whose help explains their default (default None)
    get no ``(default: ...)``.
    """

    def _get_help_string(self, action: argparse.Action) -> str | None:
        # Identity, not ==: a default of 0 is shown.
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    """Returns the argument parser of ``python -m fastrollout``.

    Returns:
        The parser (sub-commands ``sample`` and ``evaluate``).
    """
    parser = argparse.ArgumentParser(
        prog=PROG, description="Fast RL experience collection with RLlib's API."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    sample = commands.add_parser(
        "sample",
        help="sample an env with the default policy and print the metrics",
        description="Sample an env with the default (untrained) policy and print a summary "
        "and the metrics. Exit status 2 on a configuration error.",
        epilog=_THREADS_EPILOG,
        formatter_class=_HelpFormatter,
    )
    sample.add_argument("--env", default="CartPole-v1", help="gymnasium id or registered name")
    sample.add_argument(
        "--num-envs", type=_positive_int, default=8, help="sub-envs stepped together"
    )
    sample.add_argument(
        "--timesteps",
        type=_positive_int,
        default=100_000,
        help="env steps to sample (1e5 and 100000.0 are read as 100000)",
    )
    sample.add_argument(
        "--multi-agent",
        type=_positive_int,
        default=None,
        metavar="N",
        help="N copies of the env as agents 0..N-1 (make_multi_agent), one shared module "
        "(default: single-agent)",
    )
    sample.add_argument(
        "--num-env-runners",
        type=_non_negative_int,
        default=0,
        metavar="N",
        help="sample with N remote runners (Ray actors; needs fastrollout[ray]) instead of "
        "in this process",
    )
    sample.add_argument(
        "--num-cpus-per-env-runner",
        type=_positive_float,
        default=1.0,
        metavar="C",
        help="CPUs Ray reserves per remote runner",
    )
    sample.add_argument(
        "--num-threads",
        type=_non_negative_int,
        default=None,
        metavar="N",
        help=f"torch and BLAS threads of this process; 0: the libraries' defaults, one per "
        f"core (default: {DEFAULT_NUM_THREADS}, or what OMP_NUM_THREADS sets; see below)",
    )
    sample.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    sample.add_argument(
        "--seed", type=_seed, default=None, help="seed of envs and module (default: random)"
    )
    sample.add_argument(
        "--rollout-fragment-length",
        type=_positive_int,
        default=64,
        help="env steps per sub-env per sample() call",
    )
    sample.add_argument(
        "--vectorize-mode",
        choices=["sync", "async", "vector_entry_point"],
        default="sync",
        help="single-agent vector env: in-process, sub-processes, or the env's own "
        "vectorized implementation such as CartPole's",
    )
    sample.add_argument(
        "--sub-env-backend",
        choices=["default", "shared_memory"],
        default="default",
        help="where the sub-envs step: as --vectorize-mode says, or in worker processes "
        "that step in the background, observations in shared memory (an envpool:<task> "
        "env always runs on EnvPool)",
    )
    sample.add_argument(
        "--sub-env-workers",
        type=_positive_int,
        default=None,
        metavar="N",
        help="worker processes of the shared_memory backend (default: one per core but "
        "this process's)",
    )
    sample.add_argument(
        "--sub-env-batch-size",
        type=_positive_int,
        default=None,
        metavar="N",
        help="sub-envs acted for per turn with the shared_memory and EnvPool backends "
        "(default: half of them)",
    )
    sample.add_argument(
        "--env-config",
        type=_json_dict,
        default=None,
        metavar="JSON",
        help="the env config as a JSON object (for an envpool:<task> env, EnvPool's "
        'arguments, e.g. \'{"img_height": 64, "channels_last": true}\')',
    )
    sample.add_argument(
        "--output",
        type=Path,
        default=None,
        metavar="DIR",
        help=f"write every sample() call's metrics to DIR/{JSONL_NAME} (one JSON object "
        f"per line), a plot of return and throughput to DIR/{PLOT_NAME} (needs "
        "matplotlib: pip install 'fastrollout[plot]'), and the episodes to "
        f"DIR/{EPISODES_DIR}/ (parquet files of up to 64 MiB; needs pyarrow: pip install "
        "'fastrollout[offline]'), which `evaluate DIR` reads",
    )
    sample.add_argument(
        "--json",
        action="store_true",
        help="print the summary as JSON on stdout, nothing else (the progress bar and "
        "messages go to stderr)",
    )
    sample.add_argument("--no-explore", action="store_true", help="greedy actions")
    sample.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_evaluate_parser(commands, _HelpFormatter)
    return parser


def config_from_args(args: argparse.Namespace) -> Any:
    """Builds the ``RunnerConfig`` for ``sample`` arguments.

    Args:
        args: Parsed arguments of the ``sample`` command.

    Returns:
        A validated ``RunnerConfig``.

    Raises:
        ConfigurationError: An invalid combination (e.g. a bad device), from ``validate()``.
    """
    from fastrollout.config import RunnerConfig
    from fastrollout.env import make_multi_agent

    try:
        config = RunnerConfig()
        env_config = dict(args.env_config or {})
        if args.multi_agent is not None:
            config.environment(
                make_multi_agent(args.env),
                env_config={**env_config, "num_agents": args.multi_agent},
            )
        else:
            config.environment(args.env, env_config=env_config)
        config.env_runners(
            num_env_runners=args.num_env_runners,
            num_cpus_per_env_runner=args.num_cpus_per_env_runner,
            num_envs_per_env_runner=args.num_envs,
            rollout_fragment_length=args.rollout_fragment_length,
            gym_env_vectorize_mode=args.vectorize_mode,
            explore=not args.no_explore,
            sub_env_backend=args.sub_env_backend,
            num_sub_env_workers=args.sub_env_workers,
            sub_env_batch_size=args.sub_env_batch_size,
        )
        config.resources(device=args.device)
        config.debugging(seed=args.seed)
        if args.output is not None and _has_pyarrow():
            config.offline_data(
                output=str(args.output / EPISODES_DIR),
                output_write_episodes=True,
                output_max_file_size=OUTPUT_FILE_SIZE,
            )
        config.validate()
    except (ValueError, TypeError) as err:
        raise ConfigurationError(str(err)) from err
    return config


def check_config(args: argparse.Namespace) -> None:
    """Checks, before anything is built, what would fail later with a traceback.

    The env name is resolved (gymnasium's own hint included where it knows none by that
    name), the device is resolved where the runner samples in this process (remote
    runners resolve theirs on their own machines), Ray is imported for remote runners,
    and the output folder is created.

    Args:
        args: Parsed arguments of the ``sample`` command.

    Raises:
        ConfigurationError: With a one-line message.
    """
    from fastrollout.env import make_env_creator
    from fastrollout.modules import resolve_device
    from fastrollout.runners.sub_envs.envpool_backend import envpool_task

    try:
        if envpool_task(args.env) is not None:
            require_extra(
                "envpool", extra="envpool", purpose="an 'envpool:<task>' env", name="EnvPool"
            )
        else:
            make_env_creator(args.env, disable_env_checking=True)
        if not args.num_env_runners:
            resolve_device(args.device)
        else:
            from fastrollout.runners.ray_host import require_ray

            require_ray(f"--num-env-runners {args.num_env_runners}")
    except (ValueError, TypeError, ImportError) as err:
        raise ConfigurationError(str(err)) from err
    if args.output is not None:
        try:
            args.output.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise ConfigurationError(f"--output {str(args.output)!r}: {err}") from err


def _has_pyarrow() -> bool:
    """Whether the episodes can be recorded (as parquet, with pyarrow)."""
    try:
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        return False
    return True


def _start_ray(num_env_runners: int, cpus_per_runner: float) -> bool:
    """Starts Ray for the remote runners unless it runs already.

    A new local instance (``RAY_ADDRESS`` joins a cluster instead) with at least as many
    CPUs as the runners reserve, so that ``--num-env-runners`` above the core count still
    starts.

    Args:
        num_env_runners: The number of remote runners.
        cpus_per_runner: The CPUs each reserves.

    Returns:
        Whether this call started Ray (and should shut it down).

    Raises:
        ImportError: If Ray is not installed (naming the extra).
    """
    from fastrollout.runners.ray_host import require_ray

    ray = require_ray(f"--num-env-runners {num_env_runners}")
    if ray.is_initialized():
        return False
    address = os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address)
    else:
        cpus = max(os.cpu_count() or 1, math.ceil(num_env_runners * cpus_per_runner))
        ray.init(address="local", num_cpus=cpus, include_dashboard=False)
    return True


def _stop_ray() -> None:
    import ray

    ray.shutdown()


def _build_group(config: Any) -> Any:
    """The ``EnvRunnerGroup``; an env that cannot be made is a configuration error.

    Raises:
        ConfigurationError: gymnasium could not make the env (e.g. a missing dependency)
            or the env failed fastrollout's env check.
    """
    import gymnasium as gym

    from fastrollout.env import EnvCheckError
    from fastrollout.runners import EnvRunnerGroup

    try:
        return EnvRunnerGroup(config=config)
    except (gym.error.Error, EnvCheckError) as err:
        raise ConfigurationError(f"the env could not be made: {err}") from err


def _title(args: argparse.Namespace, env_steps: int, threads: str) -> str:
    return (
        f"fastrollout sample: {args.env}"
        + (f" x{args.multi_agent} agents" if args.multi_agent else "")
        + f", {args.num_envs} sub-envs"
        + (f" x {args.num_env_runners} remote runners" if args.num_env_runners else "")
        + f", {env_steps:,} env steps, {threads}"
    )


def run_sample(args: argparse.Namespace, out: TextIO | None = None) -> dict[str, Any]:
    """Runs the ``sample`` command: samples ``args.timesteps`` env steps, then reports.

    The runners are an ``EnvRunnerGroup``: with ``--num-env-runners 0`` one runner in this
    process, else that many Ray actors (Ray is started if it does not run yet). The
    process's thread counts are set first (``--num-threads``; see ``apply_num_threads``).

    Args:
        args: Parsed ``sample`` arguments.
        out: Where the report goes (default stdout); the progress bar and messages go to
            stderr.

    Returns:
        The summary (as ``--json`` prints it): settings, ``env_steps``,
        ``env_steps_per_s``, ``episodes``, returns, ``time_per_env_step_us`` and
        ``time_share``; ``metrics`` holds every metric (the latest non-NaN value of each,
        flat ``"outer/inner"`` names) with the run's totals under ``"cli/..."``.

    Raises:
        ConfigurationError: The arguments name an env, device or output folder that
            cannot be used.
        RuntimeError: The runners returned no env steps.
    """
    out = out or sys.stdout
    # With --json, stdout carries the summary only: what the envs, the runners or Ray's
    # forwarded worker output print meanwhile goes to stderr.
    with contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext():
        summary, title = _sample(args)
    if args.json:
        print(to_json(summary), file=out)
    else:
        print(render_summary(summary, title=title, multi_agent=bool(args.multi_agent)), file=out)
        print(file=out)
        print(render_table(summary["metrics"], title="all metrics (RLlib's names)"), file=out)
    return summary


def _sample(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    """Samples as ``run_sample`` says and writes the output files.

    Returns:
        The summary, and the report's title.
    """
    from tqdm import tqdm

    threads = apply_num_threads(args.num_threads)
    config = config_from_args(args)
    check_config(args)
    started_ray = (
        _start_ray(args.num_env_runners, args.num_cpus_per_env_runner)
        if args.num_env_runners
        else False
    )
    try:
        group = _build_group(config)
    except BaseException:
        if started_ray:
            _stop_ray()
        raise
    samplers = max(1, args.num_env_runners)
    # One sample() call gives every runner one fragment per sub-env.
    per_call = args.rollout_fragment_length * args.num_envs * samplers
    with contextlib.ExitStack() as stack:
        jsonl: IO[str] | None = None
        if args.output is not None:
            jsonl = stack.enter_context(open(args.output / JSONL_NAME, "w", encoding="utf-8"))
        log = RunLog(num_envs=args.num_envs, num_samplers=samplers, jsonl=jsonl)
        try:
            bar = stack.enter_context(
                tqdm(
                    total=args.timesteps,
                    unit="step",
                    unit_scale=True,
                    disable=args.no_progress,
                    dynamic_ncols=True,
                    file=sys.stderr,
                )
            )
            while log.env_steps < args.timesteps:
                start = time.perf_counter()
                episodes = group.sample(num_timesteps=min(per_call, args.timesteps - log.env_steps))
                call_s = time.perf_counter() - start
                if not any(len(e) for e in episodes):
                    raise RuntimeError("the runners returned no env steps; stopping")
                record = log.add_call(episodes, call_s=call_s, metrics=group.get_metrics())
                if log.episodes:
                    bar.set_postfix(ret=f"{log.return_sum / log.episodes:.1f}", refresh=False)
                if log.env_steps < args.timesteps:
                    bar.update(record["call_env_steps"])
            elapsed = time.perf_counter() - log.start
            # The final line, drawn once by close(): update() would draw it first. A call
            # may return a few steps more than asked (whole vector steps): the bar's
            # total becomes what was sampled, so that it ends at 100%.
            bar.total = max(args.timesteps, log.env_steps)
            bar.n = log.env_steps
            bar.close()
        finally:
            group.stop()
            if started_ray:
                _stop_ray()
    summary = summarize(
        log,
        elapsed,
        env=args.env,
        num_envs=args.num_envs,
        num_agents=args.multi_agent,
        num_env_runners=args.num_env_runners,
        num_threads=threads.num_threads,
        threads=threads.describe(),
    )
    metrics = dict(log.latest)
    metrics.update(
        {
            "cli/env_steps": log.env_steps,
            "cli/agent_steps": log.agent_steps,
            "cli/episodes_done": log.episodes,
            "cli/sample_calls": log.calls,
            "cli/wall_time_s": elapsed,
            "cli/env_steps_per_s": summary["env_steps_per_s"],
            "cli/agent_steps_per_s": summary["agent_steps_per_s"],
        }
    )
    summary["metrics"] = metrics
    title = _title(args, log.env_steps, threads.describe())
    if args.output is not None:
        _write_plot(log, args.output / PLOT_NAME, title)
        if not _has_pyarrow():
            print(
                f"{PROG} sample: no episodes recorded: it needs pyarrow "
                "(pip install 'fastrollout[offline]')",
                file=sys.stderr,
            )
        print(_wrote(args.output), file=sys.stderr)
    return summary, title


def _wrote(output: Path) -> str:
    """The line that says what ``--output`` wrote where (files, sizes)."""
    parts = [p.name for p in (output / JSONL_NAME, output / PLOT_NAME) if p.is_file()]
    files = sorted((output / EPISODES_DIR).rglob("*.parquet"))
    if files:
        size = sum(f.stat().st_size for f in files)
        parts.append(
            f"{EPISODES_DIR}/ ({len(files)} parquet file{'s' if len(files) != 1 else ''}, "
            f"{_human_size(size)})"
        )
    return f"{PROG} sample: wrote {', '.join(parts)} in {output}"


def _human_size(size: int) -> str:
    """``size`` bytes as B, KiB, MiB or GiB with 3 significant digits."""
    value = float(size)
    for unit in ("B", "KiB", "MiB"):
        if value < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.3g} {unit}"
        value /= 1024
    return f"{value:.3g} GiB"


def _write_plot(log: RunLog, path: Path, title: str) -> None:
    """Writes the plot, or says in one line on stderr why not (matplotlib missing)."""
    try:
        write_plot(log, path, title)
    except ImportError:
        print(
            f"{PROG} sample: no plot written: it needs matplotlib "
            f"(pip install 'fastrollout[plot]'); the metrics are in "
            f"{path.with_name(JSONL_NAME)}",
            file=sys.stderr,
        )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m fastrollout``.

    Args:
        argv: Arguments (default ``sys.argv[1:]``).

    Returns:
        The exit status: 0 on success, 2 on a configuration error (after a one-line
        message on stderr; argparse exits with 2 itself on a malformed argument).
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    run = {"sample": run_sample, "evaluate": run_evaluate}[args.command]
    try:
        run(args)
        # Inside the try: a reader that went away (``| head``) surfaces here.
        sys.stdout.flush()
    except ConfigurationError as err:
        # One line, however the library worded it (gymnasium's hints included).
        message = " ".join(str(err).split())
        print(f"{PROG} {args.command}: error: {message}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return _stdout_closed()
    return 0


def _stdout_closed() -> int:
    """Ends quietly after the reader of stdout went away, as a command killed by SIGPIPE.

    Returns:
        128 + SIGPIPE, the status a shell reports for such a command.
    """
    # Python flushes stdout again at exit, which would raise once more: what is left
    # in its buffer goes to /dev/null instead.
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    return 128 + int(getattr(signal, "SIGPIPE", 13))
