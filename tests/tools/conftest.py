"""Fixtures of the tools tests: one real nsqd (and one nsqlookupd it registers with) as
subprocesses on ephemeral ports, shared by the module; each test uses its own topic."""

import itertools

import pytest

from tests.harness import start_nsqd, start_nsqlookupd

_topic_numbers = itertools.count()


@pytest.fixture(scope="module")
def lookupd():
    daemon = start_nsqlookupd("-broadcast-address=127.0.0.1")
    yield daemon
    daemon.stop()


@pytest.fixture(scope="module")
def nsqd(lookupd, tmp_path_factory):
    daemon = start_nsqd(
        tmp_path_factory.mktemp("nsqd"),
        f"-lookupd-tcp-address={lookupd.addresses['TCP']}",
        "-broadcast-address=127.0.0.1",
    )
    yield daemon
    daemon.stop()


@pytest.fixture
def topic(request) -> str:
    return f"tools_{request.node.name[:30].strip('_[]')}_{next(_topic_numbers)}".replace("[", "_")
