"""``python -m fastrollout evaluate``: off-policy estimates from recorded episodes.

Example::

    python -m fastrollout sample --env CartPole-v1 --timesteps 2e4 --output runs/cp
    python -m fastrollout evaluate runs/cp --module behavior
    python -m fastrollout evaluate runs/cp --module ckpt/ --methods is,wis,dr --gamma 0.99

The episodes are read from ``DIR/episodes/`` (what ``sample --output DIR`` records), or
from ``DIR`` itself when it has no such folder. ``--module`` is a folder written by
``EnvRunner.save_to_path`` (a runner or module checkpoint for ``--env``), or
``behavior``: the logging policy against itself, from the logged log-probabilities.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any, TextIO

__all__ = ["EPISODES_DIR", "add_evaluate_parser", "run_evaluate"]

#: The folder under ``sample --output DIR`` that holds the recorded episodes.
EPISODES_DIR = "episodes"

_BEHAVIOR = "behavior"


def _methods(text: str) -> tuple[str, ...]:
    from fastrollout.offline.estimators import METHODS

    names = tuple(m.strip().lower() for m in text.split(",") if m.strip())
    unknown = [m for m in names if m not in METHODS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"expected a comma-separated list of {', '.join(METHODS)}, got {text!r}"
        )
    return names


def _gamma(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a discount in [0, 1], got {value}")
    return value


def add_evaluate_parser(commands: Any, formatter_class: type[argparse.HelpFormatter]) -> None:
    """Adds the ``evaluate`` sub-command to ``python -m fastrollout``'s parser.

    Args:
        commands: The sub-parsers object of the main parser.
        formatter_class: The help formatter the other commands use.
    """
    evaluate = commands.add_parser(
        "evaluate",
        help="off-policy estimates (IS, WIS, DM, DR) of a module from recorded episodes",
        description="Read the episodes that `sample --output DIR` recorded and estimate "
        "what a module would earn on them: step-wise importance sampling (is), weighted "
        "importance sampling (wis), the direct method (dm) and doubly robust (dr), the "
        "last two with a Q model fitted to the episodes. Exit status 2 on a "
        "configuration error.",
        formatter_class=formatter_class,
    )
    evaluate.add_argument(
        "dir",
        type=Path,
        metavar="DIR",
        help=f"a `sample --output` folder (episodes in DIR/{EPISODES_DIR}/) or a folder "
        "of episode parquet files",
    )
    evaluate.add_argument(
        "--module",
        default=_BEHAVIOR,
        help="the target: a folder written by EnvRunner.save_to_path for --env, or "
        "'behavior' for the logging policy itself (is and wis only)",
    )
    evaluate.add_argument(
        "--env",
        default="CartPole-v1",
        help="the env whose spaces the --module checkpoint's module was built for",
    )
    evaluate.add_argument(
        "--methods",
        type=_methods,
        default=None,
        help="comma-separated: is, wis, dm, dr (default: all four; is,wis for behavior)",
    )
    evaluate.add_argument("--gamma", type=_gamma, default=0.99, help="discount")
    evaluate.add_argument(
        "--explore",
        action="store_true",
        help="evaluate the module's exploration distribution instead of its inference one",
    )
    evaluate.add_argument(
        "--fqe-iters",
        type=int,
        default=200,
        metavar="N",
        help="fitted Q evaluation iterations for dm and dr",
    )
    evaluate.add_argument(
        "--json", action="store_true", help="print the estimates as JSON, nothing else"
    )


def _error(message: str) -> Exception:
    from fastrollout.cli import ConfigurationError

    return ConfigurationError(message)


def _read(folder: Path) -> list[Any]:
    if not folder.exists():
        raise _error(f"{str(folder)!r} does not exist")
    where = folder / EPISODES_DIR if (folder / EPISODES_DIR).is_dir() else folder
    try:
        from fastrollout.offline import read_episodes

        episodes = read_episodes(where)
    except (ImportError, OSError, ValueError) as err:
        raise _error(f"cannot read the episodes in {str(where)!r}: {err}") from err
    if not episodes:
        raise _error(f"no episodes in {str(where)!r}")
    return episodes


def _load_module(path: str, env: str) -> Any:
    """The module of a runner checkpoint (``EnvRunner.save_to_path``) for ``env``."""
    folder = Path(path)
    if not ((folder / "metadata.json").is_file() or (folder / "state.pkl").is_file()):
        raise _error(
            f"--module {path!r}: expected a folder written by EnvRunner.save_to_path "
            "(with a metadata.json) or 'behavior'"
        )
    import gymnasium as gym

    from fastrollout.config import RunnerConfig
    from fastrollout.env import EnvCheckError
    from fastrollout.runners import SingleAgentEnvRunner

    try:
        config = RunnerConfig().environment(env).env_runners(num_envs_per_env_runner=1)
        runner = SingleAgentEnvRunner(config=config)
        runner.restore_from_path(folder)
    except (gym.error.Error, EnvCheckError, ValueError, TypeError, KeyError, RuntimeError) as err:
        raise _error(f"--module {path!r} for --env {env!r}: {err}") from err
    module = runner.module
    runner.stop()
    return module


def estimates_for(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Reads the episodes and computes the estimates that ``evaluate`` prints.

    Raises:
        ConfigurationError: With a one-line message.
    """
    from fastrollout.offline import estimate

    behaviour = args.module == _BEHAVIOR
    methods = args.methods or (("is", "wis") if behaviour else ("is", "wis", "dm", "dr"))
    if behaviour and any(m in ("dm", "dr") for m in methods):
        raise _error(
            "--methods dm and dr need a target module (--module PATH); the behaviour's "
            "logs hold only the log-probability of the actions taken"
        )
    if args.fqe_iters < 1:
        raise _error(f"--fqe-iters must be at least 1, got {args.fqe_iters}")
    episodes = _read(args.dir)
    module = None if behaviour else _load_module(args.module, args.env)
    try:
        return estimate(
            episodes,
            module,
            methods,
            gamma=args.gamma,
            explore=args.explore,
            fqe={"n_iters": args.fqe_iters},
        )
    except (ValueError, TypeError) as err:
        raise _error(str(err)) from err


def _number(value: float) -> str:
    return "nan" if math.isnan(value) else f"{value:,.4g}"


def render_estimates(results: dict[str, dict[str, float]], *, title: str) -> str:
    """The estimates as a table: one row per method.

    Args:
        results: What ``fastrollout.offline.estimate`` returns.
        title: The line above the table.

    Returns:
        The table (no trailing newline).
    """
    header = ("method", "v_behavior", "v_target", "± ste", "v_gain", "± ste", "episodes")
    rows = [header]
    for method, r in results.items():
        rows.append(
            (
                method,
                _number(r["v_behavior"]),
                _number(r["v_target"]),
                _number(r["v_target_ste"]),
                _number(r["v_gain"]),
                _number(r["v_gain_ste"]),
                str(int(r["num_episodes"])),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = [title]
    for k, row in enumerate(rows):
        cells = [row[0].ljust(widths[0])] + [
            c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)
        ]
        lines.append("  ".join(cells).rstrip())
        if k == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def run_evaluate(args: argparse.Namespace, out: TextIO | None = None) -> dict[str, Any]:
    """Runs the ``evaluate`` command and prints the table (or JSON).

    Args:
        args: Parsed ``evaluate`` arguments.
        out: Where the report goes (default stdout).

    Returns:
        ``{method: estimates}`` as ``fastrollout.offline.estimate`` returns it.

    Raises:
        ConfigurationError: A folder without episodes, episodes without
            ``action_logp``, a module that cannot be loaded, or methods that need a module.
    """
    out = out or sys.stdout
    results = estimates_for(args)
    if args.json:
        print(json.dumps(results, indent=2, allow_nan=True), file=out)
    else:
        target = "the behaviour policy" if args.module == _BEHAVIOR else args.module
        title = f"fastrollout evaluate: {target} on {args.dir} (gamma {args.gamma:g})"
        print(render_estimates(results, title=title), file=out)
    return results
