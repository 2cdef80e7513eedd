"""ExternalEnv / ExternalMultiAgentEnv: RLlib 2.60's semantics, sampled by the runners.

Each simulator here records what it saw and did; the tests compare that with the episodes
the runner returns, step by step.
"""

from __future__ import annotations

import threading
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fastrollout as fr
from fastrollout.env import ExternalEnv, ExternalMultiAgentEnv

OBS = gym.spaces.Box(-100.0, 100.0, (2,), np.float32)
ACT = gym.spaces.Discrete(3)

# One step of a script: ("get", reward) acts on-policy, ("log", action, reward) logs an
# action taken by the simulator; each step's reward is logged in pieces to check that
# they add up (None: no reward logged, 0.0 assumed).
Step = tuple[Any, ...]


class Scripted(ExternalEnv):
    """Runs each script as one episode, all at once, one thread per episode."""

    def __init__(
        self,
        scripts: dict[str, list[Step]],
        *,
        untrained: frozenset[str] = frozenset(),
        max_concurrent: int | None = None,
    ) -> None:
        super().__init__(ACT, OBS, max_concurrent=max_concurrent)
        self.scripts = scripts
        self.untrained = untrained
        self.actions: dict[str, list[int]] = {}
        self.errors: list[BaseException] = []

    def play(self, eid: str, script: list[Step]) -> None:
        k = float(int(eid.split("-")[-1]) % 50)
        self.start_episode(eid, training_enabled=eid not in self.untrained)
        acts = []
        for t, step in enumerate(script):
            obs = np.array([t, k], np.float32)
            if step[0] == "get":
                acts.append(int(self.get_action(eid, obs)))
            else:
                self.log_action(eid, obs, step[1])
                acts.append(step[1])
            reward = step[-1]
            if reward is not None:
                self.log_returns(eid, reward / 2)
                self.log_returns(eid, reward / 2, info={"t": t})
        self.end_episode(eid, np.array([len(script), k], np.float32))
        self.actions[eid] = acts

    def run(self) -> None:
        threads = [
            threading.Thread(target=self._guard, args=(eid, s)) for eid, s in self.scripts.items()
        ]
        for th in threads:
            th.start()
        for th in threads:
            th.join()

    def _guard(self, eid: str, script: list[Step]) -> None:
        try:
            self.play(eid, script)
        except BaseException as err:  # kept for the test to show
            self.errors.append(err)


def runner_for(env: ExternalEnv, **env_runners: Any) -> fr.SingleAgentEnvRunner:
    config = fr.RunnerConfig().environment(lambda ctx: env).env_runners(**env_runners)
    return fr.SingleAgentEnvRunner(config=config.debugging(seed=0))


def check_episode(env: Scripted, episode: Any) -> None:
    """The episode the runner returned is the one the simulator played."""
    script = env.scripts[episode.id_]
    k = float(int(episode.id_.split("-")[-1]) % 50)
    obs = np.asarray(episode.get_observations())
    expected_obs = [[t, k] for t in range(len(script) + 1)]
    np.testing.assert_array_equal(obs, np.array(expected_obs, np.float32))
    assert list(episode.get_actions()) == env.actions[episode.id_]
    rewards = [0.0 if s[-1] is None else s[-1] for s in script]
    np.testing.assert_allclose(episode.get_rewards(), rewards)
    assert episode.is_terminated and not episode.is_truncated


def sample_all(runner: Any, n: int) -> list[Any]:
    episodes = runner.sample(num_episodes=n)
    assert not runner.env.errors, runner.env.errors
    return episodes


# -- the simulator's API (RLlib's errors) -----------------------------------------------


def test_episode_id_errors_match_rllib() -> None:
    """Unknown, duplicate and finished ids raise RLlib's ValueErrors, word for word."""
    from ray.rllib.env.external_env import ExternalEnv as RLlibExternalEnv

    ours, theirs = ExternalEnv(ACT, OBS), RLlibExternalEnv(ACT, OBS)
    obs = np.zeros(2, np.float32)

    def outcome(env: Any, call: str, *args: Any) -> str:
        try:
            return repr(getattr(env, call)(*args))
        except ValueError as err:
            return f"ValueError: {err}"

    calls = [
        ("start_episode", "a"),
        ("start_episode", "a"),
        ("log_returns", "nope", 1.0),
        ("end_episode", "a", obs),
        ("start_episode", "a"),
        ("log_returns", "a", 1.0),
        ("get_action", "a", obs),
        ("log_action", "a", obs, 1),
    ]
    for call in calls:
        assert outcome(ours, *call) == outcome(theirs, *call), call
    assert outcome(ours, "start_episode", "a") == "ValueError: Episode a has already completed."


def test_values_outside_the_spaces_are_refused_by_name() -> None:
    env = ExternalEnv(ACT, OBS)
    eid = env.start_episode()
    with pytest.raises(ValueError, match=r"observation outside the observation space.*\(3,\)"):
        env.log_action(eid, np.zeros(3, np.float32), 0)
    with pytest.raises(ValueError, match="action outside the action space"):
        env.log_action(eid, np.zeros(2, np.float32), 7)
    with pytest.raises(ValueError, match=r"outside.*\[500\.\s+0\.\]"):
        env.end_episode(eid, np.array([500, 0], np.float32))
    with pytest.raises(ValueError, match="reward must be a number"):
        env.log_returns(eid, "lots")  # type: ignore[arg-type]
    # Lists and other dtypes are cast to the space; the episode is still open.
    env.log_action(eid, [1, 2], np.int32(1))
    env.end_episode(eid, [0.5, 0.5])


def test_rewards_add_up_until_the_next_action_and_default_to_zero() -> None:
    scripts = {
        "ep-1": [("get", 1.0), ("get", None), ("log", 2, 4.0), ("get", -3.0)],
        "ep-2": [("get", None)],
    }
    env = Scripted(scripts)
    runner = runner_for(env)
    episodes = sample_all(runner, 2)
    assert sorted(e.id_ for e in episodes) == ["ep-1", "ep-2"]
    for e in episodes:
        check_episode(env, e)
    # The info of a step is the last one logged for it.
    ep1 = next(e for e in episodes if e.id_ == "ep-1")
    assert ep1.get_infos()[1] == {"t": 0}
    runner.stop()


def test_rewards_logged_before_the_first_action_count_toward_the_first_step() -> None:
    class Early(ExternalEnv):
        def run(self) -> None:
            eid = self.start_episode("e")
            self.log_returns(eid, 5.0)
            self.get_action(eid, np.zeros(2, np.float32))
            self.log_returns(eid, 1.0)
            self.end_episode(eid, np.ones(2, np.float32))

    runner = runner_for(Early(ACT, OBS))
    (episode,) = runner.sample(num_episodes=1)
    np.testing.assert_allclose(episode.get_rewards(), [6.0])
    runner.stop()


def test_logged_actions_are_recorded_as_given_with_the_modules_logp() -> None:
    scripts = {f"ep-{k}": [("log", k % 3, 1.0), ("get", 1.0), ("log", 2, 1.0)] for k in range(6)}
    env = Scripted(scripts)
    runner = runner_for(env)
    episodes = sample_all(runner, 6)
    module = runner.module
    for e in episodes:
        check_episode(env, e)
        obs = torch_obs(e.get_observations()[:-1])
        logits = module.forward_exploration({"obs": obs})["action_dist_inputs"]
        dist = module.get_exploration_action_dist_cls().from_logits(logits)
        expected = dist.logp(torch_obs(e.get_actions(), dtype="int64")).detach().numpy()
        np.testing.assert_allclose(
            e.get_extra_model_outputs("action_logp"), expected, rtol=1e-5, atol=1e-6
        )
    runner.stop()


def torch_obs(x: Any, dtype: str = "float32") -> Any:
    import torch

    return torch.as_tensor(np.asarray(x, dtype=dtype))


def test_the_simulators_own_outputs_replace_the_modules() -> None:
    class Local(ExternalEnv):
        def run(self) -> None:
            eid = self.start_episode("e")
            obs = np.zeros(2, np.float32)
            self.log_action(eid, obs, 1, extra_model_outputs={"action_logp": -0.25})
            self.log_action(eid, obs, 2, extra_model_outputs={"action_logp": -0.5})
            self.end_episode(eid, obs)

    runner = runner_for(Local(ACT, OBS))
    (episode,) = runner.sample(num_episodes=1)
    assert list(episode.get_actions()) == [1, 2]
    np.testing.assert_allclose(episode.get_extra_model_outputs("action_logp"), [-0.25, -0.5])
    runner.stop()


def test_many_episodes_at_once_each_recorded_exactly() -> None:
    rng = np.random.default_rng(0)
    scripts = {}
    for k in range(40):
        steps: list[Step] = []
        for _ in range(int(rng.integers(1, 12))):
            r = None if rng.random() < 0.2 else float(rng.integers(-5, 5))
            if rng.random() < 0.3:
                steps.append(("log", int(rng.integers(0, 3)), r))
            else:
                steps.append(("get", r))
        scripts[f"ep-{k}"] = steps
    env = Scripted(scripts, max_concurrent=8)
    runner = runner_for(env)
    episodes = sample_all(runner, 40)
    assert sorted(e.id_ for e in episodes) == sorted(scripts)
    for e in episodes:
        check_episode(env, e)
    runner.stop()


def test_untrained_episodes_are_served_and_counted_but_not_returned() -> None:
    scripts = {f"ep-{k}": [("get", 1.0)] * (k + 1) for k in range(6)}
    env = Scripted(scripts, untrained=frozenset({"ep-1", "ep-4"}))
    runner = runner_for(env)
    episodes = sample_all(runner, 4)
    assert sorted(e.id_ for e in episodes) == ["ep-0", "ep-2", "ep-3", "ep-5"]
    # An untrained episode may still be running when the fourth trained one ends: actions
    # are served only while the runner samples, so sample on until run() returns (untrained
    # steps count towards no sample size); what that call serves still counts below.
    with pytest.raises(RuntimeError, match="no episode runs"):
        runner.sample(num_timesteps=1)
    env.join(timeout=10)
    # Untrained episodes got their actions too (their simulators finished).
    assert set(env.actions) == set(scripts)
    metrics = runner.get_metrics()
    assert int(metrics["num_episodes"]) == 6
    assert int(metrics["num_env_steps_sampled"]) == sum(range(1, 7))
    runner.stop()


def test_untrained_steps_served_by_a_call_that_then_fails_still_count() -> None:
    """An untrained episode that runs after the last trained one is served by the next
    call; that call raises (run() returned, nothing to return) but counts what it served."""
    release = threading.Event()

    class Late(Scripted):
        def play(self, eid: str, script: list[Step]) -> None:
            if eid in self.untrained:
                assert release.wait(timeout=10)
            super().play(eid, script)

    env = Late(
        {"ep-0": [("get", 1.0)] * 2, "ep-1": [("get", 1.0)] * 3}, untrained=frozenset({"ep-1"})
    )
    runner = runner_for(env)
    assert [e.id_ for e in sample_all(runner, 1)] == ["ep-0"]
    release.set()
    with pytest.raises(RuntimeError, match="no episode runs"):
        runner.sample(num_timesteps=1)
    env.join(timeout=10)
    assert len(env.actions["ep-1"]) == 3
    metrics = runner.get_metrics()
    assert int(metrics["num_episodes"]) == 2
    assert int(metrics["num_env_steps_sampled"]) == 5
    runner.stop()


def test_timesteps_return_chunks_that_continue_across_calls() -> None:
    scripts = {f"ep-{k}": [("get", float(t)) for t in range(10)] for k in range(3)}
    env = Scripted(scripts)
    runner = runner_for(env)
    chunks: dict[str, list[Any]] = {}
    total = 0
    while total < 30:
        out = runner.sample(num_timesteps=7)
        # The last call returns what was left when the simulators finished.
        assert sum(len(c) for c in out) >= min(7, 30 - total)
        for c in out:
            chunks.setdefault(c.id_, []).append(c)
            total += len(c)
    assert total == 30
    for parts in chunks.values():
        rewards = np.concatenate([p.get_rewards() for p in parts])
        np.testing.assert_allclose(rewards, np.arange(10.0))
        assert parts[-1].is_terminated
        assert [p.t_started for p in parts] == [0, *np.cumsum([len(p) for p in parts])[:-1]]
    runner.stop()


def test_default_sample_size_counts_one_env() -> None:
    scripts = {f"ep-{k}": [("get", 1.0)] * 5 for k in range(4)}
    runner = runner_for(Scripted(scripts), rollout_fragment_length=6)
    out = runner.sample()
    assert 6 <= sum(len(e) for e in out) <= 6 + 3
    runner.stop()


# -- faults -----------------------------------------------------------------------------


def test_an_error_in_run_is_raised_by_sample() -> None:
    class Broken(ExternalEnv):
        def run(self) -> None:
            eid = self.start_episode()
            self.get_action(eid, np.zeros(2, np.float32))
            raise OSError("the simulator lost its device")

    runner = runner_for(Broken(ACT, OBS))
    with pytest.raises(OSError, match="lost its device") as info:
        runner.sample(num_episodes=1)
    assert any("run()" in note for note in info.value.__notes__)


def test_run_returning_ends_sampling_with_a_clear_error() -> None:
    class Short(ExternalEnv):
        def run(self) -> None:
            eid = self.start_episode()
            self.get_action(eid, np.zeros(2, np.float32))
            self.end_episode(eid, np.zeros(2, np.float32))

    runner = runner_for(Short(ACT, OBS))
    # What was sampled before is returned; then nothing more can come.
    (episode,) = runner.sample(num_episodes=2)
    assert episode.is_terminated and len(episode) == 1
    with pytest.raises(RuntimeError, match=r"run\(\) returned"):
        runner.sample(num_timesteps=1)


def test_stop_releases_simulators_waiting_for_an_action() -> None:
    errors: list[BaseException] = []
    started = threading.Event()

    class Waiting(ExternalEnv):
        def run(self) -> None:
            for k in range(2):
                eid = self.start_episode(f"w{k}")
                try:
                    self.get_action(eid, np.zeros(2, np.float32))
                    started.set()
                    self.get_action(eid, np.ones(2, np.float32))
                    self.get_action(eid, np.ones(2, np.float32))
                except RuntimeError as err:
                    errors.append(err)

    env = Waiting(ACT, OBS)
    runner = runner_for(env)
    runner.sample(num_timesteps=1)
    assert started.wait(10)
    runner.stop()
    env.join(timeout=10)
    assert not env.is_alive()
    assert errors and "closed" in str(errors[0])
    with pytest.raises(RuntimeError, match="closed"):
        env.start_episode()


def test_a_single_agent_runner_refuses_a_multi_agent_external_env() -> None:
    env = ExternalMultiAgentEnv(gym.spaces.Dict({"a": ACT}), gym.spaces.Dict({"a": OBS}))
    config = fr.RunnerConfig().environment(lambda ctx: env)
    with pytest.raises(TypeError, match="MultiAgentEnvRunner"):
        fr.SingleAgentEnvRunner(config=config)


# -- multi-agent ------------------------------------------------------------------------


class Team(ExternalMultiAgentEnv):
    """Two agents; "b" observes every other step; "a" may be done early."""

    def __init__(self, n: int, steps: int, *, a_done_at: int | None = None) -> None:
        spaces = {"a": OBS, "b": OBS}
        super().__init__(gym.spaces.Dict({k: ACT for k in spaces}), gym.spaces.Dict(spaces))
        self.n, self.steps, self.a_done_at = n, steps, a_done_at
        self.actions: dict[str, list[dict[str, int]]] = {}

    def play(self, k: int) -> None:
        eid = self.start_episode(f"team-{k}")
        acts = []
        for t in range(self.steps):
            obs = {"a": np.array([t, k], np.float32)}
            if t % 2:
                obs["b"] = np.array([-t, k], np.float32)
            if self.a_done_at is not None and t > self.a_done_at:
                del obs["a"]
            if not obs:
                break
            if t == 1:
                act = {aid: 2 for aid in obs}
                self.log_action(eid, obs, act)
            else:
                act = {aid: int(v) for aid, v in self.get_action(eid, obs).items()}
            acts.append(act)
            done = {"a": True} if t == self.a_done_at else None
            self.log_returns(eid, {aid: float(t) for aid in obs}, multiagent_done_dict=done)
        last = {aid: np.array([99, k], np.float32) for aid in ("a", "b")}
        if self.a_done_at is not None:
            del last["a"]
        self.end_episode(eid, last)
        self.actions[eid] = acts

    def run(self) -> None:
        threads = [threading.Thread(target=self.play, args=(k,)) for k in range(self.n)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()


def ma_runner(env: ExternalMultiAgentEnv) -> fr.MultiAgentEnvRunner:
    config = (
        fr.RunnerConfig()
        .environment(lambda ctx: env)
        .multi_agent(policies=["pa", "pb"], policy_mapping_fn=lambda aid, ep, **kw: f"p{aid}")
        .debugging(seed=0)
    )
    return fr.MultiAgentEnvRunner(config=config)


def test_multi_agent_episodes_are_recorded_per_agent() -> None:
    env = Team(n=5, steps=6)
    runner = ma_runner(env)
    episodes = runner.sample(num_episodes=5)
    assert sorted(e.id_ for e in episodes) == [f"team-{k}" for k in range(5)]
    for e in episodes:
        acts = env.actions[e.id_]
        a, b = e.agent_episodes["a"], e.agent_episodes["b"]
        assert list(a.get_actions()) == [x["a"] for x in acts]
        assert list(b.get_actions()) == [x["b"] for x in acts if "b" in x]
        np.testing.assert_allclose(a.get_rewards(), np.arange(6.0))
        np.testing.assert_allclose(b.get_rewards(), [1.0, 3.0, 5.0])
        assert a.module_id == "pa" and b.module_id == "pb"
        assert e.is_terminated
    runner.stop()


def test_multiagent_done_dict_ends_an_agent_early_where_rllib_fails() -> None:
    """RLlib 2.60's ExternalMultiAgentEnv.log_returns raises AttributeError on it."""
    from ray.rllib.env.external_multi_agent_env import ExternalMultiAgentEnv as RLlibMA

    theirs = RLlibMA(gym.spaces.Dict({"a": ACT}), gym.spaces.Dict({"a": OBS}))
    eid = theirs.start_episode()
    with pytest.raises(AttributeError):
        theirs.log_returns(eid, {"a": 1.0}, multiagent_done_dict={"a": True})

    env = Team(n=2, steps=6, a_done_at=2)
    runner = ma_runner(env)
    episodes = runner.sample(num_episodes=2)
    for e in episodes:
        a = e.agent_episodes["a"]
        assert a.is_terminated and len(a) == 3
        assert len(e.agent_episodes["b"]) == 2  # b acts at t = 1 and 3
    runner.stop()


def test_multi_agent_unknown_agents_are_refused() -> None:
    env = Team(n=0, steps=0)
    eid = env.start_episode()
    with pytest.raises(ValueError, match="unknown agent 'c'"):
        env.log_action(eid, {"c": np.zeros(2, np.float32)}, {"c": 0})
    with pytest.raises(ValueError, match="expected a dict agent id"):
        env.end_episode(eid, np.zeros(2, np.float32))


# -- properties ---------------------------------------------------------------------------

step_strategy = st.one_of(
    st.tuples(st.just("get"), st.one_of(st.none(), st.integers(-3, 3).map(float))),
    st.tuples(
        st.just("log"), st.integers(0, 2), st.one_of(st.none(), st.integers(-3, 3).map(float))
    ),
)


@settings(max_examples=15, deadline=None)
@given(
    scripts=st.lists(st.lists(step_strategy, min_size=1, max_size=8), min_size=1, max_size=6),
    slots=st.integers(1, 4),
    fragment=st.integers(1, 9),
)
def test_any_schedule_of_episodes_is_recorded_exactly(
    scripts: list[list[Step]], slots: int, fragment: int
) -> None:
    """Whatever the episodes, slots and chunk sizes: joined chunks equal what was played."""
    env = Scripted({f"ep-{k}": s for k, s in enumerate(scripts)}, max_concurrent=slots)
    runner = runner_for(env)
    parts: dict[str, list[Any]] = {}
    done: set[str] = set()
    for _ in range(200):
        for c in runner.sample(num_timesteps=fragment):
            parts.setdefault(c.id_, []).append(c)
            if c.is_terminated:
                done.add(c.id_)
        if len(done) == len(scripts):
            break
    assert done == set(env.scripts)
    for chunks in parts.values():
        whole = chunks[0]
        for c in chunks[1:]:
            whole = whole.concat_episode(c) or whole
        check_episode(env, whole)
    runner.stop()


def test_sampling_episodes_again_continues_the_running_episodes() -> None:
    """Each sample(num_episodes=1) returns the next whole episode; none is reset."""
    scripts = {f"ep-{k}": [("get", 1.0)] * 5 for k in range(4)}
    env = Scripted(scripts)
    runner = runner_for(env)
    seen = []
    for _ in range(4):
        (episode,) = runner.sample(num_episodes=1)
        check_episode(env, episode)
        seen.append(episode.id_)
    assert sorted(seen) == sorted(scripts)
    runner.stop()


def test_multi_agent_rewards_default_to_zero_for_observing_agents() -> None:
    class Quiet(ExternalMultiAgentEnv):
        def run(self) -> None:
            eid = self.start_episode("q")
            z = np.zeros(2, np.float32)
            self.get_action(eid, {"a": z, "b": z})
            self.get_action(eid, {"a": z})
            self.log_returns(eid, {"b": 2.0})
            self.end_episode(eid, {"a": z, "b": z})

    spaces = gym.spaces.Dict({"a": OBS, "b": OBS})
    env = Quiet(gym.spaces.Dict({"a": ACT, "b": ACT}), spaces)
    runner = ma_runner(env)
    (episode,) = runner.sample(num_episodes=1)
    np.testing.assert_allclose(episode.agent_episodes["a"].get_rewards(), [0.0, 0.0])
    np.testing.assert_allclose(episode.agent_episodes["b"].get_rewards(), [2.0])
    runner.stop()
