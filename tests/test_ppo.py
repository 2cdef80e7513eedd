"""PPO learner pieces (fastrollout.learners.ppo) and the examples/ppo.py trainer.

GAE against a reference written as the explicit sum of discounted TD errors; the batch
builder on hand-built chunks whose observations encode their env step, with a module
whose value is that step number, so each test sees exactly which observation a value
came from; the loss on crafted ratios; and a seeded learning run with a step budget.
"""

from __future__ import annotations

import importlib.util
import math
import pathlib
import re
import sys

import gymnasium as gym
import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from fastrollout import MultiAgentEpisode, SingleAgentEpisode
from fastrollout.core import DEFAULT_MODULE_ID, Columns
from fastrollout.learners import (
    PPOConfig,
    PPOLearner,
    build_ppo_batch,
    clipped_surrogate,
    compute_gae,
    iter_agent_chunks,
    ppo_loss,
    ppo_update,
)
from fastrollout.modules import DefaultMLPModule, RLModule, TorchCategorical

EXAMPLE = pathlib.Path(__file__).resolve().parents[1] / "examples" / "ppo.py"
OBS_SPACE = gym.spaces.Box(-1e6, 1e6, (2,), np.float32)
ACT_SPACE = gym.spaces.Discrete(2)


def load_example():
    spec = importlib.util.spec_from_file_location("fastrollout_example_ppo", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


# -- a module whose value of an observation is its first entry ---------------------


class StepValueModule(RLModule):
    """V(o) = o[0] * scale; a constant policy; a parameter so it can be optimized."""

    def setup(self):
        self.scale = float(self.model_config.get("scale", 1.0))
        self.logits = torch.nn.Parameter(torch.zeros(2))
        self.calls = 0

    def _forward(self, batch, **kwargs):
        n = batch[Columns.OBS].shape[0]
        return {Columns.ACTION_DIST_INPUTS: self.logits.expand(n, 2)}

    def _forward_train(self, batch, **kwargs):
        out = self._forward(batch)
        out[Columns.VF_PREDS] = self.compute_values(batch)
        return out

    def compute_values(self, batch, embeddings=None):
        self.calls += 1
        return batch[Columns.OBS][:, 0].float() * self.scale


class NoValueModule(RLModule):
    def setup(self):
        self.logits = torch.nn.Parameter(torch.zeros(2))

    def _forward(self, batch, **kwargs):
        n = batch[Columns.OBS].shape[0]
        return {Columns.ACTION_DIST_INPUTS: self.logits.expand(n, 2)}


def step_module(scale=1.0):
    return StepValueModule(
        observation_space=OBS_SPACE, action_space=ACT_SPACE, model_config={"scale": scale}
    )


def obs_at(t):
    """The observation at env step t: [t, 0]; V(obs_at(t)) = t for StepValueModule."""
    return np.array([t, 0.0], np.float32)


def make_episode(rewards, *, terminated=False, truncated=False, logp=-0.5, t0=0):
    """A numpy'ized chunk with observations obs_at(t0 .. t0 + len(rewards))."""
    episode = SingleAgentEpisode(observation_space=OBS_SPACE, action_space=ACT_SPACE)
    episode.add_env_reset(obs_at(t0))
    n = len(rewards)
    for i, r in enumerate(rewards):
        last = i == n - 1
        episode.add_env_step(
            obs_at(t0 + i + 1),
            i % 2,
            float(r),
            terminated=terminated and last,
            truncated=truncated and last,
            extra_model_outputs={Columns.ACTION_LOGP: np.float32(logp)},
        )
    return episode


def reference_gae(rewards, values, bootstrap, gamma, lambda_):
    """A_t = sum_k (gamma * lambda)^k delta_{t+k}, written out (no recursion)."""
    v = [*values, bootstrap]
    deltas = [rewards[t] + gamma * v[t + 1] - v[t] for t in range(len(rewards))]
    adv = [
        sum((gamma * lambda_) ** k * deltas[t + k] for k in range(len(deltas) - t))
        for t in range(len(deltas))
    ]
    return np.array(adv), np.array(adv) + np.array(values)


# -- GAE -------------------------------------------------------------------------------


@given(
    data=st.lists(
        st.tuples(
            st.floats(-10, 10, allow_nan=False, width=32),
            st.floats(-10, 10, allow_nan=False, width=32),
        ),
        min_size=1,
        max_size=30,
    ),
    bootstrap=st.floats(-10, 10, allow_nan=False, width=32),
    gamma=st.floats(0, 1),
    lambda_=st.floats(0, 1),
)
def test_gae_matches_the_explicit_sum(data, bootstrap, gamma, lambda_):
    rewards = np.array([r for r, _ in data])
    values = np.array([v for _, v in data])
    adv, targets = compute_gae(rewards, values, bootstrap, gamma=gamma, lambda_=lambda_)
    ref_adv, ref_targets = reference_gae(rewards, values, bootstrap, gamma, lambda_)
    assert adv.dtype == np.float32 and targets.dtype == np.float32
    np.testing.assert_allclose(adv, ref_adv, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(targets, ref_targets, rtol=1e-4, atol=1e-3)


def test_gae_special_cases():
    rewards, values = np.array([1.0, 2.0, 3.0]), np.array([0.5, 1.0, 2.0])
    # lambda = 0: one-step TD errors.
    adv, _ = compute_gae(rewards, values, 4.0, gamma=0.9, lambda_=0.0)
    np.testing.assert_allclose(adv, [1 + 0.9 * 1.0 - 0.5, 2 + 0.9 * 2.0 - 1.0, 3 + 0.9 * 4 - 2])
    # lambda = 1: discounted return (bootstrapped) minus the value.
    adv, targets = compute_gae(rewards, values, 4.0, gamma=0.9, lambda_=1.0)
    returns = [1 + 0.9 * 2 + 0.81 * 3 + 0.729 * 4, 2 + 0.9 * 3 + 0.81 * 4, 3 + 0.9 * 4]
    np.testing.assert_allclose(targets, returns, rtol=1e-6)
    np.testing.assert_allclose(adv, np.array(returns) - values, rtol=1e-6)


@pytest.mark.parametrize(
    ("rewards", "values"),
    [(np.zeros(3), np.zeros(2)), (np.zeros((2, 2)), np.zeros((2, 2)))],
)
def test_gae_rejects_mismatched_shapes(rewards, values):
    with pytest.raises(ValueError, match=r"1-D rewards and values of one length"):
        compute_gae(rewards, values, 0.0, gamma=0.99, lambda_=0.95)


# -- the batch builder -----------------------------------------------------------------

GAMMA, LAMBDA = 0.9, 0.8


def batch_of(episodes, module=None):
    module = module or step_module()
    return build_ppo_batch(episodes, {DEFAULT_MODULE_ID: module}, gamma=GAMMA, lambda_=LAMBDA)[
        DEFAULT_MODULE_ID
    ]


def test_terminated_chunk_bootstraps_with_zero():
    episode = make_episode([1.0, 1.0, 1.0], terminated=True).to_numpy()
    batch = batch_of([episode])
    ref_adv, ref_targets = reference_gae([1, 1, 1], [0, 1, 2], 0.0, GAMMA, LAMBDA)
    np.testing.assert_allclose(batch[Columns.ADVANTAGES].numpy(), ref_adv, rtol=1e-6)
    np.testing.assert_allclose(batch[Columns.VALUE_TARGETS].numpy(), ref_targets, rtol=1e-6)
    # The last step's target is its reward alone: nothing follows a terminal step.
    assert batch[Columns.VALUE_TARGETS][-1].item() == pytest.approx(1.0)


@pytest.mark.parametrize("truncated", [True, False], ids=["truncated", "ongoing"])
def test_truncated_or_ongoing_chunk_bootstraps_from_its_last_observation(truncated):
    episode = make_episode([1.0, 1.0, 1.0], truncated=truncated).to_numpy()
    batch = batch_of([episode])
    # V(o_3) = 3: the observation after the chunk's last step.
    ref_adv, ref_targets = reference_gae([1, 1, 1], [0, 1, 2], 3.0, GAMMA, LAMBDA)
    np.testing.assert_allclose(batch[Columns.ADVANTAGES].numpy(), ref_adv, rtol=1e-6)
    np.testing.assert_allclose(batch[Columns.VALUE_TARGETS].numpy(), ref_targets, rtol=1e-6)
    assert batch[Columns.VALUE_TARGETS][-1].item() == pytest.approx(1.0 + GAMMA * 3.0)


def test_cut_chunks_bootstrap_from_the_observation_that_follows_and_skip_look_back():
    episode = make_episode([1.0, 2.0, 3.0])
    successor = episode.cut(len_lookback_buffer=1)
    for i, r in enumerate([4.0, 5.0]):
        successor.add_env_step(
            obs_at(4 + i),
            0,
            r,
            terminated=i == 1,
            extra_model_outputs={Columns.ACTION_LOGP: np.float32(-0.5)},
        )
    first, second = episode.to_numpy(), successor.to_numpy()
    # The continuation starts at the first chunk's bootstrap observation; its look-back
    # item is the observation before it (o_2), which is no step of the second chunk.
    np.testing.assert_array_equal(second.get_observations(0), first.get_observations(-1))
    np.testing.assert_array_equal(
        second.get_observations(-1, neg_index_as_lookback=True), obs_at(2)
    )

    batch = batch_of([first, second])
    adv1, tgt1 = reference_gae([1, 2, 3], [0, 1, 2], 3.0, GAMMA, LAMBDA)
    adv2, tgt2 = reference_gae([4, 5], [3, 4], 0.0, GAMMA, LAMBDA)
    np.testing.assert_allclose(
        batch[Columns.ADVANTAGES].numpy(), np.concatenate([adv1, adv2]), rtol=1e-6
    )
    np.testing.assert_allclose(
        batch[Columns.VALUE_TARGETS].numpy(), np.concatenate([tgt1, tgt2]), rtol=1e-6
    )
    # Every env step once, in order: o_0 .. o_4 (not o_5, the terminal observation; not
    # the look-back o_2 a second time).
    np.testing.assert_array_equal(batch[Columns.OBS][:, 0].numpy(), [0, 1, 2, 3, 4])
    np.testing.assert_array_equal(batch[Columns.VF_PREDS].numpy(), [0, 1, 2, 3, 4])
    np.testing.assert_array_equal(batch[Columns.ACTIONS].numpy(), [0, 1, 0, 0, 0])


@pytest.mark.parametrize("lookback", [0, 1, 3])
@given(
    rewards=st.lists(st.floats(-5, 5, allow_nan=False, width=32), min_size=1, max_size=25),
    cuts=st.lists(st.integers(1, 6), max_size=5),
    terminated=st.booleans(),
)
def test_chunks_cover_each_step_once_and_match_per_chunk_gae(rewards, cuts, terminated, lookback):
    episode = SingleAgentEpisode(observation_space=OBS_SPACE, action_space=ACT_SPACE)
    episode.add_env_reset(obs_at(0))
    chunks, current = [], episode
    boundaries = set(np.cumsum(cuts).tolist())
    for t, r in enumerate(rewards):
        current.add_env_step(
            obs_at(t + 1),
            t % 2,
            r,
            terminated=terminated and t == len(rewards) - 1,
            extra_model_outputs={Columns.ACTION_LOGP: np.float32(-0.7)},
        )
        if t + 1 in boundaries and t + 1 < len(rewards):
            successor = current.cut(len_lookback_buffer=lookback)
            chunks.append(current.to_numpy())
            current = successor
    chunks.append(current.to_numpy())
    module = step_module()
    batch = batch_of(chunks, module)
    assert module.calls == 1  # one value forward for all chunks
    n = len(rewards)
    np.testing.assert_array_equal(batch[Columns.OBS][:, 0].numpy(), np.arange(n))
    np.testing.assert_allclose(batch[Columns.ACTION_LOGP].numpy(), np.full(n, -0.7))
    expected = []
    for chunk in chunks:
        start, length = chunk.t_started, len(chunk)
        last = start + length
        bootstrap = 0.0 if chunk.is_terminated else float(last)
        adv, _ = reference_gae(
            rewards[start:last], np.arange(start, last, dtype=float), bootstrap, GAMMA, LAMBDA
        )
        expected.append(adv)
    np.testing.assert_allclose(
        batch[Columns.ADVANTAGES].numpy(), np.concatenate(expected), rtol=1e-4, atol=1e-3
    )


def test_batch_keeps_dtypes_shapes_and_device():
    batch = batch_of([make_episode([1.0] * 4).to_numpy(), make_episode([1.0] * 2).to_numpy()])
    assert set(batch) == {
        Columns.OBS,
        Columns.ACTIONS,
        Columns.ACTION_LOGP,
        Columns.VF_PREDS,
        Columns.ADVANTAGES,
        Columns.VALUE_TARGETS,
    }
    assert batch[Columns.OBS].shape == (6, 2) and batch[Columns.OBS].dtype == torch.float32
    assert batch[Columns.ACTIONS].dtype == torch.int64
    for key in (Columns.ACTION_LOGP, Columns.ADVANTAGES, Columns.VALUE_TARGETS, Columns.VF_PREDS):
        assert batch[key].shape == (6,) and batch[key].dtype == torch.float32, key
    assert all(t.device == torch.device("cpu") for t in batch.values())


def test_dict_observations_are_batched_per_leaf():
    space = gym.spaces.Dict(
        {"pos": gym.spaces.Box(-5, 5, (2,), np.float32), "flag": gym.spaces.Discrete(3)}
    )
    module = DefaultMLPModule(
        observation_space=space, action_space=ACT_SPACE, model_config={"fcnet_hiddens": [8]}
    )
    episode = SingleAgentEpisode(observation_space=space, action_space=ACT_SPACE)
    episode.add_env_reset({"pos": np.zeros(2, np.float32), "flag": 0})
    for t in range(3):
        episode.add_env_step(
            {"pos": np.full(2, t + 1, np.float32), "flag": (t + 1) % 3},
            1,
            1.0,
            extra_model_outputs={Columns.ACTION_LOGP: np.float32(-0.7)},
        )
    batch = build_ppo_batch([episode.to_numpy()], {DEFAULT_MODULE_ID: module})[DEFAULT_MODULE_ID]
    np.testing.assert_array_equal(batch[Columns.OBS]["pos"][:, 0].numpy(), [0, 1, 2])
    np.testing.assert_array_equal(batch[Columns.OBS]["flag"].numpy(), [0, 1, 2])
    loss, _ = ppo_loss(module, batch, PPOConfig())
    assert torch.isfinite(loss)


def test_multi_agent_chunks_go_to_their_modules():
    episode = MultiAgentEpisode(agent_to_module_mapping_fn=lambda aid, ep: f"m_{aid}")
    episode.add_env_reset(observations={"a": obs_at(0), "b": obs_at(10)})
    logp = {Columns.ACTION_LOGP: np.float32(-0.5)}
    episode.add_env_step(
        {"a": obs_at(1), "b": obs_at(11)},
        {"a": 0, "b": 1},
        {"a": 1.0, "b": 2.0},
        extra_model_outputs={"a": logp, "b": logp},
    )
    # b leaves (terminated); a goes on for one more step.
    episode.add_env_step(
        {"a": obs_at(2), "b": obs_at(12)},
        {"a": 1, "b": 0},
        {"a": 1.0, "b": 2.0},
        terminateds={"b": True},
        extra_model_outputs={"a": logp, "b": logp},
    )
    episode.add_env_step({"a": obs_at(3)}, {"a": 0}, {"a": 1.0}, extra_model_outputs={"a": logp})
    episode.to_numpy()
    assert sorted((mid, len(c)) for mid, c in iter_agent_chunks([episode])) == [
        ("m_a", 3),
        ("m_b", 2),
    ]
    modules = {"m_a": step_module(), "m_b": step_module(), "unused": step_module()}
    batches = build_ppo_batch([episode], modules, gamma=GAMMA, lambda_=LAMBDA)
    assert set(batches) == {"m_a", "m_b"}
    np.testing.assert_array_equal(batches["m_a"][Columns.OBS][:, 0].numpy(), [0, 1, 2])
    np.testing.assert_array_equal(batches["m_b"][Columns.OBS][:, 0].numpy(), [10, 11])
    adv_b, _ = reference_gae([2, 2], [10, 11], 0.0, GAMMA, LAMBDA)  # b terminated
    adv_a, _ = reference_gae([1, 1, 1], [0, 1, 2], 3.0, GAMMA, LAMBDA)  # a goes on
    np.testing.assert_allclose(batches["m_b"][Columns.ADVANTAGES].numpy(), adv_b, rtol=1e-6)
    np.testing.assert_allclose(batches["m_a"][Columns.ADVANTAGES].numpy(), adv_a, rtol=1e-6)


def test_batch_builder_errors_name_the_chunk():
    modules = {DEFAULT_MODULE_ID: step_module()}
    raw = make_episode([1.0, 1.0])
    with pytest.raises(ValueError, match=rf"chunk {raw.id_} .* not numpy'ized"):
        build_ppo_batch([raw], modules)
    no_logp = SingleAgentEpisode(observation_space=OBS_SPACE, action_space=ACT_SPACE)
    no_logp.add_env_reset(obs_at(0))
    no_logp.add_env_step(obs_at(1), 0, 1.0)
    no_logp.to_numpy()
    with pytest.raises(ValueError, match=rf"chunk {no_logp.id_} .* no 'action_logp'"):
        build_ppo_batch([no_logp], modules)
    other = make_episode([1.0]).to_numpy()
    with pytest.raises(KeyError, match=r"module 'default_policy', which is not among"):
        build_ppo_batch([other], {"m": step_module()})
    no_value = NoValueModule(observation_space=OBS_SPACE, action_space=ACT_SPACE)
    with pytest.raises(TypeError, match=r"NoValueModule\) has no compute_values"):
        build_ppo_batch([other], {DEFAULT_MODULE_ID: no_value})


def test_empty_chunks_are_skipped():
    fresh = SingleAgentEpisode(observation_space=OBS_SPACE, action_space=ACT_SPACE)
    fresh.add_env_reset(obs_at(0))
    fresh.to_numpy()
    assert build_ppo_batch([fresh], {DEFAULT_MODULE_ID: step_module()}) == {}


# -- the loss ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ratio", "adv", "value", "grad"),
    [
        (1.5, 2.0, 1.2 * 2.0, 0.0),  # pushed past 1 + eps where A > 0: clipped, no gradient
        (0.5, 2.0, 0.5 * 2.0, 2.0),  # below 1 - eps where A > 0: the unclipped term is lower
        (0.5, -2.0, 0.8 * -2.0, 0.0),  # below 1 - eps where A < 0: clipped
        (1.5, -2.0, 1.5 * -2.0, -2.0),  # above 1 + eps where A < 0: unclipped
        (1.1, 2.0, 1.1 * 2.0, 2.0),  # inside the range: the plain ratio
    ],
)
def test_clipped_surrogate_on_crafted_ratios(ratio, adv, value, grad):
    r = torch.tensor([ratio], requires_grad=True)
    out = clipped_surrogate(r, torch.tensor([adv]), 0.2)
    out.sum().backward()
    assert out.item() == pytest.approx(value)
    assert r.grad.item() == pytest.approx(grad)


@given(
    ratio=st.floats(0.01, 5.0),
    adv=st.floats(-10, 10, allow_nan=False),
    eps=st.floats(0.01, 0.5),
)
def test_clipped_surrogate_is_a_pessimistic_bound(ratio, adv, eps):
    out = clipped_surrogate(torch.tensor(ratio), torch.tensor(adv), eps).item()
    assert out <= ratio * adv + 1e-5
    if 1 - eps <= ratio <= 1 + eps:
        assert out == pytest.approx(ratio * adv, rel=1e-5, abs=1e-5)


def default_module(seed=0):
    torch.manual_seed(seed)
    return DefaultMLPModule(
        observation_space=gym.spaces.Box(-1, 1, (4,), np.float32),
        action_space=ACT_SPACE,
        model_config={"fcnet_hiddens": [16, 16]},
    )


def on_policy_batch(module, n=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    obs = torch.rand(n, 4, generator=g) * 2 - 1
    with torch.no_grad():
        logits = module.forward_exploration({Columns.OBS: obs})[Columns.ACTION_DIST_INPUTS]
    dist = TorchCategorical.from_logits(logits)
    actions = torch.randint(0, 2, (n,), generator=g)
    return {
        Columns.OBS: obs,
        Columns.ACTIONS: actions,
        Columns.ACTION_LOGP: dist.logp(actions).detach(),
        Columns.ADVANTAGES: torch.randn(n, generator=g),
        Columns.VALUE_TARGETS: torch.randn(n, generator=g) * 10,
    }


def test_loss_gradients_are_finite_and_reach_both_heads():
    module = default_module()
    batch = on_policy_batch(module)
    loss, stats = ppo_loss(module, batch, PPOConfig(entropy_coeff=0.01))
    loss.backward()
    grads = {name: p.grad for name, p in module.named_parameters()}
    assert all(g is not None and torch.isfinite(g).all() for g in grads.values())
    assert grads["pi.net.mlp.0.weight"].abs().sum() > 0
    assert grads["vf.net.mlp.0.weight"].abs().sum() > 0
    assert grads["encoder.critic_encoder.net.mlp.0.weight"].abs().sum() > 0
    # On-policy (the logp were computed by this module): ratio 1, nothing clipped.
    assert stats["mean_kl"] == pytest.approx(0.0, abs=1e-6)
    assert stats["clip_fraction"] == 0.0
    assert 0 < stats["entropy"] <= math.log(2) + 1e-6
    assert loss.item() == pytest.approx(
        stats["policy_loss"] + 0.5 * stats["vf_loss"] - 0.01 * stats["entropy"], rel=1e-5
    )


def test_loss_coefficients_and_value_clip():
    module = default_module()
    batch = on_policy_batch(module)
    base, stats = ppo_loss(module, batch, PPOConfig(vf_loss_coeff=0.0))
    assert base.item() == pytest.approx(stats["policy_loss"], rel=1e-6)
    # On-policy, the surrogate is -mean(A).
    assert stats["policy_loss"] == pytest.approx(-batch[Columns.ADVANTAGES].mean().item(), 1e-5)
    _, clipped = ppo_loss(module, batch, PPOConfig(vf_clip_param=1.0))
    assert clipped["vf_loss"] <= 1.0 < stats["vf_loss"]
    # Off-policy logp: ratios far from 1 are counted as clipped.
    shifted = {**batch, Columns.ACTION_LOGP: batch[Columns.ACTION_LOGP] - 1.0}
    _, off = ppo_loss(module, shifted, PPOConfig())
    assert off["clip_fraction"] == 1.0 and off["mean_kl"] > 0


def test_loss_needs_a_value_head():
    module = NoValueModule(observation_space=OBS_SPACE, action_space=ACT_SPACE)
    batch = {
        Columns.OBS: torch.zeros(3, 2),
        Columns.ACTIONS: torch.zeros(3, dtype=torch.int64),
        Columns.ACTION_LOGP: torch.zeros(3),
        Columns.ADVANTAGES: torch.zeros(3),
        Columns.VALUE_TARGETS: torch.zeros(3),
    }
    with pytest.raises(KeyError, match=r"returned no 'vf_preds'"):
        ppo_loss(module, batch, PPOConfig())


def test_update_moves_the_policy_toward_positive_advantages():
    module = default_module()
    batch = on_policy_batch(module, n=128)
    # Action 0 is good, action 1 bad, everywhere.
    batch[Columns.ADVANTAGES] = torch.where(batch[Columns.ACTIONS] == 0, 1.0, -1.0)
    obs = batch[Columns.OBS]

    def p0():
        with torch.no_grad():
            logits = module.forward_inference({Columns.OBS: obs})[Columns.ACTION_DIST_INPUTS]
        return torch.softmax(logits, -1)[:, 0].mean().item()

    before = p0()
    config = PPOConfig(num_epochs=3, minibatch_size=48, lr=1e-2)
    optimizer = torch.optim.Adam(module.parameters(), lr=config.lr)
    stats = ppo_update(module, optimizer, batch, config, generator=torch.Generator().manual_seed(0))
    # 128 rows in minibatches of 48: two full ones per epoch (the short rest is dropped).
    assert stats["num_gradient_steps"] == 6
    assert p0() > before + 0.05
    assert stats["clip_fraction"] > 0  # later minibatches moved past the clip range


def test_update_is_deterministic_with_a_seeded_generator():
    results = []
    for _ in range(2):
        module = default_module(seed=3)
        batch = on_policy_batch(module)
        config = PPOConfig(num_epochs=2, minibatch_size=16)
        optimizer = torch.optim.Adam(module.parameters(), lr=config.lr)
        ppo_update(module, optimizer, batch, config, generator=torch.Generator().manual_seed(1))
        results.append(module.get_state())
    for key, value in results[0].items():
        np.testing.assert_array_equal(value, results[1][key], err_msg=key)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"gamma": 1.5}, r"gamma must be in \[0, 1\], got 1.5"),
        ({"lambda_": -0.1}, r"lambda_ must be in \[0, 1\]"),
        ({"clip_param": 0.0}, r"clip_param must be > 0"),
        ({"lr": -1.0}, r"lr must be > 0"),
        ({"grad_clip": 0.0}, r"grad_clip must be > 0"),
        ({"entropy_coeff": -0.01}, r"entropy_coeff must be >= 0"),
        ({"num_epochs": 0}, r"num_epochs must be an int >= 1, got 0"),
        ({"minibatch_size": 2.5}, r"minibatch_size must be an int >= 1, got 2.5"),
        ({"num_epochs": True}, r"num_epochs must be an int >= 1, got True"),
    ],
)
def test_config_rejects_bad_values(kwargs, match):
    with pytest.raises(ValueError, match=match):
        PPOConfig(**kwargs)


# -- with the runners ------------------------------------------------------------------


def test_learner_rejects_an_inference_only_module():
    module = DefaultMLPModule(
        observation_space=OBS_SPACE,
        action_space=ACT_SPACE,
        inference_only=True,
        model_config={"fcnet_hiddens": [8]},
    )
    with pytest.raises(ValueError, match=r"module 'p' is inference-only"):
        PPOLearner({"p": module})


def small_args(**overrides):
    example = load_example()
    args = example.parse_args(
        [
            "--seed",
            "0",
            "--num-envs",
            "4",
            "--rollout-fragment-length",
            "16",
            "--hiddens",
            "16,16",
            "--device",
            "cpu",
            "--num-epochs",
            "2",
            "--minibatch-size",
            "32",
        ]
    )
    vars(args).update(overrides)
    return example, args


def test_runner_chunks_train_each_step_once_and_sync_weights():
    example, args = small_args()
    runner = example.make_runner(args)
    learner = example.make_learner(args, runner)
    try:
        runner.set_weights(learner.get_weights(), weights_seq_no=1)
        greedy = runner.get_weights()[DEFAULT_MODULE_ID]
        for key, value in learner.get_weights()[DEFAULT_MODULE_ID].items():
            np.testing.assert_array_equal(greedy[key], value, err_msg=key)
        first = runner.sample(num_timesteps=64)
        second = runner.sample(num_timesteps=64)
        stats = learner.update(first)[DEFAULT_MODULE_ID]
        assert stats["num_module_steps_trained"] == sum(len(e) for e in first)
        assert math.isfinite(stats["policy_loss"]) and math.isfinite(stats["vf_loss"])
        # The chunks continued by the second call start at the observation the first
        # call's chunks bootstrapped from.
        ongoing = {e.id_: e for e in first if not e.is_done}
        continued = [e for e in second if e.id_ in ongoing]
        assert continued
        for chunk in continued:
            previous = ongoing[chunk.id_]
            assert chunk.t_started == previous.t
            np.testing.assert_array_equal(chunk.get_observations(0), previous.get_observations(-1))
        batch = build_ppo_batch(first + second, learner.modules)[DEFAULT_MODULE_ID]
        assert batch[Columns.ADVANTAGES].shape[0] == sum(len(e) for e in first + second)
        runner.set_weights(learner.get_weights(), weights_seq_no=2)
        synced = runner.get_weights()[DEFAULT_MODULE_ID]
        trained = learner.get_weights()[DEFAULT_MODULE_ID]
        assert set(synced) == set(trained)  # inference-only keys both sides
        for key, value in trained.items():
            np.testing.assert_array_equal(synced[key], value, err_msg=key)
    finally:
        runner.stop()


def test_multi_agent_runner_batches_every_agent_step():
    example, args = small_args(multi_agent=2)
    runner = example.make_runner(args)
    learner = example.make_learner(args, runner)
    try:
        runner.set_weights(learner.get_weights(), weights_seq_no=1)
        episodes = runner.sample(num_timesteps=64)
        assert all(isinstance(e, MultiAgentEpisode) for e in episodes)
        agent_steps = sum(len(c) for _, c in iter_agent_chunks(episodes))
        stats = learner.update(episodes)
        assert set(stats) == {DEFAULT_MODULE_ID}
        assert stats[DEFAULT_MODULE_ID]["num_module_steps_trained"] == agent_steps
    finally:
        runner.stop()


def test_example_runs_multi_agent_and_counts_env_steps():
    example, args = small_args(multi_agent=2, timesteps=200)
    history = example.train(args, log=None)
    assert history[-1]["env_steps"] >= 200
    assert all(h["env_steps"] > 0 for h in history)
    assert "default_policy/policy_loss" in history[-1]


def test_example_cli_prints_progress(capsys):
    example = load_example()
    assert (
        example.main(
            [
                "--timesteps",
                "100",
                "--num-envs",
                "2",
                "--rollout-fragment-length",
                "25",
                "--hiddens",
                "8",
                "--seed",
                "1",
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "steps" in out and "return_mean" in out
    last = out.strip().splitlines()[-1]
    # Each sample() may overshoot by a step per sub-env (an autoreset step does not count,
    # so where one falls depends on the episodes' lengths, hence on the draws).
    steps = int(re.match(r"done: (\d+) env steps", last).group(1))
    assert 100 <= steps <= 100 + 2 * 2, last  # 2 sub-envs, 2 sample() calls


def test_ppo_learns_cartpole_within_a_step_budget():
    """Seeded, 50k env steps on CartPole-v1 with 8 sub-envs: the mean return of the
    last 100 episodes reaches 150 (random play: about 22)."""
    example = load_example()
    args = example.parse_args(
        ["--env", "CartPole-v1", "--timesteps", "50000", "--seed", "0", "--num-envs", "8"]
    )
    assert args.threads == 1  # the example's default
    threads = torch.get_num_threads()
    try:
        history = example.train(args, log=None)
    finally:
        torch.set_num_threads(threads)
    assert history[-1]["env_steps"] >= 50_000
    assert history[-1]["return_mean"] >= 150, [round(h["return_mean"]) for h in history]
    assert history[0]["return_mean"] < 50  # it did learn: it started near random play


def test_learner_set_lr_and_full_weights():
    module = default_module()
    learner = PPOLearner({"p": module}, PPOConfig(lr=1e-3))
    assert learner.optimizers["p"].param_groups[0]["lr"] == 1e-3
    learner.set_lr(0.0)
    assert learner.optimizers["p"].param_groups[0]["lr"] == 0.0
    with pytest.raises(ValueError, match=r"learning rate must be >= 0, got -1"):
        learner.set_lr(-1.0)
    # At lr 0 an update changes no weight.
    before = learner.get_weights(inference_only=False)["p"]
    assert any(key.startswith("vf.") for key in before)
    assert not any(key.startswith("vf.") for key in learner.get_weights()["p"])
    episode = SingleAgentEpisode(observation_space=module.observation_space, action_space=ACT_SPACE)
    episode.add_env_reset(np.zeros(4, np.float32))
    for t in range(8):
        episode.add_env_step(
            np.full(4, t / 10, np.float32),
            t % 2,
            1.0,
            extra_model_outputs={Columns.ACTION_LOGP: np.float32(-0.7)},
        )
    # The chunk names no module: it goes to DEFAULT_MODULE_ID, which this learner lacks.
    with pytest.raises(KeyError, match=r"module 'default_policy'"):
        learner.update([episode.to_numpy()])
    learner = PPOLearner({DEFAULT_MODULE_ID: module}, PPOConfig(minibatch_size=4))
    learner.set_lr(0.0)
    stats = learner.update([episode])[DEFAULT_MODULE_ID]
    assert stats["num_module_steps_trained"] == 8 and stats["num_gradient_steps"] == 20
    for key, value in learner.get_weights(inference_only=False)[DEFAULT_MODULE_ID].items():
        np.testing.assert_array_equal(value, before[key], err_msg=key)
