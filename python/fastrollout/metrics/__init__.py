"""Metrics: RLlib 2.60's ``MetricsLogger`` with the statistics in the Rust core."""

from fastrollout._core import StatsSnapshot
from fastrollout.metrics.metrics_logger import MetricsLogger
from fastrollout.metrics.rllib_compat import to_rllib_results

__all__ = ["MetricsLogger", "StatsSnapshot", "to_rllib_results"]
