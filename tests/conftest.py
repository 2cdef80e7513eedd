"""pytest configuration: hypothesis profiles and the run summary.

Profiles (pick one with ``HYPOTHESIS_PROFILE=...``):
- ``ci`` (default): deterministic (derandomized, no example database), no deadline.
- ``dev``: random and longer, for hunting bugs locally.
"""

from __future__ import annotations

import os
import sys

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    derandomize=True,
    database=None,
    deadline=None,
    max_examples=60,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "dev",
    deadline=None,
    max_examples=500,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_configure(config):
    # gymnasium's Box.contains warns when RLlib hands it a python scalar (RLlib checks
    # set_rewards(...) data of numpy'ized episodes against a float32 Box). With warnings
    # as errors, the reference itself would fail there.
    config.addinivalue_line(
        "filterwarnings", "ignore:.*Casting input x to numpy array:UserWarning:gymnasium.*"
    )


def pytest_report_header(config):
    subject = os.environ.get("FR_DIFF_SUBJECT", "fastrollout")
    return f"episode test subject: {subject} (FR_DIFF_SUBJECT=rllib tests RLlib itself)"


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    # The counters live in the tests' helper module; this file does not import it, so a
    # broken subject fails only the tests that use it, not the whole session.
    helpers = sys.modules.get("_helpers")
    report = getattr(helpers, "REPORT", {})
    if report:
        terminalreporter.section("episode test counters")
        for name, n in sorted(report.items()):
            terminalreporter.write_line(f"{name}: {n}")


@pytest.fixture(scope="session")
def ray_local():
    """One local Ray instance for the whole test session (skips without ray).

    ``address="local"`` starts a new instance: without it Ray joins whatever cluster an
    earlier run left in its temp files, and hangs if that one is gone.
    """
    ray = pytest.importorskip("ray")
    if not ray.is_initialized():
        ray.init(
            address="local",
            num_cpus=2,
            include_dashboard=False,
            log_to_driver=False,
            configure_logging=False,
        )
    yield ray
    ray.shutdown()
