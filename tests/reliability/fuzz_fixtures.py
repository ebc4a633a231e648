"""The nsqd processes the fuzz tests run against (fuzz/daemon.py, with fuzz/run.py's flags).

A test module imports `fuzz_nsqd` and `shared_fuzz_nsqd` and asks for `nsqd` and
`shared_nsqd` (the fixtures' names)."""

import pytest

from fuzz.daemon import NSQDProcess
from fuzz.run import NSQD_FLAGS


@pytest.fixture(name="nsqd")
def fuzz_nsqd(tmp_path):
    daemon = NSQDProcess(tmp_path, *NSQD_FLAGS).start()
    yield daemon
    daemon.kill()


@pytest.fixture(name="shared_nsqd", scope="module")
def shared_fuzz_nsqd(tmp_path_factory):
    """One nsqd for the regression tests, which do not disturb one another."""
    daemon = NSQDProcess(tmp_path_factory.mktemp("nsqd"), *NSQD_FLAGS).start()
    yield daemon
    daemon.kill()
