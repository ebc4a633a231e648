# Everything runs from a local virtualenv in .venv, built on first use.
# `make run` needs Python 3.11 (with its venv module) and make, nothing else; `make test` also
# installs the test tools: the test extras from PyPI, nsqjs from npm, and, where they are
# missing, Debian's Chromium (nsqadmin's browser tests), Node.js (nsqjs), Java (Spark), etcd
# (the cluster tests) and iproute2 and nftables (the network fault tests) (apt-get, as root).
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
# The package alone, enough to run the daemons and utilities.
INSTALLED := $(VENV)/.installed
# The package with the test and spark extras.
TEST_INSTALLED := $(VENV)/.installed-test
# nsqjs for the interop tests, from the committed lock file; the stamp is inside
# node_modules so that a missing node_modules reinstalls too.
NODE_DIR := tests/interop/node
NODE_INSTALLED := $(NODE_DIR)/node_modules/.installed
APT_INSTALL := DEBIAN_FRONTEND=noninteractive apt-get install -y
# An editable install of a layout other than src/ makes setuptools print a notice about its
# import finder (`nsqpy/` sits beside the top-level folders it links to): not for users.
PIP_INSTALL := PYTHONWARNINGS="ignore:Editable installation" $(BIN)/python -m pip install --quiet

.PHONY: install install-test browser etcd netns java node run run-cluster test test-prepared \
	bytecode lint bench clean

$(INSTALLED): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(PIP_INSTALL) -e .
	touch $(INSTALLED)

# Spark's Python workers would compile pyspark from its zip in every process they start
# (nsqpy/spark/pyspark_first.pth says why): the installed pyspark goes first. PySpark finds
# data sources to register by listing modules, which an editable install does not list:
# pyspark_nsq.py goes beside them.
$(TEST_INSTALLED): $(INSTALLED)
	$(PIP_INSTALL) -e '.[test,spark]'
	cp nsqpy/spark/pyspark_first.pth \
		"$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/nsqpy-pyspark-first.pth"
	cp pyspark_nsq.py \
		"$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/pyspark_nsq.py"
	touch $(TEST_INSTALLED)

## Node.js and npm for the nsqjs interop tests.
node:
	@command -v npm >/dev/null 2>&1 || { \
		command -v apt-get >/dev/null 2>&1 || { \
			echo "error: npm not found and apt-get is not available: the nsqjs interop tests ($(NODE_DIR)) need Node.js and npm (Debian: apt-get install nodejs npm)" >&2; \
			exit 1; }; \
		apt-get update && $(APT_INSTALL) nodejs npm; \
	}

$(NODE_INSTALLED): $(NODE_DIR)/package.json $(NODE_DIR)/package-lock.json | node
	npm ci --prefix $(NODE_DIR) --no-audit --no-fund --loglevel=error
	touch $(NODE_INSTALLED)

# gnsq's own test suite (from its source distribution on PyPI, the version the test extra
# installed), which tests/interop/test_gnsq_suite.py runs against our daemons.
GNSQ_SUITE_INSTALLED := $(VENV)/gnsq-suite/.installed

$(GNSQ_SUITE_INSTALLED): $(TEST_INSTALLED)
	rm -rf $(VENV)/gnsq-suite && mkdir -p $(VENV)/gnsq-suite
	version=$$($(BIN)/python -c 'import gnsq; print(gnsq.__version__)') && \
	$(BIN)/python -m pip download --quiet --no-deps --no-binary :all: "gnsq==$$version" -d $(VENV)/gnsq-suite && \
	tar xzf $(VENV)/gnsq-suite/gnsq-$$version.tar.gz -C $(VENV)/gnsq-suite && \
	mv $(VENV)/gnsq-suite/gnsq-$$version $(VENV)/gnsq-suite/src
	touch $(GNSQ_SUITE_INSTALLED)

# Spark's classes in a class data sharing archive for the Spark tests' JVMs
# (tests/spark/class_archive.py), made before the suite starts rather than by its first test.
SPARK_CLASSES := $(VENV)/.spark-classes

$(SPARK_CLASSES): $(TEST_INSTALLED) | java
	$(BIN)/python -m tests.spark.class_archive
	touch $(SPARK_CLASSES)

## The package alone: what `make run` needs.
install: $(INSTALLED)

## Everything the test suite needs.
install-test: $(TEST_INSTALLED) $(GNSQ_SUITE_INSTALLED) $(NODE_INSTALLED) browser etcd netns java $(SPARK_CLASSES)

## Start nsqlookupd, nsqd and nsqadmin on localhost and print their URLs.
run: install
	$(BIN)/python -m nsqpy.tools.local_cluster

## A replicated cluster on localhost: etcd, nsqlookupd, three nsqds and nsqadmin. An nsqd that
## dies is started again on `restart <n>`, or with CLUSTER_ARGS=--restart-after=SECONDS.
CLUSTER_ARGS ?=
run-cluster: install etcd
	$(BIN)/python -m nsqpy.tools.local_cluster --replicated $(CLUSTER_ARGS)

## Debian's headless Chromium and its driver, for the nsqadmin browser tests.
browser:
	@if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then \
		command -v apt-get >/dev/null 2>&1 || { \
			echo "error: /usr/bin/chromium not found and apt-get is not available: the nsqadmin browser tests (tests/nsqadmin/test_browser.py) need Chromium and chromedriver (Debian: apt-get install chromium chromium-driver)" >&2; \
			exit 1; }; \
		apt-get update && $(APT_INSTALL) chromium chromium-driver; \
	fi

## Debian's etcd-server (etcd 3.4) for the cluster tests, which start a local etcd.
etcd:
	@if [ ! -x /usr/bin/etcd ]; then \
		command -v apt-get >/dev/null 2>&1 || { \
			echo "error: /usr/bin/etcd not found and apt-get is not available: the cluster tests (tests/cluster) need etcd 3.4 (Debian: apt-get install etcd-server)" >&2; \
			exit 1; }; \
		apt-get update && $(APT_INSTALL) etcd-server; \
	fi

## iproute2 (`ip netns`) and Debian's nftables for the network fault tests
## (tests/cluster/test_network_faults.py), which join namespaces of their own through a bridge.
netns:
	@if ! command -v ip >/dev/null 2>&1 || ! command -v nft >/dev/null 2>&1; then \
		command -v apt-get >/dev/null 2>&1 || { \
			echo "error: ip or nft not found and apt-get is not available: the network fault tests (tests/cluster/test_network_faults.py) need iproute2 and nftables (Debian: apt-get install iproute2 nftables)" >&2; \
			exit 1; }; \
		apt-get update && $(APT_INSTALL) iproute2 nftables; \
	fi

## Java 17 for the Spark connector tests (marker `spark`), which start a local JVM.
java:
	@command -v java >/dev/null 2>&1 || { \
		command -v apt-get >/dev/null 2>&1 || { \
			echo "error: java not found and apt-get is not available: the Spark connector tests (tests/spark, marker spark) need Java 17 (Debian: apt-get install openjdk-17-jre-headless)" >&2; \
			exit 1; }; \
		apt-get update && $(APT_INSTALL) openjdk-17-jre-headless; \
	}

## Lint, then the whole default test suite.
# Three workers (pytest-xdist), a test file each at a time: most tests wait on daemons, Spark
# or Chromium more than they compute. On two cores the suite took 842 s with two workers and
# 735 s with three once Spark's Python workers stopped compiling pyspark from its zip
# (nsqpy/spark/pyspark_first.pth); with Spark's class archive made before the suite, 733 s
# with three, and 677 s and 767 s in two runs with four (load average 7): no clear gain for
# more load (2026-11-28). Four again on 2026-11-29, with the bytecode below: 921 s against
# 1,030 s with three, but a load average of 9 while the Spark files ran side by side at the
# end, the Spark tests twice as slow, and a cluster test failed; three stay.
# `--no-loadscope-reorder`: the files go out in the order tests/conftest.py sets (the long
# files spread among the short ones instead of all at the end). Fresh clones, three workers,
# 2026-11-29: 1,061 s before; 1,030 s with the bytecode; 823 s with the files spread too.
#
# Most tests start daemons, tools or Spark's Python workers as new processes, each importing
# nsqpy. Where PYTHONDONTWRITEBYTECODE is set (this machine's environment sets it), Python
# writes no bytecode of the sources it imports, so each of those processes compiled nsqpy's
# sources anew: half of an nsqd's start (about 1.0 s -> 0.5 s on two cores). compileall writes
# it once; a source changed later is compiled in memory as before.
#
# The system packages first, one after another (apt holds a lock); then what the suite needs is
# made side by side (`-j4`): after pip, Spark's class archive (47 s on two cores), mypy (24 s
# without a cache), the bytecode, npm and the gnsq sources beside one another (41.6 s against
# 75 s one after another). A fresh clone on 2026-11-29: 15 m 49 s in all, 822.6 s of pytest.
test:
	$(MAKE) --no-print-directory browser etcd netns java node
	$(MAKE) --no-print-directory -j4 test-prepared
	$(BIN)/python -m pytest -n 3 --dist loadfile --no-loadscope-reorder

test-prepared: install-test lint bytecode

bytecode: $(INSTALLED)
	$(BIN)/python -m compileall -q -j0 -x "/\.venv/|/node_modules/|/\.git/" .

lint: $(TEST_INSTALLED)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python scripts/typecheck.py

bench: install-test
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis *.egg-info
