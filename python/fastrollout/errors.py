"""Exceptions raised by fastrollout.

Each extends the builtin that RLlib raises in the same situation, so ``except
AssertionError`` / ``except ValueError`` written against RLlib keeps working.
"""

from fastrollout._core import EpisodeStateError, SpaceMismatchError

__all__ = ["EpisodeStateError", "MultiAgentEnvError", "SpaceMismatchError"]

# Defined in the native module; shown under their public home in tracebacks.
EpisodeStateError.__module__ = __name__
SpaceMismatchError.__module__ = __name__


class MultiAgentEnvError(ValueError):
    """A multi-agent env step that the episode cannot record.

    Raised for data for an agent that is done, an agent that acted and observed without a
    reward, an agent truncated right after acting without a last observation, and a step
    after the episode is done.

    RLlib raises its own ``MultiAgentEnvError`` in the same places; the message names the
    agent.
    """
