"""Youzan ext topics, complete (docs/protocol.md §3.6, §6.2): HTTP `/pub_ext`, and tag dispatch —
a consumer that IDENTIFYs with `desired_tag` receives exactly the messages whose
`##client_dispatch_tag` is its tag, untagged messages go only to consumers without a tag, and a
tag no consumer has goes to the consumers without one (Youzan's messagePump). Clients here are
Youzan-style raw V2 connections (binary IDs, `extend_support`); the tags live in the partition
log, so a restart keeps them."""

import json
import struct
import zlib
from urllib.parse import quote

import pytest
import trio

from nsqpy.client.core import split_ext_section
from nsqpy.common.command import (
    encode_ext_body,
    encode_fin,
    encode_identify,
    encode_mpub_body,
    encode_pub,
    encode_req,
)
from nsqpy.common.frame import FRAME_TYPE_RESPONSE
from tests.support.http import HTTPReply, request
from tests.support.nsqd import running_nsqd
from tests.youzan.support import (
    YouzanWire,
    command,
    connect,
    create_partitions,
    http,
    http_port,
    pub_ext,
)

TAG = "##client_dispatch_tag"


def http_with_headers(nsqd, target: str, body: bytes, headers: dict[str, str]) -> HTTPReply:
    return request(http_port(nsqd), "POST", target, body, headers)


async def pub_ext_http(nsqd, topic: str, header, body: bytes, headers=None, partition=0):
    ext = header if isinstance(header, str) else json.dumps(header)
    target = f"/pub_ext?topic={topic}&partition={partition}&ext={quote(ext)}"
    return await trio.to_thread.run_sync(http_with_headers, nsqd, target, body, headers or {})


async def tagged_consumer(nsqd, topic: str, channel: str, tag: str, rdy: int = 50) -> YouzanWire:
    wire = await connect(nsqd)
    await wire.identify(extend_support=True, desired_tag=tag)
    await wire.subscribe_as("SUB", topic, channel, 0, rdy=rdy)
    return wire


def header_of(body: bytes) -> tuple[dict | None, bytes]:
    """The ext section of a message body on an ext topic: (JSON header or None, data)."""
    header, data = split_ext_section(body)
    return (None if header is None else json.loads(header)), data


async def bodies(wire: YouzanWire, count: int) -> list[bytes]:
    messages = await wire.read_youzans(count)
    await wire.send(b"".join(encode_fin(message.id) for message in messages))
    return [header_of(message.body)[1] for message in messages]


# -- /pub_ext -------------------------------------------------------------------------------


async def test_pub_ext_over_http_merges_request_headers_and_answers_ok(nsqd):
    await create_partitions(nsqd, "yz", 0, ext="true")
    reader = await tagged_consumer(nsqd, "yz", "c", "")
    reply = await pub_ext_http(
        nsqd,
        "yz",
        {"k": "query", "other": "kept"},
        b"data",
        {"X-Nsqext-K": "header", "X-NSQEXT-Key-Test": "v"},
    )
    assert (reply.status, reply.body) == (200, b"OK")
    (message,) = await reader.read_youzans(1)
    header, data = header_of(message.body)
    assert data == b"data"
    assert header == {"k": "header", "other": "kept", "key-test": "v"}


async def test_pub_ext_over_http_with_a_trace_id_answers_the_traced_json(nsqd):
    await create_partitions(nsqd, "yz", 0, ext="true")
    first = await pub_ext_http(nsqd, "yz", {"##trace_id": "123"}, b"one")
    second = await pub_ext_http(nsqd, "yz", {"a": "b"}, b"two", {"X-Nsqext-##trace_id": "9"})
    assert first.status == 200 and second.status == 200
    one, two = first.json(), second.json()
    assert (one["status"], one["trace_id"], one["queue_offset"]) == ("OK", "123", 0)
    assert two["trace_id"] == "9" and two["queue_offset"] == one["rawsize"]
    assert two["id"] == one["id"] + 1


@pytest.mark.parametrize(
    "target, status, message",
    [
        ("/pub_ext?topic=yz&partition=0", 400, "E_INVALID_JSON_HEADER"),
        ("/pub_ext?topic=yz&partition=0&ext=", 400, "E_INVALID_JSON_HEADER"),
        ("/pub_ext?topic=yz&partition=0&ext=%7Bnope", 400, "E_INVALID_JSON_HEADER"),
        ("/pub_ext?topic=yz&partition=0&ext=%5B1%5D", 400, "E_INVALID_JSON_HEADER"),
        (
            "/pub_ext?topic=yz&partition=0&ext=" + quote('{"##trace_id":5}'),
            400,
            "INVALID_TRACE_ID",
        ),
        (
            "/pub_ext?topic=yz&partition=0&ext=" + quote('{"##trace_id":"x"}'),
            400,
            "INVALID_TRACE_ID",
        ),
        ("/pub_ext?topic=plain&partition=0&ext=" + quote('{"k":"v"}'), 400, "E_EXT_NOT_SUPPORT"),
        ("/pub_ext?topic=nope&ext=" + quote('{"k":"v"}'), 404, "E_TOPIC_NOT_EXIST"),
        ("/pub_ext?partition=0&ext=" + quote('{"k":"v"}'), 400, "MISSING_ARG_TOPIC"),
    ],
    ids=[
        "no-ext",
        "empty-ext",
        "garbled",
        "not-an-object",
        "trace-not-string",
        "trace-not-decimal",
        "not-ext-topic",
        "unknown-topic",
        "no-topic",
    ],
)
async def test_pub_ext_over_http_errors(nsqd, target, status, message):
    await create_partitions(nsqd, "yz", 0, ext="true")
    await create_partitions(nsqd, "plain", 0)
    reply = await trio.to_thread.run_sync(http_with_headers, nsqd, target, b"data", {})
    assert (reply.status, reply.json()) == (status, {"message": message})


async def test_pub_ext_over_http_refuses_an_empty_body(nsqd):
    await create_partitions(nsqd, "yz", 0, ext="true")
    reply = await pub_ext_http(nsqd, "yz", {"k": "v"}, b"")
    assert (reply.status, reply.json()) == (400, {"message": "MSG_EMPTY"})


# -- tag dispatch ---------------------------------------------------------------------------


async def test_tagged_and_untagged_consumers_each_receive_exactly_their_own(nsqd):
    """Published over TCP (PUB_EXT, MPUB_EXT, plain PUB) and HTTP (/pub_ext), interleaved."""
    await create_partitions(nsqd, "yz", 0, ext="true")
    blue = await tagged_consumer(nsqd, "yz", "c", "blue")
    plain = await tagged_consumer(nsqd, "yz", "c", "")
    writer = await connect(nsqd)
    await writer.command_ok(pub_ext("yz", {TAG: "blue"}, b"b1", 0))
    await writer.command_ok(pub_ext("yz", {"k": "v"}, b"u1", 0))
    await writer.command_ok(encode_pub("yz", b"u2", 0))
    assert (await pub_ext_http(nsqd, "yz", {TAG: "blue"}, b"b2")).status == 200
    assert (
        await pub_ext_http(nsqd, "yz", {}, b"u3", {"X-Nsqext-##client_dispatch_tag": "blue"})
    ).status == 200
    batch = [
        encode_ext_body({TAG: "blue"}, b"b4"),
        encode_ext_body({}, b"u4"),
        encode_ext_body({TAG: ""}, b"u5"),
    ]
    await writer.command_ok(command("MPUB_EXT", "yz", 0, body=encode_mpub_body(batch)))
    assert await bodies(blue, 4) == [b"b1", b"b2", b"u3", b"b4"]
    assert await bodies(plain, 4) == [b"u1", b"u2", b"u4", b"u5"]
    # Nothing else came: the next message each gets is the next one published for it.
    await writer.command_ok(pub_ext("yz", {TAG: "blue"}, b"b-last", 0))
    await writer.command_ok(pub_ext("yz", {}, b"u-last", 0))
    assert await bodies(blue, 1) == [b"b-last"]
    assert await bodies(plain, 1) == [b"u-last"]


async def test_a_tag_no_consumer_has_goes_to_the_untagged_consumers(nsqd):
    """Youzan's messagePump: a tagged message whose tag no consumer of the channel has falls
    through to the channel's common queue, and an untagged consumer gets it."""
    await create_partitions(nsqd, "yz", 0, ext="true")
    plain = await tagged_consumer(nsqd, "yz", "c", "")
    writer = await connect(nsqd)
    await writer.command_ok(pub_ext("yz", {TAG: "green"}, b"g1", 0))
    await writer.command_ok(pub_ext("yz", {}, b"u1", 0))
    assert await bodies(plain, 2) == [b"g1", b"u1"]
    # With a consumer of the tag connected, its messages go to it alone.
    green = await tagged_consumer(nsqd, "yz", "c", "green")
    await writer.command_ok(pub_ext("yz", {TAG: "green"}, b"g2", 0))
    await writer.command_ok(pub_ext("yz", {}, b"u2", 0))
    assert await bodies(green, 1) == [b"g2"]
    assert await bodies(plain, 1) == [b"u2"]


async def test_a_tagged_message_falls_through_at_once_in_log_order_requeues_included(nsqd):
    """An untagged consumer with `RDY 1` (as Youzan's Go client starts) takes a tagged message
    whose tag no consumer has as soon as it reads it: in log order among the untagged ones,
    and again at once when it requeues it."""
    await create_partitions(nsqd, "yz", 0, ext="true")
    plain = await tagged_consumer(nsqd, "yz", "c", "", rdy=1)
    assert (await pub_ext_http(nsqd, "yz", {TAG: "thisIsTag1"}, b"t1")).status == 200
    (first,) = await plain.read_youzans(1, timeout=2)
    assert header_of(first.body) == ({TAG: "thisIsTag1"}, b"t1")
    await plain.send(encode_req(first.id, 0))
    (again,) = await plain.read_youzans(1, timeout=2)
    assert (again.id, again.attempts) == (first.id, 2)
    await plain.send(encode_fin(again.id))
    writer = await connect(nsqd)
    published = [b"t2", b"u1", b"t3", b"t4", b"u2"]
    for body in published:
        await writer.command_ok(pub_ext("yz", {TAG: "other"} if body[:1] == b"t" else {}, body, 0))
    received = []
    for _ in published:
        (message,) = await plain.read_youzans(1, timeout=2)
        received.append(header_of(message.body)[1])
        await plain.send(encode_fin(message.id))
    assert received == published


async def test_a_leaving_tagged_consumers_messages_go_to_the_untagged_ones(nsqd):
    await create_partitions(nsqd, "yz", 0, ext="true")
    green = await tagged_consumer(nsqd, "yz", "c", "green", rdy=1)
    plain = await tagged_consumer(nsqd, "yz", "c", "")
    writer = await connect(nsqd)
    for body in (b"g1", b"g2", b"g3"):
        await writer.command_ok(pub_ext("yz", {TAG: "green"}, body, 0))
    await writer.command_ok(pub_ext("yz", {}, b"u1", 0))
    # The green consumer holds one message in flight and leaves without finishing it.
    await green.read_youzans(1)
    await green.stream.aclose()
    received = await bodies(plain, 4)
    assert sorted(received) == [b"g1", b"g2", b"g3", b"u1"]


async def test_consumers_of_a_plain_topic_ignore_their_tag(nsqd):
    """Only ext topics carry headers: there a tagged consumer gets everything."""
    await create_partitions(nsqd, "plain", 0)
    reader = await connect(nsqd)
    await reader.identify(desired_tag="blue")
    await reader.subscribe_as("SUB", "plain", "c", 0, rdy=5)
    writer = await connect(nsqd)
    await writer.command_ok(encode_pub("plain", b"m", 0))
    (message,) = await reader.read_youzans(1)
    assert message.body == b"m"


async def test_tags_survive_a_restart_of_a_log_topic(nsqd_options):
    async with running_nsqd(nsqd_options) as nsqd:
        await create_partitions(nsqd, "yz", 0, ext="true")
        # The channel exists before publishing (a new channel starts at the log's end).
        assert (
            await http(nsqd, "POST", "/channel/create?topic=yz&channel=c&partition=0")
        ).status == 200
        writer = await connect(nsqd)
        await writer.command_ok(pub_ext("yz", {TAG: "blue", "k": "v"}, b"b1", 0))
        await writer.command_ok(pub_ext("yz", {}, b"u1", 0))
        await writer.command_ok(pub_ext("yz", {TAG: "blue"}, b"b2", 0))
    async with running_nsqd(nsqd_options) as nsqd:
        # The tagged consumer first: until it is there, its tag's messages would be anyone's.
        blue = await tagged_consumer(nsqd, "yz", "c", "blue")
        plain = await tagged_consumer(nsqd, "yz", "c", "")
        messages = await blue.read_youzans(2)
        assert [header_of(m.body) for m in messages] == [
            ({TAG: "blue", "k": "v"}, b"b1"),
            ({TAG: "blue"}, b"b2"),
        ]
        assert await bodies(plain, 1) == [b"u1"]


class DeflateWire(YouzanWire):
    """A Youzan-style connection that negotiated deflate: every byte after IDENTIFY's reply is
    compressed both ways (raw deflate, flushed per write)."""

    async def start_deflate(self, leftover: bytes) -> None:
        self._inflate = zlib.decompressobj(-15)
        self._deflate = zlib.compressobj(6, zlib.DEFLATED, -15)
        self._frames.extend(self.decoder.receive_data(self._inflate.decompress(leftover)))

    async def send(self, *parts: bytes) -> None:
        data = b"".join(parts)
        deflate = getattr(self, "_deflate", None)
        if deflate is not None:
            data = deflate.compress(data) + deflate.flush(zlib.Z_SYNC_FLUSH)
        await self.stream.send_all(data)

    async def _receive(self) -> None:
        data = await self.stream.receive_some(65536)
        if not data:
            self.closed = True
            raise AssertionError("nsqd closed the connection")
        self._frames.extend(self.decoder.receive_data(self._inflate.decompress(data)))


async def deflate_consumer(nsqd, topic: str, tag: str) -> DeflateWire:
    wire = await DeflateWire.connect(nsqd)
    await wire.send(
        encode_identify(
            {
                "feature_negotiation": True,
                "deflate": True,
                "extend_support": True,
                "desired_tag": tag,
            }
        )
    )
    raw = b""
    while len(raw) < 4 or len(raw) < 4 + struct.unpack_from(">I", raw)[0]:
        raw += await wire.stream.receive_some(65536)
    size = struct.unpack_from(">I", raw)[0]
    frame_type = struct.unpack_from(">I", raw, 4)[0]
    assert frame_type == FRAME_TYPE_RESPONSE
    assert json.loads(raw[8 : 4 + size])["deflate"] is True
    await wire.start_deflate(raw[4 + size :])
    await wire.expect_ok()  # the upgrade's OK, compressed
    await wire.subscribe_as("SUB", topic, "c", 0, rdy=10)
    return wire


async def test_tagged_messages_reach_a_consumer_on_a_compressed_connection(nsqd):
    await create_partitions(nsqd, "yz", 0, ext="true")
    blue = await deflate_consumer(nsqd, "yz", "blue")
    writer = await connect(nsqd)
    await writer.command_ok(pub_ext("yz", {"k": "v"}, b"untagged", 0))
    await writer.command_ok(pub_ext("yz", {TAG: "blue", "big": "x" * 2000}, b"tagged", 0))
    (message,) = await blue.read_youzans(1)
    header, data = header_of(message.body)
    assert data == b"tagged" and header[TAG] == "blue" and header["big"] == "x" * 2000


# -- /pub and /mpub with &partition= --------------------------------------------------------


async def test_http_pub_and_mpub_publish_to_the_partition_they_name(nsqd):
    """Youzan's topic endpoints take `&partition=` (docs/protocol.md §6.2): the message goes to
    that existing partition; -1 or none is the default one, as before."""
    assert (await http(nsqd, "POST", "/topic/create?topic=pp&partition_num=2")).status == 200
    assert (await http(nsqd, "POST", "/pub?topic=pp&partition=1", b"one")).status == 200
    assert (await http(nsqd, "POST", "/mpub?topic=pp&partition=1", b"a\nb")).status == 200
    assert (await http(nsqd, "POST", "/pub?topic=pp&partition=-1", b"zero")).status == 200
    counts = {p: nsqd.get_partition("pp", p).message_count for p in (0, 1)}
    assert counts == {0: 1, 1: 3}
    for target, status, message in (
        ("/pub?topic=pp&partition=7", 404, "E_TOPIC_NOT_EXIST"),
        ("/mpub?topic=pp&partition=7", 404, "E_TOPIC_NOT_EXIST"),
        ("/pub?topic=pp&partition=x", 400, "INVALID_ARG_TOPIC_PARTITION"),
    ):
        reply = await http(nsqd, "POST", target, b"m")
        assert (reply.status, reply.json()) == (status, {"message": message}), target
