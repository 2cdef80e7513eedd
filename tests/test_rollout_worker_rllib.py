"""``fastrollout.RolloutWorker`` against RLlib 2.60's old-stack ``RolloutWorker`` (PPOTorchPolicy).

Both workers get the same env creator and settings and make the same calls. CartPole's
episodes are random, so there only the batch's structure is compared; the other envs here
are deterministic (fixed episode lengths, observations and rewards that depend only on the
step in the episode, not on the actions), so rows, boundaries, filter statistics and
clipped rewards are compared value for value.

Deliberate differences, pinned where they show:
- RLlib 2.60's worker returns a ``MultiAgentBatch`` even for one policy (its EnvRunnerV2
  always builds one); fastrollout's returns a ``SampleBatch`` for one policy, as the issue
  asks (RLlib's classic single-policy API). Single-policy batches are compared through
  ``policy_batches["default_policy"]`` on RLlib's side.
- ``actions`` of a Discrete space: RLlib int32, fastrollout int64.
- ``eps_id``: RLlib a random int64, fastrollout a stable int64 hash of the episode id;
  ``unroll_id``: RLlib counts in its own way (1, 3, ...), fastrollout 0, 1, ...; so only
  where they change is compared, not their values.
- ``set_weights`` for an unknown policy: RLlib ignores it silently, fastrollout raises.
- ``MeanStdFilter`` with several sub-envs: the same statistics, but RLlib filters env i's
  observation of a step with the statistics after envs 0..i, fastrollout with those after
  all envs of the step.
- RLlib 2.60 bug: a multi-agent agent done in an episode that a batch boundary cuts has
  its rows emitted again in the next batch; fastrollout emits them once.
"""

from __future__ import annotations

import importlib.util
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

import fastrollout
from fastrollout.batches import MultiAgentBatch, SampleBatch

needs_rllib = pytest.mark.skipif(
    importlib.util.find_spec("ray") is None, reason="RLlib 2.60 not installed"
)
pytestmark = needs_rllib

K = 7  # steps per episode of the deterministic envs
REWARDS = (2.0, -3.0, 0.1, 0.0, 0.7, -0.2, 5.0)


def obs_at(t: int) -> np.ndarray:
    """The deterministic observation at step ``t`` of an episode (independent of actions)."""
    return np.array([t, t * t / 10.0, (-1.0) ** t], dtype=np.float32)


class FixedEnv(gym.Env):  # type: ignore[type-arg]
    """Episodes of exactly ``K`` steps, ending terminated (or truncated with ``truncate``)."""

    def __init__(self, config: Any = None) -> None:
        config = dict(config or {})
        self.truncate = bool(config.get("truncate", False))
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.t = 0

    def reset(self, *, seed: int | None = None, options: Any = None) -> Any:
        super().reset(seed=seed)
        self.t = 0
        return obs_at(0), {}

    def step(self, action: Any) -> Any:
        reward = REWARDS[self.t % len(REWARDS)]
        self.t += 1
        done = self.t >= K
        return obs_at(self.t), reward, done and not self.truncate, done and self.truncate, {}


def _rllib_multi_agent_env_class() -> type:
    from ray.rllib.env.multi_agent_env import MultiAgentEnv

    class TwoAgentEnv(MultiAgentEnv):
        """Agent "a0" acts ``K`` steps, "a1" the first 3 (terminated there); fixed rewards."""

        def __init__(self, config: Any = None) -> None:
            super().__init__()
            space = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
            self.agents = self.possible_agents = ["a0", "a1"]
            self.observation_spaces = {a: space for a in self.agents}
            self.action_spaces = {a: gym.spaces.Discrete(2) for a in self.agents}
            self.observation_space = gym.spaces.Dict(self.observation_spaces)
            self.action_space = gym.spaces.Dict(self.action_spaces)
            self.t = 0

        def reset(self, *, seed: int | None = None, options: Any = None) -> Any:
            self.t = 0
            return {"a0": obs_at(0), "a1": -obs_at(0)}, {}

        def step(self, action_dict: dict[str, Any]) -> Any:
            self.t += 1
            obs, rew, term = {}, {}, {}
            for aid in action_dict:
                obs[aid] = obs_at(self.t) if aid == "a0" else -obs_at(self.t)
                rew[aid] = REWARDS[(self.t - 1) % len(REWARDS)] * (1 if aid == "a0" else -1)
                term[aid] = (aid == "a1" and self.t == 3) or self.t >= K
            term["__all__"] = self.t >= K
            return obs, rew, term, {"__all__": False}, {}

    return TwoAgentEnv


# ---------------------------------------------------------------------------- helpers


def rllib_config(
    *,
    rollout_fragment_length: int = 10,
    num_envs: int = 1,
    batch_mode: str = "truncate_episodes",
    observation_filter: str = "NoFilter",
    clip_rewards: Any = None,
    env_config: dict[str, Any] | None = None,
    policies: Any = None,
    policy_mapping_fn: Callable[..., str] | None = None,
) -> Any:
    """RLlib 2.60's PPO config on the old API stack with these settings."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from ray.rllib.algorithms.ppo import PPOConfig

        config = (
            PPOConfig()
            .api_stack(enable_rl_module_and_learner=False, enable_env_runner_and_connector_v2=False)
            .environment(env_config=env_config or {}, clip_rewards=clip_rewards)
            .env_runners(
                rollout_fragment_length=rollout_fragment_length,
                num_envs_per_env_runner=num_envs,
                batch_mode=batch_mode,
                observation_filter=observation_filter,
            )
            .debugging(seed=0)
        )
        if policies is not None:
            config.multi_agent(policies=policies, policy_mapping_fn=policy_mapping_fn)
    return config


@contextmanager
def rllib_worker(env_creator: Callable[[Any], Any], config: Any) -> Iterator[Any]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from ray.rllib.algorithms.ppo.ppo_torch_policy import PPOTorchPolicy
        from ray.rllib.evaluation.rollout_worker import RolloutWorker

        worker = RolloutWorker(
            env_creator=env_creator, default_policy_class=PPOTorchPolicy, config=config
        )
    try:
        yield worker
    finally:
        worker.stop()


@contextmanager
def our_worker(env_creator: Callable[[Any], Any], config: Any) -> Iterator[Any]:
    worker = fastrollout.RolloutWorker(env_creator=env_creator, config=config)
    try:
        yield worker
    finally:
        worker.stop()


def rllib_sample(worker: Any) -> SampleBatch:
    """RLlib's single-policy batch (it comes as a MultiAgentBatch; see the module doc)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        batch = worker.sample()
    assert type(batch).__name__ == "MultiAgentBatch"
    assert list(batch.policy_batches) == ["default_policy"]
    return batch.policy_batches["default_policy"]


def our_sample(worker: Any) -> SampleBatch:
    batch = worker.sample()
    assert isinstance(batch, SampleBatch)  # deliberate: see the module doc
    return batch


def assert_same_structure(ours: Any, theirs: Any, same_count: bool = True) -> None:
    """Same columns, dtypes (but actions') and trailing shapes; the same row count."""
    assert sorted(ours.keys()) == sorted(theirs.keys())
    if same_count:
        assert ours.count == theirs.count
    for key in theirs:
        a, b = np.asarray(ours[key]), np.asarray(theirs[key])
        if key == "actions":  # deliberate: int64 (RLlib: int32 for Discrete)
            assert (a.dtype, b.dtype) == (np.int64, np.int32)
        else:
            assert a.dtype == b.dtype, key
        assert len(a) == ours.count and len(b) == theirs.count, key
        assert a.shape[1:] == b.shape[1:], key


def changes(x: Any) -> list[int]:
    """The rows where a column's value differs from the previous row's."""
    x = np.asarray(x)
    return np.flatnonzero(x[1:] != x[:-1]).tolist()


def assert_episode_rows(batch: Any) -> None:
    """Within one episode chunk: t counts up by 1 and new_obs[i] == obs[i + 1]."""
    same = batch["eps_id"][1:] == batch["eps_id"][:-1]
    np.testing.assert_array_equal(batch["t"][1:][same], batch["t"][:-1][same] + 1)
    np.testing.assert_array_equal(batch["new_obs"][:-1][same], batch["obs"][1:][same])
    assert not (batch["terminateds"][:-1] | batch["truncateds"][:-1])[same].any()


BOUNDARY_COLUMNS = ("t", "terminateds", "truncateds", "obs", "new_obs", "rewards", "agent_index")


# ----------------------------------------------------------------------------- tests


@pytest.mark.parametrize("entry", ["rllib_config", "runner_config"])
def test_cartpole_columns_dtypes_shapes(entry: str) -> None:
    creator = lambda ctx: gym.make("CartPole-v1")  # noqa: E731
    config = rllib_config(rollout_fragment_length=16, num_envs=2)
    ours_config: Any = config
    if entry == "runner_config":
        ours_config = (
            fastrollout.RunnerConfig()
            .env_runners(num_envs_per_env_runner=2, rollout_fragment_length=16)
            .debugging(seed=0)
        )
    with rllib_worker(creator, config) as theirs_w, our_worker(creator, ours_config) as ours_w:
        for _ in range(2):
            theirs, ours = rllib_sample(theirs_w), our_sample(ours_w)
            # Both exact: each sub-env stops at its own fragment.
            assert theirs.count == ours.count == 32
            assert_same_structure(ours, theirs)
            assert_episode_rows(ours)
            assert_episode_rows(theirs)
        assert sorted(ours_w.get_weights()) == sorted(theirs_w.get_weights())


@pytest.mark.parametrize("num_envs", [1, 4])
def test_truncate_episodes_sizes_and_boundaries(num_envs: int) -> None:
    config = rllib_config(num_envs=num_envs, env_config={"truncate": num_envs == 4})
    with rllib_worker(FixedEnv, config) as theirs_w, our_worker(FixedEnv, config) as ours_w:
        for _ in range(3):
            theirs, ours = rllib_sample(theirs_w), our_sample(ours_w)
            assert ours.count == theirs.count == 10 * num_envs
            assert_same_structure(ours, theirs)
            assert_episode_rows(ours)
            # The envs run in lockstep, so rows of the same t are alike on both: sorted
            # by t, every row matches whatever order the envs' chunks come in.
            for batch in (ours, theirs):
                assert batch["terminateds"].any() != batch["truncateds"].any()
            order_o = np.argsort(ours["t"], kind="stable")
            order_t = np.argsort(theirs["t"], kind="stable")
            for key in BOUNDARY_COLUMNS:
                np.testing.assert_array_equal(ours[key][order_o], theirs[key][order_t], key)
            for key in ("eps_id", "unroll_id"):  # one value per episode chunk on both
                assert len(set(ours[key].tolist())) == len(set(theirs[key].tolist())), key
            if num_envs == 1:  # one env: the rows themselves line up
                for key in BOUNDARY_COLUMNS:
                    np.testing.assert_array_equal(ours[key], theirs[key], key)
                assert changes(ours["eps_id"]) == changes(theirs["eps_id"])
                assert changes(ours["unroll_id"]) == changes(theirs["unroll_id"])


@pytest.mark.parametrize("num_envs", [1, 4])
def test_complete_episodes_sizes(num_envs: int) -> None:
    config = rllib_config(num_envs=num_envs, batch_mode="complete_episodes")
    target = 10 * num_envs
    with rllib_worker(FixedEnv, config) as theirs_w, our_worker(FixedEnv, config) as ours_w:
        for _ in range(2):
            theirs, ours = rllib_sample(theirs_w), our_sample(ours_w)
            for batch in (ours, theirs):
                assert batch.count >= target
                assert batch.count % K == 0
                ends = np.flatnonzero(batch["terminateds"])
                np.testing.assert_array_equal(np.flatnonzero(batch["t"] == 0), ends + 1 - K)
                assert_episode_rows(batch)
            assert_same_structure(ours, theirs)
            assert ours.count == theirs.count == -(-target // K) * K


@pytest.mark.parametrize("entry", ["rllib_config", "runner_config"])
@pytest.mark.parametrize("num_envs", [1, 2])
def test_mean_std_filter_statistics(entry: str, num_envs: int) -> None:
    config = rllib_config(num_envs=num_envs, observation_filter="MeanStdFilter")
    ours_config: Any = config
    if entry == "runner_config":
        ours_config = (
            fastrollout.RunnerConfig()
            .env_runners(
                num_envs_per_env_runner=num_envs,
                rollout_fragment_length=10,
                observation_filter="MeanStdFilter",
            )
            .debugging(seed=0)
        )
    with rllib_worker(FixedEnv, config) as theirs_w, our_worker(FixedEnv, ours_config) as ours_w:
        for first in (True, False):
            theirs, ours = rllib_sample(theirs_w), our_sample(ours_w)
            if num_envs == 1:
                np.testing.assert_allclose(ours["obs"], theirs["obs"], rtol=1e-5, atol=1e-5)
                np.testing.assert_allclose(ours["new_obs"], theirs["new_obs"], rtol=1e-5, atol=1e-5)
            else:
                # Deliberate: within one vector step RLlib filters env i's observation
                # with the statistics after envs 0..i, fastrollout all envs' observations
                # of the step with the statistics after all of them (order-independent).
                # The same raw observation in one step thus filters alike here only.
                # First reset, both envs: RLlib's env 0 row is all 0 (its own mean).
                if first:
                    o0, t0 = ours["obs"][ours["t"] == 0], theirs["obs"][theirs["t"] == 0]
                    np.testing.assert_array_equal(o0[0], o0[1])
                    np.testing.assert_array_equal(t0[0], np.zeros(3))
                    assert not np.array_equal(t0[0], t0[1])
            theirs_f = theirs_w.filters["default_policy"]
            ours_f = ours_w.get_filters()["default_policy"]
            for name in ("running_stats", "buffer"):
                a, b = getattr(ours_f, name), getattr(theirs_f, name)
                assert a.n == b.n, name
                np.testing.assert_allclose(a.mean, b.mean, rtol=1e-9, atol=1e-12, err_msg=name)
                np.testing.assert_allclose(a.std, b.std, rtol=1e-6, atol=1e-9, err_msg=name)
        # 20 steps per env, an episode starting at steps 0, 7 and 14 of each: 23 obs.
        assert ours_f.running_stats.n == 23 * num_envs


@pytest.mark.parametrize("clip_rewards", [None, True, 0.5])
def test_reward_clipping(clip_rewards: Any) -> None:
    config = rllib_config(rollout_fragment_length=12, clip_rewards=clip_rewards)
    with rllib_worker(FixedEnv, config) as theirs_w, our_worker(FixedEnv, config) as ours_w:
        for _ in range(2):
            theirs, ours = rllib_sample(theirs_w), our_sample(ours_w)
            assert ours["rewards"].dtype == theirs["rewards"].dtype == np.float32
            np.testing.assert_array_equal(ours["rewards"], theirs["rewards"])
    raw = np.array([REWARDS[t % len(REWARDS)] for t in range(K)] * 4, np.float32)[12:24]
    if clip_rewards is None:
        want = raw
    elif clip_rewards is True:
        want = np.sign(raw)
    else:
        want = np.clip(raw, -0.5, 0.5)
    np.testing.assert_array_equal(ours["rewards"], want)


def test_multi_agent_two_policies() -> None:
    env_cls = _rllib_multi_agent_env_class()

    def mapping(agent_id: Any, *args: Any, **kwargs: Any) -> str:
        return {"a0": "p0", "a1": "p1"}[agent_id]

    config = rllib_config(
        rollout_fragment_length=10, policies={"p0", "p1"}, policy_mapping_fn=mapping
    )
    seen: dict[str, set[tuple[int, int]]] = {"p0": set(), "p1": set()}
    total_repeats = 0
    with rllib_worker(env_cls, config) as theirs_w, our_worker(env_cls, config) as ours_w:
        for _ in range(3):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                theirs = theirs_w.sample()
            ours = ours_w.sample()
            assert isinstance(ours, MultiAgentBatch)
            assert ours.env_steps() == theirs.env_steps() == 10
            assert sorted(ours.policy_batches) == sorted(theirs.policy_batches) == ["p0", "p1"]
            # RLlib 2.60 bug: an agent done in an episode that a batch boundary cuts has its
            # rows emitted again in the next batch (same eps_id, t, actions, action_logp).
            # fastrollout emits each agent step once; drop RLlib's repeats to compare.
            theirs_batches, repeats = {}, 0
            for pid, t in theirs.policy_batches.items():
                keys = list(zip(t["eps_id"].tolist(), t["t"].tolist(), strict=True))
                fresh = np.array([k not in seen[pid] for k in keys], dtype=bool)
                seen[pid].update(keys)
                repeats += int((~fresh).sum())
                theirs_batches[pid] = SampleBatch({k: t[k][fresh] for k in t})
            assert ours.agent_steps() == theirs.agent_steps() - repeats
            total_repeats += repeats
            for pid in ("p0", "p1"):
                o, t = ours.policy_batches[pid], theirs_batches[pid]
                assert_same_structure(o, t)
                assert_episode_rows(o)
                for key in BOUNDARY_COLUMNS:
                    np.testing.assert_array_equal(o[key], t[key], f"{pid}: {key}")
                assert changes(o["eps_id"]) == changes(t["eps_id"])
        assert total_repeats > 0  # the bug shows here (a1's steps of episodes 2 and 3)
        assert sorted(ours_w.get_weights()) == sorted(theirs_w.get_weights())
        # Deliberate: RLlib ignores weights of an unknown policy; fastrollout raises.
        theirs_w.set_weights({"nope": {}})
        with pytest.raises(KeyError, match="nope"):
            ours_w.set_weights({"nope": {}})
