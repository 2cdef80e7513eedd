"""PPO from fastrollout episodes: GAE per episode chunk, the train batch, the loss, the update.

The pieces of a compact PPO trainer (``examples/ppo.py`` is the command line around
them). They take what a runner's ``sample(num_timesteps=...)`` returns under
``batch_mode="truncate_episodes"``: numpy'ized :class:`~fastrollout.SingleAgentEpisode`
chunks, or :class:`~fastrollout.MultiAgentEpisode` chunks whose agents' chunks are used
the same way, each routed to the module its ``module_id`` names.

A chunk of length ``T`` holds observations ``o_0 .. o_T`` (``T + 1`` of them; look-back
items before ``o_0`` are not part of it), actions, rewards and the ``action_logp`` the
runner recorded while exploring. Its steps enter the train batch once each:
``o_0 .. o_{T-1}`` with their actions. The last observation ``o_T`` is the value
bootstrap: after a terminal step its value is 0; otherwise (a truncated episode, or an
ongoing one cut by ``sample``) it is ``V(o_T)``. For a cut chunk, ``o_T`` is also the
first observation of the continuation the next ``sample`` call returns (whose look-back
holds ``o_{T-1}``), so every env step is counted once and bootstrapped from the
observation that follows it, never from a look-back item.

A stateful (recurrent) module trains on sequences, as RLlib's learner connectors lay them
out: each chunk's steps are split into sequences of ``model_config["max_seq_len"]``
steps, the last one zero-padded, with ``Columns.LOSS_MASK`` marking the real steps (every
mean of the loss is over those) and ``Columns.STATE_IN`` holding each sequence's state at
its first step: the ``STATE_OUT`` the runner recorded one step before it, which at a
chunk's first step is the module's initial state for an episode's start and the
look-back's last ``STATE_OUT`` for a continuation chunk. The bootstrap value ``V(o_T)``
is computed from the chunk's last ``STATE_OUT``, the state the runner acts on ``o_T``
with.

>>> import numpy as np
>>> adv, targets = compute_gae(
...     np.array([1.0, 1.0]), np.array([0.5, 0.5]), 0.0, gamma=1.0, lambda_=1.0
... )
>>> adv.tolist(), targets.tolist()
([1.5, 0.5], [2.0, 1.0])
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import numpy as np
import torch

from fastrollout._core import gae_segments
from fastrollout.core import DEFAULT_MODULE_ID, Columns
from fastrollout.core.tree import concat, take, to_tensor, tree_map
from fastrollout.modules import RLModule

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


@dataclasses.dataclass(frozen=True)
class PPOConfig:
    """PPO's hyperparameters (RLlib's names where RLlib has the setting).

    Args:
        gamma: Discount factor.
        lambda_: GAE's lambda.
        clip_param: The surrogate's clip range ``[1 - clip_param, 1 + clip_param]``.
        vf_clip_param: Upper bound of the squared value error per sample (RLlib's
            clipping); None (the default here, unlike RLlib's 10.0) for no bound, as a
            clipped squared error has no gradient for returns far from the estimate.
        vf_loss_coeff: Weight of the value loss.
        entropy_coeff: Weight of the entropy bonus.
        lr: Adam's learning rate.
        num_epochs: Passes over the train batch per update.
        minibatch_size: Samples per gradient step.
        grad_clip: Bound of the gradients' global norm (None, the default as in RLlib: no
            clipping). The norm covers policy and value parameters together, so while
            the value loss is large its gradients dominate it and a bound shrinks the
            policy's steps too.
        normalize_advantages: Scale each module's advantages to mean 0, std 1.
        seed: Seeds the minibatch shuffling (None: torch's global generator).

    Raises:
        ValueError: If a value is out of its range (named).
    """

    gamma: float = 0.99
    lambda_: float = 0.95
    clip_param: float = 0.2
    vf_clip_param: float | None = None
    vf_loss_coeff: float = 0.5
    entropy_coeff: float = 0.0
    lr: float = 3e-4
    num_epochs: int = 10
    minibatch_size: int = 256
    grad_clip: float | None = None
    normalize_advantages: bool = True
    seed: int | None = None

    def __post_init__(self) -> None:
        for name in ("gamma", "lambda_"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"PPOConfig.{name} must be in [0, 1], got {value}")
        for name in ("clip_param", "lr", "vf_clip_param", "grad_clip"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"PPOConfig.{name} must be > 0, got {value}")
        for name in ("vf_loss_coeff", "entropy_coeff"):
            value = getattr(self, name)
            if not value >= 0:
                raise ValueError(f"PPOConfig.{name} must be >= 0, got {value}")
        for name in ("num_epochs", "minibatch_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"PPOConfig.{name} must be an int >= 1, got {value!r}")


def compute_gae(
    rewards: np.ndarray,
    values: np.ndarray,
    bootstrap_value: float,
    *,
    gamma: float,
    lambda_: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Generalized advantage estimates of one episode chunk.

    Args:
        rewards: ``r_0 .. r_{T-1}``, shape ``(T,)``.
        values: ``V(o_0) .. V(o_{T-1})``, shape ``(T,)``.
        bootstrap_value: ``V(o_T)``, or 0 if the chunk ends with a terminal step.
        gamma: Discount factor.
        lambda_: GAE's lambda.

    Returns:
        ``(advantages, value_targets)``, each shape ``(T,)`` float32;
        ``value_targets = advantages + values``.

    Raises:
        ValueError: If ``rewards`` and ``values`` are not 1-D of the same length.
    """
    rewards = np.asarray(rewards)
    values = np.asarray(values)
    if rewards.ndim != 1 or rewards.shape != values.shape:
        raise ValueError(
            f"compute_gae needs 1-D rewards and values of one length, got shapes "
            f"{rewards.shape} and {values.shape}"
        )
    return gae_segments(
        np.ascontiguousarray(rewards, dtype=np.float32),
        np.ascontiguousarray(values, dtype=np.float32),
        np.array([len(rewards)], dtype=np.int64),
        np.array([bootstrap_value], dtype=np.float32),
        gamma,
        lambda_,
    )


def iter_agent_chunks(episodes: Iterable[Any]) -> Iterator[tuple[str, Any]]:
    """The single-agent chunks of ``episodes`` with the module id each belongs to.

    Args:
        episodes: SingleAgentEpisodes and/or MultiAgentEpisodes (each agent's chunk is
            yielded; agents without a step in the chunk are skipped).

    Yields:
        ``(module_id, SingleAgentEpisode)``; ``DEFAULT_MODULE_ID`` where the chunk names
        no module.
    """
    for episode in episodes:
        agent_episodes = getattr(episode, "agent_episodes", None)
        chunks = [episode] if agent_episodes is None else list(agent_episodes.values())
        for chunk in chunks:
            if len(chunk) == 0:
                continue
            module_id = chunk.module_id
            yield (DEFAULT_MODULE_ID if module_id is None else module_id), chunk


def _describe(chunk: Any) -> str:
    return f"episode chunk {chunk.id_} (agent {chunk.agent_id!r}, t_started={chunk.t_started})"


def build_ppo_batch(
    episodes: Iterable[Any],
    modules: Mapping[str, RLModule],
    *,
    gamma: float = 0.99,
    lambda_: float = 0.95,
) -> dict[str, dict[str, Any]]:
    """Builds the train batch of each module from episode chunks, with GAE.

    One value forward per module covers all its chunks' observations (``T + 1`` per
    chunk: the steps and the bootstrap observation).

    Args:
        episodes: Numpy'ized chunks from ``sample()`` (single- or multi-agent).
        modules: The modules to train by id (a ``MultiRLModule`` or a dict); each needs
            ``compute_values``.
        gamma: Discount factor.
        lambda_: GAE's lambda.

    Returns:
        ``{module_id: {column: tensor}}`` on each module's device with ``Columns.OBS``,
        ``ACTIONS``, ``ACTION_LOGP``, ``VF_PREDS`` (the values before the update),
        ``ADVANTAGES`` and ``VALUE_TARGETS``, one row per env step of the module's
        agents. For a stateful module a row is a sequence: those columns are
        ``(N, max_seq_len, ...)``, zero-padded, plus ``STATE_IN`` (each sequence's state
        at its first step), ``LOSS_MASK`` (True at real steps) and ``SEQ_LENS``. Modules
        without steps are left out.

    Raises:
        ValueError: If a chunk is not numpy'ized or has no ``action_logp`` (it was not
            sampled with ``explore=True`` by the policy), naming the chunk; for a stateful
            module, if a chunk has no ``state_out`` (or a continuation chunk none in its
            look-back) or the module's ``model_config`` has no ``max_seq_len``.
        KeyError: If a chunk belongs to a module not in ``modules``.
        TypeError: If a module has no ``compute_values``.
    """
    per_module: dict[str, list[Any]] = {}
    for module_id, chunk in iter_agent_chunks(episodes):
        if module_id not in modules:
            raise KeyError(
                f"{_describe(chunk)} belongs to module {module_id!r}, which is not among "
                f"the modules to train {sorted(map(str, modules))}"
            )
        if not chunk.is_numpy:
            raise ValueError(f"{_describe(chunk)} is not numpy'ized; call to_numpy() first")
        if Columns.ACTION_LOGP not in chunk.extra_model_outputs:
            raise ValueError(
                f"{_describe(chunk)} has no {Columns.ACTION_LOGP!r}: PPO needs episodes "
                "sampled by the policy with explore=True (not random actions)"
            )
        per_module.setdefault(module_id, []).append(chunk)

    batches: dict[str, dict[str, Any]] = {}
    for module_id, chunks in per_module.items():
        module = modules[module_id]
        compute_values = getattr(type(module), "compute_values", None)
        if compute_values is None:
            raise TypeError(
                f"module {module_id!r} ({type(module).__name__}) has no compute_values(); "
                "PPO needs a value function"
            )
        is_stateful = getattr(module, "is_stateful", None)
        if callable(is_stateful) and is_stateful():
            batch = _sequence_batch(module_id, module, chunks, gamma, lambda_)
        else:
            batch = _step_batch(module, chunks, gamma, lambda_)
        batches[module_id] = {k: to_tensor(v, module.device) for k, v in batch.items()}
    return batches


def _step_batch(
    module: RLModule, chunks: list[Any], gamma: float, lambda_: float
) -> dict[str, Any]:
    """One row per step of a feed-forward module's chunks (numpy), with GAE."""
    all_obs = concat([chunk.get_observations() for chunk in chunks])
    with torch.no_grad():
        values = type(module).compute_values(  # type: ignore[attr-defined]
            module, {Columns.OBS: to_tensor(all_obs, module.device)}
        )
    values = values.float().cpu().numpy()
    lengths = np.array([len(c) for c in chunks], dtype=np.int64)
    # Each chunk's T steps are followed by its bootstrap observation in all_obs.
    bootstrap_rows = np.cumsum(lengths + 1) - 1
    rows = np.ones(len(values), bool)
    rows[bootstrap_rows] = False
    terminated = np.array([c.is_terminated for c in chunks])
    bootstraps = np.where(terminated, 0.0, values[bootstrap_rows]).astype(np.float32)
    vf_preds = np.ascontiguousarray(values[rows], dtype=np.float32)
    rewards = np.concatenate([c.get_rewards() for c in chunks]).astype(np.float32)
    advantages, targets = gae_segments(rewards, vf_preds, lengths, bootstraps, gamma, lambda_)
    return {
        Columns.OBS: take(all_obs, rows),
        Columns.ACTIONS: concat([chunk.get_actions() for chunk in chunks]),
        Columns.ACTION_LOGP: np.concatenate(
            [chunk.get_extra_model_outputs(Columns.ACTION_LOGP) for chunk in chunks]
        ).astype(np.float32),
        Columns.VF_PREDS: vf_preds,
        Columns.ADVANTAGES: advantages,
        Columns.VALUE_TARGETS: targets,
    }


def _max_seq_len(module_id: str, module: RLModule) -> int:
    value = module.model_config.get("max_seq_len")
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(
            f"module {module_id!r} ({type(module).__name__}) is stateful and needs "
            f"model_config['max_seq_len'], an int >= 1, to train on sequences; got {value!r}"
        )
    return value


def _as_numpy(x: Any) -> np.ndarray:
    """A tensor (detached, on the host) or array-like as a numpy array."""
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().numpy()
    return np.asarray(x)


def _state_before(chunk: Any, module: RLModule) -> Any:
    """The recurrent state the chunk's first step was computed from (numpy, no batch axis).

    Raises:
        ValueError: A continuation chunk without a ``STATE_OUT`` in its look-back.
    """
    if chunk.t_started == 0:
        return tree_map(_as_numpy, module.get_initial_state())
    try:
        return chunk.get_extra_model_outputs(Columns.STATE_OUT, -1, neg_index_as_lookback=True)
    except IndexError:
        raise ValueError(
            f"{_describe(chunk)} continues an episode but has no {Columns.STATE_OUT!r} in its "
            "look-back to start from; sample with episode_lookback_horizon >= 1"
        ) from None


def _in_sequences(x: np.ndarray, num_sequences: int, max_seq_len: int) -> np.ndarray:
    """``(T, ...)`` rows as ``(num_sequences, max_seq_len, ...)``, zero-padded at the end."""
    out = np.zeros((num_sequences * max_seq_len, *x.shape[1:]), dtype=x.dtype)
    out[: len(x)] = x
    return out.reshape(num_sequences, max_seq_len, *x.shape[1:])


def _sequence_batch(
    module_id: str, module: RLModule, chunks: list[Any], gamma: float, lambda_: float
) -> dict[str, Any]:
    """One row per ``max_seq_len`` sequence of a stateful module's chunks, with GAE."""
    seq_len = _max_seq_len(module_id, module)
    obs, actions, logp, state_in, masks = [], [], [], [], []
    last_obs, last_state = [], []
    for chunk in chunks:
        if Columns.STATE_OUT not in chunk.extra_model_outputs:
            raise ValueError(
                f"{_describe(chunk)} has no {Columns.STATE_OUT!r}, which module {module_id!r} "
                "is stateful and needs: sample it with the module"
            )
        length = len(chunk)
        n = -(-length // seq_len)
        chunk_obs = chunk.get_observations()
        state_outs = chunk.get_extra_model_outputs(Columns.STATE_OUT)
        # Sequence k starts at step k * L, whose state in is the state out of step k * L - 1.
        state_in.append(
            tree_map(
                lambda before, outs: np.concatenate([before[None], outs[:-1]])[::seq_len],
                _state_before(chunk, module),
                state_outs,
            )
        )
        pad = functools.partial(_in_sequences, num_sequences=n, max_seq_len=seq_len)
        obs.append(tree_map(pad, take(chunk_obs, slice(0, length))))
        actions.append(tree_map(pad, chunk.get_actions()))
        logp.append(pad(chunk.get_extra_model_outputs(Columns.ACTION_LOGP)))
        masks.append(pad(np.ones(length, bool)))
        last_obs.append(take(chunk_obs, slice(length, None)))
        last_state.append(tree_map(lambda outs: outs[-1:], state_outs))
    mask = np.concatenate(masks)
    batch = {
        Columns.OBS: concat(obs),
        Columns.STATE_IN: concat(state_in),
        Columns.ACTIONS: concat(actions),
        Columns.ACTION_LOGP: np.concatenate(logp).astype(np.float32),
        Columns.LOSS_MASK: mask,
        Columns.SEQ_LENS: mask.sum(axis=1).astype(np.int64),
    }
    device = module.device
    with torch.no_grad():
        values = type(module).compute_values(  # type: ignore[attr-defined]
            module,
            {
                Columns.OBS: to_tensor(batch[Columns.OBS], device),
                Columns.STATE_IN: to_tensor(batch[Columns.STATE_IN], device),
            },
        )
        # V(o_T) from the state the runner acts on o_T with: the chunk's last state out.
        last = type(module).compute_values(  # type: ignore[attr-defined]
            module,
            {
                Columns.OBS: to_tensor(tree_map(lambda x: x[:, None], concat(last_obs)), device),
                Columns.STATE_IN: to_tensor(concat(last_state), device),
            },
        )
    # Row-major order of the mask's True entries is each chunk's steps in order.
    vf_preds = np.ascontiguousarray(values.float().cpu().numpy()[mask], dtype=np.float32)
    terminated = np.array([c.is_terminated for c in chunks])
    bootstraps = np.where(terminated, 0.0, last.float().cpu().numpy()[:, 0]).astype(np.float32)
    lengths = np.array([len(c) for c in chunks], dtype=np.int64)
    rewards = np.concatenate([c.get_rewards() for c in chunks]).astype(np.float32)
    advantages, targets = gae_segments(rewards, vf_preds, lengths, bootstraps, gamma, lambda_)
    for key, flat in (
        (Columns.VF_PREDS, vf_preds),
        (Columns.ADVANTAGES, advantages),
        (Columns.VALUE_TARGETS, targets),
    ):
        padded = np.zeros(mask.shape, np.float32)
        padded[mask] = flat
        batch[key] = padded
    return batch


# The per-step columns of a sequence batch that the loss reads at the real steps.
_STEP_COLUMNS = (
    Columns.ACTIONS,
    Columns.ACTION_LOGP,
    Columns.ADVANTAGES,
    Columns.VALUE_TARGETS,
)


def clipped_surrogate(
    ratio: torch.Tensor, advantages: torch.Tensor, clip_param: float
) -> torch.Tensor:
    """PPO's clipped surrogate objective per sample (to maximize).

    ``min(ratio * A, clip(ratio, 1 - eps, 1 + eps) * A)``: once the ratio has moved
    past the clip range in the direction the advantage rewards, the sample gives no
    gradient; in the other direction it does.

    Args:
        ratio: ``pi(a|s) / pi_old(a|s)``.
        advantages: The advantages, same shape.
        clip_param: ``eps``.

    Returns:
        The objective per sample.
    """
    clipped = torch.clamp(ratio, 1.0 - clip_param, 1.0 + clip_param)
    return torch.minimum(ratio * advantages, clipped * advantages)


def ppo_loss(
    module: RLModule, batch: Mapping[str, Any], config: PPOConfig
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO's loss on one (mini)batch: clipped surrogate, value loss, entropy bonus.

    Args:
        module: The module (``forward_train`` must return ``ACTION_DIST_INPUTS`` and
            ``VF_PREDS``).
        batch: Rows of a :func:`build_ppo_batch` batch (sequences with ``STATE_IN`` and
            ``LOSS_MASK`` for a stateful module: only the masked steps count).
        config: The coefficients and clip ranges.

    Returns:
        ``(loss, stats)``: the scalar to minimize, and ``policy_loss``, ``vf_loss``,
        ``entropy``, ``mean_kl`` (estimated from the log-probabilities) and
        ``clip_fraction`` as floats.

    Raises:
        KeyError: If ``forward_train`` returns no ``VF_PREDS``.
    """
    mask = batch.get(Columns.LOSS_MASK)
    inputs = {Columns.OBS: batch[Columns.OBS]}
    if mask is not None:
        inputs[Columns.STATE_IN] = batch[Columns.STATE_IN]
    out = module.forward_train(inputs)
    if Columns.VF_PREDS not in out:
        raise KeyError(
            f"{type(module).__name__}.forward_train returned no {Columns.VF_PREDS!r} "
            f"(keys {sorted(out)}); PPO needs a value head"
        )
    dist_inputs, vf_preds = out[Columns.ACTION_DIST_INPUTS], out[Columns.VF_PREDS]
    if mask is not None:
        # Sequences: only the real steps enter the loss (and every mean below).
        dist_inputs, vf_preds = dist_inputs[mask], vf_preds[mask]
        batch = {k: take(batch[k], mask) for k in _STEP_COLUMNS}
    dist = module.get_train_action_dist_cls().from_logits(dist_inputs)
    logp = dist.logp(batch[Columns.ACTIONS])
    log_ratio = logp - batch[Columns.ACTION_LOGP]
    ratio = torch.exp(log_ratio)
    surrogate = clipped_surrogate(ratio, batch[Columns.ADVANTAGES], config.clip_param)
    vf_error = (vf_preds - batch[Columns.VALUE_TARGETS]) ** 2
    if config.vf_clip_param is not None:
        vf_error = torch.clamp(vf_error, max=config.vf_clip_param)
    entropy = dist.entropy()
    policy_loss = -surrogate.mean()
    vf_loss = vf_error.mean()
    mean_entropy = entropy.mean()
    loss = policy_loss + config.vf_loss_coeff * vf_loss - config.entropy_coeff * mean_entropy
    with torch.no_grad():
        # The (ratio - 1) - log(ratio) estimator: non-negative, unbiased for KL(old||new).
        mean_kl = ((ratio - 1.0) - log_ratio).mean()
        clip_fraction = ((ratio - 1.0).abs() > config.clip_param).float().mean()
    stats = {
        "policy_loss": float(policy_loss.detach()),
        "vf_loss": float(vf_loss.detach()),
        "entropy": float(mean_entropy.detach()),
        "mean_kl": float(mean_kl),
        "clip_fraction": float(clip_fraction),
    }
    return loss, stats


def ppo_update(
    module: RLModule,
    optimizer: torch.optim.Optimizer,
    batch: Mapping[str, Any],
    config: PPOConfig,
    *,
    generator: torch.Generator | None = None,
) -> dict[str, float]:
    """Runs ``num_epochs`` passes of shuffled minibatch steps of :func:`ppo_loss`.

    Args:
        module: The module to train (its parameters are in ``optimizer``).
        optimizer: The optimizer.
        batch: One module's :func:`build_ppo_batch` batch.
        config: The hyperparameters.
        generator: Shuffles the rows (None: torch's global generator).

    Returns:
        The loss statistics averaged over the minibatch steps, plus
        ``num_gradient_steps``.
    """
    advantages = batch[Columns.ADVANTAGES]
    n = int(advantages.shape[0])
    mask = batch.get(Columns.LOSS_MASK)
    if mask is None:
        if config.normalize_advantages and n > 1:
            advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
        size = min(config.minibatch_size, n)
    else:
        # Rows are sequences: the statistics are the real steps', a minibatch holds
        # minibatch_size // max_seq_len sequences (at least one).
        valid = advantages[mask]
        if config.normalize_advantages and valid.numel() > 1:
            advantages = (advantages - valid.mean()) / (valid.std() + 1e-8)
        size = min(max(1, config.minibatch_size // int(mask.shape[1])), n)
    batch = {**batch, Columns.ADVANTAGES: advantages}
    totals: dict[str, float] = {}
    steps = 0
    module.train()
    for _ in range(config.num_epochs):
        order = torch.randperm(n, generator=generator).to(advantages.device)
        # The last short minibatch is dropped, as in RLlib's minibatch cycling, unless
        # it is the only one.
        for start in range(0, n - size + 1, size):
            minibatch = take(batch, order[start : start + size])
            loss, stats = ppo_loss(module, minibatch, config)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if config.grad_clip is not None:
                torch.nn.utils.clip_grad_norm_(module.parameters(), config.grad_clip)
            optimizer.step()
            steps += 1
            for key, value in stats.items():
                totals[key] = totals.get(key, 0.0) + value
    module.eval()
    result = {key: value / steps for key, value in totals.items()} if steps else {}
    result["num_gradient_steps"] = float(steps)
    return result


class PPOLearner:
    """Trains modules with PPO on episode chunks (one Adam optimizer per module).

    Args:
        modules: The full (not inference-only) modules by id; a ``MultiRLModule`` or a
            dict of RLModules.
        config: The hyperparameters.

    Raises:
        ValueError: If a module is inference-only (it has no value function).
    """

    def __init__(self, modules: Mapping[str, RLModule], config: PPOConfig | None = None) -> None:
        self.modules = modules
        self.config = config or PPOConfig()
        for module_id, module in modules.items():
            if module.inference_only:
                raise ValueError(
                    f"module {module_id!r} is inference-only; PPO needs the value function"
                )
        self.optimizers = {
            module_id: torch.optim.Adam(module.parameters(), lr=self.config.lr)
            for module_id, module in modules.items()
        }
        self._generator: torch.Generator | None = None
        if self.config.seed is not None:
            self._generator = torch.Generator().manual_seed(self.config.seed)

    def update(self, episodes: Iterable[Any]) -> dict[str, dict[str, float]]:
        """One PPO update of every module that has steps in ``episodes``.

        Args:
            episodes: Numpy'ized chunks from ``sample()``.

        Returns:
            ``{module_id: stats}``: :func:`ppo_update`'s statistics plus
            ``num_module_steps_trained`` and ``vf_explained_var``.
        """
        batches = build_ppo_batch(
            episodes, self.modules, gamma=self.config.gamma, lambda_=self.config.lambda_
        )
        results = {}
        for module_id, batch in batches.items():
            stats = ppo_update(
                self.modules[module_id],
                self.optimizers[module_id],
                batch,
                self.config,
                generator=self._generator,
            )
            targets, predictions = batch[Columns.VALUE_TARGETS], batch[Columns.VF_PREDS]
            mask = batch.get(Columns.LOSS_MASK)
            if mask is not None:
                targets, predictions = targets[mask], predictions[mask]
            stats["num_module_steps_trained"] = float(targets.shape[0])
            stats["vf_explained_var"] = explained_variance(targets, predictions)
            results[module_id] = stats
        return results

    def set_lr(self, lr: float) -> None:
        """Sets every optimizer's learning rate (for schedules).

        Args:
            lr: The learning rate.

        Raises:
            ValueError: If ``lr`` is negative.
        """
        if not lr >= 0:
            raise ValueError(f"learning rate must be >= 0, got {lr}")
        for optimizer in self.optimizers.values():
            for group in optimizer.param_groups:
                group["lr"] = lr

    def get_weights(self, *, inference_only: bool = True) -> dict[str, dict[str, np.ndarray]]:
        """The modules' weights, for a runner's ``set_weights``.

        Args:
            inference_only: Leave out what acting does not need (the value function).

        Returns:
            ``{module_id: {key: ndarray}}``.
        """
        return {
            module_id: module.get_state(inference_only=inference_only)
            for module_id, module in self.modules.items()
        }


def explained_variance(targets: torch.Tensor, predictions: torch.Tensor) -> float:
    """``1 - Var(targets - predictions) / Var(targets)`` (nan if the targets are constant)."""
    var = float(targets.var()) if targets.numel() > 1 else 0.0
    if var == 0.0:
        return math.nan
    return 1.0 - float((targets - predictions).var()) / var
