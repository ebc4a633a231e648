"""Fixtures shared by every test directory, and what a missing optional test package means."""

import re

import pytest

from nsqpy.nsqd.options import Options
from nsqpy.nsqd.server import NSQD


@pytest.fixture
def nsqd_options(tmp_path) -> Options:
    """Options for an in-process nsqd on an ephemeral port with its own data directory."""
    return Options(
        tcp_address="127.0.0.1:0",
        http_address="127.0.0.1:0",
        data_path=str(tmp_path),
        node_id=1,
    )


@pytest.fixture
async def nsqd(nsqd_options, nursery) -> NSQD:
    """A real nsqd served on trio in this test's event loop; shut down cleanly afterwards."""
    server = NSQD(nsqd_options)
    await nursery.start(server.serve)
    yield server
    server.shutdown()


# Test-only packages (the `test` and `spark` extras that `make test` installs), by the module a
# test imports. A test module that needs one that is missing is reported as skipped, naming
# the package, instead of failing the collection of the whole suite.
OPTIONAL_TEST_PACKAGES = {
    "ansq": "ansq",
    "atheris": "atheris",
    "gevent": "gevent (with gnsq)",
    "gnsq": "gnsq",
    "nsq": "pynsq",
    "prometheus_client": "prometheus-client",
    "pyarrow": "pyarrow",
    "pyspark": "pyspark",
    "selenium": "selenium",
    "tornado": "tornado (with pynsq)",
    "trustme": "trustme",
    "yaml": "pyyaml",
}
_MISSING_MODULE = re.compile(r"ModuleNotFoundError: No module named '([\w.]+)'")


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    report = yield
    if report.failed and isinstance(collector, pytest.Module):
        missing = _MISSING_MODULE.search(str(report.longrepr))
        package = missing and OPTIONAL_TEST_PACKAGES.get(missing.group(1).split(".")[0])
        if package:
            report.outcome = "skipped"
            report.longrepr = (
                str(collector.path),
                None,
                f"Skipped: the test package {package} is not installed "
                "(make test installs the test extras)",
            )
    return report


# The test files that take a minute or more of a CI core each (Spark's JVMs, the fault-injection
# runs, third-party suites, packaging), by path under tests/. They are handed to the workers
# first in collection order. Under `make test`, xdist's loadfile scheduling then orders the
# files by their number of tests (most first), so this order decides only among files of
# equal count. Making it decide (`--no-loadscope-reorder`) was measured: all the long files at
# once made the suite slower (1,080 s against 962 s, one run each, 2026-11-28).
LONG_FIRST = (
    "spark/",
    "cluster/test_network_faults.py",
    "cluster/test_chaos.py",
    "interop/test_gnsq_suite.py",
    "packaging/",
    "reliability/test_crash.py",
)


def pytest_collection_modifyitems(config, items) -> None:
    root = config.rootpath / "tests"

    def long_first(item) -> int:
        try:
            path = item.path.relative_to(root).as_posix()
        except ValueError:
            return 1
        return 0 if path.startswith(LONG_FIRST) else 1

    items.sort(key=long_first)  # stable: the order within each group stays
