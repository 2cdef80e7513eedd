"""pytest-benchmark suite: run with `make bench-python` (kept out of `make test`).

numpy's OpenBLAS runs on one thread here, as torch does (the benches set
``torch.set_num_threads(1)``): its threads spin after each BLAS call and, on a 2-core
machine, take a core from whatever is timed next (fastrollout's multi-agent runner with
8 sub-envs measured 92 ms per 1000 env steps with them, 52 ms without). The variable must
be set before numpy loads: ``make bench-python`` sets it; this covers a direct ``pytest
benches`` run where no plugin imported numpy first.
"""

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
