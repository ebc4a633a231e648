"""Fixtures of the nsqlookupd tests: an in-process nsqlookupd on ephemeral ports of 127.0.0.1
(broadcasting 127.0.0.1), and `make_lookupd(**options)` for one with other options."""

import pytest

from nsqpy.nsqlookupd.options import Options
from nsqpy.nsqlookupd.server import NSQLookupd


def lookupd_options(**changes) -> Options:
    return Options(
        tcp_address="127.0.0.1:0", http_address="127.0.0.1:0", broadcast_address="127.0.0.1"
    ).replace(**changes)


@pytest.fixture
def make_lookupd(nursery):
    """`await make_lookupd(tombstone_lifetime=1.0)`: a running in-process nsqlookupd."""
    servers: list[NSQLookupd] = []

    async def start(**changes) -> NSQLookupd:
        server = NSQLookupd(lookupd_options(**changes))
        await nursery.start(server.serve)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.shutdown()


@pytest.fixture
async def nsqlookupd(make_lookupd) -> NSQLookupd:
    return await make_lookupd()
