"""nsqadmin in front of an nsqd and an nsqlookupd that require AUTH on every route: Go
nsqadmin's `--admin-user` (named by `--acl-http-header`) decides who may act, and what
nsqadmin asks of the daemons carries the acting person's own `Authorization`, so the daemons
judge the person, not nsqadmin (docs/operations.md, "Securing a cluster")."""

from collections.abc import Iterator

import pytest

from tests.harness import start_nsqd, start_nsqlookupd
from tests.nsqadmin.support import http, start_nsqadmin
from tests.security.access import ANSWERS
from tests.support.auth_server import AuthServer
from tests.support.http import request
from tests.support.polling import poll

# Everyone operating: `admin` to act, and `subscribe` to read what the pages show.
OPERATOR = {
    "ttl": 3600,
    "authorizations": [
        {"topic": ".*", "channels": [".*"], "permissions": ["admin", "subscribe", "publish"]}
    ],
}


@pytest.fixture(scope="module")
def secured(tmp_path_factory) -> Iterator[dict]:
    server = AuthServer().start()
    server.answers.update({**ANSWERS, "operator": OPERATOR})
    auth = f"-auth-http-address=127.0.0.1:{server.port}"
    lookupd = start_nsqlookupd(auth)
    nsqd = start_nsqd(
        tmp_path_factory.mktemp("nsqd"),
        auth,
        "-http-auth-required",
        f"-lookupd-tcp-address={lookupd.addresses['TCP']}",
        "-broadcast-address=127.0.0.1",
    )
    admin = start_nsqadmin(
        f"-lookupd-http-address={lookupd.addresses['HTTP']}", "-admin-user=alice"
    )
    operator = {"Authorization": "Bearer operator"}
    reply = request(nsqd.port("HTTP"), "POST", "/pub?topic=t", b"m", operator)
    assert reply.status == 200, reply
    reply = request(nsqd.port("HTTP"), "POST", "/channel/create?topic=t&channel=c", b"", operator)
    assert reply.status == 200, reply
    poll(
        lambda: request(lookupd.port("HTTP"), "GET", "/lookup?topic=t").status == 200,
        "t registered",
    )
    yield {
        "url": f"http://127.0.0.1:{admin.port('HTTP')}",
        "nsqd": nsqd,
        "lookupd": lookupd,
        "server": server,
    }
    admin.stop()
    nsqd.stop()
    lookupd.stop()
    server.stop()


def channel_paused(nsqd) -> bool:
    target = "/stats?format=json&topic=t&channel=c"
    reply = request(nsqd.port("HTTP"), "GET", target, headers={"Authorization": "Bearer operator"})
    [topic] = reply.json()["topics"]
    return topic["channels"][0]["paused"]


def test_only_an_admin_user_with_an_admin_credential_may_act(secured):
    endpoint = f"{secured['url']}/api/topics/t/c"
    pause = {"action": "pause"}
    # Not an admin user: Go nsqadmin's answer, whatever credential.
    for headers in ({}, {"X-Forwarded-User": "bob", "Authorization": "Bearer operator"}):
        reply = http("POST", endpoint, pause, headers=headers)
        assert (reply.status, reply.json()) == (403, {"message": "FORBIDDEN"})
    # An admin user whose own credential nsqd refuses: nsqd does not pause it, and nsqadmin
    # passes its refusal on (as Go nsqadmin does a failed nsqd: a 200 with a WARNING).
    for credential, refusal in ((None, "401 Unauthorized"), ("sub", "403"), ("pub", "403")):
        headers = {"X-Forwarded-User": "alice"}
        if credential:
            headers["Authorization"] = f"Bearer {credential}"
        reply = http("POST", endpoint, pause, headers=headers)
        assert reply.json()["message"].startswith(f"WARNING: got response {refusal}"), reply
        assert channel_paused(secured["nsqd"]) is False
    reply = http(
        "POST",
        endpoint,
        pause,
        headers={"X-Forwarded-User": "alice", "Authorization": "Bearer operator"},
    )
    assert reply.status == 200, reply
    assert channel_paused(secured["nsqd"]) is True
    # The auth server was asked about the person's secret, not about nsqadmin.
    assert secured["server"].requests_for("operator")


def test_reading_through_nsqadmin_takes_the_persons_credential(secured):
    url = f"{secured['url']}/api/topics/t"
    denied = http("GET", url)
    assert denied.status == 502, denied
    assert "got response 401 Unauthorized" in denied.json()["message"]
    allowed = http("GET", url, headers={"Authorization": "Bearer operator"})
    assert allowed.status == 200, allowed
    assert allowed.json()["message_count"] == 1


def test_nsqadmins_own_secret_reads_when_the_person_sends_none(secured, monkeypatch):
    monkeypatch.setenv("NSQADMIN_HTTP_CLIENT_AUTH_SECRET", "operator")
    lookupd = secured["lookupd"].addresses["HTTP"]
    admin = start_nsqadmin(f"-lookupd-http-address={lookupd}")
    try:
        reply = http("GET", f"http://127.0.0.1:{admin.port('HTTP')}/api/topics/t")
        assert reply.status == 200, reply
        assert reply.json()["message_count"] == 1
    finally:
        admin.stop()
