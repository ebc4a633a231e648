"""A node that stopped uncleanly (docs/design.md §14, "Incarnations"): a `kill -9` cannot be
told from a power loss, which takes the unsynced tail of every log the acknowledgement did
not wait for. So the node starts as a new run of its disk (`<identity>-<run>`), proving
nothing it holds until it caught up: a complete replica leads meanwhile, and the node joins
the ISR again at its leader's end. A clean stop keeps the incarnation. With `--workers`, the
supervisor begins and ends the node's run for its workers."""

import json

import pytest

from nsqpy.nsqd.data_path import CLEAN_STOP_FILE, INCARNATION_FILE
from tests.cluster.aging import publish_batch
from tests.cluster.local_cluster import LocalCluster
from tests.cluster.traffic import check_replicas_identical, drain
from tests.support.polling import poll


@pytest.fixture(params=["one process", "workers"])
def cluster(request, tmp_path, etcd_server):
    nsqd_args = ("-workers=2",) if request.param == "workers" else ()
    with LocalCluster(tmp_path, etcd_server, nsqd_args=nsqd_args) as running:
        yield running


def _writable_on(node, topic: str, partition: int) -> bool:
    """Whether `node` says it takes writes for the partition (`/partition/offsets`)."""
    reply = node.http("GET", f"/partition/offsets?topic={topic}")
    if reply.status != 200:
        return False
    entries = json.loads(reply.body)["partitions"]
    return any(item["partition"] == partition and item.get("writable") for item in entries)


def _incarnation(node) -> str:
    return (node.data_path / INCARNATION_FILE).read_text().strip()


def test_a_killed_leader_comes_back_as_a_new_run_and_rejoins_behind_a_complete_one(cluster):
    cluster.create_writable_topic("t", 1, 3)
    leader = cluster.node_leading("t", 0)
    identity = _incarnation(leader)
    acked = publish_batch(leader, "t", "before", 100)
    leader.kill()
    leader.start()
    run = poll(
        lambda: (run := _incarnation(leader)) != identity and run,
        "the restarted node in a new run",
    )
    assert run.startswith(f"{identity}-") and len(run) == len(identity) + 9
    new = poll(
        lambda: (node := cluster.node_leading("t", 0)) is not None and node is not leader and node,
        lambda: f"a replica that proves its data leading\n{cluster.describe()}",
    )
    poll(
        lambda: leader.node_id in cluster.partition("t", 0)["isr"],
        lambda: f"the restarted node back in the ISR\n{cluster.describe()}",
        timeout=30,
    )
    acked |= publish_batch(new, "t", "after", 20)
    assert acked <= drain(new, "t", acked)
    check_replicas_identical(cluster, "t", 1)


def test_a_clean_stop_keeps_the_incarnation(cluster):
    cluster.create_writable_topic("t", 1, 3)
    node = cluster.nodes[0]
    before = _incarnation(node)
    node.stop()
    assert (node.data_path / CLEAN_STOP_FILE).exists()
    node.start()
    # The run begins once the node joins the cluster, which takes the mark.
    poll(lambda: not (node.data_path / CLEAN_STOP_FILE).exists(), "the clean stop's mark taken")
    assert _incarnation(node) == before


def test_a_lone_replica_killed_and_restarted_leads_again_with_what_it_holds(cluster):
    """Replicator 1: no other copy can prove more, so the node leads in its new run."""
    cluster.create_writable_topic("t", 1, 1)
    leader = cluster.node_leading("t", 0)
    acked = publish_batch(leader, "t", "before", 50)
    leader.kill()
    leader.start()
    # Elected again in its new run: the info counts on that run (nothing `lost`), and the
    # node has applied it (with `-workers`, its worker a moment after the master wrote it).
    poll(
        lambda: not cluster.partition("t", 0)["lost"] and _writable_on(leader, "t", 0),
        lambda: f"the lone replica leading again\n{cluster.describe()}",
    )
    acked |= publish_batch(leader, "t", "after", 10)
    assert acked <= drain(leader, "t", acked)
