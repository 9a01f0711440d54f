# The two commands of README.md. Each creates .venv with pinned packages on first use.
#   make demo   2 workers + an evaluator on the embedded digits dataset, prints the metrics
#   make test   the test suite (what .ci/run runs)

PYTHON ?= $(shell command -v python3.11 || command -v python3.10 || command -v python3.9)
VENV := .venv
STAMP := $(VENV)/.installed-$(shell cat setup.py requirements/constraints.txt | cksum | cut -d' ' -f1)
DATA_DIR := .data/tfds

.PHONY: demo test lint format

$(STAMP): setup.py requirements/constraints.txt
	@test -n "$(PYTHON)" || { echo "error: Python 3.9, 3.10 or 3.11 is needed (TensorFlow 2.15 supports no other); install one, or run: make PYTHON=/path/to/python3.11 ..." >&2; exit 1; }
	rm -rf $(VENV)
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check -c requirements/constraints.txt -e '.[test]'
	touch $@

demo: $(STAMP)
	TF_CPP_MIN_LOG_LEVEL=2 $(VENV)/bin/python -m estimator_dist.launch --num_workers=2 --evaluator --timeout_secs=600 -- \
		--data_dir=$(DATA_DIR) --train_steps=400 --batch_size=64 --communication=RING --eval_throttle_secs=2

test: $(STAMP)
	$(VENV)/bin/python -m pytest

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(STAMP)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .
