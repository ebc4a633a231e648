"""Fixtures of the Youzan tests: the in-process nsqd with per-test options, and no socket
left open after a test."""

import pytest

from tests.nsqd.wire import close_all_wires, override_options


@pytest.fixture
def nsqd_options(nsqd_options, request):
    return override_options(nsqd_options, request)


@pytest.fixture(autouse=True)
async def close_connections():
    yield
    close_all_wires()
