"""An nsqd in the test's own trio run, and what tests ask of it."""

import contextlib

import trio

from nsqpy.nsqd.options import Options
from nsqpy.nsqd.server import NSQD


@contextlib.asynccontextmanager
async def running_nsqd(options: Options):
    """An in-process nsqd on these options, stopped cleanly (flushing) on exit: for tests
    that restart one on the same data directory."""
    server = NSQD(options)
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve)
        yield server
        server.shutdown()


def tcp_port(server: NSQD) -> int:
    return int(server.tcp_address.rsplit(":", 1)[1])
