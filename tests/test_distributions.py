"""Action distributions: differential against RLlib 2.60's torch distributions, sampling
statistics, shapes, and the RLlib bugs fixed here (each pinned with what RLlib does)."""

from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fastrollout.modules.distributions import (
    TorchCategorical,
    TorchDeterministic,
    TorchDiagGaussian,
    TorchMultiCategorical,
    get_action_dist_cls,
)

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from ray.rllib.core.distribution.torch import torch_distribution as rl

B = 7

logits_st = st.integers(min_value=1, max_value=2**31 - 1).map(
    lambda seed: torch.Generator().manual_seed(seed)
)


def _randn(gen: torch.Generator, *shape: int, scale: float = 2.0) -> torch.Tensor:
    return torch.randn(*shape, generator=gen) * scale


# -- differential: logp / entropy / kl equal to RLlib's on the same inputs -------------


@given(gen=logits_st, k=st.integers(1, 6))
def test_categorical_matches_rllib(gen, k):
    a, b = _randn(gen, B, k), _randn(gen, B, k)
    ours, ours_b = TorchCategorical.from_logits(a), TorchCategorical.from_logits(b)
    ref, ref_b = rl.TorchCategorical.from_logits(a), rl.TorchCategorical.from_logits(b)
    actions = torch.randint(0, k, (B,), generator=gen)
    torch.testing.assert_close(ours.logp(actions), ref.logp(actions))
    torch.testing.assert_close(ours.entropy(), ref.entropy())
    torch.testing.assert_close(ours.kl(ours_b), ref.kl(ref_b))
    torch.testing.assert_close(ours.to_deterministic().sample(), ref.to_deterministic().sample())
    space = gym.spaces.Discrete(k)
    assert TorchCategorical.required_input_dim(space) == rl.TorchCategorical.required_input_dim(
        space
    )


@given(gen=logits_st, d=st.integers(1, 4))
def test_diag_gaussian_matches_rllib(gen, d):
    a, b = _randn(gen, B, 2 * d, scale=1.0), _randn(gen, B, 2 * d, scale=1.0)
    ours, ours_b = TorchDiagGaussian.from_logits(a), TorchDiagGaussian.from_logits(b)
    ref, ref_b = rl.TorchDiagGaussian.from_logits(a), rl.TorchDiagGaussian.from_logits(b)
    actions = _randn(gen, B, d)
    torch.testing.assert_close(ours.logp(actions), ref.logp(actions))
    torch.testing.assert_close(ours.entropy(), ref.entropy())
    torch.testing.assert_close(ours.kl(ours_b), ref.kl(ref_b))
    torch.testing.assert_close(ours.to_deterministic().sample(), ref.to_deterministic().sample())
    space = gym.spaces.Box(-1, 1, (d, 2), np.float32)
    assert TorchDiagGaussian.required_input_dim(space) == rl.TorchDiagGaussian.required_input_dim(
        space
    )


@given(gen=logits_st, nvec=st.lists(st.integers(1, 5), min_size=1, max_size=4))
def test_multi_categorical_matches_rllib(gen, nvec):
    n = sum(nvec)
    a, b = _randn(gen, B, n), _randn(gen, B, n)
    ours = TorchMultiCategorical.from_logits(a, input_lens=nvec)
    ours_b = TorchMultiCategorical.from_logits(b, input_lens=nvec)
    ref = rl.TorchMultiCategorical.from_logits(a, input_lens=nvec)
    ref_b = rl.TorchMultiCategorical.from_logits(b, input_lens=nvec)
    actions = torch.stack([torch.randint(0, k, (B,), generator=gen) for k in nvec], dim=-1)
    torch.testing.assert_close(ours.logp(actions), ref.logp(actions))
    torch.testing.assert_close(ours.entropy(), ref.entropy())
    torch.testing.assert_close(ours.kl(ours_b), ref.kl(ref_b))
    torch.testing.assert_close(ours.to_deterministic().sample(), ref.to_deterministic().sample())
    space = gym.spaces.MultiDiscrete(nvec)
    assert TorchMultiCategorical.required_input_dim(
        space
    ) == rl.TorchMultiCategorical.required_input_dim(space)


# -- sampling statistics ---------------------------------------------------------------


def test_categorical_sample_frequencies():
    torch.manual_seed(0)
    probs = torch.tensor([0.1, 0.2, 0.7])
    dist = TorchCategorical.from_logits(probs.log().expand(4, 3))
    samples = dist.sample(sample_shape=(20_000,))
    assert samples.shape == (20_000, 4) and samples.dtype == torch.int64
    freq = torch.bincount(samples.flatten(), minlength=3).float() / samples.numel()
    torch.testing.assert_close(freq, probs, atol=0.01, rtol=0)


def test_diag_gaussian_sample_moments():
    torch.manual_seed(0)
    loc, log_std = torch.tensor([[1.0, -2.0]]), torch.tensor([[0.0, np.log(0.5)]])
    dist = TorchDiagGaussian.from_logits(torch.cat([loc, log_std], -1).float())
    samples = dist.sample(sample_shape=(40_000,))
    assert samples.shape == (40_000, 1, 2)
    torch.testing.assert_close(samples.mean(0), loc, atol=0.02, rtol=0)
    torch.testing.assert_close(samples.std(0), torch.tensor([[1.0, 0.5]]), atol=0.02, rtol=0)


def test_multi_categorical_sample_frequencies_per_component():
    torch.manual_seed(1)
    p0, p1 = torch.tensor([0.5, 0.5]), torch.tensor([0.6, 0.3, 0.1])
    logits = torch.cat([p0.log(), p1.log()]).expand(2, 5)
    dist = TorchMultiCategorical.from_logits(logits, input_lens=[2, 3])
    samples = dist.sample(sample_shape=(20_000,))
    assert samples.shape == (20_000, 2, 2)
    f0 = torch.bincount(samples[..., 0].flatten(), minlength=2).float() / 40_000
    f1 = torch.bincount(samples[..., 1].flatten(), minlength=3).float() / 40_000
    torch.testing.assert_close(f0, p0, atol=0.01, rtol=0)
    torch.testing.assert_close(f1, p1, atol=0.01, rtol=0)


def test_sample_and_logp_consistent():
    torch.manual_seed(2)
    dist = TorchDiagGaussian.from_logits(torch.randn(5, 6))
    actions, logp = dist.sample_and_logp()
    torch.testing.assert_close(logp, dist.logp(actions))


def test_diag_gaussian_rsample_has_gradient():
    logits = torch.zeros(3, 4, requires_grad=True)
    TorchDiagGaussian.from_logits(logits).rsample().sum().backward()
    assert logits.grad is not None and logits.grad[:, :2].abs().sum() > 0


# -- RLlib bugs, fixed here -------------------------------------------------------------


def test_categorical_rsample_from_logits_works_rllib_fails():
    logits = torch.tensor([[0.0, 1.0, -1.0]], requires_grad=True)
    with pytest.raises(TypeError):  # RLlib: rsample uses self.probs, None from logits
        rl.TorchCategorical.from_logits(logits).rsample()
    sample = TorchCategorical.from_logits(logits).rsample(sample_shape=(4,))
    assert sample.shape == (4, 1, 3)
    assert torch.all(sample.detach().sum(-1) == 1) and set(sample.detach().unique().tolist()) <= {
        0.0,
        1.0,
    }
    (sample * torch.tensor([1.0, 2.0, 3.0])).sum().backward()
    assert logits.grad is not None and logits.grad.abs().sum() > 0


def test_multi_categorical_temperatures_applied_rllib_ignores():
    logits = torch.tensor([[1.0, 2.0, 0.5, -0.5]])
    temps = [0.5, 2.0]
    ours = TorchMultiCategorical.from_logits(logits, input_lens=[2, 2], temperatures=temps)
    ref = rl.TorchMultiCategorical.from_logits(logits, input_lens=[2, 2], temperatures=temps)
    plain = rl.TorchMultiCategorical.from_logits(logits, input_lens=[2, 2])
    torch.testing.assert_close(ref.entropy(), plain.entropy())  # RLlib: temperatures ignored
    expected = (
        TorchCategorical(logits=logits[:, :2] / 0.5).entropy()
        + TorchCategorical(logits=logits[:, 2:] / 2.0).entropy()
    )
    torch.testing.assert_close(ours.entropy(), expected)


def test_multi_categorical_sample_shape_honoured():
    dist = TorchMultiCategorical.from_logits(torch.zeros(3, 5), input_lens=[2, 3])
    assert dist.sample(sample_shape=(4,)).shape == (4, 3, 2)
    assert dist.rsample(sample_shape=(4,)).shape == (4, 3, 5)


def test_deterministic_logp_has_batch_shape_rllib_per_component():
    loc = torch.zeros(5, 3)
    assert TorchDeterministic(loc=loc).logp(loc).shape == (5,)
    assert rl.TorchDeterministic(loc=loc).logp(loc).shape == (5, 3)  # RLlib
    cat = TorchCategorical.from_logits(torch.randn(5, 4)).to_deterministic()
    assert cat.logp(cat.sample()).shape == (5,)


# -- API and errors ---------------------------------------------------------------------


def test_deterministic_api():
    loc = torch.tensor([[1.0, 2.0]])
    det = TorchDeterministic.from_logits(loc)
    assert det.sample() is loc
    assert det.sample(sample_shape=(3,)).shape == (3, 1, 2)
    assert det.to_deterministic() is det
    assert TorchDeterministic.required_input_dim(gym.spaces.Box(-1, 1, (2, 3))) == 6
    with pytest.raises(RuntimeError, match="entropy"):
        det.entropy()
    with pytest.raises(RuntimeError, match="kl"):
        det.kl(det)
    with pytest.raises(NotImplementedError, match="rsample"):
        det.rsample()


def test_categorical_probs_and_temperature():
    probs = torch.tensor([[0.25, 0.75]])
    dist = TorchCategorical(probs=probs)
    torch.testing.assert_close(dist.logp(torch.tensor([1])), probs[:, 1].log())
    assert dist.to_deterministic().sample().tolist() == [1]
    cold = TorchCategorical.from_logits(torch.tensor([[0.0, 1.0]]), temperature=0.01)
    assert cold.entropy().item() < 1e-6
    with pytest.raises(ValueError, match="exactly one"):
        TorchCategorical()
    with pytest.raises(ValueError, match="exactly one"):
        TorchCategorical(logits=probs, probs=probs)
    with pytest.raises(ValueError, match="temperature"):
        TorchCategorical.from_logits(probs, temperature=0.0)


def test_errors_name_what_is_wrong():
    with pytest.raises(TypeError, match="Discrete"):
        TorchCategorical.required_input_dim(gym.spaces.Box(-1, 1, (2,)))
    with pytest.raises(TypeError, match="Box"):
        TorchDiagGaussian.required_input_dim(gym.spaces.Discrete(2))
    with pytest.raises(TypeError, match="MultiDiscrete"):
        TorchMultiCategorical.required_input_dim(gym.spaces.Discrete(2))
    with pytest.raises(ValueError, match="even"):
        TorchDiagGaussian.from_logits(torch.zeros(2, 3))
    with pytest.raises(ValueError, match="sum to 5"):
        TorchMultiCategorical.from_logits(torch.zeros(2, 4), input_lens=[2, 3])
    with pytest.raises(ValueError, match="needs input_lens"):
        TorchMultiCategorical.from_logits(torch.zeros(2, 4))
    with pytest.raises(ValueError, match="temperatures"):
        TorchMultiCategorical.from_logits(torch.zeros(2, 4), input_lens=[2, 2], temperatures=[1.0])
    with pytest.raises(ValueError, match="non-empty"):
        TorchMultiCategorical.with_input_lens([])
    with pytest.raises(ValueError, match="at least one"):
        TorchMultiCategorical([])
    mc = TorchMultiCategorical.from_logits(torch.zeros(2, 4), input_lens=[2, 2])
    with pytest.raises(ValueError, match="components"):
        mc.logp(torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="components"):
        mc.kl(TorchMultiCategorical.from_logits(torch.zeros(2, 4), input_lens=[1, 1, 2]))
    with pytest.raises(TypeError, match="TorchMultiCategorical"):
        mc.kl(TorchCategorical.from_logits(torch.zeros(2, 4)))
    with pytest.raises(TypeError, match="TorchCategorical"):
        TorchCategorical.from_logits(torch.zeros(2, 2)).kl(
            TorchDiagGaussian.from_logits(torch.zeros(2, 2))
        )


def test_get_action_dist_cls():
    assert get_action_dist_cls(gym.spaces.Discrete(3)) is TorchCategorical
    assert get_action_dist_cls(gym.spaces.Box(-1, 1, (2,), np.float32)) is TorchDiagGaussian
    cls = get_action_dist_cls(gym.spaces.MultiDiscrete([2, 3]))
    assert issubclass(cls, TorchMultiCategorical) and cls.input_lens == (2, 3)
    assert get_action_dist_cls(gym.spaces.MultiDiscrete([2, 3])) is cls  # cached
    dist = cls.from_logits(torch.zeros(4, 5))
    assert dist.sample().shape == (4, 2)
    for bad in (gym.spaces.Box(0, 3, (2,), np.int64), gym.spaces.MultiBinary(3)):
        with pytest.raises(TypeError, match="no default action distribution"):
            get_action_dist_cls(bad)


@pytest.mark.parametrize(
    ("shape", "dtype", "grad"),
    [
        ((5,), torch.float32, False),
        ((2, 4, 6), torch.float32, False),
        ((8, 3), torch.float64, False),
        ((8, 3), torch.float32, True),
    ],
)
def test_categorical_sample_with_logp_draws_as_torch_off_the_native_path(
    shape: tuple[int, ...], dtype: torch.dtype, grad: bool
) -> None:
    """Logits the native draw does not take (not 2-D, not float32, needing a gradient)
    are drawn exactly as torch's Categorical draws for the same random state."""
    from torch.distributions import Categorical

    from fastrollout.modules.distributions import TorchCategorical

    for seed in range(20):
        logits = torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * 3
        logits = logits.to(dtype).requires_grad_(grad)
        torch.manual_seed(seed)
        reference = Categorical(logits=logits)
        expected = reference.sample()
        torch.manual_seed(seed)
        actions, logp = TorchCategorical.from_logits(logits).sample_with_logp()
        assert torch.equal(actions, expected)
        torch.testing.assert_close(logp, reference.log_prob(expected))
        assert logp.requires_grad == grad


def test_categorical_native_draw_is_seeded_by_torch_and_follows_the_probabilities() -> None:
    """Float32 (batch, n) CPU logits are drawn natively: torch's seed decides the draws,
    the log-probabilities are the log-softmax of the drawn categories, and the
    frequencies match the probabilities (chi-square, fixed seed)."""
    from fastrollout.modules.distributions import TorchCategorical

    probs = torch.tensor([0.05, 0.15, 0.3, 0.5])
    logits = (probs.log() + 2.0).repeat(20_000, 1)
    dist = TorchCategorical.from_logits(logits)
    torch.manual_seed(3)
    actions, logp = dist.sample_with_logp()
    torch.manual_seed(3)
    again, _ = dist.sample_with_logp()
    assert torch.equal(actions, again)
    assert actions.dtype == torch.int64 and logp.dtype == torch.float32
    assert actions.shape == logp.shape == (20_000,)
    torch.testing.assert_close(logp, probs.log()[actions])
    counts = torch.bincount(actions, minlength=4).double()
    expected = probs.double() * 20_000
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 16.27, (counts, expected)  # 3 dof, p = 0.001
    torch.manual_seed(4)
    assert not torch.equal(dist.sample_with_logp()[0], actions)


@pytest.mark.parametrize(
    "row",
    [[0.0, float("nan")], [float("inf"), 1.0], [float("-inf"), float("-inf")]],
    ids=["nan", "plus-inf", "all-minus-inf"],
)
def test_categorical_sample_with_logp_refuses_what_multinomial_refuses(row: list) -> None:
    """Logits no category can be drawn from raise (as ``torch.multinomial`` does for
    their probabilities), whichever row holds them; -inf beside finite logits is fine."""
    from fastrollout.modules.distributions import TorchCategorical

    logits = torch.tensor([[0.5, 0.1], row, [1.0, 2.0]])
    with pytest.raises(ValueError, match=r"row 1 .*no category can be drawn"):
        TorchCategorical.from_logits(logits).sample_with_logp()
    with pytest.raises(ValueError, match="no category can be drawn"):  # the torch path
        TorchCategorical.from_logits(logits.double()).sample_with_logp()
    with pytest.raises(RuntimeError):
        torch.distributions.Categorical(logits=logits, validate_args=False).sample()
    masked = torch.tensor([[float("-inf"), 0.0]] * 50)
    for logits in (masked, masked.double()):
        actions, logp = TorchCategorical.from_logits(logits).sample_with_logp()
        assert actions.tolist() == [1] * 50 and logp.tolist() == [0.0] * 50


@settings(max_examples=200, deadline=None)
@given(
    data=st.data(),
    rows=st.integers(1, 6),
    categories=st.integers(1, 7),
)
def test_native_categorical_draw_is_the_inverse_cdf(data, rows, categories) -> None:
    """``_core.categorical_draw`` picks, per row, the first category whose cumulative
    softmax probability exceeds the row's uniform (a float64 numpy reference), never a
    -inf category, and returns that category's log-softmax."""
    from fastrollout._core import categorical_draw

    finite = st.floats(-30, 30, width=32)
    logits = np.array(
        data.draw(
            st.lists(
                st.lists(
                    st.one_of(finite, st.just(-np.inf)), min_size=categories, max_size=categories
                ).filter(lambda r: any(np.isfinite(r))),
                min_size=rows,
                max_size=rows,
            )
        ),
        np.float32,
    )
    uniforms = np.array(
        data.draw(st.lists(st.floats(0, 1, exclude_max=True), min_size=rows, max_size=rows)),
        np.float64,
    )
    actions, logp = categorical_draw(logits, uniforms)
    assert actions.dtype == np.int64 and logp.dtype == np.float32
    x = logits.astype(np.float64)
    weights = np.exp(x - x.max(axis=1, keepdims=True))
    cumulative = np.cumsum(weights, axis=1) / weights.sum(axis=1, keepdims=True)
    for r in range(rows):
        a = int(actions[r])
        assert np.isfinite(logits[r, a])
        expected = int(np.searchsorted(cumulative[r], uniforms[r], side="right"))
        if expected != a:  # only where the uniform sits on a boundary, up to rounding
            assert abs(cumulative[r, min(a, expected)] - uniforms[r]) < 1e-12
        log_softmax = x[r] - x[r].max() - np.log(weights[r].sum())
        np.testing.assert_allclose(logp[r], log_softmax[a], rtol=1e-6, atol=1e-6)
