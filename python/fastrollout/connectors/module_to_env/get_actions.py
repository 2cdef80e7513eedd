"""``GetActions``: actions from the module's distribution inputs (or the module's own)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from fastrollout.connectors.connector_v2 import ConnectorV2
from fastrollout.core import Columns

__all__ = ["GetActions", "add_actions"]


class GetActions(ConnectorV2):
    """Samples ``Columns.ACTIONS`` per module from ``Columns.ACTION_DIST_INPUTS``.

    A module batch that already has actions (the module computed them) is left as it
    is. Otherwise, when exploring, actions are sampled from the module's exploration
    distribution and ``Columns.ACTION_LOGP`` is added (unless the module gave it);
    when not exploring (``explore`` false or None, as RLlib reads it), the inference
    distribution's deterministic version is used and no log-probability is added.
    One distribution and one sample per module batch.
    """

    def __call__(
        self,
        *,
        rl_module: Any,
        batch: dict[Any, Any],
        episodes: Sequence[Any],
        explore: bool | None = None,
        shared_data: dict[str, Any] | None = None,
        metrics: Any = None,
        **kwargs: Any,
    ) -> dict[Any, Any]:
        """Adds actions (and log-probabilities when exploring) to every module batch.

        Args:
            rl_module: The MultiRLModule (for the distribution classes).
            batch: ``{module_id: module outputs}``.
            episodes: Unused.
            explore: Sample stochastically (True) or greedily.
            shared_data: Unused.
            metrics: Unused.
            **kwargs: Unused.

        Returns:
            The batch.

        Raises:
            KeyError: If a module batch has neither actions nor distribution inputs.
        """
        return add_actions(rl_module, batch, explore, as_numpy=False)


def add_actions(
    rl_module: Any, batch: dict[Any, Any], explore: bool | None, *, as_numpy: bool
) -> dict[Any, Any]:
    """What ``GetActions`` does to every module batch (in place), without gradient.

    Args:
        rl_module: The MultiRLModule.
        batch: ``{module_id: module outputs}``.
        explore: Sample stochastically (True) or greedily.
        as_numpy: Put the sampled actions and log-probabilities in as host numpy arrays
            (what ``TensorToNumpy`` would make of them) rather than tensors; for the
            module-to-env pipeline's default tail, which converts them next anyway.

    Returns:
        The batch.

    Raises:
        KeyError: If a module batch has neither actions nor distribution inputs.
    """
    if torch.is_grad_enabled():  # the runners call this with autograd off already
        with torch.no_grad():
            _add_all(rl_module, batch, explore, as_numpy)
    else:
        _add_all(rl_module, batch, explore, as_numpy)
    return batch


def _add_all(rl_module: Any, batch: dict[Any, Any], explore: bool | None, as_numpy: bool) -> None:
    for module_id, out in batch.items():
        _add_module_actions(rl_module, module_id, out, explore, as_numpy)


def _add_module_actions(
    rl_module: Any, module_id: Any, out: dict[str, Any], explore: bool | None, as_numpy: bool
) -> None:
    if Columns.ACTIONS in out:
        return
    if Columns.ACTION_DIST_INPUTS not in out:
        raise KeyError(
            f"module {module_id!r} returned neither {Columns.ACTIONS!r} nor "
            f"{Columns.ACTION_DIST_INPUTS!r} (got {sorted(out)})"
        )
    module = rl_module[module_id]
    if explore:
        dist = module.get_exploration_action_dist_cls().from_logits(out[Columns.ACTION_DIST_INPUTS])
        if Columns.ACTION_LOGP in out:
            out[Columns.ACTIONS] = dist.sample()
        elif not hasattr(dist, "sample_with_logp"):
            # Another library's distribution (RLlib's, for its modules): draw, then score.
            actions = dist.sample()
            logp = dist.logp(actions)
            if as_numpy:
                actions, logp = actions.cpu().numpy(), logp.cpu().numpy()
            out[Columns.ACTIONS], out[Columns.ACTION_LOGP] = actions, logp
        elif as_numpy:
            out[Columns.ACTIONS], out[Columns.ACTION_LOGP] = dist.sample_with_logp_numpy()
        else:
            out[Columns.ACTIONS], out[Columns.ACTION_LOGP] = dist.sample_with_logp()
    else:
        dist = module.get_inference_action_dist_cls().from_logits(out[Columns.ACTION_DIST_INPUTS])
        actions = dist.to_deterministic().sample()
        out[Columns.ACTIONS] = actions
        if Columns.ACTION_LOGP not in out:
            # A greedy action is certain (log-probability 0, as RLlib records it), and a
            # chunk that continues across exploring and greedy calls has the column.
            inputs = out[Columns.ACTION_DIST_INPUTS]
            logp = torch.zeros(inputs.shape[0], dtype=torch.float32, device=inputs.device)
            out[Columns.ACTION_LOGP] = logp.numpy(force=True) if as_numpy else logp
