"""User hooks into sampling: the ``Callbacks`` base class and ``make_callback``.

Runners call every hook through :func:`make_callback`, which calls the methods of the
callback objects (instances of ``RunnerConfig.callbacks(callbacks_class=...)``) first and
then the plain callables given as ``RunnerConfig.callbacks(on_episode_start=...)`` etc.,
each in the order given, with keyword arguments only, as RLlib 2.60 does. A subclass of
RLlib's ``RLlibCallback`` works as a callbacks class as it is.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from fastrollout.core.tree import as_list

__all__ = ["CALLBACK_NAMES", "Callbacks", "make_callback"]

# The hooks runners call, in the order they first occur while sampling.
CALLBACK_NAMES = (
    "on_environment_created",
    "on_episode_created",
    "on_episode_start",
    "on_episode_step",
    "on_episode_end",
    "on_sample_end",
)


class Callbacks:
    """Base class for callbacks: override the hooks you need; the others do nothing.

    Every hook takes keyword arguments only and accepts ``**kwargs``, so that hooks keep
    working when runners pass more arguments. The arguments are RLlib 2.60's.
    """

    def on_environment_created(
        self,
        *,
        env_runner: Any,
        metrics_logger: Any = None,
        env: Any,
        env_context: Any,
        **kwargs: Any,
    ) -> None:
        """Called after a runner created its (vector or multi-agent) env.

        Args:
            env_runner: The runner.
            metrics_logger: The runner's ``MetricsLogger``, for custom metrics.
            env: The env just created.
            env_context: The ``EnvContext`` it was created with.
            **kwargs: Forward compatibility.
        """

    def on_episode_created(
        self,
        *,
        episode: Any,
        env_runner: Any = None,
        metrics_logger: Any = None,
        env: Any = None,
        rl_module: Any = None,
        env_index: int,
        **kwargs: Any,
    ) -> None:
        """Called when a new episode object exists, before its env reset is recorded.

        Args:
            episode: The new, still empty episode.
            env_runner: The runner.
            metrics_logger: The runner's ``MetricsLogger``.
            env: The runner's env.
            rl_module: The runner's module.
            env_index: The sub-env the episode runs in.
            **kwargs: Forward compatibility.
        """

    def on_episode_start(
        self,
        *,
        episode: Any,
        env_runner: Any = None,
        metrics_logger: Any = None,
        env: Any = None,
        env_index: int,
        rl_module: Any = None,
        **kwargs: Any,
    ) -> None:
        """Called after an episode's reset observation was recorded.

        Args:
            episode: The episode.
            env_runner: The runner.
            metrics_logger: The runner's ``MetricsLogger``.
            env: The runner's env.
            env_index: The sub-env the episode runs in.
            rl_module: The runner's module.
            **kwargs: Forward compatibility.
        """

    def on_episode_step(
        self,
        *,
        episode: Any,
        env_runner: Any = None,
        metrics_logger: Any = None,
        env: Any = None,
        env_index: int,
        rl_module: Any = None,
        **kwargs: Any,
    ) -> None:
        """Called after each env step was recorded (not after the reset).

        Args:
            episode: The episode.
            env_runner: The runner.
            metrics_logger: The runner's ``MetricsLogger``.
            env: The runner's env.
            env_index: The sub-env the episode runs in.
            rl_module: The runner's module.
            **kwargs: Forward compatibility.
        """

    def on_episode_end(
        self,
        *,
        episode: Any,
        prev_episode_chunks: list[Any] | None = None,
        env_runner: Any = None,
        metrics_logger: Any = None,
        env: Any = None,
        env_index: int,
        rl_module: Any = None,
        **kwargs: Any,
    ) -> None:
        """Called when an episode is done (terminated or truncated).

        Args:
            episode: The episode's last chunk.
            prev_episode_chunks: The chunks of the same episode returned by earlier
                ``sample()`` calls.
            env_runner: The runner.
            metrics_logger: The runner's ``MetricsLogger``.
            env: The runner's env.
            env_index: The sub-env the episode ran in.
            rl_module: The runner's module.
            **kwargs: Forward compatibility.
        """

    def on_sample_end(
        self,
        *,
        env_runner: Any = None,
        metrics_logger: Any = None,
        samples: list[Any],
        **kwargs: Any,
    ) -> None:
        """Called at the end of ``sample()`` with the episodes it returns.

        Args:
            env_runner: The runner.
            metrics_logger: The runner's ``MetricsLogger``.
            samples: The returned episodes.
            **kwargs: Forward compatibility.
        """


def make_callback(
    callback_name: str,
    callbacks_objects: Any = None,
    callbacks_functions: Callable[..., Any] | Iterable[Callable[..., Any]] | None = None,
    *,
    args: Iterable[Any] | None = None,
    kwargs: dict[str, Any] | None = None,
    **more_kwargs: Any,
) -> None:
    """Calls one hook on every callback object, then every plain callable, in order.

    Takes RLlib 2.60's form (``kwargs={...}``) and also plain keyword arguments; both are
    passed on together.

    Args:
        callback_name: The hook, e.g. ``"on_episode_start"``.
        callbacks_objects: A callbacks object or a list of them; each gets
            ``getattr(obj, callback_name)(...)``.
        callbacks_functions: A callable or a list of them (from
            ``RunnerConfig.callbacks(on_...=...)``).
        args: Positional arguments (RLlib passes none; kept for its signature).
        kwargs: Keyword arguments for every call.
        **more_kwargs: More keyword arguments for every call.

    Raises:
        AttributeError: A callbacks object lacks the hook (the message names both).
        TypeError: A given callable is not callable.

    >>> calls = []
    >>> make_callback("on_sample_end", None, [lambda **kw: calls.append(kw)], samples=[])
    >>> calls
    [{'samples': []}]
    """
    call_kwargs = {**(kwargs or {}), **more_kwargs}
    call_args = tuple(args or ())
    for obj in as_list(callbacks_objects):
        hook = getattr(obj, callback_name, None)
        if hook is None:
            raise AttributeError(
                f"callbacks object {type(obj).__name__} has no method {callback_name!r}"
            )
        hook(*call_args, **call_kwargs)
    for fn in as_list(callbacks_functions):
        if not callable(fn):
            raise TypeError(
                f"callback for {callback_name!r} must be callable, got {type(fn).__name__}"
            )
        fn(*call_args, **call_kwargs)
