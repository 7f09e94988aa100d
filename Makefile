# `make test` and `make run` install what they need into .venv themselves.
SHELL := /bin/bash
VENV := .venv
BIN := $(VENV)/bin
# Whether Python $(1) is from version $(2) to $(3), each as 100 x major + minor (309: 3.9).
python_in = $(1) -c 'import sys; sys.exit(not $(2) <= 100 * sys.version_info[0] + sys.version_info[1] <= $(3))' 2>/dev/null
# TensorFlow 2.15 (the last release with Estimator) has wheels for Python 3.9 to 3.11 only.
PYTHON ?= $(shell for p in python3.11 python3.10 python3.9 python3; do \
  command -v $$p >/dev/null 2>&1 && $(call python_in,$$p,309,311) && echo $$p && break; done)
STAMP := $(VENV)/.installed
# The TensorFlow 2.16+ suite runs in a second environment on Python 3.12 (or 3.13). pyenv's
# shim python3.12 fails unless PYENV_VERSION names it, so pyenv's own interpreters are looked
# for too.
VENV_TF2 := .venv-tf2
BIN_TF2 := $(VENV_TF2)/bin
PYTHON_TF2 ?= $(shell for p in python3.12 python3.13 \
  $$(pyenv root 2>/dev/null)/versions/3.12*/bin/python3.12 \
  $$(pyenv root 2>/dev/null)/versions/3.13*/bin/python3.13; do \
  command -v $$p >/dev/null 2>&1 && $(call python_in,$$p,312,313) && echo $$p && break; done)
STAMP_TF2 := $(VENV_TF2)/.installed
VENV_KERAS3 := .venv-keras3
STAMP_KERAS3 := $(VENV_KERAS3)/.installed
# The oldest JAX the Keras 3 runtime runs on (versions.py's OLDEST_JAX, setup.cfg's floor): the
# Keras 3 tests that need no SLURM run on it too, in an environment of its own.
OLDEST_JAX := 0.8.2
VENV_KERAS3_OLDEST := .venv-keras3-oldest
STAMP_KERAS3_OLDEST := $(VENV_KERAS3_OLDEST)/.installed

.PHONY: test check docs lint bench bench-faults run clean slurm-up slurm-down venv venv-tf2 venv-keras3 venvs

# uv puts the wheels in place several times faster than pip (docs/installing.md, "Install
# times"); each environment's own pip installs it first. uv reads UV_INDEX_URL, not pip.conf:
# where only pip knows your package mirror, `make INSTALLER=pip` installs with pip alone.
INSTALLER ?= uv
$(if $(filter-out uv pip,$(INSTALLER)),$(error INSTALLER=$(INSTALLER): expected uv or pip. HINT: make INSTALLER=pip))
# uv, unlike pip, leaves the bytecode to each first import unless told; where
# PYTHONDONTWRITEBYTECODE is set that is every import: TensorFlow 2.15's took 5.6 s of CPU
# uncompiled against 2.2 s compiled (docs/installing.md), and the tests start hundreds.
install = $(if $(filter uv,$(INSTALLER)),$(1)/bin/pip install --quiet uv && \
  $(1)/bin/uv pip install --quiet --compile-bytecode --python $(1)/bin/python,$(1)/bin/pip install --quiet)
# Removes a virtualenv in $(2) of another Python than $(1): `python -m venv` would leave it as
# it was (an install that failed there would fail again), so it is made anew.
other_venv_removed = if [ -x $(2)/bin/python ] && [ "$$($(2)/bin/python -V 2>&1)" != "$$($(1) -V 2>&1)" ]; then \
  echo "make: $(2) has $$($(2)/bin/python -V 2>&1), not $(1)'s $$($(1) -V 2>&1): made anew"; rm -rf $(2); fi
# editable_mode=compat: a plain path entry, not an import hook that costs every start ~10 ms.
$(STAMP): setup.cfg pyproject.toml
	@test -n "$(PYTHON)" || { echo "make: no Python 3.9 to 3.11 found (TensorFlow 2.15 needs one). HINT: apt-get install python3.11 python3.11-venv, or make PYTHON=/path/to/python3.11" >&2; exit 2; }
	@command -v "$(PYTHON)" >/dev/null || { echo "make: PYTHON=$(PYTHON) is not a program. HINT: make PYTHON=/path/to/python3.11, or leave PYTHON out to look for one" >&2; exit 2; }
	@$(PYTHON) -c '' 2>/dev/null || { echo "make: PYTHON=$(PYTHON) does not run (a pyenv shim runs only with PYENV_VERSION set). HINT: make PYTHON=/path/to/python3.11, or leave PYTHON out to look for one" >&2; exit 2; }
	@$(call python_in,$(PYTHON),309,311) || { echo "make: PYTHON=$(PYTHON) is Python $$($(PYTHON) -V 2>&1 | cut -d' ' -f2), and TensorFlow 2.15 needs 3.9 to 3.11. HINT: make PYTHON=/path/to/python3.11, or leave PYTHON out to look for one" >&2; exit 2; }
	@$(call other_venv_removed,$(PYTHON),$(VENV))
	$(PYTHON) -m venv $(VENV)
	$(call install,$(VENV)) --config-settings editable_mode=compat -e '.[estimator,test,dev,docs]'
	touch $@

# The checks of PYTHON_TF2, which the TensorFlow 2.16+ and the Keras 3 environments are made with.
define python_tf2_checked
@test -n "$(PYTHON_TF2)" || { echo "make: no Python 3.12 or 3.13 found (the TensorFlow 2.16+ tests run on it). HINT: apt-get install python3.12 python3.12-venv, or pyenv install 3.12, or make PYTHON_TF2=/path/to/python3.12" >&2; exit 2; }
@command -v "$(PYTHON_TF2)" >/dev/null || { echo "make: PYTHON_TF2=$(PYTHON_TF2) is not a program. HINT: make PYTHON_TF2=/path/to/python3.12, or leave PYTHON_TF2 out to look for one" >&2; exit 2; }
@$(PYTHON_TF2) -c '' 2>/dev/null || { echo "make: PYTHON_TF2=$(PYTHON_TF2) does not run (a pyenv shim runs only with PYENV_VERSION set). HINT: make PYTHON_TF2=/path/to/python3.12, or leave PYTHON_TF2 out to look for one" >&2; exit 2; }
@$(call python_in,$(PYTHON_TF2),312,313) || { echo "make: PYTHON_TF2=$(PYTHON_TF2) is Python $$($(PYTHON_TF2) -V 2>&1 | cut -d' ' -f2), and the TensorFlow 2.16+ tests run on 3.12 or 3.13. HINT: make PYTHON_TF2=/path/to/python3.12, or leave PYTHON_TF2 out to look for one" >&2; exit 2; }
endef

$(STAMP_TF2): setup.cfg pyproject.toml
	$(python_tf2_checked)
	@$(call other_venv_removed,$(PYTHON_TF2),$(VENV_TF2))
	$(PYTHON_TF2) -m venv $(VENV_TF2)
	$(call install,$(VENV_TF2)) --config-settings editable_mode=compat -e '.[tf2,test]'
	touch $@

# Keras 3 on JAX, without TensorFlow (setup.cfg's keras3 says why apart); the tests that use
# it run from .venv-tf2's pytest and start its Python.
$(STAMP_KERAS3): setup.cfg pyproject.toml
	$(python_tf2_checked)
	@$(call other_venv_removed,$(PYTHON_TF2),$(VENV_KERAS3))
	$(PYTHON_TF2) -m venv $(VENV_KERAS3)
	$(call install,$(VENV_KERAS3)) --config-settings editable_mode=compat -e '.[keras3]'
	touch $@

$(STAMP_KERAS3_OLDEST): setup.cfg pyproject.toml
	$(python_tf2_checked)
	@$(call other_venv_removed,$(PYTHON_TF2),$(VENV_KERAS3_OLDEST))
	$(PYTHON_TF2) -m venv $(VENV_KERAS3_OLDEST)
	$(call install,$(VENV_KERAS3_OLDEST)) --config-settings editable_mode=compat -e '.[keras3]' \
	  'jax==$(OLDEST_JAX)' 'jaxlib==$(OLDEST_JAX)'
	touch $@

# Each environment alone: `source .venv/bin/activate` (Estimator, TensorFlow 2.15),
# `source .venv-tf2/bin/activate` (tf-keras, TensorFlow 2.16+) or
# `source .venv-keras3/bin/activate` (Keras 3 on JAX) then puts the commands on PATH.
venv: $(STAMP)
venv-tf2: $(STAMP_TF2)
venv-keras3: $(STAMP_KERAS3)
# All at once: each pip spends most of its time downloading and unpacking, not computing.
venvs:
	@$(MAKE) --no-print-directory -j2 $(STAMP) $(STAMP_TF2) $(STAMP_KERAS3) $(STAMP_KERAS3_OLDEST)

# The Estimator suite (TensorFlow 2.15) and the TensorFlow 2.16+ one, in its own environment,
# in three lanes at once: the tests on each partition of the SLURM test cluster, and the
# others (tests/lanes).
test: venvs
	$(BIN)/lint-imports
	@# The package's own bytecode too, for each Python (see install above).
	$(BIN)/python -m compileall -q tfconfig_slurm tests
	$(BIN_TF2)/python -m compileall -q tfconfig_slurm tests
	$(BIN)/mkdocs build --strict --site-dir $(SITE)
	tests/lanes

# The docs site (MkDocs); strict: a broken link, anchor or a page left out of the nav fails
# (not with --quiet, which hides the warnings that strict counts).
SITE := build/site
docs: $(STAMP)
	$(BIN)/mkdocs build --strict --site-dir $(SITE)
	@echo "docs: open $(SITE)/index.html"

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

# The inner loop: the lint above and the tests that start no TensorFlow and need no SLURM
# (the pure core, the process machinery, the commands), eight at a time: most of them wait on
# child processes, not on a CPU. `make test` runs them too, and everything else.
CHECK_TESTS := -m 'not tensorflow and not tf2 and not keras3 and not slurm'
check: lint
	SETUPTOOLS_USE_DISTUTILS=stdlib $(BIN)/python -m pytest -q -n 8 $(CHECK_TESTS) --lane=host

bench: venvs
	@# Timed starts read the package's bytecode, not its source (see test above).
	$(BIN)/python -m compileall -q tfconfig_slurm
	$(BIN_TF2)/python -m compileall -q tfconfig_slurm
	$(BIN)/python bench/resolve.py
	$(BIN)/python bench/loopback.py
	$(BIN)/python bench/peers.py
	$(BIN)/python bench/runtime.py
	$(BIN)/python bench/keras_vs_estimator.py --keras_python $(BIN_TF2)/python
	$(BIN)/python bench/accuracy.py --keras_python $(BIN_TF2)/python
	$(VENV_KERAS3)/bin/python -m compileall -q tfconfig_slurm
	$(VENV_KERAS3)/bin/python bench/keras_peers.py --flavor keras3
	$(BIN_TF2)/python bench/keras_peers.py --flavor tf-keras

# Each fault 5 times on the test cluster (root), about 11 minutes.
bench-faults: $(STAMP)
	$(BIN)/python bench/faults.py

# A run of its own (tf-output/mnist_deep-local), which a first `sbatch launch/train.sbatch`,
# training tf-output/mnist_deep, does not carry on.
run: $(STAMP)
	$(BIN)/tfconfig-slurm-run --experiment mnist_deep --experiment_id=mnist_deep-local \
	  --train_steps=600 --save_checkpoints_steps=200

# The test suite's SLURM cluster (5 nodes x 2 fake GPUs in network namespaces); needs root.
# The SLURM tests start and stop it themselves; these keep one up between runs.
slurm-up:
	tests/slurm/cluster up

slurm-down:
	tests/slurm/cluster down

clean:
	rm -rf $(VENV) $(VENV_TF2) $(VENV_KERAS3) $(VENV_KERAS3_OLDEST) .mypy_cache .ruff_cache .pytest_cache .hypothesis
