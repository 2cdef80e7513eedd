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


# -- to_tensor: arrays torch can share are shared as the general path shares them -------

_SHARED_DTYPES = [np.float32, np.float16, np.uint8, np.int8, np.int16, np.int32, np.int64, np.bool_]


class _Sub(np.ndarray):
    """An ndarray subclass: ``to_tensor`` takes its general path for it."""


def _general_to_tensor(array: np.ndarray) -> torch.Tensor:
    from fastrollout.modules.device import to_tensor

    return to_tensor(array.view(_Sub))


@pytest.mark.parametrize("dtype", _SHARED_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("layout", ["contiguous", "strided", "readonly", "swapped"])
def test_to_tensor_fast_path_equals_the_general_path(dtype, layout):
    """Arrays of the dtypes torch shares take a fast path; every layout gives the same
    tensor as the general path (an ndarray subclass takes that one), and only writable
    C-contiguous native arrays share memory."""
    from fastrollout.modules.device import to_tensor

    array = (np.arange(12) % 3).astype(dtype).reshape(3, 4)
    if layout == "strided":
        array = array[:, ::2]
    elif layout == "readonly":
        array.setflags(write=False)
    elif layout == "swapped":
        array = array.astype(array.dtype.newbyteorder())
    fast = to_tensor(array, torch.device("cpu"))
    general = _general_to_tensor(array)
    assert fast.dtype == general.dtype and fast.shape == general.shape
    assert torch.equal(fast, general)
    assert fast.is_contiguous()
    # (one-byte types have no byte order: "swapped" leaves them native)
    shared = layout == "contiguous" or (layout == "swapped" and array.itemsize == 1)
    assert (fast.data_ptr() == array.__array_interface__["data"][0]) == shared


def test_to_tensor_device_memo_tells_cpu_from_other_devices():
    """The CPU test of a device is remembered per device object; a device that is not
    the CPU is still moved to (meta: no GPU needed)."""
    from fastrollout.modules.device import _CPU_BY_DEVICE, to_tensor

    array = np.ones((2, 3), np.float32)
    cpu = torch.device("cpu")
    assert to_tensor(array, cpu).device == cpu
    assert _CPU_BY_DEVICE[id(cpu)] == (cpu, True)
    meta = torch.device("meta")
    out = to_tensor(array, meta)
    assert out.device == meta and out.shape == (2, 3)
    for _ in range(100):  # devices made per call do not grow the memo without bound
        to_tensor(array, torch.device("cpu"))
    assert len(_CPU_BY_DEVICE) <= 65


# -- grad_off / grad_restore: torch.no_grad's switch ----------------------------------


def test_grad_off_and_restore_as_no_grad():
    from fastrollout.modules.grad import grad_off, grad_restore

    assert torch.is_grad_enabled()
    was_on = grad_off()
    assert was_on and not torch.is_grad_enabled()
    assert not grad_off()  # already off: nothing to restore for the inner one
    grad_restore(False)
    assert not torch.is_grad_enabled()
    grad_restore(was_on)
    assert torch.is_grad_enabled()


def test_runner_restores_grad_mode_when_the_module_raises():
    """The runners switch autograd off per vector step; an error in the forward pass
    leaves it as it was."""
    import fastrollout as fr

    config = fr.RunnerConfig().environment("CartPole-v1").debugging(seed=0)
    runner = fr.SingleAgentEnvRunner(config=config)
    module = runner.module

    def broken(batch, **kwargs):
        assert not torch.is_grad_enabled()
        raise RuntimeError("broken forward")

    module._forward_exploration = broken
    with pytest.raises(RuntimeError, match="broken forward"):
        runner.sample(num_timesteps=4)
    assert torch.is_grad_enabled()


# -- the native categorical draw's uniforms -------------------------------------------


@given(st.lists(st.integers(1, 9), min_size=1, max_size=6), st.integers(0, 2**31 - 1))
def test_native_draw_uses_torch_rand_numbers_whatever_the_batch_sizes(sizes, seed):
    """The kept uniform buffers (one per batch size) give each draw the numbers
    ``torch.rand(n, dtype=float64)`` would give at that point of torch's stream."""
    from fastrollout._core import categorical_draw
    from fastrollout.modules.distributions import TorchCategorical

    gen = torch.Generator().manual_seed(seed)
    all_logits = [torch.randn(n, 3, generator=gen) for n in sizes]
    torch.manual_seed(seed)
    got = [TorchCategorical.from_logits(lg).sample_with_logp_numpy() for lg in all_logits]
    torch.manual_seed(seed)
    for lg, (actions, logp) in zip(all_logits, got, strict=True):
        uniforms = torch.rand(lg.shape[0], dtype=torch.float64)
        want_actions, want_logp = categorical_draw(lg.numpy(), uniforms.numpy())
        np.testing.assert_array_equal(actions, want_actions)
        np.testing.assert_array_equal(logp, want_logp)


def test_native_draw_uniform_buffers_are_per_thread():
    import threading

    from fastrollout.modules.distributions import _uniform_buffer

    mine = _uniform_buffer(5)
    assert _uniform_buffer(5)[0] is mine[0]
    theirs: list = []
    worker = threading.Thread(target=lambda: theirs.append(_uniform_buffer(5)))
    worker.start()
    worker.join()
    assert theirs[0][0] is not mine[0]
    assert theirs[0][1].base is not None  # the numpy view shares the tensor's memory


@pytest.mark.parametrize("episode_len", [3, 7])
def test_runner_length_guess_changes_no_episode(monkeypatch, episode_len):
    """The single-agent runner passes the longest recent episode length (and the vector
    steps it has left) to the record, which reserves room in the chunks' columns (image
    observations here); the episodes sampled are the same as without the guess,
    across chunk cuts, and the guess follows the episodes that ended."""
    from tests.test_default_act import assert_same_episode

    import fastrollout as fr
    import fastrollout.runners.single_agent_env_runner as sar
    from fastrollout.env.examples import SyntheticImageEnv

    record = sar.single_agent_record_vector_step
    guesses: list = []

    def without_guess(*args, **kwargs):
        args = args + (None,) * (10 - len(args))  # (the reset passes no guess)
        guesses.append(args[8:])  # (expected_len, steps_left)
        return record(*args[:8], None, None, **kwargs)

    def sample(guess: bool) -> list:
        c = fr.RunnerConfig().debugging(seed=5).env_runners(num_envs_per_env_runner=3)
        c = c.environment(
            SyntheticImageEnv, env_config={"episode_len": episode_len, "shape": (16, 16, 4)}
        ).rl_module(model_config={"conv_filters": [[4, 4, 4]]})
        runner = fr.SingleAgentEnvRunner(config=c)
        with monkeypatch.context() as m:
            if not guess:
                m.setattr(sar, "single_agent_record_vector_step", without_guess)
            return [e for _ in range(4) for e in runner.sample(num_timesteps=10)]

    expected = sample(guess=False)
    actual = sample(guess=True)
    assert len(expected) == len(actual)
    for e, a in zip(expected, actual, strict=True):
        assert_same_episode(e, a)
    lengths = [g[0] for g in guesses]
    assert lengths[0] is None and set(lengths[1:]) >= {episode_len}
    # After the reset, the first step: the vector steps left in the call (10 env steps,
    # 3 sub-envs) plus two.
    assert guesses[0] == (None, None) and guesses[1][1] == 5


def test_length_guess_reserves_room_only_after_a_chunks_first_step():
    """With ``expected_len``, a chunk's columns take room for the steps left to that
    length (at most ``steps_left``) right after its first step, for small items as for
    big ones, and none without a guess. (Seen in the native heap's count, which holds the
    blocks of 64 KiB and more: the items here are big enough for the room to be one.)"""
    from fastrollout import SingleAgentEpisode
    from fastrollout._core import native_heap_bytes, single_agent_record_vector_step

    def first_step_growth(
        item_bytes: int, expected_len: int | None, steps_left: int | None = None
    ) -> int:
        space = gym.spaces.Box(0, 255, (item_bytes,), np.uint8)
        eps = [SingleAgentEpisode(observation_space=space, action_space=gym.spaces.Discrete(2))]
        obs = np.ones((1, item_bytes), np.uint8)
        flags = np.zeros(1, bool)

        def step() -> None:
            single_agent_record_vector_step(
                eps, obs, np.zeros(1, np.int64), np.ones(1), flags, flags,
                expected_len=expected_len, steps_left=steps_left,
            )  # fmt: skip

        step()  # the reset
        before = native_heap_bytes()
        step()
        return native_heap_bytes() - before

    assert first_step_growth(1024, 200) >= 198 * 1024
    assert first_step_growth(512, 200) >= 198 * 512
    assert first_step_growth(1024, None) < 64 * 1024
    assert first_step_growth(512, None) < 64 * 1024
    # No more room than the steps the runner has left before it cuts the chunk.
    assert 10 * 8192 <= first_step_growth(8192, 200, steps_left=10) < 20 * 8192


def test_blank_like_is_what_the_constructor_makes_with_a_new_id():
    """``_blank_like`` (the runner's new episodes) copies a blank episode's layouts and
    specs: the copy records, reads and numpy'izes as a constructed episode does, its id
    is its own, and the template stays blank; a reset episode is not copied this way."""
    from tests._helpers import assert_same, assert_same_episode

    from fastrollout import SingleAgentEpisode
    from fastrollout.errors import EpisodeStateError

    obs_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    act_space = gym.spaces.Discrete(3)
    template = SingleAgentEpisode(observation_space=obs_space, action_space=act_space)
    copies = [template._blank_like() for _ in range(2)]
    assert len({template.id_, *(c.id_ for c in copies)}) == 3
    for copy in copies:
        made = SingleAgentEpisode(id_=copy.id_, observation_space=obs_space, action_space=act_space)
        assert_same(made.get_state(), copy.get_state())
        for e in (copy, made):
            e.add_env_reset(observation=np.zeros(3, np.float32), infos={})
            e.add_env_step(
                np.ones(3, np.float32), np.int64(2), 1.5, extra_model_outputs={"logp": -0.5}
            )
        assert_same_episode(made, copy, ("logp",))
        copy.to_numpy()
        made.to_numpy()
        assert_same_episode(made, copy, ("logp",))
    assert not template.is_reset and len(template) == 0
    with pytest.raises(EpisodeStateError, match="blank"):
        copies[0]._blank_like()


def test_runner_new_episodes_follow_the_envs_space_objects():
    """The single-agent runner's blank episode (copied for each new episode) is made again
    when the env's space objects change, so new episodes take the env's current spaces."""
    import fastrollout as fr

    runner = fr.SingleAgentEnvRunner(
        config=fr.RunnerConfig().environment("CartPole-v1").env_runners(num_envs_per_env_runner=2)
    )
    runner.sample(num_timesteps=20)
    first = runner._blank_episode
    assert first is not None and runner._episodes[0].observation_space is first.observation_space
    wider = gym.spaces.Box(-100.0, 100.0, (4,), np.float64)
    runner.env.single_observation_space = wider
    runner._new_episode(0)
    assert runner._blank_episode is not first
    assert runner._episodes[0].observation_space is wider
    runner._episodes[0].add_env_reset(observation=np.zeros(4), infos={})
    runner._episodes[0].to_numpy()
    assert runner._episodes[0].get_observations().dtype == np.float64


def test_new_agent_episodes_keep_overridden_methods_and_reuse_blank_layouts():
    """The native maker of new agents' episodes (``_new_agent_episode``) copies blank
    layouts and maps modules itself only where the classes keep ``_blank_like`` and
    ``module_for``; overrides of either are called, once per new agent. Agents with the
    same spaces get the same layouts, each with its own id, module and episode id."""
    from fastrollout import MultiAgentEpisode, SingleAgentEpisode

    obs_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    act_space = gym.spaces.Discrete(3)
    calls: list[str] = []

    class Copied(SingleAgentEpisode):
        __slots__ = ()

        def _blank_like(self) -> SingleAgentEpisode:
            calls.append("blank_like")
            return super()._blank_like()

    class Mapped(MultiAgentEpisode):
        _agent_episode_cls = Copied

        def module_for(self, agent_id):
            calls.append(f"module_for {agent_id}")
            return super().module_for(agent_id)

    spaces = {"a": obs_space, "b": obs_space}
    acts = {"a": act_space, "b": act_space}
    obs = {aid: np.zeros(3, np.float32) for aid in spaces}
    mapped = Mapped(id_="m", observation_space=spaces, action_space=acts)
    mapped.add_env_reset(observations=obs)
    assert calls == ["blank_like", "module_for a", "blank_like", "module_for b"]
    plain = MultiAgentEpisode(
        id_="p",
        observation_space=spaces,
        action_space=acts,
        agent_to_module_mapping_fn=lambda aid, ep: f"m_{aid}",
    )
    plain.add_env_reset(observations=obs)
    for ep in (mapped, plain):
        a, b = ep.agent_episodes["a"], ep.agent_episodes["b"]
        assert type(a) is ep._agent_episode_cls and a.id_ != b.id_
        assert (a.agent_id, b.agent_id, a.multi_agent_episode_id) == ("a", "b", ep.id_)
        assert a.observation_space is obs_space and a.action_space is act_space
        assert a.module_id == ep.module_for("a") and b.module_id == ep.module_for("b")
    assert plain._agent_to_module_mapping == {"a": "m_a", "b": "m_b"}
