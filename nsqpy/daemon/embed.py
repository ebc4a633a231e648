"""A daemon on its own trio loop in a background thread, for code that is not trio (plain
threads, asyncio, pytest fixtures). `nsqpy.nsqd.embed` and `nsqpy.nsqlookupd.embed` build on it."""

import contextlib
import threading
from collections.abc import Callable
from typing import Any

import trio


class ServerThread:
    """Runs `serve(options)` (an async context manager yielding a listening server with
    `tcp_address`, `http_address` and `options`) until `stop()`."""

    name = "daemon"

    def __init__(
        self, options: Any, serve: Callable[[Any], contextlib.AbstractAsyncContextManager]
    ):
        self.options = options
        self._serve = serve
        self.server: Any = None
        self.tcp_address: str = ""
        self.http_address: str = ""
        self._token: trio.lowlevel.TrioToken | None = None
        self._stop_requested: trio.Event | None = None
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)

    def start(self, timeout: float = 30.0):
        self._thread.start()
        if not self._started.wait(timeout):
            raise TimeoutError(f"{self.name} did not start within {timeout}s")
        if self._error is not None:
            raise single_error(self._error)
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
        async with self._serve(self.options) as server:
            self.server = server
            self.options = server.options  # with a temporary data path, if one was made
            self.tcp_address = server.tcp_address
            self.http_address = server.http_address
            self._stop_requested = trio.Event()
            self._started.set()
            await self._stop_requested.wait()

    def stop(self, timeout: float = 30.0) -> None:
        """Shut the daemon down cleanly and wait for it; idempotent."""
        if self._thread.is_alive() and self._token is not None and self._stop_requested is not None:
            try:
                self._token.run_sync_soon(self._stop_requested.set)
            except trio.RunFinishedError:
                pass
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"{self.name} did not stop within {timeout}s")

    def __enter__(self):
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def single_error(error: BaseException) -> BaseException:
    """The one error inside nested single-member exception groups (a busy port is then a
    plain OSError for the caller)."""
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    return error
