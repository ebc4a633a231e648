"""Youzan's V2 extensions on the wire, byte for byte (docs/protocol.md §3, §6.2 and §8).

Every test talks to the in-process nsqd over real TCP connections and asserts the exact frames
of docs/protocol.md: INTERNAL_CREATE_TOPIC, the partition argument of the SUB and PUB families, the
binary 8+8 message IDs and the DETAIL section, the 30-byte traced-publish reply, the size and
JSON-header errors of PUB_TRACE / MPUB_TRACE / PUB_EXT, the Go byte-slice IDs in FIN / REQ /
TOUCH failures, the fatality of each error (a fatal one closes the connection, a non-fatal one
leaves it answering), `/disable/write`, and nsqd's Youzan HTTP endpoints.
"""

import datetime
import json
import re
import struct

import pytest
import trio

from nsqpy.common.command import (
    MAGIC_V2,
    encode_command,
    encode_ext_body,
    encode_fin,
    encode_identify,
    encode_mpub,
    encode_mpub_body,
    encode_pub,
    encode_rdy,
    encode_req,
    encode_sub,
    encode_touch,
    encode_trace_body,
)
from nsqpy.common.frame import FRAME_TYPE_RESPONSE
from tests.nsqd.wire import Wire, with_options
from tests.support.nsqd import tcp_port
from tests.support.polling import wait_until
from tests.youzan.support import (
    binary_id,
    command,
    connect,
    create_partitions,
    go_bytes,
    http,
    internal_create_topic,
    pub_ext,
    pub_trace,
    record_size,
    sub,
    trace_reply,
)

TOPIC_NOT_EXIST = "E_TOPIC_NOT_EXIST "
NOT_WRITABLE = "E_FAILED_ON_NOT_WRITABLE "
NOT_LEADER = "E_FAILED_ON_NOT_LEADER "
HEX_DIGITS = set(b"0123456789abcdef")
OFFICIAL_IDENTIFY_KEYS = [
    "max_rdy_count",
    "version",
    "max_msg_timeout",
    "msg_timeout",
    "tls_v1",
    "deflate",
    "deflate_level",
    "max_deflate_level",
    "snappy",
    "sample_rate",
    "auth_required",
    "output_buffer_size",
    "output_buffer_timeout",
]


def size(n: int) -> bytes:
    return struct.pack(">i", n)


def sized(body: bytes) -> bytes:
    return size(len(body)) + body


def mpub_trace(topic: str, messages: list[tuple[int, bytes]], *partition) -> bytes:
    bodies = [encode_trace_body(trace_id, data) for trace_id, data in messages]
    return command("MPUB_TRACE", topic, *partition, body=encode_mpub_body(bodies))


async def consumer(nsqd, name: str, topic: str, channel: str, *extra, rdy=10, **identify):
    wire = await connect(nsqd)
    if identify:
        await wire.identify(**identify)
    await wire.subscribe_as(name, topic, channel, *extra, rdy=rdy)
    return wire


async def create_ordered(nsqd, topic: str, partitions: int) -> None:
    reply = await http(
        nsqd, "POST", f"/topic/create?topic={topic}&partition_num={partitions}&orderedmulti=true"
    )
    assert reply.status == 200, reply


# -- 3.2 INTERNAL_CREATE_TOPIC ---------------------------------------------------------------


async def test_internal_create_topic_creates_the_partition(nsqd):
    wire = await connect(nsqd)
    await wire.command_ok(internal_create_topic("yz", 3))
    # Only partition 3 exists: SUB and PUB reach it, partition 0 is still missing.
    reader = await consumer(nsqd, "SUB", "yz", "c", 3)
    await wire.command_ok(encode_pub("yz", b"to-3", 3))
    assert (await reader.read_youzan()).body == b"to-3"
    await wire.send(encode_pub("yz", b"to-0", 0))
    await wire.expect_error(TOPIC_NOT_EXIST)


@pytest.mark.parametrize(
    "line, error",
    [
        (b"INTERNAL_CREATE_TOPIC\n", "E_INVALID CREATE_TOPIC insufficient number of parameters"),
        (b"INTERNAL_CREATE_TOPIC yz\n", "E_INVALID CREATE_TOPIC insufficient number of parameters"),
        (b"INTERNAL_CREATE_TOPIC a!b 0\n", 'E_BAD_TOPIC topic name "a!b" is not valid'),
        (
            b"INTERNAL_CREATE_TOPIC yz x\n",
            'E_BAD_PARTITION topic partition is not valid: strconv.Atoi: parsing "x": '
            "invalid syntax",
        ),
        (b"INTERNAL_CREATE_TOPIC yz -1\n", "E_BAD_PARTITION partition should not less than 0"),
    ],
    ids=["no-params", "no-partition", "bad-topic", "bad-partition", "negative-partition"],
)
async def test_internal_create_topic_errors_are_fatal(nsqd, line, error):
    wire = await connect(nsqd)
    await wire.send(line)
    await wire.expect_error(error)


async def test_internal_create_topic_bad_ext_is_fatal(nsqd):
    wire = await connect(nsqd)
    await wire.send(internal_create_topic("yz", 0, "maybe"))
    text = await wire.expect_error_prefix("E_BAD_EXT topic ext is not valid: ", fatal=True)
    assert b'"maybe"' in text


@pytest.mark.parametrize("word, ext", [("true", True), ("1", True), ("false", False), ("0", False)])
async def test_internal_create_topic_ext_flag(nsqd, word, ext):
    """An ext topic needs `extend_support:true` in IDENTIFY to SUB; a plain one refuses it
    (docs/protocol.md §3.3 checks 2 and 3)."""
    await create_partitions(nsqd, "yz", 0, ext=word)
    refused = await connect(nsqd)
    await refused.identify(extend_support=not ext)
    await refused.send(sub("SUB", "yz", "c", 0))
    if ext:
        await refused.expect_error(
            "E_SUB_EXTEND_NEED this topic is extended and should identify as extend support."
        )
    else:
        await refused.expect_error(
            "E_SUB_EXTEND_FORBIDDON this topic is not extended and should not identify as "
            "extend support."
        )
    accepted = await connect(nsqd)
    await accepted.identify(extend_support=ext)
    await accepted.subscribe_as("SUB", "yz", "c", 0)


# -- 3.3 the SUB family ----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["SUB", "SUB_ORDERED", "SUB_ADVANCED"])
async def test_sub_family_insufficient_parameters(nsqd, name):
    wire = await connect(nsqd)
    await wire.send(command(name, "yz"))
    await wire.expect_error("E_INVALID SUB insufficient number of parameters")


@pytest.mark.parametrize(
    "line",
    [b"SUB_ORDERED yz c x\n", b"SUB_ADVANCED yz c x\n", b"SUB_ADVANCED yz c x special:-1\n"],
    ids=["ordered", "advanced", "advanced-with-start"],
)
async def test_sub_family_bad_partition_uses_atoi_wording(nsqd, line):
    await create_partitions(nsqd, "yz", 0)
    wire = await connect(nsqd)
    await wire.send(line)
    await wire.expect_error(
        'E_BAD_PARTITION topic partition is not valid: strconv.Atoi: parsing "x": invalid syntax'
    )


@pytest.mark.parametrize(
    "line",
    [
        b"SUB yz c 7\n",
        b"SUB_ORDERED yz c 7\n",
        b"SUB_ADVANCED yz c 7 special:-1\n",
        b"SUB nope c 0\n",
        b"SUB nope c -1\n",
        b"SUB_ORDERED nope c\n",
        b"SUB_ADVANCED nope c\n",
    ],
)
async def test_sub_on_a_missing_partition_is_topic_not_exist(nsqd, line):
    """With a trailing space, fatal; and the SUB creates nothing (docs/protocol.md §3.2)."""
    await create_partitions(nsqd, "yz", 0)
    wire = await connect(nsqd)
    await wire.send(line)
    await wire.expect_error(TOPIC_NOT_EXIST)
    again = await connect(nsqd)
    await again.send(line)
    await again.expect_error(TOPIC_NOT_EXIST)


async def test_sub_partition_minus_one_is_the_default_partition(nsqd):
    """-1 means the default partition: the lowest local one (docs/protocol.md §3.3, §8 #3)."""
    await create_partitions(nsqd, "yz", 3, 2)
    reader = await consumer(nsqd, "SUB", "yz", "c", -1, rdy=5)
    writer = await connect(nsqd)
    await writer.command_ok(encode_pub("yz", b"three", 3))
    await writer.command_ok(encode_pub("yz", b"two", 2))
    first = await reader.read_youzan()
    assert first.body == b"two"
    # A publish to -1 goes to the same default partition.
    reply = await writer.publish_traced("yz", 5, b"default", -1)
    second = await reader.read_youzan()
    assert (second.body, second.internal_id, second.trace_id) == (b"default", reply.internal_id, 5)
    await reader.finish(first, second)
    # Had the reader been on partition 3 too, "three" would come before this.
    await writer.command_ok(encode_pub("yz", b"end", 2))
    assert (await reader.read_youzan()).body == b"end"


@pytest.mark.parametrize(
    "line", [b"SUB yz c 0\n", b"SUB yz c\n", b"SUB yz c -1\n", b"SUB_ADVANCED yz c 1\n"]
)
async def test_sub_on_an_ordered_topic_must_be_sub_ordered(nsqd, line):
    await create_ordered(nsqd, "yz", 2)
    wire = await connect(nsqd)
    await wire.send(line)
    await wire.expect_error("E_SUB_ORDER_IS_MUST this topic is configured only allow ordered sub")
    await consumer(nsqd, "SUB_ORDERED", "yz", "c", 1)


@pytest.mark.parametrize("name", ["SUB_ORDERED", "SUB_ORDER"])
async def test_sub_ordered_refuses_a_sample_rate(nsqd, name):
    await create_partitions(nsqd, "yz", 0)
    wire = await connect(nsqd)
    await wire.identify(sample_rate=10)
    await wire.send(sub(name, "yz", "c", 0))
    await wire.expect_error("E_INVALID order consume is not allowed while sample rate is not 0")


async def test_sub_ordered_alias_sub_order_gets_detail(nsqd):
    await create_partitions(nsqd, "yz", 0)
    reader = await consumer(nsqd, "SUB_ORDER", "yz", "c", 0)
    writer = await connect(nsqd)
    reply = await writer.publish_traced("yz", 1, b"hello", 0)
    message = await reader.read_youzan()
    assert (message.offset, message.raw_size, message.body) == (
        reply.offset,
        reply.raw_size,
        b"hello",
    )


async def test_sub_advanced_special_minus_one_skips_the_backlog(nsqd):
    await create_partitions(nsqd, "yz", 0)
    reply = await http(nsqd, "POST", "/channel/create?topic=yz&channel=c&partition=0")
    assert reply.status == 200, reply
    writer = await connect(nsqd)
    backlog = [await writer.publish_traced("yz", n, b"old-%d" % n, 0) for n in range(3)]
    reader = await consumer(nsqd, "SUB_ADVANCED", "yz", "c", 0, "special:-1")
    new = await writer.publish_traced("yz", 9, b"new", 0)
    message = await reader.read_youzan()
    assert message.body == b"new"
    assert message.trace_id == 9
    # The DETAIL section: the record starts where the three skipped ones end.
    assert new.offset == sum(r.raw_size for r in backlog)
    assert (message.offset, message.raw_size) == (new.offset, record_size(b"new"))


@pytest.mark.parametrize("start", ["timestamp:0", "virtual_queue:0", "msgcount:0"])
async def test_sub_advanced_other_starts_on_a_classic_topic_are_refused_clearly(nsqd, start):
    """A classic topic's channel is a diskqueue, which cannot go back; a log topic's can
    (tests/youzan/test_log_topics.py)."""
    await (await connect(nsqd)).command_ok(b"PUB yz\n\x00\x00\x00\x01x")
    wire = await connect(nsqd)
    await wire.send(sub("SUB_ADVANCED", "yz", "c", 0, start))
    text = await wire.expect_error_prefix("E_INVALID ", fatal=True)
    assert start.encode() in text


async def test_sub_advanced_bad_start_is_invalid_consume_offset(nsqd):
    await create_partitions(nsqd, "yz", 0)
    wire = await connect(nsqd)
    await wire.send(sub("SUB_ADVANCED", "yz", "c", 0, "nonsense"))
    await wire.expect_error("E_INVALID invalid consume offset:nonsense")


async def test_plain_sub_with_a_word_that_is_no_number_stays_classic(nsqd):
    """Official nsqd ignores extra SUB parameters (docs/protocol.md §2.3); so does a plain SUB whose
    third word is not a partition: hex IDs, the topic created as usual."""
    reader = await connect(nsqd)
    await reader.command_ok(encode_sub("plain", "c", "extra"))
    await reader.send(encode_rdy(1))
    writer = await connect(nsqd)
    await writer.command_ok(encode_pub("plain", b"hi"))
    message = await reader.read_message()
    assert set(message.id) <= HEX_DIGITS and message.body == b"hi"


# -- 3.3 the PUB family ----------------------------------------------------------------------


async def test_pub_and_mpub_with_a_partition_reach_only_that_partition(nsqd):
    await create_partitions(nsqd, "yz", 0, 1)
    one = await consumer(nsqd, "SUB", "yz", "c", 1)
    zero = await consumer(nsqd, "SUB", "yz", "c", 0)
    writer = await connect(nsqd)
    await writer.command_ok(encode_pub("yz", b"p1-a", 1))
    await writer.command_ok(encode_mpub("yz", [b"p1-b", b"p1-c"], 1))
    # Plain SUB connections never get the DETAIL section: the body is exactly what was sent.
    assert [m.body for m in await one.read_youzans(3)] == [b"p1-a", b"p1-b", b"p1-c"]
    await writer.command_ok(encode_pub("yz", b"p0", 0))
    assert (await zero.read_youzan()).body == b"p0"


@pytest.mark.parametrize(
    "data",
    [
        encode_pub("yz", b"x", 9),
        encode_mpub("yz", [b"x"], 9),
        pub_trace("yz", 1, b"x", 9),
        mpub_trace("yz", [(1, b"x")], 9),
        pub_trace("nope", 1, b"x"),
        # The topic name is not validated: a bad one just does not exist.
        pub_trace("a!b", 1, b"x", 0),
        mpub_trace("a!b", [(1, b"x")]),
        pub_trace("../escaped", 1, b"x"),
    ],
    ids=[
        "pub",
        "mpub",
        "pub_trace",
        "mpub_trace",
        "no-topic",
        "bad-name",
        "bad-name-mpub",
        "path-name",
    ],
)
async def test_pub_family_to_a_missing_partition_is_topic_not_exist(nsqd, data):
    """Youzan's PUB commands never create a topic (docs/protocol.md §3.2); only the classic forms
    `PUB t` / `MPUB t` do (§8 #2), and PUB_TRACE or MPUB_TRACE without a partition is no
    classic form: it means the default partition, which a missing topic does not have."""
    await create_partitions(nsqd, "yz", 0)
    wire = await connect(nsqd)
    await wire.send(data)
    await wire.expect_error(TOPIC_NOT_EXIST)


@pytest.mark.parametrize(
    "data", [pub_trace("yz", 1, b"x", "x"), mpub_trace("yz", [(1, b"x")], "x")]
)
async def test_pub_family_bad_partition(nsqd, data):
    await create_partitions(nsqd, "yz", 0)
    wire = await connect(nsqd)
    await wire.send(data)
    await wire.expect_error(
        'E_BAD_PARTITION topic partition is not valid: strconv.Atoi: parsing "x": invalid syntax'
    )


@pytest.mark.parametrize("name", ["PUB_TRACE", "MPUB_TRACE", "PUB_EXT", "MPUB_EXT"])
async def test_pub_family_insufficient_parameters(nsqd, name):
    wire = await connect(nsqd)
    await wire.send(name.encode() + b"\n")
    await wire.expect_error("E_INVALID insufficient number of parameters")


@pytest.mark.parametrize(
    "data",
    [encode_pub("yz", b"x"), pub_trace("yz", 1, b"x"), mpub_trace("yz", [(1, b"x")])],
    ids=["pub", "pub_trace", "mpub_trace"],
)
async def test_pub_without_partition_on_an_ordered_topic(nsqd, data):
    await create_ordered(nsqd, "yz", 2)
    wire = await connect(nsqd)
    await wire.send(data)
    await wire.expect_error("E_BAD_PARTITION topic partition is not valid for multi partition: -1")


async def test_plain_pub_with_a_word_that_is_no_number_stays_classic(nsqd):
    reader = await connect(nsqd)
    await reader.command_ok(encode_sub("plain", "c"))
    await reader.send(encode_rdy(1))
    writer = await connect(nsqd)
    await writer.command_ok(encode_command("PUB", "plain", "extra", body=b"hi"))
    message = await reader.read_message()
    assert set(message.id) <= HEX_DIGITS and message.body == b"hi"


# -- 3.6 PUB_TRACE and MPUB_TRACE replies ------------------------------------------------------


async def test_pub_trace_reply_bytes(nsqd):
    """The docs/protocol.md §3.6 example: trace 0x1234, a 12-byte body, so a 42-byte record."""
    await create_partitions(nsqd, "yz", 0)
    reader = await consumer(nsqd, "SUB_ORDERED", "yz", "c", 0)
    stream = await trio.open_tcp_stream("127.0.0.1", tcp_port(nsqd))
    async with stream:
        await stream.send_all(MAGIC_V2 + pub_trace("yz", 0x1234, b"twelve bytes", 0))
        raw = bytearray()
        with trio.fail_after(10):
            while len(raw) < 38:
                data = await stream.receive_some(65536)
                assert data, f"closed after {bytes(raw)!r}"
                raw += data
        assert len(raw) == 38, bytes(raw)
        assert raw[0:4] == b"\x00\x00\x00\x22"  # frame size: 4 + 30
        assert raw[4:8] == b"\x00\x00\x00\x00"  # a response frame
        assert raw[8:10] == b"OK"
        internal_id = int.from_bytes(raw[10:18], "big")
        assert internal_id > 0
        assert raw[18:26] == b"\x00\x00\x00\x00\x00\x00\x12\x34"  # the trace id, echoed
        assert raw[26:34] == b"\x00" * 8  # the first record of the partition starts at 0
        assert raw[34:38] == b"\x00\x00\x00\x2a"  # 4 + 26 + 12
        # The next record starts where this one ends; its id is larger.
        await stream.send_all(pub_trace("yz", 7, b"second", 0))
        raw = bytearray()
        with trio.fail_after(10):
            while len(raw) < 38:
                raw += await stream.receive_some(65536)
        second = struct.unpack(">IiQQQI", raw[0:4] + raw[4:8] + raw[10:38])
        assert raw[8:10] == b"OK"
        assert second[0:2] == (34, FRAME_TYPE_RESPONSE)
        assert second[2] > internal_id
        assert second[3:] == (7, 42, record_size(b"second"))
    # What the consumer gets: the same id, trace id, offset and size.
    message = await reader.read_youzan()
    assert message.id == binary_id(internal_id, 0x1234)
    assert (message.offset, message.raw_size, message.body) == (0, 42, b"twelve bytes")
    await reader.finish(message)
    message = await reader.read_youzan()
    assert message.id == binary_id(second[2], 7)
    assert (message.offset, message.raw_size) == (42, record_size(b"second"))


async def test_mpub_trace_reply(nsqd):
    """First id, a zero trace id, the first record's offset, the batch's total size."""
    await create_partitions(nsqd, "yz", 0)
    reader = await consumer(nsqd, "SUB_ORDERED", "yz", "c", 0)
    writer = await connect(nsqd)
    single = await writer.publish_traced("yz", 1, b"single", 0)
    batch = [(7, b"a"), (8, b"bb"), (9, b"ccc")]
    await writer.send(mpub_trace("yz", batch, 0))
    reply = trace_reply(await writer.read_response())
    assert reply.trace_id == 0
    assert reply.offset == single.offset + single.raw_size
    assert reply.raw_size == sum(record_size(data) for _trace, data in batch)
    delivered = []
    for _ in range(4):
        message = await reader.read_youzan()
        delivered.append(message)
        await reader.finish(message)
    first = delivered[1]
    assert first.internal_id == reply.internal_id
    assert [(m.trace_id, m.body) for m in delivered[1:]] == batch
    assert first.offset == reply.offset
    assert sum(m.raw_size for m in delivered[1:]) == reply.raw_size


# -- 3.3, 3.6 size errors ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "data, error",
    [
        (
            b"PUB_TRACE nope 0\n" + size(8) + b"\x00" * 8,
            "E_BAD_BODY invalid body size 8 with trace id enabled",
        ),
        (b"PUB_TRACE nope 0\n" + size(0), "E_BAD_BODY invalid body size 0"),
        (b"PUB_TRACE nope 0\n" + size(-5), "E_BAD_BODY invalid body size -5"),
        (b"PUB_TRACE nope 0\n" + size(101), "E_BAD_MESSAGE message too big 101 > 100"),
        (
            b"PUB_EXT nope 0\n" + size(2) + b"\x00\x00",
            "E_BAD_BODY invalid body size 2 with ext json header enabled",
        ),
        (
            b"PUB_EXT nope 0\n" + size(7) + b'\x00\x05{"a":',
            "E_BAD_BODY invalid body size 7 in ext json header content length",
        ),
        (
            b"PUB_EXT nope 0\n" + size(5) + b"\x00\x09abc",
            "E_BAD_BODY invalid body size 5 in ext json header content length",
        ),
        (b"PUB_EXT nope 0\n" + size(101), "E_BAD_MESSAGE message too big 101 > 100"),
        (b"MPUB_TRACE nope 0\n" + size(0), "E_BAD_BODY invalid body size 0"),
        (b"MPUB_TRACE nope 0\n" + size(201), "E_BAD_BODY body too big 201 > 200"),
        (
            b"MPUB_TRACE nope 0\n" + sized(encode_mpub_body([b"\x00" * 9, b"\x00" * 8])),
            "E_BAD_MESSAGE MPUB invalid message(1) body size 8 for tracing",
        ),
        (
            b"MPUB_TRACE nope 0\n" + size(4) + size(0),
            "E_BAD_BODY MPUB invalid message count 0",
        ),
        (
            b"MPUB_TRACE nope 0\n" + size(8) + size(1) + size(0),
            "E_BAD_MESSAGE MPUB invalid message(0) body size 0",
        ),
    ],
    ids=[
        "pub_trace-only-trace-id",
        "pub_trace-zero",
        "pub_trace-negative",
        "pub_trace-too-big",
        "pub_ext-only-length",
        "pub_ext-no-data",
        "pub_ext-json-longer-than-body",
        "pub_ext-too-big",
        "mpub_trace-zero",
        "mpub_trace-too-big",
        "mpub_trace-message-only-trace-id",
        "mpub_trace-count-zero",
        "mpub_trace-message-zero",
    ],
)
@with_options(max_msg_size=100, max_body_size=200)
async def test_traced_and_ext_publish_size_errors_are_fatal(nsqd, data, error):
    """Sizes are read before the topic is looked up, so a missing topic is never reported."""
    wire = await connect(nsqd)
    await wire.send(data)
    await wire.expect_error(error)


# -- 3.6 PUB_EXT and MPUB_EXT -------------------------------------------------------------------


@pytest.mark.parametrize(
    "header, error",
    [
        ({"##trace_id": 5}, "INVALID_TRACE_ID passin trace id should be string"),
        ({"##trace_id": "x5"}, "INVALID_TRACE_ID invalid trace id"),
        ({"##trace_id": "-5"}, "INVALID_TRACE_ID invalid trace id"),
        # Unicode digits and values past uint64, which Youzan's ParseUint refuses.
        ({"##trace_id": "\u00b2"}, "INVALID_TRACE_ID invalid trace id"),
        ({"##trace_id": "9" * 30}, "INVALID_TRACE_ID invalid trace id"),
        ({"##trace_id": str(1 << 64)}, "INVALID_TRACE_ID invalid trace id"),
    ],
)
async def test_pub_ext_trace_id_errors_are_not_fatal(nsqd, header, error):
    await create_partitions(nsqd, "yz", 0, ext="true")
    wire = await connect(nsqd)
    await wire.send(pub_ext("yz", header, b"data", 0))
    await wire.expect_error(error, fatal=False)
    # Still usable for publishing.
    await wire.command_ok(pub_ext("yz", {"k": "v"}, b"data", 0))


@pytest.mark.parametrize("header", [b"{not json", b"[" * 60000], ids=["garbled", "deep"])
async def test_pub_ext_bad_json_is_not_fatal(nsqd, header):
    await create_partitions(nsqd, "yz", 0, ext="true")
    wire = await connect(nsqd)
    await wire.send(pub_ext("yz", header, b"data", 0))
    await wire.expect_error_prefix("E_INVALID_JSON_HEADER fail to parse json header:", fatal=False)
    await wire.command_ok(pub_ext("yz", {"k": "v"}, b"data", 0))


async def test_pub_ext_on_a_topic_that_is_not_ext(nsqd):
    await create_partitions(nsqd, "yz", 0)
    wire = await connect(nsqd)
    await wire.send(pub_ext("yz", {"k": "v"}, b"data", 0))
    await wire.expect_error("E_EXT_NOT_SUPPORT ext content not supported in topic yz", fatal=False)
    await wire.send(
        command("MPUB_EXT", "yz", 0, body=encode_mpub_body([encode_ext_body({"k": "v"}, b"d")]))
    )
    await wire.expect_error("E_EXT_NOT_SUPPORT ext content not supported in topic yz", fatal=False)
    reply = await wire.publish_traced("yz", 3, b"still fine", 0)
    assert reply.trace_id == 3


async def test_pub_ext_replies(nsqd):
    """`OK` without `##trace_id`, the 30-byte traced reply with it; MPUB_EXT always `OK`."""
    await create_partitions(nsqd, "yz", 0, ext="true")
    wire = await connect(nsqd)
    await wire.command_ok(pub_ext("yz", {"k": "v"}, b"plain", 0))
    await wire.send(pub_ext("yz", {"##trace_id": "77", "k": "v"}, b"traced", 0))
    reply = trace_reply(await wire.read_response())
    assert reply.trace_id == 77
    # An ext topic's records hold the ext section `[1 version][2 length][header]` too.
    plain_header = json.dumps({"k": "v"}).encode()
    traced_header = json.dumps({"##trace_id": "77", "k": "v"}).encode()
    assert reply.offset == record_size(b"plain") + 3 + len(plain_header)
    assert reply.raw_size == record_size(b"traced") + 3 + len(traced_header)
    bodies = [encode_ext_body({"##trace_id": "5"}, b"m1"), encode_ext_body({"k": "v"}, b"m2")]
    await wire.command_ok(command("MPUB_EXT", "yz", 0, body=encode_mpub_body(bodies)))


async def test_ext_topic_messages_carry_the_ext_section(nsqd):
    """docs/protocol.md §3.5: on an ext topic, a client that IDENTIFYd extend_support:true gets
    `[1 ext_ver]` after the ID (0 for a plain PUB), `[1 ext_ver=4][2 len][json]` for PUB_EXT."""
    await create_partitions(nsqd, "yz", 0, ext="true")
    reader = await consumer(nsqd, "SUB", "yz", "c", 0, extend_support=True)
    writer = await connect(nsqd)
    await writer.command_ok(encode_pub("yz", b"plain", 0))
    header = json.dumps({"k": "v"}).encode()
    await writer.command_ok(pub_ext("yz", header, b"with-header", 0))
    plain, with_header = await reader.read_youzans(2)
    assert plain.body == b"\x00" + b"plain"
    assert with_header.body == b"\x04" + struct.pack(">H", len(header)) + header + b"with-header"


# -- 3.4 message IDs ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "identify, subscribe",
    [
        ({}, ("SUB", 0)),
        ({}, ("SUB", -1)),
        ({}, ("SUB_ORDERED",)),
        ({}, ("SUB_ADVANCED", 0)),
        ({"desired_tag": ""}, ("SUB",)),
        ({"desired_tag": "blue"}, ("SUB",)),
        ({"extend_support": False}, ("SUB",)),
        ({"ext_filter": {"type": 1, "filter_ext_key": "k", "filter_data": "v"}}, ("SUB",)),
        ({"ext_filter": None}, ("SUB",)),
    ],
    ids=[
        "sub-partition",
        "sub-minus-one",
        "sub_ordered",
        "sub_advanced",
        "empty-desired_tag",
        "desired_tag",
        "extend_support",
        "ext_filter",
        "null-ext_filter",
    ],
)
async def test_youzan_connections_get_binary_ids_classic_ones_hex(nsqd, identify, subscribe):
    """docs/protocol.md §8 #1: the same message is `16 hex digits` on a classic connection and
    `[8 internal id][8 trace id]` on a Youzan one, the internal id being its hex value."""
    # The classic way to make a topic: its partition 0, with no message in it yet.
    assert (await http(nsqd, "POST", "/topic/create?topic=mixed")).status == 200
    writer = await connect(nsqd)
    classic = await Wire.connect(nsqd)
    await classic.subscribe("mixed", "classic", 1)
    youzan = await connect(nsqd)
    if identify:
        await youzan.send(encode_identify(identify))
        await youzan.expect_ok()
    name, *extra = subscribe
    await youzan.subscribe_as(name, "mixed", "youzan", *extra, rdy=1)
    await writer.command_ok(encode_pub("mixed", b"hello"))
    hex_message = await classic.read_message()
    binary_message = await youzan.read_youzan()
    assert set(hex_message.id) <= HEX_DIGITS, hex_message.id
    assert hex_message.body == b"hello" and binary_message.body == b"hello"
    assert binary_message.id == binary_id(int(hex_message.id, 16), 0)
    await classic.finish(hex_message)
    await youzan.finish(binary_message)
    # Each connection answers FIN failures in its own dialect.
    await classic.expect_open()
    await youzan.expect_open()


TRICKY_TRACE = int.from_bytes(b" \n\r\n \n\n ", "big")


async def test_fin_req_touch_with_newlines_and_spaces_in_the_trace_half(nsqd):
    """IDs are read at fixed offsets: `\\n`, `\\r` and ` ` inside the 16 bytes are ID bytes."""
    await create_partitions(nsqd, "yz", 0)
    reader = await consumer(nsqd, "SUB", "yz", "c", 0, rdy=1)
    writer = await connect(nsqd)
    await writer.publish_traced("yz", TRICKY_TRACE, b"tricky", 0)
    message = await reader.read_youzan()
    assert message.id[8:] == b" \n\r\n \n\n "
    await reader.send(encode_touch(message.id))
    await reader.expect_open()
    await reader.send(encode_req(message.id, 0))
    again = await reader.read_youzan()
    assert (again.id, again.attempts, again.body) == (message.id, 2, b"tricky")
    await reader.send(encode_fin(again.id))
    await reader.expect_open()
    printed = go_bytes(again.id)
    await reader.send(encode_fin(again.id))
    await reader.expect_error(f"E_FIN_FAILED FIN {printed} failed ID not in flight", fatal=False)
    await reader.send(encode_req(again.id, 0))
    await reader.expect_error(f"E_REQ_FAILED REQ {printed} failed ID not in flight", fatal=False)
    await reader.send(encode_touch(again.id))
    await reader.expect_error(
        f"E_TOUCH_FAILED TOUCH {printed} failed ID not in flight", fatal=False
    )


async def test_fin_req_touch_with_newlines_or_spaces_in_the_internal_id(nsqd):
    """Publish until a message's internal id has a 0x0a or 0x20 byte, then use that ID."""
    await create_partitions(nsqd, "yz", 0)
    reader = await consumer(nsqd, "SUB", "yz", "c", 0, rdy=2500)
    writer = await connect(nsqd)
    tricky = None
    for _batch in range(8):
        await writer.send(mpub_trace("yz", [(n, b"m") for n in range(500)], 0))
        trace_reply(await writer.read_response())
        others = []
        for message in await reader.read_youzans(500):
            if tricky is None and (b"\n" in message.id[:8] or b" " in message.id[:8]):
                tricky = message
            else:
                others.append(message)
        await reader.finish(*others)
        if tricky is not None:
            break
    assert tricky is not None, "no internal id with a 0x0a or 0x20 byte in 4000 messages"
    await reader.send(encode_touch(tricky.id) + encode_req(tricky.id, 0))
    again = await reader.read_youzan()
    assert (again.id, again.attempts) == (tricky.id, 2)
    await reader.send(encode_fin(again.id) + encode_fin(again.id))
    await reader.expect_error(
        f"E_FIN_FAILED FIN {go_bytes(again.id)} failed ID not in flight", fatal=False
    )


async def test_fin_failed_text_prints_the_id_as_a_go_byte_slice(nsqd):
    await create_partitions(nsqd, "yz", 0)
    reader = await consumer(nsqd, "SUB", "yz", "c", 0)
    await reader.send(encode_fin(binary_id(12345, 0)))
    await reader.expect_error(
        "E_FIN_FAILED FIN [0 0 0 0 0 0 48 57 0 0 0 0 0 0 0 0] failed ID not in flight",
        fatal=False,
    )
    await reader.send(encode_req(binary_id(12345, 0x0102), 0))
    await reader.expect_error(
        "E_REQ_FAILED REQ [0 0 0 0 0 0 48 57 0 0 0 0 0 0 1 2] failed ID not in flight",
        fatal=False,
    )


@pytest.mark.parametrize("internal_id", [0, 1 << 63], ids=["zero", "negative"])
async def test_fin_of_an_internal_id_not_above_zero_is_invalid_message_id(nsqd, internal_id):
    """docs/protocol.md §3.4: FIN rejects an internal id <= 0 (an int64) with a fatal E_INVALID."""
    await create_partitions(nsqd, "yz", 0)
    reader = await consumer(nsqd, "SUB", "yz", "c", 0)
    await reader.send(encode_fin(binary_id(internal_id, 7)))
    await reader.expect_error("E_INVALID Invalid Message ID")


# -- 3.7 IDENTIFY ----------------------------------------------------------------------------------


async def test_identify_reply_adds_desired_tag_only_when_set(nsqd):
    wire = await connect(nsqd)
    reply = await wire.identify(feature_negotiation=True, desired_tag="blue", extend_support=False)
    assert list(reply) == [*OFFICIAL_IDENTIFY_KEYS, "desired_tag"]
    assert reply["desired_tag"] == "blue"
    other = await connect(nsqd)
    reply = await other.identify(feature_negotiation=True, desired_tag="", extend_support=True)
    assert list(reply) == OFFICIAL_IDENTIFY_KEYS


# -- publish failures and /disable/write -------------------------------------------------------


async def disable_write(nsqd, kind: str | None) -> None:
    target = "/disable/write" if kind is None else f"/disable/write?type={kind}"
    reply = await http(nsqd, "POST", target)
    assert reply.status == 200, reply


async def test_disable_write_all_refuses_publishes_not_fatally_on_youzan_connections(nsqd):
    await create_partitions(nsqd, "yz", 0, 1)
    wire = await connect(nsqd)
    await wire.identify(desired_tag="")  # a Youzan connection
    await disable_write(nsqd, "all")
    for data in [
        encode_pub("yz", b"x", 0),
        encode_mpub("yz", [b"x"], 1),
        pub_trace("yz", 1, b"x", 0),
        mpub_trace("yz", [(1, b"x")], 1),
    ]:
        await wire.send(data)
        await wire.expect_error(NOT_LEADER, fatal=False)
    reply = await http(nsqd, "POST", "/pubtrace?topic=yz&partition=0&trace_id=1", b"x")
    assert (reply.status, reply.json()) == (400, {"message": "E_FAILED_ON_NOT_LEADER"})
    # HTTP publishes without a partition too, as the TCP ones are.
    for target in ("/pub?topic=yz", "/mpub?topic=yz", "/pub?topic=new_topic"):
        reply = await http(nsqd, "POST", target, b"x")
        assert (reply.status, reply.json()) == (400, {"message": "E_FAILED_ON_NOT_LEADER"})
    # A classic connection gets the same error with official fatality (docs/protocol.md §8 #4).
    classic = await connect(nsqd)
    await classic.send(encode_pub("yz", b"x"))
    await classic.expect_error(NOT_LEADER)
    # Any other type enables writes again.
    await disable_write(nsqd, "none")
    await wire.command_ok(encode_pub("yz", b"x", 0))
    assert (await wire.publish_traced("yz", 1, b"x", 1)).trace_id == 1


async def test_disable_write_ordered_refuses_only_ordered_topics(nsqd):
    await create_ordered(nsqd, "ord", 1)
    await create_partitions(nsqd, "yz", 0)
    wire = await connect(nsqd)
    await disable_write(nsqd, "ordered")
    await wire.send(pub_trace("ord", 1, b"x", 0))
    await wire.expect_error(NOT_LEADER, fatal=False)
    assert (await wire.publish_traced("yz", 2, b"x", 0)).trace_id == 2
    await disable_write(nsqd, None)
    assert (await wire.publish_traced("ord", 3, b"x", 0)).trace_id == 3


# -- 6.2 nsqd HTTP ------------------------------------------------------------------------------


async def test_http_topic_create_partition_num_shows_in_stats(nsqd):
    reply = await http(nsqd, "POST", "/topic/create?topic=yzh&partition_num=4")
    assert reply.status == 200, reply
    stats = (await http(nsqd, "GET", "/stats?format=json&topic=yzh")).json()
    topics = sorted(stats["topics"], key=lambda t: t["topic_partition"])
    assert [(t["topic_name"], t["topic_partition"], t["topic_full_name"]) for t in topics] == [
        ("yzh", p, f"yzh-{p}") for p in range(4)
    ]
    # Each is a real partition: TCP reaches partition 3.
    wire = await connect(nsqd)
    assert (await wire.publish_traced("yzh", 1, b"x", 3)).offset == 0


async def test_stats_of_a_partition_carry_youzans_fields(nsqd):
    """`is_leader`, `is_multi_ordered`, `is_ext` per partition; per channel `depth_ts`, when
    the oldest message it has not confirmed was published, in Go's `time.Time` text (the
    epoch when none waits); `leaderOnly=true` keeps the partitions this node writes."""
    await create_partitions(nsqd, "yzs", 0, ext="true")
    consumer = await connect(nsqd)
    await consumer.identify(extend_support=True)
    await consumer.subscribe_as("SUB", "yzs", "c", 0, rdy=10)
    writer = await connect(nsqd)
    await writer.command_ok(pub_ext("yzs", {}, b"first", 0))
    await writer.command_ok(pub_ext("yzs", {}, b"second", 0))
    first, second = await consumer.read_youzans(2)

    async def partition_stats(query: str = "") -> dict | None:
        reply = await http(nsqd, "GET", f"/stats?format=json&topic=yzs{query}")
        topics = reply.json()["topics"]
        return topics[0] if topics else None

    topic = await partition_stats("&leaderOnly=true")
    assert (topic["is_leader"], topic["is_multi_ordered"], topic["is_ext"]) == (True, False, True)
    (channel,) = topic["channels"]
    assert _go_time_ns(channel["depth_ts"]) == first.timestamp
    await consumer.send(encode_fin(first.id) + encode_fin(second.id))
    epoch = datetime.datetime.fromtimestamp(0).astimezone().strftime("%Y-%m-%d %H:%M:%S %z %Z")

    async def nothing_waits() -> bool:
        return (await partition_stats())["channels"][0]["depth_ts"] == epoch

    await wait_until(nothing_waits, "depth_ts at the epoch once both are finished")


async def test_stats_filter_by_partition_and_need_clients_as_youzans(nsqd):
    """`partition=` keeps that partition; `needClients=true` lists clients and any other value
    leaves them out (without it, Go's default: listed)."""
    await create_partitions(nsqd, "yzf", 0, 1)
    consumer = await connect(nsqd)
    await consumer.subscribe_as("SUB", "yzf", "c", 1)

    async def stats(query: str) -> list[dict]:
        return (await http(nsqd, "GET", f"/stats?format=json&topic=yzf{query}")).json()["topics"]

    assert [t["topic_partition"] for t in await stats("&partition=1")] == [1]
    assert await stats("&partition=7") == []
    (listed,) = await stats("&partition=1&needClients=true")
    assert len(listed["channels"][0]["clients"]) == 1
    (unlisted,) = await stats("&partition=1&needClients=false")
    assert unlisted["channels"][0]["clients"] is None
    (default,) = await stats("&partition=1")
    assert len(default["channels"][0]["clients"]) == 1


def _go_time_ns(text: str) -> int:
    """Nanoseconds since the epoch from Go's `2006-01-02 15:04:05.999999999 -0700 MST`."""
    match = re.fullmatch(r"(\S+ \d\d:\d\d:\d\d)(?:\.(\d{1,9}))? ([+-]\d{4}) \S+", text)
    assert match, text
    moment = datetime.datetime.strptime(f"{match[1]} {match[3]}", "%Y-%m-%d %H:%M:%S %z")
    return int(moment.timestamp()) * 1_000_000_000 + int((match[2] or "0").ljust(9, "0"))


async def test_http_pubtrace(nsqd):
    reply = await http(nsqd, "POST", "/topic/create?topic=yzh&partition_num=3")
    assert reply.status == 200
    reader = await consumer(nsqd, "SUB_ORDERED", "yzh", "c", 2)
    first = await http(nsqd, "POST", "/pubtrace?topic=yzh&partition=2&trace_id=123", b"hello")
    assert first.status == 200, first
    document = first.json()
    assert list(document) == ["status", "id", "trace_id", "queue_offset", "rawsize"]
    assert document["status"] == "OK"
    assert document["trace_id"] == "123"
    assert (document["queue_offset"], document["rawsize"]) == (0, record_size(b"hello"))
    message = await reader.read_youzan()
    assert message.id == binary_id(document["id"], 123)
    assert (message.offset, message.raw_size, message.body) == (0, record_size(b"hello"), b"hello")
    await reader.finish(message)
    second = (await http(nsqd, "POST", "/pubtrace?topic=yzh&partition=2&trace_id=9", b"hi")).json()
    assert second["queue_offset"] == record_size(b"hello")
    assert second["id"] > document["id"]
    message = await reader.read_youzan()
    assert message.id == binary_id(second["id"], 9)


@pytest.mark.parametrize("trace_id", ["abc", "-1", "", "1.5"])
async def test_http_pubtrace_invalid_trace_id(nsqd, trace_id):
    await http(nsqd, "POST", "/topic/create?topic=yzh&partition_num=1")
    reply = await http(nsqd, "POST", f"/pubtrace?topic=yzh&partition=0&trace_id={trace_id}", b"x")
    assert (reply.status, reply.json()) == (400, {"message": "INVALID_TRACE_ID"})


async def test_http_pubtrace_to_a_missing_partition(nsqd):
    await http(nsqd, "POST", "/topic/create?topic=yzh&partition_num=1")
    reply = await http(nsqd, "POST", "/pubtrace?topic=yzh&partition=5&trace_id=1", b"x")
    assert (reply.status, reply.json()) == (404, {"message": "E_TOPIC_NOT_EXIST"})
