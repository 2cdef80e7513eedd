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
    if type(value) is np.ndarray and id(value.dtype) in _SHARED_DTYPE_IDS:
        # The common case (an env's float32 or uint8 observations), in 0.9 instead of
        # 1.8 µs: a native dtype torch shares as it is, checked by identity, so only
        # the layout is left to check.
        flags = value.flags
        if flags.writeable and flags.c_contiguous:
            tensor = torch.from_numpy(value)
            if device is None or _is_cpu(device):
                return tensor
            return _moved(tensor, device)
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
    if device is None or (tensor.is_cpu and _is_cpu(device)) or tensor.device == device:
        return tensor
    return _moved(tensor, device)


# Numpy's own dtype objects for the native-order types that torch.from_numpy shares
# without a cast (float64 is cast to float32 and takes the general path). Arrays of
# these types carry these very objects, so membership is an identity test.
_SHARED_DTYPE_IDS = frozenset(
    id(np.dtype(t))
    for t in (
        np.float32,
        np.float16,
        np.uint8,
        np.int8,
        np.int16,
        np.int32,
        np.int64,
        np.bool_,
    )
)

# torch.device.type builds a new string on every read (0.3 µs); whether a device is
# the CPU is remembered per device object (the runners reuse one object per module).
_CPU_BY_DEVICE: dict[int, tuple[torch.device, bool]] = {}


def _is_cpu(device: torch.device) -> bool:
    known = _CPU_BY_DEVICE.get(id(device))
    if known is not None and known[0] is device:
        return known[1]
    if len(_CPU_BY_DEVICE) > 64:  # devices made per call: keep the memo small
        _CPU_BY_DEVICE.clear()
    is_cpu = device.type == "cpu"
    # The device is kept alive with its answer, so its id cannot be reused meanwhile.
    _CPU_BY_DEVICE[id(device)] = (device, is_cpu)
    return is_cpu


def _moved(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``tensor`` on ``device`` (not the CPU); host memory is pinned for CUDA targets."""
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
    return map_to_device(tree, target, ())


def map_to_device(tree: Any, device: torch.device | None, path: tuple) -> Any:
    """:func:`to_device` for a device already resolved (the connectors' per-step path).

    Args:
        tree: The structure.
        device: The target device, or ``None`` for CPU tensors.
        path: Where ``tree`` sits, prefixed to a failing leaf's path in the error.

    Returns:
        The same structure with tensors as leaves.
    """
    if type(tree) is not np.ndarray:  # (the common leaf skips the ABC checks below)
        if type(tree) is dict:  # the common case, without the ABC check of Mapping
            return {k: map_to_device(v, device, (*path, k)) for k, v in tree.items()}
        if isinstance(tree, Mapping):
            return {k: map_to_device(v, device, (*path, k)) for k, v in tree.items()}
        if isinstance(tree, tuple | list):
            return type(tree)(map_to_device(v, device, (*path, i)) for i, v in enumerate(tree))
        if tree is None:
            return None
    try:
        return to_tensor(tree, device)
    except TypeError as err:
        where = "/".join(str(p) for p in path) or "<root>"
        raise TypeError(f"leaf {where!r}: {err}") from err
