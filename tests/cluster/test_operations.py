"""Operating a replicated cluster (docs/operations.md, "Operating a replicated cluster"), on
real processes: etcd, nsqlookupd and three or four nsqds, smart-client producers and consumers
publishing and consuming throughout. Balance after a failover, a rolling restart, partition
expansion, moves, node removal, topic meta updates and upgrade mode: nothing acknowledged is
lost, and every replica ends byte-identical."""

import json
import math
import time
from collections import Counter

import pytest

from tests.cluster.aging import AGED_NSQD_ARGS, age_topic, log_start
from tests.cluster.local_cluster import LocalCluster
from tests.cluster.proxy import BlackholeProxy
from tests.cluster.traffic import (
    Traffic,
    check_replicas_identical,
    drain,
    log_files,
    publish_numbered,
)
from tests.harness import V2Connection
from tests.support.polling import poll


@pytest.fixture
def cluster(tmp_path, etcd_server):
    # Small segments: the tests that move replicas run them on topics whose retention has
    # run (`tests/cluster/aging.py`), so a new replica copies a log that does not start at 0.
    with LocalCluster(
        tmp_path, etcd_server, nsqd_args=("-sync-every=1", *AGED_NSQD_ARGS)
    ) as running:
        yield running


def create_topic(cluster: LocalCluster, topic: str, partitions: int, replicas: int) -> None:
    """The topic, with channel `c` on every partition (made by the master on each leader)."""
    cluster.create_topic(topic, partitions, replicas)
    reply = cluster.master_http("POST", f"/channel/create?topic={topic}&channel=c")
    assert reply.status == 200, reply


def leaders(cluster: LocalCluster, topic: str, partitions: int) -> Counter:
    return Counter(cluster.partition(topic, p)["leader"] for p in range(partitions))


def balanced(cluster: LocalCluster, topic: str, partitions: int) -> bool:
    counts = leaders(cluster, topic, partitions)
    limit = math.ceil(partitions / len(cluster.nodes))
    return len(counts) == len(cluster.nodes) and max(counts.values()) <= limit


def operate(cluster: LocalCluster, target: str, status: int = 200) -> dict:
    reply = cluster.master_http("POST", target)
    assert reply.status == status, reply
    return json.loads(reply.body) if reply.body else {}


def test_leaders_move_back_once_a_restarted_node_caught_up(cluster):
    """Youzan's balance: a failover leaves a node leading nothing; once it is back and
    caught up, leaders move to it (planned transfers) until no node leads more than
    ⌈partitions / nodes⌉."""
    create_topic(cluster, "t", 6, 2)
    assert balanced(cluster, "t", 6)
    traffic = Traffic(cluster, "t", producers=1)
    try:
        traffic.wait_acked(100)
        victim = cluster.nodes[2]
        victim.kill()
        poll(lambda: victim.node_id not in leaders(cluster, "t", 6), "the victim's leaders moved")
        assert not balanced(cluster, "t", 6)
        victim.start()
        poll(lambda: balanced(cluster, "t", 6), "leaders balanced again", timeout=60)
        assert cluster.stats()["balance"]["moves"] >= 1
        traffic.check_all_consumed()
    finally:
        traffic.close()
    check_replicas_identical(cluster, "t", 6)


def test_a_rolling_restart_loses_nothing(cluster):
    """Each node in turn: SIGTERM, start again, wait until every ISR is whole. A stopping
    node first hands over what it leads and leaves the ISRs it follows, while it still
    serves (so no partition waits for its lease or for a follower that stopped answering).
    Producers and a consumer run throughout; the longest write gap per partition is
    printed (bench.cluster_ops measures it)."""
    create_topic(cluster, "t", 3, 3)
    traffic = Traffic(cluster, "t")
    try:
        traffic.wait_acked(200)
        for node in cluster.nodes:
            node.stop()
            assert "CLUSTER: leaving the cluster: " in node.process.log, node.process.log
            for partition in range(3):
                entry = cluster.partition("t", partition)
                assert node.node_id != entry["leader"] and node.node_id not in entry["isr"], (
                    f"{node.node_id} still holds t/{partition}: {entry}\n{cluster.describe()}"
                )
            node.start()
            for partition in range(3):
                poll(
                    lambda p=partition: len(cluster.partition("t", p)["isr"]) == 3,
                    f"t/{partition}'s ISR whole after {node.node_id} restarted",
                    timeout=60,
                )
            traffic.wait_acked(len(traffic.acked) + 50)
        traffic.check_all_consumed()
        print("rolling restart: longest write gap per partition (s):", traffic.gaps)
    finally:
        traffic.close()
    check_replicas_identical(cluster, "t", 3)


def test_expanding_and_moving_partitions_under_load(tmp_path, etcd_server):
    # Balancing off: a balance move beside the operator's would be refused ("another balance
    # is running") or could move the partition again right after (balance has its own test).
    with LocalCluster(
        tmp_path,
        etcd_server,
        nsqds=4,
        nsqd_args=("-sync-every=1", *AGED_NSQD_ARGS),
        lookupd_args=("-balance-interval=off",),
    ) as cluster:
        create_topic(cluster, "t", 2, 2)
        for partition in range(2):
            age_topic(cluster, "t", partition, count=150)
        traffic = Traffic(cluster, "t")
        try:
            traffic.wait_acked(200)
            operate(cluster, "/topic/partition/expand?topic=t&partition_num=4")
            meta = cluster.lookupd_http("GET", "/lookup?topic=t&metainfo=true")
            assert json.loads(meta.body)["meta"]["partition_num"] == 4
            # The new partitions have the topic's channel, and the smart clients use them.
            poll(
                lambda: traffic.partitions_used[2] > 10 and traffic.partitions_used[3] > 10,
                "publishes to the new partitions",
            )
            # Move partition 0, leader and all, to a node that does not hold it.
            entry = cluster.partition("t", 0)
            source = entry["leader"]
            [destination] = [n.node_id for n in cluster.nodes if n.node_id not in entry["isr"]][:1]
            operate(
                cluster,
                f"/topic/partition/move?topic=t&partition=0&move_leader=true"
                f"&move_from={source}&move_to={destination}",
            )
            moved = cluster.partition("t", 0)
            assert moved["leader"] == destination
            assert source not in moved["isr"] + moved["catchup"]
            poll(lambda: not log_files(cluster.node(source), "t", 0), "the old copy deleted")
            traffic.wait_acked(len(traffic.acked) + 200)
            traffic.check_all_consumed()
        finally:
            traffic.close()
        check_replicas_identical(cluster, "t", 4)


def partition_entry(node, topic: str) -> dict:
    """Partition 0 of `topic` in the node's /partition/offsets: its end and replica state."""
    reply = node.http("GET", f"/partition/offsets?topic={topic}&partition=0")
    assert reply.status == 200, reply
    return json.loads(reply.body)["partitions"][0]


def message_count(node, topic: str) -> int:
    return partition_entry(node, topic)["end"]["count"]


def test_a_node_joins_the_isr_only_through_its_leader_at_the_leaders_end(tmp_path, etcd_server):
    """A node that caught up joins the ISR through its leader, which holds its writes, gives
    it what it wrote since and has the master add it (Youzan's join session). With the leader
    cut off from etcd, it cannot learn of the new replica: the node stays on the catch-up
    list, never in an ISR the leader does not know, and what is published meanwhile is
    acknowledged without it. Once the leader hears again, the node joins at the leader's end:
    every ISR member the master lists holds every acknowledged message, and the leadership
    moves to it at once."""
    proxies = {index: BlackholeProxy(("127.0.0.1", etcd_server.client_port)) for index in range(3)}
    try:
        with LocalCluster(
            tmp_path,
            etcd_server,
            # Long enough that the lease does not end while the leader is cut off from etcd.
            ttl=10.0,
            lookupd_args=("-balance-interval=off",),
            etcd_urls={index: f"http://{proxy.address}" for index, proxy in proxies.items()},
        ) as cluster:
            create_topic(cluster, "t", 1, 2)
            publish_numbered(cluster, "t", "before", 5)
            isr = cluster.partition("t", 0)["isr"]
            leader = cluster.node(cluster.partition("t", 0)["leader"])
            [joiner] = [node for node in cluster.nodes if node.node_id not in isr]
            proxies[leader.index].blackhole()
            try:
                operate(cluster, "/topic/meta/update?topic=t&replicator=3")

                def refused_join() -> str | None:
                    reply = joiner.http("GET", "/partition/offsets?topic=t&partition=0")
                    if reply.status != 200:
                        return None  # it has not heard of its replica yet
                    progress = json.loads(reply.body)["partitions"][0].get("catch_up") or {}
                    return progress.get("error")

                assert "E_NOT_CATCHUP" in poll(
                    refused_join, "the joiner asking its leader, which does not know it yet"
                )
                publish_numbered(cluster, "t", "meanwhile", 1)
                assert joiner.node_id in cluster.partition("t", 0)["catchup"]
            finally:
                proxies[leader.index].heal()
            poll(lambda: joiner.node_id in cluster.partition("t", 0)["isr"], "the join")
            assert message_count(joiner, "t") == message_count(leader, "t") == 6
            reply = cluster.master_http(
                "POST",
                f"/topic/partition/move?topic=t&partition=0&move_leader=true"
                f"&move_from={leader.node_id}&move_to={joiner.node_id}",
            )
            assert reply.status == 200, reply
            assert cluster.partition("t", 0)["leader"] == joiner.node_id
            check_replicas_identical(cluster, "t", 1)
    finally:
        for proxy in proxies.values():
            proxy.close()


def test_a_removed_node_ends_holding_nothing(cluster):
    create_topic(cluster, "t", 3, 2)
    for partition in range(3):
        age_topic(cluster, "t", partition, count=150)
    traffic = Traffic(cluster, "t")
    try:
        traffic.wait_acked(200)
        victim = cluster.nodes[1]
        operate(cluster, f"/cluster/node/remove?remove_node={victim.node_id}")
        assert victim.node_id in cluster.stats()["removing_nodes"]

        def removed() -> bool:
            stats = cluster.stats()
            return stats["removed_nodes"] == [victim.node_id] and not any(
                victim.node_id in [entry["leader"], *entry["isr"], *entry["catchup"]]
                for entry in stats["partitions"]
            )

        poll(
            removed,
            lambda: f"the removed node holding nothing\n{cluster.describe()}",
            timeout=60,
        )
        # Stable again once every node has reported its copies caught up (reports come every
        # second).
        stats = poll(
            lambda: (stats := cluster.stats())["stable"] and stats,
            lambda: f"the cluster stable again\n{cluster.describe()}",
        )
        assert not stats["removing_nodes"]
        node_stats = {node["id"]: node for node in stats["nodes"]}
        assert node_stats[victim.node_id]["replicas"] == 0
        assert node_stats[victim.node_id]["removed"] is True
        poll(
            lambda: not any(log_files(victim, "t", p) for p in range(3)),
            lambda: (
                f"its copies deleted\n{cluster.describe()}\nits log:\n{victim.process.log[-6000:]}"
            ),
        )
        # Until it is stopped, balance gives the emptiest node nothing back.
        rounds = stats["balance"]["rounds"]
        poll(lambda: cluster.stats()["balance"]["rounds"] >= rounds + 2, "two balance rounds")
        assert removed()
        victim.stop()
        poll(lambda: not cluster.stats()["removed_nodes"], "the stopped node off the list")
        traffic.wait_acked(len(traffic.acked) + 100)
        traffic.check_all_consumed()
    finally:
        traffic.close()
    check_replicas_identical(cluster, "t", 3)


def test_meta_update_changes_replicas_and_settings(cluster):
    create_topic(cluster, "t", 2, 2)
    starts = [age_topic(cluster, "t", partition, count=150) for partition in range(2)]
    operate(cluster, "/topic/meta/update?topic=t&replicator=3&syncdisk=10&retention=5")
    for partition in range(2):
        poll(
            lambda p=partition: len(cluster.partition("t", p)["isr"]) == 3,
            f"t/{partition} on three nodes",
            timeout=30,
        )
    meta = json.loads(cluster.lookupd_http("GET", "/lookup?topic=t&metainfo=true").body)["meta"]
    assert meta["replica"] == 3
    # The third replica copied each log from where retention left it.
    check_replicas_identical(cluster, "t", 2)
    for partition, start in enumerate(starts):
        for node_id in cluster.partition("t", partition)["isr"]:
            assert log_start(cluster.node(node_id), "t", partition) == start
    operate(cluster, "/topic/meta/update?topic=t&disable_channel_auto_create=true")
    leader = cluster.node(cluster.partition("t", 0)["leader"])
    # The master answers once etcd has the meta; the leader applies it from its watch a
    # moment later (under load, after the answer).
    # A SUB taken before then made its channel: each try asks for one not made yet.
    tries = iter(range(1_000_000))
    poll(
        lambda: leader_refuses_a_new_channel(leader.tcp_port, f"other{next(tries)}"),
        "the leader refusing an unregistered channel",
    )


def leader_refuses_a_new_channel(tcp_port: int, channel: str) -> bool:
    connection = V2Connection(tcp_port)
    try:
        connection.send(f"SUB t {channel} 0\n".encode())
        answer = connection.read_response().data
    finally:
        connection.close()
    if answer == b"OK":
        return False
    assert answer == b"E_SUB_CHANNEL_NOT_REGISTERED channel is not registered under topic."
    return True
    operate(cluster, "/topic/meta/update?topic=t&replicator=2")
    for partition in range(2):
        poll(
            lambda p=partition: len(cluster.partition("t", p)["isr"]) == 2,
            f"t/{partition} back on two nodes",
        )
    check_replicas_identical(cluster, "t", 2)


def test_upgrade_mode_holds_re_replication_back(tmp_path, etcd_server):
    with LocalCluster(
        tmp_path, etcd_server, lookupd_args=("-cluster-replace-dead-after=1s",)
    ) as cluster:
        create_topic(cluster, "t", 1, 2)
        operate(cluster, "/cluster/upgrade/begin")
        assert cluster.stats()["upgrading"] and not cluster.stats()["stable"]
        entry = cluster.partition("t", 0)
        follower = cluster.node(entry["isr"][1])
        spare = next(n for n in cluster.nodes if n.node_id not in entry["isr"])
        follower.kill()
        poll(lambda: follower.node_id in cluster.partition("t", 0)["catchup"], "left ISR")
        # Past --cluster-replace-dead-after, and the spare is still not given the replica.
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            assert spare.node_id not in cluster.partition("t", 0)["catchup"]
            time.sleep(0.2)
        operate(cluster, "/cluster/upgrade/done")
        poll(
            lambda: spare.node_id in cluster.partition("t", 0)["isr"],
            "the replica placed on the spare once the upgrade is done",
        )


def test_channels_and_topics_everywhere(cluster):
    """`/channel/create` and `/channel/delete` on the master reach every partition's leader
    and its followers; `/topic/delete?partition=**` removes every replica."""
    cluster.create_topic("t", 2, 2)
    operate(cluster, "/channel/create?topic=t&channel=ch")

    def channels_everywhere(present: bool) -> bool:
        for partition in range(2):
            for node_id in cluster.partition("t", partition)["isr"]:
                reply = cluster.node(node_id).http("GET", "/cluster/partitions")
                entries = json.loads(reply.body)["partitions"]
                [entry] = [e for e in entries if e["topic"] == "t" and e["partition"] == partition]
                if ("ch" in entry["channels"]) != present:
                    return False
        return True

    assert channels_everywhere(True)
    lookup = json.loads(cluster.lookupd_http("GET", "/lookup?topic=t&access=w").body)
    assert sorted(lookup["partitions"]) == ["0", "1"]  # writable once they have a channel
    operate(cluster, "/channel/delete?topic=t&channel=ch")
    assert channels_everywhere(False)
    assert operate(cluster, "/channel/delete?topic=t&channel=ch", 404) == {
        "message": "CHANNEL_NOT_FOUND"
    }
    operate(cluster, "/topic/delete?topic=t", 400)
    operate(cluster, "/topic/delete?topic=t&partition=0", 400)
    holders = {n for p in range(2) for n in cluster.partition("t", p)["isr"]}
    operate(cluster, "/topic/delete?topic=t&partition=**")
    poll(
        lambda: not any(log_files(cluster.node(n), "t", p) for n in holders for p in range(2)),
        "every replica deleted",
    )
    assert cluster.partition("t", 0) is None
    assert cluster.lookupd_http("GET", "/lookup?topic=t").status == 404


def test_a_node_away_while_its_topic_was_deleted_drops_its_copy_on_return(cluster):
    create_topic(cluster, "kept", 1, 3)
    create_topic(cluster, "t", 1, 3)
    publish_numbered(cluster, "t", "old", 5)
    away = cluster.nodes[2]
    away.stop()
    operate(cluster, "/topic/delete?topic=t&partition=**")
    assert log_files(away, "t", 0), "the stopped node keeps its copy meanwhile"
    away.start()
    poll(lambda: not log_files(away, "t", 0), "the copy of the deleted topic dropped")
    assert log_files(away, "kept", 0), "a topic the cluster still has stays"


def test_a_topic_created_again_never_takes_the_old_topics_copy(cluster):
    """Youzan's MagicCode: a node that was away while its topic was deleted (and found no
    topic in etcd on its return, so kept its copy) drops that copy when the topic created
    again gives it the partition; here it is the only node, so it leads the new topic."""
    create_topic(cluster, "t", 1, 3)
    old = publish_numbered(cluster, "t", "old", 5)
    away, *others = reversed(cluster.nodes)
    away.stop()
    operate(cluster, "/topic/delete?topic=t&partition=**")
    for node in others:
        node.stop()
    away.start()
    poll(lambda: cluster.stats()["nsqd_nodes"] == [away.node_id], "only the node back")
    assert log_files(away, "t", 0), "with no topic in etcd at all, nothing local is deleted"
    create_topic(cluster, "t", 1, 1)
    new = publish_numbered(cluster, "t", "new", 5)
    received = drain(away, "t", new)
    assert received == new, f"the old topic's {sorted(received & old)} delivered"


@pytest.mark.parametrize(
    "target,status,message",
    [
        ("/topic/partition/expand?partition_num=3", 400, "MISSING_ARG_TOPIC"),
        ("/topic/partition/expand?topic=t", 400, "MISSING_ARG_TOPIC_PARTITION_NUM"),
        ("/topic/partition/expand?topic=t&partition_num=x", 400, "INVALID_ARG_TOPIC_PARTITION_NUM"),
        (
            "/topic/partition/expand?topic=t&partition_num=1",
            500,
            "the partition number can not be reduced",
        ),
        ("/topic/partition/expand?topic=none&partition_num=3", 500, "topic is not created"),
        ("/topic/partition/move?topic=t", 400, "MISSING_ARG_TOPIC_PARTITION"),
        (
            "/topic/partition/move?topic=t&partition=0&move_from=a&move_to=a",
            400,
            "move to and from node can not be the same",
        ),
        (
            "/topic/partition/move?topic=t&partition=0&move_leader=true&move_from=a&move_to=b",
            400,
            "move from not the topic leader",
        ),
        ("/topic/meta/update?topic=t&replicator=9", 400, "INVALID_ARG_TOPIC_REPLICATOR"),
        ("/topic/meta/update?topic=t&syncdisk=5000", 400, "max sync every allowed exceed"),
        ("/topic/meta/update?topic=t&retention=61", 400, "max retention days allowed exceed"),
        ("/topic/meta/update?topic=none&retention=1", 400, "topic is not created"),
        ("/cluster/node/remove?remove_node=nobody", 400, "node not found"),
        ("/cluster/lookupd/tombstone", 400, "MISSING_ARG_NODE"),
        ("/cluster/lookupd/tombstone?node=nobody", 404, "lookup node id not found"),
        ("/loglevel/set", 400, "MISSING_ARG_LEVEL"),
        ("/loglevel/set?loglevel=high", 400, "BAD_LEVEL_STRING"),
    ],
)
def test_operations_answer_youzans_errors(cluster, target, status, message):
    if cluster.partition("t", 0) is None:
        cluster.create_topic("t", 2, 2)
    assert operate(cluster, target, status) == {"message": message}


def test_only_the_master_operates(tmp_path, etcd_server):
    with LocalCluster(tmp_path, etcd_server, lookupds=2) as cluster:
        cluster.create_topic("t", 1, 2)
        other = next(index for index in range(2) if not cluster.stats(index)["is_master"])
        for target, status in (
            ("/topic/partition/expand?topic=t&partition_num=2", 500),
            ("/cluster/upgrade/begin", 400),
            ("/cluster/node/remove?remove_node=x", 400),
        ):
            reply = cluster.lookupd_http("POST", target, other)
            assert (reply.status, json.loads(reply.body)) == (
                status,
                {"message": "Not nsqlookup leader"},
            )


def test_a_tombstoned_nsqlookupd_leaves_listlookup(tmp_path, etcd_server):
    with LocalCluster(tmp_path, etcd_server, lookupds=2) as cluster:
        listed = json.loads(cluster.lookupd_http("GET", "/listlookup").body)["lookupdnodes"]
        victim = listed[1]["ID"]
        operate(cluster, f"/cluster/lookupd/tombstone?node={victim}")
        for index in range(2):
            poll(
                lambda i=index: (
                    victim
                    not in [
                        n["ID"]
                        for n in json.loads(cluster.lookupd_http("GET", "/listlookup", i).body)[
                            "lookupdnodes"
                        ]
                    ]
                ),
                "the tombstoned nsqlookupd hidden",
            )
        operate(cluster, f"/cluster/lookupd/tombstone?node={victim}&restore=true")
        listed = json.loads(cluster.lookupd_http("GET", "/listlookup").body)["lookupdnodes"]
        assert victim in [node["ID"] for node in listed]


def test_cluster_stats_carry_youzans_fields(cluster):
    create_topic(cluster, "t", 3, 2)
    operate(cluster, "/cluster/balance/topn?enable=true")
    stats = json.loads(cluster.master_http("GET", "/cluster/stats?topn=2").body)
    assert stats["stable"] is True
    assert stats["topn_balance"] is True
    assert stats["etcd"]["reachable"] is True
    assert len(stats["node_stat_list"]) == 3
    for entry in stats["node_stat_list"]:
        assert set(entry) == {
            "hostname",
            "broadcast_address",
            "tcp_port",
            "http_port",
            "leader_load_factor",
            "node_load_factor",
        }
        assert entry["node_load_factor"] >= entry["leader_load_factor"] > 0
    poll(
        lambda: (
            len(json.loads(cluster.master_http("GET", "/cluster/stats?topn=2").body)["topn_topics"])
            == 2
        ),
        "two top-N partitions",
    )
    nodes = {node["id"]: node for node in stats["nodes"]}
    assert sum(node["leaders"] for node in nodes.values()) == 3
    assert sum(node["replicas"] for node in nodes.values()) == 6


def test_a_leader_moved_by_balance_sends_its_consumers_to_the_new_one(cluster):
    """A planned transfer makes the old leader a follower: it closes the connections of the
    partition's consumers (they look the new leader up) and leaves nsqlookupd's list for it,
    as a leader that loses its lease does."""
    create_topic(cluster, "t", 3, 2)
    victim = cluster.nodes[2]
    victim.kill()
    poll(lambda: victim.node_id not in leaders(cluster, "t", 3), "the victim's leaders moved")
    consumers = {}
    for partition in range(3):
        leader = cluster.node_leading("t", partition)
        connection = V2Connection(leader.tcp_port)
        connection.send(b"SUB t c %d\n" % partition)
        assert connection.read_response().data == b"OK"
        consumers[partition] = (leader.node_id, connection)
    try:
        victim.start()
        poll(lambda: balanced(cluster, "t", 3), "leaders balanced again", timeout=60)
        moved = [
            partition
            for partition, (node_id, _connection) in consumers.items()
            if cluster.partition("t", partition)["leader"] != node_id
        ]
        assert moved
        for partition in moved:
            _node_id, connection = consumers[partition]
            with pytest.raises(ConnectionError):
                while True:  # heartbeats until nsqd closes it
                    connection.read_frame()
    finally:
        for _node_id, connection in consumers.values():
            connection.close()
