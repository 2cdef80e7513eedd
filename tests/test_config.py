"""RunnerConfig (builders, validation, copy/freeze, dict form) and the callbacks helper."""

from __future__ import annotations

import pickle
from typing import Any

import gymnasium as gym
import pytest
from hypothesis import given
from hypothesis import strategies as st
from ray.rllib.algorithms.algorithm_config import AlgorithmConfig
from ray.rllib.callbacks.callbacks import RLlibCallback

from fastrollout import Callbacks, RunnerConfig
from fastrollout.callbacks import CALLBACK_NAMES, make_callback
from fastrollout.config import NotProvided, default_policy_mapping_fn
from fastrollout.core import DEFAULT_MODULE_ID
from fastrollout.env import EnvCreator
from fastrollout.env.examples import TurnBasedEnv


def _rllib() -> AlgorithmConfig:
    return AlgorithmConfig()


# ----------------------------------------------------------------------------- defaults


SHARED_DEFAULTS = [
    "env",
    "env_config",
    "observation_space",
    "action_space",
    "normalize_actions",
    "clip_actions",
    "disable_env_checking",
    "num_env_runners",
    "num_envs_per_env_runner",
    "gym_env_vectorize_mode",
    "num_cpus_per_env_runner",
    "num_gpus_per_env_runner",
    "sample_timeout_s",
    "rollout_fragment_length",
    "batch_mode",
    "explore",
    "episode_lookback_horizon",
    "episodes_to_numpy",
    "add_default_connectors_to_env_to_module_pipeline",
    "add_default_connectors_to_module_to_env_pipeline",
    "restart_failed_sub_environments",
    "policies_to_train",
    "count_steps_by",
    "seed",
    "metrics_num_episodes_for_smoothing",
    "num_learners",
    "callbacks_on_environment_created",
    "callbacks_on_episode_created",
    "callbacks_on_episode_start",
    "callbacks_on_episode_step",
    "callbacks_on_episode_end",
    "callbacks_on_sample_end",
]


@pytest.mark.parametrize("name", SHARED_DEFAULTS)
def test_defaults_are_rllibs(name: str) -> None:
    assert getattr(RunnerConfig(), name) == getattr(_rllib(), name)


def test_default_modules_and_mapping() -> None:
    config = RunnerConfig()
    assert list(config.policies) == list(_rllib().policies) == [DEFAULT_MODULE_ID]
    assert config.module_ids == [DEFAULT_MODULE_ID]
    assert not config.is_multi_agent and not _rllib().is_multi_agent
    assert config.policy_mapping_fn("any", None) == DEFAULT_MODULE_ID
    assert default_policy_mapping_fn(3) == DEFAULT_MODULE_ID
    assert config.callbacks_class is Callbacks
    assert config.device == "auto"
    assert config.model_config == {} and config.rl_module_spec is None
    assert config.env_to_module_connector is None and config.module_to_env_connector is None
    config.validate()
    assert repr(NotProvided) == "NotProvided"


# ----------------------------------------------------------------------------- builders


def test_builders_set_and_chain() -> None:
    def e2m(env: Any, spaces: Any = None, device: Any = None) -> list[Any]:
        return []

    def m2e(env: Any, spaces: Any = None) -> list[Any]:
        return []

    config = (
        RunnerConfig()
        .environment(
            "CartPole-v1",
            env_config={"a": {"b": 1}},
            observation_space=gym.spaces.Discrete(2),
            action_space=gym.spaces.Discrete(3),
            normalize_actions=False,
            clip_actions=True,
            disable_env_checking=True,
        )
        .env_runners(
            num_env_runners=2,
            num_envs_per_env_runner=8,
            gym_env_vectorize_mode="async",
            num_cpus_per_env_runner=2,
            num_gpus_per_env_runner=0.5,
            sample_timeout_s=None,
            env_to_module_connector=e2m,
            module_to_env_connector=m2e,
            add_default_connectors_to_env_to_module_pipeline=False,
            add_default_connectors_to_module_to_env_pipeline=False,
            episode_lookback_horizon=4,
            rollout_fragment_length=50,
            batch_mode="complete_episodes",
            explore=False,
            episodes_to_numpy=False,
            restart_failed_sub_environments=True,
            max_sub_environment_restart_attempts=2,
        )
        .debugging(seed=7, log_level="DEBUG")
        .resources(device="cpu")
        .reporting(metrics_num_episodes_for_smoothing=10)
        .rl_module(model_config={"fcnet_hiddens": [32]})
    )
    assert config.env == "CartPole-v1" and config.env_config == {"a": {"b": 1}}
    assert config.observation_space == gym.spaces.Discrete(2)
    assert config.action_space == gym.spaces.Discrete(3)
    assert (config.normalize_actions, config.clip_actions, config.disable_env_checking) == (
        False,
        True,
        True,
    )
    assert (config.num_env_runners, config.num_envs_per_env_runner) == (2, 8)
    assert config.gym_env_vectorize_mode == "async"
    assert (config.num_cpus_per_env_runner, config.num_gpus_per_env_runner) == (2, 0.5)
    assert config.sample_timeout_s is None
    assert config.env_to_module_connector is e2m and config.module_to_env_connector is m2e
    assert not config.add_default_connectors_to_env_to_module_pipeline
    assert not config.add_default_connectors_to_module_to_env_pipeline
    assert config.episode_lookback_horizon == 4 and config.rollout_fragment_length == 50
    assert config.get_rollout_fragment_length() == 50
    assert config.batch_mode == "complete_episodes" and config.explore is False
    assert config.episodes_to_numpy is False
    assert config.restart_failed_sub_environments is True
    assert config.max_sub_environment_restart_attempts == 2
    assert (config.seed, config.log_level, config.device) == (7, "DEBUG", "cpu")
    assert config.metrics_num_episodes_for_smoothing == 10
    assert config.model_config == {"fcnet_hiddens": [32]}
    config.validate()


def test_env_config_merges_recursively_like_rllib() -> None:
    ours = RunnerConfig().environment(env_config={"a": {"x": 1}, "b": 1})
    ours.environment(env_config={"a": {"y": 2}})
    ref = _rllib().environment(env_config={"a": {"x": 1}, "b": 1})
    ref.environment(env_config={"a": {"y": 2}})
    assert ours.env_config == ref.env_config == {"a": {"x": 1, "y": 2}, "b": 1}
    given_config = {"c": [1]}
    ours.environment(env_config=given_config)
    given_config["c"].append(2)
    assert ours.env_config["c"] == [1]  # copied
    ours.environment(env_config=None)
    assert ours.env_config["b"] == 1


def test_not_provided_leaves_values() -> None:
    config = RunnerConfig().env_runners(num_envs_per_env_runner=3)
    config.env_runners(batch_mode="complete_episodes")
    assert config.num_envs_per_env_runner == 3
    config.environment()
    assert config.env is None


def test_fault_tolerance_is_the_rllib_home_of_restarts() -> None:
    config = RunnerConfig().fault_tolerance(
        restart_failed_sub_environments=True, max_sub_environment_restart_attempts=9
    )
    ref = _rllib().fault_tolerance(restart_failed_sub_environments=True)
    assert config.restart_failed_sub_environments is ref.restart_failed_sub_environments is True
    assert config.max_sub_environment_restart_attempts == 9


def test_vectorize_mode_accepts_gymnasium_enum() -> None:
    config = RunnerConfig().env_runners(gym_env_vectorize_mode=gym.VectorizeMode.ASYNC)
    config.validate()


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"num_envs_per_env_runner": 0}, ValueError, "num_envs_per_env_runner must be >= 1, got 0"),
        ({"num_envs_per_env_runner": 1.5}, TypeError, "num_envs_per_env_runner must be an int"),
        ({"num_envs_per_env_runner": True}, TypeError, "num_envs_per_env_runner must be an int"),
        ({"num_env_runners": -1}, ValueError, "num_env_runners must be >= 0"),
        (
            {"batch_mode": "episodes"},
            ValueError,
            r"batch_mode must be one of \['truncate_episodes'",
        ),
        ({"rollout_fragment_length": 0}, ValueError, "rollout_fragment_length must be 'auto' or"),
        ({"rollout_fragment_length": "big"}, ValueError, "rollout_fragment_length must be 'auto'"),
        ({"gym_env_vectorize_mode": "threads"}, ValueError, "gym_env_vectorize_mode must be one"),
        ({"gym_env_vectorize_mode": ["sync"]}, ValueError, "gym_env_vectorize_mode must be one"),
        ({"explore": 1}, TypeError, "explore must be a bool, got 1"),
        ({"episode_lookback_horizon": -1}, ValueError, "episode_lookback_horizon must be >= 0"),
        ({"env_to_module_connector": 3}, TypeError, "env_to_module_connector must be callable"),
        ({"module_to_env_connector": "x"}, TypeError, "module_to_env_connector must be callable"),
        ({"num_cpus_per_env_runner": -1}, ValueError, "num_cpus_per_env_runner must be >= 0"),
        ({"num_gpus_per_env_runner": "1"}, TypeError, "num_gpus_per_env_runner must be a number"),
        ({"sample_timeout_s": -1.0}, ValueError, "sample_timeout_s must be >= 0"),
        ({"env_runner_cls": 3}, TypeError, "env_runner_cls must be a class"),
        ({"restart_failed_sub_environments": "yes"}, TypeError, "restart_failed_sub_environments"),
        ({"max_sub_environment_restart_attempts": 0}, ValueError, "restart_attempts must be >= 1"),
    ],
)
def test_env_runners_rejects_bad_values(kwargs: dict[str, Any], error: type, message: str) -> None:
    config = RunnerConfig()
    before = config.to_dict()
    with pytest.raises(error, match=message):
        config.env_runners(**kwargs)
    assert config.to_dict().keys() == before.keys()
    name = next(iter(kwargs))
    assert getattr(config, name, None) == before.get(name, before.get(name.lstrip("_")))


def test_rllib_rejects_the_same_batch_mode_and_fragment_length() -> None:
    with pytest.raises(ValueError, match="batch_mode"):
        _rllib().env_runners(batch_mode="episodes")
    with pytest.raises(ValueError, match="rollout_fragment_length"):
        _rllib().env_runners(rollout_fragment_length=0)


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda c: c.environment(env=3), TypeError, "env must be a gymnasium id .* got int"),
        (
            lambda c: c.environment(env=gym.make("CartPole-v1")),
            TypeError,
            "not an env instance",
        ),
        (lambda c: c.environment(env_config=[1]), TypeError, "env_config must be a dict, got list"),
        (lambda c: c.environment(observation_space=3), TypeError, "observation_space must be a"),
        (lambda c: c.environment(action_space="x"), TypeError, "action_space must be a gymnasium"),
        (lambda c: c.environment(clip_actions=None), TypeError, "clip_actions must be a bool"),
        (lambda c: c.multi_agent(policies=[]), ValueError, "policies must name at least one"),
        (lambda c: c.multi_agent(policies="p0"), TypeError, "policies must be a collection"),
        (lambda c: c.multi_agent(policies={1: None}), TypeError, "module ids in policies must be"),
        (lambda c: c.multi_agent(policy_mapping_fn=3), TypeError, "policy_mapping_fn must be"),
        (lambda c: c.multi_agent(policies_to_train="p0"), TypeError, "policies_to_train must be"),
        (lambda c: c.multi_agent(count_steps_by="x"), ValueError, "count_steps_by must be one of"),
        (lambda c: c.rl_module(model_config=[1]), TypeError, "model_config must be a dict"),
        (lambda c: c.training(train_batch_size=0), ValueError, "train_batch_size must be >= 1"),
        (
            lambda c: c.training(train_batch_size_per_learner=0),
            ValueError,
            "train_batch_size_per_learner must be >= 1",
        ),
        (lambda c: c.learners(num_learners=-1), ValueError, "num_learners must be >= 0"),
        (lambda c: c.callbacks(3), TypeError, "callbacks_class must be a class"),
        (lambda c: c.callbacks(on_episode_start=3), TypeError, r"callbacks\(on_episode_start="),
        (lambda c: c.callbacks(on_sample_end=[print, 3]), TypeError, r"on_sample_end=.*got int"),
        (lambda c: c.debugging(seed="1"), TypeError, "seed must be an int"),
        (lambda c: c.debugging(seed=-1), ValueError, "seed must be >= 0"),
        (lambda c: c.debugging(log_level="LOUD"), ValueError, "log_level must be one of"),
        (lambda c: c.resources(device="tpu"), ValueError, "device must be 'auto', 'cpu'"),
        (lambda c: c.resources(device="cuda:x"), ValueError, "device must be"),
        (
            lambda c: c.reporting(metrics_num_episodes_for_smoothing=0),
            ValueError,
            "metrics_num_episodes_for_smoothing must be >= 1",
        ),
    ],
)
def test_setters_reject_bad_values(call: Any, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        call(RunnerConfig())


@pytest.mark.parametrize("device", ["auto", "cpu", "cuda", "cuda:1"])
def test_devices(device: str) -> None:
    RunnerConfig().resources(device=device).validate()


def test_torch_device_is_accepted() -> None:
    torch = pytest.importorskip("torch")
    RunnerConfig().resources(device=torch.device("cpu")).validate()


# ----------------------------------------------------------------------------- multi-agent


def test_multi_agent_policies_mapping_and_training_set() -> None:
    def mapping(agent_id: Any, episode: Any, **kwargs: Any) -> str:
        return "p0" if agent_id == "player_0" else "p1"

    config = RunnerConfig().multi_agent(
        policies={"p0", "p1"}, policy_mapping_fn=mapping, policies_to_train=["p0"]
    )
    assert set(config.module_ids) == {"p0", "p1"} and config.is_multi_agent
    assert config.policy_mapping_fn is mapping
    assert config.agent_to_module_mapping_fn("player_1", None) == "p1"
    config.validate()
    ref = _rllib().multi_agent(policies={"p0", "p1"}, policy_mapping_fn=mapping)
    assert ref.is_multi_agent
    one = RunnerConfig().multi_agent(policies=["only"])
    assert one.is_multi_agent and _rllib().multi_agent(policies=["only"]).is_multi_agent
    assert not RunnerConfig().multi_agent(policies=[DEFAULT_MODULE_ID]).is_multi_agent


def test_a_set_of_policies_is_sorted_other_collections_keep_their_order() -> None:
    ids = [f"m{i}" for i in (3, 10, 1, 2)]
    assert RunnerConfig().multi_agent(policies=set(ids)).module_ids == sorted(ids)
    assert RunnerConfig().multi_agent(policies=frozenset(ids)).module_ids == sorted(ids)
    assert RunnerConfig().multi_agent(policies=ids).module_ids == ids
    assert RunnerConfig().multi_agent(policies=tuple(ids)).module_ids == ids
    assert RunnerConfig().multi_agent(policies=dict.fromkeys(ids)).module_ids == ids
    assert RunnerConfig().multi_agent(policies=dict.fromkeys(ids).keys()).module_ids == ids
    with pytest.raises(TypeError, match="module ids in policies must be str, got 1"):
        RunnerConfig().multi_agent(policies={"a", 1})


def test_count_steps_by_is_checked_and_kept() -> None:
    assert RunnerConfig().count_steps_by == "env_steps"
    config = RunnerConfig().multi_agent(count_steps_by="agent_steps")
    assert config.count_steps_by == "agent_steps"
    config.validate()


def test_mapping_to_unknown_module_names_agent_and_module() -> None:
    config = RunnerConfig().multi_agent(policies=["p0"], policy_mapping_fn=lambda a, e, **k: "p9")
    with pytest.raises(ValueError, match=r"mapped agent 'a' to module 'p9'.*modules: \['p0'\]"):
        config.agent_to_module_mapping_fn("a", None)


def test_policies_dict_and_rllib_policy_spec() -> None:
    from ray.rllib.policy.policy import PolicySpec

    config = RunnerConfig().multi_agent(policies={"p0": PolicySpec(), "p1": None})
    assert config.policies == {"p0": None, "p1": None}


def test_policies_to_train_must_be_configured_modules() -> None:
    config = RunnerConfig().multi_agent(policies=["p0"], policies_to_train=["p0", "px"])
    with pytest.raises(ValueError, match=r"policies_to_train names modules \['px'\]"):
        config.validate()
    RunnerConfig().multi_agent(policies_to_train=lambda mid, batch=None: True).validate()


def _multi_spec(ids: list[str]) -> Any:
    from fastrollout.modules import MultiRLModuleSpec, RLModuleSpec

    return MultiRLModuleSpec(rl_module_specs={i: RLModuleSpec() for i in ids})


def test_multi_rl_module_spec_defines_modules_and_must_match_policies() -> None:
    config = RunnerConfig().rl_module(rl_module_spec=_multi_spec(["a", "b"]))
    assert config.module_ids == ["a", "b"] and config.is_multi_agent
    config.validate()
    config.multi_agent(policies=["a", "c"])
    with pytest.raises(
        ValueError, match=r"missing specs for \['c'\], specs without a policy: \['b'\]"
    ):
        config.validate()
    config.multi_agent(policies=["b", "a"])
    config.validate()


# ----------------------------------------------------------------------------- auto fragment


@given(
    batch=st.integers(1, 5000),
    envs=st.integers(1, 20),
    runners=st.integers(0, 6),
    learners=st.integers(0, 3),
)
def test_auto_rollout_fragment_length_matches_rllib(
    batch: int, envs: int, runners: int, learners: int
) -> None:
    ours = (
        RunnerConfig()
        .env_runners(
            rollout_fragment_length="auto", num_envs_per_env_runner=envs, num_env_runners=runners
        )
        .training(train_batch_size_per_learner=batch)
        .learners(num_learners=learners)
    )
    ref = (
        _rllib()
        .env_runners(
            rollout_fragment_length="auto", num_envs_per_env_runner=envs, num_env_runners=runners
        )
        .training(train_batch_size_per_learner=batch)
        .learners(num_learners=learners)
    )
    for worker_index in range(runners + 1):
        assert ours.get_rollout_fragment_length(worker_index) == ref.get_rollout_fragment_length(
            worker_index
        )
    # The remote runners' fragments add up to at least the batch (when it is not tiny).
    total = sum(ours.get_rollout_fragment_length(w) for w in range(1, (runners or 1) + 1))
    assert total * envs >= min(batch * (learners or 1), envs * (runners or 1))


def test_auto_needs_a_train_batch_size() -> None:
    config = RunnerConfig().env_runners(rollout_fragment_length="auto")
    with pytest.raises(ValueError, match=r"needs a train batch size: set \.training"):
        config.get_rollout_fragment_length()
    with pytest.raises(ValueError, match="needs a train batch size"):
        config.validate()
    config.training(train_batch_size=1000).learners(num_learners=2)
    assert config.train_batch_size_per_learner == 500
    assert config.total_train_batch_size == 1000
    assert config.get_rollout_fragment_length() == 1000


# ----------------------------------------------------------------------------- freeze, copy, dict


def test_freeze_blocks_setters_and_assignment() -> None:
    config = RunnerConfig().environment("CartPole-v1")
    config.freeze()
    assert config.is_frozen
    with pytest.raises(AttributeError, match=r"cannot set 'num_envs_per_env_runner': .*frozen"):
        config.env_runners(num_envs_per_env_runner=2)
    with pytest.raises(AttributeError, match="frozen"):
        config.seed = 3
    assert config.num_envs_per_env_runner == 1
    config.freeze()  # idempotent
    assert "frozen" in repr(config)


def test_copy_frozen_or_not_is_deep() -> None:
    config = RunnerConfig().environment("CartPole-v1", env_config={"a": [1]})
    config.freeze()
    same = config.copy()
    assert same.is_frozen and same is not config
    editable = config.copy(copy_frozen=False)
    assert not editable.is_frozen
    editable.env_config["a"].append(2)
    editable.env_runners(num_envs_per_env_runner=4)
    assert config.env_config == {"a": [1]} and config.num_envs_per_env_runner == 1
    assert RunnerConfig().copy(copy_frozen=True).is_frozen


def test_validate_catches_direct_assignments() -> None:
    for name, value, message in [
        ("batch_mode", "bogus", "batch_mode must be one of"),
        ("num_envs_per_env_runner", 0, "num_envs_per_env_runner must be >= 1"),
        ("env_config", [1], "env_config must be a dict"),
        ("explore", "no", "explore must be a bool"),
        ("device", "gpu", "device must be"),
        ("policies", {}, "policies must name at least one"),
        ("policy_mapping_fn", 3, "policy_mapping_fn must be callable"),
        ("callbacks_on_episode_end", 3, "on_episode_end"),
        ("callbacks_class", [Callbacks, 3], "callbacks_class must be a class"),
        ("env", 3.0, "env must be"),
        ("seed", 1.5, "seed must be an int"),
        ("observation_space", "x", "observation_space must be"),
    ]:
        config = RunnerConfig()
        setattr(config, name, value)
        with pytest.raises((ValueError, TypeError), match=message):
            config.validate()


def test_to_dict_from_dict_round_trip() -> None:
    config = (
        RunnerConfig()
        .environment(TurnBasedEnv, env_config={"num_turns": 4})
        .env_runners(num_envs_per_env_runner=2, batch_mode="complete_episodes")
        .multi_agent(policies=["p0", "p1"], policy_mapping_fn=default_policy_mapping_fn)
        .rl_module(model_config={"h": 1})
        .debugging(seed=3)
    )
    as_dict = config.to_dict()
    assert as_dict["num_envs_per_env_runner"] == 2
    assert as_dict["env_config"] == {"num_turns": 4} and as_dict["model_config"] == {"h": 1}
    assert "env_to_module_connector" in as_dict and "_is_frozen" not in as_dict
    back = RunnerConfig.from_dict(as_dict)
    assert back.to_dict() == as_dict
    assert back.module_ids == ["p0", "p1"]
    with pytest.raises(ValueError, match=r"unknown RunnerConfig settings \['num_workers'\]"):
        RunnerConfig.from_dict({"num_workers": 2})
    with pytest.raises(ValueError, match="batch_mode must be one of"):
        RunnerConfig().update_from_dict({"batch_mode": "x"})


def test_config_pickles() -> None:
    config = RunnerConfig().environment("CartPole-v1").multi_agent(policies=["a"])
    config.freeze()
    back = pickle.loads(pickle.dumps(config))
    assert back.is_frozen and back.env == "CartPole-v1" and back.module_ids == ["a"]


def test_make_env_creator_uses_the_config() -> None:
    config = (
        RunnerConfig()
        .environment(TurnBasedEnv, env_config={"num_turns": 3}, disable_env_checking=True)
        .env_runners(num_env_runners=2)
    )
    creator = config.make_env_creator(worker_index=1)
    assert isinstance(creator, EnvCreator) and creator.check is False
    ctx = creator.env_context(2)
    assert (ctx.worker_index, ctx.vector_index, ctx.num_workers) == (1, 2, 2)
    assert creator(0).num_turns == 3
    with pytest.raises(ValueError, match="no env given"):
        RunnerConfig().make_env_creator()


# ----------------------------------------------------------------------------- callbacks


class _Recorder(Callbacks):
    log: list[tuple[str, str, dict[str, Any]]] = []  # noqa: RUF012

    def on_episode_start(self, *, episode: Any, env_index: int, **kwargs: Any) -> None:
        self.log.append(("obj", type(self).__name__, {"episode": episode, "env_index": env_index}))


class _Second(_Recorder):
    pass


def test_make_callback_calls_objects_then_functions_in_order() -> None:
    _Recorder.log = []
    config = RunnerConfig().callbacks(
        [_Recorder, _Second],
        on_episode_start=[
            lambda **kw: _Recorder.log.append(("fn", "first", kw)),
            lambda **kw: _Recorder.log.append(("fn", "second", kw)),
        ],
    )
    objects = config.build_callbacks()
    assert [type(o) for o in objects] == [_Recorder, _Second]
    make_callback(
        "on_episode_start",
        objects,
        config.callbacks_functions("on_episode_start"),
        kwargs={"episode": "E"},
        env_index=3,
    )
    assert [(kind, who) for kind, who, _ in _Recorder.log] == [
        ("obj", "_Recorder"),
        ("obj", "_Second"),
        ("fn", "first"),
        ("fn", "second"),
    ]
    assert all(kw == {"episode": "E", "env_index": 3} for _, _, kw in _Recorder.log)


def test_make_callback_single_items_none_and_errors() -> None:
    calls: list[Any] = []
    make_callback("on_sample_end", None, None, samples=[])
    make_callback("on_sample_end", Callbacks(), lambda **kw: calls.append(kw), samples=[1])
    assert calls == [{"samples": [1]}]
    make_callback("on_sample_end", [], [lambda *a, **kw: calls.append(a)], args=[5], kwargs={})
    assert calls[-1] == (5,)
    with pytest.raises(AttributeError, match="callbacks object int has no method 'on_sample_end'"):
        make_callback("on_sample_end", [3], None)
    with pytest.raises(TypeError, match="callback for 'on_sample_end' must be callable, got str"):
        make_callback("on_sample_end", None, ["x"])
    with pytest.raises(ValueError, match="unknown callback hook 'on_train_result'"):
        RunnerConfig().callbacks_functions("on_train_result")


def test_exceptions_in_callbacks_propagate() -> None:
    def boom(**kwargs: Any) -> None:
        raise KeyError("user bug")

    with pytest.raises(KeyError, match="user bug"):
        make_callback("on_episode_end", None, boom, episode=None, env_index=0)


def test_base_hooks_accept_rllibs_arguments_and_do_nothing() -> None:
    cb = Callbacks()
    common = {"env_runner": None, "metrics_logger": None, "env": None, "rl_module": None}
    assert cb.on_environment_created(env_runner=None, env=None, env_context={}) is None
    for hook in ("on_episode_created", "on_episode_start", "on_episode_step"):
        assert getattr(cb, hook)(episode=None, env_index=0, **common, worker=None) is None
    assert cb.on_episode_end(episode=None, env_index=0, prev_episode_chunks=[], **common) is None
    assert cb.on_sample_end(env_runner=None, metrics_logger=None, samples=[]) is None
    assert set(CALLBACK_NAMES) <= {m for m in dir(RLlibCallback) if m.startswith("on_")}


def test_rllib_callback_classes_work() -> None:
    seen: list[int] = []

    class FromRLlib(RLlibCallback):
        def on_episode_step(self, *, episode: Any, env_index: int, **kwargs: Any) -> None:
            seen.append(env_index)

    config = RunnerConfig().callbacks(FromRLlib)
    config.validate()
    make_callback("on_episode_step", config.build_callbacks(), None, episode=None, env_index=4)
    assert seen == [4]
    assert RunnerConfig().callbacks(None).callbacks_class is Callbacks
    assert _rllib().callbacks_class is RLlibCallback


# ----------------------------------------------------------------------------- properties

_SETTINGS = st.fixed_dictionaries(
    {},
    optional={
        "num_envs_per_env_runner": st.integers(1, 64),
        "num_env_runners": st.integers(0, 8),
        "rollout_fragment_length": st.one_of(st.just("auto"), st.integers(1, 1000)),
        "batch_mode": st.sampled_from(["truncate_episodes", "complete_episodes"]),
        "explore": st.booleans(),
        "episode_lookback_horizon": st.integers(0, 10),
        "gym_env_vectorize_mode": st.sampled_from(["sync", "async"]),
        "restart_failed_sub_environments": st.booleans(),
    },
)


@given(
    settings=_SETTINGS,
    env_config=st.dictionaries(st.text(min_size=1, max_size=5), st.integers(), max_size=3),
    policies=st.sets(st.text(min_size=1, max_size=4), min_size=1, max_size=4),
    seed=st.one_of(st.none(), st.integers(0, 2**31)),
)
def test_dict_form_and_copies_round_trip(
    settings: dict[str, Any], env_config: dict[str, int], policies: set[str], seed: int | None
) -> None:
    config = (
        RunnerConfig()
        .environment("CartPole-v1", env_config=env_config)
        .env_runners(**settings)
        .multi_agent(policies=policies)
        .training(train_batch_size=4000)
        .debugging(seed=seed)
    )
    config.validate()
    as_dict = config.to_dict()
    assert RunnerConfig.from_dict(as_dict).to_dict() == as_dict
    frozen = config.copy(copy_frozen=True)
    assert frozen.to_dict() == as_dict and frozen.is_frozen and not config.is_frozen
    with pytest.raises(AttributeError, match="frozen"):
        frozen.env_runners(explore=True)
    assert config.copy().to_dict() == as_dict
    assert set(config.module_ids) == policies
    for worker_index in range(config.num_env_runners + 1):
        assert config.get_rollout_fragment_length(worker_index) >= 1
