"""Formatting shared by the side-by-side bench scripts (run as ``python benches/X.py``)."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess


def load_average() -> str:
    """The 1/5/15-minute load averages, or ``"n/a"`` where the OS has none."""
    try:
        return ", ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def fmt(x: float | None, ratio: bool = False) -> str:
    """A rate with thousands separators, a ratio as ``1.23x``, or ``-`` for None."""
    if x is None:
        return "-"
    return f"{x:.2f}x" if ratio else f"{x:,.0f}"


def _commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
        )
    except OSError:
        return "unknown"
    return out.stdout.strip() or "unknown"


def _version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def machine() -> dict[str, str]:
    """What the numbers were measured on: CPU, versions, torch threads, commit, load."""
    import gymnasium as gym
    import numpy as np
    import torch

    from side_by_side import cpu_model

    return {
        "cpu": cpu_model(),
        "cores": str(os.cpu_count()),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "gymnasium": gym.__version__,
        "ray": _version("ray"),
        "fastrollout": _version("fastrollout"),
        "torch threads": str(torch.get_num_threads()),
        "git": _commit(),
        "load average (1/5/15 min) at start": load_average(),
    }
