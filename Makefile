# Everything runs from a local virtualenv in .venv, built on first use.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed
# nsqjs for the interop tests, from the committed lock file; the stamp is inside
# node_modules so that a missing node_modules reinstalls too.
NODE_DIR := tests/interop/node
NODE_INSTALLED := $(NODE_DIR)/node_modules/.installed

.PHONY: install browser java run test lint bench clean

$(INSTALLED): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,spark]'
	touch $(INSTALLED)

$(NODE_INSTALLED): $(NODE_DIR)/package.json $(NODE_DIR)/package-lock.json
	@command -v npm >/dev/null 2>&1 || { \
		echo "error: npm not found: the nsqjs interop tests ($(NODE_DIR)) need Node.js and npm (e.g. apt-get install nodejs npm)" >&2; \
		exit 1; }
	npm ci --prefix $(NODE_DIR) --no-audit --no-fund --loglevel=error
	touch $(NODE_INSTALLED)

install: $(INSTALLED) $(NODE_INSTALLED)

## Start nsqlookupd, nsqd and nsqadmin on localhost and print their URLs.
run: install
	$(BIN)/python -m tools.local_cluster

## Debian's headless Chromium and its driver, for the nsqadmin browser tests (root on CI).
browser:
	@if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then \
		command -v apt-get >/dev/null 2>&1 || { \
			echo "error: /usr/bin/chromium not found and apt-get is not available: the nsqadmin browser tests (tests/nsqadmin/test_browser.py) need Chromium and chromedriver (Debian: apt-get install chromium chromium-driver)" >&2; \
			exit 1; }; \
		apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y chromium chromium-driver; \
	fi

## The Spark connector tests (marker `spark`) start a local JVM.
java:
	@command -v java >/dev/null 2>&1 || { \
		echo "error: java not found: the Spark connector tests (tests/spark, marker spark) need Java 17 (Debian: apt-get install openjdk-17-jre-headless)" >&2; \
		exit 1; }

## Lint, then the whole default test suite.
test: install browser java lint
	$(BIN)/python -m pytest

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

bench: install
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis *.egg-info
