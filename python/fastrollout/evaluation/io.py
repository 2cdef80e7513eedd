"""``RolloutWorker``'s input readers and output writers on recorded parquet episodes.

The old stack's ``input_creator`` and ``output_creator`` on ``fastrollout.offline``. A
reader's ``next()`` returns one recorded episode as a ``SampleBatch``; a writer's
``write(batch)`` records a sampled batch's episodes. Both need the ``offline`` extra.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import numpy as np

from fastrollout.batches import MultiAgentBatch, SampleBatch
from fastrollout.batches.sample_batch import episodes_to_sample_batch
from fastrollout.episodes import SingleAgentEpisode

__all__ = ["EpisodeInputReader", "EpisodeOutputWriter", "batch_to_episodes"]


def _episode_bounds(batch: SampleBatch) -> Iterator[tuple[int, int]]:
    """Row ranges of the batch's chunks (a new one where ``unroll_id``/``eps_id`` changes)."""
    key = SampleBatch.UNROLL_ID if SampleBatch.UNROLL_ID in batch else SampleBatch.EPS_ID
    ids = np.asarray(batch[key])
    if len(ids) == 0:
        return
    starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
    ends = np.r_[starts[1:], len(ids)]
    yield from zip(starts.tolist(), ends.tolist(), strict=True)


def _flag_at(batch: SampleBatch, key: str, row: int) -> bool:
    return key in batch and bool(batch[key][row])


def batch_to_episodes(batch: SampleBatch) -> list[SingleAgentEpisode]:
    """The numpy'ized episode chunks a single-policy batch's rows came from.

    Args:
        batch: Rows with ``obs``, ``new_obs``, ``actions``, ``rewards``,
            ``terminateds``/``truncateds``; other per-row columns (``action_logp``, ...)
            become extra model outputs.

    Returns:
        One ``SingleAgentEpisode`` per chunk (``unroll_id``, else ``eps_id``), in order.

    Raises:
        KeyError: A required column is missing (named).
    """
    batch = batch.decompress_if_needed()
    needed = (SampleBatch.OBS, SampleBatch.NEXT_OBS, SampleBatch.ACTIONS, SampleBatch.REWARDS)
    missing = [c for c in needed if c not in batch]
    if missing:
        raise KeyError(f"batch_to_episodes: the batch lacks columns {missing}")
    own = {
        *needed,
        SampleBatch.TERMINATEDS,
        SampleBatch.TRUNCATEDS,
        SampleBatch.INFOS,
        SampleBatch.EPS_ID,
        SampleBatch.UNROLL_ID,
        SampleBatch.AGENT_INDEX,
        SampleBatch.T,
        "advantages",
        "value_targets",
        "values_bootstrapped",
    }
    # A recurrent policy's seq_lens and state_in_* have one row per sequence, not per
    # step (its state_out_* per step stay, as extra model outputs).
    extra_keys = [
        k
        for k in batch
        if k not in own and k != SampleBatch.SEQ_LENS and not k.startswith("state_in_")
    ]
    episodes = []
    for start, end in _episode_bounds(batch):
        obs = batch[SampleBatch.OBS][start:end]
        last = batch[SampleBatch.NEXT_OBS][end - 1 : end]
        terminated = bool(
            np.asarray(batch.get(SampleBatch.TERMINATEDS, [False]))[end - 1 : end].any()
        )
        truncated = bool(
            np.asarray(batch.get(SampleBatch.TRUNCATEDS, [False]))[end - 1 : end].any()
        )
        t0 = int(batch[SampleBatch.T][start]) if SampleBatch.T in batch else 0
        eps_id = str(batch[SampleBatch.EPS_ID][start]) if SampleBatch.EPS_ID in batch else None
        episode = SingleAgentEpisode(
            eps_id,
            observations=list(np.concatenate([obs, last])),
            actions=list(batch[SampleBatch.ACTIONS][start:end]),
            rewards=list(np.asarray(batch[SampleBatch.REWARDS][start:end], dtype=np.float64)),
            extra_model_outputs={k: list(batch[k][start:end]) for k in extra_keys},
            terminated=terminated,
            truncated=truncated,
            t_started=t0,
            len_lookback_buffer=0,
        )
        episodes.append(episode.to_numpy())
    return episodes


class EpisodeInputReader:
    """Reads recorded episodes (``offline_data(output=...)``'s parquet) one per ``next()``.

    Args:
        path: A folder or file of recorded episodes (fastrollout's or RLlib's layouts).
        loop: Start again from the first episode after the last (RLlib's readers do).

    Raises:
        ValueError: No episodes at ``path``.
        ImportError: Without the ``offline`` extra.
    """

    def __init__(self, path: str | os.PathLike[str], *, loop: bool = True) -> None:
        from fastrollout.offline import read_episodes

        self.episodes = [e for e in read_episodes(path) if len(e)]
        if not self.episodes:
            raise ValueError(f"no recorded episodes with steps at {str(path)!r}")
        self.loop = loop
        self._next = 0
        self._unroll_id = 0

    def next(self) -> SampleBatch:
        """The next episode's rows.

        Raises:
            StopIteration: All episodes were read and ``loop`` is False.
        """
        if self._next >= len(self.episodes):
            if not self.loop:
                raise StopIteration
            self._next = 0
        episode = self.episodes[self._next]
        self._next += 1
        batch = episodes_to_sample_batch([episode], unroll_id_start=self._unroll_id)
        self._unroll_id += 1
        return batch


class EpisodeOutputWriter:
    """Records each written batch's episode chunks as parquet (RLlib's episodes layout).

    Args:
        path: The base folder.
        **kwargs: Passed to ``fastrollout.offline.writer.EpisodeWriter``.
    """

    def __init__(self, path: str | os.PathLike[str], **kwargs: Any) -> None:
        from fastrollout.offline.writer import EpisodeWriter

        self._writer = EpisodeWriter(path, **kwargs)

    @property
    def files(self) -> list[Any]:
        """The files written so far."""
        return list(self._writer.files)

    def write(self, batch: SampleBatch | MultiAgentBatch) -> None:
        """Queues the batch's episode chunks for writing (each policy's, multi-agent).

        Args:
            batch: A sampled batch.
        """
        parts = batch.policy_batches.values() if isinstance(batch, MultiAgentBatch) else [batch]
        episodes = [e for part in parts for e in batch_to_episodes(part)]
        self._writer.write(episodes)

    def close(self) -> None:
        """Writes what is queued and stops the writer thread."""
        self._writer.close()
