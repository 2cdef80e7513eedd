"""``ConnectorV2``: one piece of an env-to-module or module-to-env pipeline.

The batch contract (shared with the runners):

- ``batch`` is keyed by module id first: ``{module_id: {column: value}}``, also for a
  single-agent runner (module id ``DEFAULT_MODULE_ID``). Values are numpy arrays (or
  tensors after ``NumpyToTensor``) batched over the rows of that module: row ``i`` of
  every column belongs to the same agent in the same sub-env.
- ``rl_module`` is always a :class:`~fastrollout.modules.MultiRLModule`.
- ``episodes`` is the runner's list of ongoing episodes, one per sub-env (fastrollout
  ``SingleAgentEpisode`` or ``MultiAgentEpisode``), indexed by env index.
- ``shared_data["agent_rows"][module_id]`` is the list of ``(env_index, agent_id)`` of
  each row of that module's batch (``agent_id`` is ``None`` for single-agent runners).
  Connectors that need a row's episode look it up with :meth:`ConnectorV2.row_episodes`.
- ``explore`` says whether the runner explores (sampling) or acts greedily.

Pieces that work on whole module batches cost the same for 1 or 1000 agents; pieces that
read episode look-back (frame stacking, previous actions/rewards, the observation filter
that rewrites the episodes) visit one episode per row.
"""

from __future__ import annotations

import abc
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import gymnasium as gym

__all__ = ["ConnectorV2"]


def _episode_for(episodes: Sequence[Any], env_index: int, agent_id: Any) -> Any:
    try:
        episode = episodes[env_index]
    except IndexError:
        raise IndexError(
            f"agent_rows names env index {env_index}, but only {len(episodes)} episodes were passed"
        ) from None
    if agent_id is None:
        return episode
    try:
        return episode.agent_episodes[agent_id]
    except (AttributeError, KeyError):
        raise KeyError(
            f"agent_rows names agent {agent_id!r} of env index {env_index}, which its episode "
            "does not have"
        ) from None


class ConnectorV2(abc.ABC):
    """Base class of connector pieces (RLlib 2.60's ``ConnectorV2``).

    A piece transforms ``batch`` (and, for some, the episodes) and returns the batch.
    Pieces that change the observation or action space override
    ``recompute_output_observation_space`` / ``recompute_output_action_space``; the
    output spaces are then ``observation_space`` / ``action_space``.

    Spaces may be a single gym space (the same for every module) or a plain dict
    ``{module_id: space}``.

    Args:
        input_observation_space: The observation space(s) coming in.
        input_action_space: The action space(s) coming in.
        **kwargs: Ignored (forward compatibility, as RLlib's constructor).
    """

    def __init__(
        self,
        input_observation_space: Any = None,
        input_action_space: Any = None,
        **kwargs: Any,
    ) -> None:
        self._input_observation_space = input_observation_space
        self._input_action_space = input_action_space
        self._observation_space: Any = None
        self._action_space: Any = None
        self._recompute_spaces()

    @abc.abstractmethod
    def __call__(
        self,
        *,
        rl_module: Any,
        batch: dict[Any, Any],
        episodes: Sequence[Any],
        explore: bool | None = None,
        shared_data: dict[str, Any] | None = None,
        metrics: Any = None,
        **kwargs: Any,
    ) -> dict[Any, Any]:
        """Transforms the batch.

        Args:
            rl_module: The MultiRLModule.
            batch: ``{module_id: {column: value}}``.
            episodes: The runner's episodes, one per sub-env.
            explore: Whether the runner explores.
            shared_data: Data shared by the pieces of one call (``agent_rows``).
            metrics: The runner's MetricsLogger (or None).
            **kwargs: Forward compatibility.

        Returns:
            The batch (usually the same dict, changed in place).
        """

    # -- spaces ---------------------------------------------------------------------

    def recompute_output_observation_space(
        self, input_observation_space: gym.Space, input_action_space: gym.Space
    ) -> gym.Space:
        """The observation space this piece outputs for one module's input space.

        Args:
            input_observation_space: The module's incoming observation space.
            input_action_space: The module's incoming action space.

        Returns:
            The outgoing observation space (default: unchanged).
        """
        return input_observation_space

    def recompute_output_action_space(
        self, input_observation_space: gym.Space, input_action_space: gym.Space
    ) -> gym.Space:
        """The action space this piece outputs for one module's input spaces.

        Args:
            input_observation_space: The module's incoming observation space.
            input_action_space: The module's incoming action space.

        Returns:
            The outgoing action space (default: unchanged).
        """
        return input_action_space

    def _recompute_spaces(self) -> None:
        obs, act = self._input_observation_space, self._input_action_space
        if obs is None and act is None:
            self._observation_space, self._action_space = None, None
            return
        if _is_per_module(obs) or _is_per_module(act):
            ids = list(obs if _is_per_module(obs) else act)
            pairs = {mid: (self.space_for(obs, mid), self.space_for(act, mid)) for mid in ids}
            self._observation_space = {mid: self._out_obs(o, a) for mid, (o, a) in pairs.items()}
            self._action_space = {mid: self._out_act(o, a) for mid, (o, a) in pairs.items()}
        else:
            self._observation_space = self._out_obs(obs, act)
            self._action_space = self._out_act(obs, act)

    def _out_obs(self, obs: Any, act: Any) -> Any:
        return None if obs is None else self.recompute_output_observation_space(obs, act)

    def _out_act(self, obs: Any, act: Any) -> Any:
        return None if act is None else self.recompute_output_action_space(obs, act)

    @staticmethod
    def space_for(space: Any, module_id: Any) -> Any:
        """The space of one module from a single space or a ``{module_id: space}`` dict.

        Args:
            space: A gym space, a dict of them keyed by module id, or None.
            module_id: The module.

        Returns:
            The module's space, or None if there is none.
        """
        if _is_per_module(space):
            return space.get(module_id)
        return space

    @property
    def input_observation_space(self) -> Any:
        """The incoming observation space(s); setting it recomputes the outputs."""
        return self._input_observation_space

    @input_observation_space.setter
    def input_observation_space(self, value: Any) -> None:
        self._input_observation_space = value
        self._recompute_spaces()

    @property
    def input_action_space(self) -> Any:
        """The incoming action space(s); setting it recomputes the outputs."""
        return self._input_action_space

    @input_action_space.setter
    def input_action_space(self, value: Any) -> None:
        self._input_action_space = value
        self._recompute_spaces()

    @property
    def observation_space(self) -> Any:
        """The outgoing observation space(s)."""
        return self._observation_space

    @property
    def action_space(self) -> Any:
        """The outgoing action space(s)."""
        return self._action_space

    # -- episodes of batch rows ----------------------------------------------------

    @staticmethod
    def row_episodes(
        module_id: Any, episodes: Sequence[Any], shared_data: Mapping[str, Any] | None
    ) -> list[Any]:
        """The single-agent episode of every row of one module's batch.

        Args:
            module_id: The module.
            episodes: The runner's episodes, one per sub-env.
            shared_data: Must hold ``agent_rows[module_id]``.

        Returns:
            One SingleAgentEpisode per row (for multi-agent episodes, the agent's).

        Raises:
            KeyError: If ``shared_data`` has no ``agent_rows`` for the module, or a row
                names an agent its episode does not have.
            IndexError: If a row names an env index past ``episodes``.
        """
        try:
            rows = (shared_data or {})["agent_rows"][module_id]
        except (KeyError, TypeError):
            raise KeyError(
                "this connector reads episodes and needs shared_data['agent_rows']"
                f"[{module_id!r}]: the (env_index, agent_id) of each batch row"
            ) from None
        return [_episode_for(episodes, env_index, agent_id) for env_index, agent_id in rows]

    # -- state ----------------------------------------------------------------------

    def get_state(
        self,
        components: str | Collection[str] | None = None,
        *,
        not_components: str | Collection[str] | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """The piece's state (stateless pieces: ``{}``).

        Args:
            components: Unused by single pieces.
            not_components: Unused by single pieces.
            **kwargs: Ignored.

        Returns:
            A dict of plain data (numpy arrays, numbers).
        """
        return {}

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Restores the state from ``get_state`` (stateless pieces: no-op).

        Args:
            state: The state.
        """
        return

    def merge_states(self, states: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """Merges the states of copies of this piece (e.g. on several runners).

        Args:
            states: Their states.

        Returns:
            The merged state (stateless pieces: ``{}``).
        """
        return {}

    def reset_state(self) -> None:
        """Forgets accumulated state (stateless pieces: no-op)."""
        return

    @property
    def name(self) -> str:
        """The piece's name (its class name)."""
        return type(self).__name__

    def __repr__(self) -> str:
        return f"{self.name}()"


def _is_per_module(space: Any) -> bool:
    return isinstance(space, Mapping) and not isinstance(space, gym.Space)
