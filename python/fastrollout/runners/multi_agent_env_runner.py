"""``MultiAgentEnvRunner``: samples N copies of a multi-agent env.

One batched forward pass per module runs across all sub-envs and agents.

Semantics follow RLlib 2.60's ``MultiAgentEnvRunner``. Per env step: one native call
gathers each module's observations (the agents that act, across sub-envs) into one
contiguous array with the index map back; one forward per module; one native call
scatters the outputs back into per-sub-env action dicts; the sub-envs step; one native
call records the step into all sub-envs' episodes. A done sub-env is reset at once (the
next step starts its new episode; no wasted step).
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from fastrollout._core import ModuleBatcher, multi_agent_record_steps
from fastrollout.core import DEFAULT_MODULE_ID, Columns
from fastrollout.episodes import MultiAgentEpisode
from fastrollout.errors import MultiAgentEnvError, SpaceMismatchError
from fastrollout.runners import _rllib, keys
from fastrollout.runners._config import OBSERVATION_BLOCK_ROWS, cfg, smoothing_window
from fastrollout.runners.env_runner import EnvRunner
from fastrollout.runners.sub_envs import StepResults

__all__ = ["MultiAgentEnvRunner"]


def _default_mapping(agent_id: Any, episode: Any, **kwargs: Any) -> str:
    return DEFAULT_MODULE_ID


class MultiAgentEnvRunner(EnvRunner[MultiAgentEpisode]):
    """Samples ``num_envs_per_env_runner`` copies of a ``MultiAgentEnv``.

    ``sample(num_timesteps=N)`` counts env steps, or, under
    ``config.multi_agent(count_steps_by="agent_steps")``, agent steps: each observation a
    stepped sub-env returns counts one, summed over the sub-envs (so a sub-env's chunk
    holds about ``rollout_fragment_length`` agent steps by default), as RLlib counts them.
    The modules are built and run in sorted id order.

    Args:
        config: The runner config (``fastrollout.RunnerConfig``), with ``policies`` and
            ``policy_mapping_fn`` for the agent -> module mapping.
        worker_index: The runner's index (0: the local runner).
        num_workers: The number of remote runners.
        **kwargs: Ignored.

    Raises:
        ValueError: If the config names no env, or a module has no agent to take its
            spaces from and no spaces of its own.
    """

    _multi_agent = True

    def __init__(
        self,
        *,
        config: Any,
        worker_index: int | None = None,
        num_workers: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            config=config, worker_index=worker_index, num_workers=num_workers, **kwargs
        )
        if self._rllib and not self.config.is_multi_agent:
            # As RLlib's runner: its config's default mapping (for the old stack) takes
            # arguments an episode does not pass.
            raise ValueError(
                f"{type(self).__name__} needs a multi-agent config: call "
                "config.multi_agent(policies=..., policy_mapping_fn=...)"
            )
        self._obs: list[Any] = []
        # What was sent to each sub-env whose step is in flight: (actions for the env,
        # actions, extra model outputs), as the batcher's scatter gives them.
        self._sent: list[Any] = []
        # This call's steps per agent and per module (the native record counts them).
        self._agent_steps: Counter[Any] = Counter()
        self._module_steps: Counter[Any] = Counter()
        self._count_agent_steps = False
        self._terminateds: list[Any] = []
        self._truncateds: list[Any] = []
        self._batcher: ModuleBatcher | None = None
        # The modules of the latest gather whose rows are not yet in
        # `_shared_data["agent_rows"]` (see `_connect`).
        self._rows_pending: dict[str, Any] | None = None
        # The config's checked mapping names the agent and module when a mapping goes to
        # a module that is not configured.
        self._mapping_fn = cfg(
            config,
            "agent_to_module_mapping_fn",
            cfg(config, "policy_mapping_fn", _default_mapping),
        )
        if self._wants_env():
            self.make_env()
        self.make_module()

    # -- env and module ----------------------------------------------------------

    def _envs_created(self, creator: Any) -> None:
        n = self.num_envs
        self._obs, self._terminateds, self._truncateds = [None] * n, [None] * n, [None] * n
        self._sent = [None] * n
        for i in range(n):
            self._callback(
                "on_environment_created",
                env_runner=self,
                metrics_logger=self.metrics,
                env=self._sub_envs.agent_spaces(i),
                env_context=creator.env_context(i) if hasattr(creator, "env_context") else None,
            )

    def _module_ids(self) -> list[str]:
        """The configured module ids, sorted.

        The modules are built (their weights drawn) and run (their actions drawn) in this
        order, so one seed gives the same modules and episodes in every process, whatever
        order the config holds them in (a set's changes with ``PYTHONHASHSEED``).

        Returns:
            The sorted ids (``["default_policy"]`` when the config names none).
        """
        ids = cfg(self.config, "module_ids")
        if ids is None:
            ids = cfg(self.config, "policies", [DEFAULT_MODULE_ID])
        return sorted(str(m) for m in ids)

    def get_spaces(self) -> dict[str, Any]:
        """The spaces of the env and of each module (from the first agent mapped to it).

        Returns:
            ``{"__env__": (obs space, action space), "__env_single__": (per-agent Dict
            of observation spaces, per-agent Dict of action spaces), module_id: (obs
            space, action space)}``, as RLlib's (its ``Algorithm`` reads
            ``"__env_single__"`` when it has no local runner).

        Raises:
            ValueError: If a module gets no agent and has no spaces in its spec.
        """
        if self.env is None:
            return dict(self.spaces)
        env = self._sub_envs.agent_spaces(0)
        probe = MultiAgentEpisode(agent_to_module_mapping_fn=self._mapping_fn)
        agent_of: dict[str, Any] = {}
        for aid in env.possible_agents:
            agent_of.setdefault(str(probe.module_for(aid)), aid)
        policies = cfg(self.config, "policies")
        agents = list(env.possible_agents)
        out: dict[str, Any] = {
            "__env__": (
                getattr(env, "observation_space", None),
                getattr(env, "action_space", None),
            ),
            "__env_single__": (
                gym.spaces.Dict({aid: env.get_observation_space(aid) for aid in agents}),
                gym.spaces.Dict({aid: env.get_action_space(aid) for aid in agents}),
            ),
        }
        for mid in self._module_ids():
            spec = policies.get(mid) if isinstance(policies, dict) else None
            own = (getattr(spec, "observation_space", None), getattr(spec, "action_space", None))
            if own[0] is not None and own[1] is not None:
                out[mid] = own
            elif mid in agent_of:
                aid = agent_of[mid]
                out[mid] = (env.get_observation_space(aid), env.get_action_space(aid))
            elif getattr(env, "shared_spaces", None) is not None:
                # Every agent has the same spaces (an ExternalMultiAgentEnv built so).
                out[mid] = env.shared_spaces
            else:
                raise ValueError(
                    f"module {mid!r}: no agent of the env maps to it (policy_mapping_fn over "
                    f"{list(env.possible_agents)}) and its spec names no spaces"
                )
        return out

    def make_module(self) -> None:
        """Builds the MultiRLModule, the batcher and the connectors."""
        super().make_module()
        spaces = self.get_spaces()
        self._batcher = ModuleBatcher(
            {mid: sp[0] for mid, sp in spaces.items() if not mid.startswith("__")}
        )

    # -- sampling ------------------------------------------------------------------

    def _new_episode(self, i: int) -> None:
        env = self._sub_envs.agent_spaces(i)
        agents = list(env.possible_agents)
        episode_cls = _rllib.RLlibMultiAgentEpisode if self._rllib else MultiAgentEpisode
        episode = self._episodes[i] = episode_cls(
            observation_space={aid: env.get_observation_space(aid) for aid in agents},
            action_space={aid: env.get_action_space(aid) for aid in agents},
            agent_to_module_mapping_fn=self._mapping_fn,
        )
        if agents:
            # An agent outside them fails when it first observes (one lookup per agent
            # and chunk, in the episode); RLlib records it, without a space.
            episode._declared_agents = dict.fromkeys(agents)
        if cfg(self.config, "compress_observations", False):
            # Every agent's typed observations (agents whose observations are Python
            # objects store them as they are); cut chunks keep it.
            episode._observation_compression = OBSERVATION_BLOCK_ROWS
        # Every agent of the new episode starts from its module's initial state.
        self._states.drop_where(lambda slot: slot[0] == i)
        self._episode_callback("on_episode_created", i)

    def _state_slots(self, batch: dict[Any, Any]) -> dict[Any, list[Any]]:
        # (env index, agent id) per row: the batcher's map of its latest gather.
        assert self._batcher is not None
        return {mid: self._batcher.index_map(mid) for mid in batch}

    def _callback_env(self, i: int) -> Any:
        env = self._sub_envs.sub_env(i)
        return self._sub_envs.agent_spaces(i) if env is None else env.unwrapped

    def _sample(self, **kwargs: Any) -> list[MultiAgentEpisode]:
        self._agent_steps, self._module_steps = Counter(), Counter()
        self._count_agent_steps = self._counts_agent_steps()
        return super()._sample(**kwargs)

    def _counted_steps(self) -> int:
        # Agent steps: every observation a stepped sub-env returned, summed over the
        # sub-envs (an agent seen only in a terminal step included).
        if self._count_agent_steps:
            return self._agent_steps.total() - self._call.untrained_agent_steps
        return self._call.env_steps

    def _agent_and_module_steps(self) -> tuple[Counter[Any], Counter[Any]]:
        return self._agent_steps, self._module_steps

    def _drop_steps(self, episode: Any) -> None:
        super()._drop_steps(episode)
        for aid, ae in episode.agent_episodes.items():
            self._agent_steps[aid] -= len(ae)
            self._module_steps[ae.module_id] -= len(ae)

    def _reset_all(self) -> None:
        n = self.num_envs
        self._episodes = [None] * n  # type: ignore[list-item]
        self._obs, self._terminateds, self._truncateds = [None] * n, [None] * n, [None] * n
        for i in range(n):
            self._new_episode(i)
        self._ongoing_episodes_for_metrics.clear()
        # Sub-env i gets seed + i, as a gymnasium vector env (and RLlib) seeds them.
        seed = self._seed if self._needs_initial_reset else None
        self._needs_initial_reset = False
        with self.metrics.log_time(keys.ENV_RESET_TIMER):
            results = self._sub_envs.reset_all(seed)
        self._ready = None if self._sub_envs.lockstep else np.zeros(0, np.int64)
        for i, obs, infos in results.resets:
            self._record_reset(i, obs, infos)
        for i, err in results.failed.items():
            self._sub_env_failed(i, err)

    def _record_reset(self, i: int, obs: Any, infos: Any) -> None:
        try:
            self._episodes[i].add_env_reset(observations=obs, infos=infos)
        except (MultiAgentEnvError, SpaceMismatchError) as err:
            # The native step names the sub-env; a reset is recorded one sub-env at a time.
            raise type(err)(f"sub-env {i}: {err}") from err
        self._obs[i], self._terminateds[i], self._truncateds[i] = obs, None, None
        if self._ready is not None:
            self._ready = np.append(self._ready, i)
        self._episode_callback("on_episode_start", i)

    def _restart_sub_env(self, i: int) -> None:
        self._reset_sub_env(i, None)

    def _act_and_send(self) -> None:
        call = self._call
        ids = self._ready
        if call.random_actions:
            per_env = self._random_actions(ids)
        else:
            per_env = self._compute_actions(ids, call.explore, call.env_steps)
        if self._sub_envs.external and ids is not None:
            logged = self._sub_envs.logged_actions(ids)
            if logged:
                self._with_logged(logged, ids, per_env)
        self._sub_envs.send(ids, [p[0] for p in per_env])
        if ids is None:
            self._sent = per_env
        else:
            for j, i in enumerate(ids):
                self._sent[i] = per_env[j]
            self._ready = np.zeros(0, np.int64)

    def _with_logged(
        self, logged: list[tuple[int, Any, Any]], ids: Any, per_env: list[Any]
    ) -> None:
        """Puts per-agent actions a simulator took itself into ``per_env`` (in place).

        As the single-agent runner does: the logged actions replace the module's, their
        ``action_logp`` is the module's log-probability of them where its
        ``action_dist_inputs`` define one, and the simulator's own outputs replace the
        module's (its own ``STATE_OUT`` also becomes the agent's live state).

        Args:
            logged: ``(row, {agent: action}, simulator outputs or None)`` per logged row.
            ids: The sub-envs of the rows.
            per_env: ``(env actions, actions, extras)`` per row, as computed.

        Raises:
            ValueError: If a simulator's ``STATE_OUT`` is not shaped as its module's
                state (named by episode, agent and module).
        """
        for j, acts, own in logged:
            episode = self._episodes[int(ids[j])]
            _, _, extras = per_env[j]
            new_extras = {}
            for aid, action in acts.items():
                ex = extras.get(aid)
                ex = dict(ex.to_dict() if hasattr(ex, "to_dict") else ex or {})
                dist_inputs = ex.get(Columns.ACTION_DIST_INPUTS)
                if dist_inputs is not None and Columns.ACTION_LOGP in ex:
                    logp = self._logp_of(
                        episode.module_for(aid),
                        np.asarray(dist_inputs)[None],
                        np.asarray(action)[None],
                        self._call.explore,
                    )
                    if logp is not None:
                        ex[Columns.ACTION_LOGP] = logp[0]
                given = (own or {}).get(aid, {}) if _per_agent(own, acts) else own or {}
                mid = episode.module_for(aid)
                if Columns.STATE_OUT in given and mid in self._states:
                    # The simulator's own state: recorded, and the agent's next step
                    # starts from it.
                    try:
                        state = self._states.set_state(
                            mid, (int(ids[j]), aid), given[Columns.STATE_OUT]
                        )
                    except ValueError as err:
                        raise ValueError(
                            f"episode {episode.id_}, agent {aid!r}: log_action's outputs: {err}"
                        ) from None
                    given = {**given, Columns.STATE_OUT: state}
                ex.update(given)
                ex.setdefault(keys.WEIGHTS_SEQ_NO, self._weights_seq_no)
                new_extras[aid] = ex
            per_env[j] = (acts, acts, new_extras)

    def _record_steps(self, results: StepResults) -> list[int]:
        ids = results.env_ids
        failed = results.failed
        if ids is None:
            rows = [i for i in range(self.num_envs) if i not in failed] if failed else None
        else:
            rows = list(ids)
        if rows is not None and not rows:
            return []
        cols = (
            results.observations,
            results.rewards,
            results.infos,
            results.terminateds,
            results.truncateds,
        )
        sent = self._sent
        if rows is None:
            o, r, inf, te, tr = cols
            acts, extras = [p[1] for p in sent], [p[2] for p in sent]
        else:
            # Lockstep rows are by sub-env; remote rows are in ids' order.
            at = rows if ids is None else range(len(rows))
            o, r, inf, te, tr = ([c[j] for j in at] for c in cols)
            acts, extras = [sent[i][1] for i in rows], [sent[i][2] for i in rows]
        # The native call also counts each observing agent's step for the agent and its
        # module (a Python loop over the sub-envs cost about 3% at 8 sub-envs).
        done = multi_agent_record_steps(
            self._episodes,
            o,
            acts,
            r,
            inf,
            te,
            tr,
            extras,
            agent_steps=self._agent_steps,
            module_steps=self._module_steps,
            env_indices=rows,
        )
        if rows is None:
            self._call.env_steps += self.num_envs
        else:
            self._call.env_steps += len(rows) - results.untrained_steps
            self._call.untrained_steps += results.untrained_steps
            self._call.untrained_agent_steps += results.untrained_agent_steps
        self._sub_envs_stepped(rows)
        if rows is None:
            self._obs, self._terminateds, self._truncateds = list(o), list(te), list(tr)
        else:
            for j, i in enumerate(rows):
                self._obs[i], self._terminateds[i], self._truncateds[i] = o[j], te[j], tr[j]
        if self._has_callbacks("on_episode_step"):
            for i in range(self.num_envs) if rows is None else rows:
                self._episode_callback("on_episode_step", i)
        if ids is not None and rows is not None:
            # Remote: the sub-envs that stepped wait for their next action (those whose
            # episode ended wait for their reset instead).
            finished = set(done)
            self._ready = np.array([i for i in rows if i not in finished], np.int64)
        if done and not self._call.random_actions:
            self._env_to_module_done(
                [self._episodes[i] for i in done], [self._obs[i] for i in done], self._call.explore
            )
        return done  # type: ignore[no-any-return]

    def _compute_actions(self, ids: Any, explore: bool, ts: int) -> list[Any]:
        assert self.module is not None and self._batcher is not None
        start = time.perf_counter()
        if ids is None:
            gathered = self._batcher.gather(
                self._episodes, self._obs, self._terminateds, self._truncateds
            )
        else:
            gathered = self._batcher.gather(
                self._episodes,
                [self._obs[i] for i in ids],
                [self._terminateds[i] for i in ids],
                [self._truncateds[i] for i in ids],
                env_indices=ids,
            )
        self._rows_pending = gathered
        batch = self._observations_to_module(gathered, explore)
        self._log_time_since(keys.ENV_TO_MODULE_CONNECTOR, start)
        if not batch:
            return [({}, {}, {}) for _ in range(self.num_envs if ids is None else len(ids))]
        to_env, start = self._act(batch, explore, ts)
        # Each agent's extra outputs stay rows of its module's arrays until the record
        # copies them into its columns (no per-agent numpy scalars and views in between).
        per_env = self._batcher.scatter(
            to_env, extra_constants={keys.WEIGHTS_SEQ_NO: self._weights_seq_no}, extras_as_rows=True
        )
        self._log_time_since(keys.MODULE_TO_ENV_CONNECTOR, start)
        return per_env  # type: ignore[no-any-return]

    def _connect(self, pipeline: Any, batch: dict[Any, Any], explore: bool) -> dict[Any, Any]:
        """Runs a connector pipeline, with this step's ``shared_data["agent_rows"]``.

        The rows (which env index and agent each batch row is, per module) are built here,
        on the first pipeline call of the step, rather than at the gather: the default
        pipelines are never called (the runner converts and acts directly), and building
        the rows for them cost 1 to 2% of a vector step at 8 sub-envs x 8 agents.

        Args:
            pipeline: The pipeline to run.
            batch: Its input batch.
            explore: Whether the runner explores.

        Returns:
            The pipeline's output batch.
        """
        if self._rows_pending is not None:
            self._shared_data["agent_rows"] = self._agent_rows(self._rows_pending)
            self._rows_pending = None
        return super()._connect(pipeline, batch, explore)

    def _agent_rows(self, gathered: dict[str, Any]) -> dict[str, Any]:
        """The ``shared_data["agent_rows"]`` of the batcher's latest gather.

        Args:
            gathered: That gather's output (its keys are the modules).

        Returns:
            Per module, the ``(env_index, agent_id)`` of each row of its batch.
        """
        assert self._batcher is not None
        return {mid: self._batcher.index_map(mid) for mid in gathered}

    def _env_to_module_done(
        self, episodes: list[Any], observations: list[Any], explore: bool
    ) -> None:
        """Runs env-to-module on the last observations of episodes that just ended.

        As RLlib does (its output is thrown away): connectors that rewrite episodes, such
        as the observation filter, then treat the terminal observations like all others.
        The default pipeline, which only converts the batch, has nothing to do there.
        """
        assert self.module is not None and self._batcher is not None
        if self._connectors.env_to_module.only_converts():
            return
        gathered = self._batcher.gather(episodes, observations)
        if not gathered:
            return
        shared: dict[str, Any] = {"agent_rows": self._agent_rows(gathered)}
        self._connectors.env_to_module(
            batch={mid: {Columns.OBS: o} for mid, o in gathered.items()},
            rl_module=self.module,
            episodes=episodes,
            explore=explore,
            shared_data=shared,
            metrics=None,
        )

    def _random_actions(self, ids: Any) -> list[Any]:
        out = []
        for i in range(self.num_envs) if ids is None else ids:
            env = self._sub_envs.agent_spaces(i)
            obs, term, trunc = (
                self._obs[i] or {},
                self._terminateds[i] or {},
                self._truncateds[i] or {},
            )
            acts = {
                aid: env.get_action_space(aid).sample()
                for aid in obs
                if not term.get(aid, False) and not trunc.get(aid, False)
            }
            out.append(
                (acts, acts, {aid: {keys.WEIGHTS_SEQ_NO: self._weights_seq_no} for aid in acts})
            )
        return out

    def _counts_agent_steps(self) -> bool:
        """Whether ``num_timesteps`` counts agent steps (else env steps).

        Returns:
            True under ``config.multi_agent(count_steps_by="agent_steps")``.

        Raises:
            ValueError: If ``count_steps_by`` is neither ``"env_steps"`` nor
                ``"agent_steps"``.
        """
        by = cfg(self.config, "count_steps_by", "env_steps")
        if by not in ("env_steps", "agent_steps"):
            raise ValueError(f"count_steps_by must be 'env_steps' or 'agent_steps', got {by!r}")
        return bool(by == "agent_steps")

    def _episode_out(self, episode: Any, to_numpy: bool) -> Any:
        # Only agents that stepped are kept in returned episodes; ``_cut_ongoing`` cuts
        # the successors before this runs, so they keep every agent.
        for aid in [a for a, ae in episode.agent_episodes.items() if len(ae) == 0]:
            del episode.agent_episodes[aid]
        return super()._episode_out(episode, to_numpy)

    # -- metrics -------------------------------------------------------------------

    def get_metrics(self) -> dict[str, Any]:
        """The metrics since the last call, reduced (RLlib's keys).

        Includes per-agent and per-module returns.

        Returns:
            The reduced metrics dict.
        """
        win = smoothing_window(self.config)
        m = self.metrics
        for e in self._done_episodes_for_metrics:
            chunks = [*self._ongoing_episodes_for_metrics.pop(e.id_, []), e]
            length = sum(len(c) for c in chunks)
            ret = sum(float(c.get_return()) for c in chunks)
            sec = sum(c.get_duration_s() for c in chunks)
            agents: dict[str, float] = defaultdict(float)
            modules: dict[str, float] = defaultdict(float)
            steps: dict[str, int] = defaultdict(int)
            for c in chunks:
                for aid, ae in c.agent_episodes.items():
                    r = float(ae.get_return())
                    agents[str(aid)] += r
                    steps[str(aid)] += len(ae)
                    modules[str(ae.module_id)] += r
            for aid, r in agents.items():
                m.log_value((keys.EPISODE_AGENT_RETURN_MEAN, aid), r, window=win)
                m.log_value((keys.EPISODE_AGENT_STEPS, aid), steps[aid], window=win)
            for mid, r in modules.items():
                m.log_value((keys.EPISODE_MODULE_RETURN_MEAN, mid), r, window=win)
            self._log_episode_end(length, ret, sec, win)
        self._done_episodes_for_metrics.clear()
        return self._reduced_metrics()


def _per_agent(own: Any, acts: Mapping[Any, Any]) -> bool:
    """Whether a simulator's outputs for a step are keyed by agent (else shared)."""
    return bool(own) and all(isinstance(v, Mapping) for v in own.values()) and set(own) <= set(acts)
