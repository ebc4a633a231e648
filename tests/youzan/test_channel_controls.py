"""Youzan's channel controls on a log topic's partition (docs/protocol.md §6.2): `/channel/skip`
drops what is published while it lasts (the channel moves to the end, its delayed messages
go), `/channel/unskip` starts it again at the end; `/channel/setorder` switches delivery in
order on and off. The state is kept across restarts; the skip shows in `/stats` and
`/metrics`. Clients are Youzan-style raw V2 connections."""

from nsqpy.common.command import encode_fin, encode_pub, encode_req
from tests.support.nsqd import running_nsqd
from tests.support.polling import wait_until
from tests.youzan.support import YouzanWire, connect, create_partitions, http


async def consumer(nsqd, topic: str = "yz") -> YouzanWire:
    wire = await connect(nsqd)
    await wire.subscribe_as("SUB", topic, "c", 0, rdy=10)
    return wire


async def next_body(wire: YouzanWire) -> bytes:
    (message,) = await wire.read_youzans(1)
    await wire.send(encode_fin(message.id))
    return message.body


async def channel_stats(nsqd) -> dict:
    reply = await http(nsqd, "GET", "/stats?format=json&topic=yz&channel=c")
    return reply.json()["topics"][0]["channels"][0]


async def create_channel(nsqd) -> None:
    reply = await http(nsqd, "POST", "/channel/create?topic=yz&channel=c&partition=0")
    assert reply.status == 200, reply


async def skip(nsqd, path: str = "/channel/skip") -> None:
    reply = await http(nsqd, "POST", f"{path}?topic=yz&channel=c&partition=0")
    assert reply.status == 200, reply


async def test_a_skipped_channel_drops_what_is_published_until_it_is_unskipped(nsqd):
    await create_partitions(nsqd, "yz", 0)
    reader = await consumer(nsqd)
    writer = await connect(nsqd)
    await writer.command_ok(encode_pub("yz", b"before", 0))
    assert await next_body(reader) == b"before"
    await skip(nsqd)
    for body in (b"dropped 1", b"dropped 2"):
        await writer.command_ok(encode_pub("yz", body, 0))

    async def caught_up() -> bool:
        stats = await channel_stats(nsqd)
        return stats["skipped"] and stats["depth"] == 0 and stats["in_flight_count"] == 0

    await wait_until(caught_up, "the skipped channel at the end, nothing in flight")
    metrics = (await http(nsqd, "GET", "/metrics")).body.decode()
    assert 'nsq_channel_skipped{topic="yz",partition="0",channel="c"} 1' in metrics
    await skip(nsqd, "/channel/unskip")
    assert (await channel_stats(nsqd))["skipped"] is False
    await writer.command_ok(encode_pub("yz", b"after", 0))
    # The next message the consumer gets is the first one published after the unskip.
    assert await next_body(reader) == b"after"


async def test_skipping_drops_the_channels_delayed_messages(nsqd):
    await create_partitions(nsqd, "yz", 0)
    assert (
        await http(nsqd, "POST", "/channel/create?topic=yz&channel=c&partition=0")
    ).status == 200
    reply = await http(nsqd, "POST", "/pub?topic=yz&partition=0&defer=600000", b"later")
    assert reply.status == 200, reply

    async def delayed() -> int:
        return (await channel_stats(nsqd))["delayed_queue_count"]

    await wait_until(delayed, "the deferred publish in the delay queue")
    await skip(nsqd)
    assert await delayed() == 0


async def test_the_skip_survives_a_restart(nsqd_options):
    async with running_nsqd(nsqd_options) as nsqd:
        await create_partitions(nsqd, "yz", 0)
        assert (
            await http(nsqd, "POST", "/channel/create?topic=yz&channel=c&partition=0")
        ).status == 200
        await skip(nsqd)
    async with running_nsqd(nsqd_options) as nsqd:
        assert (await channel_stats(nsqd))["skipped"] is True
        reader = await consumer(nsqd)
        writer = await connect(nsqd)
        await writer.command_ok(encode_pub("yz", b"dropped", 0))
        await skip(nsqd, "/channel/unskip")
        await writer.command_ok(encode_pub("yz", b"after", 0))
        assert await next_body(reader) == b"after"


async def test_skip_answers_as_pause_does_for_what_does_not_exist(nsqd):
    await create_partitions(nsqd, "yz", 0)
    missing_channel = await http(nsqd, "POST", "/channel/skip?topic=yz&channel=none&partition=0")
    assert (missing_channel.status, missing_channel.json()) == (
        404,
        {"message": "CHANNEL_NOT_FOUND"},
    )
    missing_topic = await http(nsqd, "POST", "/channel/unskip?topic=none&channel=c")
    paused = await http(nsqd, "POST", "/channel/pause?topic=none&channel=c")
    assert (missing_topic.status, missing_topic.body) == (paused.status, paused.body)


async def set_order(nsqd, order: str) -> None:
    target = f"/channel/setorder?topic=yz&channel=c&partition=0&order={order}"
    reply = await http(nsqd, "POST", target)
    assert reply.status == 200, reply


async def assert_in_order(nsqd) -> None:
    """One message in flight at a time: a requeued one comes again before the next, however
    much RDY the consumer gives."""
    writer = await connect(nsqd)
    for body in (b"a", b"b", b"c"):
        await writer.command_ok(encode_pub("yz", body, 0))
    reader = await consumer(nsqd)
    (first,) = await reader.read_youzans(1)
    await reader.send(encode_req(first.id, 0))
    (again,) = await reader.read_youzans(1)
    assert (again.body, again.attempts) == (b"a", 2)
    await reader.send(encode_fin(again.id))
    assert [await next_body(reader) for _ in range(2)] == [b"b", b"c"]


async def test_setorder_delivers_in_order_across_a_restart_and_back(nsqd_options):
    async with running_nsqd(nsqd_options) as nsqd:
        await create_partitions(nsqd, "yz", 0)
        await create_channel(nsqd)
        await set_order(nsqd, "true")
        await assert_in_order(nsqd)
    async with running_nsqd(nsqd_options) as nsqd:
        await assert_in_order(nsqd)
        reader = await consumer(nsqd)
        # Back to FIFO: the channel's consumers are disconnected, as Youzan's are.
        await set_order(nsqd, "false")
        await reader.expect_closed()


async def test_setorder_takes_only_true_or_false(nsqd):
    await create_partitions(nsqd, "yz", 0)
    await create_channel(nsqd)
    reply = await http(nsqd, "POST", "/channel/setorder?topic=yz&channel=c&partition=0&order=1")
    assert (reply.status, reply.json()) == (400, {"message": "INVALID_OPTION"})
