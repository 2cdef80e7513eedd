"""Module specs a RunnerConfig honours, the default modules by observation space, and the
image (CNN) default module: differential against RLlib 2.60's default PPO torch module,
and trained by fastrollout's PPO learner."""

from __future__ import annotations

import dataclasses
import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch

import fastrollout as fr
from fastrollout.core import DEFAULT_MODULE_ID, Columns
from fastrollout.env.examples import SyntheticImageEnv
from fastrollout.env.multi_agent_env import make_multi_agent
from fastrollout.learners.ppo import PPOConfig, PPOLearner
from fastrollout.modules import (
    DefaultMLPModule,
    MultiRLModule,
    MultiRLModuleSpec,
    RLModule,
    RLModuleSpec,
)
from fastrollout.modules.catalog import default_module_class
from fastrollout.modules.cnn import DefaultCNNModule, default_conv_filters


def _rllib():
    """RLlib's spec classes, default PPO module, its model config and TorchRLModule."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rl_module = pytest.importorskip("ray.rllib.core.rl_module")
        ppo = pytest.importorskip("ray.rllib.algorithms.ppo.torch.default_ppo_torch_rl_module")
        cfg = pytest.importorskip("ray.rllib.core.rl_module.default_model_config")
        torch_rl_module = pytest.importorskip("ray.rllib.core.rl_module.torch")
    return rl_module, ppo.DefaultPPOTorchRLModule, cfg.DefaultModelConfig, torch_rl_module


# ------------------------------------------------------------------------ modules whose
# actions are recognisable: every draw is model_config["action"].


def _fixed_logits(obs: torch.Tensor, n: int, action: int, bias: torch.Tensor) -> torch.Tensor:
    logits = torch.full((obs.shape[0], n), -1e4, dtype=torch.float32)
    logits[:, action] = 0.0
    return logits + bias


class FixedActionModule(RLModule):
    """Always acts ``model_config["action"]`` (fastrollout's RLModule)."""

    def setup(self) -> None:
        self.bias = torch.nn.Parameter(torch.zeros(1))

    def _forward(self, batch, **kwargs):
        action = int(self.model_config["action"])
        return {
            Columns.ACTION_DIST_INPUTS: _fixed_logits(
                batch[Columns.OBS], int(self.action_space.n), action, self.bias
            )
        }


def _rllib_fixed_module_class() -> type:
    """The same module as RLlib's TorchRLModule subclass."""
    torch_rl_module = _rllib()[3]

    class RLlibFixedActionModule(torch_rl_module.TorchRLModule):
        def setup(self):
            self.bias = torch.nn.Parameter(torch.zeros(1))

        def _forward(self, batch, **kwargs):
            action = int(self.model_config["action"])
            obs = batch["obs"]
            return {
                "action_dist_inputs": _fixed_logits(obs, self.action_space.n, action, self.bias)
            }

    return RLlibFixedActionModule


def _spec_classes(flavour: str) -> tuple[type, type]:
    if flavour == "fastrollout":
        return RLModuleSpec, MultiRLModuleSpec
    rl_module = _rllib()[0]
    return rl_module.RLModuleSpec, rl_module.MultiRLModuleSpec


def _cartpole(spec=None, **model) -> fr.RunnerConfig:
    c = fr.RunnerConfig().environment("CartPole-v1").debugging(seed=3)
    c = c.env_runners(num_envs_per_env_runner=2)
    if model:
        c = c.rl_module(model_config=model)
    if spec is not None:
        c = c.rl_module(rl_module_spec=spec)
    c.validate()
    return c


def _actions(episodes) -> np.ndarray:
    return np.concatenate([e.get_actions() for e in episodes])


def _layer_widths(module) -> list[int]:
    """The output widths of the actor encoder's linear layers."""
    state = module.get_state()
    keys = sorted(
        (k for k in state if k.startswith("encoder.actor_encoder.") and k.endswith(".weight")),
        key=lambda k: int(k.split(".")[-2]),
    )
    return [state[k].shape[0] for k in keys]


# ------------------------------------------------------------------ rl_module_spec honoured


@pytest.mark.parametrize("flavour", ["fastrollout", "rllib"])
@pytest.mark.parametrize("action", [0, 1])
def test_spec_module_class_is_the_one_that_acts(flavour, action):
    spec_cls, _ = _spec_classes(flavour)
    spec = spec_cls(module_class=FixedActionModule, model_config={"action": action})
    runner = fr.SingleAgentEnvRunner(config=_cartpole(spec))
    try:
        assert type(runner.module) is FixedActionModule
        actions = _actions(runner.sample(num_timesteps=60))
        assert len(actions) >= 60 and set(actions.tolist()) == {action}
        greedy = _actions(runner.sample(num_timesteps=20, explore=False, force_reset=True))
        assert set(greedy.tolist()) == {action}
    finally:
        runner.stop()


@pytest.mark.parametrize("via", ["rllib_spec", "fastrollout_spec", "class"])
def test_rllib_module_class_builds_rllibs_module_and_acts(via):
    rllib_cls = _rllib_fixed_module_class()
    if via != "class":
        spec_cls = _rllib()[0].RLModuleSpec if via == "rllib_spec" else RLModuleSpec
        spec = spec_cls(module_class=rllib_cls, model_config={"action": 1})
        runner = fr.SingleAgentEnvRunner(config=_cartpole(spec))
    else:  # the class alone, with the config's model_config
        runner = fr.SingleAgentEnvRunner(config=_cartpole(rllib_cls, action=1))
    try:
        assert type(runner.module) is rllib_cls and runner.module.inference_only
        assert set(_actions(runner.sample(num_timesteps=40)).tolist()) == {1}
    finally:
        runner.stop()


@pytest.mark.parametrize("flavour", ["fastrollout", "rllib"])
def test_spec_model_config_reaches_the_default_module(flavour):
    spec_cls, _ = _spec_classes(flavour)
    runner = fr.SingleAgentEnvRunner(
        config=_cartpole(spec_cls(model_config={"fcnet_hiddens": [16, 8]}))
    )
    try:
        assert type(runner.module) is DefaultMLPModule
        assert _layer_widths(runner.module) == [16, 8]
        assert runner.module.get_state()["pi.net.mlp.0.weight"].shape == (2, 8)
        assert len(runner.sample(num_timesteps=10)) > 0
    finally:
        runner.stop()
    # Without a model_config of its own, the spec takes the config's.
    runner = fr.SingleAgentEnvRunner(config=_cartpole(spec_cls(), fcnet_hiddens=[12]))
    try:
        assert _layer_widths(runner.module) == [12]
    finally:
        runner.stop()


def test_rllib_default_ppo_module_class_gets_its_model_config():
    """RLlib's DefaultPPOTorchRLModule named in a spec: its twin, with the given layers."""
    rl_module, ppo_module, _, _ = _rllib()
    spec = rl_module.RLModuleSpec(
        module_class=ppo_module, model_config={"fcnet_hiddens": [24], "vf_share_layers": False}
    )
    runner = fr.SingleAgentEnvRunner(config=_cartpole(spec))
    try:
        assert isinstance(runner.module, DefaultMLPModule)
        assert _layer_widths(runner.module) == [24]
    finally:
        runner.stop()


def _two_agents(spec, policies=None) -> fr.RunnerConfig:
    c = (
        fr.RunnerConfig()
        .environment(make_multi_agent("CartPole-v1"), env_config={"num_agents": 2})
        .debugging(seed=5)
        .rl_module(rl_module_spec=spec)
        .multi_agent(
            policy_mapping_fn=lambda agent_id, episode=None, **kw: (
                "fixed" if agent_id == 0 else "mlp"
            )
        )
    )
    if policies is not None:
        c = c.multi_agent(policies=policies)
    c.validate()
    return c


def _agent_actions(episodes, agent_id) -> list[int]:
    return [
        int(a)
        for e in episodes
        if agent_id in e.agent_episodes
        for a in e.agent_episodes[agent_id].get_actions()
    ]


@pytest.mark.parametrize("flavour", ["fastrollout", "rllib"])
def test_multi_agent_per_module_specs(flavour):
    spec_cls, multi_cls = _spec_classes(flavour)
    spec = multi_cls(
        rl_module_specs={
            "fixed": spec_cls(module_class=FixedActionModule, model_config={"action": 1}),
            "mlp": spec_cls(model_config={"fcnet_hiddens": [8]}),
        }
    )
    runner = fr.MultiAgentEnvRunner(config=_two_agents(spec))
    try:
        assert type(runner.module["fixed"]) is FixedActionModule
        assert type(runner.module["mlp"]) is DefaultMLPModule
        assert _layer_widths(runner.module["mlp"]) == [8]
        episodes = runner.sample(num_timesteps=200)
        fixed, free = _agent_actions(episodes, 0), _agent_actions(episodes, 1)
        assert len(fixed) > 50 and set(fixed) == {1}
        assert set(free) == {0, 1}  # the default module draws both actions
    finally:
        runner.stop()


def test_multi_agent_rllib_module_class_and_policies_specs():
    """An RLlib module class for one id, a spec in ``policies`` for the other."""
    rl_module = _rllib()[0]
    rllib_cls = _rllib_fixed_module_class()
    spec = rl_module.MultiRLModuleSpec(
        rl_module_specs={
            "fixed": rl_module.RLModuleSpec(module_class=rllib_cls, model_config={"action": 0}),
            "mlp": rl_module.RLModuleSpec(),
        }
    )
    runner = fr.MultiAgentEnvRunner(config=_two_agents(spec))
    try:
        assert type(runner.module["fixed"]) is rllib_cls
        assert set(_agent_actions(runner.sample(num_timesteps=100), 0)) == {0}
    finally:
        runner.stop()
    policies = {
        "fixed": RLModuleSpec(module_class=FixedActionModule, model_config={"action": 1}),
        "mlp": rl_module.RLModuleSpec(model_config={"fcnet_hiddens": [4]}),
    }
    runner = fr.MultiAgentEnvRunner(config=_two_agents(None, policies))
    try:
        assert type(runner.module["fixed"]) is FixedActionModule
        assert _layer_widths(runner.module["mlp"]) == [4]
        assert set(_agent_actions(runner.sample(num_timesteps=100), 0)) == {1}
    finally:
        runner.stop()


class _OwnMultiRLModule(MultiRLModule):
    pass


def test_multi_rl_module_class_of_a_fastrollout_spec_is_built():
    spec = MultiRLModuleSpec(
        multi_rl_module_class=_OwnMultiRLModule,
        rl_module_specs={"fixed": RLModuleSpec(), "mlp": RLModuleSpec()},
    )
    runner = fr.MultiAgentEnvRunner(config=_two_agents(spec))
    try:
        assert type(runner.module) is _OwnMultiRLModule
    finally:
        runner.stop()


class _DuckMultiSpec:
    def __init__(self) -> None:
        self.rl_module_specs = {"a": None}


@pytest.mark.parametrize(
    ("value", "match"),
    [
        (
            "garbage",
            r"rl_module_spec must be None, an RLModuleSpec .* got 'garbage' \(builtins.str\)",
        ),
        (3, r"got 3 \(builtins.int\)"),
        ({"default_policy": None}, r"got \{'default_policy': None\}"),
        (_DuckMultiSpec(), r"got <.*_DuckMultiSpec object"),
        (int, r"got <class 'int'>"),
        (RLModuleSpec(module_class=int), r"rl_module_spec.module_class must be an RLModule"),
        (
            MultiRLModuleSpec(rl_module_specs={"a": RLModuleSpec(), "b": "x"}),
            r"rl_module_spec.rl_module_specs\['b'\] must be an RLModuleSpec .* got 'x'",
        ),
    ],
)
def test_other_values_fail_validate_naming_them(value, match):
    config = fr.RunnerConfig().environment("CartPole-v1").rl_module(rl_module_spec=value)
    with pytest.raises(TypeError, match=match):
        config.validate()
    # A runner built from the unvalidated config says the same.
    with pytest.raises(TypeError, match=match):
        fr.SingleAgentEnvRunner(config=config)


def test_policies_spec_values_are_checked():
    config = fr.RunnerConfig().multi_agent(policies={"a": None, "b": "spec"})
    with pytest.raises(TypeError, match=r"policies\['b'\] must be an RLModuleSpec .* got 'spec'"):
        config.validate()


def test_rllib_spec_settings_that_cannot_be_honoured_fail_validate():
    rl_module = _rllib()[0]
    config = fr.RunnerConfig().rl_module(
        rl_module_spec=rl_module.RLModuleSpec(load_state_path="/tmp/x")
    )
    with pytest.raises(ValueError, match=r"load_state_path = '/tmp/x' is not supported"):
        config.validate()

    class OwnMulti(rl_module.MultiRLModule):
        pass

    config.rl_module(
        rl_module_spec=rl_module.MultiRLModuleSpec(
            multi_rl_module_class=OwnMulti, rl_module_specs={"a": rl_module.RLModuleSpec()}
        )
    )
    with pytest.raises(ValueError, match=r"multi_rl_module_class = OwnMulti is not supported"):
        config.validate()


# --------------------------------------------------------------- default module by space


def test_default_module_class_by_observation_space():
    act = gym.spaces.Discrete(2)
    image = gym.spaces.Box(0, 255, (42, 42, 3), np.uint8)
    assert default_module_class(image, act, {}) is DefaultCNNModule
    for space in (
        gym.spaces.Box(-1, 1, (4,), np.float32),
        gym.spaces.Box(-1, 1, (3, 4), np.float32),  # (flattened, unlike RLlib)
        gym.spaces.Discrete(3),
        gym.spaces.Dict({"a": gym.spaces.Discrete(2), "b": gym.spaces.Box(0, 1, (2,))}),
    ):
        assert default_module_class(space, act, {}) is DefaultMLPModule
    with pytest.raises(
        TypeError, match=r"no default module for the observation space Text.*rl_module_spec"
    ):
        default_module_class(gym.spaces.Text(5), act, {})
    nested = gym.spaces.Dict({"ok": gym.spaces.Discrete(2), "bad": gym.spaces.Text(3)})
    with pytest.raises(TypeError, match=r"obs\['bad'\].*rl_module_spec=RLModuleSpec"):
        RLModuleSpec(observation_space=nested, action_space=act).build()


def test_image_runner_builds_the_cnn_and_samples():
    c = (
        fr.RunnerConfig()
        .environment(SyntheticImageEnv, env_config={"shape": (10, 10, 3), "episode_len": 5})
        .debugging(seed=0)
    )
    runner = fr.SingleAgentEnvRunner(config=c)
    try:
        assert type(runner.module) is DefaultCNNModule
        assert set(runner.module.get_state()) >= {"encoder.actor_encoder.net.0.cnn.1.weight"}
        episodes = runner.sample(num_episodes=2)
        assert [len(e) for e in episodes] == [5, 5]
        assert np.isfinite(
            np.concatenate([e.get_extra_model_outputs("action_logp") for e in episodes])
        ).all()
    finally:
        runner.stop()
    c.environment(SyntheticImageEnv, env_config={"shape": (16, 16, 3)})
    with pytest.raises(
        ValueError,
        match=r"no default conv_filters .* \(16, 16, 3\).*model_config\['conv_filters'\]",
    ):
        fr.SingleAgentEnvRunner(config=c)


# ------------------------------------------------------------ DefaultCNNModule vs RLlib


def _rllib_ppo_module(obs, act, inference_only=False, **model):
    _, ppo_module, default_model_config, _ = _rllib()
    config = dataclasses.asdict(default_model_config(**{"vf_share_layers": False, **model}))
    return ppo_module(
        observation_space=obs, action_space=act, inference_only=inference_only, model_config=config
    )


CNN_CASES = {
    "42x42x3": ((42, 42, 3), {}),
    "84x84x4": ((84, 84, 4), {}),
    "64x64x3-shared": ((64, 64, 3), {"vf_share_layers": True}),
    "10x10x1-heads": ((10, 10, 1), {"head_fcnet_hiddens": [7, 5], "head_fcnet_activation": "tanh"}),
    "custom": (
        (12, 9, 2),
        {
            # non-square kernel and stride, valid padding, a kernel smaller than its stride
            "conv_filters": [[4, [3, 2], [2, 1]], [6, 3, 2, "valid"], [3, 1, 2]],
            "conv_activation": "elu",
        },
    ),
}
ACTIONS = {
    "discrete": gym.spaces.Discrete(4),
    "box": gym.spaces.Box(-1.0, 1.0, (2,), np.float32),
    "multi_discrete": gym.spaces.MultiDiscrete([3, 2]),
}


@pytest.mark.parametrize("case", sorted(CNN_CASES))
@pytest.mark.parametrize("action", sorted(ACTIONS))
def test_cnn_module_same_parameters_and_outputs_as_rllib(case, action):
    shape, model = CNN_CASES[case]
    obs, act = gym.spaces.Box(0.0, 1.0, shape, np.float32), ACTIONS[action]
    torch.manual_seed(0)
    theirs = _rllib_ppo_module(obs, act, **model)
    ours = RLModuleSpec(observation_space=obs, action_space=act, model_config=model).build()
    assert type(ours) is DefaultCNNModule
    assert list(ours.state_dict()) == list(theirs.state_dict())
    ours.load_state_dict(theirs.state_dict(), strict=True)
    x = torch.rand(5, *shape)
    for phase in ("forward_inference", "forward_exploration"):
        a = getattr(theirs, phase)({"obs": x})
        b = getattr(ours, phase)({"obs": x})
        torch.testing.assert_close(
            b[Columns.ACTION_DIST_INPUTS], a["action_dist_inputs"], rtol=0, atol=1e-5
        )
    a, b = theirs.forward_train({"obs": x}), ours.forward_train({"obs": x})
    for key in ("action_dist_inputs", "embeddings"):
        torch.testing.assert_close(b[key], a[key], rtol=0, atol=1e-5)
    values = theirs.compute_values({"obs": x})
    torch.testing.assert_close(ours.compute_values({"obs": x}), values, rtol=0, atol=1e-5)
    torch.testing.assert_close(b[Columns.VF_PREDS], values, rtol=0, atol=1e-5)
    # The value from forward_train's embeddings, as RLlib's learner computes it.
    torch.testing.assert_close(
        ours.compute_values({"obs": x}, embeddings=b[Columns.EMBEDDINGS]), values, rtol=0, atol=1e-5
    )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cnn_module_on_cuda_computes_what_it_computes_on_cpu():
    obs, act = gym.spaces.Box(0, 255, (42, 42, 3), np.uint8), gym.spaces.Discrete(3)
    module = RLModuleSpec(observation_space=obs, action_space=act).build()
    x = torch.randint(0, 256, (6, 42, 42, 3), dtype=torch.uint8)
    cpu = module.forward_train({"obs": x})
    module.to("cuda")
    tf32 = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False  # (TF32 convolutions round to ~1e-3)
    try:
        gpu = module.forward_train({"obs": x.to("cuda")})
    finally:
        torch.backends.cudnn.allow_tf32 = tf32
    for key in (Columns.ACTION_DIST_INPUTS, Columns.VF_PREDS):
        torch.testing.assert_close(gpu[key].cpu(), cpu[key], rtol=1e-4, atol=1e-3)


def test_inference_only_cnn_module_as_rllib():
    obs, act = gym.spaces.Box(0.0, 1.0, (42, 42, 3), np.float32), gym.spaces.Discrete(3)
    theirs = _rllib_ppo_module(obs, act, inference_only=True)
    ours = RLModuleSpec(observation_space=obs, action_space=act, inference_only=True).build()
    assert list(ours.state_dict()) == list(theirs.state_dict())
    ours.load_state_dict(theirs.state_dict(), strict=True)
    x = torch.rand(3, 42, 42, 3)
    torch.testing.assert_close(
        ours.forward_inference({"obs": x})[Columns.ACTION_DIST_INPUTS],
        theirs.forward_inference({"obs": x})["action_dist_inputs"],
        rtol=0,
        atol=1e-5,
    )
    full = RLModuleSpec(observation_space=obs, action_space=act).build()
    assert set(full.get_state(inference_only=True)) == set(ours.get_state())


def test_default_conv_filters_are_rllibs():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        utils = pytest.importorskip("ray.rllib.models.utils")
    for shape in [(96, 96, 3), (84, 84, 4), (64, 64, 3), (42, 42, 1), (10, 10, 3), (4, 84, 84)]:
        assert default_conv_filters(shape) == utils.get_filter_config(shape), shape
    with pytest.raises(ValueError):
        utils.get_filter_config((16, 16, 3))
    with pytest.raises(ValueError, match=r"no default conv_filters .* \(16, 16, 3\)"):
        default_conv_filters((16, 16, 3))


def test_cnn_takes_uint8_images():
    """RLlib's module fails on uint8 images; this one casts them (neither scales)."""
    obs, act = gym.spaces.Box(0, 255, (10, 10, 3), np.uint8), gym.spaces.Discrete(2)
    module = RLModuleSpec(observation_space=obs, action_space=act).build()
    x = torch.randint(0, 256, (4, 10, 10, 3), dtype=torch.uint8)
    torch.testing.assert_close(
        module.forward_train({"obs": x})[Columns.ACTION_DIST_INPUTS],
        module.forward_train({"obs": x.float()})[Columns.ACTION_DIST_INPUTS],
    )


@pytest.mark.parametrize(
    ("model", "error", "match"),
    [
        ({"conv_filters": [[16, 4]]}, ValueError, r"conv_filters'\]\[0\] must be \[out_channels"),
        ({"conv_filters": [[16, 0, 1]]}, ValueError, r"conv_filters'\]\[0\]: kernel must be"),
        (
            {"conv_filters": [[16, 3, 1, "full"]]},
            ValueError,
            r"padding must be \"same\" or \"valid\"",
        ),
        (
            {"conv_filters": [[4, 11, 1, "valid"]]},
            ValueError,
            r"conv_filters'\]\[0\] leaves no pixels",
        ),
        ({"conv_filters": "big"}, ValueError, r"conv_filters'\] must be a non-empty list"),
        ({"conv_activation": "wavy"}, ValueError, r"conv_activation'\] = 'wavy' is not one of"),
        (
            {"conv_kernel_initializer": "xavier_uniform_"},
            ValueError,
            r"not supported by DefaultCNNModule",
        ),
        (
            {"conv_size": 3},
            ValueError,
            r"unknown model_config keys for DefaultCNNModule: \['conv_size'\]",
        ),
    ],
)
def test_cnn_model_config_errors_name_the_option(model, error, match):
    obs, act = gym.spaces.Box(0.0, 1.0, (10, 10, 3), np.float32), gym.spaces.Discrete(2)
    with pytest.raises(error, match=match):
        RLModuleSpec(observation_space=obs, action_space=act, model_config=model).build()
    with pytest.raises(TypeError, match=r"DefaultCNNModule needs a 3-D Box"):
        DefaultCNNModule(observation_space=gym.spaces.Box(0, 1, (4,)), action_space=act)


def test_mlp_module_rejects_conv_options():
    """conv_filters set for a vector observation: an error, not silently unused."""
    obs, act = gym.spaces.Box(-1.0, 1.0, (4,), np.float32), gym.spaces.Discrete(2)
    with pytest.raises(ValueError, match=r"conv_filters'\] = .* not supported by DefaultMLPModule"):
        RLModuleSpec(
            observation_space=obs, action_space=act, model_config={"conv_filters": [[4, 3, 1]]}
        ).build()


# ------------------------------------------------------------------- PPO trains the CNN


def _float_image_env(config):
    """SyntheticImageEnv with its frames scaled to [0, 1] float32 (as image pipelines do)."""
    env = SyntheticImageEnv(config)
    space = gym.spaces.Box(0.0, 1.0, env.observation_space.shape, np.float32)
    return gym.wrappers.TransformObservation(env, lambda o: o.astype(np.float32) / 255.0, space)


def test_ppo_learner_trains_the_cnn_module():
    """Two frames alternate and the rewarded action alternates with them: a random policy
    earns 0.5 per step, one that reads the image 1.0. (About 12 s on one busy core; one
    torch thread, as the PPO example: on a loaded 2-core machine more threads took 10x.)"""
    env_config = {"shape": (10, 10, 3), "num_actions": 2, "num_frames": 2, "episode_len": 16}
    config = (
        fr.RunnerConfig()
        .environment(_float_image_env, env_config=env_config)
        .env_runners(num_envs_per_env_runner=4)
        .debugging(seed=0)
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    runner = fr.SingleAgentEnvRunner(config=config)
    try:
        torch.manual_seed(0)
        obs, act = runner.get_spaces()[DEFAULT_MODULE_ID]
        module = RLModuleSpec(observation_space=obs, action_space=act).build()
        assert type(module) is DefaultCNNModule and type(runner.module) is DefaultCNNModule
        learner = PPOLearner(
            {DEFAULT_MODULE_ID: module},
            PPOConfig(lr=1e-3, num_epochs=4, minibatch_size=64, gamma=0.9, seed=0),
        )
        before = learner.get_weights(inference_only=False)[DEFAULT_MODULE_ID]
        rewards, losses = [], []
        for i in range(8):
            runner.set_weights(learner.get_weights(), weights_seq_no=i + 1)
            episodes = runner.sample(num_timesteps=256)
            rewards.append(float(np.mean(np.concatenate([e.get_rewards() for e in episodes]))))
            losses.append(learner.update(episodes)[DEFAULT_MODULE_ID]["vf_loss"])
    finally:
        runner.stop()
        torch.set_num_threads(threads)
    after = learner.get_weights(inference_only=False)[DEFAULT_MODULE_ID]
    for key in (
        "encoder.actor_encoder.net.0.cnn.1.weight",
        "encoder.critic_encoder.net.0.cnn.4.weight",
        "pi.net.mlp.0.weight",
    ):
        assert not np.array_equal(before[key], after[key]), key
    assert rewards[0] < 0.7 and rewards[-1] >= 0.9, rewards
    assert losses[-1] < losses[0], losses
