# fedcomm: `make repro` runs the default experiment, `make test` runs the test suite.
# Both create the local virtualenv (.venv) first if needed. `make help` lists every target.
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
export PATH := $(abspath $(BIN)):$(PATH)

.PHONY: help venv repro reproduce test test-fast lint typecheck check bench bench-backends bench-sharding gpu-check gpu-wheels clean

help:  ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-10s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "need $(PYTHON) on PATH (or make PYTHON=python3)"; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "== [1/3] pip itself"
	$(BIN)/python -m pip install -q --upgrade pip
	@echo "== [2/3] torch 2.13.0, the CPU build first, so nothing pulls a multi-GB CUDA build (~200 MB)"
	$(BIN)/python -m pip install --no-compile --progress-bar on torch==2.13.0
	@echo "== [3/3] fedcomm and its dependencies (DVC, MLflow, Optuna, polars, ...; dev tools)"
	$(BIN)/python -m pip install --no-compile --progress-bar on -e '.[dev]'
	@echo "== byte-compiling .venv on every core (pip compiles on one: ~45 s of the install)"
	@# a few files are for newer Pythons (torch's py312_intrinsics) and do not compile, as pip skips them
	-@$(BIN)/python -m compileall -q -j 0 $(VENV)/lib >/dev/null
	@echo "== installed into $(VENV)"
	touch $(STAMP)

venv: $(STAMP)  ## create .venv and install fedcomm with its dev tools

repro: $(STAMP)  ## run the default experiment (dvc repro) -> reports/summary.md
	$(BIN)/dvc repro

# make reproduce NAME=x: pipeline/reproductions/x.yaml (or PROFILE=any params file) as its own DVC
# pipeline in build/x/. Rerunning it resumes: finished stages are kept, an interrupted train stage
# continues from its checkpoint. FRESH=1 starts afresh; KEEP_CODE=1 finishes a build with the code
# it started with when the project's code has changed since (pipeline/reproduce.sh says how).
NAME    ?= fedsparse_mnist
PROFILE ?= pipeline/reproductions/$(NAME).yaml
reproduce: $(STAMP)  ## run pipeline/reproductions/$(NAME).yaml in build/$(NAME)/; rerun to resume (FRESH=1: afresh)
	@bash pipeline/reproduce.sh '$(NAME)' '$(PROFILE)' '$(FRESH)' '$(KEEP_CODE)'

# The suite runs in parallel processes (pytest-xdist, one per core; XDIST=0: in this process);
# the tests of one file stay on one worker (--dist loadfile: they share module fixtures).
XDIST ?= auto
# (src/ byte-compiled first: where PYTHONDONTWRITEBYTECODE is set, every stage process the tests
# start would compile fedcomm's modules again, ~0.25 s each)
PYTEST = $(BIN)/python -m compileall -q src >/dev/null && $(BIN)/python -m pytest -q --durations=30 $(if $(filter 0,$(XDIST)),,-n $(XDIST) --dist loadfile)

test: $(STAMP)  ## the whole test suite (unit, contract, pipeline; slow tests included)
	$(PYTEST)

test-fast: $(STAMP)  ## the test suite without slow tests
	$(PYTEST) -m "not slow"

lint: $(STAMP)  ## ruff lint + format check
	$(BIN)/ruff check src tests stages benchmarks
	$(BIN)/ruff format --check src tests stages benchmarks

typecheck: $(STAMP)  ## mypy --strict on src/
	$(BIN)/mypy

check: lint typecheck  ## the static checks CI runs first (ruff, ruff format --check, mypy)

bench: $(STAMP)  ## speed benchmark (FedAvg, MNIST MLP, 1000 clients): s/round and peak memory
	$(BIN)/python benchmarks/fedavg_mnist.py

bench-backends: $(STAMP)  ## backends vs a plain loop vs the FLOP bound (W1 MLP, W2 CNN on MNIST)
	$(BIN)/python benchmarks/backends.py

bench-sharding: $(STAMP)  ## one run on 1 and 2 processes (torchrun): W1 MLP, W3 CIFAR-10 CNN
	$(BIN)/python benchmarks/sharding.py --workloads W1 W3 --rounds 8

gpu-check:  ## the GPU check (one script, <= 8 min on one H100): writes gpu_check.json + log to $$OUT or benchmarks/results/
	bash benchmarks/gpu_check.sh

gpu-wheels:  ## download the wheels the GPU machine lacks (Python 3.12, manylinux x86_64) into .gpu-wheels/
	bash benchmarks/gpu_check.sh --fetch-wheels

clean:  ## remove the virtualenv and caches (not results)
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
