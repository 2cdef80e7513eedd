"""fastrollout's runners as RLlib 2.60's ``env_runner_cls``: built from RLlib's config.

The runners read RLlib's ``AlgorithmConfig`` as they read ``RunnerConfig``; what differs
(the modules RLlib would build, RLlib's metrics objects, episodes that RLlib's connectors
take for its own) is tested here piece by piece; tests/test_rllib_training.py trains.
"""

from __future__ import annotations

import pickle

import gymnasium as gym
import numpy as np
import pytest
import torch

import fastrollout as fr
from fastrollout.errors import SampleArgumentError
from fastrollout.modules.default import DefaultMLPModule
from fastrollout.runners import _rllib

ppo = pytest.importorskip("ray.rllib.algorithms.ppo")
from ray.rllib.algorithms.algorithm_config import AlgorithmConfig  # noqa: E402
from ray.rllib.core.rl_module.rl_module import RLModule as RLlibRLModule  # noqa: E402
from ray.rllib.env.multi_agent_episode import (  # noqa: E402
    MultiAgentEpisode as RLlibMultiAgentEpisode,
)
from ray.rllib.env.single_agent_episode import (  # noqa: E402
    SingleAgentEpisode as RLlibSingleAgentEpisode,
)


def ppo_config(**env_runners):
    return (
        ppo.PPOConfig()
        .environment("CartPole-v1")
        .env_runners(num_envs_per_env_runner=2, **env_runners)
        .rl_module(model_config={"fcnet_hiddens": [16, 16]})
        .debugging(seed=0)
    )


SPACES = [
    (gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2)),
    (gym.spaces.Box(-1, 1, (3,)), gym.spaces.Box(-2, 2, (2,))),
    (gym.spaces.Box(-1, 1, (5,)), gym.spaces.MultiDiscrete([3, 4])),
]


def _impala_config():
    from ray.rllib.algorithms.impala import IMPALAConfig

    # IMPALA leaves vf_share_layers to RLlib's DefaultModelConfig (True): one shared encoder.
    return IMPALAConfig().rl_module(model_config={"fcnet_hiddens": [16, 8]})


@pytest.mark.parametrize("make_config", [ppo_config, _impala_config], ids=["ppo", "impala"])
@pytest.mark.parametrize("spaces", SPACES, ids=["discrete", "box", "multi_discrete"])
def test_default_ppo_module_is_built_as_its_fastrollout_twin(spaces, make_config):
    """RLlib's default PPO module and fastrollout's twin: same parameters, same outputs."""
    obs_space, act_space = spaces
    spec = make_config().get_rl_module_spec(spaces={"default_policy": spaces}, inference_only=True)
    spec.observation_space, spec.action_space = obs_space, act_space
    theirs = spec.build()
    ours = _rllib.build_from_spec(spec)
    assert isinstance(ours, DefaultMLPModule)
    assert sorted(ours.get_state()) == sorted(theirs.get_state())
    ours.set_state(theirs.get_state())
    x = torch.randn(7, obs_space.shape[0])
    for phase in ("forward_inference", "forward_exploration"):
        a = getattr(theirs, phase)({"obs": x})["action_dist_inputs"]
        b = getattr(ours, phase)({"obs": x})["action_dist_inputs"]
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


@pytest.mark.parametrize(
    "model_config",
    [
        {},
        {
            "conv_filters": [[16, 4, 2], [32, 4, 2], [64, 4, 2], [128, 4, 2]],
            "head_fcnet_hiddens": [256],
        },
    ],
    ids=["default", "atari"],
)
def test_image_spaces_get_the_cnn_twin(model_config):
    """RLlib's default PPO CNN and fastrollout's DefaultCNNModule: same parameters and outputs."""
    from fastrollout.modules import DefaultCNNModule

    space = gym.spaces.Box(-1, 1, (64, 64, 4), np.float32)
    spec = (
        ppo.PPOConfig()
        .rl_module(model_config=model_config)
        .get_rl_module_spec(
            spaces={"default_policy": (space, gym.spaces.Discrete(6))}, inference_only=True
        )
    )
    spec.observation_space, spec.action_space = space, gym.spaces.Discrete(6)
    theirs = spec.build()
    ours = _rllib.build_from_spec(spec)
    assert isinstance(ours, DefaultCNNModule)
    assert sorted(ours.get_state()) == sorted(theirs.get_state())
    ours.set_state(theirs.get_state())
    x = torch.rand(5, *space.shape) * 2 - 1
    for phase in ("forward_inference", "forward_exploration"):
        a = getattr(theirs, phase)({"obs": x})["action_dist_inputs"]
        b = getattr(ours, phase)({"obs": x})["action_dist_inputs"]
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


def test_other_modules_are_rllibs_own():
    """A CNN with an LSTM: fastrollout has no twin of it, so RLlib's module runs."""
    space = gym.spaces.Box(0, 255, (42, 42, 3), np.uint8)
    spec = (
        ppo.PPOConfig()
        .rl_module(model_config={"use_lstm": True, "vf_share_layers": True})
        .get_rl_module_spec(
            spaces={"default_policy": (space, gym.spaces.Discrete(2))}, inference_only=True
        )
    )
    spec.observation_space, spec.action_space = space, gym.spaces.Discrete(2)
    module = _rllib.build_from_spec(spec)
    assert isinstance(module, RLlibRLModule)


def test_runner_from_rllib_config_has_rllibs_module_api():
    runner = fr.SingleAgentEnvRunner(config=ppo_config())
    assert runner._rllib
    module = runner.module
    out = module.forward_inference({"obs": torch.zeros(3, 4)})
    assert out["action_dist_inputs"].shape == (3, 2)
    state = runner.get_state()
    # RLlib's single-agent runner: the module's own state, not keyed by module id.
    assert set(state["rl_module"]) == set(module.get_state())
    assert state["weights_seq_no"] == 0


def test_fastrollout_single_agent_runner_module_is_the_rl_module():
    """As RLlib's ``SingleAgentEnvRunner.module``: the RLModule itself."""
    runner = fr.SingleAgentEnvRunner(
        config=fr.RunnerConfig().environment("CartPole-v1").debugging(seed=0)
    )
    out = runner.module.forward_inference({"obs": torch.zeros(2, 4)})
    assert out["action_dist_inputs"].shape == (2, 2)
    # Setting an RLModule replaces the runner's module.
    other = DefaultMLPModule(
        observation_space=runner.module.observation_space,
        action_space=runner.module.action_space,
        inference_only=True,
    )
    runner.module = other
    assert runner.module is other
    assert runner.sample(num_timesteps=4)


def test_rllib_module_samples_in_the_runner():
    """A module RLlib builds itself (here: its default module on a CNN-free but
    non-twin spec, a custom subclass) runs in fastrollout's loop with RLlib's
    distributions."""
    from ray.rllib.algorithms.ppo.torch.default_ppo_torch_rl_module import (
        DefaultPPOTorchRLModule,
    )
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    class Custom(DefaultPPOTorchRLModule):
        pass

    config = ppo_config().rl_module(
        rl_module_spec=RLModuleSpec(module_class=Custom, model_config={"fcnet_hiddens": [8]})
    )
    runner = fr.SingleAgentEnvRunner(config=config)
    assert isinstance(runner.module, Custom)
    episodes = runner.sample(num_timesteps=20)
    assert sum(len(e) for e in episodes) >= 20
    for e in episodes:
        logp = e.get_extra_model_outputs("action_logp")
        assert np.all(np.asarray(logp) <= 0)


def test_episodes_are_rllibs_for_isinstance_and_pickle_as_such():
    runner = fr.SingleAgentEnvRunner(config=ppo_config())
    episodes = runner.sample(num_timesteps=10)
    for e in episodes:
        assert isinstance(e, RLlibSingleAgentEpisode)
        assert isinstance(e, fr.SingleAgentEpisode)
        back = pickle.loads(pickle.dumps(e))
        assert type(back) is type(e)
        assert isinstance(back, RLlibSingleAgentEpisode)
        np.testing.assert_array_equal(back.get_observations(), e.get_observations())
    # fastrollout's own episodes stay what they are.
    plain = fr.SingleAgentEpisode()
    assert not isinstance(plain, RLlibSingleAgentEpisode)
    assert not isinstance(plain, RLlibMultiAgentEpisode)


def test_env_registered_with_ray_tune_is_found():
    from ray.tune import register_env

    register_env("fr_tune_cartpole", lambda ctx: gym.make("CartPole-v1"))
    config = ppo_config().environment("fr_tune_cartpole")
    runner = fr.SingleAgentEnvRunner(config=config)
    assert runner.sample(num_timesteps=4)
    # fastrollout's own config finds it too (ray is imported here).
    runner = fr.SingleAgentEnvRunner(
        config=fr.RunnerConfig().environment("fr_tune_cartpole").debugging(seed=0)
    )
    assert runner.sample(num_timesteps=4)


def test_base_algorithm_config_gives_a_runner_without_module():
    """RLlib's base ``AlgorithmConfig`` has no module to build: random actions only."""
    runner = fr.SingleAgentEnvRunner(config=AlgorithmConfig().environment("CartPole-v1"))
    assert runner.module is None
    episodes = runner.sample(num_timesteps=10, random_actions=True)
    assert sum(len(e) for e in episodes) >= 10
    with pytest.raises(RuntimeError, match="no module"):
        runner.sample(num_timesteps=10)


@pytest.mark.parametrize("kwargs", [{"num_timesteps": 1, "num_episodes": 1}, {"num_timesteps": -1}])
def test_bad_sample_arguments_raise_what_both_kinds_of_caller_catch(kwargs):
    runner = fr.SingleAgentEnvRunner(config=ppo_config())
    for kind in (ValueError, AssertionError, SampleArgumentError):
        with pytest.raises(kind):
            runner.sample(**kwargs)


class _CountingEnv(gym.Env):
    steps = 0

    def __init__(self, config=None):
        self.observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)
        self.action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        return np.zeros(2, np.float32), {}

    def step(self, action):
        type(self).steps += 1
        return np.zeros(2, np.float32), 1.0, False, False, {}


def test_runner_from_rllib_config_does_not_step_the_env_at_construction():
    """RLlib's runner checks no env; built from RLlib's config, neither does fastrollout's.

    From fastrollout's own config the env check runs (a deliberate difference, in
    docs/migrating.md), unless ``disable_env_checking``.
    """
    _CountingEnv.steps = 0
    fr.SingleAgentEnvRunner(config=ppo_config().environment(_CountingEnv))
    assert _CountingEnv.steps == 0
    fr.SingleAgentEnvRunner(config=fr.RunnerConfig().environment(_CountingEnv))
    assert _CountingEnv.steps > 0


def _map_agent(agent_id, *args, **kwargs):
    return f"p{agent_id}"


def _ma_config():
    from ray.rllib.examples.envs.classes.multi_agent import MultiAgentCartPole

    return (
        ppo.PPOConfig()
        .environment(MultiAgentCartPole, env_config={"num_agents": 2})
        .env_runners(num_envs_per_env_runner=2)
        .multi_agent(policies={"p1", "p0"}, policy_mapping_fn=_map_agent)
        .rl_module(model_config={"fcnet_hiddens": [16]})
        .debugging(seed=0)
    )


def test_multi_agent_runner_from_rllib_config():
    runner = fr.MultiAgentEnvRunner(config=_ma_config())
    assert sorted(runner.module) == ["p0", "p1"]
    assert all(isinstance(runner.module[m], DefaultMLPModule) for m in ("p0", "p1"))
    episodes = runner.sample(num_timesteps=40)
    for e in episodes:
        assert isinstance(e, RLlibMultiAgentEpisode) and isinstance(e, fr.MultiAgentEpisode)
        for sa in e.agent_episodes.values():
            assert isinstance(sa, RLlibSingleAgentEpisode)
        back = pickle.loads(pickle.dumps(e))
        assert type(back) is type(e)
        assert all(
            type(sa) is _rllib.RLlibSingleAgentEpisode for sa in back.agent_episodes.values()
        )
    # The successors of a cut keep the kind.
    assert all(type(e) is _rllib.RLlibMultiAgentEpisode for e in runner._episodes)


def test_multi_agent_spaces_are_rllibs_for_an_algorithm_without_local_runner():
    """RLlib's Algorithm without a local runner (``create_local_env_runner=False``) builds
    its connectors from the group's spaces, reading ``"__env_single__"``."""
    from ray.rllib.env.multi_agent_env_runner import MultiAgentEnvRunner

    config = _ma_config()
    ours = fr.MultiAgentEnvRunner(config=config).get_spaces()
    theirs = MultiAgentEnvRunner(config=config).get_spaces()
    assert set(ours) == set(theirs)
    assert ours["__env_single__"] == theirs["__env_single__"]
    assert config.build_env_to_module_connector(spaces=ours) is not None
    assert config.build_module_to_env_connector(spaces=ours) is not None


@pytest.mark.parametrize("multi_agent", [False, True], ids=["single_agent", "multi_agent"])
def test_get_metrics_aggregate_in_rllibs_root_logger(multi_agent):
    from ray.rllib.utils.metrics.metrics_logger import MetricsLogger as RLlibLogger

    if multi_agent:
        runners = [fr.MultiAgentEnvRunner(config=_ma_config()) for _ in range(2)]
    else:
        runners = [fr.SingleAgentEnvRunner(config=ppo_config()) for _ in range(2)]
    root = RLlibLogger(root=True)
    steps = 0
    for _ in range(2):
        results = []
        for r in runners:
            steps += sum(e.env_steps() for e in r.sample(num_timesteps=60))
            results.append(r.get_metrics())
        root.aggregate(results, key="env_runners")
    assert root.peek(("env_runners", "num_env_steps_sampled_lifetime")) == steps
    assert root.peek(("env_runners", "episode_return_mean")) > 0
    # RLlib's root reports the lifetime count's throughput, as for its own runners.
    assert "num_env_steps_sampled_lifetime_throughput" in root.compile()["env_runners"]


def test_local_runner_of_a_group_holds_no_env():
    """RLlib's rule: with remote runners, the group's local runner (index 0) has no env
    unless create_env_on_local_worker; it builds its modules from the group's spaces."""
    probe = fr.SingleAgentEnvRunner(config=ppo_config(num_env_runners=2))
    spaces = probe.get_spaces()
    local = fr.SingleAgentEnvRunner(
        config=ppo_config(num_env_runners=2), worker_index=0, num_workers=2, spaces=spaces
    )
    assert local.env is None
    assert local.module is not None
    local.set_state(probe.get_state())
    with pytest.raises(RuntimeError, match="no env"):
        local.sample(num_timesteps=1)
    with_env = fr.SingleAgentEnvRunner(
        config=ppo_config(num_env_runners=2, create_env_on_local_worker=True),
        worker_index=0,
        num_workers=2,
    )
    assert with_env.env is not None


def test_apply_and_ping():
    runner = fr.SingleAgentEnvRunner(config=ppo_config())
    assert runner.ping() == "pong"
    assert runner.apply(lambda r, x: (r.worker_index, x), 5) == (0, 5)
    # Outside a Ray actor an error in the function propagates.
    with pytest.raises(ZeroDivisionError):
        runner.apply(lambda r: 1 / 0)


def test_rllib_callbacks_run_and_its_empty_base_hooks_are_skipped():
    from ray.rllib.callbacks.callbacks import RLlibCallback

    ended = []

    class OnEnd(RLlibCallback):
        def on_episode_end(self, *, episode, **kwargs):
            ended.append(episode.id_)

    runner = fr.SingleAgentEnvRunner(config=ppo_config().callbacks(OnEnd))
    # RLlibCallback's own hooks do nothing: no per-step loop for them.
    assert not runner._has_callbacks("on_episode_step")
    assert runner._has_callbacks("on_episode_end")
    episodes = runner.sample(num_episodes=3)
    assert ended == [e.id_ for e in episodes]


def test_multi_agent_runner_needs_a_multi_agent_rllib_config():
    """As RLlib's runner: RLlib's config without multi_agent(...) is refused."""
    from ray.rllib.examples.envs.classes.multi_agent import MultiAgentCartPole

    config = AlgorithmConfig().environment(MultiAgentCartPole, env_config={"num_agents": 2})
    with pytest.raises(ValueError, match="multi_agent"):
        fr.MultiAgentEnvRunner(config=config)
    # With it, and no module to build (RLlib's base config), random actions.
    config = config.multi_agent(policies=["p0", "p1"], policy_mapping_fn=_map_agent)
    runner = fr.MultiAgentEnvRunner(config=config)
    assert runner.module is None
    episodes = runner.sample(num_timesteps=20, random_actions=True)
    assert sum(e.env_steps() for e in episodes) >= 20
