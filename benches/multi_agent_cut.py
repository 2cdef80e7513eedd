"""``MultiAgentEpisode.cut(len_lookback_buffer=1)`` of a 100-env-step chunk: turn-based with
2 agents, and simultaneous with 8 agents one of which has an action hanging (both take
the general path); and ``slice(slice(10, 60))`` of the same chunks. Prints the timeit
minimum of 5 x 50 calls, in µs per call.

    PYTHONPATH=python python benches/multi_agent_cut.py [fastrollout|rllib]
"""

from __future__ import annotations

import sys
import timeit

import gymnasium as gym
import numpy as np


def _cls(impl: str):
    if impl == "rllib":
        from ray.rllib.env.multi_agent_episode import MultiAgentEpisode

        return MultiAgentEpisode
    from fastrollout import MultiAgentEpisode

    return MultiAgentEpisode


def _spaces(agents: list[str]) -> dict:
    return {
        "observation_space": {a: gym.spaces.Box(-1.0, 1.0, (4,), np.float32) for a in agents},
        "action_space": {a: gym.spaces.Discrete(2) for a in agents},
    }


def turn_based(cls, steps: int = 100):
    """Agents a and b take turns: each env step one observes, the other's action hangs."""
    ep = cls(**_spaces(["a", "b"]))
    ep.add_env_reset(observations={"a": np.zeros(4, np.float32)})
    for t in range(1, steps + 1):
        me, other = ("b", "a") if t % 2 else ("a", "b")
        ep.add_env_step(
            observations={me: np.full(4, t, np.float32)},
            actions={other: t % 2},
            rewards={other: 1.0},
            extra_model_outputs={other: {"action_logp": np.float32(-0.69)}},
        )
    return ep


def simultaneous_one_hanging(cls, steps: int = 100, n_agents: int = 8):
    """8 agents step together; at the last env step one of them gets no observation."""
    agents = [f"agent_{i}" for i in range(n_agents)]
    ep = cls(**_spaces(agents))
    obs = {a: np.zeros(4, np.float32) for a in agents}
    actions = {a: 1 for a in agents}
    rewards = {a: 1.0 for a in agents}
    extras = {a: {"action_logp": np.float32(-0.69)} for a in agents}
    ep.add_env_reset(observations=obs)
    for t in range(steps):
        last = {a: o for a, o in obs.items() if a != agents[-1]} if t == steps - 1 else obs
        ep.add_env_step(last, actions, rewards, extra_model_outputs=extras)
    return ep


def main() -> None:
    impl = sys.argv[1] if len(sys.argv) > 1 else "fastrollout"
    cls = _cls(impl)
    for name, make in (
        ("turn-based, 2 agents", turn_based),
        ("simultaneous, 8 agents, one hanging", simultaneous_one_hanging),
    ):
        ep = make(cls)
        for what, call in (
            ("cut", lambda ep=ep: ep.cut(len_lookback_buffer=1)),
            ("slice", lambda ep=ep: ep.slice(slice(10, 60))),
        ):
            best = min(timeit.repeat(call, number=50, repeat=5)) / 50
            print(f"{impl:12s} {what:6s} {name:40s} {best * 1e6:7.1f} µs")


if __name__ == "__main__":
    main()
