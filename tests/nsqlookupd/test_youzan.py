"""Youzan's /lookup parameters and /listlookup (docs/protocol.md §5.3, §5.4, §8 rows 7-13).

Partitioned peers (an IDENTIFY with a distributed_id, or an "HA" version) register
`REGISTER t p [c]`; classic peers `REGISTER t [c]`. The bodies are compared field for field
with docs/protocol.md §5.3, including key order: Go marshals the response as a map, so the
top-level keys
come sorted (channels, meta, partitions, producers) and so do meta's, while PEER objects follow
Youzan's PeerInfo struct (id, remote_address, hostname, broadcast_address, tcp_port, http_port,
version, distributed_id). Where docs/protocol.md is silent the behaviour is that of Youzan's
nsqlookupd/http.go (doLookup), e.g. which channels a `partition=` filter lists.
"""

import pytest

from tests.nsqlookupd.support import (
    CLASSIC_IDENTIFY,
    YOUZAN_IDENTIFY,
    identified_peer,
    identify_body,
    lookup,
)
from tests.support.http import raw_get_json, raw_request

PEER_KEYS = [
    "id",
    "remote_address",
    "hostname",
    "broadcast_address",
    "tcp_port",
    "http_port",
    "version",
    "distributed_id",
]
NO_CHANNEL = "Topic has no channel, should init at least one for the new topic"
SECOND_NODE = identify_body(
    YOUZAN_IDENTIFY,
    tcp_port=25250,
    http_port=25251,
    hostname="youzan-2",
    distributed_id="127.0.0.1:25260:25250:2",
)


def peer_object(peer) -> dict:
    """The PEER object /lookup must give for this peer (docs/protocol.md §5.3)."""
    info = peer.info
    return {
        "id": peer.local_address,
        "remote_address": peer.local_address,
        "hostname": info["hostname"],
        "broadcast_address": info["broadcast_address"],
        "tcp_port": info["tcp_port"],
        "http_port": info["http_port"],
        "version": info["version"],
        "distributed_id": info.get("distributed_id", ""),
    }


def by_id(producers: list[dict]) -> list[dict]:
    """Youzan collects producers in a Go map: their order is not part of the contract."""
    return sorted(producers, key=lambda producer: producer.get("id", producer["remote_address"]))


async def lookup_json(port: int, topic: str, status: int = 200, **params: str):
    reply = await lookup(port, topic, **params)
    assert reply.status == status, reply
    return reply.json()


@pytest.fixture
async def two_nodes(nsqlookupd):
    """Two partitioned nodes of topic t: partition 0 on the first, 1 on the second, each with
    a channel."""
    first = await identified_peer(nsqlookupd.tcp_port, YOUZAN_IDENTIFY)
    second = await identified_peer(nsqlookupd.tcp_port, SECOND_NODE)
    await first.register("t", "ch", partition=0)
    await second.register("t", "ch", partition=1)
    yield first, second
    for peer in (first, second):
        await peer.aclose()


async def test_lookup_for_writers_with_metainfo(nsqlookupd, two_nodes):
    first, second = two_nodes
    port = nsqlookupd.http_port
    reply = await lookup(port, "t", access="w", metainfo="true")
    assert reply.status == 200
    assert reply.header("Content-Type") == "application/json; charset=utf-8"
    document = reply.json()
    assert list(document) == ["channels", "meta", "partitions", "producers"]
    assert document["channels"] == ["ch"]
    meta = document["meta"]
    assert list(meta) == sorted(meta)
    assert meta == {
        "disable_channel_auto_create": False,
        "extend_support": False,
        "multi_part": False,
        "ordered": False,
        "partition_num": 2,
        "replica": 1,
    }
    assert all(type(meta[key]) is bool for key in meta if key not in ("partition_num", "replica"))
    assert list(document["partitions"]) == ["0", "1"]
    assert document["partitions"] == {"0": peer_object(first), "1": peer_object(second)}
    for peer in [*document["partitions"].values(), *document["producers"]]:
        assert list(peer) == PEER_KEYS
    assert by_id(document["producers"]) == by_id([peer_object(first), peer_object(second)])


async def test_lookup_for_readers(nsqlookupd, two_nodes):
    first, second = two_nodes
    document = await lookup_json(nsqlookupd.http_port, "t", access="r")
    assert list(document) == ["channels", "partitions", "producers"]
    assert document["channels"] == ["ch"]
    assert document["partitions"] == {"0": peer_object(first), "1": peer_object(second)}
    assert by_id(document["producers"]) == by_id([peer_object(first), peer_object(second)])
    # Without access it is a read, too.
    assert await lookup_json(nsqlookupd.http_port, "t") == document


async def test_any_metainfo_value_turns_meta_on(nsqlookupd, two_nodes):
    port = nsqlookupd.http_port
    assert "meta" in await lookup_json(port, "t", metainfo="false")
    assert "meta" in await lookup_json(port, "t", access="r", metainfo="1")
    assert "meta" not in await lookup_json(port, "t", metainfo="")


@pytest.mark.parametrize("access", ["x", "rw", "W", "read"])
async def test_unknown_access_mode_is_rejected(nsqlookupd, two_nodes, access):
    reply = await lookup(nsqlookupd.http_port, "t", access=access)
    assert (reply.status, reply.message) == (400, "INVALID_ACCESS_MODE")


async def test_unknown_topic_is_404_with_youzan_parameters_too(nsqlookupd):
    """docs/protocol.md §8 row 9: TOPIC_NOT_FOUND, not Youzan's 200 with empty lists."""
    for params in ({"access": "r"}, {"access": "w", "metainfo": "true"}):
        reply = await lookup(nsqlookupd.http_port, "nope", **params)
        assert (reply.status, reply.message) == (404, "TOPIC_NOT_FOUND")


@pytest.mark.parametrize(
    "info",
    [YOUZAN_IDENTIFY, identify_body(YOUZAN_IDENTIFY, distributed_id=None)],
    ids=["distributed_id", "HA_version"],
)
async def test_partitioned_peer_shows_its_partitions(nsqlookupd, info):
    port = nsqlookupd.http_port
    peer = await identified_peer(nsqlookupd.tcp_port, info)
    assert await peer.command(b"REGISTER t 0\n") == b"OK"
    assert await peer.command(b"REGISTER t 1 ch\n") == b"OK"
    document = await lookup_json(port, "t", access="r")
    assert document["partitions"] == {"0": peer_object(peer), "1": peer_object(peer)}
    assert document["producers"] == [peer_object(peer)]
    assert document["channels"] == ["ch"]
    # Writers get only the partition that has a channel (docs/protocol.md §5.3).
    document = await lookup_json(port, "t", access="w")
    assert document["partitions"] == {"1": peer_object(peer)}
    assert document["producers"] == [peer_object(peer)]
    (node,) = (await raw_get_json(port, "/nodes"))["producers"]
    assert node["partitions"] == {"t": ["0", "1"]}
    await peer.aclose()


async def test_writers_get_404_when_no_partition_has_a_channel(nsqlookupd):
    port = nsqlookupd.http_port
    peer = await identified_peer(nsqlookupd.tcp_port, YOUZAN_IDENTIFY)
    await peer.register("t", partition=0)
    await peer.register("t", partition=1)
    reply = await lookup(port, "t", access="w", metainfo="true")
    assert (reply.status, reply.message) == (404, NO_CHANNEL)
    # Readers still see both partitions.
    document = await lookup_json(port, "t", access="r")
    assert sorted(document["partitions"]) == ["0", "1"]
    # The first channel makes its partition writable.
    await peer.register("t", "ch", partition=1)
    document = await lookup_json(port, "t", access="w")
    assert list(document["partitions"]) == ["1"]
    await peer.aclose()


async def test_allow_write_with_nochannels_lists_every_partition(make_lookupd):
    lookupd = await make_lookupd(allow_write_with_nochannels=True)
    peer = await identified_peer(lookupd.tcp_port, YOUZAN_IDENTIFY)
    await peer.register("t", partition=0)
    document = await lookup_json(lookupd.http_port, "t", access="w")
    assert document["partitions"] == {"0": peer_object(peer)}
    assert document["producers"] == [peer_object(peer)]
    await peer.aclose()


async def test_writers_do_not_get_a_node_whose_partitions_have_no_channel(nsqlookupd):
    """Youzan's doLookup skips a registration whose partition has no channel before it
    collects the producers: such a node is in neither `partitions` nor `producers`."""
    port = nsqlookupd.http_port
    empty = await identified_peer(nsqlookupd.tcp_port, YOUZAN_IDENTIFY)
    busy = await identified_peer(nsqlookupd.tcp_port, SECOND_NODE)
    await empty.register("t", partition=0)
    await busy.register("t", "ch", partition=1)
    document = await lookup_json(port, "t", access="w")
    assert document["partitions"] == {"1": peer_object(busy)}
    assert document["producers"] == [peer_object(busy)]
    document = await lookup_json(port, "t", access="r")
    assert by_id(document["producers"]) == by_id([peer_object(empty), peer_object(busy)])
    for peer in (empty, busy):
        await peer.aclose()


async def test_classic_peer_is_a_producer_for_readers_only(nsqlookupd):
    """A classic nsqd is an "old" node: permanently tombstoned for Youzan, so listed for
    readers (in producers, never in partitions) and left out for writers."""
    port = nsqlookupd.http_port
    classic = await identified_peer(nsqlookupd.tcp_port, CLASSIC_IDENTIFY)
    await classic.register("t", "ch")
    document = await lookup_json(port, "t", access="r")
    assert document["partitions"] == {}
    assert document["producers"] == [classic.info | {"remote_address": classic.local_address}]
    document = await lookup_json(port, "t", access="w")
    assert document["partitions"] == {}
    assert document["producers"] == []

    youzan = await identified_peer(nsqlookupd.tcp_port, YOUZAN_IDENTIFY)
    await youzan.register("t", "ch", partition=0)
    document = await lookup_json(port, "t", access="r")
    assert document["partitions"] == {"0": peer_object(youzan)}
    assert {producer["remote_address"] for producer in document["producers"]} == {
        classic.local_address,
        youzan.local_address,
    }
    document = await lookup_json(port, "t", access="w")
    assert document["partitions"] == {"0": peer_object(youzan)}
    assert document["producers"] == [peer_object(youzan)]
    for peer in (classic, youzan):
        await peer.aclose()


async def test_tombstoned_node_is_for_readers_only(nsqlookupd, two_nodes):
    first, second = two_nodes
    port = nsqlookupd.http_port
    node = f"127.0.0.1:{YOUZAN_IDENTIFY['http_port']}"
    assert (await raw_request(port, "POST", f"/topic/tombstone?topic=t&node={node}")).status == 200
    # Writers: the tombstoned node and its partitions are gone.
    document = await lookup_json(port, "t", access="w")
    assert document["partitions"] == {"1": peer_object(second)}
    assert document["producers"] == [peer_object(second)]
    # Readers (access=r) still get it, so they can drain it (docs/protocol.md §5.3).
    document = await lookup_json(port, "t", access="r")
    assert document["partitions"] == {"0": peer_object(first), "1": peer_object(second)}
    assert by_id(document["producers"]) == by_id([peer_object(first), peer_object(second)])


async def test_partition_filter(nsqlookupd):
    port = nsqlookupd.http_port
    first = await identified_peer(nsqlookupd.tcp_port, YOUZAN_IDENTIFY)
    second = await identified_peer(nsqlookupd.tcp_port, SECOND_NODE)
    await first.register("t", "ch0", partition=0)
    await second.register("t", "ch1", partition=1)
    document = await lookup_json(port, "t", access="r", partition="1")
    assert document["partitions"] == {"1": peer_object(second)}
    assert document["producers"] == [peer_object(second)]
    # Youzan lists the channels of the partitions asked for (FindChannelRegs(topic, pid)).
    assert document["channels"] == ["ch1"]
    document = await lookup_json(port, "t", access="w", partition="0")
    assert document["partitions"] == {"0": peer_object(first)}
    assert document["channels"] == ["ch0"]
    assert await raw_get_json(port, "/channels?topic=t&partition=0") == {"channels": ["ch0"]}
    assert await raw_get_json(port, "/channels?topic=t&partition=*") == {"channels": ["ch0", "ch1"]}
    document = await lookup_json(port, "t", partition="*")
    assert sorted(document["partitions"]) == ["0", "1"]
    for peer in (first, second):
        await peer.aclose()


async def test_lookup_is_v1_whatever_the_accept_header(nsqlookupd, two_nodes):
    """docs/protocol.md §8 row 8: always the v1 body, never the legacy envelope."""
    port = nsqlookupd.http_port
    plain = await raw_request(port, "GET", "/lookup?topic=t&access=r")
    negotiated = await raw_request(
        port,
        "GET",
        "/lookup?topic=t&access=r",
        headers=(("Accept", "application/vnd.nsq; version=1.0"),),
    )
    assert plain.status == negotiated.status == 200
    assert plain.json() == negotiated.json()
    assert "status_code" not in plain.json()
    assert negotiated.header("X-NSQ-Content-Type") == "nsq; version=1.0"


async def test_listlookup(nsqlookupd):
    reply = await raw_request(nsqlookupd.http_port, "GET", "/listlookup")
    assert reply.status == 200
    document = reply.json()
    assert list(document) == ["lookupdleader", "lookupdnodes"]
    leader = document["lookupdleader"]
    assert list(leader) == ["ID", "NodeIP", "TcpPort", "HttpPort", "RpcPort", "Epoch"]
    assert leader["NodeIP"] == "127.0.0.1"
    # The ports are strings (docs/protocol.md §5.4); Epoch is an integer.
    assert leader["TcpPort"] == str(nsqlookupd.tcp_port)
    assert leader["HttpPort"] == str(nsqlookupd.http_port)
    assert type(leader["RpcPort"]) is str and type(leader["ID"]) is str and leader["ID"]
    assert type(leader["Epoch"]) is int
    assert document["lookupdnodes"] == [leader]
