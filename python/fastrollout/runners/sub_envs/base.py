"""The interface every sub-env backend implements, and what its ``poll`` returns.

A runner steps ``num_envs`` sub-envs through one backend. Per loop turn it sends actions
to the sub-envs that wait for one (``send``), then collects the sub-envs whose step has
finished (``poll``). Lockstep backends (in-process vector envs, gymnasium's
``AsyncVectorEnv``, the list of multi-agent envs) step every sub-env per turn and return
them all; the remote backend returns whichever are ready, so a slow sub-env does not stall
the fast ones.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

import numpy as np

__all__ = ["StepResults", "SubEnvs"]

_NONE_FAILED: Mapping[int, BaseException] = MappingProxyType({})
_NO_IDS: Mapping[int, str] = MappingProxyType({})


class StepResults:
    """What ``SubEnvs.poll`` collected: finished steps, finished resets and failures.

    Attributes:
        env_ids: The sub-env of each step row, or None: every sub-env, in order.
        observations: Single-agent: the rows batched (gymnasium's vector layout);
            multi-agent: one per-agent dict per row.
        rewards: As ``observations`` (an array of floats; per-agent dicts).
        terminateds: As ``rewards`` (bools; per-agent dicts with ``"__all__"``).
        truncateds: As ``terminateds``.
        infos: Single-agent: gymnasium's vector-info dict or a list of dicts;
            multi-agent: a list of per-agent dicts.
        resets: Resets that finished: ``(sub-env, observation, infos)``.
        failed: Sub-env -> the error of its step or reset (its row, if it has one, holds
            no step). Rows of failed sub-envs stay in the batches of lockstep backends.
        episode_ids: Sub-env -> the id of the episode its row (or reset) starts, where the
            backend names its episodes (external simulators).
        untrained_steps: Step rows of episodes not returned for training (counted in
            metrics, not toward ``num_timesteps``).
        untrained_agent_steps: Their agents' observations (multi-agent).
    """

    __slots__ = (
        "env_ids",
        "episode_ids",
        "failed",
        "infos",
        "observations",
        "resets",
        "rewards",
        "terminateds",
        "truncateds",
        "untrained_agent_steps",
        "untrained_steps",
    )

    def __init__(
        self,
        env_ids: np.ndarray | None,
        observations: Any,
        rewards: Any,
        terminateds: Any,
        truncateds: Any,
        infos: Any,
        *,
        resets: Sequence[tuple[int, Any, Any]] = (),
        failed: Mapping[int, BaseException] = _NONE_FAILED,
    ) -> None:
        # The empty defaults are shared (a lockstep step makes one StepResults and nothing
        # writes to them): no new objects per step.
        self.env_ids = env_ids
        self.observations = observations
        self.rewards = rewards
        self.terminateds = terminateds
        self.truncateds = truncateds
        self.infos = infos
        self.resets = resets
        self.failed = failed
        self.episode_ids = _NO_IDS
        self.untrained_steps = 0
        self.untrained_agent_steps = 0


class SubEnvs(abc.ABC):
    """N sub-envs a runner steps: send actions, poll results, reset, recreate, close.

    Attributes:
        num_envs: The number of sub-envs.
        lockstep: Every ``send`` names all sub-envs and every ``poll`` returns them all.
        autoresets: A sub-env whose episode ended resets on its next ``send`` (its action
            is ignored and its row is the reset; gymnasium's next-step autoreset); else
            the runner calls ``reset``.
        multi_agent: The sub-envs are ``MultiAgentEnv`` objects.
        external: The sub-envs are the episodes of external simulators
            (``ExternalEnv``): they cannot be reset by the runner, may not be returned for
            training (``trains``), and may come with the action already taken
            (``logged_actions``).
        exhausted: No sub-env will ever have a step again (an external simulator's
            ``run()`` returned): the runner returns what it sampled.
    """

    num_envs: int
    lockstep: bool = True
    autoresets: bool = False
    multi_agent: bool = False
    external: bool = False
    exhausted: bool = False

    @property
    def steps_subsets(self) -> bool:
        """Whether ``send`` may name some of the sub-envs only (True but for lockstep ones)."""
        return not self.lockstep

    def fragment_envs(self) -> int:
        """The sub-envs a ``sample()`` without counts sizes its batch by (``num_envs``)."""
        return self.num_envs

    def trains(self, i: int) -> bool:
        """Whether sub-env ``i``'s episode is returned for training (always, here)."""
        return True

    def logged_actions(self, env_ids: Sequence[int]) -> list[tuple[int, Any, Any]]:
        """Rows of ``env_ids`` whose action was already taken (none, here).

        Returns:
            ``(row, action, extra model outputs or None)`` per such row.
        """
        return []

    @property
    @abc.abstractmethod
    def env(self) -> Any:
        """What the runner exposes as ``runner.env`` (the vector env, the env list, ...)."""

    @abc.abstractmethod
    def reset_all(self, seed: int | None) -> StepResults:
        """Resets every sub-env (sub-env i with ``seed + i``) and waits for them.

        Args:
            seed: The base seed, or None.

        Returns:
            The resets, in ``StepResults.resets`` (failures in ``failed``).
        """

    @abc.abstractmethod
    def send(self, env_ids: np.ndarray | None, actions: Any) -> None:
        """Starts a step of the given sub-envs.

        Args:
            env_ids: The sub-envs (None: all, in order).
            actions: Single-agent: the actions batched, one row per sub-env of
                ``env_ids``; multi-agent: one per-agent action dict per sub-env.
        """

    @abc.abstractmethod
    def poll(self, wait_s: float) -> StepResults:
        """Collects sub-envs whose step (or reset) finished.

        Blocks until at least one has finished (if any is in flight), then waits up to
        ``wait_s`` more for others.

        Args:
            wait_s: How long to wait for more sub-envs once one is ready.

        Returns:
            The finished steps, resets and failures.
        """

    @abc.abstractmethod
    def reset(self, i: int, seed: int | None = None) -> tuple[Any, Any] | None:
        """Resets sub-env ``i``.

        Args:
            i: The sub-env.
            seed: Its seed, or None.

        Returns:
            ``(observation, infos)`` when the reset finished in this call; None when it
            is in flight (a later ``poll`` returns it).

        Raises:
            Exception: What the sub-env's reset raised (in-process backends).
        """

    @abc.abstractmethod
    def recreate(self, i: int) -> None:
        """Replaces sub-env ``i`` with a new one (not reset yet).

        Args:
            i: The sub-env.

        Raises:
            Exception: What creating it raised (the env check included).
        """

    @abc.abstractmethod
    def close(self) -> None:
        """Closes every sub-env."""

    def sub_env(self, i: int) -> Any:
        """Sub-env ``i`` itself (in-process backends), for callbacks and ``foreach_env``.

        Args:
            i: The sub-env.

        Returns:
            The env, or None where it lives in another process.
        """
        return None

    def agent_spaces(self, i: int) -> Any:
        """Multi-agent sub-env ``i``'s agents and spaces.

        Args:
            i: The sub-env.

        Returns:
            An object with ``possible_agents``, ``get_observation_space(agent)`` and
            ``get_action_space(agent)`` (the env itself, unwrapped, in this process).
        """
        return self.sub_env(i).unwrapped
