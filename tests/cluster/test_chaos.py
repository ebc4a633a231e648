"""Chaos on a cluster of real processes (docs/design.md §14, docs/RELIABILITY.md): etcd, one
nsqlookupd, three nsqds; topics with replicator 2 and 3; a producer per topic publishing
steadily through the smart client (which follows the leader through nsqlookupd and retries),
and a consumer per topic draining whichever node leads it. Faults, one after the other:
`kill -9` of a leader (then it is started again), `SIGSTOP` of a leader past its lease then
`SIGCONT`, `kill -9` of a follower and a restart, a restart of etcd, a leader's link to etcd
black-holed then healed, a follower cut off from etcd and from its peers (black-holing
proxies), then healed, and the same for a leader, whose producers still reach it; retention
run on every replica under load; a follower, then a leader, killed and started again inside
its lease on an emptied data directory (a replaced disk); a leader's disk (a 16 MiB tmpfs, as
every node's) filled until it gives the partition up, then freed. Afterwards the checker reads
everything: every acknowledged message consumed at least once (0 lost), the log bytes
identical on every ISR member from the later of its and the leader's start, duplicates
counted, and the write unavailability of each fault.

The default suite runs each fault once, and the four that replace a leader five times each
(20 failovers: nothing lost, nothing stored twice); `-m slow` runs `test_chaos_long` with many
rounds.
"""

import json
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import pytest

from nsqpy.client.blocking import NSQError
from nsqpy.client.smart import SmartClientError, SmartProducer
from nsqpy.common.command import encode_rdy
from nsqpy.common.frame import FRAME_TYPE_MESSAGE
from nsqpy.common.message import decode_message
from tests.cluster.aging import replace_disk
from tests.cluster.local_cluster import LocalCluster
from tests.cluster.proxy import BlackholeProxy
from tests.cluster.traffic import check_replicas_identical, stored_bodies
from tests.harness import V2Connection
from tests.support.polling import poll

TOPICS = {"r2": 2, "r3": 3}


# The topic whose consumer subscribes with SUB_ORDERED: its first deliveries must come in
# publishing order.
ORDERED = "r3"
DETAIL_SIZE = 12  # SUB_ORDERED's [8 offset][4 size] before the body (docs/protocol.md §3.5)


@dataclass
class TopicTraffic:
    acked: set[bytes] = field(default_factory=set)
    received: Counter = field(default_factory=Counter)
    # Bodies in the order first received.
    first: list[bytes] = field(default_factory=list)
    attempts: int = 0
    # (seconds without an acknowledged publish, when it began): gaps longer than 0.5 s.
    gaps: list[tuple[float, float]] = field(default_factory=list)


class Workload:
    """A producer and a consumer thread per topic until `stop()`."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.traffic = {topic: TopicTraffic() for topic in TOPICS}
        self._stop = threading.Event()
        self._threads = []
        for topic in TOPICS:
            for target in (self._produce, self._consume):
                thread = threading.Thread(target=target, args=(topic,), daemon=True)
                thread.start()
                self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)

    def _leader_port(self, topic: str) -> int | None:
        try:
            node = self.cluster.node_leading(topic, 0)
        except (OSError, AssertionError, KeyError, ValueError):
            return None
        return node.tcp_port if node is not None else None

    def _produce(self, topic: str) -> None:
        traffic = self.traffic[topic]
        sequence = 0
        last_ok = time.monotonic()
        lookupd = f"127.0.0.1:{self.cluster.lookupds[0].port('HTTP')}"
        with SmartProducer(lookupd, publish_timeout=5, timeout=3) as producer:
            while not self._stop.is_set():
                body = b"%s-%08d" % (topic.encode(), sequence)
                sequence += 1
                traffic.attempts += 1
                try:
                    producer.publish(topic, body)
                except (SmartClientError, NSQError, OSError):
                    # Not acknowledged (it may still be stored: a retry then duplicates it).
                    continue
                traffic.acked.add(body)
                now = time.monotonic()
                if now - last_ok > 0.5:
                    traffic.gaps.append((now - last_ok, last_ok))
                last_ok = now
                time.sleep(0.005)

    def _consume(self, topic: str) -> None:
        traffic = self.traffic[topic]
        while not self._stop.is_set():
            port = self._leader_port(topic)
            if port is None:
                time.sleep(0.05)
                continue
            try:
                connection = V2Connection(port, timeout=1)
            except OSError:
                continue
            command = b"SUB_ORDERED" if topic == ORDERED else b"SUB"
            try:
                connection.send(b"%s %s c 0\n" % (command, topic.encode()))
                if connection.read_response().data != b"OK":
                    continue
                connection.send(encode_rdy(50))
                while not self._stop.is_set():
                    frame = connection.read_frame()
                    if frame.frame_type != FRAME_TYPE_MESSAGE:
                        if frame.data == b"_heartbeat_":
                            connection.send(b"NOP\n")
                            continue
                        break
                    message = decode_message(frame.data)
                    body = message.body[DETAIL_SIZE:] if topic == ORDERED else message.body
                    if body not in traffic.received:
                        traffic.first.append(body)
                    traffic.received[body] += 1
                    connection.send(b"FIN " + message.id + b"\n")
            except OSError:
                pass
            finally:
                connection.close()


def log_files(node, topic: str) -> dict[str, bytes]:
    return {
        path.name: path.read_bytes()
        for path in sorted((node.data_path / topic).iterdir())
        if path.name.endswith(".commit.log") or ".diskqueue.0" in path.name
    }


def settle_and_check(cluster: LocalCluster, workload: Workload) -> dict:
    """Stop the producers, let the consumers drain, then check every promise; the figures."""
    # Every node back in every ISR, so the byte comparison covers all replicas.
    for topic, replicas in TOPICS.items():
        poll(
            lambda t=topic, r=replicas: len(cluster.partition(t, 0)["isr"]) == r,
            f"{topic}'s ISR whole again",
            timeout=60,
        )
    producers_done = time.monotonic() + 1.0
    while time.monotonic() < producers_done:
        time.sleep(0.05)
    workload._stop.set()
    figures = {}
    for topic, traffic in workload.traffic.items():
        workload_acked = set(traffic.acked)
        leader = poll(lambda t=topic: cluster.node_leading(t, 0), f"{topic}'s leader")
        missing = workload_acked - set(traffic.received)
        if missing:
            missing -= drain_missing(leader, topic, missing)
        assert not missing, f"{topic}: {len(missing)} acknowledged never consumed"
        if topic == ORDERED:
            assert traffic.first == sorted(traffic.first), f"{topic}: out of order"
        check_replicas_identical(cluster, topic, 1)
        expected = log_files(leader, topic)
        stored = stored_bodies(expected)
        figures[topic] = {
            "acknowledged": len(workload_acked),
            "lost": 0,
            "duplicates": sum(count - 1 for count in traffic.received.values() if count > 1),
            # The smart producer publishes idempotently: its retries store nothing twice.
            "stored_duplicates": sum(count - 1 for count in stored.values() if count > 1),
            "gaps": [round(gap, 2) for gap, _at in traffic.gaps],
        }
    workload.stop()
    return figures


def drain_missing(node, topic: str, wanted: set[bytes]) -> set[bytes]:
    """What a last consumer of the leader still gets of `wanted` (the workload's consumer may
    have stopped before the end)."""
    found: set[bytes] = set()
    connection = V2Connection(node.tcp_port, timeout=2)
    try:
        connection.send(b"SUB %s c 0\n" % topic.encode())
        assert connection.read_response().data == b"OK"
        connection.send(encode_rdy(200))
        deadline = time.monotonic() + 20
        while not wanted <= found and time.monotonic() < deadline:
            try:
                frame = connection.read_frame()
            except OSError:
                break
            if frame.frame_type == FRAME_TYPE_MESSAGE:
                message = decode_message(frame.data)
                found.add(message.body)
                connection.send(b"FIN " + message.id + b"\n")
    finally:
        connection.close()
    return found & wanted


class Faults:
    def __init__(self, cluster: LocalCluster, proxies: dict[int, BlackholeProxy]) -> None:
        self.cluster = cluster
        self.proxies = proxies

    def _leader(self, topic: str = "r3"):
        return poll(lambda: self.cluster.node_leading(topic, 0), f"{topic}'s leader")

    def _whole(self) -> None:
        """Every partition's ISR whole again, each member holding the data the ISR counts on
        (a node started on an emptied disk is in the ISR it was in until the master sees its
        new incarnation) and none catching up: the next fault starts from a healthy cluster."""
        for topic, replicas in TOPICS.items():
            try:
                poll(
                    lambda t=topic, r=replicas: (
                        len((entry := self.cluster.partition(t, 0))["isr"]) == r
                        and not entry["lost"]
                        and not entry["catching_up"]
                    ),
                    f"{topic}'s ISR whole",
                    timeout=30,
                )
            except AssertionError:
                print(json.dumps(self.cluster.stats()["partitions"]))
                for node in self.cluster.nodes:
                    print("=====", node.node_id)
                    print("\n".join(node.process.lines[-200:]))
                print("\n".join(self.cluster.lookupds[0].lines[-40:]))
                raise

    def kill_leader(self) -> None:
        leader = self._leader()
        leader.kill()
        poll(lambda: self.cluster.node_leading("r3", 0) not in (None, leader), "a new leader")
        leader.start()
        self._whole()

    def freeze_leader(self) -> None:
        leader = self._leader()
        leader.pause()
        try:
            poll(
                lambda: self.cluster.partition("r3", 0)["leader"] != leader.node_id, "a new leader"
            )
        finally:
            leader.resume()
        self._whole()

    def kill_follower(self) -> None:
        info = self.cluster.partition("r3", 0)
        follower = self.cluster.node(info["isr"][-1])
        follower.kill()
        poll(
            lambda: follower.node_id not in self.cluster.partition("r3", 0)["isr"],
            "the follower out of the ISR",
        )
        follower.start()
        self._whole()

    def restart_etcd(self) -> None:
        self.cluster.etcd.kill()
        time.sleep(0.5)  # the outage itself: traffic goes on meanwhile
        self.cluster.etcd.start()
        self._whole()

    def cut_leader_from_etcd(self) -> None:
        """The leader's etcd link black-holed past its lease: it is replaced, and its writes
        are fenced off by the followers until it learns it."""
        leader = self._leader()
        proxy = self.proxies[leader.index]
        proxy.blackhole()
        try:
            poll(
                lambda: self.cluster.partition("r3", 0)["leader"] != leader.node_id, "a new leader"
            )
        finally:
            proxy.heal()
        self._whole()

    def isolate_follower(self) -> None:
        """A follower's links cut both ways (etcd, and its peers' replication to it): the
        leader's writes to it stall until it gives up on it, then go on without it; healed,
        it catches up and rejoins."""
        info = self.cluster.partition("r3", 0)
        follower = self.cluster.node(info["isr"][-1])
        links = (self.proxies[follower.index], follower.rpc_proxy)
        for link in links:
            link.blackhole()
        try:
            poll(
                lambda: follower.node_id not in self.cluster.partition("r3", 0)["isr"],
                "the cut-off follower out of the ISR",
            )
        finally:
            for link in links:
                link.heal()
        self._whole()

    def isolate_leader(self) -> None:
        """The leader's links cut both ways (etcd, its replication to the followers, their
        catch-up reads from it) while producers still reach it: it can acknowledge nothing,
        since no follower gets its writes; a new leader is elected from the followers, and
        once healed the old leader learns it, cuts back what it wrote alone and catches up."""
        leader = self._leader()
        pid = leader.process.process.pid
        links = [self.proxies[leader.index], leader.rpc_proxy]
        for link in links:
            link.blackhole()
        peers = [node.rpc_proxy for node in self.cluster.nodes if node is not leader]
        for proxy in peers:
            proxy.blackhole_from(pid)
        try:
            poll(
                lambda: self.cluster.partition("r3", 0)["leader"] != leader.node_id, "a new leader"
            )
        finally:
            for link in links + peers:
                link.heal()
        self._whole()

    def replace_follower_disk(self) -> None:
        """A follower killed and started again inside its lease on an empty data directory:
        it leaves the ISR at once, copies the log from the leader's start, and joins."""
        info = self.cluster.partition("r3", 0)
        follower = self.cluster.node(info["isr"][-1])
        replace_disk(self.cluster, follower)
        self._whole()

    def replace_leader_disk(self) -> None:
        """The same on the leader: a follower that holds everything leads at once."""
        leader = self._leader()
        replace_disk(self.cluster, leader)
        poll(lambda: self.cluster.node_leading("r3", 0) not in (None, leader), "a new leader")
        self._whole()

    def fill_leader_disk(self) -> None:
        """The leader's disk fills: it refuses what it cannot store, hands the partition to a
        follower, leaves the ISR and comes back once space returns."""
        leader = self._leader()
        leader.disk.fill()
        try:
            poll(
                lambda: self.cluster.partition("r3", 0)["leader"] != leader.node_id, "a new leader"
            )
        finally:
            leader.disk.free()
        self._whole()

    def run_retention(self) -> None:
        """Retention (`/topic/greedyclean`) on every replica while the topics take writes and
        are consumed: whatever was consumed goes, nothing else."""
        for topic in TOPICS:
            for node_id in self.cluster.partition(topic, 0)["isr"]:
                node = self.cluster.node(node_id)
                reply = node.http("POST", f"/topic/greedyclean?topic={topic}&partition=0")
                assert reply.status == 200, reply

    ALL = (
        "kill_leader",
        "freeze_leader",
        "kill_follower",
        "restart_etcd",
        "cut_leader_from_etcd",
        "isolate_follower",
        "isolate_leader",
        "run_retention",
        "replace_follower_disk",
        "replace_leader_disk",
        "fill_leader_disk",
    )
    # The faults that replace r3's leader.
    LEADER_MOVES = ("kill_leader", "freeze_leader", "cut_leader_from_etcd", "isolate_leader")


@pytest.fixture
def chaos_cluster(tmp_path, etcd_server):
    proxies = {index: BlackholeProxy(("127.0.0.1", etcd_server.client_port)) for index in range(3)}
    etcd_urls = {index: f"http://{proxy.address}" for index, proxy in proxies.items()}
    with LocalCluster(
        tmp_path,
        etcd_server,
        # Segments of a few dozen messages, so retention has whole ones to remove.
        nsqd_args=("-sync-every=1", "-max-bytes-per-file=4096"),
        etcd_urls=etcd_urls,
        rpc_proxies=True,
        disks={index: "16m" for index in range(3)},
    ) as cluster:
        for topic, replicas in TOPICS.items():
            cluster.create_topic(topic, 1, replicas)
            leader = cluster.node_leading(topic, 0)
            reply = leader.http("POST", f"/channel/create?topic={topic}&channel=c&partition=0")
            assert reply.status == 200, reply
        yield cluster, Faults(cluster, proxies)
    for proxy in proxies.values():
        proxy.close()


def run_chaos(
    cluster, faults: Faults, rounds: int, names: tuple[str, ...] = Faults.ALL
) -> tuple[dict, list[str]]:
    """`rounds` of the faults `names` under the workload; the checker's figures, and r3's
    leader after each fault."""
    workload = Workload(cluster)
    leaders = []
    try:
        for _ in range(rounds):
            for name in names:
                getattr(faults, name)()
                leaders.append(cluster.partition("r3", 0)["leader"])
        return settle_and_check(cluster, workload), leaders
    finally:
        workload.stop()


def test_chaos(chaos_cluster):
    cluster, faults = chaos_cluster
    figures, _leaders = run_chaos(cluster, faults, rounds=1)
    print("chaos:", json.dumps(figures))
    for topic, figure in figures.items():
        assert figure["acknowledged"] > 100, (topic, figure)
        assert figure["stored_duplicates"] == 0, (topic, figure)


@pytest.mark.slow
def test_chaos_long(chaos_cluster):
    cluster, faults = chaos_cluster
    figures, _leaders = run_chaos(cluster, faults, rounds=8)
    print("chaos (long):", json.dumps(figures))
    for topic, figure in figures.items():
        assert figure["stored_duplicates"] == 0, (topic, figure)


def test_leader_failovers_lose_nothing_and_store_nothing_twice(chaos_cluster):
    """The smart producers retry through 8 replacements of r3's leader (killed, frozen past
    its lease, cut from etcd, cut from everything, twice each): every acknowledged message is
    consumed and no body is stored twice in either topic's log. Twenty in the slow run."""
    check_leader_failovers(chaos_cluster, rounds=2)


@pytest.mark.slow
def test_twenty_leader_failovers_lose_nothing_and_store_nothing_twice(chaos_cluster):
    check_leader_failovers(chaos_cluster, rounds=5)


def check_leader_failovers(chaos_cluster, rounds: int) -> None:
    cluster, faults = chaos_cluster
    first = cluster.partition("r3", 0)["leader"]
    figures, leaders = run_chaos(cluster, faults, rounds=rounds, names=Faults.LEADER_MOVES)
    print(f"{len(leaders)} failovers:", json.dumps(figures), leaders)
    # Each fault left r3 led by another node than before it.
    assert len(leaders) == rounds * len(Faults.LEADER_MOVES)
    assert all(
        before != after for before, after in zip([first, *leaders[:-1]], leaders, strict=True)
    ), leaders
    for topic, figure in figures.items():
        assert figure["acknowledged"] > 200, (topic, figure)
        assert figure["lost"] == 0 and figure["stored_duplicates"] == 0, (topic, figure)
