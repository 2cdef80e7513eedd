"""Experience on disk and its evaluation.

- :func:`read_episodes` and the writer behind ``offline_data(output=...)``: episodes as
  parquet files in RLlib 2.60's layouts (``pip install 'fastrollout[offline]'``);
- :func:`estimate`: off-policy estimates (IS, WIS, DM, DR) of a module's value from logged
  episodes.

The names load on first use, so that ``import fastrollout`` needs neither pyarrow nor the
estimators' dependencies.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["estimate", "read_episodes"]

# Public name -> the module that defines it.
_WHERE = {
    "estimate": "fastrollout.offline.estimators",
    "read_episodes": "fastrollout.offline.reader",
}


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'fastrollout.offline' has no attribute {name!r}")
    return getattr(importlib.import_module(where), name)
