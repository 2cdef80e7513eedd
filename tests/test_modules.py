"""RLModule, MultiRLModule, their specs, DefaultMLPModule (differential against RLlib's
default PPO torch module) and device placement."""

from __future__ import annotations

import dataclasses
import pickle
import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from fastrollout.core import DEFAULT_MODULE_ID, Columns
from fastrollout.modules import (
    DefaultMLPModule,
    MultiRLModule,
    MultiRLModuleSpec,
    RLModule,
    RLModuleSpec,
    TorchCategorical,
    TorchDiagGaussian,
    TorchMultiCategorical,
    resolve_device,
    to_device,
)
from fastrollout.modules.device import to_tensor


def _rllib_ppo() -> tuple[type, type]:
    """RLlib's default PPO torch module and model config.

    Imported per test, so that the tests without RLlib (the CUDA ones among them) also run
    where ray is not installed; the comparisons skip there.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ppo = pytest.importorskip("ray.rllib.algorithms.ppo.torch.default_ppo_torch_rl_module")
        cfg = pytest.importorskip("ray.rllib.core.rl_module.default_model_config")
    return ppo.DefaultPPOTorchRLModule, cfg.DefaultModelConfig


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
OBS = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
ACTION_SPACES = {
    "discrete": gym.spaces.Discrete(3),
    "box": gym.spaces.Box(-2.0, 2.0, (2,), np.float32),
    "multi_discrete": gym.spaces.MultiDiscrete([3, 2]),
}


def _rllib(action_space, inference_only=False, **cfg):
    DefaultPPOTorchRLModule, DefaultModelConfig = _rllib_ppo()
    config = dataclasses.asdict(DefaultModelConfig(vf_share_layers=False, **cfg))
    return DefaultPPOTorchRLModule(
        observation_space=OBS,
        action_space=action_space,
        inference_only=inference_only,
        model_config=config,
    )


# -- DefaultMLPModule vs RLlib ------------------------------------------------------------


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("action", sorted(ACTION_SPACES))
def test_default_module_same_layers_and_outputs_as_rllib(action, shared):
    space = ACTION_SPACES[action]
    DefaultPPOTorchRLModule, DefaultModelConfig = _rllib_ppo()
    ref = DefaultPPOTorchRLModule(
        observation_space=OBS,
        action_space=space,
        model_config=dataclasses.asdict(DefaultModelConfig(vf_share_layers=shared)),
    )
    ours = DefaultMLPModule(
        observation_space=OBS, action_space=space, model_config={"vf_share_layers": shared}
    )
    state = ref.get_state()
    assert {k: v.shape for k, v in ours.get_state().items()} == {
        k: v.shape for k, v in state.items()
    }
    assert set(ours.get_state(inference_only=True)) == set(ref.get_state(inference_only=True))
    ours.set_state(state)
    batch = {Columns.OBS: torch.randn(6, 4)}
    for fwd in ("forward_inference", "forward_exploration"):
        torch.testing.assert_close(
            getattr(ours, fwd)(batch)[Columns.ACTION_DIST_INPUTS],
            getattr(ref, fwd)(batch)[Columns.ACTION_DIST_INPUTS],
        )
    out, ref_out = ours.forward_train(batch), ref.forward_train(batch)
    torch.testing.assert_close(out[Columns.ACTION_DIST_INPUTS], ref_out[Columns.ACTION_DIST_INPUTS])
    torch.testing.assert_close(out[Columns.EMBEDDINGS], ref_out[Columns.EMBEDDINGS])
    torch.testing.assert_close(out[Columns.VF_PREDS], ref.compute_values(batch))
    torch.testing.assert_close(ours.compute_values(batch), ref.compute_values(batch))
    assert (
        ours.get_inference_action_dist_cls().__name__
        == (ref.get_inference_action_dist_cls().__name__)
        or action == "multi_discrete"
    )


@pytest.mark.parametrize("shared", [False, True])
def test_default_module_layer_by_layer_forward_is_the_wrapped_one(shared):
    """``_forward`` calls the actor's layers one by one (skipping the wrappers' calls)
    only while that is the same: a hook on a wrapper, a replaced layer or a head that
    post-processes is honoured, and the outputs equal the wrapped path's."""
    m = DefaultMLPModule(
        observation_space=OBS,
        action_space=ACTION_SPACES["discrete"],
        model_config={"vf_share_layers": shared, "head_fcnet_hiddens": [8]},
    )
    obs = torch.randn(5, 4)

    def wrapped() -> torch.Tensor:
        return m.pi(m._actor_latent(obs))

    with torch.no_grad():
        assert m._plain_actor_layers() is not None
        torch.testing.assert_close(
            m._forward({Columns.OBS: obs})[Columns.ACTION_DIST_INPUTS], wrapped()
        )
        calls = []
        encoder = m.encoder.encoder if shared else m.encoder.actor_encoder
        for wrapper in (encoder, encoder.net, m.pi, m.pi.net.mlp):
            handle = wrapper.register_forward_hook(lambda *a: calls.append(1))
            assert m._plain_actor_layers() is None
            m.forward_inference({Columns.OBS: obs})
            handle.remove()
        assert len(calls) == 4
        m.pi.net.mlp[0] = torch.nn.Linear(256, 8)
        torch.testing.assert_close(
            m._forward({Columns.OBS: obs})[Columns.ACTION_DIST_INPUTS], wrapped()
        )
    gaussian = DefaultMLPModule(observation_space=OBS, action_space=ACTION_SPACES["box"])
    assert gaussian._plain_actor_layers() is None  # log-std clipping happens in the head


def test_run_layers_is_the_sequential_forward_and_honours_layer_hooks():
    """``run_layers`` gives ``nn.Sequential``'s output bit for bit (the layers it runs
    directly and those it calls), and calls a layer through ``nn.Module.__call__``
    whenever that does more than forward: hooks on the layer, a compiled layer."""
    from fastrollout.modules.default import run_layers

    torch.manual_seed(0)
    layers = [
        torch.nn.Linear(4, 16),
        torch.nn.Tanh(),
        torch.nn.Linear(16, 16, bias=False),
        torch.nn.ReLU(),
        torch.nn.Linear(16, 8),
        torch.nn.ReLU(inplace=True),
        torch.nn.ELU(),
        torch.nn.Linear(8, 3),
    ]
    x = torch.randn(5, 4)
    with torch.no_grad():
        assert torch.equal(run_layers(layers, x), torch.nn.Sequential(*layers)(x))
        calls = []
        layers[0].register_forward_pre_hook(lambda mod, args: (args[0] * 2,))
        layers[1].register_forward_hook(lambda *a: calls.append("tanh"))
        layers[3].register_forward_hook(lambda *a: calls.append("relu"))
        compiled = layers[4]

        def compiled_call(*args, **kwargs):
            calls.append("compiled")
            return compiled.forward(*args)

        compiled._compiled_call_impl = compiled_call
        out = run_layers(layers, x)
        assert calls == ["tanh", "relu", "compiled"]
        calls.clear()
        assert torch.equal(out, torch.nn.Sequential(*layers)(x))
        assert calls == ["tanh", "relu", "compiled"]


def test_default_module_default_shape_is_rllib_ppo():
    m = DefaultMLPModule(observation_space=OBS, action_space=gym.spaces.Discrete(2))
    shapes = {k: v.shape for k, v in m.get_state().items()}
    assert shapes["encoder.actor_encoder.net.mlp.0.weight"] == (256, 4)
    assert shapes["encoder.actor_encoder.net.mlp.2.weight"] == (256, 256)
    assert shapes["encoder.critic_encoder.net.mlp.2.weight"] == (256, 256)
    assert shapes["pi.net.mlp.0.weight"] == (2, 256)
    assert shapes["vf.net.mlp.0.weight"] == (1, 256)
    assert isinstance(m.encoder.actor_encoder.net.mlp[1], torch.nn.Tanh)
    ref = _rllib(gym.spaces.Discrete(2))
    assert {k: v.shape for k, v in ref.get_state().items()} == shapes


def test_inference_only_module_as_rllib():
    space = ACTION_SPACES["box"]
    ours = DefaultMLPModule(observation_space=OBS, action_space=space, inference_only=True)
    ref = _rllib(space, inference_only=True)
    assert set(ours.get_state()) == set(ref.get_state())
    assert not hasattr(ours, "vf") and not hasattr(ours.encoder, "critic_encoder")
    # A full module's state loads into an inference-only one after dropping the vf keys,
    # and an inference-only state loads into a full module.
    full = DefaultMLPModule(observation_space=OBS, action_space=space)
    ours.set_state(full.get_state(inference_only=True))
    full.set_state(ours.get_state())
    batch = {Columns.OBS: torch.randn(3, 4)}
    torch.testing.assert_close(
        ours.forward_inference(batch)[Columns.ACTION_DIST_INPUTS],
        full.forward_inference(batch)[Columns.ACTION_DIST_INPUTS],
    )
    with pytest.raises(RuntimeError, match="inference_only"):
        ours.forward_train(batch)
    with pytest.raises(RuntimeError, match="inference_only"):
        ours.compute_values(batch)
    with pytest.raises(ValueError, match="does not have"):
        ours.set_state(full.get_state())


def test_log_std_clipped_like_rllib():
    m = DefaultMLPModule(observation_space=OBS, action_space=ACTION_SPACES["box"])
    with torch.no_grad():
        m.pi.net.mlp[0].bias.fill_(100.0)
    out = m.forward_inference({Columns.OBS: torch.zeros(2, 4)})[Columns.ACTION_DIST_INPUTS]
    assert torch.all(out[:, :2] > 50) and torch.all(out[:, 2:] == 20.0)


def test_free_log_std():
    m = DefaultMLPModule(
        observation_space=OBS,
        action_space=ACTION_SPACES["box"],
        model_config={"free_log_std": True},
    )
    with torch.no_grad():
        m.pi.log_std.copy_(torch.tensor([0.5, 30.0]))
    out = m.forward_inference({Columns.OBS: torch.randn(3, 4)})[Columns.ACTION_DIST_INPUTS]
    assert out.shape == (3, 4)
    torch.testing.assert_close(out[:, 2:], torch.tensor([[0.5, 20.0]]).expand(3, 2))
    with pytest.raises(ValueError, match="free_log_std"):
        DefaultMLPModule(
            observation_space=OBS,
            action_space=gym.spaces.Discrete(2),
            model_config={"free_log_std": True},
        )


@pytest.mark.parametrize(
    ("space", "batch_obs", "in_dim"),
    [
        (gym.spaces.Box(0, 255, (3, 2, 2), np.uint8), np.zeros((5, 3, 2, 2), np.uint8), 12),
        (gym.spaces.Discrete(5, start=2), np.array([2, 3, 6, 4, 2]), 5),
        (gym.spaces.MultiDiscrete([2, 3]), np.array([[0, 2]] * 5), 5),
        (gym.spaces.MultiBinary(3), np.ones((5, 3), np.int8), 3),
        (
            gym.spaces.Dict({"a": gym.spaces.Discrete(2), "b": gym.spaces.Box(-1, 1, (3,))}),
            {"a": np.array([0, 1, 1, 0, 1]), "b": np.zeros((5, 3), np.float32)},
            5,
        ),
        (
            gym.spaces.Tuple((gym.spaces.Box(-1, 1, (2,)), gym.spaces.Discrete(3))),
            (np.zeros((5, 2), np.float32), np.array([0, 1, 2, 0, 1])),
            5,
        ),
    ],
)
def test_default_module_observation_spaces(space, batch_obs, in_dim):
    m = DefaultMLPModule(
        observation_space=space,
        action_space=gym.spaces.Discrete(2),
        model_config={"fcnet_hiddens": [8]},
    )
    assert m.encoder.actor_encoder.net.mlp[0].in_features == in_dim
    out = m.forward_exploration({Columns.OBS: to_device(batch_obs, "cpu")})
    assert out[Columns.ACTION_DIST_INPUTS].shape == (5, 2)
    assert m.compute_values({Columns.OBS: to_device(batch_obs, "cpu")}).shape == (5,)


def test_discrete_observation_is_one_hot():
    m = DefaultMLPModule(
        observation_space=gym.spaces.Discrete(3),
        action_space=gym.spaces.Discrete(2),
        model_config={"fcnet_hiddens": [], "fcnet_activation": "linear"},
    )
    with torch.no_grad():
        m.pi.net.mlp[0].weight.copy_(torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]]))
        m.pi.net.mlp[0].bias.zero_()
    out = m.forward_inference({Columns.OBS: torch.tensor([2, 0])})[Columns.ACTION_DIST_INPUTS]
    assert out[:, 0].tolist() == [3.0, 1.0]


def test_model_config_options_and_errors():
    m = DefaultMLPModule(
        observation_space=OBS,
        action_space=gym.spaces.Discrete(2),
        model_config={
            "fcnet_hiddens": [16, 8],
            "fcnet_activation": "relu",
            "head_fcnet_hiddens": [5],
            "head_fcnet_activation": "tanh",
        },
    )
    assert [type(x).__name__ for x in m.encoder.actor_encoder.net.mlp] == [
        "Linear",
        "ReLU",
        "Linear",
        "ReLU",
    ]
    assert [type(x).__name__ for x in m.pi.net.mlp] == ["Linear", "Tanh", "Linear"]
    # RLlib's full DefaultModelConfig passes (its unsupported options are at their defaults).
    DefaultMLPModule(
        observation_space=OBS,
        action_space=gym.spaces.Discrete(2),
        model_config=_rllib_ppo()[1](),
    )
    with pytest.raises(ValueError, match="fcnet_hidens"):
        DefaultMLPModule(
            observation_space=OBS,
            action_space=gym.spaces.Discrete(2),
            model_config={"fcnet_hidens": [2]},
        )
    with pytest.raises(ValueError, match="fcnet_activation"):
        DefaultMLPModule(
            observation_space=OBS,
            action_space=gym.spaces.Discrete(2),
            model_config={"fcnet_activation": "nope"},
        )
    with pytest.raises(ValueError, match="use_lstm"):
        DefaultMLPModule(
            observation_space=OBS,
            action_space=gym.spaces.Discrete(2),
            model_config={"use_lstm": True},
        )
    with pytest.raises(TypeError, match="model_config"):
        DefaultMLPModule(
            observation_space=OBS, action_space=gym.spaces.Discrete(2), model_config=[1]
        )
    with pytest.raises(TypeError, match="observation space"):
        DefaultMLPModule(observation_space=gym.spaces.Text(5), action_space=gym.spaces.Discrete(2))
    with pytest.raises(TypeError, match="action distribution"):
        DefaultMLPModule(observation_space=OBS, action_space=gym.spaces.MultiBinary(2))
    m2 = DefaultMLPModule(observation_space=OBS, action_space=gym.spaces.Discrete(2))
    with pytest.raises(KeyError, match="obs"):
        m2.forward_inference({"observations": torch.zeros(1, 4)})


def test_dist_classes_per_action_space():
    def build(space):
        return DefaultMLPModule(
            observation_space=OBS, action_space=space, model_config={"fcnet_hiddens": [4]}
        )

    assert build(ACTION_SPACES["discrete"]).get_inference_action_dist_cls() is TorchCategorical
    assert build(ACTION_SPACES["box"]).get_exploration_action_dist_cls() is TorchDiagGaussian
    cls = build(ACTION_SPACES["multi_discrete"]).get_train_action_dist_cls()
    assert issubclass(cls, TorchMultiCategorical) and cls.input_lens == (3, 2)


# -- RLModule base -------------------------------------------------------------------------


class _Linear(RLModule):
    def setup(self):
        self.net = torch.nn.Linear(self.observation_space.shape[0], self.action_space.n)

    def _forward(self, batch, **kwargs):
        return {Columns.ACTION_DIST_INPUTS: self.net(batch[Columns.OBS])}


class _TwoPhases(_Linear):
    def _forward_exploration(self, batch, **kwargs):
        return {Columns.ACTIONS: torch.zeros(len(batch[Columns.OBS]), dtype=torch.long)}


def test_custom_module_phases_modes_and_grad():
    m = _TwoPhases(observation_space=OBS, action_space=gym.spaces.Discrete(3))
    x = {Columns.OBS: torch.randn(2, 4)}
    assert Columns.ACTIONS in m.forward_exploration(x)
    m.train()
    out = m.forward_inference(x)
    assert not out[Columns.ACTION_DIST_INPUTS].requires_grad and m.training  # mode restored
    m.eval()
    out = m.forward_train(x)
    assert out[Columns.ACTION_DIST_INPUTS].requires_grad and m.training
    assert m(x)[Columns.ACTION_DIST_INPUTS].shape == (2, 3)
    assert m.unwrapped() is m and not m.is_stateful() and m.get_initial_state() == {}
    assert m.device == torch.device("cpu")
    m.to(torch.device("meta"))  # the remembered tensor follows the module
    assert m.device == torch.device("meta")


def test_module_without_forward_says_what_to_implement():
    class Empty(RLModule):
        pass

    m = Empty(observation_space=OBS, action_space=gym.spaces.Discrete(2), model_config=None)
    with pytest.raises(NotImplementedError, match="_forward"):
        m.forward_inference({Columns.OBS: torch.zeros(1, 4)})
    assert m.model_config == {} and m.device == torch.device("cpu")
    with pytest.raises(ValueError, match="both"):
        Empty(observation_space=OBS, inference_only=True, learner_only=True)
    with pytest.raises(TypeError, match="action_space"):
        Empty(observation_space=OBS).get_inference_action_dist_cls()


@given(seed=st.integers(0, 2**16), scale=st.floats(0.1, 10.0))
def test_state_round_trip_numpy_and_pickle(seed, scale):
    torch.manual_seed(seed)
    a = DefaultMLPModule(
        observation_space=OBS,
        action_space=gym.spaces.Discrete(2),
        model_config={"fcnet_hiddens": [8]},
    )
    b = DefaultMLPModule(
        observation_space=OBS,
        action_space=gym.spaces.Discrete(2),
        model_config={"fcnet_hiddens": [8]},
    )
    state = {k: v * scale for k, v in a.get_state().items()}
    assert all(isinstance(v, np.ndarray) for v in state.values())
    b.set_state(pickle.loads(pickle.dumps(state)))
    for k, v in b.get_state().items():
        np.testing.assert_array_equal(v, state[k])


def test_get_state_is_a_copy_and_filters():
    m = DefaultMLPModule(
        observation_space=OBS,
        action_space=gym.spaces.Discrete(2),
        model_config={"fcnet_hiddens": [8]},
    )
    state = m.get_state()
    state["pi.net.mlp.0.bias"][:] = 123.0
    assert not np.any(m.get_state()["pi.net.mlp.0.bias"] == 123.0)
    assert set(m.get_state(components="pi")) == {
        "pi.net.mlp.0.weight",
        "pi.net.mlp.0.bias",
        "pi.log_std_clip_param_const",
    }
    assert not any(k.startswith("encoder") for k in m.get_state(not_components=["encoder"]))


def test_set_state_errors_leave_module_unchanged():
    m = DefaultMLPModule(
        observation_space=OBS,
        action_space=gym.spaces.Discrete(2),
        model_config={"fcnet_hiddens": [8]},
    )
    before = m.get_state()
    bad = dict(before)
    bad["pi.net.mlp.0.bias"] = np.zeros(5, np.float32)
    bad["vf.net.mlp.0.bias"] = np.full(1, 9.0, np.float32)
    with pytest.raises(ValueError, match=r"pi\.net\.mlp\.0\.bias.*\(5,\).*\(2,\)"):
        m.set_state(bad)
    missing = dict(before)
    del missing["encoder.actor_encoder.net.mlp.0.weight"]
    with pytest.raises(ValueError, match=r"missing keys.*actor_encoder"):
        m.set_state(missing)
    for k, v in m.get_state().items():
        np.testing.assert_array_equal(v, before[k])


# -- specs -----------------------------------------------------------------------------------


def test_rl_module_spec_build_and_errors():
    spec = RLModuleSpec(
        observation_space=OBS,
        action_space=gym.spaces.Discrete(2),
        model_config={"fcnet_hiddens": [4]},
    )
    m = spec.build()
    assert isinstance(m, DefaultMLPModule) and m.model_config == {"fcnet_hiddens": [4]}
    spec2 = RLModuleSpec.from_module(m)
    assert (
        spec2.module_class is DefaultMLPModule
        and spec2.build().get_state().keys() == m.get_state().keys()
    )
    custom = RLModuleSpec(
        module_class=_Linear,
        observation_space=OBS,
        action_space=gym.spaces.Discrete(2),
        inference_only=True,
    ).build()
    assert isinstance(custom, _Linear) and custom.inference_only
    with pytest.raises(ValueError, match="observation_space"):
        RLModuleSpec(action_space=gym.spaces.Discrete(2)).build()
    with pytest.raises(ValueError, match="action_space"):
        RLModuleSpec(observation_space=OBS).build()
    with pytest.raises(TypeError, match="RLModule subclass"):
        RLModuleSpec(
            module_class=dict, observation_space=OBS, action_space=gym.spaces.Discrete(2)
        ).build()
    with pytest.raises(TypeError, match="RLModule"):
        RLModuleSpec.from_module(object())
    base = RLModuleSpec(observation_space=OBS)
    base.update(RLModuleSpec(action_space=gym.spaces.Discrete(2), inference_only=True))
    assert (
        base.observation_space is OBS
        and base.action_space == gym.spaces.Discrete(2)
        and base.inference_only
    )
    base.update(RLModuleSpec(observation_space=gym.spaces.Discrete(3)), override=False)
    assert base.observation_space is OBS
    with pytest.raises(TypeError):
        base.update({"a": 1})
    multi = base.as_multi_rl_module_spec()
    assert list(multi.rl_module_specs) == [DEFAULT_MODULE_ID]
    assert list(m.as_multi_rl_module()) == [DEFAULT_MODULE_ID]


def _specs():
    return {
        "a": RLModuleSpec(
            observation_space=OBS,
            action_space=gym.spaces.Discrete(2),
            model_config={"fcnet_hiddens": [4]},
        ),
        "b": RLModuleSpec(
            observation_space=OBS,
            action_space=ACTION_SPACES["box"],
            model_config={"fcnet_hiddens": [4]},
        ),
    }


def test_multi_rl_module_forward_and_state():
    multi = MultiRLModuleSpec(rl_module_specs=_specs()).build()
    assert isinstance(multi, MultiRLModule) and sorted(multi) == ["a", "b"] and len(multi) == 2
    assert "a" in multi and "c" not in multi and isinstance(multi["b"], DefaultMLPModule)
    batch = {"b": {Columns.OBS: torch.zeros(3, 4)}}
    for fwd in ("forward_inference", "forward_exploration", "forward_train"):
        out = getattr(multi, fwd)(batch)
        assert list(out) == ["b"] and out["b"][Columns.ACTION_DIST_INPUTS].shape == (3, 4)
    state = multi.get_state()
    assert set(state) == {"a", "b"} and set(multi.get_state(components="a")) == {"a"}
    assert set(multi.get_state(not_components=["a"])) == {"b"}
    assert not any(k.startswith("vf") for k in multi.get_state(inference_only=True)["a"])
    other = MultiRLModuleSpec(rl_module_specs=_specs()).build()
    other.set_state(state)
    for mid in state:
        for k, v in other.get_state()[mid].items():
            np.testing.assert_array_equal(v, state[mid][k])
    with pytest.raises(KeyError, match="'c'"):
        multi.forward_exploration({"c": {Columns.OBS: torch.zeros(1, 4)}})
    with pytest.raises(KeyError, match="unknown module"):
        multi.set_state({"c": {}})
    with pytest.raises(TypeError, match="keyed by module id"):
        multi.forward_inference([1])
    assert multi.to("cpu") is multi and "MultiRLModule" in repr(multi)
    assert multi.foreach_module(lambda mid, m: mid, return_dict=True) == {"a": "a", "b": "b"}


def test_multi_rl_module_editing_and_spec():
    multi = MultiRLModule(
        rl_modules={"x": _Linear(observation_space=OBS, action_space=gym.spaces.Discrete(2))}
    )
    with pytest.raises(ValueError, match="already exists"):
        multi.add_module("x", multi["x"])
    multi.add_module(
        "x", _Linear(observation_space=OBS, action_space=gym.spaces.Discrete(2)), override=True
    )
    with pytest.raises(TypeError, match="RLModule"):
        multi.add_module("y", torch.nn.Linear(2, 2))
    multi.remove_module("x")
    assert len(multi) == 0
    multi.remove_module("x", raise_err_if_not_found=False)
    with pytest.raises(KeyError):
        multi.remove_module("x")
    with pytest.raises(TypeError, match="RLModuleSpec"):
        MultiRLModule(rl_module_specs={"a": 1})
    spec = MultiRLModuleSpec(rl_module_specs=_specs(), inference_only=True)
    built = spec.build()
    assert all(m.inference_only for m in built.values())
    assert (
        isinstance(spec.build("a"), DefaultMLPModule) and spec.module_specs is spec.rl_module_specs
    )
    with pytest.raises(KeyError, match="no spec"):
        spec.build("zz")
    spec.add_modules({"c": _specs()["a"]})
    spec.remove_modules("a")
    assert sorted(spec.rl_module_specs) == ["b", "c"]
    with pytest.raises(TypeError, match="dict"):
        MultiRLModuleSpec(rl_module_specs=_specs()["a"])


# -- device ----------------------------------------------------------------------------------


def test_resolve_device_cpu_and_errors():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device(torch.device("cpu")) == torch.device("cpu")
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device("auto").type == expected and resolve_device(None).type == expected
    with pytest.raises(ValueError, match="unknown device"):
        resolve_device("gpu0")
    with pytest.raises(ValueError, match="only 'cpu' and 'cuda'"):
        resolve_device("meta")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            resolve_device("cuda")


def test_to_device_cpu_tree():
    readonly = np.arange(4, dtype=np.float64)
    readonly.setflags(write=False)
    tree = {
        "a": np.zeros((2, 3), np.float32),
        "b": [readonly, (np.array([1, 2]), None)],
        "c": torch.ones(2, dtype=torch.float64),
        "d": np.arange(6, dtype=np.float32).reshape(2, 3)[:, ::2],
    }
    out = to_device(tree, "cpu")
    assert out["a"].dtype == torch.float32 and out["a"].shape == (2, 3)
    assert out["b"][0].dtype == torch.float32 and out["b"][1][0].dtype == torch.int64
    assert out["b"][1][1] is None and isinstance(out["b"][1], tuple)
    assert out["c"].dtype == torch.float32
    assert out["d"].tolist() == [[0.0, 2.0], [3.0, 5.0]]
    shared = np.zeros(3, np.float32)
    to_tensor(shared)[0] = 7.0  # writable float32 arrays are shared, not copied
    assert shared[0] == 7.0
    with pytest.raises(TypeError, match=r"'x/0'.*object"):
        to_device({"x": [np.array(["a"], dtype=object)]}, None)


@CUDA
def test_to_device_cuda_pinned_non_blocking():
    dev = resolve_device("cuda")
    out = to_device({"obs": np.ones((4, 3), np.float32)}, dev)
    assert out["obs"].device.type == "cuda"
    torch.testing.assert_close(out["obs"].cpu(), torch.ones(4, 3))
    m = DefaultMLPModule(observation_space=OBS, action_space=gym.spaces.Discrete(2)).to(dev)
    assert m.device.type == "cuda"
    state = m.get_state()
    assert all(isinstance(v, np.ndarray) for v in state.values())
    m.set_state(state)
    res = m.forward_exploration({Columns.OBS: to_device(np.zeros((2, 4), np.float32), dev)})
    assert res[Columns.ACTION_DIST_INPUTS].device.type == "cuda"
