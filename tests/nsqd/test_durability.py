"""Messages survive nsqd restarts and crashes, and a Go nsqd data directory opens here.

docs/design.md §4: a clean stop (SIGTERM) writes every in-memory, in-flight and
deferred message to the diskqueues and the metadata last, and the restart delivers them
again; with `--mem-queue-size=0 --sync-every=1` a kill -9 loses nothing acknowledged with
`OK`; the files are go-diskqueue's and Go nsqd 1.3.0's `nsqd.dat`, so a Go data directory
works here and ours works in Go. Every test runs real nsqd processes on 127.0.0.1.

The Go files are written and read back with `struct` in this module, never with our
`diskqueue` package, so the format is checked against the spec rather than against itself.
"""

import itertools
import json
import re
import struct
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from nsqpy.common.command import encode_dpub, encode_mpub, encode_pub, encode_rdy, encode_sub
from nsqpy.common.frame import FRAME_TYPE_ERROR, FRAME_TYPE_MESSAGE
from nsqpy.common.message import DecodedMessage, decode_message
from nsqpy.nsqd.topic import FAN_OUT_AFTER_ANSWER_FROM
from tests.harness import DaemonProcess, V2Connection, start_nsqd
from tests.nsqd.support import number_of, number_of_body, numbered, publish
from tests.support.polling import poll

# A PUB to this topic on a consumer's connection is a barrier: nsqd runs a connection's
# commands in order, so its OK means every FIN sent before it has been processed.
BARRIER_TOPIC = "barrier"

# go-diskqueue and Go nsqd 1.3.0, written out here independently of our implementation.
_GO_MESSAGE_HEADER = struct.Struct(">qH16s")  # nsqd Message.WriteTo: ts, attempts, id
_GO_RECORD_SIZE = struct.Struct(">i")  # go-diskqueue writeOne: binary.Write(BigEndian, int32)
_GO_QUEUE_METADATA = re.compile(rb"(-?\d+)\n(\d+),(\d+)\n(\d+),(\d+)\n")
_GO_DATA_FILE = re.compile(r"nsqd\.dat|.+\.diskqueue\.(\d{6}\.dat|meta\.dat)")


# -- Go's files -----------------------------------------------------------------------------


def go_record(timestamp_ns: int, attempts: int, message_id: bytes, body: bytes) -> bytes:
    return _GO_MESSAGE_HEADER.pack(timestamp_ns, attempts, message_id) + body


def go_framed(record: bytes) -> bytes:
    return _GO_RECORD_SIZE.pack(len(record)) + record


def go_queue_metadata(depth: int, read_file: int, read_pos: int, write_file: int, write_pos: int):
    """go-diskqueue persistMetaData: `"%d\\n%d,%d\\n%d,%d\\n"`."""
    return b"%d\n%d,%d\n%d,%d\n" % (depth, read_file, read_pos, write_file, write_pos)


def go_nsqd_dat(topics: list[tuple[str, bool, list[tuple[str, bool]]]]) -> bytes:
    """Go nsqd 1.3.0's json.Marshal of its Metadata struct, byte for byte: fields in struct
    order, no spaces (names are plain ASCII, so Go's HTML escaping never applies)."""
    document = {
        "topics": [
            {
                "name": name,
                "paused": paused,
                "channels": [{"name": c, "paused": p} for c, p in channels],
            }
            for name, paused, channels in topics
        ],
        "version": "1.3.0",
    }
    return json.dumps(document, separators=(",", ":")).encode()


def queue_file(data_path: Path, queue: str, file_num: int) -> Path:
    return data_path / f"{queue}.diskqueue.{file_num:06d}.dat"


def queue_metadata_file(data_path: Path, queue: str) -> Path:
    return data_path / f"{queue}.diskqueue.meta.dat"


@dataclass
class GoQueue:
    """A go-diskqueue as Go would read it: its metadata and the unread records in order."""

    depth: int
    read_file: int
    read_pos: int
    write_file: int
    write_pos: int
    records: list[DecodedMessage]


def read_go_queue(data_path: Path, queue: str) -> GoQueue:
    """Read a queue the way go-diskqueue does, failing on anything Go could not read: the
    metadata in exactly Go's format, then size-prefixed records from (readFileNum, readPos)
    to (writeFileNum, writePos), earlier files read to their end."""
    raw = queue_metadata_file(data_path, queue).read_bytes()
    match = _GO_QUEUE_METADATA.fullmatch(raw)
    assert match, f"{queue}: metadata not in go-diskqueue's format: {raw!r}"
    depth, read_file, read_pos, write_file, write_pos = map(int, match.groups())
    assert (read_file, read_pos) <= (write_file, write_pos), raw
    records = []
    for file_num in range(read_file, write_file + 1):
        path = queue_file(data_path, queue, file_num)
        if file_num == write_file and write_pos == 0 and not path.exists():
            break  # go-diskqueue creates the next write file only on its first write
        data = path.read_bytes()
        position = read_pos if file_num == read_file else 0
        end = write_pos if file_num == write_file else len(data)
        assert end <= len(data), f"{path.name}: metadata says {end} bytes, file has {len(data)}"
        while position < end:
            (size,) = _GO_RECORD_SIZE.unpack_from(data, position)
            position += _GO_RECORD_SIZE.size
            assert _GO_MESSAGE_HEADER.size <= size <= end - position, f"{path.name}: size {size}"
            timestamp, attempts, message_id = _GO_MESSAGE_HEADER.unpack_from(data, position)
            body = data[position + _GO_MESSAGE_HEADER.size : position + size]
            records.append(DecodedMessage(timestamp, attempts, message_id, body))
            position += size
        assert position == end, f"{path.name}: a record runs past the write position"
    assert depth == len(records), f"{queue}: depth {depth} but {len(records)} records"
    return GoQueue(depth, read_file, read_pos, write_file, write_pos, records)


def read_nsqd_dat(data_path: Path) -> dict:
    """nsqd.dat, checked to have Go's field names in Go's order."""
    raw = (data_path / "nsqd.dat").read_bytes()
    pairs = json.loads(raw, object_pairs_hook=lambda items: items)
    assert [key for key, _ in pairs] == ["topics", "version"], raw
    for topic in dict(pairs)["topics"]:
        assert [key for key, _ in topic] == ["name", "paused", "channels"], raw
        for channel in dict(topic)["channels"]:
            assert [key for key, _ in channel] == ["name", "paused"], raw
    return json.loads(raw)


def paused_flags(document: dict) -> dict[str, bool]:
    """`{"topic": paused, "topic:channel": paused}` from a decoded nsqd.dat."""
    flags = {}
    for topic in document["topics"]:
        flags[topic["name"]] = topic["paused"]
        for channel in topic["channels"]:
            flags[f"{topic['name']}:{channel['name']}"] = channel["paused"]
    return flags


# -- clients --------------------------------------------------------------------------------


class Consumer:
    """A subscribed V2 connection that keeps every message it receives, in order."""

    def __init__(self, port: int, topic: str, channel: str, ready: int = 0) -> None:
        self.connection = V2Connection(port)
        self.received: list[DecodedMessage] = []
        self.connection.send(encode_sub(topic, channel))
        assert self.response() == b"OK"
        if ready:
            self.ready(ready)

    def ready(self, count: int) -> None:
        self.connection.send(encode_rdy(count))

    def finish(self, messages: list[DecodedMessage]) -> None:
        if messages:
            self.connection.send(b"".join(b"FIN " + m.id + b"\n" for m in messages))

    def _read_frame(self, deadline: float):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("deadline passed")
        self.connection.sock.settimeout(remaining)
        frame = self.connection.read_frame()
        if frame.frame_type == FRAME_TYPE_MESSAGE:
            self.received.append(decode_message(frame.data))
        return frame

    def response(self, timeout: float = 10.0) -> bytes:
        """The next response or error frame's data; messages on the way are kept."""
        deadline = time.monotonic() + timeout
        while True:
            frame = self._read_frame(deadline)
            if frame.frame_type == FRAME_TYPE_ERROR:
                raise AssertionError(f"nsqd sent an error: {frame.data!r}")
            if frame.frame_type != FRAME_TYPE_MESSAGE and frame.data != b"_heartbeat_":
                return frame.data

    def receive_until(self, done, timeout: float = 15.0, on_message=None) -> None:
        """Read until `done()` is true; `on_message(message)` sees each new message."""
        deadline = time.monotonic() + timeout
        while not done():
            try:
                frame = self._read_frame(deadline)
            except TimeoutError:
                raise AssertionError(
                    f"condition not met in {timeout}s; {len(self.received)} messages received"
                ) from None
            if frame.frame_type == FRAME_TYPE_ERROR:
                raise AssertionError(f"nsqd sent an error: {frame.data!r}")
            if frame.frame_type == FRAME_TYPE_MESSAGE and on_message is not None:
                on_message(self.received[-1])

    def barrier(self) -> None:
        """Return once nsqd has processed every command sent so far on this connection."""
        self.connection.send(encode_pub(BARRIER_TOPIC, b"barrier"))
        assert self.response() == b"OK"

    def close(self) -> None:
        self.connection.close()


def drain_and_stop(daemon: DaemonProcess, consumer: Consumer) -> None:
    """FIN whatever is still arriving until a barrier finds nothing new, then stop cleanly:
    afterwards nothing is in flight, so whatever the diskqueues hold was never delivered."""
    while True:
        before = len(consumer.received)
        consumer.barrier()
        consumer.finish(consumer.received[before:])
        if len(consumer.received) == before:
            break
    assert daemon.stop() == 0, daemon.log
    consumer.close()


# -- clean restart ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "flags",
    [(), ("-mem-queue-size=100", "-max-bytes-per-file=65536")],
    ids=["in-memory", "on-disk-in-many-files"],
)
def test_clean_restart_delivers_exactly_what_was_not_finished(tmp_path, flags):
    daemon = start_nsqd(tmp_path, *flags)
    try:
        consumer = Consumer(daemon.port(), "t", "c")
        publish(daemon.port(), "t", numbered(10_000))
        finished: set[int] = set()
        consumer.ready(250)

        def finish_first_3000(message: DecodedMessage) -> None:
            if len(finished) < 3000:
                finished.add(number_of(message))
                consumer.finish([message])

        # 100 more than are FINished stay in flight, unacknowledged, through the stop.
        consumer.receive_until(lambda: len(consumer.received) >= 3100, on_message=finish_first_3000)
        consumer.barrier()
        in_flight = {number_of(m) for m in consumer.received} - finished
        assert len(finished) == 3000 and len(in_flight) >= 100
        assert daemon.stop() == 0, daemon.log
        consumer.close()

        daemon = start_nsqd(tmp_path, *flags)
        consumer = Consumer(daemon.port(), "t", "c", ready=250)
        seen: set[int] = set()

        def finish_each(message: DecodedMessage) -> None:
            seen.add(number_of(message))
            consumer.finish([message])

        consumer.receive_until(lambda: len(seen) >= 7000, on_message=finish_each)
        drain_and_stop(daemon, consumer)
        delivered = {number_of(m) for m in consumer.received}
        assert not delivered & finished, "FINished messages were delivered again"
        assert delivered == set(range(10_000)) - finished
        assert in_flight <= delivered
        # Nothing else was waiting: after FINning all 7,000 the channel and topic are empty.
        assert read_go_queue(tmp_path, "t:c").records == []
        assert read_go_queue(tmp_path, "t").records == []
    finally:
        daemon.kill()


def http_post(daemon: DaemonProcess, path: str) -> int:
    url = f"http://127.0.0.1:{daemon.port('HTTP')}{path}"
    request = urllib.request.Request(url, data=b"", method="POST")
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.status


def stats_paused_flags(daemon: DaemonProcess) -> dict[str, bool]:
    """`{"topic": paused, "topic:channel": paused}` as GET /stats reports them."""
    url = f"http://127.0.0.1:{daemon.port('HTTP')}/stats?format=json"
    with urllib.request.urlopen(url, timeout=10) as response:
        stats = json.load(response)
    flags = {}
    for topic in stats["topics"]:
        flags[topic["topic_name"]] = topic["paused"]
        for channel in topic["channels"]:
            flags[f"{topic['topic_name']}:{channel['channel_name']}"] = channel["paused"]
    return flags


@pytest.mark.parametrize("stop", ["sigterm", "kill-9"])
def test_paused_topic_and_channel_survive_restart(tmp_path, stop):
    expected = {
        "paused_topic": True,
        "paused_topic:c": False,
        "open_topic": False,
        "open_topic:paused_channel": True,
        "open_topic:open_channel": False,
    }
    daemon = start_nsqd(tmp_path)
    try:
        for path in [
            "/topic/create?topic=paused_topic",
            "/channel/create?topic=paused_topic&channel=c",
            "/topic/create?topic=open_topic",
            "/channel/create?topic=open_topic&channel=paused_channel",
            "/channel/create?topic=open_topic&channel=open_channel",
        ]:
            assert http_post(daemon, path) == 200
        # Toggled a few times, as an operator might, ending paused: each answer comes after
        # nsqd.dat was written, and no older state may overwrite it later.
        for action in ["pause", "unpause"] * 5 + ["pause"]:
            assert http_post(daemon, f"/topic/{action}?topic=paused_topic") == 200
            channel = "topic=open_topic&channel=paused_channel"
            assert http_post(daemon, f"/channel/{action}?{channel}") == 200
        # Go nsqd persists the metadata before it answers a pause, so even kill -9 keeps it.
        if stop == "sigterm":
            assert daemon.stop() == 0, daemon.log
        else:
            daemon.kill()
        assert paused_flags(read_nsqd_dat(tmp_path)).items() >= expected.items()

        daemon = start_nsqd(tmp_path)
        assert stats_paused_flags(daemon).items() >= expected.items()
        port = daemon.port()
        held_by_topic = Consumer(port, "paused_topic", "c", ready=10)
        held_by_channel = Consumer(port, "open_topic", "paused_channel", ready=10)
        running = Consumer(port, "open_topic", "open_channel", ready=10)
        publish(port, "paused_topic", [b"held %d" % n for n in range(5)])
        publish(port, "open_topic", [b"open %d" % n for n in range(5)])
        running.receive_until(lambda: len(running.received) >= 5)
        running.finish(running.received)
        for consumer in (held_by_topic, held_by_channel, running):
            consumer.barrier()
        assert held_by_topic.received == [] and held_by_channel.received == []
        assert daemon.stop() == 0, daemon.log
    finally:
        daemon.kill()

    assert paused_flags(read_nsqd_dat(tmp_path)).items() >= expected.items()
    # The paused topic kept its messages; the paused channel kept its copies undelivered.
    held = read_go_queue(tmp_path, "paused_topic").records
    assert sorted(m.body for m in held) == [b"held %d" % n for n in range(5)]
    assert read_go_queue(tmp_path, "paused_topic:c").records == []
    kept = read_go_queue(tmp_path, "open_topic:paused_channel").records
    assert sorted(m.body for m in kept) == [b"open %d" % n for n in range(5)]
    assert {m.attempts for m in held + kept} == {0}, "a paused message was delivered"
    assert read_go_queue(tmp_path, "open_topic:open_channel").records == []


def test_sigterm_while_publishing_keeps_every_acknowledged_message(tmp_path):
    """A publisher still sending when SIGTERM arrives: whatever got OK is delivered after the
    restart; what came after is refused (`E_MPUB_FAILED`) or cut off, never acknowledged and
    then lost."""
    flags = ("-mem-queue-size=50",)
    daemon = start_nsqd(tmp_path, *flags)
    acknowledged: list[bytes] = []
    enough = threading.Event()

    def publish_until_refused(port: int) -> None:
        connection = V2Connection(port)
        try:
            for batch in itertools.count():
                bodies = [b"message %05d" % (batch * 10 + n) for n in range(10)]
                connection.send(encode_mpub("t", bodies))
                if connection.read_response().data != b"OK":
                    return
                acknowledged.extend(bodies)
                if len(acknowledged) >= 5000:
                    enough.set()
        except OSError:
            return  # nsqd closed the connection on its way out
        finally:
            enough.set()
            connection.close()

    try:
        consumer = Consumer(daemon.port(), "t", "c")
        publisher = threading.Thread(target=publish_until_refused, args=(daemon.port(),))
        publisher.start()
        assert enough.wait(20)
        assert daemon.stop() == 0, daemon.log
        publisher.join(10)
        consumer.close()
        assert len(acknowledged) >= 5000

        daemon = start_nsqd(tmp_path, *flags)
        consumer = Consumer(daemon.port(), "t", "c", ready=1000)
        seen: set[int] = set()
        wanted = {number_of_body(body) for body in acknowledged}

        def finish_each(message: DecodedMessage) -> None:
            seen.add(number_of(message))
            consumer.finish([message])

        consumer.receive_until(lambda: wanted <= seen, on_message=finish_each)
        drain_and_stop(daemon, consumer)
    finally:
        daemon.kill()


def test_pause_answered_over_http_survives_kill_9(tmp_path):
    """Go's pause handlers write nsqd.dat before they answer, so a pause answered 200 is never
    lost, even to a kill -9 right after, and no older state written later may replace it.

    Each round makes a topology change (a new channel, which nsqd persists in the background)
    between the two pauses, then kills nsqd at once; the rounds add up on one data path."""
    paused: dict[str, bool] = {}
    daemon = start_nsqd(tmp_path)
    try:
        for round_number in range(6):
            topic = f"t{round_number}"
            for path in [
                f"/topic/create?topic={topic}",
                f"/channel/create?topic={topic}&channel=paused",
                f"/topic/pause?topic={topic}",
                f"/channel/create?topic={topic}&channel=other",
                f"/channel/pause?topic={topic}&channel=paused",
            ]:
                assert http_post(daemon, path) == 200
            paused.update({topic: True, f"{topic}:paused": True, f"{topic}:other": False})
            daemon.kill()
            assert paused_flags(read_nsqd_dat(tmp_path)) == paused, f"round {round_number}"
            daemon = start_nsqd(tmp_path)
            assert stats_paused_flags(daemon) == paused
        assert daemon.stop() == 0, daemon.log
    finally:
        daemon.kill()


# -- kill -9 -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "with_channel, command",
    [(True, "PUB"), (False, "PUB"), (True, "MPUB")],
    ids=["PUB-channel-queue", "PUB-topic-queue", "MPUB-channel-queue"],
)
def test_kill_9_loses_no_acknowledged_publish(tmp_path, with_channel, command):
    flags = ("-mem-queue-size=0", "-sync-every=1")
    daemon = start_nsqd(tmp_path, *flags)
    try:
        if with_channel:
            # The channel exists (RDY 0), so the publishes land in its queue.
            idle_consumer = Consumer(daemon.port(), "t", "c")
            assert idle_consumer.received == []
        bodies = numbered(5000)
        publisher = V2Connection(daemon.port())
        # Pipelined in windows of 50 so the test is quick; every PUB (or MPUB of 10) still
        # gets its own OK, and all 5,000 messages are acknowledged before the kill.
        acknowledged = 0
        for start in range(0, len(bodies), 50):
            window = bodies[start : start + 50]
            if command == "PUB":
                commands = [encode_pub("t", body) for body in window]
            else:
                commands = [encode_mpub("t", window[i : i + 10]) for i in range(0, 50, 10)]
            publisher.send(b"".join(commands))
            for _ in commands:
                assert publisher.read_response().data == b"OK"
            acknowledged += len(window)
        assert acknowledged == 5000
        daemon.kill()

        daemon = start_nsqd(tmp_path, *flags)
        consumer = Consumer(daemon.port(), "t", "c", ready=500)
        seen: set[int] = set()

        def finish_each(message: DecodedMessage) -> None:
            seen.add(number_of(message))
            consumer.finish([message])

        consumer.receive_until(lambda: len(seen) >= 5000, on_message=finish_each)
        assert seen == set(range(5000))
        drain_and_stop(daemon, consumer)
    finally:
        daemon.kill()


def depths_of(daemon: DaemonProcess, topic: str) -> tuple[int, dict[str, int]]:
    """The topic's depth and its channels', from one `/stats` (two requests would let the
    topic's pump move a turn between them)."""
    url = f"http://127.0.0.1:{daemon.port('HTTP')}/stats?format=json&topic={topic}"
    with urllib.request.urlopen(url, timeout=10) as response:
        stats = json.load(response)
    channels = {
        channel["channel_name"]: channel["depth"]
        for found in stats["topics"]
        for channel in found["channels"]
    }
    return sum(found["depth"] for found in stats["topics"]), channels


def test_kill_9_loses_nothing_a_topic_with_many_channels_acknowledged(tmp_path):
    """With FAN_OUT_AFTER_ANSWER_FROM channels an MPUB is answered once the topic's
    diskqueue holds it, and the topic's pump copies it to the channels after (Go's way): a
    kill -9 while the pump is behind loses nothing. After the restart every channel holds
    every acknowledged message (those the pump had moved since the topic's last sync once
    more: at least once, as Go), and one of them delivers all of them, in order."""
    flags = ("-mem-queue-size=0", "-sync-every=1")
    channels = [f"c{number}" for number in range(FAN_OUT_AFTER_ANSWER_FROM)]
    daemon = start_nsqd(tmp_path, *flags)
    try:
        assert http_post(daemon, "/topic/create?topic=t") == 200
        for channel in channels:
            assert http_post(daemon, f"/channel/create?topic=t&channel={channel}") == 200
        bodies = numbered(5000)
        publisher = V2Connection(daemon.port())
        for start in range(0, len(bodies), 500):
            commands = [encode_mpub("t", bodies[i : i + 50]) for i in range(start, start + 500, 50)]
            publisher.send(b"".join(commands))
            for _ in commands:
                assert publisher.read_response().data == b"OK"
        daemon.kill()

        daemon = start_nsqd(tmp_path, *flags)

        def moved() -> dict[str, int] | None:
            topic, depths = depths_of(daemon, "t")
            return depths if topic == 0 and set(depths) == set(channels) else None

        depths = poll(moved, lambda: f"depths {depths_of(daemon, 't')}")
        # Again at most what one turn of the pump moves between two syncs; a kill in the
        # middle of a turn leaves some channels with its copies and others without, so the
        # channels may differ by what the turn had copied.
        for depth in depths.values():
            assert 5000 <= depth <= 5000 + 4096 // len(channels) + 50, depths
        # One in flight at a time: a message moved twice has the same ID twice, and a copy
        # delivered while the other is in flight could not be finished apart from it.
        consumer = Consumer(daemon.port(), "t", "c0", ready=1)
        seen: list[int] = []

        def finish_each(message: DecodedMessage) -> None:
            seen.append(number_of(message))
            consumer.finish([message])

        consumer.receive_until(lambda: len(seen) >= depths["c0"], on_message=finish_each)
        assert list(dict.fromkeys(seen)) == list(range(5000))  # all, first seen in order
        drain_and_stop(daemon, consumer)
    finally:
        daemon.kill()


# -- deferred and in flight at shutdown ---------------------------------------------------------


def test_deferred_and_in_flight_messages_come_back_after_restart(tmp_path):
    daemon = start_nsqd(tmp_path)
    try:
        consumer = Consumer(daemon.port(), "t", "c", ready=5)
        publisher = V2Connection(daemon.port())
        for n in range(3):
            # Due long after the test: still deferred when nsqd stops.
            publisher.send(encode_dpub("t", 600_000, b"deferred %d" % n))
            assert publisher.read_response().data == b"OK"
        for n in range(5):
            publisher.send(encode_pub("t", b"in flight %d" % n))
            assert publisher.read_response().data == b"OK"
        consumer.receive_until(lambda: len(consumer.received) >= 5)
        consumer.barrier()
        in_flight = {m.body: m for m in consumer.received}
        assert sorted(in_flight) == [b"in flight %d" % n for n in range(5)]
        assert {m.attempts for m in in_flight.values()} == {1}
        assert daemon.stop() == 0, daemon.log
        consumer.close()
        publisher.close()

        daemon = start_nsqd(tmp_path)
        consumer = Consumer(daemon.port(), "t", "c", ready=20)
        bodies: set[bytes] = set()

        def finish_each(message: DecodedMessage) -> None:
            bodies.add(message.body)
            consumer.finish([message])

        consumer.receive_until(lambda: len(bodies) >= 8, on_message=finish_each)
        drain_and_stop(daemon, consumer)
        again = {m.body: m for m in consumer.received}
        assert sorted(again) == sorted([b"deferred %d" % n for n in range(3)] + list(in_flight))
        for body, before in in_flight.items():
            # The same message, delivered a second time.
            assert (again[body].id, again[body].timestamp) == (before.id, before.timestamp)
            assert again[body].attempts == 2
        for n in range(3):
            assert again[b"deferred %d" % n].attempts == 1
    finally:
        daemon.kill()


# -- a Go nsqd 1.3.0 data directory -------------------------------------------------------------


def test_go_data_directory_is_served_and_left_in_go_format(tmp_path):
    ts = 1_700_000_000_123_456_789
    # The channel's queue as Go leaves it mid-stream: file 000000 consumed and deleted,
    # the first record of 000001 read already (readPos past it), one more file after it.
    consumed = go_record(ts, 1, b"0a6b3c2d1e0f0000", b"already consumed")
    channel_records = [
        (ts + 1, 0, b"0a6b3c2d1e0f0001", b"channel one"),
        (ts + 2, 3, b"0a6b3c2d1e0f0002", b"channel two \x00\xff binary"),
        (ts + 3, 1, b"0a6b3c2d1e0f0003", b"channel three, second file"),
    ]
    file_1 = go_framed(consumed) + b"".join(go_framed(go_record(*r)) for r in channel_records[:2])
    file_2 = go_framed(go_record(*channel_records[2]))
    queue_file(tmp_path, "gotopic:gochan", 1).write_bytes(file_1)
    queue_file(tmp_path, "gotopic:gochan", 2).write_bytes(file_2)
    queue_metadata_file(tmp_path, "gotopic:gochan").write_bytes(
        go_queue_metadata(3, 1, len(go_framed(consumed)), 2, len(file_2))
    )
    # The topic's own backlog, not yet moved into its channels.
    topic_records = [
        (ts + 4, 0, b"0a6b3c2d1e0f0004", b"topic one"),
        (ts + 5, 0, b"0a6b3c2d1e0f0005", b"x" * 5000),
    ]
    topic_file = b"".join(go_framed(go_record(*r)) for r in topic_records)
    queue_file(tmp_path, "gotopic", 0).write_bytes(topic_file)
    queue_metadata_file(tmp_path, "gotopic").write_bytes(
        go_queue_metadata(2, 0, 0, 0, len(topic_file))
    )
    # A second channel, paused: the topic's backlog waits in it undelivered.
    (tmp_path / "nsqd.dat").write_bytes(
        go_nsqd_dat([("gotopic", False, [("gochan", False), ("gopaused", True)])])
    )

    daemon = start_nsqd(tmp_path)
    try:
        consumer = Consumer(daemon.port(), "gotopic", "gochan", ready=10)
        consumer.receive_until(lambda: len(consumer.received) >= 5)
        delivered = {m.id: m for m in consumer.received}
        assert len(delivered) == 5, "a message was delivered twice"
        for timestamp, attempts, message_id, body in channel_records + topic_records:
            assert delivered[message_id] == DecodedMessage(
                timestamp, attempts + 1, message_id, body
            )
        finished = [delivered[b"0a6b3c2d1e0f0001"], delivered[b"0a6b3c2d1e0f0004"]]
        consumer.finish(finished)
        consumer.barrier()
        assert len(consumer.received) == 5
        assert daemon.stop() == 0, daemon.log
        consumer.close()
    finally:
        daemon.kill()

    # What Go would find: the three unfinished messages, as they were last delivered.
    document = read_nsqd_dat(tmp_path)
    go_channels = [{"name": "gochan", "paused": False}, {"name": "gopaused", "paused": True}]
    assert {"name": "gotopic", "paused": False, "channels": go_channels} in document["topics"]
    assert isinstance(document["version"], str)
    assert read_go_queue(tmp_path, "gotopic").records == []
    left = read_go_queue(tmp_path, "gotopic:gochan").records
    assert sorted(left, key=lambda m: m.id) == sorted(
        (m for m in delivered.values() if m not in finished), key=lambda m: m.id
    )
    # The paused channel's copies of the topic backlog, exactly as Go wrote them.
    undelivered = read_go_queue(tmp_path, "gotopic:gopaused").records
    assert sorted(undelivered, key=lambda m: m.id) == [
        DecodedMessage(*record) for record in topic_records
    ]
    # No file Go would not know: no temporary files left behind, no files of our own.
    strays = [p.name for p in tmp_path.iterdir() if not _GO_DATA_FILE.fullmatch(p.name)]
    assert strays == []


# -- corruption -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "content",
    [b"{not json", b'{"topics": 5}', b'{"topics":[{"paused":false}]}', b"[1, 2]", b"\xff\xfe\x00"]
    + [None],
    ids=["syntax", "topics-not-a-list", "topic-without-name", "not-an-object", "binary"]
    + ["a-directory"],
)
def test_corrupt_nsqd_dat_is_set_aside_and_queued_messages_served(tmp_path, content):
    """Go nsqd refuses to start on a corrupt nsqd.dat; we log one ERROR line naming it, move
    it to `nsqd.dat.corrupt`, find the topics and channels again from their diskqueue files,
    serve what they hold, and write a fresh nsqd.dat (tests/reliability/test_corrupt_startup.py
    has every other kind of damage)."""
    ts = 1_700_000_000_000_000_000
    stored = [(ts, 0, b"%016x" % n, b"stored %d" % n) for n in range(5)]
    data = b"".join(go_framed(go_record(*r)) for r in stored)
    queue_file(tmp_path, "t:c", 0).write_bytes(data)
    queue_metadata_file(tmp_path, "t:c").write_bytes(go_queue_metadata(5, 0, 0, 0, len(data)))
    metadata = tmp_path / "nsqd.dat"
    if content is None:
        metadata.mkdir()
    else:
        metadata.write_bytes(content)

    daemon = start_nsqd(tmp_path)
    try:
        consumer = Consumer(daemon.port(), "t", "c", ready=10)
        consumer.receive_until(lambda: len(consumer.received) >= len(stored))
        assert [m.body for m in consumer.received] == [r[3] for r in stored]
        consumer.finish(consumer.received)
        assert "Traceback" not in daemon.log, daemon.log
        naming = [line for line in daemon.lines if str(metadata) in line]
        assert len(naming) == 1 and "ERROR" in naming[0], daemon.log
        drain_and_stop(daemon, consumer)
    finally:
        daemon.kill()
    moved = tmp_path / "nsqd.dat.corrupt"
    assert moved.is_dir() if content is None else moved.read_bytes() == content
    assert paused_flags(read_nsqd_dat(tmp_path)) == {"t": False, "t:c": False, BARRIER_TOPIC: False}


def test_corrupt_diskqueue_file_is_set_aside_and_later_records_delivered(tmp_path):
    ts = 1_700_000_000_000_000_000
    good = [(ts, 0, b"%016x" % n, b"good %d" % n) for n in range(6)]
    # File 0: one good record, then a length prefix no writer could produce (-1), then junk.
    file_0 = go_framed(go_record(*good[0])) + b"\xff\xff\xff\xff" + b"junk" * 10
    # File 1: good records, then a record cut short as by a kill -9 mid-write.
    file_1 = b"".join(go_framed(go_record(*r)) for r in good[1:4])
    file_1 += _GO_RECORD_SIZE.pack(500) + go_record(ts, 0, b"f" * 16, b"cut short")
    # File 2 is the write file, intact.
    file_2 = b"".join(go_framed(go_record(*r)) for r in good[4:])
    for number, data in enumerate([file_0, file_1, file_2]):
        queue_file(tmp_path, "t:c", number).write_bytes(data)
    queue_metadata_file(tmp_path, "t:c").write_bytes(go_queue_metadata(8, 0, 0, 2, len(file_2)))
    (tmp_path / "nsqd.dat").write_bytes(go_nsqd_dat([("t", False, [("c", False)])]))

    daemon = start_nsqd(tmp_path)
    try:
        consumer = Consumer(daemon.port(), "t", "c", ready=20)
        bodies: set[bytes] = set()

        def finish_each(message: DecodedMessage) -> None:
            bodies.add(message.body)
            consumer.finish([message])

        consumer.receive_until(lambda: len(bodies) >= 6, on_message=finish_each)
        assert bodies == {r[3] for r in good}
        # Still serving: a new message after the bad files is delivered too.
        publish(daemon.port(), "t", [b"after"])
        consumer.receive_until(lambda: b"after" in bodies, on_message=finish_each)
        assert daemon.process.poll() is None
        assert "Traceback" not in daemon.log, daemon.log
        drain_and_stop(daemon, consumer)
    finally:
        daemon.kill()
    # go-diskqueue's handleReadError keeps the unreadable files as `.bad`.
    assert queue_file(tmp_path, "t:c", 0).with_name("t:c.diskqueue.000000.dat.bad").exists()
    assert queue_file(tmp_path, "t:c", 1).with_name("t:c.diskqueue.000001.dat.bad").exists()
    assert read_go_queue(tmp_path, "t:c").records == []


def test_corrupt_queue_metadata_does_not_stop_nsqd(tmp_path):
    """Garbled `.meta.dat` and a data file without one whole record: nsqd logs, starts, and
    the topic takes and delivers new messages."""
    queue_metadata_file(tmp_path, "broken").write_bytes(b"not\nmetadata\n")
    queue_file(tmp_path, "broken", 0).write_bytes(b"\x00\x00\x00\x01")
    (tmp_path / "nsqd.dat").write_bytes(go_nsqd_dat([("broken", False, [("c", False)])]))
    daemon = start_nsqd(tmp_path)
    try:
        consumer = Consumer(daemon.port(), "broken", "c", ready=1)
        publish(daemon.port(), "broken", [b"fresh"])
        consumer.receive_until(lambda: any(m.body == b"fresh" for m in consumer.received))
        assert [m.body for m in consumer.received] == [b"fresh"]
        consumer.finish(consumer.received)
        assert "Traceback" not in daemon.log, daemon.log
        drain_and_stop(daemon, consumer)
    finally:
        daemon.kill()
