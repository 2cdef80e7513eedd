"""Fast paths taken for speed behave exactly as the slow paths they replace."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

from fastrollout.core import Columns
from fastrollout.modules import DefaultMLPModule, RLModule

OBS = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)


class _Frozen(nn.Module):
    """A submodule that overrides ``train``: it stays in eval mode whatever it is told."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Dropout(0.5)
        self.calls: list[bool] = []

    def train(self, mode: bool = True) -> _Frozen:
        self.calls.append(mode)
        return super().train(False)


class _Mixed(RLModule):
    def setup(self) -> None:
        self.body = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.5), nn.Sequential(nn.Tanh()))
        self.frozen = _Frozen()
        self.nested = DefaultMLPModule(observation_space=OBS, action_space=gym.spaces.Discrete(2))
        self.empty: nn.Module | None = None
        self.pi = nn.Linear(8, 2)

    def _forward(self, batch, **kwargs):
        seen = {m.training for m in self.modules() if not isinstance(m, _Frozen | nn.Dropout)}
        assert seen == {False}, "forward_exploration/inference must run in eval mode"
        return {Columns.ACTION_DIST_INPUTS: self.pi(self.body(batch[Columns.OBS]))}


def _flags(m: nn.Module) -> list[tuple[str, bool]]:
    return [(name, sub.training) for name, sub in m.named_modules()]


def _reference_flags(mode: bool) -> list[tuple[str, bool]]:
    torch.manual_seed(0)
    ref = _Mixed(observation_space=OBS, action_space=gym.spaces.Discrete(2))
    nn.Module.train(ref, mode)
    return _flags(ref)


@given(modes=st.lists(st.booleans(), min_size=1, max_size=6))
def test_train_sets_the_same_flags_as_torch(modes):
    m = _Mixed(observation_space=OBS, action_space=gym.spaces.Discrete(2))
    for mode in modes:
        assert m.train(mode) is m
        assert _flags(m) == _reference_flags(mode)
    # The overriding submodule was asked every time, with the mode given.
    assert m.frozen.calls == modes
    assert m.frozen.training is False and m.frozen.inner.training is False


def test_eval_goes_through_the_fast_train():
    m = _Mixed(observation_space=OBS, action_space=gym.spaces.Discrete(2))
    assert m.eval() is m
    assert _flags(m) == _reference_flags(False)


@pytest.mark.parametrize("method", ["forward_exploration", "forward_inference"])
@pytest.mark.parametrize("start", [True, False])
def test_forward_runs_in_eval_and_restores_the_mode(method, start):
    m = _Mixed(observation_space=OBS, action_space=gym.spaces.Discrete(2))
    m.train(start)
    before = _flags(m)
    out = getattr(m, method)({Columns.OBS: torch.zeros(3, 4)})
    assert out[Columns.ACTION_DIST_INPUTS].shape == (3, 2)
    assert _flags(m) == before


@pytest.mark.parametrize("bad", [1, None, "eval"])
def test_train_rejects_a_non_bool_mode(bad):
    m = DefaultMLPModule(observation_space=OBS, action_space=gym.spaces.Discrete(2))
    with pytest.raises(ValueError, match="boolean"):
        m.train(bad)
    assert all(sub.training for sub in m.modules())
