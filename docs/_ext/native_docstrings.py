"""A griffe extension: docstrings for the native module's objects from the extension itself.

griffe reads ``fastrollout._core`` from its hand-written stubs (``_core.pyi``), which carry
signatures and types but no docstrings: those are written once, in the Rust source, and
reach Python as ``__doc__``. This extension imports the compiled module and gives every
stub object without a docstring the one Python sees at run time, so that the methods the
Python classes inherit from the core (``SingleAgentEpisode.add_env_step``,
``MetricsLogger.log_value``...) appear in the API reference with their documentation.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

import griffe

NATIVE_MODULE = "fastrollout._core"


class NativeDocstrings(griffe.Extension):
    """Fills the native module's missing docstrings from the compiled extension."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        """Gives ``obj`` its run-time docstring if it belongs to the native module and has none.

        Args:
            obj: The object griffe has just loaded.
            **kwargs: The other event arguments (unused).
        """
        path = obj.path
        if obj.docstring is not None or not path.startswith(NATIVE_MODULE + "."):
            return
        value: Any = importlib.import_module(NATIVE_MODULE)
        for part in path[len(NATIVE_MODULE) + 1 :].split("."):
            value = inspect.getattr_static(value, part, None)
            if value is None:
                return
        doc = getattr(value, "__doc__", None)
        # Classes without a docstring of their own inherit object's; leave those empty.
        if doc and doc not in (object.__doc__, property.__doc__, type(value).__doc__):
            obj.docstring = griffe.Docstring(inspect.cleandoc(doc), parent=obj)
