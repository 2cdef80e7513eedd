"""Thread counts of torch and BLAS for ``python -m fastrollout sample`` (``--num-threads``).

torch and OpenBLAS start one thread per core by default. The sampling loop runs small
batches (one row per sub-env), where those threads only contend for the cores, with each
other and with any other busy process. The CLI therefore sets the counts itself; the
measurements behind its default are in ``python -m fastrollout sample --help``.

The package imports numpy (and its OpenBLAS) before the CLI runs, so ``OPENBLAS_NUM_THREADS``
set by the CLI is too late for this process: the running OpenBLAS is set through
``threadpoolctl`` when it is installed, else through OpenBLAS's own
``openblas_set_num_threads`` found among the loaded libraries. The environment variables
are still set, for the processes the run starts (async sub-envs, a local Ray's workers).
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass

__all__ = ["DEFAULT_NUM_THREADS", "THREAD_ENV_VARS", "ThreadSettings", "apply_num_threads"]

#: The default of ``--num-threads``. One thread was the fastest in every case measured
#: (CartPole, 8 and 256 sub-envs, with and without another busy process; the numbers are
#: in ``fastrollout.cli``'s help).
DEFAULT_NUM_THREADS = 1

#: The variables OpenMP, OpenBLAS and MKL read when a process starts.
THREAD_ENV_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")

# OpenBLAS's setter under the names its builds export: plain, 64-bit-int, and the
# ``scipy_openblas`` prefix of the OpenBLAS inside numpy's and scipy's wheels.
_OPENBLAS_SETTERS = (
    "openblas_set_num_threads",
    "openblas_set_num_threads64_",
    "scipy_openblas_set_num_threads",
    "scipy_openblas_set_num_threads64_",
)


@dataclass(frozen=True)
class ThreadSettings:
    """What ``apply_num_threads`` did.

    Attributes:
        num_threads: The count set, or None where the libraries kept their own.
        source: Why: ``"--num-threads"``, ``"default"``, or ``"OMP_NUM_THREADS"`` (the
            user's environment, left alone).
        torch_threads: ``torch.get_num_threads()`` afterwards.
        blas: How the running BLAS was set (``"threadpoolctl"``, ``"openblas"``), or
            ``"not set"`` (none found that could be set, or the libraries kept their own).
    """

    num_threads: int | None
    source: str
    torch_threads: int
    blas: str

    def describe(self) -> str:
        """One line for the summary, e.g. ``"1 thread (default)"``.

        Returns:
            The line.
        """
        if self.num_threads is None:
            return f"{self.torch_threads} torch threads ({self.source})"
        plural = "" if self.num_threads == 1 else "s"
        return f"{self.num_threads} thread{plural} ({self.source})"


def apply_num_threads(requested: int | None) -> ThreadSettings:
    """Sets the thread counts of torch and BLAS for this process and its children.

    Args:
        requested: ``--num-threads``: a count >= 1; 0 to leave every library at its own
            default (one thread per core); None for the default, which is
            ``DEFAULT_NUM_THREADS`` unless the user's environment sets
            ``OMP_NUM_THREADS`` (then the libraries keep what they read from it).

    Returns:
        What was set.
    """
    import torch

    if requested is None and os.environ.get("OMP_NUM_THREADS"):
        return ThreadSettings(None, "OMP_NUM_THREADS", torch.get_num_threads(), "not set")
    if requested == 0:
        return ThreadSettings(None, "library defaults", torch.get_num_threads(), "not set")
    n = DEFAULT_NUM_THREADS if requested is None else requested
    for name in THREAD_ENV_VARS:
        os.environ[name] = str(n)
    torch.set_num_threads(n)
    return ThreadSettings(
        n,
        "default" if requested is None else "--num-threads",
        torch.get_num_threads(),
        _set_blas_threads(n),
    )


def _set_blas_threads(n: int) -> str:
    """Sets the running BLAS libraries' thread pools to ``n`` threads.

    Returns:
        ``"threadpoolctl"``, ``"openblas"``, or ``"not set"``.
    """
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        pass
    else:
        threadpool_limits(n, user_api="blas")
        return "threadpoolctl"
    return "openblas" if _set_openblas_threads(n) else "not set"


def _set_openblas_threads(n: int) -> bool:
    """Calls ``openblas_set_num_threads(n)`` in every loaded OpenBLAS (Linux only).

    The loaded libraries are read from ``/proc/self/maps``; ``RTLD_NOLOAD`` opens only a
    library that is loaded already, so nothing new is loaded.

    Returns:
        Whether at least one OpenBLAS was set.
    """
    try:
        with open("/proc/self/maps", encoding="utf-8") as maps:
            paths = {line.split()[-1] for line in maps if "openblas" in line.lower()}
    except OSError:  # not Linux
        return False
    done = False
    for path in sorted(paths):
        try:
            lib = ctypes.CDLL(path, mode=getattr(os, "RTLD_NOLOAD", 0))
        except OSError:
            continue
        for symbol in _OPENBLAS_SETTERS:
            setter = getattr(lib, symbol, None)
            if setter is not None:
                setter.argtypes = [ctypes.c_int]
                setter(n)
                done = True
                break
    return done
