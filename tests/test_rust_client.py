"""The Rust client of ``examples/rust_client`` against fastrollout's policy server.

A simulator outside Python connects over TCP with the wire protocol of
``docs/protocol.md``. The module builds the crate once (``cargo build --release``, about
10 s from scratch on 2 cores; skipped with the reason where cargo is missing), then:

- runs its CartPole binary against a ``PolicyServerEnv`` that a ``SingleAgentEnvRunner``
  samples, and checks that the episodes the runner returns are those the client reports
  (ids, lengths, returns, actions, observations);
- checks the handshake's token from the Rust side;
- runs the load generator against the ``BareServer`` and reads its JSON;
- runs the crate's own unit tests (frame and array codec, CartPole against gymnasium).

Everything talks to 127.0.0.1 and every subprocess and wait has a timeout.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

import fastrollout as fr

ROOT = Path(__file__).resolve().parent.parent
CRATE = ROOT / "examples" / "rust_client"
TARGET = ROOT / "target" / "rust_client"
BIN = TARGET / "release"
# Long enough for a cold build (dependencies fetched and compiled) on a shared 2-core box.
BUILD_TIMEOUT_S = 240
# How long a test waits for a client or for the runner's sample() call.
RUN_TIMEOUT_S = 60


def _cargo(*args: str) -> subprocess.CompletedProcess[str]:
    cargo = shutil.which("cargo")
    if cargo is None:
        pytest.skip("cargo is not on PATH: the Rust client cannot be built")
    manifest = ["--manifest-path", str(CRATE / "Cargo.toml"), "--target-dir", str(TARGET)]
    proc = subprocess.run(
        [cargo, *args, "--release", "--locked", *manifest],
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
    )
    assert proc.returncode == 0, f"cargo {args[0]} failed:\n{proc.stderr[-4000:]}"
    return proc


@pytest.fixture(scope="module")
def rust_bin() -> Path:
    """The folder of the built binaries (``cartpole_client``, ``loadgen``)."""
    _cargo("build")
    return BIN


def _command(rust_bin: Path, name: str, port: int, *args: str) -> list[str]:
    return [str(rust_bin / name), "--address", f"127.0.0.1:{port}", *args]


def _spaces() -> tuple[gym.Space[Any], gym.Space[Any]]:
    env = gym.make("CartPole-v1")
    try:
        return env.action_space, env.observation_space
    finally:
        env.close()


@pytest.fixture
def served_runner(request: pytest.FixtureRequest) -> Iterator[fr.SingleAgentEnvRunner]:
    """A runner whose env is a ``PolicyServerEnv`` for CartPole's spaces."""
    from fastrollout.external import PolicyServerEnv

    token = getattr(request, "param", None)
    act_space, obs_space = _spaces()
    config = fr.RunnerConfig().environment(
        lambda ctx: PolicyServerEnv(act_space, obs_space, address="127.0.0.1", token=token)
    )
    runner = fr.SingleAgentEnvRunner(config=config)
    try:
        yield runner
    finally:
        runner.stop()


def _sample_in_thread(runner: fr.SingleAgentEnvRunner, num_episodes: int) -> Any:
    """``runner.sample(num_episodes=...)`` with a timeout: a failing client cannot hang it."""
    result: dict[str, Any] = {}

    def target() -> None:
        try:
            result["episodes"] = runner.sample(num_episodes=num_episodes)
        except BaseException as e:
            result["error"] = e

    thread = threading.Thread(target=target, daemon=True, name="sample")
    thread.start()
    return thread, result


def _run_cartpole(
    rust_bin: Path, runner: fr.SingleAgentEnvRunner, args: list[str], num_episodes: int
) -> tuple[list[dict[str, Any]], list[Any]]:
    port = runner.env.port
    client = subprocess.Popen(
        _command(
            rust_bin,
            "cartpole_client",
            port,
            "--timeout-s",
            "30",
            "--episodes",
            str(num_episodes),
            *args,
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    thread, result = _sample_in_thread(runner, num_episodes)
    try:
        out, err = client.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        if client.poll() is None:
            client.kill()
            client.communicate()
    assert client.returncode == 0, f"cartpole_client exited {client.returncode}: {err}"
    thread.join(timeout=RUN_TIMEOUT_S)
    assert not thread.is_alive(), "runner.sample() did not return after the client finished"
    if "error" in result:
        raise result["error"]
    reported = [json.loads(line) for line in out.splitlines()]
    assert len(reported) == num_episodes
    return reported, result["episodes"]


@pytest.mark.parametrize(
    ("served_runner", "args"),
    [
        pytest.param(None, [], id="server-ids"),
        pytest.param(None, ["--episode-prefix", "rust"], id="client-ids"),
        pytest.param("s3cret", ["--token", "s3cret"], id="token"),
    ],
    indirect=["served_runner"],
)
def test_runner_episodes_are_the_rust_clients(
    rust_bin: Path, served_runner: fr.SingleAgentEnvRunner, args: list[str]
) -> None:
    # 40 steps at most: the policy's random actions end some episodes by the pole's fall,
    # the cap ends the others (sent as end_episode, so the server records them terminated).
    reported, episodes = _run_cartpole(
        rust_bin, served_runner, ["--max-steps", "40", "--seed", "3", *args], num_episodes=4
    )
    by_id = {e.id_: e for e in episodes}
    assert sorted(by_id) == sorted(r["episode_id"] for r in reported)
    if "--episode-prefix" in args:
        assert sorted(by_id) == [f"rust-{i}" for i in range(4)]
    for r in reported:
        e = by_id[r["episode_id"]]
        assert len(e) == r["length"] == len(r["actions"])
        assert e.get_return() == r["return"] == r["length"]
        np.testing.assert_array_equal(e.get_actions(), np.array(r["actions"]))
        obs = e.get_observations()
        assert obs.dtype == np.float32
        np.testing.assert_array_equal(obs, np.array(r["observations"], dtype=np.float32))
        assert e.is_terminated and not e.is_truncated
        # The client's own report: the pole fell, or the episode ran to --max-steps.
        assert r["terminated"] != r["truncated"]
        assert r["terminated"] or r["length"] == 40


@pytest.mark.parametrize("served_runner", ["s3cret"], indirect=True)
def test_a_wrong_token_is_refused_with_its_code(
    rust_bin: Path, served_runner: fr.SingleAgentEnvRunner
) -> None:
    # The server answers once the runner started the env's thread (its first sample()).
    thread, result = _sample_in_thread(served_runner, num_episodes=1)
    port = served_runner.env.port
    for args in (["--token", "wrong"], []):
        proc = subprocess.run(
            _command(rust_bin, "cartpole_client", port, "--timeout-s", "20", *args),
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
        )
        assert proc.returncode == 1
        assert "server error [unauthorized]" in proc.stderr
        assert proc.stdout == ""
    # The server goes on serving: a client with the token runs the episode sample() waits for.
    proc = subprocess.run(
        _command(rust_bin, "cartpole_client", port, "--episodes", "1", "--token", "s3cret"),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stderr
    thread.join(timeout=RUN_TIMEOUT_S)
    assert not thread.is_alive()
    assert [e.id_ for e in result["episodes"]] == [json.loads(proc.stdout)["episode_id"]]


def test_cartpole_client_reports_a_refused_connection(rust_bin: Path) -> None:
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.run(
        _command(rust_bin, "cartpole_client", port, "--timeout-s", "5"),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    assert proc.returncode == 1
    assert "cartpole_client:" in proc.stderr


LOADGEN_ARGS = ["--clients", "4", "--actions-per-client", "300", "--episode-len", "50"]
LOADGEN_ARGS += ["--warmup-s", "0.2", "--timeout-s", "20"]


def test_loadgen_against_the_bare_server(rust_bin: Path) -> None:
    from fastrollout.external import BareServer

    act_space, _ = _spaces()
    obs_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    server = BareServer(act_space, obs_space, address="127.0.0.1", port=0)
    server.start()
    try:
        proc = subprocess.run(
            _command(rust_bin, "loadgen", server.port, *LOADGEN_ARGS),
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
        )
    finally:
        server.close()
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["clients"] == 4
    assert out["total_actions"] == 4 * 300
    assert out["seconds"] > 0
    assert out["actions_per_s"] == pytest.approx(out["total_actions"] / out["seconds"], rel=0.01)
    assert 0 < out["p50_us"] <= out["p90_us"] <= out["p99_us"] <= out["max_us"]
    # 300 counted actions per client at 50 per episode: at least 6 episodes each.
    assert out["episodes"] >= 4 * 6
    assert (out["obs_dim"], out["episode_len"]) == (4, 50)


def test_the_crates_unit_tests_pass() -> None:
    proc = _cargo("test", "--quiet")
    assert "test result: ok" in proc.stdout
