"""Youzan's `/channel/fixconfirmed` (docs/protocol.md §6.2): a log topic's channel reads again
from its confirmed position what it neither holds nor has acknowledged, so what it holds in
flight or deferred, and what was finished out of order, never comes twice."""

from nsqpy.common.command import encode_fin, encode_mpub, encode_pub, encode_req
from tests.support.polling import wait_until
from tests.youzan.support import connect, create_partitions, http


async def channel_stats(nsqd) -> dict:
    reply = await http(nsqd, "GET", "/stats?format=json&topic=yz&channel=c")
    return reply.json()["topics"][0]["channels"][0]


async def test_fixing_a_healthy_channel_delivers_nothing_twice(nsqd):
    await create_partitions(nsqd, "yz", 0)
    created = await http(nsqd, "POST", "/channel/create?topic=yz&channel=c&partition=0")
    assert created.status == 200, created
    writer = await connect(nsqd)
    await writer.command_ok(encode_mpub("yz", [b"1", b"2", b"3", b"4", b"5"], 0))
    reader = await connect(nsqd)
    await reader.subscribe_as("SUB", "yz", "c", 0, rdy=10)
    messages = {m.body: m for m in await reader.read_youzans(5)}
    await reader.send(encode_fin(messages[b"2"].id), encode_fin(messages[b"4"].id))
    await reader.send(encode_req(messages[b"1"].id, 60_000))

    async def held() -> bool:
        stats = await channel_stats(nsqd)
        return (stats["in_flight_count"], stats["deferred_count"]) == (2, 1)

    await wait_until(held, "3 and 5 in flight, 1 deferred, 2 and 4 finished")
    reply = await http(nsqd, "POST", "/channel/fixconfirmed?topic=yz&channel=c&partition=0")
    assert (reply.status, reply.body) == (200, b"")
    await writer.command_ok(encode_pub("yz", b"6", 0))
    # Read again from the confirmed position (before 1), the log holds nothing to deliver
    # before 6.
    (next_message,) = await reader.read_youzans(1)
    assert next_message.body == b"6"
    await reader.send(
        encode_fin(messages[b"3"].id), encode_fin(messages[b"5"].id), encode_fin(next_message.id)
    )

    async def only_the_deferred_left() -> bool:
        stats = await channel_stats(nsqd)
        return (stats["depth"], stats["in_flight_count"], stats["deferred_count"]) == (0, 0, 1)

    await wait_until(only_the_deferred_left, "everything but the deferred 1 finished")


async def test_fixconfirmed_answers_as_skip_for_what_does_not_exist(nsqd):
    await create_partitions(nsqd, "yz", 0)
    missing = await http(nsqd, "POST", "/channel/fixconfirmed?topic=yz&channel=none")
    assert (missing.status, missing.json()) == (404, {"message": "CHANNEL_NOT_FOUND"})
