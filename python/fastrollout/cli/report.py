"""What ``python -m fastrollout sample`` reports: the summary, the metrics table, the files.

A :class:`RunLog` collects each ``sample`` call's step counts, wall time and metrics;
:func:`summarize` turns it into the summary (throughput, episodes, where the time went),
:func:`render_summary` and :func:`render_table` into text, :func:`write_plot` into a PNG.
"""

from __future__ import annotations

import json
import math
import textwrap
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from fastrollout._extras import require_extra

__all__ = [
    "JSONL_NAME",
    "PLOT_NAME",
    "RunLog",
    "flatten_metrics",
    "render_summary",
    "render_table",
    "summarize",
    "to_json",
    "write_plot",
]

JSONL_NAME = "metrics.jsonl"
PLOT_NAME = "metrics.png"

# The runners' per-vector-step timers (seconds, moving averages) and the summary's names
# for them, in the order of a step: observations to the module, forward pass, actions to
# the env, the env's step.
_STAGES = (
    ("env_to_module_connector", "env_to_module", "env-to-module connector"),
    ("rlmodule_inference_timer", "forward", "forward pass (RLModule)"),
    ("module_to_env_connector", "module_to_env", "module-to-env connector"),
    ("env_step_timer", "env_step", "env.step"),
)
_REST_OF_SAMPLE = ("rest_of_sample", "record, cut, rest of sample()")
_OUTSIDE_SAMPLE = ("outside_sample", "get_metrics and the CLI")

# Timers logged once per sample() call, reset or the pause between calls (seconds).
_CALL_TIMERS = {
    "sample": "ms per sample() call",
    "env_reset_timer": "ms per reset",
    "time_between_sampling": "ms between sample() calls",
}
_LAST_CALL_COUNTERS = (
    "num_env_steps_sampled",
    "num_agent_steps_sampled",
    "num_module_steps_sampled",
    "num_episodes",
)
_EPISODE_METRICS = (
    "episode_",
    "agent_episode_",
    "module_episode_",
    "agent_steps/",
)


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


def _plain(value: Any) -> Any:
    """A JSON-ready value: numpy scalars as Python numbers, NaN and infinities as None."""
    if hasattr(value, "item") and getattr(value, "shape", None) == ():
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def to_json(value: Any) -> str:
    """Strict JSON (NaN written as null, which every JSON reader takes).

    Args:
        value: Nested dicts/lists of numbers, strings, numpy scalars.

    Returns:
        One line of JSON.
    """
    return json.dumps(_plain(value), allow_nan=False, ensure_ascii=False)


class RunLog:
    """Collects each ``sample`` call of a CLI run: counts, wall time, metrics.

    Args:
        num_envs: Sub-envs per runner.
        num_samplers: Runners that sample (the remote ones, else the local one).
        jsonl: Where to write one JSON object per call (flushed each call), or None.
    """

    def __init__(self, *, num_envs: int, num_samplers: int, jsonl: IO[str] | None = None) -> None:
        self.num_envs = num_envs
        self.num_samplers = num_samplers
        self.jsonl = jsonl
        self.start = time.perf_counter()
        self.env_steps = 0
        self.agent_steps = 0
        self.calls = 0
        self.sampling_s = 0.0
        # Seconds per stage, estimated per call from the per-step timers (see add_call).
        self.stage_s = {key: 0.0 for _, key, _ in _STAGES}
        # The latest non-NaN value of each metric: episode statistics are NaN for a call
        # that finished no episode.
        self.latest: dict[str, Any] = {}
        # The returns of the run's done episodes, counted here from the episodes (whole
        # episodes: their chunks from earlier calls added), not from the metrics, whose
        # episode statistics cover the episodes of the last get_metrics() call.
        self.episodes = 0
        self.return_sum = 0.0
        self.return_min = math.inf
        self.return_max = -math.inf
        self._partial_returns: dict[str, float] = {}
        # (env steps, wall time, mean return of the call's done episodes, env steps/s of
        # the call) per call, for the plot.
        self.history: list[tuple[int, float, float, float]] = []

    def add_call(
        self, episodes: Sequence[Any], *, call_s: float, metrics: Mapping[Any, Any]
    ) -> dict[str, Any]:
        """Adds one ``sample`` call (and the ``get_metrics`` after it).

        Args:
            episodes: What the call returned: done episodes and chunks of ongoing ones
                (single- or multi-agent).
            call_s: The call's wall time in seconds.
            metrics: ``get_metrics()`` after the call (nested or flat).

        Returns:
            The call's record, as written to the JSON lines.
        """
        flat = flatten_metrics(metrics)
        for key, value in flat.items():
            if isinstance(value, float) and math.isnan(value) and key in self.latest:
                continue
            self.latest[key] = value
        # len() of single- and multi-agent episodes counts env steps.
        env_steps = sum(len(e) for e in episodes)
        agent_steps = sum(
            e.agent_steps() if hasattr(e, "agent_steps") else len(e) for e in episodes
        )
        returns = []
        for e in episodes:
            ret = self._partial_returns.pop(e.id_, 0.0) + float(e.get_return())
            if e.is_done:
                returns.append(ret)
            else:
                self._partial_returns[e.id_] = ret
        self.calls += 1
        self.env_steps += env_steps
        self.agent_steps += agent_steps
        self.episodes += len(returns)
        self.return_sum += sum(returns)
        self.return_min = min([self.return_min, *returns])
        self.return_max = max([self.return_max, *returns])
        self.sampling_s += call_s
        # The timers are moving averages of seconds per vector step of one runner; the
        # runners step in parallel, so a call spent about timer x (vector steps of one
        # runner) in each stage.
        vector_steps = env_steps / (self.num_envs * self.num_samplers)
        for metric, key, _ in _STAGES:
            value = _number(self.latest.get(metric))
            if value is not None:
                self.stage_s[key] += value * vector_steps
        wall = time.perf_counter() - self.start
        call_return = sum(returns) / len(returns) if returns else math.nan
        rate = env_steps / call_s if call_s > 0 else math.nan
        self.history.append((self.env_steps, wall, call_return, rate))
        record = {
            "sample_call": self.calls,
            "env_steps": self.env_steps,
            "agent_steps": self.agent_steps,
            "episodes": self.episodes,
            "wall_time_s": wall,
            "call_env_steps": env_steps,
            "call_episodes": len(returns),
            "call_episode_return_mean": call_return,
            "call_time_s": call_s,
            "env_steps_per_s": rate,
            "metrics": flat,
        }
        if self.jsonl is not None:
            self.jsonl.write(to_json(record) + "\n")
            self.jsonl.flush()
        return record


def _number(value: Any) -> float | None:
    """``value`` as a finite float, or None."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def summarize(log: RunLog, elapsed_s: float, **run: Any) -> dict[str, Any]:
    """The run's summary: throughput, episodes, returns, and where the time went.

    Args:
        log: The run's calls.
        elapsed_s: Wall time of the whole sampling loop (calls, ``get_metrics``, progress).
        **run: Settings to put first (env, sub-envs, threads...).

    Returns:
        The summary; times in ``time_per_env_step_us`` (µs per env step, adding up to
        ``1e6 / env_steps_per_s``) and ``time_share`` (fractions of ``elapsed_s``, adding
        up to 1). The stages inside ``sample()`` are estimated from the runners' per-step
        timers (moving averages); what they leave of the measured ``sample()`` time is
        ``rest_of_sample``. Values that could not be measured are NaN.
    """
    per_s = log.env_steps / elapsed_s if elapsed_s > 0 else math.nan
    spent = dict(log.stage_s)
    staged = sum(spent.values())
    if staged > log.sampling_s > 0:
        # The timers are moving averages that start at the first, slow steps (torch's
        # warm-up), so over a short run they add up to more than the measured time: they
        # then give the split only, scaled to the time measured.
        spent = {key: seconds * log.sampling_s / staged for key, seconds in spent.items()}
    spent[_REST_OF_SAMPLE[0]] = max(0.0, log.sampling_s - sum(spent.values()))
    spent[_OUTSIDE_SAMPLE[0]] = max(0.0, elapsed_s - log.sampling_s)
    us_per_step = {
        key: seconds * 1e6 / log.env_steps if log.env_steps else math.nan
        for key, seconds in spent.items()
    }
    share = {
        key: seconds / elapsed_s if elapsed_s > 0 else math.nan for key, seconds in spent.items()
    }

    return {
        **run,
        "env_steps": log.env_steps,
        "agent_steps": log.agent_steps,
        "wall_time_s": elapsed_s,
        "env_steps_per_s": per_s,
        "agent_steps_per_s": log.agent_steps / elapsed_s if elapsed_s > 0 else math.nan,
        "episodes": log.episodes,
        "episode_return_mean": log.return_sum / log.episodes if log.episodes else math.nan,
        "episode_return_min": log.return_min if log.episodes else math.nan,
        "episode_return_max": log.return_max if log.episodes else math.nan,
        "time_per_env_step_us": us_per_step,
        "time_share": share,
    }


def _fmt(value: float, spec: str) -> str:
    return "n/a" if math.isnan(value) else format(value, spec)


def render_summary(summary: Mapping[str, Any], *, title: str, multi_agent: bool) -> str:
    """The summary as a few lines of text.

    Args:
        summary: From :func:`summarize`.
        title: The first line.
        multi_agent: Also show agent steps per second.

    Returns:
        The text (no trailing newline).
    """
    lines = [title]
    rate = f"{_fmt(summary['env_steps_per_s'], ',.0f')} env steps/s"
    if multi_agent:
        rate += f", {_fmt(summary['agent_steps_per_s'], ',.0f')} agent steps/s"
    lines.append(
        f"  throughput  {rate}  ({summary['env_steps']:,} env steps in "
        f"{summary['wall_time_s']:.2f} s)"
    )
    episodes = f"{summary['episodes']:,} done"
    if math.isnan(summary["episode_return_mean"]):
        episodes += "; none finished, so no return yet"
    else:
        episodes += (
            f", return mean {summary['episode_return_mean']:.2f}, "
            f"min {summary['episode_return_min']:.2f}, max {summary['episode_return_max']:.2f}"
        )
    lines.append(f"  episodes    {episodes}")
    us = summary["time_per_env_step_us"]
    share = summary["time_share"]
    lines.append(f"  time per env step: {_fmt(sum(us.values()), '.1f')} µs")
    labels = [(key, label) for _, key, label in _STAGES] + [_REST_OF_SAMPLE, _OUTSIDE_SAMPLE]
    width = max(len(label) for _, label in labels)
    for key, label in labels:
        lines.append(
            f"    {label:<{width}}  {_fmt(us[key], '8.2f')} µs  {_fmt(100 * share[key], '5.1f')}%"
        )
    return "\n".join(lines)


def _section_and_unit(name: str) -> tuple[int, str, float]:
    """Where a metric goes in the table: (section index, unit, scale of the value)."""
    base = name.split("/", 1)[0]
    if name.startswith("cli/"):
        return 0, _CLI_UNITS.get(name, ""), 1.0
    if base.endswith("_lifetime"):
        return 1, "", 1.0
    if base in _LAST_CALL_COUNTERS:
        return 2, "", 1.0
    if name.startswith(_EPISODE_METRICS):
        return 3, "s" if "duration_sec" in name else "", 1.0
    if base in {metric for metric, _, _ in _STAGES}:
        return 4, "µs per vector step", 1e6
    if base in _CALL_TIMERS:
        return 4, _CALL_TIMERS[base], 1e3
    return 5, "", 1.0


_CLI_UNITS = {
    "cli/wall_time_s": "s",
    "cli/env_steps_per_s": "env steps/s",
    "cli/agent_steps_per_s": "agent steps/s",
}
_SECTIONS = (
    "this run",
    "lifetime: the runners' totals since they were built",
    "the last sample() call only",
    "episodes: those the last get_metrics() call reported",
    "timers: moving averages, over all sub-envs of one runner",
    "other",
)


def _format_value(value: Any) -> str:
    if hasattr(value, "item") and getattr(value, "shape", None) == ():
        value = value.item()
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        # Counters arrive as floats from the metrics' reductions.
        value = int(value)
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
    """Renders metrics as a table in sections, with units, sorted by name in each.

    Sections: ``cli/...`` (this run), lifetime counters, the last ``sample`` call's
    counters, episode statistics, timers (in ms or µs, per what), everything else.

    Args:
        metrics: Possibly nested dict of metric values (RLlib's names).
        title: Optional heading line.

    Returns:
        The table (no trailing newline).

    >>> print(render_table({"num_episodes_lifetime": 7, "env_step_timer": 2.5e-05}))
    metric                   value  unit
    ---------------------  -------  ------------------
    lifetime: the runners' totals since they were built
      num_episodes_lifetime      7
    timers: moving averages, over all sub-envs of one runner
      env_step_timer        25.000  µs per vector step
    """
    sections: list[list[tuple[str, str, str]]] = [[] for _ in _SECTIONS]
    for name, value in sorted(flatten_metrics(metrics).items()):
        index, unit, scale = _section_and_unit(name)
        if scale != 1.0 and isinstance(_number(value), float):
            value = float(value) * scale
        sections[index].append((f"  {name}", _format_value(value), unit))
    rows = [row for rows in sections for row in rows]
    name_width = max([len("metric"), *(len(n) for n, _, _ in rows)])
    value_width = max([len("value"), *(len(v) for _, v, _ in rows)])
    unit_width = max([len("unit"), *(len(u) for _, _, u in rows)])
    lines = [title] if title else []
    lines.append(f"{'metric':<{name_width}}  {'value':>{value_width}}  unit")
    lines.append(f"{'-' * name_width}  {'-' * value_width}  {'-' * unit_width}")
    for heading, rows in zip(_SECTIONS, sections, strict=True):
        if rows:
            lines.append(heading)
            lines.extend(f"{n:<{name_width}}  {v:>{value_width}}  {u}".rstrip() for n, v, u in rows)
    return "\n".join(lines)


def write_plot(log: RunLog, path: Path, title: str) -> None:
    """Writes a PNG of the mean episode return and the throughput over env steps.

    Args:
        log: The run's calls.
        path: The PNG file.
        title: The figure's title.

    Raises:
        ImportError: If matplotlib is not installed (naming the ``plot`` extra).
    """
    matplotlib = require_extra("matplotlib", extra="plot", purpose="the run's plot")

    # No display needed (and none may exist): render into the file only.
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [h[0] for h in log.history]
    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(8, 6))
    try:
        top.plot(steps, [h[2] for h in log.history], marker=".")
        top.set_ylabel("episode return\n(mean of the call's episodes)")
        top.set_title(textwrap.fill(title, 80), fontsize=10)
        top.grid(True, alpha=0.3)
        bottom.plot(steps, [h[3] for h in log.history], marker=".")
        bottom.set_ylabel("env steps/s (per sample call)")
        bottom.set_xlabel("env steps")
        bottom.grid(True, alpha=0.3)
        fig.tight_layout()
        fig.savefig(path, format="png", dpi=100)
    finally:
        plt.close(fig)
