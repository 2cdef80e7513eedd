"""Checkpoints with RLlib 2.60's ``Checkpointable`` API and a documented directory layout.

``save_to_path``, ``restore_from_path``, ``from_checkpoint`` and
``get_checkpointable_components`` have RLlib's names and meaning. The files differ: a
fastrollout checkpoint keeps module weights in numpy's ``.npz`` (read with
``allow_pickle=False``) and other state as JSON plus ``.npz`` wherever the data allows;
only the constructor arguments (``class_and_ctor_args.pkl``, which ``from_checkpoint``
needs, as in RLlib) and state that JSON and numpy cannot hold are pickled. See
``docs/checkpoints.md`` for the layout.

>>> path = runner.save_to_path("/tmp/ckpt")                       # doctest: +SKIP
>>> same = SingleAgentEnvRunner.from_checkpoint(path)             # doctest: +SKIP
>>> other.restore_from_path(path)                                 # doctest: +SKIP
"""

from __future__ import annotations

import importlib
import json
import math
import os
import pathlib
import pickle
import platform
import re
import sys
import tempfile
import uuid
import warnings
import zipfile
from collections.abc import Collection, Mapping
from typing import Any

import numpy as np

from fastrollout.errors import CheckpointError

__all__ = [
    "CHECKPOINT_FORMAT_VERSION",
    "MODULE_STATE_FILE",
    "Checkpointable",
    "read_module_states",
    "read_tree",
    "write_module_states",
    "write_tree",
]

#: The layout version this fastrollout writes and the only one it reads (bumped on any
#: change a reader of the files would notice).
CHECKPOINT_FORMAT_VERSION = 1

_ARRAYS_SUFFIX = ".npz"
_MARKERS = ("__ndarray__", "__tensor__", "__tuple__", "__dict__", "__float__")


class _NotEncodable(TypeError):
    """A value that the JSON + npz form cannot hold (the state is pickled instead)."""


# ---------------------------------------------------------------------- the tree form


def _encode(obj: Any, arrays: dict[str, np.ndarray], where: str) -> Any:
    """Turns a state tree into JSON data, moving arrays and tensors into ``arrays``."""
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, int) and not isinstance(obj, np.integer):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else {"__float__": repr(obj)}
    if isinstance(obj, (np.ndarray, np.generic)):
        array = np.asarray(obj)
        if array.dtype.hasobject:
            raise _NotEncodable(f"{where}: numpy array of Python objects")
        key = f"a{len(arrays)}"
        arrays[key] = array
        return {"__ndarray__": key, "scalar": isinstance(obj, np.generic)}
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        try:
            array = obj.detach().cpu().numpy()
        except TypeError as err:  # dtypes numpy lacks (bfloat16)
            raise _NotEncodable(f"{where}: tensor of dtype {obj.dtype}") from err
        key = f"a{len(arrays)}"
        arrays[key] = array.copy()
        return {"__tensor__": key}
    if isinstance(obj, list):
        return [_encode(v, arrays, f"{where}[{i}]") for i, v in enumerate(obj)]
    if isinstance(obj, tuple):
        return {"__tuple__": [_encode(v, arrays, f"{where}[{i}]") for i, v in enumerate(obj)]}
    if isinstance(obj, Mapping):
        plain = all(isinstance(k, str) and not k.startswith("__") for k in obj)
        if plain:
            return {k: _encode(v, arrays, f"{where}[{k!r}]") for k, v in obj.items()}
        return {
            "__dict__": [
                [_encode(k, arrays, f"{where} key"), _encode(v, arrays, f"{where}[{k!r}]")]
                for k, v in obj.items()
            ]
        }
    raise _NotEncodable(f"{where}: {type(obj).__module__}.{type(obj).__qualname__}")


def _decode(data: Any, arrays: Mapping[str, np.ndarray]) -> Any:
    """Inverse of :func:`_encode`."""
    if isinstance(data, list):
        return [_decode(v, arrays) for v in data]
    if not isinstance(data, dict):
        return data
    if "__ndarray__" in data:
        array = arrays[data["__ndarray__"]]
        return array[()] if data.get("scalar") else array
    if "__tensor__" in data:
        import torch

        return torch.from_numpy(np.array(arrays[data["__tensor__"]]))
    if "__tuple__" in data:
        return tuple(_decode(v, arrays) for v in data["__tuple__"])
    if "__float__" in data:
        return float(data["__float__"])
    if "__dict__" in data:
        return {_hashable(_decode(k, arrays)): _decode(v, arrays) for k, v in data["__dict__"]}
    return {k: _decode(v, arrays) for k, v in data.items()}


def _hashable(key: Any) -> Any:
    """A decoded dict key (numpy scalars back to Python numbers)."""
    return key.item() if isinstance(key, np.generic) else key


def write_tree(directory: str | os.PathLike[str], stem: str, state: Any) -> str:
    """Writes a state tree as ``stem.json`` (+ ``stem.npz``), or ``stem.pkl`` if it must.

    The JSON form holds dicts, lists, tuples, strings, numbers, bools, None, numpy
    arrays and scalars, and torch tensors (written as numpy arrays, read back as CPU
    tensors). A tree with anything else (e.g. a Python object) is pickled whole.

    Args:
        directory: The directory (created if missing).
        stem: The file name without suffix.
        state: The tree.

    Returns:
        The format written: ``"json"`` or ``"pickle"``.
    """
    d = pathlib.Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    # An earlier save's files in another form would be read instead of these.
    for suffix in (".json", _ARRAYS_SUFFIX, ".pkl"):
        (d / f"{stem}{suffix}").unlink(missing_ok=True)
    arrays: dict[str, np.ndarray] = {}
    try:
        data = _encode(state, arrays, stem)
    except _NotEncodable:
        with open(d / f"{stem}.pkl", "wb") as f:
            pickle.dump(state, f)
        return "pickle"
    with open(d / f"{stem}.json", "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1)
    if arrays:
        np.savez(d / f"{stem}{_ARRAYS_SUFFIX}", **arrays)  # type: ignore[arg-type]
    return "json"


def read_tree(directory: str | os.PathLike[str], stem: str) -> Any:
    """Reads what :func:`write_tree` wrote.

    Args:
        directory: The directory.
        stem: The file name without suffix.

    Returns:
        The tree.

    Raises:
        CheckpointError: If the files are missing or cannot be read.
    """
    d = pathlib.Path(directory)
    try:
        if (d / f"{stem}.json").is_file():
            with open(d / f"{stem}.json", encoding="utf-8") as f:
                data = json.load(f)
            arrays: dict[str, np.ndarray] = {}
            if (d / f"{stem}{_ARRAYS_SUFFIX}").is_file():
                with np.load(d / f"{stem}{_ARRAYS_SUFFIX}", allow_pickle=False) as npz:
                    arrays = {k: npz[k] for k in npz.files}
            return _decode(data, arrays)
        if (d / f"{stem}.pkl").is_file():
            with open(d / f"{stem}.pkl", "rb") as f:
                return pickle.load(f)
    except (OSError, ValueError, KeyError, EOFError, pickle.UnpicklingError) as err:
        raise CheckpointError(f"checkpoint file {str(d / stem)!r}.* is corrupt: {err}") from err
    raise CheckpointError(f"checkpoint {str(d)!r} has no {stem}.json or {stem}.pkl")


def write_arrays(file: pathlib.Path, arrays: Mapping[str, np.ndarray]) -> None:
    """Writes named arrays (a module's weights) to one ``.npz`` file."""
    file.parent.mkdir(parents=True, exist_ok=True)
    np.savez(file, **{k: np.asarray(v) for k, v in arrays.items()})  # type: ignore[arg-type]


def read_arrays(file: pathlib.Path) -> dict[str, np.ndarray]:
    """Reads an ``.npz`` file of named arrays (never unpickles).

    Raises:
        CheckpointError: If the file is missing or corrupt.
    """
    if not file.is_file():
        raise CheckpointError(f"checkpoint file {str(file)!r} is missing")
    try:
        with np.load(file, allow_pickle=False) as npz:
            return {k: npz[k] for k in npz.files}
    except (OSError, ValueError, zipfile.BadZipFile) as err:
        raise CheckpointError(f"checkpoint file {str(file)!r} is corrupt: {err}") from err


#: A module's weights inside its directory (``rl_module/<module id>/``).
MODULE_STATE_FILE = "module_state.npz"
_SAFE_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,100}$")


def write_module_states(directory: str | os.PathLike[str], states: Mapping[Any, Any]) -> None:
    """Writes modules' weights, one directory per module id with ``module_state.npz``.

    A module id that is no safe directory name gets ``module_<i>``; ``module_ids.json``
    maps the directory names to the module ids.

    Args:
        directory: The ``rl_module`` directory.
        states: ``{module_id: {parameter name: array}}``.
    """
    d = pathlib.Path(directory)
    names: dict[str, Any] = {}
    for i, (mid, weights) in enumerate(states.items()):
        name = mid if isinstance(mid, str) and _SAFE_NAME.match(mid) else f"module_{i}"
        if name in (".", "..") or name in names:
            name = f"module_{i}"
        names[name] = mid
        write_arrays(d / name / MODULE_STATE_FILE, weights)
    write_tree(d, "module_ids", names)


def read_module_states(directory: str | os.PathLike[str]) -> dict[Any, dict[str, np.ndarray]]:
    """Reads what :func:`write_module_states` wrote.

    Raises:
        CheckpointError: If a file is missing or corrupt.
    """
    d = pathlib.Path(directory)
    names = read_tree(d, "module_ids")
    if not isinstance(names, dict):
        raise CheckpointError(f"checkpoint file {str(d / 'module_ids.json')!r} is corrupt")
    return {mid: read_arrays(d / name / MODULE_STATE_FILE) for name, mid in names.items()}


# ---------------------------------------------------------------------- metadata


def _qualified(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', repr(obj))}"


def _jsonable(value: Any, depth: int = 0) -> Any:
    """A JSON-safe summary of a config value (classes and functions by name)."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, type) or callable(value):
        return _qualified(value)
    if depth < 3 and isinstance(value, Mapping):
        return {str(k): _jsonable(v, depth + 1) for k, v in value.items()}
    if depth < 3 and isinstance(value, (list, tuple, set, frozenset)):
        items = sorted(value, key=repr) if isinstance(value, (set, frozenset)) else value
        return [_jsonable(v, depth + 1) for v in items]
    text = repr(value)
    return text if len(text) <= 200 else text[:197] + "..."


def config_summary(config: Any) -> dict[str, Any]:
    """The config's settings as JSON data for ``metadata.json`` (not read back).

    Args:
        config: A ``RunnerConfig``, RLlib's ``AlgorithmConfig`` or anything with
            ``to_dict()``.

    Returns:
        ``{"class": ..., "settings": {...}}``.
    """
    to_dict = getattr(config, "to_dict", None)
    settings: Any = None
    if callable(to_dict):
        try:
            settings = _jsonable(to_dict())
        except Exception:  # a summary only: never fail a save over it
            settings = None
    return {"class": _qualified(type(config)), "settings": settings}


def _versions() -> dict[str, str | None]:
    import fastrollout

    def version(name: str) -> str | None:
        module = sys.modules.get(name)
        if module is None:
            try:
                from importlib.metadata import version as dist_version

                return dist_version(name)
            except Exception:
                return None
        return str(getattr(module, "__version__", None))

    return {
        "fastrollout": fastrollout.__version__,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "torch": version("torch"),
        "gymnasium": version("gymnasium"),
    }


def _class_of(info: Any, path: pathlib.Path) -> type:
    """Imports the class named by a metadata file's ``class`` entry."""
    if not isinstance(info, Mapping) or "module" not in info or "name" not in info:
        raise CheckpointError(f"checkpoint {str(path)!r}: metadata.json names no class")
    try:
        obj: Any = importlib.import_module(info["module"])
        for part in str(info["name"]).split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as err:
        raise CheckpointError(
            f"checkpoint {str(path)!r} is of class {info['module']}.{info['name']}, "
            f"which cannot be imported here: {err}"
        ) from err
    if not isinstance(obj, type):
        raise CheckpointError(f"checkpoint {str(path)!r}: {info['name']} is not a class")
    return obj


def _as_set(names: str | Collection[str] | None) -> set[str] | None:
    if names is None:
        return None
    return {names} if isinstance(names, str) else set(names)


def check_component(
    name: str, components: str | Collection[str] | None, not_components: Any
) -> bool:
    """Whether ``get_state`` includes component ``name`` (RLlib's rule).

    Args:
        name: The component.
        components: Only these (``"a/b"`` selects part of component ``a``).
        not_components: Not these.

    Returns:
        Whether to include it.
    """
    keep, drop = _as_set(components), _as_set(not_components)
    wanted = keep is None or name in keep or any(c.startswith(name + "/") for c in keep)
    return wanted and (drop is None or name not in drop)


def subcomponents(name: str, components: str | Collection[str] | None) -> list[str] | None:
    """The parts of component ``name`` that ``components`` asks for (None: all).

    Args:
        name: The component.
        components: As given to ``get_state``.

    Returns:
        The names below ``name/``, or None.
    """
    keep = _as_set(components)
    if keep is None:
        return None
    subs = [c[len(name) + 1 :] for c in keep if c.startswith(name + "/")]
    return subs or None


# ---------------------------------------------------------------------- the mixin


class Checkpointable:
    """Saves and restores an object's state in a directory (RLlib's ``Checkpointable``).

    A class provides ``get_state`` / ``set_state`` (with ``components`` /
    ``not_components``), ``get_ctor_args_and_kwargs`` and, where parts of its state have
    their own form on disk, ``get_checkpointable_components`` and
    ``_write_component`` / ``_read_component``.

    The directory holds ``metadata.json`` (versions, class, config summary, the
    components), ``class_and_ctor_args.pkl`` (what ``from_checkpoint`` builds the object
    with), the state outside components as ``state.json`` (+ ``state.npz``; ``state.pkl``
    where it must), and one subdirectory per component.
    """

    METADATA_FILE_NAME = "metadata.json"
    CLASS_AND_CTOR_ARGS_FILE_NAME = "class_and_ctor_args.pkl"
    STATE_FILE_NAME = "state"

    # -- what a class provides ----------------------------------------------------------

    def get_state(
        self,
        components: str | Collection[str] | None = None,
        *,
        not_components: str | Collection[str] | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """The object's state (see the class)."""
        raise NotImplementedError

    def set_state(self, state: dict[str, Any]) -> None:
        """Loads a state from ``get_state`` (see the class)."""
        raise NotImplementedError

    def get_ctor_args_and_kwargs(self) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The constructor's arguments that built this object (for ``from_checkpoint``)."""
        raise NotImplementedError

    def get_checkpointable_components(self) -> list[tuple[str, Any]]:
        """The components whose states go into subdirectories, as ``(name, object)``.

        An object that is itself ``Checkpointable`` is written as a checkpoint of its
        own; the others by :meth:`_write_component`.
        """
        return []

    def get_metadata(self) -> dict[str, Any]:
        """The JSON data of ``metadata.json``.

        Information for people and tools; a restore reads only the class, the format
        version and the list of components from it.

        Returns:
            Versions, class, files and the config summary.
        """
        cls = type(self)
        meta: dict[str, Any] = {
            "checkpoint_format_version": CHECKPOINT_FORMAT_VERSION,
            "class": {"module": cls.__module__, "name": cls.__qualname__},
            "versions": _versions(),
            "class_and_ctor_args_file": self.CLASS_AND_CTOR_ARGS_FILE_NAME,
            "state_file": self.STATE_FILE_NAME,
        }
        config = getattr(self, "config", None)
        if config is not None:
            meta["config"] = config_summary(config)
        return meta

    def _write_component(self, name: str, state: Any, path: pathlib.Path) -> str:
        """Writes a component's state into its directory; returns the format's name."""
        return write_tree(path, self.STATE_FILE_NAME, state)

    def _read_component(self, name: str, path: pathlib.Path) -> Any:
        """Reads what :meth:`_write_component` wrote."""
        return read_tree(path, self.STATE_FILE_NAME)

    def _set_restored_state(self, state: dict[str, Any]) -> None:
        """Loads a state read from a checkpoint (default: ``set_state``)."""
        self.set_state(state)

    def _read_legacy(self, path: pathlib.Path) -> dict[str, Any] | None:
        """The state of a checkpoint in an older layout, or None (none is known)."""
        return None

    # -- RLlib's API ----------------------------------------------------------------------

    def save_to_path(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        state: dict[str, Any] | None = None,
    ) -> str:
        """Writes the state (or ``state``) to a directory.

        Args:
            path: The directory (created if missing; a new one under the system's
                temporary directory if None). Files of an earlier save there are
                replaced.
            state: A state from ``get_state`` to write instead of the current one.
                Components it lacks are not written.

        Returns:
            The directory's path.

        Raises:
            CheckpointError: If a component's state cannot be written.
        """
        if path is None:
            path = pathlib.Path(tempfile.gettempdir()) / f"fastrollout_{uuid.uuid4().hex}"
        p = pathlib.Path(path)
        p.mkdir(parents=True, exist_ok=True)
        full = dict(self.get_state() if state is None else state)
        components: dict[str, str] = {}
        for name, comp in self.get_checkpointable_components():
            if name not in full:
                continue
            comp_state = full.pop(name)
            comp_path = p / name
            if isinstance(comp, Checkpointable):
                comp.save_to_path(comp_path, state=comp_state)
                components[name] = "checkpoint"
            else:
                form = self._write_component(name, comp_state, comp_path)
                _write_json(
                    comp_path / self.METADATA_FILE_NAME,
                    {
                        "checkpoint_format_version": CHECKPOINT_FORMAT_VERSION,
                        "component": name,
                        "format": form,
                    },
                )
                components[name] = form
        meta = self.get_metadata()
        meta["components"] = components
        meta["state_format"] = write_tree(p, self.STATE_FILE_NAME, full)
        self._write_ctor_args(p, meta)
        # Last: a directory with metadata.json is a complete checkpoint.
        _write_json(p / self.METADATA_FILE_NAME, meta)
        return str(p)

    def restore_from_path(
        self,
        path: str | os.PathLike[str],
        *,
        component: str | None = None,
        **kwargs: Any,
    ) -> None:
        """Loads a checkpoint written by ``save_to_path`` (module weights always load).

        Args:
            path: The checkpoint's directory, or with ``component`` the directory of that
                one component (e.g. ``ckpt/rl_module``).
            component: Load only this component (``"a/b"``: part ``b`` of component
                ``a``); the rest of the state stays as it is.
            **kwargs: Ignored (RLlib's ``filesystem`` and forward-compatible arguments).

        Raises:
            FileNotFoundError: If the directory does not exist.
            CheckpointError: If it is not a checkpoint, is corrupt, or is of another
                class or checkpoint format version (both named).
        """
        p = pathlib.Path(path)
        if not p.is_dir():
            raise FileNotFoundError(f"no checkpoint at {str(p)!r} (not a directory)")
        if component is not None:
            self._restore_component(p, component)
            return
        self._set_restored_state(self._read_checkpoint(p))

    @classmethod
    def from_checkpoint(cls, path: str | os.PathLike[str], **kwargs: Any) -> Any:
        """Builds an object of the checkpoint's class with its saved arguments and state.

        Args:
            path: The checkpoint's directory.
            **kwargs: Constructor arguments that replace the saved ones (e.g.
                ``num_env_runners=0`` for a group).

        Returns:
            A new object of the checkpoint's class (``cls`` or a subclass of it).

        Raises:
            FileNotFoundError: If the directory does not exist.
            CheckpointError: If the checkpoint is not of ``cls`` (or a subclass), is of
                another checkpoint format version, has no constructor arguments, or is
                corrupt.
        """
        p = pathlib.Path(path)
        if not p.is_dir():
            raise FileNotFoundError(f"no checkpoint at {str(p)!r} (not a directory)")
        meta = _read_metadata(p, cls)
        saved = _class_of(meta.get("class"), p)
        if not issubclass(saved, cls):
            raise CheckpointError(
                f"checkpoint {str(p)!r} is of class {_qualified(saved)}, not of "
                f"{_qualified(cls)} or a subclass: use {saved.__name__}.from_checkpoint"
            )
        file = p / cls.CLASS_AND_CTOR_ARGS_FILE_NAME
        if not file.is_file():
            why = meta.get("ctor_args_error", "the file is missing")
            raise CheckpointError(
                f"checkpoint {str(p)!r} has no constructor arguments ({why}); build the "
                "object yourself and call restore_from_path"
            )
        try:
            with open(file, "rb") as f:
                info = pickle.load(f)
            args, ctor_kwargs = info["ctor_args_and_kwargs"]
        except Exception as err:
            raise CheckpointError(
                f"checkpoint file {str(file)!r} cannot be read here: {err}"
            ) from err
        obj = saved(*args, **{**ctor_kwargs, **kwargs})
        obj.restore_from_path(p)
        return obj

    # -- internals ------------------------------------------------------------------------

    def _write_ctor_args(self, p: pathlib.Path, meta: dict[str, Any]) -> None:
        """Pickles the class and constructor arguments (cloudpickle where pickle fails)."""
        info = {"class": type(self), "ctor_args_and_kwargs": self.get_ctor_args_and_kwargs()}
        file = p / self.CLASS_AND_CTOR_ARGS_FILE_NAME
        data: bytes | None
        try:
            data = pickle.dumps(info)
        except Exception as err:
            data = _cloudpickle(info)
            if data is None:
                file.unlink(missing_ok=True)
                meta["ctor_args_error"] = f"the constructor arguments do not pickle: {err}"
                warnings.warn(
                    f"{type(self).__name__}.save_to_path: {meta['ctor_args_error']} (e.g. a "
                    "lambda in the config); restore_from_path works, from_checkpoint does not",
                    UserWarning,
                    stacklevel=3,
                )
                return
        file.write_bytes(data)

    def _read_checkpoint(self, p: pathlib.Path) -> dict[str, Any]:
        """The full state in a checkpoint directory, after checking its class and version."""
        if not (p / self.METADATA_FILE_NAME).is_file():
            legacy = self._read_legacy(p)
            if legacy is not None:
                return legacy
        meta = _read_metadata(p, type(self))
        saved = _class_of(meta.get("class"), p)
        mine = type(self)
        if not (issubclass(mine, saved) or issubclass(saved, mine)):
            raise CheckpointError(
                f"checkpoint {str(p)!r} is of class {_qualified(saved)}; it does not load "
                f"into a {_qualified(mine)} (use {saved.__name__}.from_checkpoint)"
            )
        state = read_tree(p, self.STATE_FILE_NAME)
        if not isinstance(state, dict):
            raise CheckpointError(f"checkpoint {str(p)!r}: its state file holds no dict")
        own = dict(self.get_checkpointable_components())
        for name in meta.get("components", {}):
            comp_path = p / name
            if not comp_path.is_dir():
                raise CheckpointError(
                    f"checkpoint {str(p)!r} lists component {name!r} but has no {name}/ "
                    "directory (incomplete copy?)"
                )
            comp = own.get(name)
            if isinstance(comp, Checkpointable):
                state[name] = comp._read_checkpoint(comp_path)
            else:
                state[name] = self._read_component(name, comp_path)
        return state

    def _restore_component(self, p: pathlib.Path, component: str) -> None:
        """Loads one component from its own directory."""
        name, _, rest = component.partition("/")
        own = dict(self.get_checkpointable_components())
        if name not in own:
            raise CheckpointError(
                f"{type(self).__name__} has no checkpoint component {name!r}; it has {sorted(own)}"
            )
        comp = own[name]
        if isinstance(comp, Checkpointable):
            if rest:
                comp._restore_component(p, rest)
                state = comp.get_state()
            else:
                state = comp._read_checkpoint(p)
            self._set_restored_state({name: state})
            return
        if rest:
            raise CheckpointError(f"component {name!r} of {type(self).__name__} has no parts")
        meta_file = p / self.METADATA_FILE_NAME
        if meta_file.is_file():
            meta = _load_json(meta_file)
            saved_name = meta.get("component")
            if saved_name is None:
                raise CheckpointError(
                    f"{str(p)!r} is a whole checkpoint, not the directory of component "
                    f"{name!r} (pass {str(p / name)!r})"
                )
            _check_version(meta, p)
            if saved_name != name:
                raise CheckpointError(f"{str(p)!r} holds component {saved_name!r}, not {name!r}")
        self._set_restored_state({name: self._read_component(name, p)})


def _cloudpickle(obj: Any) -> bytes | None:
    """``cloudpickle.dumps(obj)`` where cloudpickle is installed (Ray ships it), else None."""
    for module in ("cloudpickle", "ray.cloudpickle"):
        try:
            cp = importlib.import_module(module)
        except ImportError:
            continue
        try:
            return bytes(cp.dumps(obj))
        except Exception:
            return None
    return None


def _write_json(file: pathlib.Path, data: Any) -> None:
    file.parent.mkdir(parents=True, exist_ok=True)
    with open(file, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1)


def _load_json(file: pathlib.Path) -> dict[str, Any]:
    try:
        with open(file, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as err:
        raise CheckpointError(f"checkpoint file {str(file)!r} is corrupt: {err}") from err
    if not isinstance(data, dict):
        raise CheckpointError(f"checkpoint file {str(file)!r} is corrupt: not a JSON object")
    return data


def _check_version(meta: Mapping[str, Any], p: pathlib.Path) -> None:
    found = meta.get("checkpoint_format_version")
    if found != CHECKPOINT_FORMAT_VERSION:
        written = (meta.get("versions") or {}).get("fastrollout", "an unknown version")
        raise CheckpointError(
            f"checkpoint {str(p)!r} has checkpoint format version {found!r} (written by "
            f"fastrollout {written}); this fastrollout reads version "
            f"{CHECKPOINT_FORMAT_VERSION} only"
        )


def _read_metadata(p: pathlib.Path, cls: type) -> dict[str, Any]:
    """The checkpoint's ``metadata.json``, checked for its format version."""
    file = p / cls.METADATA_FILE_NAME  # type: ignore[attr-defined]
    if not file.is_file():
        raise CheckpointError(
            f"{str(p)!r} is not a fastrollout checkpoint: it has no {file.name} (write one "
            "with save_to_path)"
        )
    meta = _load_json(file)
    if "component" in meta:
        raise CheckpointError(
            f"{str(p)!r} is the directory of component {meta['component']!r}, not a whole "
            f"checkpoint (pass its parent, or component={meta['component']!r})"
        )
    _check_version(meta, p)
    return meta
