"""Exceptions raised by fastrollout.

Each extends the builtin that RLlib raises in the same situation, so ``except
AssertionError`` / ``except ValueError`` written against RLlib keeps working.
"""

from fastrollout._core import EpisodeStateError, SpaceMismatchError

__all__ = ["EpisodeStateError", "SpaceMismatchError"]

# Defined in the native module; shown under their public home in tracebacks.
EpisodeStateError.__module__ = __name__
SpaceMismatchError.__module__ = __name__
