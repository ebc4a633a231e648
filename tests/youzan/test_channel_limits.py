"""Youzan's channel limits (docs/protocol.md §6.2): `/channel/ratelimit` caps the KiB a second
a channel delivers of bodies over 1 KiB (`--channel-ratelimit-kb` for every channel), and
`/channel/setclientlimit` caps the messages in flight of the consumers whose address starts
with a prefix, whatever their RDY. Both are kept across restarts and show in `/stats` (and
the rate limit in `/metrics`). Clients are Youzan-style raw V2 connections."""

import trio

from nsqpy.common.command import encode_fin, encode_mpub
from tests.nsqd.wire import with_options
from tests.support.nsqd import running_nsqd
from tests.support.polling import wait_until
from tests.youzan.support import YouzanWire, connect, create_partitions, http

LARGE_BODY = b"x" * 2048  # 2 KiB: each costs 2 of the bucket


async def channel_stats(nsqd) -> dict:
    reply = await http(nsqd, "GET", "/stats?format=json&topic=yz&channel=c")
    return reply.json()["topics"][0]["channels"][0]


async def control(nsqd, route: str, arguments: str) -> None:
    reply = await http(nsqd, "POST", f"{route}?topic=yz&channel=c&partition=0&{arguments}")
    assert reply.status == 200, reply


async def publish(nsqd, count: int, body: bytes = LARGE_BODY) -> None:
    writer = await connect(nsqd)
    await writer.command_ok(encode_mpub("yz", [body] * count, 0))


async def consumer(nsqd, rdy: int) -> YouzanWire:
    wire = await connect(nsqd)
    await wire.subscribe_as("SUB", "yz", "c", 0, rdy=rdy)
    return wire


async def test_a_rate_limited_channel_delivers_no_faster_than_its_limit(nsqd):
    """20 KiB/s with a bucket of 80 KiB: 60 messages of 2 KiB (120 KiB) take at least the
    time the 40 KiB over the bucket take to refill (less one message in flight, paid after
    it is sent), and every one arrives."""
    await create_partitions(nsqd, "yz", 0)
    await http(nsqd, "POST", "/channel/create?topic=yz&channel=c&partition=0")
    await publish(nsqd, 60)
    await control(nsqd, "/channel/ratelimit", "ratekilobytes=20")
    started = trio.current_time()
    reader = await consumer(nsqd, rdy=1)
    for _ in range(60):
        (message,) = await reader.read_youzans(1)
        await reader.send(encode_fin(message.id))
    assert trio.current_time() - started >= (120 - 80 - 2) / 20
    stats = await channel_stats(nsqd)
    assert stats["rate_limit_kb"] == 20
    assert stats["rate_limited_count"] > 0
    metrics = (await http(nsqd, "GET", "/metrics")).body.decode()
    labels = '{topic="yz",partition="0",channel="c"}'
    assert f"nsq_channel_rate_limit_kilobytes{labels} 20" in metrics
    assert f"nsq_channel_rate_limited_total{labels} " in metrics


async def test_small_messages_pass_a_rate_limit_free(nsqd):
    """Bodies of 1 KiB or less cost nothing (Youzan's): 1 KiB/s lets 500 of them through at
    once."""
    await create_partitions(nsqd, "yz", 0)
    await http(nsqd, "POST", "/channel/create?topic=yz&channel=c&partition=0")
    await control(nsqd, "/channel/ratelimit", "ratekilobytes=1")
    await publish(nsqd, 500, b"y" * 1024)
    reader = await consumer(nsqd, rdy=500)
    assert len(await reader.read_youzans(500)) == 500
    assert (await channel_stats(nsqd))["rate_limited_count"] == 0


async def test_a_rate_limit_of_zero_gives_the_channel_the_daemons_again(nsqd):
    await create_partitions(nsqd, "yz", 0)
    await http(nsqd, "POST", "/channel/create?topic=yz&channel=c&partition=0")
    await control(nsqd, "/channel/ratelimit", "ratekilobytes=64")
    assert (await channel_stats(nsqd))["rate_limit_kb"] == 64
    await control(nsqd, "/channel/ratelimit", "ratekilobytes=0")
    assert (await channel_stats(nsqd))["rate_limit_kb"] == 0


@with_options(channel_ratelimit_kb=512)
async def test_the_flag_limits_every_channel(nsqd):
    await create_partitions(nsqd, "yz", 0)
    await http(nsqd, "POST", "/channel/create?topic=yz&channel=c&partition=0")
    assert (await channel_stats(nsqd))["rate_limit_kb"] == 512
    await control(nsqd, "/channel/ratelimit", "ratekilobytes=8")
    assert (await channel_stats(nsqd))["rate_limit_kb"] == 8


async def test_limit_routes_refuse_what_is_not_a_number_as_youzan(nsqd):
    await create_partitions(nsqd, "yz", 0)
    await http(nsqd, "POST", "/channel/create?topic=yz&channel=c&partition=0")
    for route, arguments in [
        ("/channel/ratelimit", "ratekilobytes=fast"),
        ("/channel/ratelimit", ""),
        ("/channel/setclientlimit", "ready=1.5&client_prefix=127."),
        ("/channel/setclientlimit", "ready=4294967296"),
    ]:
        target = f"{route}?topic=yz&channel=c&partition=0&{arguments}"
        reply = await http(nsqd, "POST", target)
        assert (reply.status, reply.json()) == (400, {"message": "INVALID_OPTION"}), target
    missing = await http(nsqd, "POST", "/channel/ratelimit?topic=yz&channel=no&ratekilobytes=1")
    assert (missing.status, missing.json()) == (404, {"message": "CHANNEL_NOT_FOUND"})


async def in_flight_and_depth(nsqd) -> tuple[int, int]:
    stats = await channel_stats(nsqd)
    return stats["in_flight_count"], stats["depth"]


async def test_a_client_limit_caps_the_matching_consumers_in_flight(nsqd):
    await create_partitions(nsqd, "yz", 0)
    await http(nsqd, "POST", "/channel/create?topic=yz&channel=c&partition=0")
    await control(nsqd, "/channel/setclientlimit", "ready=2&client_prefix=127.0.0.1:")
    await control(nsqd, "/channel/setclientlimit", "ready=1&client_prefix=10.")
    await publish(nsqd, 10, b"m")
    reader = await consumer(nsqd, rdy=10)
    first = await reader.read_youzans(2)

    async def two_out_eight_left() -> bool:
        return await in_flight_and_depth(nsqd) == (2, 8)

    await wait_until(two_out_eight_left, "two in flight under the consumer's limit of 2")
    (client,) = (await channel_stats(nsqd))["clients"]
    assert (client["ready_count"], client["limited_rdy"]) == (10, 2)
    await reader.send(encode_fin(first[0].id))
    await reader.read_youzans(1)

    async def two_out_seven_left() -> bool:
        return await in_flight_and_depth(nsqd) == (2, 7)

    await wait_until(two_out_seven_left, "one more after a FIN, two in flight again")
    # A limit for all (the empty prefix) set later wins.
    await control(nsqd, "/channel/setclientlimit", "ready=10&client_prefix=")
    await reader.read_youzans(7)


async def test_the_limits_survive_a_restart(nsqd_options):
    async with running_nsqd(nsqd_options) as nsqd:
        await create_partitions(nsqd, "yz", 0)
        await http(nsqd, "POST", "/channel/create?topic=yz&channel=c&partition=0")
        await control(nsqd, "/channel/ratelimit", "ratekilobytes=300")
        await control(nsqd, "/channel/setclientlimit", "ready=3&client_prefix=127.")
    async with running_nsqd(nsqd_options) as nsqd:
        await consumer(nsqd, rdy=10)
        stats = await channel_stats(nsqd)
        assert stats["rate_limit_kb"] == 300
        assert [client["limited_rdy"] for client in stats["clients"]] == [3]
