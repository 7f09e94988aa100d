# `make test` and `make run` install what they need into .venv themselves.
SHELL := /bin/bash
VENV := .venv
BIN := $(VENV)/bin
# TensorFlow 2.15 (the last release with Estimator) has wheels for Python 3.9 to 3.11 only.
PYTHON ?= $(shell for p in python3.11 python3.10 python3.9 python3; do \
  command -v $$p >/dev/null 2>&1 && $$p -c 'import sys; sys.exit(not (3,9) <= sys.version_info[:2] <= (3,11))' \
  && echo $$p && break; done)
STAMP := $(VENV)/.installed

.PHONY: test lint bench bench-faults run clean slurm-up slurm-down

# editable_mode=compat: a plain path entry, not an import hook that costs every start ~10 ms.
$(STAMP): setup.cfg pyproject.toml
	@test -n "$(PYTHON)" || { echo "make: no Python 3.9 to 3.11 found (TensorFlow 2.15 needs one). HINT: apt-get install python3.11 python3.11-venv, or make PYTHON=/path/to/python3.11" >&2; exit 2; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --config-settings editable_mode=compat -e '.[cpu,test,dev]'
	touch $@

test: $(STAMP)
	$(BIN)/python -m pytest

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python bench/resolve.py
	$(BIN)/python bench/runtime.py

# Each fault 5 times on the test cluster (root), about 11 minutes.
bench-faults: $(STAMP)
	$(BIN)/python bench/faults.py

run: $(STAMP)
	$(BIN)/tfconfig-slurm-run --experiment mnist_deep --train_steps=600 --save_checkpoints_steps=200

# The test suite's SLURM cluster (3 nodes x 2 fake GPUs in network namespaces); needs root.
# The SLURM tests start and stop it themselves; these keep one up between runs.
slurm-up:
	tests/slurm/cluster up

slurm-down:
	tests/slurm/cluster down

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
