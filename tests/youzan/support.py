"""Speaking Youzan's dialect of the V2 protocol to the in-process nsqd, byte by byte.

Youzan's own clients are not available here, so these helpers build the commands with our
codec (`nsqpy.common.command`) and read the frames with `nsqpy.common.frame.FrameDecoder`, then
decode what docs/protocol.md §3 says a Youzan client receives: binary 8+8 message IDs, the
optional DETAIL section `[8 offset][4 raw size]`, the 30-byte traced-publish reply. Nothing
here knows how nsqd implements any of it; every layout is taken from docs/protocol.md.
"""

import struct
from dataclasses import dataclass

import trio

from nsqpy.common.command import (
    encode_command,
    encode_ext_body,
    encode_fin,
    encode_identify,
)
from nsqpy.common.frame import FRAME_TYPE_ERROR, FRAME_TYPE_RESPONSE, Frame
from nsqpy.common.message import DecodedMessage
from tests.nsqd.wire import ConnectionClosed, Wire
from tests.support.http import HTTPReply, request

# docs/protocol.md §3.5: the DETAIL section, and §3.6: the traced-publish reply after "OK".
_DETAIL = struct.Struct(">QI")
_TRACE_REPLY = struct.Struct(">2sQQQI")
_BINARY_ID = struct.Struct(">QQ")
# The record of a message in a partition (docs/protocol.md §3.5 and the project's decision): the
# 4-byte length prefix, the 26-byte message header, the body.
RECORD_OVERHEAD = 4 + 26
# An ID no nsqd has issued (internal id 12345, trace id 0), and how Youzan prints it: Go's %v
# of a []byte (docs/protocol.md §3.4).
UNKNOWN_BINARY_ID = _BINARY_ID.pack(12345, 0)
UNKNOWN_BINARY_ID_TEXT = "[0 0 0 0 0 0 48 57 0 0 0 0 0 0 0 0]"


def binary_id(internal_id: int, trace_id: int = 0) -> bytes:
    return _BINARY_ID.pack(internal_id, trace_id)


def go_bytes(raw: bytes) -> str:
    """Go's `%v` of a []byte, written out here so the expected texts do not come from nsqd."""
    return "[" + " ".join(str(byte) for byte in raw) + "]"


def record_size(body: bytes) -> int:
    return RECORD_OVERHEAD + len(body)


@dataclass
class YouzanMessage:
    """A message frame as a Youzan client decodes it (docs/protocol.md §3.4, §3.5)."""

    timestamp: int
    attempts: int
    id: bytes
    offset: int | None
    raw_size: int | None
    body: bytes

    @property
    def internal_id(self) -> int:
        return _BINARY_ID.unpack(self.id)[0]

    @property
    def trace_id(self) -> int:
        return _BINARY_ID.unpack(self.id)[1]


def youzan_message(message: DecodedMessage, detail: bool) -> YouzanMessage:
    body = message.body
    offset = raw_size = None
    if detail:
        assert len(body) >= _DETAIL.size, f"no room for a DETAIL section in {body!r}"
        offset, raw_size = _DETAIL.unpack_from(body)
        body = body[_DETAIL.size :]
    return YouzanMessage(message.timestamp, message.attempts, message.id, offset, raw_size, body)


@dataclass
class TraceReply:
    """PUB_TRACE's and MPUB_TRACE's 30-byte response payload (docs/protocol.md §3.6)."""

    internal_id: int
    trace_id: int
    offset: int
    raw_size: int


def trace_reply(frame: Frame) -> TraceReply:
    assert frame.frame_type == FRAME_TYPE_RESPONSE, f"not a response: {frame}"
    assert len(frame.data) == 30, f"the traced reply is 30 bytes, got {frame.data!r}"
    ok, internal_id, trace_id, offset, raw_size = _TRACE_REPLY.unpack(frame.data)
    assert ok == b"OK", frame.data
    return TraceReply(internal_id, trace_id, offset, raw_size)


# -- commands -----------------------------------------------------------------------------


def internal_create_topic(topic: str, partition: int | str, *ext: str) -> bytes:
    return encode_command("INTERNAL_CREATE_TOPIC", topic, partition, *ext)


def sub(name: str, topic: str, channel: str, *extra: int | str) -> bytes:
    return encode_command(name, topic, channel, *extra)


def pub_trace(topic: str, trace_id: int, data: bytes, *partition: int | str) -> bytes:
    return encode_command("PUB_TRACE", topic, *partition, body=struct.pack(">Q", trace_id) + data)


# -- the connection -------------------------------------------------------------------------


class YouzanWire(Wire):
    """A V2 connection that knows the Youzan texts: its liveness probe is a FIN of an unknown
    binary ID once subscribed (E_FIN_FAILED with the ID as a Go byte slice) and a repeated
    IDENTIFY before (allowed in the Init state, answered `OK`)."""

    subscribed = False
    detail = False

    async def expect_open(self) -> None:
        try:
            if self.subscribed:
                await self.send(encode_fin(UNKNOWN_BINARY_ID))
                frame = await self.read_response()
                expected = (
                    f"E_FIN_FAILED FIN {UNKNOWN_BINARY_ID_TEXT} failed ID not in flight".encode()
                )
                got = (frame.frame_type, frame.data)
                assert got == (FRAME_TYPE_ERROR, expected), f"probe answered {got}"
            else:
                await self.send(encode_identify({"client_id": "probe"}))
                await self.expect_ok()
        except ConnectionClosed:
            raise AssertionError("nsqd closed a connection that should stay open") from None

    async def expect_error_prefix(self, prefix: str, *, fatal: bool) -> bytes:
        """An error frame starting with `prefix` (where the rest is Go's own error text)."""
        frame = await self.read_response()
        assert frame.frame_type == FRAME_TYPE_ERROR, f"expected an error, got {frame}"
        assert frame.data.startswith(prefix.encode()), frame.data
        if fatal:
            await self.expect_closed()
        else:
            await self.expect_open()
        return frame.data

    async def command_ok(self, data: bytes) -> None:
        await self.send(data)
        await self.expect_ok()

    async def subscribe_as(self, name: str, topic: str, channel: str, *extra, rdy: int = 0):
        """SUB / SUB_ORDERED / SUB_ADVANCED; messages then carry DETAIL on the last two."""
        await self.command_ok(sub(name, topic, channel, *extra))
        self.subscribed = True
        self.detail = name in ("SUB_ORDERED", "SUB_ORDER", "SUB_ADVANCED")
        if rdy:
            await self.send(b"RDY %d\n" % rdy)

    async def read_youzan(self, timeout: float = 10.0) -> YouzanMessage:
        return youzan_message(await self.read_message(timeout), self.detail)

    async def read_youzans(self, count: int, timeout: float = 10.0) -> list[YouzanMessage]:
        with trio.fail_after(timeout):
            return [await self.read_youzan(timeout) for _ in range(count)]

    async def publish_traced(self, topic: str, trace_id: int, data: bytes, *partition):
        await self.send(pub_trace(topic, trace_id, data, *partition))
        return trace_reply(await self.read_response())


async def connect(nsqd) -> YouzanWire:
    return await YouzanWire.connect(nsqd)


async def create_partitions(nsqd, topic: str, *partitions: int, ext: str | None = None):
    """INTERNAL_CREATE_TOPIC for each partition, on a connection of its own."""
    wire = await connect(nsqd)
    for partition in partitions:
        await wire.command_ok(internal_create_topic(topic, partition, *([ext] if ext else [])))
    await wire.aclose()


# -- HTTP -----------------------------------------------------------------------------------


def http_port(nsqd) -> int:
    return int(nsqd.http_address.rsplit(":", 1)[1])


async def http(nsqd, method: str, target: str, body: bytes = b"") -> HTTPReply:
    """A request to the in-process nsqd's HTTP API, from a worker thread."""
    return await trio.to_thread.run_sync(
        request, http_port(nsqd), method, target, body if method in ("POST", "PUT") else None
    )


def command(name: str, *args, body: bytes | None = None) -> bytes:
    return encode_command(name, *args, body=body)


def pub_ext(topic: str, header: dict | bytes, data: bytes, *partition) -> bytes:
    return command("PUB_EXT", topic, *partition, body=encode_ext_body(header, data))
