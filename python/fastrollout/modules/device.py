"""Device placement: which torch device to use, and moving batches onto it.

``resolve_device("auto")`` picks CUDA when it is available. ``to_device`` moves a nested
structure (dicts, lists, tuples) of numpy arrays or tensors to a device in one pass; for
CUDA targets host memory is pinned first so that the copy runs asynchronously
(``non_blocking=True``) and overlaps with the Python work that follows.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

__all__ = ["resolve_device", "to_device", "to_tensor"]


def resolve_device(device: str | torch.device | None = "auto") -> torch.device:
    """Turns a device setting into a ``torch.device``.

    Args:
        device: ``"auto"`` (or ``None``): CUDA when available, else CPU; ``"cpu"``;
            ``"cuda"`` or ``"cuda:N"``; or a ``torch.device``.

    Returns:
        The torch device.

    Raises:
        ValueError: If the setting is not a known device name, or names CUDA (or a CUDA
            device index) that this machine does not have.
    """
    if device is None or (isinstance(device, str) and device == "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(
            f"unknown device {device!r}: expected 'auto', 'cpu', 'cuda', 'cuda:N' or a torch.device"
        ) from err
    if resolved.type not in ("cpu", "cuda"):
        raise ValueError(f"unsupported device {device!r}: only 'cpu' and 'cuda' are supported")
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {device!r} was asked for, but CUDA is not available")
        if resolved.index is not None and resolved.index >= torch.cuda.device_count():
            raise ValueError(
                f"device {device!r} was asked for, but only {torch.cuda.device_count()} "
                "CUDA device(s) exist"
            )
    return resolved


def to_tensor(value: Any, device: torch.device | None = None) -> torch.Tensor:
    """Converts one numpy array (or tensor, or number) into a tensor on ``device``.

    float64 becomes float32 (modules compute in float32, as RLlib's conversion does).
    Numpy arrays are shared, not copied, where torch allows it (CPU target, writable,
    native byte order); a read-only or non-contiguous array is copied once.

    Args:
        value: A numpy array, a tensor, or a Python/numpy scalar.
        device: The target device (``None``: CPU for new tensors, unchanged for tensors).

    Returns:
        The tensor.

    Raises:
        TypeError: If the value is an object array or not numeric.
    """
    if isinstance(value, torch.Tensor):
        tensor = value
    else:
        array = np.asarray(value)
        if array.dtype == np.float64:
            array = array.astype(np.float32)
        elif array.dtype.kind not in "biuf":
            raise TypeError(
                f"cannot convert an array of dtype {array.dtype} to a tensor (numeric and "
                "bool arrays only)"
            )
        # torch.from_numpy shares memory but warns on read-only arrays and needs native
        # byte order; copying those once is cheaper than a warning per step.
        if not array.flags.writeable or not array.dtype.isnative or not array.flags.c_contiguous:
            array = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("="))
            if not array.flags.writeable:
                array = array.copy()
        tensor = torch.from_numpy(array)
    if tensor.dtype == torch.float64:
        tensor = tensor.float()
    # (torch.device equality costs 0.3 µs; the cpu case is read off two flags)
    if device is None or (tensor.is_cpu and device.type == "cpu") or tensor.device == device:
        return tensor
    if device.type == "cuda" and tensor.device.type == "cpu":
        # Pinned (page-locked) host memory lets the host-to-device copy run async.
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


def to_device(tree: Any, device: str | torch.device | None) -> Any:
    """Moves a nested structure of numpy arrays or tensors to ``device``.

    Dicts (any mapping), lists and tuples are rebuilt with the same keys and order;
    every leaf goes through :func:`to_tensor`. ``None`` leaves stay ``None``.

    Args:
        tree: The structure.
        device: The target device (a setting :func:`resolve_device` accepts, or ``None``
            to convert to CPU tensors without moving existing ones).

    Returns:
        The same structure with tensors as leaves.

    Raises:
        TypeError: If a leaf cannot become a tensor (the path of the leaf is named).
        ValueError: If the device setting is invalid.
    """
    target = None if device is None else resolve_device(device)
    return _map(tree, target, ())


def _map(tree: Any, device: torch.device | None, path: tuple) -> Any:
    if type(tree) is dict:  # the common case, without the ABC check of Mapping
        return {k: _map(v, device, (*path, k)) for k, v in tree.items()}
    if isinstance(tree, Mapping):
        return {k: _map(v, device, (*path, k)) for k, v in tree.items()}
    if isinstance(tree, tuple | list):
        return type(tree)(_map(v, device, (*path, i)) for i, v in enumerate(tree))
    if tree is None:
        return None
    try:
        return to_tensor(tree, device)
    except TypeError as err:
        where = "/".join(str(p) for p in path) or "<root>"
        raise TypeError(f"leaf {where!r}: {err}") from err
