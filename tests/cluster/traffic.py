"""Traffic for the cluster operation tests: smart-client producers and a smart-client consumer on
one topic (every partition, following leaders through nsqlookupd), and the checks after it:
nothing acknowledged lost, every replica of every partition byte-identical, and the longest
write gap each partition saw."""

import json
import re
import struct
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

from nsqpy.client.blocking import NSQError
from nsqpy.client.smart import SmartClientError, SmartConsumer, SmartProducer
from nsqpy.common.command import encode_command, encode_rdy
from nsqpy.common.frame import FRAME_TYPE_ERROR
from nsqpy.partition_log import Record
from nsqpy.partition_log.records import SIZE, decode_flagged_record
from tests.cluster.local_cluster import LocalCluster
from tests.harness import V2Connection
from tests.support.polling import poll


@dataclass
class Received:
    counts: Counter = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)


class Traffic:
    """`producers` threads publishing numbered messages through SmartProducer (round-robin
    over the partitions, as a keyless publisher does), and one SmartConsumer of channel `c`,
    until `stop()`."""

    def __init__(
        self,
        cluster: LocalCluster,
        topic: str,
        *,
        producers: int = 2,
        interval: float = 0.002,
        lookup_interval: float = 1.0,
    ) -> None:
        self.cluster = cluster
        self.topic = topic
        self.lookupd = f"127.0.0.1:{cluster.lookupds[0].port('HTTP')}"
        self.acked: set[bytes] = set()
        self.failed = 0
        self.received = Received()
        # Per partition: when its last acknowledged publish was, and the longest gap between
        # two acknowledged publishes.
        self.last_ack: dict[int, float] = {}
        self.gaps: dict[int, float] = {}
        self.partitions_used: Counter = Counter()
        self._interval = interval
        self._lookup_interval = lookup_interval
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.consumer = SmartConsumer(
            self.lookupd,
            topic,
            "c",
            self._handle,
            max_in_flight=100,
            lookup_interval=lookup_interval,
            backoff_max=0.5,
        )
        self._threads = [
            threading.Thread(target=self._produce, args=(index,), daemon=True)
            for index in range(producers)
        ]
        for thread in self._threads:
            thread.start()

    def _handle(self, message) -> None:
        with self.received.lock:
            self.received.counts[message.body] += 1

    def _produce(self, index: int) -> None:
        sequence = 0
        with SmartProducer(
            self.lookupd,
            publish_timeout=20,
            timeout=3,
            lookup_interval=self._lookup_interval,
            partition_cooldown=0.5,
        ) as producer:
            while not self._stop.is_set():
                body = b"p%d-%08d" % (index, sequence)
                sequence += 1
                try:
                    published = producer.publish(self.topic, body)
                except (SmartClientError, NSQError, OSError):
                    with self._lock:
                        self.failed += 1
                    continue
                now = time.monotonic()
                partition = published.partition
                with self._lock:
                    self.acked.add(body)
                    self.partitions_used[partition] += 1
                    last = self.last_ack.get(partition)
                    if last is not None:
                        self.gaps[partition] = max(self.gaps.get(partition, 0.0), now - last)
                    self.last_ack[partition] = now
                time.sleep(self._interval)

    def wait_acked(self, count: int, timeout: float = 30.0) -> None:
        poll(
            lambda: len(self.acked) >= count,
            lambda: f"{count} acknowledged (have {len(self.acked)})\n{self._describe()}",
            timeout=timeout,
        )

    def _describe(self) -> str:
        """The cluster's state, for a failure message (a stopped cluster says so instead)."""
        try:
            return self.cluster.describe()
        except (OSError, AssertionError) as error:
            return f"(the cluster could not be asked: {error})"

    def stop_producing(self) -> set[bytes]:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)
        return set(self.acked)

    def check_all_consumed(self, timeout: float = 60.0) -> None:
        """Stop the producers, then wait until the consumer got every acknowledged message."""
        acked = self.stop_producing()

        def missing() -> set[bytes]:
            with self.received.lock:
                return acked - set(self.received.counts)

        try:
            poll(
                lambda: not missing(),
                lambda: (
                    f"every acknowledged message consumed ({len(missing())} missing)\n"
                    + self._describe()
                ),
                timeout=timeout,
            )
        finally:
            self.consumer.close()
        assert acked, "nothing was acknowledged"

    def close(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)
        self.consumer.close()


def log_files(node, topic: str, partition: int) -> dict[str, bytes]:
    """A partition's data segments and commit log on a node."""
    directory = node.data_path / topic
    if not directory.is_dir():
        return {}
    data_prefix = f"{topic}-{partition}.diskqueue.0"
    index_name = f"{topic}_{partition}.commit.log"
    files = {}
    for path in sorted(directory.iterdir()):
        if path.name.startswith(data_prefix) or path.name == index_name:
            try:
                files[path.name] = path.read_bytes()
            except FileNotFoundError:
                continue  # deleted meanwhile (the partition moved off the node)
    return files


def check_replicas_identical(cluster: LocalCluster, topic: str, partitions: int) -> None:
    """Every ISR member of every partition holds its leader's log byte for byte from the
    later of their starts (each partition's ISR whole first): the same segment files and index
    entries (a copy that started over at the leader's start has no older ones)."""
    for partition in range(partitions):
        poll(
            lambda p=partition: (
                (entry := cluster.partition(topic, p)) is not None
                and len(entry["isr"]) == entry["replica"]
            ),
            lambda p=partition: f"{topic}/{p}'s ISR whole\n{cluster.describe()}",
            timeout=60,
        )
        entry = cluster.partition(topic, partition)
        expected = retained_log(cluster.node(entry["leader"]), topic, partition)
        assert expected[1], f"{topic}/{partition}: no log on its leader"
        for node_id in entry["isr"]:
            node = cluster.node(node_id)
            poll(
                lambda n=node, p=partition, e=expected: same_from(retained_log(n, topic, p), e),
                lambda n=node, p=partition, e=expected: (
                    f"{topic}/{p} identical on {n.node_id} from the later start:"
                    f" {_difference(retained_log(n, topic, p), e)}\n{cluster.describe()}"
                ),
            )


_ENTRY = struct.Struct(">qqqqiqi")


def retained_log(node, topic: str, partition: int = 0) -> tuple[int, dict, list]:
    """The partition's log on `node` from where it starts: the start offset, the data
    segments (name → bytes) and the index entries of the groups from the start on."""
    directory = node.data_path / topic
    if not directory.is_dir():
        return 0, {}, []
    start_meta = directory / f"{topic}-{partition}.diskqueue.meta.extra.dat"
    try:
        start = json.loads(start_meta.read_bytes())["VirtualOffset"]
    except FileNotFoundError:
        start = 0
    segments = {}
    entries = []
    prefix = f"{topic}-{partition}.diskqueue.0"
    index_prefix = f"{topic}_{partition}.commit.log"
    for path in sorted(directory.iterdir()):
        try:
            if path.name.startswith(prefix) and path.name.endswith(".dat"):
                if "offsetmeta" not in path.name:
                    segments[path.name] = path.read_bytes()
            elif path.name.startswith(index_prefix) and path.name[len(index_prefix) :] in (
                "",
                *(f".{n:08d}" for n in range(1000)),
            ):
                data = path.read_bytes()
                for at in range(0, len(data) - len(data) % _ENTRY.size, _ENTRY.size):
                    entry = _ENTRY.unpack_from(data, at)
                    if entry[3] >= start:
                        entries.append(entry)
        except FileNotFoundError:
            continue  # removed meanwhile (retention, or the partition moved off the node)
    return start, segments, sorted(entries, key=lambda entry: entry[3])


def _difference(copy: tuple[int, dict, list], leader: tuple[int, dict, list]) -> str:
    """Where a copy's log and its leader's part, for a failure message."""
    start, segments, entries = _from_later_start(copy, leader)
    lines = [f"leader start {leader[0]}, copy start {copy[0]}"]
    for name, data in sorted(segments.items()):
        mine = copy[1].get(name)
        if mine != data:
            at = next(
                (i for i in range(min(len(data), len(mine or b""))) if data[i] != mine[i]), None
            )
            lines.append(
                f"segment {name}: leader {len(data)} bytes, copy"
                f" {'none' if mine is None else len(mine)} bytes, first difference at {at}"
            )
    theirs = [e for e in copy[2] if e[3] >= start]
    for index, (a, b) in enumerate(zip(entries, theirs, strict=False)):
        if a != b:
            first = max(index - 2, 0)
            lines.append(
                f"index entries from {first}: leader {entries[first : index + 3]},"
                f" copy {theirs[first : index + 3]}"
            )
            break
    if len(entries) != len(theirs):
        lines.append(f"index entries: leader {len(entries)}, copy {len(theirs)}")
    return "; ".join(lines)


def _from_later_start(
    copy: tuple[int, dict, list], leader: tuple[int, dict, list]
) -> tuple[int, dict, list]:
    """The leader's log from the later of the two starts. Each replica cleans by its own
    channel cursors, which its leaders pushed: a copy may start later than a new leader whose
    retention ran less far (docs/design.md §13), and then lacks the leader's older segments."""
    start = max(copy[0], leader[0])
    segments = leader[1]
    if copy[0] > leader[0] and copy[1]:
        first = min(copy[1])
        segments = {name: data for name, data in segments.items() if name >= first}
    return start, segments, [e for e in leader[2] if e[3] >= start]


def same_from(copy: tuple[int, dict, list], leader: tuple[int, dict, list]) -> bool:
    """Whether `copy` holds what `leader` holds from the later of their starts: the same
    segment files (a copy may keep older ones its own retention has not removed yet) and
    index entries."""
    start, segments, entries = _from_later_start(copy, leader)
    kept = {name: data for name, data in copy[1].items() if name in segments}
    return kept == segments and [e for e in copy[2] if e[3] >= start] == entries


def publish_numbered(cluster, topic: str, label: str, count: int) -> set[bytes]:
    """Publish `<label> 0` to `<label> <count - 1>` one after the other, each acknowledged;
    their bodies."""
    bodies = [b"%s %d" % (label.encode(), i) for i in range(count)]
    for body in bodies:
        publish(cluster, topic, body)
    return set(bodies)


def drain(node, topic: str, wanted: set[bytes], partition: int = 0) -> set[bytes]:
    """Consume channel `c` of the partition from `node` until every message in `wanted`
    came."""
    received: set[bytes] = set()
    connection = V2Connection(node.tcp_port)
    try:
        connection.send(b"SUB %s c %d\n" % (topic.encode(), partition))
        assert connection.read_response().data == b"OK"
        connection.send(encode_rdy(100))
        deadline = time.monotonic() + 20
        while not wanted <= received:
            assert time.monotonic() < deadline, f"missing {sorted(wanted - received)[:5]}"
            for message in connection.read_messages(1):
                received.add(message.body)
                connection.send(b"FIN " + message.id + b"\n")
    finally:
        connection.close()
    return received


def publish(cluster, topic: str, body: bytes, deadline: float = 20.0) -> float:
    """Publish to the partition's leader, retrying on whichever node leads it; the seconds it
    took (the write unavailability a publisher saw)."""
    started = time.monotonic()
    while time.monotonic() - started < deadline:
        leader = cluster.node_leading(topic, 0)
        if leader is not None:
            try:
                connection = V2Connection(leader.tcp_port, timeout=5)
                try:
                    connection.send(encode_command(b"PUB", topic.encode(), b"0", body=body))
                    frame = connection.read_response()
                finally:
                    connection.close()
                if frame.frame_type != FRAME_TYPE_ERROR and frame.data == b"OK":
                    return time.monotonic() - started
            except OSError:
                pass
        time.sleep(0.05)
    raise AssertionError(f"could not publish {body!r} within {deadline} s")


SEGMENT_NAME = re.compile(r"\.diskqueue\.\d{6,9}\.dat$")


def stored_bodies(files: dict[str, bytes]) -> Counter:
    """How many times each body is stored in a partition's log segments."""
    bodies: Counter = Counter()
    for name in sorted(files):
        if not SEGMENT_NAME.search(name):
            continue  # the index, a rolled segment's range
        data = files[name]
        at = 0
        while at + 4 <= len(data):
            (size,) = SIZE.unpack_from(data, at)
            record = data[at + 4 : at + 4 + size]
            if size == 0 or len(record) < size:
                break  # the end of what is written
            bodies[decode_flagged_record(record, 0, 0, Record).body] += 1
            at += 4 + size
    return bodies
