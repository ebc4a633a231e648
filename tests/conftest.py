"""Fixtures shared by every test directory."""

import pytest
import trio

from nsqd.options import Options
from nsqd.server import NSQD


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


def tcp_port(server: NSQD) -> int:
    return int(server.tcp_address.rsplit(":", 1)[1])


async def wait_until(predicate, timeout: float = 10.0, interval: float = 0.005) -> None:
    """Poll `predicate` until true, failing after `timeout`; for conditions with no event."""
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(interval)
