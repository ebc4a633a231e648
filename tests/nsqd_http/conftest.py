"""Fixtures of the nsqd HTTP API tests: the in-process nsqd broadcasts 127.0.0.1, as the Go
nsqd of the reference captures did, and `with_options(...)` changes its options per test."""

import pytest

from tests.nsqd.wire import override_options


@pytest.fixture
def nsqd_options(nsqd_options, request):
    options = nsqd_options.replace(broadcast_address="127.0.0.1")
    return override_options(options, request)
