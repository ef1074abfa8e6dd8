# The two commands of the README. Each creates .venv when missing and installs what it needs.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
OPENCL := $(VENV)/.opencl

.PHONY: demo test lint format bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test,bench]'
	touch $(STAMP)

# PoCL + PyOpenCL so the OpenCL backend runs its tests on the CPU (CI runs as root on Debian).
$(OPENCL): $(STAMP) .ci/opencl.sh
	sh .ci/opencl.sh $(BIN)/python && touch $(OPENCL) || echo "opencl: not set up (reason above); OpenCL tests will skip"


demo: $(STAMP)
	$(BIN)/python examples/demo.py

test: $(STAMP) $(OPENCL)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

bench: $(STAMP)
	$(BIN)/python bench/ops.py

clean:
	rm -rf $(VENV) build *.egg-info
