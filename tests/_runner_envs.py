"""Small envs for the runner tests (module-level so async sub-processes can import them)."""

from __future__ import annotations

from typing import Any, ClassVar

import gymnasium as gym
import numpy as np


class SeededLengthEnv(gym.Env):
    """Episode lengths drawn from the reset seed's RNG; actions are ignored.

    Observation ``[t, episode number]``; reward ``0.5 * (t + 1)``; terminated after a
    length in [3, 12] drawn at reset. Runs the same under any policy, so runners seeded
    alike produce the same episodes.
    """

    def __init__(self, config: Any = None) -> None:
        self.observation_space = gym.spaces.Box(0.0, 1000.0, (2,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self._t = 0
        self._len = 0
        self._n = -1

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> Any:
        super().reset(seed=seed)
        self._t = 0
        self._n += 1
        self._len = int(self.np_random.integers(3, 13))
        return self._obs(), {"len": self._len}

    def _obs(self) -> np.ndarray:
        return np.array([self._t, self._n], np.float32)

    def step(self, action: Any) -> Any:
        self._t += 1
        reward = 0.5 * self._t
        return self._obs(), reward, self._t >= self._len, False, {}


class ActionRecordingEnv(gym.Env):
    """A continuous-action env that records the actions it receives."""

    received: ClassVar[list[np.ndarray]] = []

    def __init__(self, config: Any = None) -> None:
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.action_space = gym.spaces.Box(-0.01, 0.01, (1,), np.float32)
        self._t = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> Any:
        super().reset(seed=seed)
        self._t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action: Any) -> Any:
        ActionRecordingEnv.received.append(np.array(action, copy=True))
        self._t += 1
        return np.zeros(2, np.float32), 0.0, False, self._t >= 20, {}


class WrongShapeEnv(gym.Env):
    """Returns an observation of the wrong shape from its 3rd step on."""

    def __init__(self, config: Any = None) -> None:
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self._t = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> Any:
        super().reset(seed=seed)
        self._t = 0
        return np.zeros(4, np.float32), {}

    def step(self, action: Any) -> Any:
        self._t += 1
        obs = np.zeros(5 if self._t >= 3 else 4, np.float32)
        return obs, 1.0, False, False, {}
