"""Export an RLModule's policy to a file that runs without fastrollout.

:func:`export_module` writes a module's greedy forward pass (``forward_inference``) as a
TorchScript file (``model.pt``, loaded with ``torch.jit.load``) or an ONNX file
(``model.onnx``, run with onnxruntime or any ONNX runtime), with ``model.json`` next to it
that describes how to call it: the inputs (one tensor per observation leaf, batch first),
the outputs, the observation and action spaces and the action distribution.

The exported model's outputs:

* ``action_dist_inputs``: what ``forward_inference`` returns under
  ``Columns.ACTION_DIST_INPUTS`` (Categorical logits, DiagGaussian ``[mean, log_std]``
  halves of the last axis, MultiCategorical concatenated logits), shape ``(B, N)``.
* ``vf_preds`` (second output, only where the module has a value function, i.e.
  ``compute_values``, and is not inference-only): the value estimates, shape ``(B,)``.

Observations go in as the module reads them: a Box as ``(B, *shape)`` in the space's
dtype, a Discrete as ``(B,)`` int64, a MultiDiscrete as ``(B, *nvec.shape)`` int64, a
MultiBinary as ``(B, *shape)`` int8. A Dict or Tuple observation space becomes one input
per leaf, in the space's order (``obs.<key>`` / ``obs.<index>``, nested with dots).

ONNX export uses torch's TorchScript-based exporter, which needs the ``onnx`` package
(``pip install fastrollout[export]``, which also installs onnxruntime to run the file).
"""

from __future__ import annotations

import copy
import json
import math
import pathlib
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from fastrollout._extras import check_extra
from fastrollout.core import Columns

__all__ = ["export_module"]

#: The lowest ONNX opset the exporter accepts here (``OneHot``, for Discrete
#: observations, is opset 9).
ONNX_MIN_OPSET = 9
#: The highest opset torch's TorchScript-based ONNX exporter writes.
ONNX_MAX_OPSET = 20

_TRACE_BATCH = 2  # traced with 2 rows (not 1, so that no size-1 axis gets specialised)
_CHECK_BATCH = 3  # and checked against the eager module with another batch size
_CHECK_ATOL = 1e-5

# One observation leaf: (input name, path of keys from the observation root, space).
_Leaf = tuple[str, tuple[Any, ...], gym.Space]


def _leaves(space: gym.Space, name: str, path: tuple[Any, ...]) -> list[_Leaf]:
    """The leaf spaces of an observation space in its order, with input names and paths.

    Raises:
        TypeError: For a space that is not Box, Discrete, MultiDiscrete, MultiBinary or a
            Dict/Tuple of those (named by its input name).
    """
    if isinstance(
        space,
        gym.spaces.Box | gym.spaces.Discrete | gym.spaces.MultiDiscrete | gym.spaces.MultiBinary,
    ):
        return [(name, path, space)]
    if isinstance(space, gym.spaces.Dict):
        return [
            leaf
            for key, sub in space.spaces.items()
            for leaf in _leaves(sub, f"{name}.{key}", (*path, key))
        ]
    if isinstance(space, gym.spaces.Tuple):
        return [
            leaf
            for i, sub in enumerate(space.spaces)
            for leaf in _leaves(sub, f"{name}.{i}", (*path, i))
        ]
    raise TypeError(
        f"cannot export a module whose observation space {name} = {space} is a "
        f"{type(space).__name__}: supported are Box, Discrete, MultiDiscrete, MultiBinary "
        "and Dict/Tuple of those"
    )


def _leaf_dtype(space: gym.Space) -> torch.dtype:
    """The dtype a leaf's input tensor has (what the module's runners feed it)."""
    if isinstance(space, gym.spaces.Discrete | gym.spaces.MultiDiscrete):
        return torch.int64
    if isinstance(space, gym.spaces.MultiBinary):
        return torch.int8
    return torch.from_numpy(np.zeros(0, dtype=space.dtype)).dtype


def _sample_leaf(space: gym.Space, batch: int) -> torch.Tensor:
    """A batch of ``batch`` samples of a leaf space, as the exported model's input."""
    rows = np.stack([np.asarray(space.sample()) for _ in range(batch)])
    return torch.as_tensor(rows).to(_leaf_dtype(space))


def _rebuild(space: gym.Space, leaves: Sequence[torch.Tensor], start: int) -> tuple[Any, int]:
    """The observation structure of ``space`` from its flat leaves (from ``start`` on).

    Returns:
        ``(structure, next_start)``.
    """
    if isinstance(space, gym.spaces.Dict):
        out: dict[Any, Any] = {}
        for key, sub in space.spaces.items():
            out[key], start = _rebuild(sub, leaves, start)
        return out, start
    if isinstance(space, gym.spaces.Tuple):
        parts = []
        for sub in space.spaces:
            part, start = _rebuild(sub, leaves, start)
            parts.append(part)
        return tuple(parts), start
    return leaves[start], start + 1


class _PolicyWrapper(nn.Module):
    """The module's ``forward_inference`` (and value function) on plain tensor inputs."""

    def __init__(self, module: nn.Module, observation_space: gym.Space, with_value: bool):
        super().__init__()
        self.module = module
        self._observation_space = observation_space
        self._with_value = with_value

    def forward(self, *obs: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        structure, _ = _rebuild(self._observation_space, obs, 0)
        batch = {Columns.OBS: structure}
        out: Any = self.module.forward_inference(batch)  # type: ignore[operator]
        if not isinstance(out, dict) or Columns.ACTION_DIST_INPUTS not in out:
            got = sorted(out) if isinstance(out, dict) else type(out).__name__
            raise ValueError(
                f"cannot export {type(self.module).__name__}: its forward_inference returns "
                f"no {Columns.ACTION_DIST_INPUTS!r} (got {got})"
            )
        logits = out[Columns.ACTION_DIST_INPUTS]
        if not isinstance(logits, torch.Tensor):
            raise ValueError(
                f"cannot export {type(self.module).__name__}: its forward_inference's "
                f"{Columns.ACTION_DIST_INPUTS!r} is a {type(logits).__name__}, not a tensor"
            )
        if self._with_value:
            values = self.module.compute_values(batch)  # type: ignore[operator]
            return logits, values
        return logits


def _has_value_function(module: nn.Module) -> bool:
    return callable(getattr(module, "compute_values", None)) and not bool(
        getattr(module, "inference_only", False)
    )


def _check_module(module: Any) -> gym.Space:
    """The module's observation space, after checking that the module can be exported.

    Raises:
        TypeError: For a MultiRLModule, a module that is not a torch module, or one
            without ``forward_inference``.
        ValueError: For a module without an observation space, or a stateful one.
    """
    if isinstance(module, nn.Module) and callable(getattr(module, "forward_inference", None)):
        pass
    elif hasattr(module, "keys") and hasattr(module, "__getitem__"):
        raise TypeError(
            f"cannot export a {type(module).__name__} (a multi-agent module): export one of "
            "its policies, module[policy_id]"
        )
    elif not isinstance(module, nn.Module):
        raise TypeError(
            f"cannot export a {type(module).__name__}: only torch RLModules (torch.nn.Module "
            "with forward_inference) can be exported"
        )
    else:
        raise TypeError(
            f"cannot export {type(module).__name__}: it is a torch module but not an "
            "RLModule (it has no forward_inference)"
        )
    space = getattr(module, "observation_space", None)
    if not isinstance(space, gym.Space):
        raise ValueError(
            f"cannot export {type(module).__name__}: it has no observation_space "
            f"(got {space!r}), which says what the exported model's inputs are"
        )
    is_stateful = getattr(module, "is_stateful", None)
    if callable(is_stateful) and is_stateful():
        raise ValueError(
            f"cannot export {type(module).__name__}: it is stateful (recurrent); only "
            "stateless modules can be exported"
        )
    return space


def _check_opset(onnx: Any) -> int:
    """The ONNX opset, checked.

    Raises:
        TypeError: If ``onnx`` is not an int.
        ValueError: If it is outside what the exporter writes.
        ImportError: If the ``onnx`` package is not installed.
    """
    if isinstance(onnx, bool) or not isinstance(onnx, int):
        raise TypeError(
            f"onnx must be None (TorchScript) or an ONNX opset version (int), got {onnx!r}"
        )
    if not ONNX_MIN_OPSET <= onnx <= ONNX_MAX_OPSET:
        raise ValueError(
            f"onnx={onnx} is not an opset the exporter writes: use {ONNX_MIN_OPSET} to "
            f"{ONNX_MAX_OPSET}"
        )
    # Only looked for: torch.onnx.export imports it.
    check_extra("onnx", extra="export", purpose="exporting to ONNX", name="the onnx package")
    return onnx


# -- model.json ---------------------------------------------------------------------------


def _plain_number(x: Any) -> Any:
    """A JSON-safe number: non-finite floats as the strings "inf", "-inf", "nan"."""
    if isinstance(x, float) and not math.isfinite(x):
        return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
    return x


def _plain_array(a: np.ndarray) -> Any:
    """An array as one number where all its entries are equal, else nested lists."""
    flat = a.reshape(-1)
    if flat.size and np.all(flat == flat[0]):
        return _plain_number(flat[0].item())
    return _plain_nested(a.tolist())


def _plain_nested(x: Any) -> Any:
    if isinstance(x, Mapping):
        return {k: _plain_nested(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_plain_nested(v) for v in x]
    if isinstance(x, np.ndarray):
        return _plain_array(x)
    return _plain_number(x)


def _plain_space(space: gym.Space | None) -> Any:
    """A space as plain JSON: the policy server protocol's space map, arrays as lists."""
    from fastrollout.external.protocol import space_to_wire

    if space is None:
        return None
    try:
        wire = space_to_wire(space)
    except TypeError:  # a space the protocol does not carry: described, not mapped
        return {"type": type(space).__name__, "repr": repr(space)}
    return _plain_nested(wire)


def _dist_description(module: nn.Module) -> dict[str, Any] | None:
    """The action distribution's class and how to read ``action_dist_inputs``."""
    get_cls = getattr(module, "get_inference_action_dist_cls", None)
    try:
        cls = get_cls() if callable(get_cls) else None
    except TypeError:
        cls = None
    if cls is None:
        return None
    names = {c.__name__ for c in cls.__mro__}
    if "TorchCategorical" in names:
        how = "logits (unnormalised log-probabilities); greedy action: argmax + space.start"
    elif "TorchDiagGaussian" in names:
        how = (
            "mean and log_std concatenated on the last axis (first half mean, second half "
            "log_std); greedy action: the mean"
        )
    elif "TorchMultiCategorical" in names:
        how = (
            "the logits of each sub-action concatenated on the last axis (sizes "
            "action_space.nvec); greedy action: argmax of each part"
        )
    elif "TorchDeterministic" in names:
        how = "the action itself"
    else:
        how = f"the inputs of {cls.__name__}.from_logits"
    return {"class": cls.__name__, "action_dist_inputs": how}


def _describe(
    module: nn.Module,
    leaves: list[_Leaf],
    outputs: list[tuple[str, torch.Tensor]],
    file_name: str,
    opset: int | None,
) -> dict[str, Any]:
    """The content of ``model.json``."""
    fmt = "torchscript" if opset is None else "onnx"
    in_names = ", ".join(name for name, _, _ in leaves)
    if opset is None:
        usage = (
            f"model = torch.jit.load('{file_name}'); outputs = model({in_names}) "
            "(tensors, batch first, dtypes as in inputs)"
        )
    else:
        feeds = ", ".join(f"'{name}': ..." for name, _, _ in leaves)
        usage = (
            f"session = onnxruntime.InferenceSession('{file_name}'); "
            f"outputs = session.run(None, {{{feeds}}}) (numpy arrays, batch first)"
        )
    return {
        "format": fmt,
        "file": file_name,
        "onnx_opset": opset,
        "module_class": f"{type(module).__module__}.{type(module).__qualname__}",
        "torch_version": torch.__version__,
        "usage": usage,
        "inputs": [
            {
                "name": name,
                "observation_path": list(path),
                "dtype": str(_leaf_dtype(space)).removeprefix("torch."),
                "shape": ["batch", *(int(d) for d in (space.shape or ()))],
                "space": _plain_space(space),
            }
            for name, path, space in leaves
        ],
        "outputs": [
            {
                "name": name,
                "dtype": str(t.dtype).removeprefix("torch."),
                "shape": ["batch", *(int(d) for d in t.shape[1:])],
            }
            for name, t in outputs
        ],
        "observation_space": _plain_space(getattr(module, "observation_space", None)),
        "action_space": _plain_space(getattr(module, "action_space", None)),
        "action_distribution": _dist_description(module),
    }


# -- export ------------------------------------------------------------------------------


def _quiet_torch_deprecations() -> None:
    """Ignores torch's deprecation notices of TorchScript (inside ``catch_warnings``).

    torch deprecates ``torch.jit.trace`` and the TorchScript-based ONNX exporter in favour
    of ``torch.export``, whose files need torch 2.x's export runtime (``.pt2``) or
    onnxscript; TorchScript files still load with ``torch.jit.load`` everywhere.
    """
    warnings.simplefilter("ignore", DeprecationWarning)
    warnings.simplefilter("ignore", FutureWarning)


def _as_tuple(out: Any) -> tuple[torch.Tensor, ...]:
    return out if isinstance(out, tuple) else (out,)


def _trace(wrapper: _PolicyWrapper, leaves: list[_Leaf]) -> torch.jit.ScriptModule:
    """``wrapper`` traced, and checked against the eager module on another batch size.

    Raises:
        ValueError: If the traced graph computes something else than the module (its
            forward depends on the values or the batch size in a way a trace cannot
            record).
    """
    example = tuple(_sample_leaf(space, _TRACE_BATCH) for _, _, space in leaves)
    with torch.no_grad(), warnings.catch_warnings():
        _quiet_torch_deprecations()
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        traced = torch.jit.trace(wrapper, example, check_trace=False)
        check = tuple(_sample_leaf(space, _CHECK_BATCH) for _, _, space in leaves)
        want, got = _as_tuple(wrapper(*check)), _as_tuple(traced(*check))
    for w, g in zip(want, got, strict=True):
        if w.shape != g.shape or not torch.allclose(w, g, atol=_CHECK_ATOL, rtol=0):
            raise ValueError(
                f"cannot export {type(wrapper.module).__name__}: its traced forward_inference "
                f"differs from the module on a batch of {_CHECK_BATCH} (does its forward "
                "branch on the values or the batch size?)"
            )
    return traced


def export_module(
    module: Any, export_dir: str | pathlib.Path, *, onnx: int | None = None
) -> pathlib.Path:
    """Writes a module's policy as a TorchScript or ONNX file that runs without fastrollout.

    The file computes ``forward_inference``'s ``action_dist_inputs`` from observation
    tensors (one per observation leaf, batch first), and the value estimates as a second
    output where the module has a value function (``compute_values``) and is not
    inference-only. ``export_dir/model.json`` describes the inputs and outputs (names,
    dtypes, shapes), the observation and action spaces and the action distribution. The
    module itself is not changed (a CPU copy is traced).

    Args:
        module: A torch RLModule (fastrollout's, or any ``torch.nn.Module`` with
            ``forward_inference`` and ``observation_space``), not a MultiRLModule.
        export_dir: The folder to write to (made if missing; existing files replaced).
        onnx: ``None`` for TorchScript (``model.pt``, ``torch.jit.load``); an ONNX opset
            version (9 to 20) for ONNX (``model.onnx`` with inputs ``obs`` (or
            ``obs.<key>`` per Dict/Tuple leaf) and outputs ``action_dist_inputs`` and
            ``vf_preds``, batch axis dynamic).

    Returns:
        The path of the model file written.

    Raises:
        TypeError: If ``module`` is a MultiRLModule, not a torch module, or has no
            ``forward_inference``; if its observation space (or a part of it) is not Box,
            Discrete, MultiDiscrete, MultiBinary or Dict/Tuple of those; if ``onnx`` is
            neither None nor an int.
        ValueError: If the module has no observation space, is stateful, returns no
            ``action_dist_inputs`` tensor, or cannot be traced faithfully; if ``onnx`` is an
            opset outside 9..20.
        ImportError: If ``onnx`` is given and the onnx package is not installed
            (``pip install fastrollout[export]``).
    """
    observation_space = _check_module(module)
    opset = None if onnx is None else _check_opset(onnx)
    leaves = _leaves(observation_space, "obs", ())
    if len(leaves) == 1:
        leaves = [("obs", leaves[0][1], leaves[0][2])]

    # Traced on a CPU copy in eval mode: the caller's module (maybe in use, maybe on a
    # GPU, maybe in train mode) is left alone, and the file loads on any machine.
    # Its parameters do not require grad, so that the file's outputs do not either.
    cpu_module = copy.deepcopy(module).to("cpu")
    cpu_module.eval()
    cpu_module.requires_grad_(False)
    with_value = _has_value_function(cpu_module)
    wrapper = _PolicyWrapper(cpu_module, observation_space, with_value)
    traced = _trace(wrapper, leaves)

    example = tuple(_sample_leaf(space, _TRACE_BATCH) for _, _, space in leaves)
    with torch.no_grad():
        example_out = _as_tuple(traced(*example))
    out_names = [Columns.ACTION_DIST_INPUTS, Columns.VF_PREDS][: len(example_out)]

    export_dir = pathlib.Path(export_dir)
    export_dir.mkdir(parents=True, exist_ok=True)
    in_names = [name for name, _, _ in leaves]
    if opset is None:
        path = export_dir / "model.pt"
        with warnings.catch_warnings():
            _quiet_torch_deprecations()
            torch.jit.save(traced, str(path))
    else:
        path = export_dir / "model.onnx"
        with torch.no_grad(), warnings.catch_warnings():
            # The TorchScript-based exporter is deprecated in favour of the torch.export
            # one, which needs onnxscript; this one needs only onnx.
            _quiet_torch_deprecations()
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            torch.onnx.export(
                wrapper,  # (the exporter traces it again, as checked above)
                example,
                str(path),
                input_names=in_names,
                output_names=out_names,
                opset_version=opset,
                dynamo=False,
                dynamic_axes={name: {0: "batch"} for name in (*in_names, *out_names)},
            )
    meta = _describe(
        cpu_module, leaves, list(zip(out_names, example_out, strict=True)), path.name, opset
    )
    (export_dir / "model.json").write_text(json.dumps(meta, indent=2) + "\n")
    return path
