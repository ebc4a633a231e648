"""A control-plane nemesis (docs/RELIABILITY.md, "The control plane"): faults of etcd and of
the master nsqlookupd, alone and each followed by a data node's kill -9, on a cluster of real
processes (3 etcd members, 2 nsqlookupds, 3 nsqds) under steady writes to every partition.

Each fault lasts past a node lease (`FAULT_SECONDS`), then ends (the test resumes or restarts
what it stopped or killed, and nothing else). It passes when

* writes to every partition resume within the lease + 2 s of the fault's end (each
  partition has a producer of its own, publishing through the smart client given every
  nsqlookupd; an acknowledged publish at or after the end counts);
* the cluster heals by itself: a master, every nsqd registered, every partition led with its
  whole ISR and nothing catching up, no daemon exited;
* at the end nothing acknowledged is lost (each partition's leader stores every body that was
  acknowledged) and every ISR member holds its leader's log byte for byte.

The data node killed is the leader of partition 0 as the fault begins: its partitions need
an election while the control plane is faulted or just back. It is started again once the
writes resumed without it.
"""

import bisect
import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from nsqpy.client.blocking import NSQError
from nsqpy.client.smart import SmartClientError, SmartProducer
from tests.cluster.etcd_server import EtcdCluster
from tests.cluster.local_cluster import LocalCluster
from tests.cluster.traffic import check_replicas_identical, log_files, stored_bodies
from tests.support.polling import poll

LEASE = 2.0
# How long each fault lasts: past a lease, so every lease refreshed through what is faulted
# runs out meanwhile.
FAULT_SECONDS = LEASE + 1.0
# The promise: writes resume this soon after a fault ends.
RESUME_BOUND = LEASE + 2.0
# How long a data node's kill -9 comes after its fault begins.
NODE_KILL_AFTER = 0.5

TOPIC = "cp"
PARTITIONS = 2

FAULTS = (
    "etcd_leader_pause",
    "etcd_leader_kill",
    "etcd_follower_pause",
    "etcd_follower_kill",
    "etcd_all_pause",
    "etcd_all_kill",
    "master_pause",
    "master_kill",
)


@dataclass
class PartitionTraffic:
    acked: set[bytes] = field(default_factory=set)
    # When each acknowledged publish was answered (time.monotonic()), in order.
    ack_times: list[float] = field(default_factory=list)
    failures: int = 0


class PartitionWriters:
    """A producer thread a partition, publishing numbered bodies to its own partition through
    the smart client (given every nsqlookupd) until `stop()`."""

    def __init__(self, cluster: LocalCluster, topic: str, partitions: int) -> None:
        self.topic = topic
        self.lookupds = [f"127.0.0.1:{lookupd.port('HTTP')}" for lookupd in cluster.lookupds]
        self.traffic = {partition: PartitionTraffic() for partition in range(partitions)}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._produce, args=(partition,), daemon=True)
            for partition in range(partitions)
        ]
        for thread in self._threads:
            thread.start()

    def _produce(self, partition: int) -> None:
        traffic = self.traffic[partition]
        sequence = 0
        with SmartProducer(
            self.lookupds,
            publish_timeout=30,
            timeout=2,
            http_timeout=0.5,
            lookup_interval=1.0,
            backoff_max=0.2,
        ) as producer:
            while not self._stop.is_set():
                body = b"n-%d-%08d" % (partition, sequence)
                sequence += 1
                try:
                    producer.publish(self.topic, body, partition=partition)
                except (SmartClientError, NSQError, OSError):
                    traffic.failures += 1
                    continue
                with self._lock:
                    traffic.acked.add(body)
                    traffic.ack_times.append(time.monotonic())
                time.sleep(0.01)

    def first_ack_at_or_after(self, partition: int, moment: float) -> float | None:
        with self._lock:
            times = self.traffic[partition].ack_times
            index = bisect.bisect_left(times, moment)
            return times[index] if index < len(times) else None

    def acked(self) -> int:
        with self._lock:
            return sum(len(traffic.acked) for traffic in self.traffic.values())

    def stop(self) -> dict[int, set[bytes]]:
        self._stop.set()
        for thread in self._threads:
            thread.join(40)
        return {partition: set(traffic.acked) for partition, traffic in self.traffic.items()}


class Nemesis:
    def __init__(
        self, cluster: LocalCluster, etcd: EtcdCluster, topic: str, partitions: int
    ) -> None:
        self.cluster = cluster
        self.etcd = etcd
        self.topic = topic
        self.partitions = partitions
        self.writers = PartitionWriters(cluster, topic, partitions)
        # Per fault run: the seconds from the fault's end until each partition took a write.
        self.resumed: dict[str, list[float]] = {}
        poll(lambda: self.writers.acked() >= 20 * partitions, "the writers under way")

    # -- the faults ---------------------------------------------------------------------------

    def _begin(self, fault: str):
        """Start `fault`; what ends it."""
        etcd, cluster = self.etcd, self.cluster
        if fault.startswith("etcd_leader") or fault.startswith("etcd_follower"):
            leader = etcd.leader()
            member = (
                leader
                if fault.startswith("etcd_leader")
                else next(m for m in etcd.members if m is not leader)
            )
            if fault.endswith("pause"):
                member.pause()
                return member.resume
            member.kill()
            return member.restart
        if fault == "etcd_all_pause":
            etcd.pause_all()
            return etcd.resume_all
        if fault == "etcd_all_kill":
            etcd.kill_all()
            return etcd.start_all
        master = cluster.lookupds.index(
            poll(cluster.master, lambda: f"{fault}: a master nsqlookupd\n{cluster.describe()}")
        )
        if fault == "master_pause":
            cluster.pause_lookupd(master)
            return lambda: cluster.resume_lookupd(master)
        cluster.kill_lookupd(master)
        return lambda: cluster.restart_lookupd(master)

    def run(self, fault: str, *, then_kill_node: bool) -> float:
        """One fault (and a data node's kill -9): checks that writes resumed in time and that
        the cluster healed; the slowest partition's seconds from the fault's end to a write."""
        name = f"{fault}{' + node kill' if then_kill_node else ''}"
        victim = self.cluster.node(self.cluster.partition(self.topic, 0)["leader"])
        end = self._begin(fault)
        begun = time.monotonic()
        killed = None
        if then_kill_node:
            time.sleep(NODE_KILL_AFTER)  # the fault under way
            victim.kill()
            killed = victim
        time.sleep(max(begun + FAULT_SECONDS - time.monotonic(), 0))  # the fault lasts
        end()
        ended = time.monotonic()
        resumed = []
        for partition in range(self.partitions):
            at = poll(
                lambda p=partition: self.writers.first_ack_at_or_after(p, ended),
                lambda p=partition: (
                    f"{name}: a write to partition {p} after the fault\n" + self.cluster.describe()
                ),
                timeout=60,
            )
            resumed.append(at - ended)
        self.resumed[name] = [round(seconds, 2) for seconds in resumed]
        assert max(resumed) <= RESUME_BOUND, (
            f"{name}: writes resumed {max(resumed):.2f} s after the fault's end"
            f" (bound {RESUME_BOUND:g} s): {self.resumed[name]}\n{self.cluster.describe()}"
        )
        if killed is not None:
            killed.start()
        self.healed(name)
        return max(resumed)

    # -- the checks ---------------------------------------------------------------------------

    def healed(self, name: str) -> None:
        """The cluster whole again by itself: no daemon exited, a master, every nsqd
        registered, every partition led by a node that takes writes, its ISR whole and
        nothing catching up."""
        cluster = self.cluster
        for index, lookupd in enumerate(cluster.lookupds):
            assert lookupd.process.poll() is None, (
                f"{name}: nsqlookupd {index} exited\n" + "\n".join(lookupd.lines[-40:])
            )
        for node in cluster.nodes:
            assert node.running, f"{name}: {node.node_id} exited\n" + "\n".join(
                node.process.lines[-40:]
            )

        def whole() -> bool:
            if cluster.master() is None:
                return False
            stats = cluster.stats()
            if len(stats["nsqd_nodes"]) != len(cluster.nodes):
                return False
            for partition in range(self.partitions):
                entry = cluster.partition(self.topic, partition)
                if (
                    entry is None
                    or len(entry["isr"]) != entry["replica"]
                    or entry["catching_up"]
                    or cluster.node_leading(self.topic, partition) is None
                ):
                    return False
            return True

        poll(whole, lambda: f"{name}: the cluster whole again\n{cluster.describe()}", timeout=60)

    def finish(self) -> dict:
        """Stop the writers; every acknowledged body stored by its partition's leader, every
        ISR member's log its leader's. The figures."""
        acked = self.writers.stop()
        for partition, bodies in acked.items():
            leader = poll(
                lambda p=partition: self.cluster.node_leading(self.topic, p),
                f"{self.topic}/{partition}'s leader",
            )
            stored = stored_bodies(log_files(leader, self.topic, partition))
            missing = bodies - set(stored)
            assert not missing, (
                f"{self.topic}/{partition}: {len(missing)} of {len(bodies)} acknowledged"
                f" not stored by its leader {leader.node_id}"
            )
        check_replicas_identical(self.cluster, self.topic, self.partitions)
        return {
            "acknowledged": {partition: len(bodies) for partition, bodies in acked.items()},
            "lost": 0,
            "resumed_after_s": self.resumed,
        }


@contextlib.contextmanager
def nemesis_cluster(
    root: Path,
    etcd: EtcdCluster,
    *,
    nsqd_args: tuple[str, ...] = (),
    prepare: Callable[[LocalCluster], None] | None = None,
) -> Iterator[Nemesis]:
    """3 etcd members (`etcd`), 2 nsqlookupds and 3 nsqds (`nsqd_args`); topic `TOPIC` of
    `PARTITIONS` partitions of 3 replicas, each with a channel (then `prepare(cluster)`),
    written to steadily."""
    with LocalCluster(root, etcd, lookupds=2, ttl=LEASE, nsqd_args=nsqd_args) as cluster:
        cluster.create_writable_topic(TOPIC, PARTITIONS, 3)
        if prepare is not None:
            prepare(cluster)
        nemesis = Nemesis(cluster, etcd, TOPIC, PARTITIONS)
        try:
            yield nemesis
        finally:
            nemesis.writers.stop()
