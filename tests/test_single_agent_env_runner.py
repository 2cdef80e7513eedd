"""SingleAgentEnvRunner: every sample argument, chunks, callbacks, metrics, state, faults."""

from __future__ import annotations

import itertools
import os
import pickle
from collections import defaultdict

import gymnasium as gym
import numpy as np
import pytest
import torch

import fastrollout as fr
from _runner_envs import (
    ActionRecordingEnv,
    SeededLengthEnv,
    SeededLengthVectorEnv,
    WrongShapeSubEnv,
)
from fastrollout.core import DEFAULT_MODULE_ID, Columns
from fastrollout.env.examples import CrashingEnv, EnvCrash
from fastrollout.errors import SpaceMismatchError
from fastrollout.metrics import MetricsLogger


def config(env="CartPole-v1", n=2, **runners):
    c = (
        fr.RunnerConfig()
        .environment(env)
        .env_runners(num_envs_per_env_runner=n, **runners)
        .debugging(seed=3)
        .resources(device="cpu")
        .rl_module(model_config={"fcnet_hiddens": [16]})
    )
    return c


def compiled(runner) -> dict:
    root = MetricsLogger(root=True)
    root.aggregate([runner.get_metrics()])
    return root.compile()


@pytest.fixture(scope="module")
def cartpole():
    r = fr.SingleAgentEnvRunner(config=config(rollout_fragment_length=10))
    yield r
    r.stop()


def test_default_sample_is_fragment_times_envs_and_chunks_continue(cartpole):
    r = cartpole
    first = r.sample(force_reset=True)
    # 10 steps x 2 sub-envs; one more where a sub-env's autoreset step (not counted)
    # fell inside the fragment.
    assert 20 <= sum(len(e) for e in first) <= 21
    ongoing = {e.id_: e for e in first if not e.is_done}
    assert ongoing, "expected ongoing chunks"
    second = r.sample()
    assert 20 <= sum(len(e) for e in second) <= 21
    continued = [e for e in second if e.id_ in ongoing]
    assert len(continued) == len(ongoing)
    for e in continued:
        prev = ongoing[e.id_]
        assert e.t_started == prev.t
        # One step of look-back (episode_lookback_horizon=1): the previous chunk's last
        # observation is this chunk's first.
        np.testing.assert_array_equal(e.get_observations(0), prev.get_observations(-1))
        np.testing.assert_array_equal(
            e.get_observations(-1, neg_index_as_lookback=True), prev.get_observations(-2)
        )
    for e in first + second:
        assert e.is_numpy
        e.validate()


def test_num_timesteps_bounds(cartpole):
    eps = cartpole.sample(num_timesteps=7)
    assert 7 <= sum(len(e) for e in eps) <= 7 + 2 - 1


def test_num_episodes_returns_exactly_that_many_done(cartpole):
    for k in (1, 3):
        eps = cartpole.sample(num_episodes=k)
        assert len(eps) == k
        assert all(e.is_done and e.t_started == 0 for e in eps)
        assert all(e.get_observations().shape == (len(e) + 1, 4) for e in eps)


def test_complete_episodes_returns_only_done_ones():
    r = fr.SingleAgentEnvRunner(config=config(batch_mode="complete_episodes", n=3))
    eps = r.sample()
    assert len(eps) == 3 and all(e.is_done and e.t_started == 0 for e in eps)
    r.stop()


def test_explore_false_is_greedy_with_a_logp_of_zero(cartpole):
    eps = cartpole.sample(num_timesteps=10, explore=False, force_reset=True)
    for e in eps:
        # A greedy action is certain (RLlib records 0 too, as an integer for Discrete).
        np.testing.assert_array_equal(e.get_extra_model_outputs(Columns.ACTION_LOGP), 0.0)
        logits = e.get_extra_model_outputs(Columns.ACTION_DIST_INPUTS)
        np.testing.assert_array_equal(e.get_actions(), np.argmax(logits, axis=-1))
    eps = cartpole.sample(num_timesteps=10, explore=True)
    assert all(Columns.ACTION_LOGP in e.extra_model_outputs for e in eps)


def test_random_actions_skip_the_module(cartpole):
    calls = []
    module = cartpole.module
    orig = module.forward_exploration
    module.forward_exploration = lambda *a, **k: calls.append(1) or orig(*a, **k)
    try:
        eps = cartpole.sample(num_timesteps=10, random_actions=True, force_reset=True)
    finally:
        del module.forward_exploration
    assert not calls
    assert all(Columns.ACTION_DIST_INPUTS not in e.extra_model_outputs for e in eps)
    assert all(e.get_extra_model_outputs("weights_seq_no").tolist() == [0] * len(e) for e in eps)


def test_force_reset_starts_new_episodes(cartpole):
    a = cartpole.sample(num_timesteps=4, force_reset=True)
    b = cartpole.sample(num_timesteps=4, force_reset=True)
    assert not {e.id_ for e in a} & {e.id_ for e in b}
    assert all(e.t_started == 0 for e in b)


def test_bad_sample_arguments(cartpole):
    with pytest.raises(ValueError, match="not both"):
        cartpole.sample(num_timesteps=1, num_episodes=1)
    with pytest.raises(ValueError, match="num_episodes must be >= 0"):
        cartpole.sample(num_episodes=-1)


def test_returned_episodes_pickle(cartpole):
    for e in cartpole.sample(num_timesteps=10):
        back = pickle.loads(pickle.dumps(e))
        assert back.id_ == e.id_ and len(back) == len(e) and back.t_started == e.t_started
        np.testing.assert_array_equal(back.get_observations(), e.get_observations())
        np.testing.assert_array_equal(back.get_actions(), e.get_actions())


def test_metrics_count_chunks_returned_earlier():
    r = fr.SingleAgentEnvRunner(config=config(SeededLengthEnv, n=2, rollout_fragment_length=2))
    chunks: dict[str, list] = defaultdict(list)
    done = []
    steps = 0
    while len(done) < 4:
        for e in r.sample():
            steps += len(e)
            chunks[e.id_].append(e)
            if e.is_done:
                done.append(e.id_)
    root = MetricsLogger(root=True)
    root.aggregate([r.get_metrics()])
    m = root.compile()
    lengths = [sum(len(c) for c in chunks[i]) for i in done]
    returns = [sum(c.get_return() for c in chunks[i]) for i in done]
    assert m["num_episodes"] == len(done)
    assert m["num_env_steps_sampled"] == steps == m["num_env_steps_sampled_lifetime"]
    assert m["num_agent_steps_sampled"] == {"default_agent": steps}
    assert m["num_module_steps_sampled"] == {DEFAULT_MODULE_ID: steps}
    assert m["episode_len_mean"] == pytest.approx(np.mean(lengths))
    assert m["episode_len_max"] == max(lengths) and m["episode_len_min"] == min(lengths)
    assert m["episode_return_mean"] == pytest.approx(np.mean(returns))
    assert m["episode_return_max"] == max(returns)
    assert m["agent_episode_return_mean"]["default_agent"] == pytest.approx(np.mean(returns))
    assert m["module_episode_return_mean"][DEFAULT_MODULE_ID] == pytest.approx(np.mean(returns))
    for timer in (
        "env_step_timer",
        "rlmodule_inference_timer",
        "env_to_module_connector",
        "module_to_env_connector",
        "sample",
        "env_reset_timer",
    ):
        assert m[timer] > 0
    # Episodes long enough to span several 2-step chunks really were cut.
    assert max(len(chunks[i]) for i in done) > 1
    # The next reduce cycle starts from zero but lifetime counts go on (in the root
    # logger that aggregates the runner's results, as in RLlib).
    more = sum(len(e) for e in r.sample())
    root.aggregate([r.get_metrics()])
    m2 = root.compile()
    assert m2["num_env_steps_sampled"] == more
    assert m2["num_env_steps_sampled_lifetime"] == steps + more
    r.stop()


def test_callbacks_counts_and_order():
    log = []

    def hook(name):
        def fn(**kw):
            ep = kw.get("episode")
            log.append((name, ep.id_ if ep is not None else None, kw.get("env_index")))
            if name == "on_episode_end":
                assert "prev_episode_chunks" in kw and ep.is_done
            if name in ("on_episode_start", "on_episode_step", "on_episode_end"):
                assert kw["env_runner"] is runner and kw["rl_module"] is runner.module
                assert kw["metrics_logger"] is runner.metrics

        return fn

    names = (
        "on_environment_created",
        "on_episode_created",
        "on_episode_start",
        "on_episode_step",
        "on_episode_end",
        "on_sample_end",
    )
    c = config(SeededLengthEnv, n=2, rollout_fragment_length=15).callbacks(
        **{n: hook(n) for n in names}
    )
    runner = fr.SingleAgentEnvRunner(config=c)
    assert [x[0] for x in log] == ["on_environment_created"]
    eps = runner.sample()
    assert log[-1][0] == "on_sample_end" and sum(x[0] == "on_sample_end" for x in log) == 1
    by_id = defaultdict(list)
    for name, eid, _ in log:
        if eid is not None:
            by_id[eid].append(name)
    for e in eps:
        seq = by_id[e.id_]
        assert seq[0] == "on_episode_created" and seq[1] == "on_episode_start"
        assert seq.count("on_episode_step") == len(e)
        assert seq.count("on_episode_end") == (1 if e.is_done else 0)
        if e.is_done:
            assert seq[-1] == "on_episode_end"
    runner.stop()


def test_callbacks_class_hooks_are_called():
    counts = defaultdict(int)

    class MyCallbacks(fr.Callbacks):
        def on_episode_end(self, *, episode, **kwargs):
            counts["end"] += 1
            assert episode.is_done

    r = fr.SingleAgentEnvRunner(config=config(SeededLengthEnv).callbacks(MyCallbacks))
    eps = r.sample(num_episodes=3)
    assert counts["end"] == 3 == len(eps)


def test_continuous_actions_are_clipped_for_env_but_stored_as_computed():
    ActionRecordingEnv.received.clear()
    c = config(ActionRecordingEnv, n=2).environment(
        ActionRecordingEnv, normalize_actions=False, clip_actions=True
    )
    r = fr.SingleAgentEnvRunner(config=c)
    eps = r.sample(num_timesteps=40)
    sent = np.concatenate([a.reshape(-1) for a in ActionRecordingEnv.received])
    assert np.all(np.abs(sent) <= 0.01 + 1e-7)
    stored = np.concatenate([e.get_actions().reshape(-1) for e in eps])
    # The module's Gaussian samples (std ~1) fall far outside the tiny bounds; the
    # episodes keep them as the module produced them.
    assert np.max(np.abs(stored)) > 0.1
    # Default (normalize_actions=True): actions are unsquashed from [-1, 1] and clipped.
    ActionRecordingEnv.received.clear()
    r2 = fr.SingleAgentEnvRunner(config=config(ActionRecordingEnv, n=1))
    eps = r2.sample(num_timesteps=10)
    sent = np.concatenate([a.reshape(-1) for a in ActionRecordingEnv.received])
    stored = np.concatenate([e.get_actions().reshape(-1) for e in eps])
    # (The env check at creation sent one action first.)
    np.testing.assert_allclose(
        sent[-len(stored) :], np.clip(stored * 0.01, -0.01, 0.01), rtol=1e-5, atol=1e-8
    )


def test_wrong_observation_shape_is_a_clear_error():
    r = fr.SingleAgentEnvRunner(config=config(WrongShapeSubEnv, n=2))
    with pytest.raises(SpaceMismatchError, match=r"observation.*Box\(-1\.0, 1\.0, \(4,\)"):
        r.sample(num_timesteps=20)


_crashing_instances = itertools.count()


def crashing_cartpole(ctx):
    import gymnasium as gym

    # Each instance its own crash schedule (a recreated sub-env, in this process or a new
    # worker process, does not crash at the same step as the one it replaces).
    seed = hash((ctx.vector_index, os.getpid(), next(_crashing_instances))) % 2**31
    return CrashingEnv(gym.make("CartPole-v1"), p_crash_step=0.03, seed=seed)


def test_crashing_env_restarts_only_the_failed_sub_env():
    c = config(crashing_cartpole, n=3, rollout_fragment_length=40).fault_tolerance(
        restart_failed_sub_environments=True
    )
    r = fr.SingleAgentEnvRunner(config=c)
    seen: dict[str, set] = defaultdict(set)
    survived_crash_elsewhere = 0
    prev_ids: set = set()
    for _ in range(4):
        eps = r.sample()
        ids = {e.id_ for e in eps if e.t_started > 0}
        survived_crash_elsewhere += len(ids & prev_ids)
        prev_ids = {e.id_ for e in eps if not e.is_done}
        for e in eps:
            for info in e.get_infos():
                assert not any(k.startswith("__fastrollout") for k in info)
                if "env_instance" in info:
                    seen[e.id_].add(info["env_instance"])
    # No episode (all its chunks together) holds steps from two env instances.
    assert all(len(v) == 1 for v in seen.values())
    m = compiled(r)
    assert m["num_env_restarts_lifetime"] > 0
    assert survived_crash_elsewhere > 0
    r.stop()


def test_crashing_env_without_restarts_raises():
    # No env check: its one step would crash 3% of the time, as an EnvCheckError at
    # construction instead of the crash while sampling that this test is about.
    c = config(crashing_cartpole, n=2).environment(disable_env_checking=True)
    r = fr.SingleAgentEnvRunner(config=c)
    with pytest.raises(EnvCrash):
        r.sample(num_timesteps=500)


def test_state_round_trip_gives_same_greedy_actions():
    a = fr.SingleAgentEnvRunner(config=config())
    b = fr.SingleAgentEnvRunner(config=config().debugging(seed=99))
    obs = torch.randn(16, 4)

    def greedy(r):
        out = r.module.forward_inference({Columns.OBS: obs})
        return out[Columns.ACTION_DIST_INPUTS].argmax(-1)

    a.sample(num_timesteps=10)
    state = a.get_state()
    assert set(state) >= {
        "rl_module",
        "weights_seq_no",
        "env_to_module_connector",
        "module_to_env_connector",
        "num_env_steps_sampled_lifetime",
    }
    logits = {
        r: r.module.forward_inference({Columns.OBS: obs})[Columns.ACTION_DIST_INPUTS]
        for r in (a, b)
    }
    assert not torch.equal(logits[a], logits[b])  # differently seeded modules
    b.set_state(state)
    assert torch.equal(greedy(a), greedy(b))
    assert b.num_env_steps_sampled_lifetime == a.num_env_steps_sampled_lifetime
    # The greedy actions recorded by the two runners on the same observations agree.
    ea = a.sample(num_timesteps=8, explore=False, force_reset=True)
    for e in ea:
        out = b.module.forward_inference({Columns.OBS: torch.from_numpy(e.get_observations()[:-1])})
        np.testing.assert_array_equal(
            out[Columns.ACTION_DIST_INPUTS].argmax(-1).numpy(), e.get_actions()
        )


def test_weights_seq_no_semantics():
    a = fr.SingleAgentEnvRunner(config=config())
    b = fr.SingleAgentEnvRunner(config=config().debugging(seed=7))
    wa = a.get_weights()
    key = next(iter(wa[DEFAULT_MODULE_ID]))
    b.set_weights(wa, weights_seq_no=5)
    assert b.get_state()["weights_seq_no"] == 5
    np.testing.assert_array_equal(
        b.get_weights()[DEFAULT_MODULE_ID][key], wa[DEFAULT_MODULE_ID][key]
    )
    # An older sequence number is ignored ...
    changed = {DEFAULT_MODULE_ID: {k: v + 1 for k, v in wa[DEFAULT_MODULE_ID].items()}}
    b.set_state({"rl_module": changed, "weights_seq_no": 3})
    np.testing.assert_array_equal(
        b.get_weights()[DEFAULT_MODULE_ID][key], wa[DEFAULT_MODULE_ID][key]
    )
    assert b.get_state()["weights_seq_no"] == 5
    # ... 0 forces the update and keeps the number; a bare module state goes to the default module.
    b.set_state({"rl_module": changed[DEFAULT_MODULE_ID], "weights_seq_no": 0})
    np.testing.assert_array_equal(
        b.get_weights()[DEFAULT_MODULE_ID][key], wa[DEFAULT_MODULE_ID][key] + 1
    )
    assert b.get_state()["weights_seq_no"] == 5
    eps = b.sample(num_timesteps=4)
    assert all(set(e.get_extra_model_outputs("weights_seq_no").tolist()) == {5} for e in eps)
    with pytest.raises(ValueError, match="global_vars"):
        b.set_weights(wa, global_vars={})


def test_rllib_lowers_weights_seq_no_to_an_older_one_it_refused():
    """Pins RLlib 2.60: set_state with an older seq no keeps the weights but takes the number."""
    from types import SimpleNamespace
    from unittest import mock

    RLlibRunner = pytest.importorskip("ray.rllib.env.single_agent_env_runner").SingleAgentEnvRunner

    fake = SimpleNamespace(module=mock.Mock(), _weights_seq_no=5)
    RLlibRunner.set_state(fake, {"rl_module": {"w": 1}, "weights_seq_no": 3})
    fake.module.set_state.assert_not_called()
    assert fake._weights_seq_no == 3  # RLlib now claims version 3 while holding 5.


def test_save_and_restore_from_path(tmp_path):
    a = fr.SingleAgentEnvRunner(config=config())
    a.sample(num_timesteps=6)
    a.set_weights(a.get_weights(), weights_seq_no=2)
    path = a.save_to_path(tmp_path / "ckpt")
    b = fr.SingleAgentEnvRunner(config=config().debugging(seed=5))
    b.restore_from_path(path)
    for k, v in a.get_weights()[DEFAULT_MODULE_ID].items():
        np.testing.assert_array_equal(b.get_weights()[DEFAULT_MODULE_ID][k], v)
    assert b.get_state()["weights_seq_no"] == 2
    assert b.num_env_steps_sampled_lifetime == a.num_env_steps_sampled_lifetime
    with pytest.raises(FileNotFoundError, match="no checkpoint at"):
        b.restore_from_path(tmp_path / "missing")


def test_spaces_health_and_stop():
    r = fr.SingleAgentEnvRunner(config=config(n=3))
    spaces = r.get_spaces()
    assert spaces[DEFAULT_MODULE_ID] == spaces["__env_single__"]
    assert spaces["__env__"][0].shape == (3, 4)
    r.assert_healthy()
    r.stop()


def test_async_vector_env_gives_the_same_episodes_as_sync():
    sync = fr.SingleAgentEnvRunner(config=config(SeededLengthEnv, n=2))
    asyn = fr.SingleAgentEnvRunner(
        config=config(SeededLengthEnv, n=2, gym_env_vectorize_mode="async")
    )
    try:
        a = sync.sample(num_episodes=4, random_actions=True)
        b = asyn.sample(num_episodes=4, random_actions=True)
        assert [len(e) for e in a] == [len(e) for e in b]
        for x, y in zip(a, b, strict=True):
            np.testing.assert_array_equal(x.get_observations(), y.get_observations())
    finally:
        asyn.stop()


def test_vector_entry_point_env_gives_the_same_episodes_as_sync():
    sync = fr.SingleAgentEnvRunner(config=config(SeededLengthEnv, n=3))
    native = fr.SingleAgentEnvRunner(
        config=config(SeededLengthVectorEnv, n=3, gym_env_vectorize_mode="vector_entry_point")
    )
    assert isinstance(native.env, SeededLengthVectorEnv)
    for _ in range(2):  # the second call continues the chunks across the autoresets
        a = sync.sample(num_timesteps=40, random_actions=True)
        b = native.sample(num_timesteps=40, random_actions=True)
        assert [(e.id_ is not None, len(e), e.is_done) for e in a] == [
            (True, len(e), e.is_done) for e in b
        ]
        for x, y in zip(a, b, strict=True):
            np.testing.assert_array_equal(x.get_observations(), y.get_observations())
            np.testing.assert_array_equal(x.get_rewards(), y.get_rewards())
            assert x.get_infos() == y.get_infos()
    assert compiled(sync)["num_episodes_lifetime"] == compiled(native)["num_episodes_lifetime"]


def test_vector_entry_point_cartpole_uses_gymnasiums_vector_env():
    r = fr.SingleAgentEnvRunner(
        config=config(n=4, gym_env_vectorize_mode=gym.VectorizeMode.VECTOR_ENTRY_POINT)
    )
    assert type(r.env).__name__ == "CartPoleVectorEnv"
    eps = r.sample(num_episodes=6)
    assert len(eps) == 6
    for e in eps:
        assert e.is_terminated or e.is_truncated
        # CartPole pays 1 per step, also on the terminating one.
        assert e.get_return() == len(e)
        assert len(e.get_observations()) == len(e) + 1


@pytest.mark.parametrize(
    ("env", "runners", "error", "match"),
    [
        ("Pendulum-v1", {}, ValueError, "has no vector entry point"),
        (SeededLengthEnv, {}, TypeError, "must return a gymnasium.vector.VectorEnv"),
        (
            SeededLengthVectorEnv,
            {"restart_failed_sub_environments": True},
            ValueError,
            "restart_failed_sub_environments needs",
        ),
    ],
)
def test_vector_entry_point_errors(env, runners, error, match):
    c = config(env, gym_env_vectorize_mode="vector_entry_point", **runners)
    with pytest.raises(error, match=match):
        fr.SingleAgentEnvRunner(config=c)


def test_vector_entry_point_env_must_autoreset_next_step():
    c = config(SeededLengthVectorEnv, gym_env_vectorize_mode="vector_entry_point")
    c = c.environment(env_config={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP})
    with pytest.raises(ValueError, match="uses autoreset mode"):
        fr.SingleAgentEnvRunner(config=c)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_device_samples_and_records_numpy():
    r = fr.SingleAgentEnvRunner(config=config().resources(device="cuda"))
    assert next(r.module.parameters()).device.type == "cuda"
    eps = r.sample(num_timesteps=20)
    for e in eps:
        assert isinstance(e.get_actions(), np.ndarray)
        assert isinstance(e.get_extra_model_outputs(Columns.ACTION_LOGP), np.ndarray)


def test_episodes_to_numpy_false_returns_list_episodes():
    c = config()
    c.episodes_to_numpy = False
    r = fr.SingleAgentEnvRunner(config=c)
    eps = r.sample(num_timesteps=6)
    assert eps and not any(e.is_numpy for e in eps)
    assert isinstance(eps[0].get_actions(), list)


def test_connector_states_travel_with_the_runner_state():
    from fastrollout.connectors import MeanStdFilter

    def make(seed):
        c = config(n=2).debugging(seed=seed)
        c = c.env_runners(env_to_module_connector=lambda env, spaces, device: MeanStdFilter())
        return fr.SingleAgentEnvRunner(config=c)

    a, b = make(1), make(2)
    a.sample(num_timesteps=50)
    state = a.get_state()
    assert state["env_to_module_connector"] != b.get_state()["env_to_module_connector"]
    b.set_state(state)

    def moments(runner):
        # The filter keeps base statistics plus a delta since the last sync; their
        # combination is what normalizes.
        st = runner.get_state()["env_to_module_connector"]["MeanStdFilter"][DEFAULT_MODULE_ID]
        parts = [st["base"], st["delta"]]
        n = sum(p["count"] for p in parts)
        mean = sum(p["count"] * np.asarray(p["mean"]) for p in parts) / n
        return n, mean

    (na, ma), (nb, mb) = moments(a), moments(b)
    assert na == nb > 0
    np.testing.assert_allclose(ma, mb)


def test_dict_observations_are_recorded_per_key():
    from _runner_envs import DictObsEnv

    r = fr.SingleAgentEnvRunner(config=config(DictObsEnv, n=3))
    eps = r.sample(num_episodes=4)
    assert len(eps) == 4
    for e in eps:
        obs = e.get_observations()
        assert set(obs) == {"mode", "pos"}
        np.testing.assert_array_equal(obs["mode"], np.arange(6) % 3)
        np.testing.assert_allclose(obs["pos"][:, 0], np.arange(6) / 10, rtol=1e-6)


def test_restarts_work_in_async_sub_processes():
    c = config(crashing_cartpole, n=2, rollout_fragment_length=60, gym_env_vectorize_mode="async")
    r = fr.SingleAgentEnvRunner(config=c.fault_tolerance(restart_failed_sub_environments=True))
    try:
        seen: dict[str, set] = defaultdict(set)
        for _ in range(3):
            for e in r.sample():
                for info in e.get_infos():
                    if "env_instance" in info:
                        seen[e.id_].add(info["env_instance"])
        assert seen and all(len(v) == 1 for v in seen.values())
        assert compiled(r)["num_env_restarts_lifetime"] > 0
    finally:
        r.stop()


def test_repr_says_a_runner_is_one_of_a_group():
    """Built from a config with remote runners, a runner is the group's local runner."""
    base = fr.RunnerConfig().environment("CartPole-v1").env_runners(num_envs_per_env_runner=2)
    alone = fr.SingleAgentEnvRunner(config=base)
    assert repr(alone) == "SingleAgentEnvRunner(sub-envs: 2)"
    in_group = fr.SingleAgentEnvRunner(config=base.copy().env_runners(num_env_runners=3))
    assert repr(in_group) == (
        "SingleAgentEnvRunner(sub-envs: 2, runner 0 of a group with 3 remote runners)"
    )


def test_a_chunk_continues_across_exploring_and_greedy_calls():
    """Greedy steps record a log-probability too, so a chunk whose steps come from both
    kinds of call has every column (it failed its validation when greedy ones had none)."""
    config = fr.RunnerConfig().environment("CartPole-v1").env_runners(num_envs_per_env_runner=2)
    runner = fr.SingleAgentEnvRunner(config=config.debugging(seed=0))
    runner.sample(num_timesteps=6, explore=True)
    for e in runner.sample(num_timesteps=6, explore=False):
        assert len(e.get_extra_model_outputs(Columns.ACTION_LOGP)) == len(e)
    runner.sample(num_timesteps=6, explore=True)
