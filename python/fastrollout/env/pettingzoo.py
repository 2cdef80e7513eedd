"""Adapters from PettingZoo's AEC and parallel envs to ``MultiAgentEnv``.

They follow RLlib 2.60's ``PettingZooEnv`` / ``ParallelPettingZooEnv`` (same names, same
dicts), with these fixes, each pinned by a test:

- ``possible_agents`` keeps PettingZoo's order (RLlib builds it from a ``set``, so its order
  changes with the string hash seed from one process to the next);
- an episode that ends with some agents terminated and others truncated ends with
  ``terminateds["__all__"]`` (RLlib sets neither ``"__all__"`` flag, so the episode never
  ends); ``truncateds["__all__"]`` is true only when every agent was truncated;
- ``agents`` follows the PettingZoo env's live agents; reset infos are per agent;
- ``render()`` calls PettingZoo's ``render()`` (RLlib passes it a ``render_mode`` argument
  that PettingZoo's ``render`` does not take).

PettingZoo is imported by neither module: any object with PettingZoo's AEC or parallel API
works.
"""

from __future__ import annotations

from typing import Any

from fastrollout.env.multi_agent_env import ALL, MultiAgentDict, MultiAgentEnv

__all__ = ["ParallelPettingZooEnv", "PettingZooEnv"]


def _done_flags(
    over: bool, terminateds: MultiAgentDict, truncateds: MultiAgentDict
) -> tuple[bool, bool]:
    """``(terminated __all__, truncated __all__)`` once no agent is left."""
    if not over:
        return False, False
    all_truncated = bool(truncateds) and all(
        bool(truncateds.get(a)) and not bool(terminateds.get(a)) for a in truncateds
    )
    return not all_truncated, all_truncated


class _PettingZooBase(MultiAgentEnv):
    def __init__(self, env: Any) -> None:
        super().__init__()
        possible = getattr(env, "possible_agents", None)
        if not possible:
            # Some envs only know their agents after a reset.
            env.reset()
            possible = env.agents
        self.possible_agents = list(possible)
        self.agents = list(getattr(env, "agents", None) or possible)
        self.observation_spaces = {a: env.observation_space(a) for a in self.possible_agents}
        self.action_spaces = {a: env.action_space(a) for a in self.possible_agents}
        self.render_mode = getattr(env, "render_mode", None)

    def render(self) -> Any:
        """Renders the wrapped PettingZoo env.

        Returns:
            Whatever PettingZoo's ``render()`` returns (e.g. an RGB array).
        """
        return self._pz.render()

    def close(self) -> None:
        """Closes the wrapped PettingZoo env."""
        self._pz.close()

    @property
    def _pz(self) -> Any:
        raise NotImplementedError

    def get_sub_environments(self) -> Any:
        """Returns the wrapped PettingZoo env without its wrappers.

        Returns:
            ``env.unwrapped``.
        """
        return self._pz.unwrapped


class PettingZooEnv(_PettingZooBase):
    """A PettingZoo AEC (turn-based) env as a ``MultiAgentEnv``: only the agent to move observes.

    Each ``step`` takes the action of the agent to move (``env.agent_selection``), then
    returns the observation of the next agent to move, together with that agent's reward
    accumulated since it last acted (PettingZoo's ``last()``). Agents that are done when
    their turn comes are stepped with ``None`` (as PettingZoo requires) and their last
    observation, reward and flags are returned in the same step, so every agent's rewards
    add up exactly to what PettingZoo gave it.

    Args:
        env: A PettingZoo ``AECEnv``.

    Attributes:
        env: The wrapped AEC env.
    """

    def __init__(self, env: Any) -> None:
        self.env = env
        super().__init__(env)

    @property
    def _pz(self) -> Any:
        return self.env

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[MultiAgentDict, MultiAgentDict]:
        """Resets the AEC env and returns the first mover's observation.

        Args:
            seed: Passed to the PettingZoo env's ``reset``.
            options: Passed to the PettingZoo env's ``reset``.

        Returns:
            ``({mover: obs}, {mover: info})``.
        """
        self.env.reset(seed=seed, options=options)
        self.agents = list(self.env.agents)
        mover = self.env.agent_selection
        return {mover: self.env.observe(mover)}, {mover: dict(self.env.infos.get(mover, {}))}

    def step(  # type: ignore[override]
        self, action_dict: MultiAgentDict
    ) -> tuple[MultiAgentDict, MultiAgentDict, MultiAgentDict, MultiAgentDict, MultiAgentDict]:
        """Applies the mover's action and advances to the next live mover.

        Args:
            action_dict: ``{mover: action}``, the agent whose turn it is.

        Returns:
            ``(obs, rewards, terminateds, truncateds, infos)`` for the agents whose turn
            came (the done ones and the next mover), plus ``"__all__"``.

        Raises:
            ValueError: ``action_dict`` does not hold exactly an action for the mover.
        """
        mover = self.env.agent_selection
        if set(action_dict) != {mover}:
            raise ValueError(
                f"PettingZooEnv: it is the turn of agent {mover!r}; step() needs an action for "
                f"it alone, got actions for {list(action_dict)}"
            )
        self.env.step(action_dict[mover])
        obs: MultiAgentDict = {}
        rewards: MultiAgentDict = {}
        terminateds: MultiAgentDict = {}
        truncateds: MultiAgentDict = {}
        infos: MultiAgentDict = {}
        while self.env.agents:
            agent = self.env.agent_selection
            o, r, term, trunc, info = self.env.last()
            if agent in obs:
                # The same agent's turn again before any live mover (a done agent PettingZoo
                # did not remove): report its data once and stop.
                break
            obs[agent], rewards[agent], infos[agent] = o, r, info
            terminateds[agent], truncateds[agent] = bool(term), bool(trunc)
            if term or trunc:
                self.env.step(None)
            else:
                break
        self.agents = list(self.env.agents)
        terminateds[ALL], truncateds[ALL] = _done_flags(
            not self.env.agents, terminateds, truncateds
        )
        return obs, rewards, terminateds, truncateds, infos


class ParallelPettingZooEnv(_PettingZooBase):
    """A PettingZoo parallel env (all live agents act each step) as a ``MultiAgentEnv``.

    Args:
        env: A PettingZoo ``ParallelEnv``.

    Attributes:
        par_env: The wrapped parallel env.
    """

    def __init__(self, env: Any) -> None:
        self.par_env = env
        super().__init__(env)

    @property
    def _pz(self) -> Any:
        return self.par_env

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[MultiAgentDict, MultiAgentDict]:
        """Resets the parallel env.

        Args:
            seed: Passed to the PettingZoo env's ``reset``.
            options: Passed to the PettingZoo env's ``reset``.

        Returns:
            ``(obs, infos)`` keyed by agent.
        """
        obs, infos = self.par_env.reset(seed=seed, options=options)
        self.agents = list(self.par_env.agents)
        return dict(obs), dict(infos or {})

    def step(  # type: ignore[override]
        self, action_dict: MultiAgentDict
    ) -> tuple[MultiAgentDict, MultiAgentDict, MultiAgentDict, MultiAgentDict, MultiAgentDict]:
        """Steps all live agents.

        Args:
            action_dict: Agent -> action for the live agents.

        Returns:
            PettingZoo's five dicts (copied), with ``"__all__"`` added to the flags: the
            episode is over once the env has no live agent left.
        """
        obs, rewards, terminateds, truncateds, infos = self.par_env.step(action_dict)
        # Copies: the env may keep and reuse its dicts.
        terminateds = {a: bool(v) for a, v in terminateds.items()}
        truncateds = {a: bool(v) for a, v in truncateds.items()}
        self.agents = list(self.par_env.agents)
        terminateds[ALL], truncateds[ALL] = _done_flags(
            not self.par_env.agents, terminateds, truncateds
        )
        return dict(obs), dict(rewards), terminateds, truncateds, dict(infos)
