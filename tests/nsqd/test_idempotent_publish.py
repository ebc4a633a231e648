"""Idempotent publishing on log topics (docs/protocol.md §3.10): PUB_SEQ and MPUB_SEQ store a
producer's next sequences, acknowledge a repeat without storing it, refuse a gap or a partial
overlap, and remember the producers across a restart from the log itself."""

import dataclasses
import json
import struct
from types import SimpleNamespace

import pytest
import trio

from nsqpy.common.command import (
    encode_command,
    encode_mpub_ext_seq,
    encode_mpub_seq,
    encode_pub_seq,
)
from nsqpy.common.frame import FRAME_TYPE_ERROR
from nsqpy.nsqd.idempotence import ProducerSequences, Repeat
from nsqpy.partition_log import PartitionLog, ProducerMark, Record
from tests.nsqd.wire import Wire, consumer
from tests.support.nsqd import running_nsqd
from tests.support.polling import wait_until
from tests.youzan.support import connect, create_partitions


@pytest.fixture
def log_options(nsqd_options):
    return dataclasses.replace(nsqd_options, log_topic=["t"])


async def producer(nsqd) -> Wire:
    """A connection that negotiated idempotent publishing, to an nsqd that has topic "t"
    (a publish naming a partition never creates its topic, as on Youzan's nsqd)."""
    nsqd.get_topic("t")
    wire = await Wire.connect(nsqd)
    answer = await wire.identify(feature_negotiation=True, idempotent_publish=True)
    assert answer is not None and answer["idempotent_publish"] is True
    return wire


async def expect_refusal(wire: Wire, text: str) -> None:
    """The next response is the error `text`; the connection stays open (the test's next
    publish is answered)."""
    frame = await wire.read_response()
    assert (frame.frame_type, frame.data) == (FRAME_TYPE_ERROR, text.encode())


def message_count(nsqd) -> int:
    return nsqd.get_topic("t").message_count


async def test_a_repeated_publish_is_acknowledged_and_stored_once(log_options):
    async with running_nsqd(log_options) as nsqd:
        wire = await producer(nsqd)
        await wire.send(encode_mpub_seq("t", 0, "spark-q1-b7-p0", 0, [b"a", b"b", b"c"]))
        await wire.expect_ok()
        # The retry of a publish whose answer was lost: OK, and nothing stored again.
        await wire.send(encode_mpub_seq("t", 0, "spark-q1-b7-p0", 0, [b"a", b"b", b"c"]))
        await wire.expect_ok()
        await wire.send(encode_pub_seq("t", 0, "spark-q1-b7-p0", 1, b"b"))
        await wire.expect_ok()
        await wire.send(encode_pub_seq("t", 0, "spark-q1-b7-p0", 3, b"d"))
        await wire.expect_ok()
        assert message_count(nsqd) == 4


async def test_a_gap_and_a_partial_overlap_are_refused_and_the_connection_stays(log_options):
    async with running_nsqd(log_options) as nsqd:
        wire = await producer(nsqd)
        await wire.send(encode_pub_seq("t", 0, "p", 0, b"a"))
        await wire.expect_ok()
        await wire.send(encode_pub_seq("t", 0, "p", 2, b"c"))
        await expect_refusal(
            wire, "E_SEQUENCE_GAP PUB_SEQ sequence 2 of producer p is past the next one, 1"
        )
        await wire.send(encode_mpub_seq("t", 0, "p", 0, [b"a", b"b"]))
        await expect_refusal(
            wire,
            "E_SEQUENCE_OVERLAP MPUB_SEQ sequences 0-1 of producer p overlap the stored ones"
            " (up to 0) without repeating a publish",
        )
        # A producer the partition does not know starts at 0.
        await wire.send(encode_pub_seq("t", 0, "new", 5, b"x"))
        await expect_refusal(
            wire, "E_SEQUENCE_GAP PUB_SEQ sequence 5 of producer new is past the next one, 0"
        )
        await wire.send(encode_pub_seq("t", 0, "p", 1, b"b"))
        await wire.expect_ok()
        assert message_count(nsqd) == 2


@pytest.mark.parametrize(
    ("line", "error"),
    [
        (b"PUB_SEQ t 0 p", "E_INVALID PUB_SEQ needs <topic> <partition> <producer id> <sequence>"),
        (b"PUB_SEQ t! 0 p 0", 'E_BAD_TOPIC PUB_SEQ topic name "t!" is not valid'),
        (
            b"PUB_SEQ t x p 0",
            "E_BAD_PARTITION topic partition is not valid:"
            ' strconv.Atoi: parsing "x": invalid syntax',
        ),
        (b"PUB_SEQ t 0 p/q 0", 'E_BAD_PRODUCER PUB_SEQ producer id "p/q" is not valid'),
        (b"PUB_SEQ t 0 p -1", 'E_BAD_SEQUENCE PUB_SEQ sequence "-1" is not valid'),
        (
            b"PUB_SEQ t 0 p 9223372036854775808",
            'E_BAD_SEQUENCE PUB_SEQ sequence "9223372036854775808" is not valid',
        ),
    ],
)
async def test_malformed_sequenced_publishes_get_a_fatal_error(log_options, line, error):
    async with running_nsqd(log_options) as nsqd:
        wire = await producer(nsqd)
        await wire.send(line + b"\n" + (1).to_bytes(4, "big") + b"x")
        await wire.expect_error(error)


async def test_a_classic_topic_refuses_sequenced_publishes(nsqd_options):
    async with running_nsqd(nsqd_options) as nsqd:
        nsqd.get_topic("classic")
        wire = await producer(nsqd)
        await wire.send(encode_pub_seq("classic", 0, "p", 0, b"x"))
        await expect_refusal(
            wire,
            "E_NOT_LOG_TOPIC PUB_SEQ needs a log topic: classic keeps its messages in a diskqueue",
        )


async def test_the_producers_survive_a_restart_in_the_log(log_options):
    async with running_nsqd(log_options) as nsqd:
        wire = await producer(nsqd)
        # A channel from the start, to read back everything stored.
        await (await consumer(nsqd, "t", "all")).aclose()
        await wire.send(encode_mpub_seq("t", 0, "p", 0, [b"a", b"b"]))
        await wire.expect_ok()
        await wire.send(encode_pub_seq("t", 0, "q", 0, b"q0"))
        await wire.expect_ok()
    async with running_nsqd(log_options) as nsqd:
        wire = await producer(nsqd)
        await wire.send(encode_mpub_seq("t", 0, "p", 0, [b"a", b"b"]))
        await wire.expect_ok()
        await wire.send(encode_pub_seq("t", 0, "q", 1, b"q1"))
        await wire.expect_ok()
        await wire.send(encode_pub_seq("t", 0, "p", 3, b"d"))
        await expect_refusal(
            wire, "E_SEQUENCE_GAP PUB_SEQ sequence 3 of producer p is past the next one, 2"
        )
        assert message_count(nsqd) == 1
        reader = await consumer(nsqd, "t", "all", rdy=10)
        messages = await reader.read_messages(4)
        assert [m.body for m in messages] == [b"a", b"b", b"q0", b"q1"]


async def test_rolled_segments_leave_producer_snapshots_a_restart_starts_from(log_options):
    """The periodic sync after segments rolled writes a producer snapshot
    (tests/nsqd/test_producer_snapshots.py has the rules) in the topic's directory; after a
    restart the repeats of publishes before it are still recognised."""
    options = dataclasses.replace(log_options, max_bytes_per_file=200, sync_timeout=0.05)
    async with running_nsqd(options) as nsqd:
        wire = await producer(nsqd)
        await wire.send(encode_pub_seq("t", 0, "early", 0, b"e0"))
        await wire.expect_ok()
        for sequence in range(10):
            await wire.send(encode_pub_seq("t", 0, "p", sequence, b"p%d" % sequence))
            await wire.expect_ok()
        log = nsqd.get_topic("t").queue.log
        assert len(log.segments) > 2
        # The periodic sync writes one at the start of the active segment.
        await wait_until(
            lambda: log.files.producer_snapshot_offsets()[-1:] == [log.segments[-1].start],
            "a producer snapshot at the active segment's start",
        )
    async with running_nsqd(options) as nsqd:
        wire = await producer(nsqd)
        await wire.send(encode_pub_seq("t", 0, "early", 0, b"e0"))
        await wire.expect_ok()
        await wire.send(encode_pub_seq("t", 0, "p", 9, b"p9"))
        await wire.expect_ok()
        assert message_count(nsqd) == 0


async def test_consumers_and_classic_publishes_are_untouched(log_options):
    async with running_nsqd(log_options) as nsqd:
        reader = await consumer(nsqd, "t", "c", rdy=10)
        wire = await producer(nsqd)
        await wire.send(encode_command(b"PUB", "t", body=b"plain"))
        await wire.expect_ok()
        await wire.send(encode_mpub_seq("t", 0, "p", 0, [b"s0", b"s1"]))
        await wire.expect_ok()
        messages = await reader.read_messages(3)
        assert [m.body for m in messages] == [b"plain", b"s0", b"s1"]
        assert [m.attempts for m in messages] == [1, 1, 1]


# -- the state on its own ---------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def record(sequence_id: int, body: bytes, timestamp: float) -> Record:
    return Record(b"%016x" % sequence_id, body, int(timestamp * 1e9))


def test_a_producer_not_heard_from_for_the_expiration_is_forgotten(tmp_path):
    clock = Clock()
    log = PartitionLog(
        str(tmp_path), "t", 0, message_type=Record, max_bytes_per_file=1 << 20, sync_every=1
    )
    log.append([record(1, b"old", clock.now - 7200)], ProducerMark(b"old", 4))
    log.append([record(2, b"recent", clock.now - 60)], ProducerMark(b"recent", 9))
    log.commit()
    sequences = ProducerSequences(log, lambda: 3600.0, clock)
    # Rebuilt from the last hour of the log: only "recent" is remembered.
    assert sequences.check("PUB_SEQ", b"recent", 10, 1) is None
    assert sequences.check("PUB_SEQ", b"recent", 9, 1) is not None
    assert sequences.check("PUB_SEQ", b"old", 0, 1) is None
    assert len(sequences) == 1
    log.close()


def test_groups_another_leader_wrote_rebuild_from_the_log(tmp_path):
    clock = Clock()
    log = PartitionLog(
        str(tmp_path), "t", 0, message_type=Record, max_bytes_per_file=1 << 20, sync_every=1
    )
    sequences = ProducerSequences(log, lambda: 3600.0, clock)
    assert sequences.check("PUB_SEQ", b"p", 0, 1) is None
    # Another leader wrote p's first three messages meanwhile (replicated here).
    other = PartitionLog(
        str(tmp_path / "other"),
        "t",
        0,
        message_type=Record,
        max_bytes_per_file=1 << 20,
        sync_every=1,
    )
    other.append([record(1, b"x", clock.now)], ProducerMark(b"p", 2))
    log.append_raw(*other.commit())
    log.write_epoch += 1
    assert sequences.check("PUB_SEQ", b"p", 3, 1) is None
    other.close()
    log.close()


def test_a_new_write_epoch_alone_keeps_the_publishes_not_yet_written(tmp_path):
    """A node joining the leader's ISR moves the write epoch on: the leader's producers stay
    as they were, with the publish appended and not written yet, which the log cannot tell
    (built again from the log, the next publish would be refused as a gap, and a retry of the
    pending one stored twice)."""
    clock = Clock()
    log = PartitionLog(
        str(tmp_path), "t", 0, message_type=Record, max_bytes_per_file=1 << 20, sync_every=1
    )
    sequences = ProducerSequences(log, lambda: 3600.0, clock)
    assert sequences.check("PUB_SEQ", b"p", 0, 1) is None
    # The open write group, not written yet (a WriteGroup's two fields the state reads).
    group = SimpleNamespace(done=False, error=None)
    sequences.appended(b"p", 0, 0, group)
    log.write_epoch += 1
    assert isinstance(sequences.check("PUB_SEQ", b"p", 0, 1), Repeat)
    assert sequences.check("PUB_SEQ", b"p", 1, 1) is None
    log.close()


async def test_a_repeat_of_a_publish_still_being_written_waits_for_that_write(log_options):
    async with running_nsqd(log_options) as nsqd:
        first, second = await producer(nsqd), await producer(nsqd)
        body = encode_mpub_seq("t", 0, "p", 0, [b"a", b"b"])
        # Both in flight at once: one stores, the other repeats it; both are answered OK.
        async with trio.open_nursery() as nursery:
            nursery.start_soon(first.send, body)
            nursery.start_soon(second.send, body)
        await first.expect_ok()
        await second.expect_ok()
        assert message_count(nsqd) == 2


async def test_mpub_ext_seq_stores_an_ext_topics_headers_once(nsqd_options):
    """MPUB_EXT_SEQ: MPUB_EXT's messages, idempotent; a repeat stores nothing; a topic that
    is not ext refuses it as MPUB_EXT is refused."""
    async with running_nsqd(nsqd_options) as nsqd:
        await create_partitions(nsqd, "ext", 0, ext="true")
        await create_partitions(nsqd, "plain", 0)
        reader = await connect(nsqd)
        await reader.identify(extend_support=True)
        await reader.subscribe_as("SUB", "ext", "c", 0, rdy=10)
        wire = await producer(nsqd)
        headers = [{"k": "a"}, {"##trace_id": "42", "k": "v"}]
        publish = encode_mpub_ext_seq("ext", 0, "spark-q-b1-p0", 0, [b"m1", b"m2"], headers)
        await wire.send(publish)
        await wire.expect_ok()
        await wire.send(publish)
        await wire.expect_ok()
        assert nsqd.get_topic("ext").message_count == 2
        first, second = await reader.read_youzans(2)
        tag = json.dumps(headers[0]).encode()
        assert first.body == b"\x04" + struct.pack(">H", len(tag)) + tag + b"m1"
        assert second.body.endswith(b"m2") and b'"##trace_id": "42"' in second.body
        await wire.send(encode_mpub_ext_seq("plain", 0, "p", 0, [b"x"], [{"k": "v"}]))
        await expect_refusal(wire, "E_EXT_NOT_SUPPORT ext content not supported in topic plain")
