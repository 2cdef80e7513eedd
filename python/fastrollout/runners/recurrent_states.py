"""The live recurrent state of a runner's stateful modules, per sub-env (and agent).

RLlib's runners read a stateful module's next ``STATE_IN`` back from each episode (its
last ``STATE_OUT``, or the module's initial state at the episode's start), one episode at
a time. Here the runner keeps the live state beside the episodes instead: one array per
state leaf and module, a row per slot (a sub-env, or a sub-env's agent), gathered into the
module's one batched forward pass with a single fancy index. The episodes still record
``STATE_OUT`` per step in ``extra_model_outputs`` (RLlib's layout), so a cut chunk's
look-back holds the state its continuation starts from, as RLlib's learner connectors
expect.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from typing import Any

import numpy as np

from fastrollout.core import Columns
from fastrollout.core.tree import leaves, tree_map

__all__ = ["RecurrentStates", "is_stateful"]


def is_stateful(module: Any) -> bool:
    """Whether a module keeps a recurrent state (its ``is_stateful()``; False without one)."""
    fn = getattr(module, "is_stateful", None)
    return bool(fn()) if callable(fn) else False


def _to_numpy(x: Any) -> np.ndarray:
    """A tensor or array leaf as a numpy array (detached, on the host)."""
    if hasattr(x, "detach"):
        return x.detach().cpu().numpy()  # type: ignore[no-any-return]
    return np.asarray(x)


def _same_structure(template: Any, value: Any) -> Any:
    """``value`` with numpy leaves, if nested exactly as ``template`` (else raises)."""
    if isinstance(template, Mapping):
        if not isinstance(value, Mapping) or set(value) != set(template):
            raise ValueError("keys differ")
        return {k: _same_structure(t, value[k]) for k, t in template.items()}
    if isinstance(template, tuple):
        if not isinstance(value, (tuple, list)) or len(value) != len(template):
            raise ValueError("lengths differ")
        return tuple(_same_structure(t, v) for t, v in zip(template, value, strict=True))
    return _to_numpy(value)


def _describe(tree: Any) -> str:
    """The structure and leaf shapes of a state, for messages."""
    return str(tree_map(lambda x: tuple(np.shape(x)), tree))


class _ModuleStates:
    """One stateful module's states: row 0 is its initial state, row ``k`` a slot's.

    Args:
        module_id: The module's id (for messages).
        initial: Its initial state, without a batch axis.
    """

    def __init__(self, module_id: str, initial: Any) -> None:
        self.module_id = module_id
        self.initial = tree_map(_to_numpy, initial)
        if not list(leaves(self.initial)):
            raise ValueError(f"module {module_id!r} is stateful but its initial state is empty")
        self.buffers = tree_map(lambda x: np.array(x[None]), self.initial)
        self.rows: dict[Hashable, int] = {}
        self._free: list[int] = []
        self._size = 1

    def gather(self, slots: Iterable[Hashable]) -> Any:
        """The states of ``slots`` as a batch (a slot without one reads the initial state)."""
        rows = self.rows
        index = np.fromiter((rows.get(s, 0) for s in slots), np.int64)
        return tree_map(lambda b: b[index], self.buffers)

    def store(self, slots: list[Hashable], state_out: Any) -> None:
        """Keeps each slot's row of ``state_out`` (a batch laid out as the initial state).

        Raises:
            ValueError: If ``state_out``'s structure, row count or leaf shapes differ
                from the initial state's (nothing is stored then).
        """
        out = self.like_initial(state_out, len(slots), Columns.STATE_OUT)
        index = np.fromiter((self._row_of(s) for s in slots), np.int64, len(slots))

        def put(buffer: np.ndarray, rows: np.ndarray) -> None:
            buffer[index] = rows

        tree_map(put, self.buffers, out)

    def put(self, slot: Hashable, state: Any) -> Any:
        """Makes ``state`` (one state, no batch axis) the slot's state.

        Returns:
            The state with numpy leaves.

        Raises:
            ValueError: If its structure or a leaf's shape differs from the initial
                state's (nothing is stored then).
        """
        one = self.like_initial(state, None, Columns.STATE_OUT)
        self.store([slot], tree_map(lambda x: x[None], one))
        return one

    def like_initial(self, value: Any, n: int | None, key: str) -> Any:
        """``value`` as numpy leaves, checked to be laid out as the initial state.

        Args:
            value: A state, or a batch of states (dicts/tuples of tensors or arrays; lists
                where the state has tuples, as msgpack delivers them).
            n: The batch size it must have (None: one state, without a batch axis).
            key: Its column (``STATE_IN`` or ``STATE_OUT``), for the message.

        Returns:
            The value with numpy leaves.

        Raises:
            ValueError: Naming the module and the key, if the structure or a leaf's shape
                differs from the initial state's (with a batch axis of ``n``).
        """
        batch = () if n is None else (n,)
        try:
            out = _same_structure(self.initial, value)
        except (KeyError, TypeError, ValueError):
            out = None
        if out is None or any(
            x.shape != (*batch, *i.shape)
            for i, x in zip(leaves(self.initial), leaves(out), strict=True)
        ):
            what = "a state" if n is None else f"a batch of {n}"
            raise ValueError(
                f"module {self.module_id!r}: its {key!r} {_describe(value)} is not {what} of "
                f"its initial state {_describe(self.initial)} (leaf shapes shown)"
            )
        return out

    def _row_of(self, slot: Hashable) -> int:
        row = self.rows.get(slot)
        if row is not None:
            return row
        if self._free:
            row = self._free.pop()
        else:
            row = self._size
            self._size += 1
            if row >= len(next(iter(leaves(self.buffers)))):
                self.buffers = tree_map(
                    lambda b: np.concatenate([b, np.zeros_like(b[: max(1, len(b))])]),
                    self.buffers,
                )
        self.rows[slot] = row
        return row

    def drop(self, slots: Iterable[Hashable]) -> None:
        """Forgets slots: their next gather reads the initial state."""
        for s in slots:
            row = self.rows.pop(s, None)
            if row is not None:
                self._free.append(row)


class RecurrentStates:
    """The live states of a runner's stateful modules, keyed by slot.

    Single-agent runners use sub-env indices as slots; multi-agent runners use
    ``(sub-env index, agent id)``. Around each forward pass the runner calls
    :meth:`add_state_in` (the slots' states as ``STATE_IN``, and a time axis of one step on
    every other column, as RLlib's env-to-module connectors add them for stateful
    modules), :meth:`remove_time_axis` on the module's outputs, and :meth:`store` with the
    module-to-env pipeline's ``STATE_OUT``. A slot's state starts over (the module's
    initial state) after :meth:`drop`, which the runner calls for every new episode.

    Args:
        modules: Module id -> module; only the stateful ones are tracked.
    """

    def __init__(self, modules: Mapping[str, Any]) -> None:
        self._modules = {
            mid: _ModuleStates(mid, m.get_initial_state())
            for mid, m in modules.items()
            if is_stateful(m)
        }

    def __bool__(self) -> bool:
        return bool(self._modules)

    def __contains__(self, module_id: object) -> bool:
        return module_id in self._modules

    def state(self, module_id: str, slot: Hashable) -> Any:
        """A slot's current state (numpy, without a batch axis)."""
        return tree_map(lambda b: b[0], self._modules[module_id].gather([slot]))

    def add_state_in(self, batch: dict[str, Any], slots: Mapping[str, list[Any]]) -> None:
        """Puts ``STATE_IN`` into each stateful module's batch and a time axis on the rest.

        Args:
            batch: ``{module_id: {column: tensor}}``, changed in place.
            slots: Module id -> the slot of each row of its batch.

        Raises:
            ValueError: If a module's batch already holds a ``STATE_IN`` whose structure
                or batch size does not match its initial state (named by module and key).
        """
        import torch

        for mid, module_batch in batch.items():
            states = self._modules.get(mid)
            if states is None:
                continue
            rows = slots[mid]
            given = module_batch.get(Columns.STATE_IN)
            if given is not None:  # (a connector of the user's made it)
                states.like_initial(given, len(rows), Columns.STATE_IN)
            for k, v in list(module_batch.items()):
                if k != Columns.STATE_IN:
                    module_batch[k] = tree_map(_add_time_axis, v)
            if given is None:
                device = _device_of(module_batch)
                module_batch[Columns.STATE_IN] = tree_map(
                    lambda x, d=device: torch.from_numpy(x).to(d), states.gather(rows)
                )

    def remove_time_axis(self, outputs: dict[str, Any]) -> None:
        """Drops the one-step time axis from every output column but ``STATE_OUT``.

        Args:
            outputs: ``{module_id: {column: value}}``, the forward pass's, changed in place.
        """
        for mid, module_out in outputs.items():
            if mid not in self._modules:
                continue
            for k, v in list(module_out.items()):
                if k != Columns.STATE_OUT:
                    module_out[k] = tree_map(_drop_time_axis, v)

    def store(self, outputs: Mapping[str, Any], slots: Mapping[str, list[Any]]) -> None:
        """Keeps each stateful module's ``STATE_OUT`` rows as its slots' states.

        Args:
            outputs: ``{module_id: {column: value}}``, the module-to-env output.
            slots: Module id -> the slot of each row.

        Raises:
            ValueError: If a stateful module gave no ``STATE_OUT``, or one whose
                structure or batch size does not match its initial state.
        """
        for mid, states in self._modules.items():
            out = outputs.get(mid)
            if out is None:
                continue
            state_out = out.get(Columns.STATE_OUT)
            if state_out is None:
                raise ValueError(
                    f"module {mid!r} is stateful but its forward pass gave no "
                    f"{Columns.STATE_OUT!r} output"
                )
            states.store(list(slots[mid]), state_out)

    def set_state(self, module_id: str, slot: Hashable, state: Any) -> Any:
        """Makes a state given from outside the slot's next ``STATE_IN``.

        A simulator that took a step itself (``log_action`` with its own
        ``STATE_OUT``, as a local-inference policy client sends it) sets the state the
        episode records for that step, so the next step starts from it: the state a
        step records is always the one the next step reads, as RLlib's runners read it
        back from the episode.

        Args:
            module_id: A stateful module's id.
            slot: The slot.
            state: One state, nested as the module's initial state, without a batch
                axis (tensors, arrays, or lists where the initial state has tuples).

        Returns:
            The state with numpy leaves (to record).

        Raises:
            ValueError: Naming the module and the key, if its structure or a leaf's
                shape differs from the initial state's (nothing is stored then).
        """
        return self._modules[module_id].put(slot, state)

    def drop(self, slots: Iterable[Hashable]) -> None:
        """Starts slots over: their next forward pass reads the initial state."""
        slots = list(slots)
        for states in self._modules.values():
            states.drop(slots)

    def drop_where(self, match: Any) -> None:
        """Starts over every slot for which ``match(slot)`` is true (all modules)."""
        for states in self._modules.values():
            states.drop([s for s in states.rows if match(s)])


def _add_time_axis(x: Any) -> Any:
    return x.unsqueeze(1) if hasattr(x, "unsqueeze") else np.expand_dims(x, 1)


def _drop_time_axis(x: Any) -> Any:
    if getattr(x, "ndim", 0) >= 2 and x.shape[1] == 1:
        return x.squeeze(1) if hasattr(x, "unsqueeze") else x[:, 0]
    return x


def _device_of(module_batch: Mapping[str, Any]) -> Any:
    """The device of a batch's tensors (the CPU where it holds none)."""
    for v in module_batch.values():
        for leaf in leaves(v):
            device = getattr(leaf, "device", None)
            if device is not None:
                return device
    return "cpu"
