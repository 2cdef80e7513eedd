"""The default module-to-env pipeline's part of a vector step, in one pass.

With the default pieces, a runner's exploring step is: for each module, its forward pass
on the observations, one categorical draw, the outputs as numpy, and the actions fitted to
the env. Going through the interfaces RLlib defines (``MultiRLModule`` ->
``RLModule.forward_exploration`` -> ``_forward_exploration`` -> ``_forward``, then the
pipeline's ``__call__`` and its three pieces) costs about twenty Python calls per vector
step on top of that work: at one CartPole sub-env, about 15% of ``sample()`` (127 against
107 µs per env step with this class and the direct env-to-module conversion).

:class:`DefaultAct` does the same work directly, and only where it is the same work: the
module is a ``MultiRLModule`` whose modules' distribution is ``TorchCategorical``, and the
module-to-env pipeline holds exactly the default pieces. Each module's forward pass is
its own ``forward_exploration`` (``forward_inference``), the call ``MultiRLModule`` makes,
except for a ``DefaultMLPModule`` whose phase methods are the defaults: its actor layers
run directly. It is built at the start of every ``sample()`` call; each step re-checks
what can change meanwhile (the pipeline's pieces, the modules, hooks and replaced layers,
train mode) and hands the step back to the general path (returns None) where anything
differs. Greedy steps take the argmax. Outputs the direct draw does not take (logits of
another dtype or device, a module that gives its own actions or log-probabilities) go from
the forward pass already made through the pipeline. The outputs are those of the general
path, key for key and bit for bit (tests compare whole sampled episodes).
"""

from __future__ import annotations

import time
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from fastrollout.connectors.module_to_env.get_actions import GetActions
from fastrollout.connectors.module_to_env.normalize_and_clip_actions import (
    NormalizeAndClipActions,
)
from fastrollout.connectors.module_to_env.tensor_to_numpy import TensorToNumpy, to_numpy
from fastrollout.connectors.pipeline import ModuleToEnvPipeline
from fastrollout.core import Columns
from fastrollout.modules.default import DefaultMLPModule, run_layers
from fastrollout.modules.distributions import (
    TorchCategorical,
    categorical_draw_numpy,
    native_draw_applies,
)
from fastrollout.modules.multi_rl_module import MultiRLModule
from fastrollout.runners import keys

__all__ = ["DefaultAct"]

_DEFAULT_TAIL: tuple[type, ...] = (GetActions, TensorToNumpy, NormalizeAndClipActions)


# The methods the direct step stands in for, or calls, per phase (exploring, greedy): a
# module whose class or instance (a method assigned to it) has its own takes the general
# path.
_SHARED_METHODS = ("_forward", "_obs", "_plain_actor_layers")
_PHASE_METHODS = {
    True: ("forward_exploration", "_forward_exploration", "get_exploration_action_dist_cls"),
    False: ("forward_inference", "_forward_inference", "get_inference_action_dist_cls"),
}


def _is_default_module(module: Any, explore: bool) -> bool:
    """Whether ``module``'s forward pass is ``DefaultMLPModule``'s own (its actor layers)."""
    if not isinstance(module, DefaultMLPModule):
        return False
    cls = type(module)
    names = (*_SHARED_METHODS, *_PHASE_METHODS[explore])
    if any(name in module.__dict__ for name in names):
        return False
    return all(getattr(cls, name) is getattr(DefaultMLPModule, name) for name in names)


def _draws_categorical(module: Any, explore: bool) -> bool:
    """Whether the phase's distribution of ``module`` is ``TorchCategorical``."""
    getter = _PHASE_METHODS[explore][2]
    try:
        return getattr(module, getter)() is TorchCategorical
    except (AttributeError, TypeError):  # (no such method, or no default for the space)
        return False


def _own_logits(out: Any) -> torch.Tensor | None:
    """A module's logits, where the direct tail makes of its outputs what the pipeline makes.

    Returns:
        The logits tensor; None where the module gave its own actions or
        log-probabilities, or outputs of another form.
    """
    if type(out) is not dict or Columns.ACTIONS in out or Columns.ACTION_LOGP in out:
        return None
    logits = out.get(Columns.ACTION_DIST_INPUTS)
    return logits if isinstance(logits, torch.Tensor) else None


def _fit_space(fit: NormalizeAndClipActions, module_id: Any, module: Any) -> Any:
    """The action space ``fit.fit_module`` fits a module's actions to."""
    space = fit.space_for(fit.input_action_space, module_id)
    return space if space is not None else getattr(module, "action_space", None)


class DefaultAct:
    """One vector step's forward pass and module-to-env pipeline, direct.

    Args:
        multi_module: The runner's ``MultiRLModule``.
        pipeline: The runner's module-to-env pipeline.
        explore: Sample, or act greedily (what the runner's ``sample`` call does).
    """

    __slots__ = (
        "_direct_forward",
        "_explore",
        "_fit",
        "_fit_is_identity",
        "_modules",
        "_multi_module",
        "_phase",
        "_pieces",
        "_pipeline",
    )

    def __init__(
        self, multi_module: MultiRLModule, pipeline: ModuleToEnvPipeline, explore: bool
    ) -> None:
        self._explore = explore
        self._phase = _PHASE_METHODS[explore][0]
        self._multi_module = multi_module
        self._pipeline = pipeline
        self._pieces = list(pipeline.connectors)
        self._modules: dict[Any, Any] = dict(multi_module._rl_modules)
        # Modules whose actor layers the step runs itself (see _is_default_module).
        self._direct_forward = {
            module_id
            for module_id, module in self._modules.items()
            if _is_default_module(module, explore)
        }
        fit = self._pieces[-1]
        assert isinstance(fit, NormalizeAndClipActions)
        self._fit = fit
        # Modules whose env actions are their actions, as fit_module finds per step (1 µs
        # of space lookups): unsquashing and clipping change Box actions only.
        self._fit_is_identity = {
            module_id
            for module_id, module in self._modules.items()
            if not (fit.normalize_actions or fit.clip_actions)
            or type(_fit_space(fit, module_id, module)) is gym.spaces.Discrete
        }

    @classmethod
    def of(cls, multi_module: Any, pipeline: Any, explore: bool) -> DefaultAct | None:
        """The direct step for this module and pipeline, or None where it would differ.

        Args:
            multi_module: The runner's module.
            pipeline: The runner's module-to-env pipeline.
            explore: Sample (``forward_exploration``) or act greedily
                (``forward_inference``, the distribution's argmax).

        Returns:
            A ``DefaultAct``, or None.
        """
        if (
            type(multi_module) is not MultiRLModule
            or _PHASE_METHODS[explore][0] in multi_module.__dict__  # (set on the instance)
            or type(pipeline) is not ModuleToEnvPipeline
        ):
            return None
        pieces = pipeline.connectors
        if len(pieces) != len(_DEFAULT_TAIL) or any(
            type(p) is not t for p, t in zip(pieces, _DEFAULT_TAIL, strict=True)
        ):
            return None
        if not all(_draws_categorical(m, explore) for m in multi_module._rl_modules.values()):
            return None
        return cls(multi_module, pipeline, explore)

    def __call__(
        self, runner: Any, batch: dict[Any, Any], ts: int
    ) -> tuple[dict[Any, Any], float] | None:
        """Runs the step on an env-to-module batch, or hands it back.

        Args:
            runner: The runner (its timers, the exploration step count).
            batch: ``{module_id: {column: tensor}}``, the env-to-module output.
            ts: Env steps sampled so far in this ``sample`` call.

        Returns:
            What ``EnvRunner._act`` returns (the module-to-env output and the time its
            stage started), or None where the general path must run the step (before
            anything was computed).

        Raises:
            ValueError: If a row of logits holds NaN or +inf, or is all -inf.
        """
        if runner._module is not self._multi_module or self._pipeline.connectors != self._pieces:
            return None
        modules = self._multi_module._rl_modules
        plan = []
        for module_id, module_batch in batch.items():
            module = self._modules.get(module_id)
            if module is None or modules.get(module_id) is not module or module.training:
                return None
            layers = (
                module._plain_actor_layers()  # (None: hooks, replaced head, ...)
                if module_id in self._direct_forward
                else None
            )
            plan.append((module_id, module, module_batch, layers))
        explore = self._explore
        start = time.perf_counter()
        kwargs: dict[str, Any] | None = None
        logits: dict[Any, Any] = {}  # (None: outputs the direct draw does not take)
        own: dict[Any, Any] = {}  # the outputs of the modules that ran their own forward
        for module_id, module, module_batch, layers in plan:
            if layers is None:  # the module's own forward pass, as MultiRLModule calls it
                if kwargs is None:
                    kwargs = {"t": runner._exploration_t(ts)} if explore else {}
                output = own[module_id] = getattr(module, self._phase)(module_batch, **kwargs)
                if module_id in runner._states:  # (its outputs have a one-step time axis)
                    runner._states.remove_time_axis({module_id: output})
                logits[module_id] = _own_logits(output)
            else:
                logits[module_id] = run_layers(layers, module._obs(module_batch))
        runner._log_time_since(keys.RLMODULE_INFERENCE_TIMER, start)
        start = time.perf_counter()
        if not all(
            x is not None and (not explore or native_draw_applies(x)) for x in logits.values()
        ):
            # The pipeline draws (or takes) these from the very outputs (no second
            # forward pass).
            outputs = {
                mid: own.get(mid, {Columns.ACTION_DIST_INPUTS: x}) for mid, x in logits.items()
            }
            return runner._connect(self._pipeline, outputs, explore), start
        out: dict[Any, dict[str, Any]] = {}
        for module_id, x in logits.items():
            # One numpy view of the logits serves the draw and the output. Exploring, the
            # logits are float32 CPU tensors without grad (checked above), for which
            # numpy() is the view numpy(force=True) gives, in 0.75 instead of 1.8 µs.
            x_np = x.numpy() if explore else x.numpy(force=True)
            # The general path's keys in its order: the module's outputs, then GetActions'
            # (actions and, exploring, their log-probabilities), then the env actions.
            output = own.get(module_id)
            module_out: dict[str, Any] = (
                {Columns.ACTION_DIST_INPUTS: x_np}
                if output is None
                else {
                    k: x_np if k == Columns.ACTION_DIST_INPUTS else to_numpy(v)
                    for k, v in output.items()
                }
            )
            if explore:
                module_out[Columns.ACTIONS], module_out[Columns.ACTION_LOGP] = (
                    categorical_draw_numpy(x_np)
                )
            else:  # GetActions' argmax
                greedy = TorchCategorical(logits=x).to_deterministic().sample()
                module_out[Columns.ACTIONS] = greedy.numpy(force=True)
                module_out[Columns.ACTION_LOGP] = np.zeros(len(x_np), np.float32)
            if module_id in self._fit_is_identity:
                module_out[Columns.ACTIONS_FOR_ENV] = module_out[Columns.ACTIONS]
            else:
                self._fit.fit_module(self._multi_module, module_id, module_out)
            out[module_id] = module_out
        return out, start
