"""Connector pipelines: ordered lists of pieces that are themselves connectors."""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping, Sequence
from typing import Any

from fastrollout.connectors.connector_v2 import ConnectorV2
from fastrollout.connectors.env_to_module.numpy_to_tensor import NumpyToTensor
from fastrollout.connectors.module_to_env.get_actions import GetActions, add_actions
from fastrollout.connectors.module_to_env.normalize_and_clip_actions import (
    NormalizeAndClipActions,
)
from fastrollout.connectors.module_to_env.tensor_to_numpy import TensorToNumpy, to_numpy
from fastrollout.core import Columns

__all__ = ["ConnectorPipelineV2", "EnvToModulePipeline", "ModuleToEnvPipeline"]


class ConnectorPipelineV2(ConnectorV2):
    """Runs its pieces in order, each on the batch the previous one returned.

    Pieces are found by index, by name (class name) or by class for editing
    (``insert_before``, ``insert_after``, ``remove``, ``[...]``). The output spaces of
    piece ``i`` are the input spaces of piece ``i + 1``; they are recomputed after every
    edit, and an edit after which a piece cannot take its input space is undone (the
    error is raised, the pipeline is as before).

    Args:
        input_observation_space: The observation space(s) of the first piece.
        input_action_space: The action space(s) of the first piece.
        connectors: The pieces.
        **kwargs: Passed to ``ConnectorV2``.

    Raises:
        TypeError: If a piece is not a ConnectorV2.
    """

    def __init__(
        self,
        input_observation_space: Any = None,
        input_action_space: Any = None,
        *,
        connectors: Sequence[ConnectorV2] | None = None,
        **kwargs: Any,
    ) -> None:
        self.connectors: list[ConnectorV2] = []
        for c in connectors or ():
            self._check(c)
            self.connectors.append(c)
        super().__init__(input_observation_space, input_action_space, **kwargs)

    def __call__(
        self,
        *,
        rl_module: Any,
        batch: dict[Any, Any] | None = None,
        episodes: Sequence[Any] = (),
        explore: bool | None = None,
        shared_data: dict[str, Any] | None = None,
        metrics: Any = None,
        **kwargs: Any,
    ) -> dict[Any, Any]:
        """Runs every piece.

        Args:
            rl_module: The MultiRLModule.
            batch: ``{module_id: {column: value}}`` (None: an empty dict).
            episodes: The runner's episodes.
            explore: Whether the runner explores.
            shared_data: Shared by the pieces of this call (a fresh dict if None).
            metrics: The runner's MetricsLogger (or None).
            **kwargs: Passed to every piece.

        Returns:
            The batch the last piece returned.
        """
        out: dict[Any, Any] = {} if batch is None else batch
        shared = {} if shared_data is None else shared_data
        return self._run(
            self.connectors,
            dict(
                rl_module=rl_module,
                episodes=episodes,
                explore=explore,
                shared_data=shared,
                metrics=metrics,
                **kwargs,
            ),
            out,
        )

    def _run(
        self, pieces: Sequence[ConnectorV2], call: dict[str, Any], batch: dict[Any, Any]
    ) -> dict[Any, Any]:
        """Runs ``pieces`` in order on ``batch``, each called with ``call`` as keywords."""
        for piece in pieces:
            batch = piece(batch=batch, **call)
        return batch

    # -- editing ----------------------------------------------------------------------

    @staticmethod
    def _check(connector: Any) -> None:
        if not isinstance(connector, ConnectorV2):
            raise TypeError(f"pipeline pieces must be ConnectorV2, got {type(connector).__name__}")

    def _index(self, name_or_class: str | type | int) -> int:
        if isinstance(name_or_class, int):
            if not -len(self.connectors) <= name_or_class < len(self.connectors):
                raise IndexError(f"no piece at index {name_or_class} ({len(self)} pieces)")
            return name_or_class % len(self.connectors)
        for i, c in enumerate(self.connectors):
            if (isinstance(name_or_class, str) and c.name == name_or_class) or (
                isinstance(name_or_class, type) and isinstance(c, name_or_class)
            ):
                return i
        label = name_or_class if isinstance(name_or_class, str) else name_or_class.__name__
        raise ValueError(f"no piece {label!r} in the pipeline {[c.name for c in self.connectors]}")

    def _apply(self, new_connectors: list[ConnectorV2]) -> None:
        """Swaps in an edited piece list; restores the old one if the spaces do not fit."""
        old = self.connectors
        self.connectors = new_connectors
        try:
            self._recompute_spaces()
        except Exception:
            self.connectors = old
            self._recompute_spaces()
            raise

    def prepend(self, connector: ConnectorV2) -> None:
        """Puts a piece first.

        Args:
            connector: The piece.
        """
        self._check(connector)
        self._apply([connector, *self.connectors])

    def append(self, connector: ConnectorV2) -> None:
        """Puts a piece last.

        Args:
            connector: The piece.
        """
        self._check(connector)
        self._apply([*self.connectors, connector])

    def insert_before(self, name_or_class: str | type | int, connector: ConnectorV2) -> ConnectorV2:
        """Inserts a piece before the first one matching ``name_or_class``.

        Args:
            name_or_class: A piece's name, class (subclasses match) or index.
            connector: The piece to insert.

        Returns:
            The piece it was inserted before.

        Raises:
            ValueError: If no piece matches.
        """
        return self._insert(name_or_class, connector, after=False)

    def insert_after(self, name_or_class: str | type | int, connector: ConnectorV2) -> ConnectorV2:
        """Inserts a piece after the first one matching ``name_or_class``.

        Args:
            name_or_class: A piece's name, class (subclasses match) or index.
            connector: The piece to insert.

        Returns:
            The piece it was inserted after.

        Raises:
            ValueError: If no piece matches.
        """
        return self._insert(name_or_class, connector, after=True)

    def _insert(
        self, name_or_class: str | type | int, connector: ConnectorV2, *, after: bool
    ) -> ConnectorV2:
        self._check(connector)
        i = self._index(name_or_class)
        anchor = self.connectors[i]
        at = i + 1 if after else i
        self._apply([*self.connectors[:at], connector, *self.connectors[at:]])
        return anchor

    def remove(self, name_or_class: str | type | int) -> ConnectorV2:
        """Removes the first piece matching ``name_or_class``.

        Args:
            name_or_class: A piece's name, class (subclasses match) or index.

        Returns:
            The removed piece.

        Raises:
            ValueError: If no piece matches.
        """
        i = self._index(name_or_class)
        removed = self.connectors[i]
        self._apply([*self.connectors[:i], *self.connectors[i + 1 :]])
        return removed

    def __getitem__(self, key: str | type | int) -> ConnectorV2:
        """The first piece matching a name, class or index.

        Args:
            key: A piece's name, class (subclasses match) or index.

        Returns:
            The piece.

        Raises:
            ValueError: If no piece matches a name or class.
            IndexError: If the index is out of range.
        """
        return self.connectors[self._index(key)]

    def __len__(self) -> int:
        return len(self.connectors)

    def __iter__(self) -> Iterator[ConnectorV2]:
        return iter(self.connectors)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(repr(c) for c in self.connectors)})"

    # -- spaces -----------------------------------------------------------------------

    def _recompute_spaces(self) -> None:
        obs, act = self._input_observation_space, self._input_action_space
        for piece in self.connectors:
            piece._input_observation_space = obs
            piece._input_action_space = act
            piece._recompute_spaces()
            obs = piece.observation_space if obs is not None else None
            act = piece.action_space if act is not None else None
        self._observation_space, self._action_space = obs, act

    # -- state ------------------------------------------------------------------------

    def _state_keys(self) -> list[str]:
        """Unique state keys: the piece names, with ``_1``, ``_2``... for repeats."""
        seen: dict[str, int] = {}
        keys = []
        for c in self.connectors:
            n = seen.get(c.name, 0)
            seen[c.name] = n + 1
            keys.append(c.name if n == 0 else f"{c.name}_{n}")
        return keys

    def get_state(
        self,
        components: str | Collection[str] | None = None,
        *,
        not_components: str | Collection[str] | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """The pieces' states keyed by piece name (stateless pieces left out).

        Args:
            components: Only these piece keys.
            not_components: Leave out these piece keys.
            **kwargs: Ignored.

        Returns:
            ``{piece key: piece state}``.
        """
        keep = {components} if isinstance(components, str) else components
        drop = {not_components} if isinstance(not_components, str) else not_components
        state = {}
        for key, piece in zip(self._state_keys(), self.connectors, strict=True):
            if (keep is not None and key not in keep) or (drop is not None and key in drop):
                continue
            piece_state = piece.get_state()
            if piece_state:
                state[key] = piece_state
        return state

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Restores the pieces named in ``state``.

        Args:
            state: ``{piece key: piece state}``.

        Raises:
            KeyError: If a key names no piece (checked before anything changes).
        """
        pieces = dict(zip(self._state_keys(), self.connectors, strict=True))
        unknown = [k for k in state if k not in pieces]
        if unknown:
            raise KeyError(f"state for unknown pipeline piece(s) {unknown}; have {list(pieces)}")
        for key, piece_state in state.items():
            pieces[key].set_state(piece_state)

    def merge_states(self, states: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """Merges pipeline states piece by piece.

        Args:
            states: States of copies of this pipeline.

        Returns:
            ``{piece key: merged piece state}``.
        """
        merged = {}
        for key, piece in zip(self._state_keys(), self.connectors, strict=True):
            parts = [s[key] for s in states if key in s]
            if parts:
                merged[key] = piece.merge_states(parts)
        return merged

    def reset_state(self) -> None:
        """Resets every piece's state."""
        for piece in self.connectors:
            piece.reset_state()


class EnvToModulePipeline(ConnectorPipelineV2):
    """The pipeline from the runner's gathered observations to the module's input.

    When it ends in the default piece (``NumpyToTensor``, this exact class), that piece's
    conversion runs directly after the pieces before it (the runners call this once per
    vector step; the piece's keyword call is about 1 µs of a CartPole step).
    """

    def only_converts(self) -> bool:
        """Whether a call does nothing but convert its batch.

        That is: every piece is a ``NumpyToTensor`` (this exact class) and the pipeline's
        class runs them as this one does. A caller that throws the output away then need
        not call it.

        Returns:
            True or False.
        """
        cls = type(self)
        return (
            cls.__call__ is ConnectorPipelineV2.__call__
            and cls._run is EnvToModulePipeline._run
            and all(type(piece) is NumpyToTensor for piece in self.connectors)
        )

    def convert_observations(
        self, rl_module: Any, observations: dict[Any, Any]
    ) -> dict[Any, Any] | None:
        """A call's output for observations, where the pipeline only converts; else None.

        That is what a call makes of ``{module_id: {Columns.OBS: observations}}`` where
        :meth:`only_converts` holds. Each piece's conversion of each module's one column
        is made directly (``NumpyToTensor.convert_leaf``), without the call and the batch
        dicts around it: the runners call this once per vector step (about 2.5 µs less in
        isolation, several times that in a loop that also copies big observations).

        Args:
            rl_module: The MultiRLModule (the modules' devices).
            observations: The observations batched per module.

        Returns:
            ``{module_id: {Columns.OBS: tensor}}``, or None where the caller must call
            the pipeline.

        Raises:
            TypeError: If a column cannot become a tensor (module and column named).
        """
        if not self.only_converts():
            return None
        out = {}
        for module_id, value in observations.items():
            for piece in self.connectors:
                assert isinstance(piece, NumpyToTensor)
                value = piece.convert_leaf(rl_module, module_id, Columns.OBS, value)
            out[module_id] = {Columns.OBS: value}
        return out

    def _run(
        self, pieces: Sequence[ConnectorV2], call: dict[str, Any], batch: dict[Any, Any]
    ) -> dict[Any, Any]:
        if not pieces or type(pieces[-1]) is not NumpyToTensor:
            return super()._run(pieces, call, batch)
        last = pieces[-1]
        assert isinstance(last, NumpyToTensor)
        return last.convert(call["rl_module"], super()._run(pieces[:-1], call, batch))


class ModuleToEnvPipeline(ConnectorPipelineV2):
    """The pipeline from the module's output to the actions sent to the env.

    When it ends in the default tail (``GetActions``, ``TensorToNumpy``,
    ``NormalizeAndClipActions``, these exact classes), the tail runs as one pass that
    gives the same batch: sampled actions and log-probabilities are made as numpy arrays
    directly instead of as tensors that ``TensorToNumpy`` converts next. The runners call
    this once per vector step; the three piece calls and the tensor round trip cost about
    6 µs of a CartPole step.
    """

    def _run(
        self, pieces: Sequence[ConnectorV2], call: dict[str, Any], batch: dict[Any, Any]
    ) -> dict[Any, Any]:
        if (
            len(pieces) < 3
            or type(pieces[-3]) is not GetActions
            or type(pieces[-2]) is not TensorToNumpy
            or type(pieces[-1]) is not NormalizeAndClipActions
        ):
            return super()._run(pieces, call, batch)
        out = super()._run(pieces[:-3], call, batch)
        rl_module = call["rl_module"]
        # The three pieces' loops, in their order (so an error leaves the batch as the
        # pieces would have).
        add_actions(rl_module, out, call["explore"], as_numpy=True)
        for module_id, module_out in out.items():
            out[module_id] = to_numpy(module_out)
        fit = pieces[-1]
        assert isinstance(fit, NormalizeAndClipActions)
        for module_id, module_out in out.items():
            fit.fit_module(rl_module, module_id, module_out)
        return out
