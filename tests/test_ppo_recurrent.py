"""PPO on sequences for stateful modules: the sequence batch (state in, zero padding,
loss mask), the learner's view equal to the runner's, and the masked loss.

Episodes here are built by stepping a DefaultLSTMModule one step at a time, as a runner
does, recording each step's ``state_out`` and ``action_logp``.
"""

from __future__ import annotations

import importlib.util
import pathlib
import sys

import gymnasium as gym
import numpy as np
import pytest
import torch

from fastrollout import SingleAgentEpisode
from fastrollout.core import Columns
from fastrollout.core.tree import tree_map
from fastrollout.learners import PPOConfig, PPOLearner, build_ppo_batch, compute_gae, ppo_loss
from fastrollout.learners.ppo import ppo_update
from fastrollout.modules import DefaultLSTMModule, RLModule

OBS_SPACE = gym.spaces.Box(-10.0, 10.0, (3,), np.float32)
ACT_SPACE = gym.spaces.Discrete(2)
SEQ = 3
GAMMA, LAMBDA = 0.9, 0.8


def lstm_module(shared=False, seed=0, **config):
    torch.manual_seed(seed)
    return DefaultLSTMModule(
        observation_space=OBS_SPACE,
        action_space=ACT_SPACE,
        model_config={
            "lstm_cell_size": 8,
            "fcnet_hiddens": [16],
            "max_seq_len": SEQ,
            "vf_share_layers": shared,
            **config,
        },
    )


class Rollout:
    """One episode stepped by ``module`` as a runner steps it: per step the state in,
    the action, its logp, the state out and the value (with the state in)."""

    def __init__(self, module, steps, seed=0):
        rng = np.random.default_rng(seed)
        self.obs = rng.uniform(-1, 1, (steps + 1, 3)).astype(np.float32)
        self.rewards = rng.uniform(-1, 1, steps).astype(np.float32)
        self.actions, self.logp, self.state_out, self.values = [], [], [], []
        state = tree_map(lambda s: s[None], module.get_initial_state())
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for t in range(steps + 1):
                batch = {Columns.OBS: torch.as_tensor(self.obs[t][None, None]), "state_in": state}
                self.values.append(float(module.compute_values(batch)[0, 0]))
                if t == steps:
                    break
                out = module.forward_exploration(batch)
                dist = module.get_exploration_action_dist_cls().from_logits(
                    out[Columns.ACTION_DIST_INPUTS][:, 0]
                )
                probs = torch.softmax(out[Columns.ACTION_DIST_INPUTS][0, 0], -1)
                action = torch.multinomial(probs, 1, generator=g)
                self.actions.append(int(action[0]))
                self.logp.append(np.float32(dist.logp(action)[0]))
                state = out[Columns.STATE_OUT]
                self.state_out.append(tree_map(lambda s: s[0].numpy().copy(), state))

    def chunk(self, start, stop, *, lookback=0, terminated=False):
        """Steps ``start .. stop - 1`` as a numpy'ized chunk with ``lookback`` items."""
        first = start - lookback
        episode = SingleAgentEpisode(
            observations=list(self.obs[first : stop + 1]),
            actions=self.actions[first:stop],
            rewards=list(self.rewards[first:stop]),
            extra_model_outputs={
                Columns.STATE_OUT: self.state_out[first:stop],
                Columns.ACTION_LOGP: self.logp[first:stop],
            },
            len_lookback_buffer=lookback,
            t_started=start,
            terminated=terminated,
            observation_space=OBS_SPACE,
            action_space=ACT_SPACE,
        )
        episode.to_numpy()
        return episode


def assert_state_equal(actual, expected):
    """``actual`` (a batch row's state tree) equals ``expected`` (numpy or torch)."""
    tree_map(
        lambda a, e: np.testing.assert_array_equal(np.asarray(a), np.asarray(e)),
        actual,
        expected,
    )


@pytest.mark.parametrize("shared", [False, True])
def test_sequences_state_in_padding_and_mask(shared):
    """A 7-step chunk from the episode's start and a 5-step continuation (look-back 1),
    sequences of 3: state in is the initial state, then the state out one step before
    each sequence; the continuation starts from its look-back's state out."""
    module = lstm_module(shared)
    run = Rollout(module, 12)
    first, second = run.chunk(0, 7), run.chunk(7, 12, lookback=1)
    batch = build_ppo_batch(
        [first, second], {"default_policy": module}, gamma=GAMMA, lambda_=LAMBDA
    )["default_policy"]
    mask = batch[Columns.LOSS_MASK]
    assert mask.dtype == torch.bool
    np.testing.assert_array_equal(
        mask.numpy(), [[1, 1, 1], [1, 1, 1], [1, 0, 0], [1, 1, 1], [1, 1, 0]]
    )
    np.testing.assert_array_equal(batch[Columns.SEQ_LENS].numpy(), [3, 3, 1, 3, 2])
    initial = tree_map(lambda s: s.numpy(), module.get_initial_state())
    expected_state_in = [
        initial,
        run.state_out[2],
        run.state_out[5],
        run.state_out[6],
        run.state_out[9],
    ]
    for row, expected in enumerate(expected_state_in):
        assert_state_equal(tree_map(lambda s, r=row: s[r], batch[Columns.STATE_IN]), expected)
    # Steps in order in the real positions, zeros in the padding.
    obs = batch[Columns.OBS].numpy()
    assert obs.shape == (5, SEQ, 3)
    np.testing.assert_array_equal(obs[mask.numpy()], run.obs[:12])
    assert not obs[~mask.numpy()].any()
    np.testing.assert_array_equal(batch[Columns.ACTIONS][mask].numpy(), run.actions)
    assert not batch[Columns.ACTIONS][~mask].any()
    for key in (Columns.ACTION_LOGP, Columns.ADVANTAGES, Columns.VALUE_TARGETS, Columns.VF_PREDS):
        assert batch[key].shape == (5, SEQ) and not batch[key][~mask].any(), key
    np.testing.assert_array_equal(batch[Columns.ACTION_LOGP][mask].numpy(), run.logp)


@pytest.mark.parametrize("shared", [False, True])
def test_learner_view_equals_the_runner_view(shared):
    """With the weights that sampled, the train forward over the sequences recomputes
    the stored action_logp, and the values before the update (also the cut chunk's
    bootstrap value) are the ones stepping computed: GAE as from the stepped values."""
    module = lstm_module(shared, seed=3)
    run = Rollout(module, 13, seed=4)
    chunks = [run.chunk(0, 5), run.chunk(5, 13, lookback=2)]
    batch = build_ppo_batch(chunks, {"default_policy": module}, gamma=GAMMA, lambda_=LAMBDA)[
        "default_policy"
    ]
    mask = batch[Columns.LOSS_MASK]
    with torch.no_grad():
        out = module.forward_train(
            {Columns.OBS: batch[Columns.OBS], Columns.STATE_IN: batch[Columns.STATE_IN]}
        )
    dist = module.get_train_action_dist_cls().from_logits(out[Columns.ACTION_DIST_INPUTS][mask])
    logp = dist.logp(batch[Columns.ACTIONS][mask])
    torch.testing.assert_close(logp, torch.tensor(run.logp), rtol=0, atol=1e-5)
    torch.testing.assert_close(
        batch[Columns.VF_PREDS][mask], torch.tensor(run.values[:13]), rtol=0, atol=1e-5
    )
    # Chunk 1 is cut at step 5: its bootstrap is V(o_5) with the state out of step 4.
    adv = []
    for start, stop in ((0, 5), (5, 13)):
        a, _ = compute_gae(
            run.rewards[start:stop],
            np.array(run.values[start:stop]),
            run.values[stop],
            gamma=GAMMA,
            lambda_=LAMBDA,
        )
        adv.append(a)
    np.testing.assert_allclose(
        batch[Columns.ADVANTAGES][mask].numpy(), np.concatenate(adv), atol=1e-5
    )
    # So the first loss sees ratio 1 everywhere.
    _, stats = ppo_loss(module, batch, PPOConfig())
    assert stats["mean_kl"] == pytest.approx(0.0, abs=1e-6)
    assert stats["clip_fraction"] == 0.0


def test_terminated_chunk_bootstraps_with_zero():
    module = lstm_module()
    run = Rollout(module, 4)
    batch = build_ppo_batch(
        [run.chunk(0, 4, terminated=True)], {"default_policy": module}, gamma=1.0, lambda_=1.0
    )["default_policy"]
    mask = batch[Columns.LOSS_MASK]
    # lambda = gamma = 1: the targets are the returns to go, with nothing after the end.
    np.testing.assert_allclose(
        batch[Columns.VALUE_TARGETS][mask].numpy(), np.cumsum(run.rewards[::-1])[::-1], atol=1e-5
    )


def test_padding_does_not_enter_the_loss():
    """Garbage in the padded positions changes neither the loss nor its gradients."""
    module = lstm_module()
    run = Rollout(module, 7)
    batch = build_ppo_batch([run.chunk(0, 7)], {"default_policy": module})["default_policy"]
    pad = ~batch[Columns.LOSS_MASK]
    dirty = dict(batch)
    for key in (Columns.ACTION_LOGP, Columns.ADVANTAGES, Columns.VALUE_TARGETS):
        dirty[key] = batch[key].masked_fill(pad, 1e6)
    dirty[Columns.OBS] = batch[Columns.OBS].masked_fill(pad[..., None], 7.0)
    grads = []
    for b in (batch, dirty):
        module.zero_grad()
        loss, _ = ppo_loss(module, b, PPOConfig(entropy_coeff=0.1))
        loss.backward()
        grads.append([p.grad.clone() for p in module.parameters()])
        assert torch.isfinite(loss)
    for clean, noisy in zip(*grads, strict=True):
        torch.testing.assert_close(clean, noisy, rtol=0, atol=0)


def test_update_minibatches_count_sequences_and_stats_count_real_steps():
    module = lstm_module()
    run = Rollout(module, 14)
    chunks = [run.chunk(0, 8), run.chunk(8, 14, lookback=1)]  # 3 + 2 sequences of 3
    config = PPOConfig(num_epochs=2, minibatch_size=6, seed=0)  # 6 // 3 = 2 sequences
    batch = build_ppo_batch(chunks, {"default_policy": module})["default_policy"]
    optimizer = torch.optim.Adam(module.parameters(), lr=1e-3)
    stats = ppo_update(module, optimizer, batch, config, generator=torch.Generator().manual_seed(0))
    assert stats["num_gradient_steps"] == 2 * (5 // 2)
    learner = PPOLearner({"default_policy": lstm_module()}, config)
    result = learner.update(chunks)["default_policy"]
    assert result["num_module_steps_trained"] == 14
    assert np.isfinite(result["vf_explained_var"])


def test_errors_name_the_chunk_and_module():
    module = lstm_module()
    run = Rollout(module, 6)
    with pytest.raises(ValueError, match=r"t_started=3\).*no 'state_out' in its look-back"):
        build_ppo_batch([run.chunk(3, 6)], {"default_policy": module})
    plain = SingleAgentEpisode(
        observations=list(run.obs[:3]),
        actions=run.actions[:2],
        rewards=list(run.rewards[:2]),
        extra_model_outputs={Columns.ACTION_LOGP: run.logp[:2]},
        len_lookback_buffer=0,
        observation_space=OBS_SPACE,
        action_space=ACT_SPACE,
    )
    plain.to_numpy()
    with pytest.raises(
        ValueError, match=r"has no 'state_out', which module 'default_policy' is stateful"
    ):
        build_ppo_batch([plain], {"default_policy": module})

    class Stateful(RLModule):
        def get_initial_state(self):
            return {"h": torch.zeros(2)}

        def compute_values(self, batch, embeddings=None):
            raise AssertionError("not reached")

    custom = Stateful(observation_space=OBS_SPACE, action_space=ACT_SPACE)
    with pytest.raises(
        ValueError,
        match=r"module 'default_policy' \(Stateful\) is stateful and needs model_config",
    ):
        build_ppo_batch([run.chunk(0, 6)], {"default_policy": custom})


def test_feed_forward_batches_have_no_sequences():
    from fastrollout.modules import DefaultMLPModule

    module = DefaultMLPModule(
        observation_space=OBS_SPACE, action_space=ACT_SPACE, model_config={"fcnet_hiddens": [8]}
    )
    run = Rollout(lstm_module(), 5)
    batch = build_ppo_batch([run.chunk(0, 5)], {"default_policy": module})["default_policy"]
    assert Columns.LOSS_MASK not in batch and Columns.STATE_IN not in batch
    assert batch[Columns.OBS].shape == (5, 3)


def test_state_in_and_mask_as_rllib_learner_connectors():
    """Differential: RLlib's learner connector pieces (AddStatesFromEpisodesToBatch and
    the mask of AddTimeDimToBatchAndZeroPad), on RLlib episodes holding the same data,
    give the same state in per sequence and the same loss mask and sequence lengths."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        states = pytest.importorskip(
            "ray.rllib.connectors.common.add_states_from_episodes_to_batch"
        )
        padding = pytest.importorskip("ray.rllib.utils.postprocessing.zero_padding")
        episodes = pytest.importorskip("ray.rllib.env.single_agent_episode")
    module = lstm_module()
    run = Rollout(module, 15, seed=2)
    bounds = ((0, 7, 0), (7, 9, 1), (9, 15, 2))
    ours = build_ppo_batch(
        [run.chunk(a, b, lookback=k) for a, b, k in bounds], {"default_policy": module}
    )["default_policy"]
    ref_chunks = []
    for start, stop, lookback in bounds:
        first = start - lookback
        chunk = episodes.SingleAgentEpisode(
            observations=list(run.obs[first : stop + 1]),
            actions=run.actions[first:stop],
            rewards=list(run.rewards[first:stop]),
            extra_model_outputs={
                Columns.STATE_OUT: run.state_out[first:stop],
                Columns.ACTION_LOGP: run.logp[first:stop],
            },
            len_lookback_buffer=lookback,
            t_started=start,
            observation_space=OBS_SPACE,
            action_space=ACT_SPACE,
        )
        chunk.to_numpy()
        ref_chunks.append(chunk)
    connector = states.AddStatesFromEpisodesToBatch(as_learner_connector=True)
    ref = connector(rl_module=module, batch={}, episodes=ref_chunks, shared_data={})
    ref_state_in = [ref[Columns.STATE_IN][(chunk.id_,)][0] for chunk in ref_chunks]
    assert_state_equal(
        ours[Columns.STATE_IN], tree_map(lambda *xs: np.concatenate(xs), *ref_state_in)
    )
    masks, seq_lens = zip(
        *(padding.create_mask_and_seq_lens(len(c), SEQ) for c in ref_chunks), strict=True
    )
    np.testing.assert_array_equal(ours[Columns.LOSS_MASK].numpy(), np.concatenate(masks))
    np.testing.assert_array_equal(ours[Columns.SEQ_LENS].numpy(), np.concatenate(seq_lens))


# -- with the runners -----------------------------------------------------------------------

EXAMPLE = pathlib.Path(__file__).resolve().parents[1] / "examples" / "ppo.py"


def load_example():
    spec = importlib.util.spec_from_file_location("fastrollout_example_ppo_lstm", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def lstm_args(example, *extra):
    return example.parse_args(
        [
            "--env",
            "StatelessCartPole",
            "--lstm",
            "--max-seq-len",
            "16",
            "--lstm-cell-size",
            "32",
            "--hiddens",
            "32",
            "--device",
            "cpu",
            "--num-envs",
            "8",
            *extra,
        ]
    )


@pytest.mark.parametrize("shared", [False, True])
def test_runner_chunks_give_the_learner_the_runner_view(shared):
    """Chunks a runner sampled with the learner's weights, continuations (look-back)
    among them: the train forward over their sequences recomputes every stored
    action_logp, so the first loss sees ratio 1 everywhere."""
    example = load_example()
    args = lstm_args(example, "--seed", "3", "--rollout-fragment-length", "24")
    args.vf_share_layers = shared
    runner = example.make_runner(args)
    learner = example.make_learner(args, runner)
    try:
        runner.set_weights(learner.get_weights(), weights_seq_no=1)
        runner.sample(num_timesteps=8 * 24)
        chunks = runner.sample(num_timesteps=8 * 24)
    finally:
        runner.stop()
    assert any(c.t_started > 0 for c in chunks) and any(c.t_started == 0 for c in chunks)
    module = learner.modules["default_policy"]
    batch = build_ppo_batch(chunks, learner.modules)["default_policy"]
    mask = batch[Columns.LOSS_MASK]
    assert int(mask.sum()) == sum(len(c) for c in chunks)
    with torch.no_grad():
        out = module.forward_train(
            {Columns.OBS: batch[Columns.OBS], Columns.STATE_IN: batch[Columns.STATE_IN]}
        )
    dist = module.get_train_action_dist_cls().from_logits(out[Columns.ACTION_DIST_INPUTS][mask])
    torch.testing.assert_close(
        dist.logp(batch[Columns.ACTIONS][mask]), batch[Columns.ACTION_LOGP][mask], rtol=0, atol=1e-5
    )
    _, stats = ppo_loss(module, batch, PPOConfig())
    assert stats["mean_kl"] == pytest.approx(0.0, abs=1e-6) and stats["clip_fraction"] == 0.0


def test_lstm_ppo_improves_on_stateless_cartpole():
    """Seeded, 12k env steps of StatelessCartPole (no velocities) with a small LSTM:
    the mean return of the last 100 episodes climbs from random play (about 20) past
    40. Without memory it stays low: the MLP example stands at 34 after 50k steps
    (--env StatelessCartPole --hiddens 64 --seed 0). About 20-35 s on 2 busy cores."""
    example = load_example()
    args = lstm_args(
        example,
        "--seed",
        "0",
        "--timesteps",
        "12000",
        "--rollout-fragment-length",
        "128",
        "--num-epochs",
        "8",
        "--minibatch-size",
        "128",
        "--lr",
        "1e-3",
        "--no-anneal-lr",
    )
    threads = torch.get_num_threads()
    try:
        history = example.train(args, log=None)
    finally:
        torch.set_num_threads(threads)
    returns = [round(h["return_mean"]) for h in history]
    assert history[0]["return_mean"] < 30, returns
    assert history[-1]["return_mean"] >= 40, returns
