"""Off-policy estimates of a module's value from logged single-agent episodes.

:func:`estimate` computes, from episodes a behaviour policy logged (with its
``action_logp`` per step), what a target module would earn:

- ``"is"``: step-wise importance sampling, ``sum_t gamma^t p_t r_t`` per episode, with
  ``p_t`` the product of the ratios ``pi_e(a_k|s_k) / pi_b(a_k|s_k)`` for ``k <= t``;
- ``"wis"``: step-wise weighted importance sampling: ``p_t`` divided by ``w_t``, the mean
  of ``p_t`` over the episodes that last at least ``t + 1`` steps;
- ``"dm"``: the direct method, ``sum_a pi_e(a|s_0) Q(s_0, a)`` with ``Q`` fitted to the
  data by fitted Q evaluation (:class:`FittedQEvaluation`);
- ``"dr"``: doubly robust, ``V_t = V(s_t) + rho_t (r_t + gamma V_{t+1} - Q(s_t, a_t))``
  backwards from ``V_T = 0``, with the single-step ratio ``rho_t``.

These are the per-episode formulas of RLlib 2.60's ``ImportanceSampling``,
``WeightedImportanceSampling``, ``DirectMethod`` and ``DoublyRobust`` estimators
(``estimate()`` on a batch split by episode), and the summary is theirs: the means over
episodes, the population standard deviations (``np.std``), ``v_gain = v_target /
max(v_behavior, 1e-8)`` and ``v_delta``; the standard errors (sample standard deviation
over the square root of the number of episodes, as their ``estimate_on_dataset`` reports
``v_gain_ste``) are added. The loops over steps are numpy operations on ``(episodes,
steps)`` arrays padded to the longest episode.

The target's probabilities: the module's ``forward_inference`` outputs as inputs of
``get_inference_action_dist_cls()``, the full distribution (not its greedy action), as
RLlib's estimators take ``Policy.compute_log_likelihoods`` (the model's distribution
with ``explore=False``); ``explore=True`` takes ``forward_exploration`` and the
exploration distribution instead. ``epsilon_greedy`` mixes the target with the uniform
policy over a Discrete action space, as RLlib's ``epsilon_greedy`` argument does; unlike
RLlib, the mixed policy is also the one the Q model is fitted for and DM/DR average over
(RLlib's FQE model ignores ``epsilon_greedy``). Neither RLlib nor this module clips the
importance ratios.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from fastrollout.core.tree import concat, leaves, take, tree_map

__all__ = ["METHODS", "FittedQEvaluation", "estimate"]

#: The methods :func:`estimate` knows, in the order it reports them.
METHODS = ("is", "wis", "dm", "dr")

# RLlib's floor of v_behavior in v_gain.
_GAIN_FLOOR = 1e-8

# Rows per forward pass of the target module (bounds the memory of one pass).
_FORWARD_ROWS = 65_536


# -- logged data --------------------------------------------------------------------------


@dataclasses.dataclass
class LoggedSteps:
    """The steps of N episodes, concatenated episode after episode.

    Attributes:
        obs: Observations ``s_t`` of every step, ``(S, ...)`` (or a dict/tuple of such).
        next_obs: The observations after each step, ``s_{t+1}``.
        actions: Actions, ``(S, ...)``.
        rewards: Rewards, float64 ``(S,)``.
        logp_behavior: The behaviour policy's ``action_logp``, float64 ``(S,)``.
        terminated: True at the last step of a terminated episode, ``(S,)``.
        lengths: Steps per episode, ``(N,)``.
    """

    obs: Any
    next_obs: Any
    actions: np.ndarray
    rewards: np.ndarray
    logp_behavior: np.ndarray
    terminated: np.ndarray
    lengths: np.ndarray

    @property
    def num_steps(self) -> int:
        return int(self.rewards.shape[0])

    def padded(self, values: np.ndarray, fill: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
        """``values`` of shape ``(S,)`` as ``(N, T_max)`` rows, and the mask of real steps."""
        lengths = self.lengths
        n, t_max = len(lengths), int(lengths.max(initial=0))
        mask = np.arange(t_max)[None, :] < lengths[:, None]
        out = np.full((n, t_max), fill, dtype=np.float64)
        out[mask] = values  # row-major: episode after episode, step after step
        return out, mask


def _join_chunks(episodes: Iterable[Any]) -> list[list[Any]]:
    """Groups episode chunks by id, in step order, and checks that each group is contiguous.

    Raises:
        TypeError: If an item is not a single-agent episode.
        ValueError: If the chunks of one episode leave a gap or overlap.
    """
    groups: dict[Any, list[Any]] = {}
    for i, episode in enumerate(episodes):
        if not hasattr(episode, "get_extra_model_outputs") or hasattr(episode, "agent_episodes"):
            raise TypeError(
                f"estimate() takes single-agent episodes (SingleAgentEpisode); item {i} is "
                f"a {type(episode).__name__}"
            )
        groups.setdefault(episode.id_, []).append(episode)
    joined = []
    for eps_id, chunks in groups.items():
        chunks.sort(key=lambda e: e.t_started)
        for before, after in itertools.pairwise(chunks):
            if before.t_started + len(before) != after.t_started:
                raise ValueError(
                    f"episode {eps_id!r}: its chunks are not contiguous (one covers steps "
                    f"{before.t_started}..{before.t_started + len(before)}, the next starts "
                    f"at {after.t_started})"
                )
        joined.append(chunks)
    return joined


def logged_steps(episodes: Iterable[Any]) -> LoggedSteps:
    """Collects the steps of logged episodes (chunks of one episode are joined by id).

    Args:
        episodes: ``SingleAgentEpisode`` objects, each with the extra model output
            ``action_logp`` at every step.

    Returns:
        The steps, with empty episodes (no step) left out.

    Raises:
        TypeError: If an item is not a single-agent episode.
        ValueError: If there is no step, an episode lacks ``action_logp`` or has a
            non-finite one, or the chunks of one episode are not contiguous.
    """
    obs, next_obs, actions, rewards, logps, terminated, lengths = [], [], [], [], [], [], []
    for chunks in _join_chunks(episodes):
        chunks = [c for c in chunks if len(c) > 0]
        if not chunks:
            continue
        for c in chunks:
            if "action_logp" not in c.extra_model_outputs:
                have = sorted(c.extra_model_outputs.keys())
                raise ValueError(
                    f"episode {c.id_!r} has no extra model output 'action_logp' (the "
                    f"behaviour policy's log-probability of each action, which off-policy "
                    f"estimation needs); it has {have}. Sample with a module whose "
                    "distribution gives log-probabilities."
                )
            observations = c.get_observations()
            obs.append(tree_map(lambda x: np.asarray(x)[:-1], observations))
            next_obs.append(tree_map(lambda x: np.asarray(x)[1:], observations))
            actions.append(np.asarray(c.get_actions()))
            rewards.append(np.asarray(c.get_rewards(), dtype=np.float64))
            logps.append(
                np.asarray(c.get_extra_model_outputs("action_logp"), dtype=np.float64).reshape(
                    len(c)
                )
            )
        length = sum(len(c) for c in chunks)
        done = np.zeros(length, dtype=bool)
        done[-1] = bool(chunks[-1].is_terminated)
        terminated.append(done)
        lengths.append(length)
    if not lengths:
        raise ValueError("estimate() needs at least one episode with at least one step")
    logp = np.concatenate(logps)
    if not np.isfinite(logp).all():
        bad = int(np.flatnonzero(~np.isfinite(logp))[0])
        raise ValueError(
            f"the logged action_logp must be finite; step {bad} (counted over all episodes) "
            f"has {logp[bad]}"
        )
    return LoggedSteps(
        obs=concat(obs),
        next_obs=concat(next_obs),
        actions=np.concatenate(actions),
        rewards=np.concatenate(rewards),
        logp_behavior=logp,
        terminated=np.concatenate(terminated),
        lengths=np.asarray(lengths, dtype=np.int64),
    )


# -- the target policy --------------------------------------------------------------------


class TargetPolicy:
    """Log-probabilities of a target module, optionally mixed with the uniform policy.

    Args:
        module: The fastrollout ``RLModule``.
        explore: Use ``forward_exploration`` and the exploration distribution (default:
            ``forward_inference`` and the inference distribution).
        epsilon_greedy: Probability of a uniformly random action (Discrete actions only).

    Raises:
        ValueError: If ``epsilon_greedy`` is outside ``[0, 1]`` or given for a
            non-Discrete action space.
    """

    def __init__(self, module: Any, *, explore: bool = False, epsilon_greedy: float = 0.0):
        import gymnasium as gym

        if not 0.0 <= epsilon_greedy <= 1.0:
            raise ValueError(f"epsilon_greedy must be in [0, 1], got {epsilon_greedy}")
        self.module = module
        self.explore = explore
        self.epsilon_greedy = float(epsilon_greedy)
        space = getattr(module, "action_space", None)
        self.num_actions = int(space.n) if isinstance(space, gym.spaces.Discrete) else None
        self.action_start = int(space.start) if isinstance(space, gym.spaces.Discrete) else 0
        if self.epsilon_greedy > 0 and self.num_actions is None:
            raise ValueError(
                "epsilon_greedy needs a Discrete action space; the module's is "
                f"{space if space is not None else 'unknown'}"
            )

    def _dists(self, obs: Any) -> Iterable[tuple[int, int, Any]]:
        """Yields ``(start, stop, distribution)`` for slices of the observations."""
        import torch

        from fastrollout.core.columns import Columns
        from fastrollout.modules.device import to_device

        module = self.module
        forward = module.forward_exploration if self.explore else module.forward_inference
        dist_cls = (
            module.get_exploration_action_dist_cls()
            if self.explore
            else module.get_inference_action_dist_cls()
        )
        rows = len(next(leaves(obs)))
        device = getattr(module, "device", None)
        with torch.no_grad():
            for start in range(0, rows, _FORWARD_ROWS):
                stop = min(rows, start + _FORWARD_ROWS)
                batch = {Columns.OBS: to_device(take(obs, slice(start, stop)), device)}
                out = forward(batch)
                yield start, stop, dist_cls.from_logits(out[Columns.ACTION_DIST_INPUTS])

    def _mix(self, logp: np.ndarray) -> np.ndarray:
        eps = self.epsilon_greedy
        if eps == 0.0:
            return logp
        assert self.num_actions is not None
        with np.errstate(divide="ignore"):
            return np.logaddexp(np.log1p(-eps) + logp, math.log(eps / self.num_actions))

    def logp(self, obs: Any, actions: np.ndarray) -> np.ndarray:
        """``log pi_e(a_t | s_t)`` for every row, float64."""
        import torch

        from fastrollout.modules.device import to_tensor

        out = np.empty(len(actions), dtype=np.float64)
        for start, stop, dist in self._dists(obs):
            device = getattr(self.module, "device", None)
            a = to_tensor(np.ascontiguousarray(actions[start:stop]), device)
            if self.num_actions is not None:
                a = a.long() - self.action_start
            lp = dist.logp(a)
            out[start:stop] = lp.detach().to(torch.float64).cpu().numpy().reshape(stop - start)
        return self._mix(out)

    def probs(self, obs: Any) -> np.ndarray:
        """``pi_e(a | s_t)`` for every row and every action of a Discrete space, ``(S, n)``.

        Raises:
            ValueError: If the action space is not Discrete.
        """
        import torch

        n = self.num_actions
        if n is None:
            raise ValueError(
                "the direct method and doubly robust need a Discrete action space (the Q "
                "model sums over all actions); the module's is "
                f"{getattr(self.module, 'action_space', 'unknown')}"
            )
        chunks = []
        for _start, stop, dist in self._dists(obs):
            rows = stop - _start
            device = getattr(self.module, "device", None)
            cols = [
                dist.logp(torch.full((rows,), a, dtype=torch.long, device=device))
                .to(torch.float64)
                .cpu()
                .numpy()
                for a in range(n)
            ]
            chunks.append(np.stack(cols, axis=1))
        logp = np.concatenate(chunks) if chunks else np.empty((0, n))
        return np.exp(self._mix(logp))


# -- fitted Q evaluation ------------------------------------------------------------------


class FittedQEvaluation:
    """A Q model of the target policy, fitted to logged steps (fitted Q evaluation).

    Each iteration runs one pass over the shuffled steps in minibatches, regressing
    ``Q(s, a)`` on ``r + gamma (1 - terminated) sum_a' pi_e(a'|s') Q_target(s', a')``,
    then moves the target network towards the trained one (``polyak_coef``; 1: a copy).
    It stops early once an iteration's mean loss falls below ``min_loss_threshold``. The
    defaults are those of RLlib's ``FQETorchModel`` except ``n_iters`` (RLlib runs one
    iteration per call of its estimator's ``train``, once per evaluation; here the model
    is fitted once) and the minibatch size.

    Args:
        obs_space: The observation space (observations are flattened as the default
            module does: Box flattened, Discrete one-hot, ...).
        num_actions: The size of the Discrete action space.
        gamma: The discount.
        hiddens: Hidden layer sizes of the MLP (ReLU).
        n_iters: Iterations (passes over the data, each followed by a target update).
        lr: Adam's learning rate.
        minibatch_size: Steps per gradient step (None: all steps).
        clip_grad_norm: Gradient norm clip.
        polyak_coef: Weight of the trained network in each target update.
        min_loss_threshold: Stop once an iteration's mean loss is below this.
        seed: Seed of the initial weights and the shuffling.
    """

    def __init__(
        self,
        obs_space: Any,
        num_actions: int,
        *,
        gamma: float,
        hiddens: Sequence[int] = (32, 32, 32),
        n_iters: int = 200,
        lr: float = 1e-3,
        minibatch_size: int | None = 256,
        clip_grad_norm: float = 100.0,
        polyak_coef: float = 1.0,
        min_loss_threshold: float = 1e-4,
        seed: int | None = 0,
    ) -> None:
        import torch
        from torch import nn

        from fastrollout.modules.default import obs_preprocessor

        self.gamma = float(gamma)
        self.num_actions = int(num_actions)
        self.n_iters = int(n_iters)
        self.minibatch_size = minibatch_size
        self.clip_grad_norm = float(clip_grad_norm)
        self.polyak_coef = float(polyak_coef)
        self.min_loss_threshold = float(min_loss_threshold)
        self.seed = seed
        self.losses: list[float] = []
        dim, self._preprocess = obs_preprocessor(obs_space)

        def mlp() -> nn.Sequential:
            layers: list[nn.Module] = []
            last = dim
            for h in hiddens:
                layers += [nn.Linear(last, int(h)), nn.ReLU()]
                last = int(h)
            layers.append(nn.Linear(last, self.num_actions))
            return nn.Sequential(*layers)

        with torch.random.fork_rng(devices=[]):
            if seed is not None:
                torch.manual_seed(seed)
            self.q = mlp().double()
            self.q_target = mlp().double()
        self.q_target.load_state_dict(self.q.state_dict())
        self.optimizer = torch.optim.Adam(self.q.parameters(), lr=lr)

    def _features(self, obs: Any) -> Any:
        from fastrollout.modules.device import to_device

        return self._preprocess(to_device(obs, None)).double()

    def fit(
        self, steps: LoggedSteps, next_probs: np.ndarray, *, action_start: int = 0
    ) -> list[float]:
        """Fits the Q model.

        Args:
            steps: The logged steps.
            next_probs: ``pi_e(a | s_{t+1})`` per step and action, ``(S, n)``.
            action_start: The Discrete action space's ``start`` (action ``start + i`` is
                column ``i``).

        Returns:
            The mean loss of each iteration.
        """
        import torch

        x = self._features(steps.obs)
        x_next = self._features(steps.next_obs)
        actions = torch.as_tensor(steps.actions.reshape(-1).astype(np.int64) - action_start)
        rewards = torch.as_tensor(steps.rewards)
        not_done = torch.as_tensor(1.0 - steps.terminated.astype(np.float64))
        pi_next = torch.as_tensor(next_probs)
        rows = steps.num_steps
        size = self.minibatch_size or rows
        rng = np.random.default_rng(self.seed)
        for _ in range(self.n_iters):
            order = torch.as_tensor(rng.permutation(rows))
            losses = []
            for start in range(0, rows, size):
                idx = order[start : start + size]
                q_sa = self.q(x[idx]).gather(1, actions[idx, None]).squeeze(1)
                with torch.no_grad():
                    v_next = (self.q_target(x_next[idx]) * pi_next[idx]).sum(dim=1)
                    target = rewards[idx] + self.gamma * not_done[idx] * v_next
                loss = torch.mean((target - q_sa) ** 2)
                self.optimizer.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(self.q.parameters(), self.clip_grad_norm)
                self.optimizer.step()
                losses.append(float(loss.item()))
            self.losses.append(sum(losses) / len(losses))
            if self.losses[-1] < self.min_loss_threshold:
                break
            self._update_target()
        return self.losses

    def _update_target(self) -> None:
        import torch

        c = self.polyak_coef
        with torch.no_grad():
            for t, s in zip(self.q_target.parameters(), self.q.parameters(), strict=True):
                t.mul_(1.0 - c).add_(c * s)

    def q_values(self, obs: Any) -> np.ndarray:
        """``Q(s, a)`` for every row and action, float64 ``(S, n)``."""
        import torch

        with torch.no_grad():
            return self.q(self._features(obs)).numpy()


# -- the estimators -----------------------------------------------------------------------


def _discounts(gamma: float, t_max: int) -> np.ndarray:
    return gamma ** np.arange(t_max, dtype=np.float64)


def _summary(v_behavior: np.ndarray, v_target: np.ndarray) -> dict[str, float]:
    """RLlib's summary over per-episode values, with standard errors added."""
    n = len(v_behavior)
    b, t = float(np.mean(v_behavior)), float(np.mean(v_target))
    # Sample standard deviation (ddof 1) for the standard errors; 0 for one episode.
    b_ste = float(np.std(v_behavior, ddof=1) / math.sqrt(n)) if n > 1 else 0.0
    t_ste = float(np.std(v_target, ddof=1) / math.sqrt(n)) if n > 1 else 0.0
    floor = max(b, _GAIN_FLOOR)
    return {
        "v_behavior": b,
        "v_behavior_std": float(np.std(v_behavior)),
        "v_behavior_ste": b_ste,
        "v_target": t,
        "v_target_std": float(np.std(v_target)),
        "v_target_ste": t_ste,
        "v_gain": t / floor,
        "v_gain_ste": t_ste / floor,
        "v_delta": t - b,
        "num_episodes": float(n),
    }


def _per_episode(
    steps: LoggedSteps,
    method: str,
    gamma: float,
    ratio: np.ndarray,
    q_sa: np.ndarray | None,
    v_s: np.ndarray | None,
) -> tuple[np.ndarray, np.ndarray]:
    """Per-episode ``(v_behavior, v_target)`` of one method (arrays of shape ``(N,)``)."""
    rewards, mask = steps.padded(steps.rewards)
    disc = _discounts(gamma, rewards.shape[1])
    v_behavior = rewards @ disc
    rho, _ = steps.padded(ratio, fill=1.0)
    p = np.cumprod(rho, axis=1)  # p_t = rho_0 ... rho_t; padding keeps the product
    if method == "is":
        v_target = (p * rewards) @ disc
    elif method == "wis":
        counts = mask.sum(axis=0)
        w = np.where(mask, p, 0.0).sum(axis=0) / counts
        # Where every episode's p_t is 0, so is every term; RLlib divides 0 by 0 (NaN).
        with np.errstate(divide="ignore", invalid="ignore"):
            normalised = np.where(w > 0, p / w, 0.0)
        v_target = (normalised * rewards) @ disc
    elif method == "dm":
        assert v_s is not None
        starts = np.concatenate([[0], np.cumsum(steps.lengths)[:-1]])
        v_target = v_s[starts]
    else:  # "dr": V_0 = sum_t gamma^t (p_{t-1} V(s_t) + p_t (r_t - Q(s_t, a_t)))
        assert v_s is not None and q_sa is not None
        v_pad, _ = steps.padded(v_s)
        q_pad, _ = steps.padded(q_sa)
        p_before = np.concatenate([np.ones((len(p), 1)), p[:, :-1]], axis=1)
        v_target = (p_before * v_pad + p * (rewards - q_pad)) @ disc
    return v_behavior, v_target


def estimate(
    episodes: Iterable[Any],
    module: Any,
    methods: Sequence[str] = METHODS,
    *,
    gamma: float = 0.99,
    explore: bool = False,
    epsilon_greedy: float = 0.0,
    fqe: Mapping[str, Any] | None = None,
    q_model: FittedQEvaluation | None = None,
) -> dict[str, dict[str, float]]:
    """Off-policy estimates of ``module``'s value from episodes a behaviour policy logged.

    Args:
        episodes: ``SingleAgentEpisode`` objects with the extra model output
            ``action_logp`` (the behaviour policy's log-probability of each action).
            Chunks of one episode (same id) are joined; the discount restarts at each
            episode's first logged step.
        module: The target ``RLModule``, or None (or ``"behavior"``) to evaluate the
            behaviour policy against itself from the logged log-probabilities (IS and WIS
            only; their ``v_gain`` is then 1).
        methods: Any of ``"is"``, ``"wis"``, ``"dm"``, ``"dr"``.
        gamma: The discount (RLlib's estimators take the algorithm's ``gamma``).
        explore: Take the target's exploration distribution (``forward_exploration``)
            instead of its inference one.
        epsilon_greedy: Evaluate the target mixed with a uniformly random action with
            this probability (Discrete actions).
        fqe: Keyword arguments of :class:`FittedQEvaluation` for DM and DR.
        q_model: An already fitted Q model for DM and DR (then ``fqe`` is not used).

    Returns:
        ``{method: summary}``, each summary with ``v_behavior``, ``v_target`` (means over
        episodes), their ``_std`` (population) and ``_ste`` (standard errors),
        ``v_gain`` (``v_target / max(v_behavior, 1e-8)``), ``v_gain_ste``, ``v_delta``,
        ``num_episodes``; DM and DR add ``q_loss``, the Q model's last iteration loss.

    Raises:
        ValueError: An unknown method, no steps, an episode without ``action_logp``,
            DM/DR without a target module or with a non-Discrete action space.
        TypeError: An item that is not a single-agent episode.

    Examples:
        >>> import fastrollout as fr
        >>> from fastrollout.offline import estimate
        >>> runner = fr.SingleAgentEnvRunner(
        ...     config=fr.RunnerConfig().environment("CartPole-v1").debugging(seed=0))
        >>> episodes = runner.sample(num_episodes=4)
        >>> round(estimate(episodes, runner.module, ["wis"])["wis"]["v_gain"], 6)
        1.0
    """
    methods = tuple(methods)
    unknown = [m for m in methods if m not in METHODS]
    if unknown or not methods:
        raise ValueError(
            f"unknown off-policy estimation method(s) {unknown}; known: {list(METHODS)}"
            if unknown
            else "estimate() needs at least one method"
        )
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")
    steps = logged_steps(episodes)
    behaviour_only = module is None or (isinstance(module, str) and module == "behavior")
    needs_q = [m for m in methods if m in ("dm", "dr")]
    if behaviour_only:
        if needs_q:
            raise ValueError(
                f"{'/'.join(needs_q)} need a target module (the Q model averages over the "
                "target's probabilities of every action); the logged behaviour gives only "
                "the log-probability of the action taken, so evaluate it with 'is'/'wis'"
            )
        if epsilon_greedy:
            raise ValueError("epsilon_greedy needs a target module")
        ratio = np.ones(steps.num_steps)
    else:
        policy = TargetPolicy(module, explore=explore, epsilon_greedy=epsilon_greedy)
        ratio = np.exp(policy.logp(steps.obs, steps.actions) - steps.logp_behavior)
    q_sa = v_s = None
    loss = math.nan
    if needs_q:
        obs_space = getattr(module, "observation_space", None)
        probs = policy.probs(steps.obs)
        if q_model is None:
            assert policy.num_actions is not None
            q_model = FittedQEvaluation(
                obs_space, policy.num_actions, gamma=gamma, **dict(fqe or {})
            )
            q_model.fit(steps, policy.probs(steps.next_obs), action_start=policy.action_start)
        q_all = q_model.q_values(steps.obs)
        index = steps.actions.reshape(-1).astype(np.int64) - policy.action_start
        q_sa = np.take_along_axis(q_all, index[:, None], axis=1)[:, 0]
        v_s = (q_all * probs).sum(axis=1)
        loss = q_model.losses[-1] if q_model.losses else math.nan
    results: dict[str, dict[str, float]] = {}
    for method in methods:
        v_behavior, v_target = _per_episode(steps, method, gamma, ratio, q_sa, v_s)
        results[method] = _summary(v_behavior, v_target)
        if method in ("dm", "dr"):
            results[method]["q_loss"] = float(loss)
    return results
