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


def _pong_row(name, times, refs):
    """A per-contender result as `measure` and `main` make it (ratios within a round are
    faked as the ratio of the times, which is all the bookkeeping needs)."""
    r = {"name": name, "unit": "µs/env step", "contenders": list(times), "references": refs}
    r.update(times)
    for ref in refs:
        for who in times:
            if who != ref and ref in times:
                r[f"{ref}/{who}"] = times[ref] / times[who]
    return r


def test_workload_ratios_pair_each_reference_with_every_other_contender(sbs):
    w = sbs.Workload("w", "µs/env step", 1, references=("a", "b"))
    w.contenders = {"a": None, "b": None, "c": None}
    assert w.ratios() == (("a", "b"), ("a", "c"), ("b", "a"), ("b", "c"))
    plain = sbs.Workload("p", "µs/env step", 1)
    assert plain.ratios() == sbs.RATIOS


def test_measure_leaves_out_unavailable_contenders_and_closes_the_others(sbs):
    closed = []

    def contender(name):
        def factory():
            def run():
                return 10

            run.close = lambda: closed.append(name)
            run.built = f"built {name}"
            return run

        return factory

    def unavailable():
        raise sbs.Unavailable("not installed here")

    out = sbs.measure(
        {"a": contender("a"), "gone": unavailable, "b": contender("b")},
        repeats=2,
        warmup=1,
        ratios=(("a", "b"), ("a", "gone")),
    )
    assert out["left out"] == {"gone": "not installed here"}
    assert sorted(closed) == ["a", "b"]
    assert out["built"] == {"a": "built a", "b": "built b"}
    assert "a/b" in out and "a/gone" not in out and "gone" not in out


def test_measure_closes_the_contenders_when_a_run_fails(sbs):
    closed = []

    def factory():
        def run():
            raise RuntimeError("boom")

        run.close = lambda: closed.append(True)
        return run

    with pytest.raises(RuntimeError, match="boom"):
        sbs.measure({"x": factory}, repeats=1, warmup=1)
    assert closed == [True]


def test_combine_keeps_the_contenders_and_reference_ratios_of_per_contender_rows(sbs):
    refs = ["R", "B"]
    runs = [
        [_pong_row("pong", {"R": 10.0, "B": 5.0, "x": 4.0}, refs)],
        [_pong_row("pong", {"R": 12.0, "B": 6.0, "x": 3.0}, refs)],
        [_pong_row("pong", {"R": 11.0, "B": 5.5, "x": 5.0}, refs)],
    ]
    (c,) = sbs.combine(runs)
    assert c["contenders"] == ["R", "B", "x"] and c["references"] == refs
    assert c["x"] == 4.0
    assert c["R/x"] == pytest.approx(10 / 4)
    assert c["R/x range"] == (pytest.approx(11 / 5), pytest.approx(4.0))
    assert c["B/x"] == pytest.approx(5.0 / 4.0)


def test_contender_table_has_a_line_per_contender_and_a_column_per_reference(sbs):
    r = _pong_row("pong, 8 sub-envs", {"R": 10.0, "B": 5.0, "x": 2.0}, ["R", "B"])
    del r["R/B"]  # a pair that did not run
    text = sbs.table([r])
    lines = text.splitlines()
    assert lines[0].startswith("| workload | contender |") and "R / this" in lines[0]
    assert len(lines) == 2 + 3
    x_line = next(line for line in lines if "| x |" in line)
    # R took 5x as long as x: x is 5x faster.
    assert "| 5.00x | 2.50x |" in x_line
    assert "500,000" in x_line  # env steps/s of 2 µs per step
    r_line = next(line for line in lines if "| R |" in line)
    assert "| ref |" in r_line
    b_line = next(line for line in lines if "| B |" in line)
    assert b_line.endswith("| - | ref |")
    # Without per-contender rows the main table alone, as before.
    assert "contender" not in sbs.table([_row("a", 1.0, 1.1)])


def test_table_shows_both_tables_when_both_kinds_ran(sbs):
    text = sbs.table([_row("a", 1.0, 1.1), _pong_row("pong", {"R": 2.0, "x": 1.0}, ["R"])])
    main, per_contender = text.split("\n\n")
    assert "| a |" in main and "pong" not in main
    assert "| pong | x |" in per_contender


def test_the_pong_rows_run_only_when_asked_for(sbs):
    pong = sbs.Workload("Pong-v5 64x64x4, 8 sub-envs", "µs/env step", 1, on_request=True)
    cartpole = sbs.Workload("CartPole-v1, 8 sub-env(s)", "µs/env step", 1)
    assert not sbs._selected(pong, None, False) and sbs._selected(cartpole, None, False)
    assert sbs._selected(pong, None, True) and sbs._selected(cartpole, None, True)
    assert sbs._selected(pong, ["pong"], False) and not sbs._selected(cartpole, ["pong"], False)
    assert sbs._selected(cartpole, ["cartpole-v1, 8"], False)


def test_contenders_option_keeps_the_named_contenders(sbs):
    cs = {"bare loop, EnvPool": 1, "fastrollout, EnvPool": 2, "fastrollout, sync": 3}
    assert list(sbs._chosen(cs, ["envpool"])) == ["bare loop, EnvPool", "fastrollout, EnvPool"]
    assert sbs._chosen(cs, None) is cs


def test_pong_rows_say_which_package_is_missing(sbs, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "ale_py" else real(name, *a)
    )
    rows = sbs.pong_workloads(200, (8, 16))
    assert [w.unavailable is not None and "ale-py" in w.unavailable for w in rows] == [True, True]
    assert all(w.on_request for w in rows)
    cpu_only = sbs.pong_workloads(200, (8,), device="cuda")
    assert "CPU" in cpu_only[0].unavailable


def test_pong_rows_have_every_contender_and_rllib_references(sbs):
    (w,) = sbs.pong_workloads(200, (8,))
    names = list(w.contenders)
    assert names[:4] == [sbs.BARE_SYNC, sbs.BARE_ASYNC, sbs.RLLIB_SYNC, sbs.RLLIB_ASYNC]
    assert "fastrollout, shared memory" in " ".join(names) and "batch 4" in names[6]
    assert any("EnvPool send/recv" in n for n in names)
    assert w.references == sbs.PONG_REFERENCES and w.units_per_run == 200
    (no_rllib,) = sbs.pong_workloads(200, (16,), with_rllib=False)
    assert sbs.RLLIB_SYNC not in no_rllib.contenders
    assert no_rllib.references == (sbs.BARE_SYNC, sbs.BARE_ASYNC)


def test_a_per_contender_row_without_references_stays_in_its_table(sbs):
    # `--contenders envpool`: none of the references ran.
    r = _pong_row("pong", {"x": 2.0, "y": 4.0}, [])
    text = sbs.table([r])
    assert text.splitlines()[0].startswith("| workload | contender |")
    assert len(text.splitlines()) == 4
    (c,) = sbs.combine([[r], [r]])
    assert c["references"] == [] and c["contenders"] == ["x", "y"] and c["y"] == 4.0
