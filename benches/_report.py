"""Formatting shared by the side-by-side bench scripts (run as ``python benches/X.py``)."""

from __future__ import annotations

import os


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
