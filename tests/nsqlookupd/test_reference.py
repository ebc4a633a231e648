"""Our nsqlookupd's HTTP responses against Go nsqlookupd v1.3.0's, for every `nsqlookupd_*.http`.

`tests/reference/go-1.3.0/` holds the raw `curl -i` output of Go nsqlookupd for the
requests listed in its INDEX.txt. The captures were taken with one Go nsqd registered: first
with nothing (`_empty`, `_no_topics`), then with topic "test" and channel "ch". Each test builds
the same state in a fresh in-process nsqlookupd, replays the request and compares the response
with Go's field by field:

* the status line, exactly;
* the header names and values. `Date` only has to be a current IMF-fixdate and
  `Content-Length` must be our body's length; the order of headers is not compared;
* JSON bodies: the keys in the same order at every level, the same value types, and the same
  values except the volatile ones (versions, ports, remote addresses and ids, hostnames,
  last_update), which must only look right;
* other bodies byte for byte.

The state is built two ways:

* `classic`: a peer that speaks V1 by hand exactly as Go nsqd v1.3.0 does (IDENTIFY without
  distributed_id, `REGISTER test`, `REGISTER test ch`). Every response must be Go's, except
  that /lookup always carries `partitions` (docs/protocol.md §8 row 10), empty for a classic peer.
* `nsqd`: our own nsqd, which identifies with a distributed_id and registers `test 0 ch`
  (docs/protocol.md §8 row 7). Then exactly these Youzan additions are allowed and required:
  /lookup's
  `partitions` maps "0" to the node, and its PEER objects gain `id` first and `distributed_id`
  last; /nodes adds `partitions` ({topic: ["0"]}) after `topics`; /debug's keys of partitioned
  registrations carry the partition as a fourth part (`topic:test::0`).
"""

import email.utils
import re
import socket
import time
from urllib.parse import urlsplit

import pytest

from nsqpy.nsqd.options import Options as NSQDOptions
from nsqpy.nsqd.server import NSQD
from tests.nsqlookupd.support import CLASSIC_IDENTIFY, Peer, identify_body
from tests.reference import REFERENCE_DIR
from tests.support.http import HTTPReply, parse_response, raw_get_json, raw_request
from tests.support.polling import wait_until

REFERENCE_FILES = sorted(path.name for path in REFERENCE_DIR.glob("nsqlookupd_*.http"))
# Captured while the registered nsqd hosted nothing yet; every other one after "test"/"ch".
BEFORE_TOPICS = {"nsqlookupd_ping.http", "nsqlookupd_info.http"} | {
    name for name in REFERENCE_FILES if name.endswith(("_empty.http", "_no_topics.http"))
}


def read_index() -> dict[str, tuple[str, str]]:
    """file -> (method, target) for the nsqlookupd requests of INDEX.txt."""
    requests = {}
    for line in (REFERENCE_DIR / "INDEX.txt").read_text().splitlines():
        if line.startswith("nsqlookupd_"):
            file, _, request = line.partition(": ")
            method, url = request.split()[:2]
            parts = urlsplit(url)
            requests[file] = (method, parts.path + (f"?{parts.query}" if parts.query else ""))
    return requests


REQUESTS = read_index()


def reference(file: str) -> HTTPReply:
    reply = parse_response((REFERENCE_DIR / file).read_bytes())
    assert int(reply.header("Content-Length")) == len(reply.body), file
    return reply


def test_every_reference_file_has_a_request_in_the_index():
    assert REFERENCE_FILES, f"no nsqlookupd_*.http in {REFERENCE_DIR}"
    assert sorted(REQUESTS) == REFERENCE_FILES


# -- the state of the captures ---------------------------------------------------------------


async def classic_state(nsqlookupd, with_topics: bool) -> Peer:
    """A peer doing over V1 what Go nsqd v1.3.0 does (lookup.go): IDENTIFY, then REGISTER the
    topic when it is created and the channel when it is created."""
    peer = await Peer.connect(nsqlookupd.tcp_port)
    await peer.identify(identify_body(CLASSIC_IDENTIFY, hostname=socket.gethostname()))
    if with_topics:
        await peer.register("test")
        await peer.register("test", "ch")
    return peer


async def nsqd_state(nsqlookupd, nursery, tmp_path, with_topics: bool) -> NSQD:
    """Our nsqd with `-lookupd-tcp-address`, the topic and channel made over its HTTP API as
    in the capture."""
    nsqd = NSQD(
        NSQDOptions(
            tcp_address="127.0.0.1:0",
            http_address="127.0.0.1:0",
            data_path=str(tmp_path),
            broadcast_address="127.0.0.1",
            lookupd_tcp_address=[nsqlookupd.tcp_address],
        )
    )
    await nursery.start(nsqd.serve)
    port = nsqlookupd.http_port

    async def registered() -> bool:
        return len((await raw_get_json(port, "/nodes"))["producers"]) == 1

    await wait_until(registered, "our nsqd in /nodes")
    if with_topics:
        nsqd_http = int(nsqd.http_address.rsplit(":", 1)[1])
        assert (await raw_request(nsqd_http, "POST", "/topic/create?topic=test")).status == 200
        assert (
            await raw_request(nsqd_http, "POST", "/channel/create?topic=test&channel=ch")
        ).status == 200

        async def channel_registered() -> bool:
            lookup = await raw_request(port, "GET", "/lookup?topic=test")
            return lookup.status == 200 and lookup.json()["channels"] == ["ch"]

        await wait_until(channel_registered, "test/ch registered by our nsqd")
    return nsqd


# -- what we must answer, from Go's answer ---------------------------------------------------


def youzan_peer(peer: dict) -> dict:
    """A PEER object as Youzan writes it: `id` first, `distributed_id` last (docs/protocol.md
    §5.3)."""
    return {"id": peer["remote_address"], **peer, "distributed_id": "<distributed id>"}


def expected_document(file: str, go, kind: str):
    """Go's JSON body with the additions docs/protocol.md §8 requires of us for this kind of
    peer."""
    if file == "nsqlookupd_lookup.http":
        if kind == "classic":
            return {"channels": go["channels"], "partitions": {}, "producers": go["producers"]}
        producers = [youzan_peer(peer) for peer in go["producers"]]
        partitions = {"0": producers[0]}
        return {"channels": go["channels"], "partitions": partitions, "producers": producers}
    if kind == "nsqd" and file.startswith("nsqlookupd_nodes"):
        return {
            "producers": [
                {**node, "partitions": {topic: ["0"] for topic in node["topics"]}}
                for node in go["producers"]
            ]
        }
    if kind == "nsqd" and file == "nsqlookupd_debug.http":
        renamed = {}
        for key, entries in go.items():
            category = key.split(":", 1)[0]
            renamed[key + ":0" if category in ("topic", "channel") else key] = entries
        return renamed
    return go


# -- comparing --------------------------------------------------------------------------------

# Values that differ between any two runs, by key: ours must only match the pattern.
VOLATILE = {
    "version": re.compile(r"\d+\.\d+\.\d+\S*"),
    "remote_address": re.compile(r"127\.0\.0\.1:\d+"),
    "id": re.compile(r"127\.0\.0\.1:\d+"),
    "hostname": re.compile(r".+"),
    "distributed_id": re.compile(r".+"),
    "tcp_port": re.compile(r"[1-9]\d*"),
    "http_port": re.compile(r"[1-9]\d*"),
    "last_update": re.compile(r"[1-9]\d*"),
}


def _json_type(value) -> str:
    return "null" if value is None else type(value).__name__


def json_differences(ours, expected, path: str = "$", key: str = "") -> list[str]:
    """Where `ours` differs from `expected`: key order, value types, non-volatile values."""
    if _json_type(ours) != _json_type(expected):
        return [
            f"{path}: {_json_type(ours)} {ours!r}, expected {_json_type(expected)} {expected!r}"
        ]
    if isinstance(expected, dict):
        if list(ours) != list(expected):
            return [f"{path}: keys {list(ours)}, expected {list(expected)}"]
        return [
            difference
            for name in expected
            for difference in json_differences(ours[name], expected[name], f"{path}.{name}", name)
        ]
    if isinstance(expected, list):
        if len(ours) != len(expected):
            return [f"{path}: {len(ours)} items {ours!r}, expected {len(expected)} {expected!r}"]
        return [
            difference
            for index, (mine, theirs) in enumerate(zip(ours, expected, strict=True))
            for difference in json_differences(mine, theirs, f"{path}[{index}]")
        ]
    if key in VOLATILE:
        if not VOLATILE[key].fullmatch(str(ours)):
            return [f"{path}: {ours!r} does not look like a {key}"]
        return []
    if ours != expected:
        return [f"{path}: {ours!r}, expected {expected!r}"]
    return []


def header_differences(ours: HTTPReply, go: HTTPReply) -> list[str]:
    def by_name(reply: HTTPReply) -> dict[str, str]:
        headers = {}
        for name, value in reply.headers.items():
            assert name.lower() not in headers, f"header {name} sent twice"
            headers[name.lower()] = value
        return headers

    mine, theirs = by_name(ours), by_name(go)
    differences = []
    if sorted(mine) != sorted(theirs):
        differences.append(f"header names {sorted(mine)}, Go has {sorted(theirs)}")
    date = mine.get("date", "")
    if not re.fullmatch(r"\w{3}, \d\d \w{3} \d{4} \d\d:\d\d:\d\d GMT", date):
        differences.append(f"Date {date!r} is not an IMF-fixdate")
    elif abs(email.utils.parsedate_to_datetime(date).timestamp() - time.time()) > 60:
        differences.append(f"Date {date!r} is not now")
    if mine.get("content-length") != str(len(ours.body)):
        differences.append(f"Content-Length {mine.get('content-length')}, body {len(ours.body)}")
    for name in sorted(set(mine) & set(theirs) - {"date", "content-length"}):
        if mine[name] != theirs[name]:
            differences.append(f"{name}: {mine[name]!r}, Go has {theirs[name]!r}")
    return differences


def response_differences(ours: HTTPReply, go: HTTPReply, expected_json=None) -> list[str]:
    differences = []
    if (ours.status, ours.reason) != (go.status, go.reason):
        differences.append(f"status {ours.status} {ours.reason}, Go has {go.status} {go.reason}")
    differences += header_differences(ours, go)
    if (go.header("Content-Type") or "").startswith("application/json"):
        expected = go.json() if expected_json is None else expected_json
        differences += json_differences(ours.json(), expected)
    elif ours.body != go.body:
        differences.append(f"body {ours.body!r}, Go has {go.body!r}")
    return differences


# -- the tests --------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["classic", "nsqd"])
@pytest.mark.parametrize("file", REFERENCE_FILES)
async def test_response_matches_go_nsqlookupd(nsqlookupd, nursery, tmp_path, file, kind):
    with_topics = file not in BEFORE_TOPICS
    peer = nsqd = None
    try:
        if kind == "classic":
            peer = await classic_state(nsqlookupd, with_topics)
        else:
            nsqd = await nsqd_state(nsqlookupd, nursery, tmp_path, with_topics)
        method, target = REQUESTS[file]
        ours = await raw_request(nsqlookupd.http_port, method, target)
    finally:
        if nsqd is not None:
            nsqd.shutdown()
    go = reference(file)
    expected = None
    if (go.header("Content-Type") or "").startswith("application/json"):
        expected = expected_document(file, go.json(), kind)
    differences = response_differences(ours, go, expected)
    assert not differences, f"{file} ({kind}):\n  " + "\n  ".join(differences)

    if file == "nsqlookupd_lookup.http":
        # The volatile values are this peer's, not just well-formed.
        document = ours.json()
        (producer,) = document["producers"]
        if peer is not None:
            assert producer["remote_address"] == peer.local_address
            assert (producer["tcp_port"], producer["http_port"]) == (24150, 24151)
        else:
            assert producer["id"] == producer["remote_address"]
            assert producer["tcp_port"] == int(nsqd.tcp_address.rsplit(":", 1)[1])
            assert producer["http_port"] == int(nsqd.http_address.rsplit(":", 1)[1])
            assert document["partitions"]["0"] == producer


async def test_classic_peer_object_has_exactly_gos_keys_in_gos_order(nsqlookupd):
    """The official PEER shape, exactly (docs/protocol.md §5.2), next to a Youzan-style peer."""
    classic = await classic_state(nsqlookupd, with_topics=True)
    go_peer = reference("nsqlookupd_lookup.http").json()["producers"][0]
    document = await raw_get_json(nsqlookupd.http_port, "/lookup?topic=test")
    assert list(document) == ["channels", "partitions", "producers"]
    (peer,) = document["producers"]
    assert (
        list(peer)
        == list(go_peer)
        == [
            "remote_address",
            "hostname",
            "broadcast_address",
            "tcp_port",
            "http_port",
            "version",
        ]
    )
    assert peer == {
        "remote_address": classic.local_address,
        "hostname": socket.gethostname(),
        "broadcast_address": "127.0.0.1",
        "tcp_port": 24150,
        "http_port": 24151,
        "version": "1.3.0",
    }
    assert document["partitions"] == {}
    go_node = reference("nsqlookupd_nodes.http").json()["producers"][0]
    (node,) = (await raw_get_json(nsqlookupd.http_port, "/nodes"))["producers"]
    assert list(node) == list(go_node)


def test_comparison_catches_differences():
    """The comparison is not vacuous: it sees order, type and value changes."""
    go = {"version": "1.3.0", "producers": [{"tcp_port": 1, "tombstoned": False, "x": None}]}
    same = {"version": "9.9.9-x", "producers": [{"tcp_port": 7, "tombstoned": False, "x": None}]}
    assert json_differences(same, go) == []
    assert json_differences({"producers": same["producers"], "version": "1.3.0"}, go)
    assert json_differences({**same, "version": "nope"}, go)
    assert json_differences(
        {**same, "producers": [{"tcp_port": 1, "tombstoned": 0, "x": None}]}, go
    )
    assert json_differences(
        {**same, "producers": [{"tcp_port": "1", "tombstoned": False, "x": None}]}, go
    )
    assert json_differences(
        {**same, "producers": [{"tcp_port": 1, "tombstoned": False, "x": []}]}, go
    )
    assert json_differences({**same, "producers": []}, go)
