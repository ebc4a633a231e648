# Everything runs from a local virtualenv in .venv, built on first use.
# `make run` needs Python 3.11 (with its venv module) and make, nothing else; `make test` also
# installs the test tools: the test extras from PyPI, nsqjs from npm, and, where they are
# missing, Debian's Chromium (nsqadmin's browser tests), Node.js (nsqjs), Java (Spark), etcd
# (the cluster tests) and iproute2 and nftables (the network fault tests) (apt-get, as root).
# The Python the virtualenv is made from (`make PYTHON=/path/to/python3.11` chooses): Debian's
# own 3.11 where it is installed with its venv module, else the first python3.11 or python3 on
# PATH. Debian builds its Python with profile-guided and link-time optimisation, which one
# built from source without --enable-optimizations (pyenv's default) lacks: an nsqd's start
# took 13 % less CPU (0.42-0.47 s against 0.50-0.54 s, three runs each), and the test suite,
# which starts about a thousand daemons, tools and Spark workers, 748 s instead of 858 s on
# two cores (fresh clones, 2026-11-29).
PYTHON ?= $(shell for python in /usr/bin/python3.11 "$$(command -v python3.11)" \
	"$$(command -v python3)"; do [ -x "$$python" ] && "$$python" -c 'import ensurepip' \
	2>/dev/null && { echo "$$python"; break; }; done)
VENV := .venv
BIN := $(VENV)/bin
# The package alone, enough to run the daemons and utilities.
INSTALLED := $(VENV)/.installed
# The package with the test and spark extras.
TEST_INSTALLED := $(VENV)/.installed-test
# PySpark alone, installed before those.
SPARK_INSTALLED := $(VENV)/.installed-spark
# The virtualenv's site-packages, asked of its Python when a recipe runs (it may not exist yet
# when make reads this file).
SITE_PACKAGES = $$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
# nsqjs for the interop tests, from the committed lock file; the stamp is inside
# node_modules so that a missing node_modules reinstalls too.
NODE_DIR := tests/interop/node
NODE_INSTALLED := $(NODE_DIR)/node_modules/.installed
# An editable install of a layout other than src/ makes setuptools print a notice about its
# import finder (`nsqpy/` sits beside the top-level folders it links to): not for users.
PIP_INSTALL := PYTHONWARNINGS="ignore:Editable installation" $(BIN)/python -m pip install --quiet

.PHONY: install install-test system-packages spark-classes browser etcd netns java node run run-cluster test test-prepared \
	test-cluster-workers bytecode lint bench clean

# The virtualenv with a current pip.
VENV_MADE := $(VENV)/.made

$(VENV_MADE):
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	touch $(VENV_MADE)

$(INSTALLED): pyproject.toml | $(VENV_MADE)
	$(PIP_INSTALL) -e .
	touch $(INSTALLED)

# Spark's Python workers would compile pyspark from its zip in every process they start
# (nsqpy/spark/pyspark_first.pth says why): the zips leave the path, so the installed pyspark
# is imported; the file's name sorts before the other .pth files, which import. PySpark finds
# data sources to register by listing modules, which an editable install does not list:
# pyspark_nsq.py goes beside them. The package comes with its extras in one install (it is
# `make install`'s too); pip compiles nothing, one file after another (half of its 72 s on two
# cores): `make bytecode` compiles them on every core.
$(TEST_INSTALLED): pyproject.toml | $(SPARK_INSTALLED)
	$(PIP_INSTALL) --no-compile -e '.[test,spark]'
	cp nsqpy/spark/pyspark_first.pth "$(SITE_PACKAGES)/00-nsqpy-pyspark-first.pth"
	cp pyspark_nsq.py "$(SITE_PACKAGES)/pyspark_nsq.py"
	touch $(INSTALLED) $(TEST_INSTALLED)

$(NODE_INSTALLED): $(NODE_DIR)/package.json $(NODE_DIR)/package-lock.json | system-packages
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

# PySpark alone (the version the spark extra names), installed before the rest so that Spark's
# class archive is made while pip installs the others: the archive, the longest step of
# `make test-prepared`, then no longer waits for all of pip (one process on one core).
$(SPARK_INSTALLED): pyproject.toml | $(VENV_MADE)
	$(PIP_INSTALL) --no-compile "$$($(BIN)/python -c 'import tomllib; \
		extra = tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]; \
		print(next(d for d in extra["spark"] if d.startswith("pyspark")))')"
	touch $(SPARK_INSTALLED)

# Spark's classes in a class data sharing archive for the Spark tests' JVMs
# (tests/spark/class_archive.py), made before the suite starts rather than by its first test;
# asked each time (it does nothing when the archive of this JVM and pyspark exists), since a
# Java update needs another. It needs only pyspark, which pip leaves alone while it installs
# the rest beside it.
spark-classes: $(SPARK_INSTALLED) | system-packages
	$(BIN)/python -m tests.spark.class_archive

## The package alone: what `make run` needs.
install: $(INSTALLED)

## Everything the test suite needs.
install-test: $(TEST_INSTALLED) $(GNSQ_SUITE_INSTALLED) $(NODE_INSTALLED) system-packages spark-classes

## Start nsqlookupd, nsqd and nsqadmin on localhost and print their URLs.
run: install
	$(BIN)/python -m nsqpy.tools.local_cluster

## A replicated cluster on localhost: etcd, nsqlookupd, three nsqds and nsqadmin. An nsqd that
## dies is started again on `restart <n>`, or with CLUSTER_ARGS=--restart-after=SECONDS.
CLUSTER_ARGS ?=
run-cluster: install etcd
	$(BIN)/python -m nsqpy.tools.local_cluster --replicated $(CLUSTER_ARGS)

## Debian's packages for the tests, where their programs are missing (scripts/system-packages.sh:
## one apt-get update and one install for all, as root): headless Chromium and its driver (the
## nsqadmin browser tests), etcd-server 3.4 (the cluster tests, which start a local etcd),
## iproute2 and nftables (the network fault tests, tests/cluster/test_network_faults.py, which
## join namespaces of their own through a bridge), Java 17 (the Spark connector tests, marker
## `spark`) and Node.js with npm (the nsqjs interop tests). `make browser`, `etcd`, `netns`,
## `java` and `node` install one of them alone.
SYSTEM_PACKAGES := sh scripts/system-packages.sh
NEED_BROWSER := "/usr/bin/chromium|chromium chromium-driver|the nsqadmin browser tests (tests/nsqadmin/test_browser.py) need Chromium and chromedriver" \
	"/usr/bin/chromedriver|chromium chromium-driver|the nsqadmin browser tests (tests/nsqadmin/test_browser.py) need Chromium and chromedriver"
NEED_ETCD := "/usr/bin/etcd|etcd-server|the cluster tests (tests/cluster) need etcd 3.4"
NEED_NETNS := "ip|iproute2|the network fault tests (tests/cluster/test_network_faults.py) need iproute2 and nftables" \
	"nft|nftables|the network fault tests (tests/cluster/test_network_faults.py) need iproute2 and nftables"
NEED_JAVA := "java|openjdk-17-jre-headless|the Spark connector tests (tests/spark, marker spark) need Java 17"
NEED_NODE := "npm|nodejs npm|the nsqjs interop tests ($(NODE_DIR)) need Node.js and npm"

system-packages:
	@$(SYSTEM_PACKAGES) $(NEED_BROWSER) $(NEED_ETCD) $(NEED_NETNS) $(NEED_JAVA) $(NEED_NODE)
browser:
	@$(SYSTEM_PACKAGES) $(NEED_BROWSER)
etcd:
	@$(SYSTEM_PACKAGES) $(NEED_ETCD)
netns:
	@$(SYSTEM_PACKAGES) $(NEED_NETNS)
java:
	@$(SYSTEM_PACKAGES) $(NEED_JAVA)
node:
	@$(SYSTEM_PACKAGES) $(NEED_NODE)

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
# What the suite needs is made side by side (`-j4`): the system packages (one apt-get for all)
# beside the virtualenv and pip, then Spark's class archive (47 s on two cores), mypy (24 s
# without a cache), the bytecode, npm and the gnsq sources beside one another (41.6 s against
# 75 s one after another). A fresh clone on 2026-11-29: 15 m 49 s in all, 822.6 s of pytest.
# On a machine without Chromium and Java, installing them (about 30 s or more) overlapped pip
# (69 s) instead of coming first. One pip install of the package with its extras instead of
# two, with the bytecode compiled by `make bytecode` on every core rather than by pip: pip done
# at 51 s instead of 96 s, `make test-prepared` of a fresh clone in 128 s instead of 157 s;
# with Debian's Python and PySpark installed first (the class archive made beside pip), 84 s
# (2026-11-29).
test:
	$(MAKE) --no-print-directory -j4 test-prepared
	$(BIN)/python -m pytest -n 3 --dist loadfile --no-loadscope-reorder

test-prepared: install-test lint bytecode

# Every suite that runs a cluster (tests/cluster with its network faults and chaos, the Spark
# failovers, the smart client, nsqadmin) with `-workers=2` on every node;
# tests/cluster/test_workers_in_cluster.py keeps the combination in `make test`.
CLUSTER_SUITES := tests/cluster tests/spark/test_exactly_once_failover.py \
	tests/spark/test_log_failover.py tests/tools/test_smart_client.py tests/nsqadmin
test-cluster-workers: test-prepared
	NSQPY_TEST_CLUSTER_NSQD_ARGS=-workers=2 $(BIN)/python -m pytest -n 3 --dist loadfile \
		$(CLUSTER_SUITES)

bytecode: $(TEST_INSTALLED)
	$(BIN)/python -m compileall -q -j0 -x "/\.venv/|/node_modules/|/\.git/" .
	$(BIN)/python -m compileall -q -j0 -x "/site-packages/.*/tests/" "$(SITE_PACKAGES)"

lint: $(TEST_INSTALLED)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python scripts/typecheck.py

bench: install-test
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis *.egg-info
