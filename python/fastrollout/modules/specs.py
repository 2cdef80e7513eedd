"""What ``RunnerConfig.rl_module(rl_module_spec=...)`` takes, checked and resolved per module.

A runner config names its modules with fastrollout's or RLlib 2.60's specs
(``RLModuleSpec``, ``MultiRLModuleSpec``) or a module class; ``policies`` may give a spec
per module id too. :func:`check_rl_module_spec` rejects anything else when the config is
validated, and :func:`resolve_module_specs` turns what was given into one complete spec
per module (spaces, model config, inference-only), which the runner builds:

- a spec whose ``module_class`` is an RLlib ``RLModule`` stays RLlib's spec and builds
  RLlib's module (as runners built from RLlib's own config do);
- any other spec becomes fastrollout's :class:`RLModuleSpec`, whose ``module_class``
  (None: the default module for the spaces, as
  :func:`~fastrollout.modules.catalog.default_module_class` chooses it) gets the spec's
  ``model_config``, else the config's.

RLlib's classes are recognised by their module path, so ray is imported only by whoever
made them.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from fastrollout.modules.multi_rl_module import MultiRLModule, MultiRLModuleSpec
from fastrollout.modules.rl_module import RLModule, RLModuleSpec

__all__ = [
    "check_rl_module_spec",
    "is_rllib_module_class",
    "is_rllib_spec",
    "resolve_module_specs",
]


def _rllib_class(cls: type, name: str) -> bool:
    """Whether ``cls`` is (a subclass of) RLlib's class of that name."""
    return any(c.__name__ == name and c.__module__.startswith("ray.rllib.") for c in cls.__mro__)


def is_rllib_module_class(value: Any) -> bool:
    """Whether ``value`` is a subclass of RLlib's ``RLModule``.

    Args:
        value: Anything.

    Returns:
        True for RLlib's module classes and their subclasses.
    """
    return isinstance(value, type) and _rllib_class(value, "RLModule")


def is_rllib_spec(spec: Any) -> bool:
    """Whether ``spec`` is RLlib's ``RLModuleSpec`` (or a subclass).

    Args:
        spec: Anything.

    Returns:
        True for RLlib's single-module spec.
    """
    return _rllib_class(type(spec), "RLModuleSpec")


def _is_rllib_multi_spec(spec: Any) -> bool:
    return _rllib_class(type(spec), "MultiRLModuleSpec")


def _is_single_spec(spec: Any) -> bool:
    return isinstance(spec, RLModuleSpec) or is_rllib_spec(spec)


def _is_module_class(value: Any) -> bool:
    return (isinstance(value, type) and issubclass(value, RLModule)) or is_rllib_module_class(value)


def _check_single(spec: Any, where: str) -> None:
    """Checks one module's spec (``where`` names it in errors)."""
    if not _is_single_spec(spec):
        raise TypeError(
            f"{where} must be an RLModuleSpec (fastrollout's or RLlib's), got {spec!r} "
            f"({type(spec).__name__})"
        )
    module_class = spec.module_class
    if module_class is not None and not _is_module_class(module_class):
        raise TypeError(
            f"{where}.module_class must be an RLModule subclass (fastrollout's or RLlib's) "
            f"or None for the default module, got {module_class!r}"
        )
    if is_rllib_spec(spec):
        if getattr(spec, "load_state_path", None) is not None:
            raise ValueError(
                f"{where}.load_state_path = {spec.load_state_path!r} is not supported: "
                "load the weights into the runner with set_state()"
            )
        if module_class is None and spec.catalog_class is not None:
            raise ValueError(
                f"{where} names a catalog_class ({spec.catalog_class.__name__}) but no "
                "module_class; give the RLlib module class the catalog builds for"
            )


def check_rl_module_spec(value: Any, policies: Mapping[str, Any] | None = None) -> None:
    """Checks what ``rl_module(rl_module_spec=...)`` and ``policies`` give for modules.

    Args:
        value: ``rl_module_spec``: None, an ``RLModuleSpec`` or ``MultiRLModuleSpec``
            (fastrollout's or RLlib's), or an RLModule class (fastrollout's or RLlib's).
        policies: ``{module_id: spec or None}`` from ``multi_agent(policies=...)``.

    Raises:
        TypeError: For any other value, naming it (and the module id where it is one
            module's spec).
        ValueError: For RLlib spec settings fastrollout cannot honour
            (``load_state_path``, a custom ``multi_rl_module_class``).
    """
    for module_id, spec in (policies or {}).items():
        if spec is not None:
            _check_single(spec, f"policies[{module_id!r}]")
    if value is None or _is_module_class(value):
        return
    if _is_single_spec(value):
        _check_single(value, "rl_module_spec")
        return
    if isinstance(value, MultiRLModuleSpec) or _is_rllib_multi_spec(value):
        specs = value.rl_module_specs
        if not isinstance(specs, Mapping):
            raise TypeError(
                "rl_module_spec.rl_module_specs must be a dict {module_id: RLModuleSpec}, "
                f"got {specs!r}"
            )
        for module_id, spec in specs.items():
            _check_single(spec, f"rl_module_spec.rl_module_specs[{module_id!r}]")
        multi_class = value.multi_rl_module_class
        if isinstance(value, MultiRLModuleSpec):
            if not (isinstance(multi_class, type) and issubclass(multi_class, MultiRLModule)):
                raise TypeError(
                    "rl_module_spec.multi_rl_module_class must be a MultiRLModule subclass, "
                    f"got {multi_class!r}"
                )
            return
        if not (
            multi_class.__name__ == "MultiRLModule" and _rllib_class(multi_class, "MultiRLModule")
        ):
            raise ValueError(
                f"rl_module_spec.multi_rl_module_class = {multi_class.__name__} is not "
                "supported: fastrollout's runners hold the modules in its own MultiRLModule "
                "(give per-module specs, or fastrollout's MultiRLModuleSpec with a "
                "fastrollout MultiRLModule subclass)"
            )
        if getattr(value, "load_state_path", None) is not None:
            raise ValueError(
                f"rl_module_spec.load_state_path = {value.load_state_path!r} is not "
                "supported: load the weights into the runner with set_state()"
            )
        return
    raise TypeError(
        "rl_module_spec must be None, an RLModuleSpec or MultiRLModuleSpec (fastrollout's "
        "or RLlib's) or an RLModule class, got "
        f"{value!r} ({type(value).__module__}.{type(value).__qualname__})"
    )


def _complete(
    base: Any, observation_space: Any, action_space: Any, model_config: Mapping[str, Any]
) -> Any:
    """One module's spec with the runner's spaces and the config's model config filled in.

    Returns RLlib's spec (a copy) where ``module_class`` is RLlib's, else fastrollout's.
    """
    if base is None:
        return RLModuleSpec(
            observation_space=observation_space,
            action_space=action_space,
            inference_only=True,
            model_config=dict(model_config),
        )
    # (``is None``: a Dict or Tuple space is a container, falsy when empty)
    filled = {
        "observation_space": (
            observation_space if base.observation_space is None else base.observation_space
        ),
        "action_space": action_space if base.action_space is None else base.action_space,
        "inference_only": True,
        "model_config": base.model_config if base.model_config is not None else model_config,
    }
    if is_rllib_module_class(base.module_class):
        spec = (
            copy.copy(base)
            if is_rllib_spec(base)
            else _rllib_spec()(module_class=base.module_class)
        )
        for key, value in filled.items():
            setattr(spec, key, value)
        if not is_rllib_spec(base):
            spec.catalog_class = base.catalog_class
        return spec
    return RLModuleSpec(
        module_class=base.module_class,
        catalog_class=base.catalog_class if isinstance(base, RLModuleSpec) else None,
        **filled,
    )


def _rllib_spec() -> type:
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec as RLlibRLModuleSpec

    return RLlibRLModuleSpec


def resolve_module_specs(
    rl_module_spec: Any,
    policies: Mapping[str, Any] | None,
    model_config: Mapping[str, Any] | None,
    spaces: Mapping[str, tuple[Any, Any]],
) -> tuple[type[MultiRLModule], dict[str, Any]]:
    """The MultiRLModule class and one complete, inference-only spec per module.

    Args:
        rl_module_spec: The config's ``rl_module_spec`` (checked by
            :func:`check_rl_module_spec`).
        policies: The config's ``policies`` (a spec per module id, or None).
        model_config: The config's ``model_config``, for specs without their own.
        spaces: ``{module_id: (observation_space, action_space)}`` of the runner's
            modules, in build order.

    Returns:
        ``(multi_rl_module_class, {module_id: spec})`` in the order of ``spaces``; a spec
        is RLlib's where its module class is RLlib's (:func:`is_rllib_spec`), else
        fastrollout's :class:`RLModuleSpec`.

    Raises:
        TypeError: What :func:`check_rl_module_spec` raises (a runner may be built from
            a config that was never validated).
        ValueError: Likewise.
    """
    check_rl_module_spec(rl_module_spec, policies)
    spec = rl_module_spec
    multi_class: type[MultiRLModule] = MultiRLModule
    given: dict[str, Any]
    if spec is None:
        given = {}
    elif isinstance(spec, MultiRLModuleSpec):
        given = dict(spec.rl_module_specs)
        multi_class = spec.multi_rl_module_class
    elif _is_rllib_multi_spec(spec):
        given = dict(spec.rl_module_specs)
    elif _is_single_spec(spec):
        given = dict.fromkeys(spaces, spec)
    elif is_rllib_module_class(spec):
        given = dict.fromkeys(spaces, _rllib_spec()(module_class=spec))
    else:
        given = dict.fromkeys(spaces, RLModuleSpec(module_class=spec))
    for module_id, policy_spec in (policies or {}).items():
        if policy_spec is not None and module_id not in given:
            given[module_id] = policy_spec
    config = dict(model_config or {})
    out = {
        module_id: _complete(given.get(module_id), obs_space, act_space, config)
        for module_id, (obs_space, act_space) in spaces.items()
    }
    return multi_class, out
