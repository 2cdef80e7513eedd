"""RLlib's PPO trains with fastrollout's runners (``env_runner_cls``), as with its own.

The proof the drop-in works end to end: RLlib's Algorithm, EnvRunnerGroup (local, and
two remote Ray actors), learner connectors and Learner, with fastrollout's runners
sampling, learn CartPole to a mean return of 150 in about as many iterations as with
RLlib's own runner (PPO's CartPole settings from RLlib's tuned example, smaller batches).
"""

from __future__ import annotations

import pytest

import fastrollout as fr

ppo = pytest.importorskip("ray.rllib.algorithms.ppo")

TARGET = 150.0
MAX_ITERS = 40


def _config(env_runner_cls, *, num_env_runners=0, multi_agent=False):
    config = (
        ppo.PPOConfig()
        .env_runners(
            env_runner_cls=env_runner_cls,
            num_env_runners=num_env_runners,
            num_envs_per_env_runner=2,
        )
        .training(
            lr=0.0003,
            num_epochs=6,
            vf_loss_coeff=0.01,
            train_batch_size_per_learner=1000,
            minibatch_size=250,
        )
        .rl_module(model_config={"fcnet_hiddens": [64, 64]})
        .debugging(seed=0)
    )
    if multi_agent:
        from ray.rllib.examples.envs.classes.multi_agent import MultiAgentCartPole

        config = config.environment(MultiAgentCartPole, env_config={"num_agents": 2}).multi_agent(
            policies=["p0", "p1"], policy_mapping_fn=lambda aid, *a, **k: f"p{aid}"
        )
    else:
        config = config.environment("CartPole-v1")
    return config


def _train(algo, check=None):
    """Trains until the mean return passes TARGET; the number of iterations it took."""
    for i in range(1, MAX_ITERS + 1):
        result = algo.train()
        if check is not None:
            check(algo, result)
        ret = result["env_runners"].get("episode_return_mean")
        if ret is not None and ret >= TARGET:
            return i
    pytest.fail(f"mean return below {TARGET} after {MAX_ITERS} iterations: {ret}")


def _fr_runner(multi_agent):
    return fr.MultiAgentEnvRunner if multi_agent else fr.SingleAgentEnvRunner


@pytest.mark.parametrize("multi_agent", [False, True], ids=["single_agent", "multi_agent"])
def test_ppo_learns_with_the_local_runner_as_with_rllibs(ray_local, multi_agent):
    """As many iterations as RLlib's own runner takes, give or take (same seed, same
    settings; the runners draw different random numbers)."""
    from ray.rllib.env.multi_agent_env_runner import MultiAgentEnvRunner
    from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner

    iters = {}
    for name, runner_cls in (
        ("fastrollout", _fr_runner(multi_agent)),
        ("rllib", MultiAgentEnvRunner if multi_agent else SingleAgentEnvRunner),
    ):
        algo = _config(runner_cls, multi_agent=multi_agent).build_algo()
        try:
            assert type(algo.env_runner) is runner_cls
            iters[name] = _train(algo)
        finally:
            algo.stop()
    assert iters["fastrollout"] <= 1.5 * iters["rllib"] + 3, iters


@pytest.mark.parametrize("multi_agent", [False, True], ids=["single_agent", "multi_agent"])
def test_ppo_learns_with_two_remote_runners_in_step(ray_local, multi_agent):
    """Two remote runners: after each sync both hold the same, rising weights_seq_no."""
    seen = []
    runner_cls = _fr_runner(multi_agent)

    def check(algo, result):
        group = algo.env_runner_group
        seqs = group.foreach_env_runner(
            lambda r: (type(r).__name__, r._weights_seq_no), local_env_runner=False
        )
        assert len(seqs) == 2
        assert {name for name, _ in seqs} == {runner_cls.__name__}
        assert len({seq for _, seq in seqs}) == 1, seqs
        seen.append(seqs[0][1])

    algo = _config(runner_cls, num_env_runners=2, multi_agent=multi_agent).build_algo()
    try:
        # RLlib's rule: the local runner of a group with remote runners holds no env.
        assert algo.env_runner.env is None
        _train(algo, check)
    finally:
        algo.stop()
    # Each iteration's weights went out with a higher number.
    assert seen == sorted(seen) and len(set(seen)) == len(seen)


@pytest.mark.parametrize("algo_name", ["DQN", "SAC"])
def test_off_policy_algorithms_learn_from_the_runners_episodes(ray_local, algo_name):
    """DQN and SAC: RLlib's replay buffers take fastrollout's episodes and the Learner
    updates from what they sample (a few iterations; learning itself is PPO's proof)."""
    if algo_name == "DQN":
        from ray.rllib.algorithms.dqn import DQNConfig as Config

        env = "CartPole-v1"
        training = {"num_steps_sampled_before_learning_starts": 200, "train_batch_size": 32}
    else:
        from ray.rllib.algorithms.sac import SACConfig as Config

        env = "Pendulum-v1"
        training = {"num_steps_sampled_before_learning_starts": 200, "train_batch_size": 32}
    config = (
        Config()
        .environment(env)
        .env_runners(env_runner_cls=fr.SingleAgentEnvRunner, num_env_runners=0)
        .training(**training)
        .rl_module(model_config={"fcnet_hiddens": [32]})
        .reporting(min_time_s_per_iteration=0, min_sample_timesteps_per_iteration=100)
        .debugging(seed=0)
    )
    algo = config.build_algo()
    try:
        assert isinstance(algo.env_runner, fr.SingleAgentEnvRunner)
        for _ in range(4):
            result = algo.train()
        learner = result["learners"]["default_policy"]
        assert learner["num_module_steps_trained"] > 0
        assert result["env_runners"]["num_env_steps_sampled_lifetime"] >= 400
    finally:
        algo.stop()


@pytest.mark.parametrize("algo_name", ["APPO", "IMPALA"])
def test_async_algorithms_train_with_a_remote_runner(ray_local, algo_name):
    """APPO and IMPALA: a remote runner samples through RLlib's asynchronous protocol
    (sample_get_state_and_metrics, weights pulled from the EnvRunnerStateServer) and the
    Learner updates from its episodes."""
    if algo_name == "APPO":
        from ray.rllib.algorithms.appo import APPOConfig as Config
    else:
        from ray.rllib.algorithms.impala import IMPALAConfig as Config
    config = (
        Config()
        .environment("CartPole-v1")
        .env_runners(
            env_runner_cls=fr.SingleAgentEnvRunner,
            num_env_runners=1,
            num_envs_per_env_runner=2,
            rollout_fragment_length=50,
        )
        .learners(num_learners=0, num_aggregator_actors_per_learner=0)
        .training(train_batch_size_per_learner=200)
        .rl_module(model_config={"fcnet_hiddens": [32]})
        .reporting(min_time_s_per_iteration=0, min_sample_timesteps_per_iteration=200)
        .debugging(seed=0)
    )
    algo = config.build_algo()
    try:
        trained = 0
        for _ in range(6):
            result = algo.train()
            trained += (
                result.get("learners", {})
                .get("default_policy", {})
                .get("num_module_steps_trained", 0)
            )
        assert trained > 0
        assert result["env_runners"]["num_env_steps_sampled_lifetime"] > 0
        # The remote runner took the Learner's newer weights.
        seqs = algo.env_runner_group.foreach_env_runner(
            lambda r: r._weights_seq_no, local_env_runner=False
        )
        assert seqs and seqs[0] > 0
    finally:
        algo.stop()


def _lstm_algorithm(algo_name, *, num_env_runners, multi_agent):
    """RLlib's algorithm with its default LSTM module on (multi-agent) StatelessCartPole."""
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    if algo_name == "PPO":
        Config = ppo.PPOConfig
        training = {"train_batch_size_per_learner": 200, "minibatch_size": 100, "num_epochs": 2}
    elif algo_name == "APPO":
        from ray.rllib.algorithms.appo import APPOConfig as Config

        training = {"train_batch_size_per_learner": 200}
    else:
        from ray.rllib.algorithms.impala import IMPALAConfig as Config

        training = {"train_batch_size_per_learner": 200}
    config = (
        Config()
        .env_runners(
            env_runner_cls=_fr_runner(multi_agent),
            num_env_runners=num_env_runners,
            num_envs_per_env_runner=2,
            rollout_fragment_length=50,
        )
        .learners(num_learners=0)
        .training(**training)
        .rl_module(
            model_config=DefaultModelConfig(use_lstm=True, max_seq_len=10, lstm_cell_size=16)
        )
        .reporting(min_time_s_per_iteration=0, min_sample_timesteps_per_iteration=200)
        .debugging(seed=0)
    )
    if algo_name != "PPO":
        config = config.learners(num_aggregator_actors_per_learner=0)
    if multi_agent:
        from ray.rllib.examples.envs.classes.multi_agent import MultiAgentStatelessCartPole

        config = config.environment(
            MultiAgentStatelessCartPole, env_config={"num_agents": 2}
        ).multi_agent(policies=["p0", "p1"], policy_mapping_fn=lambda aid, *a, **k: f"p{aid}")
    else:
        from ray.rllib.examples.envs.classes.stateless_cartpole import StatelessCartPole

        config = config.environment(StatelessCartPole)
    return config.build_algo()


@pytest.mark.parametrize("algo_name", ["PPO", "APPO", "IMPALA"])
@pytest.mark.parametrize(
    ("num_env_runners", "multi_agent"),
    [(0, False), (1, True)],
    ids=["local_single_agent", "remote_multi_agent"],
)
def test_lstm_algorithms_train_on_the_runners_recurrent_episodes(
    ray_local, algo_name, num_env_runners, multi_agent
):
    """RLlib's learner connectors read the states fastrollout's runners recorded (its
    AddStatesFromEpisodesToBatch, AddTimeDimToBatchAndZeroPad) and every module trains."""
    algo = _lstm_algorithm(algo_name, num_env_runners=num_env_runners, multi_agent=multi_agent)
    modules = ["p0", "p1"] if multi_agent else ["default_policy"]
    try:
        trained = dict.fromkeys(modules, 0)
        for _ in range(8):
            result = algo.train()
            for mid in modules:
                trained[mid] += (
                    result.get("learners", {}).get(mid, {}).get("num_module_steps_trained", 0)
                )
            if all(trained.values()):
                break
        assert all(trained.values()), trained
        runner_cls = _fr_runner(multi_agent)
        kinds = algo.env_runner_group.foreach_env_runner(
            lambda r: type(r).__name__, local_env_runner=num_env_runners == 0
        )
        assert set(kinds) == {runner_cls.__name__}
    finally:
        algo.stop()


def test_lstm_ppo_learns_stateless_cartpole_with_the_runner(ray_local):
    """RLlib's LSTM PPO on StatelessCartPole (no velocities: only memory does well) reaches
    a mean return of 100 with fastrollout's runner; ``benches/lstm_learning.py`` runs the
    same with both runners (9 iterations each with seed 0)."""
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
    from ray.rllib.examples.envs.classes.stateless_cartpole import StatelessCartPole

    config = (
        ppo.PPOConfig()
        .environment(StatelessCartPole)
        .env_runners(env_runner_cls=fr.SingleAgentEnvRunner, num_envs_per_env_runner=4)
        .training(lr=0.0005, num_epochs=6, vf_loss_coeff=0.01, train_batch_size_per_learner=2000)
        .rl_module(
            model_config=DefaultModelConfig(use_lstm=True, max_seq_len=20, lstm_cell_size=64)
        )
        .debugging(seed=0)
    )
    algo = config.build_algo()
    try:
        for _ in range(30):
            ret = algo.train()["env_runners"].get("episode_return_mean")
            if ret is not None and ret >= 100.0:
                return
        pytest.fail(f"mean return below 100 after 30 iterations: {ret}")
    finally:
        algo.stop()
