"""Type stubs for the native module ``fastrollout._core`` (hand-written, checked by stubtest)."""

from typing import Any, final

__all__ = ["EpisodeStateError", "SingleAgentBuffers", "SpaceMismatchError", "__version__"]

__version__: str

class EpisodeStateError(AssertionError):
    """An episode operation that its state does not allow."""

class SpaceMismatchError(ValueError):
    """A value that does not fit its space."""

@final
class SingleAgentBuffers:
    """Native buffers of one single-agent episode."""

    t: int
    t_started: int
    is_terminated: bool
    is_truncated: bool

    def __new__(
        cls, observation_space: Any = None, action_space: Any = None
    ) -> SingleAgentBuffers: ...
    def set_space(self, field: str, space: Any) -> None: ...
    def add_reset(self, observation: Any, infos: Any) -> None: ...
    def add_step(
        self,
        observation: Any,
        action: Any,
        reward: Any,
        infos: Any,
        terminated: bool,
        truncated: bool,
        extra_model_outputs: dict[str, Any] | None = None,
    ) -> None: ...
    def extend(self, field: str, data: Any, key: str | None = None) -> None: ...
    def set_lookback(self, field: str, lookback: int, key: str | None = None) -> None: ...
    def lookback(self, field: str, key: str | None = None) -> int: ...
    def field_len(self, field: str, key: str | None = None) -> int: ...
    def is_finalized(self, field: str, key: str | None = None) -> bool: ...
    def extra_keys(self) -> list[str]: ...
    def validate(self) -> None: ...
    def to_numpy(self) -> None: ...
    def get_return(self) -> Any: ...
    def cut(self, len_lookback_buffer: int) -> SingleAgentBuffers: ...
    def slice(
        self,
        start: int | None,
        stop: int | None,
        step: int | None,
        len_lookback_buffer: int | None = None,
    ) -> SingleAgentBuffers: ...
    def concat(self, other: SingleAgentBuffers) -> None: ...
    def copy(self) -> SingleAgentBuffers: ...
    def get(
        self,
        field: str,
        key: str | None = None,
        indices: Any = None,
        neg_index_as_lookback: bool = False,
        fill: Any = None,
        one_hot_discrete: bool = False,
    ) -> Any: ...
    def set(
        self,
        field: str,
        new_data: Any,
        key: str | None = None,
        at_indices: Any = None,
        neg_index_as_lookback: bool = False,
    ) -> None: ...
