"""A small HTTP/1.x client that shows the bytes, for the nsqd HTTP API tests.

Requests are written by hand, the way curl writes them; responses are parsed without
normalising anything: the status line as sent, header names with their case and order, the
exact body. That is what a comparison with Go nsqd's captured `curl -i` output needs, and what
keep-alive, pipelining and malformed-request tests need to see. The async `HTTPConnection`
runs on trio next to the in-process nsqd; `parse_response` also reads the reference files.
"""

import json
from dataclasses import dataclass
from urllib.parse import urlencode

import trio

READ_TIMEOUT = 10.0
CURL_USER_AGENT = "curl/8.5.0"


@dataclass
class HTTPResponse:
    status_line: str
    headers: list[tuple[str, str]]
    body: bytes

    @property
    def status(self) -> int:
        return int(self.status_line.split(" ", 2)[1])

    def header(self, name: str) -> str | None:
        """The first value of header `name` (any case), None when absent."""
        wanted = name.lower()
        for key, value in self.headers:
            if key.lower() == wanted:
                return value
        return None

    def json(self):
        return json.loads(self.body)

    @property
    def text(self) -> str:
        return self.body.decode()


def parse_head(head: bytes) -> tuple[str, list[tuple[str, str]]]:
    """Status line and headers of a response head (without the blank line)."""
    lines = head.decode("latin-1").split("\r\n")
    headers = []
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers.append((name, value.strip()))
    return lines[0], headers


def parse_response(raw: bytes) -> HTTPResponse:
    """One complete response, e.g. a `curl -i` capture: the body is everything after the head."""
    head, separator, body = raw.partition(b"\r\n\r\n")
    assert separator, f"no end of headers in {raw[:200]!r}"
    status_line, headers = parse_head(head)
    return HTTPResponse(status_line, headers, body)


def encode_request(
    method: str,
    target: str,
    body: bytes | str | None = None,
    *,
    host: str = "127.0.0.1",
    headers: list[tuple[str, str]] | tuple = (),
    version: str = "HTTP/1.1",
) -> bytes:
    """A request as `curl -X METHOD [--data-binary BODY] URL` sends it."""
    lines = [f"{method} {target} {version}", f"Host: {host}", f"User-Agent: {CURL_USER_AGENT}"]
    lines.append("Accept: */*")
    lines.extend(f"{name}: {value}" for name, value in headers)
    if isinstance(body, str):
        body = body.encode()
    if body is not None:
        lines.append(f"Content-Length: {len(body)}")
        lines.append("Content-Type: application/x-www-form-urlencoded")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b"")


def target(path: str, **params) -> str:
    """`path?k=v&...` with the values URL-encoded; None values are left out."""
    query = urlencode({key: value for key, value in params.items() if value is not None})
    return f"{path}?{query}" if query else path


class HTTPConnection:
    """One client connection; responses are read one at a time, in order."""

    def __init__(self, stream: trio.SocketStream, host: str) -> None:
        self.stream = stream
        self.host = host
        self.buffer = bytearray()
        self.eof = False

    @classmethod
    async def open(cls, address: str) -> "HTTPConnection":
        host, _, port = address.rpartition(":")
        stream = await trio.open_tcp_stream(host, int(port))
        return cls(stream, address)

    async def send(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def send_request(self, method: str, target: str, body=None, **kwargs) -> None:
        await self.send(encode_request(method, target, body, host=self.host, **kwargs))

    async def _receive(self) -> None:
        if self.eof:
            raise ConnectionError("the server closed the connection")
        try:
            data = await self.stream.receive_some(65536)
        except trio.BrokenResourceError:
            data = b""
        if not data:
            self.eof = True
            raise ConnectionError("the server closed the connection")
        self.buffer += data

    async def read_response(self, timeout: float = READ_TIMEOUT) -> HTTPResponse:
        with trio.fail_after(timeout):
            while b"\r\n\r\n" not in self.buffer:
                await self._receive()
            end = self.buffer.index(b"\r\n\r\n")
            status_line, headers = parse_head(bytes(self.buffer[:end]))
            del self.buffer[: end + 4]
            response = HTTPResponse(status_line, headers, b"")
            length = response.header("Content-Length")
            if length is None:  # no length: the body runs to the end of the connection
                while True:
                    try:
                        await self._receive()
                    except ConnectionError:
                        break
                response.body, self.buffer = bytes(self.buffer), bytearray()
                return response
            while len(self.buffer) < int(length):
                await self._receive()
            response.body = bytes(self.buffer[: int(length)])
            del self.buffer[: int(length)]
            return response

    async def request(self, method: str, target: str, body=None, **kwargs) -> HTTPResponse:
        await self.send_request(method, target, body, **kwargs)
        return await self.read_response()

    async def closed_by_peer(self, timeout: float = READ_TIMEOUT) -> bool:
        """True when the server closes the connection (with nothing more to read) in time."""
        with trio.move_on_after(timeout):
            while True:
                try:
                    await self._receive()
                except ConnectionError:
                    return not self.buffer
        return False

    async def aclose(self) -> None:
        await self.stream.aclose()


async def request(address: str, method: str, target: str, body=None, **kwargs) -> HTTPResponse:
    """One request on a connection of its own."""
    connection = await HTTPConnection.open(address)
    try:
        return await connection.request(method, target, body, **kwargs)
    finally:
        await connection.aclose()


async def get_json(address: str, path: str, **params):
    response = await request(address, "GET", target(path, **params))
    assert response.status == 200, response
    return response.json()


async def stats(address: str, **params) -> dict:
    """`GET /stats?format=json` with these filters."""
    return await get_json(address, "/stats", format="json", **params)
