"""What a cluster is given that it must refuse, or survive (docs/design.md §14): topic names
and parameters it cannot serve, control routes called with what the master does not hold, and
metadata in etcd a node cannot apply. No daemon stops; every refusal says what was wrong."""

import json

import pytest

from nsqpy.common.cluster_meta import ClusterKeys, ReplicaInfo, TopicMeta
from nsqpy.common.replication import ERROR, PUT, encode_frame
from tests.cluster.local_cluster import LocalCluster
from tests.cluster.raw_rpc import frames_of, raw_exchange
from tests.cluster.traffic import publish_numbered
from tests.support.polling import poll


@pytest.fixture
def cluster(tmp_path, etcd_server):
    with LocalCluster(tmp_path, etcd_server) as running:
        yield running


def _answer(reply) -> tuple[int, str]:
    return reply.status, json.loads(reply.body).get("message", "")


CREATE_REFUSALS = [
    ("topic=t%23ephemeral&partition_num=1&replicator=2", 400, "INVALID_ARG_TOPIC"),
    ("topic=t&partition_num=1&replicator=2&retention=-1", 400, "INVALID_ARG_TOPIC_RETENTION"),
    (
        "topic=t&partition_num=1&replicator=2&retention=100000",
        400,
        "max retention days allowed exceed",
    ),
    ("topic=t&partition_num=1&replicator=2&syncdisk=-5", 400, "INVALID_ARG_TOPIC_SYNC_DISK"),
    ("topic=t&partition_num=1&replicator=2&syncdisk=x", 400, "INVALID_ARG_TOPIC_SYNC_DISK"),
    ("topic=t&partition_num=1&replicator=2&syncdisk=5000", 400, "max sync every allowed exceed"),
]


def test_topic_create_checks_its_parameters_as_meta_update_does(cluster):
    for query, status, message in CREATE_REFUSALS:
        reply = cluster.master_http("POST", f"/topic/create?{query}")
        assert _answer(reply) == (status, message), query
    assert cluster.partition("t", 0) is None and cluster.partition("t#ephemeral", 0) is None


def test_control_routes_check_what_they_are_given(cluster):
    cluster.create_topic("t", 1, 3)
    entry = cluster.partition("t", 0)
    leader, follower = entry["leader"], entry["isr"][1]
    epoch = entry["epoch"]
    leave = f"/cluster/isr/leave?topic=t&partition=0&node={follower}"
    for target, status, message in [
        (f"{leave}&epoch=-1&leader={leader}", 400, "INVALID_ARG_EPOCH"),
        (f"{leave}&leader={leader}", 400, "MISSING_ARG_EPOCH"),
        (f"{leave}&epoch={epoch}", 400, "MISSING_ARG_LEADER"),
        (f"{leave}&epoch={epoch + 1000}&leader={leader}", 409, "E_STALE_EPOCH"),
        (f"{leave}&epoch={epoch}&leader={follower}", 400, "E_FAILED_ON_NOT_LEADER"),
        (
            "/cluster/isr/leave?topic=t&partition=0&node=garbage&epoch=1&leader=" + leader,
            400,
            "INVALID_ARG_NODE",
        ),
        ("/cluster/leader/unwritable?topic=t&partition=0&node=garbage&epoch=abc", 400, ""),
        (
            f"/cluster/leader/unwritable?topic=t&partition=0&node={follower}&epoch={epoch}",
            400,
            "E_FAILED_ON_NOT_LEADER",
        ),
        (
            f"/cluster/isr/join?topic=t&partition=0&node={follower}&epoch=x",
            400,
            "INVALID_ARG_EPOCH",
        ),
        (
            f"/cluster/isr/join?topic=t&partition=0&node={follower}&epoch={epoch}&leader={leader}",
            400,
            "E_NOT_CATCHUP",
        ),
        (
            "/cluster/isr/leave?topic=t&partition=-1&node=" + follower,
            400,
            "INVALID_ARG_TOPIC_PARTITION",
        ),
    ]:
        reply = cluster.master_http("POST", target)
        got_status, got_message = _answer(reply)
        assert got_status == status, (target, reply)
        assert got_message.split(" ")[0].startswith(message.split(" ")[0]) or not message, (
            target,
            got_message,
        )
    # Nothing was changed by any of them.
    assert cluster.partition("t", 0)["isr"] == entry["isr"]
    assert cluster.partition("t", 0)["epoch"] == epoch


def test_metadata_a_node_cannot_apply_costs_that_partition_only(cluster, etcd_server):
    """A topic a cluster cannot serve (#ephemeral) and a replica info that is not one, put
    into etcd by hand: every node says so once, keeps serving the others, and starts again."""
    cluster.create_writable_topic("good", 1, 2)
    keys = ClusterKeys("NSQMetaData", cluster.cluster_id)
    holders = tuple(node.node_id for node in cluster.nodes[:2])
    meta = TopicMeta(1, 2, magic_code=1).to_json()
    etcd_server.put(keys.topic_meta("t#ephemeral"), meta)
    etcd_server.put(
        keys.replica_info("t#ephemeral", 0),
        ReplicaInfo(holders[0], holders, replica=2).to_json(),
    )
    etcd_server.put(keys.topic_meta("bad"), meta)
    etcd_server.put(keys.replica_info("bad", 0), b'{"Leader": "x", "ISR": 5}')
    for node in cluster.nodes[:2]:
        poll(
            lambda n=node: "cannot hold t#ephemeral/0 as the cluster says" in n.process.log,
            f"{node.node_id} refusing the ephemeral topic",
        )
        poll(lambda n=node: "bad metadata at" in n.process.log, f"{node.node_id} on bad/0")
    node = cluster.nodes[0]
    node.stop()
    node.start()
    poll(lambda: "cannot hold t#ephemeral/0" in node.process.log, "refused again after a restart")
    assert all(other.running for other in cluster.nodes)
    assert cluster.lookupds[0].process.poll() is None
    publish_numbered(cluster, "good", "still", 5)


def test_a_write_from_an_epoch_a_follower_cannot_confirm_deposes_no_one(cluster):
    """A follower that has not seen an epoch (it started a moment ago, or etcd is out of its
    reach) answers a PUT from it `E_CATCHING_UP` and stores nothing: a leader is deposed only
    by a follower that knows a newer one, never by one that is behind."""
    cluster.create_writable_topic("t", 1, 2)
    publish_numbered(cluster, "t", "before", 5)
    info = cluster.partition("t", 0)
    follower = cluster.node(next(node for node in info["isr"] if node != info["leader"]))
    before = json.loads(follower.http("GET", "/partition/offsets?topic=t").body)
    [entry] = before["partitions"]
    end, count = entry["end"]["offset"], entry["end"]["count"]
    put = encode_frame(
        PUT,
        {
            "topic": "t",
            "partition": 0,
            "leader": info["leader"],
            "epoch": info["write_epoch"] + 5,
            "entry": [0, 0, 0, end, 10, count + 1, 1],
        },
        b"\0" * 10,
    )
    [answer] = frames_of(raw_exchange(follower.ports["RPC"], put))
    assert answer.op == ERROR
    assert answer.header["code"] == "E_CATCHING_UP", answer.header
    assert json.loads(follower.http("GET", "/partition/offsets?topic=t").body) == before
    assert cluster.partition("t", 0)["leader"] == info["leader"]
    publish_numbered(cluster, "t", "after", 5)
