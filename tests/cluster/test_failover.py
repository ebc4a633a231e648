"""Failover on a cluster of real processes (docs/design.md §14): etcd, one nsqlookupd, three
nsqds, node leases of 2 s. Publishers retry on the new leader; a consumer drains at the end;
nothing acknowledged is lost, and the replicas' logs end byte-identical."""

import json
import time

import pytest

from nsqpy.common.command import encode_command, encode_dpub, encode_rdy
from nsqpy.common.frame import FRAME_TYPE_ERROR
from nsqpy.nsqd.cluster_partition import untold_finished
from tests.cluster.aging import AGED_NSQD_ARGS, age_topic, log_start
from tests.cluster.local_cluster import LocalCluster
from tests.cluster.traffic import check_replicas_identical, drain, publish, publish_numbered
from tests.harness import V2Connection
from tests.support.polling import poll


@pytest.fixture
def cluster(tmp_path, etcd_server):
    with LocalCluster(tmp_path, etcd_server, nsqd_args=("-sync-every=1",)) as running:
        yield running


def subscribed(node, topic: str) -> V2Connection:
    """A consumer of channel `c` of partition 0 on `node`, RDY 1."""
    consumer = V2Connection(node.tcp_port, timeout=15)
    consumer.send(b"SUB %s c 0\n" % topic.encode())
    assert consumer.read_response().data == b"OK"
    consumer.send(encode_rdy(1))
    return consumer


def requeue_once(cluster, leader, body: bytes, delay_ms: int):
    """Publish `body` to `t`, receive it on `leader` and REQ it with `delay_ms`: the message
    and when it was requeued (monotonic)."""
    publish(cluster, "t", body)
    consumer = subscribed(leader, "t")
    try:
        (message,) = consumer.read_messages(1)
        consumer.send(b"REQ " + message.id + b" %d\n" % delay_ms)
        return message, time.monotonic()
    finally:
        consumer.close()


def followers_of(cluster, leader) -> list:
    """The other ISR members of partition 0 of `t`."""
    return [cluster.node(n) for n in cluster.partition("t", 0)["isr"] if n != leader.node_id]


def leader_with_dpubs(cluster, delay_ms: int, *bodies: bytes):
    """Topic `t` (1 partition, 3 replicas) with channel `c`, and a DPUB of each body on its
    leader: the leader, and when the first DPUB was sent (monotonic)."""
    cluster.create_topic("t", 1, 3)
    leader = cluster.node_leading("t", 0)
    assert leader.http("POST", "/channel/create?topic=t&channel=c&partition=0").status == 200
    connection = V2Connection(leader.tcp_port)
    try:
        sent = time.monotonic()
        for body in bodies:
            connection.send(encode_dpub("t", delay_ms, body))
            assert connection.read_response().data == b"OK"
    finally:
        connection.close()
    return leader, sent


def first_message(node, topic: str):
    """The first message `node` delivers on channel `c` of partition 0."""
    consumer = subscribed(node, topic)
    try:
        (message,) = consumer.read_messages(1)
    finally:
        consumer.close()
    return message


def log_files(node, topic: str) -> dict[str, bytes]:
    return {
        path.name: path.read_bytes()
        for path in sorted((node.data_path / topic).iterdir())
        if path.name.endswith(".commit.log") or ".diskqueue.0" in path.name
    }


def test_a_killed_leader_is_replaced_and_comes_back_as_a_follower(cluster):
    cluster.create_topic("t", 1, 3)
    old = cluster.node_leading("t", 0)
    channel = old.http("POST", "/channel/create?topic=t&channel=c&partition=0")
    assert channel.status == 200, channel
    acked = publish_numbered(cluster, "t", "before", 30)
    old.kill()
    killed_at = time.monotonic()
    unavailable = publish(cluster, "t", b"during")
    acked.add(b"during")
    new = cluster.node_leading("t", 0)
    assert new is not old
    assert unavailable < 10, unavailable
    acked |= publish_numbered(cluster, "t", "after", 30)
    info = cluster.partition("t", 0)
    assert old.node_id not in info["isr"] and old.node_id in info["catchup"]
    assert info["write_epoch"] >= 2
    old.start()
    poll(lambda: old.node_id in cluster.partition("t", 0)["isr"], "the old leader rejoining")
    assert cluster.node_leading("t", 0) is new
    publish(cluster, "t", b"last")
    acked.add(b"last")
    received = drain(new, "t", acked)
    assert acked <= received
    expected = log_files(new, "t")
    for node in cluster.nodes:
        poll(lambda n=node: log_files(n, "t") == expected, f"{node.node_id} identical")
    print(f"failover: write unavailability {unavailable:.2f} s after kill -9 at {killed_at:.0f}")


def test_a_frozen_leader_is_replaced_and_cannot_write_when_it_thaws(cluster):
    """SIGSTOP past the lease: a new leader is elected. SIGCONT: the old leader's next write
    is refused by the followers (fencing), it steps down and catches up."""
    cluster.create_topic("t", 1, 3)
    old = cluster.node_leading("t", 0)
    assert old.http("POST", "/channel/create?topic=t&channel=c&partition=0").status == 200
    acked = publish_numbered(cluster, "t", "before", 10)
    old.pause()
    try:
        unavailable = publish(cluster, "t", b"during")
        acked.add(b"during")
        new = cluster.node_leading("t", 0)
        assert new is not old and unavailable < 10
    finally:
        old.resume()
    # The thawed node learns it was replaced: it refuses publishes and rejoins as a follower.
    poll(
        lambda: (
            old.node_id in cluster.partition("t", 0)["isr"] and cluster.node_leading("t", 0) is new
        ),
        "the thawed leader back as a follower",
    )
    connection = V2Connection(old.tcp_port)
    try:
        connection.send(encode_command(b"PUB", b"t", b"0", body=b"to the old leader"))
        frame = connection.read_response()
        assert (frame.frame_type, frame.data) == (FRAME_TYPE_ERROR, b"E_FAILED_ON_NOT_LEADER ")
    finally:
        connection.close()
    acked |= publish_numbered(cluster, "t", "after", 10)
    assert acked <= drain(new, "t", acked)
    expected = log_files(new, "t")
    for node in cluster.nodes:
        poll(lambda n=node: log_files(n, "t") == expected, f"{node.node_id} identical")


def test_a_killed_follower_leaves_the_isr_and_rejoins_after_a_restart(cluster):
    cluster.create_topic("t", 1, 3)
    leader = cluster.node_leading("t", 0)
    follower = cluster.node(cluster.partition("t", 0)["isr"][1])
    assert leader.http("POST", "/channel/create?topic=t&channel=c&partition=0").status == 200
    acked = publish_numbered(cluster, "t", "before", 10)
    follower.kill()
    # The leader keeps taking writes: the follower leaves the ISR (the leader asks, or the
    # master sees its lease end), and 2 of 3 is still a majority.
    acked |= publish_numbered(cluster, "t", "while down", 10)
    info = cluster.partition("t", 0)
    assert follower.node_id not in info["isr"] and follower.node_id in info["catchup"]
    assert cluster.node_leading("t", 0) is leader
    follower.start()
    poll(lambda: follower.node_id in cluster.partition("t", 0)["isr"], "the follower back")
    acked |= publish_numbered(cluster, "t", "after", 10)
    assert acked <= drain(leader, "t", acked)
    expected = log_files(leader, "t")
    for node in cluster.nodes:
        poll(lambda n=node: log_files(n, "t") == expected, f"{node.node_id} identical")


def test_leaders_keep_serving_while_etcd_restarts(cluster, etcd_server):
    cluster.create_topic("t", 1, 3)
    leader = cluster.node_leading("t", 0)
    assert leader.http("POST", "/channel/create?topic=t&channel=c&partition=0").status == 200
    acked = set()
    etcd_server.kill()
    for i in range(10):
        assert publish(cluster_leader_only(leader), "t", b"etcd down %d" % i) < 5
        acked.add(b"etcd down %d" % i)
    etcd_server.start()
    acked |= publish_numbered(cluster, "t", "etcd back", 10)
    assert cluster.node_leading("t", 0) is leader
    assert acked <= drain(leader, "t", acked)


class cluster_leader_only:
    """A stand-in for `cluster` in `publish` while nsqlookupd cannot answer from etcd: the
    leader is known."""

    def __init__(self, leader) -> None:
        self.leader = leader

    def node_leading(self, topic: str, partition: int):
        return self.leader


def test_a_new_leader_resumes_consumption_near_the_old_leaders_cursor(cluster):
    """The leader sends its channels' confirmed positions to the followers every
    `--sync-timeout` (200 ms here): after a failover the consumer gets what it had not
    finished, and at most what was finished since the last such update again."""
    cluster.create_topic("t", 1, 3)
    old = cluster.node_leading("t", 0)
    assert old.http("POST", "/channel/create?topic=t&channel=c&partition=0").status == 200
    bodies = [b"m%03d" % i for i in range(100)]
    for body in bodies:
        publish(cluster, "t", body)
    finished: set[bytes] = set()
    connection = V2Connection(old.tcp_port)
    try:
        connection.send(b"SUB t c 0\n")
        assert connection.read_response().data == b"OK"
        connection.send(encode_rdy(1))
        for _ in range(60):
            (message,) = connection.read_messages(1)
            finished.add(message.body)
            connection.send(b"FIN " + message.id + b"\n")
            connection.send(encode_rdy(1))
    finally:
        connection.close()
    follower = cluster.node(cluster.partition("t", 0)["isr"][1])

    def confirmed_on_follower() -> bool:
        reply = follower.http("GET", "/stats?format=json&topic=t&channel=c")
        topics = json.loads(reply.body)["topics"]
        channels = topics[0]["channels"] if topics else []
        return bool(channels) and channels[0].get("confirmed_count") == 60

    poll(confirmed_on_follower, "the cursor on the followers")
    old.kill()
    new = poll(lambda: cluster.node_leading("t", 0), "a new leader")
    received = drain(new, "t", set(bodies) - finished)
    assert received == set(bodies) - finished, sorted(received & finished)[:5]


def test_a_cleanly_stopped_leader_is_replaced_without_waiting_for_its_lease(tmp_path, etcd_server):
    """SIGTERM: the node ends its lease as it stops, so the master moves its partitions at
    once (a rolling restart costs no TTL)."""
    with LocalCluster(tmp_path, etcd_server, ttl=30.0) as cluster:
        cluster.create_topic("t", 1, 3)
        old = cluster.node_leading("t", 0)
        publish(cluster, "t", b"before")
        old.stop()
        stopped = time.monotonic()
        publish(cluster, "t", b"after", deadline=10)
        assert time.monotonic() - stopped < 10  # a 30 s lease would not have ended yet
        assert cluster.node_leading("t", 0) is not old


@pytest.mark.parametrize("subscribe", ["SUB", "SUB_ORDERED"])
def test_a_channels_cursor_reaches_the_followers_on_every_fin(tmp_path, etcd_server, subscribe):
    """Each FIN's new cursor goes to the followers at once, coalesced (Youzan replicates an
    ordered cursor synchronously, others on a timer), not at the next `--sync-timeout` (30 s
    here): after a failover the consumer continues right after its last FIN."""
    # SUB_ORDERED messages start with a 12-byte detail (offset and size).
    detail = 12 if subscribe == "SUB_ORDERED" else 0
    with LocalCluster(tmp_path, etcd_server, nsqd_args=("-sync-timeout=30s",)) as cluster:
        cluster.create_topic("t", 1, 3)
        old = cluster.node_leading("t", 0)
        assert old.http("POST", "/channel/create?topic=t&channel=c&partition=0").status == 200
        bodies = [b"m%03d" % i for i in range(50)]
        for body in bodies:
            publish(cluster, "t", body)
        connection = V2Connection(old.tcp_port)
        try:
            connection.send(b"%s t c 0\n" % subscribe.encode())
            assert connection.read_response().data == b"OK"
            connection.send(encode_rdy(1))
            for expected in bodies[:30]:
                (message,) = connection.read_messages(1)
                assert message.body[detail:] == expected
                connection.send(b"FIN " + message.id + b"\n")
            follower = cluster.node(cluster.partition("t", 0)["isr"][1])

            def follower_confirmed() -> bool:
                reply = follower.http("GET", "/stats?format=json&topic=t&channel=c")
                channels = json.loads(reply.body)["topics"][0]["channels"]
                return bool(channels) and channels[0].get("confirmed_count") == 30

            poll(follower_confirmed, "the cursor on a follower", timeout=10)
        finally:
            connection.close()
        old.kill()
        new = poll(lambda: cluster.node_leading("t", 0), "a new leader")
        consumer = V2Connection(new.tcp_port)
        try:
            consumer.send(b"%s t c 0\n" % subscribe.encode())
            assert consumer.read_response().data == b"OK"
            consumer.send(encode_rdy(1))
            (message,) = consumer.read_messages(1)
            assert message.body[detail:] == bodies[30]
        finally:
            consumer.close()


def test_a_deferred_message_still_waits_on_the_new_leader(cluster):
    """A DPUB's due time travels with its group: after a failover the new leader holds the
    message until then, as the old one would have."""
    old, published_at = leader_with_dpubs(cluster, 6000, b"later")
    old.kill()
    new = poll(lambda: cluster.node_leading("t", 0), "a new leader")
    message = first_message(new, "t")
    waited = time.monotonic() - published_at
    assert message.body == b"later"
    assert waited >= 5.5, f"delivered {waited:.1f} s after a 6 s DPUB"


def delayed_count(node, topic: str) -> int:
    """How many messages of channel `c` of partition 0 wait in `node`'s delay queue."""
    reply = node.http("GET", f"/stats?format=json&topic={topic}&include_mem=false")
    assert reply.status == 200, reply
    for entry in json.loads(reply.body)["topics"] or ():
        for channel in entry["channels"]:
            if channel["channel_name"] == "c":
                return channel["delayed_queue_count"]
    return 0


def test_a_message_moved_to_the_delay_queue_comes_when_due_from_the_new_leader(
    tmp_path, etcd_server
):
    """A REQ long enough to move the message to the delay queue writes its copy through the
    partition's replication: every follower's delay queue holds it, and after the leader's
    kill -9 the new leader delivers it when it is due, not before."""
    with LocalCluster(
        tmp_path, etcd_server, nsqd_args=("-sync-every=1", "-req-to-end-threshold=1s")
    ) as cluster:
        cluster.create_topic("t", 1, 3)
        old = cluster.node_leading("t", 0)
        assert old.http("POST", "/channel/create?topic=t&channel=c&partition=0").status == 200
        message, requeued_at = requeue_once(cluster, old, b"retry much later", 6000)
        followers = followers_of(cluster, old)
        poll(
            lambda: all(delayed_count(node, "t") == 1 for node in [old, *followers]),
            "the move in every replica's delay queue",
            timeout=5,
        )
        old.kill()
        new = poll(lambda: cluster.node_leading("t", 0), "a new leader")
        again = first_message(new, "t")
        waited = time.monotonic() - requeued_at
        assert (again.body, again.id) == (b"retry much later", message.id)
        assert waited >= 5.5, f"delivered {waited:.1f} s after a 6 s REQ"


def test_a_finished_delayed_message_does_not_come_again_from_the_new_leader(cluster):
    """The FIN of a message from the delay queue reaches the followers with the channels'
    positions: after the leader's kill -9 the new leader does not give it out again."""
    old, _sent = leader_with_dpubs(cluster, 1000, b"once")
    followers = followers_of(cluster, old)
    poll(
        lambda: all(delayed_count(node, "t") == 1 for node in followers),
        "the DPUB in every follower's delay queue",
    )
    consumer = subscribed(old, "t")
    try:
        (message,) = consumer.read_messages(1)
        assert message.body == b"once"
        consumer.send(b"FIN " + message.id + b"\n")
        poll(
            lambda: all(delayed_count(node, "t") == 0 for node in [old, *followers]),
            "the FIN in every replica's delay queue",
        )
    finally:
        consumer.close()
    old.kill()
    new = poll(lambda: cluster.node_leading("t", 0), "a new leader")
    assert delayed_count(new, "t") == 0
    publish(cluster, "t", b"after")
    assert first_message(new, "t").body == b"after"


def test_finishing_and_emptying_the_leaders_delay_queue_reach_the_followers(cluster):
    """/message/finish of a delayed message and /channel/emptydelayed on the leader reach the
    followers with the next cursor push: the new leader after a kill -9 holds none of them."""
    old, _sent = leader_with_dpubs(cluster, 3_000_000, b"d1", b"d2")
    followers = followers_of(cluster, old)
    message, _requeued = requeue_once(cluster, old, b"moved", 1_000_000)  # over 15 min
    poll(
        lambda: all(delayed_count(node, "t") == 3 for node in followers),
        "three in every follower's delay queue",
    )
    # A partition's consumer speaks Youzan's dialect: its binary ID starts with the decimal
    # `msgid` Youzan's route takes.
    query = f"topic=t&channel=c&partition=0&msgid={int.from_bytes(message.id[:8], 'big')}"
    assert old.http("POST", f"/message/finish?{query}").status == 200
    poll(
        lambda: all(delayed_count(node, "t") == 2 for node in followers),
        "the finished one gone from every follower",
    )
    assert old.http("POST", "/channel/emptydelayed?topic=t&channel=c&partition=0").status == 200
    poll(
        lambda: all(delayed_count(node, "t") == 0 for node in followers),
        "the emptied ones gone from every follower",
    )
    old.kill()
    new = poll(lambda: cluster.node_leading("t", 0), "a new leader")
    http = new.http("POST", "/channel/requeuedelayed?topic=t&channel=c&partition=0")
    assert http.status == 200
    publish(cluster, "t", b"after")
    assert first_message(new, "t").body == b"after"


def test_a_message_finished_while_its_move_to_the_delay_queue_is_written_leaves_every_replica(
    cluster,
):
    """A REQ past the threshold moves the message to the delay queue with a replicated write;
    a /message/finish that lands while that write is under way finishes it in memory. The
    copy the write then puts in every replica's delay queue goes again, on the followers
    too (they would otherwise give a finished message out after a failover)."""
    old, _sent = leader_with_dpubs(cluster, 3_000_000, b"kept")
    followers = followers_of(cluster, old)
    finished = 0
    for number in range(8):
        publish(cluster, "t", b"raced-%d" % number)
        consumer = subscribed(old, "t")
        try:
            (message,) = consumer.read_messages(1)
            msgid = int.from_bytes(message.id[:8], "big")
            # The REQ and the finish back to back: the finish often comes while the move's
            # write is being replicated.
            consumer.send(b"REQ " + message.id + b" 1000000\n")
            query = f"topic=t&channel=c&partition=0&msgid={msgid}"
            if old.http("POST", f"/message/finish?{query}").status == 200:
                finished += 1
        finally:
            consumer.close()
    assert finished >= 1
    expected = 1 + 8 - finished
    poll(
        lambda: all(delayed_count(node, "t") == expected for node in [old, *followers]),
        lambda: (
            f"{expected} delayed on every replica, not"
            f" {[delayed_count(node, 't') for node in [old, *followers]]}\n{cluster.describe()}"
        ),
    )


def test_a_cursor_push_that_ends_after_a_later_one_keeps_what_it_did_not_tell():
    """Two cursor pushes of a partition at once (the `--sync-timeout` timer's and a FIN's).
    The first's header named x; y was finished, the second's header named x and y, and the
    second ended first; z was finished since. The first, ending now, forgets nothing but x:
    z stays for the next push (forgotten by a count, z went and a follower kept it)."""
    finished = [b"x"]
    first = ["x"]
    finished.append(b"y")
    second = ["x", "y"]
    finished = untold_finished(finished, [second, second])
    assert finished == []
    finished.append(b"z")
    assert untold_finished(finished, [first, first]) == [b"z"]


def test_a_finished_delayed_message_is_forgotten_once_every_follower_was_told():
    # One follower's header was made before y was finished, the other's after.
    assert untold_finished([b"x", b"y"], [["x"], ["x", "y"]]) == [b"y"]
    assert untold_finished([b"x"], []) == [b"x"]


def test_a_replica_gone_for_good_is_placed_on_another_node_which_catches_up(tmp_path, etcd_server):
    with LocalCluster(
        tmp_path,
        etcd_server,
        nsqd_args=("-sync-every=1", *AGED_NSQD_ARGS),
        lookupd_args=("-cluster-replace-dead-after=1s",),
    ) as cluster:
        cluster.create_topic("t", 1, 2)
        info = cluster.partition("t", 0)
        leader = cluster.node(info["leader"])
        gone = cluster.node(info["isr"][1])
        spare = next(node for node in cluster.nodes if node.node_id not in info["isr"])
        assert leader.http("POST", "/channel/create?topic=t&channel=c&partition=0").status == 200
        # Retention has run: the spare copies a log that starts past 0.
        start = age_topic(cluster, "t")
        acked = publish_numbered(cluster, "t", "before", 20)
        gone.kill()
        # Two replicas, one gone: no writes until the spare node has caught up and joined.
        # The master drops the gone node from the catch-up list in its next pass after that.
        poll(
            lambda: (
                (entry := cluster.partition("t", 0))["isr"] == [leader.node_id, spare.node_id]
                and gone.node_id not in entry["catchup"]
            ),
            "the spare node in the ISR and the gone one dropped",
            timeout=30,
        )
        acked |= publish_numbered(cluster, "t", "after", 20)
        check_replicas_identical(cluster, "t", 1)
        assert log_start(spare, "t") == start
        assert drain(leader, "t", acked) >= acked


def test_a_requeued_messages_delay_still_holds_on_the_new_leader(cluster):
    """A REQ's delay reaches the followers at once: after a failover the new leader holds the
    message until it is due, as the old one would have."""
    cluster.create_topic("t", 1, 3)
    old = cluster.node_leading("t", 0)
    assert old.http("POST", "/channel/create?topic=t&channel=c&partition=0").status == 200
    _message, requeued_at = requeue_once(cluster, old, b"retry later", 6000)
    followers = followers_of(cluster, old)

    def known_to_the_followers() -> bool:
        # Each follower keeps its channels' deferred messages in `<log>:<channel>.delayed.json`.
        return all(
            any(
                b'"0"' in path.read_bytes()
                for path in (node.data_path / "t").glob("*:c.delayed.json")
            )
            for node in followers
        )

    poll(known_to_the_followers, "the delay on both followers", timeout=5)
    old.kill()
    new = poll(lambda: cluster.node_leading("t", 0), "a new leader")
    again = first_message(new, "t")
    waited = time.monotonic() - requeued_at
    assert again.body == b"retry later"
    assert waited >= 5.5, f"delivered {waited:.1f} s after a 6 s REQ"


def test_a_skipped_channel_stays_skipped_on_the_new_leader(cluster):
    """Youzan's `/channel/skip` on the leader reaches its followers before the answer; the
    node that leads after a `kill -9` drops what is published as the old one did, and an
    unskip there delivers what comes after it."""
    cluster.create_topic("t", 1, 3)
    old = cluster.node_leading("t", 0)
    assert old.http("POST", "/channel/create?topic=t&channel=c&partition=0").status == 200
    reply = old.http("POST", "/channel/skip?topic=t&channel=c&partition=0")
    assert reply.status == 200, reply
    for follower in followers_of(cluster, old):
        stats = follower.http("GET", "/stats?format=json&topic=t&channel=c")
        assert json.loads(stats.body)["topics"][0]["channels"][0]["skipped"] is True
    publish(cluster, "t", b"dropped before")
    old.kill()
    publish(cluster, "t", b"dropped after")
    new = cluster.node_leading("t", 0)
    assert new is not old

    def channel_on_new() -> dict:
        stats = new.http("GET", "/stats?format=json&topic=t&channel=c")
        return json.loads(stats.body)["topics"][0]["channels"][0]

    # Nobody consumes: only a skipped channel is at the end.
    poll(
        lambda: (c := channel_on_new())["skipped"] and c["depth"] == 0,
        lambda: f"the new leader's channel skipped to the end: {channel_on_new()}",
    )
    reply = new.http("POST", "/channel/unskip?topic=t&channel=c&partition=0")
    assert reply.status == 200, reply
    publish(cluster, "t", b"kept")
    consumer = subscribed(new, "t")
    try:
        (message,) = consumer.read_messages(1)
        assert message.body == b"kept"
    finally:
        consumer.close()
