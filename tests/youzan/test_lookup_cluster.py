"""Partitioned topics across a cluster: 1 nsqlookupd and 2 nsqd processes (docs/protocol.md §5.3,
§5.6).

nsqlookupd's Youzan `POST /topic/create?partition_num=N&replicator=1` places the partitions on
the registered nsqds round-robin; each nsqd then registers the partitions it holds, and
`/lookup?access=w&metainfo=true` maps every partition to its nsqd once it has a channel.
`/disable/write` on nsqlookupd hides writers. Every daemon is a subprocess started the way
client harnesses start them (port 0, `-broadcast-address=127.0.0.1`); everything that depends
on a registration arriving is polled with a deadline.
"""

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest

from tests.harness import DaemonProcess, start_nsqd, start_nsqlookupd
from tests.support.http import HTTPReply, request
from tests.support.polling import poll

DEADLINE = 10.0
NO_CHANNEL = "Topic has no channel, should init at least one for the new topic"


@pytest.fixture(autouse=True)
def close_connections():
    """These tests open no V2 connections: the package's trio fixture is not needed."""
    yield


@dataclass
class Cluster:
    lookupd: DaemonProcess
    nsqds: list[DaemonProcess]

    def lookupd_http(self, method: str, target: str) -> HTTPReply:
        return request(self.lookupd.port("HTTP"), method, target)

    def lookup(self, topic: str, **params: str) -> HTTPReply:
        query = "&".join([f"topic={topic}", *(f"{k}={v}" for k, v in params.items())])
        return self.lookupd_http("GET", f"/lookup?{query}")

    def partitions_on(self, nsqd: DaemonProcess, topic: str) -> dict[int, dict]:
        """topic_partition -> the /stats topic, for each partition of `topic` on `nsqd`."""
        reply = request(nsqd.port("HTTP"), "GET", f"/stats?format=json&topic={topic}")
        assert reply.status == 200, reply
        return {t["topic_partition"]: t for t in reply.json()["topics"] or []}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    lookupd = start_nsqlookupd("-broadcast-address=127.0.0.1")
    directories = [tmp_path_factory.mktemp(f"nsqd{index}") for index in range(2)]
    flags = [
        f"-lookupd-tcp-address=127.0.0.1:{lookupd.port('TCP')}",
        "-broadcast-address=127.0.0.1",
    ]
    with ThreadPoolExecutor(max_workers=2) as pool:
        nsqds = list(pool.map(lambda directory: start_nsqd(directory, *flags), directories))
    cluster = Cluster(lookupd, nsqds)
    try:
        poll(
            lambda: len(cluster.lookupd_http("GET", "/nodes").json()["producers"]) == 2,
            "both nsqds in nsqlookupd's /nodes",
        )
        yield cluster
    finally:
        for daemon in [*nsqds, lookupd]:
            daemon.kill()


def test_topic_create_places_partitions_round_robin_and_lookup_maps_them(cluster):
    reply = cluster.lookupd_http("POST", "/topic/create?topic=t&partition_num=4&replicator=1")
    assert reply.status == 200, reply
    # Round-robin over the two nsqds: one holds 0 and 2, the other 1 and 3.
    held = {nsqd.port("TCP"): cluster.partitions_on(nsqd, "t") for nsqd in cluster.nsqds}
    assert sorted(sorted(partitions) for partitions in held.values()) == [[0, 2], [1, 3]]
    for partitions in held.values():
        for partition, stats in partitions.items():
            assert (stats["topic_name"], stats["topic_full_name"]) == ("t", f"t-{partition}")
    owner = {p: port for port, partitions in held.items() for p in partitions}

    # Registered but without channels: writers are told to make one first.
    def no_channel_yet():
        reply = cluster.lookup("t", access="w")
        return reply.status == 404 and reply.json() == {"message": NO_CHANNEL}

    poll(no_channel_yet, "access=w to refuse a topic with no channel")

    for nsqd in cluster.nsqds:
        for partition in cluster.partitions_on(nsqd, "t"):
            target = f"/channel/create?topic=t&channel=c&partition={partition}"
            assert request(nsqd.port("HTTP"), "POST", target).status == 200

    def all_partitions_writable():
        reply = cluster.lookup("t", access="w", metainfo="true")
        if reply.status != 200:
            return None
        document = reply.json()
        partitions = document["partitions"] or {}
        mapped = {int(p): peer["tcp_port"] for p, peer in partitions.items()}
        return document if mapped == owner else None

    document = poll(all_partitions_writable, "all 4 partitions in /lookup?access=w")
    assert list(document) == ["channels", "meta", "partitions", "producers"]
    assert document["channels"] == ["c"]
    assert document["meta"]["partition_num"] == 4
    assert document["meta"]["replica"] == 1
    assert document["meta"]["ordered"] is False
    for peer in document["partitions"].values():
        assert peer["broadcast_address"] == "127.0.0.1"
        assert "id" in peer and "distributed_id" in peer
        assert peer["http_port"] in {nsqd.port("HTTP") for nsqd in cluster.nsqds}
    assert sorted(p["tcp_port"] for p in document["producers"]) == sorted(held)
    # Without metainfo there is no meta.
    assert "meta" not in cluster.lookup("t", access="w").json()


@pytest.mark.parametrize(
    "query, message",
    [
        ("topic=r2&partition_num=4&replicator=2", None),
        ("topic=r6&partition_num=4&replicator=6", "INVALID_ARG_TOPIC_REPLICATOR"),
        ("topic=r0&partition_num=4", "MISSING_ARG_TOPIC_REPLICATOR"),
        ("topic=p0&partition_num=0&replicator=1", "INVALID_ARG_TOPIC_PARTITION_NUM"),
        ("topic=p256&partition_num=256&replicator=1", "INVALID_ARG_TOPIC_PARTITION_NUM"),
        ("topic=a!b&partition_num=4&replicator=1", "INVALID_ARG_TOPIC"),
        ("partition_num=4&replicator=1", "MISSING_ARG_TOPIC"),
    ],
    ids=[
        "replicator-2",
        "replicator-6",
        "no-replicator",
        "zero-partitions",
        "256-partitions",
        "bad-topic",
        "no-topic",
    ],
)
def test_topic_create_refuses(cluster, query, message):
    """400 for each bad parameter (docs/protocol.md §5.6); replicator > 1 is refused by an
    nsqlookupd that is not in a cluster (its message says how to start one). Nothing is
    placed on any nsqd."""
    reply = cluster.lookupd_http("POST", f"/topic/create?{query}")
    assert reply.status == 400, reply
    if message is not None:
        assert reply.json() == {"message": message}
    else:
        assert reply.json()["message"]
    _, named, rest = query.partition("topic=")
    if named:
        topic = rest.partition("&")[0]
        for nsqd in cluster.nsqds:
            assert cluster.partitions_on(nsqd, topic) == {}


def test_disable_write_hides_writers(cluster):
    reply = cluster.lookupd_http("POST", "/topic/create?topic=w&partition_num=2&replicator=1")
    assert reply.status == 200, reply
    for nsqd in cluster.nsqds:
        for partition in cluster.partitions_on(nsqd, "w"):
            target = f"/channel/create?topic=w&channel=c&partition={partition}"
            assert request(nsqd.port("HTTP"), "POST", target).status == 200

    def writable():
        reply = cluster.lookup("w", access="w")
        return reply.status == 200 and len(reply.json()["partitions"] or {}) == 2

    poll(writable, "both partitions of w writable")
    try:
        assert cluster.lookupd_http("POST", "/disable/write?type=all").status == 200
        reply = cluster.lookup("w", access="w")
        assert reply.status == 200, reply
        assert b'"partitions":null,"producers":null' in reply.body
        assert reply.json()["partitions"] is None and reply.json()["producers"] is None
        # Readers still find every partition.
        readable = cluster.lookup("w", access="r").json()
        assert sorted(readable["partitions"]) == ["0", "1"]
        # `ordered` hides only ordered topics; w is not one.
        assert cluster.lookupd_http("POST", "/disable/write?type=ordered").status == 200
        assert writable()
        assert cluster.lookupd_http("POST", "/disable/write?type=all").status == 200
        assert not writable()
    finally:
        # Anything else enables writes again.
        assert cluster.lookupd_http("POST", "/disable/write?type=none").status == 200
    assert writable()
    assert json.loads(cluster.lookup("w", access="w").body)["producers"]
