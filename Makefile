# The two commands of README.md. Each creates .venv with pinned packages on first use.
#   make demo   2 workers + an evaluator on the embedded digits dataset, prints the metrics
#   make test   the test suite (what .ci/run runs)
# While working: make test-fast, every test that starts no process and takes no more than a
# second or two. How many tests each runs, and for how long: docs/development.md.
# And the benchmark suite (not part of the tests; about 1.7 hours on 2 cores):
#   make bench  writes docs/benchmarks/ (BENCH_ARGS=--quick for a short check)

PYTHON ?= $(shell command -v python3.11 || command -v python3.10 || command -v python3.9)
VENV := .venv
STAMP := $(VENV)/.installed-$(shell cat setup.py requirements/constraints.txt | cksum | cut -d' ' -f1)
DATA_DIR := .data/tfds

HOROVOD_VENV := .venv-horovod
BENCH_ARGS ?=

.PHONY: demo test test-fast faults lint format bench bench-horovod

$(STAMP): setup.py requirements/constraints.txt
	@test -n "$(PYTHON)" || { echo "error: Python 3.9, 3.10 or 3.11 is needed (TensorFlow 2.15 supports no other); install one, or run: make PYTHON=/path/to/python3.11 ..." >&2; exit 1; }
	rm -rf $(VENV)
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check -c requirements/constraints.txt -e '.[test]'
	touch $@

demo: $(STAMP)
	TF_CPP_MIN_LOG_LEVEL=2 $(VENV)/bin/python -m estimator_dist.launch --num_workers=2 --evaluator --timeout_secs=600 -- \
		--data_dir=$(DATA_DIR) --train_steps=400 --batch_size=64 --communication=RING --eval_throttle_secs=2

# Two test processes, each taking whole files (module fixtures run once): the end-to-end
# tests spend much of their time waiting on process start-ups, rendezvous and evaluations, so
# two of them share 2 cores well. Timings: docs/development.md#the-suites-size-and-time.
test: $(STAMP)
	$(VENV)/bin/python -m pytest -n 2 --dist loadfile

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
$(HOROVOD_VENV)/.installed: setup.py requirements/constraints.txt
	rm -rf $(HOROVOD_VENV)
	$(PYTHON) -m venv $(HOROVOD_VENV)
	$(HOROVOD_VENV)/bin/pip install --quiet --disable-pip-version-check -c requirements/constraints.txt -e . setuptools wheel
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
