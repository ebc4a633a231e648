"""Old data and lost disks for the cluster tests: a topic whose retention has already run (its
log starts past offset 0 on every replica), a node whose data directory is replaced, and the
check that two replicas hold the same log from the later of their starts on.

A topic is aged by publishing messages of about 1 KiB into segments of 32 KiB
(`AGED_NSQD_ARGS`), consuming them all on channel `c`, and running `/topic/greedyclean` on every
replica: every consumed segment goes, so the log starts where the first unconsumed one does.
"""

import json
import shutil

from nsqpy.common.command import encode_mpub
from nsqpy.partition_log.view import LogView
from tests.cluster.local_cluster import LocalCluster, Node
from tests.cluster.traffic import drain
from tests.harness import V2Connection
from tests.support.polling import poll

# Small segments, so retention has whole segments to remove after a few hundred messages.
AGED_NSQD_ARGS = ("-max-bytes-per-file=32768",)
BODY_SIZE = 1000


def publish_batch(node: Node, topic: str, label: str, count: int, partition: int = 0) -> set[bytes]:
    """MPUB `count` bodies of about 1 KiB to the partition's leader `node`, 50 at a time,
    each batch acknowledged; the bodies."""
    bodies = [(b"%s %06d " % (label.encode(), i)).ljust(BODY_SIZE, b".") for i in range(count)]
    connection = V2Connection(node.tcp_port, timeout=10)
    try:
        for at in range(0, count, 50):
            batch = bodies[at : at + 50]
            connection.send(encode_mpub(b"%s %d" % (topic.encode(), partition), batch))
            frame = connection.read_response()
            assert frame.data == b"OK", (frame, node.node_id)
    finally:
        connection.close()
    return set(bodies)


def log_start(node: Node, topic: str, partition: int = 0) -> int:
    """Where the partition's log starts on `node`, as its `/partition/offsets` says."""
    reply = node.http("GET", f"/partition/offsets?topic={topic}")
    for entry in json.loads(reply.body)["partitions"]:
        if entry["partition"] == partition:
            return int(entry["start"]["offset"])
    raise AssertionError(f"{node.node_id} holds no {topic}/{partition}")


def age_topic(cluster: LocalCluster, topic: str, partition: int = 0, count: int = 300) -> int:
    """Publish `count` messages to the partition, consume them all on channel `c`, and run
    retention on every replica; the offset its log starts at afterwards (past 0)."""
    leader = poll(lambda: cluster.node_leading(topic, partition), f"a leader of {topic}")
    bodies = publish_batch(leader, topic, "aged", count, partition)
    drain(leader, topic, bodies, partition=partition)
    holders = [cluster.node(node_id) for node_id in cluster.partition(topic, partition)["isr"]]

    def cleaned() -> int | None:
        starts = set()
        for node in holders:
            reply = node.http("POST", f"/topic/greedyclean?topic={topic}&partition={partition}")
            assert reply.status == 200, reply
            starts.add(log_start(node, topic, partition))
        # The followers clean once the leader's cursor reached them.
        return starts.pop() if len(starts) == 1 and 0 not in starts else None

    return poll(cleaned, f"{topic}/{partition} cleaned on every replica")


def replace_disk(cluster: LocalCluster, node: Node) -> None:
    """`kill -9` the node, empty its data directory (a replaced disk), start it again on the
    same ports and node ID (well within its lease); until the master knows it by its new
    incarnation."""
    node.kill()
    for child in node.data_path.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()
    node.start()
    incarnation = poll(
        lambda: (
            (node.data_path / "nsqd.incarnation").exists()
            and (node.data_path / "nsqd.incarnation").read_text().strip()
        ),
        "the new disk's incarnation",
    )
    poll(
        lambda: any(
            entry["id"] == node.node_id and entry["incarnation"] == incarnation
            for entry in cluster.stats()["nodes"]
        ),
        f"the master knowing {node.node_id} by its new incarnation",
    )


def poll_back_in_isr(cluster: LocalCluster, node: Node, topic: str, partition: int = 0) -> None:
    """Until `node`, after `replace_disk`, is in the partition's ISR in its new incarnation
    (right after the restart the ISR may still list it, as `lost`, until the master acts)."""
    poll(
        lambda: (
            node.node_id in (entry := cluster.partition(topic, partition))["isr"]
            and node.node_id not in entry["lost"]
        ),
        lambda: f"the new disk's replica back in the ISR\n{cluster.describe()}",
        timeout=30,
    )


def zero_a_group(node: Node, topic: str, which: float, partition: int = 0) -> tuple:
    """What a bad disk does to old data: the group `which` of the way into the partition's
    retained log on `node` reads as zeros, its index entry intact; the entry."""
    view = LogView(str(node.data_path), topic, partition)
    try:
        first = view.first_retained
        entry = view.index.entry(first + int((view.index.total - 1 - first) * which))
        segment = [s for s in view.segments if s.start <= entry[3]][-1]
        with open(view.files.segment(segment.number), "r+b") as data:
            data.seek(entry[3] - segment.start)
            data.write(bytes(entry[4]))
        assert [fault.entry for fault in view.faults([view.entry_at("virtual_offset", entry[3])])]
    finally:
        view.close()
    return entry


def corrupt_groups(node: Node, topic: str, partition: int = 0) -> list[tuple]:
    """The index entries of the groups on `node` whose bytes do not hold them."""
    view = LogView(str(node.data_path), topic, partition)
    try:
        return [fault.entry for fault in view.faults()]
    finally:
        view.close()
