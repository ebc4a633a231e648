"""Youzan's stats routes beside `/stats` (docs/protocol.md §6.2): `/serverstats` (the version,
health, start time and the publishes refused for a write the disk refused), `/message/stats`
(how a channel stands, a text), `/message/historystats` (bytes published per hour) and
`/coordinator/stats` outside a cluster (in one: tests/cluster/test_replica_stats.py); and
`pub_failed_cnt` in a partition's `/stats`. (The refusals themselves are counted on a full
disk: tests/reliability/test_disk_faults.py.)"""

import time

from nsqpy.common.command import encode_fin, encode_mpub, encode_req
from nsqpy.common.version import VERSION
from nsqpy.nsqd.hourly_bytes import HourlyBytes
from tests.support.polling import wait_until
from tests.youzan.support import connect, create_partitions, http


async def test_serverstats_answers_as_youzans(nsqd):
    reply = await http(nsqd, "GET", "/serverstats")
    assert reply.status == 200, reply
    assert reply.json() == {
        "version": VERSION,
        "health": "OK",
        "start_time": nsqd.start_time,
        "server_pub_failed": 0,
    }
    await create_partitions(nsqd, "yz", 0)
    stats = (await http(nsqd, "GET", "/stats?format=json&topic=yz")).json()
    assert stats["topics"][0]["pub_failed_cnt"] == 0


async def test_message_stats_tells_where_a_log_topics_channel_stands(nsqd):
    await create_partitions(nsqd, "yz", 0)
    created = await http(nsqd, "POST", "/channel/create?topic=yz&channel=c&partition=0")
    assert created.status == 200, created
    writer = await connect(nsqd)
    await writer.command_ok(encode_mpub("yz", [b"a", b"b", b"c"], 0))
    reader = await connect(nsqd)
    await reader.subscribe_as("SUB", "yz", "c", 0, rdy=3)
    messages = await reader.read_youzans(3)
    # The second finished, the first and third in flight: one range beyond the confirmed.
    await reader.send(encode_fin(messages[1].id))

    async def text() -> str:
        reply = await http(nsqd, "GET", "/message/stats?topic=yz&channel=c&partition=0")
        assert reply.status == 200, reply
        return reply.body.decode()

    async def finished() -> bool:
        return "inflight 2," in await text()

    await wait_until(finished, "the FIN taken")
    stats = await text()
    assert stats.startswith("topic yz channel c \ninflight 2, deferred: 0, depth: 0\n"), stats
    assert "current confirm 0:0, confirmed 1 messages: [[" in stats, stats
    assert (await http(nsqd, "GET", "/message/stats?topic=yz&channel=none")).body == b""
    missing = await http(nsqd, "GET", "/message/stats?topic=none&channel=c")
    assert (missing.status, missing.json()) == (404, {"message": "TOPIC_NOT_FOUND"})


async def test_history_stats_give_22_hours_of_a_partition_and_the_last_of_every_one(nsqd):
    await create_partitions(nsqd, "yz", 0, 1)
    reply = await http(nsqd, "GET", "/message/historystats?topic=yz&partition=1")
    assert reply.json() == {"hourly_pub_size": [0] * 22}
    node = (await http(nsqd, "GET", "/message/historystats")).json()
    assert node == {
        "node_hourly_pub_size_stats": [
            {"topic_name": "yz", "topic_partition": "0", "hourly_pub_size": 0},
            {"topic_name": "yz", "topic_partition": "1", "hourly_pub_size": 0},
        ]
    }
    bad = await http(nsqd, "GET", "/message/historystats?topic=yz&partition=x")
    assert (bad.status, bad.json()) == (400, {"message": "INVALID_REQUEST"})
    missing = await http(nsqd, "GET", "/message/historystats?topic=none&partition=0")
    assert (missing.status, missing.json()) == (404, {"message": "E_TOPIC_NOT_EXIST"})


async def test_an_hour_closed_by_the_clock_shows_in_the_history(nsqd):
    """The bytes published two hours ago show as the second newest of the 22 (the partition
    counted from then on, as if nsqd had started then)."""
    await create_partitions(nsqd, "yz", 0)
    (topic,) = nsqd.registry.partitions("yz")
    hour = time.localtime().tm_hour
    topic.hourly_bytes = HourlyBytes((hour - 2) % 24, topic.message_bytes)
    writer = await connect(nsqd)
    await writer.command_ok(encode_mpub("yz", [b"x" * 100] * 3, 0))

    async def published() -> bool:
        return topic.message_bytes == 300

    await wait_until(published, "the publish counted")
    # What nsqd's hour timer does at the ends of those two hours.
    topic.hourly_bytes.close_hours((hour - 1) % 24, topic.message_bytes)
    topic.hourly_bytes.close_hours(hour, topic.message_bytes)
    reply = await http(nsqd, "GET", "/message/historystats?topic=yz&partition=0")
    assert reply.json()["hourly_pub_size"] == [0] * 20 + [300, 0]


async def test_coordinator_stats_outside_a_cluster_say_the_coordinator_is_disabled(nsqd):
    reply = await http(nsqd, "GET", "/coordinator/stats?topic=yz")
    assert (reply.status, reply.json()) == (500, {"message": "Coordinator is disabled."})


async def test_a_partitions_channel_reports_youzans_backlogs(nsqd):
    """`backlogs`: what the channel has not read, and what it defers in memory."""
    await create_partitions(nsqd, "yz", 0)
    created = await http(nsqd, "POST", "/channel/create?topic=yz&channel=c&partition=0")
    assert created.status == 200, created
    writer = await connect(nsqd)
    await writer.command_ok(encode_mpub("yz", [b"1", b"2", b"3"], 0))

    async def backlogs() -> int:
        stats = (await http(nsqd, "GET", "/stats?format=json&topic=yz&channel=c")).json()
        return stats["topics"][0]["channels"][0]["backlogs"]

    async def three() -> bool:
        return await backlogs() == 3

    await wait_until(three, "three messages not read")
    reader = await connect(nsqd)
    await reader.subscribe_as("SUB", "yz", "c", 0, rdy=3)
    messages = await reader.read_youzans(3)
    await reader.send(encode_req(messages[0].id, 60_000))

    async def one_deferred() -> bool:
        return await backlogs() == 1

    await wait_until(one_deferred, "all read, one deferred")
