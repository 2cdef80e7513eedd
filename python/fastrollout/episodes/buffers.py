"""Live views of a SingleAgentEpisode's fields with RLlib's ``InfiniteLookbackBuffer`` API.

RLlib's own code reads episodes' buffers directly: its replay buffers index
``episode.observations[...]``, ``episode.actions[...]`` and ``episode.rewards[...]`` and set
``episode.extra_model_outputs[key]``; its learner connectors iterate
``episode.extra_model_outputs.keys()`` and append to / pop from the buffers. In fastrollout
the data lives in native columns; these views give that code what it reads, through the
episode's native reads (one call per access, only the requested items copied out) and
writes (in place, in the column).

A view holds no data: it reads the episode as it is at the time of each access.
"""

from __future__ import annotations

import builtins
import sys
from collections.abc import Iterator, Mapping, MutableMapping
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np

from fastrollout.core.spaces import space_to_dict

if TYPE_CHECKING:
    from fastrollout.episodes.single_agent_episode import SingleAgentEpisode

# The space RLlib gives every episode's rewards buffer but a slice's.
REWARDS_SPACE = gym.spaces.Box(float("-inf"), float("inf"), (), np.float32)


def space_state(space: gym.Space | None) -> Any:
    """A space as RLlib's buffer states hold it.

    Returns:
        The space in RLlib's ``gym_space_to_dict`` form
        (:func:`fastrollout.core.spaces.space_to_dict`) where RLlib is loaded in this
        process, else the space itself (None for None).
    """
    if space is None:
        return None
    # RLlib's from_state needs the dict form; elsewhere the space object costs nothing to
    # keep, and fastrollout's from_state takes both forms.
    if "ray.rllib" not in sys.modules:
        return space
    return space_to_dict(space)


def _same_data(a: Any, b: Any) -> bool:
    """Whether two buffers' data (lists, arrays, or dicts/tuples of them) are equal."""
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(_same_data(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_same_data(x, y) for x, y in zip(a, b, strict=True))
    try:
        return bool(np.array_equal(a, b))
    except (TypeError, ValueError):
        return bool(a == b)


class LookbackBufferView:
    """One field of a SingleAgentEpisode as RLlib's ``InfiniteLookbackBuffer``.

    ``len``, indexing (ints, lists and slices; non-negative indices from the chunk start,
    negative ones from the end, look-back included, as ``InfiniteLookbackBuffer``'s
    ``__getitem__``), ``get``/``set`` with RLlib's arguments, ``data``, ``lookback``,
    ``finalized``, ``space``, ``get_state``, ``append``, ``extend`` and ``pop``.

    Reads and writes go to the episode's native columns (a write changes the episode).

    Args:
        episode: The episode.
        field: ``"observations"``, ``"infos"``, ``"actions"``, ``"rewards"`` or
            ``"extra_model_outputs"``.
        key: The extra model output's key (only for ``"extra_model_outputs"``).

    Examples:
        >>> from fastrollout import SingleAgentEpisode
        >>> ep = SingleAgentEpisode(observations=[0, 1, 2], actions=[5, 6], rewards=[1.0, 2.0],
        ...                         len_lookback_buffer=1)
        >>> ep.actions[-1], ep.actions[:], len(ep.actions), ep.actions.lookback
        (6, [6], 1, 1)
    """

    __slots__ = ("_episode", "_field", "_key")

    def __init__(self, episode: SingleAgentEpisode, field: str, key: str | None = None) -> None:
        self._episode = episode
        self._field = field
        self._key = key

    # ------------------------------------------------------------------ geometry

    def __len__(self) -> int:
        """Items after the look-back."""
        return self._episode._field_len(self._field, self._key)

    def len_incl_lookback(self) -> int:
        """Items stored, look-back included."""
        return self.lookback + len(self)

    @property
    def lookback(self) -> int:
        """How many of the stored items are look-back."""
        return self._episode._lookback(self._field, self._key)

    @lookback.setter
    def lookback(self, value: int) -> None:
        self._episode._set_lookback(self._field, int(value), key=self._key)

    @property
    def finalized(self) -> bool:
        """Whether reads return batched numpy arrays (after ``to_numpy``, or built from arrays)."""
        return self._episode._is_finalized(self._field, self._key)

    @property
    def space(self) -> gym.Space | None:
        """The field's space as RLlib's buffer has it.

        The episode's observation or action space, RLlib's float32 reward space (not in
        slices, as in RLlib), else None.
        """
        if self._field == "observations":
            return self._episode.observation_space
        if self._field == "actions":
            return self._episode.action_space
        if self._field == "rewards" and self._episode._rewards_have_space():
            return REWARDS_SPACE
        return None

    # ------------------------------------------------------------------ reads

    @property
    def data(self) -> Any:
        """All stored items, look-back included: a list, or (``finalized``) a batch.

        A copy: changing it does not change the episode (use ``set`` or ``view[i] = x``).
        """
        lookback = self.lookback
        return self._episode._get(self._field, self._key, slice(-lookback, None), True, None, False)

    def get(
        self,
        indices: int | list[int] | builtins.slice | None = None,
        *,
        neg_index_as_lookback: bool = False,
        fill: Any = None,
        one_hot_discrete: bool = False,
        _ignore_last_ts: bool = False,
        _add_last_ts_value: Any = None,
    ) -> Any:
        """Reads items with RLlib's index semantics (see ``SingleAgentEpisode.get_*``).

        Args:
            indices: None (the chunk), an int, a list of ints or a slice.
            neg_index_as_lookback: Negative indices count back from the chunk start.
            fill: Value for positions outside the stored items.
            one_hot_discrete: One-hot encode discrete parts (needs a space).
            _ignore_last_ts: Read as if the last stored item were not there.
            _add_last_ts_value: Read as if this item followed the stored ones.

        Returns:
            One item, or a list (a batch once ``finalized``).

        Raises:
            IndexError: For an int index outside the stored items without ``fill``.
            KeyError: If the extra model output is no longer in the episode.
        """
        if _ignore_last_ts or _add_last_ts_value is not None:
            return self._episode._get_ext(
                self._field,
                self._key,
                indices,
                neg_index_as_lookback,
                fill,
                one_hot_discrete,
                _add_last_ts_value,
                _ignore_last_ts,
            )
        return self._episode._get(
            self._field, self._key, indices, neg_index_as_lookback, fill, one_hot_discrete
        )

    def __getitem__(self, item: int | list[int] | builtins.slice) -> Any:
        """``view[i]``, ``view[[i, j]]``, ``view[a:b]``: ``view.get(item)``."""
        return self.get(item)

    def __iter__(self) -> Iterator[Any]:
        """The chunk's items, one by one (as iterating RLlib's buffer does)."""
        for i in range(len(self)):
            yield self.get(i)

    def __repr__(self) -> str:
        lookback = self.lookback
        before = self.get(slice(-lookback, 0), neg_index_as_lookback=True) if lookback else []
        return f"{type(self).__name__}({before} <- lookback({lookback}) | {self.get()})"

    def __eq__(self, other: object) -> bool:
        """Equal to a view or RLlib buffer with equal data, look-back, finalized and space."""
        if not all(hasattr(other, a) for a in ("data", "lookback", "finalized", "space")):
            return NotImplemented
        theirs: Any = other
        return (
            self.lookback == theirs.lookback
            and self.finalized == theirs.finalized
            and self.space == theirs.space
            and _same_data(self.data, theirs.data)
        )

    __hash__ = None  # type: ignore[assignment]  # mutable, compared by value

    def get_state(self) -> dict[str, Any]:
        """The view as RLlib's ``InfiniteLookbackBuffer.get_state()`` has a buffer.

        Returns:
            ``data`` (all items, look-back included), ``lookback``, ``finalized`` and
            ``space`` (as RLlib's ``gym_space_to_dict`` gives it, where RLlib is installed;
            the space otherwise), so that ``InfiniteLookbackBuffer.from_state`` builds an
            equal buffer.
        """
        return {
            "data": self.data,
            "lookback": self.lookback,
            "finalized": self.finalized,
            "space": space_state(self.space),
        }

    # ------------------------------------------------------------------ writes

    def set(
        self,
        new_data: Any,
        *,
        at_indices: int | list[int] | builtins.slice | None = None,
        neg_index_as_lookback: bool = False,
    ) -> None:
        """Overwrites items in place (RLlib's ``set``; see ``SingleAgentEpisode.set_*``).

        Args:
            new_data: One item (int index), or one per selected position.
            at_indices: None (the chunk), an int, a list of ints or a slice.
            neg_index_as_lookback: Negative indices count back from the chunk start.

        Raises:
            IndexError: For an index outside the stored items, or a number of items that
                does not match the selection. Nothing changes then.
            SpaceMismatchError: For a value that does not fit the field's space.
        """
        self._episode._set(self._field, new_data, self._key, at_indices, neg_index_as_lookback)

    def __setitem__(self, item: int | list[int] | builtins.slice, value: Any) -> None:
        """``view[i] = x``: ``view.set(x, at_indices=i)``."""
        self.set(value, at_indices=item)

    def append(self, item: Any) -> None:
        """Appends one item after the stored ones, as RLlib's ``append``.

        The episode's counters do not change: ``validate`` tells whether the fields fit.

        Raises:
            SpaceMismatchError: If the item does not fit the field's space.
        """
        self._episode._extend(self._field, [item], key=self._key)

    def extend(self, items: Any) -> None:
        """Appends the items of a list, or of a batch (items on its first axis).

        Raises:
            SpaceMismatchError: If an item does not fit the field's space.
        """
        if not isinstance(items, list) and not self.finalized:
            items = list(items)
        stored = self.len_incl_lookback()
        try:
            self._episode._extend(self._field, items, key=self._key)
        except BaseException:
            # All or nothing: the items appended before the one that failed go again.
            while self.len_incl_lookback() > stored:
                self.pop()
            raise

    def pop(self, index: int = -1) -> None:
        """Removes an item without returning it, as RLlib's ``pop``.

        Args:
            index: Position among all stored items, look-back included (negative: from
                the end).

        Raises:
            IndexError: If there is no such item.
        """
        self._episode._pop(self._field, index, key=self._key)


class ExtraModelOutputsView(MutableMapping[str, LookbackBufferView]):
    """A SingleAgentEpisode's extra model outputs as RLlib's dict of buffers.

    Key -> :class:`LookbackBufferView`, in the order the keys first appeared.

    Setting a key takes an RLlib ``InfiniteLookbackBuffer`` (or a view: its data and
    look-back are copied), or a list or array of items without look-back; the items after
    the look-back must be one per step of the episode.

    Args:
        episode: The episode.
    """

    __slots__ = ("_episode",)

    def __init__(self, episode: SingleAgentEpisode) -> None:
        self._episode = episode

    def __getitem__(self, key: str) -> LookbackBufferView:
        if key not in self:
            raise KeyError(key)
        return LookbackBufferView(self._episode, "extra_model_outputs", key)

    def __setitem__(self, key: str, value: Any) -> None:
        """Makes ``value`` the extra model output ``key`` (replacing one that is there).

        Raises:
            TypeError: If ``key`` is not a string.
            EpisodeStateError: If ``value`` holds a number of items (after its look-back)
                other than the episode's steps. Nothing changes then.
        """
        if not isinstance(key, str):
            raise TypeError(f"extra model output keys are strings, not {key!r}")
        if isinstance(value, LookbackBufferView) and (value._episode, value._key) == (
            self._episode,
            key,
        ):
            return
        if hasattr(value, "data") and hasattr(value, "lookback"):
            data, lookback = value.data, int(value.lookback)
        else:
            data, lookback = value, 0
        self._episode._put_extra(key, data, lookback)

    def __delitem__(self, key: str) -> None:
        self._episode._del_extra(key)

    def __contains__(self, key: object) -> bool:
        return key in self._episode._extra_keys()

    def __iter__(self) -> Iterator[str]:
        return iter(self._episode._extra_keys())

    def __len__(self) -> int:
        return len(self._episode._extra_keys())

    def copy(self) -> dict[str, LookbackBufferView]:
        """A dict of the current keys' views (as ``dict.copy``)."""
        return dict(self.items())

    def __repr__(self) -> str:
        return repr(dict(self.items()))


__all__ = ["REWARDS_SPACE", "ExtraModelOutputsView", "LookbackBufferView"]
