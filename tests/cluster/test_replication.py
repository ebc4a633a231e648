"""Partition replicas on a cluster of real processes (docs/design.md §14): etcd, one
nsqlookupd and three nsqds. A topic created with `replicator=3` has its partitions' replicas
on distinct nodes; the leader takes the publishes and every follower writes each group, byte
for byte; a follower refuses publishes and consumers with `E_FAILED_ON_NOT_LEADER`."""

import json

import pytest

from nsqpy.common.command import encode_command, encode_fin, encode_rdy
from nsqpy.common.frame import FRAME_TYPE_ERROR
from tests.cluster.local_cluster import LocalCluster
from tests.harness import V2Connection
from tests.support.polling import poll


@pytest.fixture
def cluster(tmp_path, etcd_server):
    with LocalCluster(tmp_path, etcd_server) as running:
        yield running


def youzan_pub(port: int, topic: str, partition: int, body: bytes) -> bytes:
    connection = V2Connection(port)
    try:
        connection.send(encode_command(b"PUB", topic.encode(), b"%d" % partition, body=body))
        frame = connection.read_response()
        return frame.data if frame.frame_type != FRAME_TYPE_ERROR else b"ERROR " + frame.data
    finally:
        connection.close()


def log_files(node, topic: str) -> dict[str, bytes]:
    directory = node.data_path / topic
    return {
        path.name: path.read_bytes()
        for path in sorted(directory.iterdir())
        if path.name.endswith(".commit.log") or ".diskqueue.0" in path.name
    }


def offsets(node, topic: str, partition: int) -> dict:
    reply = node.http("GET", f"/partition/offsets?topic={topic}")
    assert reply.status == 200, reply
    for entry in json.loads(reply.body)["partitions"]:
        if entry["partition"] == partition:
            return entry
    raise AssertionError(f"no partition {partition} on {node.node_id}")


def test_every_replica_has_the_leaders_log_byte_for_byte(cluster):
    cluster.create_topic("t", 1, 3)
    info = cluster.partition("t", 0)
    assert sorted(info["isr"]) == sorted(node.node_id for node in cluster.nodes)
    leader = cluster.node_leading("t", 0)
    followers = [node for node in cluster.nodes if node is not leader]
    for i in range(50):
        assert youzan_pub(leader.tcp_port, "t", 0, b"message %d" % i) == b"OK"
    end = offsets(leader, "t", 0)["end"]
    assert end["count"] == 50
    for node in followers:
        assert offsets(node, "t", 0)["end"] == end
        assert offsets(node, "t", 0)["role"] == "follower"
    expected = log_files(leader, "t")
    assert expected
    for node in followers:
        assert log_files(node, "t") == expected


def test_a_follower_refuses_publishes_and_consumers(cluster):
    cluster.create_topic("t", 1, 2)
    info = cluster.partition("t", 0)
    follower = cluster.node(info["isr"][1])
    assert youzan_pub(follower.tcp_port, "t", 0, b"x") == b"ERROR E_FAILED_ON_NOT_LEADER "
    connection = V2Connection(follower.tcp_port)
    try:
        connection.send(b"SUB t c 0\n")
        frame = connection.read_response()
        assert (frame.frame_type, frame.data) == (FRAME_TYPE_ERROR, b"E_FAILED_ON_NOT_LEADER ")
        assert connection.is_closed_by_peer()
    finally:
        connection.close()
    # nsqlookupd lists the leader only.
    leader = cluster.node_leading("t", 0)
    reply = leader.http("POST", "/channel/create?topic=t&channel=c&partition=0")
    assert reply.status == 200, reply

    def writers():
        reply = cluster.lookupd_http("GET", "/lookup?topic=t&access=w")
        return reply.status == 200 and json.loads(reply.body)["partitions"]

    partitions = poll(writers, "t writable in nsqlookupd")
    assert partitions["0"]["tcp_port"] == leader.tcp_port


def test_a_consumer_of_the_leader_gets_what_was_published(cluster):
    cluster.create_topic("t", 1, 3)
    leader = cluster.node_leading("t", 0)
    consumer = V2Connection(leader.tcp_port)
    try:
        consumer.send(b"SUB t c 0\n")
        assert consumer.read_response().data == b"OK"
        consumer.send(encode_rdy(10))
        for i in range(5):
            assert youzan_pub(leader.tcp_port, "t", 0, b"m%d" % i) == b"OK"
        messages = consumer.read_messages(5)
        assert [m.body for m in messages] == [b"m%d" % i for i in range(5)]
        for message in messages:
            consumer.send(encode_fin(message.id))
    finally:
        consumer.close()


def test_a_follower_syncs_every_sync_every_messages_not_only_at_the_sync_timeout(
    tmp_path, etcd_server
):
    """`--sync-every=1` on a follower: each group it takes from its leader is fsynced (its
    writer metadata, written by the sync, says so) soon after, not at the next
    `--sync-timeout` (a minute here). Its answer to the leader does not wait for it."""
    with LocalCluster(
        tmp_path, etcd_server, nsqd_args=("-sync-every=1", "-sync-timeout=60s")
    ) as cluster:
        cluster.create_topic("t", 1, 3)
        leader = cluster.node_leading("t", 0)
        followers = [node for node in cluster.nodes if node is not leader]
        for count in (1, 2, 3):
            assert youzan_pub(leader.tcp_port, "t", 0, b"message %d" % count) == b"OK"
            for node in followers:
                meta = node.data_path / "t" / "t-0.diskqueue.meta.writer.dat"
                poll(
                    lambda m=meta, c=count: (
                        m.exists() and m.read_bytes().split(b"\n")[0] == b"%d" % c
                    ),
                    f"{node.node_id} synced {count} messages",
                )
