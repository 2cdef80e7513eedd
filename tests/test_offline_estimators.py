"""Off-policy estimation (fastrollout.offline.estimate), against RLlib 2.60's estimators.

The differential tests drive RLlib's old-stack estimators (``ImportanceSampling``,
``WeightedImportanceSampling``, ``DirectMethod``, ``DoublyRobust``) on SampleBatches
built from the same fastrollout episodes, with a stand-in policy whose
``compute_log_likelihoods`` asks the same fastrollout module, and (DM/DR) a stand-in Q
model that returns the same fitted Q values.
"""

from __future__ import annotations

from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
import pytest
import torch

import fastrollout as fr
from fastrollout.offline import estimate
from fastrollout.offline.estimators import FittedQEvaluation, TargetPolicy, logged_steps

# Float tolerance of the differential tests. The formulas run in float64 on both sides,
# but the module computes its logits in float32, and one forward pass over all steps (the
# estimator) and one per episode (RLlib) round differently: relative differences of
# about 1e-8 in the log-probabilities, hence 1e-8 to 1e-7 in the estimates.
RTOL = 1e-6


class ChainEnv(gym.Env):
    """Three steps through states 0, 1, 2 whatever the actions; reward 1 for action 1.

    The value of a policy is ``sum_t gamma^t pi(1 | t)``, known exactly.
    """

    def __init__(self, config: Any = None) -> None:
        self.observation_space = gym.spaces.Discrete(3)
        self.action_space = gym.spaces.Discrete(2)
        self._t = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> Any:
        super().reset(seed=seed)
        self._t = 0
        return 0, {}

    def step(self, action: Any) -> Any:
        reward = float(action == 1)
        self._t += 1
        terminated = self._t >= 3
        return min(self._t, 2), reward, terminated, False, {}


def _runner(env: Any, seed: int) -> Any:
    config = fr.RunnerConfig().environment(env).debugging(seed=seed)
    return fr.SingleAgentEnvRunner(config=config)


@pytest.fixture(scope="module")
def cartpole() -> tuple[list[Any], Any, Any]:
    """CartPole episodes of a behaviour module (seed 0), and a target module (seed 1)."""
    behaviour = _runner("CartPole-v1", 0)
    episodes = behaviour.sample(num_episodes=12)
    target = _runner("CartPole-v1", 1)
    return episodes, behaviour.module, target.module


@pytest.fixture(scope="module")
def chain() -> tuple[list[Any], Any]:
    behaviour = _runner(ChainEnv, 0)
    episodes = behaviour.sample(num_episodes=400)
    target = _runner(ChainEnv, 3).module
    # A target that prefers action 1 (pi(1 | s) = 0.82), unlike the near-uniform behaviour.
    with torch.no_grad():
        head = target.pi.net.mlp[0]
        head.weight.zero_()
        head.bias.copy_(torch.tensor([0.0, 1.5]))
    return episodes, target


def _target_logp(module: Any, obs: np.ndarray, actions: np.ndarray) -> np.ndarray:
    """The target's log-probabilities, computed here independently of the estimator."""
    with torch.no_grad():
        logits = module.forward_inference({"obs": torch.as_tensor(obs)})["action_dist_inputs"]
    dist = module.get_inference_action_dist_cls().from_logits(logits)
    return dist.logp(torch.as_tensor(actions).long()).double().numpy()


class _Policy:
    """What RLlib's estimators call on their policy, answered by a fastrollout module."""

    config: ClassVar[dict[str, Any]] = {}

    def __init__(self, module: Any) -> None:
        self.module = module
        self.action_space = module.action_space
        self.observation_space = module.observation_space

    def compute_log_likelihoods(self, actions: Any, obs_batch: Any, **kwargs: Any) -> Any:
        return _target_logp(self.module, np.asarray(obs_batch), np.asarray(actions))


def _sample_batch(episodes: list[Any]) -> Any:
    from ray.rllib.policy.sample_batch import SampleBatch

    columns: dict[str, list[np.ndarray]] = {
        k: [] for k in ("obs", "new_obs", "actions", "rewards", "action_prob", "eps_id")
    }
    for i, e in enumerate(episodes):
        obs = np.asarray(e.get_observations())
        columns["obs"].append(obs[:-1])
        columns["new_obs"].append(obs[1:])
        columns["actions"].append(np.asarray(e.get_actions()))
        columns["rewards"].append(np.asarray(e.get_rewards(), np.float64))
        logp = np.asarray(e.get_extra_model_outputs("action_logp"), np.float64)
        columns["action_prob"].append(np.exp(logp))
        columns["eps_id"].append(np.full(len(e), i))
    return SampleBatch({k: np.concatenate(v) for k, v in columns.items()})


@pytest.mark.parametrize("gamma", [0.99, 0.9])
def test_is_and_wis_match_rllib(cartpole: Any, gamma: float) -> None:
    from ray.rllib.offline.estimators import ImportanceSampling, WeightedImportanceSampling

    episodes, _, target = cartpole
    ours = estimate(episodes, target, ["is", "wis"], gamma=gamma)
    for name, cls in (("is", ImportanceSampling), ("wis", WeightedImportanceSampling)):
        theirs = cls(_Policy(target), gamma=gamma).estimate(_sample_batch(episodes))
        scale = RTOL * abs(float(theirs["v_target"]))  # v_delta: a difference of two
        for key, value in theirs.items():
            assert ours[name][key] == pytest.approx(float(value), rel=RTOL, abs=scale), (
                name,
                key,
            )
    # A different target than the behaviour: the weights are not all 1.
    assert ours["is"]["v_target"] != pytest.approx(ours["is"]["v_behavior"])


def test_epsilon_greedy_matches_rllib(cartpole: Any) -> None:
    from ray.rllib.offline.estimators import ImportanceSampling, WeightedImportanceSampling

    episodes, _, target = cartpole
    ours = estimate(episodes, target, ["is", "wis"], gamma=0.95, epsilon_greedy=0.3)
    for name, cls in (("is", ImportanceSampling), ("wis", WeightedImportanceSampling)):
        theirs = cls(_Policy(target), gamma=0.95, epsilon_greedy=0.3).estimate(
            _sample_batch(episodes)
        )
        assert ours[name]["v_target"] == pytest.approx(theirs["v_target"], rel=RTOL)
        assert ours[name]["v_target_std"] == pytest.approx(theirs["v_target_std"], rel=RTOL)


def test_dm_and_dr_formulas_match_rllib_with_the_same_q_model(cartpole: Any) -> None:
    from ray.rllib.offline.estimators import DirectMethod, DoublyRobust

    episodes, _, target = cartpole
    gamma = 0.99
    steps = logged_steps(episodes)
    policy = TargetPolicy(target)
    q_model = FittedQEvaluation(target.observation_space, 2, gamma=gamma, n_iters=20)
    q_model.fit(steps, policy.probs(steps.next_obs))

    class FixedQ:
        """RLlib's Q-model interface over the Q model fitted above."""

        def __init__(self, policy: Any, gamma: float, **kwargs: Any) -> None:
            pass

        def estimate_q(self, batch: Any) -> np.ndarray:
            q = q_model.q_values(np.asarray(batch["obs"]))
            return q[np.arange(len(q)), np.asarray(batch["actions"])]

        def estimate_v(self, batch: Any) -> np.ndarray:
            obs = np.asarray(batch["obs"])
            return (q_model.q_values(obs) * policy.probs(obs)).sum(axis=1)

    ours = estimate(episodes, target, ["dm", "dr"], gamma=gamma, q_model=q_model)
    for name, cls in (("dm", DirectMethod), ("dr", DoublyRobust)):
        rllib = cls(_Policy(target), gamma=gamma, q_model_config={"type": FixedQ})
        theirs = rllib.estimate(_sample_batch(episodes))
        scale = RTOL * abs(float(theirs["v_target"]))
        for key, value in theirs.items():
            assert ours[name][key] == pytest.approx(float(value), rel=RTOL, abs=scale), (
                name,
                key,
            )


def test_target_equal_to_behaviour_gives_gain_one() -> None:
    runner = _runner("CartPole-v1", 0)
    episodes = runner.sample(num_episodes=8)  # explore=True: logged with the same dist
    result = estimate(episodes, runner.module, ["is", "wis"], explore=True)
    for name in ("is", "wis"):
        # The logged action_logp is float32; the recomputed one float64.
        assert result[name]["v_gain"] == pytest.approx(1.0, abs=1e-5)
        assert result[name]["v_target"] == pytest.approx(result[name]["v_behavior"], rel=1e-5)
    # The default module's inference and exploration distributions are the same.
    inference = estimate(episodes, runner.module, ["is"])
    assert inference["is"]["v_gain"] == pytest.approx(1.0, abs=1e-5)
    # Against itself from the logs alone: exactly 1.
    behaviour = estimate(episodes, None, ["is", "wis"])
    assert behaviour["is"]["v_gain"] == 1.0 and behaviour["wis"]["v_gain"] == 1.0


def _true_chain_value(module: Any, gamma: float) -> float:
    logp_one = _target_logp(module, np.arange(3), np.ones(3))
    return float(np.sum(gamma ** np.arange(3) * np.exp(logp_one)))


def test_all_methods_land_near_the_true_value_on_a_chain(chain: Any) -> None:
    episodes, target = chain
    gamma = 0.9
    truth = _true_chain_value(target, gamma)
    result = estimate(episodes, target, gamma=gamma, fqe={"n_iters": 300, "minibatch_size": None})
    # The behaviour's own value, for scale: the target differs from it.
    assert result["is"]["v_behavior"] < truth - 0.3
    assert result["dm"]["q_loss"] < 0.3
    # IS and WIS within three standard errors (about 0.13 here); DM's error is the Q
    # model's only, and DR with an accurate Q model has a small variance.
    for name in ("is", "wis"):
        assert abs(result[name]["v_target"] - truth) < 3 * result[name]["v_target_ste"], name
    for name in ("dm", "dr"):
        assert result[name]["v_target"] == pytest.approx(truth, abs=0.03), name


def test_dr_is_unbiased_with_a_wrong_q_model(chain: Any) -> None:
    """DR corrects a Q model that is off: with zero Q it reduces to step-wise IS."""
    episodes, target = chain
    q_model = FittedQEvaluation(target.observation_space, 2, gamma=0.9, n_iters=0)
    with torch.no_grad():
        for p in q_model.q.parameters():
            p.zero_()
    result = estimate(episodes, target, ["is", "dm", "dr"], gamma=0.9, q_model=q_model)
    assert result["dm"]["v_target"] == 0.0
    assert result["dr"]["v_target"] == pytest.approx(result["is"]["v_target"], rel=1e-12)


def test_episodes_without_action_logp_are_refused() -> None:
    episode = fr.SingleAgentEpisode()
    episode.add_env_reset(observation=0)
    episode.add_env_step(observation=1, action=1, reward=1.0)
    with pytest.raises(ValueError, match="no extra model output 'action_logp'"):
        estimate([episode], None, ["is"])


def test_bad_arguments_are_refused(cartpole: Any) -> None:
    episodes, _, target = cartpole
    with pytest.raises(ValueError, match="unknown off-policy estimation method"):
        estimate(episodes, target, ["snips"])
    with pytest.raises(ValueError, match="need a target module"):
        estimate(episodes, None, ["dm"])
    with pytest.raises(ValueError, match="at least one episode"):
        estimate([], target, ["is"])
    with pytest.raises(ValueError, match="epsilon_greedy must be in"):
        estimate(episodes, target, ["is"], epsilon_greedy=2.0)


def test_chunks_of_one_episode_are_joined(cartpole: Any) -> None:
    episodes, _, target = cartpole
    long = max(episodes, key=len)
    half = len(long) // 2
    chunks = [long.slice(slice(0, half)), long.slice(slice(half, len(long)))]
    whole = estimate([long], target, ["is"])
    joined = estimate(chunks, target, ["is"])
    assert joined["is"]["v_target"] == pytest.approx(whole["is"]["v_target"], rel=1e-12)
    with pytest.raises(ValueError, match="not contiguous"):
        estimate([chunks[1], long.slice(slice(0, half - 1))], target, ["is"])
