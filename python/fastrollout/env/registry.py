"""Turning an env spec (a registered name, a gymnasium id, a class, a creator) into envs.

The runners create every env through :func:`make_env_creator` (or :func:`create_env`),
so that all spec forms behave the same and every env gets an :class:`EnvContext` with
its own ``worker_index`` and ``vector_index``.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import sys
from collections.abc import Callable, Mapping
from typing import Any

import gymnasium as gym

from fastrollout.env.check import check_env
from fastrollout.env.env_context import EnvContext
from fastrollout.env.external_env import ExternalEnv, ExternalEnvCreated
from fastrollout.env.multi_agent_env import MultiAgentEnv

__all__ = [
    "EnvCreator",
    "create_env",
    "get_registered_env",
    "is_multi_agent_env",
    "make_env_creator",
    "register_env",
    "registered_envs",
]

EnvSpec = str | type | Callable[..., Any]

_REGISTRY: dict[str, Callable[[EnvContext], Any]] = {}


def register_env(name: str, env_creator: Callable[[EnvContext], Any]) -> None:
    """Registers an env creator under a name that ``.environment(env=name)`` then accepts.

    A registered name takes precedence over a gymnasium id of the same name, as in RLlib.
    Registering a name again replaces the creator.

    Args:
        name: The name to register.
        env_creator: A callable taking an :class:`EnvContext` (the env config plus
            ``worker_index``, ``vector_index``, ...) and returning a ``gymnasium.Env`` or
            a ``MultiAgentEnv``.

    Raises:
        TypeError: ``name`` is not a non-empty str or ``env_creator`` is not callable.

    >>> register_env("my_cartpole", lambda ctx: gymnasium.make("CartPole-v1"))
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"register_env: name must be a non-empty str, got {name!r}")
    if not callable(env_creator):
        raise TypeError(
            f"register_env({name!r}, ...): env_creator must be callable (taking an "
            f"EnvContext), got {type(env_creator).__name__}"
        )
    _REGISTRY[name] = env_creator


def get_registered_env(name: str) -> Callable[[EnvContext], Any] | None:
    """Returns the creator registered under ``name``, or None.

    Args:
        name: A name given to :func:`register_env`.

    Returns:
        The creator, or None when nothing is registered under that name.
    """
    return _REGISTRY.get(name)


def registered_envs() -> list[str]:
    """Returns the names registered with :func:`register_env`, in registration order.

    Returns:
        The names.
    """
    return list(_REGISTRY)


def is_multi_agent_env(env: Any) -> bool:
    """Whether an env (or env class) is a fastrollout or an RLlib ``MultiAgentEnv``.

    RLlib's class is recognised without importing ray: an RLlib env subclass can only
    exist once ``ray.rllib.env.multi_agent_env`` has been imported, so it is looked up in
    ``sys.modules``.

    Args:
        env: An env instance or class; wrappers are looked through via ``unwrapped``.

    Returns:
        True for a multi-agent env.
    """
    cls = env if isinstance(env, type) else type(getattr(env, "unwrapped", env))
    if issubclass(cls, MultiAgentEnv):
        return True
    rllib_module = sys.modules.get("ray.rllib.env.multi_agent_env")
    rllib_cls = getattr(rllib_module, "MultiAgentEnv", None)
    return isinstance(rllib_cls, type) and issubclass(cls, rllib_cls)


class EnvCreator:
    """Creates the envs of one env runner: ``creator(vector_index)`` returns a new env.

    Made by :func:`make_env_creator`. It is picklable whenever the user's creator is
    (gymnasium's async vector env sends it to sub-processes with cloudpickle).

    Attributes:
        env_spec: The spec it was made from.
        env_config: The env config (a plain dict).
        worker_index: The runner's index, put into every ``EnvContext``.
        num_workers: The number of remote runners, put into every ``EnvContext``.
        check: Whether every env is checked (:func:`fastrollout.env.check_env`) when
            created.
        multi_agent: The kind of env the runner that uses it samples (None: either);
            an env of the other kind is refused, naming the runner that samples it.
    """

    def __init__(
        self,
        env_spec: EnvSpec,
        make: Callable[[EnvContext], Any],
        env_config: Mapping[str, Any],
        *,
        worker_index: int,
        num_workers: int,
        remote: bool,
        check: bool,
        multi_agent: bool | None = None,
    ) -> None:
        self.env_spec = env_spec
        self._make = make
        self.env_config = dict(env_config)
        self.worker_index = worker_index
        self.num_workers = num_workers
        self.remote = remote
        self.check = check
        self.multi_agent = multi_agent
        if (
            multi_agent is not None
            and isinstance(env_spec, type)
            and (issubclass(env_spec, gym.Env) or is_multi_agent_env(env_spec))
        ):
            # An env class tells its kind before any env is made.
            _check_kind(env_spec, multi_agent, env_spec)

    def env_context(self, vector_index: int = 0) -> EnvContext:
        """Returns the ``EnvContext`` that the env at ``vector_index`` is created with.

        Args:
            vector_index: The sub-env's index in the runner.

        Returns:
            A fresh ``EnvContext`` (a copy of the config; creators may change it).
        """
        return EnvContext(
            dict(self.env_config),
            worker_index=self.worker_index,
            vector_index=vector_index,
            remote=self.remote,
            num_workers=self.num_workers,
        )

    def __call__(self, vector_index: int = 0) -> Any:
        """Creates (and, unless disabled, checks) the env for one sub-env slot.

        Args:
            vector_index: The sub-env's index in the runner.

        Returns:
            The new env.

        Raises:
            TypeError: The creator returned something that is not an env, or an env of
                the other kind than ``multi_agent`` says.
            fastrollout.env.EnvCheckError: The env failed the check.
        """
        env = self._make(self.env_context(vector_index))
        if isinstance(env, ExternalEnv):
            # Not a sub-env: the runner serves its episodes instead (make_sub_envs).
            raise ExternalEnvCreated(env)
        if not (isinstance(env, gym.Env) or is_multi_agent_env(env)):
            hint = ""
            if _is_pettingzoo(env):
                hint = (
                    ": wrap it, env=lambda ctx: ParallelPettingZooEnv(...) (or "
                    "PettingZooEnv for an AEC env, from fastrollout.env), and sample it "
                    "with a MultiAgentEnvRunner"
                )
            raise TypeError(
                f"the env creator for {_describe(self.env_spec)} returned "
                f"{type(env).__name__}, not a gymnasium.Env or MultiAgentEnv{hint}"
            )
        if self.multi_agent is not None:
            try:
                _check_kind(env, self.multi_agent, self.env_spec)
            except TypeError:
                env.close()
                raise
        if self.check:
            check_env(env, name=_describe(self.env_spec))
        return env

    def make_vector(self, num_envs: int) -> Any:
        """Creates all sub-envs at once, as one natively vectorized env.

        This is gymnasium's ``vector_entry_point`` mode: a gymnasium id is made with
        ``gymnasium.make_vec(..., vectorization_mode="vector_entry_point")`` (for example
        CartPole's numpy-vectorized env); any other creator is called once with the
        ``EnvContext`` plus ``num_envs`` and must return a ``gymnasium.vector.VectorEnv``.
        The per-sub-env env check does not apply.

        Args:
            num_envs: The number of sub-envs.

        Returns:
            The vector env.

        Raises:
            ValueError: The env has no vector entry point, has another number of sub-envs,
                or resets its sub-envs in another mode than gymnasium's next-step autoreset
                (which the runners record).
            TypeError: The creator returned something that is not a vector env.
        """
        name = _describe(self.env_spec)
        if isinstance(self._make, _GymMake):
            try:
                env = gym.make_vec(
                    self._make.env_id,
                    num_envs=num_envs,
                    vectorization_mode=gym.VectorizeMode.VECTOR_ENTRY_POINT,
                    **self.env_config,
                )
            except gym.error.Error as e:
                raise ValueError(f"env {name} has no vector entry point: {e}") from e
        else:
            ctx = self.env_context(0)
            ctx["num_envs"] = num_envs
            env = self._make(ctx)
        if not isinstance(env, gym.vector.VectorEnv):
            raise TypeError(
                f"with gym_env_vectorize_mode='vector_entry_point' the env creator for {name} "
                f"must return a gymnasium.vector.VectorEnv, got {type(env).__name__}"
            )
        if env.num_envs != num_envs:
            env.close()
            raise ValueError(f"the vector env {name} has {env.num_envs} sub-envs, not {num_envs}")
        autoreset = env.metadata.get("autoreset_mode", gym.vector.AutoresetMode.NEXT_STEP)
        if autoreset != gym.vector.AutoresetMode.NEXT_STEP:
            env.close()
            raise ValueError(
                f"the vector env {name} uses autoreset mode {autoreset}; the runners record "
                "gymnasium's next-step autoreset"
            )
        return env

    def __repr__(self) -> str:
        return (
            f"EnvCreator({_describe(self.env_spec)}, env_config={self.env_config!r}, "
            f"worker_index={self.worker_index}, check={self.check})"
        )


def _check_kind(env: Any, multi_agent: bool, env_spec: Any) -> None:
    """Raises when ``env`` (an env or env class) is not of the kind the runner samples."""
    if is_multi_agent_env(env) == multi_agent:
        return
    name = _describe(env_spec)
    if multi_agent:
        raise TypeError(
            f"env {name} is a single-agent gymnasium env; MultiAgentEnvRunner samples "
            "MultiAgentEnv envs: sample it with a SingleAgentEnvRunner, or make it a "
            "multi-agent env with fastrollout.env.make_multi_agent"
        )
    raise TypeError(
        f"env {name} is a multi-agent env (MultiAgentEnv); SingleAgentEnvRunner samples "
        "single-agent gymnasium envs: sample it with fastrollout.MultiAgentEnvRunner("
        "config=config), and map its agents to modules with config.multi_agent(policies="
        "..., policy_mapping_fn=...) (one shared module by default)"
    )


def _is_pettingzoo(env: Any) -> bool:
    """Whether ``env`` is a PettingZoo env (AEC or parallel), known by its class's module."""
    return any(c.__module__.split(".")[0] == "pettingzoo" for c in type(env).__mro__)


def _takes_config(creator: Any) -> bool:
    """Whether ``creator`` can be called with one positional argument (the EnvContext).

    Returns True where the signature cannot be read (some builtins): the call decides.
    """
    try:
        signature = inspect.signature(creator)
    except (TypeError, ValueError):
        return True
    try:
        signature.bind(None)
    except TypeError:
        return False
    return True


def _config_argument_error(creator: Any) -> TypeError:
    """The error for an env class or creator that takes no EnvContext."""
    name = _describe(creator)
    if isinstance(creator, type):
        return TypeError(
            f"env class {name} cannot be made: its __init__ takes no config argument, and "
            "env classes are called with the env config (an EnvContext dict), as in RLlib; "
            f"give __init__ one (def __init__(self, config=None)), or pass a creator, "
            f"environment(env=lambda ctx: {name}()), or register one, "
            f"register_env('name', lambda ctx: {name}()) and environment(env='name')"
        )
    return TypeError(
        f"env creator {name} takes no argument; env creators are called with the env "
        "config (an EnvContext dict), as in RLlib: define it as lambda ctx: ... or "
        "def make(config): ..."
    )


def _describe(env_spec: Any) -> str:
    if isinstance(env_spec, str):
        return repr(env_spec)
    return getattr(env_spec, "__qualname__", None) or repr(env_spec)


class _GymMake:
    """``gymnasium.make(env_id, **ctx)`` as a picklable callable."""

    def __init__(self, env_id: str) -> None:
        self.env_id = env_id

    def __call__(self, ctx: EnvContext) -> Any:
        return gym.make(self.env_id, **ctx)


def _import_dotted(path: str) -> Any:
    """Imports ``pkg.mod.Name`` or ``pkg.mod:Name``; None when it names nothing importable."""
    module_name, sep, attr = path.replace(":", ".").rpartition(".")
    if not sep or not module_name:
        return None
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        return None
    return getattr(module, attr, None)


def _tune_registered(name: str) -> Callable[[EnvContext], Any] | None:
    """The creator registered under ``name`` with ``ray.tune.register_env``, or None.

    RLlib users register their envs there; it is looked up only when ray is already
    imported (a process without ray has nothing registered there).
    """
    if "ray" not in sys.modules:
        return None
    try:
        from ray.tune.registry import ENV_CREATOR, _global_registry
    except ImportError:  # a ray without its tune part
        return None
    try:
        if _global_registry.contains(ENV_CREATOR, name):
            return _global_registry.get(ENV_CREATOR, name)  # type: ignore[no-any-return]
    except Exception:  # a registry that cannot be read holds nothing usable
        return None
    return None


def _gym_unknown_reason(env_id: str) -> str:
    """The words gymnasium has for an id it does not know, with its hints.

    The hints: a close name ("Did you mean: `CartPole`?"), the versions that
    exist, a namespace whose package is missing (``ALE``).
    """
    try:
        gym.spec(env_id)
    except gym.error.Error as err:
        return f"gymnasium: {err}"
    return "not a gymnasium id"


def _resolve(env_spec: EnvSpec) -> Callable[[EnvContext], Any]:
    """Returns the callable ``ctx -> env`` for a spec, or raises naming the spec."""
    if isinstance(env_spec, str):
        registered = _REGISTRY.get(env_spec) or _tune_registered(env_spec)
        if registered is not None:
            return registered
        if env_spec in gym.registry:
            return _GymMake(env_spec)
        # gymnasium ids of the form "module:Env-v0" register their env when the module
        # is imported.
        module_name, sep, env_id = env_spec.partition(":")
        if sep:
            with contextlib.suppress(ImportError):
                importlib.import_module(module_name)
            if env_id in gym.registry:
                return _GymMake(env_spec)
        target = _import_dotted(env_spec)
        if callable(target):
            if not _takes_config(target):
                raise _config_argument_error(target)
            return target  # type: ignore[no-any-return]
        raise ValueError(
            f"unknown env {env_spec!r} (not a name given to fastrollout.register_env, "
            f"registered: {registered_envs()}, nor an importable 'module.Class' path); "
            f"{_gym_unknown_reason(env_spec)}"
        )
    if not isinstance(env_spec, type) and (
        isinstance(env_spec, gym.Env) or is_multi_agent_env(env_spec)
    ):
        raise TypeError(
            f"env must be a name, a class or a creator, not an env instance "
            f"({type(env_spec).__name__}); pass its class or a lambda ctx: ... instead"
        )
    if callable(env_spec):
        if not _takes_config(env_spec):
            raise _config_argument_error(env_spec)
        return env_spec
    raise TypeError(
        f"env must be a registered name, a gymnasium id, an env class or a callable "
        f"taking an EnvContext; got {type(env_spec).__name__}"
    )


def make_env_creator(
    env_spec: EnvSpec,
    env_config: Mapping[str, Any] | None = None,
    *,
    worker_index: int = 0,
    num_workers: int = 0,
    remote: bool = False,
    disable_env_checking: bool = False,
    multi_agent: bool | None = None,
) -> EnvCreator:
    """Returns a callable that creates the envs of one runner from an env spec.

    The spec is resolved at once (so errors in it surface here, not in a sub-process):

    - a name given to :func:`register_env`: its creator is called with the
      ``EnvContext``;
    - a gymnasium id (also ``"module:Env-v0"``): ``gymnasium.make(id, **env_config)``;
    - a ``gymnasium.Env`` or ``MultiAgentEnv`` class (fastrollout's or RLlib's), or any
      callable: called with the ``EnvContext``, as RLlib does;
    - a ``"package.module.Class"`` path: imported, then called with the ``EnvContext``.

    Args:
        env_spec: The env, as given to ``RunnerConfig.environment(env=...)``.
        env_config: The env config dict; the creator sees it as an ``EnvContext``.
        worker_index: The runner's index (0 for the local runner).
        num_workers: The number of remote runners.
        remote: Whether sub-envs run as Ray actors (only recorded in the context).
        disable_env_checking: Skip :func:`fastrollout.env.check_env` on created envs.
        multi_agent: The kind of env the runner samples (None: either); an env class of
            the other kind is refused here, any other env when it is made.

    Returns:
        An :class:`EnvCreator`; ``creator(vector_index)`` returns a new env.

    Raises:
        ValueError: An unknown name or id.
        TypeError: A spec of the wrong type (e.g. an env instance, a class or creator
            that takes no config argument, an env class of the other kind) or a non-dict
            config.
    """
    if env_spec is None:
        raise ValueError(
            "no env given: call RunnerConfig.environment(env=...) with a gymnasium id, a "
            "registered name, an env class or a creator"
        )
    if env_config is not None and not isinstance(env_config, Mapping):
        raise TypeError(f"env_config must be a dict, got {type(env_config).__name__}")
    return EnvCreator(
        env_spec,
        _resolve(env_spec),
        env_config or {},
        worker_index=worker_index,
        num_workers=num_workers,
        remote=remote,
        check=not disable_env_checking,
        multi_agent=multi_agent,
    )


def create_env(
    env_spec: EnvSpec,
    env_config: Mapping[str, Any] | None = None,
    *,
    worker_index: int = 0,
    vector_index: int = 0,
    num_workers: int = 0,
    disable_env_checking: bool = False,
) -> Any:
    """Creates one env from a spec (see :func:`make_env_creator` for the spec forms).

    Args:
        env_spec: The env spec.
        env_config: The env config dict.
        worker_index: The runner's index.
        vector_index: The sub-env's index in the runner.
        num_workers: The number of remote runners.
        disable_env_checking: Skip the env check.

    Returns:
        The new (checked) env.

    Raises:
        ValueError: An unknown name or id.
        TypeError: A spec of the wrong type, or a creator that returned no env.
        fastrollout.env.EnvCheckError: The env failed the check.
    """
    creator = make_env_creator(
        env_spec,
        env_config,
        worker_index=worker_index,
        num_workers=num_workers,
        disable_env_checking=disable_env_checking,
    )
    return creator(vector_index)
