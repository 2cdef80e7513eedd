"""``python -m fastrollout sample``: sample an env with a default policy and show the metrics.

Example::

    python -m fastrollout sample --env CartPole-v1 --num-envs 8 --timesteps 100000
    python -m fastrollout sample --env CartPole-v1 --multi-agent 4 --device cpu --seed 0
    python -m fastrollout sample --env CartPole-v1 --num-env-runners 2   # Ray actors

A progress bar (tqdm) shows env steps per second and the running mean episode return; a
table of the runners' metrics follows (RLlib's metric names), aggregated over the runners
by an ``EnvRunnerGroup``.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TextIO

__all__ = ["build_parser", "config_from_args", "flatten_metrics", "main", "render_table"]

EPISODE_RETURN_MEAN = "episode_return_mean"


def _int_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type: an int of at least ``minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an int, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected an int >= {minimum}, got {value}")
        return value

    return parse


_positive_int = _int_at_least(1)
_non_negative_int = _int_at_least(0)


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {value}")
    return value


def _seed(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an int seed, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a seed >= 0, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """Returns the argument parser of ``python -m fastrollout``.

    Returns:
        The parser (sub-command ``sample``).
    """
    parser = argparse.ArgumentParser(
        prog="python -m fastrollout",
        description="Fast RL experience collection with RLlib's API.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    sample = commands.add_parser(
        "sample",
        help="sample an env with the default policy and print the metrics",
        description="Sample an env with the default (untrained) policy and print the metrics.",
    )
    sample.add_argument("--env", default="CartPole-v1", help="gymnasium id or registered name")
    sample.add_argument(
        "--num-envs", type=_positive_int, default=8, help="sub-envs stepped together (default 8)"
    )
    sample.add_argument(
        "--timesteps", type=_positive_int, default=100_000, help="env steps to sample"
    )
    sample.add_argument(
        "--multi-agent",
        type=_positive_int,
        default=None,
        metavar="N",
        help="N copies of the env as agents 0..N-1 (make_multi_agent), one shared module",
    )
    sample.add_argument(
        "--num-env-runners",
        type=_non_negative_int,
        default=0,
        metavar="N",
        help="sample with N remote runners (Ray actors; needs fastrollout[ray]) instead of "
        "in this process (default 0)",
    )
    sample.add_argument(
        "--num-cpus-per-env-runner",
        type=_positive_float,
        default=1.0,
        metavar="C",
        help="CPUs Ray reserves per remote runner (default 1)",
    )
    sample.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default auto)")
    sample.add_argument("--seed", type=_seed, default=None, help="seed of envs and module")
    sample.add_argument(
        "--rollout-fragment-length",
        type=_positive_int,
        default=64,
        help="env steps per sub-env per sample() call (default 64)",
    )
    sample.add_argument(
        "--vectorize-mode",
        choices=["sync", "async", "vector_entry_point"],
        default="sync",
        help="single-agent vector env: in-process, sub-processes, or the env's own "
        "vectorized implementation such as CartPole's (default sync)",
    )
    sample.add_argument("--no-explore", action="store_true", help="greedy actions")
    sample.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def config_from_args(args: argparse.Namespace) -> Any:
    """Builds the ``RunnerConfig`` for ``sample`` arguments.

    Args:
        args: Parsed arguments of the ``sample`` command.

    Returns:
        A validated ``RunnerConfig``.

    Raises:
        ValueError: An invalid combination (e.g. a bad device), from ``validate()``.
    """
    from fastrollout.config import RunnerConfig
    from fastrollout.env import make_multi_agent

    config = RunnerConfig()
    if args.multi_agent is not None:
        config.environment(make_multi_agent(args.env), env_config={"num_agents": args.multi_agent})
    else:
        config.environment(args.env)
    config.env_runners(
        num_env_runners=args.num_env_runners,
        num_cpus_per_env_runner=args.num_cpus_per_env_runner,
        num_envs_per_env_runner=args.num_envs,
        rollout_fragment_length=args.rollout_fragment_length,
        gym_env_vectorize_mode=args.vectorize_mode,
        explore=not args.no_explore,
    )
    config.resources(device=args.device)
    config.debugging(seed=args.seed)
    config.validate()
    return config


def flatten_metrics(metrics: Mapping[Any, Any], prefix: str = "") -> dict[str, Any]:
    """Flattens nested metric dicts into ``"outer/inner"`` keys, with plain values.

    Leaves with a ``peek()`` method (the snapshots a ``MetricsLogger.reduce()`` returns)
    are replaced by their reduced value.

    Args:
        metrics: Possibly nested dict of metric values.
        prefix: Key prefix (used in recursion).

    Returns:
        A flat dict, keys in the nested dict's order.
    """
    flat: dict[str, Any] = {}
    for key, value in metrics.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten_metrics(value, f"{name}/"))
        else:
            peek = getattr(value, "peek", None)
            flat[name] = peek() if callable(peek) else value
    return flat


def _format_value(value: Any) -> str:
    if hasattr(value, "item") and getattr(value, "shape", None) == ():
        value = value.item()
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return str(value)
        if value != 0 and (abs(value) >= 1e6 or abs(value) < 1e-3):
            return f"{value:.3e}"
        return f"{value:,.3f}"
    text = str(value)
    return text if len(text) <= 40 else text[:37] + "..."


def render_table(metrics: Mapping[Any, Any], title: str | None = None) -> str:
    """Renders metrics as a two-column text table, sorted by name.

    Args:
        metrics: Possibly nested dict of metric values.
        title: Optional heading line.

    Returns:
        The table (no trailing newline).

    >>> print(render_table({"a": 1, "b": {"c": 2.5}}))
    metric  value
    ------  -----
    a           1
    b/c     2.500
    """
    rows = sorted((name, _format_value(v)) for name, v in flatten_metrics(metrics).items())
    name_width = max([len("metric"), *(len(n) for n, _ in rows)])
    value_width = max([len("value"), *(len(v) for _, v in rows)])
    lines = [title] if title else []
    lines.append(f"{'metric':<{name_width}}  {'value':>{value_width}}".rstrip())
    lines.append(f"{'-' * name_width}  {'-' * value_width}")
    lines.extend(f"{n:<{name_width}}  {v:>{value_width}}" for n, v in rows)
    return "\n".join(lines)


def _merge_latest(latest: dict[str, Any], new: Mapping[str, Any]) -> None:
    """Updates ``latest`` with ``new``, except where ``new`` is NaN and a number is known."""
    for key, value in new.items():
        if isinstance(value, float) and math.isnan(value) and key in latest:
            continue
        latest[key] = value


def _env_steps(episodes: Sequence[Any]) -> int:
    # len() of single- and multi-agent episodes counts env steps.
    return sum(len(e) for e in episodes)


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
    from fastrollout.runners._ray_host import require_ray

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


def run_sample(args: argparse.Namespace, out: TextIO | None = None) -> dict[str, Any]:
    """Runs the ``sample`` command: samples ``args.timesteps`` env steps, then prints metrics.

    The runners are an ``EnvRunnerGroup``: with ``--num-env-runners 0`` one runner in this
    process, else that many Ray actors (Ray is started if it does not run yet).

    Args:
        args: Parsed ``sample`` arguments.
        out: Where the table goes (default stdout); the progress bar goes to stderr.

    Returns:
        The runners' metrics, flattened (the latest non-NaN value of each), plus
        ``"cli"`` totals and timing.
    """
    from tqdm import tqdm

    from fastrollout.runners import EnvRunnerGroup

    out = out or sys.stdout
    config = config_from_args(args)
    started_ray = (
        _start_ray(args.num_env_runners, args.num_cpus_per_env_runner)
        if args.num_env_runners
        else False
    )
    try:
        group = EnvRunnerGroup(config=config)
    except BaseException:
        if started_ray:
            _stop_ray()
        raise
    # One sample() call gives every runner one fragment per sub-env.
    per_call = args.rollout_fragment_length * args.num_envs * max(1, args.num_env_runners)
    sampled = 0
    episodes_done = 0
    # The group's metrics are per get_metrics() call; episode statistics are NaN for a
    # call that finished no episode, so the table keeps the latest number seen for each key.
    latest: dict[str, Any] = {}
    running_return = float("nan")
    start = time.perf_counter()
    try:
        with tqdm(
            total=args.timesteps,
            unit="step",
            unit_scale=True,
            disable=args.no_progress,
            dynamic_ncols=True,
            file=sys.stderr,
        ) as bar:
            while sampled < args.timesteps:
                episodes = group.sample(num_timesteps=min(per_call, args.timesteps - sampled))
                steps = _env_steps(episodes)
                if steps == 0:
                    raise RuntimeError("the runners returned no env steps; stopping")
                sampled += steps
                episodes_done += sum(1 for e in episodes if e.is_done)
                _merge_latest(latest, flatten_metrics(group.get_metrics()))
                value = latest.get(EPISODE_RETURN_MEAN)
                if value is not None:
                    running_return = float(value)
                bar.set_postfix(ret=f"{running_return:.1f}", refresh=False)
                bar.update(steps)
        elapsed = time.perf_counter() - start
    finally:
        group.stop()
        if started_ray:
            _stop_ray()
    metrics: dict[str, Any] = dict(latest)
    metrics["cli"] = {
        "env_steps": sampled,
        "episodes_done": episodes_done,
        "wall_time_s": elapsed,
        "env_steps_per_s": sampled / elapsed if elapsed > 0 else float("nan"),
    }
    title = (
        f"fastrollout sample: {args.env}"
        + (f" x{args.multi_agent} agents" if args.multi_agent else "")
        + f", {args.num_envs} sub-envs"
        + (f" x {args.num_env_runners} remote runners" if args.num_env_runners else "")
        + f", {sampled:,} env steps"
    )
    print(render_table(metrics, title=title), file=out)
    return metrics


def _stop_ray() -> None:
    import ray

    ray.shutdown()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m fastrollout``.

    Args:
        argv: Arguments (default ``sys.argv[1:]``).

    Returns:
        The exit status (0 on success, 2 on a configuration error).
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "sample":
        try:
            config_from_args(args)
            if args.num_env_runners:
                from fastrollout.runners._ray_host import require_ray

                require_ray(f"--num-env-runners {args.num_env_runners}")
        except (ValueError, TypeError, ImportError) as e:
            parser.error(str(e))
        run_sample(args)
    return 0
