"""pytest-benchmark suite: run with `make bench-python` (kept out of `make test`)."""
