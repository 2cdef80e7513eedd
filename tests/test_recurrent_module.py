"""DefaultLSTMModule: differential tests against RLlib 2.60's recurrent PPO module, the
time-axis contract, the catalog's choice and the model config.

(PPO on sequences is in tests/test_ppo_recurrent.py.)
"""

from __future__ import annotations

import dataclasses
import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch

from fastrollout import RunnerConfig, SingleAgentEnvRunner
from fastrollout.core import Columns
from fastrollout.core.tree import leaves, tree_map
from fastrollout.modules import (
    DefaultLSTMModule,
    DefaultMLPModule,
    RLModuleSpec,
    TorchCategorical,
    TorchDiagGaussian,
)
from fastrollout.modules.catalog import default_module_class

OBS = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
ACTION_SPACES = {
    "discrete": gym.spaces.Discrete(3),
    "box": gym.spaces.Box(-2.0, 2.0, (2,), np.float32),
}
SMALL = {"lstm_cell_size": 16, "fcnet_hiddens": [32, 8], "max_seq_len": 5}


def _rllib_module(action_space, **model_config):
    """RLlib's default PPO torch module, built as RLlib's learner builds it."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ppo = pytest.importorskip("ray.rllib.algorithms.ppo.torch.default_ppo_torch_rl_module")
        catalog = pytest.importorskip("ray.rllib.algorithms.ppo.ppo_catalog")
        cfg = pytest.importorskip("ray.rllib.core.rl_module.default_model_config")
        spec = pytest.importorskip("ray.rllib.core.rl_module.rl_module")
        inference_only = model_config.pop("inference_only", False)
        return spec.RLModuleSpec(
            module_class=ppo.DefaultPPOTorchRLModule,
            catalog_class=catalog.PPOCatalog,
            observation_space=OBS,
            action_space=action_space,
            inference_only=inference_only,
            model_config=dataclasses.asdict(cfg.DefaultModelConfig(**model_config)),
        ).build()


def _batched(state, n, generator=None):
    """``state`` (no batch axis) repeated ``n`` times, plus noise if ``generator``."""

    def one(s):
        out = s.unsqueeze(0).repeat(n, *([1] * s.dim()))
        if generator is not None:
            out = out + torch.randn(out.shape, generator=generator)
        return out

    return tree_map(one, state)


def _assert_tree_close(actual, expected, atol=1e-6):
    assert type(actual) is type(expected)
    if isinstance(expected, dict):
        assert sorted(actual) == sorted(expected)
        for key in expected:
            _assert_tree_close(actual[key], expected[key], atol)
    else:
        torch.testing.assert_close(actual, expected, rtol=0.0, atol=atol)


# -- against RLlib -------------------------------------------------------------------------


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("action", sorted(ACTION_SPACES))
def test_same_parameters_state_and_outputs_as_rllib(action, shared):
    """RLlib's state dict loads with strict=True; every forward, the state out and the
    values agree to 1e-6 over batches of sequences with random states in."""
    space = ACTION_SPACES[action]
    config = {**SMALL, "use_lstm": True, "vf_share_layers": shared}
    ref = _rllib_module(space, **config)
    ours = RLModuleSpec(observation_space=OBS, action_space=space, model_config=config).build()
    assert type(ours) is DefaultLSTMModule
    ours.load_state_dict(ref.state_dict(), strict=True)
    assert ours.is_stateful() and ref.is_stateful()
    _assert_tree_close(ours.get_initial_state(), ref.get_initial_state(), atol=0.0)
    g = torch.Generator().manual_seed(0)
    for b, t in ((1, 1), (3, 1), (4, 7)):
        batch = {
            Columns.OBS: torch.randn(b, t, 4, generator=g),
            Columns.STATE_IN: _batched(ref.get_initial_state(), b, g),
        }
        for fwd in ("forward_inference", "forward_exploration", "forward_train"):
            out, ref_out = getattr(ours, fwd)(batch), getattr(ref, fwd)(batch)
            assert set(ref_out) <= set(out)
            for key in ref_out:
                _assert_tree_close(out[key], ref_out[key])
            assert out[Columns.ACTION_DIST_INPUTS].shape[:2] == (b, t)
        train = ours.forward_train(batch)
        values = ref.compute_values(batch)
        assert values.shape == (b, t)
        _assert_tree_close(train[Columns.VF_PREDS], values)
        _assert_tree_close(ours.compute_values(batch), values)
        _assert_tree_close(ours.compute_values(batch, train[Columns.EMBEDDINGS]), values)
    dist = ours.get_inference_action_dist_cls()
    assert dist is (TorchCategorical if action == "discrete" else TorchDiagGaussian)


@pytest.mark.parametrize("shared", [False, True])
def test_stepping_one_step_at_a_time_is_the_sequence_forward(shared):
    """Feeding each step's state out back in (what a runner does) gives the outputs of
    one pass over the whole sequence, also across sequences that start mid-way from a
    carried state."""
    torch.manual_seed(1)
    ours = DefaultLSTMModule(
        observation_space=OBS,
        action_space=ACTION_SPACES["discrete"],
        model_config={**SMALL, "vf_share_layers": shared},
    )
    ref = _rllib_module(ACTION_SPACES["discrete"], **SMALL, use_lstm=True, vf_share_layers=shared)
    ref.load_state_dict(ours.state_dict(), strict=True)
    obs = torch.randn(2, 9, 4)
    state = _batched(ours.get_initial_state(), 2)
    stepped, ref_stepped = [], []
    ref_state = state
    for t in range(9):
        out = ours.forward_exploration({Columns.OBS: obs[:, t : t + 1], Columns.STATE_IN: state})
        ref_out = ref.forward_exploration(
            {Columns.OBS: obs[:, t : t + 1], Columns.STATE_IN: ref_state}
        )
        stepped.append(out[Columns.ACTION_DIST_INPUTS])
        ref_stepped.append(ref_out[Columns.ACTION_DIST_INPUTS])
        state, ref_state = out[Columns.STATE_OUT], ref_out[Columns.STATE_OUT]
        if t == 3:
            carried = state
    whole = ours.forward_train(
        {Columns.OBS: obs, Columns.STATE_IN: _batched(ours.get_initial_state(), 2)}
    )
    torch.testing.assert_close(
        torch.cat(stepped, 1), whole[Columns.ACTION_DIST_INPUTS], rtol=0, atol=1e-6
    )
    torch.testing.assert_close(
        torch.cat(ref_stepped, 1), whole[Columns.ACTION_DIST_INPUTS], rtol=0, atol=1e-6
    )
    _assert_tree_close(whole[Columns.STATE_OUT], state)
    tail = ours.forward_train({Columns.OBS: obs[:, 4:], Columns.STATE_IN: carried})
    torch.testing.assert_close(
        tail[Columns.ACTION_DIST_INPUTS],
        whole[Columns.ACTION_DIST_INPUTS][:, 4:],
        rtol=0,
        atol=1e-6,
    )
    torch.testing.assert_close(
        tail[Columns.VF_PREDS], whole[Columns.VF_PREDS][:, 4:], rtol=0, atol=1e-6
    )


def test_default_shape_is_rllib_default_model_config():
    ours = DefaultLSTMModule(observation_space=OBS, action_space=gym.spaces.Discrete(2))
    ref = _rllib_module(gym.spaces.Discrete(2), use_lstm=True, vf_share_layers=False)
    assert {k: v.shape for k, v in ours.get_state().items()} == {
        k: v.shape for k, v in ref.get_state().items()
    }
    assert ours.model_config["max_seq_len"] == 20 == ref.model_config["max_seq_len"]
    assert ours.get_initial_state()["actor"]["h"].shape == (1, 256)


def test_inference_only_weights_carry_the_critic_encoder_unlike_rllib():
    """RLlib deviation: without shared layers the critic's recurrent state is part of
    what a runner carries and records (STATE_OUT), yet RLlib's inference-only weights
    leave the critic's encoder out, so an RLlib runner advances the critic's state with
    the weights it was built with, never the learner's. Here acting weights include it."""
    space = ACTION_SPACES["discrete"]
    config = {**SMALL, "use_lstm": True, "vf_share_layers": False}
    learner_ref = _rllib_module(space, **config)
    runner_ref = _rllib_module(space, **config, inference_only=True)
    runner_ref.set_state(learner_ref.get_state(inference_only=True))
    assert not any(
        k.startswith("encoder.critic_encoder") for k in learner_ref.get_state(inference_only=True)
    )
    assert not torch.equal(
        runner_ref.state_dict()["encoder.critic_encoder.lstm.weight_hh_l0"],
        learner_ref.state_dict()["encoder.critic_encoder.lstm.weight_hh_l0"],
    )

    learner = DefaultLSTMModule(observation_space=OBS, action_space=space, model_config=config)
    runner = DefaultLSTMModule(
        observation_space=OBS, action_space=space, model_config=config, inference_only=True
    )
    weights = learner.get_state(inference_only=True)
    assert any(k.startswith("encoder.critic_encoder") for k in weights)
    assert not any(k.startswith("vf.") for k in weights)
    assert not hasattr(runner, "vf")
    runner.set_state(weights)
    batch = {
        Columns.OBS: torch.randn(2, 3, 4),
        Columns.STATE_IN: _batched(learner.get_initial_state(), 2),
    }
    _assert_tree_close(
        runner.forward_exploration(batch)[Columns.STATE_OUT],
        learner.forward_exploration(batch)[Columns.STATE_OUT],
        atol=0.0,
    )
    with pytest.raises(RuntimeError, match="inference_only"):
        runner.compute_values(batch)


# -- the catalog, the config and errors ------------------------------------------------------


def test_catalog_and_runner_config_choose_the_lstm_module():
    assert (
        default_module_class(OBS, gym.spaces.Discrete(2), {"use_lstm": True}) is DefaultLSTMModule
    )
    for off in (None, {}, {"use_lstm": False}, {"fcnet_hiddens": [8]}):
        assert default_module_class(OBS, gym.spaces.Discrete(2), off) is DefaultMLPModule
    config = (
        RunnerConfig()
        .environment("CartPole-v1")
        .rl_module(model_config={"use_lstm": True, "max_seq_len": 7, "lstm_cell_size": 8})
    )
    runner = SingleAgentEnvRunner(config=config)
    try:
        module = runner.module
        assert type(module) is DefaultLSTMModule
        assert module.is_stateful() and module.model_config["max_seq_len"] == 7
        assert module.get_initial_state()["actor"]["h"].shape == (1, 8)
    finally:
        runner.stop()


def test_model_config_errors_name_the_key():
    space = gym.spaces.Discrete(2)

    def build(**cfg):
        return DefaultLSTMModule(observation_space=OBS, action_space=space, model_config=cfg)

    with pytest.raises(
        ValueError, match=r"model_config\['lstm_cell_size'\] must be an int >= 1, got 0"
    ):
        build(lstm_cell_size=0)
    with pytest.raises(
        ValueError, match=r"model_config\['max_seq_len'\] must be an int >= 1, got 2.5"
    ):
        build(max_seq_len=2.5)
    with pytest.raises(ValueError, match=r"needs model_config\['use_lstm'\] = True, got False"):
        build(use_lstm=False)
    with pytest.raises(
        ValueError, match=r"'lstm_use_prev_action'.*not supported by DefaultLSTMModule"
    ):
        build(lstm_use_prev_action=True)
    with pytest.raises(
        ValueError, match=r"unknown model_config keys for DefaultLSTMModule: \['lstm_size'\]"
    ):
        build(lstm_size=3)
    with pytest.raises(ValueError, match="free_log_std"):
        build(free_log_std=True)


def test_inputs_without_time_axis_or_state_are_named_errors():
    m = DefaultLSTMModule(
        observation_space=OBS, action_space=gym.spaces.Discrete(2), model_config=SMALL
    )
    state = _batched(m.get_initial_state(), 3)
    with pytest.raises(ValueError, match=r"\(B, T, \*obs_shape\), got \(3, 4\)"):
        m.forward_exploration({Columns.OBS: torch.zeros(3, 4), Columns.STATE_IN: state})
    with pytest.raises(KeyError, match="needs batch\\['state_in'\\]"):
        m.forward_exploration({Columns.OBS: torch.zeros(3, 1, 4)})


def test_non_box_observations_fold_the_time_axis():
    space = gym.spaces.Dict(
        {"pos": gym.spaces.Box(-1, 1, (2,), np.float32), "mode": gym.spaces.Discrete(3)}
    )
    m = DefaultLSTMModule(
        observation_space=space, action_space=gym.spaces.Discrete(2), model_config=SMALL
    )
    obs = {"pos": torch.randn(2, 5, 2), "mode": torch.tensor([[0, 1, 2, 1, 0], [2, 2, 1, 0, 1]])}
    state = _batched(m.get_initial_state(), 2)
    whole = m.forward_train({Columns.OBS: obs, Columns.STATE_IN: state})
    assert whole[Columns.ACTION_DIST_INPUTS].shape == (2, 5, 2)
    # Each sequence is encoded on its own: the second row alone gives its outputs.
    alone = m.forward_train(
        {
            Columns.OBS: tree_map(lambda x: x[1:], obs),
            Columns.STATE_IN: _batched(m.get_initial_state(), 1),
        }
    )
    torch.testing.assert_close(
        alone[Columns.VF_PREDS], whole[Columns.VF_PREDS][1:], rtol=0, atol=1e-6
    )
    assert all(leaf.shape[0] == 2 for leaf in leaves(whole[Columns.STATE_OUT]))
