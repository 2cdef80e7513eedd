"""export_module: TorchScript and ONNX files that compute the module's outputs without it."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch

from fastrollout.core import Columns
from fastrollout.modules import RLModule, RLModuleSpec
from fastrollout.modules.export import export_module

CARTPOLE_OBS = gym.spaces.Box(
    np.array([-4.8, -np.inf, -0.42, -np.inf], np.float32),
    np.array([4.8, np.inf, 0.42, np.inf], np.float32),
    dtype=np.float32,
)
CARTPOLE_ACT = gym.spaces.Discrete(2)
PENDULUM_OBS = gym.spaces.Box(-np.array([1, 1, 8], np.float32), np.array([1, 1, 8], np.float32))
PENDULUM_ACT = gym.spaces.Box(-2.0, 2.0, (1,), np.float32)
DICT_OBS = gym.spaces.Dict(
    {
        "pos": gym.spaces.Box(-1.0, 1.0, (2, 3), np.float32),
        "mode": gym.spaces.Discrete(3, start=1),
        "more": gym.spaces.Tuple((gym.spaces.MultiDiscrete([2, 4]), gym.spaces.MultiBinary(3))),
    }
)


def _module(obs, act, **kwargs):
    torch.manual_seed(0)
    return RLModuleSpec(
        observation_space=obs, action_space=act, model_config={"fcnet_hiddens": [32, 32]}, **kwargs
    ).build()


def _leaf_arrays(space, n, seed):
    """(name, batch) per observation leaf, as the exported model takes them."""
    space.seed(seed)
    rows = [space.sample() for _ in range(n)]

    def stack(path, sub):
        if isinstance(sub, gym.spaces.Dict):
            return [x for k, s in sub.items() for x in stack((*path, k), s)]
        if isinstance(sub, gym.spaces.Tuple):
            return [x for i, s in enumerate(sub.spaces) for x in stack((*path, i), s)]
        vals = []
        for r in rows:
            for k in path:
                r = r[k]
            vals.append(np.asarray(r))
        dtype = (
            np.int64 if isinstance(sub, gym.spaces.Discrete | gym.spaces.MultiDiscrete) else None
        )
        return [(".".join(["obs", *map(str, path)]), np.stack(vals).astype(dtype or vals[0].dtype))]

    return stack((), space)


def _batch(space, leaves):
    """The module's batch of the leaf arrays (the observation structure rebuilt)."""
    it = iter(torch.as_tensor(a) for _, a in leaves)

    def build(sub):
        if isinstance(sub, gym.spaces.Dict):
            return {k: build(s) for k, s in sub.items()}
        if isinstance(sub, gym.spaces.Tuple):
            return tuple(build(s) for s in sub.spaces)
        return next(it)

    return {Columns.OBS: build(space)}


def _expected(module, space, leaves):
    batch = _batch(space, leaves)
    logits = module.forward_inference(batch)[Columns.ACTION_DIST_INPUTS].numpy()
    if module.inference_only:
        return [logits]
    with torch.no_grad():
        return [logits, module.compute_values(batch).numpy()]


CASES = {
    "cartpole": (CARTPOLE_OBS, CARTPOLE_ACT, {}),
    "pendulum": (PENDULUM_OBS, PENDULUM_ACT, {}),
    "dict": (DICT_OBS, gym.spaces.MultiDiscrete([3, 2]), {}),
    "inference_only": (CARTPOLE_OBS, CARTPOLE_ACT, {"inference_only": True}),
}

# Loads every model.pt with fastrollout made unimportable, runs it on the saved inputs and
# saves its outputs.
_LOADER = textwrap.dedent(
    """
    import sys, importlib.abc

    class _Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] == "fastrollout":
                raise ImportError("fastrollout must not be imported")

    sys.meta_path.insert(0, _Block())
    import warnings
    warnings.simplefilter("ignore")
    import numpy as np, torch
    for d in sys.argv[1:]:
        inputs = np.load(d + "/inputs.npz")
        model = torch.jit.load(d + "/model.pt")
        outs = model(*[torch.from_numpy(inputs[k]) for k in inputs.files])
        outs = outs if isinstance(outs, tuple) else (outs,)
        np.savez(d + "/outputs.npz", *[o.numpy() for o in outs])
    assert not any(m.split(".")[0] == "fastrollout" for m in sys.modules)
    print("ok")
    """
)


def test_torchscript_runs_without_fastrollout(tmp_path):
    dirs, expected = [], {}
    for name, (obs, act, kwargs) in CASES.items():
        module = _module(obs, act, **kwargs)
        out_dir = tmp_path / name
        path = export_module(module, out_dir)
        assert path == out_dir / "model.pt" and path.exists()
        leaves = _leaf_arrays(obs, 5, seed=1)
        np.savez(out_dir / "inputs.npz", **dict(leaves))
        expected[name] = _expected(module, obs, leaves)
        dirs.append(str(out_dir))
    proc = subprocess.run(
        [sys.executable, "-I", "-c", _LOADER, *dirs],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr
    for name in CASES:
        got = np.load(tmp_path / name / "outputs.npz")
        got = [got[f"arr_{i}"] for i in range(len(got.files))]
        want = expected[name]
        assert len(got) == len(want) == (1 if name == "inference_only" else 2), name
        for g, w in zip(got, want, strict=True):
            assert g.shape == w.shape and g.dtype == w.dtype
            np.testing.assert_allclose(g, w, rtol=0, atol=1e-6)


def test_onnx_runs_in_onnxruntime(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    for name, (obs, act, kwargs) in CASES.items():
        module = _module(obs, act, **kwargs)
        path = export_module(module, tmp_path / name, onnx=17)
        assert path == tmp_path / name / "model.onnx"
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        meta = json.loads((tmp_path / name / "model.json").read_text())
        assert [i.name for i in session.get_inputs()] == [i["name"] for i in meta["inputs"]]
        assert [o.name for o in session.get_outputs()] == [o["name"] for o in meta["outputs"]]
        for n in (1, 7):  # the batch axis is dynamic
            leaves = _leaf_arrays(obs, n, seed=n)
            got = session.run(None, dict(leaves))
            want = _expected(module, obs, leaves)
            assert len(got) == len(want)
            for g, w in zip(got, want, strict=True):
                assert g.shape == w.shape
                np.testing.assert_allclose(g, w, rtol=0, atol=1e-6)
    single = ort.InferenceSession(str(tmp_path / "cartpole" / "model.onnx"))
    assert [i.name for i in single.get_inputs()] == ["obs"]
    assert [o.name for o in single.get_outputs()] == ["action_dist_inputs", "vf_preds"]


def test_model_json_describes_the_call(tmp_path):
    module = _module(PENDULUM_OBS, PENDULUM_ACT)
    export_module(module, tmp_path)
    meta = json.loads((tmp_path / "model.json").read_text())
    assert meta["format"] == "torchscript" and meta["file"] == "model.pt"
    assert meta["inputs"] == [
        {
            "name": "obs",
            "observation_path": [],
            "dtype": "float32",
            "shape": ["batch", 3],
            "space": {
                "type": "Box",
                "shape": [3],
                "dtype": "float32",
                "low": [-1.0, -1.0, -8.0],
                "high": [1.0, 1.0, 8.0],
            },
        }
    ]
    assert meta["outputs"] == [
        {"name": "action_dist_inputs", "dtype": "float32", "shape": ["batch", 2]},
        {"name": "vf_preds", "dtype": "float32", "shape": ["batch"]},
    ]
    assert meta["action_space"]["low"] == -2.0 and meta["action_space"]["shape"] == [1]
    assert meta["action_distribution"]["class"] == "TorchDiagGaussian"
    assert meta["module_class"].endswith("DefaultMLPModule")

    export_module(_module(CARTPOLE_OBS, CARTPOLE_ACT), tmp_path / "cp", onnx=13)
    meta = json.loads((tmp_path / "cp" / "model.json").read_text())
    assert meta["format"] == "onnx" and meta["onnx_opset"] == 13
    high, low = meta["observation_space"]["high"], meta["observation_space"]["low"]
    assert high[1::2] == ["inf", "inf"] and low[1::2] == ["-inf", "-inf"]
    assert high[0] == pytest.approx(4.8) and low[2] == pytest.approx(-0.42)
    assert meta["action_space"] == {"type": "Discrete", "n": 2, "start": 0}

    export_module(_module(DICT_OBS, CARTPOLE_ACT), tmp_path / "d")
    meta = json.loads((tmp_path / "d" / "model.json").read_text())
    # In the space's order (gymnasium sorts a Dict's keys).
    assert [(i["name"], i["dtype"], i["observation_path"]) for i in meta["inputs"]] == [
        ("obs.mode", "int64", ["mode"]),
        ("obs.more.0", "int64", ["more", 0]),
        ("obs.more.1", "int8", ["more", 1]),
        ("obs.pos", "float32", ["pos"]),
    ]


def test_module_left_as_it_was(tmp_path):
    module = _module(CARTPOLE_OBS, CARTPOLE_ACT)
    module.train()
    before = {k: v.copy() for k, v in module.get_state().items()}
    export_module(module, tmp_path)
    assert module.training
    for k, v in module.get_state().items():
        np.testing.assert_array_equal(v, before[k])


class _Linear(RLModule):
    def setup(self):
        self.net = torch.nn.Linear(4, 2)

    def _forward(self, batch, **kwargs):
        return {Columns.ACTION_DIST_INPUTS: self.net(batch[Columns.OBS])}


class _BatchSizeBranch(_Linear):
    def _forward(self, batch, **kwargs):
        x = self.net(batch[Columns.OBS])
        return {Columns.ACTION_DIST_INPUTS: x * 2 if x.shape[0] == 2 else x}


class _NoDistInputs(_Linear):
    def _forward(self, batch, **kwargs):
        return {Columns.ACTIONS: self.net(batch[Columns.OBS]).argmax(-1)}


class _Stateful(_Linear):
    def get_initial_state(self):
        return {"h": torch.zeros(3)}


def test_custom_module_without_value_function(tmp_path):
    module = _Linear(observation_space=CARTPOLE_OBS, action_space=CARTPOLE_ACT)
    export_module(module, tmp_path)
    meta = json.loads((tmp_path / "model.json").read_text())
    assert [o["name"] for o in meta["outputs"]] == ["action_dist_inputs"]
    traced = _load(tmp_path / "model.pt")
    x = torch.randn(4, 4)
    torch.testing.assert_close(traced(x), module.net(x), rtol=0, atol=1e-6)


def _load(path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.jit.load(str(path))


def test_errors(tmp_path, monkeypatch):
    cartpole = _module(CARTPOLE_OBS, CARTPOLE_ACT)
    with pytest.raises(TypeError, match=r"multi-agent module.*module\[policy_id\]"):
        export_module(cartpole.as_multi_rl_module(), tmp_path)
    with pytest.raises(TypeError, match="not an RLModule"):
        export_module(torch.nn.Linear(4, 2), tmp_path)
    with pytest.raises(TypeError, match="only torch RLModules"):
        export_module(object(), tmp_path)
    with pytest.raises(TypeError, match="opset version"):
        export_module(cartpole, tmp_path, onnx=True)
    with pytest.raises(ValueError, match="9 to 20"):
        export_module(cartpole, tmp_path, onnx=21)
    text = gym.spaces.Dict({"a": gym.spaces.Box(0, 1, (4,)), "t": gym.spaces.Text(5)})
    with pytest.raises(TypeError, match=r"obs\.t .*Text"):
        export_module(_Linear(observation_space=text, action_space=CARTPOLE_ACT), tmp_path)
    with pytest.raises(ValueError, match="no observation_space"):
        export_module(_Linear(action_space=CARTPOLE_ACT), tmp_path)
    with pytest.raises(ValueError, match="stateful"):
        export_module(
            _Stateful(observation_space=CARTPOLE_OBS, action_space=CARTPOLE_ACT), tmp_path
        )
    with pytest.raises(ValueError, match="returns no 'action_dist_inputs'"):
        export_module(
            _NoDistInputs(observation_space=CARTPOLE_OBS, action_space=CARTPOLE_ACT), tmp_path
        )
    with pytest.raises(ValueError, match="differs from the module"):
        export_module(
            _BatchSizeBranch(observation_space=CARTPOLE_OBS, action_space=CARTPOLE_ACT),
            tmp_path,
        )
    assert not (tmp_path / "model.pt").exists()

    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "onnx" else real(name, *a)
    )
    with pytest.raises(ImportError, match=r"pip install 'fastrollout\[export\]'"):
        export_module(cartpole, tmp_path, onnx=17)
    assert not (tmp_path / "model.onnx").exists()


def test_import_fastrollout_does_not_import_onnx():
    code = (
        "import sys, fastrollout, fastrollout.modules.export; "
        "assert 'onnx' not in sys.modules and 'onnxruntime' not in sys.modules; print('ok')"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr
