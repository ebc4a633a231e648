"""Running nsqlookupd inside another program: `serve()` for trio code, `run_in_thread()` for
everything else (plain threads, asyncio, pytest fixtures).

Both default to 127.0.0.1 on ephemeral ports, broadcasting 127.0.0.1; read the real addresses
back from the server or handle::

    async with serve() as lookupd:                      # trio
        print(lookupd.tcp_address, lookupd.http_address)

    handle = run_in_thread(tombstone_lifetime=5.0)     # anything else
    try:
        print(handle.tcp_address, handle.http_address)
    finally:
        handle.stop()

This mirrors `nsqpy.nsqd.embed` (the daemons do not import each other).
"""

import contextlib
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import trio

from nsqpy.daemon.embed import ServerThread
from nsqpy.nsqlookupd.options import Options
from nsqpy.nsqlookupd.server import NSQLookupd

__all__ = ["EMBEDDED_DEFAULTS", "NSQLookupdThread", "embedded_options", "run_in_thread", "serve"]

# Loopback and ephemeral ports: an embedded nsqlookupd never collides with a real one.
EMBEDDED_DEFAULTS: dict[str, Any] = {
    "tcp_address": "127.0.0.1:0",
    "http_address": "127.0.0.1:0",
    "broadcast_address": "127.0.0.1",
}


def embedded_options(options: Options | None = None, **changes: Any) -> Options:
    """`options` (or the embedded defaults) with `changes` applied; field names are the
    flags' with `_` (`tombstone_lifetime=5.0`)."""
    if options is None:
        options = Options(**{**EMBEDDED_DEFAULTS, **changes})
    elif changes:
        options = dataclasses.replace(options, **changes)
    return options


@contextlib.asynccontextmanager
async def serve(options: Options | None = None, **changes: Any) -> AsyncIterator[NSQLookupd]:
    """Run nsqlookupd in the current trio run; yields the listening server, shut down on exit."""
    options = embedded_options(options, **changes)
    server = NSQLookupd(options)
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve)
        try:
            yield server
        finally:
            server.shutdown()


class NSQLookupdThread(ServerThread):
    """An nsqlookupd running on its own trio loop in a daemon thread (see `run_in_thread`)."""

    name = "nsqlookupd"

    def __init__(self, options: Options) -> None:
        super().__init__(options, serve)


def run_in_thread(options: Options | None = None, **changes: Any) -> NSQLookupdThread:
    """Start nsqlookupd in a background thread; returns once it listens."""
    return NSQLookupdThread(embedded_options(options, **changes)).start()
