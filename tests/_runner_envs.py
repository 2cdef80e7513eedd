"""Small envs for the runner tests (module-level so async sub-processes can import them)."""

from __future__ import annotations

from typing import Any, ClassVar

import gymnasium as gym
import numpy as np


class SeededLengthEnv(gym.Env):
    """Episode lengths drawn from the reset seed's RNG; actions are ignored.

    Observation ``[t, episode length]``; reward ``0.5 * (t + 1)``; terminated after a
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
        return np.array([self._t, self._len], np.float32)

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


class LongEnv(gym.Env):
    """Episodes of 1000 steps; counts the steps all instances took (``LongEnv.steps``)."""

    steps = 0

    def __init__(self, config: Any = None) -> None:
        self.observation_space = gym.spaces.Box(0.0, 1000.0, (1,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self._t = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> Any:
        super().reset(seed=seed)
        self._t = 0
        return np.zeros(1, np.float32), {}

    def step(self, action: Any) -> Any:
        self._t += 1
        LongEnv.steps += 1
        return np.array([self._t], np.float32), 1.0, False, self._t >= 1000, {}


def crash_first_sub_env_once(ctx: Any) -> Any:
    """LongEnv; sub-env 0 of the first vector crashes on its 5th sampling step."""
    from fastrollout.env.examples import CrashingEnv

    first = ctx.vector_index == 0 and not _created[0]
    if ctx.vector_index == 0:
        _created[0] = True
    # The env check at creation takes one step, so call 6 is the 5th sampling step.
    return CrashingEnv(LongEnv(), crash_on_step={6} if first else ())


_created = [False]


def rllib_turn_env_class() -> type:
    """An RLlib ``MultiAgentEnv`` subclass (fastrollout runs RLlib's envs as they are).

    Players "a" and "b" alternate; episode length drawn from the reset seed's RNG
    (actions are ignored), so runners seeded alike produce the same episodes. The mover
    gets reward ``t``; at the end both observe and are terminated.
    """
    from ray.rllib.env.multi_agent_env import MultiAgentEnv as RLlibMultiAgentEnv

    class SeededTurnsEnv(RLlibMultiAgentEnv):
        def __init__(self, config: Any = None) -> None:
            super().__init__()
            self.possible_agents = ["a", "b"]
            self.agents = ["a", "b"]
            space = gym.spaces.Box(0.0, 100.0, (2,), np.float32)
            self.observation_spaces = {"a": space, "b": space}
            self.action_spaces = {"a": gym.spaces.Discrete(2), "b": gym.spaces.Discrete(2)}
            self._t = 0
            self._len = 0

        def reset(self, *, seed: int | None = None, options: dict | None = None) -> Any:
            if seed is not None:
                self._rng = np.random.default_rng(seed)
            elif not hasattr(self, "_rng"):
                self._rng = np.random.default_rng()
            self._t = 0
            self._len = int(self._rng.integers(3, 10))
            return {"a": self._obs()}, {"a": {}}

        def _obs(self) -> np.ndarray:
            return np.array([self._t, self._len], np.float32)

        def step(self, action_dict: dict) -> Any:
            (mover,) = action_dict
            self._t += 1
            rewards = {mover: float(self._t)}
            if self._t >= self._len:
                obs = {"a": self._obs(), "b": self._obs()}
                return obs, rewards, {"a": True, "b": True, "__all__": True}, {"__all__": False}, {}
            nxt = "b" if mover == "a" else "a"
            return {nxt: self._obs()}, rewards, {"__all__": False}, {"__all__": False}, {}

    return SeededTurnsEnv


class DictObsEnv(gym.Env):
    """Dict observations (a Box and a Discrete); episodes of 5 steps."""

    def __init__(self, config: Any = None) -> None:
        self.observation_space = gym.spaces.Dict(
            {"pos": gym.spaces.Box(-1.0, 1.0, (2,), np.float32), "mode": gym.spaces.Discrete(3)}
        )
        self.action_space = gym.spaces.Discrete(2)
        self._t = 0

    def _obs(self) -> dict:
        return {"mode": self._t % 3, "pos": np.full(2, self._t / 10, np.float32)}

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> Any:
        super().reset(seed=seed)
        self._t = 0
        return self._obs(), {}

    def step(self, action: Any) -> Any:
        self._t += 1
        return self._obs(), 1.0, self._t >= 5, False, {}


class SeededLengthVectorEnv(gym.vector.VectorEnv):
    """``num_envs`` SeededLengthEnvs as one native vector env (for ``vector_entry_point``).

    Implements gymnasium's next-step autoreset itself and seeds sub-env ``i`` with
    ``seed + i`` as ``SyncVectorEnv`` does, so it yields the same data as a sync vector env
    of SeededLengthEnvs. ``config["autoreset_mode"]`` overrides the declared mode (to test
    that runners refuse other modes).
    """

    def __init__(self, config: Any) -> None:
        self.num_envs = int(config["num_envs"])
        self._envs = [SeededLengthEnv() for _ in range(self.num_envs)]
        self.single_observation_space = self._envs[0].observation_space
        self.single_action_space = self._envs[0].action_space
        self.observation_space = gym.vector.utils.batch_space(
            self.single_observation_space, self.num_envs
        )
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, self.num_envs)
        mode = config.get("autoreset_mode", gym.vector.AutoresetMode.NEXT_STEP)
        self.metadata = {"autoreset_mode": mode}
        self._done = np.zeros(self.num_envs, bool)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> Any:
        obs, lens = [], []
        for i, e in enumerate(self._envs):
            o, info = e.reset(seed=None if seed is None else seed + i)
            obs.append(o)
            lens.append(info["len"])
        self._done[:] = False
        return np.stack(obs), {"len": np.array(lens), "_len": np.ones(self.num_envs, bool)}

    def step(self, actions: Any) -> Any:
        obs, rew, term = [], np.zeros(self.num_envs), np.zeros(self.num_envs, bool)
        lens, reset = np.zeros(self.num_envs, np.int64), np.zeros(self.num_envs, bool)
        for i, e in enumerate(self._envs):
            if self._done[i]:
                # The reset's info comes with the step that returns the reset observation.
                o, info = e.reset()
                lens[i], reset[i] = info["len"], True
            else:
                o, rew[i], term[i], _, _ = e.step(actions[i])
            obs.append(o)
        self._done = term.copy()
        infos = {"len": lens, "_len": reset} if reset.any() else {}
        return np.stack(obs), rew, term, np.zeros(self.num_envs, bool), infos


class WrongShapeSubEnv(gym.Env):
    """Observations of shape (4,); the sub-env ``config["bad_index"]`` returns shape (5,)
    from its 3rd step on (the others never do)."""

    def __init__(self, config: Any = None) -> None:
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        index = getattr(config, "vector_index", 0)
        self._bad = index == (config or {}).get("bad_index", 0)
        self._t = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> Any:
        super().reset(seed=seed)
        self._t = 0
        return np.zeros(4, np.float32), {}

    def step(self, action: Any) -> Any:
        self._t += 1
        obs = np.zeros(5 if self._bad and self._t >= 3 else 4, np.float32)
        return obs, 1.0, False, self._t >= 20, {}


def crash_sub_env_1_on_step_3(ctx: Any) -> Any:
    """SeededLengthEnv; sub-env 1 raises EnvCrash on its 3rd step call (the env check's is
    its 1st), the others never."""
    from fastrollout.env.examples import CrashingEnv

    return CrashingEnv(SeededLengthEnv(), crash_on_step={3} if ctx.vector_index == 1 else ())
