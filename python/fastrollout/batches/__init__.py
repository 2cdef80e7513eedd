"""Batches of rows for training: RLlib 2.60's ``SampleBatch`` and ``MultiAgentBatch``."""

from fastrollout.batches.sample_batch import (
    DEFAULT_POLICY_ID,
    CompressedArray,
    MultiAgentBatch,
    SampleBatch,
    concat_samples,
    episode_to_sample_batch,
    episodes_to_multi_agent_batch,
    episodes_to_sample_batch,
)

__all__ = [
    "DEFAULT_POLICY_ID",
    "CompressedArray",
    "MultiAgentBatch",
    "SampleBatch",
    "concat_samples",
    "episode_to_sample_batch",
    "episodes_to_multi_agent_batch",
    "episodes_to_sample_batch",
]
