# fastrollout developer commands. Every target sets up what it needs, so on a fresh
# machine `make test` and `make demo` are all it takes.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
export VIRTUAL_ENV := $(abspath $(VENV))
export PATH := $(VIRTUAL_ENV)/bin:$(PATH)

.DEFAULT_GOAL := test
.PHONY: install build wheel test test-rust test-python docs lint format bench bench-rust bench-python demo clean

# The venv and every dependency named in pyproject.toml (build backend, runtime, and the
# dev/test extra with RLlib 2.60 as the reference). The package itself is built by `build`.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb')); \
	print('\n'.join(p['build-system']['requires'] + p['project']['dependencies'] \
	+ p['project']['optional-dependencies']['dev']))" > $(VENV)/requirements.txt
	$(PY) -m pip install -q -r $(VENV)/requirements.txt
	touch $@

install: $(VENV)/.installed

# The native extension in release mode, installed into the venv (editable).
build: install
	maturin develop --release -q

# One wheel for every CPython from 3.10 on (abi3) and every x86-64 Linux with glibc 2.17 or
# newer (manylinux2014), into target/wheels/. zig (the ziglang package of the dev extra) links
# it against glibc 2.17 instead of a manylinux docker image; older wheels there are removed so
# that the one wheel left is this source's.
wheel: install
	rm -f target/wheels/fastrollout-*.whl
	maturin build --release --features abi3 --zig --compatibility manylinux2014 -i $(PY) -o target/wheels -q

test-rust:
	cargo test --release -q

# The wheel too: tests/test_install.py installs it into a fresh venv (its own `make wheel`
# then has nothing left to compile).
test-python: build wheel
	$(PY) -m pytest -q

# The documentation site into site/, warnings as errors: a broken link, a docstring reference
# that does not resolve or a malformed docstring section fails the build. mkdocstrings imports
# fastrollout (the native module's docstrings come from the built extension), hence `build`.
# (NO_MKDOCS_2_WARNING silences mkdocs-material's banner about its successor, not a build warning.)
docs: build
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --quiet

test: test-rust test-python docs

lint: install
	cargo clippy --all-targets -q -- -D warnings
	cargo clippy --all-targets --features python -q -- -D warnings
	cargo clippy --all-targets --features abi3 -q -- -D warnings
	cargo fmt --check
	cargo fmt --check --manifest-path examples/rust_client/Cargo.toml
	cargo clippy --all-targets -q --manifest-path examples/rust_client/Cargo.toml --target-dir target/rust_client -- -D warnings
	$(PY) -m ruff check python tests benches examples
	$(PY) -m ruff format --check python tests benches examples
	$(MAKE) -s build
	$(PY) -m mypy.stubtest fastrollout._core --allowlist .mypy-stubtest-allowlist
	$(PY) -m mypy python/fastrollout

format: install
	cargo fmt
	$(PY) -m ruff format python tests benches examples
	$(PY) -m ruff check --fix python tests benches examples

bench-rust:
	cargo bench --benches

bench-python: build
	OPENBLAS_NUM_THREADS=1 $(PY) -m pytest benches -q --benchmark-only --benchmark-group-by=group --benchmark-columns=min,median,mean,ops

bench: bench-rust bench-python

demo: build
	$(PY) examples/demo.py
	$(PY) -m fastrollout sample --env CartPole-v1 --num-envs 8 --timesteps 100000 --seed 0
	$(PY) -m fastrollout sample --env CartPole-v1 --multi-agent 4 --num-envs 4 --timesteps 50000 --seed 0

clean:
	rm -rf target $(VENV) .pytest_cache .hypothesis .benchmarks site
