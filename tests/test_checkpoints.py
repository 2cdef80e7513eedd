"""Checkpoints: RLlib's Checkpointable API on runners, EnvRunnerGroup and RolloutWorker.

Round trips for each class, the directory layout (weights in ``.npz`` read without pickle,
connector states as JSON + npz), a restored runner that samples what the original samples,
``components`` / ``not_components``, and the refusals (other class, other format version,
missing or corrupt files, the old ``state.pkl``).
"""

from __future__ import annotations

import json
import math
import pickle
import sys
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

import fastrollout as fr
from fastrollout import EnvRunnerGroup, RolloutWorker, RunnerConfig
from fastrollout.checkpoints import CHECKPOINT_FORMAT_VERSION, read_tree, write_tree
from fastrollout.connectors.env_to_module import MeanStdFilter
from fastrollout.core import DEFAULT_MODULE_ID
from fastrollout.env.examples import TurnBasedEnv
from fastrollout.errors import CheckpointError
from fastrollout.runners import EnvRunner, MultiAgentEnvRunner, SingleAgentEnvRunner


def _mean_std(env: Any = None, spaces: Any = None, device: Any = None) -> Any:
    return MeanStdFilter()


def _by_player(agent_id: Any, episode: Any = None, **kwargs: Any) -> str:
    return "p0" if agent_id == "player_0" else "p1"


def _single(seed: int = 3, **runners: Any) -> RunnerConfig:
    return (
        RunnerConfig()
        .environment("CartPole-v1")
        .env_runners(num_envs_per_env_runner=2, env_to_module_connector=_mean_std, **runners)
        .rl_module(model_config={"fcnet_hiddens": [8]})
        .resources(device="cpu")
        .debugging(seed=seed)
    )


def _multi(seed: int = 3) -> RunnerConfig:
    return (
        RunnerConfig()
        .environment(TurnBasedEnv)
        .multi_agent(policies={"p0", "p1"}, policy_mapping_fn=_by_player)
        .rl_module(model_config={"fcnet_hiddens": [8]})
        .resources(device="cpu")
        .debugging(seed=seed)
    )


def _perturb(runner: EnvRunner, seed: int, seq_no: int = 2) -> None:
    """New weights (not the seeded initial ones), so that a restore is visible."""
    rng = np.random.default_rng(seed)
    weights = runner.get_weights()
    new = {
        mid: {k: (v + rng.normal(0, 0.5, v.shape)).astype(v.dtype) for k, v in w.items()}
        for mid, w in weights.items()
    }
    runner.set_weights(new, weights_seq_no=seq_no)


def _assert_same_weights(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert sorted(a) == sorted(b)
    for mid in a:
        assert sorted(a[mid]) == sorted(b[mid])
        for k, v in a[mid].items():
            np.testing.assert_array_equal(b[mid][k], v, err_msg=f"{mid}/{k}")


def _trace(episodes: list[Any]) -> list[tuple[Any, ...]]:
    """Observations and actions of single-agent episodes, in order."""
    return [
        (np.asarray(e.get_observations()).tolist(), np.asarray(e.get_actions()).tolist())
        for e in episodes
    ]


def _ma_trace(episodes: list[Any]) -> list[Any]:
    out = []
    for e in episodes:
        per_agent = e.agent_episodes
        out.append(
            {
                aid: (
                    np.asarray(sa.get_observations()).tolist(),
                    np.asarray(sa.get_actions()).tolist(),
                )
                for aid, sa in sorted(per_agent.items())
            }
        )
    return out


# -- the layout ------------------------------------------------------------------------


def test_runner_checkpoint_layout_has_metadata_npz_weights_and_json_connector_states(
    tmp_path: Path,
) -> None:
    a = SingleAgentEnvRunner(config=_single())
    a.sample(num_timesteps=20)
    path = Path(a.save_to_path(tmp_path / "ckpt"))
    meta = json.loads((path / "metadata.json").read_text())
    assert meta["checkpoint_format_version"] == CHECKPOINT_FORMAT_VERSION
    assert meta["class"] == {
        "module": "fastrollout.runners.single_agent_env_runner",
        "name": "SingleAgentEnvRunner",
    }
    assert meta["versions"]["fastrollout"] == fr.__version__
    assert meta["versions"]["torch"] == torch.__version__
    assert meta["versions"]["gymnasium"] == gym.__version__
    assert meta["config"]["settings"]["env"] == "CartPole-v1"
    assert meta["config"]["settings"]["env_to_module_connector"].endswith("_mean_std")
    assert set(meta["components"]) == {
        "rl_module",
        "env_to_module_connector",
        "module_to_env_connector",
    }
    assert (path / "class_and_ctor_args.pkl").is_file()
    assert json.loads((path / "state.json").read_text()) == {
        "num_env_steps_sampled_lifetime": 20,
        "weights_seq_no": 0,
    }
    # Weights: one npz per module, readable without pickle.
    with np.load(path / "rl_module" / DEFAULT_MODULE_ID / "module_state.npz") as npz:
        saved = {k: npz[k] for k in npz.files}
    for k, v in a.get_weights()[DEFAULT_MODULE_ID].items():
        np.testing.assert_array_equal(saved[k], v)
    # The MeanStdFilter's statistics: JSON + npz, no pickle anywhere but the ctor args.
    e2m = path / "env_to_module_connector"
    assert (e2m / "state.json").is_file() and (e2m / "state.npz").is_file()
    assert sorted(p.name for p in path.rglob("*.pkl")) == ["class_and_ctor_args.pkl"]


def test_save_to_path_without_a_path_makes_a_new_directory() -> None:
    a = SingleAgentEnvRunner(config=_single())
    first, second = a.save_to_path(), a.save_to_path()
    assert first != second
    assert (Path(first) / "metadata.json").is_file()


# -- round trips -----------------------------------------------------------------------


def test_single_agent_runner_round_trip_with_from_checkpoint(tmp_path: Path) -> None:
    a = SingleAgentEnvRunner(config=_single())
    a.sample(num_timesteps=30)
    _perturb(a, seed=1, seq_no=4)
    path = a.save_to_path(tmp_path / "ckpt")
    b = SingleAgentEnvRunner.from_checkpoint(path)
    assert type(b) is SingleAgentEnvRunner
    _assert_same_weights(a.get_weights(), b.get_weights())
    assert b.get_state()["weights_seq_no"] == 4
    assert b.num_env_steps_sampled_lifetime == 30
    # The MeanStdFilter's statistics (all it has seen) came along.
    stats_a = a._env_to_module["MeanStdFilter"].running_stats(DEFAULT_MODULE_ID)
    stats_b = b._env_to_module["MeanStdFilter"].running_stats(DEFAULT_MODULE_ID)
    assert stats_b.n == stats_a.n >= 30
    np.testing.assert_array_equal(stats_b.mean, stats_a.mean)
    np.testing.assert_array_equal(stats_b.std, stats_a.std)
    # The base class builds the checkpoint's class too (as RLlib's from_checkpoint).
    assert type(EnvRunner.from_checkpoint(path)) is SingleAgentEnvRunner


def test_restored_single_agent_runner_samples_the_same_episodes(tmp_path: Path) -> None:
    a = SingleAgentEnvRunner(config=_single(seed=11))
    _perturb(a, seed=5)
    path = a.save_to_path(tmp_path / "ckpt")
    expected = _trace(a.sample(num_episodes=3, explore=True))
    b = SingleAgentEnvRunner.from_checkpoint(path)
    assert _trace(b.sample(num_episodes=3, explore=True)) == expected
    # The weights make the difference: the same config without the restore differs.
    c = SingleAgentEnvRunner(config=_single(seed=11))
    assert _trace(c.sample(num_episodes=3, explore=True)) != expected


def test_multi_agent_runner_round_trip_samples_the_same_episodes(tmp_path: Path) -> None:
    a = MultiAgentEnvRunner(config=_multi(seed=7))
    _perturb(a, seed=2, seq_no=3)
    path = Path(a.save_to_path(tmp_path / "ma"))
    assert sorted(p.name for p in (path / "rl_module").iterdir() if p.is_dir()) == ["p0", "p1"]
    expected = _ma_trace(a.sample(num_episodes=2, explore=True))
    b = MultiAgentEnvRunner.from_checkpoint(path)
    assert type(b) is MultiAgentEnvRunner
    assert b.get_state()["weights_seq_no"] == 3
    assert _ma_trace(b.sample(num_episodes=2, explore=True)) == expected
    c = MultiAgentEnvRunner(config=_multi(seed=7))
    assert _ma_trace(c.sample(num_episodes=2, explore=True)) != expected


def test_restore_loads_older_weights_and_their_seq_no(tmp_path: Path) -> None:
    a = SingleAgentEnvRunner(config=_single())
    _perturb(a, seed=1, seq_no=2)
    path = a.save_to_path(tmp_path / "old")
    b = SingleAgentEnvRunner(config=_single(seed=4))
    _perturb(b, seed=9, seq_no=7)
    b.set_state(a.get_state())  # set_state refuses the older number's weights ...
    with pytest.raises(AssertionError):
        _assert_same_weights(a.get_weights(), b.get_weights())
    b.restore_from_path(path)  # ... a restore does not
    _assert_same_weights(a.get_weights(), b.get_weights())
    assert b.get_state()["weights_seq_no"] == 2


def test_components_and_not_components(tmp_path: Path) -> None:
    a = SingleAgentEnvRunner(config=_single())
    a.sample(num_timesteps=10)
    _perturb(a, seed=1)
    assert set(a.get_state(components="rl_module")) == {
        "rl_module",
        "weights_seq_no",
        "num_env_steps_sampled_lifetime",
    }
    assert "rl_module" not in a.get_state(not_components="rl_module")
    # A state without the module writes no rl_module directory ...
    path = Path(
        a.save_to_path(tmp_path / "no_module", state=a.get_state(not_components="rl_module"))
    )
    assert not (path / "rl_module").exists()
    assert set(json.loads((path / "metadata.json").read_text())["components"]) == {
        "env_to_module_connector",
        "module_to_env_connector",
    }
    b = SingleAgentEnvRunner(config=_single(seed=4))
    before = b.get_weights()
    b.restore_from_path(path)  # ... and its restore leaves the weights alone
    _assert_same_weights(before, b.get_weights())
    assert b.num_env_steps_sampled_lifetime == 10
    # One component from its own directory: only the weights change.
    full = Path(a.save_to_path(tmp_path / "full"))
    c = SingleAgentEnvRunner(config=_single(seed=4))
    c.restore_from_path(full / "rl_module", component="rl_module")
    _assert_same_weights(a.get_weights(), c.get_weights())
    assert c.num_env_steps_sampled_lifetime == 0
    assert c.get_state()["env_to_module_connector"] == {}
    with pytest.raises(CheckpointError, match="holds component 'env_to_module_connector'"):
        c.restore_from_path(full / "env_to_module_connector", component="rl_module")
    with pytest.raises(CheckpointError, match="no checkpoint component 'policies'"):
        c.restore_from_path(full, component="policies")


# -- refusals --------------------------------------------------------------------------


def test_checkpoint_of_another_class_is_refused_naming_both(tmp_path: Path) -> None:
    ma_path = MultiAgentEnvRunner(config=_multi()).save_to_path(tmp_path / "ma")
    sa = SingleAgentEnvRunner(config=_single())
    with pytest.raises(CheckpointError, match=r"MultiAgentEnvRunner.*SingleAgentEnvRunner"):
        sa.restore_from_path(ma_path)
    with pytest.raises(CheckpointError, match=r"MultiAgentEnvRunner, not of .*SingleAgentEnv"):
        SingleAgentEnvRunner.from_checkpoint(ma_path)
    sa_path = sa.save_to_path(tmp_path / "sa")
    with pytest.raises(CheckpointError, match=r"SingleAgentEnvRunner\.from_checkpoint"):
        EnvRunnerGroup.from_checkpoint(sa_path)


def test_checkpoint_of_another_format_version_is_refused_naming_both(tmp_path: Path) -> None:
    a = SingleAgentEnvRunner(config=_single())
    path = Path(a.save_to_path(tmp_path / "ckpt"))
    meta = json.loads((path / "metadata.json").read_text())
    meta["checkpoint_format_version"] = CHECKPOINT_FORMAT_VERSION + 1
    meta["versions"]["fastrollout"] = "9.9.9"
    (path / "metadata.json").write_text(json.dumps(meta))
    v = CHECKPOINT_FORMAT_VERSION
    message = rf"format version {v + 1}.*9\.9\.9.*reads version {v} only"
    with pytest.raises(CheckpointError, match=message):
        a.restore_from_path(path)
    with pytest.raises(CheckpointError, match=message):
        SingleAgentEnvRunner.from_checkpoint(path)


def test_missing_and_corrupt_checkpoints_give_clear_errors(tmp_path: Path) -> None:
    a = SingleAgentEnvRunner(config=_single())
    with pytest.raises(FileNotFoundError, match="no checkpoint at"):
        a.restore_from_path(tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match="no checkpoint at"):
        SingleAgentEnvRunner.from_checkpoint(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="not a fastrollout checkpoint: it has no metadata"):
        a.restore_from_path(tmp_path / "empty")

    path = Path(a.save_to_path(tmp_path / "ckpt"))
    with pytest.raises(CheckpointError, match="directory of component 'rl_module'"):
        a.restore_from_path(path / "rl_module")
    npz = path / "rl_module" / DEFAULT_MODULE_ID / "module_state.npz"
    npz.write_bytes(b"not a zip file")
    with pytest.raises(CheckpointError, match=r"module_state\.npz' is corrupt"):
        a.restore_from_path(path)
    npz.unlink()
    with pytest.raises(CheckpointError, match=r"module_state\.npz' is missing"):
        a.restore_from_path(path)
    (path / "metadata.json").write_text("{not json")
    with pytest.raises(CheckpointError, match=r"metadata\.json' is corrupt"):
        a.restore_from_path(path)

    path = Path(a.save_to_path(tmp_path / "ckpt2"))
    for f in (path / "module_to_env_connector").iterdir():
        f.unlink()
    (path / "module_to_env_connector").rmdir()
    with pytest.raises(CheckpointError, match="component 'module_to_env_connector' but has no"):
        a.restore_from_path(path)
    (path / "class_and_ctor_args.pkl").unlink()
    with pytest.raises(CheckpointError, match="no constructor arguments"):
        SingleAgentEnvRunner.from_checkpoint(path)


def test_old_state_pkl_checkpoints_load_with_a_deprecation_warning(tmp_path: Path) -> None:
    a = SingleAgentEnvRunner(config=_single())
    _perturb(a, seed=3, seq_no=5)
    old = tmp_path / "old"
    old.mkdir()
    with open(old / "state.pkl", "wb") as f:  # what save_to_path wrote before format 1
        pickle.dump({"state": a.get_state(), "class": "SingleAgentEnvRunner"}, f)
    b = SingleAgentEnvRunner(config=_single(seed=8))
    with pytest.warns(FutureWarning, match="state.pkl checkpoint of an older fastrollout"):
        b.restore_from_path(old)
    _assert_same_weights(a.get_weights(), b.get_weights())
    assert b.get_state()["weights_seq_no"] == 5
    ma = MultiAgentEnvRunner(config=_multi())
    with pytest.raises(
        CheckpointError, match="SingleAgentEnvRunner; it does not load into a Multi"
    ):
        ma.restore_from_path(old)


# -- the state tree form ---------------------------------------------------------------


def test_state_tree_round_trips_without_pickle(tmp_path: Path) -> None:
    state = {
        "ints": {0: np.arange(3), 1: (1.5, "x", None)},
        "nested": [{"a": np.float32(2.5), "b": True}, []],
        "__dunder__": math.inf,
        "nan": math.nan,
        "tensor": torch.tensor([[1.0, 2.0]]),
        "scalar": np.int64(7),
    }
    assert write_tree(tmp_path, "state", state) == "json"
    assert not (tmp_path / "state.pkl").exists()
    back = read_tree(tmp_path, "state")
    np.testing.assert_array_equal(back["ints"][0], np.arange(3))
    assert back["ints"][1] == (1.5, "x", None)
    assert back["nested"][0]["a"] == np.float32(2.5)
    assert isinstance(back["nested"][0]["a"], np.float32)
    assert back["nested"][0]["b"] is True and back["nested"][1] == []
    assert back["__dunder__"] == math.inf and math.isnan(back["nan"])
    assert torch.equal(back["tensor"], state["tensor"])
    assert back["scalar"] == 7 and isinstance(back["scalar"], np.int64)
    # Python objects are pickled (that piece only), and an earlier JSON form is removed.
    assert write_tree(tmp_path, "state", {"obj": gym.spaces.Discrete(3)}) == "pickle"
    assert not (tmp_path / "state.json").exists()
    assert read_tree(tmp_path, "state") == {"obj": gym.spaces.Discrete(3)}


# -- EnvRunnerGroup ----------------------------------------------------------------------


def test_local_group_round_trip(tmp_path: Path) -> None:
    group = EnvRunnerGroup(config=_single())
    group.sample(num_timesteps=20)
    _perturb(group.local_env_runner, seed=4)
    group.sync_weights()
    assert group.weights_seq_no == 1
    path = Path(group.save_to_path(tmp_path / "group"))
    assert (path / "env_runner" / "metadata.json").is_file()
    assert (path / "env_runner" / "rl_module" / DEFAULT_MODULE_ID / "module_state.npz").is_file()
    assert set(group.get_state()) == {"env_runner", "weights_seq_no"}
    assert set(group.get_state(components="env_runner/rl_module")["env_runner"]) == {
        "rl_module",
        "weights_seq_no",
        "num_env_steps_sampled_lifetime",
    }
    other = EnvRunnerGroup.from_checkpoint(path)
    assert type(other.local_env_runner) is SingleAgentEnvRunner
    assert other.weights_seq_no == 1
    _assert_same_weights(group.local_env_runner.get_weights(), other.local_env_runner.get_weights())
    assert other.local_env_runner.num_env_steps_sampled_lifetime == 20
    group.stop()
    other.stop()


@pytest.fixture
def by_value(ray_local: Any) -> Any:
    from ray import cloudpickle

    # The actors unpickle the config's connector factory from this module, which is not
    # importable there: ship it by value.
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    yield ray_local
    cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


def test_group_with_a_remote_runner_round_trip(tmp_path: Path, by_value: Any) -> None:
    config = _single().env_runners(num_env_runners=1, num_cpus_per_env_runner=0.5)
    group = EnvRunnerGroup(config=config)
    try:
        _perturb(group.local_env_runner, seed=6)
        group.sync_weights(timeout_seconds=None)
        group.sync_weights(timeout_seconds=None)
        path = group.save_to_path(tmp_path / "group")
    finally:
        group.stop()
    saved = group.local_env_runner.get_weights()
    restored = EnvRunnerGroup.from_checkpoint(path)
    try:
        assert restored.num_remote_env_runners() == 1
        assert restored.weights_seq_no == 2
        remote = restored.foreach_env_runner(
            lambda r: (r.get_weights(), r.get_state()["weights_seq_no"]), local_env_runner=False
        )
        assert len(remote) == 1
        _assert_same_weights(saved, remote[0][0])
        assert remote[0][1] == 2
        assert sum(len(e) for e in restored.sample(num_timesteps=10)) >= 10
    finally:
        restored.stop()
    # The constructor's arguments can be replaced: the same checkpoint without Ray actors.
    local = EnvRunnerGroup.from_checkpoint(
        path, config=config.copy().env_runners(num_env_runners=0)
    )
    assert local.num_remote_env_runners() == 0
    _assert_same_weights(saved, local.local_env_runner.get_weights())
    local.stop()


# -- RolloutWorker ---------------------------------------------------------------------


def _cartpole(ctx: Any) -> Any:
    return gym.make("CartPole-v1")


def test_rollout_worker_round_trip(tmp_path: Path) -> None:
    config = (
        RunnerConfig()
        .env_runners(rollout_fragment_length=32, observation_filter="MeanStdFilter")
        .rl_module(model_config={"fcnet_hiddens": [8]})
        .debugging(seed=1)
    )
    worker = RolloutWorker(env_creator=_cartpole, config=config)
    worker.learn_on_batch(worker.sample())
    worker.global_vars["timestep"] = 32
    path = Path(worker.save_to_path(tmp_path / "worker"))
    assert (path / "policy_states" / DEFAULT_MODULE_ID / "module_state.npz").is_file()
    assert (path / "filters" / "state.json").is_file()
    assert sorted(p.name for p in path.rglob("*.pkl")) == ["class_and_ctor_args.pkl"]
    other = RolloutWorker.from_checkpoint(path)
    a, b = worker.get_state(), other.get_state()
    assert b["global_vars"] == {"timestep": 32}
    _assert_same_weights(
        {p: s["weights"] for p, s in a["policy_states"].items()},
        {p: s["weights"] for p, s in b["policy_states"].items()},
    )
    pa, pb = a["policy_states"][DEFAULT_MODULE_ID], b["policy_states"][DEFAULT_MODULE_ID]
    assert pb["num_grad_updates"] == pa["num_grad_updates"] > 0
    opt_a, opt_b = pa["optimizer"]["state"], pb["optimizer"]["state"]
    assert sorted(opt_a) == sorted(opt_b)
    for i in opt_a:
        for k, v in opt_a[i].items():
            assert torch.equal(torch.as_tensor(opt_b[i][k]), torch.as_tensor(v)), (i, k)
    fa = a["filters"][DEFAULT_MODULE_ID]["running_stats"]
    fb = b["filters"][DEFAULT_MODULE_ID]["running_stats"]
    assert fa.keys() == fb.keys()
    for k in fa:
        np.testing.assert_array_equal(np.asarray(fb[k]), np.asarray(fa[k]), err_msg=k)
    assert set(worker.get_state(components="global_vars")) == {"policy_ids", "global_vars"}
    worker.stop()
    other.stop()
