"""``TorchPolicy``: the old stack's policy as a torch RLModule plus PPO's loss.

A ``RolloutWorker`` acts with its runner's inference copy of each module; the policy holds
the full module (policy and value function) that learns, post-processes sampled batches
(value estimates and GAE, as RLlib's ``PPOTorchPolicy.postprocess_trajectory``) and
computes and applies gradients.
"""

from __future__ import annotations

import pathlib
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from fastrollout._core import gae_segments
from fastrollout.batches import SampleBatch
from fastrollout.core import Columns
from fastrollout.core.tree import concat, take, to_tensor
from fastrollout.learners.ppo import PPOConfig, _explained_variance, ppo_loss
from fastrollout.modules import RLModule

__all__ = ["LOSS_COLUMNS", "LossFn", "TorchPolicy"]

#: ``loss_fn(module, batch, config) -> (loss, stats)``: the scalar to minimise and float
#: statistics, from a dict of tensors (``loss_columns``); PPO's ``ppo_loss`` by default.
LossFn = Callable[[RLModule, Mapping[str, Any], Any], tuple[torch.Tensor, dict[str, float]]]

#: The columns PPO's loss reads from a post-processed batch.
LOSS_COLUMNS = (
    Columns.OBS,
    Columns.ACTIONS,
    Columns.ACTION_LOGP,
    Columns.VF_PREDS,
    Columns.ADVANTAGES,
    Columns.VALUE_TARGETS,
)

# RLlib's keys in a learn_on_batch info dict.
LEARNER_STATS_KEY = "learner_stats"
NUM_GRAD_UPDATES_LIFETIME = "num_grad_updates_lifetime"
DIFF_NUM_GRAD_UPDATES_VS_SAMPLER_POLICY = "diff_num_grad_updates_vs_sampler_policy"


class TorchPolicy:
    """One policy of a ``RolloutWorker``: a full RLModule, PPO's loss and an optimizer.

    Args:
        policy_id: The policy's id.
        module: The full module (with ``compute_values``; not inference-only).
        config: PPO's hyperparameters (``gamma``, ``lambda_``, ``lr``, clip ranges,
            coefficients; ``num_epochs``/``minibatch_size`` are the caller's loop here).
        loss_fn: The loss (default: PPO's clipped surrogate, value and entropy terms).
        loss_columns: The batch columns ``loss_fn`` reads (default: PPO's).

    Raises:
        ValueError: If the module is inference-only.
    """

    def __init__(
        self,
        policy_id: str,
        module: RLModule,
        config: PPOConfig | None = None,
        *,
        loss_fn: LossFn | None = None,
        loss_columns: Collection[str] | None = None,
    ) -> None:
        if module.inference_only:
            raise ValueError(f"policy {policy_id!r}: the module is inference-only (no value head)")
        self.policy_id = policy_id
        self.model = module
        self.config = config or PPOConfig()
        self.loss_fn: LossFn = ppo_loss if loss_fn is None else loss_fn
        self.loss_columns = tuple(
            LOSS_COLUMNS if loss_columns is None and loss_fn is None else loss_columns or ()
        )
        self.optimizer = torch.optim.Adam(module.parameters(), lr=self.config.lr)
        self.global_timestep = 0
        self.num_grad_updates = 0
        # The grad-update count of the weights the sampler acted with (set_weights).
        self.sampler_grad_updates = 0

    @property
    def observation_space(self) -> Any:
        """The module's observation space."""
        return self.model.observation_space

    @property
    def action_space(self) -> Any:
        """The module's action space."""
        return self.model.action_space

    @property
    def device(self) -> torch.device:
        """Where the module's parameters are."""
        return self.model.device

    # -- post-processing -----------------------------------------------------------------

    def values(self, obs: Any) -> np.ndarray:
        """The value estimates of a batch of observations (float32, one per row).

        Args:
            obs: Observations, shape ``(B, ...)`` (nested for Dict/Tuple spaces).

        Returns:
            ``V(obs)``.
        """
        compute_values = getattr(type(self.model), "compute_values", None)
        if compute_values is None:
            raise TypeError(
                f"policy {self.policy_id!r}: {type(self.model).__name__} has no "
                "compute_values(); PPO's post-processing needs a value function"
            )
        with torch.no_grad():
            values = compute_values(self.model, {Columns.OBS: to_tensor(obs, self.device)})
        return values.float().cpu().numpy()

    def postprocess(
        self, batch: SampleBatch, segment_ends: Sequence[int] | np.ndarray
    ) -> SampleBatch:
        """Adds ``vf_preds``, ``values_bootstrapped``, ``advantages``, ``value_targets``.

        One value forward covers every row's observation and each segment's last
        ``new_obs``; GAE runs over all segments in one native call. A segment ending in a
        terminal step bootstraps from 0, any other (truncated or cut) from ``V`` of its
        last ``new_obs``; ``values_bootstrapped`` holds that value on the segment's last
        row and 0 elsewhere (RLlib's column).

        Args:
            batch: Rows of consecutive episode chunks (``obs``, ``new_obs``, ``rewards``,
                ``terminateds``).
            segment_ends: The row index after each chunk, ascending, the last equal to
                ``batch.count``.

        Returns:
            ``batch``, with the columns added.
        """
        n = batch.count
        if n == 0:
            return batch
        ends = np.asarray(segment_ends, dtype=np.int64)
        last_rows = ends - 1
        new_obs = batch[SampleBatch.NEXT_OBS]
        last_obs = take(new_obs, last_rows)
        all_values = self.values(concat([batch[SampleBatch.OBS], last_obs]))
        vf_preds = np.ascontiguousarray(all_values[:n], dtype=np.float32)
        terminated = np.asarray(batch[SampleBatch.TERMINATEDS])[last_rows]
        bootstraps = np.where(terminated, 0.0, all_values[n:]).astype(np.float32)
        lengths = np.diff(ends, prepend=0).astype(np.int64)
        rewards = np.ascontiguousarray(batch[SampleBatch.REWARDS], dtype=np.float32)
        advantages, targets = gae_segments(
            rewards, vf_preds, lengths, bootstraps, self.config.gamma, self.config.lambda_
        )
        bootstrapped = np.zeros(n, dtype=np.float32)
        bootstrapped[last_rows] = bootstraps
        batch[Columns.VF_PREDS] = vf_preds
        batch[Columns.VALUES_BOOTSTRAPPED] = bootstrapped
        batch[Columns.ADVANTAGES] = advantages
        batch[Columns.VALUE_TARGETS] = targets
        return batch

    # -- learning ------------------------------------------------------------------------

    def _loss_batch(self, batch: SampleBatch) -> dict[str, Any]:
        batch = batch.decompress_if_needed()
        missing = [c for c in self.loss_columns if c not in batch]
        if missing:
            raise KeyError(
                f"policy {self.policy_id!r}: the batch lacks the loss's columns {missing} "
                f"(it has {sorted(batch)}); sample() adds PPO's when it post-processes"
            )
        columns = self.loss_columns or [k for k in batch if k != SampleBatch.INFOS]
        return {c: to_tensor(batch[c], self.device) for c in columns}

    def _loss(self, batch: SampleBatch) -> tuple[torch.Tensor, dict[str, float]]:
        tensors = self._loss_batch(batch)
        self.model.train()
        try:
            loss, stats = self.loss_fn(self.model, tensors, self.config)
        finally:
            self.model.eval()
        if Columns.VALUE_TARGETS in tensors and Columns.VF_PREDS in tensors:
            stats["vf_explained_var"] = _explained_variance(
                tensors[Columns.VALUE_TARGETS], tensors[Columns.VF_PREDS]
            )
        stats["total_loss"] = float(loss.detach())
        return loss, stats

    def compute_gradients(self, batch: SampleBatch) -> tuple[list[np.ndarray], dict[str, Any]]:
        """The gradients of the loss on ``batch`` (not applied).

        Args:
            batch: A post-processed batch of this policy.

        Returns:
            ``(grads, info)``: one array per parameter (in ``model.parameters()``
            order; zeros where a parameter gets no gradient) and
            ``{"learner_stats": {...}}``.

        Raises:
            KeyError: If the batch lacks a loss column (named).
        """
        loss, stats = self._loss(batch)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.config.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.grad_clip)
        grads = [
            np.zeros(tuple(p.shape), np.float32)
            if p.grad is None
            else p.grad.detach().cpu().numpy().copy()
            for p in self.model.parameters()
        ]
        return grads, {LEARNER_STATS_KEY: stats}

    def apply_gradients(self, gradients: Sequence[Any]) -> None:
        """Takes one optimizer step with given gradients.

        Args:
            gradients: One array per parameter, as ``compute_gradients`` returns them.

        Raises:
            ValueError: If the number or shapes of the gradients do not fit.
        """
        params = list(self.model.parameters())
        if len(gradients) != len(params):
            raise ValueError(
                f"policy {self.policy_id!r}: {len(gradients)} gradients for "
                f"{len(params)} parameters"
            )
        for i, (p, g) in enumerate(zip(params, gradients, strict=True)):
            grad = torch.as_tensor(np.asarray(g), dtype=p.dtype, device=p.device)
            if tuple(grad.shape) != tuple(p.shape):
                raise ValueError(
                    f"policy {self.policy_id!r}: gradient {i} has shape {tuple(grad.shape)}, "
                    f"the parameter {tuple(p.shape)}"
                )
            p.grad = grad.clone()
        self.optimizer.step()
        self.num_grad_updates += 1

    def learn_on_batch(self, batch: SampleBatch) -> dict[str, Any]:
        """One gradient step of the loss on ``batch`` (RLlib's old-stack semantics).

        Args:
            batch: A post-processed batch of this policy.

        Returns:
            ``{"learner_stats": {...}, "custom_metrics": {}, "num_grad_updates_lifetime":
            n, "diff_num_grad_updates_vs_sampler_policy": d}``.

        Raises:
            KeyError: If the batch lacks a loss column (named).
        """
        grads_before = batch.num_grad_updates
        _, info = self.compute_gradients(batch)
        self.optimizer.step()
        self.num_grad_updates += 1
        sampled_with = self.sampler_grad_updates if grads_before is None else grads_before
        info.update(
            {
                "custom_metrics": {},
                NUM_GRAD_UPDATES_LIFETIME: self.num_grad_updates,
                DIFF_NUM_GRAD_UPDATES_VS_SAMPLER_POLICY: self.num_grad_updates
                - 1
                - float(sampled_with),
            }
        )
        return info

    # -- weights and state ---------------------------------------------------------------

    def get_weights(self) -> dict[str, np.ndarray]:
        """The full module's weights (numpy arrays by parameter name)."""
        return self.model.get_state()

    def set_weights(self, weights: Mapping[str, Any]) -> None:
        """Loads weights from ``get_weights`` (or an inference-only subset of them).

        Args:
            weights: Arrays by parameter name.
        """
        self.model.set_state(dict(weights))
        self.sampler_grad_updates = self.num_grad_updates

    def get_state(self) -> dict[str, Any]:
        """Weights, optimizer state and counters, as plain data."""
        return {
            "weights": self.get_weights(),
            "optimizer": self.optimizer.state_dict(),
            "global_timestep": self.global_timestep,
            "num_grad_updates": self.num_grad_updates,
        }

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Restores ``get_state``'s output.

        Args:
            state: The state.
        """
        self.set_weights(state["weights"])
        if state.get("optimizer"):
            self.optimizer.load_state_dict(state["optimizer"])
        self.global_timestep = int(state.get("global_timestep", 0))
        self.num_grad_updates = int(state.get("num_grad_updates", 0))

    def on_global_var_update(self, global_vars: Mapping[str, Any]) -> None:
        """Takes RLlib's global variables (``timestep``; ``lr`` sets the learning rate).

        Args:
            global_vars: The variables.
        """
        if "timestep" in global_vars:
            self.global_timestep = int(global_vars["timestep"])
        if "lr" in global_vars:
            for group in self.optimizer.param_groups:
                group["lr"] = float(global_vars["lr"])

    def export_model(self, export_dir: str | pathlib.Path, onnx: int | None = None) -> pathlib.Path:
        """Writes the module as TorchScript (or ONNX with an opset) into ``export_dir``.

        Args:
            export_dir: The folder (created if missing).
            onnx: An ONNX opset version; None for TorchScript.

        Returns:
            The written model file.
        """
        from fastrollout.modules.export import export_module

        return export_module(self.model, export_dir, onnx=onnx)

    def __repr__(self) -> str:
        return f"TorchPolicy({self.policy_id!r}, {type(self.model).__name__})"
