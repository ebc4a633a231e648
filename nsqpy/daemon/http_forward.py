"""Passing an HTTP request on to another server and its answer back, over kept-alive
connections (nsqd's `--workers` route a topic's request to the worker that owns it).

llhttp (httptools) parses the answers, as it parses the requests (`daemon/http_server.py`).
"""

import httptools
import trio

from nsqpy.daemon.http_server import Request, Response

# Headers that describe one hop, not the request; the forwarder sets its own.
_HOP_HEADERS = frozenset(("connection", "keep-alive", "content-length", "transfer-encoding"))
_RECEIVE_SIZE = 64 * 1024


class _Answer:
    def __init__(self) -> None:
        self.headers: list[tuple[str, str]] = []
        self.body: list[bytes] = []
        self.complete = False
        self.keep_alive = False
        self.status = 0
        self.parser: httptools.HttpResponseParser | None = None

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.decode("latin-1"), value.decode("latin-1")))

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        # llhttp answers these only until the message is done.
        assert self.parser is not None
        self.keep_alive = self.parser.should_keep_alive()
        self.status = self.parser.get_status_code()
        self.complete = True


class HTTPForwarder:
    """Requests to other servers by `host:port`, each connection reused while it lasts."""

    def __init__(self) -> None:
        self._idle: dict[str, list[trio.SocketStream]] = {}

    async def forward(self, address: str, request: Request, timeout: float = 30.0) -> Response:
        """`request` as `address` answers it. OSError or trio.TooSlowError when it cannot."""
        idle = self._idle.setdefault(address, [])
        while idle:
            stream = idle.pop()
            try:
                return await self._exchange(address, stream, request, timeout)
            except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
                continue  # it was closed while idle: open another
        host, _, port = address.rpartition(":")
        with trio.fail_after(timeout):
            stream = await trio.open_tcp_stream(host.strip("[]"), int(port))
        return await self._exchange(address, stream, request, timeout)

    async def _exchange(
        self, address: str, stream: trio.SocketStream, request: Request, timeout: float
    ) -> Response:
        target = request.path + (f"?{request.query_string}" if request.query_string else "")
        lines = [f"{request.method} {target} HTTP/1.1", f"Host: {address}"]
        lines += [
            f"{name}: {value}"
            for name, value in request.headers.items()
            if name not in _HOP_HEADERS and name != "host"
        ]
        lines.append(f"Content-Length: {len(request.body)}")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        answer = _Answer()
        parser = answer.parser = httptools.HttpResponseParser(answer)
        try:
            with trio.fail_after(timeout):
                await stream.send_all(head + request.body)
                while not answer.complete:
                    data = await stream.receive_some(_RECEIVE_SIZE)
                    if not data:
                        raise trio.BrokenResourceError("the server closed the connection")
                    parser.feed_data(data)
        except BaseException:
            await stream.aclose()
            raise
        finally:
            # The parser holds the answer's callbacks: without this they hold each other.
            answer.parser = None
        if answer.keep_alive:
            self._idle.setdefault(address, []).append(stream)
        else:
            await stream.aclose()
        headers = [
            (name, value)
            for name, value in answer.headers
            if name.lower() not in _HOP_HEADERS and name.lower() not in ("date", "server")
        ]
        return Response(answer.status, b"".join(answer.body), headers)

    async def aclose(self) -> None:
        for streams in self._idle.values():
            for stream in streams:
                await stream.aclose()
        self._idle.clear()
