"""Every HTTP route of nsqlookupd behind AUTH (docs/operations.md, "Securing a cluster").

nsqlookupd with a real auth server and `--cluster-secret`: every operation (topic and channel
creation and deletion, tombstones, Youzan's partition and cluster operations, the log level,
disabling writes) needs an `admin` authorization; what the nsqds tell the master
(`/cluster/isr/*`, `/cluster/leader/*`, `/cluster/node/leave`) only the cluster secret; the
reads stay open to every client, as Go's. Each route is asked with no credential, a refused
one, `subscribe` only, `publish` only, `admin` and the cluster secret; a refusal changes
nothing (the topics, their channels, the registrations).
"""

import json
from collections.abc import Iterator

import pytest

from nsqpy.nsqlookupd.http_api import HTTPAPI
from nsqpy.nsqlookupd.options import Options
from nsqpy.nsqlookupd.server import NSQLookupd
from tests.harness import start_nsqlookupd
from tests.security.access import ANSWERS, CLUSTER_SECRET, CREDENTIALS, HOLDERS
from tests.support.auth_server import AuthServer
from tests.support.http import HTTPReply, request

ROUTES = {
    ("GET", "/ping"): "open",
    ("GET", "/info"): "open",
    ("GET", "/debug"): "open",
    ("GET", "/lookup"): "open",
    ("GET", "/topics"): "open",
    ("GET", "/channels"): "open",
    ("GET", "/nodes"): "open",
    ("GET", "/listlookup"): "open",
    ("GET", "/cluster/stats"): "open",
    ("GET", "/stats"): "open",
    ("POST", "/topic/create"): "admin",
    ("POST", "/topic/delete"): "admin",
    ("POST", "/topic/tombstone"): "admin",
    ("POST", "/channel/create"): "admin",
    ("POST", "/channel/delete"): "admin",
    ("POST", "/disable/write"): "admin",
    ("POST", "/loglevel/set"): "admin",
    ("POST", "/topic/partition/expand"): "admin",
    ("POST", "/topic/partition/move"): "admin",
    ("POST", "/topic/partition/elect"): "admin",
    ("POST", "/topic/meta/update"): "admin",
    ("POST", "/cluster/node/remove"): "admin",
    ("POST", "/cluster/upgrade/begin"): "admin",
    ("POST", "/cluster/upgrade/done"): "admin",
    ("POST", "/cluster/balance/topn"): "admin",
    ("POST", "/cluster/lookupd/tombstone"): "admin",
    ("POST", "/cluster/isr/leave"): "cluster",
    ("POST", "/cluster/isr/join"): "cluster",
    ("POST", "/cluster/leader/unwritable"): "cluster",
    ("POST", "/cluster/node/leave"): "cluster",
    ("POST", "/cluster/leader/resign"): "cluster",
}


@pytest.fixture(scope="module")
def lookupd(tmp_path_factory) -> Iterator:
    server = AuthServer().start()
    server.answers.update(ANSWERS)
    daemon = start_nsqlookupd(
        f"-auth-http-address=127.0.0.1:{server.port}", f"-cluster-secret={CLUSTER_SECRET}"
    )
    yield daemon
    daemon.stop()
    server.stop()


def ask(daemon, method: str, target: str, secret: str | None) -> HTTPReply:
    headers = {"Authorization": f"Bearer {secret}"} if secret else {}
    return request(daemon.port("HTTP"), method, target, b"" if method == "POST" else None, headers)


def prepare(daemon) -> None:
    for target in ("/topic/create?topic=t", "/channel/create?topic=t&channel=c"):
        assert ask(daemon, "POST", target, CLUSTER_SECRET).status == 200


def state(daemon) -> dict:
    return {
        target: ask(daemon, "GET", target, None).json()
        for target in ("/topics", "/channels?topic=t", "/lookup?topic=t", "/nodes")
    }


def test_the_table_names_every_route_nsqlookupd_has():
    api = HTTPAPI(NSQLookupd(Options()))
    assert sorted(api.router.routes()) == sorted(ROUTES)


@pytest.mark.parametrize("route", list(ROUTES), ids=[f"{m} {p}" for m, p in ROUTES])
def test_a_route_answers_only_whom_it_allows(lookupd, route):
    method, path = route
    need = ROUTES[route]
    target = f"{path}?topic=t&channel=c&partition=0&node=n"
    for name, secret in CREDENTIALS.items():
        if name in HOLDERS[need]:
            continue
        prepare(lookupd)
        before = state(lookupd)
        reply = ask(lookupd, method, target, secret)
        expected = (403, "FORBIDDEN")
        if name == "none":
            expected = (401, "AUTH_REQUIRED")
        elif name == "wrong" and need != "cluster":
            expected = (401, "AUTH_FAILED")
        assert (reply.status, json.loads(reply.body)["message"]) == expected, (name, reply)
        assert state(lookupd) == before, (name, "changed what it refused")
    for name in HOLDERS[need]:
        prepare(lookupd)
        reply = ask(lookupd, method, target, CREDENTIALS[name])
        assert reply.status not in (401, 403), (name, reply)
