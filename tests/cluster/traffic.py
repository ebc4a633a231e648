"""Traffic for the cluster operation tests: smart-client producers and a smart-client consumer on
one topic (every partition, following leaders through nsqlookupd), and the checks after it:
nothing acknowledged lost, every replica of every partition byte-identical, and the longest
write gap each partition saw."""

import threading
import time
from collections import Counter
from dataclasses import dataclass, field

from nsqpy.client.blocking import NSQError
from nsqpy.client.smart import SmartClientError, SmartConsumer, SmartProducer
from tests.cluster.local_cluster import LocalCluster, wait_for


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
        wait_for(lambda: len(self.acked) >= count, f"{count} acknowledged", timeout)

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
            wait_for(lambda: not missing(), "every acknowledged message consumed", timeout)
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
    """Every ISR member of every partition holds its leader's log byte for byte (each
    partition's ISR whole first)."""
    for partition in range(partitions):
        wait_for(
            lambda p=partition: (
                (entry := cluster.partition(topic, p)) is not None
                and len(entry["isr"]) == entry["replica"]
            ),
            f"{topic}/{partition}'s ISR whole",
            timeout=60,
        )
        entry = cluster.partition(topic, partition)
        expected = log_files(cluster.node(entry["leader"]), topic, partition)
        assert expected, f"{topic}/{partition}: no log on its leader"
        for node_id in entry["isr"]:
            node = cluster.node(node_id)
            wait_for(
                lambda n=node, p=partition, e=expected: log_files(n, topic, p) == e,
                f"{topic}/{partition} identical on {node_id}",
            )
