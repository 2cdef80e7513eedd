"""The side-by-side benchmark's bookkeeping (``benches/side_by_side.py``): how the figures
of several processes are combined and shown. Nothing is timed here."""

from __future__ import annotations

import importlib.util
import pathlib
import sys

import pytest

_PATH = pathlib.Path(__file__).resolve().parents[1] / "benches" / "side_by_side.py"


@pytest.fixture(scope="module")
def sbs():
    name = "_side_by_side_under_test"
    spec = importlib.util.spec_from_file_location(name, _PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # Registered first: its dataclasses look their module up while they are made.
    sys.modules[name] = module
    spec.loader.exec_module(module)
    yield module
    del sys.modules[name]


def _row(name, bare, fr, rllib=None):
    r = {"name": name, "unit": "µs/env step", "bare": bare, "fastrollout": fr}
    r["fastrollout/bare"] = fr / bare
    if rllib is not None:
        r["rllib"] = rllib
        r["rllib/fastrollout"] = rllib / fr
    return r


def test_combine_takes_medians_and_the_ratio_range(sbs):
    runs = [
        [_row("a", 10.0, 11.0, 50.0), _row("b", 1.0, 1.5)],
        [_row("a", 12.0, 12.0, 60.0), _row("b", 1.0, 1.1)],
        [_row("a", 8.0, 12.0, 40.0), _row("b", 1.0, 1.2)],
    ]
    out = sbs.combine(runs)
    assert [r["name"] for r in out] == ["a", "b"]
    a, b = out
    assert a["processes"] == 3
    assert a["bare"] == 10.0 and a["fastrollout"] == 12.0 and a["rllib"] == 50.0
    # The ratio is the median of the processes' ratios, not the ratio of the medians.
    ratios = sorted([11 / 10, 12 / 12, 12 / 8])
    assert a["fastrollout/bare"] == pytest.approx(ratios[1])
    assert a["fastrollout/bare"] != pytest.approx(a["fastrollout"] / a["bare"])
    assert a["fastrollout/bare range"] == (pytest.approx(ratios[0]), pytest.approx(ratios[2]))
    assert "rllib" not in b and "rllib/fastrollout" not in b
    assert b["fastrollout/bare range"] == (pytest.approx(1.1), pytest.approx(1.5))


def test_combine_keeps_workloads_missing_from_some_processes(sbs):
    out = sbs.combine(
        [[_row("a", 1.0, 2.0)], [_row("b", 1.0, 3.0), _row("a", 1.0, 4.0, rllib=8.0)]]
    )
    assert [(r["name"], r["processes"]) for r in out] == [("a", 2), ("b", 1)]
    assert out[0]["fastrollout"] == 3.0
    # A contender only the second process ran still has its figure.
    assert out[0]["rllib"] == 8.0 and out[0]["rllib/fastrollout range"] == (2.0, 2.0)


def test_table_shows_the_range_only_where_there_is_one(sbs):
    one = [_row("a", 10.0, 11.0, 55.0)]
    assert "1.10x |" in sbs.table(one) and " to " not in sbs.table(one)
    many = sbs.combine([one, [_row("a", 10.0, 12.0, 60.0)]])
    line = sbs.table(many).splitlines()[-1]
    assert "1.15x (1.10 to 1.20)" in line


def test_children_get_the_arguments_without_processes_and_json(sbs):
    argv = ["--processes", "5", "--only", "image", "8 agents", "--json=x.json", "--quick"]
    assert sbs._without_options(argv, ("--processes", "--json")) == [
        "--only",
        "image",
        "8 agents",
        "--quick",
    ]
    assert sbs._without_options(["--json", "a", "--no-rllib"], ("--json",)) == ["--no-rllib"]
