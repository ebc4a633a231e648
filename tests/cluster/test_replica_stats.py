"""The replica state of cluster partitions in nsqd's `/stats` (JSON and text) and `/metrics`,
on a cluster of real processes (etcd, one nsqlookupd, three nsqds): every node that holds a
partition reports its role, the leader, the ISR, the catch-up nodes and the write epoch as the
master nsqlookupd wrote them, and a follower that dies makes its partitions under-replicated
once the master drops it from the ISR."""

import json
import re

import pytest

from nsqpy.nsqd.metrics import render_metrics
from nsqpy.nsqd.partition_replica import UNKNOWN_REPLICA, PartitionReplica
from nsqpy.nsqd.stats import gather, memory_stats, text_report
from tests.cluster.local_cluster import LocalCluster
from tests.support.polling import poll


@pytest.fixture
def cluster(tmp_path, etcd_server):
    with LocalCluster(tmp_path, etcd_server) as running:
        running.create_topic("three", 1, 3)
        running.create_topic("two", 1, 2)
        yield running


def stats(node, topic: str) -> dict | None:
    """The node's /stats entry for partition 0 of `topic`; None when it holds none."""
    reply = node.http("GET", f"/stats?format=json&topic={topic}&include_mem=false")
    assert reply.status == 200, reply
    # Go answers `"topics": null` for a topic it does not have.
    topics = json.loads(reply.body)["topics"]
    if topics is None:
        return None
    [entry] = topics
    return entry


def text_stats(node) -> str:
    reply = node.http("GET", "/stats?include_mem=false")
    assert reply.status == 200, reply
    return reply.body.decode()


def metrics(node) -> dict[str, float]:
    """`/metrics`' `nsq_partition_*` samples, by series (name and labels)."""
    reply = node.http("GET", "/metrics")
    assert reply.status == 200, reply
    samples = {}
    for line in reply.body.decode().splitlines():
        if line.startswith("nsq_partition_"):
            series, _, value = line.rpartition(" ")
            samples[series] = float(value)
    return samples


def replica_line(node, topic: str) -> str:
    """The line under the topic's line in the node's text /stats."""
    lines = text_stats(node).splitlines()
    index = next(i for i, line in enumerate(lines) if re.match(rf"^ {{3}}\[{topic} +\]", line))
    return lines[index + 1]


def address(node) -> str:
    return f"127.0.0.1:{node.tcp_port}"


def test_every_replica_reports_the_partitions_state(cluster):
    for topic, replicas in (("three", 3), ("two", 2)):
        info = cluster.partition(topic, 0)
        leader = cluster.node(info["leader"])
        holders = {cluster.node(node_id) for node_id in info["isr"]}
        assert len(holders) == replicas
        for node in cluster.nodes:
            entry = stats(node, topic)
            if node not in holders:
                assert entry is None
                continue
            role = "leader" if node is leader else "follower"
            assert {key: entry[key] for key in entry if key.startswith("cluster_")} == {
                "cluster_role": role,
                "cluster_leader": address(leader),
                "cluster_isr": info["isr"],
                "cluster_catchup": [],
                "cluster_write_epoch": info["write_epoch"],
                "cluster_writable": node is leader,
                "cluster_replicas": replicas,
            }
            assert entry["under_replicated"] is False
            # Youzan's: the leader alone writes, and `leaderOnly` keeps only what it writes.
            assert entry["is_leader"] is (node is leader)
            reply = node.http("GET", f"/stats?format=json&topic={topic}&leaderOnly=true")
            assert len(json.loads(reply.body)["topics"]) == (node is leader)
            # After the keys Go and Youzan have, in this order.
            assert list(entry)[-9:-8] == ["log_end_count"]
            assert replica_line(node, topic) == (
                f"      partition: 0 role: {role} leader: {address(leader)}"
                f" isr: {','.join(info['isr'])} catchup: - write-epoch: {info['write_epoch']}"
                f" writable: {str(node is leader).lower()} replicas: {replicas}/{replicas}"
            )
            labels = f'{{topic="{topic}",partition="0"}}'
            samples = metrics(node)
            assert {
                name: samples[f"nsq_partition_{name}{labels}"]
                for name in ("isr_size", "replicas", "write_epoch", "is_leader", "under_replicated")
            } == {
                "isr_size": replicas,
                "replicas": replicas,
                "write_epoch": info["write_epoch"],
                "is_leader": int(node is leader),
                "under_replicated": 0,
            }


def test_coordinator_stats_give_each_partitions_isr(cluster):
    """Youzan's `/coordinator/stats?topic=`: each node holding the topic's partition names its
    ISR; without a topic, no partition; a node's `partition` that is not a number is refused."""
    info = cluster.partition("two", 0)
    for node in cluster.nodes:
        reply = node.http("GET", "/coordinator/stats?topic=two&partition=0")
        assert reply.status == 200, reply
        entries = json.loads(reply.body)["topic_coord_stats"]
        if node.node_id not in info["isr"]:
            assert entries == []
            continue
        assert entries == [
            {
                "node": node.node_id,
                "name": "two",
                "partition": 0,
                "isr_stats": [{"hostname": "", "node_id": n} for n in info["isr"]],
                "catchup_stats": [],
            }
        ]
        everything = json.loads(node.http("GET", "/coordinator/stats").body)
        assert everything == {"rpc_stats": None, "topic_coord_stats": []}
        bad = node.http("GET", "/coordinator/stats?topic=two&partition=x")
        assert (bad.status, json.loads(bad.body)) == (400, {"message": "INVALID_REQUEST"})


def test_cleanunused_removes_the_logs_of_partitions_the_cluster_gives_elsewhere(cluster):
    """Youzan's `/topic/cleanunused`: files of partition 0 of `two` left on the node that does
    not hold it, and of a topic the cluster does not have, stay through a dry run and are
    removed by `dryrun=false`; the nodes that hold `two` keep theirs."""
    info = cluster.partition("two", 0)
    (outsider,) = [node for node in cluster.nodes if node.node_id not in info["isr"]]
    leftovers = [
        outsider.data_path / "two" / "two_0.commit.log",
        outsider.data_path / "two" / "two-0.diskqueue.000000.dat",
        outsider.data_path / "ghost" / "ghost_3.commit.log",
    ]
    for path in leftovers:
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(b"left over")
    reply = outsider.http("POST", "/topic/cleanunused?checkall=true")
    assert (reply.status, reply.body) == (200, b"")
    assert all(path.exists() for path in leftovers)
    reply = outsider.http("POST", "/topic/cleanunused?topic=two&dryrun=false")
    assert reply.status == 200, reply
    assert [path.exists() for path in leftovers] == [False, False, True]
    assert outsider.http("POST", "/topic/cleanunused?checkall=true&dryrun=false").status == 200
    assert not leftovers[2].exists()
    for node in cluster.nodes:
        if node is not outsider:
            reply = node.http("POST", "/topic/cleanunused?checkall=true&dryrun=false")
            assert reply.status == 200, reply
            assert stats(node, "two") is not None  # its own partition kept


def test_metrics_name_each_family_once(cluster):
    # A node that holds both partitions ("three" is on every node).
    node = cluster.node(cluster.partition("two", 0)["leader"])
    body = node.http("GET", "/metrics").body.decode()
    for name in ("isr_size", "replicas", "write_epoch", "is_leader", "under_replicated"):
        assert body.count(f"# TYPE nsq_partition_{name} gauge\n") == 1
        # One series per partition on this node: "three" and "two".
        assert len(re.findall(rf"^nsq_partition_{name}{{", body, re.MULTILINE)) == 2


def test_a_topic_outside_the_cluster_reports_no_replicas(cluster):
    node = cluster.nodes[0]
    reply = node.http("POST", "/topic/create?topic=plain")
    assert reply.status == 200, reply
    entry = stats(node, "plain")
    assert not [key for key in entry if key.startswith("cluster_") or key == "under_replicated"]
    assert not replica_line(node, "plain").startswith("      partition:")
    assert 'topic="plain"' not in "".join(metrics(node))


def test_a_dead_follower_leaves_its_partitions_under_replicated(cluster):
    two = cluster.partition("two", 0)
    three = cluster.partition("three", 0)
    # The placement spreads the two leaders over two nodes; the third follows both.
    assert two["leader"] != three["leader"]
    [victim_id] = [n for n in two["isr"] if n not in (two["leader"], three["leader"])]
    victim = cluster.node(victim_id)
    leaders = {"two": cluster.node(two["leader"]), "three": cluster.node(three["leader"])}
    survivor = cluster.node(next(n for n in three["isr"] if n not in (victim_id, three["leader"])))
    victim.kill()

    # The node's lease runs out (--cluster-node-ttl), then the master drops it from the ISRs.
    poll(
        lambda: all(stats(leaders[topic], topic)["under_replicated"] for topic in leaders),
        "the leaders reporting their partitions under-replicated",
    )
    poll(
        lambda: stats(survivor, "three")["under_replicated"],
        "the other follower of three reporting it under-replicated",
    )
    for topic, isr, writable in (
        # One of two replicas is no majority: the leader refuses publishes.
        ("two", [leaders["two"].node_id], False),
        ("three", [leaders["three"].node_id, survivor.node_id], True),
    ):
        leader = leaders[topic]
        entry = stats(leader, topic)
        assert entry["cluster_role"] == "leader"
        assert sorted(entry["cluster_isr"]) == sorted(isr)
        assert entry["cluster_catchup"] == [victim.node_id]
        assert entry["cluster_writable"] is writable
        assert entry["cluster_isr"] == cluster.partition(topic, 0)["isr"]
        line = replica_line(leader, topic)
        assert f" catchup: {victim.node_id} " in line
        assert line.endswith(f" replicas: {len(isr)}/{entry['cluster_replicas']} UNDER-REPLICATED")
        samples = metrics(leader)
        assert samples[f'nsq_partition_under_replicated{{topic="{topic}",partition="0"}}'] == 1
        assert samples[f'nsq_partition_isr_size{{topic="{topic}",partition="0"}}'] == len(isr)
        assert samples[f'nsq_partition_is_leader{{topic="{topic}",partition="0"}}'] == 1
    assert metrics(survivor)['nsq_partition_is_leader{topic="three",partition="0"}'] == 0


async def test_a_partition_not_yet_placed_is_not_called_under_replicated(nsqd):
    """A partition found on disk waits for etcd to say who holds it (UNKNOWN_REPLICA): it
    reports no replicas and no leader, and is not flagged on a guess."""
    nsqd.create_partition(
        "t",
        0,
        partitioned=True,
        replication=lambda topic: PartitionReplica(nsqd.cluster, topic, UNKNOWN_REPLICA),
    )
    topics, producers = gather(nsqd, "t", "", include_clients=False)
    [entry] = topics
    assert {key: entry[key] for key in entry if key.startswith("cluster_")} == {
        "cluster_role": "none",
        "cluster_leader": "",
        "cluster_isr": [],
        "cluster_catchup": [],
        "cluster_write_epoch": -1,
        "cluster_writable": False,
        "cluster_replicas": 0,
    }
    assert entry["under_replicated"] is False
    report = text_report(nsqd, topics, producers, memory_stats(), "OK")
    assert (
        "      partition: 0 role: none leader: - isr: - catchup: - write-epoch: -1"
        " writable: false replicas: 0/0\n"
    ) in report
    assert 'nsq_partition_under_replicated{topic="t",partition="0"} 0\n' in render_metrics(nsqd)


def test_cluster_stats_give_each_isr_members_http_address(cluster):
    info = cluster.partition("three", 0)
    members = [cluster.node(node_id) for node_id in info["isr"]]
    assert info["isr_http"] == [f"127.0.0.1:{node.http_port}" for node in members]
