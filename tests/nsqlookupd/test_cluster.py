"""Two nsqlookupd and three nsqd processes on 127.0.0.1, started as harnesses start them.

Every nsqd is given both `-lookupd-tcp-address` flags and `-broadcast-address=127.0.0.1`, so
each lookupd sees all three. The tests check that what happens on the nsqds (topics and
channels made over HTTP or by PUB/SUB, an nsqd killed, a lookupd restarted, the lookupd list
changed at run time) shows in both lookupds' /lookup, polling with a deadline.
"""

import json
import struct
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest

from tests.harness import DaemonProcess, V2Connection, start_nsqd, start_nsqlookupd
from tests.support.http import get_json, post, request
from tests.support.polling import poll

REGISTER_DEADLINE = 1.0  # nsqd sends REGISTER as soon as a topic or channel is made
RECONNECT_DEADLINE = 10.0


def in_parallel(function, items) -> list:
    with ThreadPoolExecutor(max_workers=len(items)) as pool:
        return list(pool.map(function, items))


@dataclass
class Cluster:
    lookupds: list[DaemonProcess]
    nsqds: list[DaemonProcess]

    def lookupd_http_ports(self) -> list[int]:
        return [lookupd.port("HTTP") for lookupd in self.lookupds]

    def lookupd_tcp_addresses(self) -> list[str]:
        return [f"127.0.0.1:{lookupd.port('TCP')}" for lookupd in self.lookupds]


def lookup(http_port: int, topic: str) -> tuple[set[int], list[str]] | None:
    """(tcp ports of the producers, channels) of /lookup, None when the topic is unknown."""
    reply = request(http_port, "GET", f"/lookup?topic={topic}")
    if reply.status == 404:
        return None
    assert reply.status == 200, reply
    document = reply.json()
    for producer in document["producers"]:
        assert producer["broadcast_address"] == "127.0.0.1"
    return {producer["tcp_port"] for producer in document["producers"]}, document["channels"]


def wait_for_lookup(cluster, topic, ports, channels, timeout=REGISTER_DEADLINE, lookupds=None):
    """Poll until every lookupd's /lookup?topic= lists exactly these producers and channels."""
    expected = (set(ports), channels)
    for http_port in lookupds or cluster.lookupd_http_ports():
        poll(
            lambda port=http_port: lookup(port, topic) == expected,
            f"lookupd :{http_port} to list {topic}: {expected}, has {lookup(http_port, topic)}",
            timeout=timeout,
        )


@pytest.fixture
def cluster(tmp_path):
    lookupds = in_parallel(lambda _: start_nsqlookupd(), range(2))
    flags = [f"-lookupd-tcp-address=127.0.0.1:{lookupd.port('TCP')}" for lookupd in lookupds]
    directories = [tmp_path / f"nsqd{index}" for index in range(3)]
    for directory in directories:
        directory.mkdir()
    nsqds = in_parallel(
        lambda directory: start_nsqd(directory, *flags, "-broadcast-address=127.0.0.1"),
        directories,
    )
    cluster = Cluster(lookupds, nsqds)
    try:
        # Every nsqd has identified itself to both lookupds.
        for http_port in cluster.lookupd_http_ports():
            poll(
                lambda port=http_port: len(get_json(port, "/nodes")["producers"]) == 3,
                "three nsqds in /nodes",
            )
        yield cluster
    finally:
        in_parallel(lambda daemon: daemon.kill(), [*cluster.nsqds, *cluster.lookupds])


def pub(nsqd: DaemonProcess, topic: str, body: bytes = b"hello") -> None:
    connection = V2Connection(nsqd.port("TCP"))
    try:
        connection.send(f"PUB {topic}\n".encode() + struct.pack(">I", len(body)) + body)
        assert connection.read_response().data == b"OK"
    finally:
        connection.close()


def test_topics_and_channels_show_in_both_lookupds(cluster):
    first, second, third = cluster.nsqds
    ports = [nsqd.port("TCP") for nsqd in cluster.nsqds]
    # Over HTTP on the first.
    post(first.port("HTTP"), "/topic/create?topic=made")
    wait_for_lookup(cluster, "made", ports[:1], [])
    post(first.port("HTTP"), "/channel/create?topic=made&channel=c1")
    wait_for_lookup(cluster, "made", ports[:1], ["c1"])
    # PUB on the second creates the topic there.
    pub(second, "made")
    wait_for_lookup(cluster, "made", ports[:2], ["c1"])
    # SUB on the third creates topic and channel there.
    subscriber = V2Connection(third.port("TCP"))
    try:
        subscriber.send(b"SUB made c2\n")
        assert subscriber.read_response().data == b"OK"
        wait_for_lookup(cluster, "made", ports, ["c1", "c2"])
        # Every lookupd's /nodes shows every nsqd's topic.
        for http_port in cluster.lookupd_http_ports():
            nodes = get_json(http_port, "/nodes")["producers"]
            assert {node["tcp_port"] for node in nodes if "made" in node["topics"]} == set(ports)
    finally:
        subscriber.close()

    # A channel and a topic deleted on an nsqd are unregistered.
    post(first.port("HTTP"), "/channel/delete?topic=made&channel=c1")
    post(second.port("HTTP"), "/topic/delete?topic=made")

    def unregistered(port: int) -> bool:
        document = get_json(port, "/lookup?topic=made")
        if {p["tcp_port"] for p in document["producers"]} != {ports[0], ports[2]}:
            return False
        # No registration of c1 is left with the first nsqd as its producer.
        debug = get_json(port, "/debug")
        return not [
            entry
            for key, entries in debug.items()
            if key.startswith("channel:made:c1")
            for entry in entries
            if entry["tcp_port"] == ports[0]
        ]

    for http_port in cluster.lookupd_http_ports():
        poll(
            lambda port=http_port: unregistered(port),
            "the deletes to show",
            timeout=REGISTER_DEADLINE,
        )


def test_killed_nsqd_leaves_lookup(cluster):
    ports = [nsqd.port("TCP") for nsqd in cluster.nsqds]
    for nsqd in cluster.nsqds:
        pub(nsqd, "t")
    wait_for_lookup(cluster, "t", ports, [])
    cluster.nsqds[2].kill()
    # The connection closes with the process: its registrations go at once.
    wait_for_lookup(cluster, "t", ports[:2], [], timeout=5.0)
    for http_port in cluster.lookupd_http_ports():
        nodes = get_json(http_port, "/nodes")["producers"]
        assert sorted(node["tcp_port"] for node in nodes) == sorted(ports[:2])


def test_restarted_lookupd_learns_everything_again(cluster):
    ports = [nsqd.port("TCP") for nsqd in cluster.nsqds]
    for index, nsqd in enumerate(cluster.nsqds):
        post(nsqd.port("HTTP"), "/topic/create?topic=t")
        post(nsqd.port("HTTP"), f"/channel/create?topic=t&channel=c{index}")
    post(cluster.nsqds[0].port("HTTP"), "/topic/create?topic=lonely")
    wait_for_lookup(cluster, "t", ports, ["c0", "c1", "c2"])

    old = cluster.lookupds[1]
    tcp_port, http_port = old.port("TCP"), old.port("HTTP")
    old.kill()
    # Started at once on the same ports, as harnesses do (SO_REUSEADDR).
    cluster.lookupds[1] = start_nsqlookupd(tcp_port=tcp_port, http_port=http_port)
    assert get_json(http_port, "/topics") == {"topics": []}
    wait_for_lookup(
        cluster, "t", ports, ["c0", "c1", "c2"], RECONNECT_DEADLINE, lookupds=[http_port]
    )
    wait_for_lookup(cluster, "lonely", ports[:1], [], RECONNECT_DEADLINE, lookupds=[http_port])
    assert get_json(http_port, "/topics") == {"topics": ["lonely", "t"]}


def test_lookupd_list_changes_at_run_time(cluster):
    nsqd = cluster.nsqds[0]
    ports = [each.port("TCP") for each in cluster.nsqds]
    first, second = cluster.lookupd_tcp_addresses()
    first_http, second_http = cluster.lookupd_http_ports()
    for each in cluster.nsqds:
        pub(each, "t")
    wait_for_lookup(cluster, "t", ports, [])

    def set_lookupds(addresses: list[str]) -> None:
        body = json.dumps(addresses).encode()
        reply = request(nsqd.port("HTTP"), "PUT", "/config/nsqlookupd_tcp_addresses", body)
        assert reply.status == 200, reply
        assert reply.json() == addresses
        assert get_json(nsqd.port("HTTP"), "/config/nsqlookupd_tcp_addresses") == addresses

    # Removing the second lookupd closes that connection: it forgets this nsqd.
    set_lookupds([first])
    wait_for_lookup(cluster, "t", ports[1:], [], 5.0, lookupds=[second_http])
    wait_for_lookup(cluster, "t", ports, [], lookupds=[first_http])
    # Adding it back registers everything again.
    set_lookupds([first, second])
    wait_for_lookup(cluster, "t", ports, [], 5.0)
    # And with none, both forget it.
    set_lookupds([])
    wait_for_lookup(cluster, "t", ports[1:], [], 5.0)
