"""HTTP to the daemons under test: one reply type, one blocking request, one raw trio request.

`request` is what most tests use (a daemon process, or an in-process one from a worker
thread); `raw_request` and `RawConnection` write the request bytes themselves, as curl sends
them, and read the answer without normalising anything, for the tests that compare our answers
with Go's byte for byte and those that need keep-alive, pipelining or malformed requests.
"""

import http.client
import json
import ssl
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode, urljoin, urlsplit

import trio

HOST = "127.0.0.1"
REPLY_TIMEOUT = 10.0


class Headers(Mapping[str, str]):
    """A reply's headers as sent, in order, looked up by name whatever its case."""

    def __init__(self, pairs: Iterable[tuple[str, str]] = ()) -> None:
        self.pairs = list(pairs)
        self._by_name = {name.lower(): value for name, value in self.pairs}

    def __getitem__(self, name: str) -> str:
        return self._by_name[name.lower()]

    def __iter__(self) -> Iterator[str]:
        return (name for name, _value in self.pairs)

    def __len__(self) -> int:
        return len(self.pairs)

    def items(self) -> list[tuple[str, str]]:  # the pairs as sent, repeated names too
        return list(self.pairs)

    def __repr__(self) -> str:
        return repr(self.pairs)


@dataclass
class HTTPReply:
    status: int
    body: bytes
    headers: Headers = field(default_factory=Headers)
    reason: str = ""
    version: str = "HTTP/1.1"

    @property
    def status_line(self) -> str:
        return f"{self.version} {self.status} {self.reason}"

    def header(self, name: str) -> str | None:
        return self.headers.get(name)

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def text(self) -> str:
        return self.body.decode()

    @property
    def message(self) -> str:
        """The text of a V1 error body `{"message": ...}`."""
        document = self.json()
        assert list(document) == ["message"], document
        return document["message"]


def request(
    address: str | int,
    method: str,
    target: str,
    body: bytes | None = None,
    headers: Mapping[str, str] | None = None,
    *,
    context: ssl.SSLContext | None = None,
    timeout: float = REPLY_TIMEOUT,
) -> HTTPReply:
    """One request to `host:port` (or a port on 127.0.0.1), whatever its status; HTTPS with
    `context`."""
    host, port = (HOST, address) if isinstance(address, int) else _split(address)
    connection: http.client.HTTPConnection
    if context is not None:
        connection = http.client.HTTPSConnection(host, port, timeout=timeout, context=context)
    else:
        connection = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        connection.request(method, target, body=body, headers=dict(headers or {}))
        response = connection.getresponse()
        return HTTPReply(
            response.status, response.read(), Headers(response.getheaders()), response.reason
        )
    finally:
        connection.close()


def fetch(
    url: str,
    method: str = "GET",
    body: bytes | None = None,
    headers: Mapping[str, str] | None = None,
    *,
    context: ssl.SSLContext | None = None,
    timeout: float = REPLY_TIMEOUT,
) -> HTTPReply:
    """`request` to a full URL; an https one verifies with `context` (the default one when
    none is given). Redirects are followed as a browser does (a 303 as a GET)."""
    for _hop in range(5):
        parts = urlsplit(url)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        if parts.scheme == "https" and context is None:
            context = ssl.create_default_context()
        reply = request(
            parts.netloc, method, target, body, headers, context=context, timeout=timeout
        )
        location = reply.header("Location")
        if reply.status not in (301, 302, 303, 307, 308) or not location:
            return reply
        url = urljoin(url, location)
        if reply.status in (301, 302, 303):
            method, body = "GET", None
    raise AssertionError(f"too many redirects from {url}")


def get_json(address: str | int, target: str) -> Any:
    reply = request(address, "GET", target)
    assert reply.status == 200, (target, reply)
    return reply.json()


def post(address: str | int, target: str, body: bytes | None = None) -> HTTPReply:
    reply = request(address, "POST", target, body)
    assert reply.status == 200, (target, reply)
    return reply


def _split(address: str) -> tuple[str, int]:
    for scheme in ("http://", "https://"):
        address = address.removeprefix(scheme)
    host, _, port = address.rstrip("/").rpartition(":")
    return host.strip("[]"), int(port)


# -- the raw client: requests written by hand, the way curl writes them; answers as sent ---------

CURL_USER_AGENT = "curl/8.5.0"


def reply_from_head(head: bytes) -> HTTPReply:
    """The status line and headers of a response head (without the blank line), no body."""
    status_line, *lines = head.decode("latin-1").split("\r\n")
    version, status, reason = (status_line.split(" ", 2) + [""])[:3]
    headers = []
    for line in lines:
        name, _, value = line.partition(":")
        headers.append((name, value.strip()))
    return HTTPReply(int(status), b"", Headers(headers), reason, version)


def parse_response(raw: bytes) -> HTTPReply:
    """One complete response, e.g. a `curl -i` capture: the body is everything after the head."""
    head, separator, body = raw.partition(b"\r\n\r\n")
    assert separator, f"no end of headers in {raw[:200]!r}"
    reply = reply_from_head(head)
    reply.body = body
    return reply


def encode_request(
    method: str,
    target: str,
    body: bytes | str | None = None,
    *,
    host: str = HOST,
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


def target(path: str, **params: object) -> str:
    """`path?k=v&...` with the values URL-encoded; None values are left out."""
    query = urlencode({key: value for key, value in params.items() if value is not None})
    return f"{path}?{query}" if query else path


class RawConnection:
    """One client connection on trio; answers are read one at a time, in order, exactly as
    sent (keep-alive, pipelining and malformed-request tests need to see them)."""

    def __init__(self, stream: trio.SocketStream, host: str) -> None:
        self.stream = stream
        self.host = host
        self.buffer = bytearray()
        self.eof = False

    @classmethod
    async def open(cls, address: str | int) -> "RawConnection":
        host, port = (HOST, address) if isinstance(address, int) else _split(address)
        stream = await trio.open_tcp_stream(host, port)
        return cls(stream, f"{host}:{port}")

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

    async def read_response(self, timeout: float = REPLY_TIMEOUT) -> HTTPReply:
        with trio.fail_after(timeout):
            while b"\r\n\r\n" not in self.buffer:
                await self._receive()
            end = self.buffer.index(b"\r\n\r\n")
            reply = reply_from_head(bytes(self.buffer[:end]))
            del self.buffer[: end + 4]
            length = reply.header("Content-Length")
            if length is None:  # no length: the body runs to the end of the connection
                while True:
                    try:
                        await self._receive()
                    except ConnectionError:
                        break
                reply.body, self.buffer = bytes(self.buffer), bytearray()
                return reply
            while len(self.buffer) < int(length):
                await self._receive()
            reply.body = bytes(self.buffer[: int(length)])
            del self.buffer[: int(length)]
            return reply

    async def request(self, method: str, target: str, body=None, **kwargs) -> HTTPReply:
        timeout = kwargs.pop("timeout", REPLY_TIMEOUT)
        await self.send_request(method, target, body, **kwargs)
        return await self.read_response(timeout)

    async def closed_by_peer(self, timeout: float = REPLY_TIMEOUT) -> bool:
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


async def raw_request(
    address: str | int, method: str, target: str, body=None, **kwargs
) -> HTTPReply:
    """One request on a connection of its own (`headers=`, `version=`, `timeout=`)."""
    connection = await RawConnection.open(address)
    try:
        return await connection.request(method, target, body, **kwargs)
    finally:
        await connection.aclose()


async def raw_get_json(address: str | int, path: str, **params: object) -> Any:
    reply = await raw_request(address, "GET", target(path, **params))
    assert reply.status == 200, (path, reply)
    return reply.json()
