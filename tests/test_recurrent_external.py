"""Stateful (recurrent) modules through the backends that deliver steps out of order.

``ExternalEnv`` / ``ExternalMultiAgentEnv`` (simulator threads), the policy server (clients
in remote and local inference mode) and Ray-actor sub-envs hand the runner the steps of
many episodes in any order, reusing rows ("slots") across episodes. Whatever the order,
each episode's (and agent's) states must chain exactly: ``RunningSumModule``'s
``state_out["n"]`` at step ``t`` is ``t + 1`` and its ``"sum"`` adds the observations.

Logged actions (``log_action``): the module still runs on the step's observation, so the
state advances with its forward pass, as RLlib's runners advance it for off-policy actions;
a simulator that sends its own ``STATE_OUT`` (a local-inference client) has that one
recorded, and the next step starts from it.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import fastrollout as fr
from fastrollout.core import Columns
from fastrollout.env import ExternalEnv, ExternalMultiAgentEnv
from fastrollout.modules import RLModuleSpec
from test_recurrent_runners import RunningSumModule, check_chain

OBS = gym.spaces.Box(-1000.0, 1000.0, (2,), np.float32)
ACT = gym.spaces.Discrete(3)
SPEC = RLModuleSpec(module_class=RunningSumModule)
TIMEOUT = 30.0  # the longest any one wait here may take


def chain_agents(episodes: list[Any], seen: dict[Any, Any]) -> int:
    """Each agent's chunks chain (``check_chain``) from the agent's own start.

    An agent that acted but had not observed again when its episode was cut starts its
    next chunk with that step and without a state look-back (RLlib's multi-agent
    episodes cut alike); such chunks are checked from ``seen`` alone.

    Returns:
        The continuation chunks whose look-back state was checked.
    """
    looked_back = 0
    for e in episodes:
        for aid, ae in e.agent_episodes.items():
            key = (e.id_, aid)
            prev = {ae.id_: seen[key]} if key in seen else {}
            out = ae.get_extra_model_outputs(Columns.STATE_OUT) if len(ae) else None
            if ae.t_started and len(ae) and not _has_look_back(ae):
                # (The hanging step's state continues the agent's previous chunk.)
                start, total = seen[key]
                assert ae.t_started == start
                assert float(out["n"][0, 0]) == start + 1
                obs = np.asarray(ae.get_observations())[:-1].reshape(len(ae), -1)
                sums = total + np.cumsum(obs, 0)
                np.testing.assert_array_equal(
                    out["n"][:, 0], np.arange(start + 1, start + len(ae) + 1)
                )
                np.testing.assert_allclose(out["sum"], sums, rtol=1e-5)
                seen[key] = (start + len(ae), sums[-1])
                continue
            looked_back += bool(ae.t_started and len(ae))
            check_chain([ae], prev)
            if ae.id_ in prev:
                seen[key] = prev[ae.id_]
    return looked_back


def _has_look_back(ae: Any) -> bool:
    try:
        ae.get_extra_model_outputs(Columns.STATE_OUT, -1, neg_index_as_lookback=True)
    except IndexError:
        return False
    return True


# -- ExternalEnv in-process -------------------------------------------------------------


class Sims(ExternalEnv):
    """Episodes ``ep-k`` of ``lengths[k]`` steps, one thread each; ``log`` steps log."""

    def __init__(self, lengths: list[int], log: Any = None, max_concurrent: int = 3) -> None:
        super().__init__(ACT, OBS, max_concurrent=max_concurrent)
        self.lengths = lengths
        self.log = log or (lambda k, t: False)
        self.errors: list[BaseException] = []

    def play(self, k: int) -> None:
        try:
            eid = self.start_episode(f"ep-{k}")
            for t in range(self.lengths[k]):
                obs = np.array([t, k], np.float32)
                if self.log(k, t):
                    self.log_action(eid, obs, (k + t) % 3)
                else:
                    self.get_action(eid, obs)
                self.log_returns(eid, 1.0)
            self.end_episode(eid, np.array([self.lengths[k], k], np.float32))
        except BaseException as err:  # kept for the test to show
            self.errors.append(err)

    def run(self) -> None:
        threads = [threading.Thread(target=self.play, args=(k,)) for k in range(len(self.lengths))]
        for th in threads:
            th.start()
        for th in threads:
            th.join()


def sum_runner(env: Any, **env_runners: Any) -> fr.SingleAgentEnvRunner:
    config = (
        fr.RunnerConfig()
        .environment(lambda ctx: env)
        .env_runners(**env_runners)
        .rl_module(rl_module_spec=SPEC)
        .debugging(seed=0)
    )
    return fr.SingleAgentEnvRunner(config=config)


def sample_chained(runner: Any, total: int, fragment: int) -> dict[str, Any]:
    """Samples ``total`` steps in calls of ``fragment``, checking every chunk's chain."""
    seen: dict[str, Any] = {}
    got = 0
    for _ in range(10 * total + 10):
        chunks = runner.sample(num_timesteps=fragment)
        check_chain(chunks, seen)
        got += sum(len(c) for c in chunks)
        if got >= total:
            break
    assert got == total
    return seen


@settings(max_examples=10, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 9), min_size=1, max_size=8),
    slots=st.integers(1, 4),
    fragment=st.integers(1, 7),
    log_every=st.integers(0, 3),
)
def test_external_episodes_in_any_order_chain_per_episode(
    lengths: list[int], slots: int, fragment: int, log_every: int
) -> None:
    # Slots are reused by the next episodes; logged steps advance the state as others.
    env = Sims(lengths, lambda k, t: bool(log_every) and t % log_every == 1, slots)
    runner = sum_runner(env)
    try:
        seen = sample_chained(runner, sum(lengths), fragment)
        assert {k: n for k, (n, _) in seen.items()} == {f"ep-{k}": n for k, n in enumerate(lengths)}
        assert not env.errors, env.errors
    finally:
        runner.stop()


def test_logged_steps_advance_the_state_and_logp_is_the_learners() -> None:
    # Every step logged: the states count every step, and each logged action's logp is
    # the module's run over the whole episode from its initial state (the learner's view).
    lengths = [6, 4, 7]
    env = Sims(lengths, lambda k, t: True)
    runner = sum_runner(env)
    try:
        episodes = runner.sample(num_episodes=3)
        check_chain(episodes, {})
        module = runner.module
        for e in episodes:
            obs = torch.as_tensor(np.asarray(e.get_observations())[:-1])[None]
            state = {k: v[None] for k, v in module.get_initial_state().items()}
            with torch.no_grad():
                logits = module.forward_exploration({Columns.OBS: obs, Columns.STATE_IN: state})[
                    Columns.ACTION_DIST_INPUTS
                ][0]
            dist = module.get_exploration_action_dist_cls().from_logits(logits)
            actions = torch.as_tensor(np.asarray(e.get_actions()))
            k = int(e.id_.split("-")[1])
            assert actions.tolist() == [(k + t) % 3 for t in range(lengths[k])]
            np.testing.assert_allclose(
                e.get_extra_model_outputs(Columns.ACTION_LOGP), dist.logp(actions), atol=1e-5
            )
    finally:
        runner.stop()


def own_state(n: float, total: Any) -> dict[str, np.ndarray]:
    return {"n": np.array([n], np.float32), "sum": np.asarray(total, np.float32)}


def test_a_simulators_own_state_out_is_recorded_and_the_next_step_starts_from_it() -> None:
    class Own(ExternalEnv):
        def run(self) -> None:
            eid = self.start_episode("e")
            for t in range(5):
                obs = np.array([t, 1], np.float32)
                if t == 2:
                    mine = {Columns.STATE_OUT: own_state(100, [0.5, 0.5])}
                    self.log_action(eid, obs, 1, extra_model_outputs=mine)
                else:
                    self.get_action(eid, obs)
            self.end_episode(eid, np.array([5, 1], np.float32))

    runner = sum_runner(Own(ACT, OBS))
    try:
        (episode,) = runner.sample(num_episodes=1)
        out = episode.get_extra_model_outputs(Columns.STATE_OUT)
        np.testing.assert_array_equal(out["n"][:, 0], [1, 2, 100, 101, 102])
        np.testing.assert_allclose(
            out["sum"], [[0, 1], [1, 2], [0.5, 0.5], [3.5, 1.5], [7.5, 2.5]], rtol=1e-6
        )
    finally:
        runner.stop()


def test_a_simulators_state_out_of_the_wrong_shape_is_refused_by_episode_and_module() -> None:
    class Bad(ExternalEnv):
        def run(self) -> None:
            eid = self.start_episode("bad")
            mine = {Columns.STATE_OUT: {"n": np.zeros(1, np.float32)}}  # "sum" is missing
            self.log_action(eid, np.zeros(2, np.float32), 0, extra_model_outputs=mine)
            self.end_episode(eid, np.zeros(2, np.float32))

    runner = sum_runner(Bad(ACT, OBS))
    try:
        with pytest.raises(
            ValueError, match=r"episode bad: log_action.*module 'default_policy'.*'state_out'"
        ):
            runner.sample(num_episodes=1)
    finally:
        runner.stop()


# -- ExternalMultiAgentEnv ----------------------------------------------------------------


class Team(ExternalMultiAgentEnv):
    """Agent "a" observes every step, "b" every other one; step 1 (and 4) are logged."""

    def __init__(self, n: int, steps: int, own_b_state_at: int | None = None) -> None:
        spaces = gym.spaces.Dict({"a": OBS, "b": OBS})
        super().__init__(gym.spaces.Dict({"a": ACT, "b": ACT}), spaces, max_concurrent=2)
        self.n, self.steps, self.own_b_state_at = n, steps, own_b_state_at

    def play(self, k: int) -> None:
        eid = self.start_episode(f"team-{k}")
        for t in range(self.steps):
            obs = {"a": np.array([t, k], np.float32)}
            if t % 2:
                obs["b"] = np.array([-t, k], np.float32)
            if t == self.own_b_state_at:
                mine = {"b": {Columns.STATE_OUT: own_state(50, [0.0, 0.0])}}
                self.log_action(eid, obs, {aid: 1 for aid in obs}, extra_model_outputs=mine)
            elif t % 3 == 1:
                self.log_action(eid, obs, {aid: 2 for aid in obs})
            else:
                self.get_action(eid, obs)
            self.log_returns(eid, dict.fromkeys(obs, 1.0))
        self.end_episode(eid, {aid: np.array([99, k], np.float32) for aid in ("a", "b")})

    def run(self) -> None:
        threads = [threading.Thread(target=self.play, args=(k,)) for k in range(self.n)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()


def team_runner(env: Any) -> fr.MultiAgentEnvRunner:
    config = (
        fr.RunnerConfig()
        .environment(lambda ctx: env)
        .multi_agent(policies={"p"}, policy_mapping_fn=lambda aid, *a, **k: "p")
        .rl_module(rl_module_spec=SPEC)
        .debugging(seed=0)
    )
    return fr.MultiAgentEnvRunner(config=config)


def test_multi_agent_external_states_chain_per_episode_and_agent() -> None:
    env = Team(n=6, steps=7)
    runner = team_runner(env)
    seen: dict[Any, Any] = {}
    looked_back = 0
    try:
        for _ in range(100):
            looked_back += chain_agents(runner.sample(num_timesteps=3), seen)
            if len(seen) == 12 and all(
                n == (7 if a == "a" else 3) for (_, a), (n, _) in seen.items()
            ):
                break
        # Every agent of every episode, whole (b observes at t = 1, 3, 5).
        assert {k: n for k, (n, _) in seen.items()} == {
            (f"team-{k}", a): 7 if a == "a" else 3 for k in range(6) for a in "ab"
        }
        assert looked_back > 0
    finally:
        runner.stop()


def test_multi_agent_simulators_own_state_out_is_the_agents_next_state_in() -> None:
    env = Team(n=1, steps=7, own_b_state_at=3)
    runner = team_runner(env)
    try:
        (episode,) = runner.sample(num_episodes=1)
        b = episode.agent_episodes["b"].get_extra_model_outputs(Columns.STATE_OUT)
        np.testing.assert_array_equal(b["n"][:, 0], [1, 50, 51])
        np.testing.assert_allclose(b["sum"], [[-1, 0], [0, 0], [-5, 0]])
        a = episode.agent_episodes["a"].get_extra_model_outputs(Columns.STATE_OUT)
        np.testing.assert_array_equal(a["n"][:, 0], np.arange(1, 8))
    finally:
        runner.stop()


# -- Ray-actor sub-envs -----------------------------------------------------------------------


def slow_config(n: int, **runners: Any) -> fr.RunnerConfig:
    return (
        fr.RunnerConfig()
        .environment(
            fr.env.examples.SlowEnv,
            env_config={"step_ms": [0, 2, 5][:n], "episode_len": 7},
        )
        .env_runners(num_envs_per_env_runner=n, remote_worker_envs=True, **runners)
        .rl_module(rl_module_spec=SPEC)
        .debugging(seed=3)
        .resources(device="cpu")
    )


def test_remote_sub_envs_stepping_at_their_own_speed_chain(ray_local: Any) -> None:
    runner = fr.SingleAgentEnvRunner(config=slow_config(3, remote_env_batch_wait_ms=0))
    try:
        seen: dict[str, Any] = {}
        for _ in range(4):
            check_chain(runner.sample(num_timesteps=10), seen)
        # Episodes of 7 steps across calls of 10: continuations, and some ended.
        assert any(n == 7 for n, _ in seen.values())
    finally:
        runner.stop()


def test_remote_multi_agent_sub_envs_chain(ray_local: Any) -> None:
    from fastrollout.env import make_multi_agent

    config = (
        slow_config(2)
        .environment(
            make_multi_agent(lambda c: fr.env.examples.SlowEnv(c)),
            env_config={"num_agents": 2, "step_ms": [0, 3], "episode_len": 7},
        )
        .multi_agent(policies={"p"}, policy_mapping_fn=lambda aid, *a, **k: "p")
    )
    runner = fr.MultiAgentEnvRunner(config=config)
    try:
        seen: dict[Any, Any] = {}
        for _ in range(4):
            chain_agents(runner.sample(num_timesteps=10), seen)
        assert len(seen) >= 4
    finally:
        runner.stop()


# -- the policy server ----------------------------------------------------------------------


def server_runner(multi_agent: bool = False) -> Any:
    from fastrollout.external import PolicyServerEnv

    config = fr.RunnerConfig().rl_module(rl_module_spec=SPEC).debugging(seed=0)
    if multi_agent:
        spaces = gym.spaces.Dict({"a": OBS, "b": OBS}), gym.spaces.Dict({"a": ACT, "b": ACT})
        config = config.environment(
            lambda ctx: PolicyServerEnv(spaces[1], spaces[0], multi_agent=True)
        ).multi_agent(policies={"p"}, policy_mapping_fn=lambda aid, *a, **k: "p")
        return fr.MultiAgentEnvRunner(config=config)
    config = config.environment(lambda ctx: PolicyServerEnv(ACT, OBS))
    return fr.SingleAgentEnvRunner(config=config)


class Sampler:
    """Samples ``n`` episodes on a thread."""

    def __init__(self, runner: Any, n: int) -> None:
        self.runner, self.episodes, self.error = runner, [], None
        self.thread = threading.Thread(target=self._run, args=(n,), daemon=True)
        self.thread.start()

    def _run(self, n: int) -> None:
        try:
            self.episodes = self.runner.sample(num_episodes=n)
        except BaseException as err:  # shown by join
            self.error = err

    def join(self) -> list[Any]:
        self.thread.join(TIMEOUT)
        assert not self.thread.is_alive(), "the runner did not finish sampling"
        assert self.error is None, self.error
        return self.episodes


def wait_for_weights(env: Any) -> None:
    deadline = time.monotonic() + TIMEOUT
    while env.weights_snapshot() is None:
        assert time.monotonic() < deadline
        time.sleep(0.01)


def play_clients(
    port: int,
    mode: str,
    clients: int,
    episodes: int,
    *,
    multi_agent: bool = False,
    log: bool = True,
) -> list[BaseException]:
    """Clients on threads, each playing ``episodes`` episodes (every third step logged)."""
    from fastrollout.external import PolicyClient

    errors: list[BaseException] = []

    def client(k: int) -> None:
        try:
            with PolicyClient(f"127.0.0.1:{port}", mode, None, timeout_s=TIMEOUT) as c:
                for e in range(episodes):
                    eid = c.start_episode(f"c{k}-e{e}")
                    for t in range(2 + (k + e) % 5):
                        obs: Any = np.array([t, k], np.float32)
                        if multi_agent:
                            obs = {"a": obs, **({"b": -obs} if t % 2 else {})}
                        if log and t % 3 == 2:
                            c.log_action(eid, obs, {a: 0 for a in obs} if multi_agent else 0)
                        else:
                            c.get_action(eid, obs)
                        c.log_returns(eid, dict.fromkeys(obs, 1.0) if multi_agent else 1.0)
                    last: Any = np.array([99, k], np.float32)
                    c.end_episode(eid, {"a": last, "b": last} if multi_agent else last)
        except BaseException as err:  # shown by the test
            errors.append(err)

    threads = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(clients)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(TIMEOUT)
    assert not any(th.is_alive() for th in threads)
    return errors


@pytest.mark.parametrize("mode", ["remote", "local"])
def test_policy_server_clients_episodes_chain(mode: str) -> None:
    pytest.importorskip("msgpack")
    runner = server_runner()
    try:
        sampler = Sampler(runner, 12)
        wait_for_weights(runner.env)
        assert not play_clients(runner.env.port, mode, 4, 3)
        episodes = sampler.join()
        check_chain(episodes, {})
        assert sorted(len(e) for e in episodes) == sorted(
            2 + (k + e) % 5 for k in range(4) for e in range(3)
        )
    finally:
        runner.stop()


@pytest.mark.parametrize("mode", ["remote", "local"])
def test_policy_server_multi_agent_clients_episodes_chain(mode: str) -> None:
    pytest.importorskip("msgpack")
    runner = server_runner(multi_agent=True)
    try:
        sampler = Sampler(runner, 6)
        wait_for_weights(runner.env)
        assert not play_clients(runner.env.port, mode, 3, 2, multi_agent=True)
        seen: dict[Any, Any] = {}
        chain_agents(sampler.join(), seen)
        assert len(seen) == 12
    finally:
        runner.stop()


def test_the_server_records_the_local_clients_state_out_and_continues_from_it() -> None:
    # The client's module starts its episodes from another state than the server's
    # (n = 1000): the server's episodes hold the client's states, logged steps included,
    # in RLlib's layout (a dict of per-step arrays).
    pytest.importorskip("msgpack")
    from fastrollout.external import PolicyClient
    from fastrollout.runners.recurrent_states import RecurrentStates

    runner = server_runner()
    try:
        sampler = Sampler(runner, 2)
        wait_for_weights(runner.env)
        with PolicyClient(f"127.0.0.1:{runner.env.port}", "local", None, timeout_s=TIMEOUT) as c:
            module = c._modules["default_policy"]
            initial = module.get_initial_state()
            module.get_initial_state = lambda: {"n": initial["n"] + 1000, "sum": initial["sum"]}
            c._states = RecurrentStates(c._modules)
            eids = [c.start_episode(f"e{k}") for k in range(2)]
            for t in range(4):
                for k, eid in enumerate(eids):  # (the two episodes interleave)
                    obs = np.array([t, k], np.float32)
                    if t == 1:
                        c.log_action(eid, obs, 2)
                    else:
                        c.get_action(eid, obs)
            for k, eid in enumerate(eids):
                c.end_episode(eid, np.array([4, k], np.float32))
        for e in sampler.join():
            out = e.get_extra_model_outputs(Columns.STATE_OUT)
            assert set(out) == {"n", "sum"} and out["n"].shape == (4, 1)
            np.testing.assert_array_equal(out["n"][:, 0], [1001, 1002, 1003, 1004])
            k = int(e.id_[1:])
            np.testing.assert_allclose(out["sum"][:, 1], [k, 2 * k, 3 * k, 4 * k])
    finally:
        runner.stop()


def test_nested_state_extras_travel_in_log_experience_frames() -> None:
    # A recurrent state (a dict of arrays, or tuples, which msgpack sends as lists)
    # inside a log_action's "extra", as a local-inference client sends it.
    pytest.importorskip("msgpack")
    from fastrollout.external import protocol

    h, c = np.arange(4, dtype=np.float32), np.ones((2, 3), np.float64)
    call = {"type": "log_action", "extra": {Columns.STATE_OUT: {"h": h, "pair": (c, h)}}}
    back = protocol.unpack(protocol.pack({"type": "log_experience", "calls": [call]}))
    state = back["calls"][0]["extra"][Columns.STATE_OUT]
    assert state["h"].dtype == np.float32 and state["pair"][0].dtype == np.float64
    np.testing.assert_array_equal(state["h"], h)
    np.testing.assert_array_equal(state["pair"][0], c)
    assert isinstance(state["pair"], list)  # (the runner reads it as the state's tuple)
    from fastrollout.runners.recurrent_states import RecurrentStates

    class Pair:
        def is_stateful(self) -> bool:
            return True

        def get_initial_state(self) -> Any:
            return {"h": np.zeros(4, np.float32), "pair": (np.zeros((2, 3)), np.zeros(4))}

    states = RecurrentStates({"m": Pair()})
    kept = states.set_state("m", ("e", None), state)
    assert isinstance(kept["pair"], tuple)
    np.testing.assert_array_equal(states.state("m", ("e", None))["pair"][1], h)


def test_an_episode_begun_before_the_client_had_weights_keeps_the_servers_states() -> None:
    # Its first steps were random (no module yet): the client sends no state for it, so
    # the server's runner keeps the episode's own chain; episodes begun later send theirs.
    pytest.importorskip("msgpack")
    from fastrollout.external import PolicyClient

    runner = server_runner()
    try:
        with PolicyClient(f"127.0.0.1:{runner.env.port}", "local", None, timeout_s=TIMEOUT) as c:
            assert not c._modules
            early = c.start_episode("early")
            c.get_action(early, np.array([0, 1], np.float32))
            sampler = Sampler(runner, 2)
            wait_for_weights(runner.env)
            c.update_policy_weights()
            assert c._modules
            late = c.start_episode("late")
            for t in range(1, 4):
                c.get_action(early, np.array([t, 1], np.float32))
                c.get_action(late, np.array([t, 2], np.float32))
            assert c._calls[-1]["extra"][Columns.STATE_OUT]["n"].tolist() == [3.0]
            assert all(
                Columns.STATE_OUT not in call.get("extra", {})
                for call in c._calls
                if call.get("episode_id") == early
            )
            c.end_episode(early, np.array([4, 1], np.float32))
            c.end_episode(late, np.array([4, 2], np.float32))
        episodes = sampler.join()
        check_chain(episodes, {})
        assert sorted(len(e) for e in episodes) == [3, 4]
    finally:
        runner.stop()
