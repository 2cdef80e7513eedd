"""Learners that train modules on fastrollout episodes (a compact PPO)."""

from fastrollout.learners.ppo import (
    PPOConfig,
    PPOLearner,
    build_ppo_batch,
    clipped_surrogate,
    compute_gae,
    iter_agent_chunks,
    ppo_loss,
    ppo_update,
)

__all__ = [
    "PPOConfig",
    "PPOLearner",
    "build_ppo_batch",
    "clipped_surrogate",
    "compute_gae",
    "iter_agent_chunks",
    "ppo_loss",
    "ppo_update",
]
