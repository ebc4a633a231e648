"""Discovery in a cluster (docs/design.md §14): every nsqlookupd answers `/lookup` from the
registrations and etcd's replica info, lists every nsqlookupd and the master in `/listlookup`;
one master at a time, replaced when it dies."""

import json

import pytest

from tests.cluster.local_cluster import LocalCluster
from tests.support.polling import poll


@pytest.fixture
def cluster(tmp_path, etcd_server):
    with LocalCluster(tmp_path, etcd_server, lookupds=2) as running:
        yield running


def lookup(cluster, topic: str, access: str, index: int = 0):
    reply = cluster.lookupd_http(
        "GET", f"/lookup?topic={topic}&access={access}&metainfo=true", index
    )
    return reply.status, json.loads(reply.body) if reply.body else None


def test_listlookup_names_every_nsqlookupd_and_one_master(cluster):
    ids = {f"127.0.0.1:{ld.port('HTTP')}:{ld.port('TCP')}" for ld in cluster.lookupds}
    for index in range(2):
        answer = poll(
            lambda i=index: (
                (a := json.loads(cluster.lookupd_http("GET", "/listlookup", i).body))
                and {node["ID"] for node in a["lookupdnodes"]} == ids
                and a
            ),
            "both nsqlookupds listed",
        )
        assert answer["lookupdleader"]["ID"] in ids
    masters = [index for index in range(2) if cluster.stats(index)["is_master"]]
    assert len(masters) == 1
    # Only the master places topics.
    other = 1 - masters[0]
    reply = cluster.lookupd_http(
        "POST", "/topic/create?topic=x&partition_num=1&replicator=2", other
    )
    assert (reply.status, json.loads(reply.body)) == (400, {"message": "E_FAILED_ON_NOT_LEADER"})


def test_a_dead_master_is_replaced(cluster):
    master = cluster.master()
    master.kill()
    survivor = next(ld for ld in cluster.lookupds if ld is not master)
    index = cluster.lookupds.index(survivor)
    poll(lambda: cluster.stats(index)["is_master"], "the other nsqlookupd as master")
    reply = cluster.lookupd_http(
        "POST", "/topic/create?topic=after&partition_num=1&replicator=3", index
    )
    assert reply.status == 200, reply


def test_lookup_lists_writable_leaders_and_meta(cluster):
    cluster.create_topic("t", 2, 2)
    for partition in range(2):
        leader = cluster.node_leading("t", partition)
        reply = leader.http("POST", f"/channel/create?topic=t&channel=c&partition={partition}")
        assert reply.status == 200

    def both(index: int, access: str) -> dict | None:
        status, answer = lookup(cluster, "t", access, index)
        return answer if status == 200 and len(answer["partitions"] or {}) == 2 else None

    for index in range(2):
        answer = poll(lambda i=index: both(i, "w"), "both partitions writable")
        assert answer["meta"]["partition_num"] == 2 and answer["meta"]["replica"] == 2
        for partition in range(2):
            leader = cluster.node_leading("t", partition)
            assert answer["partitions"][str(partition)]["tcp_port"] == leader.tcp_port
    # A follower of partition 0 dies: with 1 of 2 replicas partition 0 takes no writes, so
    # writers no longer see it; readers still do.
    info = cluster.partition("t", 0)
    follower = cluster.node(info["isr"][1])
    follower.kill()
    poll(lambda: len(cluster.partition("t", 0)["isr"]) == 1, "the follower out of the ISR")

    def writers_without_0() -> bool:
        status, answer = lookup(cluster, "t", "w")
        return status == 200 and "0" not in (answer["partitions"] or {})

    poll(writers_without_0, "partition 0 gone from access=w")
    status, answer = lookup(cluster, "t", "r")
    assert status == 200 and "0" in answer["partitions"]
