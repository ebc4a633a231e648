# Everything runs from a local virtualenv in .venv, built on first use.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed

.PHONY: install run test lint bench clean

$(INSTALLED): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(INSTALLED)

install: $(INSTALLED)

## Start nsqlookupd, nsqd and nsqadmin on localhost and print their URLs.
run: install
	$(BIN)/python -m tools.local_cluster

## Lint, then the whole default test suite.
test: install lint
	$(BIN)/python -m pytest

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

bench: install
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis *.egg-info
