"""``NumpyToTensor``: the module batches' numpy arrays become tensors on the module's device."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from fastrollout.connectors.connector_v2 import ConnectorV2
from fastrollout.modules.device import map_to_device, resolve_device

__all__ = ["NumpyToTensor"]


class NumpyToTensor(ConnectorV2):
    """Converts every module's batch (nested numpy) into tensors on a device.

    One conversion per column per module (no per-row work). float64 becomes float32. On
    CUDA targets host memory is pinned and the copies are non-blocking.

    Args:
        device: The target device setting (``"cpu"``, ``"cuda"``, ``"auto"``...); None:
            the device of each module (its first parameter).
        **kwargs: Passed to ``ConnectorV2``.
    """

    def __init__(self, device: str | torch.device | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.device = None if device is None else resolve_device(device)

    def __call__(
        self,
        *,
        rl_module: Any,
        batch: dict[Any, Any],
        episodes: Sequence[Any],
        explore: bool | None = None,
        shared_data: dict[str, Any] | None = None,
        metrics: Any = None,
        **kwargs: Any,
    ) -> dict[Any, Any]:
        """Converts the batch in place.

        Args:
            rl_module: The MultiRLModule (its modules' devices are used if no device
                was given).
            batch: ``{module_id: {column: array}}``.
            episodes: Unused.
            explore: Unused.
            shared_data: Unused.
            metrics: Unused.
            **kwargs: Unused.

        Returns:
            The batch with tensors.

        Raises:
            TypeError: If a column cannot become a tensor (module and column named).
        """
        return self.convert(rl_module, batch)

    def convert(self, rl_module: Any, batch: dict[Any, Any]) -> dict[Any, Any]:
        """Converts the batch in place, as ``__call__`` does.

        ``EnvToModulePipeline`` calls this directly when this piece ends it.

        Args:
            rl_module: The MultiRLModule (its modules' devices are used if no device
                was given).
            batch: ``{module_id: {column: array}}``, converted in place.

        Returns:
            The batch with tensors.

        Raises:
            TypeError: If a column cannot become a tensor (module and column named).
        """
        for module_id, module_batch in batch.items():
            device = self.device if self.device is not None else rl_module[module_id].device
            batch[module_id] = map_to_device(module_batch, device, (module_id,))
        return batch

    def convert_leaf(self, rl_module: Any, module_id: Any, column: str, value: Any) -> Any:
        """What ``convert`` makes of ``value`` in ``{module_id: {column: value}}``.

        ``EnvToModulePipeline.convert_observations`` converts the runners' observation
        columns this way, without the batch dicts around them.

        Args:
            rl_module: The MultiRLModule (the module's device is used if no device was
                given).
            module_id: The module the value is for.
            column: The value's column (for error messages).
            value: A numpy array (or nested arrays).

        Returns:
            The value as tensors.

        Raises:
            TypeError: If the value cannot become a tensor (module and column named).
        """
        device = self.device if self.device is not None else rl_module[module_id].device
        return map_to_device(value, device, (module_id, column))

    def __repr__(self) -> str:
        return f"NumpyToTensor(device={self.device})"
