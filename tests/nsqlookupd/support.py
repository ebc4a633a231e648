"""Clients for the nsqlookupd tests: a V1 peer over a real socket, a small HTTP client, polling.

The async helpers run on trio next to an in-process nsqlookupd (or against a daemon process);
the `Sync*` ones are for the tests that drive daemon processes from plain threads. Everything
talks to 127.0.0.1 over real sockets.
"""

import http.client
import json
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import trio

from nsqpy.common.lookup_protocol import (
    MAGIC_V1,
    LookupClientConnection,
    encode_identify,
    encode_register,
    encode_unregister,
)

HOST = "127.0.0.1"
REPLY_TIMEOUT = 5.0

# What Go nsqd v1.3.0 sends in IDENTIFY (docs/protocol.md §4.2): an official, "classic" peer.
CLASSIC_IDENTIFY = {
    "version": "1.3.0",
    "tcp_port": 24150,
    "http_port": 24151,
    "hostname": "classic-host",
    "broadcast_address": "127.0.0.1",
}
# What Youzan nsqd sends (docs/protocol.md §4.3): a partitioned peer, known by its distributed_id.
YOUZAN_IDENTIFY = {
    "version": "0.3.7-HA.1.13.0",
    "tcp_port": 24250,
    "http_port": 24251,
    "hostname": "youzan-host",
    "broadcast_address": "127.0.0.1",
    "distributed_id": "127.0.0.1:24260:24250:1",
}


def identify_body(base: dict, **changes) -> dict:
    """`base` with `changes`; a change to None removes the key."""
    body = {**base, **changes}
    return {key: value for key, value in body.items() if value is not None}


# -- the V1 protocol, async --------------------------------------------------------------------


class Peer:
    """One nsqd-side connection to nsqlookupd's TCP port, speaking V1 by hand."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.decoder = LookupClientConnection()
        self.replies: list[bytes] = []
        self.info: dict | None = None
        self.eof = False

    @classmethod
    async def connect(cls, port: int, *, magic: bool = True) -> "Peer":
        peer = cls(await trio.open_tcp_stream(HOST, port))
        if magic:
            await peer.send(MAGIC_V1)
        return peer

    @property
    def local_address(self) -> str:
        """The peer id nsqlookupd gives this connection (its remote address)."""
        host, port = self.stream.socket.getsockname()[:2]
        return f"{host}:{port}"

    async def send(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def _receive(self) -> bytes:
        try:
            data = await self.stream.receive_some(65536)
        except trio.BrokenResourceError:  # a reset: the server closed with data unread
            data = b""
        if not data:
            self.eof = True
        return data

    async def reply(self, timeout: float = REPLY_TIMEOUT) -> bytes:
        """The next length-prefixed reply; AssertionError if the server closes first."""
        with trio.fail_after(timeout):
            while not self.replies:
                data = await self._receive()
                if not data:
                    raise AssertionError("nsqlookupd closed the connection without a reply")
                self.replies.extend(self.decoder.receive_data(data))
        return self.replies.pop(0)

    async def command(self, data: bytes | str) -> bytes:
        if isinstance(data, str):
            data = data.encode()
        await self.send(data)
        return await self.reply()

    async def identify(self, info: dict) -> dict:
        reply = await self.command(encode_identify(info))
        self.info = info
        return json.loads(reply)

    async def register(
        self, topic: str, channel: str | None = None, partition: int | None = None
    ) -> None:
        reply = await self.command(encode_register(topic, channel, partition))
        assert reply == b"OK", reply

    async def unregister(
        self, topic: str, channel: str | None = None, partition: int | None = None
    ) -> None:
        reply = await self.command(encode_unregister(topic, channel, partition))
        assert reply == b"OK", reply

    async def ping(self) -> None:
        assert await self.command(b"PING\n") == b"OK"

    async def closed_by_server(self, timeout: float = REPLY_TIMEOUT) -> bool:
        """True when the server closes the connection in time with no further reply."""
        with trio.move_on_after(timeout):
            while not self.eof:
                data = await self._receive()
                if data:
                    self.replies.extend(self.decoder.receive_data(data))
            return not self.replies
        return False

    async def expect_fatal(self, text: str) -> None:
        """The server answers `text` and closes the connection (docs/protocol.md §4.1)."""
        assert (await self.reply()).decode("utf-8", "surrogateescape") == text
        assert await self.closed_by_server(), "nsqlookupd left the connection open"

    async def aclose(self) -> None:
        await self.stream.aclose()


async def identified_peer(port: int, info: dict) -> Peer:
    peer = await Peer.connect(port)
    await peer.identify(info)
    return peer


# -- HTTP, async -------------------------------------------------------------------------------


@dataclass
class HTTPReply:
    status: int
    reason: str
    headers: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> str | None:
        for key, value in self.headers:
            if key.lower() == name.lower():
                return value
        return None

    def json(self):
        return json.loads(self.body)

    @property
    def message(self) -> str:
        """The text of a V1 error body `{"message": ...}`."""
        document = self.json()
        assert list(document) == ["message"], document
        return document["message"]


def parse_http_head(head: bytes) -> tuple[int, str, list[tuple[str, str]]]:
    status_line, *lines = head.decode("latin-1").split("\r\n")
    _version, status, reason = status_line.split(" ", 2)
    headers = []
    for line in lines:
        name, _, value = line.partition(":")
        headers.append((name, value.strip()))
    return int(status), reason, headers


async def http_request(
    port: int,
    method: str,
    target: str,
    body: bytes = b"",
    headers: tuple[tuple[str, str], ...] = (),
    timeout: float = REPLY_TIMEOUT,
) -> HTTPReply:
    """One request on its own keep-alive connection, as curl sends it; the reply as sent."""
    lines = [f"{method} {target} HTTP/1.1", f"Host: {HOST}:{port}", "User-Agent: curl/8.5.0"]
    lines.append("Accept: */*")
    lines.extend(f"{name}: {value}" for name, value in headers)
    if body or method in ("POST", "PUT"):
        lines.append(f"Content-Length: {len(body)}")
    request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
    with trio.fail_after(timeout):
        stream = await trio.open_tcp_stream(HOST, port)
        async with stream:
            await stream.send_all(request)
            buffer = bytearray()
            while b"\r\n\r\n" not in buffer:
                data = await stream.receive_some(65536)
                assert data, f"connection closed before a response to {method} {target}"
                buffer += data
            head, _, rest = bytes(buffer).partition(b"\r\n\r\n")
            status, reason, reply_headers = parse_http_head(head)
            reply = HTTPReply(status, reason, reply_headers, b"")
            length = int(reply.header("Content-Length") or 0)
            body_bytes = bytearray(rest)
            while len(body_bytes) < length:
                data = await stream.receive_some(65536)
                assert data, "connection closed inside the body"
                body_bytes += data
            reply.body = bytes(body_bytes[:length])
            return reply


async def get_json(port: int, target: str):
    reply = await http_request(port, "GET", target)
    assert reply.status == 200, (target, reply)
    return reply.json()


async def post(port: int, target: str) -> HTTPReply:
    return await http_request(port, "POST", target)


async def lookup(port: int, topic: str, **params: str) -> HTTPReply:
    query = "&".join([f"topic={topic}", *(f"{key}={value}" for key, value in params.items())])
    return await http_request(port, "GET", f"/lookup?{query}")


async def lookup_producers(port: int, topic: str) -> list[dict] | None:
    """The producers of /lookup, or None when the topic is unknown (404)."""
    reply = await lookup(port, topic)
    if reply.status == 404:
        return None
    assert reply.status == 200, reply
    return reply.json()["producers"]


async def node_addresses(port: int) -> list[str]:
    """remote_address of every producer /nodes lists."""
    return [node["remote_address"] for node in (await get_json(port, "/nodes"))["producers"]]


async def eventually(
    check: Callable[[], Awaitable[object]], what: str, timeout: float = 5.0
) -> object:
    """Poll `check` until it returns something truthy; fail with `what` after `timeout`."""
    deadline = trio.current_time() + timeout
    while True:
        result = await check()
        if result:
            return result
        if trio.current_time() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await trio.sleep(0.01)


# -- synchronous versions, for the tests that drive daemon processes ------------------------------


def sync_request(port: int, method: str, target: str, body: bytes | None = None) -> HTTPReply:
    connection = http.client.HTTPConnection(HOST, port, timeout=REPLY_TIMEOUT)
    try:
        connection.request(method, target, body=body)
        response = connection.getresponse()
        return HTTPReply(response.status, response.reason, response.getheaders(), response.read())
    finally:
        connection.close()


def sync_get_json(port: int, target: str):
    reply = sync_request(port, "GET", target)
    assert reply.status == 200, (target, reply)
    return reply.json()


def sync_post(port: int, target: str, body: bytes | None = None) -> HTTPReply:
    reply = sync_request(port, "POST", target, body)
    assert reply.status == 200, (target, reply)
    return reply


def sync_lookup_producers(port: int, topic: str) -> list[dict] | None:
    reply = sync_request(port, "GET", f"/lookup?topic={topic}")
    if reply.status == 404:
        return None
    assert reply.status == 200, reply
    return reply.json()["producers"]


def poll(check: Callable[[], object], what: str, timeout: float = 5.0) -> object:
    """Call `check` until it returns something truthy; fail with `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


class SyncPeer:
    """A blocking V1 peer, for tests that run nsqlookupd as a process."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection((HOST, port), timeout=REPLY_TIMEOUT)
        self.decoder = LookupClientConnection()
        self.replies: list[bytes] = []
        self.sock.sendall(MAGIC_V1)

    def command(self, data: bytes) -> bytes:
        self.sock.sendall(data)
        while not self.replies:
            received = self.sock.recv(65536)
            if not received:
                raise AssertionError("nsqlookupd closed the connection")
            self.replies.extend(self.decoder.receive_data(received))
        return self.replies.pop(0)

    def identify(self, info: dict) -> dict:
        return json.loads(self.command(encode_identify(info)))

    def register(self, topic: str, channel: str | None = None) -> None:
        assert self.command(encode_register(topic, channel)) == b"OK"

    def close(self) -> None:
        self.sock.close()
