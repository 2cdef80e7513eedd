"""The wheel that ``make wheel`` builds installs into a fresh venv, imports and samples.

``make wheel`` builds one abi3 wheel (CPython 3.10 and later) for manylinux2014 (glibc
2.17 and later), linked with zig, into ``target/wheels/``. The test runs it itself, so it
checks the wheel of the current source: ``make test`` builds the wheel before pytest runs
(``test-python`` depends on ``wheel``), which leaves cargo nothing to compile here and the
whole test at about 10 s; after a change to the Rust code it compiles once (about a minute
on 2 cores).

The wheel goes into a new venv with ``pip install --no-deps``. Its dependencies (numpy,
gymnasium, torch: several GB) are not downloaded again: the new venv sees this venv's
site-packages through a ``.pth`` line, which Python appends after the venv's own
site-packages and whose own ``.pth`` files it does not read, so the editable install of the
source tree stays out and ``fastrollout`` can only come from the wheel (the test checks
that it does).
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import site
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
WHEELS = ROOT / "target" / "wheels"

# The platform tags of manylinux2014 (PEP 599) and its PEP 600 alias.
MANYLINUX2014 = {"manylinux2014_x86_64", "manylinux_2_17_x86_64"}

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or sysconfig.get_platform() != "linux-x86_64",
    reason="make wheel builds the Linux x86-64 wheel",
)


@pytest.fixture(scope="module")
def wheel() -> Path:
    """The wheel of the current source, built by ``make wheel``."""
    proc = subprocess.run(
        ["make", "-s", "wheel"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, f"make wheel failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    wheels = sorted(WHEELS.glob("fastrollout-*.whl"))
    # make wheel removes older wheels first, so one is there.
    assert len(wheels) == 1, wheels
    return wheels[0]


def _tags(wheel: Path) -> set[str]:
    """The WHEEL file's ``Tag:`` lines (python-abi-platform)."""
    with zipfile.ZipFile(wheel) as zf:
        info = next(n for n in zf.namelist() if n.endswith(".dist-info/WHEEL"))
        text = zf.read(info).decode()
    return {line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Tag:")}


def test_wheel_is_abi3_manylinux2014(wheel):
    # One wheel for every CPython from 3.10 on: abi3 (the stable ABI), tagged cp310.
    assert _tags(wheel) == {f"cp310-abi3-{platform}" for platform in MANYLINUX2014}
    name_tags = wheel.name.removesuffix(".whl").split("-")[2:]
    assert name_tags[:2] == ["cp310", "abi3"]
    assert set(name_tags[2].split(".")) == MANYLINUX2014


def test_wheel_contents(wheel):
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        native = [n for n in names if n.endswith(".so")]
        # The one extension module, for the stable ABI; none built for one Python version
        # (a develop build left in the source tree must not ship).
        assert native == ["fastrollout/_core.abi3.so"]
        core = zf.read(native[0])
    assert {"fastrollout/_core.pyi", "fastrollout/py.typed"} <= names
    # Every module of the tracked Python sources is in the wheel.
    tracked = subprocess.run(
        ["git", "ls-files", "python/fastrollout"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    sources = {p.removeprefix("python/") for p in tracked if p.endswith((".py", ".pyi"))}
    assert sources and sources <= names
    # manylinux2014 is glibc 2.17: no symbol of a newer glibc version is referenced.
    versions = {tuple(map(int, v)) for v in re.findall(rb"GLIBC_(\d+)\.(\d+)(?:\.\d+)?\x00", core)}
    assert versions and max(versions) <= (2, 17), sorted(versions)


def test_wheel_installs_and_imports_in_a_fresh_venv(wheel, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # numpy, gymnasium and torch from this venv, after the new venv's own packages.
    Path(purelib, "_deps_from_test_venv.pth").write_text(
        "\n".join(site.getsitepackages()) + "\n", encoding="utf-8"
    )
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", wheel],
        check=True,
    )
    smoke = (
        "import fastrollout, fastrollout._core as core\n"
        "print(fastrollout.__file__)\n"
        "print(core.__file__)\n"
        "config = (fastrollout.RunnerConfig().environment('CartPole-v1')\n"
        "          .env_runners(num_envs_per_env_runner=2).debugging(seed=0))\n"
        "episodes = fastrollout.SingleAgentEnvRunner(config=config).sample(num_timesteps=100)\n"
        "print(sum(len(e) for e in episodes))\n"
    )
    proc = subprocess.run(
        [python, "-c", smoke], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr[-5000:]
    package_file, core_file, steps = proc.stdout.split()
    assert Path(package_file).is_relative_to(venv)
    assert Path(core_file) == Path(package_file).parent / "_core.abi3.so"
    assert int(steps) >= 100


def _other_pythons() -> dict[str, str]:
    """Other CPython 3.10+ interpreters on this machine: ``{"3.x": executable}``.

    On PATH as ``python3.x``, or installed by pyenv (whose shims answer only for the
    selected version, so its installs are looked up too).
    """
    candidates = [shutil.which(f"python3.{minor}") for minor in range(10, 20)]
    pyenv = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    candidates += sorted(glob.glob(os.path.join(pyenv, "versions", "3.*", "bin", "python3.*")))
    found: dict[str, str] = {}
    current = f"{sys.version_info.major}.{sys.version_info.minor}"
    for exe in filter(None, candidates):
        if not re.fullmatch(r"python3\.\d+", os.path.basename(exe)):
            continue
        probe = subprocess.run(
            [
                exe,
                "-c",
                "import sys; print('%d.%d' % sys.version_info[:2], sys.implementation.name)",
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if probe.returncode != 0:
            continue
        version, implementation = probe.stdout.split()
        if implementation == "cpython" and version != current and int(version.split(".")[1]) >= 10:
            found.setdefault(version, exe)
    return found


def test_extension_loads_in_other_python_versions(wheel, tmp_path):
    # The one wheel is for every CPython from 3.10 on: its extension loads in the others
    # found here (numpy and the rest are not installed for them, so the extension alone,
    # outside its package, and a call that needs nothing else).
    pythons = _other_pythons()
    if not pythons:
        pytest.skip("no other CPython 3.10+ on this machine")
    with zipfile.ZipFile(wheel) as zf:
        zf.extract("fastrollout/_core.abi3.so", tmp_path)
    load = (
        "import importlib.util, sys\n"
        "spec = importlib.util.spec_from_file_location('fastrollout._core', sys.argv[1])\n"
        "core = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(core)\n"
        "store = core.MetricsStore()\n"
        "print(core.__version__, core.native_heap_bytes() >= 0)\n"
    )
    for version, exe in sorted(pythons.items()):
        proc = subprocess.run(
            [exe, "-c", load, tmp_path / "fastrollout" / "_core.abi3.so"],
            capture_output=True,
            text=True,
            check=False,
        )
        assert proc.returncode == 0, f"CPython {version} ({exe}):\n{proc.stderr[-3000:]}"
        assert proc.stdout.split() == ["0.1.0", "True"], (version, proc.stdout)
