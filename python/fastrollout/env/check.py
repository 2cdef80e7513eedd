"""The env check run when a runner creates an env (unless ``disable_env_checking``).

It catches, with one message naming the env, the agent and what was wrong, the mistakes
that otherwise surface deep inside sampling: missing or non-gymnasium spaces, the old
gym API (``reset`` returning only obs, ``step`` returning a 4-tuple), observations
outside their space, non-numeric rewards, non-bool flags, multi-agent dicts keyed by
unknown agents and a missing ``"__all__"``.

The check calls ``reset()`` (without a seed, so it does not make envs created with the
same RNG state identical) and one ``step()`` with sampled actions; a runner resets every
env before its first sample anyway.
"""

from __future__ import annotations

import inspect
import numbers
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np

__all__ = ["EnvCheckError", "check_env", "space_mismatch"]

_ALL = "__all__"
_COMMON = "__common__"


class EnvCheckError(ValueError):
    """An env failed the check at creation; the message names the env, agent and problem."""


def space_mismatch(space: gym.Space[Any], value: Any) -> str | None:
    """Says why ``value`` is not in ``space``, naming the innermost offending part.

    Args:
        space: A gymnasium space (nested Dict/Tuple spaces are searched).
        value: The value to test.

    Returns:
        None when ``space.contains(value)``; otherwise a description such as
        ``"at ['pos']: expected shape (2,) float32 within Box(...), got shape (3,) float64"``.
    """
    return _mismatch(space, value, [])


def _mismatch(space: gym.Space[Any], value: Any, path: list[Any]) -> str | None:
    where = f"at {path}: " if path else ""
    if isinstance(space, gym.spaces.Dict):
        if not isinstance(value, Mapping):
            return f"{where}expected a dict for {space}, got {type(value).__name__}"
        if set(value) != set(space.spaces):
            keys = sorted(space.spaces, key=str)
            return f"{where}expected keys {keys}, got {sorted(value, key=str)}"
        for key, sub in space.spaces.items():
            found = _mismatch(sub, value[key], [*path, key])
            if found:
                return found
        return None
    if isinstance(space, gym.spaces.Tuple):
        if not isinstance(value, tuple | list) or len(value) != len(space.spaces):
            n = len(space.spaces)
            return f"{where}expected a tuple of {n} for {space}, got {_describe(value)}"
        for i, sub in enumerate(space.spaces):
            found = _mismatch(sub, value[i], [*path, i])
            if found:
                return found
        return None
    try:
        inside = space.contains(value)
    except Exception:  # a space may raise on values of an unexpected type
        inside = False
    if inside:
        return None
    expected = f"{space}"
    if space.shape is not None and space.dtype is not None:
        expected = f"shape {space.shape} {space.dtype} within {space}"
    return f"{where}expected {expected}, got {_describe(value)}"


def _describe(value: Any) -> str:
    if isinstance(value, np.ndarray):
        # Small arrays with their values: a value outside the bounds shows there.
        shown = f" {np.array2string(value, threshold=8)}" if value.size <= 8 else ""
        return f"shape {value.shape} {value.dtype}{shown}"
    if isinstance(value, np.generic):
        return f"{type(value).__name__} {value!r}"
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{type(value).__name__} {text}"


def _is_reward(value: Any) -> bool:
    if isinstance(value, bool | np.bool_):
        return False
    if isinstance(value, np.ndarray):
        return value.shape == () and np.issubdtype(value.dtype, np.number)
    return isinstance(value, numbers.Real)


def _is_flag(value: Any) -> bool:
    return isinstance(value, bool | np.bool_)


def check_env(env: Any, *, name: str | None = None) -> None:
    """Checks an env's spaces and its reset/step results; raises on the first problem.

    Works on ``gymnasium.Env`` and on ``MultiAgentEnv`` (fastrollout's or RLlib's). The
    env is reset and stepped once with sampled actions; reset it before use.

    Args:
        env: The env.
        name: How to name the env in messages (default: its class name).

    Raises:
        EnvCheckError: What was wrong, naming the env and, in multi-agent envs, the agent.
            An exception raised by the env's own ``reset``/``step`` is chained as the
            cause.
    """
    from fastrollout.env.registry import is_multi_agent_env

    label = f"env {name or type(getattr(env, 'unwrapped', env)).__name__}"
    _check_reset_signature(env, label)
    if is_multi_agent_env(env):
        _check_multi_agent(env, label)
    else:
        _check_single_agent(env, label)


def _check_reset_signature(env: Any, label: str) -> None:
    try:
        params = inspect.signature(env.reset).parameters
    except (TypeError, ValueError):  # builtins without a signature: nothing to check
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    missing = [k for k in ("seed", "options") if k not in params]
    if missing:
        raise EnvCheckError(
            f"{label}: reset() must accept the keyword arguments seed and options "
            f"(gymnasium API); it lacks {missing}"
        )


def _space(value: Any, what: str, label: str) -> gym.Space[Any]:
    if value is None:
        raise EnvCheckError(f"{label}: {what} is not set")
    if not isinstance(value, gym.spaces.Space):
        raise EnvCheckError(
            f"{label}: {what} must be a gymnasium.spaces.Space, got {type(value).__name__}"
            " (old gym spaces are not supported)"
        )
    return value


def _call(env: Any, method: str, label: str, *args: Any) -> Any:
    try:
        return getattr(env, method)(*args)
    except Exception as e:
        raise EnvCheckError(f"{label}: {method}() raised {type(e).__name__}: {e}") from e


def _check_single_agent(env: gym.Env[Any, Any], label: str) -> None:
    obs_space = _space(getattr(env, "observation_space", None), "observation_space", label)
    act_space = _space(getattr(env, "action_space", None), "action_space", label)

    result = _call(env, "reset", label)
    if not isinstance(result, tuple) or len(result) != 2:
        raise EnvCheckError(
            f"{label}: reset() must return (observation, info) (gymnasium API), got "
            f"{_describe(result)}"
        )
    obs, info = result
    _check_obs(obs_space, obs, f"{label}: reset() returned an observation")
    if not isinstance(info, dict):
        raise EnvCheckError(f"{label}: reset() must return a dict info, got {_describe(info)}")

    result = _call(env, "step", label, act_space.sample())
    if not isinstance(result, tuple) or len(result) != 5:
        raise EnvCheckError(
            f"{label}: step() must return (observation, reward, terminated, truncated, info)"
            f" (gymnasium API), got {_describe(result)}"
        )
    obs, reward, terminated, truncated, info = result
    _check_obs(obs_space, obs, f"{label}: step() returned an observation")
    if not _is_reward(reward):
        raise EnvCheckError(f"{label}: step() returned a non-numeric reward {_describe(reward)}")
    for flag_name, flag in (("terminated", terminated), ("truncated", truncated)):
        if not _is_flag(flag):
            raise EnvCheckError(
                f"{label}: step() returned {flag_name}={_describe(flag)}; it must be a bool"
            )
    if not isinstance(info, dict):
        raise EnvCheckError(f"{label}: step() must return a dict info, got {_describe(info)}")


def _check_obs(space: gym.Space[Any], obs: Any, what: str) -> None:
    problem = space_mismatch(space, obs)
    if problem is not None:
        raise EnvCheckError(f"{what} outside observation_space: {problem}")


def _check_multi_agent(env: Any, label: str) -> None:
    possible = list(getattr(env, "possible_agents", None) or getattr(env, "agents", None) or [])
    known = set(possible)
    obs_spaces: dict[Any, gym.Space[Any]] = {}
    act_spaces: dict[Any, gym.Space[Any]] = {}

    def spaces_of(agent: Any) -> tuple[gym.Space[Any], gym.Space[Any]]:
        if agent not in obs_spaces:
            for kind, store in (("observation", obs_spaces), ("action", act_spaces)):
                try:
                    space = getattr(env, f"get_{kind}_space")(agent)
                except Exception as e:
                    raise EnvCheckError(
                        f"{label}: get_{kind}_space({agent!r}) raised {type(e).__name__}: {e}"
                    ) from e
                store[agent] = _space(space, f"the {kind} space of agent {agent!r}", label)
        return obs_spaces[agent], act_spaces[agent]

    for agent in possible:
        spaces_of(agent)

    def check_keys(d: Any, what: str, extra: tuple[str, ...] = ()) -> None:
        if not isinstance(d, dict):
            raise EnvCheckError(
                f"{label}: {what} must be a dict keyed by agent id, got {_describe(d)}"
            )
        if known:
            unknown = [k for k in d if k not in known and k not in extra]
            if unknown:
                raise EnvCheckError(
                    f"{label}: {what} has keys {unknown} that are not agents of the env "
                    f"(possible_agents: {possible})"
                )

    result = _call(env, "reset", label)
    if not isinstance(result, tuple) or len(result) != 2:
        raise EnvCheckError(
            f"{label}: reset() must return (observations, infos), two dicts keyed by agent "
            f"id; got {_describe(result)}"
        )
    obs, infos = result
    check_keys(obs, "reset()'s observations")
    check_keys(infos, "reset()'s infos", (_COMMON,))
    if not obs:
        raise EnvCheckError(f"{label}: reset() returned no observation, so no agent can act")
    for agent, o in obs.items():
        _check_obs(
            spaces_of(agent)[0], o, f"{label}: reset() returned for agent {agent!r} an observation"
        )

    actions = {agent: spaces_of(agent)[1].sample() for agent in obs}
    result = _call(env, "step", label, actions)
    if not isinstance(result, tuple) or len(result) != 5:
        raise EnvCheckError(
            f"{label}: step() must return (observations, rewards, terminateds, truncateds, "
            f"infos), five dicts keyed by agent id; got {_describe(result)}"
        )
    obs, rewards, terminateds, truncateds, infos = result
    check_keys(obs, "step()'s observations")
    check_keys(rewards, "step()'s rewards")
    check_keys(terminateds, "step()'s terminateds", (_ALL,))
    check_keys(truncateds, "step()'s truncateds", (_ALL,))
    check_keys(infos, "step()'s infos", (_COMMON,))
    for agent, o in obs.items():
        _check_obs(
            spaces_of(agent)[0], o, f"{label}: step() returned for agent {agent!r} an observation"
        )
    for agent, r in rewards.items():
        if not _is_reward(r):
            raise EnvCheckError(
                f"{label}: step() returned for agent {agent!r} a non-numeric reward {_describe(r)}"
            )
    for what, flags in (("terminateds", terminateds), ("truncateds", truncateds)):
        if _ALL not in flags:
            raise EnvCheckError(
                f"{label}: step()'s {what} lacks the key '__all__' (whether the whole "
                "episode is over)"
            )
        for agent, flag in flags.items():
            if not _is_flag(flag):
                raise EnvCheckError(
                    f"{label}: step()'s {what}[{agent!r}] is {_describe(flag)}; it must be a bool"
                )
    for agent, info in infos.items():
        if not isinstance(info, dict):
            raise EnvCheckError(
                f"{label}: step()'s infos[{agent!r}] must be a dict, got {_describe(info)}"
            )
