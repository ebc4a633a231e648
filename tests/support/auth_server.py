"""An nsq auth server for the tests (Go's `--auth-http-address` protocol): an aiohttp
application on 127.0.0.1:0 in a thread with its own asyncio loop, answering by secret from a
table the tests may change while the daemons run, and recording every request it gets."""

import asyncio
import contextlib
import threading
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass

from aiohttp import web


@dataclass
class AuthRequest:
    method: str
    path: str
    query_string: str
    headers: dict

    @property
    def query(self) -> dict:
        pairs = urllib.parse.parse_qsl(self.query_string, keep_blank_values=True)
        return dict(pairs)


class AuthServer:
    """An nsq auth server: answers `GET <any path>?secret=...` from `answers` (a JSON
    document, or an HTTP status with a plain-text body); unknown secrets get 403."""

    def __init__(self) -> None:
        self.answers: dict = {}
        self.requests: list[AuthRequest] = []
        self.port = 0
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="auth-server", daemon=True)

    def start(self) -> "AuthServer":
        self._thread.start()
        assert self._ready.wait(10), "the auth server did not start"
        return self

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def forget_requests(self) -> None:
        with self._lock:
            self.requests.clear()

    def requests_for(self, secret: str) -> list[AuthRequest]:
        with self._lock:
            return [r for r in self.requests if r.query.get("secret") == secret]

    def _run(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        app = web.Application()
        app.router.add_route("GET", "/{tail:.*}", self._answer)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.port = runner.addresses[0][1]
        self._ready.set()
        await self._stop.wait()
        await runner.cleanup()

    async def _answer(self, request: web.Request) -> web.Response:
        record = AuthRequest(
            request.method, request.path, request.rel_url.raw_query_string, dict(request.headers)
        )
        with self._lock:
            self.requests.append(record)
            answer = self.answers.get(record.query.get("secret"), 403)
        if isinstance(answer, int):
            return web.Response(status=answer, text="denied")
        return web.json_response(answer)


@contextlib.contextmanager
def answering(answers: dict) -> Iterator[AuthServer]:
    """An AuthServer answering from `answers` for the duration of the block."""
    server = AuthServer().start()
    server.answers.update(answers)
    try:
        yield server
    finally:
        server.stop()
