# The two commands of README.md. Each creates its venv with pinned packages on first use.
#   make demo   2 workers + an evaluator on the embedded digits dataset, prints the metrics
#   make test   the test suite (what .ci/run runs, on both stacks)
# While working: make test-fast, every test that starts no process and takes no more than a
# second or two. How many tests each runs, and for how long: docs/development.md.
# And the benchmark suite (not part of the tests; about 1.7 hours on 2 cores):
#   make bench  writes docs/benchmarks/ (BENCH_ARGS=--quick for a short check)
#
# TF picks the TensorFlow stack (docs/tensorflow.md): 2.21 (the default, Python 3.10-3.13,
# in .venv) or 2.15 (Python 3.9-3.11, in .venv-tf2.15): `make test TF=2.15`.
# PYTEST_ARGS adds pytest arguments: `make test TF=2.15 PYTEST_ARGS='-m multiprocess'`.

TF ?= 2.21
ifeq ($(TF),2.21)
VENV := .venv
EXTRAS := test
PYTHONS := 3.12 3.13 3.11 3.10
else ifeq ($(TF),2.15)
VENV := .venv-tf2.15
EXTRAS := tf215,test
PYTHONS := 3.11 3.10 3.9
else
$(error TF=$(TF): the stacks are 2.21 (the default) and 2.15)
endif
PINS := requirements/tf$(TF).txt
# The first of PYTHONS that runs, on the PATH or among pyenv's versions (a pyenv shim of a
# version not selected is on the PATH but fails, hence the test run).
PYENV_ROOT ?= $(shell pyenv root 2>/dev/null || echo $$HOME/.pyenv)
PYTHON ?= $(shell for v in $(PYTHONS); do \
	for p in $$(command -v python$$v) $$(ls -d $(PYENV_ROOT)/versions/$$v.*/bin/python$$v 2>/dev/null | sort -rV); do \
	$$p -c '' 2>/dev/null && { echo $$p; exit 0; }; done; done)
STAMP := $(VENV)/.installed-$(shell cat setup.py $(PINS) | cksum | cut -d' ' -f1)
DATA_DIR := .data/tfds
PYTEST_ARGS ?=

HOROVOD_VENV := .venv-horovod
BENCH_ARGS ?=

.PHONY: demo test test-fast faults lint format bench bench-horovod

$(STAMP): setup.py $(PINS)
	@test -n "$(PYTHON)" || { echo "error: TensorFlow $(TF) needs Python $(PYTHONS) (found none that runs); install one, or run: make PYTHON=/path/to/python$(firstword $(PYTHONS)) ..." >&2; exit 1; }
	rm -rf $(VENV)
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check -c $(PINS) -e '.[$(EXTRAS)]'
	touch $@

demo: $(STAMP)
	TF_CPP_MIN_LOG_LEVEL=2 $(VENV)/bin/python -m estimator_dist.launch --num_workers=2 --evaluator --timeout_secs=600 -- \
		--data_dir=$(DATA_DIR) --train_steps=400 --batch_size=64 --communication=RING --eval_throttle_secs=2

# Two test processes, each taking whole files (module fixtures run once): the end-to-end
# tests spend much of their time waiting on process start-ups, rendezvous and evaluations, so
# two of them share 2 cores well. Timings: docs/development.md#the-suites-size-and-time.
test: $(STAMP)
	$(VENV)/bin/python -m pytest -n 2 --dist loadfile $(PYTEST_ARGS)

# Leaves out the tests marked multiprocess or slow (see pytest.ini): workers, launchers,
# clusters, and single-process tests that take seconds.
test-fast: $(STAMP)
	$(VENV)/bin/python -m pytest -n 2 --dist loadfile -m "not multiprocess and not slow"

# The fault suite: every test marked `fault` with seeds 1 to 5, on a quiet machine and then
# with one core kept busy (about an hour on 2 cores). `make test` runs each with seed 1.
faults: $(STAMP)
	ESTIMATOR_DIST_FAULT_SEEDS=1,2,3,4,5 $(VENV)/bin/python -m pytest -m fault -rA
	ESTIMATOR_DIST_FAULT_SEEDS=1,2,3,4,5 ESTIMATOR_DIST_BUSY_CORES=1 $(VENV)/bin/python -m pytest -m fault -rA

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(STAMP)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

# Horovod (Gloo, no MPI) compiled against the pinned TensorFlow, in a venv of its own,
# for the suite's Horovod comparison: about 15 minutes on 2 cores; needs cmake and g++.
$(HOROVOD_VENV)/.installed: setup.py $(PINS)
	rm -rf $(HOROVOD_VENV)
	$(PYTHON) -m venv $(HOROVOD_VENV)
	$(HOROVOD_VENV)/bin/pip install --quiet --disable-pip-version-check -c $(PINS) -e . setuptools wheel
	HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_WITHOUT_PYTORCH=1 \
	HOROVOD_WITHOUT_MXNET=1 HOROVOD_CPU_OPERATIONS=GLOO MAKEFLAGS=-j$$(nproc) \
		$(HOROVOD_VENV)/bin/pip install --quiet --disable-pip-version-check --no-build-isolation --no-cache-dir horovod==0.28.1
	touch $@

bench-horovod: $(HOROVOD_VENV)/.installed

bench: $(STAMP)
	$(MAKE) bench-horovod || echo "Horovod could not be built; the suite runs without its comparison."
	TF_CPP_MIN_LOG_LEVEL=2 $(VENV)/bin/python -m benchmarks $(BENCH_ARGS)

# The flag reference, generated from the flag definitions; a test fails when it is out of date.
.PHONY: docs
docs: $(STAMP)
	$(VENV)/bin/python -m estimator_dist.flag_reference > docs/flags.md.tmp
	mv docs/flags.md.tmp docs/flags.md
