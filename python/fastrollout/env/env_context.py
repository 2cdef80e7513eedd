"""``EnvContext``: an env config dict that also says where the env runs."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

__all__ = ["EnvContext"]


class EnvContext(dict):  # type: ignore[type-arg]
    """The config dict an env creator receives, plus the env's place in the runner set.

    It is a plain ``dict`` of the user's ``env_config`` (so ``gymnasium.make(id, **ctx)``
    and ``ctx["key"]`` work), with attributes that let a creator configure each copy
    differently, e.g. read a different data file per ``worker_index``.

    Attributes:
        worker_index: Index of the env runner that holds the env: 0 for the local runner,
            1..n for remote ones.
        vector_index: Index of the sub-env inside its runner's vector of envs (0..N-1).
            Unlike RLlib 2.60's new-stack runners, which hand every sub-env the same
            context with ``vector_index=0``, fastrollout's creators set it per sub-env.
        num_workers: Number of remote env runners (0 when only a local one exists).
        remote: Whether sub-envs run as Ray actors.
        recreated_worker: Whether the runner replaced a failed one.

    >>> ctx = EnvContext({"size": 3}, worker_index=1, vector_index=2, num_workers=4)
    >>> ctx["size"], ctx.worker_index, ctx.vector_index
    (3, 1, 2)
    """

    def __init__(
        self,
        env_config: Mapping[str, Any] | None = None,
        worker_index: int = 0,
        vector_index: int = 0,
        remote: bool = False,
        num_workers: int | None = None,
        recreated_worker: bool = False,
    ) -> None:
        super().__init__(env_config if env_config is not None else {})
        self.worker_index = worker_index
        self.vector_index = vector_index
        self.remote = remote
        self.num_workers = num_workers
        self.recreated_worker = recreated_worker

    def copy_with_overrides(
        self,
        env_config: Mapping[str, Any] | None = None,
        worker_index: int | None = None,
        vector_index: int | None = None,
        remote: bool | None = None,
        num_workers: int | None = None,
        recreated_worker: bool | None = None,
    ) -> EnvContext:
        """Returns a copy with the given fields replaced.

        Args:
            env_config: A new config dict (deep-copied); None keeps this one's items.
            worker_index: A new worker index; None keeps this one's.
            vector_index: A new vector index; None keeps this one's.
            remote: A new remote flag; None keeps this one's.
            num_workers: A new number of workers; None keeps this one's.
            recreated_worker: A new recreated flag; None keeps this one's.

        Returns:
            A new ``EnvContext``; ``self`` is unchanged.
        """
        return EnvContext(
            copy.deepcopy(dict(env_config)) if env_config is not None else dict(self),
            worker_index=self.worker_index if worker_index is None else worker_index,
            vector_index=self.vector_index if vector_index is None else vector_index,
            remote=self.remote if remote is None else remote,
            num_workers=self.num_workers if num_workers is None else num_workers,
            recreated_worker=(
                self.recreated_worker if recreated_worker is None else recreated_worker
            ),
        )

    def set_defaults(self, defaults: Mapping[str, Any]) -> None:
        """Adds the items of ``defaults`` whose keys are not set yet.

        Args:
            defaults: Keys and values to add where missing; existing keys keep their values.
        """
        for key, value in defaults.items():
            self.setdefault(key, value)

    def __reduce__(self) -> tuple[Any, ...]:
        # Rebuild through __init__ so the attributes survive pickling (async sub-env
        # processes receive the context this way).
        return (
            EnvContext,
            (
                dict(self),
                self.worker_index,
                self.vector_index,
                self.remote,
                self.num_workers,
                self.recreated_worker,
            ),
        )

    def __repr__(self) -> str:
        return (
            f"EnvContext({dict.__repr__(self)}, worker_index={self.worker_index}, "
            f"vector_index={self.vector_index}, num_workers={self.num_workers}, "
            f"remote={self.remote})"
        )

    def __str__(self) -> str:
        return self.__repr__()
