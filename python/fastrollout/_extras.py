"""Optional dependencies: imported where a feature needs them, with an error naming the extra.

``import fastrollout`` imports none of them (Ray, pyarrow, msgpack, EnvPool, onnx,
matplotlib); each feature calls :func:`require_extra` when it starts, so a missing package
fails there with the ``pip install 'fastrollout[<extra>]'`` line that installs it.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

__all__ = ["check_extra", "require_extra"]


def _missing(module: str, extra: str, purpose: str, name: str | None) -> str:
    """The message of a missing optional dependency (without the import's own error)."""
    return f"{purpose} needs {name or module.partition('.')[0]}: pip install 'fastrollout[{extra}]'"


def require_extra(module: str, *, extra: str, purpose: str, name: str | None = None) -> ModuleType:
    """Imports an optional dependency, or raises an ``ImportError`` that names its extra.

    >>> require_extra("json", extra="none", purpose="this example").__name__
    'json'

    Args:
        module: The module to import (dotted: ``"pyarrow.parquet"``).
        extra: fastrollout's extra that installs it (``"offline"``).
        purpose: What needs it, the message's subject (``"fastrollout.offline"``).
        name: What to call the dependency in the message (default: the top-level package
            of ``module``).

    Returns:
        The imported module.

    Raises:
        ImportError: If the import fails: ``"{purpose} needs {name}: pip install
            'fastrollout[{extra}]' (import failed: ...)"``, chained to the import's error.
    """
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise ImportError(
            f"{_missing(module, extra, purpose, name)} (import failed: {err})"
        ) from err


def check_extra(module: str, *, extra: str, purpose: str, name: str | None = None) -> None:
    """Checks that an optional dependency is installed, without importing it.

    For a package another library imports later (torch imports onnx when it exports),
    checked before any work starts so that nothing is left half done.

    Args:
        module: The top-level module to look for (``"onnx"``).
        extra: fastrollout's extra that installs it (``"export"``).
        purpose: What needs it, the message's subject (``"exporting to ONNX"``).
        name: What to call the dependency in the message (default: ``module``).

    Raises:
        ImportError: If it is not installed: ``"{purpose} needs {name}: pip install
            'fastrollout[{extra}]'"``.
    """
    if importlib.util.find_spec(module) is None:
        raise ImportError(_missing(module, extra, purpose, name))
