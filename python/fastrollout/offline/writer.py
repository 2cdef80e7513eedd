"""Writes sampled episodes to parquet files, off the sampling thread.

:class:`EpisodeWriter` is what ``RunnerConfig.offline_data(output=...)`` switches on: the
runner hands every ``sample()`` call's episodes to :meth:`EpisodeWriter.write`, which
takes their states and queues them; a writer thread packs them into rows (see
:mod:`fastrollout.offline._layouts` for the two layouts) and writes files. The queue is
bounded: when the disk is slower than sampling, ``write`` (so ``sample``) waits.

Files go where RLlib's ``OfflineSingleAgentEnvRunner`` puts them,
``{output}/{env}/run-{worker:06d}-{write:05d}/{writer id}_000000.parquet``: ``env`` the
first sub-env's unwrapped class name in lower case, ``worker`` the runner's index,
``write`` counts the files written (RLlib: its sample calls; the file name is Ray Data's). Each
file is written under a hidden temporary name in its folder and then renamed
(``os.replace``), so a crash leaves only whole files under ``.parquet`` names.

With ``max_rows_per_file`` and ``max_bytes_per_file`` unset, each ``sample()`` call's
episodes make one file (as RLlib's). With either, rows are buffered until there are that
many rows or bytes (the bytes before parquet's compression: the packed states, or the
columns' arrays), and files hold whole chunks (never a chunk split across two files; a
chunk over the limit gets a file of its own). Unlike RLlib (whose
``output_write_remaining_data`` defaults to False and drops them), the rows still buffered
at ``close()`` are always written: data sampled is data kept.
"""

from __future__ import annotations

import json
import os
import queue
import threading
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from fastrollout._extras import require_extra
from fastrollout.offline import _layouts as L

__all__ = ["EpisodeWriter", "OfflineWriteError"]

_STOP = object()


class OfflineWriteError(RuntimeError):
    """The writer thread failed (the message names the file); raised on the next call."""


class EpisodeWriter:
    """Writes episode chunks to parquet in a writer thread behind a bounded queue.

    Args:
        output: The base folder.
        write_episodes: One row per chunk holding its state (RLlib's episodes layout),
            or one row per step in RLlib's column names.
        max_rows_per_file: Rows per file (None: no limit on rows).
        max_bytes_per_file: Bytes per file before compression (None: no limit on
            bytes). Without either limit, one file per :meth:`write` call.
        subdir: The folder under ``output`` (RLlib: the env's name, lower case).
        worker_index: The runner's index (in the folder names).
        queue_size: ``write`` calls that may wait for the writer thread before the next
            one blocks.

    Raises:
        ImportError: pyarrow (or msgpack, for the episodes layout) is missing.
    """

    def __init__(
        self,
        output: str | os.PathLike[str],
        *,
        write_episodes: bool = True,
        max_rows_per_file: int | None = None,
        max_bytes_per_file: int | None = None,
        subdir: str = "env",
        worker_index: int = 0,
        queue_size: int = 2,
    ) -> None:
        require_extra("pyarrow.parquet", extra="offline", purpose="fastrollout.offline")
        if write_episodes:
            require_extra("msgpack", extra="offline", purpose="fastrollout.offline")
        self.folder = Path(output) / subdir
        self.write_episodes = write_episodes
        self.max_rows_per_file = max_rows_per_file
        self.max_bytes_per_file = max_bytes_per_file
        self.worker_index = worker_index
        self._id = uuid.uuid4().hex[:16]
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=queue_size)
        self._error: BaseException | None = None
        self._closed = False
        self._writes = 0
        self.files: list[Path] = []
        # Buffered chunks (with a limit): per chunk, its rows (episodes layout: one), its
        # bytes and its payload.
        self._pending: list[tuple[int, int, Any]] = []
        self._thread = threading.Thread(
            target=self._run, name=f"fastrollout-offline-writer-{worker_index}", daemon=True
        )
        self._thread.start()

    # ------------------------------------------------------------------ sampling side

    def write(self, episodes: list[Any]) -> None:
        """Queues one ``sample()`` call's episodes (waits while the queue is full).

        Raises:
            OfflineWriteError: An earlier write failed in the writer thread.
        """
        self._raise_error()
        if self._closed:
            raise OfflineWriteError("the offline writer is closed")
        # States now: the caller owns the episodes from here on.
        states = [(_is_ma(e), e.get_state()) for e in episodes]
        self._queue.put(states)

    def close(self) -> None:
        """Writes what is buffered, stops and joins the writer thread (idempotent).

        Raises:
            OfflineWriteError: A write failed in the writer thread.
        """
        if not self._closed:
            self._closed = True
            self._queue.put(_STOP)
            self._thread.join()
        self._raise_error()

    def _raise_error(self) -> None:
        err = self._error
        if err is not None:
            self._error = None
            raise OfflineWriteError(str(err)) from err

    # ------------------------------------------------------------------ writer thread

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                if self._error is None:
                    try:
                        self._flush(final=True)
                    except BaseException as err:
                        self._error = err
                return
            if self._error is not None:
                continue  # drain, so that write() never blocks on a dead writer
            try:
                self._add(item)
            except BaseException as err:
                self._error = err

    def _add(self, states: list[tuple[bool, dict[str, Any]]]) -> None:
        for multi_agent, state in states:
            self._pending.append(self._rows_of(multi_agent, state))
        unlimited = self.max_rows_per_file is None and self.max_bytes_per_file is None
        self._flush(final=unlimited)

    def _rows_of(self, multi_agent: bool, state: dict[str, Any]) -> tuple[int, int, Any]:
        """(row count, bytes, payload) of one chunk in the configured layout."""
        if self.write_episodes:
            state = L.ma_state_for_disk(state) if multi_agent else L.sa_state_for_disk(state)
            packed = L.packb(state)
            return 1, len(packed), (multi_agent, packed)
        if not multi_agent:
            cols, rem = L.split_sa_state(L.sa_state_for_disk(state))
            _add_ids(cols, rem["rows"], state["id_"], None, None)
            return rem["rows"], _nbytes([cols]), (False, [cols], rem)
        state = L.ma_state_for_disk(state)
        parts, agents, total = [], [], 0
        for aid, s in state["agent_episodes"]:
            cols, rem = L.split_sa_state(s)
            _add_ids(cols, rem["rows"], s["id_"], str(aid), s["module_id"])
            parts.append(cols)
            agents.append([aid, rem])
            total += rem["rows"]
        state["agent_episodes"] = agents
        return total, _nbytes(parts), (True, parts, state)

    def _flush(self, *, final: bool) -> None:
        max_rows = self.max_rows_per_file
        max_bytes = self.max_bytes_per_file

        def over(rows: int, size: int) -> bool:
            return (max_rows is not None and rows > max_rows) or (
                max_bytes is not None and size > max_bytes
            )

        while self._pending:
            take, rows, size = 0, 0, 0
            for n, b, _ in self._pending:
                if take and over(rows + n, size + b):
                    break
                take, rows, size = take + 1, rows + n, size + b
            reached = (max_rows is not None and rows >= max_rows) or (
                max_bytes is not None and size >= max_bytes
            )
            if take == len(self._pending) and not (reached or final):
                return  # wait for more rows
            batch, self._pending = self._pending[:take], self._pending[take:]
            self._write_file([payload for _, _, payload in batch])

    def _write_file(self, payloads: list[Any]) -> None:
        pa = require_extra("pyarrow", extra="offline", purpose="fastrollout.offline")
        pq = require_extra("pyarrow.parquet", extra="offline", purpose="fastrollout.offline")
        multi_agent = any(p[0] for p in payloads)
        meta: dict[bytes, bytes] = {
            L.META_KEY: json.dumps(
                {
                    "version": L.VERSION,
                    "layout": "episodes" if self.write_episodes else "columns",
                    "multi_agent": multi_agent,
                }
            ).encode()
        }
        if self.write_episodes:
            table = pa.table({"item": pa.array([p[1] for p in payloads], type=pa.binary())})
        else:
            parts = [cols for p in payloads for cols in p[1]]
            table = _columns_table(pa, parts)
            meta[L.CHUNKS_KEY] = L.packb([p[2] for p in payloads])
        table = table.replace_schema_metadata(meta)
        self._writes += 1
        folder = self.folder / f"run-{self.worker_index:06d}-{self._writes:05d}"
        folder.mkdir(parents=True, exist_ok=True)
        final = folder / f"{self._id}_000000.parquet"
        tmp = folder / f".{final.name}.tmp"
        try:
            pq.write_table(table, tmp)
            os.replace(tmp, final)
        except BaseException as err:
            tmp.unlink(missing_ok=True)
            raise OfflineWriteError(f"writing {final} failed: {err}") from err
        self.files.append(final)


def _add_ids(
    cols: dict[str, np.ndarray], rows: int, eps_id: Any, agent_id: Any, module_id: Any
) -> None:
    """Adds RLlib's id columns (the same value in each of ``rows`` rows) to a chunk's."""
    for name, value in ((L.EPS_ID, eps_id), (L.AGENT_ID, agent_id), (L.MODULE_ID, module_id)):
        cols[name] = np.array([value] * rows, dtype=object)


def _nbytes(parts: list[dict[str, np.ndarray]]) -> int:
    """The bytes of a chunk's column arrays (object items count as pointers)."""
    return sum(a.nbytes for cols in parts for a in cols.values())


def _is_ma(episode: Any) -> bool:
    return hasattr(episode, "agent_episodes")


def _arrow_array(pa: Any, data: np.ndarray) -> Any:
    """An arrow array of ``data``'s items: fixed-size lists for array items."""
    if data.dtype == object:
        return pa.array(list(data))
    arr = pa.array(np.ascontiguousarray(data).reshape(-1))
    for size in reversed(data.shape[1:]):
        arr = pa.FixedSizeListArray.from_arrays(arr, size)
    return arr


def _columns_table(pa: Any, parts: list[dict[str, np.ndarray]]) -> Any:
    """One table of the chunks' rows, in RLlib's column order."""
    names: list[str] = []
    for cols in parts:
        names += [k for k in cols if k not in names]
    order = [
        L.EPS_ID,
        L.AGENT_ID,
        L.MODULE_ID,
        L.OBS,
        L.ACTIONS,
        L.REWARDS,
        L.NEXT_OBS,
        L.TERMINATEDS,
        L.TRUNCATEDS,
        L.T,
    ]
    names = order + sorted(n for n in names if n not in order)
    columns = {}
    for name in names:
        missing = [i for i, c in enumerate(parts) if name not in c]
        if missing:
            raise ValueError(
                f"the columns layout needs the same columns in every chunk of a file: "
                f"{name!r} is missing from some (extra model outputs differ)"
            )
        columns[name] = _arrow_array(pa, np.concatenate([c[name] for c in parts]))
    return pa.table(columns)


def _subdir(runner: Any) -> str:
    """The folder RLlib's recording runner names: the first sub-env's class, lower case."""
    try:
        env = runner.env
        if isinstance(env, list | tuple):
            first = env[0]
        else:
            first = getattr(env.unwrapped, "envs", [env])[0]
        return type(getattr(first, "unwrapped", first)).__name__.lower()
    except Exception:
        name = getattr(runner.config, "env", None)
        return name.lower() if isinstance(name, str) else "env"


def for_runner(runner: Any) -> EpisodeWriter:
    """The writer of a runner whose config sets ``output`` (RLlib's folder and settings).

    Args:
        runner: An env runner.

    Returns:
        A new writer; the runner hands it each ``sample()`` call's episodes and closes it
        at ``stop()``.
    """
    from fastrollout.config import RunnerConfig

    config = runner.config
    # Only fastrollout's config: RLlib's new-stack recording ignores its
    # output_max_file_size (a 64 MiB default meant for the old stack's JSON writer).
    max_bytes = config.output_max_file_size if isinstance(config, RunnerConfig) else None
    return EpisodeWriter(
        config.output,
        write_episodes=bool(getattr(config, "output_write_episodes", True)),
        max_rows_per_file=getattr(config, "output_max_rows_per_file", None),
        max_bytes_per_file=max_bytes,
        subdir=_subdir(runner),
        worker_index=int(getattr(runner, "worker_index", 0)),
    )
