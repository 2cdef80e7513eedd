"""Errors a user makes: sampling a stopped runner, envs that return data that does not fit
(observations of the wrong shape, agents they did not declare), pickling runners, configs,
states and modules, and what the runners' ``sample`` is typed to return."""

from __future__ import annotations

import pickle
import typing
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

import fastrollout as fr
from _runner_envs import (
    SeededLengthEnv,
    SeededLengthVectorEnv,
    WrongShapeSubEnv,
    crash_sub_env_1_on_step_3,
)
from fastrollout.connectors import MeanStdFilter
from fastrollout.core import DEFAULT_MODULE_ID, Columns
from fastrollout.env import MultiAgentEnv
from fastrollout.env.examples import EnvCrash
from fastrollout.errors import MultiAgentEnvError, RunnerStoppedError, SpaceMismatchError
from fastrollout.modules import DefaultMLPModule, RLModuleSpec
from fastrollout.runners.env_runner import EnvRunner


def config(env: Any = SeededLengthEnv, n: int = 2, env_config: dict | None = None, **runners):
    return (
        fr.RunnerConfig()
        .environment(env, env_config=env_config or {})
        .env_runners(num_envs_per_env_runner=n, **runners)
        .debugging(seed=5)
        .resources(device="cpu")
        .rl_module(model_config={"fcnet_hiddens": [8]})
    )


class Agents(MultiAgentEnv):
    """Agents "a" and "b" declared; episodes of 4 steps.

    ``env_config``: the sub-env ``bad_index`` returns an observation for the undeclared
    agent "c" at its step ``extra_at_step`` or its reset ``extra_at_reset``, and a (3,)
    observation for "b" (its space is (2,)) at its step ``wrong_shape_at_step``; steps
    and resets are counted over the sub-env's episodes from the runner's first (1).
    """

    def __init__(self, config: Any = None) -> None:
        super().__init__()
        self.possible_agents = self.agents = ["a", "b"]
        space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.observation_spaces = {"a": space, "b": space}
        self.action_spaces = {"a": gym.spaces.Discrete(2), "b": gym.spaces.Discrete(2)}
        config = config or {}
        bad = getattr(config, "vector_index", 0) == config.get("bad_index", 0)
        self._extra_step = config.get("extra_at_step") if bad else None
        self._extra_reset = config.get("extra_at_reset") if bad else None
        self._wrong_step = config.get("wrong_shape_at_step") if bad else None
        self._t = 0
        # The env check at creation takes one reset and one step; count from after them.
        self._steps = -1
        self._resets = -1

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> Any:
        self._t = 0
        self._resets += 1
        ids = ["a", "b", "c"] if self._resets == self._extra_reset else ["a", "b"]
        return {a: np.zeros(2, np.float32) for a in ids}, {}

    def step(self, action_dict: dict) -> Any:
        self._t += 1
        self._steps += 1
        ids = ["a", "b", "c"] if self._steps == self._extra_step else ["a", "b"]
        obs = {a: np.zeros(2, np.float32) for a in ids}
        if self._steps == self._wrong_step:
            obs["b"] = np.zeros(3, np.float32)
        done = self._t >= 4
        return obs, dict.fromkeys(ids, 1.0), {"__all__": done}, {"__all__": False}, {}


# -- sample() after stop() --------------------------------------------------------------

RUNNERS = {
    "single-agent sync": lambda: fr.SingleAgentEnvRunner(config=config()),
    "single-agent async": lambda: fr.SingleAgentEnvRunner(
        config=config(gym_env_vectorize_mode="async")
    ),
    "single-agent vector_entry_point": lambda: fr.SingleAgentEnvRunner(
        config=config(SeededLengthVectorEnv, gym_env_vectorize_mode="vector_entry_point")
    ),
    "multi-agent": lambda: fr.MultiAgentEnvRunner(config=config(Agents)),
}


@pytest.mark.parametrize("kind", list(RUNNERS))
def test_sample_after_stop_raises_one_error_and_make_env_starts_again(kind):
    runner = RUNNERS[kind]()
    try:
        assert runner.sample(num_timesteps=4, random_actions=True)
        runner.stop()
        runner.stop()  # harmless
        with pytest.raises(RunnerStoppedError, match=rf"^{type(runner).__name__} cannot "):
            runner.sample(num_timesteps=4)
        with pytest.raises(RuntimeError, match=r"stop\(\) closed its env.*call make_env\(\)"):
            runner.sample(num_episodes=1)
        with pytest.raises(AssertionError, match="stop"):
            runner.assert_healthy()
        # What does not touch the envs still works.
        assert runner.get_state()["num_env_steps_sampled_lifetime"] >= 4
        runner.get_metrics()
        runner.make_env()
        runner.assert_healthy()
        episodes = runner.sample(num_timesteps=4)
        assert sum(len(e) for e in episodes) >= 4
        assert all(started(e) == 0 for e in episodes)
    finally:
        runner.stop()


def started(episode: Any) -> int:
    """Where a returned chunk starts (0: in a fresh episode)."""
    if isinstance(episode, fr.MultiAgentEpisode):
        return episode.env_t_started
    return episode.t_started


# -- observations of the wrong shape ----------------------------------------------------


def test_sync_vector_env_names_the_sub_env_and_the_shape_it_returned():
    runner = fr.SingleAgentEnvRunner(
        config=config(WrongShapeSubEnv, n=3, env_config={"bad_index": 1})
    )
    with pytest.raises(SpaceMismatchError) as info:
        runner.sample(num_timesteps=30)
    message = str(info.value)
    assert message.startswith("sub-env 1 returned an observation that does not fit")
    assert "expected shape (4,) float32 within Box(-1.0, 1.0, (4,), float32)" in message
    assert "got shape (5,) float32" in message
    # The envs stepped past the episodes: the next call starts from fresh resets (two
    # vector steps, before sub-env 1 goes wrong again).
    episodes = runner.sample(num_timesteps=6)
    assert [e.t_started for e in episodes] == [0, 0, 0]
    assert [len(e) for e in episodes] == [2, 2, 2]


# gymnasium logs a worker's error (its traceback too) as warnings starting "ERROR",
# before it raises it.
@pytest.mark.filterwarnings("ignore:.*ERROR:UserWarning")
def test_async_vector_env_names_the_sub_env_and_the_shape_it_returned():
    runner = fr.SingleAgentEnvRunner(
        config=config(
            WrongShapeSubEnv, n=3, env_config={"bad_index": 2}, gym_env_vectorize_mode="async"
        )
    )
    try:
        with pytest.raises(SpaceMismatchError) as info:
            runner.sample(num_timesteps=30)
        message = str(info.value)
        assert message.startswith("sub-env 2 returned an observation that does not fit")
        assert "Box(-1.0, 1.0, (4,), float32)" in message
        assert "from shape (5,) into shape (4,)" in message
        # gymnasium shut the sub-env's worker down; the runner says so until make_env().
        with pytest.raises(RunnerStoppedError, match=r"lost the worker process of sub-env 2"):
            runner.sample(num_timesteps=6)
        runner.make_env()
        assert [len(e) for e in runner.sample(num_timesteps=6)] == [2, 2, 2]
    finally:
        runner.stop()


class WideFromStep3(SeededLengthVectorEnv):
    """A native vector env whose batch gains a column (in every sub-env's row) from the
    3rd step after a reset on."""

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> Any:
        self._steps = 0
        return super().reset(seed=seed, options=options)

    def step(self, actions: Any) -> Any:
        obs, *rest = super().step(actions)
        self._steps += 1
        if self._steps >= 3:
            obs = np.concatenate([obs, np.zeros((len(obs), 1), np.float32)], axis=1)
        return (obs, *rest)


@pytest.mark.filterwarnings("ignore:.*ERROR:UserWarning")
def test_async_sub_env_that_crashes_leaves_a_runner_that_says_so_until_make_env():
    runner = fr.SingleAgentEnvRunner(
        config=config(crash_sub_env_1_on_step_3, n=3, gym_env_vectorize_mode="async")
    )
    try:
        with pytest.raises(EnvCrash):
            runner.sample(num_timesteps=30)
        # Without the guard, the reset of the next call fails inside gymnasium (its pipe
        # to the lost worker is None).
        with pytest.raises(
            RunnerStoppedError,
            match=r"lost the worker process of sub-env 1 to an error in its step \(EnvCrash\)",
        ):
            runner.sample(num_timesteps=3)
        runner.make_env()
        assert [len(e) for e in runner.sample(num_timesteps=3)] == [1, 1, 1]
    finally:
        runner.stop()


def test_native_vector_env_batch_of_the_wrong_shape_names_both_shapes():
    runner = fr.SingleAgentEnvRunner(
        config=config(WideFromStep3, n=3, gym_env_vectorize_mode="vector_entry_point")
    )
    # The batch's rows share one shape, so no sub-env is singled out.
    with pytest.raises(SpaceMismatchError) as info:
        runner.sample(num_timesteps=30)
    assert str(info.value) == (
        "observations: expected a batch of items of shape (2,) and dtype float32, got an "
        "array of shape (3, 3) and dtype float32"
    )


def test_multi_agent_wrong_shape_names_sub_env_agent_and_shapes():
    runner = fr.MultiAgentEnvRunner(
        config=config(Agents, n=3, env_config={"bad_index": 1, "wrong_shape_at_step": 5})
    )
    with pytest.raises(SpaceMismatchError) as info:
        runner.sample(num_timesteps=60)
    assert str(info.value) == (
        "sub-env 1: agent 'b': observation: expected shape (2,) and dtype float32, got an "
        "array of shape (3,) and dtype float32"
    )


# -- agents outside possible_agents -------------------------------------------------------


def test_undeclared_agent_raises_naming_it_and_keeps_what_was_recorded():
    runner = fr.MultiAgentEnvRunner(
        config=config(Agents, n=2, env_config={"bad_index": 1, "extra_at_step": 6})
    )
    with pytest.raises(MultiAgentEnvError) as info:
        runner.sample(num_timesteps=60)
    assert str(info.value) == (
        "sub-env 1: the env returned an observation for agent 'c', which is not one of its "
        "possible_agents ['a', 'b']: list every agent the env may return data for in "
        "possible_agents"
    )
    # Nothing of the failed step was stored: sub-env 1's episode (its second, one step
    # in) holds its steps before it, without "c"; sub-env 0's recorded the step.
    bad, good = runner._episodes[1], runner._episodes[0]
    assert bad.env_t == 1 and sorted(bad.agent_episodes) == ["a", "b"]
    assert good.env_t == 2
    for e in (bad, good):
        e.validate()
        assert all(len(ae) == e.env_t for ae in e.agent_episodes.values())


def test_undeclared_agent_at_a_reset_and_in_a_cut_successor():
    runner = fr.MultiAgentEnvRunner(
        config=config(Agents, n=2, env_config={"bad_index": 0, "extra_at_reset": 2})
    )
    # The first episodes are fine; the chunks are cut, then the second reset brings "c".
    chunks = runner.sample(num_timesteps=4)
    assert {e.env_t for e in chunks} == {2}
    with pytest.raises(MultiAgentEnvError, match=r"^sub-env 0: .*agent 'c'"):
        runner.sample(num_timesteps=60)
    # A successor checks as its episode did.
    runner = fr.MultiAgentEnvRunner(config=config(Agents, n=1, env_config={"extra_at_step": 2}))
    assert [e.env_t for e in runner.sample(num_timesteps=1)] == [1]
    with pytest.raises(MultiAgentEnvError, match="agent 'c'"):
        runner.sample(num_timesteps=2)


def test_episodes_outside_runners_take_any_agent_as_rllib():
    episode = fr.MultiAgentEpisode(
        observation_space={"a": gym.spaces.Box(-1.0, 1.0, (2,), np.float32)}
    )
    episode.add_env_reset(observations={"a": np.zeros(2, np.float32), "z": 1})
    episode.add_env_step({"a": np.zeros(2, np.float32), "z": 2}, {"a": 0, "z": 1}, {"a": 1, "z": 1})
    assert sorted(episode.agent_episodes) == ["a", "z"]


# -- pickling ---------------------------------------------------------------------------


def mean_std_filter(env: Any, spaces: Any, device: Any) -> Any:
    return MeanStdFilter()


def policy_of(agent_id: Any, episode: Any, **kwargs: Any) -> str:
    return f"p_{agent_id}"


def mean_std(runner: Any) -> MeanStdFilter:
    return next(c for c in runner._env_to_module.connectors if isinstance(c, MeanStdFilter))


def assert_same_weights(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], dict):
            assert_same_weights(a[k], b[k])
        else:
            np.testing.assert_array_equal(a[k], b[k])


@pytest.mark.parametrize("multi_agent", [False, True])
def test_runner_pickles_as_config_and_state_with_fresh_envs(multi_agent):
    if multi_agent:
        c = config(Agents).multi_agent(policies={"p_a", "p_b"}, policy_mapping_fn=policy_of)
        cls: type[EnvRunner] = fr.MultiAgentEnvRunner
    else:
        c = config()
        cls = fr.SingleAgentEnvRunner
    runner = cls(config=c.env_runners(env_to_module_connector=mean_std_filter))
    runner.sample(num_timesteps=20)
    runner.set_weights(runner.get_weights(), weights_seq_no=3)
    for module in runner.module.values() if multi_agent else [runner.module]:
        for p in module.parameters():
            torch.nn.init.normal_(p.data)  # weights other than a fresh build's
    state = runner.get_state()

    back = pickle.loads(pickle.dumps(runner))

    assert type(back) is cls
    assert back.config.num_envs_per_env_runner == 2 and back.config.env is c.env
    got = back.get_state()
    assert got["weights_seq_no"] == 3
    assert got["num_env_steps_sampled_lifetime"] == state["num_env_steps_sampled_lifetime"]
    assert_same_weights(got["rl_module"], state["rl_module"])
    # The filter's statistics (set_state folds the unsynced delta into the base).
    for mid in runner.module.keys() if multi_agent else [DEFAULT_MODULE_ID]:
        want, have = (mean_std(r).running_stats(mid) for r in (runner, back))
        assert have.count == want.count > 0
        np.testing.assert_array_equal(have.mean, want.mean)
        np.testing.assert_array_equal(have.var, want.var)
    # Fresh envs, reset at the first sample; a new logger.
    assert back.env is not runner.env
    assert all(started(e) == 0 for e in back.sample())
    assert back.get_metrics()["num_env_steps_sampled"] > 0
    runner.stop()
    back.stop()


def test_config_and_states_pickle():
    c = config(Agents).multi_agent(policies={"p_a", "p_b"}, policy_mapping_fn=policy_of)
    c.freeze()
    back = pickle.loads(pickle.dumps(c))
    assert back.is_frozen and back.policies == c.policies
    assert back.policy_mapping_fn is policy_of
    runner = fr.MultiAgentEnvRunner(config=c)
    state = runner.get_state()
    assert_same_weights(pickle.loads(pickle.dumps(state))["rl_module"], state["rl_module"])


@pytest.mark.parametrize(
    "space",
    [
        gym.spaces.Box(-1.0, 1.0, (2, 3), np.float32),
        gym.spaces.Discrete(4, start=1),
        gym.spaces.MultiDiscrete([2, 3]),
        gym.spaces.MultiBinary(3),
        gym.spaces.Dict({"d": gym.spaces.Discrete(3), "b": gym.spaces.Box(0.0, 1.0, (2,))}),
    ],
    ids=lambda s: type(s).__name__,
)
def test_default_module_pickles_and_computes_the_same(space):
    module = RLModuleSpec(
        module_class=DefaultMLPModule,
        observation_space=space,
        action_space=gym.spaces.Discrete(2),
        model_config={"fcnet_hiddens": [8]},
    ).build()
    back = pickle.loads(pickle.dumps(module))
    samples = [space.sample() for _ in range(5)]
    if isinstance(space, gym.spaces.Dict):
        obs: Any = {k: torch.as_tensor(np.stack([s[k] for s in samples])) for k in space.spaces}
    else:
        obs = torch.as_tensor(np.stack(samples))
    with torch.no_grad():
        want = module.forward_inference({Columns.OBS: obs})[Columns.ACTION_DIST_INPUTS]
        got = back.forward_inference({Columns.OBS: obs})[Columns.ACTION_DIST_INPUTS]
    torch.testing.assert_close(got, want)


# -- what sample() returns, for type checkers ---------------------------------------------


_TYPED_USE = """
from typing import assert_type

import fastrollout as fr


def use(a: fr.SingleAgentEnvRunner, b: fr.MultiAgentEnvRunner) -> None:
    assert_type(a.sample(), list[fr.SingleAgentEpisode])
    assert_type(b.sample(num_episodes=1), list[fr.MultiAgentEpisode])
"""

# Third-party packages are not analysed (they would take a minute cold): their types are
# Any here, and the check is about fastrollout's own annotations.
_MYPY_INI = """
[mypy]
follow_imports = silent
ignore_missing_imports = True
[mypy-torch.*,numpy.*,gymnasium.*,ray.*,tqdm.*,scipy.*,pettingzoo.*]
follow_imports = skip
"""


def test_mypy_sees_what_each_runner_samples(tmp_path):
    api = pytest.importorskip("mypy.api")
    (tmp_path / "use.py").write_text(_TYPED_USE)
    (tmp_path / "mypy.ini").write_text(_MYPY_INI)
    out, err, status = api.run(
        [
            "--config-file",
            str(tmp_path / "mypy.ini"),
            "--cache-dir",
            str(tmp_path / "cache"),
            str(tmp_path / "use.py"),
        ]
    )
    assert status == 0, out + err


def test_sample_is_typed_by_runner():
    hints = typing.get_type_hints(EnvRunner.sample)
    (episode_type,) = typing.get_args(hints["return"])
    assert isinstance(episode_type, typing.TypeVar)
    for cls, episode_cls in (
        (fr.SingleAgentEnvRunner, fr.SingleAgentEpisode),
        (fr.MultiAgentEnvRunner, fr.MultiAgentEpisode),
    ):
        (base,) = cls.__orig_bases__  # type: ignore[attr-defined]
        assert typing.get_origin(base) is EnvRunner
        assert typing.get_args(base) == (episode_cls,)


# -- setup mistakes: the error says what to do ------------------------------------------


class _NoConfigEnv(gym.Env):  # type: ignore[type-arg]
    """An env class whose __init__ takes no config (the env config cannot reach it)."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed: Any = None, options: Any = None) -> Any:
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action: Any) -> Any:
        return np.zeros(2, np.float32), 1.0, True, False, {}


class _NoConfigInitEnv(_NoConfigEnv):
    def __init__(self) -> None:
        self.made = True


@pytest.mark.parametrize("env_cls", [_NoConfigEnv, _NoConfigInitEnv])
def test_an_env_class_without_a_config_argument_is_refused_with_the_fixes(env_cls: type) -> None:
    # RLlib 2.60 calls an env class with the EnvContext too, and fails inside gymnasium
    # with a bare "takes no arguments": here the error names the class and the fixes.
    name = env_cls.__qualname__
    with pytest.raises(TypeError, match=f"env class {name} cannot be made") as error:
        fr.SingleAgentEnvRunner(config=config(env_cls))
    message = str(error.value)
    assert "def __init__(self, config=None)" in message
    assert f"environment(env=lambda ctx: {name}())" in message
    assert f"register_env('name', lambda ctx: {name}())" in message
    # The fix it names works.
    runner = fr.SingleAgentEnvRunner(config=config(lambda ctx: env_cls()))
    assert sum(len(e) for e in runner.sample(num_timesteps=4)) >= 4
    runner.stop()


def test_an_env_creator_without_an_argument_is_refused_with_the_fix() -> None:
    with pytest.raises(TypeError, match=r"env creator \S*<lambda> takes no argument.*lambda ctx"):
        fr.SingleAgentEnvRunner(config=config(lambda: _NoConfigEnv()))


class _TwoAgentParallel:
    """A minimal PettingZoo parallel env (two agents, one step)."""

    metadata = {"name": "two_v0"}  # noqa: RUF012

    def __init__(self) -> None:
        self.possible_agents = ["a", "b"]
        self.render_mode = None

    def observation_space(self, agent: str) -> gym.Space[Any]:
        return gym.spaces.Box(-1.0, 1.0, (2,), np.float32)

    def action_space(self, agent: str) -> gym.Space[Any]:
        return gym.spaces.Discrete(2)

    def reset(self, seed: Any = None, options: Any = None) -> Any:
        self.agents = list(self.possible_agents)
        return {a: np.zeros(2, np.float32) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions: dict[str, Any]) -> Any:
        obs = {a: np.zeros(2, np.float32) for a in actions}
        done = dict.fromkeys(actions, True)
        return obs, dict.fromkeys(actions, 1.0), done, dict.fromkeys(actions, False), {}


def _pettingzoo_parallel() -> Any:
    pettingzoo = pytest.importorskip("pettingzoo")
    return type("TwoAgentParallel", (_TwoAgentParallel, pettingzoo.ParallelEnv), {})


def test_a_multi_agent_env_in_a_single_agent_runner_names_multi_agent_env_runner() -> None:
    from fastrollout.env import ParallelPettingZooEnv, make_multi_agent

    parallel = _pettingzoo_parallel()
    for env in (
        make_multi_agent("CartPole-v1"),  # a MultiAgentEnv class
        lambda ctx: ParallelPettingZooEnv(parallel()),  # a creator of one
    ):
        with pytest.raises(TypeError, match="is a multi-agent env") as error:
            fr.SingleAgentEnvRunner(config=config(env, env_config={"num_agents": 2}))
        assert "fastrollout.MultiAgentEnvRunner(config=config)" in str(error.value)
        assert "config.multi_agent(policies=" in str(error.value)
        # What it says to do samples.
        runner = fr.MultiAgentEnvRunner(config=config(env, env_config={"num_agents": 2}))
        assert sum(e.env_steps() for e in runner.sample(num_timesteps=4)) >= 4
        runner.stop()


def test_an_unwrapped_pettingzoo_env_is_refused_naming_the_adapter() -> None:
    parallel = _pettingzoo_parallel()
    with pytest.raises(TypeError, match=r"ParallelPettingZooEnv.*MultiAgentEnvRunner"):
        fr.SingleAgentEnvRunner(config=config(lambda ctx: parallel()))


def test_a_single_agent_env_in_a_multi_agent_runner_names_single_agent_env_runner() -> None:
    with pytest.raises(TypeError, match=r"single-agent gymnasium env.*SingleAgentEnvRunner"):
        fr.MultiAgentEnvRunner(config=config("CartPole-v1"))
