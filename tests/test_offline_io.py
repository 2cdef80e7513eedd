"""Recording episodes to parquet (offline_data(output=...)) and reading them back."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fastrollout as fr
from fastrollout.env import make_multi_agent
from fastrollout.offline import _layouts as L
from fastrollout.offline import read_episodes
from fastrollout.offline import writer as writer_mod
from fastrollout.offline.reader import OfflineReadError, parquet_files

pq = pytest.importorskip("pyarrow.parquet")


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(np.array_equal(a, b))


def assert_same_sa(a: Any, b: Any) -> None:
    assert (a.id_, a.agent_id, a.module_id, a.multi_agent_episode_id) == (
        b.id_,
        b.agent_id,
        b.module_id,
        b.multi_agent_episode_id,
    )
    assert (a.t_started, a.t, a.is_terminated, a.is_truncated) == (
        b.t_started,
        b.t,
        b.is_terminated,
        b.is_truncated,
    )
    sa, sb = a.get_state(), b.get_state()
    for f in ("observations", "actions", "rewards", "infos"):
        assert sa[f]["lookback"] == sb[f]["lookback"], f
        assert _same(sa[f]["data"], sb[f]["data"]), f
    assert sa["extra_model_outputs"].keys() == sb["extra_model_outputs"].keys()
    for k, v in sa["extra_model_outputs"].items():
        assert _same(v["data"], sb["extra_model_outputs"][k]["data"]), k
    assert a.observation_space == b.observation_space
    assert a.action_space == b.action_space


def assert_same(a: Any, b: Any) -> None:
    if hasattr(a, "agent_episodes"):
        assert (a.id_, a.env_t_started, a.env_t, a.is_terminated, a.is_truncated) == (
            b.id_,
            b.env_t_started,
            b.env_t,
            b.is_terminated,
            b.is_truncated,
        )
        assert a.agent_episodes.keys() == b.agent_episodes.keys()
        for aid in a.agent_episodes:
            assert_same_sa(a.agent_episodes[aid], b.agent_episodes[aid])
        sa, sb = a.get_state(), b.get_state()
        for k in ("env_t_to_agent_t", "agent_t_started", "_agent_to_module_mapping"):
            assert sa[k] == sb[k], k
    else:
        assert_same_sa(a, b)


def _sa_config(out: Path, **offline: Any) -> fr.RunnerConfig:
    return (
        fr.RunnerConfig()
        .environment("CartPole-v1")
        .env_runners(num_envs_per_env_runner=2)
        .debugging(seed=0)
        .offline_data(output=str(out), **offline)
    )


def _ma_config(out: Path, **offline: Any) -> fr.RunnerConfig:
    return (
        fr.RunnerConfig()
        .environment(make_multi_agent("CartPole-v1"), env_config={"num_agents": 2})
        .multi_agent(policies=["p0", "p1"], policy_mapping_fn=lambda a, e=None, **k: f"p{a}")
        .debugging(seed=0)
        .offline_data(output=str(out), **offline)
    )


def _record(config: fr.RunnerConfig, calls: list[int]) -> list[Any]:
    runner_cls = fr.MultiAgentEnvRunner if config.is_multi_agent else fr.SingleAgentEnvRunner
    runner = runner_cls(config=config)
    got: list[Any] = []
    for steps in calls:
        got += runner.sample(num_timesteps=steps)
    runner.stop()
    return got


# ----------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("multi_agent", [False, True])
@pytest.mark.parametrize("write_episodes", [True, False])
def test_round_trip(tmp_path: Path, multi_agent: bool, write_episodes: bool) -> None:
    make = _ma_config if multi_agent else _sa_config
    got = _record(make(tmp_path, output_write_episodes=write_episodes), [60, 45, 80])
    back = read_episodes(tmp_path)
    assert len(back) == len(got)
    for a, b in zip(got, back, strict=True):
        assert_same(a, b)
    # Ongoing chunks continue in the next call's file, with their look-back.
    assert any(e.t_started > 0 for e in back if not multi_agent) or multi_agent
    files = parquet_files(tmp_path)
    assert len(files) == 3  # one per sample() call
    if not multi_agent:
        assert files[0].parent.parent.name == "cartpoleenv"


@settings(
    max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    calls=st.lists(st.integers(1, 70), min_size=1, max_size=4),
    write_episodes=st.booleans(),
    max_rows=st.one_of(st.none(), st.integers(1, 60)),
    max_bytes=st.one_of(st.none(), st.integers(1, 20_000)),
    multi_agent=st.booleans(),
)
def test_round_trip_property(
    tmp_path_factory: pytest.TempPathFactory,
    calls: list[int],
    write_episodes: bool,
    max_rows: int | None,
    max_bytes: int | None,
    multi_agent: bool,
) -> None:
    out = tmp_path_factory.mktemp("rec")
    make = _ma_config if multi_agent else _sa_config
    config = make(
        out,
        output_write_episodes=write_episodes,
        output_max_rows_per_file=max_rows,
        output_max_file_size=max_bytes,
    )
    got = _record(config, calls)
    back = read_episodes(out)
    assert len(back) == len(got)
    for a, b in zip(got, back, strict=True):
        assert_same(a, b)
    if max_rows is not None:
        # Files hold whole chunks: at most max_rows rows, unless one chunk is longer.
        for f in parquet_files(out):
            rows = pq.read_metadata(f).num_rows
            if rows > max_rows:
                assert len(read_episodes(f)) == 1


def _items(path: Path) -> list[bytes]:
    """The packed chunks of an episodes-layout file."""
    return pq.read_table(path).column("item").to_pylist()


@pytest.mark.parametrize("max_bytes", [1, 3_000, 10**9])
def test_max_file_size_buffers_whole_chunks_up_to_the_limit(tmp_path: Path, max_bytes: int) -> None:
    config = _sa_config(tmp_path, output_max_file_size=max_bytes)
    got = _record(config, [40] * 8)
    files = sorted(parquet_files(tmp_path), key=lambda f: f.parent.name)
    sizes = [[len(item) for item in _items(f)] for f in files]
    assert sum(len(s) for s in sizes) == len(got)
    for this, following in itertools.pairwise(sizes):
        # A file closes when the next chunk would take it over the limit, not earlier;
        # it goes over only as one chunk alone.
        assert sum(this) <= max_bytes or len(this) == 1
        assert sum(this) + following[0] > max_bytes
    if max_bytes == 10**9:
        assert len(files) == 1  # all 8 sample() calls in one file, written at stop()
    for a, b in zip(got, read_episodes(tmp_path), strict=True):
        assert_same(a, b)


def test_non_numpy_episodes_round_trip(tmp_path: Path) -> None:
    for write_episodes in (True, False):
        out = tmp_path / str(write_episodes)
        config = _sa_config(out, output_write_episodes=write_episodes).env_runners(
            episodes_to_numpy=False
        )
        got = _record(config, [30, 30])
        back = read_episodes(out)
        for a, b in zip(got, back, strict=True):
            assert_same(a, b)


def test_config_checks_offline_data() -> None:
    c = fr.RunnerConfig()
    assert (c.output, c.output_write_episodes, c.output_max_rows_per_file) == (None, True, None)
    with pytest.raises(TypeError, match="output"):
        c.offline_data(output=3)
    with pytest.raises(ValueError, match="output_max_rows_per_file"):
        c.offline_data(output_max_rows_per_file=0)
    assert c.output_max_file_size is None
    with pytest.raises(ValueError, match="output_max_file_size"):
        c.offline_data(output_max_file_size=0)
    with pytest.raises(TypeError, match="output_max_file_size"):
        c.offline_data(output_max_file_size=1.5)
    with pytest.raises(TypeError, match="output_write_episodes"):
        c.offline_data(output_write_episodes="yes")
    c.output = 5
    with pytest.raises(TypeError, match="output"):
        c.validate()


# ----------------------------------------------------------------------------- RLlib


def test_rllib_reads_our_episode_files(tmp_path: Path) -> None:
    msgpack = pytest.importorskip("msgpack")
    mnp = pytest.importorskip("msgpack_numpy")
    from ray.rllib.env.single_agent_episode import SingleAgentEpisode as RLlibEpisode

    got = _record(_sa_config(tmp_path), [60, 60])
    items = [
        i for f in parquet_files(tmp_path) for i in pq.read_table(f).column("item").to_pylist()
    ]
    assert len(items) == len(got)
    for ours, item in zip(got, items, strict=True):
        # What RLlib's OfflinePreLearner does with input_read_episodes=True.
        theirs = RLlibEpisode.from_state(msgpack.unpackb(item, object_hook=mnp.decode))
        assert (theirs.id_, theirs.t_started, len(theirs), theirs.is_done) == (
            ours.id_,
            ours.t_started,
            len(ours),
            ours.is_done,
        )
        np.testing.assert_array_equal(theirs.get_observations(), ours.get_observations())
        np.testing.assert_array_equal(theirs.get_actions(), ours.get_actions())
        np.testing.assert_array_equal(theirs.get_rewards(), ours.get_rewards())
        np.testing.assert_array_equal(
            theirs.get_extra_model_outputs("action_logp"),
            ours.get_extra_model_outputs("action_logp"),
        )
        assert theirs.observation_space == ours.observation_space


def test_rllib_reads_our_column_files(tmp_path: Path) -> None:
    import ray.data
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.offline.offline_prelearner import OfflinePreLearner

    got = _record(_sa_config(tmp_path, output_write_episodes=False), [50])
    batch = ray.data.read_parquet(str(tmp_path)).take_batch(10_000, batch_format="numpy")
    config = PPOConfig().environment("CartPole-v1").offline_data(input_compress_columns=[])
    # RLlib's own mapping of rows to (one-step) episodes.
    prelearner = OfflinePreLearner.__new__(OfflinePreLearner)
    prelearner.config = config
    theirs = prelearner._map_to_episodes(batch)["episodes"]
    assert len(theirs) == sum(len(e) for e in got)
    obs = np.concatenate([e.get_observations()[:-1] for e in got])
    np.testing.assert_allclose([e.get_observations(0) for e in theirs], obs)
    assert sorted(theirs[0].extra_model_outputs) == sorted(got[0].extra_model_outputs)


@pytest.fixture(scope="module")
def rllib_recordings(tmp_path_factory: pytest.TempPathFactory) -> dict[bool, tuple[Path, list]]:
    pytest.importorskip("msgpack_numpy")
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.offline.offline_env_runner import OfflineSingleAgentEnvRunner

    out = {}
    for write_episodes in (True, False):
        path = tmp_path_factory.mktemp(f"rllib{write_episodes}")
        config = (
            PPOConfig()
            .environment("CartPole-v1")
            .env_runners(num_env_runners=0, num_envs_per_env_runner=2)
            .offline_data(output=str(path), output_write_episodes=write_episodes)
        )
        runner = OfflineSingleAgentEnvRunner(config=config)
        episodes = runner.sample(num_timesteps=40)
        runner.stop()
        out[write_episodes] = (path, episodes)
    return out


def test_we_read_rllib_episode_files(rllib_recordings: dict) -> None:
    path, theirs = rllib_recordings[True]
    ours = read_episodes(path)
    assert len(ours) == len(theirs)
    by_id = {e.id_: e for e in ours}
    for t in theirs:
        o = by_id[t.id_]
        assert (o.t_started, len(o), o.is_terminated, o.is_truncated) == (
            t.t_started,
            len(t),
            t.is_terminated,
            t.is_truncated,
        )
        np.testing.assert_array_equal(o.get_observations(), np.stack(t.get_observations()))
        np.testing.assert_array_equal(o.get_actions(), np.stack(t.get_actions()))
        np.testing.assert_array_equal(o.get_rewards(), t.get_rewards())
        assert o.get_infos() == t.get_infos()
        assert o.observation_space == t.observation_space


def test_we_read_rllib_column_files(rllib_recordings: dict) -> None:
    path, theirs = rllib_recordings[False]
    # RLlib compresses obs/new_obs by pickling them (output_compress_columns).
    with pytest.raises(OfflineReadError, match="allow_pickle"):
        read_episodes(path)
    ours = read_episodes(path, allow_pickle=True)
    assert [(e.id_, len(e), e.is_done) for e in ours] == [
        (t.id_, len(t), t.is_done) for t in theirs
    ]
    for o, t in zip(ours, theirs, strict=True):
        np.testing.assert_allclose(o.get_observations(), np.stack(t.get_observations()))
        np.testing.assert_array_equal(o.get_actions(), np.stack(t.get_actions()))
        np.testing.assert_allclose(
            o.get_extra_model_outputs("action_logp"),
            np.stack(t.get_extra_model_outputs("action_logp")),
        )


# ----------------------------------------------------------------------------- bad files


def test_truncated_file_names_file_and_keeps_earlier(tmp_path: Path) -> None:
    got = _record(_sa_config(tmp_path), [40, 40, 40])
    files = parquet_files(tmp_path)
    first = len(read_episodes(files[0]))
    last = read_episodes(files[2])
    data = files[1].read_bytes()
    files[1].write_bytes(data[: len(data) // 2])
    with pytest.raises(OfflineReadError) as info:
        read_episodes(tmp_path)
    assert str(files[1]) in str(info.value) and "row 0" in str(info.value)
    assert info.value.path == files[1] and info.value.row == 0
    assert len(info.value.episodes) == first
    for a, b in zip(got, info.value.episodes, strict=False):
        assert_same(a, b)
    skipped = read_episodes(tmp_path, on_error="skip")
    assert [e.id_ for e in skipped] == [e.id_ for e in info.value.episodes + last]


def test_corrupt_row_names_file_and_row(tmp_path: Path) -> None:
    got = _record(_sa_config(tmp_path), [120])
    [file] = parquet_files(tmp_path)
    table = pq.read_table(file)
    items = table.column("item").to_pylist()
    assert len(items) >= 3
    items[2] = items[2][: len(items[2]) // 3]
    import pyarrow as pa

    pq.write_table(pa.table({"item": pa.array(items, type=pa.binary())}), file)
    with pytest.raises(OfflineReadError, match=r"row 2") as info:
        read_episodes(tmp_path)
    assert str(file) in str(info.value) and info.value.row == 2
    assert len(info.value.episodes) == 2
    for a, b in zip(got[:2], info.value.episodes, strict=True):
        assert_same(a, b)
    rest = read_episodes(tmp_path, on_error="skip")
    assert [e.id_ for e in rest] == [e.id_ for i, e in enumerate(got) if i != 2]


# ----------------------------------------------------------------------------- writer thread


def test_slow_disk_makes_sample_wait(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    started = threading.Event()
    release = threading.Event()
    real = writer_mod.EpisodeWriter._write_file

    def slow(self: Any, payloads: list[Any]) -> None:
        started.set()
        release.wait(10)
        real(self, payloads)

    monkeypatch.setattr(writer_mod.EpisodeWriter, "_write_file", slow)
    runner = fr.SingleAgentEnvRunner(config=_sa_config(tmp_path))
    runner.sample(num_timesteps=10)  # taken by the writer thread, which then blocks
    assert started.wait(10)
    writer = runner.__dict__["_offline_writer"]
    runner.sample(num_timesteps=10)
    runner.sample(num_timesteps=10)  # queue (2) full now
    assert writer._queue.qsize() == writer._queue.maxsize
    done = threading.Event()
    thread = threading.Thread(target=lambda: (runner.sample(num_timesteps=10), done.set()))
    thread.start()
    time.sleep(0.3)
    assert not done.is_set()  # sample() waits for the writer
    assert writer._queue.qsize() <= writer._queue.maxsize
    release.set()
    thread.join(10)
    assert done.is_set()
    runner.stop()
    assert len(parquet_files(tmp_path)) == 4


def test_failed_write_leaves_no_partial_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def crash(table: Any, where: Any, **kwargs: Any) -> None:
        Path(where).write_bytes(b"PAR1 half a file")
        raise OSError("disk full")

    runner = fr.SingleAgentEnvRunner(config=_sa_config(tmp_path))
    runner.sample(num_timesteps=20)
    writer = runner.__dict__["_offline_writer"]
    deadline = time.monotonic() + 10
    while not writer.files and time.monotonic() < deadline:
        time.sleep(0.01)
    monkeypatch.setattr(pq, "write_table", crash)
    runner.sample(num_timesteps=20)
    with pytest.raises(writer_mod.OfflineWriteError, match="disk full"):
        runner.stop()
    monkeypatch.undo()
    names = sorted(p.name for p in tmp_path.rglob("*") if p.is_file())
    assert all(n.endswith(".parquet") for n in names)
    assert len(names) == 1  # the first call's file; the failed one left nothing
    assert read_episodes(tmp_path)


def test_temporary_files_are_not_read(tmp_path: Path) -> None:
    _record(_sa_config(tmp_path), [20])
    [file] = parquet_files(tmp_path)
    (file.parent / f".{file.name}.tmp").write_bytes(b"partial")
    assert len(parquet_files(tmp_path)) == 1


def test_layout_codec_matches_msgpack_numpy() -> None:
    msgpack = pytest.importorskip("msgpack")
    mnp = pytest.importorskip("msgpack_numpy")
    value = {
        "a": np.arange(6, dtype=np.float32).reshape(2, 3),
        "b": np.int64(3),
        "c": [np.bool_(True), 1.5, "x"],
    }
    ours = L.packb(value)
    assert _same(msgpack.unpackb(ours, object_hook=mnp.decode), value)
    assert _same(L.unpackb(msgpack.packb(value, default=mnp.encode)), value)


def test_import_without_pyarrow(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('pyarrow', 'msgpack'):\n"
        "            raise ImportError('blocked ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import fastrollout, fastrollout.offline\n"
        "try:\n"
        "    fastrollout.offline.read_episodes('.')\n"
        "except ImportError as e:\n"
        "    print('ERR', e)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert res.returncode == 0, res.stderr
    assert "fastrollout[offline]" in res.stdout
