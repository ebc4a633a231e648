"""Running nsqd inside another program: `serve()` for trio code, `run_in_thread()` for
everything else (plain threads, asyncio, pytest fixtures).

Both default to 127.0.0.1 on ephemeral ports (read the real addresses back from the server or
handle) and, when no `data_path` is given, a temporary data directory removed afterwards::

    async with serve(mem_queue_size=100) as nsqd:       # trio
        print(nsqd.tcp_address, nsqd.http_address)

    handle = run_in_thread()                            # anything else
    try:
        print(handle.tcp_address, handle.http_address)
    finally:
        handle.stop()

Stopping is the daemon's clean shutdown (listeners closed, clients closed, messages and
metadata persisted), as on SIGTERM.
"""

import contextlib
import dataclasses
import tempfile
from collections.abc import AsyncIterator
from typing import Any

import trio

from nsqpy.daemon.embed import ServerThread
from nsqpy.nsqd.options import Options
from nsqpy.nsqd.server import NSQD

__all__ = ["EMBEDDED_DEFAULTS", "NSQDThread", "embedded_options", "run_in_thread", "serve"]

# Loopback and ephemeral ports: an embedded nsqd never collides with a real one.
EMBEDDED_DEFAULTS: dict[str, Any] = {
    "tcp_address": "127.0.0.1:0",
    "http_address": "127.0.0.1:0",
    "https_address": "127.0.0.1:0",
    "broadcast_address": "127.0.0.1",
}


def embedded_options(options: Options | None = None, **changes: Any) -> Options:
    """`options` (or the embedded defaults) with `changes` applied; field names are the
    flags' with `_` (`mem_queue_size=100`, `lookupd_tcp_address=["127.0.0.1:4160"]`)."""
    if options is None:
        options = Options(**{**EMBEDDED_DEFAULTS, **changes})
    elif changes:
        options = dataclasses.replace(options, **changes)
    return options


@contextlib.asynccontextmanager
async def serve(options: Options | None = None, **changes: Any) -> AsyncIterator[NSQD]:
    """Run nsqd in the current trio run; yields the listening server, shut down on exit."""
    options = embedded_options(options, **changes)
    with contextlib.ExitStack() as cleanup:
        if not options.data_path:
            directory = cleanup.enter_context(tempfile.TemporaryDirectory(prefix="nsqd-"))
            options = dataclasses.replace(options, data_path=directory)
        server = NSQD(options)
        async with trio.open_nursery() as nursery:
            await nursery.start(server.serve)
            try:
                yield server
            finally:
                server.shutdown()


class NSQDThread(ServerThread):
    """An nsqd running on its own trio loop in a daemon thread (see `run_in_thread`)."""

    name = "nsqd"

    def __init__(self, options: Options) -> None:
        super().__init__(options, serve)

    @property
    def data_path(self) -> str:
        return self.options.data_path


def run_in_thread(options: Options | None = None, **changes: Any) -> NSQDThread:
    """Start nsqd in a background thread; returns once it listens. Without `data_path`, its
    data lives in a temporary directory removed by `stop()`."""
    return NSQDThread(embedded_options(options, **changes)).start()
