"""Torch action distributions built from a module's ``action_dist_inputs``.

The classes follow RLlib 2.60's ``TorchCategorical``, ``TorchDiagGaussian``,
``TorchMultiCategorical`` and ``TorchDeterministic``: the same constructors,
``from_logits``, ``sample``, ``rsample``, ``logp``, ``entropy``, ``kl``,
``to_deterministic`` and ``required_input_dim``, with the same numbers. Where RLlib is
wrong, these are right (each pinned by a test):

- ``TorchCategorical.rsample`` works when built from logits (RLlib's uses ``probs``,
  which is ``None`` then, and fails);
- ``TorchMultiCategorical.from_logits`` applies ``temperatures`` (RLlib ignores them),
  and ``sample``/``rsample`` honour ``sample_shape``;
- ``TorchDeterministic.logp`` has the batch shape of the other distributions' ``logp``
  (RLlib returns one zero per action component).

:func:`get_action_dist_cls` picks the class for an action space (MultiDiscrete gets a
subclass that knows the split of its logits, so ``from_logits(logits)`` alone works).
"""

from __future__ import annotations

import abc
import math
import threading
from collections.abc import Sequence
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
import torch
from torch.distributions import Categorical, Normal, kl_divergence

from fastrollout._core import categorical_draw

__all__ = [
    "TorchCategorical",
    "TorchDeterministic",
    "TorchDiagGaussian",
    "TorchDistribution",
    "TorchMultiCategorical",
    "get_action_dist_cls",
]

_Shape = torch.Size | Sequence[int]


def _size(sample_shape: _Shape | None) -> torch.Size:
    return torch.Size(() if sample_shape is None else sample_shape)


class TorchDistribution(abc.ABC):
    """An action distribution: sample actions, score them, compare distributions."""

    @classmethod
    @abc.abstractmethod
    def from_logits(cls, logits: torch.Tensor, **kwargs: Any) -> TorchDistribution:
        """Builds the distribution from a module's ``action_dist_inputs``.

        Args:
            logits: The inputs, shape ``(..., required_input_dim)``.
            **kwargs: Class-specific options.

        Returns:
            The distribution, one per leading index of ``logits``.
        """

    @staticmethod
    @abc.abstractmethod
    def required_input_dim(space: gym.Space, **kwargs: Any) -> int:
        """The size of the last axis of ``action_dist_inputs`` for ``space``.

        Args:
            space: The action space.
            **kwargs: Ignored (RLlib passes the model config).

        Returns:
            The number of inputs per action.

        Raises:
            TypeError: If the space is not one this distribution models.
        """

    @abc.abstractmethod
    def sample(self, *, sample_shape: _Shape | None = None) -> torch.Tensor:
        """Draws actions (no gradient).

        Args:
            sample_shape: Extra leading dimensions of independent draws.

        Returns:
            The actions, shape ``sample_shape + batch_shape + event_shape``.
        """

    def rsample(self, *, sample_shape: _Shape | None = None) -> torch.Tensor:
        """Draws actions with a gradient to the distribution's parameters.

        Args:
            sample_shape: Extra leading dimensions of independent draws.

        Returns:
            The actions.

        Raises:
            NotImplementedError: If the distribution has no reparameterised sample.
        """
        raise NotImplementedError(f"{type(self).__name__} has no rsample()")

    def sample_with_logp(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Draws one action per batch row and its log-probability.

        Returns:
            ``(actions, logp)``, as ``sample()`` and ``logp(actions)`` give them.
        """
        actions = self.sample()
        return actions, self.logp(actions)

    def sample_with_logp_numpy(self) -> tuple[np.ndarray, np.ndarray]:
        """``sample_with_logp()`` as host numpy arrays (for a runner's default tail).

        Returns:
            ``(actions, logp)`` as numpy arrays, the values ``sample_with_logp`` draws.
        """
        actions, logp = self.sample_with_logp()
        return actions.numpy(force=True), logp.numpy(force=True)

    @abc.abstractmethod
    def logp(self, value: torch.Tensor) -> torch.Tensor:
        """Log-probability (density) of ``value``, summed over action components.

        Args:
            value: Actions, shape ``batch_shape + event_shape``.

        Returns:
            One log-probability per action, shape ``batch_shape``.
        """

    @abc.abstractmethod
    def entropy(self) -> torch.Tensor:
        """Entropy, summed over action components.

        Returns:
            One entropy per distribution, shape ``batch_shape``.
        """

    @abc.abstractmethod
    def kl(self, other: TorchDistribution) -> torch.Tensor:
        """KL divergence ``KL(self || other)``, summed over action components.

        Args:
            other: A distribution of the same class and shape.

        Returns:
            One divergence per distribution, shape ``batch_shape``.
        """

    @abc.abstractmethod
    def to_deterministic(self) -> TorchDeterministic:
        """The greedy version of this distribution (its mode).

        Returns:
            A :class:`TorchDeterministic` whose sample is the most likely action.
        """

    def sample_and_logp(
        self, *, sample_shape: _Shape | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Draws actions and returns them with their log-probabilities.

        Args:
            sample_shape: Extra leading dimensions of independent draws.

        Returns:
            ``(actions, logp)``.
        """
        actions = self.sample(sample_shape=sample_shape)
        return actions, self.logp(actions)


def _check_same_class(this: TorchDistribution, other: TorchDistribution) -> None:
    if type(other) is not type(this) and not isinstance(other, type(this)):
        raise TypeError(
            f"kl() needs two {type(this).__name__} distributions, got {type(other).__name__}"
        )


class TorchCategorical(TorchDistribution):
    """Categorical distribution over ``{0, ..., K-1}`` (Discrete action spaces).

    Args:
        logits: Unnormalised log-probabilities, shape ``(..., K)``.
        probs: Probabilities, shape ``(..., K)`` (give exactly one of the two).

    Raises:
        ValueError: If not exactly one of ``logits`` and ``probs`` is given.
    """

    def __init__(
        self, logits: torch.Tensor | None = None, probs: torch.Tensor | None = None
    ) -> None:
        if (logits is None) == (probs is None):
            raise ValueError("TorchCategorical needs exactly one of `logits` and `probs`")
        self.logits = logits
        self.probs = probs
        self._torch_dist: Categorical | None = None

    @property
    def _dist(self) -> Categorical:
        # Built on first use: the runners' hot path (sample_with_logp) needs none.
        if self._torch_dist is None:
            self._torch_dist = Categorical(
                logits=self.logits, probs=self.probs, validate_args=False
            )
        return self._torch_dist

    def sample_with_logp(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Draws one category per batch row and its log-probability.

        The runners call this once per vector step, and torch spends about ten small
        tensor operations (1 µs each) on a draw. So float32 logits on the CPU that need
        no gradient, shaped ``(batch, categories)`` as a module's outputs are, are drawn
        natively (``_core.categorical_draw``: inverse CDF with one ``torch.rand``
        uniform per row, so seeding torch still decides the draws). Other logits are
        drawn the way torch's ``Categorical.sample`` draws them, with the same random
        numbers: the argmax of ``probs / q`` with ``q ~ Exp(1)``, which is what
        ``torch.multinomial`` does for one sample, without its nine checks of ``probs``.

        Returns:
            ``(indices, logp)``, each of shape ``batch_shape``: int64 and the logits'
            dtype, on the logits' device.

        Raises:
            ValueError: If the logits hold NaN or +inf, or a row is all -inf (a row
                with no valid category), as ``torch.multinomial`` refuses them.
        """
        logits = self.logits
        if logits is None:
            return super().sample_with_logp()
        native = self._native_draw()
        if native is not None:
            return torch.from_numpy(native[0]), torch.from_numpy(native[1])
        log_probs = torch.log_softmax(logits, dim=-1)
        probs = log_probs.exp()
        flat = probs if probs.dim() == 2 else probs.reshape(-1, probs.shape[-1])
        race = torch.empty_like(flat).exponential_(1)
        index = torch.div(flat, race).argmax(dim=-1)
        if probs.dim() != 2:
            index = index.reshape(probs.shape[:-1])
        logp = log_probs.gather(-1, index.unsqueeze(-1)).squeeze(-1)
        # Every invalid row (NaN or +inf logits, all -inf) makes its drawn logp NaN, and
        # a NaN survives the sum: one reduction and one read instead of multinomial's
        # checks of the whole probability tensor.
        if math.isnan(logp.sum().item()):
            raise ValueError(
                "categorical logits hold NaN or +inf, or a row with every logit -inf: "
                "no category can be drawn"
            )
        return index, logp

    def sample_with_logp_numpy(self) -> tuple[np.ndarray, np.ndarray]:
        """``sample_with_logp()`` as host numpy arrays (the native draw's own arrays).

        Returns:
            ``(indices, logp)``: int64 and float32 numpy arrays of shape ``batch_shape``.

        Raises:
            ValueError: As ``sample_with_logp``.
        """
        native = self._native_draw()
        if native is not None:
            return native
        return super().sample_with_logp_numpy()

    def _native_draw(self) -> tuple[np.ndarray, np.ndarray] | None:
        """The native draw of ``sample_with_logp``, or None where it does not apply."""
        logits = self.logits
        if logits is None or not native_draw_applies(logits):
            return None
        return categorical_draw_numpy(logits.numpy())

    @classmethod
    def from_logits(
        cls, logits: torch.Tensor, temperature: float = 1.0, **kwargs: Any
    ) -> TorchCategorical:
        """Builds the distribution from logits.

        Args:
            logits: Unnormalised log-probabilities, shape ``(..., K)``.
            temperature: Divides the logits (> 0; lower is greedier).
            **kwargs: Ignored (forward compatibility, as in RLlib).

        Returns:
            The distribution.

        Raises:
            ValueError: If ``temperature`` is not positive.
        """
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        return cls(logits=logits if temperature == 1.0 else logits / temperature)

    @staticmethod
    def required_input_dim(space: gym.Space, **kwargs: Any) -> int:
        """The number of logits: ``space.n``.

        Args:
            space: A Discrete space.
            **kwargs: Ignored.

        Returns:
            ``space.n``.

        Raises:
            TypeError: If ``space`` is not Discrete.
        """
        if not isinstance(space, gym.spaces.Discrete):
            raise TypeError(f"TorchCategorical models Discrete spaces, got {space}")
        return int(space.n)

    def sample(self, *, sample_shape: _Shape | None = None) -> torch.Tensor:
        """Draws category indices (int64).

        Args:
            sample_shape: Extra leading dimensions of independent draws.

        Returns:
            The indices, shape ``sample_shape + batch_shape``.
        """
        return self._dist.sample(_size(sample_shape))

    def rsample(self, *, sample_shape: _Shape | None = None) -> torch.Tensor:
        """Draws one-hot samples with a straight-through gradient to the probabilities.

        Args:
            sample_shape: Extra leading dimensions of independent draws.

        Returns:
            One-hot float samples, shape ``sample_shape + batch_shape + (K,)``, whose
            values are exact one-hots and whose gradient is that of the probabilities.
        """
        probs = self._dist.probs
        index = self._dist.sample(_size(sample_shape))
        one_hot = torch.nn.functional.one_hot(index, probs.shape[-1]).to(probs.dtype)
        return (one_hot - probs).detach() + probs

    def logp(self, value: torch.Tensor) -> torch.Tensor:
        """Log-probability of category indices.

        Args:
            value: Indices, shape ``batch_shape``.

        Returns:
            The log-probabilities.
        """
        return self._dist.log_prob(value)

    def entropy(self) -> torch.Tensor:
        """Entropy per distribution.

        Returns:
            Shape ``batch_shape``.
        """
        return self._dist.entropy()

    def kl(self, other: TorchDistribution) -> torch.Tensor:
        """``KL(self || other)``.

        Args:
            other: Another TorchCategorical of the same shape.

        Returns:
            Shape ``batch_shape``.
        """
        _check_same_class(self, other)
        assert isinstance(other, TorchCategorical)
        return kl_divergence(self._dist, other._dist)

    def to_deterministic(self) -> TorchDeterministic:
        """The argmax category.

        Returns:
            A TorchDeterministic over the argmax indices.
        """
        scores = self.logits if self.logits is not None else self.probs
        assert scores is not None
        return TorchDeterministic(loc=torch.argmax(scores, dim=-1), event_ndims=0)


class TorchDiagGaussian(TorchDistribution):
    """Gaussian with diagonal covariance (Box action spaces).

    Args:
        loc: Means, shape ``(..., D)``.
        scale: Standard deviations (positive), broadcastable to ``loc``.
    """

    def __init__(self, loc: torch.Tensor, scale: torch.Tensor | float) -> None:
        self.loc = loc
        self.scale = scale
        self._dist = Normal(loc, scale, validate_args=False)

    @classmethod
    def from_logits(cls, logits: torch.Tensor, **kwargs: Any) -> TorchDiagGaussian:
        """Builds the distribution from ``[mean, log_std]`` halves of the last axis.

        Args:
            logits: Shape ``(..., 2 * D)``: the first half the means, the second the log
                standard deviations.
            **kwargs: Ignored.

        Returns:
            The distribution.

        Raises:
            ValueError: If the last axis has an odd size.
        """
        if logits.shape[-1] % 2:
            raise ValueError(
                "TorchDiagGaussian.from_logits needs an even last axis (means and log "
                f"stds), got shape {tuple(logits.shape)}"
            )
        loc, log_std = logits.chunk(2, dim=-1)
        return cls(loc=loc, scale=log_std.exp())

    @staticmethod
    def required_input_dim(space: gym.Space, **kwargs: Any) -> int:
        """Twice the number of action components (means and log stds).

        Args:
            space: A Box space.
            **kwargs: Ignored.

        Returns:
            ``2 * prod(space.shape)``.

        Raises:
            TypeError: If ``space`` is not a Box.
        """
        if not isinstance(space, gym.spaces.Box):
            raise TypeError(f"TorchDiagGaussian models Box spaces, got {space}")
        return int(np.prod(space.shape, dtype=np.int64)) * 2

    def sample(self, *, sample_shape: _Shape | None = None) -> torch.Tensor:
        """Draws actions.

        Args:
            sample_shape: Extra leading dimensions of independent draws.

        Returns:
            Shape ``sample_shape + loc.shape``.
        """
        return self._dist.sample(_size(sample_shape))

    def rsample(self, *, sample_shape: _Shape | None = None) -> torch.Tensor:
        """Draws actions with a gradient (reparameterised).

        Args:
            sample_shape: Extra leading dimensions of independent draws.

        Returns:
            Shape ``sample_shape + loc.shape``.
        """
        return self._dist.rsample(_size(sample_shape))

    def logp(self, value: torch.Tensor) -> torch.Tensor:
        """Log-density summed over the last axis.

        Args:
            value: Actions, shape ``(..., D)``.

        Returns:
            Shape ``(...)``.
        """
        return self._dist.log_prob(value).sum(-1)

    def entropy(self) -> torch.Tensor:
        """Entropy summed over the last axis.

        Returns:
            Shape ``batch_shape``.
        """
        return self._dist.entropy().sum(-1)

    def kl(self, other: TorchDistribution) -> torch.Tensor:
        """``KL(self || other)`` summed over the last axis.

        Args:
            other: Another TorchDiagGaussian of the same shape.

        Returns:
            Shape ``batch_shape``.
        """
        _check_same_class(self, other)
        assert isinstance(other, TorchDiagGaussian)
        return kl_divergence(self._dist, other._dist).sum(-1)

    def to_deterministic(self) -> TorchDeterministic:
        """The mean.

        Returns:
            A TorchDeterministic at ``loc``.
        """
        return TorchDeterministic(loc=self.loc, event_ndims=1)


class TorchDeterministic(TorchDistribution):
    """A point mass: ``sample`` returns ``loc``.

    Args:
        loc: The value to return, shape ``batch_shape + event_shape``.
        event_ndims: How many trailing axes of ``loc`` form one action (1 for Box and
            MultiDiscrete actions, 0 for Discrete ones); ``logp`` has the remaining shape.
    """

    def __init__(self, loc: torch.Tensor, event_ndims: int = 1) -> None:
        self.loc = loc
        self.event_ndims = min(event_ndims, loc.dim())

    @classmethod
    def from_logits(cls, logits: torch.Tensor, **kwargs: Any) -> TorchDeterministic:
        """The point mass at ``logits`` (the module outputs the action itself).

        Args:
            logits: The actions, shape ``(..., D)``.
            **kwargs: Ignored.

        Returns:
            The distribution.
        """
        return cls(loc=logits)

    @staticmethod
    def required_input_dim(space: gym.Space, **kwargs: Any) -> int:
        """The number of action components.

        Args:
            space: A Box space.
            **kwargs: Ignored.

        Returns:
            ``prod(space.shape)``.

        Raises:
            TypeError: If ``space`` is not a Box.
        """
        if not isinstance(space, gym.spaces.Box):
            raise TypeError(f"TorchDeterministic models Box spaces, got {space}")
        return int(np.prod(space.shape, dtype=np.int64))

    def _batch_shape(self) -> torch.Size:
        return self.loc.shape[: self.loc.dim() - self.event_ndims]

    def sample(self, *, sample_shape: _Shape | None = None) -> torch.Tensor:
        """Returns ``loc`` (repeated over ``sample_shape``).

        Args:
            sample_shape: Extra leading dimensions.

        Returns:
            Shape ``sample_shape + loc.shape``.
        """
        size = _size(sample_shape)
        if not size:
            return self.loc
        return self.loc.expand(size + self.loc.shape).clone()

    def logp(self, value: torch.Tensor) -> torch.Tensor:
        """Zero log-probability per action (a convention; the density is degenerate).

        Args:
            value: Actions (only their batch shape is used).

        Returns:
            Zeros of shape ``batch_shape``.
        """
        return torch.zeros(self._batch_shape(), dtype=torch.float32, device=self.loc.device)

    def entropy(self) -> torch.Tensor:
        """Not defined for a point mass.

        Returns:
            Never returns.

        Raises:
            RuntimeError: Always, as in RLlib.
        """
        raise RuntimeError("entropy() is not defined for TorchDeterministic")

    def kl(self, other: TorchDistribution) -> torch.Tensor:
        """Not defined for a point mass.

        Args:
            other: Ignored.

        Returns:
            Never returns.

        Raises:
            RuntimeError: Always, as in RLlib.
        """
        raise RuntimeError("kl() is not defined for TorchDeterministic")

    def to_deterministic(self) -> TorchDeterministic:
        """Itself.

        Returns:
            ``self``.
        """
        return self


class TorchMultiCategorical(TorchDistribution):
    """Independent categoricals, one per MultiDiscrete component.

    Args:
        categoricals: One TorchCategorical per component, same batch shape.

    Raises:
        ValueError: If no categoricals are given.
    """

    #: Sizes of the components' logits; set on classes made by :meth:`with_input_lens`.
    input_lens: ClassVar[tuple[int, ...] | None] = None

    def __init__(self, categoricals: Sequence[TorchCategorical]) -> None:
        if not categoricals:
            raise ValueError("TorchMultiCategorical needs at least one categorical")
        self._cats = list(categoricals)

    @classmethod
    def with_input_lens(cls, input_lens: Sequence[int]) -> type[TorchMultiCategorical]:
        """A subclass whose ``from_logits`` knows how to split the logits.

        Args:
            input_lens: Number of categories per component (a MultiDiscrete's ``nvec``).

        Returns:
            The subclass (``from_logits(logits)`` then needs no ``input_lens``).

        Raises:
            ValueError: If ``input_lens`` is empty or has a non-positive entry.
        """
        lens = tuple(int(n) for n in input_lens)
        if not lens or min(lens) <= 0:
            raise ValueError(f"input_lens must be non-empty and positive, got {list(lens)}")
        # Cached: connectors ask for the class on every step, and a new class per call
        # would cost a type() construction each time.
        key = (cls, lens)
        made = _SPLIT_CLASSES.get(key)
        if made is None:
            made = type(cls.__name__, (cls,), {"input_lens": lens, "__module__": cls.__module__})
            _SPLIT_CLASSES[key] = made
        return made

    @classmethod
    def from_logits(
        cls,
        logits: torch.Tensor,
        input_lens: Sequence[int] | None = None,
        temperatures: Sequence[float] | None = None,
        **kwargs: Any,
    ) -> TorchMultiCategorical:
        """Splits the last axis of ``logits`` into one categorical per component.

        Args:
            logits: Shape ``(..., sum(input_lens))``.
            input_lens: Categories per component (default: the class's ``input_lens``).
            temperatures: One temperature per component (default 1.0 each).
            **kwargs: Ignored.

        Returns:
            The distribution.

        Raises:
            ValueError: If ``input_lens`` is missing or does not sum to the last axis, or
                ``temperatures`` has a different length or a non-positive entry.
        """
        lens = tuple(input_lens) if input_lens is not None else cls.input_lens
        if lens is None:
            raise ValueError(
                "TorchMultiCategorical.from_logits needs input_lens (or use a class made "
                "by with_input_lens / get_action_dist_cls)"
            )
        if sum(lens) != logits.shape[-1]:
            raise ValueError(
                f"input_lens {list(lens)} sum to {sum(lens)}, but the logits' last axis "
                f"has {logits.shape[-1]}"
            )
        temps = [1.0] * len(lens) if not temperatures else list(temperatures)
        if len(temps) != len(lens):
            raise ValueError(
                f"{len(temps)} temperatures given for {len(lens)} components (input_lens)"
            )
        parts = torch.split(logits, list(lens), dim=-1)
        return cls(
            [
                TorchCategorical.from_logits(p, temperature=t)
                for p, t in zip(parts, temps, strict=True)
            ]
        )

    @staticmethod
    def required_input_dim(space: gym.Space, **kwargs: Any) -> int:
        """The total number of categories: ``sum(space.nvec)``.

        Args:
            space: A one-dimensional MultiDiscrete space.
            **kwargs: Ignored.

        Returns:
            ``sum(space.nvec)``.

        Raises:
            TypeError: If ``space`` is not a MultiDiscrete.
        """
        if not isinstance(space, gym.spaces.MultiDiscrete):
            raise TypeError(f"TorchMultiCategorical models MultiDiscrete spaces, got {space}")
        return int(np.sum(space.nvec))

    def sample(self, *, sample_shape: _Shape | None = None) -> torch.Tensor:
        """Draws one index per component.

        Args:
            sample_shape: Extra leading dimensions of independent draws.

        Returns:
            int64, shape ``sample_shape + batch_shape + (num_components,)``.
        """
        return torch.stack([c.sample(sample_shape=sample_shape) for c in self._cats], dim=-1)

    def rsample(self, *, sample_shape: _Shape | None = None) -> torch.Tensor:
        """Straight-through one-hot samples, concatenated over the components.

        Args:
            sample_shape: Extra leading dimensions of independent draws.

        Returns:
            Shape ``sample_shape + batch_shape + (sum(input_lens),)``.
        """
        return torch.cat([c.rsample(sample_shape=sample_shape) for c in self._cats], dim=-1)

    def logp(self, value: torch.Tensor) -> torch.Tensor:
        """Sum of the components' log-probabilities.

        Args:
            value: Indices, shape ``batch_shape + (num_components,)``.

        Returns:
            Shape ``batch_shape``.

        Raises:
            ValueError: If the last axis of ``value`` is not the number of components.
        """
        if value.shape[-1] != len(self._cats):
            raise ValueError(
                f"logp() got actions with last axis {value.shape[-1]}, expected "
                f"{len(self._cats)} components"
            )
        parts = value.unbind(-1)
        return torch.stack([c.logp(v) for c, v in zip(self._cats, parts, strict=True)], dim=-1).sum(
            -1
        )

    def entropy(self) -> torch.Tensor:
        """Sum of the components' entropies.

        Returns:
            Shape ``batch_shape``.
        """
        return torch.stack([c.entropy() for c in self._cats], dim=-1).sum(-1)

    def kl(self, other: TorchDistribution) -> torch.Tensor:
        """Sum of the components' KL divergences.

        Args:
            other: A TorchMultiCategorical with the same components.

        Returns:
            Shape ``batch_shape``.

        Raises:
            ValueError: If the number of components differs.
        """
        if not isinstance(other, TorchMultiCategorical):
            raise TypeError(
                f"kl() needs two TorchMultiCategorical distributions, got {type(other).__name__}"
            )
        if len(other._cats) != len(self._cats):
            raise ValueError(f"kl() between {len(self._cats)} and {len(other._cats)} components")
        kls = [a.kl(b) for a, b in zip(self._cats, other._cats, strict=True)]
        return torch.stack(kls, dim=-1).sum(-1)

    def to_deterministic(self) -> TorchDeterministic:
        """The argmax of every component.

        Returns:
            A TorchDeterministic with shape ``batch_shape + (num_components,)``.
        """
        loc = torch.stack([c.to_deterministic().loc for c in self._cats], dim=-1)
        return TorchDeterministic(loc=loc, event_ndims=1)


def native_draw_applies(logits: torch.Tensor) -> bool:
    """Whether the native draw (:func:`categorical_draw_numpy`) takes ``logits``.

    Args:
        logits: Categorical logits.

    Returns:
        True for float32 CPU tensors of shape ``(batch, n)`` that need no gradient.
    """
    return (
        logits.dim() == 2
        and logits.dtype is torch.float32
        and logits.is_cpu  # (device.type makes a string per read: 0.4 µs)
        and not logits.requires_grad
    )


def categorical_draw_numpy(logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One category per row of ``logits`` and its log-probability, drawn natively.

    What ``TorchCategorical.from_logits(t).sample_with_logp_numpy()`` returns for logits
    ``t`` that :func:`native_draw_applies` to, given their numpy view. The uniforms are
    torch's.

    Args:
        logits: float32 ``(batch, n)`` (the numpy view of logits the native draw takes).

    Returns:
        ``(indices, logp)``: int64 and float32 numpy arrays of shape ``(batch,)``.

    Raises:
        ValueError: If a row holds NaN or +inf, or is all -inf.
    """
    uniforms, uniforms_np = _uniform_buffer(logits.shape[0])
    # Filling a kept buffer draws the same numbers as torch.rand(n, float64) (both are
    # the generator's uniform_), without a new tensor and its numpy view.
    uniforms.uniform_()
    if not logits.flags.c_contiguous:
        logits = np.ascontiguousarray(logits)
    return categorical_draw(logits, uniforms_np)


# Per thread, per batch size: a float64 CPU tensor for the native draw's uniforms and
# its numpy view. Per thread because torch releases the GIL while filling it.
_UNIFORMS = threading.local()


def _uniform_buffer(n: int) -> tuple[torch.Tensor, np.ndarray]:
    buffers: dict[int, tuple[torch.Tensor, np.ndarray]] | None = getattr(_UNIFORMS, "by_size", None)
    if buffers is None:
        buffers = _UNIFORMS.by_size = {}
    found = buffers.get(n)
    if found is None:
        if len(buffers) >= 32:  # many batch sizes (multi-agent): keep the cache small
            buffers.clear()
        tensor = torch.empty(n, dtype=torch.float64)
        found = buffers[n] = (tensor, tensor.numpy())
    return found


_SPLIT_CLASSES: dict[tuple[type, tuple[int, ...]], type[TorchMultiCategorical]] = {}


def get_action_dist_cls(space: gym.Space) -> type[TorchDistribution]:
    """The default distribution class for an action space.

    Args:
        space: Discrete, float Box, or one-dimensional MultiDiscrete.

    Returns:
        TorchCategorical, TorchDiagGaussian, or a TorchMultiCategorical subclass whose
        ``from_logits`` splits by ``space.nvec``.

    Raises:
        TypeError: For any other space.
    """
    if isinstance(space, gym.spaces.Discrete):
        return TorchCategorical
    if isinstance(space, gym.spaces.Box) and np.issubdtype(space.dtype, np.floating):
        return TorchDiagGaussian
    if isinstance(space, gym.spaces.MultiDiscrete) and space.nvec.ndim == 1:
        return TorchMultiCategorical.with_input_lens(space.nvec.tolist())
    raise TypeError(
        f"no default action distribution for the action space {space}: supported are "
        "Discrete, Box with a float dtype and one-dimensional MultiDiscrete"
    )
