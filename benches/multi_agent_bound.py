"""What bounds the ``MultiAgentEpisode`` row: the same values in one episode per agent.

Usage::

    python benches/multi_agent_bound.py [--rounds N] [--episodes K]

The row of ``side_by_side.py`` and ``test_bench_multi_agent_episode.py`` builds one
``MultiAgentEpisode`` of N simultaneous agents (float32[4] observations, Discrete(2)
actions, a float reward and one extra model output each), records 100 env steps, cuts with
look-back 1 and turns the chunk to numpy. This script times that row in three ways, taking
turns in one process:

- **multi-agent**: fastrollout's ``MultiAgentEpisode``, as in the row;
- **one per agent**: N fastrollout ``SingleAgentEpisode`` objects recording the same
  values, one ``add_env_step`` per agent and env step, then cut and numpy'd: the row's work
  without any multi-agent bookkeeping, i.e. what the multi-agent episode would cost if
  its env step, maps and hanging data were free;
- **RLlib 2.60**: its ``MultiAgentEpisode`` doing the row.

A time is the median over the rounds (each round: K episodes per contender). RLlib /
"one per agent" is the ratio the row could reach with the multi-agent layer costing
nothing on top of the single-agent records.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from test_bench_multi_agent_episode import STEPS, chunk_recorder, setup_agents


def one_episode_per_agent(n: int) -> Callable[[], object]:
    """The row's values recorded in one fastrollout single-agent episode per agent."""
    from fastrollout import SingleAgentEpisode

    agents, obs_space, act_space, obs, actions, rewards, extras = setup_agents(n)

    def run() -> object:
        episodes = [
            SingleAgentEpisode(observation_space=obs_space[a], action_space=act_space[a])
            for a in agents
        ]
        for a, ep in zip(agents, episodes, strict=True):
            ep.add_env_reset(obs[a])
        for _ in range(STEPS):
            for a, ep in zip(agents, episodes, strict=True):
                ep.add_env_step(obs[a], actions[a], rewards[a], extra_model_outputs=extras[a])
        successors = [ep.cut(len_lookback_buffer=1) for ep in episodes]
        for ep in episodes:
            ep.to_numpy()
        return successors

    return run


def main(argv: list[str] | None = None) -> int:
    """Times the three contenders for 2 and 8 agents and prints a table.

    Args:
        argv: Command-line arguments (default ``sys.argv[1:]``).

    Returns:
        The exit status (0).
    """
    from ray.rllib.env.multi_agent_episode import MultiAgentEpisode as RLlibEpisode

    from _report import load_average
    from fastrollout import MultiAgentEpisode

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--episodes", type=int, default=20, help="per contender and round")
    args = parser.parse_args(argv)
    print(f"load average before: {load_average()}")
    print(
        "| agents | RLlib 2.60 (µs) | multi-agent (µs) | one per agent (µs) "
        "| RLlib / multi-agent | RLlib / one per agent |"
    )
    print("|---:|---:|---:|---:|---:|---:|")
    for n in (2, 8):
        contenders = {
            "rllib": chunk_recorder(RLlibEpisode, n),
            "multi": chunk_recorder(MultiAgentEpisode, n),
            "single": one_episode_per_agent(n),
        }
        times: dict[str, list[float]] = {k: [] for k in contenders}
        for run in contenders.values():
            run()  # warm-up
        for _ in range(args.rounds):
            for name, run in contenders.items():
                episodes = args.episodes if name != "rllib" else max(1, args.episodes // 4)
                start = time.perf_counter()
                for _ in range(episodes):
                    run()
                times[name].append((time.perf_counter() - start) / episodes * 1e6)
        med = {k: statistics.median(v) for k, v in times.items()}
        print(
            f"| {n} | {med['rllib']:,.0f} | {med['multi']:,.0f} | {med['single']:,.0f} "
            f"| {med['rllib'] / med['multi']:.2f}x | {med['rllib'] / med['single']:.2f}x |"
        )
    print(f"load average after: {load_average()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
