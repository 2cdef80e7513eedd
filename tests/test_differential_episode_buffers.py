"""Differential tests: ``SingleAgentEpisode``'s buffers as RLlib 2.60's code reads them.

RLlib's replay buffers and learner connectors index ``episode.observations[...]``,
``.actions[...]``, ``.rewards[...]``, read and set ``episode.extra_model_outputs[...]`` and
append to / pop from the buffers. fastrollout's episodes expose live views with RLlib's
``InfiniteLookbackBuffer`` behaviour; here the same episodes are built in RLlib and in
fastrollout and every view is compared with RLlib's buffer (len, look-back, finalized,
data, get_state, indexing with every index form, writes, append/pop), before and after
``to_numpy``. Then RLlib's own code runs on fastrollout's episodes: its
``EpisodeReplayBuffer`` and ``PrioritizedEpisodeReplayBuffer`` (add, sample with the same
seed as for RLlib's episodes: the same batches) and the learner postprocessing that appends
a time step and takes it away again.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

pytest.importorskip("ray.rllib")

from ray.rllib.env.single_agent_episode import SingleAgentEpisode as RLlibEpisode
from ray.rllib.env.utils.infinite_lookback_buffer import InfiniteLookbackBuffer

from _helpers import Raised, assert_same, assert_same_outcome, count, outcome, raised
from fastrollout import MultiAgentEpisode, SingleAgentEpisode, SpaceMismatchError
from fastrollout.episodes.buffers import ExtraModelOutputsView, LookbackBufferView

F = np.float32

# --------------------------------------------------------------------------------------
# The same episodes in RLlib and in fastrollout.
# --------------------------------------------------------------------------------------


def _obs(kind: str, t: int) -> Any:
    if kind == "int":
        return t
    if kind == "box":
        return np.array([t, -t, t / 2], F)
    return {"id": t % 5, "pos": np.full(2, t, F)}


OBS_SPACES = {
    "int": gym.spaces.Discrete(100),
    "box": gym.spaces.Box(-100, 100, (3,), F),
    "dict": gym.spaces.Dict(
        {"id": gym.spaces.Discrete(5), "pos": gym.spaces.Box(-100, 100, (2,), F)}
    ),
}


def record(cls: Any, kind: str, *, spaces: bool, steps: int, extras: bool) -> Any:
    """An episode of ``steps`` steps with ``kind`` observations and infos."""
    kwargs: dict[str, Any] = {"id_": f"{kind}-episode"}
    if spaces:
        kwargs.update(observation_space=OBS_SPACES[kind], action_space=gym.spaces.Discrete(4))
    ep = cls(**kwargs)
    ep.add_env_reset(_obs(kind, 0), {"t": 0})
    for t in range(1, steps + 1):
        ep.add_env_step(
            _obs(kind, t),
            t % 4,
            float(t) / 4,
            {"t": t} if t % 2 else None,
            extra_model_outputs=(
                {"logp": F(-t), "dist": np.array([t, t + 1], F)} if extras else None
            ),
        )
    return ep


CASES = {
    # name: (observations, spaces, steps, extras, cut's look-back (None: no cut), steps after)
    "ints": ("int", False, 5, True, None, 0),
    "ints-cut-2": ("int", False, 5, True, 2, 3),
    "box-space": ("box", True, 4, True, None, 0),
    "box-cut-0": ("box", True, 4, True, 0, 2),
    "dict": ("dict", False, 4, False, None, 0),
    "dict-space-cut-1": ("dict", True, 3, False, 1, 2),
    "reset-only": ("box", False, 0, False, None, 0),
}


def pair(case: str) -> tuple[Any, Any]:
    """RLlib's and fastrollout's episode for one of ``CASES``."""
    kind, spaces, steps, extras, lookback, more = CASES[case]
    eps = []
    for cls in (RLlibEpisode, SingleAgentEpisode):
        ep = record(cls, kind, spaces=spaces, steps=steps, extras=extras)
        if lookback is not None:
            ep = ep.cut(len_lookback_buffer=lookback)
            for t in range(steps + 1, steps + more + 1):
                ep.add_env_step(
                    _obs(kind, t),
                    t % 4,
                    float(t) / 4,
                    extra_model_outputs=(
                        {"logp": F(-t), "dist": np.array([t, t + 1], F)} if extras else None
                    ),
                )
        eps.append(ep)
    return eps[0], eps[1]


def buffers(ep: Any) -> dict[str, Any]:
    """Every buffer of an episode (RLlib's buffers or fastrollout's views) by name."""
    out = {name: getattr(ep, name) for name in ("observations", "infos", "actions", "rewards")}
    for key, buffer in ep.extra_model_outputs.items():
        out[f"extra_model_outputs[{key!r}]"] = buffer
    return out


def indices(n: int, lookback: int) -> list[Any]:
    """Index expressions for a buffer of ``n`` chunk items after ``lookback`` items."""
    total = n + lookback
    ints = list(range(-total - 2, n + 2))
    lists = [[0], [0, -1], [-1, 0], [n - 1, 0]] if n else [[-1]]
    slices = [
        slice(None),
        slice(1, None),
        slice(None, -1),
        slice(-2, None),
        slice(-total - 3, total + 3),
        slice(2, 1),
        slice(None, None, 2),
        slice(None, None, -1),
        slice(-1, None, -1),
        slice(1, 3),
        slice(-3, -1),
        slice(0, 0),
    ]
    return ints + lists + slices


def same_buffer(expected: Any, actual: Any, where: str) -> None:
    """``actual`` (a view, or another RLlib buffer) reads like ``expected`` (RLlib's buffer)
    in every way RLlib's code reads a buffer."""
    assert_same(len(expected), len(actual), f"{where}: len")
    assert_same(expected.lookback, actual.lookback, f"{where}: lookback")
    assert_same(expected.finalized, actual.finalized, f"{where}: finalized")
    assert_same(expected.len_incl_lookback(), actual.len_incl_lookback(), f"{where}: len incl")
    assert expected.space == actual.space, f"{where}: space {expected.space} != {actual.space}"
    assert_same(expected.data, actual.data, f"{where}: data")
    assert_same(expected.get_state(), actual.get_state(), f"{where}: get_state()")
    assert_same(list(expected), list(actual), f"{where}: iteration")
    for index in indices(len(expected), expected.lookback):
        count("episode buffer views: index expressions compared")
        ref, sub = outcome(lambda i=index: expected[i]), outcome(lambda i=index: actual[i])
        if isinstance(actual, LookbackBufferView) and raised(ref, AssertionError):
            # RLlib's _interpret_slice trips its own assert on some slices of short or
            # empty buffers; fastrollout answers (test_reversed_slice_on_empty_buffer).
            assert isinstance(index, slice) and not isinstance(sub, Raised), (where, index)
            count("episode buffer views: RLlib's slice assert (known bug)")
            continue
        assert_same_outcome(ref, sub, f"{where}[{index!r}]")
    # The view is a buffer RLlib's own code can rebuild from its state.
    assert_same(
        InfiniteLookbackBuffer.from_state(expected.get_state()).data,
        InfiniteLookbackBuffer.from_state(actual.get_state()).data,
        f"{where}: from_state",
    )


def same_buffers(rllib: Any, ours: Any) -> None:
    ref, sub = buffers(rllib), buffers(ours)
    assert list(ref) == list(sub)
    if isinstance(ours, SingleAgentEpisode):
        assert all(isinstance(b, LookbackBufferView) for b in sub.values())
    assert list(rllib.extra_model_outputs.keys()) == list(ours.extra_model_outputs.keys())
    for name in ref:
        same_buffer(ref[name], sub[name], name)


# --------------------------------------------------------------------------------------
# The views against RLlib's buffers.
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("numpy", [False, True], ids=["lists", "numpy"])
@pytest.mark.parametrize("case", list(CASES))
def test_views_read_like_rllibs_buffers(case: str, numpy: bool) -> None:
    rllib, ours = pair(case)
    if numpy:
        rllib.to_numpy()
        ours.to_numpy()
    same_buffers(rllib, ours)


@pytest.mark.parametrize("numpy", [False, True], ids=["lists", "numpy"])
@pytest.mark.parametrize("case", list(CASES))
def test_states_load_in_rllib_and_back(case: str, numpy: bool) -> None:
    """get_state is RLlib's form: RLlib's from_state (which its replay buffers' set_state
    calls) rebuilds fastrollout's episodes, and fastrollout's rebuilds RLlib's."""
    rllib, ours = pair(case)
    if numpy:
        rllib.to_numpy()
        ours.to_numpy()
    same_buffers(rllib, RLlibEpisode.from_state(ours.get_state()))
    state = rllib.get_state()
    same_buffers(RLlibEpisode.from_state(state), SingleAgentEpisode.from_state(state))


@pytest.mark.parametrize("numpy", [False, True], ids=["lists", "numpy"])
def test_view_writes_are_rllibs(numpy: bool) -> None:
    rllib, ours = pair("ints-cut-2")
    if numpy:
        rllib.to_numpy()
        ours.to_numpy()
    for ep in (rllib, ours):
        ep.actions[0] = 3
        ep.actions[-1] = 2
        ep.rewards[[0, 1]] = [9.0, 8.0]
        ep.observations.set(77, at_indices=-1, neg_index_as_lookback=True)
        ep.extra_model_outputs["logp"][1] = F(0.5)
        ep.extra_model_outputs["logp"].set(
            np.array([F(1), F(2)]) if numpy else [F(1), F(2)], at_indices=slice(-2, None)
        )
    same_buffers(rllib, ours)
    assert_same(rllib.get_actions(), ours.get_actions())
    assert_same(rllib.get_observations(-1, neg_index_as_lookback=True), 77)


def test_views_are_live_and_fail_clearly() -> None:
    ep = record(SingleAgentEpisode, "int", spaces=False, steps=2, extras=True)
    actions, logp = ep.actions, ep.extra_model_outputs["logp"]
    ep.add_env_step(3, 1, 0.75, extra_model_outputs={"logp": F(-3), "dist": np.zeros(2, F)})
    assert len(actions) == 3 and actions[-1] == 1 and logp[-1] == F(-3)
    data = actions.data
    data.append(99)  # a copy (RLlib hands out its stored list)
    assert ep.get_actions() == [1, 2, 1]
    with pytest.raises(IndexError, match="out of range"):
        actions[3]
    before = ep.get_actions()
    with pytest.raises(IndexError):
        actions[[0, 1]] = [1]
    assert ep.get_actions() == before
    del ep.extra_model_outputs["logp"]
    with pytest.raises(KeyError):
        logp[0]
    with pytest.raises(KeyError):
        ep.extra_model_outputs["logp"]
    assert "logp" not in ep.extra_model_outputs and list(ep.extra_model_outputs) == ["dist"]
    with pytest.raises(IndexError, match="pop index 9"):
        ep.actions.pop(9)
    # extend is all or nothing: an item that does not fit the space takes the others back.
    spaced = record(SingleAgentEpisode, "box", spaces=True, steps=1, extras=False)
    good = np.zeros(3, F)
    with pytest.raises(SpaceMismatchError, match="observation"):
        spaced.observations.extend([good, good, np.zeros(2, F)])
    assert len(spaced.observations) == 2
    spaced.observations.extend([good])
    with pytest.raises(SpaceMismatchError):
        spaced.observations.append("text")
    assert len(spaced.observations) == 3
    assert isinstance(ep.extra_model_outputs, ExtraModelOutputsView)
    assert repr(ep.actions) == "LookbackBufferView([] <- lookback(0) | [1, 2, 1])"
    assert ep.actions == InfiniteLookbackBuffer([1, 2, 1]) and ep.actions != ep.rewards
    with pytest.raises(TypeError, match="unhashable"):
        hash(ep.actions)


@pytest.mark.parametrize("numpy", [False, True], ids=["lists", "numpy"])
def test_extra_model_outputs_mapping_is_rllibs_dict_of_buffers(numpy: bool) -> None:
    rllib, ours = pair("ints-cut-2")
    if numpy:
        rllib.to_numpy()
        ours.to_numpy()
    n = len(ours)
    for ep in (rllib, ours):
        assert "logp" in ep.extra_model_outputs and "nope" not in ep.extra_model_outputs
        # As RLlib's replay buffer sets them, and as a plain array or list.
        ep.extra_model_outputs["n_step"] = InfiniteLookbackBuffer(np.full(n + 1, 3), lookback=1)
        ep.extra_model_outputs["weights"] = InfiniteLookbackBuffer(np.ones(n))
        ep.extra_model_outputs["logp"] = InfiniteLookbackBuffer([F(i) for i in range(n)])
    assert_same(list(rllib.extra_model_outputs.keys()), list(ours.extra_model_outputs.keys()))
    assert [k for k, _ in ours.extra_model_outputs.items()] == list(ours.extra_model_outputs)
    same_buffers(rllib, ours)
    for key in rllib.extra_model_outputs:
        assert_same(rllib.get_extra_model_outputs(key), ours.get_extra_model_outputs(key), key)
    # A copy of another episode's view, and a view set to itself.
    other = record(SingleAgentEpisode, "int", spaces=False, steps=n, extras=True)
    ours.extra_model_outputs["copied"] = other.extra_model_outputs["logp"]
    ours.extra_model_outputs["copied"] = ours.extra_model_outputs["copied"]
    assert_same(ours.get_extra_model_outputs("copied"), other.get_extra_model_outputs("logp"))
    ours.validate()
    # A buffer whose items do not match the steps changes nothing.
    state = ours.get_state()
    with pytest.raises(AssertionError, match=r"\[.bad.\]: 2 items after a look-back of 0"):
        ours.extra_model_outputs["bad"] = [1, 2]
    with pytest.raises(AssertionError):
        ours.extra_model_outputs["logp"] = InfiniteLookbackBuffer(np.ones(n + 2), lookback=1)
    with pytest.raises(TypeError, match="keys are strings"):
        ours.extra_model_outputs[3] = np.ones(n)  # type: ignore[index]
    assert_same(state, ours.get_state())


@pytest.mark.parametrize("numpy", [False, True], ids=["lists", "numpy"])
def test_agent_episodes_of_a_multi_agent_episode_have_the_views(numpy: bool) -> None:
    from ray.rllib.env.multi_agent_episode import MultiAgentEpisode as RLlibMAEpisode

    eps = []
    for cls in (RLlibMAEpisode, MultiAgentEpisode):
        ep = cls(id_="ma")
        ep.add_env_reset(observations={"a": 0, "b": 10})
        for t in (1, 2, 3):
            ep.add_env_step(
                {"a": t, "b": 10 + t},
                {"a": t % 2, "b": np.array([t, -t], F)},
                {"a": 1.0, "b": 2.0},
                extra_model_outputs={"a": {"logp": F(-t)}, "b": {"logp": F(-10 * t)}},
            )
        ep = ep.cut(2)
        ep.add_env_step(
            {"a": 4},
            {"a": 0, "b": np.zeros(2, F)},
            {"a": 1.0, "b": 2.0},
            extra_model_outputs={"a": {"logp": F(-4)}, "b": {"logp": F(-40)}},
        )
        if numpy:
            ep.to_numpy()
        eps.append(ep)
    rllib, ours = eps
    for aid in ("a", "b"):
        same_buffers(rllib.agent_episodes[aid], ours.agent_episodes[aid])


# --------------------------------------------------------------------------------------
# RLlib's learner postprocessing on fastrollout's episodes.
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("numpy", [False, True], ids=["lists", "numpy"])
@pytest.mark.parametrize("case", ["ints", "box-space", "ints-cut-2", "dict"])
def test_rllib_adds_and_removes_a_time_step(case: str, numpy: bool) -> None:
    from ray.rllib.utils.postprocessing.episodes import (
        add_one_ts_to_episodes_and_truncate,
        remove_last_ts_from_episodes_and_restore_truncateds,
    )

    rllib, ours = pair(case)
    if numpy:
        rllib.to_numpy()
        ours.to_numpy()
    before = ours.get_state()
    truncateds = [add_one_ts_to_episodes_and_truncate([ep]) for ep in (rllib, ours)]
    assert truncateds[0] == truncateds[1]
    assert (rllib.t, rllib.is_truncated) == (ours.t, ours.is_truncated)
    same_buffers(rllib, ours)
    for ep, orig in zip((rllib, ours), truncateds, strict=True):
        remove_last_ts_from_episodes_and_restore_truncateds([ep], orig)
    same_buffers(rllib, ours)
    after = ours.get_state()
    for state in (before, after):
        state.pop("_start_time"), state.pop("_last_step_time")
    assert_same(before, after)


# --------------------------------------------------------------------------------------
# RLlib's replay buffers on fastrollout's episodes.
# --------------------------------------------------------------------------------------


def rollouts(cls: Any, *, seed: int, chunk: int, spaces: bool) -> list[Any]:
    """CartPole chunks as a runner hands them out: episodes cut every ``chunk`` steps, each
    chunk numpy'd, with RLlib's action_logp and vf_preds extra outputs."""
    env = gym.make("CartPole-v1")
    rng = np.random.default_rng(seed)
    kwargs = (
        {"observation_space": env.observation_space, "action_space": env.action_space}
        if spaces
        else {}
    )
    out = []
    for i in range(4):
        ep = cls(id_=f"episode-{seed}-{i}", **kwargs)
        obs, info = env.reset(seed=seed + i)
        ep.add_env_reset(obs, info)
        for t in range(60):
            action = int(rng.integers(2))
            obs, reward, terminated, truncated, info = env.step(action)
            ep.add_env_step(
                obs,
                action,
                float(reward),
                info,
                terminated=terminated,
                truncated=truncated or t == 59,
                extra_model_outputs={"action_logp": F(-0.69 - t / 100), "vf_preds": F(t)},
            )
            if ep.is_done:
                break
            if len(ep) == chunk:
                successor = ep.cut()
                out.append(ep.to_numpy())
                ep = successor
        out.append(ep.to_numpy())
    return out


def same_result(expected: Any, actual: Any, where: str) -> None:
    """Replay buffer results: batches (dicts of arrays) or lists of sampled episodes."""
    if isinstance(expected, list):
        assert_same(len(expected), len(actual), f"{where}: number of episodes")
        for i, (a, b) in enumerate(zip(expected, actual, strict=True)):
            same_sampled_episode(a, b, f"{where}[{i}]")
    else:
        assert_same(expected, actual, where)


def same_sampled_episode(expected: Any, actual: Any, where: str) -> None:
    assert_same(len(expected), len(actual), f"{where}: len")
    # (The prioritized buffer's samples are new episodes with random ids.)
    same_id = expected.id_.startswith("episode-") or actual.id_.startswith("episode-")
    for what in ("id_", "t_started", "t", "is_terminated", "is_truncated", "is_numpy"):
        if what != "id_" or same_id:
            assert_same(getattr(expected, what), getattr(actual, what), f"{where}: {what}")
    keys = list(expected.extra_model_outputs.keys())
    assert_same(keys, list(actual.extra_model_outputs.keys()), f"{where}: extra keys")
    for name in ("observations", "actions", "rewards", "infos"):
        get = f"get_{name}"
        assert_same(getattr(expected, get)(), getattr(actual, get)(), f"{where}: {get}()")
        assert_same(
            getattr(expected, get)(slice(-1, 0), neg_index_as_lookback=True),
            getattr(actual, get)(slice(-1, 0), neg_index_as_lookback=True),
            f"{where}: {get} look-back",
        )
    for key in keys:
        assert_same(
            expected.get_extra_model_outputs(key),
            actual.get_extra_model_outputs(key),
            f"{where}: extra {key}",
        )


def run_buffer(
    make: Callable[[], Any], calls: list[tuple[str, dict]], spaces: bool, ours: type
) -> None:
    """Feeds RLlib's chunks and ``ours``' (a fastrollout episode class) to two buffers made
    by ``make`` and compares what each call of ``calls`` (``sample``,
    ``update_priorities``...) returns, then the buffers restored from their states."""
    results = []
    for cls in (RLlibEpisode, ours):
        buffer = make()
        buffer.rng = np.random.default_rng(7)
        chunks = rollouts(cls, seed=3, chunk=7, spaces=spaces)
        outs = [buffer.add(chunks[: len(chunks) // 2])]
        outs.append(buffer.add(chunks[len(chunks) // 2 :]))
        outs.append(buffer.get_num_timesteps())
        outs.append(buffer.get_num_episodes())
        for method, kwargs in calls:
            outs.append(getattr(buffer, method)(**copy.deepcopy(kwargs)))
        results.append((outs, buffer))
    (ref, ref_buffer), (sub, sub_buffer) = results
    for i, (a, b) in enumerate(zip(ref, sub, strict=True)):
        count("replay buffer results compared")
        same_result(a, b, f"result {i}")
    for i, (a, b) in enumerate(zip(ref_buffer.episodes, sub_buffer.episodes, strict=True)):
        assert type(b) is ours
        same_sampled_episode(a, b, f"stored episode {i}")
    # A checkpoint: set_state rebuilds the episodes with RLlib's SingleAgentEpisode class
    # (from_state of fastrollout's get_state); they read as before, and sample as before.
    restored = []
    for buffer in (ref_buffer, sub_buffer):
        copied = make()
        copied.set_state(buffer.get_state())
        copied.rng = np.random.default_rng(11)
        restored.append((copied, copied.sample(**copy.deepcopy(calls[0][1]))))
    (ref_copy, ref_out), (sub_copy, sub_out) = restored
    assert all(type(e) is RLlibEpisode for e in sub_copy.episodes)
    for i, (a, b) in enumerate(zip(ref_copy.episodes, sub_copy.episodes, strict=True)):
        same_sampled_episode(a, b, f"restored episode {i}")
    same_result(ref_out, sub_out, "sample after set_state")


def _episode_classes() -> list[Any]:
    """fastrollout's episode class, and the runners' RLlib-flavoured one (which RLlib's
    isinstance checks take for its own)."""
    from fastrollout.runners._rllib import RLlibSingleAgentEpisode

    return [SingleAgentEpisode, RLlibSingleAgentEpisode]


EPISODE_CLASSES = pytest.mark.parametrize(
    "ours", _episode_classes(), ids=["fastrollout", "rllib-flavoured"]
)


@EPISODE_CLASSES
@pytest.mark.parametrize("spaces", [False, True], ids=["no-spaces", "spaces"])
def test_episode_replay_buffer(spaces: bool, ours: type) -> None:
    from ray.rllib.utils.replay_buffers.episode_replay_buffer import EpisodeReplayBuffer

    run_buffer(
        lambda: EpisodeReplayBuffer(capacity=60, batch_size_B=4, batch_length_T=5),
        [
            ("sample", {}),
            ("sample", {"batch_size_B": 3, "batch_length_T": 12}),
            (
                "sample",
                {
                    "num_items": 6,
                    "n_step": 3,
                    "sample_episodes": True,
                    "include_infos": True,
                    "include_extra_model_outputs": True,
                },
            ),
            ("sample", {"num_items": 5, "n_step": (1, 4), "sample_episodes": True}),
            # Sequences: slices of the stored (fastrollout) episodes, with n_step and
            # weights set into their extra_model_outputs as RLlib's buffers.
            (
                "sample",
                {
                    "batch_size_B": 6,
                    "batch_length_T": 3,
                    "n_step": 1,
                    "sample_episodes": True,
                    "lookback": 1,
                },
            ),
        ],
        spaces,
        ours,
    )


@EPISODE_CLASSES
@pytest.mark.parametrize("spaces", [False, True], ids=["no-spaces", "spaces"])
def test_prioritized_episode_replay_buffer(spaces: bool, ours: type) -> None:
    from ray.rllib.utils.replay_buffers.prioritized_episode_buffer import (
        PrioritizedEpisodeReplayBuffer,
    )

    sample = {
        "num_items": 8,
        "n_step": 2,
        "beta": 0.4,
        "include_infos": True,
        "include_extra_model_outputs": True,
        "to_numpy": True,
    }
    run_buffer(
        lambda: PrioritizedEpisodeReplayBuffer(capacity=60, batch_size_B=8, alpha=0.6),
        [
            ("sample", sample),
            ("update_priorities", {"priorities": np.linspace(0.1, 2.0, 8)}),
            ("sample", sample),
            ("sample", {**sample, "n_step": (1, 3)}),
        ],
        spaces,
        ours,
    )
