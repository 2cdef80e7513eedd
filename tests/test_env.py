"""fastrollout.env: EnvContext, MultiAgentEnv, make_multi_agent, the registry, the env check.

Differential tests run RLlib 2.60's counterparts on the same input; deliberate
differences are pinned with what RLlib does.
"""

from __future__ import annotations

import copy
import functools
import pickle
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from ray.rllib.env.env_context import EnvContext as RLlibEnvContext
from ray.rllib.env.multi_agent_env import MultiAgentEnv as RLlibMultiAgentEnv
from ray.rllib.env.multi_agent_env import make_multi_agent as rllib_make_multi_agent

import fastrollout
from fastrollout.env import (
    EnvCheckError,
    EnvContext,
    EnvCreator,
    MultiAgentEnv,
    check_env,
    create_env,
    get_registered_env,
    is_multi_agent_env,
    make_env_creator,
    make_multi_agent,
    register_env,
    registered_envs,
    space_mismatch,
)
from fastrollout.env.examples import TurnBasedEnv

BOX4 = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)


# ----------------------------------------------------------------------------- EnvContext


def test_env_context_is_a_dict_with_fields() -> None:
    ctx = EnvContext({"a": 1}, worker_index=2, vector_index=3, remote=True, num_workers=4)
    assert ctx == {"a": 1}
    assert isinstance(ctx, dict)
    assert (ctx.worker_index, ctx.vector_index, ctx.remote, ctx.num_workers) == (2, 3, True, 4)
    assert ctx.recreated_worker is False
    assert EnvContext().worker_index == 0 and EnvContext() == {}
    assert "worker_index=2" in repr(ctx) and "vector_index=3" in str(ctx)


def test_env_context_fields_match_rllib() -> None:
    ours = EnvContext({"a": 1}, worker_index=1, vector_index=2, remote=False, num_workers=3)
    ref = RLlibEnvContext({"a": 1}, worker_index=1, vector_index=2, remote=False, num_workers=3)
    for field in ("worker_index", "vector_index", "remote", "num_workers", "recreated_worker"):
        assert getattr(ours, field) == getattr(ref, field), field
    o2 = ours.copy_with_overrides(vector_index=5, env_config={"b": 2})
    r2 = ref.copy_with_overrides(vector_index=5, env_config={"b": 2})
    assert dict(o2) == dict(r2) == {"b": 2}
    assert (o2.worker_index, o2.vector_index, o2.num_workers) == (
        r2.worker_index,
        r2.vector_index,
        r2.num_workers,
    )


def test_copy_with_overrides_overrides_each_field_and_leaves_self() -> None:
    ctx = EnvContext({"nested": {"x": 1}}, worker_index=1, vector_index=0, num_workers=2)
    same = ctx.copy_with_overrides()
    assert same == ctx and same is not ctx
    assert (same.worker_index, same.num_workers) == (1, 2)
    new_config = {"nested": {"x": 2}}
    other = ctx.copy_with_overrides(
        env_config=new_config,
        worker_index=7,
        vector_index=8,
        remote=True,
        num_workers=9,
        recreated_worker=True,
    )
    assert other == {"nested": {"x": 2}}
    new_config["nested"]["x"] = 3  # deep-copied
    assert other["nested"]["x"] == 2
    assert (other.worker_index, other.vector_index, other.remote) == (7, 8, True)
    assert (other.num_workers, other.recreated_worker) == (9, True)
    assert ctx == {"nested": {"x": 1}} and ctx.worker_index == 1


def test_set_defaults_adds_only_missing_keys() -> None:
    ctx = EnvContext({"a": 1})
    ctx.set_defaults({"a": -1, "b": 2})
    assert ctx == {"a": 1, "b": 2}


@pytest.mark.parametrize("clone", [pickle.loads, copy.deepcopy, copy.copy])
def test_env_context_survives_pickle_and_copy(clone: Any) -> None:
    ctx = EnvContext({"a": [1]}, worker_index=3, vector_index=4, remote=True, num_workers=5)
    data = pickle.dumps(ctx) if clone is pickle.loads else ctx
    back = clone(data)
    assert isinstance(back, EnvContext) and back == ctx
    assert (back.worker_index, back.vector_index, back.remote, back.num_workers) == (3, 4, True, 5)


# ----------------------------------------------------------------------------- MultiAgentEnv


class _DictSpacesEnv(MultiAgentEnv):
    def __init__(self) -> None:
        self.agents = ["a", "b"]
        super().__init__()
        self.observation_spaces = {"a": BOX4, "b": gym.spaces.Discrete(3)}
        self.action_spaces = {"a": gym.spaces.Discrete(2), "b": gym.spaces.Discrete(5)}


def test_possible_agents_inferred_from_agents_and_lists_not_shared() -> None:
    env = _DictSpacesEnv()
    assert env.possible_agents == ["a", "b"] and env.agents == ["a", "b"]
    env.agents.remove("a")
    assert env.possible_agents == ["a", "b"]
    plain = MultiAgentEnv()
    plain.agents.append("x")
    assert MultiAgentEnv.agents == [] and MultiAgentEnv().agents == []
    assert plain.num_agents == 1 and plain.max_num_agents == 0


def test_spaces_from_per_agent_dicts() -> None:
    env = _DictSpacesEnv()
    assert env.get_observation_space("a") is BOX4
    assert env.get_action_space("b") == gym.spaces.Discrete(5)
    assert isinstance(env.observation_space, gym.spaces.Dict)
    assert env.observation_space["b"] == gym.spaces.Discrete(3)
    assert env.action_space == gym.spaces.Dict(
        {"a": gym.spaces.Discrete(2), "b": gym.spaces.Discrete(5)}
    )
    assert env.num_agents == 2 and env.max_num_agents == 2
    assert env.get_agent_ids() == {"a", "b"}


def test_unknown_agent_space_names_the_agent() -> None:
    with pytest.raises(KeyError, match=r"observation_spaces has no entry for agent 'zz'"):
        _DictSpacesEnv().get_observation_space("zz")
    with pytest.raises(KeyError, match=r"action_spaces has no entry for agent 'zz'"):
        _DictSpacesEnv().get_action_space("zz")
    with pytest.raises(ValueError, match=r"neither observation_spaces nor observation_space"):
        MultiAgentEnv().get_observation_space("a")
    with pytest.raises(ValueError, match=r"neither action_spaces nor action_space"):
        MultiAgentEnv().get_action_space("a")


def _old_style(base: type) -> Any:
    class OldStyle(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.observation_space = gym.spaces.Dict({"a": BOX4})
            self.action_space = gym.spaces.Discrete(3)  # shared by all agents

    return OldStyle()


def test_old_style_whole_spaces_agree_with_rllib() -> None:
    ours, ref = _old_style(MultiAgentEnv), _old_style(RLlibMultiAgentEnv)
    for agent in ("a", "b"):
        assert ours.get_observation_space(agent) == ref.get_observation_space(agent)
        assert ours.get_action_space(agent) == ref.get_action_space(agent)
    assert ours.observation_space == ref.observation_space


def test_base_reset_seeds_and_step_render() -> None:
    env = MultiAgentEnv()
    assert env.reset(seed=3) == ({}, {})
    first = env.np_random.random()
    env.reset(seed=3)
    assert env.np_random.random() == first
    assert env.render() is None
    with pytest.raises(NotImplementedError, match="MultiAgentEnv does not implement step"):
        env.step({})


# ----------------------------------------------------------------------------- make_multi_agent


def _rollout(env: Any, seed: int, steps: int, action_seed: int = 0) -> list[Any]:
    """Resets with ``seed`` and steps live agents with seeded actions; returns everything."""
    rng = np.random.default_rng(action_seed)
    obs, infos = env.reset(seed=seed)
    out: list[Any] = [(obs, infos)]
    done: set[Any] = set()
    for _ in range(steps):
        actions = {a: int(rng.integers(2)) for a in obs if a not in done}
        if not actions:
            break
        result = env.step(actions)
        out.append(result)
        obs, _, terminateds, truncateds, _ = result
        done |= {a for a in obs if terminateds.get(a) or truncateds.get(a)}
        if terminateds["__all__"] or truncateds["__all__"]:
            break
    return out


def _assert_same(a: Any, b: Any) -> None:
    if isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), (a, b)
        for k in a:
            _assert_same(a[k], b[k])
    elif isinstance(a, tuple | list):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _assert_same(x, y)
    elif isinstance(a, np.ndarray):
        np.testing.assert_array_equal(a, b)
        assert a.dtype == b.dtype
    else:
        assert a == b, (a, b)


@pytest.mark.parametrize("seed", [0, 7])
def test_make_multi_agent_one_agent_matches_rllib(seed: int) -> None:
    ours = make_multi_agent("CartPole-v1")({"num_agents": 1})
    ref = rllib_make_multi_agent("CartPole-v1")({"num_agents": 1})
    assert ours.possible_agents == ref.possible_agents == [0]
    assert ours.observation_spaces == ref.observation_spaces
    assert ours.action_spaces == ref.action_spaces
    _assert_same(_rollout(ours, seed, 60), _rollout(ref, seed, 60))


def test_make_multi_agent_agent_zero_matches_rllib_and_copies_are_seeded_apart() -> None:
    ours = make_multi_agent("CartPole-v1")({"num_agents": 3})
    ref = rllib_make_multi_agent("CartPole-v1")({"num_agents": 3})
    o_obs, _ = ours.reset(seed=5)
    r_obs, _ = ref.reset(seed=5)
    np.testing.assert_array_equal(o_obs[0], r_obs[0])
    # RLlib seeds every copy with the same seed: all copies start in the same state.
    np.testing.assert_array_equal(r_obs[0], r_obs[1])
    np.testing.assert_array_equal(r_obs[1], r_obs[2])
    # fastrollout derives a different seed for copies 1..n-1 (reproducibly).
    assert not np.array_equal(o_obs[0], o_obs[1])
    assert not np.array_equal(o_obs[1], o_obs[2])
    again, _ = make_multi_agent("CartPole-v1")({"num_agents": 3}).reset(seed=5)
    _assert_same(again, o_obs)
    # Same actions on agent 0 give the same trajectory as RLlib's agent 0.
    for _ in range(5):
        o = ours.step({0: 1})
        r = ref.step({0: 1})
        _assert_same([x[0] for x in o[:4]], [x[0] for x in r[:4]])


class _Scripted(gym.Env):  # type: ignore[type-arg]
    """Ends after ``length`` steps, terminated or truncated as configured."""

    observation_space = gym.spaces.Box(0.0, 100.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, config: Any) -> None:
        self.config = config
        self.length = config.get("length", 3)
        self.truncate = config.get("truncate", False)
        self.t = 0

    def reset(self, *, seed: Any = None, options: Any = None) -> Any:
        self.t = 0
        return np.zeros(1, np.float32), {}

    def step(self, action: Any) -> Any:
        self.t += 1
        end = self.t >= self.length
        obs = np.array([self.t], np.float32)
        return obs, 1.0, end and not self.truncate, end and self.truncate, {}

    def render(self) -> Any:
        return np.full((2, 3, 3), self.t, np.uint8)


def test_make_multi_agent_creator_gets_config_without_num_agents() -> None:
    seen: list[Any] = []

    def creator(ctx: Any) -> Any:
        seen.append(ctx)
        return _Scripted(ctx)

    cfg = EnvContext({"num_agents": 2, "length": 4}, worker_index=3, vector_index=1)
    env = make_multi_agent(creator)(cfg)
    assert len(seen) == 2
    assert all(dict(c) == {"length": 4} and c.worker_index == 3 for c in seen)
    assert cfg["num_agents"] == 2  # the caller's config is not changed
    assert env.possible_agents == [0, 1]
    assert "MultiEnv" in type(env).__name__


def test_make_multi_agent_all_flags_and_live_agents() -> None:
    # Copy 0 ends (terminated) after 2 steps, copy 1 is truncated after 3 steps.
    configs = iter([{"length": 2}, {"length": 3, "truncate": True}])

    def counting(ctx: Any) -> Any:
        return _Scripted(next(configs))

    env = make_multi_agent(counting)({"num_agents": 2})
    env.reset()
    _, _, te, tr, _ = env.step({0: 0, 1: 0})
    assert (te["__all__"], tr["__all__"]) == (False, False)
    _, _, te, tr, _ = env.step({0: 0, 1: 0})
    assert te == {0: True, 1: False, "__all__": False} and env.agents == [1]
    with pytest.raises(ValueError, match=r"action for agent 0, whose env is done"):
        env.step({0: 0, 1: 0})
    _, _, te, tr, _ = env.step({1: 0})
    # RLlib's rules: terminated __all__ once every copy is done; truncated __all__ only
    # when every copy was truncated.
    assert (te["__all__"], tr["__all__"]) == (True, False)
    assert env.agents == []
    env.reset()
    assert env.agents == [0, 1]


def test_make_multi_agent_truncation_of_all_copies_and_gym_kwargs() -> None:
    # The remaining config reaches gymnasium.make (RLlib drops it).
    env = make_multi_agent("CartPole-v1")({"num_agents": 2, "max_episode_steps": 3})
    env.reset(seed=0)
    for _ in range(3):
        _, _, te, tr, _ = env.step({0: 0, 1: 1})
    assert tr == {0: True, 1: True, "__all__": True}
    assert te["__all__"] is True  # every copy done, as RLlib reports it


def test_make_multi_agent_errors() -> None:
    cls = make_multi_agent("CartPole-v1")
    env = cls({"num_agents": 2})
    env.reset(seed=0)
    with pytest.raises(ValueError, match="at least one agent"):
        env.step({})
    with pytest.raises(ValueError, match=r"unknown agent 5; agents are \[0, 1\]"):
        env.step({5: 0})
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="num_agents must be an int >= 1"):
            cls({"num_agents": bad})


def test_make_multi_agent_render_and_close() -> None:
    env = make_multi_agent(_Scripted)({"num_agents": 2})
    frame = env.render()
    assert frame.shape == (4, 3, 3)  # wide frames stack vertically
    closed: list[int] = []
    for i, sub in enumerate(env.envs):
        sub.close = functools.partial(closed.append, i)  # type: ignore[method-assign]
    env.close()
    assert closed == [0, 1]
    no_frames = make_multi_agent("CartPole-v1")()
    no_frames.reset(seed=0)
    with pytest.warns(UserWarning, match="render_mode"):
        assert no_frames.render() is None  # no render_mode: no frames


# ----------------------------------------------------------------------------- registry


def test_register_env_and_creator_gets_env_context() -> None:
    seen: list[Any] = []

    def creator(ctx: EnvContext) -> Any:
        seen.append(ctx)
        return gym.make("CartPole-v1")

    register_env("test_env_registered", creator)
    assert get_registered_env("test_env_registered") is creator
    assert "test_env_registered" in registered_envs()
    make = make_env_creator("test_env_registered", {"k": 1}, worker_index=2, num_workers=3)
    assert isinstance(make, EnvCreator) and "test_env_registered" in repr(make)
    make(0)
    make(4)
    assert [dict(c) for c in seen] == [{"k": 1}, {"k": 1}]
    assert [c.vector_index for c in seen] == [0, 4]
    assert all(c.worker_index == 2 and c.num_workers == 3 for c in seen)
    assert fastrollout.register_env is register_env
    assert get_registered_env("never_registered") is None
    register_env("test_env_registered", TurnBasedEnv)  # registering again replaces
    assert get_registered_env("test_env_registered") is TurnBasedEnv


def test_registered_name_shadows_gym_id() -> None:
    register_env("Pendulum-v1", lambda ctx: TurnBasedEnv(ctx))
    try:
        assert isinstance(create_env("Pendulum-v1"), TurnBasedEnv)
    finally:
        from fastrollout.env import registry

        del registry._REGISTRY["Pendulum-v1"]
    assert not isinstance(create_env("Pendulum-v1"), TurnBasedEnv)


def test_gym_id_gets_env_config_as_kwargs() -> None:
    env = create_env("CartPole-v1", {"max_episode_steps": 2})
    env.reset(seed=0)
    env.step(0)
    assert env.step(0)[3] is True
    module_form = create_env("gymnasium.envs.classic_control:CartPole-v1")
    assert module_form.spec.id == "CartPole-v1"


def test_classes_callables_and_paths_get_the_context() -> None:
    env = create_env(TurnBasedEnv, {"num_turns": 3}, vector_index=1)
    assert isinstance(env, TurnBasedEnv) and env.num_turns == 3
    env = create_env(lambda ctx: TurnBasedEnv({"num_turns": ctx.vector_index + 1}), vector_index=4)
    assert env.num_turns == 5
    env = create_env("fastrollout.env.examples.TurnBasedEnv", {"num_turns": 2})
    assert isinstance(env, TurnBasedEnv) and env.num_turns == 2
    env = create_env("fastrollout.env.examples:SyntheticImageEnv", {"episode_len": 2})
    assert env.episode_len == 2


def test_rllib_multi_agent_envs_work_as_they_are() -> None:
    class RLlibStyle(RLlibMultiAgentEnv):
        def __init__(self, config: Any = None) -> None:
            super().__init__()
            self.agents = self.possible_agents = ["x", "y"]
            self.observation_spaces = {a: BOX4 for a in self.agents}
            self.action_spaces = {a: gym.spaces.Discrete(2) for a in self.agents}

        def reset(self, *, seed: Any = None, options: Any = None) -> Any:
            return {a: np.zeros(4, np.float32) for a in self.agents}, {}

        def step(self, action_dict: Any) -> Any:
            obs = {a: np.ones(4, np.float32) for a in action_dict}
            rew = {a: 1.0 for a in action_dict}
            return obs, rew, {"__all__": True}, {"__all__": False}, {}

    assert is_multi_agent_env(RLlibStyle) and is_multi_agent_env(RLlibStyle())
    env = create_env(RLlibStyle)
    assert isinstance(env, RLlibStyle)
    rllib_cartpoles = create_env(rllib_make_multi_agent("CartPole-v1"), {"num_agents": 2})
    assert rllib_cartpoles.possible_agents == [0, 1]


def test_is_multi_agent_env() -> None:
    assert is_multi_agent_env(TurnBasedEnv) and is_multi_agent_env(TurnBasedEnv())
    assert not is_multi_agent_env(gym.make("CartPole-v1"))
    assert not is_multi_agent_env(gym.Env)
    assert not is_multi_agent_env(lambda ctx: None)


@pytest.mark.parametrize(
    ("name", "hint"),
    [
        ("NoSuchEnv-v0", "gymnasium: Environment `NoSuchEnv` doesn't exist."),
        ("CartPol-v1", "Did you mean: `CartPole`?"),
        ("CartPole-v9", "It provides versioned environments: [ `v0`, `v1` ]."),
        ("ALE/Pong-v5", "Namespace ALE not found. Have you installed the proper package for ALE?"),
    ],
)
def test_an_unknown_env_keeps_gymnasiums_hint(name: str, hint: str) -> None:
    with pytest.raises(ValueError, match=rf"unknown env {name!r}") as info:
        make_env_creator(name)
    assert hint in str(info.value) and "\n" not in str(info.value)


def test_registry_errors_name_the_culprit() -> None:
    with pytest.raises(ValueError, match=r"unknown env 'NoSuchEnv-v9'"):
        make_env_creator("NoSuchEnv-v9")
    with pytest.raises(ValueError, match="no env given"):
        make_env_creator(None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"not an env instance \(CartPoleEnv\)"):
        make_env_creator(gym.make("CartPole-v1").unwrapped)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="got int"):
        make_env_creator(3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="env_config must be a dict, got list"):
        make_env_creator("CartPole-v1", [1])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"returned int, not a gymnasium.Env"):
        create_env(lambda ctx: 3)
    with pytest.raises(TypeError, match="name must be a non-empty str"):
        register_env("", lambda ctx: None)
    with pytest.raises(TypeError, match=r"register_env\('x', ...\): env_creator must be callable"):
        register_env("x", 3)  # type: ignore[arg-type]


def test_creator_checks_unless_disabled() -> None:
    bad = functools.partial(_BadEnv, "reset_obs_only")
    with pytest.raises(EnvCheckError, match="reset\\(\\) must return \\(observation, info\\)"):
        create_env(lambda ctx: bad())
    env = create_env(lambda ctx: bad(), disable_env_checking=True)
    assert isinstance(env, _BadEnv)
    assert make_env_creator("CartPole-v1", disable_env_checking=True).check is False


def test_creator_is_picklable_and_builds_async_vector_envs() -> None:
    make = make_env_creator("CartPole-v1", {"max_episode_steps": 5}, worker_index=1)
    back = pickle.loads(pickle.dumps(make))
    assert back.env_context(3).vector_index == 3 and back.env_config == {"max_episode_steps": 5}
    vec = gym.vector.AsyncVectorEnv([functools.partial(make, i) for i in range(2)])
    try:
        obs, _ = vec.reset(seed=[1, 2])
        assert obs.shape == (2, 4)
    finally:
        vec.close()


# ----------------------------------------------------------------------------- the env check


class _BadEnv(gym.Env):  # type: ignore[type-arg]
    """A CartPole-like env broken in one way, chosen by name."""

    def __init__(self, fault: str) -> None:
        self.fault = fault
        self.observation_space = BOX4
        self.action_space = gym.spaces.Discrete(2)
        if fault == "no_obs_space":
            self.observation_space = None  # type: ignore[assignment]
        if fault == "old_space":
            self.action_space = object()  # type: ignore[assignment]

    def reset(self, *, seed: Any = None, options: Any = None) -> Any:
        if self.fault == "reset_raises":
            raise RuntimeError("boom")
        obs = np.zeros(4, np.float32)
        if self.fault == "reset_obs_only":
            return obs
        if self.fault == "reset_obs_shape":
            return np.zeros(3, np.float32), {}
        if self.fault == "reset_info":
            return obs, None
        return obs, {}

    def step(self, action: Any) -> Any:
        obs = np.zeros(4, np.float32)
        if self.fault == "step_4_tuple":
            return obs, 1.0, False, {}
        if self.fault == "step_obs_bounds":
            obs = np.full(4, 2.0, np.float32)
        reward: Any = {"reward_str": "1", "reward_bool": True, "reward_array": np.ones(2)}.get(
            self.fault, 1.0
        )
        terminated: Any = 0 if self.fault == "terminated_int" else False
        info: Any = [] if self.fault == "step_info" else {}
        return obs, reward, terminated, False, info


class _OldResetEnv(_BadEnv):
    def reset(self, seed: Any = None) -> Any:  # type: ignore[override]
        return np.zeros(4, np.float32), {}


@pytest.mark.parametrize(
    ("fault", "message"),
    [
        ("no_obs_space", r"env _BadEnv: observation_space is not set"),
        ("old_space", r"action_space must be a gymnasium.spaces.Space, got object"),
        ("reset_raises", r"reset\(\) raised RuntimeError: boom"),
        ("reset_obs_only", r"reset\(\) must return \(observation, info\).*got ndarray|shape"),
        (
            "reset_obs_shape",
            r"reset\(\) returned an observation outside observation_space: "
            r"expected shape \(4,\) float32 within Box.*got shape \(3,\) float32",
        ),
        ("reset_info", r"reset\(\) must return a dict info, got NoneType"),
        (
            "step_4_tuple",
            r"step\(\) must return \(observation, reward, terminated, truncated, info\)",
        ),
        ("step_obs_bounds", r"step\(\) returned an observation outside observation_space"),
        ("reward_str", r"non-numeric reward str '1'"),
        ("reward_bool", r"non-numeric reward bool True"),
        ("reward_array", r"non-numeric reward shape \(2,\) float64"),
        ("terminated_int", r"terminated=int 0; it must be a bool"),
        ("step_info", r"step\(\) must return a dict info, got list"),
    ],
)
def test_check_catches_each_single_agent_fault(fault: str, message: str) -> None:
    with pytest.raises(EnvCheckError, match=message):
        check_env(_BadEnv(fault))


def test_check_error_chains_the_env_exception_and_names_the_env() -> None:
    with pytest.raises(EnvCheckError, match=r"^env my-env: reset\(\) raised") as info:
        check_env(_BadEnv("reset_raises"), name="my-env")
    assert isinstance(info.value.__cause__, RuntimeError)
    assert isinstance(info.value, ValueError)


def test_check_requires_gymnasium_reset_signature() -> None:
    with pytest.raises(EnvCheckError, match=r"reset\(\) must accept .* lacks \['options'\]"):
        check_env(_OldResetEnv("ok"))


def test_check_passes_good_envs() -> None:
    check_env(_BadEnv("ok"))
    check_env(gym.make("CartPole-v1"))
    check_env(gym.make("Pendulum-v1"))
    check_env(make_multi_agent("CartPole-v1")({"num_agents": 2}))
    check_env(TurnBasedEnv())


class _BadMA(MultiAgentEnv):
    def __init__(self, fault: str) -> None:
        super().__init__()
        self.fault = fault
        self.possible_agents = ["a", "b"]
        self.agents = ["a", "b"]
        self.observation_spaces = {"a": BOX4, "b": BOX4}
        self.action_spaces = {"a": gym.spaces.Discrete(2), "b": gym.spaces.Discrete(2)}
        if fault == "space_missing":
            del self.observation_spaces["b"]

    def reset(self, *, seed: Any = None, options: Any = None) -> Any:
        obs: Any = {"a": np.zeros(4, np.float32), "b": np.zeros(4, np.float32)}
        if self.fault == "reset_tuple":
            return obs
        if self.fault == "reset_not_dict":
            return [1, 2], {}
        if self.fault == "reset_unknown":
            obs["c"] = np.zeros(4, np.float32)
        if self.fault == "reset_empty":
            return {}, {}
        if self.fault == "reset_obs_shape":
            obs["b"] = np.zeros((2, 2), np.float32)
        return obs, {}

    def step(self, action_dict: Any) -> Any:
        obs = {a: np.zeros(4, np.float32) for a in action_dict}
        rewards: dict[Any, Any] = {a: 0.5 for a in action_dict}
        terminateds: dict[Any, Any] = {"__all__": False}
        truncateds: dict[Any, Any] = {"__all__": False}
        infos: dict[Any, Any] = {a: {} for a in action_dict}
        if self.fault == "no_all":
            del terminateds["__all__"]
        if self.fault == "no_all_truncated":
            del truncateds["__all__"]
        if self.fault == "reward_none":
            rewards["b"] = None
        if self.fault == "flag_int":
            terminateds["a"] = 1
        if self.fault == "info_str":
            infos["a"] = "x"
        if self.fault == "step_4":
            return obs, rewards, terminateds, infos
        if self.fault == "step_unknown_reward":
            rewards["zz"] = 1.0
        if self.fault == "common_info":
            infos["__common__"] = {"shared": 1}
        return obs, rewards, terminateds, truncateds, infos


@pytest.mark.parametrize(
    ("fault", "message"),
    [
        ("space_missing", r"get_observation_space\('b'\) raised KeyError"),
        ("reset_tuple", r"reset\(\) must return \(observations, infos\)"),
        ("reset_not_dict", r"reset\(\)'s observations must be a dict keyed by agent id"),
        ("reset_unknown", r"reset\(\)'s observations has keys \['c'\] that are not agents"),
        ("reset_empty", r"reset\(\) returned no observation, so no agent can act"),
        (
            "reset_obs_shape",
            r"reset\(\) returned for agent 'b' an observation outside observation_space:"
            r" expected shape \(4,\) float32.*got shape \(2, 2\) float32",
        ),
        ("no_all", r"step\(\)'s terminateds lacks the key '__all__'"),
        ("no_all_truncated", r"step\(\)'s truncateds lacks the key '__all__'"),
        ("reward_none", r"step\(\) returned for agent 'b' a non-numeric reward NoneType"),
        ("flag_int", r"step\(\)'s terminateds\['a'\] is int 1; it must be a bool"),
        ("info_str", r"step\(\)'s infos\['a'\] must be a dict, got str"),
        ("step_4", r"step\(\) must return \(observations, rewards, terminateds, truncateds"),
        ("step_unknown_reward", r"step\(\)'s rewards has keys \['zz'\]"),
    ],
)
def test_check_catches_each_multi_agent_fault(fault: str, message: str) -> None:
    with pytest.raises(EnvCheckError, match=rf"^env _BadMA: {message}"):
        check_env(_BadMA(fault))


def test_check_allows_common_infos() -> None:
    check_env(_BadMA("common_info"))


def test_check_does_not_seed_the_env() -> None:
    # The check resets without a seed, so two envs check-created from the same state do
    # not end up with the same RNG (RLlib's check resets with seed=42).
    a, b = create_env("CartPole-v1"), create_env("CartPole-v1")
    assert not np.array_equal(a.reset()[0], b.reset()[0])


def test_space_mismatch_names_nested_parts() -> None:
    space = gym.spaces.Dict(
        {"pos": BOX4, "rest": gym.spaces.Tuple((gym.spaces.Discrete(3), gym.spaces.Discrete(2)))}
    )
    assert space_mismatch(space, space.sample()) is None
    bad = {"pos": np.zeros(4, np.float32), "rest": (1, 5)}
    assert space_mismatch(space, bad) == (
        "at ['rest', 1]: expected shape () int64 within Discrete(2), got int 5"
    )
    assert "expected keys ['pos', 'rest'], got ['pos']" in str(space_mismatch(space, {"pos": 1}))
    assert "expected a dict" in str(space_mismatch(space, 3))
    assert "expected a tuple of 2" in str(space_mismatch(space.spaces["rest"], (1,)))


@given(
    shape=st.lists(st.integers(1, 4), min_size=0, max_size=3).map(tuple),
    dtype=st.sampled_from([np.float32, np.float64, np.int64, np.uint8]),
)
def test_space_mismatch_property(shape: tuple[int, ...], dtype: Any) -> None:
    space = gym.spaces.Box(0, 10, shape, dtype)
    assert space_mismatch(space, space.sample()) is None
    wrong = np.zeros((*shape, 2), dtype)
    message = space_mismatch(space, wrong)
    assert message is not None
    assert f"expected shape {shape} {np.dtype(dtype)}" in message
    assert f"got shape {wrong.shape} {np.dtype(dtype)}" in message
