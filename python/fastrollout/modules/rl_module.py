"""``RLModule``: a torch policy with RLlib 2.60's forward and state API.

A module maps a batch (a dict of tensors keyed by :class:`~fastrollout.core.Columns`) to
its outputs through three entry points: ``forward_inference`` (greedy acting),
``forward_exploration`` (acting while collecting experience) and ``forward_train``
(learning). Subclasses build their layers in ``setup()`` and implement ``_forward`` (used
by all three) or the three ``_forward_*`` methods separately, as in RLlib.

State travels as plain numpy: ``get_state()`` returns ``{parameter name: np.ndarray}``
(copies), so it pickles cheaply and crosses process boundaries; ``set_state`` copies the
arrays into the existing parameters, on whatever device the module lives.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from fastrollout.modules.distributions import TorchDistribution, get_action_dist_cls

if TYPE_CHECKING:
    from fastrollout.modules.multi_rl_module import MultiRLModuleSpec

__all__ = ["RLModule", "RLModuleSpec"]


def _set_training(module: nn.Module, mode: bool) -> None:
    """What ``nn.Module.train(mode)`` does, without its per-submodule ``__setattr__``."""
    # ``training`` is a plain instance attribute (nn.Module.__init__ puts it in __dict__),
    # so writing the dict is what __setattr__ ends up doing for it.
    module.__dict__["training"] = mode
    for child in module._modules.values():
        if child is None:
            continue
        train = type(child).train
        if train is nn.Module.train or train is RLModule.train:
            _set_training(child, mode)
        else:
            child.train(mode)


def _model_config_dict(model_config: Any) -> dict[str, Any]:
    if model_config is None:
        return {}
    if dataclasses.is_dataclass(model_config) and not isinstance(model_config, type):
        return dataclasses.asdict(model_config)
    if isinstance(model_config, Mapping):
        return dict(model_config)
    raise TypeError(
        f"model_config must be a dict or a dataclass instance, got {type(model_config).__name__}"
    )


def _matches(key: str, prefixes: Collection[str]) -> bool:
    """Whether a state-dict key belongs to one of the (dotted) attribute prefixes."""
    return any(key == p or key.startswith(p + ".") for p in prefixes)


class RLModule(nn.Module):
    """Base class of torch policies (RLlib's ``TorchRLModule``).

    Args:
        observation_space: The observations the module reads.
        action_space: The actions it outputs a distribution over.
        inference_only: Build only what acting needs (no value function); such a module
            cannot ``forward_train``.
        learner_only: Marks a module that only learners build (kept for RLlib parity).
        model_config: Free-form settings for ``setup()`` (a dict or a dataclass).
        catalog_class: Accepted for RLlib compatibility; unused.
        **kwargs: Ignored (forward compatibility, as RLlib's constructor).

    Raises:
        ValueError: If both ``inference_only`` and ``learner_only`` are set.
        TypeError: If ``model_config`` is neither a dict nor a dataclass.
    """

    framework = "torch"

    def __init__(
        self,
        *,
        observation_space: gym.Space | None = None,
        action_space: gym.Space | None = None,
        inference_only: bool = False,
        learner_only: bool = False,
        model_config: Any = None,
        catalog_class: Any = None,
        **kwargs: Any,
    ) -> None:
        super().__init__()
        if inference_only and learner_only:
            raise ValueError("an RLModule cannot be both inference_only and learner_only")
        self.observation_space = observation_space
        self.action_space = action_space
        self.inference_only = bool(inference_only)
        self.learner_only = bool(learner_only)
        self.model_config = _model_config_dict(model_config)
        self.catalog = None
        # Subclasses may set this in setup() to choose the action distribution.
        self.action_dist_cls: type[TorchDistribution] | None = None
        self.setup()

    def setup(self) -> None:
        """Builds the layers (override; called once at the end of ``__init__``)."""

    # -- forward passes ---------------------------------------------------------------

    def forward_inference(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        """Greedy forward pass (eval mode, no gradient).

        Args:
            batch: Input tensors keyed by column (at least ``Columns.OBS``).
            **kwargs: Passed to ``_forward_inference``.

        Returns:
            Output tensors keyed by column (e.g. ``Columns.ACTION_DIST_INPUTS``).
        """
        if not self.training and not torch.is_grad_enabled():  # the runners' case
            return self._forward_inference(batch, **kwargs)
        return self._without_grad_in_eval(self._forward_inference, batch, kwargs)

    def forward_exploration(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        """Forward pass for collecting experience (eval mode, no gradient).

        Args:
            batch: Input tensors keyed by column.
            **kwargs: Passed to ``_forward_exploration``.

        Returns:
            Output tensors keyed by column.
        """
        if not self.training and not torch.is_grad_enabled():  # the runners' case
            return self._forward_exploration(batch, **kwargs)
        return self._without_grad_in_eval(self._forward_exploration, batch, kwargs)

    def _without_grad_in_eval(self, forward: Any, batch: dict[str, Any], kwargs: dict) -> Any:
        """Runs ``forward(batch)`` in eval mode without gradient.

        A module that was training goes back to train mode after. Switching modes walks
        every submodule (it cost about a quarter of a runner's sample time when done per
        step), so it happens only when the module is in train mode.
        """
        if not self.training:
            with torch.no_grad():
                return forward(batch, **kwargs)
        self.eval()
        try:
            with torch.no_grad():
                return forward(batch, **kwargs)
        finally:
            self.train()

    def forward_train(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        """Forward pass for learning (train mode, with gradient).

        Args:
            batch: Input tensors keyed by column.
            **kwargs: Passed to ``_forward_train``.

        Returns:
            Output tensors keyed by column.

        Raises:
            RuntimeError: If the module was built ``inference_only``.
        """
        if self.inference_only:
            raise RuntimeError(
                f"{type(self).__name__} was built with inference_only=True and cannot run "
                "forward_train(); build it with inference_only=False to train"
            )
        self.train()
        return self._forward_train(batch, **kwargs)

    def forward(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        """The ``nn.Module`` entry point (what DDP calls).

        It is ``forward_train``, or ``forward_exploration`` for inference-only modules.

        Args:
            batch: Input tensors keyed by column.
            **kwargs: Passed on.

        Returns:
            Output tensors keyed by column.
        """
        if self.inference_only:
            return self.forward_exploration(batch, **kwargs)
        return self.forward_train(batch, **kwargs)

    def _forward(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        """The forward pass shared by all three phases unless they are overridden.

        Args:
            batch: Input tensors keyed by column.
            **kwargs: Phase-specific options.

        Returns:
            Output tensors keyed by column.

        Raises:
            NotImplementedError: If the subclass implements neither this nor the phase's
                own ``_forward_*`` method.
        """
        raise NotImplementedError(
            f"{type(self).__name__} must implement _forward() or the _forward_inference/"
            "_forward_exploration/_forward_train methods"
        )

    def _forward_inference(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        return self._forward(batch, **kwargs)

    def _forward_exploration(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        return self._forward(batch, **kwargs)

    def _forward_train(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        return self._forward(batch, **kwargs)

    # -- distributions ----------------------------------------------------------------

    def get_inference_action_dist_cls(self) -> type[TorchDistribution]:
        """The distribution class ``forward_inference`` outputs are inputs of.

        Returns:
            ``self.action_dist_cls`` if set, else the default for the action space.

        Raises:
            TypeError: If the action space has no default distribution.
        """
        if self.action_dist_cls is not None:
            return self.action_dist_cls
        if self.action_space is None:
            raise TypeError(f"{type(self).__name__} has no action_space to pick a distribution")
        return get_action_dist_cls(self.action_space)

    def get_exploration_action_dist_cls(self) -> type[TorchDistribution]:
        """The distribution class for ``forward_exploration`` outputs.

        Returns:
            The inference class unless overridden.
        """
        return self.get_inference_action_dist_cls()

    def get_train_action_dist_cls(self) -> type[TorchDistribution]:
        """The distribution class for ``forward_train`` outputs.

        Returns:
            The inference class unless overridden.
        """
        return self.get_inference_action_dist_cls()

    # -- recurrent state (none by default) ----------------------------------------

    def is_stateful(self) -> bool:
        """Whether the module carries recurrent state between steps.

        Returns:
            ``True`` if ``get_initial_state()`` is non-empty.
        """
        return bool(self.get_initial_state())

    def get_initial_state(self) -> dict[str, Any]:
        """The recurrent state at an episode start (none by default).

        Returns:
            An empty dict.
        """
        return {}

    def unwrapped(self) -> RLModule:
        """The module itself (RLlib unwraps DDP wrappers here).

        Returns:
            ``self``.
        """
        return self

    # -- weights ------------------------------------------------------------------

    def get_non_inference_attributes(self) -> list[str]:
        """Dotted attribute names that acting does not need (e.g. the value function).

        Returns:
            The names; an inference-only module does not build them and
            ``get_state(inference_only=True)`` leaves their weights out.
        """
        return []

    @property
    def device(self) -> torch.device:
        """The device of the module's first parameter or buffer (CPU if it has none)."""
        # Walking the module tree costs ~10 us, and connectors ask every step; the first
        # tensor is remembered instead, and forgotten by ``_apply`` (what ``.to()``,
        # ``.cuda()``, ``.cpu()`` run), which may replace it.
        ref = self.__dict__.get("_device_ref")
        if ref is None:
            ref = next(iter(self.parameters()), None)
            if ref is None:
                ref = next(iter(self.buffers()), None)
            if ref is None:
                return torch.device("cpu")
            self.__dict__["_device_ref"] = ref
        return ref.device

    def _apply(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        self.__dict__.pop("_device_ref", None)
        return super()._apply(fn, *args, **kwargs)

    def train(self, mode: bool = True) -> RLModule:
        """Sets the training flag of this module and every submodule (``nn.Module.train``).

        ``forward_exploration`` and ``forward_inference`` switch to eval mode and back on
        every call (as RLlib's do); ``nn.Module.train`` pays ``nn.Module.__setattr__`` for
        each submodule, about 150 us per env step for the default 256x256 module at B=8
        (twice its matrix products). Submodules whose class keeps ``nn.Module.train`` get
        the flag set directly; ones that override ``train`` have it called.

        Args:
            mode: True for training mode, False for eval mode.

        Returns:
            The module.

        Raises:
            ValueError: If ``mode`` is not a bool (as torch).
        """
        if not isinstance(mode, bool):
            raise ValueError("training mode is expected to be boolean")
        _set_training(self, mode)
        return self

    def get_state(
        self,
        components: str | Collection[str] | None = None,
        *,
        not_components: str | Collection[str] | None = None,
        inference_only: bool = False,
        **kwargs: Any,
    ) -> dict[str, np.ndarray]:
        """The weights as numpy arrays (copies, on the host).

        Args:
            components: Only keys under these (dotted) attribute names.
            not_components: Leave out keys under these attribute names.
            inference_only: Leave out what acting does not need
                (``get_non_inference_attributes()``).
            **kwargs: Ignored.

        Returns:
            ``{state-dict key: np.ndarray}``.
        """
        keep = [components] if isinstance(components, str) else components
        drop = [not_components] if isinstance(not_components, str) else not_components
        non_inference = self.get_non_inference_attributes() if inference_only else []
        state = {}
        for key, tensor in self.state_dict().items():
            if keep is not None and not _matches(key, keep):
                continue
            if drop is not None and _matches(key, drop):
                continue
            if _matches(key, non_inference):
                continue
            state[key] = tensor.detach().cpu().numpy().copy()
        return state

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Copies weights into the module (numpy arrays or tensors).

        The state may leave out what this module does not need for acting (an
        inference-only state loads into a full module); every other key must be there.

        Args:
            state: ``{state-dict key: array}``, as ``get_state`` returns.

        Raises:
            ValueError: If a key is unknown, a needed key is missing, or an array has the
                wrong shape (the key and both shapes are named). Nothing is changed then.
        """
        own = self.state_dict()
        unknown = sorted(set(state) - set(own))
        if unknown:
            raise ValueError(f"state has keys that {type(self).__name__} does not have: {unknown}")
        optional = self.get_non_inference_attributes()
        missing = sorted(k for k in own if k not in state and not _matches(k, optional))
        if missing:
            raise ValueError(f"state is missing keys of {type(self).__name__}: {missing}")
        converted = {}
        for key, value in state.items():
            array: torch.Tensor = (
                value if isinstance(value, torch.Tensor) else torch.as_tensor(_writable(value))
            )
            if tuple(array.shape) != tuple(own[key].shape):
                raise ValueError(
                    f"state[{key!r}] has shape {tuple(array.shape)}, the module's is "
                    f"{tuple(own[key].shape)}"
                )
            converted[key] = array
        with torch.no_grad():
            for key, array in converted.items():
                own[key].copy_(array)

    def as_multi_rl_module(self) -> Any:
        """Wraps this module into a MultiRLModule under ``DEFAULT_MODULE_ID``.

        Returns:
            The MultiRLModule.
        """
        from fastrollout.core import DEFAULT_MODULE_ID
        from fastrollout.modules.multi_rl_module import MultiRLModule

        return MultiRLModule(rl_modules={DEFAULT_MODULE_ID: self})


@dataclasses.dataclass
class RLModuleSpec:
    """How to build an RLModule (RLlib's ``RLModuleSpec``).

    Args:
        module_class: The RLModule subclass (``None``: the catalog's default for the
            spaces and model config: :class:`DefaultMLPModule`, :class:`DefaultCNNModule`
            for images, :class:`DefaultLSTMModule` with ``use_lstm``).
        observation_space: Passed to the module.
        action_space: Passed to the module.
        inference_only: Build without the parts only training needs.
        learner_only: Passed to the module.
        model_config: Passed to the module (dict or dataclass).
        catalog_class: Accepted for RLlib compatibility; passed on.
    """

    module_class: type[RLModule] | None = None
    observation_space: gym.Space | None = None
    action_space: gym.Space | None = None
    inference_only: bool = False
    learner_only: bool = False
    model_config: Any = None
    catalog_class: Any = None

    def build(self) -> RLModule:
        """Builds the module.

        Returns:
            A new module instance.

        Raises:
            ValueError: If the observation or action space is not set.
            TypeError: If ``module_class`` is not an RLModule subclass.
        """
        if self.observation_space is None:
            raise ValueError("RLModuleSpec.observation_space is not set")
        if self.action_space is None:
            raise ValueError("RLModuleSpec.action_space is not set")
        module_class = self.module_class
        if module_class is None:
            from fastrollout.modules.catalog import default_module_class

            module_class = default_module_class(
                self.observation_space, self.action_space, _model_config_dict(self.model_config)
            )
        if not (isinstance(module_class, type) and issubclass(module_class, RLModule)):
            raise TypeError(
                f"RLModuleSpec.module_class must be an RLModule subclass, got {module_class!r}"
            )
        return module_class(
            observation_space=self.observation_space,
            action_space=self.action_space,
            inference_only=self.inference_only,
            learner_only=self.learner_only,
            model_config=self.model_config,
            catalog_class=self.catalog_class,
        )

    @classmethod
    def from_module(cls, module: RLModule) -> RLModuleSpec:
        """The spec that builds a module like ``module`` (fresh weights).

        Args:
            module: A built RLModule.

        Returns:
            The spec.

        Raises:
            TypeError: If ``module`` is not an RLModule.
        """
        if not isinstance(module, RLModule):
            raise TypeError(f"expected an RLModule, got {type(module).__name__}")
        return cls(
            module_class=type(module),
            observation_space=module.observation_space,
            action_space=module.action_space,
            inference_only=module.inference_only,
            learner_only=module.learner_only,
            model_config=dict(module.model_config),
        )

    def update(self, other: RLModuleSpec, override: bool = True) -> None:
        """Fills this spec from another one, like ``dict.update``.

        Args:
            other: The spec to take values from.
            override: Take every value ``other`` sets; if False, only fill this spec's
                unset (``None``) fields.

        Raises:
            TypeError: If ``other`` is not an RLModuleSpec.
        """
        if not isinstance(other, RLModuleSpec):
            raise TypeError(f"can only update from an RLModuleSpec, got {type(other).__name__}")
        for f in ("module_class", "observation_space", "action_space", "model_config"):
            mine, theirs = getattr(self, f), getattr(other, f)
            if override:
                setattr(self, f, theirs if theirs is not None else mine)
            elif mine is None:
                setattr(self, f, theirs)
        if override:
            self.inference_only = other.inference_only or self.inference_only

    def as_multi_rl_module_spec(self) -> MultiRLModuleSpec:
        """Wraps this spec into a MultiRLModuleSpec under ``DEFAULT_MODULE_ID``.

        Returns:
            The MultiRLModuleSpec.
        """
        from fastrollout.core import DEFAULT_MODULE_ID
        from fastrollout.modules.multi_rl_module import MultiRLModuleSpec

        return MultiRLModuleSpec(rl_module_specs={DEFAULT_MODULE_ID: self})


def _writable(value: Any) -> np.ndarray:
    """``value`` as an array torch may wrap (read-only arrays are copied).

    Weights that arrive through Ray's object store are read-only; torch wraps only memory
    it may write.
    """
    array = np.asarray(value)
    return array if array.flags.writeable else array.copy()
