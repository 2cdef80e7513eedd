"""The EnvPool backend: ``"envpool:<task>"`` env ids stepped through EnvPool's send/recv.

The episodes are checked against EnvPool's own outputs: the actions the runner recorded,
replayed into a fresh pool with the same seed, give the same observations, rewards and
flags.
"""

from __future__ import annotations

import itertools
import sys
import warnings
from collections import defaultdict
from typing import Any

import numpy as np
import pytest

envpool = pytest.importorskip("envpool")

import fastrollout as fr  # noqa: E402
from fastrollout.runners.sub_envs.envpool_backend import EnvPoolSubEnvs  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:.*precision lowered by casting")

CARTPOLE = "envpool:CartPole-v1"
MAX_STEPS = 25


def config(n: int = 4, batch: int | None = 2, seed: int = 3, **env_config: Any) -> Any:
    return (
        fr.RunnerConfig()
        .environment(CARTPOLE, env_config={"max_episode_steps": MAX_STEPS, **env_config})
        .env_runners(num_envs_per_env_runner=n, sub_env_batch_size=batch)
        .debugging(seed=seed)
        .resources(device="cpu")
    )


def by_sub_env(episodes: list[Any]) -> dict[int, list[Any]]:
    """Episodes (chunks) per sub-env, in sampling order (EnvPool's env_id in the infos).

    A sub-env runs one episode at a time, and ``sample`` returns its done episodes in the
    order they ended, then its ongoing chunk: the calls' lists, one after the other, keep
    each sub-env's order.
    """
    out: dict[int, list[Any]] = defaultdict(list)
    for e in episodes:
        out[int(e.get_infos(0)["env_id"])].append(e)
    return out


def replay(seed: int, n: int, per_env: dict[int, list[Any]]) -> None:
    """Steps a fresh pool with each sub-env's recorded actions; compares everything."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pool = envpool.make(
            "CartPole-v1",
            env_type="gymnasium",
            num_envs=n,
            batch_size=n,
            seed=seed,
            max_episode_steps=MAX_STEPS,
        )
    obs, _ = pool.reset()
    # Per sub-env: its (observation, action, reward, terminated, truncated) in order, and
    # a reset row between two episodes (the action EnvPool ignores).
    scripts: dict[int, list[Any]] = {}
    for i, episodes in per_env.items():
        script = []
        for k, e in enumerate(episodes):
            o = np.asarray(e.get_observations())
            if k and not episodes[k - 1].is_done:  # a continuation chunk: no reset
                o = o[1:]
            else:
                script.append(("reset", o[0]))
                o = o[1:]
            acts, rews = e.get_actions(), e.get_rewards()
            for t in range(len(e)):
                last = t == len(e) - 1
                script.append(
                    (
                        "step",
                        int(acts[t]),
                        o[t],
                        float(rews[t]),
                        bool(last and e.is_terminated),
                        bool(last and e.is_truncated),
                    )
                )
        scripts[i] = script
    # Step all sub-envs together; each follows its script (the first item: the reset).
    pos = dict.fromkeys(scripts, 1)
    for i, script in scripts.items():
        np.testing.assert_allclose(obs[i], script[0][1], rtol=0, atol=0)
    for _ in range(max(len(s) for s in scripts.values())):
        actions = np.zeros(n, np.int64)
        for i, script in scripts.items():
            if pos[i] < len(script) and script[pos[i]][0] == "step":
                actions[i] = script[pos[i]][1]
        obs, rew, term, trunc, _ = pool.step(actions)
        for i, script in scripts.items():
            if pos[i] >= len(script):
                continue
            item = script[pos[i]]
            if item[0] == "reset":
                np.testing.assert_array_equal(obs[i], item[1])
            else:
                _, _, o, r, te, tr = item
                np.testing.assert_array_equal(obs[i], o)
                assert (float(rew[i]), bool(term[i]), bool(trunc[i])) == (r, te, tr)
            pos[i] += 1
    pool.close()


@pytest.mark.parametrize(("n", "batch"), [(4, 2), (3, 3), (5, 1)])
def test_episodes_equal_envpools_own_outputs_for_the_same_actions(n, batch):
    r = fr.SingleAgentEnvRunner(config=config(n, batch, seed=11))
    try:
        assert isinstance(r.env, EnvPoolSubEnvs) and r.env.batch_size == batch
        episodes = r.sample(num_timesteps=120) + r.sample(num_timesteps=45)
        per_env = by_sub_env(episodes)
        assert set(per_env) == set(range(n))
        # Chunks continue one another across the two calls.
        for parts in per_env.values():
            for a, b in itertools.pairwise(parts):
                if not a.is_done:
                    assert b.id_ == a.id_ and b.t_started == a.t_started + len(a)
        replay(11, n, per_env)
    finally:
        r.stop()


def test_done_episodes_metrics_and_num_episodes():
    r = fr.SingleAgentEnvRunner(config=config(4, 2))
    try:
        done = r.sample(num_episodes=5)
        assert len(done) == 5 and all(e.is_done for e in done)
        assert all(len(e) <= MAX_STEPS for e in done)
        m = r.get_metrics()
        returns = [float(np.sum(e.get_rewards())) for e in done]
        assert m["num_episodes"].peek() == 5
        assert m["episode_return_mean"].peek() == pytest.approx(np.mean(returns))
        # A second call resets the pool (steps in flight drained first) and goes on.
        assert len(r.sample(num_episodes=2)) == 2
        assert sum(len(e) for e in r.sample(num_timesteps=30)) >= 30
    finally:
        r.stop()


def test_channels_last_turns_images_for_the_default_cnn():
    kwargs = {"img_height": 64, "img_width": 64, "stack_num": 4, "max_episode_steps": 200}
    c = (
        fr.RunnerConfig()
        .environment("envpool:Pong-v5", env_config={**kwargs, "channels_last": True})
        .env_runners(num_envs_per_env_runner=2, sub_env_batch_size=1)
        .debugging(seed=0)
        .resources(device="cpu")
    )
    r = fr.SingleAgentEnvRunner(config=c)
    try:
        assert r.env.single_observation_space.shape == (64, 64, 4)
        assert type(r.module).__name__ == "DefaultCNNModule"
        eps = r.sample(num_timesteps=20)
        first = next(e for e in eps if e.t_started == 0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            plain = envpool.make("Pong-v5", env_type="gymnasium", num_envs=2, seed=0, **kwargs)
        obs, _ = plain.reset()
        i = int(first.get_infos(0)["env_id"])
        np.testing.assert_array_equal(first.get_observations(0), np.moveaxis(obs[i], 0, -1))
        plain.close()
    finally:
        r.stop()


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match=r"sub_env_batch_size must be between 1 and .*=2\), got 3"):
        fr.SingleAgentEnvRunner(config=config(2, 3))
    with pytest.raises(TypeError, match="envpool:CartPole-v1 is a single-agent env"):
        fr.MultiAgentEnvRunner(config=config())
    with pytest.raises(ValueError, match="restart_failed_sub_environments"):
        fr.SingleAgentEnvRunner(
            config=config().fault_tolerance(restart_failed_sub_environments=True)
        )
    with pytest.raises(ValueError, match="shared_memory"):
        fr.SingleAgentEnvRunner(config=config().env_runners(sub_env_backend="shared_memory"))
    with pytest.raises(ValueError, match="EnvPool could not make it"):
        fr.SingleAgentEnvRunner(config=config().environment("envpool:NoSuchTask-v9"))
    with pytest.raises(ValueError, match="channels_last needs a 3-D Box"):
        fr.SingleAgentEnvRunner(config=config(channels_last=True))


def test_without_envpool_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "envpool", None)
    with pytest.raises(ImportError, match=r"fastrollout\[envpool\]"):
        fr.SingleAgentEnvRunner(config=config())


def test_an_rllib_config_names_the_task_as_any_env():
    pytest.importorskip("ray.rllib")
    from ray.rllib.algorithms.ppo import PPOConfig

    c = (
        PPOConfig()
        .environment(CARTPOLE, env_config={"max_episode_steps": MAX_STEPS})
        .env_runners(num_envs_per_env_runner=4, env_runner_cls=fr.SingleAgentEnvRunner)
    )
    fr.sub_env_backend(c, "default", batch_size=2)
    r = fr.SingleAgentEnvRunner(config=c)
    try:
        assert isinstance(r.env, EnvPoolSubEnvs) and r.env.batch_size == 2
        assert sum(len(e) for e in r.sample(num_timesteps=60)) >= 60
        assert "episode_return_mean" in r.get_metrics()
    finally:
        r.stop()


def test_remote_runners_of_a_group(ray_local):
    group = fr.EnvRunnerGroup(config=config(2, 1).env_runners(num_env_runners=1))
    try:
        eps = group.sample(num_timesteps=40)
        assert sum(len(e) for e in eps) >= 40
        kinds = group.foreach_env_runner(lambda r: type(r.env).__name__, local_env_runner=False)
        assert kinds == ["EnvPoolSubEnvs"]
    finally:
        group.stop()


def test_the_command_line_samples_an_envpool_task(capsys):
    from fastrollout.cli import main

    code = main(
        [
            "sample",
            "--env",
            CARTPOLE,
            "--env-config",
            '{"max_episode_steps": 20}',
            "--num-envs",
            "4",
            "--sub-env-batch-size",
            "2",
            "--timesteps",
            "200",
            "--no-progress",
            "--json",
            "--seed",
            "1",
        ]
    )
    assert code == 0
    assert '"env_steps"' in capsys.readouterr().out
