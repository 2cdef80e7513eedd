"""Sub-envs in Ray actors, stepped as they become ready (dynamic batching).

Each sub-env lives in its own actor (``num_cpus=0`` by default, as RLlib's remote
sub-envs). ``send`` starts a step on some actors; ``poll`` waits until at least one step
has finished, then up to ``remote_env_batch_wait_ms`` for more, and returns whichever
finished: the runner acts for exactly those in one forward pass, so a slow sub-env no
longer holds back the fast ones. A step that raises, an actor that dies, and a step that
takes longer than ``step_timeout_s`` are reported as that sub-env's failure.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from fastrollout.runners.sub_envs.base import StepResults, SubEnvs

__all__ = ["RemoteSubEnvs", "SubEnvHost"]

# Added to the step timeout for an actor's first call (its process starting).
_STARTUP_ALLOWANCE_S = 60.0


class SubEnvHost:
    """The body of one sub-env actor.

    A single-agent host resets its env on the first ``step`` after its episode ended, or
    after it was created (gymnasium's next-step autoreset: the action is then ignored),
    so the runner treats it as any vector env. A multi-agent host is reset by the runner.

    Args:
        creator: ``creator(vector_index) -> env``.
        index: The sub-env's vector index.
        autoreset: Reset on the next step as described above (single-agent).
    """

    def __init__(self, creator: Callable[[int], Any], index: int, autoreset: bool) -> None:
        self.env = creator(index)
        self._autoreset = autoreset
        self._needs_reset = autoreset

    def spaces(self) -> dict[str, Any]:
        """The env's spaces (and, multi-agent, its agents and their spaces).

        Returns:
            ``{"observation_space", "action_space"}``, plus ``"possible_agents"``,
            ``"agent_observation_spaces"`` and ``"agent_action_spaces"`` for a
            ``MultiAgentEnv``.
        """
        env = self.env.unwrapped
        out = {
            "observation_space": self.env.observation_space,
            "action_space": self.env.action_space,
        }
        if hasattr(env, "possible_agents") and hasattr(env, "get_observation_space"):
            agents = list(env.possible_agents)
            out["possible_agents"] = agents
            out["agent_observation_spaces"] = {a: env.get_observation_space(a) for a in agents}
            out["agent_action_spaces"] = {a: env.get_action_space(a) for a in agents}
        return out

    def reset(self, seed: int | None) -> tuple[Any, Any]:
        """Resets the env.

        Args:
            seed: The seed, or None.

        Returns:
            ``(observation, infos)``.
        """
        obs, infos = self.env.reset(seed=seed)
        self._needs_reset = False
        return obs, infos

    def step(self, action: Any) -> tuple[Any, ...]:
        """Steps the env (or resets it, see the class).

        Args:
            action: The action (a per-agent dict for a ``MultiAgentEnv``).

        Returns:
            ``(observation, reward, terminated, truncated, infos)``.
        """
        if self._needs_reset:
            obs, infos = self.reset(None)
            return obs, 0.0, False, False, infos
        obs, reward, terminated, truncated, infos = self.env.step(action)
        if self._autoreset and (terminated or truncated):
            self._needs_reset = True
        return obs, reward, terminated, truncated, infos

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Runs ``fn(env, *args)`` in the actor (``foreach_env``).

        Args:
            fn: The function.
            *args: More arguments.

        Returns:
            Its result.
        """
        return fn(self.env, *args)

    def close(self) -> None:
        """Closes the env."""
        self.env.close()


class _AgentSpaces:
    """A multi-agent sub-env's agents and spaces, read from its actor once."""

    def __init__(self, spaces: dict[str, Any]) -> None:
        self.observation_space = spaces["observation_space"]
        self.action_space = spaces["action_space"]
        self.possible_agents = spaces.get("possible_agents", [])
        self._obs = spaces.get("agent_observation_spaces", {})
        self._act = spaces.get("agent_action_spaces", {})

    @property
    def unwrapped(self) -> _AgentSpaces:
        return self

    def get_observation_space(self, agent_id: Any) -> Any:
        return self._obs[agent_id]

    def get_action_space(self, agent_id: Any) -> Any:
        return self._act[agent_id]


class RemoteSubEnvs(SubEnvs):
    """``num_envs`` sub-envs, each in a Ray actor, stepped as they become ready.

    For a single-agent env this object is the runner's ``env``: it has the vector env's
    ``single_observation_space``/``single_action_space``, their batched forms and
    ``num_envs``.

    Args:
        creator: ``creator(vector_index) -> env`` (pickled to the actors).
        num_envs: The number of sub-envs.
        multi_agent: The env is a ``MultiAgentEnv``.
        step_timeout_s: A step or reset that takes longer fails its sub-env (its actor is
            ended); None: no limit.

    Raises:
        ImportError: If ray is not installed (naming the extra).
        Exception: What creating sub-env 0 raised (its spaces are read from it).
    """

    lockstep = False

    def __init__(
        self,
        creator: Callable[[int], Any],
        num_envs: int,
        *,
        multi_agent: bool,
        step_timeout_s: float | None = None,
    ) -> None:
        from fastrollout.runners.ray_host import require_ray

        ray = require_ray("remote_worker_envs")
        self._ray = ray
        self.multi_agent = multi_agent
        self.autoresets = not multi_agent
        self.num_envs = num_envs
        self._creator = creator
        self._step_timeout_s = step_timeout_s
        # No CPU reserved, as RLlib's remote sub-envs: they share the runner's.
        self._actor_cls = ray.remote(num_cpus=0, max_restarts=0)(SubEnvHost)
        # Sub-envs whose actor has not answered a call yet (see _deadline).
        self._starting: set[int] = set(range(num_envs))
        self._actors = [self._new_actor(i) for i in range(num_envs)]
        # ObjectRef -> (sub-env, "step" | "reset", deadline or None).
        self._inflight: dict[Any, tuple[int, str, float | None]] = {}
        self._agent_spaces: list[_AgentSpaces | None] = [None] * num_envs
        spaces = ray.get(self._actors[0].spaces.remote())
        if multi_agent:
            self._agent_spaces[0] = _AgentSpaces(spaces)
        else:
            from gymnasium.vector.utils import batch_space

            self.single_observation_space = spaces["observation_space"]
            self.single_action_space = spaces["action_space"]
            self.observation_space = batch_space(self.single_observation_space, num_envs)
            self.action_space = batch_space(self.single_action_space, num_envs)

    def _new_actor(self, i: int) -> Any:
        return self._actor_cls.remote(self._creator, i, not self.multi_agent)

    @property
    def env(self) -> Any:
        """See :attr:`SubEnvs.env`."""
        return (
            self if not self.multi_agent else [self.agent_spaces(i) for i in range(self.num_envs)]
        )

    @property
    def unwrapped(self) -> RemoteSubEnvs:
        """The object itself (as a vector env's ``unwrapped``)."""
        return self

    def get_sub_environments(self) -> list[Any]:
        """The sub-envs' actor handles (as RLlib's remote envs).

        Returns:
            One actor handle per sub-env.
        """
        return list(self._actors)

    def agent_spaces(self, i: int) -> _AgentSpaces:
        """Multi-agent sub-env ``i``'s agents and spaces (read from its actor once).

        Args:
            i: The sub-env.

        Returns:
            An object with ``possible_agents``, ``get_observation_space(agent)`` and
            ``get_action_space(agent)``.
        """
        spaces = self._agent_spaces[i]
        if spaces is None:
            spaces = self._agent_spaces[i] = _AgentSpaces(
                self._ray.get(self._actors[i].spaces.remote())
            )
        return spaces

    def _deadline(self, i: int | None = None) -> float | None:
        if self._step_timeout_s is None:
            return None
        allowance = 0.0
        if i is not None and i in self._starting:
            # An actor's first call also waits for its process to start and import its
            # env (seconds, with torch): that is not the step timing out.
            self._starting.discard(i)
            allowance = _STARTUP_ALLOWANCE_S
        return time.monotonic() + self._step_timeout_s + allowance

    def reset_all(self, seed: int | None) -> StepResults:
        """See :meth:`SubEnvs.reset_all`."""
        self._inflight.clear()
        refs = [
            a.reset.remote(None if seed is None else seed + i) for i, a in enumerate(self._actors)
        ]
        timeout = None
        if self._step_timeout_s is not None:
            timeout = self._step_timeout_s + (_STARTUP_ALLOWANCE_S if self._starting else 0.0)
        self._starting.clear()
        resets: list[tuple[int, Any, Any]] = []
        failed: dict[int, BaseException] = {}
        for i, ref in enumerate(refs):
            try:
                obs, infos = self._ray.get(ref, timeout=timeout)
            except Exception as err:
                failed[i] = _cause(err, i, self._step_timeout_s)
                continue
            resets.append((i, obs, infos))
        return StepResults(None, [], [], [], [], [], resets=resets, failed=failed)

    def send(self, env_ids: np.ndarray | None, actions: Any) -> None:
        """See :meth:`SubEnvs.send`."""
        ids = range(self.num_envs) if env_ids is None else env_ids
        if self.multi_agent:
            for j, i in enumerate(ids):
                ref = self._actors[i].step.remote(actions[j])
                self._inflight[ref] = (int(i), "step", self._deadline(int(i)))
            return
        from gymnasium.vector.utils import iterate

        for i, action in zip(ids, iterate(self.action_space, actions), strict=False):
            self._inflight[self._actors[i].step.remote(action)] = (
                int(i),
                "step",
                self._deadline(int(i)),
            )

    def poll(self, wait_s: float) -> StepResults:
        """See :meth:`SubEnvs.poll`."""
        ray = self._ray
        refs = list(self._inflight)
        ready: list[Any] = []
        failed: dict[int, BaseException] = {}
        if refs:
            deadlines = [d for _, _, d in self._inflight.values() if d is not None]
            timeout = None if not deadlines else max(0.0, min(deadlines) - time.monotonic())
            ready, rest = ray.wait(refs, num_returns=1, timeout=timeout)
            if rest:
                # The others that are ready now, or become so within the batch wait.
                more, _ = ray.wait(rest, num_returns=len(rest), timeout=wait_s if ready else 0)
                ready += more
            if not ready:
                self._time_out(failed)
        ids: list[int] = []
        rows: list[Any] = []
        resets: list[tuple[int, Any, Any]] = []
        sent = [self._inflight.pop(ref) for ref in ready]
        try:
            # One call for all (a call per result cost a tenth of a step here).
            values = ray.get(ready)
        except Exception:
            values = [_get_or_error(ray, ref) for ref in ready]
        for (i, kind, _), value in zip(sent, values, strict=True):
            if isinstance(value, _Failed):
                failed[i] = _cause(value.error, i, None)
            elif kind == "reset":
                resets.append((i, value[0], value[1]))
            else:
                ids.append(i)
                rows.append(value)
        return self._results(ids, rows, resets, failed)

    def _time_out(self, failed: dict[int, BaseException]) -> None:
        """Fails every sub-env whose step is past its deadline (and ends its actor)."""
        now = time.monotonic()
        for ref, (i, kind, deadline) in list(self._inflight.items()):
            if deadline is not None and deadline <= now:
                del self._inflight[ref]
                failed[i] = TimeoutError(
                    f"sub-env {i}: its {kind} took longer than {self._step_timeout_s} s "
                    "(step_timeout_s)"
                )
                self._ray.kill(self._actors[i], no_restart=True)

    def _results(
        self,
        ids: list[int],
        rows: list[Any],
        resets: list[tuple[int, Any, Any]],
        failed: dict[int, BaseException],
    ) -> StepResults:
        env_ids = np.asarray(ids, np.int64)
        if self.multi_agent:
            cols: list[list[Any]] = [list(c) for c in zip(*rows, strict=True)] if rows else [[]] * 5
            return StepResults(env_ids, *cols, resets=resets, failed=failed)
        from gymnasium.vector.utils import concatenate, create_empty_array

        space = self.single_observation_space
        out = create_empty_array(space, len(rows))
        obs = concatenate(space, [r[0] for r in rows], out) if rows else out
        return StepResults(
            env_ids,
            obs,
            np.array([r[1] for r in rows], np.float64),
            np.array([r[2] for r in rows], bool),
            np.array([r[3] for r in rows], bool),
            [r[4] for r in rows],
            resets=resets,
            failed=failed,
        )

    def reset(self, i: int, seed: int | None = None) -> None:
        """See :meth:`SubEnvs.reset`."""
        self._inflight[self._actors[i].reset.remote(seed)] = (i, "reset", self._deadline(i))

    def recreate(self, i: int) -> None:
        """See :meth:`SubEnvs.recreate`."""
        for ref in [r for r, (j, _, _) in self._inflight.items() if j == i]:
            del self._inflight[ref]
        self._ray.kill(self._actors[i], no_restart=True)
        # Its agents and spaces stay those read before: the same env, made again.
        self._actors[i] = self._new_actor(i)
        self._starting.add(i)

    def close(self) -> None:
        """See :meth:`SubEnvs.close`."""
        for actor in self._actors:
            try:
                self._ray.kill(actor, no_restart=True)
            except Exception:
                continue
        self._inflight.clear()


class _Failed:
    """A call's error, in place of its result."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


def _get_or_error(ray: Any, ref: Any) -> Any:
    try:
        return ray.get(ref)
    except Exception as err:
        return _Failed(err)


def _cause(err: BaseException, i: int, timeout_s: float | None) -> BaseException:
    """The sub-env's own error inside Ray's wrapper (or what Ray says happened)."""
    cause = getattr(err, "cause", None)
    if isinstance(cause, BaseException):
        return cause
    if type(err).__name__ == "GetTimeoutError":
        return TimeoutError(f"sub-env {i}: its reset took longer than {timeout_s} s")
    return err
