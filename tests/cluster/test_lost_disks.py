"""A replica whose disk is replaced, on a topic whose retention has run (docs/design.md §14,
"Incarnations" and "Catch-up"): etcd, one nsqlookupd, three nsqds with 32 KiB segments and
node leases of 2 s, every replication port behind a proxy the test can black-hole.

A node restarted on an empty data directory is a new incarnation: it leaves the ISR at once,
is never elected while it lacks what was acknowledged, starts its log over at its leader's
start (wherever retention put it) and joins the ISR again only at its leader's end."""

import json

import pytest

from nsqpy.common.command import encode_dpub, encode_mpub_seq, encode_rdy
from tests.cluster.aging import (
    AGED_NSQD_ARGS,
    age_topic,
    corrupt_groups,
    log_start,
    poll_back_in_isr,
    publish_batch,
    replace_disk,
    zero_a_group,
)
from tests.cluster.local_cluster import LocalCluster
from tests.cluster.traffic import check_replicas_identical, drain, publish
from tests.harness import V2Connection
from tests.support.polling import poll


@pytest.fixture
def cluster(tmp_path, etcd_server):
    with LocalCluster(tmp_path, etcd_server, nsqd_args=AGED_NSQD_ARGS, rpc_proxies=True) as running:
        yield running


def _follower_of(cluster, topic: str):
    entry = cluster.partition(topic, 0)
    return cluster.node(next(node for node in entry["isr"] if node != entry["leader"]))


def test_a_replaced_disk_never_leads_and_copies_the_aged_log_once_its_leader_is_back(cluster):
    """The issue's loss: an emptied follower stayed in the ISR, was elected when the leader
    died, and every acknowledged message went. Here it leaves the ISR at once, the partition
    waits (and says why) while the only complete replica is down, and nothing is lost."""
    cluster.create_writable_topic("t", 1, 2)
    leader = cluster.node_leading("t", 0)
    follower = _follower_of(cluster, "t")
    start = age_topic(cluster, "t")
    acked = publish_batch(leader, "t", "kept", 200)
    # The follower cannot reach its leader's replication port: it cannot copy anything.
    leader.rpc_proxy.blackhole()
    replace_disk(cluster, follower)
    poll(
        lambda: follower.node_id in cluster.partition("t", 0)["catchup"],
        lambda: f"the emptied follower out of the ISR\n{cluster.describe()}",
    )
    assert cluster.partition("t", 0)["isr"] == [leader.node_id]
    stats = cluster.stats()
    assert stats["stable"] is False
    assert cluster.partition("t", 0)["under_replicated"] is True
    leader.kill()
    entry = poll(
        lambda: (entry := cluster.partition("t", 0))["unavailable"] and entry,
        lambda: f"the partition saying it has no leader to elect\n{cluster.describe()}",
    )
    assert entry["leader"] == leader.node_id, entry
    assert "waiting for one to come back" in entry["unavailable"]
    assert follower.node_id not in entry["isr"]
    leader.rpc_proxy.heal()
    leader.start()
    poll(lambda: cluster.node_leading("t", 0) is leader, "the old leader leading again")
    poll(
        lambda: follower.node_id in cluster.partition("t", 0)["isr"],
        lambda: f"the new disk's replica back in the ISR\n{cluster.describe()}",
        timeout=30,
    )
    assert log_start(follower, "t") == start
    acked |= publish_batch(leader, "t", "after", 20)
    assert acked <= drain(leader, "t", acked)
    check_replicas_identical(cluster, "t", 1)


def test_a_replaced_disk_on_the_leader_hands_the_partition_to_the_complete_follower(cluster):
    cluster.create_writable_topic("t", 1, 3)
    leader = cluster.node_leading("t", 0)
    age_topic(cluster, "t")
    acked = publish_batch(leader, "t", "kept", 100)
    replace_disk(cluster, leader)
    new = poll(
        lambda: (node := cluster.node_leading("t", 0)) is not None and node is not leader and node,
        lambda: f"a complete replica leading\n{cluster.describe()}",
    )
    poll(
        lambda: leader.node_id in cluster.partition("t", 0)["isr"],
        lambda: f"the emptied node back in the ISR\n{cluster.describe()}",
        timeout=30,
    )
    acked |= publish_batch(new, "t", "after", 20)
    assert acked <= drain(new, "t", acked)
    check_replicas_identical(cluster, "t", 1)


def test_catch_up_progress_and_its_cause_are_reported(cluster):
    """A replica that cannot progress is reported with the cause, and `/cluster/stats` shows
    how far behind it is."""
    cluster.create_writable_topic("t", 1, 2)
    leader = cluster.node_leading("t", 0)
    follower = _follower_of(cluster, "t")
    age_topic(cluster, "t")
    publish_batch(leader, "t", "kept", 100)
    leader.rpc_proxy.blackhole()
    replace_disk(cluster, follower)

    def progress() -> dict | None:
        reply = follower.http("GET", "/cluster/partitions")
        for entry in json.loads(reply.body)["partitions"]:
            if entry["topic"] == "t" and entry.get("catch_up") and entry["catch_up"]["error"]:
                return entry["catch_up"]
        return None

    reported = poll(progress, "the follower reporting why it cannot catch up")
    assert reported["leader"] == leader.node_id
    assert leader.node_id.split(":")[1] in reported["error"] or "no answer" in reported["error"]
    leader.rpc_proxy.heal()
    poll(
        lambda: follower.node_id in cluster.partition("t", 0)["isr"],
        lambda: f"caught up once the link healed\n{cluster.describe()}",
        timeout=30,
    )
    check_replicas_identical(cluster, "t", 1)


def test_an_operator_may_elect_an_incomplete_replica_and_says_so(cluster):
    """Kafka's unclean election: with the only complete replica gone for good, an operator
    makes the emptied one lead. Refused while a complete replica can; logged loudly; the
    other replica, when back, cuts what the new leader lacks and follows it."""
    cluster.create_writable_topic("t", 1, 2)
    leader = cluster.node_leading("t", 0)
    follower = _follower_of(cluster, "t")
    publish_batch(leader, "t", "lost", 20)
    elect = f"/topic/partition/elect?topic=t&partition=0&unclean=true&node={follower.node_id}"
    refused = cluster.master_http("POST", elect)
    assert (refused.status, json.loads(refused.body)["message"].split()[0]) == (
        400,
        "E_HAS_LEADER",
    )
    leader.rpc_proxy.blackhole()
    replace_disk(cluster, follower)
    poll(lambda: follower.node_id in cluster.partition("t", 0)["catchup"], "out of the ISR")
    leader.kill()
    poll(lambda: cluster.partition("t", 0)["unavailable"], "no leader to elect")
    clean = cluster.master_http("POST", "/topic/partition/elect?topic=t&partition=0")
    assert clean.status == 400 and b"E_CLEAN_ELECTION_IS_AUTOMATIC" in clean.body
    reply = cluster.master_http("POST", elect)
    assert reply.status == 200, reply
    assert json.loads(reply.body)["Leader"] == follower.node_id
    # The master logs it as it answers; its log reaches the test through a reader thread.
    poll(
        lambda: any("UNCLEAN ELECTION" in lookupd.log for lookupd in cluster.lookupds),
        "the unclean election in the master's log",
    )
    poll(lambda: cluster.node_leading("t", 0) is follower, "the emptied replica leading")
    leader.rpc_proxy.heal()
    leader.start()
    poll(
        lambda: leader.node_id in cluster.partition("t", 0)["isr"],
        lambda: f"the old leader following the new one\n{cluster.describe()}",
        timeout=30,
    )
    # The channel's cursor was among what was lost: it starts again at the new leader's end.
    assert follower.http("POST", "/channel/create?topic=t&channel=c&partition=0").status == 200
    after = publish_batch(follower, "t", "after", 10)
    received = drain(follower, "t", after)
    assert not any(body.startswith(b"lost") for body in received)
    check_replicas_identical(cluster, "t", 1)


def _publish_sequenced(node, first: int, count: int) -> bytes:
    """MPUB_SEQ `count` messages of producer `p` from sequence `first` to the partition's
    leader `node`; its answer."""
    connection = V2Connection(node.tcp_port, timeout=10)
    try:
        bodies = [b"p %06d" % sequence for sequence in range(first, first + count)]
        connection.send(encode_mpub_seq("t", 0, "p", first, bodies))
        return connection.read_response().data
    finally:
        connection.close()


def _message_count(node) -> int:
    reply = node.http("GET", "/partition/offsets?topic=t&partition=0")
    return json.loads(reply.body)["partitions"][0]["end"]["count"]


def test_idempotent_producers_survive_a_start_over(cluster):
    """A replica that started its log over at its leader's start copied the leader's producer
    snapshots: leading, it still knows a producer whose every record retention removed, and
    acknowledges a retry of its last publish without storing it."""
    cluster.create_writable_topic("t", 1, 2)
    leader = cluster.node_leading("t", 0)
    follower = _follower_of(cluster, "t")
    for first in range(0, 100, 50):
        assert _publish_sequenced(leader, first, 50) == b"OK"
    # Enough after them that retention removes every segment p's records are in.
    age_topic(cluster, "t")
    replace_disk(cluster, follower)
    poll_back_in_isr(cluster, follower, "t")
    # The leadership moves to it, and the old leader's copy to the third node, which copies
    # the log (and the producers) from it in turn.
    reply = cluster.master_http(
        "POST",
        f"/topic/partition/move?topic=t&partition=0&move_leader=true"
        f"&move_from={leader.node_id}&move_to={follower.node_id}",
    )
    assert reply.status == 200, reply
    poll(
        lambda: (
            cluster.node_leading("t", 0) is follower and len(cluster.partition("t", 0)["isr"]) == 2
        ),
        lambda: f"the started-over replica leading a whole ISR\n{cluster.describe()}",
        timeout=30,
    )
    stored = _message_count(follower)
    assert _publish_sequenced(follower, 50, 50) == b"OK"  # the retry of p's last publish
    assert _message_count(follower) == stored
    assert _publish_sequenced(follower, 100, 1) == b"OK"
    assert _message_count(follower) == stored + 1


def _delayed(node, topic: str) -> int | None:
    """Channel `c`'s messages in `node`'s delay queue of partition 0 (None: no channel yet)."""
    reply = node.http("GET", f"/stats?format=json&topic={topic}&include_mem=false")
    for entry in json.loads(reply.body)["topics"] or ():
        for channel in entry["channels"]:
            if channel["channel_name"] == "c":
                return channel["delayed_queue_count"]
    return None


def _dpub(node, bodies: list[bytes]) -> None:
    """DPUBs of 10 minutes to topic "t" at `node`, each acknowledged."""
    connection = V2Connection(node.tcp_port)
    try:
        for body in bodies:
            connection.send(encode_dpub("t", 600_000, body))
            assert connection.read_response().data == b"OK"
    finally:
        connection.close()


def _replace_disk_then_lead(cluster, leader, follower, start: int, delayed: int) -> None:
    """The follower's disk replaced: it copies the aged log from `start` and holds `delayed`
    messages in its delay queue; then it leads (the old leader killed) and requeues them."""
    replace_disk(cluster, follower)
    poll_back_in_isr(cluster, follower, "t")
    assert log_start(follower, "t") == start
    poll(
        lambda: _delayed(follower, "t") == delayed,
        lambda: f"the copied delay queue: {_delayed(follower, 't')}, not {delayed}",
    )
    leader.kill()
    poll(lambda: cluster.node_leading("t", 0) is follower, "the follower leading")
    reply = follower.http("POST", "/channel/requeuedelayed?topic=t&channel=c&partition=0")
    assert reply.status == 200, reply


def test_a_replaced_disk_copies_the_delayed_messages_of_an_aged_topic(cluster):
    """DPUBs on a topic whose retention has run, then the follower's disk replaced: its
    catch-up copies the delayed records with the log, its delay queue holds them again, and
    once it leads (the old leader killed) it gives them out when asked, none lost."""
    cluster.create_writable_topic("t", 1, 2)
    leader = cluster.node_leading("t", 0)
    follower = _follower_of(cluster, "t")
    start = age_topic(cluster, "t")
    _dpub(leader, [b"delayed %d" % number for number in range(5)])
    poll(lambda: _delayed(follower, "t") == 5, "the DPUBs in the follower's delay queue")
    _replace_disk_then_lead(cluster, leader, follower, start, 5)
    bodies = {b"delayed %d" % number for number in range(5)}
    assert bodies <= drain(follower, "t", bodies)


def test_finished_delayed_messages_stay_finished_on_a_replaced_disk_of_an_aged_topic(cluster):
    """On a topic whose retention has run: messages moved to the delay queue (a REQ past the
    threshold) and finished (`/message/finish`) leave every replica's delay queue; a follower
    whose disk is then replaced copies the log and the delay queue again and holds only what
    is still delayed, not the finished ones, so it never gives them out once it leads."""
    cluster.create_writable_topic("t", 1, 2)
    leader = cluster.node_leading("t", 0)
    follower = _follower_of(cluster, "t")
    start = age_topic(cluster, "t")
    _dpub(leader, [b"still delayed"])
    for number in range(5):
        publish(cluster, "t", b"finished %d" % number)
        consumer = V2Connection(leader.tcp_port, timeout=15)
        try:
            consumer.send(b"SUB t c 0\n")
            assert consumer.read_response().data == b"OK"
            consumer.send(encode_rdy(1))
            (message,) = consumer.read_messages(1)
            consumer.send(b"REQ " + message.id + b" 1000000\n")
            msgid = int.from_bytes(message.id[:8], "big")
            finish = f"/message/finish?topic=t&channel=c&partition=0&msgid={msgid}"
            poll(
                lambda finish=finish: leader.http("POST", finish).status == 200,
                f"message {number} finished",
            )
        finally:
            consumer.close()
    poll(
        lambda: (_delayed(leader, "t"), _delayed(follower, "t")) == (1, 1),
        lambda: f"1 delayed on both: {_delayed(leader, 't')}, {_delayed(follower, 't')}",
    )
    _replace_disk_then_lead(cluster, leader, follower, start, 1)
    assert drain(follower, "t", {b"still delayed"}) == {b"still delayed"}


def test_a_replaced_disk_takes_the_channel_controls_of_an_aged_topic(cluster):
    """Youzan's skip, setorder, ratelimit and setclientlimit on a topic whose retention has
    run, then the follower's disk replaced: its catch-up copies the channel with its
    controls, and once it leads (the old leader killed) its channel is still skipped, in
    order and limited."""
    cluster.create_writable_topic("t", 1, 2)
    leader = cluster.node_leading("t", 0)
    follower = _follower_of(cluster, "t")
    start = age_topic(cluster, "t")
    for route in (
        "/channel/skip",
        "/channel/setorder?order=true",
        "/channel/ratelimit?ratekilobytes=640",
        "/channel/setclientlimit?ready=7&client_prefix=127.",
    ):
        path, _, arguments = route.partition("?")
        reply = leader.http("POST", f"{path}?topic=t&channel=c&partition=0&{arguments}")
        assert reply.status == 200, reply
    replace_disk(cluster, follower)
    poll_back_in_isr(cluster, follower, "t")
    assert log_start(follower, "t") == start
    leader.kill()
    poll(lambda: cluster.node_leading("t", 0) is follower, "the follower leading")
    reply = follower.http("GET", "/stats?format=json&topic=t&channel=c&include_mem=false")
    stats = json.loads(reply.body)["topics"][0]["channels"][0]
    assert (stats["skipped"], stats["rate_limit_kb"]) == (True, 640)
    dat = json.loads((follower.data_path / "nsqd.dat").read_bytes())
    (channel,) = [c for t in dat["topics"] if t["name"] == "t" for c in t["channels"]]
    assert (channel.get("skipped"), channel.get("in_order")) == (True, True)
    assert channel.get("rate_limit_kb") == 640
    assert channel.get("client_limits") == [{"prefix": "127.", "ready": 7}]


def test_fixconfirmed_on_an_aged_topic_delivers_nothing_twice(cluster):
    """Youzan's `/channel/fixconfirmed` on a topic whose retention has run: the channel reads
    again from its confirmed position (past the removed segments) and gives out neither the
    messages a consumer holds in flight nor those it finished out of order; what is
    published next is what comes next."""
    cluster.create_writable_topic("t", 1, 2)
    leader = cluster.node_leading("t", 0)
    start = age_topic(cluster, "t")
    held = publish_batch(leader, "t", "held", 3)
    consumer = V2Connection(leader.tcp_port, timeout=15)
    try:
        consumer.send(b"SUB t c 0\n")
        assert consumer.read_response().data == b"OK"
        consumer.send(encode_rdy(3))
        first, second, third = consumer.read_messages(3)
        assert {first.body, second.body, third.body} == held
        consumer.send(b"FIN " + second.id + b"\n")  # out of order: a range past confirmed
        reply = leader.http("POST", "/channel/fixconfirmed?topic=t&channel=c&partition=0")
        assert reply.status == 200, reply
        (after,) = publish_batch(leader, "t", "after", 1)
        (following,) = consumer.read_messages(1)
        assert following.body == after
        assert log_start(leader, "t") == start
    finally:
        consumer.close()


def test_fixdata_writes_corrupt_old_groups_again_from_another_replica(cluster):
    """Old data gone bad on a disk (zeroed blocks), on the leader and on the follower, each in
    a different group of a topic whose retention has run: `/topic/fixdata?checkcorrupt=true`
    on each node writes its groups again from the other replica's copy, and every
    acknowledged message is read, once."""
    cluster.create_writable_topic("t", 1, 2)
    leader = cluster.node_leading("t", 0)
    follower = _follower_of(cluster, "t")
    start = age_topic(cluster, "t")
    acked = publish_batch(leader, "t", "kept", 200)
    broken = {leader: zero_a_group(leader, "t", 0.25), follower: zero_a_group(follower, "t", 0.75)}
    assert broken[leader][3] >= start
    for node, entry in broken.items():
        assert corrupt_groups(node, "t") == [entry]
        reply = node.http("POST", "/topic/fixdata?topic=t&partition=0&checkcorrupt=true")
        assert (reply.status, reply.body) == (200, b""), reply
        assert corrupt_groups(node, "t") == []
    check_replicas_identical(cluster, "t", 1)
    assert drain(leader, "t", acked) == acked
