"""Partitioned topics are logs (docs/design.md §13), seen over the wire: IDs, offsets and trace
IDs survive a restart, channels resume at their confirmed position, `/channel/setoffset` and
SUB_ADVANCED replay, a new channel starts at the end, and a kill -9 with `--sync-every=1` loses
no acknowledged message."""

import os
import struct
import time

import pytest
import trio

from nsqpy.common.command import encode_fin
from nsqpy.common.guid import GUIDFactory
from nsqpy.diskqueue import DiskQueue
from nsqpy.nsqd.message import Message
from nsqpy.nsqd.metadata import ChannelMetadata, TopicMetadata, encode_metadata, write_metadata
from nsqpy.partition_log import ID_PARTITION_SHIFT
from tests.nsqd.wire import with_options
from tests.support.nsqd import running_nsqd
from tests.support.polling import wait_until
from tests.youzan.support import (
    YouzanWire,
    connect,
    create_partitions,
    http,
    pub_trace,
    sub,
    trace_reply,
)


async def publish_traced(nsqd, topic: str, partition: int, bodies: list[bytes]) -> list:
    writer = await connect(nsqd)
    replies = []
    for number, body in enumerate(bodies):
        await writer.send(pub_trace(topic, 100 + number, body, partition))
        replies.append(trace_reply(await writer.read_response()))
    await writer.stream.aclose()
    return replies


async def subscriber(nsqd, name: str, topic: str, channel: str, *extra, rdy: int = 100):
    wire = await connect(nsqd)
    await wire.subscribe_as(name, topic, channel, *extra, rdy=rdy)
    return wire


async def read_and_fin(wire: YouzanWire, count: int) -> list:
    messages = await wire.read_youzans(count)
    for message in messages:
        await wire.send(encode_fin(message.id))
    return messages


async def test_ids_offsets_and_trace_ids_survive_a_restart(nsqd_options):
    async with running_nsqd(nsqd_options) as nsqd:
        await create_partitions(nsqd, "lt", 0, 1)
        await (await connect(nsqd)).command_ok(sub("SUB_ORDERED", "lt", "c", 1))
        before = await publish_traced(nsqd, "lt", 1, [b"a", b"bb"])
    assert [r.internal_id for r in before] == [(1 << ID_PARTITION_SHIFT) + 1, (1 << 50) + 2]
    async with running_nsqd(nsqd_options) as nsqd:
        (after,) = await publish_traced(nsqd, "lt", 1, [b"ccc"])
        assert after.internal_id == before[-1].internal_id + 1
        assert after.offset == before[-1].offset + before[-1].raw_size
        reader = await subscriber(nsqd, "SUB_ORDERED", "lt", "c", 1)
        seen = []
        for _ in range(3):
            (message,) = await read_and_fin(reader, 1)
            seen.append(message)
        # The channel existed before the restart: it resumes where it was, with the detail
        # section and trace IDs read back from the log.
        assert [m.body for m in seen] == [b"a", b"bb", b"ccc"]
        assert [m.offset for m in seen] == [r.offset for r in [*before, after]]
        assert [m.trace_id for m in seen] == [100, 101, 100]
        assert [m.internal_id for m in seen] == [r.internal_id for r in [*before, after]]


async def test_a_new_channel_starts_at_the_end(nsqd):
    await create_partitions(nsqd, "lt", 0)
    await publish_traced(nsqd, "lt", 0, [b"before"])
    reader = await subscriber(nsqd, "SUB", "lt", "fresh", 0)
    await publish_traced(nsqd, "lt", 0, [b"after"])
    (message,) = await read_and_fin(reader, 1)
    assert message.body == b"after"


async def test_consumption_resumes_at_the_confirmed_position_after_a_clean_restart(
    nsqd_options,
):
    async with running_nsqd(nsqd_options) as nsqd:
        await create_partitions(nsqd, "lt", 0)
        reader = await subscriber(nsqd, "SUB", "lt", "c", 0)
        await publish_traced(nsqd, "lt", 0, [b"%d" % n for n in range(6)])
        await read_and_fin(reader, 3)
        await reader.read_youzans(3)  # in flight, never FINished
        channel = nsqd.registry.get("lt", 0).channels["c"]
        await wait_until(lambda: channel.queue.confirmed.count == 3)
    async with running_nsqd(nsqd_options) as nsqd:
        reader = await subscriber(nsqd, "SUB", "lt", "c", 0)
        assert [m.body for m in await read_and_fin(reader, 3)] == [b"3", b"4", b"5"]


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b"msgcount:2", [b"2", b"3"]),
        (b"virtual_queue:{offset_of_1}", [b"1", b"2", b"3"]),
        (b"timestamp:0", [b"0", b"1", b"2", b"3"]),
        (b"special:-1", []),
    ],
)
async def test_setoffset_replays_for_connected_consumers(nsqd, body, expected):
    await create_partitions(nsqd, "lt", 0)
    reader = await subscriber(nsqd, "SUB", "lt", "c", 0)
    replies = await publish_traced(nsqd, "lt", 0, [b"0", b"1", b"2", b"3"])
    await read_and_fin(reader, 4)
    body = body.replace(b"{offset_of_1}", b"%d" % replies[1].offset)
    reply = await http(nsqd, "POST", "/channel/setoffset?topic=lt&channel=c&partition=0", body)
    assert (reply.status, reply.body) == (200, b""), reply
    got = [m.body for m in await read_and_fin(reader, len(expected))] if expected else []
    assert got == expected
    await publish_traced(nsqd, "lt", 0, [b"next"])
    assert [m.body for m in await read_and_fin(reader, 1)] == [b"next"]


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        (b"", 406, "MSG_EMPTY"),
        (b"nonsense", 400, "invalid consume offset:nonsense"),
        (b"msgcount:x", 400, 'strconv.ParseInt: parsing "x": invalid syntax'),
        (b"special:5", 500, "not supported special consume offset: 5"),
    ],
)
async def test_setoffset_refusals(nsqd, body, status, message):
    await create_partitions(nsqd, "lt", 0)
    await http(nsqd, "POST", "/channel/create?topic=lt&channel=c&partition=0")
    reply = await http(nsqd, "POST", "/channel/setoffset?topic=lt&channel=c&partition=0", body)
    assert (reply.status, reply.json()) == (status, {"message": message})
    missing = await http(nsqd, "POST", "/channel/setoffset?topic=lt&channel=nope", b"special:-1")
    assert (missing.status, missing.json()) == (404, {"message": "CHANNEL_NOT_FOUND"})


@pytest.mark.parametrize("start", ["msgcount:1", "timestamp:0", "virtual_queue:0"])
async def test_sub_advanced_starts_where_it_says(nsqd, start):
    await create_partitions(nsqd, "lt", 0)
    await http(nsqd, "POST", "/channel/create?topic=lt&channel=c&partition=0")
    await publish_traced(nsqd, "lt", 0, [b"0", b"1", b"2"])
    reader = await subscriber(nsqd, "SUB_ADVANCED", "lt", "c", 0, start)
    expected = [b"1", b"2"] if start == "msgcount:1" else [b"0", b"1", b"2"]
    assert [m.body for m in await read_and_fin(reader, len(expected))] == expected


async def test_ordered_consumption_continues_in_order_across_a_restart(nsqd_options):
    async with running_nsqd(nsqd_options) as nsqd:
        reply = await http(
            nsqd, "POST", "/topic/create?topic=ord&partition_num=1&orderedmulti=true"
        )
        assert reply.status == 200, reply
        reader = await subscriber(nsqd, "SUB_ORDERED", "ord", "c", 0)
        await publish_traced(nsqd, "ord", 0, [b"%d" % n for n in range(10)])
        first = await read_and_fin(reader, 1)
        for _ in range(3):
            first += await read_and_fin(reader, 1)
        channel = nsqd.registry.get("ord", 0).channels["c"]
        await wait_until(lambda: channel.queue.confirmed.count == 4)
    async with running_nsqd(nsqd_options) as nsqd:
        reader = await subscriber(nsqd, "SUB_ORDERED", "ord", "c", 0)
        rest = []
        for _ in range(6):
            rest += await read_and_fin(reader, 1)
    bodies = [m.body for m in first + rest]
    assert bodies == [b"%d" % n for n in range(10)]
    offsets = [m.offset for m in first + rest]
    assert offsets == sorted(offsets)


@pytest.mark.parametrize("name", ["SUB_ORDERED", "SUB"])
async def test_a_leaving_consumers_in_flight_messages_go_to_the_next_at_once(nsqd, name):
    """Youzan requeues a closed connection's in-flight messages (RequeueClientMessages), where
    Go waits for --msg-timeout (60 s here): an ordered channel would deliver nothing meanwhile."""
    await create_partitions(nsqd, "leave", 0)
    first = await subscriber(nsqd, name, "leave", "c", 0, rdy=2)
    await publish_traced(nsqd, "leave", 0, [b"a", b"b", b"c"])
    held = await first.read_youzans(1 if name == "SUB_ORDERED" else 2)
    await first.stream.aclose()
    second = await subscriber(nsqd, name, "leave", "c", 0, rdy=3)
    again = []
    with trio.fail_after(5):  # well inside the 60 s message timeout
        while len(again) < 3:  # one at a time: an ordered channel's next waits for the FIN
            again += await read_and_fin(second, 1)
    assert [m.body for m in again] == [b"a", b"b", b"c"]
    assert [m.attempts for m in again[: len(held)]] == [2] * len(held)
    channel = nsqd.registry.get("leave", 0).channels["c"]
    assert channel.requeue_count == len(held) and channel.timeout_count == 0


# -- helpers --------------------------------------------------------------------------------


async def test_range_reads_return_the_stored_records(nsqd):
    await create_partitions(nsqd, "lt", 0)
    replies = await publish_traced(nsqd, "lt", 0, [b"zero", b"one", b"two"])
    end = replies[-1].offset + replies[-1].raw_size
    offsets = (await http(nsqd, "GET", "/partition/offsets?topic=lt")).json()
    assert offsets == {
        "topic": "lt",
        "partitions": [
            {
                "partition": 0,
                "start": {"offset": 0, "count": 0},
                "end": {"offset": end, "count": 3},
                "leader": f"{nsqd.options.broadcast_address}:{nsqd.tcp_port}",
            }
        ],
    }
    found = (await http(nsqd, "GET", "/partition/search?topic=lt&partition=0&timestamp=0")).json()
    assert found == {"offset": 0, "count": 0}
    search = "/partition/search?topic=lt&partition=0"
    by_count = (await http(nsqd, "GET", f"{search}&count=2")).json()
    assert by_count == {"offset": replies[2].offset, "count": 2}
    inside_the_first = (await http(nsqd, "GET", f"{search}&offset=1")).json()
    assert inside_the_first == {"offset": replies[1].offset, "count": 1}
    past_the_end = (await http(nsqd, "GET", f"{search}&count=99")).json()
    assert past_the_end == {"offset": end, "count": 3}
    first = await http(nsqd, "GET", "/partition/fetch?topic=lt&partition=0&offset=0&max_bytes=1")
    assert first.headers["Content-Type"] == "application/octet-stream"
    assert (first.headers["X-NSQ-Start-Count"], first.headers["X-NSQ-Next-Count"]) == ("0", "1")
    assert int(first.headers["X-NSQ-Next-Offset"]) == replies[1].offset
    rest = await http(
        nsqd, "GET", f"/partition/fetch?topic=lt&partition=0&offset={replies[1].offset}"
    )
    records = _records(first.body + rest.body)
    assert [(r[0], r[2], r[3], r[4]) for r in records] == [
        (0, reply.internal_id, reply.trace_id, body)
        for reply, body in zip(replies, [b"zero", b"one", b"two"], strict=True)
    ]
    done = await http(nsqd, "GET", f"/partition/fetch?topic=lt&partition=0&offset={end}")
    assert (done.status, done.body, done.headers["X-NSQ-Next-Offset"]) == (200, b"", str(end))
    # With `starts=true`: where each record starts, ahead of the same records.
    both = await http(nsqd, "GET", "/partition/fetch?topic=lt&partition=0&offset=0&starts=true")
    assert both.headers["X-NSQ-Record-Starts"] == "3"
    table, data = both.body[:12], both.body[12:]
    assert data == first.body + rest.body
    assert list(struct.unpack(">3I", table)) == [0, replies[1].offset, replies[2].offset]
    assert "X-NSQ-Record-Starts" not in first.headers


@pytest.mark.parametrize(
    ("target", "status", "message"),
    [
        ("/partition/offsets", 400, "MISSING_ARG_TOPIC"),
        ("/partition/offsets?topic=nope", 404, "TOPIC_NOT_FOUND"),
        ("/partition/offsets?topic=classic", 400, "NOT_A_LOG_TOPIC"),
        ("/partition/fetch?topic=lt&offset=0", 400, "MISSING_ARG_PARTITION"),
        ("/partition/fetch?topic=lt&partition=0&offset=1", 400, "OFFSET_NOT_A_RECORD_BOUNDARY"),
        ("/partition/fetch?topic=lt&partition=0&offset=x", 400, "INVALID_ARG_OFFSET"),
        ("/partition/search?topic=lt&partition=0&timestamp=x", 400, "INVALID_ARG_TIMESTAMP"),
        ("/partition/search?topic=lt&partition=0&count=x", 400, "INVALID_ARG_COUNT"),
        ("/partition/search?topic=lt&partition=0&offset=x", 400, "INVALID_ARG_OFFSET"),
    ],
)
async def test_range_read_refusals(nsqd, target, status, message):
    await create_partitions(nsqd, "lt", 0)
    await publish_traced(nsqd, "lt", 0, [b"zero"])
    await http(nsqd, "POST", "/topic/create?topic=classic")
    reply = await http(nsqd, "GET", target)
    assert (reply.status, reply.json()) == (status, {"message": message})


def _records(data: bytes) -> list[tuple]:
    """`[4 size][8 ts][2 attempts][8 id][8 trace id][body]` records: (attempts, ts, id, trace,
    body)."""
    records = []
    at = 0
    while at < len(data):
        size, timestamp, attempts, internal_id, trace_id = struct.unpack_from(">IqHQQ", data, at)
        records.append((attempts, timestamp, internal_id, trace_id, data[at + 30 : at + 4 + size]))
        at += 4 + size
    return records


@with_options(max_bytes_per_file=200)
async def test_greedyclean_removes_only_what_every_channel_consumed(nsqd):
    await create_partitions(nsqd, "lt", 0)
    await http(nsqd, "POST", "/channel/create?topic=lt&channel=slow&partition=0")
    reader = await subscriber(nsqd, "SUB", "lt", "fast", 0)
    await publish_traced(nsqd, "lt", 0, [b"x" * 40 for _ in range(10)])
    await read_and_fin(reader, 10)
    channel = nsqd.registry.get("lt", 0).channels["fast"]
    await wait_until(lambda: channel.queue.lag == 0)
    clean = "/topic/greedyclean?topic=lt&partition=0"
    assert (await http(nsqd, "POST", clean)).status == 200
    offsets = "/partition/offsets?topic=lt"
    # "slow" has read nothing: nothing may go.
    assert (await http(nsqd, "GET", offsets)).json()["partitions"][0]["start"]["offset"] == 0
    await http(nsqd, "POST", "/channel/delete?topic=lt&channel=slow&partition=0")
    assert (await http(nsqd, "POST", clean)).status == 200
    start = (await http(nsqd, "GET", offsets)).json()["partitions"][0]["start"]
    assert start["offset"] > 0 and start["count"] > 0
    replay = await http(
        nsqd, "POST", "/channel/setoffset?topic=lt&channel=fast&partition=0", b"virtual_queue:0"
    )
    assert replay.status == 500 and "before the start" in replay.json()["message"]
    gone = await http(nsqd, "GET", "/partition/fetch?topic=lt&partition=0&offset=0")
    assert (gone.status, gone.json()) == (416, {"message": "OFFSET_BEFORE_START"})


async def test_syncdisk_gives_a_topic_its_own_sync_policy(nsqd_options):
    async with running_nsqd(nsqd_options) as nsqd:
        reply = await http(nsqd, "POST", "/topic/create?topic=lt&partition_num=2&syncdisk=1")
        assert reply.status == 200, reply
        assert [nsqd.registry.get("lt", p).queue.log.sync_every for p in (0, 1)] == [1, 1]
        bad = await http(nsqd, "POST", "/topic/create?topic=lu&partition_num=1&syncdisk=0")
        assert (bad.status, bad.json()) == (400, {"message": "INVALID_ARG_SYNCDISK"})
    async with running_nsqd(nsqd_options) as nsqd:
        assert nsqd.registry.get("lt", 1).queue.log.sync_every == 1


async def test_a_deferred_message_still_waits_after_a_restart(nsqd_options):
    """A DPUB (in the partition's delay queue) and a REQ with a delay (in the channel's memory)
    that wait at a clean stop come when they are due, not at once, after nsqd starts again."""
    async with running_nsqd(nsqd_options) as nsqd:
        await create_partitions(nsqd, "lt", 0)
        # "idle" has no consumer before the restart: it never read the DPUB.
        await http(nsqd, "POST", "/channel/create?topic=lt&channel=idle&partition=0")
        reader = await subscriber(nsqd, "SUB", "lt", "c", 0, rdy=1)
        await publish_traced(nsqd, "lt", 0, [b"requeued"])
        (message,) = await reader.read_youzans(1)
        await reader.send(b"REQ " + message.id + b" 2000\n")
        requeued_due = time.time() + 2.0
        writer = await connect(nsqd)
        await writer.command_ok(b"DPUB lt 2500\n" + (4).to_bytes(4, "big") + b"late")
        late_due = time.time() + 2.5
        channels = nsqd.registry.get("lt", 0).channels
        await wait_until(lambda: len(channels["c"].deferred) == 1)
        assert channels["c"].delayed_count == channels["idle"].delayed_count == 1
    async with running_nsqd(nsqd_options) as nsqd:
        reader = await subscriber(nsqd, "SUB", "lt", "c", 0)
        idle = await subscriber(nsqd, "SUB", "lt", "idle", 0)
        channels = nsqd.registry.get("lt", 0).channels
        await wait_until(lambda: len(channels["c"].deferred) == 1)
        # "idle" gets the plain message at once; the DPUB waits in the delay queue.
        assert [m.body for m in await read_and_fin(idle, 1)] == [b"requeued"]
        assert channels["idle"].delayed_count == 1
        arrivals = {}
        for message in await read_and_fin(reader, 2):
            arrivals[message.body] = time.time()
        assert [m.body for m in await read_and_fin(idle, 1)] == [b"late"]
    assert arrivals[b"requeued"] >= requeued_due - 0.25
    assert arrivals[b"late"] >= late_due - 0.25


async def test_an_earlier_nsqpys_partition_queues_are_delivered_then_removed(nsqd_options):
    """Before partitioned topics were logs, nsqpy kept their messages in diskqueues
    (`<topic>:<channel>`, `<topic>#<p>:<channel>`, and `<topic>#<p>` for what was not yet fanned
    out). Upgrading loses none of them: a channel delivers its diskqueue's messages first, a
    partition's own backlog goes into its log, and the files go once delivered."""
    data = nsqd_options.data_path
    topics = [TopicMetadata("old", channels=[ChannelMetadata("c")], partition=p) for p in (0, 1)]
    write_metadata(data, encode_metadata(topics, "1.3.0"))
    factory = GUIDFactory(1)
    for name, bodies in (
        ("old:c", [b"p0-a", b"p0-b"]),
        ("old#1:c", [b"p1-a"]),
        ("old#1", [b"p1-backlog"]),
    ):
        queue = DiskQueue(name, data, 1 << 20, 26, 1 << 20, 1)
        queue.put_many([Message(factory.next_id(), body, 0).to_record() for body in bodies])
        queue.close()
    async with running_nsqd(nsqd_options) as nsqd:
        first = await subscriber(nsqd, "SUB", "old", "c", 0)
        second = await subscriber(nsqd, "SUB", "old", "c", 1)
        assert [m.body for m in await read_and_fin(first, 2)] == [b"p0-a", b"p0-b"]
        got = sorted(m.body for m in await read_and_fin(second, 2))
        assert got == [b"p1-a", b"p1-backlog"]
        channel = nsqd.registry.get("old", 1).channels["c"]
        await wait_until(lambda: channel.queue.lag == 0 and not channel.in_flight)
    assert not [name for name in os.listdir(data) if ".diskqueue." in name]
