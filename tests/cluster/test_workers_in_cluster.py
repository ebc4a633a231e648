"""A cluster node on every core (docs/design.md §15, "Workers in a cluster"): with `--workers`
each worker holds the node's partitions it owns, replicates them and pushes their cursors; a
peer's replication connection moves to the worker owning the partition its first request
names, or (TLS, or a peer with another worker count) each request is answered by that worker
over a link of this node's own. The node keeps one identity and one lease (worker 0's), and
answers `/stats`, `/cluster/partitions` and `/coordinator/stats` for all of its workers.

`make test-cluster-workers` runs every suite that runs a cluster with `-workers=2` on every
node; these tests keep the combination in the default suite."""

import json
import os
import signal

from nsqpy.nsqd.worker import WORKER_ENVIRONMENT, owner_of
from tests.cluster.aging import (
    AGED_NSQD_ARGS,
    age_topic,
    log_start,
    poll_back_in_isr,
    publish_batch,
    replace_disk,
)
from tests.cluster.cluster_tls import cluster_tls_flags
from tests.cluster.local_cluster import LocalCluster
from tests.cluster.traffic import Traffic, check_replicas_identical, drain
from tests.support.polling import poll

PARTITIONS = 4


def test_partitions_hash_to_both_workers():
    """The topic these tests use has partitions on each of two workers, so both the moved
    connections and the links between workers carry its replication."""
    assert {owner_of("t", partition, 2) for partition in range(PARTITIONS)} == {0, 1}
    assert {owner_of("t", partition, 3) for partition in range(PARTITIONS)} == {0, 1, 2}


def test_nodes_on_two_workers_replicate_fail_over_and_lose_nothing(tmp_path, etcd_server):
    """Three nodes of two workers each, a topic of 4 partitions on 3 replicas under smart
    producers and a consumer: a leader node is killed (`kill -9`: its workers die with it) and
    started again, worker 0 of another node (the one holding the node's lease) is killed and
    started again by its supervisor, and worker 1 of the third is frozen (SIGSTOP), which its
    supervisor kills past the node's TTL and starts again. Every acknowledged message is
    consumed, and every replica of every partition is its leader's log byte for byte."""
    with LocalCluster(tmp_path, etcd_server, nsqd_args=("-workers=2", "-sync-every=1")) as cluster:
        cluster.create_writable_topic("t", PARTITIONS, 3)
        node = cluster.nodes[0]
        # One node's view holds every partition, whichever worker holds it.
        reply = node.http("GET", "/stats?format=json&topic=t")
        held = sorted(int(entry["topic_partition"]) for entry in json.loads(reply.body)["topics"])
        assert held == list(range(PARTITIONS))
        reports = json.loads(node.http("GET", "/cluster/partitions").body)
        assert reports["node"] == node.node_id
        assert [entry["partition"] for entry in reports["partitions"]] == list(range(PARTITIONS))
        coordinator = json.loads(node.http("GET", "/coordinator/stats?topic=t").body)
        assert [entry["partition"] for entry in coordinator["topic_coord_stats"]] == list(
            range(PARTITIONS)
        )
        traffic = Traffic(cluster, "t")
        try:
            traffic.wait_acked(200)
            leader = cluster.node_leading("t", 0)
            leader.kill()
            poll(
                lambda: cluster.partition("t", 0)["leader"] != leader.node_id,
                lambda: f"t/0 led by another node\n{cluster.describe()}",
            )
            traffic.wait_acked(len(traffic.acked) + 200)
            leader.start()
            other = next(node for node in cluster.nodes if node is not leader)
            # Worker 0: the one holding the node's registration and lease.
            (worker,) = [pid for pid in other.worker_pids() if worker_index(pid) == 0]
            os.kill(worker, signal.SIGKILL)
            traffic.wait_acked(len(traffic.acked) + 200)
            poll(lambda: len(other.worker_pids()) == 2, "the killed worker started again")
            # A worker that freezes (not worker 0, so the lease lives on): its supervisor
            # kills it once it was silent past the node's TTL, and starts it again.
            third = next(node for node in cluster.nodes if node not in (leader, other))
            (frozen,) = [pid for pid in third.worker_pids() if worker_index(pid) == 1]
            os.kill(frozen, signal.SIGSTOP)
            poll(
                lambda: frozen not in third.worker_pids() and len(third.worker_pids()) == 2,
                "the frozen worker killed and started again",
            )
            assert "WORKER(1): its event loop stood still for " in third.process.log
            traffic.wait_acked(len(traffic.acked) + 200)
            traffic.stop_producing()
            traffic.check_all_consumed()
        finally:
            traffic.close()
        check_replicas_identical(cluster, "t", PARTITIONS)


def worker_index(pid: int) -> int:
    """Which of its node's workers a process is (`NSQPY_WORKER`: "index,count,...")."""
    with open(f"/proc/{pid}/environ", "rb") as environment:
        for entry in environment.read().split(b"\0"):
            if entry.startswith(WORKER_ENVIRONMENT.encode() + b"="):
                return int(entry.split(b"=", 1)[1].split(b",")[0])
    raise AssertionError(f"process {pid} is not a worker")


def test_nodes_of_different_worker_counts_over_tls_replicate_every_partition(
    tmp_path, etcd_server, cluster_ca
):
    """One node in one process, one of two workers, one of three, over the cluster's mutual
    TLS: no connection can move, and no two nodes share how partitions map to workers, so
    each request reaches its partition's worker over the node's own links. Publishes to every
    partition reach every replica byte for byte, and a clean stop of the three-worker node
    hands what it leads over first."""
    with LocalCluster(
        tmp_path,
        etcd_server,
        nsqd_args=("-sync-every=1", *cluster_tls_flags(cluster_ca)),
        node_args={1: ("-workers=2",), 2: ("-workers=3",)},
    ) as cluster:
        cluster.create_writable_topic("t", PARTITIONS, 3)
        traffic = Traffic(cluster, "t")
        try:
            traffic.wait_acked(300)
            stopping = cluster.nodes[2]
            stopping.stop()
            assert "CLUSTER: leaving the cluster: " in stopping.process.log
            for partition in range(PARTITIONS):
                assert cluster.partition("t", partition)["leader"] != stopping.node_id
            traffic.wait_acked(len(traffic.acked) + 100)
            stopping.start()
            traffic.stop_producing()
            traffic.check_all_consumed()
        finally:
            traffic.close()
        check_replicas_identical(cluster, "t", PARTITIONS)


def test_a_replaced_disk_under_two_workers_copies_both_workers_aged_partitions(
    tmp_path, etcd_server
):
    """Nodes of two workers, a topic of 2 partitions (one on each worker) whose retention has
    run on every replica. A follower node's disk is replaced (`kill -9`, its data directory
    emptied, started again): both of its workers come back in the one new incarnation, each
    starts its partition's log over at the leader's aged start and rejoins the ISR, and every
    acknowledged message is there, on every replica byte for byte."""
    assert {owner_of("t", partition, 2) for partition in range(2)} == {0, 1}
    with LocalCluster(tmp_path, etcd_server, nsqd_args=("-workers=2", *AGED_NSQD_ARGS)) as cluster:
        cluster.create_writable_topic("t", 2, 2)
        starts = {partition: age_topic(cluster, "t", partition) for partition in range(2)}
        acked: dict[int, set[bytes]] = {}
        for partition in range(2):
            leader = cluster.node_leading("t", partition)
            acked[partition] = publish_batch(leader, "t", f"kept{partition}", 100, partition)
        follower_ids = set(cluster.partition("t", 0)["isr"]) & set(cluster.partition("t", 1)["isr"])
        leaders = {cluster.partition("t", partition)["leader"] for partition in range(2)}
        follower = cluster.node(
            next(iter(follower_ids - leaders), None) or next(iter(follower_ids))
        )
        replace_disk(cluster, follower)
        for partition in range(2):
            poll_back_in_isr(cluster, follower, "t", partition)
            if cluster.partition("t", partition)["leader"] != follower.node_id:
                assert log_start(follower, "t", partition) == starts[partition]
        for partition in range(2):
            leader = cluster.node_leading("t", partition)
            acked[partition] |= publish_batch(leader, "t", f"after{partition}", 20, partition)
            assert acked[partition] <= drain(leader, "t", acked[partition], partition=partition)
        check_replicas_identical(cluster, "t", 2)
