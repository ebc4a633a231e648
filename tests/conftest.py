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
# runs, third-party suites, packaging), by path under tests/.
LONG = (
    "spark/",
    "cluster/test_network_faults.py",
    "cluster/test_chaos.py",
    "interop/test_gnsq_suite.py",
    "packaging/",
    "reliability/test_crash.py",
)


def pytest_collection_modifyitems(config, items) -> None:
    """The order in which `make test` hands the test files to its workers (xdist's loadfile
    scheduling with `--no-loadscope-reorder`): by number of tests, most first, as xdist orders
    them itself, with the long files spread evenly over the first two thirds, one between every
    few short ones.

    xdist's own order put the long files, which have few tests, last: the suite ended on a few
    workers each running Spark JVMs one after the other. All of them first made three Spark
    JVMs and the fault runs compete at once (1,080 s against 962 s, 2026-11-28). Spread out,
    each long file runs beside short ones (823 s against 1,030 s, 2026-11-29)."""
    root = config.rootpath / "tests"

    def is_long(path) -> bool:
        try:
            return path.relative_to(root).as_posix().startswith(LONG)
        except ValueError:
            return False

    by_file: dict = {}
    for item in items:
        by_file.setdefault(item.path, []).append(item)
    files = sorted(by_file, key=lambda path: -len(by_file[path]))  # stable
    # The long files with the fewest tests first: those are the longest (a job killed and
    # run again, a whole third-party suite).
    long = sorted((path for path in files if is_long(path)), key=lambda path: len(by_file[path]))
    short = [path for path in files if not is_long(path)]
    gap = max(1, (2 * len(short) // 3) // max(1, len(long)))
    order = []
    for index, path in enumerate(short):
        if index % gap == 0 and long:
            order.append(long.pop(0))
        order.append(path)
    order.extend(long)
    items[:] = [item for path in order for item in by_file[path]]
