"""fastrollout demo: record a CartPole episode, cut it into chunks with look-back, and
print the arrays a trainer receives.

Run with ``make demo``, which then samples with the runners
(``python -m fastrollout sample``, single- and multi-agent).
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from fastrollout import SingleAgentEpisode


def main() -> None:
    env = gym.make("CartPole-v1")
    rng = np.random.default_rng(0)
    obs, info = env.reset(seed=0)
    episode = SingleAgentEpisode(
        observation_space=env.observation_space, action_space=env.action_space
    )
    episode.add_env_reset(obs, info)
    chunks = []
    chunk_len = 8
    while True:
        action = int(rng.integers(2))
        obs, reward, terminated, truncated, info = env.step(action)
        episode.add_env_step(
            obs,
            action,
            float(reward),
            info,
            terminated=terminated,
            truncated=truncated,
            extra_model_outputs={"action_logp": np.float32(np.log(0.5))},
        )
        if episode.is_done or len(episode) == chunk_len:
            successor = None if episode.is_done else episode.cut(len_lookback_buffer=1)
            chunks.append(episode.to_numpy())
            if successor is None:
                break
            episode = successor

    np.set_printoptions(precision=3, suppress=True)
    print(f"episode {chunks[0].id_}: {len(chunks)} chunks of up to {chunk_len} steps")
    for i, chunk in enumerate(chunks):
        print(
            f"\nchunk {i}: t={chunk.t_started}..{chunk.t}  return={chunk.get_return():.1f}"
            f"  done={chunk.is_done}"
        )
        print("  observations (incl. next obs):", chunk.get_observations().shape)
        lookback = chunk.get_observations(-1, neg_index_as_lookback=True, fill=0.0)
        print("  look-back observation:", lookback)
        print("  actions:", chunk.get_actions())
        print("  rewards:", chunk.get_rewards())
        print("  action_logp:", chunk.get_extra_model_outputs("action_logp"))

    total = sum(len(c) for c in chunks)
    print(f"\n{total} steps in all, return {sum(c.get_return() for c in chunks):.1f}")


if __name__ == "__main__":
    main()
