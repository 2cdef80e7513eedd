"""The policy server and client (fastrollout.external): codec, handshake, faults, episodes.

Every network test runs on 127.0.0.1 with bounded waits. The end-to-end tests run
deterministic simulators as clients and compare every episode the runner returns with what
its simulator saw and sent, step by step.
"""

from __future__ import annotations

import ast
import contextlib
import logging
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

msgpack = pytest.importorskip("msgpack")

import fastrollout as fr  # noqa: E402
from fastrollout.env import ExternalEnv, ExternalMultiAgentEnv  # noqa: E402
from fastrollout.external import (  # noqa: E402
    BareServer,
    PolicyClient,
    PolicyServerEnv,
    PolicyServerMultiAgentEnv,
)
from fastrollout.external import protocol as p  # noqa: E402

OBS = gym.spaces.Box(-1000.0, 1000.0, (2,), np.float32)
ACT = gym.spaces.Discrete(3)
MA_OBS = gym.spaces.Dict({"a": OBS, "b": gym.spaces.Box(-1000.0, 1000.0, (3,), np.float32)})
MA_ACT = gym.spaces.Dict({"a": ACT, "b": gym.spaces.Discrete(2)})
TIMEOUT = 30.0  # the longest any one wait here may take


# -- codec ----------------------------------------------------------------------------------


def roundtrip(obj: Any) -> Any:
    return p.unpack(p.pack(obj))


@given(
    hnp.arrays(
        dtype=st.sampled_from(sorted(p.DTYPES)).map(np.dtype),
        shape=hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5),
    )
)
def test_arrays_of_every_dtype_and_shape_round_trip(array: np.ndarray) -> None:
    back = roundtrip(array)
    assert back.dtype == array.dtype and back.shape == array.shape
    assert back.tobytes() == array.tobytes()
    assert back.flags.writeable


def test_arrays_in_any_layout_and_byte_order_travel_as_c_order_little_endian() -> None:
    a = np.arange(12, dtype=">i4").reshape(3, 4).T  # big-endian, not C-contiguous
    ext = p.encode_array(a)
    name, shape, data = msgpack.unpackb(ext.data)
    assert (name, shape) == ("int32", [4, 3])
    assert data == np.ascontiguousarray(a, dtype="<i4").tobytes()
    np.testing.assert_array_equal(roundtrip(a), a)


def test_numpy_scalars_are_plain_numbers() -> None:
    assert roundtrip({"x": np.float32(1.5), "i": np.int64(3), "b": np.bool_(True)}) == {
        "x": 1.5,
        "i": 3,
        "b": True,
    }
    with pytest.raises(TypeError, match="object"):
        p.pack(np.array([object()]))
    with pytest.raises(TypeError, match="set"):
        p.pack({1, 2})


SPACES = [
    gym.spaces.Box(-1.0, 1.0, (3,), np.float32),
    gym.spaces.Box(-np.inf, np.inf, (2, 2), np.float64),
    gym.spaces.Box(np.array([0, -np.inf], np.float32), np.array([np.inf, 5], np.float32)),
    gym.spaces.Box(0, 255, (4, 4, 3), np.uint8),
    gym.spaces.Box(-5, 5, (), np.int64),
    gym.spaces.Discrete(5),
    gym.spaces.Discrete(3, start=-1),
    gym.spaces.MultiDiscrete([2, 3, 4]),
    gym.spaces.MultiDiscrete([[2, 3], [4, 5]], start=[[1, -1], [0, 2]]),
    gym.spaces.MultiBinary(4),
    gym.spaces.MultiBinary([2, 3]),
    gym.spaces.Dict({"pos": gym.spaces.Box(-1, 1, (2,)), "n": gym.spaces.Discrete(2)}),
    gym.spaces.Tuple((gym.spaces.Discrete(2), gym.spaces.MultiBinary(2))),
    gym.spaces.Dict(
        {
            "outer": gym.spaces.Tuple(
                (gym.spaces.Dict({"x": gym.spaces.Box(-1, 1, (1,))}), gym.spaces.Discrete(4))
            ),
            "m": gym.spaces.MultiDiscrete([3, 3]),
        }
    ),
]


def assert_same_value(a: Any, b: Any) -> None:
    if isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b)
        for k in a:
            assert_same_value(a[k], b[k])
    elif isinstance(a, tuple):
        assert isinstance(b, tuple) and len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_same_value(x, y)
    else:
        assert np.asarray(a).dtype == np.asarray(b).dtype
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("space", SPACES, ids=str)
def test_spaces_and_their_values_round_trip(space: gym.Space) -> None:
    back = p.space_from_wire(roundtrip(p.space_to_wire(space)))
    assert back == space
    assert type(back) is type(space)
    space.seed(0)
    for _ in range(5):
        value = space.sample()
        decoded = p.decode_value(space, roundtrip(p.encode_value(space, value)))
        assert space.contains(decoded)
        assert_same_value(value, decoded)


def test_plain_numbers_and_lists_become_the_space_dtype() -> None:
    box = gym.spaces.Box(-10, 10, (2, 2), np.float32)
    v = p.decode_value(box, roundtrip([[1, 2], [3.5, 4]]))
    assert v.dtype == np.float32 and v.tolist() == [[1, 2], [3.5, 4]]
    assert p.decode_value(gym.spaces.Discrete(3), roundtrip(2)) == 2
    md = p.decode_value(gym.spaces.MultiDiscrete([3, 3]), roundtrip([1, 2]))
    assert md.dtype == np.int64 and md.tolist() == [1, 2]
    t = p.decode_value(gym.spaces.Tuple((gym.spaces.Discrete(2), box)), [1, [[0, 0], [0, 0]]])
    assert isinstance(t, tuple) and t[1].dtype == np.float32
    # The client casts what it sends to the space's dtype.
    sent = p.encode_value(box, np.ones((2, 2), np.float64))
    assert sent.dtype == np.float32
    with pytest.raises(ValueError, match="does not fit dtype int64"):
        p.decode_value(gym.spaces.MultiDiscrete([3]), [0.5])
    with pytest.raises(ValueError, match="expected the keys"):
        p.decode_value(SPACES[11], {"pos": [0, 0]})
    with pytest.raises(ValueError, match="expected an int"):
        p.decode_value(gym.spaces.Discrete(3), "1")
    with pytest.raises(ValueError, match="not an array"):
        p.decode_value(box, [[1, 2], [3]])


def test_unpacking_is_safe_for_untrusted_input(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[dict[str, Any]] = []
    real = msgpack.unpackb

    def spy(data: bytes, **kwargs: Any) -> Any:
        seen.append(kwargs)
        return real(data, **kwargs)

    monkeypatch.setattr(msgpack, "unpackb", spy)
    p.unpack(p.pack({"a": np.zeros(2)}))
    assert len(seen) == 2  # the body and the array's payload
    for kwargs in seen:
        assert kwargs["raw"] is False and kwargs["strict_map_key"] is True
        assert callable(kwargs["ext_hook"])
    # Nothing in the package imports a serializer that runs code.
    unsafe = {"pickle", "cloudpickle", "dill", "marshal", "shelve", "ray"}
    for path in Path(p.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            assert not {n.split(".")[0] for n in names} & unsafe, (path, names)


@pytest.mark.parametrize(
    "body",
    [
        msgpack.packb(msgpack.ExtType(2, b"x")),
        msgpack.packb({"type": "x", "v": msgpack.ExtType(42, b"")}),
        msgpack.packb({1: 2}),  # non-str keys
        msgpack.packb(msgpack.ExtType(1, msgpack.packb(["object", [1], b"x" * 8]))),
        msgpack.packb(msgpack.ExtType(1, msgpack.packb(["float32", [3], b"x" * 8]))),
        msgpack.packb(msgpack.ExtType(1, msgpack.packb(["float32", [-1], b""]))),
        msgpack.packb(msgpack.ExtType(1, msgpack.packb(["bool", [1], b"\x02"]))),
        msgpack.packb(msgpack.ExtType(1, msgpack.packb(["int8", [1]]))),
        msgpack.packb(msgpack.ExtType(1, b"\xc1")),
        b"\xc1",
        b"\x92\x01",
        b"\x01\x02",
        b"\x91" * 100_000 + b"\x01",
    ],
)
def test_bad_bodies_raise_frame_error(body: bytes) -> None:
    with pytest.raises(p.FrameError):
        p.unpack(body)


def test_malformed_spaces_are_named() -> None:
    with pytest.raises(ValueError, match="unknown space type 'Graph'"):
        p.space_from_wire({"type": "Graph"})
    with pytest.raises(ValueError, match=r"space\['a'\]: a Box space needs the key 'low'"):
        p.space_from_wire(
            {"type": "Dict", "spaces": {"a": {"type": "Box", "dtype": "float32", "shape": [1]}}}
        )
    with pytest.raises(TypeError, match="Text"):
        p.space_to_wire(gym.spaces.Text(5))


def test_import_fastrollout_needs_no_msgpack() -> None:
    script = """
import sys
import fastrollout
import fastrollout.external as fx
assert "msgpack" not in sys.modules, "imported msgpack"
sys.modules["msgpack"] = None  # as if it were not installed
import gymnasium as gym
try:
    fx.BareServer(gym.spaces.Discrete(2), gym.spaces.Discrete(2))
except ImportError as err:
    assert "pip install 'fastrollout[server]'" in str(err), err
else:
    raise AssertionError("no ImportError")
try:
    fx.PolicyClient("127.0.0.1:1")
except ImportError as err:
    assert "fastrollout[server]" in str(err), err
else:
    raise AssertionError("no ImportError")
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr


# -- the bare server: handshake, bad clients ------------------------------------------------


def join_all(threads: list[threading.Thread]) -> None:
    """Joins the threads, all of them within TIMEOUT (daemon threads left hanging fail)."""
    deadline = time.monotonic() + TIMEOUT
    for th in threads:
        th.join(max(0.0, deadline - time.monotonic()))
    assert not any(th.is_alive() for th in threads), "clients still waiting after the timeout"


def raw(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
    s.settimeout(TIMEOUT)
    return s


def send(s: socket.socket, obj: Any) -> None:
    s.sendall(p.encode_frame(obj))


def recv(s: socket.socket) -> Any:
    def exact(n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = s.recv(n - len(buf))
            if not chunk:
                raise EOFError
            buf += chunk
        return buf

    (n,) = p.HEADER.unpack(exact(4))
    return p.unpack(exact(n))


def hello(**over: Any) -> dict[str, Any]:
    return {"type": "hello", "protocol": 1, "inference_mode": "remote", "token": None, **over}


def assert_closed(s: socket.socket) -> None:
    with contextlib.suppress(ConnectionResetError):
        assert s.recv(1) == b""


@pytest.fixture
def bare():
    server = BareServer(ACT, OBS, token="s3cret", max_frame_bytes=4096).start()
    yield server
    server.close()


def test_welcome_names_the_spaces(bare: BareServer) -> None:
    s = raw(bare.port)
    send(s, hello(token="s3cret"))
    w = recv(s)
    assert w["type"] == "welcome" and w["protocol"] == 1 and w["multi_agent"] is False
    assert w["server"].startswith("fastrollout ")
    assert p.space_from_wire(w["observation_space"]) == OBS
    assert p.space_from_wire(w["action_space"]) == ACT
    assert w["max_frame_bytes"] == 4096
    send(s, {"type": "ping"})
    assert recv(s) == {"type": "pong"}
    s.close()


BAD_CLIENTS = {
    "version": ([hello(protocol=2, token="s3cret")], "protocol_version", "version 1"),
    "wrong_token": ([hello(token="nope")], "unauthorized", "token"),
    "missing_token": ([hello()], "unauthorized", "token"),
    "before_hello": ([{"type": "ping"}], "unknown_message", "expected 'hello' first"),
    "unknown_type": (
        [hello(token="s3cret"), {"type": "teleport"}],
        "unknown_message",
        "'teleport'",
    ),
    "missing_key": (
        [hello(token="s3cret"), {"type": "get_action", "episode_id": "e"}],
        "bad_frame",
        "'observation'",
    ),
    "wrong_key_type": (
        [hello(token="s3cret"), {"type": "get_action", "episode_id": 5, "observation": 1}],
        "bad_frame",
        "episode_id",
    ),
    "not_a_map": ([[1, 2, 3]], "bad_frame", "map"),
    "malformed": ([b"\xc1\xc1"], "bad_frame", "msgpack"),
    "unknown_ext": ([b"\xd4\x07\x00"], "bad_frame", "extension type 7"),
    "oversize": ([4097], "frame_too_large", "4097 bytes"),
}


@pytest.mark.parametrize("case", list(BAD_CLIENTS))
def test_a_bad_client_is_closed_and_the_others_go_on(
    bare: BareServer, case: str, caplog: pytest.LogCaptureFixture
) -> None:
    frames, code, words = BAD_CLIENTS[case]
    good = PolicyClient(("127.0.0.1", bare.port), token="s3cret", reconnect_s=2)
    eid = good.start_episode()
    bad = raw(bare.port)
    with caplog.at_level(logging.WARNING, logger="fastrollout.external.server"):
        for i, frame in enumerate(frames):
            if isinstance(frame, int):  # a length over the limit, and a little body
                bad.sendall(p.HEADER.pack(frame) + b"\0" * 100)
            elif isinstance(frame, bytes):
                bad.sendall(p.HEADER.pack(len(frame)) + frame)
            else:
                send(bad, frame)
            if i < len(frames) - 1:
                assert recv(bad)["type"] == "welcome"
        reply = recv(bad)
        assert reply["type"] == "error" and reply["code"] == code, reply
        assert words in reply["message"]
        assert_closed(bad)
    assert any(code in r.getMessage() for r in caplog.records), caplog.text
    # The other client was not disturbed.
    assert good.get_action(eid, [0.0, 0.0]) in range(3)
    good.end_episode(eid, [0.0, 0.0])
    good.close()
    bad.close()


def test_client_with_a_wrong_token_or_version_fails_at_once(bare: BareServer) -> None:
    start = time.monotonic()
    with pytest.raises(ConnectionError, match="unauthorized"):
        PolicyClient(f"127.0.0.1:{bare.port}", token="wrong", reconnect_s=20)
    assert time.monotonic() - start < 5  # refused, not retried


def test_client_gives_up_after_reconnect_s() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    start = time.monotonic()
    with pytest.raises(ConnectionError, match=r"not back within 0\.5 s"):
        PolicyClient(f"http://127.0.0.1:{port}", reconnect_s=0.5)
    assert time.monotonic() - start < 5


def test_the_server_reads_pipelined_requests_in_order() -> None:
    with BareServer(ACT, OBS) as server:
        s = raw(server.port)
        frames = (
            [hello()] + [{"type": "ping"}] * 50 + [{"type": "start_episode", "episode_id": "x"}]
        )
        s.sendall(b"".join(p.encode_frame(f) for f in frames))
        replies = [recv(s) for _ in frames]
        assert replies[0]["type"] == "welcome"
        assert replies[1:-1] == [{"type": "pong"}] * 50
        assert replies[-1] == {"type": "episode_started", "episode_id": "x"}
        s.close()


def test_many_clients_on_the_bare_server() -> None:
    n, steps = 64, 20
    errors: list[BaseException] = []
    with BareServer(ACT, OBS) as server:

        def run(k: int) -> None:
            try:
                with PolicyClient(f"127.0.0.1:{server.port}", timeout_s=TIMEOUT) as c:
                    eid = c.start_episode()
                    for t in range(steps):
                        assert ACT.contains(c.get_action(eid, [k, t]))
                        c.log_returns(eid, 1.0)
                    c.end_episode(eid, [k, steps])
            except BaseException as err:
                errors.append(err)

        threads = [threading.Thread(target=run, args=(k,), daemon=True) for k in range(n)]
        for th in threads:
            th.start()
        join_all(threads)
    assert not errors, errors[:3]
    assert not any(th.is_alive() for th in threads)


def test_bare_server_multi_agent_actions() -> None:
    with (
        BareServer(MA_ACT, MA_OBS, multi_agent=True) as server,
        PolicyClient(f"127.0.0.1:{server.port}") as c,
    ):
        assert c.multi_agent and c.observation_space == MA_OBS
        eid = c.start_episode()
        action = c.get_action(eid, {"b": [1, 2, 3]})
        assert list(action) == ["b"] and MA_ACT["b"].contains(action["b"])
        with pytest.raises(ValueError, match="unknown agent 'c'"):
            c.get_action(eid, {"c": [1, 2]})  # (checked by the client against the welcome)


def test_policy_server_env_classes_are_chosen_by_multi_agent() -> None:
    env = PolicyServerEnv(MA_ACT, MA_OBS, multi_agent=True)
    assert type(env) is PolicyServerMultiAgentEnv and env.multi_agent
    env.close()
    with pytest.raises(ValueError, match="PolicyServerMultiAgentEnv is multi-agent"):
        PolicyServerMultiAgentEnv(MA_ACT, MA_OBS, multi_agent=False)

    class Sub(PolicyServerEnv):
        pass

    # A subclass is not switched to multi-agent: the flag that disagrees is refused.
    with pytest.raises(ValueError, match=r"Sub is single-agent \(use PolicyServerMultiAgentEnv\)"):
        Sub(ACT, OBS, multi_agent=True)


# -- the env: a runner samples the clients --------------------------------------------------


def sa_runner(**server: Any) -> fr.SingleAgentEnvRunner:
    config = (
        fr.RunnerConfig()
        .environment(lambda ctx: PolicyServerEnv(ACT, OBS, **server))
        .env_runners(num_envs_per_env_runner=1)
        .rl_module(model_config={"fcnet_hiddens": [16]})
        .debugging(seed=0)
    )
    return fr.SingleAgentEnvRunner(config=config)


def ma_runner(**server: Any) -> fr.MultiAgentEnvRunner:
    config = (
        fr.RunnerConfig()
        .environment(lambda ctx: PolicyServerEnv(MA_ACT, MA_OBS, multi_agent=True, **server))
        .multi_agent(policies=["pa", "pb"], policy_mapping_fn=lambda aid, ep, **kw: f"p{aid}")
        .rl_module(model_config={"fcnet_hiddens": [16]})
        .debugging(seed=0)
    )
    return fr.MultiAgentEnvRunner(config=config)


def sa_obs(k: int, e: int, t: int) -> np.ndarray:
    return np.array([k, 10 * e + t], np.float32)


def ma_obs(k: int, e: int, t: int) -> dict[str, np.ndarray]:
    obs = {"a": np.array([k, 10 * e + t], np.float32)}
    if t % 2 == 0:  # b observes (and acts) every other step
        obs["b"] = np.array([k, e, t], np.float32)
    return obs


def play(client: PolicyClient, k: int, e: int, steps: int, *, multi_agent: bool) -> dict:
    """One episode of a deterministic simulator; what it sent and got."""
    make = ma_obs if multi_agent else sa_obs
    eid = client.start_episode()
    rec: dict[str, Any] = {"id": eid, "obs": [], "actions": [], "rewards": []}
    for t in range(steps):
        obs = make(k, e, t)
        action = client.get_action(eid, obs)
        if multi_agent:
            reward = {aid: float(k + t + int(a)) for aid, a in action.items()}
        else:
            reward = float(k + t + int(action))
        client.log_returns(eid, reward)
        rec["obs"].append(obs)
        rec["actions"].append(action)
        rec["rewards"].append(reward)
    last = make(k, e, steps) if not multi_agent else {"a": make(k, e, steps)["a"]}
    rec["obs"].append(last)
    client.end_episode(eid, last)
    return rec


def check_sa(episode: Any, rec: dict, *, local: bool) -> None:
    np.testing.assert_array_equal(np.asarray(episode.get_observations()), np.stack(rec["obs"]))
    assert [int(a) for a in episode.get_actions()] == [int(a) for a in rec["actions"]]
    assert list(episode.get_rewards()) == rec["rewards"]
    assert episode.is_terminated
    if local:  # the client's own outputs were recorded
        logits = np.asarray(episode.get_extra_model_outputs("action_dist_inputs"))
        logp = np.asarray(episode.get_extra_model_outputs("action_logp"))
        acts = np.asarray(episode.get_actions())
        log_softmax = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
        np.testing.assert_allclose(logp, log_softmax[np.arange(len(acts)), acts], atol=1e-5)


def check_ma(episode: Any, rec: dict) -> None:
    for aid in ("a", "b"):
        part = episode.agent_episodes[aid]
        obs = [o[aid] for o in rec["obs"] if aid in o]
        if aid == "b":  # (the last observation has no b: its final one is its last again)
            obs.append(obs[-1])
        acts = [int(a[aid]) for a in rec["actions"] if aid in a]
        rewards = [r[aid] for r in rec["rewards"] if aid in r]
        np.testing.assert_array_equal(np.asarray(part.get_observations()), np.stack(obs))
        assert [int(a) for a in part.get_actions()] == acts
        assert list(part.get_rewards()) == rewards
        assert part.module_id == f"p{aid}" and part.is_terminated


class Sampler:
    """Samples ``n`` episodes on a thread (``sample(num_episodes=n)``)."""

    def __init__(self, runner: Any, n: int) -> None:
        self.runner = runner
        self.episodes: list[Any] = []
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(n,), daemon=True)
        self.thread.start()

    def _run(self, n: int) -> None:
        try:
            self.episodes = self.runner.sample(num_episodes=n)
        except BaseException as err:
            self.error = err

    def join(self) -> dict[str, Any]:
        self.thread.join(TIMEOUT)
        assert not self.thread.is_alive(), "the runner did not finish sampling"
        assert self.error is None, self.error
        return {e.id_: e for e in self.episodes}


def run_clients(env: Any, modes: list[str], episodes: int, multi_agent: bool) -> list[tuple]:
    """Runs one client per mode at once; ``(mode, record)`` per episode."""
    out: list[tuple] = []
    errors: list[BaseException] = []
    connected: list[int] = []
    # All clients are connected at once before any episode starts.
    barrier = threading.Barrier(
        len(modes), action=lambda: connected.append(len(env._server._conns))
    )

    def client(k: int, mode: str) -> None:
        try:
            fn = (lambda aid: f"p{aid}") if multi_agent else None
            with PolicyClient(
                f"127.0.0.1:{env.port}", mode, 0.2, timeout_s=TIMEOUT, policy_mapping_fn=fn
            ) as c:
                barrier.wait(TIMEOUT)
                for e in range(episodes):
                    steps = 2 + (k + e) % 4
                    out.append((mode, play(c, k, e, steps, multi_agent=multi_agent)))
        except BaseException as err:
            errors.append(err)

    threads = [
        threading.Thread(target=client, args=(k, m), daemon=True) for k, m in enumerate(modes)
    ]
    for th in threads:
        th.start()
    join_all(threads)
    assert not errors, errors[:3]
    assert not any(th.is_alive() for th in threads)
    assert connected == [len(modes)]
    return out


def wait_for_weights(env: Any) -> None:
    deadline = time.monotonic() + TIMEOUT
    while env.weights_snapshot() is None:
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_64_clients_remote_and_local_get_exact_episodes() -> None:
    runner = sa_runner()
    env = runner.env
    assert isinstance(env, PolicyServerEnv) and isinstance(env, ExternalEnv)
    modes = ["remote", "local"] * 32
    sampler = Sampler(runner, 2 * len(modes))
    wait_for_weights(env)
    records = run_clients(env, modes, 2, multi_agent=False)
    got = sampler.join()
    assert sorted(got) == sorted(r["id"] for _, r in records)
    for mode, rec in records:
        check_sa(got[rec["id"]], rec, local=mode == "local")
    runner.stop()


def test_64_multi_agent_clients_remote_and_local_get_exact_episodes() -> None:
    runner = ma_runner()
    env = runner.env
    assert isinstance(env, PolicyServerMultiAgentEnv) and isinstance(env, ExternalMultiAgentEnv)
    modes = ["remote", "local"] * 32
    sampler = Sampler(runner, len(modes))
    wait_for_weights(env)
    records = run_clients(env, modes, 1, multi_agent=True)
    got = sampler.join()
    assert sorted(got) == sorted(r["id"] for _, r in records)
    for _, rec in records:
        check_ma(got[rec["id"]], rec)
    runner.stop()


@pytest.mark.parametrize("mode", ["remote", "local"])
def test_a_client_that_disconnects_mid_episode_is_truncated(mode: str) -> None:
    runner = sa_runner()
    sampler = Sampler(runner, 1)
    wait_for_weights(runner.env)
    client = PolicyClient(f"127.0.0.1:{runner.env.port}", mode, None, timeout_s=TIMEOUT)
    eid = client.start_episode()
    sent = []
    for t in range(3):
        sent.append(sa_obs(0, 0, t))
        client.get_action(eid, sent[-1])
        client.log_returns(eid, 1.0)
    if mode == "local":
        client.update_policy_weights()  # (sends the recorded steps)
    client._drop()  # the connection is lost (no end_episode)
    got = sampler.join()
    episode = got[eid]
    assert episode.is_truncated and not episode.is_terminated
    np.testing.assert_array_equal(
        np.asarray(episode.get_observations()), np.stack([*sent, sent[-1]])
    )
    client.close()
    runner.stop()


def test_multi_agent_client_that_disconnects_is_truncated() -> None:
    runner = ma_runner()
    sampler = Sampler(runner, 1)
    client = PolicyClient(f"127.0.0.1:{runner.env.port}", timeout_s=TIMEOUT)
    eid = client.start_episode()
    for t in range(3):
        action = client.get_action(eid, ma_obs(1, 0, t))
        client.log_returns(eid, dict.fromkeys(action, 1.0))
    client._drop()
    episode = sampler.join()[eid]
    assert episode.is_truncated
    assert len(episode.agent_episodes["a"]) == 3
    client.close()
    runner.stop()


def test_an_observation_outside_the_space_is_refused_and_the_connection_stays() -> None:
    runner = sa_runner()
    sampler = Sampler(runner, 1)
    with PolicyClient(f"127.0.0.1:{runner.env.port}", timeout_s=TIMEOUT) as client:
        eid = client.start_episode()
        with pytest.raises(ValueError, match="observation outside the observation space"):
            client.get_action(eid, [5000.0, 0.0])
        with pytest.raises(ValueError, match="Episode nope not found"):
            client.get_action("nope", [0.0, 0.0])
        with pytest.raises(ValueError, match="already started"):
            client.start_episode(eid)
        sock = client._sock
        client.get_action(eid, [1.0, 2.0])
        client.end_episode(eid, [1.0, 3.0])
        assert client._sock is sock  # the same connection throughout
        episode = sampler.join()[eid]
        assert len(episode) == 1
    runner.stop()


def test_multi_agent_observation_outside_the_space_is_refused() -> None:
    runner = ma_runner()
    sampler = Sampler(runner, 1)
    with PolicyClient(f"127.0.0.1:{runner.env.port}", timeout_s=TIMEOUT) as client:
        eid = client.start_episode()
        with pytest.raises(ValueError, match=r"agent 'b'.*outside its space"):
            client.get_action(eid, {"a": [0, 0], "b": [0, 0, 9999]})
        client.get_action(eid, {"a": [0, 0], "b": [0, 0, 0]})
        client.log_returns(eid, {"a": 1.0, "b": 2.0})
        client.end_episode(eid, {"a": [0, 1]})
        sampler.join()
    runner.stop()


def test_local_mode_checks_values_in_the_client() -> None:
    with (
        BareServer(ACT, OBS) as server,
        PolicyClient(f"127.0.0.1:{server.port}", "local", None) as c,
    ):
        eid = c.start_episode()
        with pytest.raises(ValueError, match="observation outside"):
            c.get_action(eid, [5000.0, 0.0])
        with pytest.raises(ValueError, match="action outside"):
            c.log_action(eid, [0.0, 0.0], 7)
        with pytest.raises(ValueError, match="not found"):
            c.end_episode("nope", [0.0, 0.0])


class Restartable:
    """A runner on a fixed port, sampling on a thread until stopped (then a new one)."""

    def __init__(self, make: Any, port: int = 0) -> None:
        self.runner = make(port=port)
        self.port = self.runner.env.port
        self.episodes: list[Any] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stopping.is_set():
            try:
                self.episodes += self.runner.sample(num_timesteps=1)
            except RuntimeError:  # (closed by stop())
                return

    def stop(self) -> None:
        self.stopping.set()
        self.runner.stop()
        self.thread.join(TIMEOUT)
        assert not self.thread.is_alive()


@pytest.mark.parametrize("multi_agent", [False, True], ids=["single", "multi"])
@pytest.mark.parametrize("mode", ["remote", "local"])
def test_a_restarted_server_is_reconnected_and_the_episode_goes_on(
    multi_agent: bool, mode: str
) -> None:
    make = ma_runner if multi_agent else sa_runner
    obs_of = ma_obs if multi_agent else sa_obs
    first = Restartable(make)
    wait_for_weights(first.runner.env)
    fn = (lambda aid: f"p{aid}") if multi_agent else None
    client = PolicyClient(
        f"127.0.0.1:{first.port}",
        mode,
        None,
        timeout_s=TIMEOUT,
        reconnect_s=TIMEOUT,
        policy_mapping_fn=fn,
    )
    eid = client.start_episode()

    def step(obs: Any) -> Any:
        action = client.get_action(eid, obs)
        client.log_returns(eid, dict.fromkeys(action, 1.0) if multi_agent else 1.0)
        return action

    for t in range(2):
        step(obs_of(0, 0, t))
    if mode == "local":
        client.update_policy_weights()  # (the first server got these steps)
    first.stop()  # the server goes away

    second: list[Restartable] = []

    def restart() -> None:
        time.sleep(0.3)  # the client is retrying meanwhile
        second.append(Restartable(make, port=first.port))

    th = threading.Thread(target=restart)
    th.start()
    later = [obs_of(0, 0, t) for t in range(2, 5)]
    sock = client._sock
    actions = [step(obs) for obs in later]  # (remote: the first one reconnects)
    last = obs_of(0, 0, 5) if not multi_agent else {"a": obs_of(0, 0, 5)["a"]}
    client.end_episode(eid, last)
    assert client._sock is not sock  # (a new connection)
    th.join(TIMEOUT)
    deadline = time.monotonic() + TIMEOUT
    while not any(e.id_ == eid and e.is_done for e in second[0].episodes):
        assert time.monotonic() < deadline, "the episode did not end on the new server"
        time.sleep(0.02)
    chunks = [e for e in second[0].episodes if e.id_ == eid]
    parts = [c.agent_episodes["a"] if multi_agent else c for c in chunks]
    # A chunk's first observation is the previous chunk's last.
    got = [o for i, c in enumerate(parts) for o in list(c.get_observations())[0 if i == 0 else 1 :]]
    acts = [int(a) for c in parts for a in c.get_actions()]
    if multi_agent:
        want = [o["a"] for o in later] + [last["a"]]
        assert acts == [int(a["a"]) for a in actions]
    else:
        want = [*later, last]
        assert acts == [int(a) for a in actions]
    np.testing.assert_array_equal(np.stack(got[: len(want)]), np.stack(want))
    assert chunks[-1].is_terminated
    client.close()
    second[0].stop()


def module_weights(module: Any) -> dict[str, np.ndarray]:
    return module.get_state(inference_only=True)


def test_local_clients_refresh_the_weights_every_update_interval() -> None:
    runner = sa_runner()
    env = runner.env
    sampler = Sampler(runner, 1)
    wait_for_weights(env)
    with PolicyClient(f"127.0.0.1:{env.port}", "local", 0.1, timeout_s=TIMEOUT) as client:
        mine = client._modules["default_policy"]
        for k, v in module_weights(runner.module).items():
            np.testing.assert_array_equal(module_weights(mine)[k], v)
        first = play(client, 0, 0, 2, multi_agent=False)
        check_sa(sampler.join()[first["id"]], first, local=True)
        new = {k: v + 1.0 for k, v in runner.module.get_state().items()}
        runner.set_weights({"default_policy": new}, weights_seq_no=1)
        sampler = Sampler(runner, 1)  # (publishes the new weights)
        deadline = time.monotonic() + TIMEOUT
        while env.weights_snapshot()[0] != 1:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        time.sleep(0.15)
        second = play(client, 0, 1, 2, multi_agent=False)  # (refreshes first)
        assert client._weights_seq_no == 1
        for k, v in module_weights(client._modules["default_policy"]).items():
            np.testing.assert_array_equal(v, new[k])
        check_sa(sampler.join()[second["id"]], second, local=True)
    runner.stop()


@pytest.mark.parametrize("mode", ["remote", "local"])
def test_untrained_episodes_are_served_but_not_returned(mode: str) -> None:
    runner = sa_runner()
    sampler = Sampler(runner, 1)
    with PolicyClient(f"127.0.0.1:{runner.env.port}", mode, None, timeout_s=TIMEOUT) as client:
        untrained = client.start_episode(training_enabled=False)
        for t in range(2):
            client.get_action(untrained, sa_obs(1, 0, t))
        client.end_episode(untrained, sa_obs(1, 0, 2))
        trained = play(client, 2, 0, 2, multi_agent=False)
        assert list(sampler.join()) == [trained["id"]]
    runner.stop()


def test_sustained_load_keeps_every_client_served() -> None:
    """Thousands of round trips from 32 clients while the runner samples in chunks.

    Answers reach the I/O thread through one wake-up per batch; a lost wake-up would
    leave clients waiting forever (seen under this load before the wake-up's order was
    fixed).
    """
    runner = sa_runner()
    env = runner.env
    stop = threading.Event()

    def sample() -> None:
        with contextlib.suppress(RuntimeError):  # (stop() closes the env)
            while not stop.is_set():
                runner.sample(num_timesteps=500)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    done: list[int] = []

    def client(k: int) -> None:
        with PolicyClient(f"127.0.0.1:{env.port}", timeout_s=TIMEOUT, reconnect_s=1) as c:
            for e in range(8):
                eid = c.start_episode()
                for t in range(20):
                    c.get_action(eid, sa_obs(k, e, t))
                    c.log_returns(eid, 1.0)
                c.end_episode(eid, sa_obs(k, e, 20))
        done.append(k)

    threads = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(32)]
    for th in threads:
        th.start()
    join_all(threads)
    stop.set()
    runner.stop()
    sampler.join(TIMEOUT)
    assert sorted(done) == list(range(32))


def test_local_mode_box_actions_are_recorded_as_the_simulator_got_them() -> None:
    box = gym.spaces.Box(np.array([0, 10], np.float32), np.array([1, 20], np.float32))
    config = (
        fr.RunnerConfig()
        .environment(lambda ctx: PolicyServerEnv(box, OBS))
        .rl_module(model_config={"fcnet_hiddens": [16]})
        .debugging(seed=0)
    )
    runner = fr.SingleAgentEnvRunner(config=config)
    sampler = Sampler(runner, 1)
    wait_for_weights(runner.env)
    with PolicyClient(f"127.0.0.1:{runner.env.port}", "local", None) as client:
        eid = client.start_episode()
        got = []
        for t in range(4):
            got.append(client.get_action(eid, sa_obs(0, 0, t)))
            assert box.contains(got[-1])
            client.log_returns(eid, 1.0)
        client.end_episode(eid, sa_obs(0, 0, 4))
    episode = sampler.join()[eid]
    np.testing.assert_array_equal(np.asarray(episode.get_actions()), np.stack(got))
    assert np.isfinite(episode.get_extra_model_outputs("action_logp")).all()
    runner.stop()


def test_an_answer_posted_while_the_wake_socket_drains_still_wakes_the_loop() -> None:
    """The runner's post() landing inside the I/O thread's drain leaves a wake-up pending.

    The poster runs right before the drain's first recv (where the GIL may switch): the
    next post must still find the wake socket readable, or the loop sleeps with answers
    queued and every client waits forever.
    """
    import select

    server = BareServer(gym.spaces.Discrete(2), gym.spaces.Box(-1, 1, (4,), np.float32))._server
    real = server._wake_r

    class PostAtFirstRecv:
        fired = False

        def recv(self, n: int) -> bytes:
            if not self.fired:
                self.fired = True
                server.post(None, 1, "A")
            return real.recv(n)

    try:
        server._wake_r = PostAtFirstRecv()
        server._drain_wake()
        server._wake_r = real
        server._posted.clear()
        server.post(None, 2, "B")
        assert select.select([real], [], [], 1.0)[0], "the second post did not wake the loop"
    finally:
        server._wake_r = real
        server._teardown()
