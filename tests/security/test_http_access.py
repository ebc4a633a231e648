"""Every HTTP route of nsqd behind AUTH (docs/operations.md, "Securing a cluster").

Two modes, each an nsqd with a real auth server and `--cluster-secret`:
- `messages` (`--auth-http-address`): the routes that read messages or move a channel's need
  `subscribe` on their topic and channel; every other route answers as Go's, to anyone.
- `all` (and `--http-auth-required`): every route but /ping and /info needs `publish`,
  `subscribe` or `admin`; the master's routes (/cluster/*) only the cluster secret.

Each route is asked with no credential, a secret the auth server refuses, one granting only
`subscribe`, only `publish`, only `admin`, and the cluster secret. A refusal is Go-style (401
`AUTH_REQUIRED`, `AUTH_FAILED`, 403 `FORBIDDEN`) and changes nothing: the node's topics,
channels, messages, pause flags, offsets, configuration and writability are as before. An
allowed request gets its route's own answer. The expectations are this file's table, and
every route nsqd has is in it.
"""

import json
import ssl
from collections.abc import Iterator

import pytest

from nsqpy.nsqd.http_api import HTTPAPI
from nsqpy.nsqd.options import Options
from nsqpy.nsqd.server import NSQD
from tests.security.access import ANSWERS, CLUSTER_SECRET, CREDENTIALS, HOLDERS
from tests.security.support import CLIENT_COMMON_NAME, running_nsqd
from tests.support.auth_server import AuthServer, answering
from tests.support.http import HTTPReply, request

# (method, route): (need with --auth-http-address alone, need with --http-auth-required).
ROUTES = {
    ("GET", "/ping"): ("open", "open"),
    ("GET", "/info"): ("open", "open"),
    ("GET", "/partition/offsets"): ("subscribe", "subscribe"),
    ("GET", "/partition/search"): ("subscribe", "subscribe"),
    ("GET", "/partition/fetch"): ("subscribe", "subscribe"),
    ("POST", "/channel/setoffset"): ("subscribe", "subscribe"),
    ("POST", "/channel/emptydelayed"): ("subscribe", "subscribe"),
    ("POST", "/channel/requeuedelayed"): ("subscribe", "subscribe"),
    ("POST", "/channel/finishmemdelayed"): ("subscribe", "subscribe"),
    ("POST", "/channel/replaydeadletters"): ("subscribe", "subscribe"),
    ("POST", "/message/finish"): ("subscribe", "subscribe"),
    ("POST", "/channel/fixconfirmed"): ("subscribe", "subscribe"),
    ("GET", "/message/get"): ("subscribe", "subscribe"),
    ("GET", "/message/stats"): ("subscribe", "subscribe"),
    ("POST", "/pub"): ("open", "publish"),
    ("POST", "/put"): ("open", "publish"),
    ("POST", "/mpub"): ("open", "publish"),
    ("POST", "/pub_ext"): ("open", "publish"),
    ("POST", "/pubtrace"): ("open", "publish"),
    ("POST", "/topic/create"): ("open", "publish"),
    ("POST", "/channel/create"): ("open", "subscribe"),
    ("GET", "/stats"): ("open", "subscribe"),
    ("GET", "/metrics"): ("open", "subscribe"),
    ("GET", "/serverstats"): ("open", "subscribe"),
    ("GET", "/debug/connections"): ("open", "subscribe"),
    ("GET", "/coordinator/stats"): ("open", "subscribe"),
    ("GET", "/message/historystats"): ("open", "subscribe"),
    ("POST", "/topic/delete"): ("open", "admin"),
    ("POST", "/topic/empty"): ("open", "admin"),
    ("POST", "/topic/pause"): ("open", "admin"),
    ("POST", "/topic/unpause"): ("open", "admin"),
    ("POST", "/topic/greedyclean"): ("open", "admin"),
    ("POST", "/topic/cleanunused"): ("open", "admin"),
    ("POST", "/topic/fixdata"): ("open", "admin"),
    ("POST", "/channel/delete"): ("open", "admin"),
    ("POST", "/channel/empty"): ("open", "admin"),
    ("POST", "/channel/pause"): ("open", "admin"),
    ("POST", "/channel/unpause"): ("open", "admin"),
    ("POST", "/channel/skip"): ("open", "admin"),
    ("POST", "/channel/unskip"): ("open", "admin"),
    ("POST", "/channel/setorder"): ("open", "admin"),
    ("POST", "/channel/ratelimit"): ("open", "admin"),
    ("POST", "/channel/setclientlimit"): ("open", "admin"),
    ("POST", "/channel/setmaxattempts"): ("open", "admin"),
    ("PUT", "/delayqueue/enable"): ("open", "admin"),
    ("GET", "/config/*"): ("open", "admin"),
    ("PUT", "/config/*"): ("open", "admin"),
    ("POST", "/debug/freememory"): ("open", "admin"),
    ("POST", "/loglevel/set"): ("open", "admin"),
    ("POST", "/disable/write"): ("open", "admin"),
    ("GET", "/cluster/partitions"): ("cluster", "cluster"),
    ("POST", "/cluster/leader/handover"): ("cluster", "cluster"),
}
MODES = {"messages": 0, "all": 1}
# What each route is asked, so that an allowed request would change what a refused one must
# not: a message published, a channel moved, a pause, a configuration value.
TARGETS = {
    "/config/*": "/config/log_level",
    "/pub": "/pub?topic=t",
    "/put": "/put?topic=t",
    "/mpub": "/mpub?topic=t",
    "/pub_ext": "/pub_ext?topic=t",
    "/pubtrace": "/pubtrace?topic=t&trace_id=1",
    "/channel/setoffset": "/channel/setoffset?topic=t&channel=c&partition=0",
    "/channel/setmaxattempts": "/channel/setmaxattempts?topic=t&channel=c&max_attempts=3",
    "/channel/setorder": "/channel/setorder?topic=t&channel=c&partition=0&order=true",
    "/channel/ratelimit": "/channel/ratelimit?topic=t&channel=c&partition=0&ratekilobytes=9",
    "/channel/setclientlimit": "/channel/setclientlimit?topic=t&channel=c&partition=0&ready=1",
    "/message/get": "/message/get?topic=t&partition=0&search_mode=count&search_pos=0",
    "/disable/write": "/disable/write?type=all",
    "/loglevel/set": "/loglevel/set?loglevel=3",
}
BODIES = {
    "/channel/setoffset": b'{"special":-1}',
    "/config/*": b"debug",
}


@pytest.fixture(scope="module")
def auth_server() -> Iterator[AuthServer]:
    with answering(ANSWERS) as server:
        yield server


@pytest.fixture(scope="module", params=list(MODES))
def secured(request, auth_server, certs, tmp_path_factory):
    """(mode, nsqd): `t` a log topic, so that its partition can be read."""
    flags = [
        f"-auth-http-address=127.0.0.1:{auth_server.port}",
        f"-cluster-secret={CLUSTER_SECRET}",
        "-log-topic=t",
        *certs.tls_flags(),
        f"-tls-root-ca-file={certs.ca}",
    ]
    if request.param == "all":
        flags.append("-http-auth-required")
    with running_nsqd(tmp_path_factory.mktemp(request.param), *flags) as daemon:
        # Here, not only in `prepare`: a test that reads it may run first, or alone.
        as_cluster(daemon, "POST", "/topic/create?topic=t")
        yield request.param, daemon


def ask(daemon, method: str, target: str, secret: str | None, body: bytes = b"") -> HTTPReply:
    headers = {"Authorization": f"Bearer {secret}"} if secret else {}
    payload = body if method in ("POST", "PUT") else None
    return request(daemon.port("HTTP"), method, target, payload, headers)


def as_cluster(daemon, method: str, target: str, body: bytes = b"") -> HTTPReply:
    reply = ask(daemon, method, target, CLUSTER_SECRET, body)
    assert reply.status == 200, (target, reply)
    return reply


def prepare(daemon) -> None:
    """Topic `t` with channel `c`, both unpaused, holding a message; writes on; log level
    info; channel `c` without an attempt limit."""
    as_cluster(daemon, "POST", "/disable/write?type=none")
    as_cluster(daemon, "POST", "/topic/create?topic=t")
    as_cluster(daemon, "POST", "/channel/create?topic=t&channel=c")
    as_cluster(daemon, "POST", "/topic/unpause?topic=t")
    as_cluster(daemon, "POST", "/channel/unpause?topic=t&channel=c")
    as_cluster(daemon, "PUT", "/config/log_level", b"info")
    as_cluster(daemon, "POST", "/channel/setmaxattempts?topic=t&channel=c&max_attempts=0")
    if state(daemon)["topics"]["t"]["channels"]["c"]["depth"] == 0:
        as_cluster(daemon, "POST", "/pub?topic=t", b"kept")


def state(daemon) -> dict:
    """What a request could change, read with the cluster secret."""
    stats = as_cluster(daemon, "GET", "/stats?format=json&include_clients=false").json()
    topics = {}
    for topic in stats["topics"] or ():
        channels = {
            channel["channel_name"]: {
                key: value
                for key, value in channel.items()
                if key not in ("clients", "e2e_processing_latency")
            }
            for channel in topic["channels"]
        }
        topics[topic["topic_name"]] = {
            "paused": topic["paused"],
            "message_count": topic["message_count"],
            "depth": topic["depth"],
            "channels": channels,
        }
    offsets = as_cluster(daemon, "GET", "/partition/offsets?topic=t").json()
    return {
        "topics": topics,
        "offsets": offsets,
        "log_level": as_cluster(daemon, "GET", "/config/log_level").json(),
        "lookupds": as_cluster(daemon, "GET", "/config/nsqlookupd_tcp_addresses").json(),
        # Writes on: a publish of the probe topic (never compared) is taken.
        "writable": ask(daemon, "POST", "/pub?topic=probe", CLUSTER_SECRET, b"p").status,
    }


def without_probe(snapshot: dict) -> dict:
    return {**snapshot, "topics": {k: v for k, v in snapshot["topics"].items() if k != "probe"}}


def test_the_table_names_every_route_nsqd_has(tmp_path):
    api = HTTPAPI(NSQD(Options(data_path=str(tmp_path))))
    assert sorted(api.router.routes()) == sorted(ROUTES)


@pytest.mark.parametrize("route", list(ROUTES), ids=[f"{m} {p}" for m, p in ROUTES])
def test_a_route_answers_only_whom_its_mode_allows(secured, route):
    mode, daemon = secured
    method, path = route
    need = ROUTES[route][MODES[mode]]
    target = TARGETS.get(path, f"{path}?topic=t&channel=c&partition=0")
    body = BODIES.get(path, b"x")
    for name, secret in CREDENTIALS.items():
        if name in HOLDERS[need]:
            continue
        prepare(daemon)
        before = without_probe(state(daemon))
        reply = ask(daemon, method, target, secret, body)
        expected = (403, "FORBIDDEN")
        if name == "none":
            expected = (401, "AUTH_REQUIRED")
        elif name == "wrong" and need != "cluster":  # the cluster's routes ask no auth server
            expected = (401, "AUTH_FAILED")
        assert (reply.status, json.loads(reply.body)["message"]) == expected, (name, reply)
        if name == "none":
            assert reply.header("WWW-Authenticate") == 'Bearer realm="nsqd"'
        assert without_probe(state(daemon)) == before, (name, "changed what it refused")
    for name in HOLDERS[need]:
        prepare(daemon)
        reply = ask(daemon, method, target, CREDENTIALS[name], body)
        assert reply.status not in (401, 403), (name, reply)


def test_a_credential_granting_nothing_is_unauthorized(secured):
    _mode, daemon = secured
    reply = ask(daemon, "GET", "/partition/fetch?topic=t&partition=0", "nothing")
    assert (reply.status, reply.json()["message"]) == (401, "UNAUTHORIZED")


def test_a_grant_covers_its_own_topic_and_channel_only(secured):
    _mode, daemon = secured
    prepare(daemon)
    as_cluster(daemon, "POST", "/channel/create?topic=t&channel=other")
    allowed = ask(daemon, "POST", "/channel/setoffset?topic=t&channel=c", "narrow", b"{}")
    assert allowed.status not in (401, 403), allowed
    other = ask(daemon, "POST", "/channel/setoffset?topic=t&channel=other", "narrow", b"{}")
    assert (other.status, other.json()["message"]) == (403, "FORBIDDEN")
    # A topic-wide read is covered by a subscribe grant on the topic, whatever its channels.
    assert ask(daemon, "GET", "/partition/offsets?topic=t", "narrow").status == 200


def test_the_auth_server_is_asked_once_per_ttl(secured, auth_server):
    mode, daemon = secured
    secret = f"counted-{mode}"
    auth_server.answers[secret] = ANSWERS["sub"]
    for _ in range(5):
        assert ask(daemon, "GET", "/partition/offsets?topic=t", secret).status == 200
    asked = auth_server.requests_for(secret)
    assert len(asked) == 1, asked
    assert asked[0].query["remote_ip"] == "127.0.0.1"
    assert asked[0].query["tls"] == "false"


def test_over_https_the_client_certificates_common_name_goes_to_the_auth_server(
    secured, auth_server, certs
):
    mode, daemon = secured
    secret = f"https-{mode}"
    auth_server.answers[secret] = ANSWERS["sub"]
    context: ssl.SSLContext = certs.client_context(with_certificate="ca")
    reply = request(
        daemon.port("HTTPS"),
        "GET",
        "/partition/offsets?topic=t",
        headers={"Authorization": f"Bearer {secret}"},
        context=context,
    )
    assert reply.status == 200, reply
    asked = auth_server.requests_for(secret)
    assert [(r.query["tls"], r.query["common_name"]) for r in asked] == [
        ("true", CLIENT_COMMON_NAME)
    ]
