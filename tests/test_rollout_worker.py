"""RolloutWorker: batch modes, horizons, filters, clipping, learning, state, I/O, errors."""

from __future__ import annotations

import pickle
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fastrollout import RolloutWorker, RunnerConfig
from fastrollout.batches import MultiAgentBatch, SampleBatch, concat_samples
from fastrollout.env import MultiAgentEnv
from fastrollout.filters import RunningStat, synchronize


class CountingEnv(gym.Env):
    """Observations ``[k, k / 2]`` for the k-th observation it ever returns (actions do not
    matter); rewards cycle through ``rewards``; episodes last ``length`` steps."""

    def __init__(self, config=None):
        config = config or {}
        self.length = int(config.get("length", 7))
        self.rewards = list(config.get("rewards", [1.0]))
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.seen: list[np.ndarray] = []
        self.resets = 0
        self._k = int(config.get("offset", 0))
        self._t = 0

    def _obs(self):
        self._k += 1
        obs = np.array([self._k, self._k / 2], np.float32)
        self.seen.append(obs)
        return obs

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.resets += 1
        self._t = 0
        return self._obs(), {}

    def step(self, action):
        self._t += 1
        reward = self.rewards[(self._t - 1) % len(self.rewards)]
        return self._obs(), reward, self._t >= self.length, False, {}


def forget_env_check(worker):
    """Drops the observations the env check made (no filter saw them)."""
    worker.foreach_env(lambda e: e.unwrapped.seen.clear())


def counting(config=None):
    return lambda ctx: CountingEnv({**(config or {}), "offset": 1000 * ctx.vector_index})


def cartpole(ctx):
    return gym.make("CartPole-v1")


def make(env_creator=cartpole, **settings_):
    config = RunnerConfig().debugging(seed=settings_.pop("seed", 0))
    config.rl_module(model_config={"fcnet_hiddens": [16]})
    env_kw = {k: settings_.pop(k) for k in ("clip_rewards",) if k in settings_}
    ma_kw = {
        k: settings_.pop(k)
        for k in ("policies", "policy_mapping_fn", "policies_to_train", "observation_fn")
        if k in settings_
    }
    fake = settings_.pop("fake_sampler", None)
    if env_kw:
        config.environment(**env_kw)
    if ma_kw:
        config.multi_agent(**ma_kw)
    if fake is not None:
        config.debugging(fake_sampler=fake)
    config.env_runners(**settings_)
    return RolloutWorker(env_creator=env_creator, config=config)


@pytest.fixture
def worker():
    w = make(rollout_fragment_length=20, num_envs_per_env_runner=2)
    yield w
    w.stop()


def chunks(batch):
    ids = batch["unroll_id"]
    starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
    return list(zip(starts, np.r_[starts[1:], len(ids)], strict=True))


# -- sampling ----------------------------------------------------------------------------


def test_truncate_episodes_count_columns_and_dtypes(worker):
    batch = worker.sample()
    assert isinstance(batch, SampleBatch)
    assert 40 <= batch.count <= 41
    expected = {
        "obs": np.float32,
        "new_obs": np.float32,
        "actions": np.int64,
        "rewards": np.float32,
        "terminateds": np.bool_,
        "truncateds": np.bool_,
        "infos": np.object_,
        "eps_id": np.int64,
        "unroll_id": np.int64,
        "agent_index": np.int64,
        "t": np.int64,
        "action_logp": np.float32,
        "action_dist_inputs": np.float32,
        "vf_preds": np.float32,
        "values_bootstrapped": np.float32,
        "advantages": np.float32,
        "value_targets": np.float32,
    }
    assert {k: batch[k].dtype.type for k in batch} == expected
    for start, end in chunks(batch):
        np.testing.assert_array_equal(
            batch["obs"][start + 1 : end], batch["new_obs"][start : end - 1]
        )
        assert list(batch["t"][start:end]) == list(
            range(batch["t"][start], batch["t"][end - 1] + 1)
        )
        assert len(set(batch["eps_id"][start:end])) == 1


def test_chunks_continue_across_calls(worker):
    first, second = worker.sample(), worker.sample()
    ongoing = {
        int(first["eps_id"][end - 1]): (first["new_obs"][end - 1], first["t"][end - 1])
        for start, end in chunks(first)
        if not (first["terminateds"][end - 1] or first["truncateds"][end - 1])
    }
    assert ongoing
    for start, _ in chunks(second):
        eps = int(second["eps_id"][start])
        if eps in ongoing:
            np.testing.assert_array_equal(second["obs"][start], ongoing[eps][0])
            assert second["t"][start] == ongoing[eps][1] + 1
    assert set(second["unroll_id"]).isdisjoint(set(first["unroll_id"]))


def test_complete_episodes_hold_whole_episodes_only():
    w = make(
        counting({"length": 7}),
        rollout_fragment_length=10,
        num_envs_per_env_runner=2,
        batch_mode="complete_episodes",
    )
    batch = w.sample()
    w.stop()
    assert batch.count >= 20
    for start, end in chunks(batch):
        assert batch["t"][start] == 0 and end - start == 7
        assert batch["terminateds"][end - 1] and not batch["terminateds"][start : end - 1].any()


@settings(max_examples=12)
@given(st.integers(1, 30), st.integers(1, 3), st.integers(2, 9))
def test_any_fragment_length_samples_its_count_in_consistent_chunks(rfl, n, length):
    w = make(counting({"length": length}), rollout_fragment_length=rfl, num_envs_per_env_runner=n)
    try:
        for _ in range(2):
            batch = w.sample()
            assert rfl * n <= batch.count <= rfl * n + n - 1
            for start, end in chunks(batch):
                done = batch["terminateds"][start:end]
                assert not done[:-1].any()
                assert done[-1] == (batch["t"][end - 1] == length - 1)
                np.testing.assert_array_equal(
                    batch["new_obs"][start:end, 0] - batch["obs"][start:end, 0], 1
                )
    finally:
        w.stop()


def test_episode_horizon_truncates_and_resets():
    w = make(counting({"length": 50}), rollout_fragment_length=25, episode_horizon=10)
    batch = w.sample()
    w.stop()
    for _start, end in chunks(batch):
        if batch["truncateds"][end - 1]:
            assert batch["t"][end - 1] == 9
    ends = [end for start, end in chunks(batch) if batch["truncateds"][end - 1]]
    assert len(ends) == 2
    # A hard horizon resets: the next episode starts from a fresh reset observation.
    assert batch["obs"][ends[0], 0] == batch["new_obs"][ends[0] - 1, 0] + 1


def test_soft_horizon_continues_from_the_last_observation():
    w = make(
        counting({"length": 50}), rollout_fragment_length=25, episode_horizon=10, soft_horizon=True
    )
    resets_before = w.foreach_env(lambda e: e.unwrapped.resets)[0]  # the env check's
    batch = w.sample()
    resets = w.foreach_env(lambda e: e.unwrapped.resets)[0] - resets_before
    w.stop()
    ends = [end for start, end in chunks(batch) if batch["truncateds"][end - 1]]
    assert len(ends) == 2 and resets == 1
    for end in ends:
        np.testing.assert_array_equal(batch["obs"][end], batch["new_obs"][end - 1])
        assert batch["t"][end] == 0 and batch["eps_id"][end] != batch["eps_id"][end - 1]


def test_no_done_at_end_bootstraps_the_last_step():
    w = make(counting({"length": 5}), rollout_fragment_length=12, no_done_at_end=True)
    batch = w.sample()
    w.stop()
    assert not batch["terminateds"].any()
    last = [end - 1 for start, end in chunks(batch)]
    assert all(batch["values_bootstrapped"][i] != 0.0 for i in last)


@pytest.mark.parametrize(("clip", "expected"), [(True, [1.0, -1.0, 1.0]), (0.5, [0.5, -0.5, 0.1])])
def test_clip_rewards(clip, expected):
    w = make(
        counting({"length": 3, "rewards": [2.0, -3.0, 0.1]}),
        rollout_fragment_length=6,
        clip_rewards=clip,
    )
    batch = w.sample()
    metrics = w.get_metrics()
    w.stop()
    np.testing.assert_allclose(batch["rewards"], expected * 2, rtol=1e-6)
    # Episode returns are the env's own rewards.
    assert [m.episode_reward for m in metrics] == pytest.approx([-0.9, -0.9])


def test_seed_gives_the_same_batches():
    runs = []
    for _ in range(2):
        w = make(rollout_fragment_length=30, num_envs_per_env_runner=2, seed=3)
        runs.append([w.sample() for _ in range(2)])
        w.stop()
    for x, y in zip(*runs, strict=True):
        for key in ("obs", "actions", "rewards", "terminateds", "vf_preds", "advantages"):
            np.testing.assert_array_equal(x[key], y[key])


def test_sample_async_is_one_batch_ahead():
    w = make(rollout_fragment_length=16, sample_async=True)
    try:
        batches = [w.sample() for _ in range(3)]
        assert all(b.count == 16 for b in batches)
        assert w._async._queue.maxsize == 1
        w.learn_on_batch(batches[0])
    finally:
        w.stop()
    assert not w._async._thread.is_alive()


def test_fake_sampler_returns_the_first_batch_again():
    w = make(rollout_fragment_length=8, fake_sampler=True)
    first = w.sample()
    assert w.sample() is first
    w.stop()


def test_compress_observations_round_trips_and_learns():
    w = make(counting(), rollout_fragment_length=20, compress_observations=True)
    batch = w.sample()
    assert not isinstance(batch["obs"], np.ndarray) or batch["obs"].dtype == object
    raw = batch.copy().decompress_if_needed()
    assert raw["obs"].shape == (20, 2)
    np.testing.assert_array_equal(raw["obs"][1:, 0] - raw["obs"][:-1, 0] >= 1, True)
    w.learn_on_batch(batch)
    w.stop()


# -- filters -------------------------------------------------------------------------------


def test_mean_std_filter_normalizes_what_the_policy_sees():
    w = make(
        counting({"length": 100}), rollout_fragment_length=30, observation_filter="MeanStdFilter"
    )
    forget_env_check(w)
    batch = w.sample()
    seen = np.array(w.foreach_env(lambda e: e.unwrapped.seen)[0], np.float64)
    f = w.get_filters()["default_policy"]
    w.stop()
    assert f.running_stats.n == len(seen) == 31
    np.testing.assert_allclose(f.running_stats.mean, seen.mean(0), rtol=1e-12)
    np.testing.assert_allclose(f.running_stats.std, seen.std(0, ddof=1), rtol=1e-12)
    # The last observation was normalized with the statistics of all of them.
    expected = (seen[-1] - seen.mean(0)) / (seen.std(0, ddof=1) + 1e-6)
    np.testing.assert_allclose(batch["new_obs"][-1], np.clip(expected, -10, 10), rtol=1e-5)


def test_filters_merge_exactly_across_workers():
    config = {"length": 9}
    workers = [
        make(
            counting(config),
            rollout_fragment_length=13 + 5 * i,
            num_envs_per_env_runner=2,
            observation_filter="MeanStdFilter",
            seed=i,
        )
        for i in range(3)
    ]
    local, remotes = workers[0], workers[1:]
    for w in remotes:
        forget_env_check(w)
    everything = []
    for _ in range(2):
        for w in remotes:
            w.sample()
        merged = synchronize(local.filters, [w.get_filters(flush_after=True) for w in remotes])
        for w in remotes:
            w.sync_filters(merged)
    for w in remotes:
        everything += [
            o for env_seen in w.foreach_env(lambda e: e.unwrapped.seen) for o in env_seen
        ]
    truth = RunningStat((2,))
    truth.push_batch(np.array(everything, np.float64))
    got = local.get_filters()["default_policy"].running_stats
    assert got.n == truth.n
    np.testing.assert_allclose(got.mean, truth.mean, rtol=0, atol=1e-9)
    np.testing.assert_allclose(got.var, truth.var, rtol=1e-9)
    for w in remotes:
        after = w.get_filters()["default_policy"]
        assert after.running_stats.n == truth.n and after.buffer.n == 0
    for w in workers:
        w.stop()


def test_state_save_and_restore_keep_weights_and_filters():
    a = make(counting(), rollout_fragment_length=10, observation_filter="MeanStdFilter")
    batch = a.sample()
    a.learn_on_batch(batch)
    blob = a.save()
    b = make(counting(), rollout_fragment_length=10, observation_filter="MeanStdFilter", seed=7)
    b.restore(blob)
    fa, fb = a.get_filters()["default_policy"], b.get_filters()["default_policy"]
    assert fa.running_stats == fb.running_stats
    for key, value in a.get_weights()["default_policy"].items():
        np.testing.assert_array_equal(value, b.get_weights()["default_policy"][key])
    obs = torch.zeros((1, 2))
    pa, pb = a.get_policy().model, b.get_policy().model
    assert torch.equal(
        pa.forward_inference({"obs": obs})["action_dist_inputs"],
        pb.forward_inference({"obs": obs})["action_dist_inputs"],
    )
    # The acting copy follows the restored weights.
    runner_w = b.runner.get_weights()["default_policy"]
    for key, value in runner_w.items():
        np.testing.assert_array_equal(value, b.get_weights()["default_policy"][key])
    assert pickle.loads(blob)["policy_states"]["default_policy"]["num_grad_updates"] == 1
    a.stop()
    b.stop()


# -- learning and weights --------------------------------------------------------------------


def test_learn_on_batch_updates_policy_and_acting_copy(worker):
    batch = worker.sample()
    before = {k: v.copy() for k, v in worker.get_weights()["default_policy"].items()}
    info = worker.learn_on_batch(batch)["default_policy"]
    assert set(info) >= {"learner_stats", "num_grad_updates_lifetime", "custom_metrics"}
    assert {"policy_loss", "vf_loss", "entropy", "total_loss"} <= set(info["learner_stats"])
    after = worker.get_weights()["default_policy"]
    assert any(not np.array_equal(before[k], after[k]) for k in after)
    acting = worker.runner.get_weights()["default_policy"]
    for key, value in acting.items():
        np.testing.assert_array_equal(value, after[key])


def test_gradients_computed_then_applied_equal_learn_on_batch():
    a, b = (make(counting(), rollout_fragment_length=12) for _ in range(2))
    batch = a.sample()
    grads, info = a.compute_gradients(batch)
    assert isinstance(grads, list) and "learner_stats" in info
    a.apply_gradients(grads)
    b.learn_on_batch(batch)
    for key, value in a.get_weights()["default_policy"].items():
        np.testing.assert_allclose(value, b.get_weights()["default_policy"][key], rtol=1e-6)
    a.stop()
    b.stop()


def test_weights_seq_no_and_global_vars(worker):
    weights = {
        "default_policy": {
            k: np.zeros_like(v) for k, v in worker.get_weights()["default_policy"].items()
        }
    }
    worker.set_weights(weights, global_vars={"timestep": 100}, weights_seq_no=4)
    assert worker.weights_seq_no == 4 and worker.get_global_vars()["timestep"] == 100
    assert worker.get_policy().global_timestep == 100
    other = {"default_policy": {k: np.ones_like(v) for k, v in weights["default_policy"].items()}}
    worker.set_weights(other, weights_seq_no=4)  # same number: skipped, as in RLlib
    assert all(not v.any() for v in worker.get_weights()["default_policy"].values())
    worker.set_weights(other, weights_seq_no=5)
    assert all(v.all() for v in worker.get_weights()["default_policy"].values())


def test_sample_and_learn(worker):
    info, count = worker.sample_and_learn(num_sgd_iter=2, sgd_minibatch_size=16)
    assert count >= 40 and worker.get_policy().num_grad_updates == 4
    assert "learner_stats" in info["default_policy"]


def test_foreach_and_policy_helpers(worker):
    assert worker.foreach_env(lambda e: e.spec.id) == ["CartPole-v1"] * 2
    assert worker.foreach_env_with_context(lambda e, ctx: ctx.vector_index) == [0, 1]
    assert worker.foreach_policy(lambda p, pid: pid) == ["default_policy"]
    assert worker.foreach_trainable_policy(lambda p, pid: pid) == ["default_policy"]
    assert worker.for_policy(lambda p: p.policy_id) == "default_policy"
    assert worker.get_policy("nope") is None
    assert worker.get_spaces()["default_policy"][1] == gym.spaces.Discrete(2)


def test_export_policy_model_runs_as_torchscript(worker, tmp_path):
    path = worker.export_policy_model(tmp_path)
    obs = np.zeros((3, 4), np.float32)
    expected = worker.get_policy().model.forward_inference({"obs": torch.as_tensor(obs)})
    code = (
        "import sys, torch, numpy as np; m = torch.jit.load(sys.argv[1]); "
        "out = m(torch.zeros((3, 4))); out = out[0] if isinstance(out, tuple) else out; "
        "print(out.detach().numpy().tolist()); "
        "assert 'fastrollout' not in sys.modules"
    )
    res = subprocess.run(
        [sys.executable, "-c", code, str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    np.testing.assert_allclose(
        eval(res.stdout), expected["action_dist_inputs"].detach().numpy(), rtol=1e-5, atol=1e-6
    )
    ckpt = worker.export_policy_checkpoint(tmp_path / "ckpt")
    assert (ckpt / "policy_state.pkl").exists()


# -- multi-agent ---------------------------------------------------------------------------


class TwoAgents(MultiAgentEnv):
    """Agents "a" and "b" see counters; episodes last 6 steps; "b" gets reward 2."""

    def __init__(self, config=None):
        super().__init__()
        space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
        self.possible_agents = self.agents = ["a", "b"]
        self.observation_spaces = {"a": space, "b": space}
        self.action_spaces = {"a": gym.spaces.Discrete(2), "b": gym.spaces.Discrete(2)}
        self._t = 0

    def _obs(self):
        return {aid: np.array([self._t, i], np.float32) for i, aid in enumerate(self.agents)}

    def reset(self, *, seed=None, options=None):
        self._t = 0
        return self._obs(), {}

    def step(self, action_dict):
        self._t += 1
        done = self._t >= 6
        return (self._obs(), {"a": 1.0, "b": 2.0}, {"__all__": done}, {"__all__": False}, {})


def ma_worker(**kw):
    return make(
        lambda ctx: TwoAgents(),
        policies=["pa", "pb"],
        policy_mapping_fn=lambda aid, *a, **k: f"p{aid}",
        **kw,
    )


def test_multi_agent_batches_per_policy():
    w = ma_worker(rollout_fragment_length=9, num_envs_per_env_runner=2, policies_to_train=["pa"])
    batch = w.sample()
    assert isinstance(batch, MultiAgentBatch)
    assert batch.env_steps() == 18 and set(batch.policy_batches) == {"pa", "pb"}
    assert batch["pa"].count == batch["pb"].count == 18
    assert set(batch["pa"]["agent_index"]) == {0} and set(batch["pb"]["agent_index"]) == {1}
    np.testing.assert_array_equal(batch["pb"]["rewards"], 2.0)
    before = {k: v.copy() for k, v in w.get_weights(["pb"])["pb"].items()}
    info = w.learn_on_batch(batch)
    assert set(info) == {"pa"}
    assert all(np.array_equal(v, w.get_weights(["pb"])["pb"][k]) for k, v in before.items())
    assert w.get_policies_to_train() == {"pa"}
    metrics = w.get_metrics()
    assert metrics and metrics[0].agent_rewards == {("a", "pa"): 6.0, ("b", "pb"): 12.0}
    w.stop()


def test_observation_fn_changes_what_policies_see():
    def observation_fn(agent_obs, worker, base_env, policies, episode):
        assert set(policies) == {"pa", "pb"}
        return {aid: obs + 100 for aid, obs in agent_obs.items()}

    w = ma_worker(rollout_fragment_length=4, observation_fn=observation_fn)
    batch = w.sample()
    w.stop()
    assert (batch["pa"]["obs"][:, 0] >= 100).all()


def test_concat_of_workers_batches():
    a, b = ma_worker(rollout_fragment_length=3), ma_worker(rollout_fragment_length=3, seed=1)
    joined = concat_samples([a.sample(), b.sample()])
    assert joined.env_steps() == 6 and joined["pa"].count == 6
    a.stop()
    b.stop()


# -- offline input and output ------------------------------------------------------------------


def test_output_then_input_with_off_policy_estimates(tmp_path):
    pytest.importorskip("pyarrow")
    from fastrollout.evaluation.io import EpisodeInputReader, EpisodeOutputWriter

    writer = make(
        counting({"length": 4}), rollout_fragment_length=8, batch_mode="complete_episodes"
    )
    writer_out = EpisodeOutputWriter(tmp_path)
    writer.output_writer = writer_out
    written = writer.sample()
    writer.stop()
    assert writer_out.files
    config = RunnerConfig().env_runners(rollout_fragment_length=8).debugging(seed=0)
    config.rl_module(model_config={"fcnet_hiddens": [16]})
    reader = RolloutWorker(
        env_creator=counting(),
        config=config,
        input_creator=lambda ioctx: EpisodeInputReader(tmp_path),
        input_evaluation=["is", "wis"],
    )
    batch = reader.sample()
    assert batch.count == 8
    np.testing.assert_array_equal(batch["obs"], written["obs"][: batch.count])
    np.testing.assert_allclose(batch["action_logp"], written["action_logp"][:8], rtol=1e-6)
    (metric,) = reader.get_metrics()
    estimates = metric.custom_metrics["off_policy_estimation"]
    assert set(estimates) == {"is", "wis"} and estimates["is"]["num_episodes"] == 2
    reader.stop()


# -- bad input ---------------------------------------------------------------------------


def test_unknown_batch_mode_or_filter_is_named():
    config = RunnerConfig()
    config.batch_mode = "whole_episodes"
    with pytest.raises(ValueError, match="batch_mode 'whole_episodes'"):
        RolloutWorker(env_creator=cartpole, config=config)
    config = RunnerConfig()
    config.observation_filter = "ZFilter"
    with pytest.raises(ValueError, match="observation_filter 'ZFilter'"):
        RolloutWorker(env_creator=cartpole, config=config)
    with pytest.raises(ValueError, match="observation_filter"):
        RunnerConfig().env_runners(observation_filter="ZFilter")


def test_mapping_to_an_unknown_policy_is_named():
    with pytest.raises(ValueError, match="agent 'a' to module 'ghost'"):
        make(
            lambda ctx: TwoAgents(),
            policies=["pa", "pb"],
            policy_mapping_fn=lambda aid, *a, **k: "ghost",
            rollout_fragment_length=4,
        )


def test_set_weights_of_an_unknown_policy_is_named(worker):
    with pytest.raises(KeyError, match="no policy 'ghost'"):
        worker.set_weights({"ghost": {}})


def test_learn_on_batch_without_the_loss_columns_is_named(worker):
    batch = worker.sample()
    for column in ("advantages", "action_logp"):
        with pytest.raises(KeyError, match=column):
            worker.learn_on_batch(SampleBatch({k: v for k, v in batch.items() if k != column}))


def test_other_policy_classes_are_refused():
    class DQNTorchPolicy:
        pass

    with pytest.raises(ValueError, match="DQNTorchPolicy"):
        RolloutWorker(
            env_creator=cartpole, config=RunnerConfig(), default_policy_class=DQNTorchPolicy
        )


def test_observation_fn_on_a_single_agent_env_is_refused():
    with pytest.raises(ValueError, match="observation_fn"):
        make(observation_fn=lambda **kw: kw["agent_obs"], rollout_fragment_length=4)


# -- construction and callbacks --------------------------------------------------------------


def test_env_creator_gets_the_context_and_callbacks_run():
    from fastrollout import Callbacks

    contexts, calls = [], []

    class Recorder(Callbacks):
        def on_episode_end(self, *, episode, **kwargs):
            calls.append(("episode_end", len(episode)))

        def on_create_policy(self, *, policy_id, policy):
            calls.append(("create_policy", policy_id))

        def on_sample_end(self, *, worker, samples):
            calls.append(("sample_end", samples.count))

        def on_learn_on_batch(self, *, policy, train_batch, result):
            calls.append(("learn_on_batch", train_batch.count))

    def creator(ctx):
        contexts.append((ctx.worker_index, ctx.vector_index, ctx.num_workers))
        return CountingEnv({"length": 3})

    config = RunnerConfig().env_runners(num_envs_per_env_runner=2, rollout_fragment_length=3)
    config.callbacks(Recorder, on_sample_end=lambda *, worker, samples: calls.append("fn"))
    w = RolloutWorker(env_creator=creator, config=config, worker_index=2, num_workers=3)
    batch = w.sample()
    w.learn_on_batch(batch)
    w.stop()
    assert (2, 0, 3) in contexts and (2, 1, 3) in contexts
    assert calls[0] == ("create_policy", "default_policy")
    assert calls.count(("episode_end", 3)) == 2
    assert ("sample_end", 6) in calls and ("learn_on_batch", 6) in calls and "fn" in calls


def test_a_custom_loss_and_per_policy_hyperparameters():
    from fastrollout.learners import PPOConfig

    seen = []

    def value_only(module, batch, config):
        seen.append((sorted(batch), config.lr))
        values = module.compute_values({"obs": batch["obs"]})
        loss = ((values - batch["value_targets"]) ** 2).mean()
        return loss, {"vf_loss": float(loss.detach())}

    w = make(
        lambda ctx: TwoAgents(),
        policies=["pa", "pb"],
        policy_mapping_fn=lambda aid, *a, **k: f"p{aid}",
        rollout_fragment_length=6,
    )
    w.stop()
    config = w.config
    w = RolloutWorker(
        env_creator=lambda ctx: TwoAgents(),
        config=config,
        policy_config={"pa": PPOConfig(lr=0.1), "pb": PPOConfig(lr=0.2)},
        loss_fn={"pb": value_only},
        loss_columns=["obs", "value_targets"],
    )
    batch = w.sample()
    info = w.learn_on_batch(batch)
    assert seen == [(["obs", "value_targets"], 0.2)]
    assert set(info["pb"]["learner_stats"]) == {"vf_loss", "total_loss"}
    assert "policy_loss" in info["pa"]["learner_stats"]
    assert w.get_policy("pa").config.lr == 0.1
    with pytest.raises(KeyError, match="value_targets"):
        w.learn_on_batch(MultiAgentBatch({"pb": SampleBatch({"obs": batch["pb"]["obs"]})}, 6))
    w.stop()
    with pytest.raises(KeyError, match="ghost"):
        RolloutWorker(
            env_creator=lambda ctx: TwoAgents(), config=config, loss_fn={"ghost": value_only}
        )


def test_a_workers_config_builds_another_worker_with_one_filter():
    first = make(counting(), rollout_fragment_length=4, observation_filter="MeanStdFilter")
    first.stop()
    second = RolloutWorker(env_creator=counting(), config=first.config)
    pieces = second.runner._connectors.env_to_module.connectors
    assert sum(type(p).__name__ == "MeanStdFilter" for p in pieces) == 1
    assert second.sample().count == 4
    second.stop()
