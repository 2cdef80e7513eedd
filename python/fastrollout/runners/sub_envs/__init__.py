"""Sub-env backends: the sub-envs a runner steps, behind one small interface.

- :class:`~fastrollout.runners.sub_envs.base.SubEnvs`: send actions to some sub-envs, poll
  those that finished, reset one, recreate one, close;
- :class:`~fastrollout.runners.sub_envs.vector.GymVectorSubEnvs`: a gymnasium vector env
  (in-process, natively vectorized, or ``AsyncVectorEnv`` sub-processes), single-agent;
- :class:`~fastrollout.runners.sub_envs.multi_agent.MultiAgentListSubEnvs`: a list of
  multi-agent envs in this process;
- :class:`~fastrollout.runners.sub_envs.remote.RemoteSubEnvs`: one Ray actor per sub-env,
  stepped as they become ready (``remote_worker_envs``), single- and multi-agent;
- :class:`~fastrollout.runners.sub_envs.external.ExternalSubEnvs`: the episodes of an
  ``ExternalEnv`` (simulators, a policy server's clients), one per row;
- :class:`~fastrollout.runners.sub_envs.shared_memory.SharedMemorySubEnvs`: worker
  processes that step groups of sub-envs in the background, observations in shared
  memory, batches returned as they are ready (``sub_env_backend="shared_memory"``);
- :class:`~fastrollout.runners.sub_envs.envpool_backend.EnvPoolSubEnvs`: an EnvPool task
  (``"envpool:<task>"`` env ids), stepped through EnvPool's own ``send``/``recv``;
- :func:`make_sub_envs`: the backend a runner config asks for.
"""

from __future__ import annotations

from typing import Any

from fastrollout.env.external_env import ExternalEnv, ExternalEnvCreated
from fastrollout.runners._config import cfg
from fastrollout.runners.sub_envs.base import StepResults, SubEnvs

__all__ = ["StepResults", "SubEnvs", "make_sub_envs"]


def make_sub_envs(config: Any, creator: Any, *, multi_agent: bool) -> SubEnvs:
    """The sub-envs of a runner, as its config asks.

    ``remote_worker_envs=True``: one Ray actor per sub-env; else a multi-agent env gets a
    list of envs in this process and a single-agent env the gymnasium vector env of
    ``gym_env_vectorize_mode``; an ``ExternalEnv`` (whatever made it) is served by
    ``ExternalSubEnvs``, its ``max_concurrent`` episodes as the sub-envs. With
    ``restart_failed_sub_environments``, in-process sub-envs that fail to be created are
    made again, up to ``max_sub_environment_restart_attempts`` more times.

    Args:
        config: The runner config (``num_envs_per_env_runner``, ``remote_worker_envs``,
            ``gym_env_vectorize_mode``, ``restart_failed_sub_environments``,
            ``sub_env_step_timeout_s``).
        creator: ``creator(vector_index) -> env``.
        multi_agent: The env is a ``MultiAgentEnv``.

    Returns:
        The backend, its sub-envs created.

    Raises:
        ValueError: For an unknown vectorize mode, or restarts with gymnasium's
            natively vectorized entry point.
        TypeError: For an ``ExternalEnv`` of the other kind (single- vs multi-agent).
        ImportError: For remote sub-envs without ray (naming the extra).
    """
    n = int(cfg(config, "num_envs_per_env_runner", 1))
    timeout = cfg(config, "sub_env_step_timeout_s")
    timeout = None if timeout is None else float(timeout)
    backend = cfg(config, "sub_env_backend", "default")
    from fastrollout.runners.sub_envs.envpool_backend import EnvPoolSpec

    if isinstance(creator, EnvPoolSpec):
        return _envpool(config, creator, n, backend, multi_agent=multi_agent)
    if backend == "shared_memory":
        if cfg(config, "remote_worker_envs", False):
            raise ValueError(
                "sub_env_backend='shared_memory' and remote_worker_envs=True both say where "
                "the sub-envs run: choose one"
            )
        from fastrollout.runners.sub_envs.shared_memory import SharedMemorySubEnvs

        workers = cfg(config, "num_sub_env_workers")
        batch = cfg(config, "sub_env_batch_size")
        return SharedMemorySubEnvs(
            creator,
            n,
            multi_agent=multi_agent,
            num_workers=None if workers is None else int(workers),
            batch_size=None if batch is None else int(batch),
            step_timeout_s=timeout,
        )
    if backend != "default":
        raise ValueError(f"sub_env_backend must be 'default' or 'shared_memory', got {backend!r}")
    if cfg(config, "remote_worker_envs", False):
        from fastrollout.runners.sub_envs.remote import RemoteSubEnvs

        return RemoteSubEnvs(
            creator,
            n,
            multi_agent=multi_agent,
            step_timeout_s=timeout,
        )
    # With restarts, a sub-env that fails to be created (its env check included) is one
    # more failed attempt, as when it is recreated: here the whole set is made again.
    attempts = 1
    if cfg(config, "restart_failed_sub_environments", False):
        attempts += int(cfg(config, "max_sub_environment_restart_attempts", 5))
    for attempt in range(attempts):
        try:
            return _in_process(config, creator, n, timeout, multi_agent=multi_agent)
        except ExternalEnvCreated as made:
            return _external(made.env, multi_agent=multi_agent)
        except Exception:
            if attempt + 1 >= attempts:
                raise
    raise AssertionError("unreachable")  # pragma: no cover


def _in_process(
    config: Any, creator: Any, n: int, timeout: float | None, *, multi_agent: bool
) -> SubEnvs:
    if multi_agent:
        from fastrollout.runners.sub_envs.multi_agent import MultiAgentListSubEnvs

        return MultiAgentListSubEnvs(creator, n)
    from fastrollout.runners.sub_envs.vector import GymVectorSubEnvs

    mode = cfg(config, "gym_env_vectorize_mode", "sync")
    # gymnasium's VectorizeMode enum holds the name in its value.
    mode = str(getattr(mode, "value", mode)).lower()
    return GymVectorSubEnvs(
        creator,
        n,
        mode,
        guard=bool(cfg(config, "restart_failed_sub_environments", False)),
        make_vector=getattr(creator, "make_vector", None),
        step_timeout_s=timeout,
    )


def _envpool(config: Any, spec: Any, n: int, backend: str, *, multi_agent: bool) -> SubEnvs:
    """The EnvPool of an ``"envpool:<task>"`` env id (single-agent runners only)."""
    from fastrollout.runners.sub_envs.envpool_backend import EnvPoolSubEnvs

    name = f"envpool:{spec.task}"
    if multi_agent:
        raise TypeError(f"{name} is a single-agent env: sample it with a SingleAgentEnvRunner")
    for setting, clash in (
        ("sub_env_backend='shared_memory'", backend == "shared_memory"),
        ("remote_worker_envs=True", bool(cfg(config, "remote_worker_envs", False))),
        (
            # EnvPool cannot make one of its envs again.
            "restart_failed_sub_environments=True",
            bool(cfg(config, "restart_failed_sub_environments", False)),
        ),
    ):
        if clash:
            raise ValueError(f"{name} runs on EnvPool, which does not go with {setting}")
    batch = cfg(config, "sub_env_batch_size")
    return EnvPoolSubEnvs(spec, n, None if batch is None else int(batch))


def _external(env: ExternalEnv, *, multi_agent: bool) -> SubEnvs:
    """The backend of an ``ExternalEnv`` the creator made (the runner kind must match)."""
    from fastrollout.runners.sub_envs.external import ExternalSubEnvs

    if env.multi_agent != multi_agent:
        want, runner = (
            ("an ExternalMultiAgentEnv", "MultiAgentEnvRunner")
            if env.multi_agent
            else ("a single-agent ExternalEnv", "SingleAgentEnvRunner")
        )
        raise TypeError(f"{type(env).__name__} is {want}: sample it with a {runner}")
    return ExternalSubEnvs(env)
