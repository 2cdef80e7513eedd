"""Random valid multi-agent step scripts, and models of RLlib 2.60 with its bugs fixed.

``Planner`` writes the arguments of ``add_env_reset``/``add_env_step`` for a multi-agent
environment with a few agents: all of them acting every step (simultaneous), taking turns,
or a random subset; agents joining late and leaving early (terminated or truncated),
``__all__`` termination and truncation, rewards for agents without an observation (they
hang until the agent's next observation) and rewards before an agent's first observation.
It follows the rules of RLlib's ``MultiAgentEpisode.add_env_step``:

- every agent that got an observation at the previous step and is not done acts now;
- an agent that acts and gets its next observation in the same step gets a reward;
- an agent that acted but got no observation holds a hanging action until its next
  observation (it does not act again before that); it may get rewards meanwhile;
- an agent is truncated only with an observation; it may be terminated without one (RLlib
  then repeats its last observation);
- no data at all for an agent that is done.

The planner keeps its own book of every agent's status, so a planner copy drives a cut
successor exactly like the original would have gone on.

``fixed_cut``, ``extras_model`` and the helpers around them compute what RLlib 2.60 would
return without the bugs listed in the differential test's ``KNOWN_RLLIB_BUGS`` (they run
RLlib itself, on patched inputs).
"""

from __future__ import annotations

import contextlib
import copy
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
from ray.rllib.env.utils.infinite_lookback_buffer import InfiniteLookbackBuffer

from _helpers import Raised, assert_same_outcome, episode_getters, outcome

AGENT_IDS = ("a0", "a1", "a2", "a3")
EXTRA_KEYS = ("logp", "dist")
MODES = ("simultaneous", "turns", "random")


def obs_space(kind: str) -> gym.Space:
    if kind == "discrete":
        return gym.spaces.Discrete(5)
    return gym.spaces.Box(-1.0, 1.0, (2,), np.float32)


def act_space(kind: str) -> gym.Space:
    if kind == "discrete":
        return gym.spaces.Discrete(3)
    return gym.spaces.Box(-1.0, 1.0, (2,), np.float32)


# Agent-to-module mapping functions (module level, so that episodes pickle).
def module_by_parity(agent_id: Any, episode: Any) -> str:
    return "even" if int(str(agent_id)[-1]) % 2 == 0 else "odd"


def module_per_agent(agent_id: Any, episode: Any) -> str:
    return f"module_{agent_id}"


MAPPING_FNS = (None, module_by_parity, module_per_agent)


@dataclass(frozen=True)
class AgentSpec:
    obs_kind: str  # "discrete" (python int in [0, 5)) or "box" (float32, shape (2,))
    act_kind: str  # "discrete" (python int in [0, 3)) or "box" (float32, shape (2,))
    extras: bool  # whether its actions come with extra_model_outputs (logp, dist)
    late: bool  # not in the reset observation (may join later)


@dataclass
class ScriptConfig:
    agents: dict[str, AgentSpec]
    mode: str
    p_end: float  # per step: __all__ terminated or truncated
    p_done: float  # per observation: the agent is terminated or truncated
    p_join: float  # per step and late agent: its first observation
    spaces: str  # "none", "dict" (a plain dict of spaces) or "gym" (gym.spaces.Dict)

    @staticmethod
    def draw(rng: np.random.Generator) -> ScriptConfig:
        n = int(rng.choice([1, 2, 2, 3, 3, 4]))
        agents = {}
        for i, aid in enumerate(AGENT_IDS[:n]):
            agents[aid] = AgentSpec(
                obs_kind=("discrete", "box")[int(rng.integers(2))],
                act_kind=("discrete", "box")[int(rng.integers(2))],
                extras=bool(rng.random() < 0.5),
                late=bool(i > 0 and rng.random() < 0.3),
            )
        return ScriptConfig(
            agents=agents,
            mode=MODES[int(rng.integers(len(MODES)))],
            p_end=float(rng.choice([0.0, 0.04, 0.1])),
            p_done=float(rng.choice([0.0, 0.05, 0.15])),
            p_join=float(rng.choice([0.2, 0.5])),
            spaces=("none", "none", "dict", "gym")[int(rng.integers(4))],
        )

    def space_kwargs(self) -> dict[str, Any]:
        """observation_space/action_space constructor arguments (per agent), if any."""
        if self.spaces == "none":
            return {}
        obs = {aid: obs_space(s.obs_kind) for aid, s in self.agents.items()}
        act = {aid: act_space(s.act_kind) for aid, s in self.agents.items()}
        if self.spaces == "gym":
            return {"observation_space": gym.spaces.Dict(obs), "action_space": gym.spaces.Dict(act)}
        return {"observation_space": obs, "action_space": act}

    def describe(self) -> str:
        agents = ", ".join(
            f"{aid}({s.obs_kind}/{s.act_kind}{', extras' if s.extras else ''}"
            f"{', late' if s.late else ''})"
            for aid, s in self.agents.items()
        )
        return f"{self.mode} [{agents}] spaces={self.spaces}"


class Planner:
    """Writes valid reset/step arguments and keeps the book of every agent's status.

    Status: "out" (no observation yet), "ready" (observed at the previous step: acts now),
    "hanging" (acted, waits for its next observation), "done", "gone" (left or was dropped
    without ever being part of the episode).
    """

    def __init__(self, cfg: ScriptConfig, rng: np.random.Generator):
        self.cfg = cfg
        self.rng = rng
        self.status = dict.fromkeys(cfg.agents, "out")
        self.joined: set[str] = set()  # agents with a SingleAgentEpisode
        self.done = False
        self.t = 0
        self.turn = 0
        self.events: Counter[str] = Counter()  # what the scripts covered (shared by forks)

    def fork(self) -> Planner:
        """An independent copy (same random generator) to drive a successor."""
        twin = copy.copy(self)
        twin.status = dict(self.status)
        twin.joined = set(self.joined)
        return twin

    # -- data ----------------------------------------------------------------------

    def obs(self, aid: str) -> Any:
        if self.cfg.agents[aid].obs_kind == "discrete":
            return int(self.rng.integers(5))
        return self.rng.uniform(-1.0, 1.0, 2).astype(np.float32)

    def act(self, aid: str) -> Any:
        if self.cfg.agents[aid].act_kind == "discrete":
            return int(self.rng.integers(3))
        return self.rng.uniform(-1.0, 1.0, 2).astype(np.float32)

    def reward(self) -> float:
        return float(np.round(self.rng.normal(), 3))

    def extra(self) -> dict[str, Any]:
        r = self.rng
        return {
            "logp": np.float32(np.round(r.normal(), 3)),
            "dist": r.normal(size=2).astype(np.float32),
        }

    def info(self, aid: str) -> dict | None:
        return {"t": self.t, "who": aid} if self.rng.random() < 0.5 else None

    # -- scripts -------------------------------------------------------------------

    def reset(self) -> tuple[dict, dict]:
        """(observations, infos) for add_env_reset: at least one agent."""
        r = self.rng
        first = [aid for aid, s in self.cfg.agents.items() if not s.late]
        if self.cfg.mode == "turns":
            first = first[:1]
        elif self.cfg.mode == "random":
            first = [aid for aid in first if r.random() < 0.6] or first[:1]
        observations = {aid: self.obs(aid) for aid in first}
        infos = {aid: i for aid in first if (i := self.info(aid)) is not None}
        for aid in first:
            self.status[aid] = "ready"
            self.joined.add(aid)
        return observations, infos

    def step(self) -> dict[str, Any]:
        """Keyword arguments for one valid add_env_step."""
        r, cfg, st = self.rng, self.cfg, self.status
        self.t += 1
        ready = [a for a in st if st[a] == "ready"]
        hanging = [a for a in st if st[a] == "hanging"]
        out = [a for a in st if st[a] == "out"]
        live = ready + hanging
        u = r.random()
        end = "terminated" if u < cfg.p_end / 2 else "truncated" if u < cfg.p_end else None

        movers: set[str] = set()
        if cfg.mode == "simultaneous":
            movers = {a for a in live if r.random() < 0.9}
        elif cfg.mode == "turns" and live:
            # The next agent in turn observes; usually not the one that just acted.
            order = sorted(live)
            mover = order[self.turn % len(order)]
            self.turn += 1
            waiting = [a for a in order if a not in ready]
            if mover in ready and waiting and r.random() < 0.8:
                mover = waiting[0]
            movers = {mover}
        else:
            movers = {a for a in live if r.random() < 0.6}
        joiners = {a for a in out if r.random() < cfg.p_join}
        if end == "truncated":
            movers |= set(live)  # A truncation needs every acting agent's last observation.

        observations = {a: self.obs(a) for a in sorted(movers | joiners)}
        actions = {a: self.act(a) for a in ready}
        extras = {a: self.extra() for a in ready if cfg.agents[a].extras}
        rewards: dict[str, float] = {}
        for a in st:
            if st[a] in ("done", "gone"):
                continue
            if (a in ready and a in observations) or r.random() < (0.3 if st[a] == "out" else 0.5):
                rewards[a] = self.reward()
        infos = {a: i for a in observations if (i := self.info(a)) is not None}
        terminateds: dict[str, bool] = {}
        truncateds: dict[str, bool] = {}
        for a in observations:
            if r.random() < cfg.p_done:
                (terminateds if r.random() < 0.5 else truncateds)[a] = True
            elif r.random() < 0.1:
                terminateds[a] = False
        for a in live:
            if a not in observations and r.random() < cfg.p_done / 3:
                terminateds[a] = True  # Terminated without a last observation.
        for a in out:
            if a not in observations and r.random() < 0.02:
                terminateds[a] = True  # Leaves before it ever joined.
        if end is not None:
            (terminateds if end == "terminated" else truncateds)["__all__"] = True
        elif r.random() < 0.2:
            terminateds["__all__"] = False

        ev = self.events
        ev["steps"] += 1
        ev["steps with a hanging action"] += bool(hanging) or any(
            a not in observations for a in ready
        )
        ev["rewards without an observation"] += sum(
            a in st and a not in observations for a in rewards
        )
        ev["rewards before the first observation"] += sum(st[a] == "out" for a in rewards)
        ev["agents terminated"] += sum(bool(terminateds.get(a)) for a in st)
        ev["agents truncated"] += sum(bool(truncateds.get(a)) for a in st)
        ev["agents terminated without an observation"] += sum(
            bool(terminateds.get(a)) and a in live and a not in observations for a in st
        )
        if end is not None:
            ev[f"episode ends: __all__ {end}"] += 1

        # The book: who is done, who joined, and whether the episode ends.
        flagged = {
            a
            for a in {*terminateds, *truncateds} - {"__all__"}
            if terminateds.get(a) or truncateds.get(a)
        }
        done_before = {a for a in self.joined if st[a] == "done"}
        # RLlib ends the episode (terminated) once every agent that has an episode is done.
        self.done = end is not None or all(a in done_before | flagged for a in self.joined)
        for a in list(st):
            if st[a] in ("done", "gone"):
                continue
            if st[a] == "out":
                if a in observations and not (a in flagged or self.done):
                    st[a] = "ready"
                    self.joined.add(a)
                    ev["late joins"] += 1
                elif a in observations or a in flagged:
                    st[a] = "gone"  # Done with its first observation: never part of it.
                continue
            if a in flagged or self.done:
                st[a] = "done"
            else:
                st[a] = "ready" if a in observations else "hanging"

        kwargs: dict[str, Any] = {
            "observations": observations,
            "actions": actions,
            "rewards": rewards,
        }
        if infos or r.random() < 0.5:
            kwargs["infos"] = infos
        if terminateds or r.random() < 0.3:
            kwargs["terminateds"] = terminateds
        if truncateds or r.random() < 0.3:
            kwargs["truncateds"] = truncateds
        if extras or r.random() < 0.3:
            kwargs["extra_model_outputs"] = extras
        return kwargs

    def invalid_step(self) -> tuple[str, dict[str, Any]] | None:
        """(what is wrong, add_env_step kwargs) for a step RLlib rejects; None if none fits.

        Does not change the book (the step is meant to be rejected).
        """
        st = self.status
        ready = [a for a in st if st[a] == "ready"]
        done = [a for a in st if st[a] == "done"]
        options = []
        if done:
            options.append("data for a done agent")
        if ready:
            options += ["acted and observed without a reward", "truncated without an observation"]
        if not options:
            return None
        what = options[int(self.rng.integers(len(options)))]
        actions = {a: self.act(a) for a in ready}
        if what == "data for a done agent":
            a = done[int(self.rng.integers(len(done)))]
            return what, {
                "observations": {a: self.obs(a)},
                "actions": actions,
                "rewards": {a: 1.0},
            }
        a = ready[0]
        if what == "acted and observed without a reward":
            return what, {"observations": {a: self.obs(a)}, "actions": actions, "rewards": {}}
        return what, {
            "observations": {},
            "actions": actions,
            "rewards": {},
            "truncateds": {a: True},
        }


# --------------------------------------------------------------------------------------
# Per-agent data.
# --------------------------------------------------------------------------------------


def agent_data(ep: Any) -> dict[str, dict[str, Any]]:
    """Every agent episode's chunk data and counters (excluding its look-back)."""
    out = {}
    for aid in sorted(ep.agent_ids, key=str):
        sa = ep.agent_episodes[aid]
        out[aid] = {
            "len": len(sa),
            "t_started": sa.t_started,
            "t": sa.t,
            "is_terminated": sa.is_terminated,
            "is_truncated": sa.is_truncated,
            "observations": sa.get_observations(),
            "actions": sa.get_actions(),
            "rewards": sa.get_rewards(),
            "infos": sa.get_infos(),
        }
    return out


# --------------------------------------------------------------------------------------
# Models of RLlib 2.60 without its bugs (computed with RLlib itself).
# --------------------------------------------------------------------------------------


def boundary_done_agents(ep: Any) -> dict[Any, tuple[bool, bool]]:
    """Agents that are done and stepped at the last env step: {id: (terminated, truncated)}."""
    out = {}
    for aid in ep.get_agents_that_stepped():
        sa = ep.agent_episodes[aid]
        if sa.is_done:
            out[aid] = (sa.is_terminated, sa.is_truncated)
    return out


def fixed_cut(ep: Any, len_lookback_buffer: int = 0) -> Any:
    """RLlib 2.60's ``cut`` without ray issues 61602 and 44677, and without bringing back
    agents that finished before the cut (``ep`` is RLlib's).

    - 61602: an agent that is done and stepped at the last env step (it finishes exactly
      at the cut) stays in the successor: a done agent episode of length 0 holding its
      last observation, with ``t_started`` = its ``t`` (RLlib drops it for
      ``len_lookback_buffer=0`` and starts it at t=0 otherwise). Modelled by cutting with
      its done flags cleared, then setting them again on the successor.
    - 44677 (a): with ``len_lookback_buffer=0``, RLlib's look-back extension for agents
      with a hanging action reads index 0 instead of the last item, so such an agent is
      dropped and its pending step is lost. The intended extension equals RLlib's own
      ``cut(1)`` whenever a hanging action exists.
    - 44677 (b): the successor's agent episodes come from the constructor, which leaves
      ``_last_added_observation`` unset; an agent terminated without an observation then
      loses its last step. Fixed by setting it to the agent's last observation (and infos).
    - revived (see ``revived_agents``): an agent that finished before the last env step
      is deleted from the successor (``_del_agent``, as RLlib's constructor deletes one
      whose only observation in the look-back is done).
    """
    successor = _rllib_fixed_cut(ep, len_lookback_buffer)
    for aid in revived_agents(ep, successor):
        successor._del_agent(aid)
    return successor


def revived_agents(ep: Any, successor: Any) -> list:
    """Agents of RLlib's cut ``successor`` that finished before ``ep``'s last env step.

    RLlib 2.60's cut reads the look-back's env steps for every agent; one that finished
    before the last env step and has two or more observations there comes back in the
    successor as a done agent episode restarted at agent step 0, with an env-step map one
    entry short per missing env step, so it counts among the agents that stepped at the
    successor's last env step. (With one observation there, the constructor drops it.)
    """
    boundary = boundary_done_agents(ep)
    return [
        aid
        for aid in successor.agent_episodes
        if aid in ep.agent_episodes and ep.agent_episodes[aid].is_done and aid not in boundary
    ]


def _rllib_fixed_cut(ep: Any, len_lookback_buffer: int) -> Any:
    """``fixed_cut`` without its correction of revived agents."""
    src = ep
    boundary = boundary_done_agents(ep)
    if boundary:
        src = copy.deepcopy(ep)
        for aid in boundary:
            src.agent_episodes[aid].is_terminated = False
            src.agent_episodes[aid].is_truncated = False
    if len_lookback_buffer == 0 and ep._hanging_actions_end:
        len_lookback_buffer = 1
    successor = src.cut(len_lookback_buffer=len_lookback_buffer)
    for aid, (terminated, truncated) in boundary.items():
        successor.agent_episodes[aid].is_terminated = terminated
        successor.agent_episodes[aid].is_truncated = truncated
    patch_last_added(successor)
    return successor


def patch_last_added(ep: Any) -> Any:
    """Sets RLlib's private ``_last_added_observation``/``_infos`` of every agent episode
    to its last observation/infos (what add_env_reset/add_env_step would have left)."""
    for sa in ep.agent_episodes.values():
        sa._last_added_observation = sa.get_observations(-1)
        sa._last_added_infos = sa.get_infos(-1)
    return ep


def fixed_cut_bugs(ep: Any, len_lookback_buffer: int) -> tuple[str, ...]:
    """Which of the issues ``fixed_cut`` corrects can show in this cut (RLlib's ``ep``)."""
    bugs = []
    if boundary_done_agents(ep):
        bugs.append("61602")
    bugs.append("44677")  # (b) can show in any successor; (a) if there is a hanging action.
    if any(sa.is_done for sa in ep.agent_episodes.values()):
        # Cut as the differential test cuts RLlib's side (see its ``_unflattened``).
        with no_flatten(), obs_is_numpy():
            successor = outcome(lambda: _rllib_fixed_cut(ep, len_lookback_buffer))
        if not isinstance(successor, Raised) and revived_agents(ep, successor):
            bugs.append("revived")
    return tuple(bugs)


def _with_agent_ids(args: tuple, kwargs: dict, agent_ids: list) -> tuple[tuple, dict]:
    """The (args, kwargs) of a getter call (after its key) with ``agent_ids`` replaced."""
    if len(args) > 1:
        return (args[0], agent_ids, *args[2:]), kwargs
    return args, {**kwargs, "agent_ids": agent_ids}


def extras_model(ep: Any, key: Any, args: tuple, kwargs: dict) -> Any:
    """``get_extra_model_outputs`` as RLlib 2.60 means it, where RLlib crashes internally.

    RLlib's extra-model-output reads run the same index mapping as its action reads (one
    item per action, the hanging one last), but several of its code paths crash (key None
    with batched indices, any fill, env_steps=False). The model: for each key, the
    action read of a copy of ``ep`` whose actions (and hanging actions) are that key's
    extra model outputs; for ``key=None``, {agent: {key: ...}} over the agent's keys.
    """
    keys = [key]
    if key is None:
        # The env-step map is read for every selected agent, with or without extra
        # outputs: an index outside it fails as the action read does.
        by_env_steps = (args[2] if len(args) > 2 else kwargs.get("env_steps", True)) is not False
        actions: Any = {}
        failure: Exception | None = None
        if by_env_steps:
            try:
                actions = ep.get_actions(*args, **kwargs)
            except IndexError:
                raise
            except Exception as e:  # an action-only failure (e.g. batching the fill)
                actions, failure = None, e
        keys = sorted(
            {k for sa in ep.agent_episodes.values() for k in sa.extra_model_outputs}
            | {k for h in ep._hanging_extra_model_outputs_end.values() if h for k in h}
        )
    selected = args[1] if len(args) > 1 else kwargs.get("agent_ids")
    if selected is not None and not isinstance(selected, (list, tuple, set)):
        selected = [selected]
    selected = selected or None  # RLlib reads an empty selection as all agents
    per_key = {}
    for k in keys:
        shadow = copy.deepcopy(ep)
        shadow.action_space = {}
        for aid, sa in list(shadow.agent_episodes.items()):
            if selected is not None and aid not in selected:
                continue
            hanging = shadow._hanging_extra_model_outputs_end.get(aid)
            if k in sa.extra_model_outputs:
                sa.actions = sa.extra_model_outputs[k]
            elif key is None and isinstance(hanging, dict) and k in hanging:
                # Only hanging so far: read as an empty buffer with the hanging value
                # after it (RLlib's own reading of all keys where it does not crash; a
                # read of this one key fails with KeyError).
                sa.actions = InfiniteLookbackBuffer()
            else:
                if key is not None:
                    # RLlib reads agent by agent: the env-step map of this agent and of
                    # the agents before it is read (and may fail) before the key is.
                    so_far = [a for a in ep.agent_episodes if a in (selected or ep.agent_ids)]
                    before = so_far[: so_far.index(aid)]
                    if before:  # their reads come first (and may fail)
                        call_args, call_kwargs = _with_agent_ids(args, kwargs, before)
                        extras_model(ep, key, call_args, call_kwargs)
                    call_args, call_kwargs = _with_agent_ids(args, kwargs, [aid])
                    ep.get_actions(*call_args, **call_kwargs)  # this agent's map read
                    raise KeyError(k)
                del shadow.agent_episodes[aid]
                continue
            sa.actions.space = None
            if aid in shadow._hanging_actions_end:
                shadow._hanging_actions_end[aid] = None if hanging is None else hanging[k]
        if key is None and kwargs.get("return_list"):
            # Agent by agent: RLlib counts the rows by the first selected agent's map
            # (which the shadow may have lost), and fails for an agent with fewer.
            per_key[k] = {}
            for aid in shadow.agent_episodes:
                if selected is None or aid in selected:
                    call_args, call_kwargs = _with_agent_ids(args, kwargs, [aid])
                    per_key[k][aid] = shadow.get_actions(*call_args, **call_kwargs)
            continue
        per_key[k] = shadow.get_actions(*args, **kwargs) if shadow.agent_episodes else None
    if key is not None:
        return per_key[key]
    if kwargs.get("return_list"):
        # One dict per env step, as many as the action read of all agents has.
        if actions is None:
            raise failure  # type: ignore[misc]
        steps: list[dict] = [{} for _ in actions]
        for k, per_agent in per_key.items():
            for aid, rows in per_agent.items():
                if len(rows) < len(steps):
                    raise IndexError(f"agent {aid!r} has fewer env steps than the first")
                for i, row in enumerate(rows[: len(steps)]):
                    if aid in row:
                        steps[i].setdefault(aid, {})[k] = row[aid]
        return steps
    out: dict[Any, dict] = {}
    for k, values in per_key.items():
        for aid, value in (values or {}).items():
            out.setdefault(aid, {})[k] = value
    # An agent without extra model outputs but with a hanging (empty) dict of them reads
    # as {} where an int env-step index gives its action read an item (RLlib's answer
    # where it does not crash; batched reads drop empty answers).
    indices = args[0] if args else kwargs.get("indices")
    empty = (
        []
        if not (key is None and isinstance(indices, int) and by_env_steps)
        else [
            aid
            for aid, sa in ep.agent_episodes.items()
            if not sa.extra_model_outputs
            and ep._hanging_extra_model_outputs_end.get(aid) is not None
        ]
    )
    if empty and actions is not None:
        for aid in empty:
            if aid in actions:
                out.setdefault(aid, {})
    return out


# --------------------------------------------------------------------------------------
# Snapshots.
# --------------------------------------------------------------------------------------


def _rounded(x: Any) -> Any:
    return round(float(x), 9)


def ma_snapshot(ep: Any, extra_keys: tuple[str, ...] = (), *, ids: bool = True) -> dict[str, Any]:
    """Everything observable about a multi-agent episode through its public API, as one
    comparable structure (exceptions become ``Raised`` markers).

    With ``ids=False`` the (random) agent episode ids are left out.
    """
    snap: dict[str, Any] = {
        "len": outcome(lambda: len(ep)),
        "env_t": ep.env_t,
        "env_t_started": ep.env_t_started,
        "agent_ids": outcome(lambda: ep.agent_ids),
        "agent_t_started": outcome(
            lambda: {a: ep.agent_t_started.get(a, 0) for a in sorted(ep.agent_ids, key=str)}
        ),
        "id_": ep.id_,
        "is_done": ep.is_done,
        "is_terminated": ep.is_terminated,
        "is_truncated": ep.is_truncated,
        "is_reset": ep.is_reset,
        "is_numpy": outcome(lambda: ep.is_numpy),
        "env_steps": outcome(ep.env_steps),
        "agent_steps": outcome(ep.agent_steps),
        "return": outcome(lambda: _rounded(ep.get_return())),
        "return incl. hanging": outcome(
            lambda: _rounded(ep.get_return(include_hanging_rewards=True))
        ),
        "agents to act": outcome(ep.get_agents_to_act),
        "agents that stepped": outcome(ep.get_agents_that_stepped),
        "terminateds": outcome(ep.get_terminateds),
        "truncateds": outcome(ep.get_truncateds),
        "custom_data": outcome(lambda: dict(ep.custom_data)),
        "agents": outcome(lambda: agent_data(ep)),
    }
    if ids:
        snap["agent_episode_ids"] = outcome(lambda: ep.agent_episode_ids)
    else:
        snap["agent_episode_ids (keys)"] = outcome(lambda: sorted(ep.agent_episode_ids, key=str))
    for name, get in episode_getters(ep, extra_keys).items():
        snap[name] = outcome(get)
        snap[f"{name} (agent steps)"] = outcome(lambda g=get: g(env_steps=False))
        snap[f"{name} (list)"] = outcome(lambda g=get: g(return_list=True))
        snap[f"{name} (filled)"] = outcome(
            lambda g=get: g(slice(-2, None), neg_index_as_lookback=True, fill=0)
        )
        snap[f"{name}[-1]"] = outcome(lambda g=get: g(-1))
    return snap


def assert_same_ma(expected: Any, actual: Any, extra_keys: tuple[str, ...] = (), **kw: Any) -> None:
    """Compares the ``ma_snapshot`` of two multi-agent episodes."""
    a = ma_snapshot(expected, extra_keys, **kw)
    b = ma_snapshot(actual, extra_keys, **kw)
    for key in a:
        assert_same_outcome(a[key], b[key], key)


def relative_t_model(ep: Any) -> Any:
    """A copy of RLlib's ``ep`` whose env-step map counts agent steps from the chunk's
    look-back instead of from the episode's start.

    RLlib 2.60's dict-returning env-step reads of actions, rewards and extra model
    outputs drop the item whose *absolute* agent step equals the buffer length (meant:
    the observation without an action yet, a *relative* position). In the first chunk
    both agree; in a cut or sliced chunk (agent_t_started != look-back) the read loses or
    keeps the wrong item. On this copy both agree, so RLlib's reads come out right.
    """
    model = copy.deepcopy(ep)
    for aid, sa in model.agent_episodes.items():
        lookback = sa.observations.lookback
        offset = model.agent_t_started.get(aid, 0) - lookback
        if offset == 0 or aid not in model.env_t_to_agent_t:
            continue
        mapping = model.env_t_to_agent_t[aid]
        mapping.data = [v if v == "S" else v - offset for v in mapping.data]
        model.agent_t_started[aid] = lookback
    return model


def _is_numpy_by_stepped_agents(ep: Any) -> bool:
    """is_numpy as fastrollout decides it: the agents' rewards flags (as RLlib), without
    agents that have no steps but numpy'd observations (True only if all agree)."""
    episodes = ep.agent_episodes.values()
    flags = {sa.is_numpy for sa in episodes if len(sa) > 0 or not sa.observations.finalized} or {
        sa.observations.finalized for sa in episodes
    }
    return flags == {True}


def obs_numpy_model(ep: Any, *, batch_infos: bool = True) -> Any:
    """A copy of RLlib's ``ep`` whose ``is_numpy`` follows the agents' observations.

    RLlib 2.60's ``SingleAgentEpisode.is_numpy`` is its rewards buffer's flag, which an
    agent episode without steps keeps False through ``to_numpy`` and ``cut``; the
    multi-agent ``is_numpy`` then raises RuntimeError ("only some ... converted") for an
    episode that was numpy'd as a whole, and so do the reads that consult it. On this copy
    those reads give RLlib's own answer for a numpy'd episode. With ``batch_infos=False``
    the copy claims not to be numpy'd, for info reads: fastrollout keeps infos lists of
    dicts where RLlib tries to batch them (see the numpy-infos-fill entry).
    """
    model = copy.deepcopy(ep)

    class ObsNumpy(type(model)):  # type: ignore[misc]
        __slots__ = ()  # same layout as RLlib's class, so __class__ can be swapped

        @property
        def is_numpy(self) -> bool:
            return batch_infos and _is_numpy_by_stepped_agents(self)

    model.__class__ = ObsNumpy
    return model


class _NoFlattenNumpy:
    """numpy, but ``append`` adds one item instead of flattening (see ``no_flatten``)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(np, name)

    @staticmethod
    def append(data: Any, value: Any) -> Any:
        if isinstance(data, list):
            return [*data, value]
        data, item = np.asarray(data), np.asarray(value)
        if data.ndim == item.ndim + 1:
            return np.concatenate([data, item[None]])
        return np.append(data, item)


@contextlib.contextmanager
def obs_is_numpy() -> Iterator[None]:
    """RLlib 2.60 with ``MultiAgentEpisode.is_numpy`` decided by the observations (see
    ``obs_numpy_model``), for calls that build new episodes (cut, slice)."""
    from ray.rllib.env.multi_agent_episode import MultiAgentEpisode

    saved = MultiAgentEpisode.__dict__["is_numpy"]

    def is_numpy(self: Any) -> bool:
        return _is_numpy_by_stepped_agents(self)

    MultiAgentEpisode.is_numpy = property(is_numpy)  # type: ignore[assignment,method-assign]
    try:
        yield
    finally:
        MultiAgentEpisode.is_numpy = saved  # type: ignore[method-assign]


@contextlib.contextmanager
def no_flatten() -> Iterator[None]:
    """RLlib 2.60 with its look-back buffer's hanging-value append fixed.

    ``InfiniteLookbackBuffer.get(_add_last_ts_value=...)`` appends the hanging action,
    reward or extra output with ``np.append``, which flattens array items (Box actions)
    and the list of items into one 1-D array. Inside this context it appends one item.
    """
    from ray.rllib.env.utils import infinite_lookback_buffer as ilb

    saved = ilb.np
    ilb.np = _NoFlattenNumpy()  # type: ignore[assignment]
    try:
        yield
    finally:
        ilb.np = saved


def fix_joiner_map(ep: Any, agent_id: Any) -> None:
    """Corrects, in RLlib's ``ep``, the env-step map of ``agent_id``, which joined in the
    step just added: one skip per env step of this chunk before it, look-back included.

    RLlib 2.60 starts a joining agent's map with ``env_t`` skips, counted from the
    episode's start: too many in a chunk that starts later (a cut successor), too few in
    one whose look-back reaches further back than its start; the agent's data then sits
    at the wrong env steps. fastrollout counts from the chunk's start.
    """
    mapping = ep.env_t_to_agent_t[agent_id]
    right = mapping.lookback + ep.env_t - ep.env_t_started + 1
    body = [v for v in mapping.data if v != "S"]
    mapping.data = ["S"] * (right - len(body)) + body
