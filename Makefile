# Two entry points a new user needs (see README): `make run` and `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: setup setup-test run test test-triton-latest bench bench-sweep bench-tuning

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# The editable install follows code changes by itself: pip runs again only when pyproject.toml
# changes (the stamp files record the last install), so `make run` starts at once after the first.
setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e .
	touch $@

# torch==2.13.0 is pinned so pip takes the CPU build (an unpinned torch pulls a multi-GB CUDA build).
setup-test: $(VENV)/.installed-test

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q torch==2.13.0 "triton==3.6.0"
	$(BIN)/pip install -q -e '.[test,kernels,notebooks,ray,lmsys,hf,advise]'
	touch $@ $(VENV)/.installed

run: setup
	$(BIN)/marconi run

# The kernels' interpreter tests again on the newest Triton the `kernels` extra allows (.venv pins
# the oldest, 3.6.0): only the triton wheel, installed into a folder inside .venv that goes first
# on PYTHONPATH (the venv's torch, pytest and numpy serve both runs; no second venv). `make test`
# runs the `triton_compat` subset there (every kernel and launch path at least once, the sm_90a
# compiles and the Gluon fallbacks); `make test-triton-latest` runs every kernel test on it.
TRITON_LATEST ?= 3.9.0
TRITON_LATEST_DIR ?= $(VENV)/triton-$(TRITON_LATEST)

# xdist workers: 2 (CI's machine has 2 cores); `make test PYTEST_WORKERS=auto` uses every core.
PYTEST_WORKERS ?= 2
PYTEST := TRITON_INTERPRET=1 $(BIN)/python -m pytest -q -p no:cacheprovider -n $(PYTEST_WORKERS)

test: setup-test $(TRITON_LATEST_DIR)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(PYTEST)
	PYTHONPATH=$(abspath $(TRITON_LATEST_DIR)):$(CURDIR) $(PYTEST) -m triton_compat tests/kernels

$(TRITON_LATEST_DIR)/.installed: | $(BIN)/python
	$(BIN)/pip install -q --no-deps --target $(TRITON_LATEST_DIR) "triton==$(TRITON_LATEST)"
	touch $@

test-triton-latest: setup-test $(TRITON_LATEST_DIR)/.installed
	PYTHONPATH=$(abspath $(TRITON_LATEST_DIR)):$(CURDIR) $(PYTEST) tests/kernels

# Every GPU suite (kernels and replay, marked `gpu`; about 11 minutes on one H200, most of it
# first compiles: 2026-12-05), run with a python whose torch has CUDA: not .venv, whose torch is
# the CPU build. The replay suite needs the package's own dependencies there too (simpy, ...). Run
# it on every change that reaches a GPU: the replay tests found a kernel bug the kernel tests
# missed (docs/kernels.md, the host path). The two halves run apart where one command's time is
# capped (test-gpu-kernels, then test-gpu-replay).
GPU_PY ?= python3
GPU_PYTEST = $(GPU_PY) -m pytest -q -p no:cacheprovider -m gpu
.PHONY: test-gpu test-gpu-kernels test-gpu-replay
test-gpu:  # both halves run, even when the first fails
	$(GPU_PYTEST) tests/kernels; k=$$?; $(GPU_PYTEST) tests/sim/replay && exit $$k
test-gpu-kernels:
	$(GPU_PYTEST) tests/kernels
test-gpu-replay:
	$(GPU_PYTEST) tests/sim/replay

# benchmarks print figures; they are not part of the test suite (kernel_bench.py needs a GPU)
bench: setup-test
	$(BIN)/python benchmarks/sim_bench.py

bench-sweep: setup-test
	$(BIN)/python benchmarks/sweep_bench.py

bench-tuning: setup-test
	$(BIN)/python benchmarks/tuning_report.py

# plant seeded one-line bugs in the core modules and print how many the tests catch (no ../shared):
# make mutation MUTATION_ARGS="-m tree --per-module 5"
.PHONY: mutation
mutation: setup-test
	$(BIN)/python benchmarks/mutation.py $(MUTATION_ARGS)
