"""Differential test: ``fastrollout.SingleAgentEpisode`` against RLlib 2.60's.

Each seed drives one random trajectory: the same calls go to a reference episode (RLlib)
and a subject episode (fastrollout, or RLlib again with ``FR_DIFF_SUBJECT=rllib``, which
validates this harness), and everything observable is compared after every call: lengths
and counters, flags, returns, and every getter with every index form and flag. Episodes
derived from the pair (``cut`` successors, ``slice``/``[a:b]`` chunks, ``from_state`` and
pickle round trips) become pairs of their own and are checked the same way.

Where RLlib raises, the subject must raise the same exception type (a subclass counts),
unless the call is listed in ``KNOWN_RLLIB_BUGS``. Inputs are deep-copied per side, so
neither episode can see the other's data.

A failure names its seeds; replay one with ``Run(seed).run()`` (it raises ``Divergence``
with the last operations that led there).
"""

from __future__ import annotations

import copy
import pickle
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, NoReturn

import gymnasium as gym
import numpy as np
import pytest

from _helpers import (
    Divergence,
    Raised,
    RLlibEpisode,
    assert_same,
    count,
    outcome,
    raised,
    run_differential_batch,
)
from _helpers import Episode as SubjectEpisode

N_BATCHES = 40
SEEDS_PER_BATCH = 25  # N_BATCHES * SEEDS_PER_BATCH trajectories in all.


@dataclass(frozen=True)
class Call:
    """One compared call, as a ``KnownRLlibBug`` sees it."""

    episode: str  # which episode of the trajectory, e.g. "ep", "ep.cut(2)", "ep[slice(1, 3, None)]"
    label: str  # e.g. "get_observations(-3, neg_index_as_lookback=True)"
    method: str  # e.g. "get_observations"; the label for calls that are not getters
    args: tuple
    kwargs: dict
    reference: Any  # RLlib's episode (after the call)
    ref_out: Any  # what RLlib returned, or Raised(type)
    sub_out: Any  # what the subject returned, or Raised(type)


@dataclass(frozen=True)
class KnownRLlibBug:
    """A documented, deliberate deviation of fastrollout from RLlib."""

    op: str | tuple[str, ...]  # method name(s) (or label prefixes) the entry is about
    why: str  # what RLlib gets wrong, and where fastrollout documents and tests its answer
    applies: Callable[[Call], bool]  # True where the difference is this bug


# Calls in which the subject may differ from RLlib because RLlib is wrong there. An entry
# only excuses what its `applies` accepts (look at `call.ref_out` / `call.sub_out` to say
# what each side must do); the subject's answer there is pinned down by the unit tests.
# Example (not enabled):
#   KnownRLlibBug(
#       op="get_observations",
#       why="numpy'ized RLlib wraps a neg_index_as_lookback index past the lookback "
#       "around to the end; fastrollout raises IndexError (test_...)",
#       applies=lambda c: c.reference.is_numpy and c.sub_out == Raised(IndexError),
#   ),
def _nested_lookback_capped_by_keys(c: Call) -> bool:
    """RLlib sizes a numpy'd Dict/Tuple buffer's look-back by its number of keys."""
    r = c.reference
    buffers = [r.observations, r.actions, r.rewards, r.infos, *r.extra_model_outputs.values()]
    obs = r.observations
    capped = (
        obs.finalized
        and isinstance(obs.data, dict | tuple)
        and 0 < obs.lookback == len(obs.data) < obs.len_incl_lookback()
    )
    return capped or any(b.lookback > b.len_incl_lookback() for b in buffers)


def _empty_batch(out: Any) -> bool:
    leaves = out.values() if isinstance(out, dict) else [out]
    return all(isinstance(x, np.ndarray) and len(x) == 0 for x in leaves)


# Every call that reads data, for bugs that corrupt a buffer and show up in any read.
_ANY_READ = ("get_", "is_", "env_steps", "agent_steps", "validate", "cut", "slice", "__getitem__")

# Where fastrollout deliberately differs from RLlib 2.60 because RLlib is wrong there.
# Each entry's behaviour on the fastrollout side is pinned by a test in
# tests/test_rllib_deviations.py (named in `why`).
KNOWN_RLLIB_BUGS: list[KnownRLlibBug] = [
    KnownRLlibBug(
        op="get_",
        why="numpy'd RLlib wraps an int index with neg_index_as_lookback=True that reaches "
        "before the look-back around to the end of the data (numpy negative indexing); "
        "fastrollout raises IndexError as RLlib does before to_numpy "
        "(test_lookback_index_past_the_lookback_raises_after_to_numpy)",
        applies=lambda c: (
            raised(c.sub_out, IndexError)
            and c.kwargs.get("neg_index_as_lookback")
            and c.kwargs.get("fill") is None
            and c.reference.observations.finalized
        ),
    ),
    KnownRLlibBug(
        op=("get_", "slice", "__getitem__"),
        why="RLlib's _interpret_slice trips its own assert (start becomes -1) for reversed "
        "or out-of-range slices on an empty buffer; fastrollout returns the fill items / "
        "nothing (test_reversed_slice_on_empty_buffer)",
        applies=lambda c: (
            raised(c.ref_out, AssertionError)
            and (
                any(isinstance(a, slice) for a in c.args)
                or c.method.startswith(("slice", "__getitem__"))
            )
            and (not isinstance(c.sub_out, Raised) or raised(c.sub_out, ValueError))
        ),
    ),
    KnownRLlibBug(
        op="get_",
        why="without a space, numpy'd RLlib concatenates np.array([fill] * n) with array "
        "items and fails on the shape; fastrollout broadcasts the fill to the item shape "
        "(test_fill_without_space_broadcasts_to_item_shape)",
        applies=lambda c: (
            raised(c.ref_out, ValueError)
            and c.kwargs.get("fill") is not None
            and not isinstance(c.sub_out, Raised)
        ),
    ),
    KnownRLlibBug(
        op="get_",
        why="without a space, numpy'd RLlib fills nested (dict) items into an object array "
        "of mixed fill values and dicts; fastrollout fills every leaf "
        "(test_fill_without_space_keeps_nesting)",
        applies=lambda c: (
            c.kwargs.get("fill") is not None
            and isinstance(c.ref_out, np.ndarray)
            and c.ref_out.dtype == object
            and isinstance(c.sub_out, dict)
        ),
    ),
    KnownRLlibBug(
        op="get_",
        why="RLlib's one_hot takes np.max of the data and fails on an empty numpy batch; "
        "fastrollout returns an empty one-hot batch (test_one_hot_of_empty_batch)",
        applies=lambda c: (
            c.kwargs.get("one_hot_discrete")
            and raised(c.ref_out, ValueError)
            and _empty_batch(c.sub_out)
        ),
    ),
    KnownRLlibBug(
        op="get_infos",
        why="RLlib's constructor replaces an infos buffer of length 0 (`infos or [...]`), "
        "so slices with an empty chunk lose their infos look-back "
        "(test_empty_slice_keeps_infos_lookback)",
        applies=lambda c: (
            len(c.reference.infos.data) == 0 and c.reference.observations.lookback > 0
        ),
    ),
    KnownRLlibBug(
        op=_ANY_READ,
        why="RLlib builds numpy'd Dict/Tuple buffers with look-back min(lookback, "
        "len(data)), where len(data) is the number of keys: cut/slice then fail validate "
        "or get a wrong look-back (test_cut_and_slice_of_numpy_dict_observations)",
        applies=_nested_lookback_capped_by_keys,
    ),
    KnownRLlibBug(
        op=("cut", "slice", "__getitem__"),
        why="same look-back-by-number-of-keys bug: RLlib's cut/slice of numpy'd Dict "
        "observations fails its own validate (test_cut_and_slice_of_numpy_dict_observations)",
        applies=lambda c: (
            raised(c.ref_out, AssertionError)
            and not isinstance(c.sub_out, Raised)
            and c.reference.observations.finalized
            and isinstance(c.reference.observations.data, dict | tuple)
        ),
    ),
    KnownRLlibBug(
        op="from_state",
        why="RLlib's get_state stores an extras buffer that holds only look-back as the "
        "buffer object itself, and from_state then fails; fastrollout round-trips "
        "(test_state_round_trip_of_lookback_only_chunk)",
        applies=lambda c: (
            isinstance(c.ref_out, Raised)
            and not isinstance(c.sub_out, Raised)
            and len(c.reference) == 0
        ),
    ),
    KnownRLlibBug(
        op="get_extra_model_outputs",
        why="after RLlib's from_state, extra_model_outputs is a defaultdict, so an unknown "
        "key reads as empty data; fastrollout raises KeyError as before the round trip "
        "(test_unknown_extra_key_after_round_trip)",
        applies=lambda c: (
            type(c.reference.extra_model_outputs).__name__ == "defaultdict"
            and raised(c.sub_out, KeyError)
        ),
    ),
    KnownRLlibBug(
        op=("agent_id", "module_id", "multi_agent_episode_id"),
        why="RLlib's cut() and slice() drop agent_id, module_id and multi_agent_episode_id; "
        "fastrollout's successors keep them (test_cut_and_slice_keep_agent_and_module_ids)",
        applies=lambda c: c.ref_out is None and c.sub_out is not None,
    ),
    KnownRLlibBug(
        op="concat_episode",
        why="RLlib's concat_episode asserts that each extra model output of the second "
        "chunk is in the first; fastrollout takes one that starts in the second chunk "
        "when the first has no step yet "
        "(test_concat_episode_takes_a_key_first_used_in_the_second_chunk)",
        applies=lambda c: (
            raised(c.ref_out, AssertionError)
            and c.sub_out is None
            # RLlib fails at the end, with the other fields concatenated: the first chunk
            # had no step if the result is as long as the second chunk.
            and len(c.reference) == len(c.args[0])
            and bool(set(c.args[0].extra_model_outputs) - set(c.reference.extra_model_outputs))
        ),
    ),
    KnownRLlibBug(
        op="set_",
        why="numpy'd RLlib rejects a Python list as new_data (tree structure mismatch with "
        "the arrays); fastrollout takes lists of items in both modes "
        "(test_set_after_to_numpy_takes_a_list)",
        applies=lambda c: (
            c.reference.is_numpy and raised(c.ref_out, ValueError) and c.sub_out is None
        ),
    ),
    KnownRLlibBug(
        op="set_observations",
        why="numpy'd RLlib checks each leaf of a Dict/Tuple observation against the whole "
        "space, so every set fails; fastrollout checks leaves against their own spaces "
        "(test_set_nested_observations_after_to_numpy)",
        applies=lambda c: (
            raised(c.ref_out, AssertionError, IndexError)
            and c.reference.observations.finalized
            and isinstance(c.reference.observation_space, gym.spaces.Dict | gym.spaces.Tuple)
        ),
    ),
]


def _concat(ep: Any, other: Any, side: int) -> None:
    """``ep.concat_episode(other)``; on RLlib's side (0) with two fixes of RLlib 2.60's
    concat_episode that change the episode rather than one call's answer (fastrollout's
    deliberate differences, pinned in test_rllib_deviations.py):

    - a chunk numpy'd before its first step, followed by a numpy'd chunk, reads as
      batches; RLlib leaves its actions, rewards and extra outputs lists
      (test_concat_of_numpy_chunks_reads_as_the_numpy_episode);
    - a chunk that ended terminated and truncated at once keeps both flags; RLlib keeps
      only the termination (test_concat_episode_keeps_both_done_flags).
    """
    numpy_without_steps = side == 0 and (
        len(ep) == 0 and ep.observations.finalized and other.observations.finalized
    )
    ep.concat_episode(other)
    if side != 0:
        return
    if numpy_without_steps and len(ep) > 0:
        count("differential concat fixes on RLlib's side: concat-numpy")
        for buffer in (ep.actions, ep.rewards, *ep.extra_model_outputs.values()):
            buffer.finalize()
    if other.is_terminated and other.is_truncated:
        count("differential concat fixes on RLlib's side: concat-both-flags")
        ep.is_truncated = True


class PairRetired(Exception):
    """Stands for the outcome of a call on a pair that is no longer compared."""


_RETIRED = Raised(PairRetired)


# --------------------------------------------------------------------------------------
# Random data.
# --------------------------------------------------------------------------------------

OBS_KINDS = ("discrete", "box3", "box22", "dict")
ACT_KINDS = ("discrete", "box")
EXTRA_KEYS = ("logp", "dist")


def make_obs_space(kind: str) -> gym.Space:
    if kind == "discrete":
        return gym.spaces.Discrete(5)
    if kind == "box3":
        return gym.spaces.Box(-10.0, 10.0, (3,), np.float32)
    if kind == "box22":
        return gym.spaces.Box(-10.0, 10.0, (2, 2), np.float32)
    return gym.spaces.Dict(
        {
            "pos": gym.spaces.Box(-10.0, 10.0, (2,), np.float32),
            "id": gym.spaces.Discrete(4),
        }
    )


def make_act_space(kind: str) -> gym.Space:
    if kind == "discrete":
        return gym.spaces.Discrete(3)
    return gym.spaces.Box(-1.0, 1.0, (2,), np.float32)


def _f32(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return rng.uniform(-1.0, 1.0, shape).astype(np.float32)


def draw_obs(kind: str, rng: np.random.Generator) -> Any:
    if kind == "discrete":
        return int(rng.integers(5))
    if kind == "box3":
        return _f32(rng, (3,))
    if kind == "box22":
        return _f32(rng, (2, 2))
    return {"pos": _f32(rng, (2,)), "id": int(rng.integers(4))}


def draw_act(kind: str, rng: np.random.Generator) -> Any:
    if kind == "discrete":
        return int(rng.integers(3))
    return _f32(rng, (2,))


def draw_reward(rng: np.random.Generator) -> float:
    return float(np.round(rng.normal(), 3))


def draw_infos(rng: np.random.Generator, i: int) -> dict | None:
    u = rng.random()
    if u < 0.25:
        return None
    if u < 0.5:
        return {}
    return {"step": i, "x": float(np.round(rng.random(), 3))}


def draw_extra(key: str, rng: np.random.Generator) -> Any:
    if key == "logp":
        return np.float32(rng.normal())
    return rng.normal(size=2).astype(np.float32)


def draw_item(field_: str, cfg: Config, rng: np.random.Generator) -> Any:
    if field_ == "observations":
        return draw_obs(cfg.obs_kind, rng)
    if field_ == "actions":
        return draw_act(cfg.act_kind, rng)
    if field_ == "rewards":
        return draw_reward(rng)
    return draw_extra(field_.removeprefix("extra:"), rng)


def batch_items(items: list) -> Any:
    """Stacks single items into the batched form a numpy'ized episode stores."""
    if isinstance(items[0], dict):
        return {k: batch_items([it[k] for it in items]) for k in items[0]}
    if isinstance(items[0], np.ndarray):
        return np.stack(items)
    return np.array(items)


@dataclass
class Config:
    obs_kind: str
    act_kind: str
    obs_space: gym.Space | None
    act_space: gym.Space | None
    extra_keys: tuple[str, ...]
    explicit_id: bool
    ctor_kwargs: dict[str, Any] = field(default_factory=dict)

    @staticmethod
    def draw(seed: int, rng: np.random.Generator) -> Config:
        obs_kind = OBS_KINDS[int(rng.integers(len(OBS_KINDS)))]
        act_kind = ACT_KINDS[int(rng.integers(len(ACT_KINDS)))]
        cfg = Config(
            obs_kind=obs_kind,
            act_kind=act_kind,
            obs_space=make_obs_space(obs_kind) if rng.random() < 0.6 else None,
            act_space=make_act_space(act_kind) if rng.random() < 0.6 else None,
            extra_keys=EXTRA_KEYS if rng.random() < 0.7 else (),
            explicit_id=rng.random() < 0.85,
        )
        kw: dict[str, Any] = {}
        if cfg.explicit_id:
            kw["id_"] = f"episode-{seed}"
        if cfg.obs_space is not None:
            kw["observation_space"] = cfg.obs_space
        if cfg.act_space is not None:
            kw["action_space"] = cfg.act_space
        if rng.random() < 0.3:
            kw["agent_id"] = "agent_0"
            kw["module_id"] = "module_a"
            kw["multi_agent_episode_id"] = f"ma-{seed}"
        if rng.random() < 0.35:
            # Initial data, part or all of which becomes the lookback buffer.
            n = int(rng.integers(0, 5))
            kw["observations"] = [draw_obs(obs_kind, rng) for _ in range(n + 1)]
            kw["actions"] = [draw_act(act_kind, rng) for _ in range(n)]
            kw["rewards"] = [draw_reward(rng) for _ in range(n)]
            if rng.random() < 0.5:
                kw["infos"] = [draw_infos(rng, i) or {} for i in range(n + 1)]
            if cfg.extra_keys:
                kw["extra_model_outputs"] = {
                    k: [draw_extra(k, rng) for _ in range(n)] for k in cfg.extra_keys
                }
            u = rng.random()
            if u < 0.6:
                kw["len_lookback_buffer"] = int(rng.integers(0, n + 2))
            elif u < 0.8:
                kw["len_lookback_buffer"] = "auto"
            if rng.random() < 0.3:
                kw["t_started"] = int(rng.integers(0, 20))
            if rng.random() < 0.05:
                kw["terminated" if rng.random() < 0.5 else "truncated"] = True
        cfg.ctor_kwargs = kw
        return cfg


# --------------------------------------------------------------------------------------
# The harness.
# --------------------------------------------------------------------------------------


class Pair:
    """A reference episode and a subject episode that must stay indistinguishable."""

    def __init__(self, ref: Any, sub: Any, name: str, *, from_state: bool = False):
        self.eps = (ref, sub)
        self.name = name
        self.alive = True
        # RLlib's `from_state` stores extras in a defaultdict: an unknown key then yields
        # an empty result (and adds the key) instead of raising KeyError. Not probed.
        self.from_state = from_state

    @property
    def ref(self) -> Any:
        return self.eps[0]


def _known_bug(call: Call) -> KnownRLlibBug | None:
    for bug in KNOWN_RLLIB_BUGS:
        if call.method.startswith(bug.op) and bug.applies(call):
            return bug
    return None


def _fmt(x: Any) -> str:
    if isinstance(x, slice):
        return f"slice({x.start}, {x.stop}, {x.step})"
    return repr(x)


class Run:
    """One random trajectory (one seed)."""

    def __init__(self, seed: int):
        self.seed = seed
        self.rng = np.random.default_rng(seed)
        self.cfg = Config.draw(seed, self.rng)
        self.comparisons = 0
        self.history: list[str] = []

    # -- comparing ----------------------------------------------------------------

    def both(
        self,
        pair: Pair,
        label: str,
        fn: Callable[[Any, int], Any],
        *,
        mutating: bool = False,
        pure_rejection: bool = False,
        returns_episode: bool = False,
        call: tuple[str, tuple, dict] | None = None,
    ) -> tuple[Any, Any]:
        """Runs ``fn(episode, side)`` on both sides and compares the outcomes.

        A mutating call that RLlib rejects leaves RLlib's episode in whatever state it
        got to (RLlib often changes some buffers before it fails), so the pair is retired
        afterwards, unless ``pure_rejection`` says RLlib checks before changing anything.
        With ``returns_episode``, only whether each side raised is compared. ``call`` is
        (method, args, kwargs), for ``KNOWN_RLLIB_BUGS`` to look at.
        """
        if not pair.alive:
            return _RETIRED, _RETIRED
        full_label = f"{pair.name}.{label}"
        self.history.append(full_label)
        ref_out = outcome(lambda: fn(pair.eps[0], 0))
        sub_out = outcome(lambda: fn(pair.eps[1], 1))
        self.comparisons += 1
        problem = None
        if isinstance(ref_out, Raised):
            if not (isinstance(sub_out, Raised) and issubclass(sub_out.exc_type, ref_out.exc_type)):
                problem = f"reference raised {ref_out!r}, subject gave {sub_out!r}"
            if mutating and not pure_rejection:
                pair.alive = False
        elif isinstance(sub_out, Raised):
            problem = f"reference returned {ref_out!r}, subject raised {sub_out!r}"
        elif not returns_episode:
            try:
                assert_same(ref_out, sub_out, "result")
            except AssertionError as e:
                problem = str(e)
        if problem is not None:
            method, args, kwargs = call or (label, (), {})
            bug = _known_bug(
                Call(pair.name, label, method, args, kwargs, pair.ref, ref_out, sub_out)
            )
            if bug is None:
                self.diverged(full_label, problem)
            count(f"differential known-RLlib-bug deviations: {bug.op}")
            if mutating:
                pair.alive = False
        return ref_out, sub_out

    def diverged(self, label: str, msg: str) -> NoReturn:
        recent = "\n  ".join(self.history[-12:])
        raise Divergence(
            f"seed={self.seed} ({self.cfg.obs_kind} obs, {self.cfg.act_kind} actions, "
            f"obs_space={self.cfg.obs_space is not None}, "
            f"act_space={self.cfg.act_space is not None}, extras={self.cfg.extra_keys})\n"
            f"diverged at {label}: {msg}\nlast operations:\n  {recent}"
        )

    def derive(
        self,
        pair: Pair,
        label: str,
        fn: Callable[[Any, int], Any],
        name: str,
        *,
        from_state: bool = False,
    ) -> Pair | None:
        """Like ``both`` for calls that return a new episode: returns the new pair."""
        ref_out, sub_out = self.both(pair, label, fn, returns_episode=True)
        if isinstance(ref_out, Raised):
            return None
        return Pair(ref_out, sub_out, name, from_state=from_state)

    # -- what gets compared -------------------------------------------------------

    def scalars(self, pair: Pair) -> None:
        probes: list[tuple[str, Callable[[Any], Any]]] = [
            ("__len__()", len),
            ("t", lambda ep: ep.t),
            ("t_started", lambda ep: ep.t_started),
            ("is_done", lambda ep: ep.is_done),
            ("is_terminated", lambda ep: ep.is_terminated),
            ("is_truncated", lambda ep: ep.is_truncated),
            ("is_reset", lambda ep: ep.is_reset),
            ("is_numpy", lambda ep: ep.is_numpy),
            ("env_steps()", lambda ep: ep.env_steps()),
            ("agent_steps()", lambda ep: ep.agent_steps()),
            ("get_return()", lambda ep: ep.get_return()),
            ("agent_id", lambda ep: ep.agent_id),
            ("module_id", lambda ep: ep.module_id),
            ("multi_agent_episode_id", lambda ep: ep.multi_agent_episode_id),
            ("custom_data", lambda ep: ep.custom_data),
            ("observation_space", lambda ep: ep.observation_space),
            ("action_space", lambda ep: ep.action_space),
            ("validate()", lambda ep: ep.validate()),
        ]
        if self.cfg.explicit_id:
            probes.append(("id_", lambda ep: ep.id_))
        else:
            probes.append(("id_ (generated)", lambda ep: (type(ep.id_), len(ep.id_))))
        for label, fn in probes:
            self.both(pair, label, lambda ep, _side, f=fn: f(ep))

    def getters(self) -> Iterator[tuple[str, bool]]:
        """(getter, whether it takes one_hot_discrete) pairs; extras as 'extra:<key>'."""
        yield "get_observations", True
        yield "get_actions", True
        yield "get_rewards", False
        yield "get_infos", False
        for key in self.cfg.extra_keys:
            yield f"extra:{key}", False

    def query(
        self, pair: Pair, getter: str, indices: Any, neg: bool, fill: Any, one_hot: bool
    ) -> tuple[Any, Any]:
        kwargs: dict[str, Any] = {}
        if neg:
            kwargs["neg_index_as_lookback"] = True
        if fill is not None:
            kwargs["fill"] = fill
        if one_hot:
            kwargs["one_hot_discrete"] = True
        args = () if indices is None and self.rng.random() < 0.5 else (indices,)
        shown = ", ".join([*map(_fmt, args), *(f"{k}={v!r}" for k, v in kwargs.items())])
        if getter.startswith("extra:"):
            key = getter.removeprefix("extra:")
            return self.both(
                pair,
                f"get_extra_model_outputs({key!r}{', ' if shown else ''}{shown})",
                lambda ep, _s: ep.get_extra_model_outputs(key, *args, **kwargs),
                call=("get_extra_model_outputs", (key, *args), kwargs),
            )
        return self.both(
            pair,
            f"{getter}({shown})",
            lambda ep, _s: getattr(ep, getter)(*args, **kwargs),
            call=(getter, args, kwargs),
        )

    def index_forms(self, pair: Pair) -> list[Any]:
        r = self.rng
        n = len(pair.ref) + 1
        span = n + 6

        def an_int() -> int:
            return int(r.integers(-span, span))

        def a_bound() -> int | None:
            return None if r.random() < 0.25 else an_int()

        forms: list[Any] = [None, 0, -1, n, -n - 1, an_int(), an_int()]
        forms.append([an_int() for _ in range(int(r.integers(1, 4)))])
        forms.append([0, -1] if r.random() < 0.8 else [])
        steps = (None, None, 1, 2, -1)
        forms += [slice(a_bound(), a_bound(), steps[int(r.integers(len(steps)))]) for _ in range(5)]
        return forms

    def flags(self, getter: str) -> tuple[bool, Any, bool]:
        r = self.rng
        fills = (None, None, 0.0, -1)
        neg = bool(r.random() < 0.5)
        fill = fills[int(r.integers(len(fills)))]
        # one_hot_discrete matters where a space is given; without one it must raise.
        space = {
            "get_observations": self.cfg.obs_space,
            "get_actions": self.cfg.act_space,
        }.get(getter, False)
        if space is False:
            return neg, fill, False
        p_one_hot = 0.35 if space is not None else 0.05
        return neg, fill, bool(r.random() < p_one_hot)

    def light_check(self, pair: Pair) -> None:
        """After every step: counters, flags, whole getters and one random query each."""
        if not pair.alive:
            return
        self.scalars(pair)
        forms = self.index_forms(pair)
        for getter, _ in self.getters():
            self.query(pair, getter, None, False, None, False)
            indices = forms[int(self.rng.integers(len(forms)))]
            self.query(pair, getter, indices, *self.flags(getter))

    def full_check(self, pair: Pair) -> None:
        """Every index form with random flags; half the time, one form with every flag
        combination too."""
        if not pair.alive:
            return
        self.scalars(pair)
        forms = self.index_forms(pair)
        for getter, one_hot_ok in self.getters():
            for indices in forms:
                self.query(pair, getter, indices, *self.flags(getter))
            if self.rng.random() < 0.5:
                continue
            indices = forms[int(self.rng.integers(len(forms)))]
            for neg in (False, True):
                for fill in (None, 0.0, -1):
                    for one_hot in (False, True) if one_hot_ok else (False,):
                        self.query(pair, getter, indices, neg, fill, one_hot)
        if not pair.from_state:
            self.both(
                pair,
                "get_extra_model_outputs('no-such-key')",
                lambda ep, _s: ep.get_extra_model_outputs("no-such-key"),
            )

    # -- driving ------------------------------------------------------------------

    def step_kwargs(self, i: int, end: str | None) -> dict[str, Any]:
        cfg, r = self.cfg, self.rng
        kw: dict[str, Any] = {
            "observation": draw_obs(cfg.obs_kind, r),
            "action": draw_act(cfg.act_kind, r),
            "reward": draw_reward(r),
        }
        infos = draw_infos(r, i)
        if infos is not None or r.random() < 0.5:
            kw["infos"] = infos
        if end is not None:
            kw[end] = True
        elif r.random() < 0.2:
            kw["terminated"] = False
        if cfg.extra_keys:
            kw["extra_model_outputs"] = {k: draw_extra(k, r) for k in cfg.extra_keys}
        return kw

    def step(self, pair: Pair, i: int, end: str | None = None) -> None:
        kw = self.step_kwargs(i, end)
        done = bool(pair.ref.is_done)
        self.both(
            pair,
            f"add_env_step(#{i}{', ' + end if end else ''})",
            lambda ep, _s: ep.add_env_step(**copy.deepcopy(kw)),
            mutating=True,
            pure_rejection=done,  # RLlib asserts "not done" before touching anything.
        )

    def run_steps(self, pair: Pair, n: int, first: int, *, may_end: bool) -> None:
        end = None
        if may_end and self.rng.random() < 0.5:
            end = "terminated" if self.rng.random() < 0.5 else "truncated"
        for i in range(n):
            if not pair.alive:
                return
            self.step(pair, first + i, end if i == n - 1 else None)
            self.light_check(pair)

    def slices(self, pair: Pair, how_many: int) -> None:
        r = self.rng
        for _ in range(how_many):
            if not pair.alive:
                return
            n = len(pair.ref)

            def bound(n: int = n) -> int | None:
                return None if r.random() < 0.3 else int(r.integers(-n - 1, n + 2))

            s = slice(bound(), bound())
            if r.random() < 0.5:
                name = f"{pair.name}[{_fmt(s)}]"
                chunk = self.derive(
                    pair, f"__getitem__({_fmt(s)})", lambda ep, _s, s=s: ep[s], name
                )
            else:
                lb = (None, 0, 1, 2)[int(r.integers(4))]
                name = f"{pair.name}.slice({_fmt(s)}, lb={lb})"
                chunk = self.derive(
                    pair,
                    f"slice({_fmt(s)}, len_lookback_buffer={lb})",
                    lambda ep, _s, s=s, lb=lb: ep.slice(s, len_lookback_buffer=lb),
                    name,
                )
            if chunk is not None:
                self.full_check(chunk)
        self.both(pair, "__getitem__(3)", lambda ep, _s: ep[3])

    def cuts(self, pair: Pair, first_step: int) -> None:
        """Cuts with several lookbacks, steps the successors, concats one back."""
        r = self.rng
        if not pair.alive:
            return
        if pair.ref.is_done:
            self.both(pair, "cut()", lambda ep, _s: ep.cut(), mutating=True, pure_rejection=True)
            return
        if r.random() < 0.5:
            note = {"seed": self.seed, "seen": [1, 2]}
            self.both(
                pair,
                "custom_data['note'] = ...",
                lambda ep, _s: ep.custom_data.__setitem__("note", copy.deepcopy(note)),
                mutating=True,
            )
        ks = sorted(int(k) for k in r.choice(4, size=int(r.integers(1, 3)), replace=False))
        successors = []
        for k in ks:
            succ = self.derive(
                pair,
                f"cut(len_lookback_buffer={k})",
                lambda ep, _s, k=k: ep.cut(len_lookback_buffer=k),
                f"{pair.name}.cut({k})",
            )
            if succ is not None:
                self.full_check(succ)
                successors.append(succ)
        for succ in successors:
            # The successor's custom_data is a deep copy: changing it leaves `pair`'s alone.
            self.both(
                succ,
                "custom_data.setdefault('note', {})['extra'] = True",
                lambda ep, _s: ep.custom_data.setdefault("note", {}).__setitem__("extra", True),
                mutating=True,
            )
            self.both(pair, "custom_data", lambda ep, _s: ep.custom_data)
            self.run_steps(succ, int(r.integers(0, 5)), first_step, may_end=True)
            self.full_check(succ)
        if successors and r.random() < 0.8:
            succ = successors[0]
            self.both(
                pair,
                f"concat_episode({succ.name})",
                lambda ep, side: _concat(ep, succ.eps[side], side),
                mutating=True,
                call=("concat_episode", (succ.eps[0],), {}),
            )
            self.full_check(pair)
        elif r.random() < 0.5:
            # An episode with another id_ cannot be concatenated.
            other = Pair(*(cls(id_="another-id") for cls in (RLlibEpisode, SubjectEpisode)), "x")
            self.both(
                pair,
                "concat_episode(<other id_>)",
                lambda ep, side: ep.concat_episode(other.eps[side]),
                mutating=True,
                pure_rejection=True,
            )

    def set_ops(self, pair: Pair, how_many: int) -> None:
        """Random ``set_*`` calls, on a deep copy (a rejected set retires its pair)."""
        copied = self.derive(
            pair, "deepcopy()", lambda ep, _s: copy.deepcopy(ep), f"deepcopy({pair.name})"
        )
        if copied is None:
            return
        fields = ["observations", "actions", "rewards"]
        fields += [f"extra:{k}" for k in self.cfg.extra_keys]
        for _ in range(how_many):
            if not copied.alive:
                return
            self.set_op(copied, fields[int(self.rng.integers(len(fields)))])
            self.light_check(copied)

    def set_op(self, pair: Pair, field_: str) -> None:
        r = self.rng
        key = field_.removeprefix("extra:") if field_.startswith("extra:") else None

        def get(*args: Any, **kwargs: Any) -> Any:
            if key is not None:
                return pair.ref.get_extra_model_outputs(key, *args, **kwargs)
            return getattr(pair.ref, f"get_{field_}")(*args, **kwargs)

        listed = isinstance(outcome(get), list)
        n = len(pair.ref) + 1
        neg = bool(r.random() < 0.3)
        form = int(r.integers(4))
        at: Any
        if form == 0:
            at = int(r.integers(-n - 1, n + 1))
            new_data: Any = draw_item(field_, self.cfg, r)
        elif form == 1:
            at = [int(i) for i in r.integers(-n, n, size=int(r.integers(1, 3)))]
            new_data = [draw_item(field_, self.cfg, r) for _ in at]
        else:
            at = None if form == 3 else slice(int(r.integers(-n, n)), None)
            current = outcome(lambda: get() if at is None else get(at, neg_index_as_lookback=neg))
            if isinstance(current, Raised):
                size = int(r.integers(1, 3))
            elif isinstance(current, dict):  # A numpy'ized Dict observation batch.
                size = len(next(iter(current.values())))
            else:
                size = len(current)
            size += int(r.random() < 0.15)  # Sometimes one too many -> IndexError.
            items = [draw_item(field_, self.cfg, r) for _ in range(size)]
            new_data = items if listed or not items else batch_items(items)
        kwargs: dict[str, Any] = {"new_data": new_data, "at_indices": at}
        if neg:
            kwargs["neg_index_as_lookback"] = True
        if key is not None:
            kwargs["key"] = key
        setter = "set_extra_model_outputs" if key is not None else f"set_{field_}"
        self.both(
            pair,
            f"{setter}(at_indices={_fmt(at)}, neg={neg})",
            lambda ep, _s: getattr(ep, setter)(**copy.deepcopy(kwargs)),
            mutating=True,
        )

    def round_trips(self, pair: Pair) -> None:
        classes = (RLlibEpisode, SubjectEpisode)
        restored = self.derive(
            pair,
            "from_state(get_state())",
            lambda ep, side: classes[side].from_state(ep.get_state()),
            f"from_state({pair.name}.get_state())",
            from_state=True,
        )
        if restored is not None:
            self.full_check(restored)
        kind = int(self.rng.integers(3))
        how: Callable[[Any], Any] = (
            lambda ep: pickle.loads(pickle.dumps(ep)),
            copy.deepcopy,
            copy.copy,
        )[kind]
        name = ("pickle", "deepcopy", "copy")[kind]
        copied = self.derive(pair, f"{name}()", lambda ep, _s: how(ep), f"{name}({pair.name})")
        if copied is not None:
            self.full_check(copied)

    def run(self) -> None:
        r, cfg = self.rng, self.cfg
        ep = Pair(
            *(cls(**copy.deepcopy(cfg.ctor_kwargs)) for cls in (RLlibEpisode, SubjectEpisode)),
            "ep",
        )
        self.light_check(ep)
        reset_obs, reset_infos = draw_obs(cfg.obs_kind, r), draw_infos(r, 0)
        reset_args = (reset_obs,) if r.random() < 0.3 else (reset_obs, reset_infos)
        already_reset = bool(ep.ref.is_reset)
        self.both(
            ep,
            "add_env_reset()",
            lambda e, _s: e.add_env_reset(*copy.deepcopy(reset_args)),
            mutating=True,
            pure_rejection=already_reset,
        )
        self.light_check(ep)
        if r.random() < 0.2:  # A second reset is always rejected, before any change.
            self.both(
                ep,
                "add_env_reset() again",
                lambda e, _s: e.add_env_reset(*copy.deepcopy(reset_args)),
                mutating=True,
                pure_rejection=True,
            )
        n_steps = int(r.integers(0, 10))
        self.run_steps(ep, n_steps, 1, may_end=r.random() < 0.4)
        if ep.alive and ep.ref.is_done:
            self.step(ep, n_steps + 1)  # Stepping a done episode is rejected.
        self.full_check(ep)
        self.slices(ep, int(r.integers(1, 3)))
        self.cuts(ep, n_steps + 1)
        if r.random() < 0.3:
            self.set_ops(ep, int(r.integers(1, 4)))
        # numpy phase.
        self.both(ep, "to_numpy() is self", lambda e, _s: e.to_numpy() is e, mutating=True)
        self.full_check(ep)
        self.both(ep, "to_numpy() again", lambda e, _s: e.to_numpy() is e, mutating=True)
        self.light_check(ep)
        self.slices(ep, int(r.integers(1, 3)))
        self.cuts(ep, 100)
        if r.random() < 0.5:
            self.set_ops(ep, int(r.integers(1, 4)))
        if ep.alive and not ep.ref.is_done and r.random() < 0.5:
            self.run_steps(ep, int(r.integers(1, 4)), 200, may_end=True)
            self.full_check(ep)
        self.round_trips(ep)


def run_batch(batch: int) -> None:
    """Runs one batch of seeds; fails naming every diverging seed and the first story."""
    run_differential_batch(
        range(batch * SEEDS_PER_BATCH, (batch + 1) * SEEDS_PER_BATCH), Run, "trajectories"
    )


@pytest.mark.parametrize(
    "batch",
    range(N_BATCHES),
    ids=lambda b: f"seeds{b * SEEDS_PER_BATCH}-{(b + 1) * SEEDS_PER_BATCH - 1}",
)
def test_differential(batch: int) -> None:
    run_batch(batch)


def test_known_rllib_bugs_are_documented() -> None:
    for bug in KNOWN_RLLIB_BUGS:
        assert bug.op and bug.why.strip() and callable(bug.applies), bug
