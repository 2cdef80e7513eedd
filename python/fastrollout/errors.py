"""Exceptions raised by fastrollout.

Each extends the builtin that RLlib raises in the same situation, so ``except
AssertionError`` / ``except ValueError`` written against RLlib keeps working.
"""

from fastrollout._core import EpisodeStateError, SpaceMismatchError

__all__ = [
    "CheckpointError",
    "EpisodeDoneError",
    "EpisodeStateError",
    "IndexFormError",
    "MultiAgentEnvError",
    "RunnerStoppedError",
    "SampleArgumentError",
    "SpaceMismatchError",
]

# Defined in the native module; shown under their public home in tracebacks.
EpisodeStateError.__module__ = __name__
SpaceMismatchError.__module__ = __name__


class MultiAgentEnvError(ValueError):
    """A multi-agent env step that the episode cannot record.

    Raised for data for an agent that is done, an agent that acted and observed without a
    reward, an agent truncated right after acting without a last observation, and a step
    after the episode is done. RLlib raises its own ``MultiAgentEnvError`` in those places;
    the message names the agent.

    A runner's episodes also raise it for an observation of an agent that is not among the
    env's ``possible_agents`` (RLlib records such an agent, without a space); the message
    names the agent, the sub-env and the declared agents.
    """


class EpisodeDoneError(EpisodeStateError, RuntimeError):
    """An operation that a done (terminated or truncated) episode does not allow.

    Also a ``RuntimeError``, which RLlib raises for a cut of a done multi-agent episode.
    """


class IndexFormError(TypeError, AssertionError):
    """An index form that a read does not take, e.g. an int with ``return_list=True``.

    RLlib 2.60 fails there with a ``TypeError`` or an ``AssertionError`` (depending on the
    data); this error is both, with a message that says what to pass instead.
    """


class SampleArgumentError(ValueError, AssertionError):
    """Arguments of ``EnvRunner.sample`` that do not go together or are out of range.

    RLlib 2.60's runners assert on them (``AssertionError``); a ``ValueError`` is what
    Python callers expect for a bad argument. This error is both.
    """


class RunnerStoppedError(RuntimeError):
    """A runner was asked to sample after ``stop()`` closed its env(s).

    RLlib's runners have no such guard: a stopped synchronous vector env samples on, an
    asynchronous one raises gymnasium's ``ClosedEnvironmentError``. fastrollout's runners
    raise this one error for every kind of env; ``make_env()`` creates new envs, after
    which the runner samples again.
    """


class CheckpointError(ValueError):
    """A checkpoint directory that cannot be loaded here.

    Raised for a directory that is not a fastrollout checkpoint or is incomplete or
    corrupt, and for a checkpoint of another class or of another checkpoint format
    version (the message names both). A missing directory is a ``FileNotFoundError``.
    """
