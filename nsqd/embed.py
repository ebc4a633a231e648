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
import threading
from collections.abc import AsyncIterator
from typing import Any

import trio

from nsqd.options import Options
from nsqd.server import NSQD

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


class NSQDThread:
    """An nsqd running on its own trio loop in a daemon thread (see `run_in_thread`)."""

    def __init__(self, options: Options) -> None:
        self.options = options
        self.server: NSQD | None = None
        self.tcp_address: str = ""
        self.http_address: str = ""
        self._token: trio.lowlevel.TrioToken | None = None
        self._stop_requested: trio.Event | None = None
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="nsqd", daemon=True)

    @property
    def data_path(self) -> str:
        return self.options.data_path

    def start(self, timeout: float = 30.0) -> "NSQDThread":
        self._thread.start()
        if not self._started.wait(timeout):
            raise TimeoutError(f"nsqd did not start within {timeout}s")
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
            self.options = server.options  # with the temporary data_path, if one was made
            self.tcp_address = server.tcp_address
            self.http_address = server.http_address
            self._stop_requested = trio.Event()
            self._started.set()
            await self._stop_requested.wait()

    def stop(self, timeout: float = 30.0) -> None:
        """Shut nsqd down cleanly and wait for it; idempotent."""
        if self._thread.is_alive() and self._token is not None and self._stop_requested is not None:
            try:
                self._token.run_sync_soon(self._stop_requested.set)
            except trio.RunFinishedError:
                pass
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"nsqd did not stop within {timeout}s")

    def __enter__(self) -> "NSQDThread":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def run_in_thread(options: Options | None = None, **changes: Any) -> NSQDThread:
    """Start nsqd in a background thread; returns once it listens. Without `data_path`, its
    data lives in a temporary directory removed by `stop()`."""
    return NSQDThread(embedded_options(options, **changes)).start()


def _single(error: BaseException) -> BaseException:
    """The one error inside nested single-member exception groups (a busy port is then a
    plain OSError for the caller)."""
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    return error
