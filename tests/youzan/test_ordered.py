"""Ordered consumption of a 4-partition topic (docs/protocol.md §3.5, §3.6).

1,000 messages are published with PUB_TRACE, sharded by key (crc32(key) % 4, a stable hash)
with the message number as trace id, while one SUB_ORDERED consumer per partition (RDY 10,
msg_timeout 1 s) reads them. On each partition the consumer must see the messages strictly in
offset order, each record starting where the previous one ended (next.offset = prev.offset +
prev.raw_size), with never a second message sent while one is unanswered: not after a
`REQ id 0` (which comes back first), not after a `REQ id <ms>` (ignored on an ordered channel:
the message is redelivered after its msg timeout), not while a message is left to time out.
The PUB_TRACE replies give the same id, offset and size as the DETAIL sections delivered.
"""

import zlib
from dataclasses import dataclass, field

import trio

from nsqpy.common.command import encode_fin, encode_req
from tests.youzan.support import (
    TraceReply,
    YouzanMessage,
    YouzanWire,
    connect,
    http,
    pub_trace,
    trace_reply,
)

TOPIC = "orders"
CHANNEL = "billing"
PARTITIONS = 4
MESSAGES = 1000
MSG_TIMEOUT = 1.0  # seconds; IDENTIFY msg_timeout 1000, Go's smallest
RDY = 10
# What each consumer does with the n-th message of its partition on its first delivery; every
# other first delivery, and every redelivery, is FIN'd.
REQUEUE_AT = 5  # REQ <id> 0: back at once, before anything else
REQUEUE_LATER_AT = 10  # REQ <id> 60000: ignored, redelivered after the msg timeout
HOLD_AT = 15  # no answer: redelivered after the msg timeout
DEADLINE = 30.0


def key_of(number: int) -> str:
    return f"customer-{number % 53}"


def partition_of(key: str) -> int:
    return zlib.crc32(key.encode()) % PARTITIONS


def body_of(number: int) -> bytes:
    return f"{key_of(number)}:{number}".encode()


@dataclass
class PartitionLog:
    """What one partition's consumer saw."""

    first_deliveries: list[YouzanMessage] = field(default_factory=list)
    redeliveries: list[tuple[str, YouzanMessage, float]] = field(default_factory=list)


async def consume(wire: YouzanWire, expected: int, log: PartitionLog) -> None:
    """Read until `expected` messages are FIN'd, checking order and one-in-flight."""
    unanswered: YouzanMessage | None = None  # delivered, neither FIN'd nor REQ 0'd
    why_unanswered = ""
    unanswered_since = 0.0
    requeued: YouzanMessage | None = None  # REQ 0'd, must be the next delivery
    next_offset = 0  # a fresh partition's first record starts at 0
    finished = 0
    while finished < expected:
        message = await wire.read_youzan(timeout=DEADLINE)
        now = trio.current_time()
        if unanswered is not None:
            # The only message allowed now is the unanswered one, back after its timeout.
            assert message.id == unanswered.id, (
                f"{message.body!r} sent while {unanswered.body!r} was still in flight"
            )
            assert message.attempts == unanswered.attempts + 1
            assert (message.offset, message.raw_size) == (unanswered.offset, unanswered.raw_size)
            log.redeliveries.append((why_unanswered, message, now - unanswered_since))
            unanswered = None
        elif requeued is not None:
            assert message.id == requeued.id, (
                f"{message.body!r} came before the requeued {requeued.body!r}"
            )
            assert message.attempts == requeued.attempts + 1
            assert (message.offset, message.raw_size) == (requeued.offset, requeued.raw_size)
            log.redeliveries.append(("REQ 0", message, 0.0))
            requeued = None
        else:
            assert message.attempts == 1, message
            assert message.offset == next_offset, (
                f"{message.body!r} at offset {message.offset}, expected {next_offset}"
            )
            next_offset = message.offset + message.raw_size
            log.first_deliveries.append(message)
            position = len(log.first_deliveries)
            if position == REQUEUE_AT:
                requeued = message
                await wire.send(encode_req(message.id, 0))
                continue
            if position in (REQUEUE_LATER_AT, HOLD_AT):
                unanswered, unanswered_since = message, now
                if position == REQUEUE_LATER_AT:
                    why_unanswered = "REQ later"
                    await wire.send(encode_req(message.id, 60_000))
                else:
                    why_unanswered = "hold"
                continue
        await wire.send(encode_fin(message.id))
        finished += 1


async def publish(wire: YouzanWire, replies: dict[int, TraceReply]) -> None:
    commands = [
        pub_trace(TOPIC, number, body_of(number), partition_of(key_of(number)))
        for number in range(MESSAGES)
    ]
    # Pipelined in chunks: nsqd answers in order.
    for start in range(0, MESSAGES, 100):
        await wire.send(b"".join(commands[start : start + 100]))
        for number in range(start, min(start + 100, MESSAGES)):
            reply = trace_reply(await wire.read_response())
            assert reply.trace_id == number
            replies[number] = reply


async def test_ordered_consumers_see_each_partition_in_offset_order(nsqd):
    create = f"/topic/create?topic={TOPIC}&partition_num={PARTITIONS}&orderedmulti=true"
    assert (await http(nsqd, "POST", create)).status == 200
    numbers_of: dict[int, list[int]] = {p: [] for p in range(PARTITIONS)}
    for number in range(MESSAGES):
        numbers_of[partition_of(key_of(number))].append(number)
    assert all(len(numbers) > HOLD_AT for numbers in numbers_of.values()), numbers_of

    consumers = []
    for partition in range(PARTITIONS):
        wire = await connect(nsqd)
        await wire.identify(msg_timeout=int(MSG_TIMEOUT * 1000))
        await wire.subscribe_as("SUB_ORDERED", TOPIC, CHANNEL, partition, rdy=RDY)
        consumers.append(wire)
    publisher = await connect(nsqd)
    replies: dict[int, TraceReply] = {}
    logs = {partition: PartitionLog() for partition in range(PARTITIONS)}
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(publish, publisher, replies)
            for partition, wire in enumerate(consumers):
                expected = len(numbers_of[partition])
                nursery.start_soon(consume, wire, expected, logs[partition])

    for partition, log in logs.items():
        numbers = numbers_of[partition]
        # Every message of the partition, in publish order, each delivered first exactly once.
        assert [m.trace_id for m in log.first_deliveries] == numbers
        assert [m.body for m in log.first_deliveries] == [body_of(n) for n in numbers]
        # The DETAIL sections are what PUB_TRACE answered, and offsets are contiguous.
        for message in log.first_deliveries:
            reply = replies[message.trace_id]
            assert (message.internal_id, message.offset, message.raw_size) == (
                reply.internal_id,
                reply.offset,
                reply.raw_size,
            )
            assert message.raw_size == 4 + 26 + len(message.body)
        offsets = [m.offset for m in log.first_deliveries]
        ends = [m.offset + m.raw_size for m in log.first_deliveries]
        assert offsets[0] == 0 and offsets[1:] == ends[:-1]
        # Exactly the three redeliveries, the delayed ones only after the msg timeout.
        reasons = [(why, m.trace_id) for why, m, _elapsed in log.redeliveries]
        assert reasons == [
            ("REQ 0", numbers[REQUEUE_AT - 1]),
            ("REQ later", numbers[REQUEUE_LATER_AT - 1]),
            ("hold", numbers[HOLD_AT - 1]),
        ]
        for why, _message, elapsed in log.redeliveries:
            if why != "REQ 0":
                assert elapsed >= MSG_TIMEOUT * 0.9, f"{why} redelivered after {elapsed:.3f}s"

    # nsqd's own account agrees: nothing left, one requeue and two timeouts per partition.
    stats = (await http(nsqd, "GET", f"/stats?format=json&topic={TOPIC}")).json()
    for topic in stats["topics"]:
        (channel,) = topic["channels"]
        partition = topic["topic_partition"]
        assert channel["message_count"] == len(numbers_of[partition])
        assert (channel["depth"], channel["in_flight_count"]) == (0, 0)
        assert (channel["requeue_count"], channel["timeout_count"]) == (1, 2)
