"""External simulators as sub-envs: the episodes of an ``ExternalEnv``, one per row.

An :class:`~fastrollout.env.external_env.ExternalEnv` has no ``step``: its simulator
threads (or a policy server's network clients) push observations and wait for actions.
This backend gives each running episode one of ``max_concurrent`` rows ("slots") of the
runner: an episode's first observation starts the slot's episode (a reset row), each
later one is a step, ``end_episode`` ends it. ``poll`` hands the runner the next
observation of every episode that has one, ``send`` answers them, and a slot is free
again once its episode ended. It is not lockstep: only the episodes that wait are in a
turn.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from fastrollout.core.tree import take
from fastrollout.env.external_env import ExternalEnv, ExternalEnvEpisode, ExternalEnvEvent
from fastrollout.runners.sub_envs.base import StepResults, SubEnvs

__all__ = ["ExternalSubEnvs"]

#: How often a waiting ``poll`` checks that the simulator's thread is still alive.
_LIVENESS_S = 0.1


class ExternalSubEnvs(SubEnvs):
    """The episodes of one ``ExternalEnv`` (or ``ExternalMultiAgentEnv``) as sub-envs.

    ``num_envs`` is the env's ``max_concurrent``; the runner's ``env`` is the
    ``ExternalEnv`` itself. The simulator's thread is started here if it was not (when
    the runner makes its env, before it samples).

    Args:
        env: The external env.
    """

    lockstep = False
    external = True

    def __init__(self, env: ExternalEnv) -> None:
        self._env = env
        self.multi_agent = bool(env.multi_agent)
        # Single-agent rows behave as gymnasium's next-step autoreset: the runner sends
        # an (ignored) action to a slot whose episode ended, which frees it.
        self.autoresets = not self.multi_agent
        self.num_envs = env.max_concurrent
        n = self.num_envs
        self._slots: list[ExternalEnvEpisode | None] = [None] * n
        self._free: list[int] = list(range(n - 1, -1, -1))
        # The event each slot's row came from, until the runner answers it.
        self._current: list[ExternalEnvEvent | None] = [None] * n
        if not self.multi_agent:
            from gymnasium.vector.utils import batch_space, create_empty_array

            self._obs_space = env.observation_space
            self._empty_obs = create_empty_array(self._obs_space, 0)
            self.observation_space = batch_space(env.observation_space, n)
            self.action_space = batch_space(env.action_space, n)
        # Started now, not at the first sample(): a server takes connections (and
        # handshakes) from the start, and simulators' requests wait for the runner.
        if env.ident is None:
            # run() through a guard that keeps its error for the runner to raise.
            env.run = env._run_guarded  # type: ignore[method-assign]
            env.start()

    @property
    def env(self) -> Any:
        """See :attr:`SubEnvs.env` (the ``ExternalEnv``)."""
        return self._env

    def sub_env(self, i: int) -> Any:
        """See :meth:`SubEnvs.sub_env` (the ``ExternalEnv`` for every slot)."""
        return self._env

    def agent_spaces(self, i: int) -> Any:
        """See :meth:`SubEnvs.agent_spaces`."""
        return self._env

    def fragment_envs(self) -> int:
        """Slots are not sub-envs: default sample sizes count one (RLlib's rule)."""
        return 1

    def trains(self, i: int) -> bool:
        """Whether slot ``i``'s episode is returned for training (``training_enabled``)."""
        episode = self._slots[i]
        return episode is None or episode.training_enabled

    # -- the runner's calls ----------------------------------------------------------

    def reset_all(self, seed: int | None) -> StepResults:
        """Nothing to reset: episodes start when the simulator starts them.

        Args:
            seed: Ignored (the simulator seeds itself).

        Returns:
            No resets: the first observation of each episode comes through ``poll``.
        """
        return self._results([], [], {})

    def send(self, env_ids: np.ndarray | None, actions: Any) -> None:
        """Answers the slots' events: actions go to the simulators that wait.

        Args:
            env_ids: The slots.
            actions: Single-agent: the actions batched; multi-agent: one dict per slot.
        """
        assert env_ids is not None, "external sub-envs are never sent a lockstep action"
        answers = []
        with self._env._cond:
            for j, i in enumerate(env_ids):
                event = self._current[i]
                episode = self._slots[i]
                if event is None or episode is None:
                    continue
                self._current[i] = None
                if event.last:
                    self._release(i)
                    continue
                if event.on_action is not None:
                    answers.append((event.on_action, j))
                self._answered(episode)
        for fn, j in answers:
            fn(actions[j] if self.multi_agent else take(actions, j))

    def logged_actions(self, env_ids: Sequence[int]) -> list[tuple[int, Any, Any]]:
        """The rows whose action the simulator took itself (``log_action``).

        Args:
            env_ids: The slots about to be sent actions, in the batch's order.

        Returns:
            ``(row in env_ids, action, the simulator's extra model outputs or None)``.
        """
        out = []
        for j, i in enumerate(env_ids):
            event = self._current[i]
            if event is not None and event.logged:
                out.append((j, event.action, event.extras))
        return out

    def poll(self, wait_s: float) -> StepResults:
        """The next observation of every episode that has one (blocks for the first).

        Args:
            wait_s: Once one is there, how long to wait for more (0: the env's
                ``batch_wait_s``); the wait ends early once every running episode has
                one.

        Returns:
            The rows; single-agent first observations are reset rows (their episode
            is new), multi-agent ones are in ``resets``.

        Once ``run()`` returned and every event was taken, no more can come: the results
        are empty and ``exhausted`` is set.

        Raises:
            BaseException: What the simulator's ``run()`` raised.
            RuntimeError: If the env was closed.
        """
        env = self._env
        rows: list[tuple[int, ExternalEnvEvent]] = []
        with env._cond:
            while not self._take(rows):
                if self._check_alive():
                    self.exhausted = True
                    return self._results([], [], {})
                env._wake_at = 1
                try:
                    env._cond.wait(_LIVENESS_S)
                finally:
                    env._wake_at = 0
            wait_s = wait_s if wait_s > 0 else env.batch_wait_s
            # The other running episodes: the wait ends when all of them wait too.
            others = len(env._episodes) - len(rows)
            if wait_s > 0 and others > len(env._deliverable):
                deadline = time.monotonic() + wait_s
                env._wake_at = others
                try:
                    while (left := deadline - time.monotonic()) > 0 and env._closed is None:
                        if len(env._deliverable) >= others:
                            break
                        env._cond.wait(left)
                finally:
                    env._wake_at = 0
                self._take(rows)
            return self._rows_to_results(rows)

    def reset(self, i: int, seed: int | None = None) -> tuple[Any, Any] | None:
        """Frees slot ``i`` (its episode ended); its next episode arrives via ``poll``.

        Args:
            i: The slot.
            seed: Ignored.

        Returns:
            None: the reset is "in flight" until an episode starts in the slot.
        """
        with self._env._cond:
            self._current[i] = None
            if self._slots[i] is not None:
                self._release(i)
        return None

    def recreate(self, i: int) -> None:
        """External episodes cannot be recreated.

        Raises:
            RuntimeError: Always.
        """
        raise RuntimeError("an ExternalEnv's episodes cannot be recreated")

    def close(self) -> None:
        """Closes the env; simulators still waiting for an action get an error."""
        env = self._env
        with env._cond:
            waiting = [e.on_action for e in self._current if e is not None and e.on_action]
            self._current = [None] * self.num_envs
        env.close()
        env._fail_waiting(waiting)

    # -- internals (the env's lock held) ---------------------------------------------

    def _take(self, rows: list[tuple[int, ExternalEnvEvent]]) -> bool:
        """Moves the next event of each deliverable episode into ``rows``."""
        env = self._env
        waiting = env._deliverable
        if not waiting:
            return bool(rows)
        keep = []
        while waiting:
            episode = waiting.popleft()
            if not episode.events or episode.with_runner:
                continue
            if episode.slot is None:
                if not self._free:
                    keep.append(episode)
                    continue
                episode.slot = self._free.pop()
                self._slots[episode.slot] = episode
            event = episode.events.popleft()
            episode.with_runner = True
            self._current[episode.slot] = event
            rows.append((episode.slot, event))
        waiting.extend(keep)
        return bool(rows)

    def _answered(self, episode: ExternalEnvEpisode) -> None:
        episode.with_runner = False
        if episode.events:
            self._env._deliverable.append(episode)

    def _release(self, i: int) -> None:
        episode = self._slots[i]
        self._slots[i] = None
        self._free.append(i)
        if episode is not None:
            episode.slot = None
            episode.with_runner = False
            if episode.events:
                # Ended and started again under its id: its new events wait for a slot.
                self._env._deliverable.append(episode)

    def _check_alive(self) -> bool:
        """Raises the simulator thread's error; True if its run() returned."""
        env = self._env
        env._check_open()
        if env._run_error is not None:
            err = env._run_error
            err.add_note(f"raised by {type(env).__name__}.run(), the simulator's thread")
            raise err
        # run() returned: once nothing is queued, nothing more can come.
        return env._run_done or (env.ident is not None and not env.is_alive())

    def _rows_to_results(self, rows: list[tuple[int, ExternalEnvEvent]]) -> StepResults:
        steps = []
        resets = []
        started: dict[int, str] = {}
        untrained = untrained_agents = 0
        for i, event in rows:
            episode = self._slots[i]
            assert episode is not None
            if event.first:
                started[i] = episode.id
                if self.multi_agent:
                    resets.append((i, event.observation, event.info))
                    continue
            elif not episode.training_enabled:
                untrained += 1
                if self.multi_agent:
                    untrained_agents += len(event.observation)
            steps.append((i, event))
        results = self._results(steps, resets, started)
        results.untrained_steps = untrained
        results.untrained_agent_steps = untrained_agents
        return results

    def _results(
        self,
        steps: list[tuple[int, ExternalEnvEvent]],
        resets: list[tuple[int, Any, Any]],
        started: Any,
    ) -> StepResults:
        ids = np.fromiter((i for i, _ in steps), np.int64, len(steps))
        if self.multi_agent:
            obs: Any = [e.observation for _, e in steps]
            rewards: Any = [e.reward for _, e in steps]
            terminateds: Any = [e.terminated for _, e in steps]
            truncateds: Any = [e.truncated for _, e in steps]
        else:
            from gymnasium.vector.utils import concatenate, create_empty_array

            m = len(steps)
            obs = (
                concatenate(
                    self._obs_space,
                    [e.observation for _, e in steps],
                    create_empty_array(self._obs_space, m),
                )
                if m
                else self._empty_obs
            )
            rewards = np.fromiter((0.0 if e.first else e.reward for _, e in steps), np.float64, m)
            terminateds = np.fromiter((e.terminated for _, e in steps), bool, m)
            truncateds = np.fromiter((e.truncated for _, e in steps), bool, m)
        results = StepResults(
            ids,
            obs,
            rewards,
            terminateds,
            truncateds,
            [e.info for _, e in steps],
            resets=resets,
        )
        results.episode_ids = started
        return results
