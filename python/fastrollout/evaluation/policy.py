"""``TorchPolicy``: the old stack's policy as a torch RLModule plus PPO's loss.

A ``RolloutWorker`` acts with its runner's inference copy of each module; the policy holds
the full module (policy and value function) that learns, post-processes sampled batches
(value estimates and GAE, as RLlib's ``PPOTorchPolicy.postprocess_trajectory``) and
computes and applies gradients.

A stateful module (``is_stateful()``) is a recurrent policy: its batches carry the old
stack's ``state_in_*``/``state_out_*``/``seq_lens`` columns
(:mod:`fastrollout.evaluation.recurrent`), and every forward pass over a batch's rows runs
its sequences, zero-padded to the longest, from their ``state_in``; the loss sees only the
real rows (the padding is masked out).
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
from fastrollout.core.tree import concat, leaves, take, to_tensor, tree_map
from fastrollout.evaluation.recurrent import (
    DEFAULT_MAX_SEQ_LEN,
    SequenceLayout,
    flatten_state,
    state_paths,
    unflatten_state,
)
from fastrollout.learners.ppo import PPOConfig, explained_variance, ppo_loss
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
        # A recurrent module's initial state (numpy leaves) and its leaves' order.
        self._initial_state: Any = None
        self._state_paths: list[tuple[Any, ...]] = []
        if module.is_stateful():
            self._initial_state = tree_map(
                lambda x: np.asarray(x.detach().cpu() if hasattr(x, "detach") else x),
                module.get_initial_state(),
            )
            self._state_paths = state_paths(self._initial_state)
        #: Rows per sequence of a recurrent policy's batches (``model_config``'s).
        self.max_seq_len = int(module.model_config.get("max_seq_len") or DEFAULT_MAX_SEQ_LEN)

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

    # -- recurrent state -----------------------------------------------------------------

    def is_recurrent(self) -> bool:
        """Whether the module is stateful (its batches carry ``state_in_*``, ``seq_lens``)."""
        return self._initial_state is not None

    def num_state_tensors(self) -> int:
        """The number of state leaves (``state_in_0`` ... ``state_in_{n-1}``)."""
        return len(self._state_paths)

    def get_initial_state(self) -> list[np.ndarray]:
        """The initial state's leaves, in ``state_in_i`` order (empty if not recurrent)."""
        if self._initial_state is None:
            return []
        return [np.array(x) for x in flatten_state(self._initial_state, self._state_paths)]

    @property
    def initial_state(self) -> Any:
        """The module's initial state as nested numpy leaves (None if not recurrent)."""
        return self._initial_state

    def _nested_state(self, flat: Sequence[Any]) -> Any:
        """Tensors of ``state_in_i`` columns as the module's nested ``STATE_IN``."""
        return unflatten_state([to_tensor(x, self.device) for x in flat], self._initial_state)

    def _state_columns(self, batch: Mapping[str, Any], prefix: str) -> list[Any]:
        names = [f"{prefix}{i}" for i in range(self.num_state_tensors())]
        missing = [k for k in names if k not in batch]
        if missing:
            raise KeyError(
                f"policy {self.policy_id!r} is recurrent: the batch lacks {missing} "
                f"(it has {sorted(batch)}); RolloutWorker.sample() adds them"
            )
        return [batch[k] for k in names]

    def _sequence_view(self, batch: Mapping[str, Any]) -> _SequenceRows:
        """The module as seen by a loss on ``batch``'s rows (its sequences run whole)."""
        if SampleBatch.SEQ_LENS not in batch:
            raise KeyError(
                f"policy {self.policy_id!r} is recurrent: the batch has no 'seq_lens' "
                "(RolloutWorker.sample() adds them)"
            )
        layout = SequenceLayout(np.asarray(batch[SampleBatch.SEQ_LENS]))
        state_in = self._nested_state(self._state_columns(batch, "state_in_"))
        return _SequenceRows(self.model, layout, state_in)

    def _recurrent_values(self, batch: SampleBatch, last_rows: np.ndarray) -> np.ndarray:
        """The values of every row, then of each segment's last ``new_obs``.

        A row's value comes from its sequence run from its ``state_in``; a last
        ``new_obs``'s from one step from its row's ``state_out``.
        """
        view = self._sequence_view(batch)
        last_obs = tree_map(lambda x: x[:, None], take(batch[SampleBatch.NEXT_OBS], last_rows))
        last_state = [np.asarray(x)[last_rows] for x in self._state_columns(batch, "state_out_")]
        with torch.no_grad():
            try:
                rows = view.forward_train({Columns.OBS: to_tensor(batch[Columns.OBS], self.device)})
                last = self.model.forward_train(
                    {
                        Columns.OBS: to_tensor(last_obs, self.device),
                        Columns.STATE_IN: self._nested_state(last_state),
                    }
                )
            finally:
                self.model.eval()
        for out in (rows, last):
            if Columns.VF_PREDS not in out:
                raise KeyError(
                    f"policy {self.policy_id!r}: {type(self.model).__name__}.forward_train "
                    f"returned no {Columns.VF_PREDS!r}; PPO's post-processing needs values"
                )
        values = torch.cat([rows[Columns.VF_PREDS], last[Columns.VF_PREDS][:, 0]])
        return values.float().cpu().numpy()  # type: ignore[no-any-return]

    def compute_log_likelihoods(
        self,
        actions: Any,
        obs_batch: Any,
        state_batches: Sequence[Any] | None = None,
        prev_action_batch: Any = None,
        prev_reward_batch: Any = None,
        actions_normalized: bool = True,
        in_training: bool = True,
        *,
        seq_lens: Any = None,
    ) -> torch.Tensor:
        """The log-likelihood of ``actions`` under the policy, one per row.

        Args:
            actions: One action per row.
            obs_batch: The rows' observations.
            state_batches: A recurrent policy's ``state_in_i`` columns: one row per row
                (each row a sequence of one step, as RLlib's), or one per sequence with
                ``seq_lens``; None: the initial state.
            prev_action_batch: Accepted for RLlib's signature; unused.
            prev_reward_batch: Accepted for RLlib's signature; unused.
            actions_normalized: Accepted for RLlib's signature; unused.
            in_training: Accepted for RLlib's signature; unused.
            seq_lens: The rows' sequences (fastrollout's addition): each sequence runs
                from its ``state_in`` through its rows.

        Returns:
            A float tensor of one log-likelihood per row.
        """
        obs = to_tensor(obs_batch, self.device)
        n = len(next(leaves(obs)))
        with torch.no_grad():
            try:
                if self.is_recurrent():
                    lens = np.ones(n, np.int64) if seq_lens is None else np.asarray(seq_lens)
                    layout = SequenceLayout(lens)
                    flat = state_batches
                    if not flat:
                        flat = [np.repeat(x[None], len(lens), 0) for x in self.get_initial_state()]
                    out = _SequenceRows(self.model, layout, self._nested_state(flat)).forward_train(
                        {Columns.OBS: obs}
                    )
                else:
                    out = self.model.forward_train({Columns.OBS: obs})
            finally:
                self.model.eval()
        dist = self.model.get_train_action_dist_cls().from_logits(out[Columns.ACTION_DIST_INPUTS])
        return dist.logp(to_tensor(actions, self.device))  # type: ignore[no-any-return]

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
        if self.is_recurrent():
            all_values = self._recurrent_values(batch, last_rows)
        else:
            last_obs = take(batch[SampleBatch.NEXT_OBS], last_rows)
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
        # A recurrent module's rows run as zero-padded sequences; the loss gets the real
        # rows' outputs back (the mask), so PPO's row-wise loss applies unchanged.
        module: Any = self._sequence_view(batch) if self.is_recurrent() else self.model
        self.model.train()
        try:
            loss, stats = self.loss_fn(module, tensors, self.config)
        finally:
            self.model.eval()
        if Columns.VALUE_TARGETS in tensors and Columns.VF_PREDS in tensors:
            stats["vf_explained_var"] = explained_variance(
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


class _SequenceRows:
    """A recurrent module seen row by row: ``forward_train`` on rows runs their sequences.

    The rows' observations are zero-padded into ``(num_sequences, T, ...)``, the module
    runs them from the sequences' ``STATE_IN``, and each output comes back as one row per
    real row (padded steps dropped: the loss mask). Other attributes are the module's.

    Args:
        module: The stateful module.
        layout: The rows' sequences.
        state_in: The module's ``STATE_IN`` at each sequence's start (nested tensors).
    """

    def __init__(self, module: RLModule, layout: SequenceLayout, state_in: Any) -> None:
        self.module = module
        self.layout = layout
        self.state_in = state_in

    def forward_train(self, batch: Mapping[str, Any], **kwargs: Any) -> dict[str, Any]:
        """The module's ``forward_train`` over the rows' sequences, one output per row."""
        obs = tree_map(self.layout.pad, batch[Columns.OBS])
        out = self.module.forward_train(
            {Columns.OBS: obs, Columns.STATE_IN: self.state_in}, **kwargs
        )
        return {k: tree_map(self.layout.unpad, v) for k, v in out.items() if k != Columns.STATE_OUT}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.module, name)
