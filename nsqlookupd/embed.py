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

This mirrors `nsqd.embed` (the daemons do not import each other).
"""

import contextlib
import dataclasses
import threading
from collections.abc import AsyncIterator
from typing import Any

import trio

from nsqlookupd.options import Options
from nsqlookupd.server import NSQLookupd

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


class NSQLookupdThread:
    """An nsqlookupd running on its own trio loop in a daemon thread (see `run_in_thread`)."""

    def __init__(self, options: Options) -> None:
        self.options = options
        self.server: NSQLookupd | None = None
        self.tcp_address: str = ""
        self.http_address: str = ""
        self._token: trio.lowlevel.TrioToken | None = None
        self._stop_requested: trio.Event | None = None
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="nsqlookupd", daemon=True)

    def start(self, timeout: float = 30.0) -> "NSQLookupdThread":
        self._thread.start()
        if not self._started.wait(timeout):
            raise TimeoutError(f"nsqlookupd did not start within {timeout}s")
        if self._error is not None:
            raise _single(self._error)
        return self

    def _run(self) -> None:
        try:
            trio.run(self._main)
        except BaseException as error:  # reported to start(), or kept for stop()
            self._error = error
        finally:
            self._started.set()

    async def _main(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        async with serve(self.options) as server:
            self.server = server
            self.tcp_address = server.tcp_address
            self.http_address = server.http_address
            self._stop_requested = trio.Event()
            self._started.set()
            await self._stop_requested.wait()

    def stop(self, timeout: float = 30.0) -> None:
        """Shut nsqlookupd down cleanly and wait for it; idempotent."""
        if self._thread.is_alive() and self._token is not None and self._stop_requested is not None:
            try:
                self._token.run_sync_soon(self._stop_requested.set)
            except trio.RunFinishedError:
                pass
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"nsqlookupd did not stop within {timeout}s")

    def __enter__(self) -> "NSQLookupdThread":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def run_in_thread(options: Options | None = None, **changes: Any) -> NSQLookupdThread:
    """Start nsqlookupd in a background thread; returns once it listens."""
    return NSQLookupdThread(embedded_options(options, **changes)).start()


def _single(error: BaseException) -> BaseException:
    """The one error inside nested single-member exception groups (a busy port is then a
    plain OSError for the caller)."""
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    return error
