"""Reads episodes back from parquet files in RLlib 2.60's layouts.

:func:`read_episodes` reads what ``offline_data(output=...)`` wrote (both layouts,
single- and multi-agent) into the chunks exactly as ``sample()`` returned them, and what
RLlib 2.60's ``OfflineSingleAgentEnvRunner`` wrote (episodes layout: whole states;
columns layout: rows grouped into chunks by ``eps_id``, with empty infos and no
look-back, since RLlib's rows hold neither).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import numpy as np

from fastrollout._extras import require_extra
from fastrollout.offline import _layouts as L

__all__ = ["OfflineReadError", "read_episodes"]

_log = logging.getLogger(__name__)


class OfflineReadError(ValueError):
    """A file or row could not be read.

    Attributes:
        path: The file.
        row: The row (0 where the file itself could not be opened).
        episodes: The episodes read before the failure (all earlier files and rows).
    """

    def __init__(self, message: str, *, path: Path, row: int, episodes: list[Any]) -> None:
        super().__init__(message)
        self.path = path
        self.row = row
        self.episodes = episodes


def parquet_files(path: str | os.PathLike[str]) -> list[Path]:
    """The ``.parquet`` files under ``path`` (or ``path`` itself), in write order.

    Hidden files and folders (names starting with ``.`` or ``_``, as the temporary files
    of an unfinished write) are skipped, as pyarrow's datasets skip them.
    """
    root = Path(path)
    if root.is_file():
        return [root]
    if not root.exists():
        raise FileNotFoundError(f"no such file or folder: {root}")
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith((".", "_")))
        found += [
            Path(dirpath) / f
            for f in filenames
            if f.endswith(".parquet") and not f.startswith((".", "_"))
        ]
    return sorted(found)


def read_episodes(
    path: str | os.PathLike[str],
    *,
    on_error: Literal["raise", "skip"] = "raise",
    allow_pickle: bool = False,
) -> list[Any]:
    """Reads the episode chunks under ``path``, in the order they were written.

    Args:
        path: A folder (``offline_data(output=...)``'s, or any folder of parquet files,
            read recursively) or one parquet file.
        on_error: ``"raise"``: the first unreadable file or row raises
            :class:`OfflineReadError`, which names them and carries the episodes read
            before it (``err.episodes``). ``"skip"``: unreadable files and rows are
            logged and skipped, the rest returned.
        allow_pickle: Read columns that RLlib compressed (``output_compress_columns``;
            RLlib's default for ``obs`` and ``new_obs`` in its columns layout), which are
            pickled: only for files you trust. Off, such a column raises.

    Returns:
        ``SingleAgentEpisode`` and ``MultiAgentEpisode`` objects (fastrollout's).

    Raises:
        OfflineReadError: (a ``ValueError``) With ``on_error="raise"``: a truncated or
            corrupt file, or a row that does not decode; the message names file and row.
        FileNotFoundError: ``path`` does not exist.
        ImportError: pyarrow is not installed (``pip install 'fastrollout[offline]'``).
    """
    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
    pq = require_extra("pyarrow.parquet", extra="offline", purpose="fastrollout.offline")
    episodes: list[Any] = []
    # RLlib's columns layout spreads one chunk over files (Ray Data writes a file per
    # row or block): consecutive such files are read as one table.
    rllib_rows: list[tuple[Path, Any]] = []

    def flush_rllib() -> None:
        if rllib_rows:
            for e in _rllib_columns(rllib_rows, on_error, allow_pickle, episodes):
                episodes.append(e)
            rllib_rows.clear()

    for file in parquet_files(path):
        try:
            table = pq.read_table(file)
        except Exception as err:
            flush_rllib()
            _fail(
                on_error,
                f"{file}: cannot read the parquet file (row 0): {err}",
                file,
                0,
                episodes,
                err,
            )
            continue
        meta = table.schema.metadata or {}
        if "item" in table.column_names:
            flush_rllib()
            for e in _episodes_layout(table, file, on_error, episodes):
                episodes.append(e)
        elif L.CHUNKS_KEY in meta:
            flush_rllib()
            for e in _our_columns(table, meta[L.CHUNKS_KEY], file, on_error, episodes):
                episodes.append(e)
        else:
            rllib_rows.append((file, table))
    flush_rllib()
    return episodes


def _fail(
    on_error: str, message: str, file: Path, row: int, episodes: list[Any], err: BaseException
) -> None:
    if on_error == "skip":
        _log.warning("skipped: %s", message)
        return
    raise OfflineReadError(message, path=file, row=row, episodes=list(episodes)) from err


def _episodes_layout(table: Any, file: Path, on_error: str, done: list[Any]) -> Iterator[Any]:
    from fastrollout.episodes import MultiAgentEpisode, SingleAgentEpisode

    items = table.column("item").to_pylist()
    for row, item in enumerate(items):
        try:
            state = L.unpackb(item)
            if L.is_ma_state(state):
                episode: Any = MultiAgentEpisode.from_state(L.ma_state_from_disk(state))
            else:
                episode = SingleAgentEpisode.from_state(L.sa_state_from_disk(state))
        except Exception as err:
            _fail(
                on_error,
                f"{file}: row {row} does not decode into an episode: {type(err).__name__}: {err}",
                file,
                row,
                done,
                err,
            )
            continue
        yield episode


def _column_arrays(table: Any, allow_pickle: bool, file: Path) -> dict[str, np.ndarray]:
    """Every column as a numpy array with one item per row."""
    return {name: _to_numpy(table, name, allow_pickle, file) for name in table.column_names}


def _to_numpy(table: Any, name: str, allow_pickle: bool, file: Path) -> np.ndarray:
    pa = require_extra("pyarrow", extra="offline", purpose="fastrollout.offline")
    col = table.column(name).combine_chunks()
    field = table.schema.field(name)
    typ = col.type
    storage = col.storage if isinstance(typ, pa.ExtensionType) else col
    if isinstance(typ, pa.ExtensionType):
        typ = typ.storage_type
    shape: list[int] = []
    arr = storage
    while (
        pa.types.is_fixed_size_list(arr.type)
        or pa.types.is_list(arr.type)
        or (pa.types.is_large_list(arr.type))
    ):
        if pa.types.is_fixed_size_list(arr.type):
            shape.append(arr.type.list_size)
        else:
            lengths = np.asarray(arr.value_lengths())
            if len(lengths) and (lengths != lengths[0]).any():
                raise ValueError(f"{file}: column {name!r} holds lists of different lengths")
            shape.append(int(lengths[0]) if len(lengths) else 0)
        arr = arr.flatten()
    if shape:
        values = arr.to_numpy(zero_copy_only=False)
        out = values.reshape(len(storage), *shape)
        ext = (field.metadata or {}).get(b"ARROW:extension:metadata")
        if ext:  # Ray's tensor columns: the item shape in the extension's metadata.
            try:
                item_shape = json.loads(ext)
                if isinstance(item_shape, list) and int(np.prod(item_shape)) == int(np.prod(shape)):
                    out = out.reshape(len(storage), *item_shape)
            except ValueError:
                pass
        return out  # type: ignore[no-any-return]
    if pa.types.is_string(typ) or pa.types.is_binary(typ) or pa.types.is_large_string(typ):
        values = storage.to_pylist()
        if name in (L.EPS_ID, L.AGENT_ID, L.MODULE_ID, L.INFOS):
            return np.array(values, dtype=object)
        if not allow_pickle:
            raise ValueError(
                f"{file}: column {name!r} holds compressed (pickled) items, as RLlib's "
                "output_compress_columns writes them; pass allow_pickle=True for files "
                "you trust"
            )
        from ray.rllib.utils.compression import unpack_if_needed

        return np.stack([np.asarray(unpack_if_needed(v)) for v in values])
    if pa.types.is_null(typ):
        return np.array([None] * len(storage), dtype=object)
    return storage.to_numpy(zero_copy_only=False)  # type: ignore[no-any-return]


def _our_columns(
    table: Any, chunks_blob: bytes, file: Path, on_error: str, done: list[Any]
) -> Iterator[Any]:
    from fastrollout.episodes import MultiAgentEpisode, SingleAgentEpisode

    try:
        chunks = L.unpackb(chunks_blob)
        cols = _column_arrays(table, False, file)
    except Exception as err:
        _fail(
            on_error,
            f"{file}: the chunk metadata does not decode (row 0): {err}",
            file,
            0,
            done,
            err,
        )
        return
    row = 0
    for rem in chunks:
        start = row
        try:
            if L.is_ma_state(rem):
                agents = []
                for aid, srem in rem["agent_episodes"]:
                    n = srem["rows"]
                    part = {k: v[row : row + n] for k, v in cols.items()}
                    row += n
                    agents.append([aid, L.join_sa_state(part, srem)])
                rem["agent_episodes"] = agents
                episode: Any = MultiAgentEpisode.from_state(L.ma_state_from_disk(rem))
            else:
                n = rem["rows"]
                part = {k: v[row : row + n] for k, v in cols.items()}
                row += n
                episode = SingleAgentEpisode.from_state(
                    L.sa_state_from_disk(L.join_sa_state(part, rem))
                )
        except Exception as err:
            _fail(
                on_error,
                f"{file}: the chunk at row {start} does not decode: {type(err).__name__}: {err}",
                file,
                start,
                done,
                err,
            )
            continue
        yield episode


def _rllib_columns(
    files: list[tuple[Path, Any]], on_error: str, allow_pickle: bool, done: list[Any]
) -> Iterator[Any]:
    """Chunks from RLlib's rows: runs of one ``eps_id``, ending at a done row."""
    from fastrollout.episodes import SingleAgentEpisode

    pa = require_extra("pyarrow", extra="offline", purpose="fastrollout.offline")
    # Row -> (file, row in file), for error messages.
    where = [(f, r) for f, t in files for r in range(t.num_rows)]
    first = files[0][0]
    try:
        table = pa.concat_tables([t for _, t in files], promote_options="default")
        cols = _column_arrays(table, allow_pickle, first)
        missing = [c for c in (L.OBS, L.NEXT_OBS, L.ACTIONS, L.REWARDS) if c not in cols]
        if missing:
            raise ValueError(f"no column(s) {missing}")
    except Exception as err:
        _fail(on_error, f"{first}: not an episode file (row 0): {err}", first, 0, done, err)
        return
    n = table.num_rows
    ids = cols.get(L.EPS_ID, np.array([None] * n, dtype=object))
    term = cols.get(L.TERMINATEDS, np.zeros(n, dtype=bool))
    trunc = cols.get(L.TRUNCATEDS, np.zeros(n, dtype=bool))
    extra = [k for k in cols if k not in L.KNOWN_COLUMNS]
    start = 0
    for row in range(n):
        last = row == n - 1 or ids[row + 1] != ids[row] or term[row] or trunc[row]
        if not last:
            continue
        sl = slice(start, row + 1)
        try:
            obs = np.concatenate([cols[L.OBS][sl], cols[L.NEXT_OBS][row : row + 1]])
            t0 = int(cols[L.T][start]) if L.T in cols else 0
            episode = SingleAgentEpisode(
                None if ids[row] is None else str(ids[row]),
                observations=list(obs),
                infos=[{} for _ in range(len(obs))],
                actions=list(cols[L.ACTIONS][sl]),
                rewards=list(cols[L.REWARDS][sl]),
                extra_model_outputs={k: list(cols[k][sl]) for k in extra},
                terminated=bool(term[row]),
                truncated=bool(trunc[row]),
                t_started=t0,
                len_lookback_buffer=0,
            )
            episode.to_numpy()
        except Exception as err:
            file, frow = where[start]
            _fail(
                on_error,
                f"{file}: the chunk at row {frow} does not make an episode: "
                f"{type(err).__name__}: {err}",
                file,
                frow,
                done,
                err,
            )
            start = row + 1
            continue
        start = row + 1
        yield episode
