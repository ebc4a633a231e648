"""Full disks in a cluster (docs/design.md §14, "The disk"): every nsqd's data directory is a
small tmpfs of its own, filled under smart-client load and freed again. No daemon exits; a
node whose disk refuses writes says so on `/ping`; a follower leaves the ISR, a leader hands
its partition to a follower that can write; both come back by themselves once space returns,
and nothing acknowledged is lost."""

import pytest

from tests.cluster.aging import AGED_NSQD_ARGS
from tests.cluster.local_cluster import LocalCluster
from tests.cluster.traffic import Traffic, check_replicas_identical
from tests.support.polling import poll


@pytest.fixture
def cluster(tmp_path, etcd_server):
    with LocalCluster(
        tmp_path,
        etcd_server,
        nsqd_args=AGED_NSQD_ARGS,
        disks={index: "8m" for index in range(3)},
        lookupd_args=("-balance-interval=off",),
    ) as running:
        yield running


def _ping(node) -> tuple[int, bytes]:
    reply = node.http("GET", "/ping")
    return reply.status, reply.body


def _said_full(node) -> bool:
    status, body = _ping(node)
    return status == 500 and b"no space left on device" in body.lower()


@pytest.mark.parametrize("role", ["follower", "leader"])
def test_a_full_disk_stops_no_daemon_and_its_replica_comes_back_when_space_returns(cluster, role):
    cluster.create_writable_topic("t", 1, 3)
    entry = cluster.partition("t", 0)
    leader = cluster.node(entry["leader"])
    victim = (
        leader
        if role == "leader"
        else cluster.node(next(node for node in entry["isr"] if node != entry["leader"]))
    )
    traffic = Traffic(cluster, "t")
    try:
        traffic.wait_acked(200)
        victim.disk.fill()
        # Health is the last write's: an append that fits in the slack of a file's last page
        # succeeds on the full disk, and /ping says OK until the next write fails. One answer
        # gives the status and the reason.
        poll(
            lambda: _said_full(victim),
            lambda: f"/ping NOK on the node whose disk is full\n{cluster.describe()}",
        )
        poll(
            lambda: victim.node_id not in cluster.partition("t", 0)["isr"],
            lambda: f"the full disk's replica out of the ISR\n{cluster.describe()}",
        )
        if role == "leader":
            assert cluster.partition("t", 0)["leader"] != victim.node_id
        # Writes go on without it.
        traffic.wait_acked(len(traffic.acked) + 200)
        assert victim.running
        victim.disk.free()
        poll(
            lambda: victim.node_id in cluster.partition("t", 0)["isr"],
            lambda: f"the freed replica back in the ISR\n{cluster.describe()}",
            timeout=30,
        )
        poll(lambda: _ping(victim) == (200, b"OK"), "/ping OK again")
        traffic.wait_acked(len(traffic.acked) + 100)
        traffic.check_all_consumed()
    finally:
        traffic.close()
    assert all(node.running for node in cluster.nodes)
    check_replicas_identical(cluster, "t", 1)
