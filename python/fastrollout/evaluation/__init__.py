"""The old stack's experience collection: ``RolloutWorker`` and its policies.

RLlib's ``ray.rllib.evaluation`` (``RolloutWorker``, once ``PolicyEvaluator``) on
fastrollout's runners: :class:`RolloutWorker` samples ``SampleBatch`` es with the old
stack's columns, filters and batch modes; each policy is a :class:`TorchPolicy` (a torch
RLModule and PPO's loss).
"""

from fastrollout.evaluation.policy import TorchPolicy
from fastrollout.evaluation.rollout_worker import RolloutMetrics, RolloutWorker

__all__ = ["RolloutMetrics", "RolloutWorker", "TorchPolicy"]
