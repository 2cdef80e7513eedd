"""The RolloutWorker with a recurrent (stateful) policy: the old stack's recurrent columns.

RLlib 2.60's old-stack worker gives a recurrent policy's batch, per episode chunk,
``seq_lens`` (sequences of ``max_seq_len`` rows from the chunk's first row),
``state_out_i`` per row and ``state_in_i`` per *sequence* (the state before its first
step). These tests check fastrollout's columns against that rule value for value (the
state before a sequence is the previous row's ``state_out`` within an episode, the
module's initial state at an episode's start, the previous batch's last ``state_out`` at a
continuation), that ``learn_on_batch`` trains on zero-padded sequences, and the layout
against RLlib's own old-stack worker with its LSTM model.
"""

from __future__ import annotations

import importlib.util
import itertools
import warnings
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

import fastrollout as fr
from fastrollout.batches import MultiAgentBatch, SampleBatch
from fastrollout.core import Columns
from fastrollout.env.examples import JoinLeaveEnv
from fastrollout.evaluation.recurrent import (
    SequenceLayout,
    flatten_state,
    seq_lens_for,
    state_paths,
    unflatten_state,
)
from fastrollout.modules import RLModule, RLModuleSpec

K = 7  # steps per episode of FixedEnv
CELL = 5


class FixedEnv(gym.Env):  # type: ignore[type-arg]
    """Episodes of exactly ``K`` steps; observations depend on the step only."""

    def __init__(self, config: Any = None) -> None:
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.t = 0

    def _obs(self) -> np.ndarray:
        t = self.t
        return np.array([t, t * t / 10.0, (-1.0) ** t], dtype=np.float32)

    def reset(self, *, seed: int | None = None, options: Any = None) -> Any:
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action: Any) -> Any:
        self.t += 1
        return self._obs(), float(action) - 0.5 * self.t, self.t >= K, False, {}


class LSTMModule(RLModule):
    """A small LSTM policy with a value head; the state is ``{"h", "c"}``, h starting at 0.25."""

    def setup(self) -> None:
        dim = int(np.prod(self.observation_space.shape))
        self.encoder = torch.nn.Linear(dim, CELL)
        self.lstm = torch.nn.LSTM(CELL, CELL, batch_first=True)
        self.pi = torch.nn.Linear(CELL, int(self.action_space.n))
        self.vf = torch.nn.Linear(CELL, 1)

    def get_initial_state(self) -> dict[str, Any]:
        # A non-zero h, so that a zero-filled state_in cannot pass for the initial state.
        return {"h": torch.full((CELL,), 0.25), "c": torch.zeros(CELL)}

    def _forward(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        obs = batch[Columns.OBS].float().flatten(2)  # (B, T, dim)
        state = batch[Columns.STATE_IN]
        x = torch.tanh(self.encoder(obs))
        y, (h, c) = self.lstm(x, (state["h"][None], state["c"][None]))
        return {
            Columns.ACTION_DIST_INPUTS: self.pi(y),
            Columns.VF_PREDS: self.vf(y).squeeze(-1),
            Columns.STATE_OUT: {"h": h[0], "c": c[0]},
        }


SPEC = RLModuleSpec(module_class=LSTMModule, model_config={"max_seq_len": 3})
# The state leaves in state_in_i order: dict keys sorted ("c" before "h").
INITIAL = [np.zeros(CELL, np.float32), np.full(CELL, 0.25, np.float32)]


def lstm_worker(
    num_envs: int = 2, fragment: int = 10, batch_mode: str = "truncate_episodes"
) -> fr.RolloutWorker:
    config = (
        fr.RunnerConfig()
        .env_runners(
            num_envs_per_env_runner=num_envs,
            rollout_fragment_length=fragment,
            batch_mode=batch_mode,
        )
        .rl_module(rl_module_spec=SPEC)
        .debugging(seed=3)
    )
    return fr.RolloutWorker(env_creator=FixedEnv, config=config)


def chunk_bounds(batch: SampleBatch) -> list[tuple[int, int]]:
    """The row ranges of the batch's episode chunks (each chunk has its own unroll_id)."""
    ids = np.asarray(batch["unroll_id"])
    cuts = np.flatnonzero(ids[1:] != ids[:-1]) + 1
    bounds = [0, *cuts.tolist(), batch.count]
    return list(itertools.pairwise(bounds))


def check_recurrent_columns(
    batch: SampleBatch,
    max_seq_len: int,
    initial: list[np.ndarray],
    carried: dict[Any, list[np.ndarray]] | None = None,
) -> dict[Any, list[np.ndarray]]:
    """The old stack's rule for every chunk; returns each open episode's last state.

    Args:
        batch: A policy's batch.
        max_seq_len: Its sequences' length.
        initial: The initial state's leaves.
        carried: ``(eps_id, agent_index)`` -> the last state_out of a chunk of an earlier
            batch: a continuation's first sequence must start from it.
    """
    n_leaves = len(initial)
    assert sorted(k for k in batch if k.startswith("state_")) == sorted(
        [f"state_in_{i}" for i in range(n_leaves)] + [f"state_out_{i}" for i in range(n_leaves)]
    )
    seq_lens = np.asarray(batch["seq_lens"])
    assert seq_lens.dtype == np.int32
    assert int(seq_lens.sum()) == batch.count
    for i in range(n_leaves):
        assert batch[f"state_out_{i}"].shape == (batch.count, *initial[i].shape)
        assert batch[f"state_in_{i}"].shape == (len(seq_lens), *initial[i].shape)
    seq = 0
    out: dict[Any, list[np.ndarray]] = {}
    for start, end in chunk_bounds(batch):
        n = end - start
        lens = seq_lens[seq : seq + len(seq_lens_for(n, max_seq_len))]
        np.testing.assert_array_equal(lens, seq_lens_for(n, max_seq_len))
        key = (int(batch["eps_id"][start]), int(batch["agent_index"][start]))
        for j, first in enumerate(range(start, end, max_seq_len)):
            for i in range(n_leaves):
                state_in = batch[f"state_in_{i}"][seq + j]
                if first > start:
                    expected = batch[f"state_out_{i}"][first - 1]
                elif batch["t"][first] == 0:
                    expected = initial[i]
                elif carried is not None and key in carried:
                    expected = carried[key][i]
                else:
                    continue  # a continuation of a chunk this test did not see
                np.testing.assert_array_equal(state_in, expected)
        seq += len(lens)
        if not (batch["terminateds"][end - 1] or batch["truncateds"][end - 1]):
            out[key] = [batch[f"state_out_{i}"][end - 1] for i in range(n_leaves)]
    assert seq == len(seq_lens)
    return out


# -- columns -----------------------------------------------------------------------------


@pytest.mark.parametrize("batch_mode", ["truncate_episodes", "complete_episodes"])
def test_columns_follow_the_old_stacks_rule(batch_mode: str) -> None:
    worker = lstm_worker(batch_mode=batch_mode)
    try:
        batch = worker.sample()
        assert isinstance(batch, SampleBatch)
        assert batch.max_seq_len == 3
        assert Columns.STATE_OUT not in batch  # the nested column became state_out_i
        check_recurrent_columns(batch, 3, INITIAL)
        assert batch.count >= 20
        # Every episode start reads the initial state: h (state_in_1) 0.25, c 0.
        starts = np.flatnonzero(batch["t"] == 0)
        assert len(starts) >= 2
    finally:
        worker.stop()


def test_states_chain_across_sample_calls() -> None:
    worker = lstm_worker(num_envs=3, fragment=5)
    try:
        carried: dict[Any, list[np.ndarray]] = {}
        continued = 0
        for _ in range(5):
            batch = worker.sample()
            first_rows = [s for s, _ in chunk_bounds(batch) if batch["t"][s] > 0]
            continued += sum(
                (int(batch["eps_id"][s]), int(batch["agent_index"][s])) in carried
                for s in first_rows
            )
            carried = check_recurrent_columns(batch, 3, INITIAL, carried)
        assert continued >= 3  # (continuations were checked against the last batch)
    finally:
        worker.stop()


def test_state_out_is_the_modules_state_after_each_step() -> None:
    # Replaying an episode's observations through the module from its initial state gives
    # the recorded state_out rows (state_out_0 = c, state_out_1 = h).
    worker = lstm_worker(num_envs=1, fragment=K)
    try:
        batch = worker.sample()
        assert batch["t"][0] == 0 and batch.count == K
        module = worker.get_policy().model
        obs = torch.as_tensor(batch["obs"])[None]
        state = {"h": torch.full((1, CELL), 0.25), "c": torch.zeros(1, CELL)}
        with torch.no_grad():
            x = torch.tanh(module.encoder(obs))
            y, _ = module.lstm(x, (state["h"][None], state["c"][None]))
        np.testing.assert_allclose(batch["state_out_1"], y[0].numpy(), rtol=1e-5, atol=1e-6)
    finally:
        worker.stop()


def test_multi_agent_policies_get_columns_per_agent_chunk() -> None:
    config = (
        fr.RunnerConfig()
        .environment(env_config={})
        .env_runners(num_envs_per_env_runner=2, rollout_fragment_length=6)
        .multi_agent(
            policies={"p0", "p1"},
            policy_mapping_fn=lambda aid, *a, **k: "p0" if str(aid).endswith(("0", "2")) else "p1",
        )
        .rl_module(rl_module_spec=SPEC)
        .debugging(seed=1)
    )
    worker = fr.RolloutWorker(env_creator=lambda ctx: JoinLeaveEnv(), config=config)
    try:
        carried: dict[str, dict[Any, list[np.ndarray]]] = {"p0": {}, "p1": {}}
        for _ in range(3):
            batch = worker.sample()
            assert isinstance(batch, MultiAgentBatch)
            for pid, policy_batch in batch.policy_batches.items():
                carried[pid] = check_recurrent_columns(policy_batch, 3, INITIAL, carried[pid])
    finally:
        worker.stop()


# -- learning ----------------------------------------------------------------------------


def test_learn_on_batch_trains_on_sequences() -> None:
    worker = lstm_worker(num_envs=2, fragment=10)
    try:
        batch = worker.sample()
        policy = worker.get_policy()
        assert policy.is_recurrent() and policy.num_state_tensors() == 2
        # Each sequence run from its state_in reproduces the sampled log-probabilities.
        logp = policy.compute_log_likelihoods(
            batch["actions"],
            batch["obs"],
            [batch["state_in_0"], batch["state_in_1"]],
            seq_lens=batch["seq_lens"],
        )
        np.testing.assert_allclose(logp.numpy(), batch["action_logp"], rtol=1e-5, atol=1e-6)
        before = {k: v.copy() for k, v in worker.get_weights()["default_policy"].items()}
        info = worker.learn_on_batch(batch)["default_policy"]
        stats = info["learner_stats"]
        # Before the step the ratio is 1 in every real row: the padding is masked out.
        assert stats["mean_kl"] < 1e-6 and stats["clip_fraction"] == 0.0
        assert np.isfinite(stats["total_loss"])
        after = worker.get_weights()["default_policy"]
        assert any(not np.array_equal(before[k], after[k]) for k in before)
        assert not np.array_equal(before["lstm.weight_hh_l0"], after["lstm.weight_hh_l0"])
        # The runner acts with the new weights.
        acting = worker.runner._module["default_policy"].get_state()
        np.testing.assert_array_equal(acting["lstm.weight_hh_l0"], after["lstm.weight_hh_l0"])
    finally:
        worker.stop()


def test_values_run_the_sequences_from_their_state() -> None:
    # vf_preds of every row equal the module's values over the whole chunk from its start
    # state (the post-processing runs sequences, not single rows from a zero state).
    worker = lstm_worker(num_envs=1, fragment=K)
    try:
        batch = worker.sample()
        module = worker.get_policy().model
        state = {"h": torch.full((1, CELL), 0.25), "c": torch.zeros(1, CELL)}
        with torch.no_grad():
            out = module._forward(
                {Columns.OBS: torch.as_tensor(batch["obs"])[None], Columns.STATE_IN: state}
            )
        np.testing.assert_allclose(
            batch["vf_preds"], out[Columns.VF_PREDS][0].numpy(), rtol=1e-5, atol=1e-6
        )
    finally:
        worker.stop()


def test_sample_and_learn_keeps_sequences_whole_in_minibatches() -> None:
    worker = lstm_worker(num_envs=2, fragment=12)
    seen: list[SampleBatch] = []
    policy = worker.get_policy()
    original = policy.learn_on_batch

    def spy(batch: SampleBatch) -> dict[str, Any]:
        seen.append(batch)
        return original(batch)

    policy.learn_on_batch = spy  # type: ignore[method-assign]
    try:
        info, steps = worker.sample_and_learn(num_sgd_iter=2, sgd_minibatch_size=8)
        assert steps >= 24 and "default_policy" in info
        assert len(seen) >= 4
        for mb in seen:
            assert mb.count >= 8
            assert len(mb["state_in_0"]) == len(mb["seq_lens"])
            # A minibatch's sequences are whole: each is its chunk's rows, in step order.
            layout = SequenceLayout(mb["seq_lens"])
            t = layout.pad(np.asarray(mb["t"]))
            for s, n in enumerate(mb["seq_lens"]):
                np.testing.assert_array_equal(np.diff(t[s, :n]), np.ones(n - 1))
    finally:
        worker.stop()


def test_a_batch_without_state_columns_is_refused_by_name() -> None:
    worker = lstm_worker()
    try:
        batch = worker.sample()
        del batch["state_in_1"]
        with pytest.raises(KeyError, match=r"recurrent.*state_in_1"):
            worker.learn_on_batch(batch)
    finally:
        worker.stop()


def test_recorded_episodes_keep_state_out_per_step_and_drop_per_sequence_columns() -> None:
    from fastrollout.evaluation.io import batch_to_episodes

    worker = lstm_worker()
    try:
        batch = worker.sample()
        episodes = batch_to_episodes(batch)
        assert sum(len(e) for e in episodes) == batch.count
        for e in episodes:
            keys = set(e.extra_model_outputs)
            assert {"state_out_0", "state_out_1"} <= keys
            assert not {"seq_lens", "state_in_0", "state_in_1"} & keys
    finally:
        worker.stop()


# -- helpers -----------------------------------------------------------------------------


def test_state_leaves_are_numbered_in_dm_trees_order() -> None:
    state = {"z": np.zeros(1), "a": (np.ones(2), {"y": np.full(3, 2.0), "b": np.full(4, 3.0)})}
    paths = state_paths(state)
    assert paths == [("a", 0), ("a", 1, "b"), ("a", 1, "y"), ("z",)]
    flat = flatten_state(state, paths)
    assert [len(x) for x in flat] == [2, 4, 3, 1]
    back = unflatten_state(flat, state)
    assert list(back) == ["z", "a"] and back["a"][1]["y"] is state["a"][1]["y"]
    with pytest.raises(ValueError, match="lacks"):
        flatten_state({"z": 1}, paths)


def test_sequence_layout_pads_with_zeros_and_round_trips() -> None:
    layout = SequenceLayout([3, 1, 2])
    rows = np.arange(6, dtype=np.float32) + 1
    padded = layout.pad(rows)
    np.testing.assert_array_equal(padded, [[1, 2, 3], [4, 0, 0], [5, 6, 0]])
    np.testing.assert_array_equal(layout.mask, padded != 0)
    np.testing.assert_array_equal(layout.unpad(padded), rows)
    tensor = layout.pad(torch.as_tensor(rows)[:, None].repeat(1, 2))
    assert tuple(tensor.shape) == (3, 3, 2)
    np.testing.assert_array_equal(layout.unpad(tensor)[:, 0].numpy(), rows)
    with pytest.raises(ValueError, match="positive"):
        SequenceLayout([2, 0])
    with pytest.raises(ValueError, match="5 rows"):
        layout.pad(rows[:5])
    np.testing.assert_array_equal(seq_lens_for(7, 3), [3, 3, 1])
    np.testing.assert_array_equal(seq_lens_for(6, 3), [3, 3])


# -- against RLlib 2.60's old-stack worker ------------------------------------------------


@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="RLlib 2.60 not installed")
@pytest.mark.parametrize("num_envs", [1, 2])
def test_layout_matches_rlllibs_old_stack_lstm_worker(num_envs: int) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from ray.rllib.algorithms.ppo import PPOConfig
        from ray.rllib.algorithms.ppo.ppo_torch_policy import PPOTorchPolicy
        from ray.rllib.evaluation.rollout_worker import RolloutWorker

        rllib_config = (
            PPOConfig()
            .api_stack(enable_rl_module_and_learner=False, enable_env_runner_and_connector_v2=False)
            .env_runners(rollout_fragment_length=10, num_envs_per_env_runner=num_envs)
            .training(model={"use_lstm": True, "max_seq_len": 3, "lstm_cell_size": CELL})
            .debugging(seed=0)
        )
        theirs_w = RolloutWorker(
            env_creator=FixedEnv, default_policy_class=PPOTorchPolicy, config=rllib_config
        )
    ours_w = lstm_worker(num_envs=num_envs, fragment=10)
    try:
        zeros = [np.zeros(CELL, np.float32)] * 2  # RLlib's LSTM starts from zeros
        carried_theirs: dict[Any, list[np.ndarray]] = {}
        carried_ours: dict[Any, list[np.ndarray]] = {}
        for _ in range(3):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                theirs = theirs_w.sample().policy_batches["default_policy"]
            ours = ours_w.sample()
            assert ours.count == theirs.count == 10 * num_envs
            # The same recurrent columns, dtypes and shapes; the same rule on both.
            keys = ("seq_lens", "state_in_0", "state_in_1", "state_out_0", "state_out_1")
            assert set(keys) <= set(theirs) and set(keys) <= set(ours)
            for key in keys:
                a, b = np.asarray(ours[key]), np.asarray(theirs[key])
                assert (a.dtype, a.shape) == (b.dtype, b.shape), key
            assert ours.max_seq_len == theirs.max_seq_len == 3
            carried_theirs = check_recurrent_columns(theirs, 3, zeros, carried_theirs)
            carried_ours = check_recurrent_columns(ours, 3, INITIAL, carried_ours)

            # The envs reset in lockstep: the same chunks, so the same sequences per chunk
            # (the chunks' order in the batch may differ).
            def per_chunk(b: SampleBatch) -> list[tuple[int, int]]:
                return sorted((int(b["t"][s]), e - s) for s, e in chunk_bounds(b))

            assert per_chunk(ours) == per_chunk(theirs)
            assert sorted(ours["seq_lens"].tolist()) == sorted(theirs["seq_lens"].tolist())
    finally:
        theirs_w.stop()
        ours_w.stop()


@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="RLlib 2.60 not installed")
def test_an_rllib_old_stack_lstm_config_builds_the_default_lstm_module() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from ray.rllib.algorithms.ppo import PPOConfig

        rllib_config = (
            PPOConfig()
            .api_stack(enable_rl_module_and_learner=False, enable_env_runner_and_connector_v2=False)
            .env_runners(rollout_fragment_length=10, num_envs_per_env_runner=2)
            .training(model={"use_lstm": True, "max_seq_len": 4, "lstm_cell_size": 8})
            .debugging(seed=0)
        )
    worker = fr.RolloutWorker(env_creator=FixedEnv, config=rllib_config)
    try:
        module = worker.get_policy().model
        assert isinstance(module, fr.modules.DefaultLSTMModule)
        assert module.model_config["max_seq_len"] == 4
        batch = worker.sample()
        assert batch.max_seq_len == 4 and sum(batch["seq_lens"]) == batch.count
        assert np.asarray(batch["state_out_0"]).shape == (batch.count, 1, 8)
    finally:
        worker.stop()
