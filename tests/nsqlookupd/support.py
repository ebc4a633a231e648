"""Clients for the nsqlookupd tests: a V1 peer over a real socket, a small HTTP client, polling.

The async helpers run on trio next to an in-process nsqlookupd (or against a daemon process);
the `Sync*` ones are for the tests that drive daemon processes from plain threads. Everything
talks to 127.0.0.1 over real sockets.
"""

import json
import socket

import trio

from nsqpy.common.lookup_protocol import (
    MAGIC_V1,
    LookupClientConnection,
    encode_identify,
    encode_register,
    encode_unregister,
)
from tests.support.http import HTTPReply, raw_get_json, raw_request, request

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


async def lookup(port: int, topic: str, **params: str) -> HTTPReply:
    query = "&".join([f"topic={topic}", *(f"{key}={value}" for key, value in params.items())])
    return await raw_request(port, "GET", f"/lookup?{query}")


async def lookup_producers(port: int, topic: str) -> list[dict] | None:
    """The producers of /lookup, or None when the topic is unknown (404)."""
    reply = await lookup(port, topic)
    if reply.status == 404:
        return None
    assert reply.status == 200, reply
    return reply.json()["producers"]


async def node_addresses(port: int) -> list[str]:
    """remote_address of every producer /nodes lists."""
    return [node["remote_address"] for node in (await raw_get_json(port, "/nodes"))["producers"]]


# -- synchronous versions, for the tests that drive daemon processes ------------------------------


def sync_lookup_producers(port: int, topic: str) -> list[dict] | None:
    reply = request(port, "GET", f"/lookup?topic={topic}")
    if reply.status == 404:
        return None
    assert reply.status == 200, reply
    return reply.json()["producers"]


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
