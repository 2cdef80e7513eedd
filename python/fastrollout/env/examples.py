"""Small deterministic environments for tests and benchmarks.

Every env here takes a config dict (or ``EnvContext``) as its only constructor argument, so
its class can be passed as ``RunnerConfig.environment(env=Class, env_config={...})``.
Rewards are exact (sums of small binary fractions) so tests can compare returns with
``==``.

- :class:`TurnBasedEnv`: two players take turns; only the mover observes and acts; the
  other player's rewards hang until its next turn.
- :class:`JoinLeaveEnv`: agents join one after another and leave after a fixed lifetime.
- :class:`HangingRewardsEnv`: one agent acts every step, the other every ``period`` steps
  while receiving rewards every step.
- :class:`SyntheticImageEnv`: a single-agent env with Atari-sized (84, 84, 4) uint8
  observations that costs almost nothing to step.
- :class:`SlowEnv`: a single-agent env whose steps take a set time, by sub-env (slow
  simulators of different speeds).
- :class:`StatelessCartPole`: CartPole without the two velocities, which a policy must
  infer from the positions it saw before (a task for recurrent modules).
- :class:`CrashingEnv` / :class:`CrashingMultiAgentEnv`: wrappers that raise
  :class:`EnvCrash` on ``reset``/``step`` by schedule or with a seeded probability, and
  tag infos with an id of the env instance.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Collection, Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from fastrollout.env.multi_agent_env import ALL, MultiAgentDict, MultiAgentEnv

__all__ = [
    "CrashingEnv",
    "CrashingMultiAgentEnv",
    "EnvCrash",
    "HangingRewardsEnv",
    "JoinLeaveEnv",
    "SlowEnv",
    "StatelessCartPole",
    "SyntheticImageEnv",
    "TurnBasedEnv",
]

StepResult = tuple[MultiAgentDict, MultiAgentDict, MultiAgentDict, MultiAgentDict, MultiAgentDict]


def _int_option(config: Mapping[str, Any], key: str, default: int, minimum: int) -> int:
    value = config.get(key, default)
    if not isinstance(value, int | np.integer) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"config[{key!r}] must be an int >= {minimum}, got {value!r}")
    return int(value)


class TurnBasedEnv(MultiAgentEnv):
    """Two players, ``"player_0"`` and ``"player_1"``, take turns; only the mover acts.

    Turn ``k`` (0-based) belongs to ``player_{k % 2}``. The mover observes
    ``[k, own previous action, opponent's previous action]`` (float32; -1 for none yet) and
    picks 0 or 1. It gets reward 1.0 if its action equals ``(k // 2) % 2`` and 0.0
    otherwise; in the same step the waiting player gets -0.25 (which hangs until that
    player's next observation), except on turn 0, before ``player_1`` first observes (so no
    reward ever precedes an agent's first observation). After ``num_turns`` turns (config,
    default 10) both players observe once more and the episode terminates.

    Args:
        config: Optional ``{"num_turns": int >= 1}``.
    """

    PLAYERS = ("player_0", "player_1")

    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        self.num_turns = _int_option(config or {}, "num_turns", 10, 1)
        self.possible_agents = list(self.PLAYERS)
        self.agents = list(self.PLAYERS)
        space = gym.spaces.Box(-1.0, float(self.num_turns), (3,), np.float32)
        self.observation_spaces = dict.fromkeys(self.PLAYERS, space)
        self.action_spaces = {p: gym.spaces.Discrete(2) for p in self.PLAYERS}
        self._turn = 0
        self._last = {p: -1 for p in self.PLAYERS}

    def _obs(self, player: str) -> np.ndarray:
        other = self.PLAYERS[1 - self.PLAYERS.index(player)]
        return np.array([self._turn, self._last[player], self._last[other]], np.float32)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[MultiAgentDict, MultiAgentDict]:
        """Starts a game; ``player_0`` moves first.

        Args:
            seed: Unused (the env is deterministic); accepted for the API.
            options: Unused.

        Returns:
            ``({"player_0": obs}, {"player_0": {}})``.
        """
        super().reset(seed=seed, options=options)
        self._turn = 0
        self._last = {p: -1 for p in self.PLAYERS}
        self.agents = list(self.PLAYERS)
        return {"player_0": self._obs("player_0")}, {"player_0": {}}

    def step(self, action_dict: MultiAgentDict) -> StepResult:  # type: ignore[override]
        """Applies the mover's action.

        Args:
            action_dict: ``{mover: 0 or 1}``.

        Returns:
            The next mover's observation (both players' at the end), both players'
            rewards, and the flags.

        Raises:
            ValueError: The action is not for the mover alone, or not 0/1, or the game is
                over.
        """
        if self._turn >= self.num_turns:
            raise ValueError("TurnBasedEnv: step() after the game ended; call reset()")
        mover = self.PLAYERS[self._turn % 2]
        if set(action_dict) != {mover}:
            raise ValueError(
                f"TurnBasedEnv: turn {self._turn} belongs to {mover!r}; got actions for "
                f"{list(action_dict)}"
            )
        action = int(action_dict[mover])
        if action not in (0, 1):
            raise ValueError(f"TurnBasedEnv: action of {mover!r} must be 0 or 1, got {action}")
        waiting = self.PLAYERS[1 - self._turn % 2]
        reward = 1.0 if action == (self._turn // 2) % 2 else 0.0
        rewards = {mover: reward}
        if self._turn > 0:
            rewards[waiting] = -0.25
        self._last[mover] = action
        self._turn += 1
        if self._turn == self.num_turns:
            self.agents = []
            obs = {p: self._obs(p) for p in self.PLAYERS}
            flags = dict.fromkeys(self.PLAYERS, True)
            return obs, rewards, {**flags, ALL: True}, {ALL: False}, {p: {} for p in obs}
        nxt = waiting
        return {nxt: self._obs(nxt)}, rewards, {ALL: False}, {ALL: False}, {nxt: {}}


class JoinLeaveEnv(MultiAgentEnv):
    """Agents ``"agent_0"``..``"agent_{n-1}"`` join one by one and leave after a fixed lifetime.

    Agent ``i`` observes first at env step ``i * stagger`` (step 0 being the reset), acts
    ``lifetime`` times, and is terminated by the step of its last action (with a last
    observation). The episode ends when the last agent leaves. An agent observes
    ``[its age, env step]`` (float32) and gets reward ``1.0 + action`` for each of its
    actions (Discrete(2)), so its return is ``lifetime + sum(actions)``.

    Args:
        config: Optional ``{"num_agents": int >= 1 (default 3), "lifetime": int >= 1
            (default 4), "stagger": int in [1, lifetime] (default 2)}``.
    """

    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        config = config or {}
        self.num = _int_option(config, "num_agents", 3, 1)
        self.lifetime = _int_option(config, "lifetime", 4, 1)
        self.stagger = _int_option(config, "stagger", 2, 1)
        if self.stagger > self.lifetime:
            # Otherwise the env has steps with no live agent to act.
            raise ValueError(
                f"JoinLeaveEnv: stagger ({self.stagger}) must be <= lifetime ({self.lifetime})"
            )
        self.possible_agents = [f"agent_{i}" for i in range(self.num)]
        self.agents = []
        horizon = float(self.stagger * self.num + self.lifetime)
        space = gym.spaces.Box(0.0, horizon, (2,), np.float32)
        self.observation_spaces = dict.fromkeys(self.possible_agents, space)
        self.action_spaces = {a: gym.spaces.Discrete(2) for a in self.possible_agents}
        self._t = 0
        self._age: dict[str, int] = {}

    def _joining(self) -> list[str]:
        return [f"agent_{i}" for i in range(self.num) if i * self.stagger == self._t]

    def _obs(self, agent: str) -> np.ndarray:
        return np.array([self._age[agent], self._t], np.float32)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[MultiAgentDict, MultiAgentDict]:
        """Starts an episode with the agents that join at step 0.

        Args:
            seed: Unused (deterministic env).
            options: Unused.

        Returns:
            Observations and infos of the first agents.
        """
        super().reset(seed=seed, options=options)
        self._t = 0
        self._age = {}
        self.agents = self._joining()
        for a in self.agents:
            self._age[a] = 0
        return {a: self._obs(a) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, action_dict: MultiAgentDict) -> StepResult:  # type: ignore[override]
        """Steps every live agent.

        Args:
            action_dict: An action (0 or 1) for every live agent.

        Returns:
            Observations of the live and joining agents, rewards of the agents that
            acted, and flags (leaving agents terminated).

        Raises:
            ValueError: Actions missing for live agents or given for others, or the
                episode is over.
        """
        if not self.agents:
            raise ValueError("JoinLeaveEnv: step() with no live agent; call reset()")
        if set(action_dict) != set(self.agents):
            raise ValueError(
                f"JoinLeaveEnv: expected actions for {self.agents}, got {list(action_dict)}"
            )
        self._t += 1
        obs: MultiAgentDict = {}
        rewards: MultiAgentDict = {}
        terminateds: MultiAgentDict = {}
        infos: MultiAgentDict = {}
        staying = []
        for a in self.agents:
            rewards[a] = 1.0 + float(int(action_dict[a]))
            self._age[a] += 1
            obs[a], infos[a] = self._obs(a), {}
            if self._age[a] >= self.lifetime:
                terminateds[a] = True
            else:
                staying.append(a)
        for a in self._joining():
            self._age[a] = 0
            obs[a], infos[a] = self._obs(a), {}
            staying.append(a)
        self.agents = staying
        joined_all = self._t >= (self.num - 1) * self.stagger
        terminateds[ALL] = joined_all and not staying
        return obs, rewards, terminateds, {ALL: False}, infos


class HangingRewardsEnv(MultiAgentEnv):
    """Agent ``"fast"`` acts every step, ``"slow"`` every ``period`` steps, both rewarded each step.

    At env step ``t`` (1-based, counting steps) ``fast`` gets reward 1.0 and ``slow`` gets
    ``0.5 * t``, whether or not ``slow`` acted; ``slow``'s rewards hang and add up until its
    next observation. Both observe ``[t]`` (float32) at reset. ``slow`` observes again after
    steps ``period``, ``2 * period``, ...; after ``episode_len`` steps both observe and the
    episode terminates. Returns: ``fast`` gets ``episode_len``; ``slow`` gets
    ``0.5 * episode_len * (episode_len + 1) / 2``. Actions are Discrete(2) and do not
    matter.

    Args:
        config: Optional ``{"period": int >= 1 (default 3), "episode_len": int >= 1
            (default 10)}``.
    """

    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        config = config or {}
        self.period = _int_option(config, "period", 3, 1)
        self.episode_len = _int_option(config, "episode_len", 10, 1)
        self.possible_agents = ["fast", "slow"]
        self.agents = list(self.possible_agents)
        space = gym.spaces.Box(0.0, float(self.episode_len), (1,), np.float32)
        self.observation_spaces = dict.fromkeys(self.possible_agents, space)
        self.action_spaces = {a: gym.spaces.Discrete(2) for a in self.possible_agents}
        self._t = 0
        self._acting = list(self.possible_agents)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[MultiAgentDict, MultiAgentDict]:
        """Starts an episode; both agents observe.

        Args:
            seed: Unused (deterministic env).
            options: Unused.

        Returns:
            Both agents' observations and infos.
        """
        super().reset(seed=seed, options=options)
        self._t = 0
        self.agents = list(self.possible_agents)
        self._acting = list(self.possible_agents)
        obs = np.zeros(1, np.float32)
        return {a: obs.copy() for a in self._acting}, {a: {} for a in self._acting}

    def step(self, action_dict: MultiAgentDict) -> StepResult:  # type: ignore[override]
        """Steps the acting agents and rewards both.

        Args:
            action_dict: Actions for exactly the agents that observed last.

        Returns:
            Observations for the agents that act next, rewards for both, flags.

        Raises:
            ValueError: Actions for the wrong agents, or a step after the end.
        """
        if self._t >= self.episode_len:
            raise ValueError("HangingRewardsEnv: step() after the episode ended")
        if set(action_dict) != set(self._acting):
            raise ValueError(
                f"HangingRewardsEnv: expected actions for {self._acting}, got {list(action_dict)}"
            )
        self._t += 1
        rewards = {"fast": 1.0, "slow": 0.5 * self._t}
        done = self._t == self.episode_len
        self._acting = ["fast", "slow"] if done or self._t % self.period == 0 else ["fast"]
        obs = {a: np.array([self._t], np.float32) for a in self._acting}
        if done:
            self.agents = []
            return (
                obs,
                rewards,
                {"fast": True, "slow": True, ALL: True},
                {ALL: False},
                {a: {} for a in obs},
            )
        return obs, rewards, {ALL: False}, {ALL: False}, {a: {} for a in obs}


class SyntheticImageEnv(gym.Env[np.ndarray, np.int64]):
    """A single-agent env with (84, 84, 4) uint8 observations that costs almost nothing to step.

    Observations cycle through ``num_frames`` frames made once: with ``frames="noise"``
    (the default) ``num_frames`` (default 8) uniform random frames drawn from the seed given
    to ``reset`` (or 0), which no codec compresses; with ``frames="scene"``, Atari-like frame
    stacks (the last ``shape[-1]`` grayscale frames, channels last) of three squares
    bouncing over a gradient and a striped floor, ``num_frames`` (default 64) of them, the
    squares' start set by the seed. The reward is 1.0 when the action equals the step index
    modulo the number of actions, else 0.0; the episode is truncated after
    ``episode_len`` (default 100) steps.

    Args:
        config: Optional ``{"episode_len": int >= 1, "num_actions": int >= 1 (default 4),
            "num_frames": int >= 1, "shape": tuple (default (84, 84, 4)),
            "frames": "noise" or "scene"}``.
    """

    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        config = config or {}
        self.episode_len = _int_option(config, "episode_len", 100, 1)
        self.num_actions = _int_option(config, "num_actions", 4, 1)
        self.frames = config.get("frames", "noise")
        if self.frames not in ("noise", "scene"):
            raise ValueError(f'frames must be "noise" or "scene", got {self.frames!r}')
        self.num_frames = _int_option(config, "num_frames", 64 if self.frames == "scene" else 8, 1)
        self.shape = tuple(config.get("shape", (84, 84, 4)))
        self.observation_space = gym.spaces.Box(0, 255, self.shape, np.uint8)
        self.action_space = gym.spaces.Discrete(self.num_actions)
        self._frames = self._draw(0)
        self._t = 0

    def _draw(self, seed: int) -> np.ndarray:
        rng = np.random.default_rng(seed)
        if self.frames == "noise":
            return rng.integers(0, 256, (self.num_frames, *self.shape), dtype=np.uint8)
        return _scene(self.shape, self.num_frames, rng)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Starts an episode (redrawing the frames when a seed is given).

        Args:
            seed: Seeds the frames.
            options: Unused.

        Returns:
            ``(first frame, {})``.
        """
        super().reset(seed=seed)
        if seed is not None:
            self._frames = self._draw(seed)
        self._t = 0
        return self._frames[0].copy(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """Advances one frame.

        Args:
            action: An int in ``[0, num_actions)``.

        Returns:
            ``(frame, reward, False, truncated, {})``.
        """
        reward = 1.0 if int(action) == self._t % self.num_actions else 0.0
        self._t += 1
        frame = self._frames[self._t % self.num_frames].copy()
        return frame, reward, False, self._t >= self.episode_len, {}


def _scene(shape: tuple[int, ...], n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` frame stacks of the bouncing-squares scene (see :class:`SyntheticImageEnv`)."""
    h, w = shape[0], shape[1] if len(shape) > 1 else 1
    depth = shape[2] if len(shape) > 2 else 1
    ys = np.arange(h)[:, None]
    xs = np.arange(w)[None, :]
    background = np.broadcast_to(40 + (ys * 100) // max(h, 1), (h, w)).astype(np.uint8)
    floor = ys >= (h * 5) // 6
    background = np.where(floor, 120 + 30 * ((xs // 6) % 2), background).astype(np.uint8)
    squares = [
        (size, rng.integers(1, 4), rng.integers(1, 4), rng.integers(0, 1000), c)
        for size, c in ((10, 200), (6, 90), (8, 160))
    ]

    def bounce(p: int, span: int) -> int:
        span = max(span, 1)
        p %= 2 * span
        return 2 * span - p if p > span else p

    frames = np.empty((n + depth - 1, h, w), np.uint8)
    for t in range(n + depth - 1):
        f = background.copy()
        for size, vx, vy, start, c in squares:
            x = bounce(int(start + vx * t), w - size)
            y = bounce(int(start // 7 + vy * t), h - size)
            f[y : y + size, x : x + size] = c
        frames[t] = f
    stacks = np.stack([frames[k : k + n] for k in range(depth)], axis=-1)
    return np.ascontiguousarray(stacks.reshape((n, *shape)))


class SlowEnv(gym.Env[np.ndarray, np.int64]):
    """A single-agent env whose ``step`` takes a set wall time: a slow simulator.

    The time is ``step_ms`` milliseconds, or, when ``step_ms`` is a list, its entry for the
    sub-env (``vector_index`` of the ``EnvContext``, modulo the list's length), so one
    vector of sub-envs holds simulators of different speeds. The wait sleeps (the GIL is
    free meanwhile, as a simulator in C or another process would leave it). Observations
    are ``[t / episode_len, vector_index]`` (float32); the reward is 1.0 when the action is
    ``t % 2``, else 0.0; the episode is truncated after ``episode_len`` (default 100)
    steps. The observation records which sub-env and step it came from, so tests can
    check that every episode's steps come from one sub-env, in order.

    Args:
        config: Optional ``{"step_ms": float or list of floats (default 1.0),
            "episode_len": int >= 1}``; an ``EnvContext`` gives the ``vector_index``.
    """

    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        config = config or {}
        self.episode_len = _int_option(config, "episode_len", 100, 1)
        self.vector_index = int(getattr(config, "vector_index", 0) or 0)
        step_ms = config.get("step_ms", 1.0)
        if isinstance(step_ms, (list, tuple)):
            if not step_ms:
                raise ValueError("SlowEnv: step_ms must be a number or a non-empty list")
            step_ms = step_ms[self.vector_index % len(step_ms)]
        if float(step_ms) < 0:
            raise ValueError(f"SlowEnv: step_ms must be >= 0, got {step_ms}")
        self.step_s = float(step_ms) / 1000.0
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self._t = 0

    def _obs(self) -> np.ndarray:
        return np.array([self._t / self.episode_len, self.vector_index], np.float32)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Starts an episode.

        Args:
            seed: Seeds the env's generator (nothing here draws from it).
            options: Unused.

        Returns:
            ``([0, vector_index], {})``.
        """
        super().reset(seed=seed)
        self._t = 0
        return self._obs(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """Waits ``step_ms``, then advances one step.

        Args:
            action: 0 or 1.

        Returns:
            ``(obs, reward, False, truncated, {})``.
        """
        if self.step_s > 0:
            time.sleep(self.step_s)
        reward = 1.0 if int(action) == self._t % 2 else 0.0
        self._t += 1
        return self._obs(), reward, False, self._t >= self.episode_len, {}


class StatelessCartPole(gym.Env[np.ndarray, np.int64]):
    """CartPole-v1 that observes only the cart's position and the pole's angle.

    Without the two velocities a memoryless policy cannot tell which way the pole is
    falling; a recurrent module can, from the observations before (RLlib's example env of
    the same name). Dynamics, rewards and termination are gymnasium's ``CartPoleEnv``;
    episodes are truncated after ``max_episode_steps`` steps (500, as CartPole-v1; RLlib's
    version never truncates).

    Args:
        config: Optional ``{"max_episode_steps": int >= 1}``.
    """

    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        from gymnasium.envs.classic_control.cartpole import CartPoleEnv

        config = config or {}
        self.max_episode_steps = _int_option(config, "max_episode_steps", 500, 1)
        self._env = CartPoleEnv()
        high = np.array(
            [self._env.x_threshold * 2, self._env.theta_threshold_radians * 2], np.float32
        )
        self.observation_space = gym.spaces.Box(-high, high, dtype=np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self._t = 0

    @staticmethod
    def _positions(state: np.ndarray) -> np.ndarray:
        # CartPole's state is [x, x_dot, theta, theta_dot].
        return np.array([state[0], state[2]], np.float32)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Starts an episode.

        Args:
            seed: Seeds CartPole's initial state.
            options: Passed to ``CartPoleEnv.reset``.

        Returns:
            ``([x, theta], {})``.
        """
        super().reset(seed=seed)
        state, info = self._env.reset(seed=seed, options=options)
        self._t = 0
        return self._positions(state), info

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """Pushes the cart left (0) or right (1).

        Args:
            action: 0 or 1.

        Returns:
            ``([x, theta], 1.0, terminated, truncated, {})``.
        """
        state, reward, terminated, _, info = self._env.step(action)
        self._t += 1
        truncated = not terminated and self._t >= self.max_episode_steps
        return self._positions(state), float(reward), terminated, truncated, info


class EnvCrash(RuntimeError):
    """The simulated failure raised by :class:`CrashingEnv` and :class:`CrashingMultiAgentEnv`."""


# Instance ids unique within a process; the pid keeps them unique across async sub-envs.
_instance_ids = itertools.count()


class _CrashSchedule:
    """Decides when a crashing wrapper raises, and counts its calls."""

    def __init__(
        self,
        p_crash_reset: float,
        p_crash_step: float,
        crash_on_reset: Collection[int],
        crash_on_step: Collection[int],
        seed: int | None,
    ) -> None:
        for name, p in (("p_crash_reset", p_crash_reset), ("p_crash_step", p_crash_step)):
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"{name} must be within [0, 1], got {p!r}")
        self.p_reset = p_crash_reset
        self.p_step = p_crash_step
        self.on_reset = frozenset(crash_on_reset)
        self.on_step = frozenset(crash_on_step)
        self.rng = np.random.default_rng(seed)
        self.num_resets = 0
        self.num_steps = 0
        self.instance_id = f"{os.getpid()}-{next(_instance_ids)}"

    def before_reset(self) -> None:
        self.num_resets += 1
        if self.num_resets in self.on_reset or (self.p_reset and self.rng.random() < self.p_reset):
            raise EnvCrash(f"simulated crash in reset() call {self.num_resets}")

    def before_step(self) -> None:
        self.num_steps += 1
        if self.num_steps in self.on_step or (self.p_step and self.rng.random() < self.p_step):
            raise EnvCrash(f"simulated crash in step() call {self.num_steps}")


class CrashingEnv(gym.Wrapper[Any, Any, Any, Any]):
    """Wraps a single-agent env so that ``reset``/``step`` raise :class:`EnvCrash` on schedule.

    Calls are counted over the wrapper's lifetime (1-based, across episodes; the env check
    at creation makes one reset and one step call): the ``k``-th ``reset`` raises when ``k``
    is in ``crash_on_reset``, the ``k``-th ``step`` when ``k`` is in ``crash_on_step``;
    besides, each call raises with probability ``p_crash_reset`` / ``p_crash_step`` drawn
    from an RNG seeded with ``seed``. A call that raises leaves the inner env untouched.
    Every info carries ``info["env_instance"]``, an id unique to this wrapper instance, so
    tests can tell whether an episode mixes steps of two env instances.

    Args:
        env: The env to wrap.
        p_crash_reset: Probability that a reset raises.
        p_crash_step: Probability that a step raises.
        crash_on_reset: Reset call numbers that raise.
        crash_on_step: Step call numbers that raise.
        seed: Seed of the crash RNG.

    Raises:
        ValueError: A probability outside [0, 1].
    """

    def __init__(
        self,
        env: gym.Env[Any, Any],
        *,
        p_crash_reset: float = 0.0,
        p_crash_step: float = 0.0,
        crash_on_reset: Collection[int] = (),
        crash_on_step: Collection[int] = (),
        seed: int | None = None,
    ) -> None:
        super().__init__(env)
        self.schedule = _CrashSchedule(
            p_crash_reset, p_crash_step, crash_on_reset, crash_on_step, seed
        )

    @property
    def instance_id(self) -> str:
        """The id put into every info."""
        return self.schedule.instance_id

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """Resets the inner env unless this call is scheduled to crash.

        Args:
            seed: Passed on.
            options: Passed on.

        Returns:
            The inner env's ``(obs, info)``, info tagged with ``env_instance``.

        Raises:
            EnvCrash: This call crashes.
        """
        self.schedule.before_reset()
        obs, info = self.env.reset(seed=seed, options=options)
        return obs, {**info, "env_instance": self.instance_id}

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict[str, Any]]:
        """Steps the inner env unless this call is scheduled to crash.

        Args:
            action: Passed on.

        Returns:
            The inner env's 5-tuple, info tagged with ``env_instance``.

        Raises:
            EnvCrash: This call crashes.
        """
        self.schedule.before_step()
        obs, reward, terminated, truncated, info = self.env.step(action)
        return obs, reward, terminated, truncated, {**info, "env_instance": self.instance_id}


class CrashingMultiAgentEnv(MultiAgentEnv):
    """Wraps a ``MultiAgentEnv`` so that ``reset``/``step`` raise :class:`EnvCrash` on schedule.

    Same schedule and ``env_instance`` tagging (in each agent's info) as
    :class:`CrashingEnv`. ``agents``, ``possible_agents`` and the spaces are the inner
    env's.

    Args:
        env: The multi-agent env to wrap.
        p_crash_reset: Probability that a reset raises.
        p_crash_step: Probability that a step raises.
        crash_on_reset: Reset call numbers that raise.
        crash_on_step: Step call numbers that raise.
        seed: Seed of the crash RNG.

    Raises:
        ValueError: A probability outside [0, 1].
    """

    def __init__(
        self,
        env: Any,
        *,
        p_crash_reset: float = 0.0,
        p_crash_step: float = 0.0,
        crash_on_reset: Collection[int] = (),
        crash_on_step: Collection[int] = (),
        seed: int | None = None,
    ) -> None:
        super().__init__()
        self.env = env
        self.schedule = _CrashSchedule(
            p_crash_reset, p_crash_step, crash_on_reset, crash_on_step, seed
        )
        self.possible_agents = list(env.possible_agents)
        self.agents = list(env.agents)
        self.observation_spaces = {a: env.get_observation_space(a) for a in self.possible_agents}
        self.action_spaces = {a: env.get_action_space(a) for a in self.possible_agents}

    @property
    def instance_id(self) -> str:
        """The id put into every agent's info."""
        return self.schedule.instance_id

    def _tag(self, infos: MultiAgentDict, obs: MultiAgentDict) -> MultiAgentDict:
        tagged = {a: {**i, "env_instance": self.instance_id} for a, i in infos.items()}
        for a in obs:
            tagged.setdefault(a, {"env_instance": self.instance_id})
        return tagged

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[MultiAgentDict, MultiAgentDict]:
        """Resets the inner env unless this call is scheduled to crash.

        Args:
            seed: Passed on.
            options: Passed on.

        Returns:
            The inner env's ``(obs, infos)``, every observing agent's info tagged.

        Raises:
            EnvCrash: This call crashes.
        """
        self.schedule.before_reset()
        obs, infos = self.env.reset(seed=seed, options=options)
        self.agents = list(self.env.agents)
        return obs, self._tag(infos, obs)

    def step(self, action_dict: MultiAgentDict) -> StepResult:  # type: ignore[override]
        """Steps the inner env unless this call is scheduled to crash.

        Args:
            action_dict: Passed on.

        Returns:
            The inner env's five dicts, every observing agent's info tagged.

        Raises:
            EnvCrash: This call crashes.
        """
        self.schedule.before_step()
        obs, rewards, terminateds, truncateds, infos = self.env.step(action_dict)
        self.agents = list(self.env.agents)
        return obs, rewards, terminateds, truncateds, self._tag(infos, obs)

    def render(self) -> Any:
        """Renders the inner env.

        Returns:
            What the inner env's ``render()`` returns.
        """
        return self.env.render()

    def close(self) -> None:
        """Closes the inner env."""
        self.env.close()
