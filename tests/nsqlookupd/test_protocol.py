"""nsqlookupd's V1 TCP protocol on the wire (docs/protocol.md §4), and what it does to the HTTP
views.

Every test talks to a real in-process nsqlookupd over 127.0.0.1: peers speak V1 by hand (see
`support.Peer`), and the registry is read back through /lookup, /topics, /channels, /nodes and
/debug, as a client or nsqadmin would. The admin endpoints and the HTTP error texts are those of
Go nsqlookupd v1.3.0 (docs/protocol.md §5.6).
"""

import json
import socket
import struct

import pytest
import trio

from nsqpy.common.version import VERSION
from tests.nsqlookupd.support import (
    CLASSIC_IDENTIFY,
    YOUZAN_IDENTIFY,
    Peer,
    identified_peer,
    identify_body,
    lookup,
    lookup_producers,
    node_addresses,
)
from tests.support.http import raw_get_json, raw_request
from tests.support.polling import wait_until


def _identify_frame(body: dict) -> bytes:
    data = json.dumps(body).encode()
    return b"IDENTIFY\n" + struct.pack(">i", len(data)) + data


def addresses(producers: list[dict] | None) -> list[str]:
    return [producer["remote_address"] for producer in producers or []]


async def channels(port: int, topic: str) -> list[str]:
    return (await raw_get_json(port, f"/channels?topic={topic}"))["channels"]


async def topics(port: int) -> list[str]:
    return (await raw_get_json(port, "/topics"))["topics"]


async def nodes_by_address(port: int) -> dict[str, dict]:
    return {
        node["remote_address"]: node for node in (await raw_get_json(port, "/nodes"))["producers"]
    }


async def debug_ids(port: int) -> set[str]:
    """Every peer id /debug lists, under any registration."""
    document = await raw_get_json(port, "/debug")
    return {entry["id"] for entries in document.values() for entry in entries}


# -- the connection ---------------------------------------------------------------------------


async def test_identify_reply_has_lookupd_info_with_sorted_keys(nsqlookupd):
    peer = await Peer.connect(nsqlookupd.tcp_port)
    reply = await peer.command(_identify_frame(CLASSIC_IDENTIFY))
    expected = {
        "broadcast_address": "127.0.0.1",
        "hostname": socket.gethostname(),
        "http_port": nsqlookupd.http_port,
        "tcp_port": nsqlookupd.tcp_port,
        "version": VERSION,
    }
    # A Go map marshalled: keys sorted, compact.
    assert reply == json.dumps(expected, separators=(",", ":")).encode()
    assert list(json.loads(reply)) == sorted(expected)
    # Identified: registrations work, and the connection stays open.
    await peer.register("t")
    await peer.ping()
    await peer.aclose()


@pytest.mark.parametrize(
    "opening", [b"  V2", b"V1  ", b"GET / HTTP/1.1\r\n\r\n", b"\x00\x00\x00\x00"]
)
async def test_wrong_magic_gets_bare_e_bad_protocol_and_close(nsqlookupd, opening):
    peer = await Peer.connect(nsqlookupd.tcp_port, magic=False)
    await peer.send(opening)
    # Go's tcp.go writes the bare code: no description, no trailing space.
    await peer.expect_fatal("E_BAD_PROTOCOL")


async def test_magic_split_across_writes_is_accepted(nsqlookupd):
    peer = await Peer.connect(nsqlookupd.tcp_port, magic=False)
    for byte in b"  V1":
        await peer.send(bytes([byte]))
    assert await peer.command(b"PING\n") == b"OK"
    await peer.aclose()


async def test_ping_answers_ok_before_and_after_identify(nsqlookupd):
    peer = await Peer.connect(nsqlookupd.tcp_port)
    assert await peer.command(b"PING\n") == b"OK"
    assert await peer.command(b"  PING  \r\n") == b"OK"  # the line is trimmed
    await peer.identify(CLASSIC_IDENTIFY)
    assert await peer.command(b"PING\n") == b"OK"
    # Pipelined commands are answered in order.
    await peer.send(b"PING\nREGISTER a\nPING\nREGISTER a b\n")
    assert [await peer.reply() for _ in range(4)] == [b"OK"] * 4
    assert await channels(nsqlookupd.http_port, "a") == ["b"]
    await peer.aclose()


# -- REGISTER and UNREGISTER -----------------------------------------------------------------------


async def test_classic_register_and_unregister(nsqlookupd):
    port = nsqlookupd.http_port
    peer = await identified_peer(nsqlookupd.tcp_port, CLASSIC_IDENTIFY)
    await peer.register("t")
    document = await raw_get_json(port, "/lookup?topic=t")
    assert document["channels"] == []
    assert addresses(document["producers"]) == [peer.local_address]
    await peer.register("t", "c1")
    await peer.register("t", "c2")
    await peer.register("t", "c1")  # twice is harmless
    document = await raw_get_json(port, "/lookup?topic=t")
    assert document["channels"] == ["c1", "c2"]
    assert addresses(document["producers"]) == [peer.local_address]
    assert document["partitions"] == {}  # a classic peer never appears under partitions
    assert await topics(port) == ["t"]

    # UNREGISTER of a channel drops this peer from it; a non-ephemeral channel stays known.
    await peer.unregister("t", "c1")
    assert await channels(port, "t") == ["c1", "c2"]
    document = await raw_get_json(port, "/debug")
    assert "channel:t:c1" not in document
    assert [entry["id"] for entry in document["channel:t:c2"]] == [peer.local_address]

    # UNREGISTER of the topic drops this peer from the topic and from its channels.
    await peer.unregister("t")
    assert await lookup_producers(port, "t") == []
    assert await topics(port) == ["t"]
    assert set(await raw_get_json(port, "/debug")) == {"client::"}
    # The peer itself is still known.
    assert await node_addresses(port) == [peer.local_address]
    await peer.aclose()


async def test_classic_peer_channel_named_like_a_partition_is_a_channel(nsqlookupd):
    """docs/protocol.md §8 row 7: a classic peer only gets the classic grammar, so `REGISTER t 5` is
    channel "5" (Youzan's own lookupd would misread it as partition 5)."""
    peer = await identified_peer(nsqlookupd.tcp_port, CLASSIC_IDENTIFY)
    await peer.register("t", "5")
    document = await raw_get_json(nsqlookupd.http_port, "/lookup?topic=t")
    assert document["channels"] == ["5"]
    assert document["partitions"] == {}
    assert addresses(document["producers"]) == [peer.local_address]
    await peer.aclose()


@pytest.mark.parametrize(
    "info",
    [YOUZAN_IDENTIFY, identify_body(YOUZAN_IDENTIFY, distributed_id=None)],
    ids=["distributed_id", "HA_version"],
)
async def test_partitioned_register_and_unregister(nsqlookupd, info):
    """A peer with a distributed_id, or an "HA" version, uses `REGISTER t p [c]`."""
    port = nsqlookupd.http_port
    peer = await identified_peer(nsqlookupd.tcp_port, info)
    await peer.register("t", partition=0)
    await peer.register("t", "ch", partition=1)
    document = await raw_get_json(port, "/lookup?topic=t")
    assert document["channels"] == ["ch"]
    assert sorted(document["partitions"]) == ["0", "1"]
    assert addresses(document["producers"]) == [peer.local_address]
    assert await raw_get_json(port, "/channels?topic=t&partition=1") == {"channels": ["ch"]}
    assert await raw_get_json(port, "/channels?topic=t&partition=0") == {"channels": []}
    (node,) = (await raw_get_json(port, "/nodes"))["producers"]
    assert node["topics"] == ["t"]
    assert node["partitions"] == {"t": ["0", "1"]}

    # `UNREGISTER t 1` also drops this peer's channels of t/1.
    await peer.unregister("t", partition=1)
    document = await raw_get_json(port, "/lookup?topic=t")
    assert list(document["partitions"]) == ["0"]
    assert "channel:t:ch:1" not in await raw_get_json(port, "/debug")
    await peer.unregister("t", partition=0)
    assert await lookup_producers(port, "t") == []
    await peer.aclose()


async def test_partitioned_peer_accepts_old_version_partition(nsqlookupd):
    """-11 is Youzan's OLD_VERSION_PID: valid, but never listed under partitions."""
    peer = await identified_peer(nsqlookupd.tcp_port, YOUZAN_IDENTIFY)
    await peer.register("t", "ch", partition=-11)
    document = await raw_get_json(nsqlookupd.http_port, "/lookup?topic=t")
    assert document["partitions"] == {}
    assert addresses(document["producers"]) == [peer.local_address]
    await peer.aclose()


# -- errors: every one is fatal -------------------------------------------------------------------

NOT_IDENTIFIED = None
CLASSIC = CLASSIC_IDENTIFY
YOUZAN = YOUZAN_IDENTIFY

ERRORS = [
    (NOT_IDENTIFIED, b"FOO\n", "E_INVALID invalid command FOO"),
    (NOT_IDENTIFIED, b"ping\n", "E_INVALID invalid command ping"),
    (CLASSIC, b"\n", "E_INVALID invalid command "),
    (CLASSIC, b"PUB t\n", "E_INVALID invalid command PUB"),
    (NOT_IDENTIFIED, b"REGISTER t\n", "E_INVALID client must IDENTIFY"),
    (NOT_IDENTIFIED, b"UNREGISTER t c\n", "E_INVALID client must IDENTIFY"),
    (CLASSIC, b"REGISTER\n", "E_INVALID REGISTER insufficient number of params"),
    (CLASSIC, b"UNREGISTER\n", "E_INVALID UNREGISTER insufficient number of params"),
    (CLASSIC, b"REGISTER bad!topic\n", "E_BAD_TOPIC REGISTER topic name 'bad!topic' is not valid"),
    (CLASSIC, b"UNREGISTER bad!t c\n", "E_BAD_TOPIC UNREGISTER topic name 'bad!t' is not valid"),
    (CLASSIC, b"REGISTER t bad!ch\n", "E_BAD_CHANNEL REGISTER channel name 'bad!ch' is not valid"),
    (
        CLASSIC,
        b"UNREGISTER t " + b"c" * 65 + b"\n",
        "E_BAD_CHANNEL UNREGISTER channel name '" + "c" * 65 + "' is not valid",
    ),
    (YOUZAN, b"REGISTER t\n", "E_INVALID REGISTER insufficient number of params"),
    (YOUZAN, b"UNREGISTER t\n", "E_INVALID UNREGISTER insufficient number of params"),
    (YOUZAN, b"REGISTER bad! 0\n", "E_BAD_TOPIC REGISTER topic name 'bad!' is not valid"),
    (YOUZAN, b"REGISTER t 0 bad!\n", "E_BAD_CHANNEL REGISTER channel name 'bad!' is not valid"),
    # Go's getTopicChan checks the channel before the partition.
    (YOUZAN, b"REGISTER t x bad!\n", "E_BAD_CHANNEL REGISTER channel name 'bad!' is not valid"),
    (YOUZAN, b"REGISTER t x\n", "E_BAD_PARTITIONID REGISTER partition id 'x' is not valid"),
    (YOUZAN, b"REGISTER t 255 c\n", "E_BAD_PARTITIONID REGISTER partition id '255' is not valid"),
    (YOUZAN, b"REGISTER t -1\n", "E_BAD_PARTITIONID REGISTER partition id '-1' is not valid"),
    (YOUZAN, b"UNREGISTER t 1.5\n", "E_BAD_PARTITIONID UNREGISTER partition id '1.5' is not valid"),
    (CLASSIC, b"IDENTIFY\n", "E_INVALID cannot IDENTIFY again"),
    (NOT_IDENTIFIED, b"IDENTIFY\n\xff\xff\xff\xff", "E_BAD_BODY IDENTIFY failed to read body size"),
    (
        NOT_IDENTIFIED,
        b"IDENTIFY\n" + struct.pack(">i", 9) + b"not json!",
        "E_BAD_BODY IDENTIFY failed to decode JSON body",
    ),
    (
        NOT_IDENTIFIED,
        b"IDENTIFY\n" + struct.pack(">i", 2) + b"[]",
        "E_BAD_BODY IDENTIFY failed to decode JSON body",
    ),
]


ERRORS += [
    (
        NOT_IDENTIFIED,
        _identify_frame(identify_body(CLASSIC_IDENTIFY, tcp_port="4150")),
        "E_BAD_BODY IDENTIFY failed to decode JSON body",
    ),
] + [
    (
        NOT_IDENTIFIED,
        _identify_frame(identify_body(CLASSIC_IDENTIFY, **{field: None})),
        "E_BAD_BODY IDENTIFY missing fields",
    )
    for field in ("broadcast_address", "tcp_port", "http_port", "version")
]


@pytest.mark.parametrize(
    "identify, data, error",
    ERRORS,
    ids=[f"{i}-{error.split(' ', 1)[0]}" for i, (_, _, error) in enumerate(ERRORS)],
)
async def test_error_text_then_connection_closed(nsqlookupd, identify, data, error):
    peer = await Peer.connect(nsqlookupd.tcp_port)
    if identify is not None:
        await peer.identify(identify)
    await peer.send(data)
    await peer.expect_fatal(error)


@pytest.mark.parametrize(
    "data, error",
    [
        (b"IDENTIFY\n", "E_BAD_BODY IDENTIFY failed to read body size"),
        (b"IDENTIFY\n\x00\x00", "E_BAD_BODY IDENTIFY failed to read body size"),
        (b"IDENTIFY\n" + struct.pack(">i", 100) + b"{}", "E_BAD_BODY IDENTIFY failed to read body"),
    ],
)
async def test_identify_cut_short_by_eof(nsqlookupd, data, error):
    """Go reads the size and body with io.ReadFull: EOF there is an error reply."""
    peer = await Peer.connect(nsqlookupd.tcp_port)
    await peer.send(data)
    await peer.stream.send_eof()
    await peer.expect_fatal(error)


async def test_fatal_error_drops_the_peers_registrations(nsqlookupd):
    port = nsqlookupd.http_port
    peer = await identified_peer(nsqlookupd.tcp_port, CLASSIC_IDENTIFY)
    await peer.register("t", "c")
    await peer.send(b"REGISTER bad!\n")
    await peer.expect_fatal("E_BAD_TOPIC REGISTER topic name 'bad!' is not valid")

    async def gone() -> bool:
        return await lookup_producers(port, "t") == []

    await wait_until(gone, "the producer to go")
    assert await node_addresses(port) == []


# -- disconnecting --------------------------------------------------------------------------------


@pytest.mark.parametrize("info", [CLASSIC_IDENTIFY, YOUZAN_IDENTIFY], ids=["classic", "youzan"])
async def test_disconnect_removes_every_registration_of_that_peer(nsqlookupd, info):
    port = nsqlookupd.http_port
    partition = 0 if info is YOUZAN_IDENTIFY else None
    leaving = await identified_peer(nsqlookupd.tcp_port, info)
    staying = await identified_peer(
        nsqlookupd.tcp_port, identify_body(info, tcp_port=5150, http_port=5151)
    )
    for peer in (leaving, staying):
        await peer.register("t1", "c1", partition=partition)
    await leaving.register("t1", "c2", partition=partition)
    await leaving.register("t2", partition=partition)
    assert sorted(addresses(await lookup_producers(port, "t1"))) == sorted(
        [leaving.local_address, staying.local_address]
    )
    assert leaving.local_address in await debug_ids(port)

    gone = leaving.local_address
    await leaving.aclose()

    async def forgotten() -> bool:
        return gone not in await debug_ids(port)

    await wait_until(forgotten, "the closed peer to leave /debug")
    assert addresses(await lookup_producers(port, "t1")) == [staying.local_address]
    assert await lookup_producers(port, "t2") == []
    assert await node_addresses(port) == [staying.local_address]
    (node,) = (await raw_get_json(port, "/nodes"))["producers"]
    assert node["topics"] == ["t1"]
    await staying.aclose()


# -- ephemeral topics and channels (Go's UNREGISTER) ---------------------------------------------


async def test_ephemeral_channel_goes_with_its_last_producer(nsqlookupd):
    port = nsqlookupd.http_port
    first = await identified_peer(nsqlookupd.tcp_port, CLASSIC_IDENTIFY)
    second = await identified_peer(nsqlookupd.tcp_port, identify_body(CLASSIC_IDENTIFY, tcp_port=9))
    for peer in (first, second):
        await peer.register("t", "e#ephemeral")
        await peer.register("t", "durable")
    await first.unregister("t", "e#ephemeral")
    assert await channels(port, "t") == ["durable", "e#ephemeral"]  # second still has it
    await second.unregister("t", "e#ephemeral")
    assert await channels(port, "t") == ["durable"]
    # A durable channel stays known with no producers at all.
    await first.unregister("t", "durable")
    await second.unregister("t", "durable")
    assert await channels(port, "t") == ["durable"]
    for peer in (first, second):
        await peer.aclose()


async def test_ephemeral_topic_goes_with_its_last_producer(nsqlookupd):
    port = nsqlookupd.http_port
    first = await identified_peer(nsqlookupd.tcp_port, CLASSIC_IDENTIFY)
    second = await identified_peer(nsqlookupd.tcp_port, identify_body(CLASSIC_IDENTIFY, tcp_port=9))
    for peer in (first, second):
        await peer.register("e#ephemeral")
        await peer.register("durable")
    await first.unregister("e#ephemeral")
    assert addresses(await lookup_producers(port, "e#ephemeral")) == [second.local_address]
    await second.unregister("e#ephemeral")
    assert await lookup_producers(port, "e#ephemeral") is None  # 404 TOPIC_NOT_FOUND
    assert await topics(port) == ["durable"]
    await first.unregister("durable")
    await second.unregister("durable")
    assert await lookup_producers(port, "durable") == []
    assert await topics(port) == ["durable"]
    for peer in (first, second):
        await peer.aclose()


async def test_disconnect_leaves_ephemeral_registrations_in_place(nsqlookupd):
    """Go removes only the producers when a peer's connection closes; the registration of an
    ephemeral channel goes only with an UNREGISTER."""
    port = nsqlookupd.http_port
    peer = await identified_peer(nsqlookupd.tcp_port, CLASSIC_IDENTIFY)
    await peer.register("t", "e#ephemeral")
    await peer.aclose()

    async def gone() -> bool:
        return await node_addresses(port) == []

    await wait_until(gone, "the peer to leave /nodes")
    assert await channels(port, "t") == ["e#ephemeral"]
    assert await lookup_producers(port, "t") == []


# -- tombstones ---------------------------------------------------------------------------------


async def test_tombstone_hides_the_node_from_lookup_for_the_lifetime(make_lookupd):
    lookupd = await make_lookupd(tombstone_lifetime=1.0)
    port = lookupd.http_port
    peer = await identified_peer(lookupd.tcp_port, CLASSIC_IDENTIFY)
    other = await identified_peer(lookupd.tcp_port, identify_body(CLASSIC_IDENTIFY, http_port=9))
    for each in (peer, other):
        await each.register("t", "c")
    await peer.register("u")

    started = trio.current_time()
    reply = await raw_request(port, "POST", "/topic/tombstone?topic=t&node=127.0.0.1:24151")
    assert (reply.status, reply.body) == (200, b"")
    # Hidden from /lookup of that topic only; the node itself stays listed, flagged.
    assert addresses(await lookup_producers(port, "t")) == [other.local_address]
    assert addresses(await lookup_producers(port, "u")) == [peer.local_address]
    nodes = await nodes_by_address(port)
    mine = nodes[peer.local_address]
    assert dict(zip(mine["topics"], mine["tombstones"], strict=True)) == {"t": True, "u": False}
    assert nodes[other.local_address]["tombstones"] == [False]
    debug = await raw_get_json(port, "/debug")
    (entry,) = [e for e in debug["topic:t:"] if e["id"] == peer.local_address]
    assert entry["tombstoned"] is True and entry["tombstoned_at"] > 0

    async def back() -> bool:
        return peer.local_address in addresses(await lookup_producers(port, "t"))

    await wait_until(back, "the tombstone to expire", timeout=5.0)
    assert trio.current_time() - started >= 1.0
    assert (await nodes_by_address(port))[peer.local_address]["tombstones"] == [False, False]
    for each in (peer, other):
        await each.aclose()


async def test_tombstone_of_an_unknown_node_changes_nothing(nsqlookupd):
    port = nsqlookupd.http_port
    peer = await identified_peer(nsqlookupd.tcp_port, CLASSIC_IDENTIFY)
    await peer.register("t")
    assert (
        await raw_request(port, "POST", "/topic/tombstone?topic=t&node=127.0.0.1:1")
    ).status == 200
    assert (
        await raw_request(port, "POST", "/topic/tombstone?topic=other&node=127.0.0.1:24151")
    ).status == 200
    assert addresses(await lookup_producers(port, "t")) == [peer.local_address]
    await peer.aclose()


# -- inactive producers -----------------------------------------------------------------------


async def test_inactive_producer_ages_out_and_a_ping_brings_it_back(make_lookupd):
    lookupd = await make_lookupd(inactive_producer_timeout=1.0)
    port = lookupd.http_port
    started = trio.current_time()  # last_update is set at IDENTIFY, after this
    peer = await identified_peer(lookupd.tcp_port, CLASSIC_IDENTIFY)
    await peer.register("t", "c")
    assert addresses(await lookup_producers(port, "t")) == [peer.local_address]

    async def aged_out() -> bool:
        return await lookup_producers(port, "t") == [] and await node_addresses(port) == []

    await wait_until(aged_out, "the silent producer to age out", timeout=5.0)
    assert trio.current_time() - started >= 1.0
    # Official nsqlookupd: only PING refreshes last_update, not REGISTER.
    await peer.register("t2")
    assert await node_addresses(port) == []
    await peer.ping()
    assert addresses(await lookup_producers(port, "t")) == [peer.local_address]
    assert await node_addresses(port) == [peer.local_address]
    await peer.aclose()


async def test_partitioned_register_counts_as_a_sign_of_life(make_lookupd):
    """Youzan's REGISTER and UNREGISTER refresh last_update too (docs/protocol.md §4.3)."""
    lookupd = await make_lookupd(inactive_producer_timeout=1.0)
    port = lookupd.http_port
    peer = await identified_peer(lookupd.tcp_port, YOUZAN_IDENTIFY)
    await peer.register("t", "c", partition=0)

    async def aged_out() -> bool:
        return await node_addresses(port) == []

    await wait_until(aged_out, "the silent producer to age out", timeout=5.0)
    await peer.register("t", "c", partition=1)
    assert await node_addresses(port) == [peer.local_address]
    assert addresses(await lookup_producers(port, "t")) == [peer.local_address]
    await peer.aclose()


# -- the HTTP admin endpoints (official) -------------------------------------------------------


async def expect_error(port: int, method: str, target: str, status: int, message: str) -> None:
    reply = await raw_request(port, method, target)
    assert (reply.status, reply.message) == (status, message), (target, reply)
    assert reply.header("Content-Type") == "application/json; charset=utf-8"
    assert reply.header("X-NSQ-Content-Type") == "nsq; version=1.0"


async def test_topic_create_and_delete(nsqlookupd):
    port = nsqlookupd.http_port
    reply = await raw_request(port, "POST", "/topic/create?topic=t")
    assert (reply.status, reply.body) == (200, b"")
    assert reply.header("X-NSQ-Content-Type") == "nsq; version=1.0"
    assert await topics(port) == ["t"]
    # Known, with no producers: 200, not TOPIC_NOT_FOUND.
    assert await raw_get_json(port, "/lookup?topic=t") == {
        "channels": [],
        "partitions": {},
        "producers": [],
    }

    peer = await identified_peer(nsqlookupd.tcp_port, CLASSIC_IDENTIFY)
    await peer.register("t", "c")
    reply = await raw_request(port, "POST", "/topic/delete?topic=t")
    assert (reply.status, reply.body) == (200, b"")
    assert await topics(port) == []
    assert await channels(port, "t") == []
    await expect_error(port, "GET", "/lookup?topic=t", 404, "TOPIC_NOT_FOUND")
    (node,) = (await raw_get_json(port, "/nodes"))["producers"]
    assert node["topics"] == []
    # Deleting what does not exist is fine.
    assert (await raw_request(port, "POST", "/topic/delete?topic=never")).status == 200
    await peer.aclose()


async def test_channel_create_and_delete(nsqlookupd):
    port = nsqlookupd.http_port
    reply = await raw_request(port, "POST", "/channel/create?topic=t&channel=c")
    assert (reply.status, reply.body) == (200, b"")
    assert await topics(port) == ["t"]  # the topic comes with it
    assert await channels(port, "t") == ["c"]
    assert (await raw_get_json(port, "/lookup?topic=t"))["channels"] == ["c"]
    reply = await raw_request(port, "POST", "/channel/delete?topic=t&channel=c")
    assert (reply.status, reply.body) == (200, b"")
    assert await channels(port, "t") == []
    await expect_error(port, "POST", "/channel/delete?topic=t&channel=c", 404, "CHANNEL_NOT_FOUND")
    await expect_error(port, "POST", "/channel/delete?topic=x&channel=c", 404, "CHANNEL_NOT_FOUND")


@pytest.mark.parametrize(
    "method, target, status, message",
    [
        ("POST", "/topic/create", 400, "MISSING_ARG_TOPIC"),
        ("POST", "/topic/create?topic=bad!", 400, "INVALID_ARG_TOPIC"),
        ("POST", "/topic/create?topic=" + "t" * 65, 400, "INVALID_ARG_TOPIC"),
        ("POST", "/topic/delete", 400, "MISSING_ARG_TOPIC"),
        ("POST", "/channel/create?channel=c", 400, "MISSING_ARG_TOPIC"),
        ("POST", "/channel/create?topic=bad!&channel=c", 400, "INVALID_ARG_TOPIC"),
        ("POST", "/channel/create?topic=t", 400, "MISSING_ARG_CHANNEL"),
        ("POST", "/channel/create?topic=t&channel=bad!", 400, "INVALID_ARG_CHANNEL"),
        ("POST", "/channel/delete?channel=c", 400, "MISSING_ARG_TOPIC"),
        ("POST", "/channel/delete?topic=t", 400, "MISSING_ARG_CHANNEL"),
        ("POST", "/channel/delete?topic=t&channel=bad!", 400, "INVALID_ARG_CHANNEL"),
        ("POST", "/topic/tombstone?node=127.0.0.1:4151", 400, "MISSING_ARG_TOPIC"),
        ("POST", "/topic/tombstone?topic=t", 400, "MISSING_ARG_NODE"),
        ("GET", "/lookup", 400, "MISSING_ARG_TOPIC"),
        ("GET", "/lookup?topic=%zz", 400, "INVALID_REQUEST"),
        ("GET", "/lookup?topic=nope", 404, "TOPIC_NOT_FOUND"),
        ("GET", "/channels", 400, "MISSING_ARG_TOPIC"),
        ("GET", "/nope", 404, "NOT_FOUND"),
        ("GET", "/topic/create?topic=t", 405, "METHOD_NOT_ALLOWED"),
        ("GET", "/channel/delete?topic=t&channel=c", 405, "METHOD_NOT_ALLOWED"),
        ("POST", "/lookup?topic=t", 405, "METHOD_NOT_ALLOWED"),
        ("DELETE", "/nodes", 405, "METHOD_NOT_ALLOWED"),
    ],
)
async def test_http_error_texts(nsqlookupd, method, target, status, message):
    await expect_error(nsqlookupd.http_port, method, target, status, message)
    # An error changes nothing.
    assert await topics(nsqlookupd.http_port) == []


async def test_ping_and_info(nsqlookupd):
    reply = await raw_request(nsqlookupd.http_port, "GET", "/ping")
    assert (reply.status, reply.body) == (200, b"OK")
    assert reply.header("Content-Type") == "text/plain; charset=utf-8"
    assert await raw_get_json(nsqlookupd.http_port, "/info") == {"version": VERSION}
    reply = await lookup(nsqlookupd.http_port, "t")
    assert reply.status == 404
