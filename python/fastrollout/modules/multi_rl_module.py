"""``MultiRLModule``: RLModules keyed by module id (RLlib 2.60's ``MultiRLModule``).

Batches in and out are keyed by module id first: ``forward_exploration({mid: batch})``
returns ``{mid: outputs}`` for exactly the module ids in the input, so a step in which
only some modules act runs only those. State is ``{mid: module state}``. A single-agent
runner uses one under ``DEFAULT_MODULE_ID``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterator, Mapping
from typing import Any

import torch

from fastrollout.modules.rl_module import RLModule, RLModuleSpec

__all__ = ["MultiRLModule", "MultiRLModuleSpec"]


def _is_foreign_rl_module(module: Any) -> bool:
    """Whether ``module`` is another library's RLModule with RLlib's interface.

    RLlib's own modules run in fastrollout's runners when they are built from RLlib's
    config (``fastrollout.runners._rllib``).
    """
    return all(
        callable(getattr(module, name, None))
        for name in ("forward_inference", "forward_exploration", "get_state", "set_state")
    )


def _as_set(value: str | Collection[str] | None) -> set[str] | None:
    if value is None:
        return None
    return {value} if isinstance(value, str) else set(value)


class MultiRLModule(Mapping[str, RLModule]):
    """A mapping ``module_id -> RLModule`` with batched forward passes and state.

    Args:
        rl_module_specs: Specs to build the modules from, keyed by module id.
        rl_modules: Already-built modules, keyed by module id (merged with the built
            ones; an id in both is an error).
        **kwargs: Accepted for RLlib's constructor arguments (observation_space,
            action_space, inference_only, model_config) and ignored: the per-module specs
            carry them.

    Raises:
        ValueError: If a module id appears twice.
        TypeError: If a value is not an RLModule (or RLModuleSpec).
    """

    def __init__(
        self,
        rl_module_specs: Mapping[str, RLModuleSpec] | None = None,
        *,
        rl_modules: Mapping[str, RLModule] | None = None,
        **kwargs: Any,
    ) -> None:
        self._rl_modules: dict[str, RLModule] = {}
        for module_id, spec in (rl_module_specs or {}).items():
            if not isinstance(spec, RLModuleSpec):
                raise TypeError(
                    f"rl_module_specs[{module_id!r}] must be an RLModuleSpec, got "
                    f"{type(spec).__name__}"
                )
            self.add_module(module_id, spec.build())
        for module_id, module in (rl_modules or {}).items():
            self.add_module(module_id, module)

    # -- mapping ----------------------------------------------------------------

    def __getitem__(self, module_id: str) -> RLModule:
        try:
            return self._rl_modules[module_id]
        except KeyError:
            raise KeyError(
                f"no module {module_id!r} in this MultiRLModule (it has "
                f"{sorted(map(str, self._rl_modules))})"
            ) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._rl_modules)

    def __len__(self) -> int:
        return len(self._rl_modules)

    def __repr__(self) -> str:
        inner = ", ".join(f"{mid!r}: {type(m).__name__}" for mid, m in self._rl_modules.items())
        return f"MultiRLModule({{{inner}}})"

    def add_module(self, module_id: str, module: RLModule, *, override: bool = False) -> None:
        """Adds a module.

        Args:
            module_id: Its id.
            module: The module.
            override: Replace a module with the same id instead of failing.

        Raises:
            ValueError: If the id exists and ``override`` is False.
            TypeError: If ``module`` is not an RLModule.
        """
        if not isinstance(module, RLModule) and not _is_foreign_rl_module(module):
            raise TypeError(
                f"module {module_id!r} must be an RLModule, got {type(module).__name__}"
            )
        if module_id in self._rl_modules and not override:
            raise ValueError(f"module {module_id!r} already exists (pass override=True)")
        self._rl_modules[module_id] = module

    def remove_module(self, module_id: str, *, raise_err_if_not_found: bool = True) -> None:
        """Removes a module.

        Args:
            module_id: Its id.
            raise_err_if_not_found: Fail if there is no such module.

        Raises:
            KeyError: If the module does not exist and ``raise_err_if_not_found``.
        """
        if module_id not in self._rl_modules:
            if raise_err_if_not_found:
                raise KeyError(f"no module {module_id!r} to remove")
            return
        del self._rl_modules[module_id]

    def foreach_module(self, func: Any, *, return_dict: bool = False) -> Any:
        """Calls ``func(module_id, module)`` for every module.

        Args:
            func: The function.
            return_dict: Return ``{module_id: result}`` instead of a list.

        Returns:
            The results.
        """
        results = {mid: func(mid, m) for mid, m in self._rl_modules.items()}
        return results if return_dict else list(results.values())

    def to(self, device: torch.device | str) -> MultiRLModule:
        """Moves every module to ``device`` (in place).

        Args:
            device: The target device.

        Returns:
            ``self``.
        """
        for module in self._rl_modules.values():
            module.to(device)
        return self

    # -- forward passes --------------------------------------------------------

    def _forward_each(self, method: str, batch: Mapping[str, Any], **kwargs: Any) -> dict:
        if type(batch) is not dict and not isinstance(batch, Mapping):  # (dict: no ABC check)
            raise TypeError(
                "a MultiRLModule takes batches keyed by module id ({module_id: {column: "
                f"tensor}}), got {type(batch).__name__}"
            )
        modules = self._rl_modules
        return {
            # (self[mid] only for its error message when the module is unknown)
            mid: getattr(modules[mid] if mid in modules else self[mid], method)(b, **kwargs)
            for mid, b in batch.items()
        }

    def forward_inference(self, batch: Mapping[str, Any], **kwargs: Any) -> dict[str, Any]:
        """``forward_inference`` of every module named in ``batch``.

        Args:
            batch: ``{module_id: {column: tensor}}``.
            **kwargs: Passed to each module.

        Returns:
            ``{module_id: outputs}`` for the same module ids.

        Raises:
            KeyError: If a module id is unknown.
        """
        return self._forward_each("forward_inference", batch, **kwargs)

    def forward_exploration(self, batch: Mapping[str, Any], **kwargs: Any) -> dict[str, Any]:
        """``forward_exploration`` of every module named in ``batch``.

        Args:
            batch: ``{module_id: {column: tensor}}``.
            **kwargs: Passed to each module.

        Returns:
            ``{module_id: outputs}`` for the same module ids.

        Raises:
            KeyError: If a module id is unknown.
        """
        return self._forward_each("forward_exploration", batch, **kwargs)

    def forward_train(self, batch: Mapping[str, Any], **kwargs: Any) -> dict[str, Any]:
        """``forward_train`` of every module named in ``batch``.

        Args:
            batch: ``{module_id: {column: tensor}}``.
            **kwargs: Passed to each module.

        Returns:
            ``{module_id: outputs}`` for the same module ids.

        Raises:
            KeyError: If a module id is unknown.
        """
        return self._forward_each("forward_train", batch, **kwargs)

    # -- state -------------------------------------------------------------------

    def get_state(
        self,
        components: str | Collection[str] | None = None,
        *,
        not_components: str | Collection[str] | None = None,
        inference_only: bool = False,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """The modules' weights, keyed by module id.

        Args:
            components: Only these module ids.
            not_components: Leave out these module ids.
            inference_only: Each module leaves out what acting does not need.
            **kwargs: Ignored.

        Returns:
            ``{module_id: {key: np.ndarray}}``.
        """
        keep, drop = _as_set(components), _as_set(not_components)
        return {
            mid: m.get_state(inference_only=inference_only)
            for mid, m in self._rl_modules.items()
            if (keep is None or mid in keep) and (drop is None or mid not in drop)
        }

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Loads weights for the modules named in ``state`` (others are untouched).

        Args:
            state: ``{module_id: module state}``.

        Raises:
            KeyError: If a module id is unknown (checked before anything is loaded).
            ValueError: If a module's state does not fit it.
        """
        unknown = [mid for mid in state if mid not in self._rl_modules]
        if unknown:
            raise KeyError(
                f"state for unknown module(s) {unknown}; this MultiRLModule has "
                f"{sorted(map(str, self._rl_modules))}"
            )
        for mid, module_state in state.items():
            self._rl_modules[mid].set_state(module_state)


@dataclasses.dataclass
class MultiRLModuleSpec:
    """How to build a MultiRLModule: one RLModuleSpec per module id.

    Args:
        multi_rl_module_class: The class to build (default :class:`MultiRLModule`).
        rl_module_specs: ``{module_id: RLModuleSpec}``.
        inference_only: If True, every module is built inference-only.
    """

    multi_rl_module_class: type[MultiRLModule] = MultiRLModule
    rl_module_specs: dict[str, RLModuleSpec] = dataclasses.field(default_factory=dict)
    inference_only: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.rl_module_specs, RLModuleSpec):
            raise TypeError(
                "rl_module_specs must be a dict {module_id: RLModuleSpec}; for one module "
                "use RLModuleSpec.as_multi_rl_module_spec()"
            )

    @property
    def module_specs(self) -> dict[str, RLModuleSpec]:
        """RLlib's older name of ``rl_module_specs``."""
        return self.rl_module_specs

    def build(self, module_id: str | None = None) -> Any:
        """Builds the MultiRLModule, or one of its modules.

        Args:
            module_id: If given, build only this module and return it.

        Returns:
            The MultiRLModule (or the one RLModule).

        Raises:
            KeyError: If ``module_id`` has no spec.
        """
        specs = self.rl_module_specs
        if self.inference_only:
            specs = {mid: dataclasses.replace(s, inference_only=True) for mid, s in specs.items()}
        if module_id is not None:
            if module_id not in specs:
                raise KeyError(f"no spec for module {module_id!r} (have {sorted(specs)})")
            return specs[module_id].build()
        return self.multi_rl_module_class(rl_module_specs=specs)

    def add_modules(self, module_specs: Mapping[str, RLModuleSpec], override: bool = True) -> None:
        """Adds specs (replacing existing ones only with ``override``).

        Args:
            module_specs: ``{module_id: RLModuleSpec}``.
            override: Replace specs with the same id.
        """
        for mid, spec in module_specs.items():
            if override or mid not in self.rl_module_specs:
                self.rl_module_specs[mid] = spec

    def remove_modules(self, module_ids: str | Collection[str]) -> None:
        """Removes specs (missing ids are ignored).

        Args:
            module_ids: One id or several.
        """
        for mid in _as_set(module_ids) or ():
            self.rl_module_specs.pop(mid, None)
