"""Type stubs for the native module ``fastrollout._core`` (hand-written, checked by stubtest)."""

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt
from typing_extensions import Self, disjoint_base, final

__all__ = [
    "AgentOutputs",
    "EpisodeStateError",
    "MetricsStore",
    "ModuleBatcher",
    "MultiAgentEpisodeCore",
    "SingleAgentEpisodeCore",
    "SpaceMismatchError",
    "StatsSnapshot",
    "StepMap",
    "__version__",
    "_forget_episode_ids",
    "categorical_draw",
    "gae_segments",
    "multi_agent_add_env_reset",
    "multi_agent_record_steps",
    "native_heap_bytes",
    "new_episode_id",
    "single_agent_record_vector_step",
    "wait_ready",
]
__version__: str

def categorical_draw(
    logits: npt.NDArray[np.float32], uniforms: npt.NDArray[np.float64]
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]: ...
def gae_segments(
    rewards: npt.NDArray[np.float32],
    values: npt.NDArray[np.float32],
    lengths: npt.NDArray[np.int64],
    bootstraps: npt.NDArray[np.float32],
    gamma: float,
    lambda_: float,
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
    """GAE over consecutive chunks: ``(advantages, value_targets)``, float32."""

def native_heap_bytes() -> int:
    """Bytes in the extension's live heap blocks (not in the C heap's statistics)."""

def new_episode_id() -> str:
    """A new random version-4 UUID as 32 hex digits (what ``uuid.uuid4().hex`` gives)."""

def _forget_episode_ids() -> None:
    """Forgets the drawn episode ids (a forked child draws its own)."""

def multi_agent_add_env_reset(
    episode: MultiAgentEpisodeCore,
    observations: dict[Any, Any],
    infos: dict[Any, Any] | None = None,
) -> None: ...

@disjoint_base
class MultiAgentEpisodeCore:
    """Native bookkeeping and ``add_env_step`` of ``fastrollout.MultiAgentEpisode``."""

    env_t: int
    env_t_started: int
    is_terminated: bool
    is_truncated: bool
    _len_lookback_buffers: int
    _start_time: float | None
    _last_step_time: float | None
    agent_episodes: dict[Any, Any]
    env_t_to_agent_t: dict[Any, StepMap]
    agent_t_started: dict[Any, int]
    _hanging_actions_end: dict[Any, Any]
    _hanging_extra_model_outputs_end: dict[Any, Any]
    _hanging_rewards_end: dict[Any, float]
    _hanging_rewards_begin: dict[Any, float]
    _dropped_agents: set[Any]
    _observation_compression: int | None

    def __new__(cls, *_args: Any, **_kwargs: Any) -> Self: ...
    @property
    def is_done(self) -> bool:
        """Whether the episode is terminated or truncated (``__all__``)."""

    def add_env_step(
        self,
        observations: dict[Any, Any],
        actions: dict[Any, Any],
        rewards: dict[Any, Any],
        infos: dict[Any, Any] | None = None,
        *,
        terminateds: dict[Any, Any] | None = None,
        truncateds: dict[Any, Any] | None = None,
        extra_model_outputs: dict[Any, Any] | None = None,
    ) -> None: ...
    def _concat_books(self, other: MultiAgentEpisodeCore, agents: list[Any]) -> None: ...
    def _cut_books(self, successor: MultiAgentEpisodeCore, lookback: int) -> bool: ...
    def _new_agent_episode(self, agent_id: Any) -> SingleAgentEpisodeCore: ...
    def _cut_simultaneous(self, requested: int) -> Self | None: ...
    def _blank_counters(self) -> None: ...
    def _agents_to_numpy(self) -> None: ...
    def _slice_books(
        self,
        sliced: MultiAgentEpisodeCore,
        start: int,
        stop: int,
        lookback: int,
        modules: dict[Any, Any],
    ) -> bool: ...

@final
class StepMap:
    """One agent's env-step -> agent-step map, with look-back ("S" where it did not step)."""

    lookback: int
    def __new__(cls, data: Any = None, lookback: int = 0) -> StepMap: ...
    @property
    def data(self) -> list[int | str]: ...
    def __len__(self) -> int: ...
    @staticmethod
    def _cut_lookback(requested: int, hanging: list[StepMap]) -> int: ...
    def append(self, value: int | str) -> None: ...
    def extend(self, values: Any) -> None: ...
    def get(
        self,
        indices: Any = None,
        *,
        neg_index_as_lookback: bool = False,
        fill: bool = False,
        ignore_last: bool = False,
    ) -> Any: ...
    def __getitem__(self, key: Any, /) -> Any: ...
    def copy(self) -> StepMap: ...
    def __reduce__(self) -> tuple[Any, tuple[list[int | str], int]]: ...
    def __eq__(self, other: object, /) -> bool: ...
    __hash__: ClassVar[None]  # type: ignore[assignment]

class EpisodeStateError(AssertionError):
    """An episode operation that its state does not allow."""

class SpaceMismatchError(ValueError):
    """A value that does not fit its space."""

@disjoint_base
class SingleAgentEpisodeCore:
    """Native data and per-step methods of ``fastrollout.SingleAgentEpisode``."""

    t: int
    t_started: int
    is_terminated: bool
    is_truncated: bool
    _start_time: float | None
    _last_step_time: float | None

    def __new__(cls, *_args: Any, **_kwargs: Any) -> Self: ...
    @property
    def is_done(self) -> bool: ...
    @property
    def is_reset(self) -> bool: ...
    @property
    def is_numpy(self) -> bool: ...
    def add_env_reset(self, observation: Any, infos: Any = None) -> None: ...
    def add_env_step(
        self,
        observation: Any,
        action: Any,
        reward: Any,
        infos: Any = None,
        *,
        terminated: bool = False,
        truncated: bool = False,
        extra_model_outputs: dict[str, Any] | None = None,
    ) -> None: ...
    def validate(self) -> None: ...
    def to_numpy(self) -> Self: ...
    def finalize(self) -> Self: ...
    def get_return(self) -> Any: ...
    def get_duration_s(self) -> float: ...
    def env_steps(self) -> int: ...
    def agent_steps(self) -> int: ...
    def __len__(self) -> int: ...
    def get_observations(
        self,
        indices: Any = None,
        *,
        neg_index_as_lookback: bool = False,
        fill: Any = None,
        one_hot_discrete: bool = False,
    ) -> Any: ...
    def get_infos(
        self, indices: Any = None, *, neg_index_as_lookback: bool = False, fill: Any = None
    ) -> Any: ...
    def get_actions(
        self,
        indices: Any = None,
        *,
        neg_index_as_lookback: bool = False,
        fill: Any = None,
        one_hot_discrete: bool = False,
    ) -> Any: ...
    def get_rewards(
        self, indices: Any = None, *, neg_index_as_lookback: bool = False, fill: Any = None
    ) -> Any: ...
    def get_extra_model_outputs(
        self,
        key: str,
        indices: Any = None,
        *,
        neg_index_as_lookback: bool = False,
        fill: Any = None,
    ) -> Any: ...
    def set_observations(
        self, *, new_data: Any, at_indices: Any = None, neg_index_as_lookback: bool = False
    ) -> None: ...
    def set_actions(
        self, *, new_data: Any, at_indices: Any = None, neg_index_as_lookback: bool = False
    ) -> None: ...
    def set_rewards(
        self, *, new_data: Any, at_indices: Any = None, neg_index_as_lookback: bool = False
    ) -> None: ...
    def set_extra_model_outputs(
        self,
        *,
        key: str,
        new_data: Any,
        at_indices: Any = None,
        neg_index_as_lookback: bool = False,
    ) -> None: ...
    # Internal helpers of the Python subclass.
    def _set_space(self, field: str, space: Any) -> None: ...
    def _extend(self, field: str, data: Any, key: str | None = None) -> None: ...
    def _extend_empty_infos(self, n: int) -> None: ...
    def _set_lookback(self, field: str, lookback: int, key: str | None = None) -> None: ...
    def _lookback(self, field: str, key: str | None = None) -> int: ...
    def _field_len(self, field: str, key: str | None = None) -> int: ...
    def _is_finalized(self, field: str, key: str | None = None) -> bool: ...
    def _extra_keys(self) -> list[str]: ...
    def _set_compression(self, field: str, rows: int | None, key: str | None = None) -> None: ...
    def _compression(self, field: str, key: str | None = None) -> int | None: ...
    def _packed_state(self, field: str, key: str | None = None) -> dict[str, Any] | None: ...
    def _set_packed_state(
        self, field: str, state: dict[str, Any], finalized: bool, key: str | None = None
    ) -> None: ...
    def _stored_bytes(self, field: str, key: str | None = None) -> int: ...
    def _seal(self) -> None: ...
    def _pop(self, field: str, index: int = ..., key: str | None = None) -> None: ...
    def _put_extra(self, key: str, data: Any, lookback: int) -> None: ...
    def _del_extra(self, key: str) -> None: ...
    def _rewards_have_space(self) -> bool: ...
    def _blank_into(self, target: SingleAgentEpisodeCore) -> None: ...
    def _cut_into(
        self, target: SingleAgentEpisodeCore, len_lookback_buffer: int, keep_done: bool = False
    ) -> None: ...
    def _slice_into(
        self,
        target: SingleAgentEpisodeCore,
        start: int | None,
        stop: int | None,
        step: int | None,
        len_lookback_buffer: int | None = None,
    ) -> None: ...
    def _check_concat(self, other: SingleAgentEpisodeCore) -> None: ...
    def _concat(self, other: SingleAgentEpisodeCore) -> None: ...
    def _get(
        self,
        field: str,
        key: str | None = None,
        indices: Any = None,
        neg_index_as_lookback: bool = False,
        fill: Any = None,
        one_hot_discrete: bool = False,
    ) -> Any: ...
    def _get_ext(
        self,
        field: str,
        key: str | None = None,
        indices: Any = None,
        neg_index_as_lookback: bool = False,
        fill: Any = None,
        one_hot_discrete: bool = False,
        add_last: Any = None,
        ignore_last: bool = False,
    ) -> Any: ...
    def _set(
        self,
        field: str,
        new_data: Any,
        key: str | None = None,
        at_indices: Any = None,
        neg_index_as_lookback: bool = False,
    ) -> None: ...

# The runner's hot path (rust/py/runner.rs).

def single_agent_record_vector_step(
    episodes: list[Any],
    observations: Any,
    actions: Any,
    rewards: Any,
    terminateds: Any,
    truncateds: Any,
    infos: Any = None,
    extra_model_outputs: dict[str, Any] | None = None,
    expected_len: int | None = None,
    steps_left: int | None = None,
    env_indices: Sequence[int] | npt.NDArray[np.integer[Any]] | None = None,
) -> tuple[list[int], list[int]]: ...
def multi_agent_record_steps(
    episodes: list[Any],
    observations: list[Any],
    actions: list[Any],
    rewards: list[Any],
    infos: list[Any],
    terminateds: list[Any],
    truncateds: list[Any],
    extra_model_outputs: list[Any],
    agent_steps: dict[Any, int] | None = None,
    module_steps: dict[Any, int] | None = None,
    env_indices: Sequence[int] | npt.NDArray[np.integer[Any]] | None = None,
) -> list[int]: ...

# The shared-memory sub-env backend's wait (rust/py/ready.rs; GIL released).

def wait_ready(
    fds: list[int], weights: list[int], need: int, timeout_s: float | None = None
) -> list[int]: ...

@final
class ModuleBatcher:
    """Per-module inference batches gathered across sub-envs and agents, scattered back."""

    def __new__(cls, observation_spaces: dict[str, Any]) -> ModuleBatcher: ...
    @property
    def module_ids(self) -> list[str]: ...
    def gather(
        self,
        episodes: list[Any],
        observations: list[Any],
        terminateds: list[Any] | None = None,
        truncateds: list[Any] | None = None,
        env_indices: Sequence[int] | npt.NDArray[np.integer[Any]] | None = None,
    ) -> dict[str, Any]: ...
    def index_map(self, module_id: str) -> list[tuple[int, Any]]: ...
    def scatter(
        self,
        outputs: dict[str, dict[str, Any]],
        actions_key: str = "actions",
        actions_for_env_key: str = "actions_for_env",
        extra_constants: dict[str, Any] | None = None,
        extras_as_rows: bool = False,
    ) -> list[tuple[dict[Any, Any], dict[Any, Any], dict[Any, dict[str, Any] | AgentOutputs]]]: ...

@final
class AgentOutputs:
    """One agent's extra model outputs as its row of its module's output arrays.

    What ``ModuleBatcher.scatter(..., extras_as_rows=True)`` hands the multi-agent record.
    """

    def to_dict(self) -> dict[str, Any]: ...

@final
class StatsSnapshot:
    """What one stat's reduce() returned: its configuration and reduced content."""

    def peek(self, compile: bool = True) -> Any: ...
    def reduce(self, compile: bool = True) -> Any: ...
    @property
    def reduce_method(self) -> str: ...
    @property
    def count(self) -> float | None: ...
    def __float__(self) -> float: ...
    def __int__(self) -> int: ...
    def __eq__(self, other: object, /) -> bool: ...
    def __ne__(self, other: object, /) -> bool: ...
    def __lt__(self, other: object, /) -> bool: ...
    def __le__(self, other: object, /) -> bool: ...
    def __gt__(self, other: object, /) -> bool: ...
    def __ge__(self, other: object, /) -> bool: ...
    __hash__: ClassVar[None]  # type: ignore[assignment]
    def __add__(self, other: object, /) -> float: ...
    def __radd__(self, other: object, /) -> float: ...
    def __sub__(self, other: object, /) -> float: ...
    def __rsub__(self, other: object, /) -> float: ...
    def __mul__(self, other: object, /) -> float: ...
    def __rmul__(self, other: object, /) -> float: ...
    def __format__(self, spec: str, /) -> str: ...
    def __len__(self) -> int: ...
    def __array__(self, dtype: Any = None, copy: bool | None = None) -> npt.NDArray[Any]: ...
    def get_state(self) -> dict[str, Any]: ...
    @staticmethod
    def from_state(state: dict[str, Any]) -> StatsSnapshot: ...
    def __reduce__(self) -> tuple[Any, tuple[dict[str, Any]]]: ...

@disjoint_base
class MetricsStore:
    """The native store behind fastrollout.MetricsLogger (which subclasses it)."""

    def __new__(cls, root: bool = False) -> Self: ...
    @property
    def _is_root_logger(self) -> bool: ...
    def log_value(
        self,
        key: Any,
        value: Any,
        *,
        reduce: str | None = None,
        window: float | None = None,
        ema_coeff: float | None = None,
        percentiles: list[float] | bool | None = None,
        clear_on_reduce: bool | None = None,
        with_throughput: bool | None = None,
        throughput_ema_coeff: float | None = None,
        reduce_per_index_on_aggregate: bool | None = None,
    ) -> None: ...
    def set_value(
        self,
        key: Any,
        value: Any,
        *,
        reduce: str | None = None,
        window: float | None = None,
        ema_coeff: float | None = None,
        percentiles: list[float] | bool | None = None,
        with_throughput: bool | None = None,
    ) -> None: ...
    def __contains__(self, key: Any, /) -> bool: ...
    def reset(self) -> None: ...
    # Internal helpers of the Python subclass.
    def _ensure(
        self,
        key: Any,
        *,
        reduce: str | None = None,
        window: float | None = None,
        ema_coeff: float | None = None,
        percentiles: list[float] | bool | None = None,
        with_throughput: bool | None = None,
    ) -> str: ...
    def _peek(
        self, key: Any = None, compile: bool = True, latest_merged_only: bool = False
    ) -> Any: ...
    def _reduce(self, compile: bool = False) -> dict[Any, Any]: ...
    def _aggregate(self, stats_dicts: Any, key: Any = None) -> None: ...
    def _throughputs(self, key: Any = None) -> Any: ...
    def _delete(self, key: Any, key_error: bool = True) -> None: ...
    def _get_state(self) -> dict[str, Any]: ...
    def _set_state(self, state: Any) -> None: ...
