"""Episode ids: random UUID4 hex strings, as RLlib's ``uuid.uuid4().hex``."""

from __future__ import annotations

import os

import numpy as np

from fastrollout._core import _forget_episode_ids, new_episode_id

__all__ = ["new_episode_id"]

# Ids are made 256 at a time as one hex string: ``os.urandom`` is a system call (about
# 0.5 µs per call in isolation, several times that in a runner's loop, where the runners
# make one id per episode and per agent episode), and a slice of a string is cheaper than
# formatting each id. The native module holds the string and hands out its slices (the
# episodes it makes take their ids there without a Python call); this module draws it.
_BATCH = 256

# A forked child draws its own bytes: ids must not repeat across processes.
os.register_at_fork(after_in_child=_forget_episode_ids)


def _draw_pool() -> str:
    """The hex digits of the next `_BATCH` ids (the native pool's refill)."""
    # One id per row; the bits are set for all rows at once (a loop over the bytes costs
    # about twice the draw itself).
    raw = np.frombuffer(os.urandom(16 * _BATCH), np.uint8).reshape(_BATCH, 16).copy()
    raw[:, 6] = (raw[:, 6] & 0x0F) | 0x40  # version 4
    raw[:, 8] = (raw[:, 8] & 0x3F) | 0x80  # RFC 4122 variant
    return raw.tobytes().hex()
