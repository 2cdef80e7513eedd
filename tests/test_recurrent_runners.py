"""Stateful (recurrent) modules in both runners: the live state per sub-env and agent.

A stateful module's ``STATE_IN`` is its initial state at every episode start (and for
every agent that joins), else the ``STATE_OUT`` of the slot's previous step; every step's
``STATE_OUT`` is recorded in ``extra_model_outputs`` (RLlib's layout), so a chunk cut by
``sample()`` carries in its look-back the state its continuation starts from.

``RunningSumModule`` makes the chaining checkable exactly: its state counts the steps it
has seen and sums their observations, so ``state_out["n"]`` at an episode's step ``t``
must be ``t + 1``, whatever the chunks, sub-envs, backends and agents were.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fastrollout as fr
from _runner_envs import SeededLengthEnv
from fastrollout.core import Columns
from fastrollout.core.tree import tree_map
from fastrollout.env.examples import JoinLeaveEnv
from fastrollout.modules import RLModule, RLModuleSpec


class RunningSumModule(RLModule):
    """State: the number of steps seen and the sum of their observations (per row)."""

    def setup(self) -> None:
        dim = int(np.prod(self.observation_space.shape))
        self.dim = dim
        self.logits = torch.nn.Linear(dim, int(self.action_space.n))

    def get_initial_state(self) -> dict[str, Any]:
        return {"n": torch.zeros(1), "sum": torch.zeros(self.dim)}

    def _forward(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        obs = batch[Columns.OBS].float().flatten(2)  # (B, T, dim)
        state = batch[Columns.STATE_IN]
        steps = torch.arange(1, obs.shape[1] + 1, dtype=obs.dtype)[None, :, None]
        n = state["n"][:, None] + steps
        total = state["sum"][:, None] + torch.cumsum(obs, 1)
        return {
            Columns.ACTION_DIST_INPUTS: self.logits(total / n),
            Columns.STATE_OUT: {"n": n[:, -1], "sum": total[:, -1]},
        }


def sum_runner(
    env: Any = SeededLengthEnv, n: int = 2, **env_runners: Any
) -> fr.SingleAgentEnvRunner:
    config = (
        fr.RunnerConfig()
        .environment(env)
        .env_runners(num_envs_per_env_runner=n, **env_runners)
        .rl_module(rl_module_spec=RLModuleSpec(module_class=RunningSumModule))
        .debugging(seed=1)
    )
    return fr.SingleAgentEnvRunner(config=config)


def check_chain(chunks: list[Any], seen: dict[str, tuple[int, np.ndarray]]) -> None:
    """Each chunk's states continue its episode's: n counts steps, sum adds observations.

    ``seen`` maps an episode id to (steps so far, observation sum so far) across calls.
    """
    for c in chunks:
        if len(c) == 0:
            continue
        out = c.get_extra_model_outputs(Columns.STATE_OUT)
        obs = np.asarray(c.get_observations())[:-1].reshape(len(c), -1)
        start, total = seen.get(c.id_, (0, np.zeros(obs.shape[1])))
        assert start == c.t_started, (c.id_, start, c.t_started)
        if c.t_started:
            # The look-back holds the predecessor's last state, the continuation's start.
            back = c.get_extra_model_outputs(Columns.STATE_OUT, -1, neg_index_as_lookback=True)
            assert float(back["n"][0]) == start
            np.testing.assert_allclose(back["sum"], total, rtol=1e-5)
        np.testing.assert_array_equal(out["n"][:, 0], np.arange(start + 1, start + len(c) + 1))
        sums = total + np.cumsum(obs, 0)
        np.testing.assert_allclose(out["sum"], sums, rtol=1e-5)
        seen[c.id_] = (start + len(c), sums[-1])


def test_states_chain_across_cuts_and_start_over_at_each_episode() -> None:
    runner = sum_runner(n=3, rollout_fragment_length=4)
    seen: dict[str, Any] = {}
    for _ in range(6):
        check_chain(runner.sample(), seen)
    assert any(t > 4 for t, _ in seen.values())  # (episodes spanning several calls)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(1, 4),
    fragments=st.lists(st.integers(1, 17), min_size=1, max_size=5),
)
def test_any_fragments_and_sub_env_counts_chain_exactly(n: int, fragments: list[int]) -> None:
    runner = sum_runner(n=n)
    seen: dict[str, Any] = {}
    for k in fragments:
        check_chain(runner.sample(num_timesteps=k), seen)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_every_in_process_backend_chains(mode: str) -> None:
    runner = sum_runner(n=2, rollout_fragment_length=5, gym_env_vectorize_mode=mode)
    seen: dict[str, Any] = {}
    try:
        for _ in range(4):
            check_chain(runner.sample(), seen)
    finally:
        runner.stop()


@pytest.mark.parametrize("explore", [False, True])
def test_greedy_and_exploring_calls_chain(explore: bool) -> None:
    runner = sum_runner(n=2, rollout_fragment_length=6)
    seen: dict[str, Any] = {}
    for _ in range(3):
        check_chain(runner.sample(explore=explore), seen)


def test_random_actions_leave_the_state_where_it_was() -> None:
    # Random actions run no module: they record no state and advance none, so the
    # first module step after them starts from the state before them (here, the initial
    # state of fresh episodes), as RLlib's runner reads no STATE_OUT from such steps.
    runner = sum_runner(n=2)
    randoms = runner.sample(num_timesteps=4, random_actions=True, force_reset=True)
    assert all(Columns.STATE_OUT not in c.extra_model_outputs for c in randoms)
    steps_before = {c.id_: len(c) for c in randoms if not c.is_done}
    for c in runner.sample(num_timesteps=4):
        n = c.get_extra_model_outputs(Columns.STATE_OUT)["n"][:, 0]
        if c.id_ in steps_before:
            assert c.t_started == steps_before[c.id_]
        np.testing.assert_array_equal(n, np.arange(1, len(c) + 1))


def test_the_state_of_a_reset_row_is_not_the_new_episodes() -> None:
    # A sub-env whose episode just ended gets an action for the step gymnasium's
    # autoreset ignores; its new episode still starts from the initial state.
    runner = sum_runner(n=1, rollout_fragment_length=40)
    episodes = [e for e in runner.sample() if e.t_started == 0]
    assert len(episodes) >= 2
    check_chain(episodes, {})


def test_a_state_out_of_the_wrong_structure_is_refused_by_module_and_key() -> None:
    class Broken(RunningSumModule):
        def _forward(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
            out = super()._forward(batch, **kwargs)
            out[Columns.STATE_OUT] = {"n": out[Columns.STATE_OUT]["n"]}  # "sum" is missing
            return out

    config = (
        fr.RunnerConfig()
        .environment(SeededLengthEnv)
        .env_runners(num_envs_per_env_runner=2)
        .rl_module(rl_module_spec=RLModuleSpec(module_class=Broken))
    )
    runner = fr.SingleAgentEnvRunner(config=config)
    with pytest.raises(ValueError, match=r"module 'default_policy'.*'state_out'"):
        runner.sample(num_timesteps=4)


def test_a_state_in_of_the_wrong_batch_size_is_refused_before_the_forward_pass() -> None:
    class BadStateIn(fr.connectors.ConnectorV2):
        def __call__(self, *, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
            for module_batch in batch.values():
                module_batch[Columns.STATE_IN] = {"n": torch.zeros(5, 1), "sum": torch.zeros(5, 2)}
            return batch

    config = (
        fr.RunnerConfig()
        .environment(SeededLengthEnv)
        .env_runners(num_envs_per_env_runner=2, env_to_module_connector=lambda *a: BadStateIn())
        .rl_module(rl_module_spec=RLModuleSpec(module_class=RunningSumModule))
    )
    runner = fr.SingleAgentEnvRunner(config=config)
    with pytest.raises(ValueError, match=r"module 'default_policy'.*'state_in'.*batch of 2"):
        runner.sample(num_timesteps=4)
    # Nothing was stored: the episodes hold their reset observations only.
    assert all(len(e) == 0 for e in runner._episodes)


# -- multi-agent -----------------------------------------------------------------------


def sum_ma_runner(n: int = 2, **env_runners: Any) -> fr.MultiAgentEnvRunner:
    config = (
        fr.RunnerConfig()
        .environment(JoinLeaveEnv)
        .env_runners(num_envs_per_env_runner=n, **env_runners)
        .multi_agent(policies={"p"}, policy_mapping_fn=lambda aid, *a, **k: "p")
        .rl_module(rl_module_spec=RLModuleSpec(module_class=RunningSumModule))
        .debugging(seed=2)
    )
    return fr.MultiAgentEnvRunner(config=config)


def check_ma_chain(episodes: list[Any], seen: dict[Any, Any]) -> None:
    for e in episodes:
        for aid, ae in e.agent_episodes.items():
            key = (e.id_, aid)
            # Agent chunks chain as single-agent chunks do, each from its own start.
            ae_seen = {ae.id_: seen[key]} if key in seen else {}
            check_chain([ae], ae_seen)
            if ae.id_ in ae_seen:
                seen[key] = ae_seen[ae.id_]


def test_multi_agent_states_per_agent_chain_and_start_at_joins() -> None:
    runner = sum_ma_runner(n=2, rollout_fragment_length=3)
    seen: dict[Any, Any] = {}
    for _ in range(8):
        check_ma_chain(runner.sample(), seen)
    assert len({aid for _, aid in seen}) >= 2


# -- against RLlib 2.60's runners ---------------------------------------------------------


def _stateless_cartpole() -> Any:
    pytest.importorskip("ray.rllib")
    from ray.rllib.examples.envs.classes.stateless_cartpole import StatelessCartPole

    return StatelessCartPole


def _lstm_config(env: Any, n: int, fragment: int, shared: bool = True) -> Any:
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    model = DefaultModelConfig(
        use_lstm=True, max_seq_len=10, lstm_cell_size=16, vf_share_layers=shared
    )
    return (
        PPOConfig()
        .environment(env)
        .env_runners(num_envs_per_env_runner=n, rollout_fragment_length=fragment)
        .rl_module(model_config=model)
        .debugging(seed=4)
    )


def _same_chunks(ours: list[Any], theirs: list[Any], actions: bool = True) -> None:
    assert [(len(a), a.t_started, a.is_done) for a in ours] == [
        (len(b), b.t_started, b.is_done) for b in theirs
    ]
    for a, b in zip(ours, theirs, strict=True):
        np.testing.assert_array_equal(a.get_observations(), b.get_observations())
        if actions:
            np.testing.assert_array_equal(a.get_actions(), b.get_actions())
        # (Log-probabilities of different draws differ: compared where the actions are.)
        for key in (Columns.ACTION_LOGP, Columns.ACTION_DIST_INPUTS)[not actions :]:
            np.testing.assert_allclose(
                a.get_extra_model_outputs(key), b.get_extra_model_outputs(key), atol=1e-6
            )
        tree_map(
            lambda x, y: np.testing.assert_allclose(x, y, atol=1e-6),
            a.get_extra_model_outputs(Columns.STATE_OUT),
            b.get_extra_model_outputs(Columns.STATE_OUT),
        )
        if a.t_started:
            back = (Columns.STATE_OUT, -1)
            mine = a.get_extra_model_outputs(*back, neg_index_as_lookback=True)
            rllib = b.get_extra_model_outputs(*back, neg_index_as_lookback=True)
            tree_map(lambda x, y: np.testing.assert_allclose(x, y, atol=1e-6), mine, rllib)


@pytest.mark.parametrize(
    ("explore", "shared"),
    [(False, True), (False, False), (True, False)],
    ids=["greedy-fastrollouts_twin", "greedy-rllibs_module", "exploring-rllibs_module"],
)
def test_single_agent_lstm_steps_as_rllibs_runner(explore: bool, shared: bool) -> None:
    """With shared value layers the runner acts with fastrollout's twin of RLlib's LSTM
    module (same weights, same outputs); else with RLlib's module, whose draws come from
    torch's generator as in RLlib's runner (the twin's come from numpy's)."""
    from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner as RLlibRunner

    env = _stateless_cartpole()
    theirs = RLlibRunner(config=_lstm_config(env, 2, 7, shared))
    ours = fr.SingleAgentEnvRunner(config=_lstm_config(env, 2, 7, shared))
    assert isinstance(ours.module, fr.modules.DefaultLSTMModule) == shared
    ours.set_state({"rl_module": theirs.module.get_state(), "weights_seq_no": 1})
    for k in range(4):
        torch.manual_seed(k)
        mine = ours.sample(explore=explore)
        torch.manual_seed(k)
        rllib = theirs.sample(explore=explore)
        _same_chunks(mine, rllib)


@pytest.mark.parametrize("explore", [False, True])
def test_multi_agent_lstm_steps_as_rllibs_runner_with_agents_joining_and_leaving(
    explore: bool,
) -> None:
    # The env ignores actions, so observations, distribution inputs and states agree
    # whatever the draws; actions are compared where both act greedily (the two runners
    # draw their modules' actions from torch's generator in different orders).
    pytest.importorskip("ray.rllib")
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
    from ray.rllib.env.multi_agent_env_runner import MultiAgentEnvRunner as RLlibRunner

    from test_differential_multi_agent_env_runner import SeededLifetimesEnv

    def config() -> Any:
        # (One sub-env and agent steps, as RLlib's multi-agent loop counts its steps
        # alike then; see test_differential_multi_agent_env_runner.)
        return (
            PPOConfig()
            .environment(SeededLifetimesEnv)
            .env_runners(num_envs_per_env_runner=1, rollout_fragment_length=7)
            .multi_agent(
                policies={"p0", "p1"},
                policy_mapping_fn=lambda aid, *a, **k: "p0" if aid == "a" else "p1",
                count_steps_by="agent_steps",
            )
            .rl_module(
                model_config=DefaultModelConfig(use_lstm=True, max_seq_len=10, lstm_cell_size=8)
            )
            .debugging(seed=5)
        )

    theirs = RLlibRunner(config=config())
    ours = fr.MultiAgentEnvRunner(config=config())
    ours.set_state({"rl_module": theirs.module.get_state(), "weights_seq_no": 1})
    joined_late = 0
    # (Four calls: on the fifth, RLlib's runner returns three chunks where fastrollout's
    # returns two, with or without a recurrent module: a difference in multi-agent
    # chunking that this test is not about.)
    for k in range(4):
        torch.manual_seed(k)
        mine = ours.sample(explore=explore)
        torch.manual_seed(k)
        rllib = theirs.sample(explore=explore)
        order = sorted(range(len(mine)), key=lambda j: (mine[j].env_t_started, len(mine[j])))
        mine = [mine[j] for j in order]
        rllib = sorted(rllib, key=lambda e: (e.env_t_started, len(e)))
        assert [(e.env_t_started, len(e)) for e in mine] == [
            (e.env_t_started, len(e)) for e in rllib
        ]
        for a, b in zip(mine, rllib, strict=True):
            assert sorted(a.agent_episodes) == sorted(b.agent_episodes)
            for aid in a.agent_episodes:
                pair = [a.agent_episodes[aid]], [b.agent_episodes[aid]]
                _same_chunks(*pair, actions=not explore)
            joined_late += "c" in a.agent_episodes
    assert joined_late  # (agent "c" joins mid-episode and starts from the initial state)


def test_the_runners_logp_is_the_learners_over_the_whole_episode() -> None:
    pytest.importorskip("ray.rllib")
    env = _stateless_cartpole()
    runner = fr.SingleAgentEnvRunner(config=_lstm_config(env, 2, 7))
    module = runner.module
    for episode in runner.sample(num_episodes=3):
        obs = torch.as_tensor(np.asarray(episode.get_observations())[:-1])[None]
        state = {k: torch.as_tensor(v)[None] for k, v in module.get_initial_state().items()}
        with torch.no_grad():
            out = module.forward_train({Columns.OBS: obs, Columns.STATE_IN: state})
        dist = module.get_train_action_dist_cls().from_logits(out[Columns.ACTION_DIST_INPUTS][0])
        logp = dist.logp(torch.as_tensor(episode.get_actions())).numpy()
        np.testing.assert_allclose(
            logp, episode.get_extra_model_outputs(Columns.ACTION_LOGP), atol=1e-5
        )


def test_a_box_observation_env_without_lstm_is_unchanged() -> None:
    # (Feed-forward modules keep the one-pass default step: no state, no time axis.)
    config = fr.RunnerConfig().environment("CartPole-v1").env_runners(num_envs_per_env_runner=2)
    runner = fr.SingleAgentEnvRunner(config=config.debugging(seed=0))
    episodes = runner.sample(num_timesteps=10)
    assert runner._default_act is not None
    assert all(Columns.STATE_OUT not in e.extra_model_outputs for e in episodes)
    assert isinstance(runner.env.single_observation_space, gym.spaces.Box)
