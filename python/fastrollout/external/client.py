"""``PolicyClient``: RLlib's policy client API over the policy server's protocol.

A simulator calls ``start_episode``, ``get_action`` / ``log_action``, ``log_returns``
and ``end_episode``, as with RLlib's ``PolicyClient``. In ``"remote"`` mode each call is
a request to the server (whose runner acts); in ``"local"`` mode the client fetches the
module's weights, acts itself and sends what it did in chunks (``log_experience``).

A lost connection is retried with exponential backoff (up to ``reconnect_s`` in all);
after the new handshake the client starts its open episodes again under their ids and
sends the request that failed again, so the simulator's episode goes on (the server ended
the old part as truncated).
"""

from __future__ import annotations

import importlib
import logging
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from fastrollout.core.tree import take, tree_map
from fastrollout.external import protocol
from fastrollout.external.protocol import HEADER, PROTOCOL_VERSION, FrameError, ValueSpace

__all__ = ["PolicyClient"]

logger = logging.getLogger(__name__)

# Reconnect backoff: the first wait, and the cap of the doubling waits.
_BACKOFF_FIRST_S = 0.05
_BACKOFF_MAX_S = 2.0
# The connect timeout of one attempt, and the handshake's reply timeout.
_CONNECT_TIMEOUT_S = 10.0
# Local mode: recorded calls sent once this many are buffered (and at end_episode).
_CHUNK_CALLS = 256


class _Fatal(Exception):
    """An error that reconnecting does not mend (raised as ``error`` after cleanup)."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


def _parse_address(address: Any) -> tuple[str, int]:
    """The host and port of an address.

    Forms: ``"host:port"``, ``"http://host:port"`` (the scheme is dropped),
    ``"[::1]:port"``, ``(host, port)``.
    """
    if isinstance(address, (tuple, list)) and len(address) == 2:
        return str(address[0]), int(address[1])
    if not isinstance(address, str):
        raise TypeError(f"address must be 'host:port' or (host, port), got {address!r}")
    text = address.split("://", 1)[-1].rstrip("/")
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"address must be 'host:port', got {address!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


class PolicyClient:
    """Connects a simulator to a policy server (RLlib 2.60's ``PolicyClient`` API).

    Thread-safe: each call holds the client's lock for its request and reply (threads
    that run episodes at once share the one connection; one client per thread serves
    them in parallel).

    Args:
        address: ``"host:port"``, ``"http://host:port"`` (RLlib's form; the scheme is
            dropped) or ``(host, port)``.
        inference_mode: ``"remote"`` (the server acts) or ``"local"`` (the client acts
            with a copy of the module, refreshed every ``update_interval`` seconds).
        update_interval: Local mode: seconds between weight refreshes, and the longest
            time recorded experience waits before it is sent (None: only at
            ``end_episode``, when the buffer fills, and on ``update_policy_weights``).
        token: The server's token, if it has one.
        timeout_s: The longest wait for one reply (None: no limit; a ``get_action``
            waits until the runner samples). A reply that takes longer counts as a lost
            connection.
        reconnect_s: How long to keep trying to (re)connect before a call raises
            ``ConnectionError``. The first connection is made here, with the same
            patience.
        policy_mapping_fn: Local multi-agent mode: ``fn(agent_id) -> module_id`` (default:
            the one module if there is one, else the agent id).
        max_frame_bytes: The longest frame the client reads from the server.

    Raises:
        ImportError: If msgpack is missing (``pip install 'fastrollout[server]'``).
        ConnectionError: If the server cannot be reached within ``reconnect_s``, or
            refuses the handshake (wrong token, another protocol version).

    Examples:
        >>> with PolicyClient("127.0.0.1:9900") as client:  # doctest: +SKIP
        ...     eid = client.start_episode()
        ...     action = client.get_action(eid, obs)
        ...     client.log_returns(eid, 1.0)
        ...     client.end_episode(eid, obs)
    """

    def __init__(
        self,
        address: Any,
        inference_mode: str = "remote",
        update_interval: float | None = 10.0,
        *,
        token: str | None = None,
        timeout_s: float | None = None,
        reconnect_s: float = 60.0,
        policy_mapping_fn: Callable[[Any], Any] | None = None,
        max_frame_bytes: int = 1 << 30,
    ) -> None:
        protocol.msgpack_module()
        if inference_mode not in ("remote", "local"):
            raise ValueError(f"inference_mode must be 'remote' or 'local', got {inference_mode!r}")
        self.address = _parse_address(address)
        self.inference_mode = inference_mode
        self.update_interval = update_interval
        self._token = token
        self._timeout_s = timeout_s
        self._reconnect_s = float(reconnect_s)
        self._policy_mapping_fn = policy_mapping_fn
        self._max_frame_bytes = int(max_frame_bytes)
        self._lock = threading.RLock()
        self._sock: socket.socket | None = None
        self._closed = False
        # Episodes the server knows as started and not ended (id -> training_enabled):
        # started again after a reconnect.
        self._server_open: dict[str, bool] = {}
        #: What the server's welcome said (set by the first handshake).
        self.server: str | None = None
        self.multi_agent = False
        self.observation_space: gym.Space[Any] | None = None
        self.action_space: gym.Space[Any] | None = None
        self._obs: ValueSpace | None = None
        self._actions: ValueSpace | None = None
        # Local mode.
        self._modules: dict[str, Any] = {}
        # The packed description each module was built from (rebuilt if it changes).
        self._module_descriptions: dict[str, bytes] = {}
        self._weights_seq_no = -1
        self._weights_time = 0.0
        self._calls: list[dict[str, Any]] = []
        self._calls_time = time.monotonic()
        self._local_open: dict[str, bool] = {}
        # Stateful modules' live states, per (episode id, agent id) (single-agent: agent
        # None), and the episodes that took a step before the client had weights (they
        # send no state: the server's runner keeps its own for them).
        self._states: Any = None
        self._stateless_episodes: set[str] = set()
        with self._lock:
            self._call(None)
            if inference_mode == "local":
                self._refresh_weights()

    # -- RLlib's API ----------------------------------------------------------------

    def start_episode(self, episode_id: str | None = None, training_enabled: bool = True) -> str:
        """Starts an episode.

        Args:
            episode_id: Its id (None: a new one).
            training_enabled: Whether its experience is used for training.

        Returns:
            The episode id.

        Raises:
            ValueError: If the id is already running or has completed.
            ConnectionError: If the server is lost for longer than ``reconnect_s``.
        """
        training = bool(training_enabled)
        with self._lock:
            if self.inference_mode == "local":
                eid = uuid.uuid4().hex if episode_id is None else str(episode_id)
                if eid in self._local_open:
                    raise ValueError(f"Episode {eid} is already started")
                self._local_open[eid] = training
                self._forget_states(eid)
                self._record(
                    {"type": "start_episode", "episode_id": eid, "training_enabled": training}
                )
                return eid
            reply = self._call(
                {
                    "type": "start_episode",
                    "episode_id": None if episode_id is None else str(episode_id),
                    "training_enabled": training,
                },
                "episode_started",
            )
            eid = reply["episode_id"]
            self._server_open[eid] = training
            return str(eid)

    def get_action(self, episode_id: str, observation: Any) -> Any:
        """Records an observation and returns the policy's action for it.

        Args:
            episode_id: The episode.
            observation: The observation (multi-agent: a dict agent id -> observation).

        Returns:
            The action (multi-agent: a dict agent id -> action).

        Raises:
            ValueError: For an unknown or finished episode, or an observation outside
                the space (the server's message).
            ConnectionError: If the server is lost for longer than ``reconnect_s``.
        """
        with self._lock:
            if self.inference_mode == "local":
                return self._local_get_action(episode_id, observation)
            assert self._obs is not None and self._actions is not None
            reply = self._call(
                {
                    "type": "get_action",
                    "episode_id": episode_id,
                    "observation": self._obs.encode(observation),
                },
                "action",
            )
            return self._actions.decode(reply.get("action"), "action")

    def log_action(self, episode_id: str, observation: Any, action: Any) -> None:
        """Records an observation and an action the simulator chose itself (off-policy).

        Args:
            episode_id: The episode.
            observation: The observation.
            action: The action taken.

        Raises:
            ValueError: For an unknown or finished episode, or an observation or action
                outside its space.
        """
        with self._lock:
            if self.inference_mode == "local":
                self._check_local(episode_id)
                obs = self._conform(self._obs, observation, "observation")
                act = self._conform(self._actions, action, "action")
                call = {
                    "type": "log_action",
                    "episode_id": episode_id,
                    "observation": obs,
                    "action": act,
                }
                if self._states:
                    # A stateful module still sees the step: its state advances with its
                    # forward pass (as the runner's does for logged actions).
                    extra = self._logged_states(episode_id, obs)
                    if extra:
                        call["extra"] = extra
                self._record(call)
                return
            assert self._obs is not None and self._actions is not None
            self._call(
                {
                    "type": "log_action",
                    "episode_id": episode_id,
                    "observation": self._obs.encode(observation),
                    "action": self._actions.encode(action),
                },
                "ok",
            )

    def log_returns(
        self,
        episode_id: str,
        reward: Any,
        info: Mapping[str, Any] | None = None,
        multiagent_done_dict: Mapping[str, bool] | None = None,
    ) -> None:
        """Adds rewards for the last action (they add up until the next action).

        Args:
            episode_id: The episode.
            reward: A number (multi-agent: a dict agent id -> number).
            info: An info dict for the step (multi-agent: agent id -> info dict).
            multiagent_done_dict: Multi-agent: agent id -> whether the agent is done.

        Raises:
            ValueError: For an unknown or finished episode, or a reward that is not a
                number.
        """
        msg = {
            "type": "log_returns",
            "episode_id": episode_id,
            "reward": _reward(reward, self.multi_agent),
            "info": dict(info) if info else None,
            "done": dict(multiagent_done_dict) if multiagent_done_dict else None,
        }
        with self._lock:
            if self.inference_mode == "local":
                self._check_local(episode_id)
                self._record(msg)
                return
            self._call(msg, "ok")

    def end_episode(self, episode_id: str, observation: Any) -> None:
        """Ends an episode with its last observation.

        Args:
            episode_id: The episode.
            observation: The last observation.

        Raises:
            ValueError: For an unknown or finished episode, or an observation outside
                the space.
        """
        with self._lock:
            if self.inference_mode == "local":
                self._check_local(episode_id)
                obs = self._conform(self._obs, observation, "observation")
                del self._local_open[episode_id]
                self._forget_states(episode_id)
                self._record({"type": "end_episode", "episode_id": episode_id, "observation": obs})
                self._flush()
                return
            assert self._obs is not None
            self._call(
                {
                    "type": "end_episode",
                    "episode_id": episode_id,
                    "observation": self._obs.encode(observation),
                },
                "ok",
            )
            self._server_open.pop(episode_id, None)

    def update_policy_weights(self) -> None:
        """Local mode: fetches the latest weights now (and sends the buffered experience).

        Remote mode: nothing to do (the server acts).
        """
        with self._lock:
            if self.inference_mode == "local":
                self._flush()
                self._refresh_weights()

    def close(self) -> None:
        """Sends buffered experience (local mode) and closes the connection (idempotent).

        Episodes still open are ended by the server as truncated.
        """
        with self._lock:
            if self._closed:
                return
            if self._calls and self._sock is not None:
                try:
                    self._flush(retry=False)
                except (ConnectionError, ValueError, OSError) as err:
                    logger.warning("PolicyClient.close: buffered experience not sent: %s", err)
            self._closed = True
            self._drop()

    def __enter__(self) -> PolicyClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- requests -------------------------------------------------------------------

    def _call(
        self, msg: dict[str, Any] | None, expect: str | None = None, *, retry: bool = True
    ) -> dict[str, Any]:
        """Sends a request and returns its reply, reconnecting as needed (lock held).

        ``msg`` None only makes sure the client is connected.

        Raises:
            ValueError: The server's ``invalid_request`` (its message).
            ConnectionError: Another server error, or no connection within
                ``reconnect_s``.
        """
        frame = protocol.encode_frame(msg) if msg is not None else b""  # (TypeError early)
        deadline: float | None = None
        delay = _BACKOFF_FIRST_S
        while True:
            if self._closed:
                raise ConnectionError("the PolicyClient is closed")
            try:
                if self._sock is None:
                    self._connect()
                if msg is None:
                    return {}
                assert self._sock is not None
                self._sock.sendall(frame)
                reply = self._recv(self._sock)
            except _Fatal as fatal:
                self._drop()
                raise fatal.error from None
            except (OSError, EOFError, FrameError) as err:
                self._drop()
                now = time.monotonic()
                if deadline is None:
                    deadline = now + self._reconnect_s
                if not retry or now >= deadline:
                    raise ConnectionError(
                        f"policy server {self._where()}: connection lost and not back within "
                        f"{self._reconnect_s:g} s ({type(err).__name__}: {err})"
                    ) from err
                if deadline - now > 0:
                    time.sleep(min(delay, deadline - now))
                delay = min(delay * 2, _BACKOFF_MAX_S)
                continue
            return self._check(reply, expect)

    def _check(self, reply: Any, expect: str | None) -> dict[str, Any]:
        if not isinstance(reply, dict):
            self._drop()
            raise ConnectionError(f"policy server {self._where()}: a reply that is not a map")
        kind = reply.get("type")
        if kind == "error":
            code, message = reply.get("code"), str(reply.get("message"))
            if code == "invalid_request":
                raise ValueError(message)
            self._drop()  # (the server closes the connection after every other error)
            raise ConnectionError(f"policy server {self._where()}: error {code}: {message}")
        if expect is not None and kind != expect:
            self._drop()
            raise ConnectionError(
                f"policy server {self._where()}: expected a {expect!r} reply, got {kind!r}"
            )
        return reply

    def _recv(self, sock: socket.socket) -> Any:
        (length,) = HEADER.unpack(_recv_exact(sock, HEADER.size))
        if length > self._max_frame_bytes:
            raise _Fatal(
                ConnectionError(
                    f"policy server {self._where()}: a frame of {length} bytes is over the "
                    f"client's limit of {self._max_frame_bytes}"
                )
            )
        return protocol.unpack(_recv_exact(sock, length))

    def _connect(self) -> None:
        """Connects, handshakes and starts the open episodes again (lock held)."""
        sock = socket.create_connection(self.address, timeout=_CONNECT_TIMEOUT_S)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            sock.sendall(
                protocol.encode_frame(
                    {
                        "type": "hello",
                        "protocol": PROTOCOL_VERSION,
                        "inference_mode": self.inference_mode,
                        "token": self._token,
                        "client": f"fastrollout.external.PolicyClient {protocol.package_version()}",
                    }
                )
            )
            welcome = self._recv(sock)
            if not isinstance(welcome, dict) or welcome.get("type") != "welcome":
                if isinstance(welcome, dict) and welcome.get("type") == "error":
                    raise _Fatal(
                        ConnectionError(
                            f"policy server {self._where()} refused the connection: "
                            f"{welcome.get('code')}: {welcome.get('message')}"
                        )
                    )
                raise _Fatal(ConnectionError(f"policy server {self._where()}: no welcome"))
            self._welcomed(welcome)
            sock.settimeout(self._timeout_s)
            for eid, training in list(self._server_open.items()):
                sock.sendall(
                    protocol.encode_frame(
                        {"type": "start_episode", "episode_id": eid, "training_enabled": training}
                    )
                )
                reply = self._recv(sock)
                if isinstance(reply, dict) and reply.get("type") == "error":
                    logger.warning(
                        "PolicyClient: episode %s not started again after reconnecting: %s",
                        eid,
                        reply.get("message"),
                    )
        except BaseException:
            sock.close()
            raise
        self._sock = sock
        logger.info("PolicyClient: connected to %s", self._where())

    def _welcomed(self, welcome: dict[str, Any]) -> None:
        try:
            multi_agent = bool(welcome["multi_agent"])
            obs = ValueSpace.from_wire(
                welcome["observation_space"], multi_agent, "observation_space"
            )
            actions = ValueSpace.from_wire(welcome["action_space"], multi_agent, "action_space")
        except (KeyError, ValueError) as err:
            raise _Fatal(
                ConnectionError(f"policy server {self._where()}: bad welcome: {err}")
            ) from None
        if self._obs is not None and (
            multi_agent != self.multi_agent or obs.space != self._obs.space
        ):
            raise _Fatal(
                ConnectionError(
                    f"policy server {self._where()}: the server came back with other spaces"
                )
            )
        self.server = str(welcome.get("server"))
        self.multi_agent = multi_agent
        self._obs, self._actions = obs, actions
        self.observation_space, self.action_space = obs.space, actions.space

    def _drop(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock = None

    def _where(self) -> str:
        return f"{self.address[0]}:{self.address[1]}"

    # -- local inference ---------------------------------------------------------------

    def _check_local(self, episode_id: str) -> None:
        if episode_id not in self._local_open:
            raise ValueError(f"Episode {episode_id} not found.")

    def _conform(self, space: ValueSpace | None, value: Any, what: str) -> Any:
        """A value checked against its space, as the server would (ValueError if outside)."""
        from fastrollout.env.external_env import conform_value

        assert space is not None
        return conform_value(value, what, space.of if space.multi_agent else space.space)

    def _local_get_action(self, episode_id: str, observation: Any) -> Any:
        self._check_local(episode_id)
        obs = self._conform(self._obs, observation, "observation")
        if self.update_interval is not None and (
            time.monotonic() - self._weights_time >= self.update_interval
        ):
            self._refresh_weights()
        action, extra = self._act(episode_id, obs)
        if extra and episode_id in self._stateless_episodes:
            extra = _without_state(extra, self.multi_agent)
        call = {
            "type": "log_action",
            "episode_id": episode_id,
            "observation": obs,
            "action": action,
        }
        if extra:
            call["extra"] = extra
        self._record(call)
        return action

    def _act(self, episode_id: str, obs: Any) -> tuple[Any, Any]:
        """The module's action (and its outputs for the step) for one observation.

        Args:
            episode_id: The episode (a stateful module's state is kept per episode and
                agent).
            obs: The observation (multi-agent: a dict agent id -> observation).

        Returns:
            The action and the outputs to log with it (None: none).
        """
        assert self._actions is not None
        if not self._modules:  # (no weights yet: the server's runner has not sampled)
            self._stateless_episodes.add(episode_id)
            if not self.multi_agent:
                return self._actions.space.sample(), None
            return {a: self._actions.of(a).sample() for a in obs}, None
        if not self.multi_agent:
            mid = self._single_module()
            actions, extras = self._forward(mid, [obs], [(episode_id, None)])
            return actions[0], extras[0]
        action, extra = {}, {}
        for mid, agents in self._agents_by_module(obs).items():
            slots = [(episode_id, a) for a in agents]
            actions, extras = self._forward(mid, [obs[a] for a in agents], slots)
            for a, act, ex in zip(agents, actions, extras, strict=True):
                action[a], extra[a] = act, ex
        return action, extra

    def _single_module(self) -> Any:
        return next(iter(self._modules)) if len(self._modules) == 1 else "default_policy"

    def _agents_by_module(self, obs: Mapping[Any, Any]) -> dict[Any, list[Any]]:
        by_module: dict[Any, list[Any]] = {}
        for aid in obs:
            by_module.setdefault(self._module_for(aid), []).append(aid)
        return by_module

    def _logged_states(self, episode_id: str, obs: Any) -> Any:
        """A logged step's ``STATE_OUT`` per stateful module's row (None: none to send).

        The stateful modules run on the step's observation, so their states advance as
        for an action of their own; the server records the state and goes on from it.
        """
        from fastrollout.core import Columns

        if episode_id in self._stateless_episodes:
            return None
        states = self._states
        if not self.multi_agent:
            mid = self._single_module()
            if mid not in states:
                return None
            _, extras = self._forward(mid, [obs], [(episode_id, None)])
            return {Columns.STATE_OUT: extras[0][Columns.STATE_OUT]}
        extra = {}
        for mid, agents in self._agents_by_module(obs).items():
            if mid not in states:
                continue
            slots = [(episode_id, a) for a in agents]
            _, extras = self._forward(mid, [obs[a] for a in agents], slots)
            for a, ex in zip(agents, extras, strict=True):
                extra[a] = {Columns.STATE_OUT: ex[Columns.STATE_OUT]}
        return extra or None

    def _forget_states(self, episode_id: str) -> None:
        """Drops an episode's states (its next start reads the initial state)."""
        self._stateless_episodes.discard(episode_id)
        if self._states:
            self._states.drop_where(lambda slot: slot[0] == episode_id)

    def _module_for(self, agent_id: str) -> Any:
        if self._policy_mapping_fn is not None:
            mid = self._policy_mapping_fn(agent_id)
        elif len(self._modules) == 1:
            mid = next(iter(self._modules))
        else:
            mid = agent_id
        if mid not in self._modules:
            raise ValueError(
                f"agent {agent_id!r} maps to module {mid!r}, which the server does not have "
                f"(its modules: {sorted(self._modules)})"
            )
        return mid

    def _forward(
        self, module_id: Any, observations: list[Any], slots: list[Any]
    ) -> tuple[list[Any], list[Any]]:
        """One exploring forward pass of a module on a batch of observations.

        A stateful module gets its rows' states as ``STATE_IN`` (a time axis of one step
        on every column, as the runner feeds it), and keeps each row's ``STATE_OUT``.

        Args:
            module_id: The module.
            observations: One observation per row.
            slots: The ``(episode id, agent id)`` of each row (its state's key).

        Returns:
            The actions for the env, one per row, and per row the module's
            ``action_logp`` and ``action_dist_inputs`` (those it outputs) and, for a
            stateful module, its ``STATE_OUT`` (numpy, nested as its state).
        """
        import torch

        from fastrollout.connectors.module_to_env.get_actions import add_actions
        from fastrollout.connectors.module_to_env.normalize_and_clip_actions import (
            unsquash_action,
        )
        from fastrollout.core import Columns

        module = self._modules[module_id]
        stacked = tree_map(lambda *rows: np.stack(rows), *observations)
        batch = {Columns.OBS: tree_map(torch.from_numpy, stacked)}
        states = self._states
        stateful = module_id in states
        if stateful:
            states.add_state_in({module_id: batch}, {module_id: slots})
        with torch.no_grad():
            out = dict(module.forward_exploration(batch))
            outputs = {module_id: out}
            if stateful:
                states.remove_time_axis(outputs)
                states.store(outputs, {module_id: slots})
            add_actions({module_id: module}, outputs, True, as_numpy=True)
        out = outputs[module_id]
        space = module.action_space
        actions = unsquash_action(tree_map(_numpy, out[Columns.ACTIONS]), space)
        # The runner records the logged action, the env's. Where that is not the module's
        # own (a bounded Box, unsquashed as the runner's default pipeline does), the
        # module's log-probability is of another action: left out, so that the runner
        # records its module's log-probability of the env's action, as for any
        # log_action.
        columns = (
            {}
            if _unsquashed(space)
            else {
                k: _numpy(out[k])
                for k in (Columns.ACTION_LOGP, Columns.ACTION_DIST_INPUTS)
                if k in out and not isinstance(out[k], (dict, tuple))
            }
        )
        rows = range(len(observations))
        extras = [{k: np.asarray(v[i]) for k, v in columns.items()} for i in rows]
        if stateful:
            state_out = tree_map(_numpy, out[Columns.STATE_OUT])
            for i, ex in enumerate(extras):
                ex[Columns.STATE_OUT] = take(state_out, i)
        return [take(actions, i) for i in rows], extras

    def _refresh_weights(self) -> None:
        reply = self._call(
            {"type": "get_weights", "weights_seq_no": self._weights_seq_no}, "weights"
        )
        self._weights_time = time.monotonic()
        modules, weights = reply.get("modules"), reply.get("weights")
        if modules is None or weights is None:
            return
        from fastrollout.modules import RLModuleSpec

        built = dict(self._modules)
        described = {mid: protocol.pack(d) for mid, d in modules.items()}
        # Other modules (not only other weights): the live states start over.
        rebuilt = described != self._module_descriptions
        for mid, description in modules.items():
            module = built.get(mid)
            if module is None or self._module_descriptions.get(mid) != described[mid]:
                spec = RLModuleSpec(
                    module_class=_import_class(description["class"]),
                    observation_space=protocol.space_from_wire(description["observation_space"]),
                    action_space=protocol.space_from_wire(description["action_space"]),
                    model_config=description.get("model_config"),
                )
                module = spec.build()
                module.eval()
            module.set_state(weights[mid])
            built[mid] = module
        self._modules = {mid: built[mid] for mid in modules}
        self._module_descriptions = described
        if rebuilt or self._states is None:
            from fastrollout.runners.recurrent_states import RecurrentStates

            self._states = RecurrentStates(self._modules)
        self._weights_seq_no = int(reply["weights_seq_no"])

    def _record(self, call: dict[str, Any]) -> None:
        self._calls.append(call)
        if len(self._calls) >= _CHUNK_CALLS or (
            self.update_interval is not None
            and time.monotonic() - self._calls_time >= self.update_interval
        ):
            self._flush()

    def _flush(self, retry: bool = True) -> None:
        """Sends the recorded calls as one ``log_experience`` request."""
        self._calls_time = time.monotonic()
        if not self._calls:
            return
        assert self._obs is not None and self._actions is not None
        calls, self._calls = self._calls, []
        wire = []
        for call in calls:
            kind = call["type"]
            if kind in ("log_action", "end_episode"):
                call = dict(call, observation=self._obs.encode(call["observation"]))
                if kind == "log_action":
                    call["action"] = self._actions.encode(call["action"])
            wire.append(call)
        try:
            self._call({"type": "log_experience", "calls": wire}, "ok", retry=retry)
        except ConnectionError:
            self._calls = calls + self._calls  # (kept: sent with the next flush)
            raise
        except ValueError:
            # A refused chunk: the calls before the refused one stay applied; the
            # server ends the episodes left open when this client closes.
            self._track(calls)
            raise
        self._track(calls)

    def _track(self, calls: list[dict[str, Any]]) -> None:
        """Keeps ``_server_open`` as the server knows the episodes after ``calls``."""
        for call in calls:
            if call["type"] == "start_episode":
                self._server_open[call["episode_id"]] = call["training_enabled"]
            elif call["type"] == "end_episode":
                self._server_open.pop(call["episode_id"], None)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            raise EOFError("the server closed the connection")
        got += k
    return bytes(buf)


def _reward(reward: Any, multi_agent: bool) -> Any:
    if multi_agent and isinstance(reward, Mapping):
        return {a: float(r) if _is_number(r) else r for a, r in reward.items()}
    return float(reward) if _is_number(reward) else reward


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(
        x, (bool, np.bool_)
    )


def _unsquashed(space: gym.Space[Any]) -> bool:
    """Whether ``unsquash_action`` changes actions of ``space`` (a Box bounded both ways)."""
    if isinstance(space, gym.spaces.Dict):
        return any(_unsquashed(s) for s in space.spaces.values())
    if isinstance(space, gym.spaces.Tuple):
        return any(_unsquashed(s) for s in space.spaces)
    return isinstance(space, gym.spaces.Box) and bool(space.is_bounded("both"))


def _without_state(extra: dict[str, Any], multi_agent: bool) -> dict[str, Any]:
    """A step's outputs without ``STATE_OUT`` (per agent, multi-agent)."""
    from fastrollout.core import Columns

    if multi_agent:
        return {
            a: {k: v for k, v in ex.items() if k != Columns.STATE_OUT} for a, ex in extra.items()
        }
    return {k: v for k, v in extra.items() if k != Columns.STATE_OUT}


def _numpy(x: Any) -> Any:
    return x.detach().cpu().numpy() if hasattr(x, "detach") else np.asarray(x)


def _import_class(path: str) -> type:
    """The class ``"package.module:ClassName"`` (an RLModule subclass)."""
    from fastrollout.modules import RLModule

    module_name, sep, qualname = str(path).partition(":")
    if not sep:
        raise ValueError(f"a module class is named 'package.module:ClassName', got {path!r}")
    obj: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    if not (isinstance(obj, type) and issubclass(obj, RLModule)):
        raise TypeError(f"{path!r} is not an RLModule subclass")
    return obj
