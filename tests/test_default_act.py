"""The runners' direct step for the default module and pieces (``DefaultAct``) samples
exactly what the general path samples, and steps aside wherever it would differ."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import pytest
import torch
from tests._helpers import assert_same_outcome, snapshot

import fastrollout as fr
from fastrollout.connectors.connector_v2 import ConnectorV2
from fastrollout.core import Columns
from fastrollout.modules import DefaultMLPModule
from fastrollout.runners._default_act import DefaultAct

EXTRAS = (Columns.ACTION_LOGP, Columns.ACTION_DIST_INPUTS, "weights_seq_no")


def assert_same_episode(expected: Any, actual: Any) -> None:
    """Everything observable but the random ids."""
    a, b = snapshot(expected, EXTRAS), snapshot(actual, EXTRAS)
    for key in a.keys() - {"id_", "multi_agent_episode_id"}:
        assert_same_outcome(a[key], b[key], key)


def episode_pairs(expected: Any, actual: Any) -> list[tuple[Any, Any]]:
    """``(expected, actual)`` single-agent episodes: the pair itself, or each agent's pair
    of two multi-agent episodes (by the actual episode's agents)."""
    if hasattr(actual, "agent_episodes"):
        return [(expected.agent_episodes[aid], ae) for aid, ae in actual.agent_episodes.items()]
    return [(expected, actual)]


def _counting(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Counts the steps the direct path took and handed back."""
    counts = {"direct": 0, "handed back": 0}
    call = DefaultAct.__call__

    def counted(self: DefaultAct, runner: Any, batch: Any, ts: int) -> Any:
        out = call(self, runner, batch, ts)
        counts["direct" if out is not None else "handed back"] += 1
        return out

    monkeypatch.setattr(DefaultAct, "__call__", counted)
    return counts


def _general_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(DefaultAct, "of", classmethod(lambda cls, *args, **kw: None))


def _single(num_envs: int, env: str = "CartPole-v1", **config: Any) -> fr.SingleAgentEnvRunner:
    c = fr.RunnerConfig().environment(env).debugging(seed=3)
    c = c.env_runners(num_envs_per_env_runner=num_envs, **config)
    return fr.SingleAgentEnvRunner(config=c)


def _multi(num_envs: int) -> fr.MultiAgentEnvRunner:
    c = fr.RunnerConfig().debugging(seed=3).env_runners(num_envs_per_env_runner=num_envs)
    c = c.environment(fr.env.make_multi_agent("CartPole-v1"), env_config={"num_agents": 3})
    c = c.multi_agent(
        policies={"p0", "p1"}, policy_mapping_fn=lambda aid, *a, **k: f"p{int(aid) % 2}"
    )
    return fr.MultiAgentEnvRunner(config=c)


def _sample_twice(make: Any, monkeypatch: pytest.MonkeyPatch, **kw: Any) -> tuple[list, list]:
    with monkeypatch.context() as m:
        counts = _counting(m)
        direct = make().sample(**kw)
        assert counts["direct"] > 0 and counts["handed back"] == 0
    with monkeypatch.context() as m:
        _general_only(m)
        general = make().sample(**kw)
    return direct, general


@pytest.mark.parametrize(
    ("num_envs", "env"), [(1, "CartPole-v1"), (4, "CartPole-v1"), (3, "FrozenLake-v1")]
)
def test_single_agent_direct_step_samples_what_the_general_path_samples(
    monkeypatch: pytest.MonkeyPatch, num_envs: int, env: str
) -> None:
    """FrozenLake's Discrete observations go through the module's one-hot encoding."""
    direct, general = _sample_twice(lambda: _single(num_envs, env), monkeypatch, num_timesteps=120)
    assert len(direct) == len(general)
    for a, b in zip(direct, general, strict=True):
        assert_same_episode(b, a)
        assert list(a.extra_model_outputs) == list(b.extra_model_outputs)


def test_multi_agent_direct_step_samples_what_the_general_path_samples(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    direct, general = _sample_twice(lambda: _multi(2), monkeypatch, num_timesteps=80)
    assert len(direct) == len(general)
    for a, b in zip(direct, general, strict=True):
        assert a.env_t == b.env_t and sorted(a.agent_episodes) == sorted(b.agent_episodes)
        for expected, actual in episode_pairs(b, a):
            assert_same_episode(expected, actual)


def test_direct_step_metrics_keys_are_the_general_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    runners = []
    for direct in (True, False):
        with monkeypatch.context() as m:
            if not direct:
                _general_only(m)
            runner = _single(2)
            runner.sample(num_timesteps=40)
            runners.append(runner)
    assert sorted(runners[0].get_metrics()) == sorted(runners[1].get_metrics())


class _Noop(ConnectorV2):
    def __call__(self, *, rl_module: Any, batch: Any, episodes: Any, **kwargs: Any) -> Any:
        return batch


def test_user_module_to_env_piece_turns_the_direct_step_off() -> None:
    c = fr.RunnerConfig().environment("CartPole-v1").debugging(seed=0)
    c = c.env_runners(module_to_env_connector=lambda *args, **kwargs: [_Noop()])
    runner = fr.SingleAgentEnvRunner(config=c)
    runner.sample(num_timesteps=5)
    assert runner._default_act is None


@pytest.mark.parametrize("agents", [0, 3], ids=["single-agent", "multi-agent"])
def test_greedy_direct_step_samples_what_the_general_path_samples(
    monkeypatch: pytest.MonkeyPatch, agents: int
) -> None:
    """Not exploring, the direct step takes the argmax as ``GetActions`` does."""
    make = (lambda: _multi(2)) if agents else (lambda: _single(2))
    direct, general = _sample_twice(make, monkeypatch, num_timesteps=40, explore=False)
    assert len(direct) == len(general)
    for a, b in zip(direct, general, strict=True):
        for expected, actual in episode_pairs(b, a):
            assert_same_episode(expected, actual)
            np.testing.assert_array_equal(actual.get_extra_model_outputs(Columns.ACTION_LOGP), 0.0)


def test_hook_replaced_layer_and_subclass_are_honoured(monkeypatch: pytest.MonkeyPatch) -> None:
    """A forward hook on a wrapper is seen (the module's own forward pass runs, the draw
    stays direct); a subclass that overrides ``_forward`` gets its own forward pass."""
    runner = _single(1)
    counts = _counting(monkeypatch)
    module = runner.module
    calls: list[int] = []
    handle = module.pi.register_forward_hook(lambda *args: calls.append(1))
    runner.sample(num_timesteps=6)
    assert len(calls) == counts["direct"] >= 6 and counts["handed back"] == 0
    handle.remove()

    class Doubled(DefaultMLPModule):
        def _forward(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
            out = super()._forward(batch, **kwargs)
            return {Columns.ACTION_DIST_INPUTS: out[Columns.ACTION_DIST_INPUTS] * 2}

    sub = Doubled(
        observation_space=module.observation_space,
        action_space=module.action_space,
        inference_only=module.inference_only,
    )
    sub.load_state_dict(module.state_dict())
    sub.eval()
    runner.module = sub
    episodes = runner.sample(num_timesteps=6, force_reset=True)
    for e in episodes:
        obs = torch.from_numpy(np.asarray(e.get_observations(slice(0, len(e)))))
        # Row by row, as the runner with one sub-env ran them: BLAS may pick another kernel
        # for a taller batch, whose float32 sums differ in the last bits (AMD's MKL
        # kernels do, by up to 2e-6 relative).
        with torch.no_grad():
            plain = torch.cat(
                [
                    module.forward_inference({Columns.OBS: row})[Columns.ACTION_DIST_INPUTS]
                    for row in obs.split(1)
                ]
            )
        logits = e.get_extra_model_outputs(Columns.ACTION_DIST_INPUTS, slice(0, len(e)))
        np.testing.assert_allclose(logits, 2 * plain.numpy(), rtol=1e-6)


class _WithExtra(fr.modules.RLModule):
    """A user module (not a DefaultMLPModule) with a categorical head and an extra output."""

    def setup(self) -> None:
        self.net = torch.nn.Linear(4, 2)

    def _forward(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        logits = self.net(batch[Columns.OBS])
        return {Columns.ACTION_DIST_INPUTS: logits, "embeddings": logits.detach() * 3}


class _OwnActions(_WithExtra):
    """Gives its own actions: the pipeline's GetActions leaves them."""

    def _forward(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        out = super()._forward(batch, **kwargs)
        out[Columns.ACTIONS] = out[Columns.ACTION_DIST_INPUTS].argmax(-1)
        return out


class _OwnLogp(_WithExtra):
    """Gives its own log-probabilities: the pipeline only samples."""

    def _forward(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        out = super()._forward(batch, **kwargs)
        out[Columns.ACTION_LOGP] = torch.zeros(out[Columns.ACTION_DIST_INPUTS].shape[0])
        return out


class _KwargsSeen(_WithExtra):
    """Records the keywords of its exploration forward pass."""

    seen: ClassVar[list[dict[str, Any]]] = []

    def _forward_exploration(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        _KwargsSeen.seen.append(dict(kwargs))
        return self._forward(batch)


@pytest.mark.parametrize("module_class", [_WithExtra, _OwnActions, _OwnLogp])
@pytest.mark.parametrize("explore", [True, False])
def test_user_module_steps_as_the_general_path(
    monkeypatch: pytest.MonkeyPatch, module_class: type, explore: bool
) -> None:
    """A user module with a categorical distribution takes the direct step with its own
    forward pass; its outputs, the pipeline's draws (own actions or log-probabilities)
    and the episodes are the general path's."""
    from fastrollout.modules import RLModuleSpec

    def make() -> fr.SingleAgentEnvRunner:
        c = fr.RunnerConfig().environment("CartPole-v1").debugging(seed=4)
        c = c.env_runners(num_envs_per_env_runner=3)
        c = c.rl_module(rl_module_spec=RLModuleSpec(module_class=module_class))
        return fr.SingleAgentEnvRunner(config=c)

    direct, general = _sample_twice(make, monkeypatch, num_timesteps=45, explore=explore)
    assert len(direct) == len(general)
    for a, b in zip(direct, general, strict=True):
        assert_same_episode(b, a)
        assert list(a.extra_model_outputs) == list(b.extra_model_outputs)
        assert "embeddings" in a.extra_model_outputs


def test_user_module_gets_the_exploration_step_count(monkeypatch: pytest.MonkeyPatch) -> None:
    from fastrollout.modules import RLModuleSpec

    seen: dict[bool, list] = {}
    for direct in (True, False):
        with monkeypatch.context() as m:
            if not direct:
                _general_only(m)
            _KwargsSeen.seen = []
            c = fr.RunnerConfig().environment("CartPole-v1").debugging(seed=4)
            c = c.rl_module(rl_module_spec=RLModuleSpec(module_class=_KwargsSeen))
            runner = fr.SingleAgentEnvRunner(config=c)
            runner.sample(num_timesteps=5)
            runner.sample(num_timesteps=5)
            assert (runner._default_act is not None) == direct
            seen[direct] = _KwargsSeen.seen
    assert seen[True] == seen[False] == [{"t": t} for t in range(10)]


def test_a_piece_added_during_sampling_is_used_from_the_next_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The direct step re-checks the pipeline every step: a piece a callback adds in the
    middle of ``sample`` runs from then on."""
    runner = _single(1)
    counts = _counting(monkeypatch)
    seen: list[int] = []

    class Spy(ConnectorV2):
        def __call__(self, *, rl_module: Any, batch: Any, episodes: Any, **kw: Any) -> Any:
            seen.append(1)
            return batch

    steps = {"n": 0}
    act = runner._act

    def act_then_add(batch: Any, explore: bool, ts: int) -> Any:
        steps["n"] += 1
        if steps["n"] == 3:
            runner._connectors.module_to_env.prepend(Spy())
        return act(batch, explore, ts)

    monkeypatch.setattr(runner, "_act", act_then_add)
    runner.sample(num_timesteps=8)
    assert counts["direct"] == 2 and counts["handed back"] >= 5 and len(seen) >= 5


class _ToDouble(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.double()


def test_logits_the_native_draw_does_not_take_go_through_the_pipeline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """float64 logits (a layer appended to the head) are drawn by the pipeline from the
    outputs already computed: one forward pass per vector step all the same."""
    runner = _single(2)
    module = runner.module
    module.pi.net.mlp.append(_ToDouble())
    forwards: list[int] = []
    acts: list[int] = []
    module._plain_actor_layers()[-1].register_forward_hook(lambda *a: forwards.append(1))
    act = runner._act
    monkeypatch.setattr(runner, "_act", lambda *a: (acts.append(1), act(*a))[1])
    episodes = runner.sample(num_timesteps=10)
    assert sum(len(e) for e in episodes) >= 10
    assert runner._default_act is not None
    for e in episodes:
        assert e.get_extra_model_outputs(Columns.ACTION_LOGP).dtype == np.float64
    assert len(forwards) == len(acts) > 0


def test_default_env_to_module_is_converted_directly_as_the_pipeline_converts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The pipeline's last ``NumpyToTensor`` converts without its keyword call; the result
    is the piece's own. Pieces before it still run as pieces."""
    from fastrollout.connectors.env_to_module.numpy_to_tensor import NumpyToTensor

    runner = _single(3)
    pipeline = runner._connectors.env_to_module
    piece = pipeline.connectors[-1]
    assert type(piece) is NumpyToTensor
    calls: list[str] = []
    monkeypatch.setattr(NumpyToTensor, "__call__", lambda *a, **k: calls.append("call"))
    obs = np.arange(12, dtype=np.float64).reshape(3, 4)
    direct = runner._connect(pipeline, {"default_policy": {Columns.OBS: obs}}, True)
    assert calls == []
    monkeypatch.undo()
    general = piece(
        batch={"default_policy": {Columns.OBS: obs}}, rl_module=runner._module, episodes=[]
    )
    assert torch.equal(
        direct["default_policy"][Columns.OBS], general["default_policy"][Columns.OBS]
    )
    assert direct["default_policy"][Columns.OBS].dtype == torch.float32

    seen: list[int] = []

    class Spy(ConnectorV2):
        def __call__(self, *, rl_module: Any, batch: Any, episodes: Any, **kw: Any) -> Any:
            seen.append(1)
            return batch

    pipeline.prepend(Spy())
    runner.sample(num_timesteps=6)
    assert seen


def test_a_method_set_on_the_module_instance_is_honoured() -> None:
    runner = _single(1)
    module = runner.module
    forward = module._forward
    calls: list[int] = []

    def patched(batch: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return forward(batch, **kwargs)

    module._forward = patched
    runner.sample(num_timesteps=4)
    # The module's own forward pass runs (the direct step only skips it for the
    # default one).
    assert runner._default_act is not None
    assert "default_policy" not in runner._default_act._direct_forward
    assert len(calls) >= 4


class _Strided(torch.nn.Module):
    """Returns the same logits as a non-contiguous view."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x, x], dim=-1)[:, ::2]


def test_non_contiguous_logits_are_drawn_as_the_general_path_draws_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def make() -> fr.SingleAgentEnvRunner:
        runner = _single(3)
        runner.module.pi.net.mlp.append(_Strided())
        return runner

    direct, general = _sample_twice(make, monkeypatch, num_timesteps=30)
    for a, b in zip(direct, general, strict=True):
        assert_same_episode(b, a)


def test_shared_layers_and_other_hiddens_sample_as_the_general_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def make() -> fr.SingleAgentEnvRunner:
        c = fr.RunnerConfig().environment("CartPole-v1").debugging(seed=5)
        c = c.env_runners(num_envs_per_env_runner=2).rl_module(
            model_config={
                "vf_share_layers": True,
                "fcnet_hiddens": [32, 16],
                "head_fcnet_hiddens": [8],
                "fcnet_activation": "relu",
            }
        )
        return fr.SingleAgentEnvRunner(config=c)

    direct, general = _sample_twice(make, monkeypatch, num_timesteps=40)
    for a, b in zip(direct, general, strict=True):
        assert_same_episode(b, a)


def test_runner_calls_a_pipeline_that_overrides_call() -> None:
    """The runner runs a pipeline's pieces without ``__call__``'s keyword packing, unless
    the pipeline's class has its own ``__call__``: then that is called, with the
    runner's module, episodes, explore flag, shared data and metrics."""
    from fastrollout.connectors.pipeline import EnvToModulePipeline

    calls: list[dict[str, Any]] = []

    class Logged(EnvToModulePipeline):
        def __call__(self, **kwargs: Any) -> Any:
            calls.append(kwargs)
            return super().__call__(**kwargs)

    runner = _single(2)
    default = runner._connectors.env_to_module
    runner._connectors.env_to_module = Logged(connectors=list(default.connectors))
    runner.sample(num_timesteps=4)
    assert calls
    assert set(calls[0]) == {"batch", "rl_module", "episodes", "explore", "shared_data", "metrics"}
    assert calls[0]["rl_module"] is runner._module and calls[0]["explore"] is True


def _same_tree(a: Any, b: Any) -> None:
    assert type(a) is type(b)
    if isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            _same_tree(a[k], b[k])
    elif isinstance(a, tuple | list):
        for x, y in zip(a, b, strict=True):
            _same_tree(x, y)
    else:
        assert a.dtype == b.dtype and a.device == b.device and torch.equal(a, b)


@pytest.mark.parametrize(
    "value",
    [
        np.arange(6.0).reshape(2, 3),
        np.zeros((2, 2), np.uint8),
        np.arange(4, dtype=np.float32)[::2],
        {"a": np.ones((2, 1)), "b": (np.zeros(2, np.int64), np.ones(2, bool))},
    ],
    ids=["float64", "uint8", "strided", "nested"],
)
def test_convert_leaf_is_what_convert_makes_of_the_column(value: Any) -> None:
    from fastrollout.connectors.env_to_module.numpy_to_tensor import NumpyToTensor

    module = _single(1)._module
    piece = NumpyToTensor()
    leaf = piece.convert_leaf(module, "default_policy", Columns.OBS, value)
    whole = piece.convert(module, {"default_policy": {Columns.OBS: value}})
    _same_tree(whole["default_policy"][Columns.OBS], leaf)
    with pytest.raises(TypeError, match="default_policy/obs"):
        piece.convert_leaf(module, "default_policy", Columns.OBS, np.array([object()]))


@pytest.mark.parametrize("agents", [0, 3], ids=["single-agent", "multi-agent"])
def test_default_env_to_module_pipeline_is_not_called_per_step(
    monkeypatch: pytest.MonkeyPatch, agents: int
) -> None:
    """With the default env-to-module pipeline (one ``NumpyToTensor``), the runners convert
    the observations through ``convert_observations``, without calling the pipeline; the
    episodes are those the pipeline call gives, and another piece brings the call back."""
    from fastrollout.runners.env_runner import EnvRunner

    connected: list[Any] = []
    connect = EnvRunner._connect

    def counted(self: Any, pipeline: Any, batch: Any, explore: bool) -> Any:
        connected.append(pipeline)
        return connect(self, pipeline, batch, explore)

    def sample(direct: bool) -> list:
        runner: Any = _multi(2) if agents else _single(2)
        if not direct:
            runner._connectors.env_to_module.prepend(_Noop())
        with monkeypatch.context() as m:
            m.setattr(EnvRunner, "_connect", counted)
            episodes = runner.sample(num_timesteps=30)
        e2m = [p for p in connected if p is runner._connectors.env_to_module]
        assert bool(e2m) != direct
        connected.clear()
        return episodes

    direct, general = sample(True), sample(False)
    assert len(direct) == len(general)
    for a, b in zip(direct, general, strict=True):
        for expected, actual in episode_pairs(b, a):
            assert_same_episode(expected, actual)


@pytest.mark.parametrize("explore", [True, False])
def test_a_stateful_modules_direct_step_samples_what_the_general_path_samples(
    monkeypatch: pytest.MonkeyPatch, explore: bool
) -> None:
    """A stateful module's own forward pass (STATE_IN in, a one-step time axis on its
    outputs, STATE_OUT recorded) goes through the direct draw as well."""
    from test_recurrent_runners import RunningSumModule

    def make() -> fr.SingleAgentEnvRunner:
        c = fr.RunnerConfig().environment("CartPole-v1").debugging(seed=3)
        c = c.env_runners(num_envs_per_env_runner=3)
        spec = fr.modules.RLModuleSpec(module_class=RunningSumModule)
        return fr.SingleAgentEnvRunner(config=c.rl_module(rl_module_spec=spec))

    direct, general = _sample_twice(make, monkeypatch, num_timesteps=90, explore=explore)
    assert len(direct) == len(general)
    for a, b in zip(direct, general, strict=True):
        assert_same_episode(b, a)
        for k, v in b.get_extra_model_outputs(Columns.STATE_OUT).items():
            np.testing.assert_array_equal(a.get_extra_model_outputs(Columns.STATE_OUT)[k], v)
