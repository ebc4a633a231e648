"""Youzan's compatibility flags (docs/protocol.md §7.3): `--allow-ext-compatible` lets a
PUB_EXT whose header holds only internal keys reach a topic that is not ext (the header
dropped), `--allow-sub-ext-compatible` lets a client without `extend_support` consume an ext
topic (its messages without headers), and `--max-conn-for-client` turns away one connection
too many with Youzan's error."""

import trio

from nsqpy.common.command import MAGIC_V2, encode_sub
from nsqpy.common.frame import FRAME_TYPE_ERROR, FrameDecoder
from tests.nsqd.wire import with_options
from tests.support.nsqd import tcp_port
from tests.youzan.support import connect, create_partitions, http, pub_ext


@with_options(allow_ext_compatible=True)
async def test_internal_keys_are_dropped_on_a_topic_that_is_not_ext(nsqd):
    await create_partitions(nsqd, "yz", 0)
    reader = await connect(nsqd)
    await reader.subscribe_as("SUB", "yz", "c", 0, rdy=5)
    writer = await connect(nsqd)
    await writer.command_ok(pub_ext("yz", {"##client_dispatch_tag": "t", "zan_test": "1"}, b"a", 0))
    await writer.send(pub_ext("yz", {"custom": "v"}, b"b", 0))
    await writer.expect_error(
        "E_EXT_NOT_SUPPORT ext content not supported in topic yz", fatal=False
    )
    reply = await http(
        nsqd, "POST", "/pub_ext?topic=yz&partition=0&ext=%7B%22%23%23k%22%3A%221%22%7D", b"c"
    )
    assert reply.status == 200, reply
    assert [m.body for m in await reader.read_youzans(2)] == [b"a", b"c"]


async def test_without_the_flag_a_header_is_refused_on_a_topic_that_is_not_ext(nsqd):
    await create_partitions(nsqd, "yz", 0)
    writer = await connect(nsqd)
    await writer.send(pub_ext("yz", {"##client_dispatch_tag": "t"}, b"a", 0))
    await writer.expect_error(
        "E_EXT_NOT_SUPPORT ext content not supported in topic yz", fatal=False
    )


@with_options(allow_sub_ext_compatible=True)
async def test_a_client_without_extend_support_consumes_an_ext_topic(nsqd):
    await create_partitions(nsqd, "yz", 0, ext="true")
    reader = await connect(nsqd)
    await reader.subscribe_as("SUB", "yz", "c", 0, rdy=5)
    writer = await connect(nsqd)
    await writer.command_ok(pub_ext("yz", {"k": "v"}, b"data", 0))
    (message,) = await reader.read_youzans(1)
    assert message.body == b"data"


@with_options(max_conn_for_client=2)
async def test_one_connection_too_many_is_told_so_and_closed(nsqd):
    await create_partitions(nsqd, "yz", 0)
    kept = [await connect(nsqd) for _ in range(2)]
    stream = await trio.open_tcp_stream("127.0.0.1", tcp_port(nsqd))
    await stream.send_all(MAGIC_V2)
    decoder = FrameDecoder()
    frames: list = []
    with trio.fail_after(5):
        while not frames:
            data = await stream.receive_some(4096)
            assert data, "closed without the error frame"
            frames.extend(decoder.receive_data(data))
        assert await stream.receive_some(4096) == b""
    assert (frames[0].frame_type, frames[0].data) == (
        FRAME_TYPE_ERROR,
        b"too much client connections",
    )
    await stream.aclose()
    # The others are served still.
    await kept[0].command_ok(encode_sub("yz", "c"))
