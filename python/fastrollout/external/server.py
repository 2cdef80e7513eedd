"""The policy server: simulators connect over TCP and are sampled like an ``ExternalEnv``.

One I/O thread serves every connection (``selectors``, non-blocking sockets): it reads
frames, decodes them, calls the env's non-blocking methods and writes the replies. A
``get_action`` is answered later, from the runner's thread, through a callback that
hands the action to the I/O thread (a deque and a socketpair that wakes its selector);
only the I/O thread writes to sockets. The wire protocol is docs/protocol.md.

- :class:`PolicyServerEnv` (``ExternalEnv``; ``multi_agent=True`` gives a
  :class:`PolicyServerMultiAgentEnv`, an ``ExternalMultiAgentEnv``): the env a runner
  samples; its ``run()`` (the env's thread, which the runner starts) serves.
- :class:`BareServer`: the same loop, codec and handshake, answering every request at
  once with a fixed action (benchmarks of the server itself).

Both differ only in their :class:`_Dispatch` (what a request does); :class:`_Serving`
is the one I/O loop.
"""

from __future__ import annotations

import collections
import contextlib
import hmac
import logging
import selectors
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import gymnasium as gym

from fastrollout.env.external_env import ExternalEnv, ExternalMultiAgentEnv
from fastrollout.external import protocol
from fastrollout.external.protocol import (
    DEFAULT_MAX_FRAME_BYTES,
    HEADER,
    PROTOCOL_VERSION,
    FrameError,
    ValueSpace,
)

__all__ = ["BareServer", "PolicyServerEnv", "PolicyServerMultiAgentEnv"]

logger = logging.getLogger(__name__)

# A connection closed for an error keeps reading (and dropping) what its client still
# sends for this long, so that the client reads the error frame before the close (a
# close with unread input would reset the connection and lose the frame).
_LINGER_S = 2.0
# Input of a connection is not read further while this much output waits for it (a
# client that sends requests without reading the replies).
_WRITE_HIGH = 4 << 20
_RECV_BYTES = 256 << 10
# Reads per readiness event (the selector reports the socket again if more is waiting:
# one fast sender does not hold the loop).
_RECVS_PER_EVENT = 8
_OK = {"type": "ok"}
# What a request handler returns when the reply comes later (get_action).
_DEFERRED = object()


class _Reject(Exception):
    """A request that closes its connection: an error frame with ``code``."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class _Conn:
    """One client connection (touched by the I/O thread only)."""

    __slots__ = (
        "busy",
        "closed",
        "closing",
        "episodes",
        "events",
        "greeted",
        "linger_until",
        "mode",
        "peer",
        "rbuf",
        "sock",
        "token",
        "wbuf",
    )

    def __init__(self, sock: socket.socket, peer: str) -> None:
        self.sock = sock
        self.peer = peer
        self.rbuf = bytearray()
        self.wbuf = bytearray()
        self.greeted = False
        self.mode = "remote"
        # Episodes this connection started and did not end (truncated if it goes away).
        self.episodes: dict[str, None] = {}
        # A deferred request is in flight (replies go out in request order).
        self.busy = False
        # Identifies the in-flight request: a late answer for an older one is dropped.
        self.token = 0
        self.closing = False
        self.closed = False
        self.linger_until = 0.0
        self.events = 0


class _Dispatch:
    """What requests do; the I/O loop parses them and calls these (on the I/O thread).

    Args:
        action_space: The action space (multi-agent: see :class:`ValueSpace`).
        observation_space: The observation space.
        multi_agent: Whether values are agent dicts.
    """

    def __init__(
        self, action_space: gym.Space[Any], observation_space: gym.Space[Any], multi_agent: bool
    ) -> None:
        per_agent = protocol.per_agent_spaces(observation_space, action_space)
        self.multi_agent = multi_agent
        self.observations = ValueSpace(observation_space, multi_agent, per_agent)
        self.actions = ValueSpace(action_space, multi_agent, per_agent)

    def start_episode(self, conn: _Conn, episode_id: str | None, training_enabled: bool) -> str:
        raise NotImplementedError

    def get_action(
        self, conn: _Conn, episode_id: str, observation: Any, answer: Callable[[Any], None]
    ) -> Any:
        """The action, or ``_DEFERRED`` where ``answer(action)`` comes later."""
        raise NotImplementedError

    def log_action(
        self,
        conn: _Conn,
        episode_id: str,
        observation: Any,
        action: Any,
        extra: dict[str, Any] | None,
    ) -> None:
        raise NotImplementedError

    def log_returns(self, conn: _Conn, episode_id: str, reward: Any, info: Any, done: Any) -> None:
        raise NotImplementedError

    def end_episode(self, conn: _Conn, episode_id: str, observation: Any) -> None:
        raise NotImplementedError

    def weights(self, weights_seq_no: int) -> dict[str, Any] | bytes:
        """The ``weights`` reply (or its packed body) for a client at ``weights_seq_no``."""
        raise NotImplementedError

    def disconnected(self, conn: _Conn) -> None:
        """A connection went away (its episodes are left open)."""


class _Serving:
    """The I/O loop: one thread, every connection, the handshake, framing and parsing.

    Args:
        dispatch: What requests do.
        address: The address to bind.
        port: The port (0: the OS picks one).
        token: The token clients must send in ``hello`` (None: none needed).
        max_frame_bytes: The longest frame body a client may send.
    """

    def __init__(
        self,
        dispatch: _Dispatch,
        address: str,
        port: int,
        token: str | None,
        max_frame_bytes: int,
    ) -> None:
        protocol.msgpack_module()  # (the ImportError naming the extra, before binding)
        if token is not None and not isinstance(token, str):
            raise TypeError(f"token must be a str or None, got {type(token).__name__}")
        if max_frame_bytes < 64:
            raise ValueError(f"max_frame_bytes must be at least 64, got {max_frame_bytes}")
        self._dispatch = dispatch
        self._token = token.encode() if token is not None else None
        self.max_frame_bytes = int(max_frame_bytes)
        # (Packed first: a space the protocol cannot send fails before anything is bound.)
        self._welcome = protocol.pack(
            {
                "type": "welcome",
                "protocol": PROTOCOL_VERSION,
                "server": f"fastrollout {protocol.package_version()}",
                "multi_agent": dispatch.multi_agent,
                "observation_space": dispatch.observations.to_wire(),
                "action_space": dispatch.actions.to_wire(),
                "max_frame_bytes": self.max_frame_bytes,
            }
        )
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._listener.bind((address, port))
            self._listener.listen(1024)
            self._listener.setblocking(False)
        except OSError:
            self._listener.close()
            raise
        self.address, self.port = self._listener.getsockname()[:2]
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ, None)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._conns: dict[int, _Conn] = {}
        # Connections closed for an error that still drop their client's input.
        self._lingering: set[_Conn] = set()
        # Answers from other threads: (connection, request token, action or exception).
        self._posted: collections.deque[tuple[_Conn, int, Any]] = collections.deque()
        self._wake_pending = False
        self._state = threading.Lock()
        self._serving = False
        self._stopping = False
        self._torn_down = False
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    # -- life cycle -----------------------------------------------------------------

    def serve_forever(self) -> None:
        """Serves until :meth:`close` (on the calling thread: the I/O thread).

        Raises:
            RuntimeError: If it already serves.
        """
        with self._state:
            if self._stopping:
                return
            if self._serving:
                raise RuntimeError("the server already serves")
            self._serving = True
            self._thread = threading.current_thread()
        try:
            while not self._stopping:
                self._step()
        finally:
            self._teardown()
            self._done.set()

    def close(self, timeout: float = 10.0) -> None:
        """Stops serving and closes every socket (idempotent; waits for the I/O thread)."""
        with self._state:
            self._stopping = True
            serving = self._serving
        if not serving:
            self._teardown()
            return
        self._wake()
        if threading.current_thread() is not self._thread:
            self._done.wait(timeout)

    def post(self, conn: _Conn, token: int, answer: Any) -> None:
        """Hands an answer to the I/O thread (from any thread).

        One wake-up per batch of answers: the runner answers every waiting client in one
        turn, and a syscall per answer would cost its thread about 10 us each.
        """
        self._posted.append((conn, token, answer))
        if not self._wake_pending:  # (see _drain_wake for the order that makes it safe)
            self._wake_pending = True
            self._wake()

    def _wake(self) -> None:
        # (Full: a wake is pending already; closed: the loop stopped.)
        with contextlib.suppress(OSError):
            self._wake_w.send(b"\0")

    def _teardown(self) -> None:
        with self._state:
            if self._torn_down:
                return
            self._torn_down = True
        for conn in list(self._conns.values()):
            self._close_socket(conn)
        self._conns.clear()
        self._posted.clear()
        for sock in (self._listener, self._wake_r, self._wake_w):
            sock.close()
        self._selector.close()

    # -- the loop ---------------------------------------------------------------------

    def _step(self) -> None:
        lingering = self._lingering
        timeout = (
            max(0.0, min(c.linger_until for c in lingering) - time.monotonic())
            if lingering
            else None
        )
        for key, mask in self._selector.select(timeout):
            conn = key.data
            if conn is None:
                if key.fileobj is self._listener:
                    self._accept()
                else:
                    self._drain_wake()
                continue
            if mask & selectors.EVENT_WRITE and not conn.closed:
                self._flush(conn)
                if conn.rbuf and not conn.closed:
                    self._process(conn)  # (input that waited for the output to drain)
            if mask & selectors.EVENT_READ and not conn.closed:
                self._read(conn)
        if self._posted:
            self._answer_posted()
        if lingering:
            now = time.monotonic()
            for conn in [c for c in lingering if now >= c.linger_until]:
                if not conn.closed:
                    self._close_socket(conn)

    def _accept(self) -> None:
        while True:
            try:
                sock, addr = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as err:  # (EMFILE and the like: the others go on)
                logger.warning("policy server: accept failed: %s", err)
                return
            sock.setblocking(False)
            if sock.family in (socket.AF_INET, socket.AF_INET6):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = _Conn(sock, f"{addr[0]}:{addr[1]}")
            self._conns[sock.fileno()] = conn
            self._set_events(conn)

    def _drain_wake(self) -> None:
        with contextlib.suppress(BlockingIOError, InterruptedError):
            while self._wake_r.recv(4096):
                pass
        # Cleared after the bytes are read (a poster's byte read here must not leave the
        # flag set with no byte to come) and before the deque is drained (what a poster
        # appended while the flag was set is answered in this turn).
        self._wake_pending = False

    def _set_events(self, conn: _Conn) -> None:
        """Registers the connection for what it waits for (input unless it is blocked)."""
        events = 0
        if conn.linger_until or not (conn.closing or self._blocked(conn)):
            events |= selectors.EVENT_READ
        if conn.wbuf:
            events |= selectors.EVENT_WRITE
        if events == conn.events:
            return
        if conn.events == 0:
            self._selector.register(conn.sock, events, conn)
        elif events == 0:
            self._selector.unregister(conn.sock)
        else:
            self._selector.modify(conn.sock, events, conn)
        conn.events = events

    def _blocked(self, conn: _Conn) -> bool:
        """Whether to stop reading a connection's input.

        While a reply is in flight or output piled up, requests wait; their input is
        still read up to one frame's worth, so that a disconnect is seen meanwhile.
        """
        return (conn.busy or len(conn.wbuf) > _WRITE_HIGH) and (
            len(conn.rbuf) > self.max_frame_bytes + HEADER.size
        )

    def _read(self, conn: _Conn) -> None:
        for _ in range(_RECVS_PER_EVENT):
            try:
                data = conn.sock.recv(_RECV_BYTES)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as err:
                self._lost(conn, f"receive failed: {err}")
                return
            if not data:
                if conn.linger_until:
                    self._close_socket(conn)
                else:
                    self._lost(conn, "the client closed the connection")
                return
            if conn.linger_until:
                continue  # (dropped: the connection is closing)
            conn.rbuf += data
            if len(data) < _RECV_BYTES or len(conn.rbuf) > self.max_frame_bytes + HEADER.size:
                # (A short read drained the socket: no second recv to find that out, which
                # cost a syscall and an exception per request.)
                break
        self._process(conn)

    def _process(self, conn: _Conn) -> None:
        """Handles the complete frames in the input, in order, while nothing blocks."""
        while not (conn.closed or conn.closing or conn.busy or len(conn.wbuf) > _WRITE_HIGH):
            if len(conn.rbuf) < HEADER.size:
                break
            (length,) = HEADER.unpack_from(conn.rbuf)
            if length > self.max_frame_bytes:
                self._reject(
                    conn,
                    "frame_too_large",
                    f"a frame of {length} bytes is over the limit of {self.max_frame_bytes}",
                )
                break
            end = HEADER.size + length
            if len(conn.rbuf) < end:
                break
            body = bytes(conn.rbuf[HEADER.size : end])
            del conn.rbuf[:end]
            self._handle(conn, body)
        if not conn.closed:
            self._set_events(conn)

    def _handle(self, conn: _Conn, body: bytes) -> None:
        try:
            msg = protocol.unpack(body)
            if not (isinstance(msg, dict) and isinstance(msg.get("type"), str)):
                raise _Reject("bad_frame", "the body is not a map with a str 'type'")
            reply = self._hello(conn, msg) if not conn.greeted else self._request(conn, msg)
        except FrameError as err:
            self._reject(conn, "bad_frame", str(err))
            return
        except _Reject as err:
            self._reject(conn, err.code, str(err))
            return
        except ValueError as err:
            self._send(conn, _error("invalid_request", str(err)))
            return
        except Exception as err:  # (a failure of the env: that request fails, not the server)
            logger.exception("policy server: %s: %s failed", conn.peer, msg.get("type"))
            self._send(conn, _error("invalid_request", f"{type(err).__name__}: {err}"))
            return
        if reply is _DEFERRED:
            conn.busy = True
        else:
            self._send(conn, reply)

    def _hello(self, conn: _Conn, msg: dict[str, Any]) -> Any:
        if msg["type"] != "hello":
            raise _Reject("unknown_message", f"expected 'hello' first, got {msg['type']!r}")
        version = msg.get("protocol")
        if version != PROTOCOL_VERSION:
            raise _Reject(
                "protocol_version",
                f"protocol {version!r} is not spoken here; this server speaks version "
                f"{PROTOCOL_VERSION}",
            )
        mode = msg.get("inference_mode", "remote")
        if mode not in ("remote", "local"):
            raise _Reject("bad_frame", f"inference_mode must be 'remote' or 'local', got {mode!r}")
        if self._token is not None:
            token = msg.get("token")
            given = token.encode() if isinstance(token, str) else b""
            if not hmac.compare_digest(given, self._token):
                raise _Reject("unauthorized", "a wrong or missing token")
        conn.greeted = True
        conn.mode = mode
        logger.debug("policy server: %s connected (%s, %s)", conn.peer, mode, msg.get("client"))
        return self._welcome

    def _request(self, conn: _Conn, msg: dict[str, Any]) -> Any:
        kind = msg["type"]
        if kind == "get_action":
            episode_id = _field(msg, "episode_id", str)
            obs = self._dispatch.observations.decode(_field(msg, "observation"), "observation")
            conn.token += 1
            token = conn.token
            return self._dispatch.get_action(
                conn, episode_id, obs, lambda action: self.post(conn, token, action)
            )
        if kind in _CALLS:
            return self._call(conn, msg)
        if kind == "log_experience":
            calls = _field(msg, "calls", list)
            for i, call in enumerate(calls):
                try:
                    if not (isinstance(call, dict) and call.get("type") in _CALLS):
                        raise ValueError(f"not a call of {sorted(_CALLS)}: {call!r:.200}")
                    self._call(conn, call, nested=True)
                except (_Reject, ValueError) as err:
                    what = call.get("type") if isinstance(call, dict) else None
                    raise ValueError(f"log_experience: call {i} ({what}): {err}") from None
            return _OK
        if kind == "get_weights":
            return self._dispatch.weights(_field(msg, "weights_seq_no", int))
        if kind == "ping":
            return {"type": "pong"}
        raise _Reject("unknown_message", f"unknown message type {kind!r}")

    def _call(self, conn: _Conn, msg: dict[str, Any], nested: bool = False) -> Any:
        """Applies start_episode, log_action, log_returns or end_episode.

        ``msg`` is a request, or (``nested``) a call of ``log_experience``, which must
        give the episode id.
        """
        kind = msg["type"]
        dispatch = self._dispatch
        if kind == "start_episode":
            episode_id = _field(msg, "episode_id", str, optional=not nested)
            training = _field(msg, "training_enabled", bool, optional=True)
            started = dispatch.start_episode(
                conn, episode_id, True if training is None else training
            )
            return {"type": "episode_started", "episode_id": started}
        episode_id = _field(msg, "episode_id", str)
        if kind == "log_action":
            obs = dispatch.observations.decode(_field(msg, "observation"), "observation")
            action = dispatch.actions.decode(_field(msg, "action"), "action")
            extra = _field(msg, "extra", dict, optional=True)
            dispatch.log_action(conn, episode_id, obs, action, extra)
        elif kind == "log_returns":
            reward = _field(msg, "reward")
            info = _field(msg, "info", dict, optional=True)
            done = _field(msg, "done", dict, optional=True)
            dispatch.log_returns(conn, episode_id, reward, info, done)
        else:  # end_episode
            obs = dispatch.observations.decode(_field(msg, "observation"), "observation")
            dispatch.end_episode(conn, episode_id, obs)
        return _OK

    def _answer_posted(self) -> None:
        while self._posted:
            conn, token, answer = self._posted.popleft()
            if conn.closed or conn.closing or not conn.busy or token != conn.token:
                continue  # (the connection went away, or the answer is stale)
            conn.busy = False
            reply: dict[str, Any] | bytes
            if isinstance(answer, BaseException):
                reply = _error("invalid_request", f"{type(answer).__name__}: {answer}")
            else:
                try:
                    reply = protocol.pack(
                        {"type": "action", "action": self._dispatch.actions.encode(answer)}
                    )
                except (TypeError, ValueError) as err:
                    reply = _error("invalid_request", f"the action cannot be sent: {err}")
            self._send(conn, reply)
            self._process(conn)

    # -- output and closing -----------------------------------------------------------

    def _send(self, conn: _Conn, reply: dict[str, Any] | bytes) -> None:
        body = reply if isinstance(reply, bytes) else protocol.pack(reply)
        conn.wbuf += HEADER.pack(len(body))
        conn.wbuf += body
        self._flush(conn)

    def _flush(self, conn: _Conn) -> None:
        try:
            while conn.wbuf:
                sent = conn.sock.send(conn.wbuf)
                del conn.wbuf[:sent]
        except (BlockingIOError, InterruptedError):
            pass
        except OSError as err:
            self._lost(conn, f"send failed: {err}")
            return
        if not conn.wbuf and conn.closing and not conn.linger_until:
            self._linger(conn)
            return
        self._set_events(conn)

    def _reject(self, conn: _Conn, code: str, message: str) -> None:
        """Sends an error frame and closes the connection (after the frame is out)."""
        logger.warning("policy server: closing %s: %s: %s", conn.peer, code, message)
        self._drop_episodes(conn)
        conn.closing = True
        conn.rbuf.clear()
        self._send(conn, _error(code, message))

    def _linger(self, conn: _Conn) -> None:
        """The error frame is out: half-close, then read (and drop) until EOF or timeout."""
        try:
            conn.sock.shutdown(socket.SHUT_WR)
        except OSError:
            self._close_socket(conn)
            return
        conn.linger_until = time.monotonic() + _LINGER_S
        self._lingering.add(conn)
        self._set_events(conn)

    def _lost(self, conn: _Conn, reason: str) -> None:
        if conn.episodes and not conn.closing:
            logger.warning(
                "policy server: %s: %s; truncating its %d open episode(s)",
                conn.peer,
                reason,
                len(conn.episodes),
            )
        else:
            logger.info("policy server: %s: %s", conn.peer, reason)
        self._drop_episodes(conn)
        self._close_socket(conn)

    def _drop_episodes(self, conn: _Conn) -> None:
        if not conn.closing:
            try:
                self._dispatch.disconnected(conn)
            except Exception:
                logger.exception("policy server: %s: ending its episodes failed", conn.peer)
        conn.episodes.clear()

    def _close_socket(self, conn: _Conn) -> None:
        if conn.closed:
            return
        conn.closed = True
        conn.busy = False
        self._lingering.discard(conn)
        if conn.events:
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(conn.sock)
            conn.events = 0
        self._conns.pop(conn.sock.fileno(), None)
        conn.sock.close()
        conn.rbuf.clear()
        conn.wbuf.clear()


# Requests that are also the calls of a log_experience request.
_CALLS = frozenset({"start_episode", "log_action", "log_returns", "end_episode"})
_MISSING = object()


def _field(
    msg: Mapping[str, Any], key: str, kind: type | None = None, *, optional: bool = False
) -> Any:
    """A request's key (``bad_frame`` if it is missing or of the wrong type)."""
    value = msg.get(key, _MISSING)
    if value is _MISSING or (value is None and optional):
        if optional:
            return None
        raise _Reject("bad_frame", f"{msg.get('type')!r} needs the key {key!r}")
    if kind is not None and not (
        isinstance(value, kind) and not (kind is int and isinstance(value, bool))
    ):
        raise _Reject(
            "bad_frame",
            f"{msg.get('type')!r}: {key!r} must be of type {kind.__name__}, "
            f"got {type(value).__name__}",
        )
    return value


def _error(code: str, message: str) -> dict[str, Any]:
    return {"type": "error", "code": code, "message": message}


# -- the env ---------------------------------------------------------------------------


class _EnvDispatch(_Dispatch):
    """Requests as calls of an ``ExternalEnv``'s non-blocking methods."""

    def __init__(self, env: ExternalEnv) -> None:
        super().__init__(env.action_space, env.observation_space, env.multi_agent)
        self._env = env
        # The packed weights reply of the latest snapshot: (weights_seq_no, body).
        self._weights_body: tuple[int, bytes] | None = None

    def start_episode(self, conn: _Conn, episode_id: str | None, training_enabled: bool) -> str:
        started = self._env.start_episode(episode_id, training_enabled)
        conn.episodes[started] = None
        return started

    def get_action(
        self, conn: _Conn, episode_id: str, observation: Any, answer: Callable[[Any], None]
    ) -> Any:
        self._env.request_action(episode_id, observation, answer)
        return _DEFERRED

    def log_action(
        self,
        conn: _Conn,
        episode_id: str,
        observation: Any,
        action: Any,
        extra: dict[str, Any] | None,
    ) -> None:
        self._env.log_action(episode_id, observation, action, extra)

    def log_returns(self, conn: _Conn, episode_id: str, reward: Any, info: Any, done: Any) -> None:
        if self.multi_agent:
            if not isinstance(reward, Mapping):
                raise ValueError(
                    f"a multi-agent reward is a map agent -> float, got {reward!r:.100}"
                )
            self._env.log_returns(episode_id, reward, info, done)  # type: ignore[call-arg, arg-type]
        else:
            if isinstance(reward, bool) or not isinstance(reward, (int, float)):
                raise ValueError(f"a reward is a number, got {reward!r:.100}")
            self._env.log_returns(episode_id, reward, info)

    def end_episode(self, conn: _Conn, episode_id: str, observation: Any) -> None:
        self._env.end_episode(episode_id, observation)
        conn.episodes.pop(episode_id, None)

    def weights(self, weights_seq_no: int) -> dict[str, Any] | bytes:
        snapshot = self._env.weights_snapshot()
        if snapshot is None:
            return {"type": "weights", "weights_seq_no": -1, "modules": None, "weights": None}
        seq_no, modules, weights = snapshot
        if seq_no <= weights_seq_no:
            return {"type": "weights", "weights_seq_no": seq_no, "modules": None, "weights": None}
        cached = self._weights_body
        if cached is None or cached[0] != seq_no:
            body = protocol.pack(
                {
                    "type": "weights",
                    "weights_seq_no": seq_no,
                    "modules": {
                        mid: {
                            "class": m["class"],
                            "model_config": dict(m.get("model_config") or {}),
                            "observation_space": protocol.space_to_wire(m["observation_space"]),
                            "action_space": protocol.space_to_wire(m["action_space"]),
                        }
                        for mid, m in modules.items()
                    },
                    "weights": weights,
                }
            )
            cached = self._weights_body = (seq_no, body)
        return cached[1]

    def disconnected(self, conn: _Conn) -> None:
        for episode_id in conn.episodes:
            try:
                self._env.truncate_episode(episode_id)
            except (ValueError, RuntimeError) as err:  # (ended elsewhere, or env closed)
                logger.debug("policy server: truncating %s: %s", episode_id, err)


class _ServerEnvMixin:
    """The serving part of :class:`PolicyServerEnv` and :class:`PolicyServerMultiAgentEnv`.

    Its ``__init__`` is both classes' (see :class:`PolicyServerEnv` for the arguments):
    it initializes the ``ExternalEnv`` (next in the MRO), then binds.
    """

    _server: _Serving
    multi_agent: bool

    def __init__(
        self,
        action_space: gym.Space[Any],
        observation_space: gym.Space[Any],
        *,
        address: str = "127.0.0.1",
        port: int = 0,
        token: str | None = None,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        multi_agent: bool | None = None,
        max_concurrent: int | None = None,
    ) -> None:
        if multi_agent is not None and bool(multi_agent) != self.multi_agent:
            kind, other = (
                ("multi-agent", "PolicyServerEnv")
                if self.multi_agent
                else ("single-agent", "PolicyServerMultiAgentEnv")
            )
            raise ValueError(f"{type(self).__name__} is {kind} (use {other})")
        super().__init__(action_space, observation_space, max_concurrent)  # type: ignore[call-arg]
        self._server = _Serving(
            _EnvDispatch(self),  # type: ignore[arg-type]
            address,
            port,
            token,
            max_frame_bytes,
        )

    @property
    def address(self) -> str:
        """The address the server is bound to."""
        return str(self._server.address)

    @property
    def port(self) -> int:
        """The port the server is bound to (the OS's choice for ``port=0``)."""
        return int(self._server.port)

    @property
    def max_frame_bytes(self) -> int:
        """The longest frame body a client may send."""
        return self._server.max_frame_bytes

    def run(self) -> None:
        """Serves until :meth:`close` (the env's thread, which the runner starts)."""
        self._server.serve_forever()

    def close(self) -> None:
        """Stops serving, closes every socket, then closes the env (idempotent)."""
        self._server.close()
        super().close()  # type: ignore[misc]


class PolicyServerEnv(_ServerEnvMixin, ExternalEnv):
    """An ``ExternalEnv`` whose simulators are network clients (RLlib's ``PolicyServerInput``).

    Binds at construction (``port``/``address`` are known at once) and serves in
    ``run()``, the env's thread, which the runner starts. Clients speak docs/protocol.md
    (:class:`fastrollout.external.PolicyClient` in Python): in ``"remote"`` mode the
    runner acts for them, all waiting clients in one forward pass per module; in
    ``"local"`` mode they fetch the weights, act themselves and send their experience.

    A client that sends something wrong (a frame over ``max_frame_bytes``, a body that
    is not a protocol message, an unknown message, anything before ``hello``, a wrong
    token) gets an error frame and is disconnected, with a logged warning; the others go
    on. A client that disconnects mid-episode has its episodes ended as truncated.
    Observations or actions outside their space are refused (``invalid_request``) and
    the connection stays open.

    Args:
        action_space: The action space (multi-agent: a ``Dict`` per agent, or shared).
        observation_space: The observation space.
        address: The address to bind (127.0.0.1: this machine only).
        port: The port (0: the OS picks a free one).
        token: A secret every client must send (compared in constant time).
        max_frame_bytes: The longest frame body a client may send.
        multi_agent: Serve a multi-agent env (the instance is then a
            :class:`PolicyServerMultiAgentEnv`, an ``ExternalMultiAgentEnv``).
        max_concurrent: Episodes the runner serves at once (``ExternalEnv``'s).

    Raises:
        ImportError: If msgpack is missing (``pip install 'fastrollout[server]'``).
        OSError: If the address cannot be bound.
        ValueError: If ``multi_agent`` is given and disagrees with a subclass's kind.

    Examples:
        >>> import fastrollout as fr
        >>> config = fr.RunnerConfig().environment(
        ...     lambda ctx: PolicyServerEnv(act_space, obs_space, port=9900)
        ... )  # doctest: +SKIP
    """

    def __new__(cls, *args: Any, multi_agent: bool = False, **kwargs: Any) -> Any:
        """A :class:`PolicyServerMultiAgentEnv` for ``multi_agent=True``, else this class."""
        if multi_agent and cls is PolicyServerEnv:
            return PolicyServerMultiAgentEnv(*args, **kwargs)
        return super().__new__(cls)


class PolicyServerMultiAgentEnv(_ServerEnvMixin, ExternalMultiAgentEnv):
    """:class:`PolicyServerEnv` for multi-agent simulators (an ``ExternalMultiAgentEnv``).

    Values are agent dicts; the spaces are ``Dict`` spaces keyed by agent id (the same
    keys in both) or one space every agent shares. Same arguments as
    :class:`PolicyServerEnv` (without ``multi_agent``).
    """


# -- the bare server -----------------------------------------------------------------------


class _BareDispatch(_Dispatch):
    """Every request answered at once: one fixed valid action, everything else ``ok``."""

    def __init__(
        self, action_space: gym.Space[Any], observation_space: gym.Space[Any], multi_agent: bool
    ) -> None:
        super().__init__(action_space, observation_space, multi_agent)
        if multi_agent and self.actions.per_agent:
            self._action: Any = {
                a: s.sample()
                for a, s in action_space.spaces.items()  # type: ignore[attr-defined]
            }
        else:
            self._action = action_space.sample()

    def start_episode(self, conn: _Conn, episode_id: str | None, training_enabled: bool) -> str:
        return episode_id if episode_id is not None else uuid.uuid4().hex

    def get_action(
        self, conn: _Conn, episode_id: str, observation: Any, answer: Callable[[Any], None]
    ) -> Any:
        if not self.multi_agent:
            action = self._action
        elif self.actions.per_agent:
            action = {a: self._action[a] for a in observation}
        else:
            action = dict.fromkeys(observation, self._action)
        return {"type": "action", "action": self.actions.encode(action)}

    def log_action(
        self,
        conn: _Conn,
        episode_id: str,
        observation: Any,
        action: Any,
        extra: dict[str, Any] | None,
    ) -> None:
        pass

    def log_returns(self, conn: _Conn, episode_id: str, reward: Any, info: Any, done: Any) -> None:
        pass

    def end_episode(self, conn: _Conn, episode_id: str, observation: Any) -> None:
        pass

    def weights(self, weights_seq_no: int) -> dict[str, Any] | bytes:
        return {"type": "weights", "weights_seq_no": -1, "modules": None, "weights": None}


class BareServer:
    """The policy server's I/O loop without an env: for benchmarks of the server itself.

    The same loop, codec and handshake as :class:`PolicyServerEnv`; ``get_action`` is
    answered at once, on the I/O thread, with one fixed valid action (sampled once),
    and the other requests with ``ok`` (``start_episode`` with the id, a new one if none
    was given; ``get_weights`` with no weights).

    Args:
        action_space: The action space.
        observation_space: The observation space.
        address: The address to bind.
        port: The port (0: the OS picks one).
        token: A secret every client must send.
        max_frame_bytes: The longest frame body a client may send.
        multi_agent: Whether values are agent dicts.
    """

    def __init__(
        self,
        action_space: gym.Space[Any],
        observation_space: gym.Space[Any],
        *,
        address: str = "127.0.0.1",
        port: int = 0,
        token: str | None = None,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        multi_agent: bool = False,
    ) -> None:
        self.action_space = action_space
        self.observation_space = observation_space
        self._server = _Serving(
            _BareDispatch(action_space, observation_space, multi_agent),
            address,
            port,
            token,
            max_frame_bytes,
        )
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> str:
        """The address the server is bound to."""
        return str(self._server.address)

    @property
    def port(self) -> int:
        """The port the server is bound to."""
        return int(self._server.port)

    def start(self) -> BareServer:
        """Serves on a daemon thread.

        Returns:
            The server.
        """
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._server.serve_forever, name="BareServer", daemon=True
            )
            self._thread.start()
        return self

    def close(self) -> None:
        """Stops serving and closes every socket (idempotent)."""
        self._server.close()
        if self._thread is not None:
            self._thread.join(10.0)

    def __enter__(self) -> BareServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
