"""AUTH against a real HTTP auth server (docs/protocol.md §2.2; Go's internal/auth and CheckAuth).

`AuthServer` (tests/support/auth_server.py) is an aiohttp application in a thread of its own.
It answers by secret from a table the tests may change while nsqd is running, and records
every request nsqd makes, so the tests assert both sides: the exact frame the client gets
(every AUTH error text of Go nsqd v1.3.0) and what nsqd asked the auth server (remote_ip, tls,
secret, common_name). nsqd is the console script with `-auth-http-address`.
"""

import asyncio
import json
import socket
import time

import nsq
import pytest

from nsqpy.common.command import (
    encode_auth,
    encode_command,
    encode_dpub,
    encode_mpub,
    encode_pub,
    encode_sub,
)
from nsqpy.common.frame import FRAME_TYPE_RESPONSE
from tests.security.support import CLIENT_COMMON_NAME, client_stats, connection, running_nsqd
from tests.support.auth_server import answering
from tests.support.polling import poll, wait_until

ALLOW_ALL = {"topic": "allowed.*", "channels": [".*"], "permissions": ["subscribe", "publish"]}
GOOD = {
    "ttl": 3600,
    "identity": "alice",
    "identity_url": "http://x",
    "authorizations": [ALLOW_ALL],
}
ANSWERS = {
    "good": GOOD,
    "pubonly": {
        "ttl": 3600,
        "identity": "bob",
        "authorizations": [{"topic": "allowed.*", "channels": [".*"], "permissions": ["publish"]}],
    },
    "subonly": {
        "ttl": 3600,
        "identity": "carol",
        "authorizations": [
            {"topic": "allowed.*", "channels": [".*"], "permissions": ["subscribe"]}
        ],
    },
    "narrow": {
        "ttl": 3600,
        "authorizations": [
            {"topic": "^orders$", "channels": ["^billing$"], "permissions": ["subscribe"]},
            {"topic": "^orders$", "channels": [".*"], "permissions": ["publish"]},
        ],
    },
    # Go matches a PUB's channel "" against the channel patterns too: with none, no PUB.
    "nochannels": {
        "ttl": 3600,
        "authorizations": [{"topic": ".*", "channels": [], "permissions": ["publish"]}],
    },
    "none": {"ttl": 3600, "identity": "nobody", "authorizations": []},
    "bad": 403,
    # Go's QueryAuthd refuses these answers, so AUTH fails as if the server were down.
    "nottl": {"identity": "dave", "authorizations": [ALLOW_ALL]},
    "badpermission": {
        "ttl": 3600,
        "authorizations": [{"topic": ".*", "channels": [".*"], "permissions": ["root"]}],
    },
    # nsqpy's third permission: its HTTP routes that change a node (Go refuses the answer).
    "adminonly": {
        "ttl": 3600,
        "authorizations": [{"topic": ".*", "channels": [".*"], "permissions": ["admin"]}],
    },
}
GO_ACCEPT = "application/vnd.nsq; version=1.0"
AUTH_FAILED = "E_AUTH_FAILED AUTH failed"


def closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound once, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# -- fixtures -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def auth_server():
    with answering(ANSWERS) as server:
        yield server


@pytest.fixture(scope="module", params=["1", "2"], ids=["one process", "two workers"])
def auth_nsqd(request, auth_server, certs, tmp_path_factory):
    """Auth enabled; TLS available (with our CA, so a client certificate is checked if sent).
    Also with `--workers=2`: a connection moved or relayed to its topic's owner keeps what
    AUTH granted, and the auth server is not asked again."""
    flags = [
        f"-auth-http-address=127.0.0.1:{auth_server.port}",
        *certs.tls_flags(),
        f"-tls-root-ca-file={certs.ca}",
        f"-workers={request.param}",
    ]
    # The tests count the requests of their secrets: each nsqd starts the count afresh.
    auth_server.forget_requests()
    with running_nsqd(tmp_path_factory.mktemp("auth"), *flags) as daemon:
        yield daemon


@pytest.fixture(scope="module")
def down_nsqd(tmp_path_factory):
    flags = [f"-auth-http-address=127.0.0.1:{closed_port()}"]
    with running_nsqd(tmp_path_factory.mktemp("auth-down"), *flags) as daemon:
        yield daemon


@pytest.fixture(scope="module")
def two_servers_nsqd(auth_server, tmp_path_factory):
    """One auth server down, one up: nsqd tries them in random order until one answers."""
    flags = [
        f"-auth-http-address=127.0.0.1:{closed_port()}",
        f"-auth-http-address=http://127.0.0.1:{auth_server.port}/v2/authorize",
    ]
    with running_nsqd(tmp_path_factory.mktemp("auth-two"), *flags) as daemon:
        yield daemon


@pytest.fixture(scope="module")
def no_auth_nsqd(tmp_path_factory):
    with running_nsqd(tmp_path_factory.mktemp("no-auth")) as daemon:
        yield daemon


def expect_auth_error(daemon, secret: str, text: str) -> None:
    with connection(daemon.port("TCP")) as conn:
        reply = conn.negotiate()
        assert reply["auth_required"] is True
        conn.send(encode_auth(secret))
        conn.expect_error(text)


# -- a successful AUTH ---------------------------------------------------------------------------


def test_identify_says_auth_is_required(auth_nsqd):
    with connection(auth_nsqd.port("TCP")) as conn:
        assert conn.negotiate()["auth_required"] is True


def test_auth_reply_and_an_authorized_round_trip(auth_nsqd):
    with connection(auth_nsqd.port("TCP")) as conn:
        conn.negotiate(client_id="alice-client")
        conn.send(encode_auth("good"))
        frame = conn.read_response()
        assert frame.frame_type == FRAME_TYPE_RESPONSE
        # Go marshals a struct: exactly these keys, in this order, no spaces.
        assert frame.data == b'{"identity":"alice","identity_url":"http://x","permission_count":1}'
        conn.send(encode_pub("allowed.one", b"first"))
        conn.expect_ok()
        conn.send(encode_mpub("allowed.one", [b"second", b"third"]))
        conn.expect_ok()
        conn.send(encode_dpub("allowed.one", 0, b"fourth"))
        conn.expect_ok()
        conn.subscribe("allowed.one", "reader", rdy=10)
        messages = conn.read_messages(4)
        assert sorted(m.body for m in messages) == [b"first", b"fourth", b"second", b"third"]
        conn.finish(messages)
        stats = client_stats(f"http://{auth_nsqd.addresses['HTTP']}", "alice-client")
        assert stats["authed"] is True
        assert stats["auth_identity"] == "alice"
        assert stats["auth_identity_url"] == "http://x"


def test_auth_query_without_tls(auth_nsqd, auth_server):
    with connection(auth_nsqd.port("TCP")) as conn:
        conn.negotiate()
        conn.send(encode_auth("good"))
        assert conn.read_response().frame_type == FRAME_TYPE_RESPONSE
    request = auth_server.requests_for("good")[-1]
    assert (request.method, request.path) == ("GET", "/auth")
    assert request.query == {
        "remote_ip": "127.0.0.1",
        "tls": "false",
        "secret": "good",
        "common_name": "",
    }


@pytest.mark.parametrize("certificate, common_name", [("", ""), ("ca", CLIENT_COMMON_NAME)])
def test_auth_query_over_tls(auth_nsqd, auth_server, certs, certificate, common_name):
    secret = f"good-tls-{certificate or 'anonymous'}"
    auth_server.answers[secret] = GOOD
    context = certs.client_context(with_certificate=certificate)
    with connection(auth_nsqd.port("TCP")) as conn:
        reply = conn.negotiate(context, tls_v1=True)
        assert reply["tls_v1"] is True and reply["auth_required"] is True
        conn.send(encode_auth(secret))
        assert conn.read_response().frame_type == FRAME_TYPE_RESPONSE
        conn.send(encode_pub("allowed.tls", b"over tls"))
        conn.expect_ok()
    (request,) = auth_server.requests_for(secret)
    assert request.query == {
        "remote_ip": "127.0.0.1",
        "tls": "true",
        "secret": secret,
        "common_name": common_name,
    }


def test_auth_request_is_byte_for_byte_gos(auth_nsqd, auth_server):
    # Go builds the query with url.Values.Encode (keys sorted) and asks with its http_api
    # client, which always sends the NSQ v1 Accept header.
    secret = "good & proper"
    auth_server.answers[secret] = GOOD
    with connection(auth_nsqd.port("TCP")) as conn:
        conn.negotiate()
        conn.send(encode_auth(secret))
        assert conn.read_response().frame_type == FRAME_TYPE_RESPONSE
    (request,) = auth_server.requests_for(secret)
    assert (request.query_string, request.headers.get("Accept")) == (
        "common_name=&remote_ip=127.0.0.1&secret=good+%26+proper&tls=false",
        GO_ACCEPT,
    )


def test_full_url_auth_address_and_a_second_server_that_is_down(two_servers_nsqd, auth_server):
    secret = "good-two-servers"
    auth_server.answers[secret] = GOOD
    # Whichever server nsqd tries first, the one that answers lets every connection in.
    for _ in range(4):
        with connection(two_servers_nsqd.port("TCP")) as conn:
            conn.negotiate()
            conn.send(encode_auth(secret))
            assert conn.read_response().frame_type == FRAME_TYPE_RESPONSE
            conn.send(encode_pub("allowed.two", b"x"))
            conn.expect_ok()
    requests = auth_server.requests_for(secret)
    assert len(requests) == 4
    assert {request.path for request in requests} == {"/v2/authorize"}


# -- refusals -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "command, data",
    [
        ("SUB", encode_sub("allowed.t", "c")),
        ("PUB", encode_pub("allowed.t", b"x")),
        ("MPUB", encode_mpub("allowed.t", [b"x", b"y"])),
        ("DPUB", encode_dpub("allowed.t", 10, b"x")),
        ("CREATE_TOPIC", encode_command("INTERNAL_CREATE_TOPIC", "allowed.t", 0)),
    ],
)
def test_commands_before_auth_are_refused(auth_nsqd, command, data):
    with connection(auth_nsqd.port("TCP")) as conn:
        conn.negotiate()
        conn.send(data)
        conn.expect_error(f"E_AUTH_FIRST AUTH required before {command}")


@pytest.mark.parametrize(
    "secret, data, text",
    [
        ("good", encode_pub("other", b"x"), 'AUTH failed for PUB on "other" ""'),
        ("good", encode_mpub("other", [b"x"]), 'AUTH failed for MPUB on "other" ""'),
        ("good", encode_dpub("other", 5, b"x"), 'AUTH failed for DPUB on "other" ""'),
        ("good", encode_sub("other", "c"), 'AUTH failed for SUB on "other" "c"'),
        ("pubonly", encode_sub("allowed.t", "c"), 'AUTH failed for SUB on "allowed.t" "c"'),
        ("subonly", encode_pub("allowed.t", b"x"), 'AUTH failed for PUB on "allowed.t" ""'),
        ("narrow", encode_sub("orders", "shipping"), 'AUTH failed for SUB on "orders" "shipping"'),
        ("narrow", encode_pub("orders.eu", b"x"), 'AUTH failed for PUB on "orders.eu" ""'),
        ("nochannels", encode_pub("orders", b"x"), 'AUTH failed for PUB on "orders" ""'),
        (
            "subonly",
            encode_command("INTERNAL_CREATE_TOPIC", "allowed.t", 1),
            'AUTH failed for CREATE_TOPIC on "allowed.t" ""',
        ),
    ],
    ids=[
        "pub",
        "mpub",
        "dpub",
        "sub",
        "pubonly-sub",
        "subonly-pub",
        "channel",
        "anchored",
        "no-channel-patterns",
        "create-topic",
    ],
)
def test_unauthorized_commands(auth_nsqd, secret, data, text):
    with connection(auth_nsqd.port("TCP")) as conn:
        conn.negotiate()
        conn.send(encode_auth(secret))
        assert conn.read_response().frame_type == FRAME_TYPE_RESPONSE
        conn.send(data)
        conn.expect_error(f"E_UNAUTHORIZED {text}")


def test_what_the_narrow_authorization_allows(auth_nsqd):
    with connection(auth_nsqd.port("TCP")) as conn:
        conn.negotiate()
        conn.send(encode_auth("narrow"))
        assert json.loads(conn.read_response().data)["permission_count"] == 2
        conn.send(encode_pub("orders", b"x"))
        conn.expect_ok()
        conn.subscribe("orders", "billing", rdy=1)
        assert [m.body for m in conn.read_messages(1)] == [b"x"]


def test_youzans_internal_create_topic_needs_publishing_rights(auth_nsqd):
    """As Youzan's: its partition is parsed first (a bad one is refused before AUTH), then
    the client must be allowed to publish to the topic."""
    with connection(auth_nsqd.port("TCP")) as conn:
        conn.negotiate()
        conn.send(encode_command("INTERNAL_CREATE_TOPIC", "allowed.t", "x"))
        conn.expect_error(
            "E_BAD_PARTITION topic partition is not valid:"
            ' strconv.Atoi: parsing "x": invalid syntax'
        )
    with connection(auth_nsqd.port("TCP")) as conn:
        conn.negotiate()
        conn.send(encode_auth("pubonly"))
        assert conn.read_response().frame_type == FRAME_TYPE_RESPONSE
        # With two workers, the later partitions of another worker are forwarded to it.
        for partition in range(4):
            conn.send(encode_command("INTERNAL_CREATE_TOPIC", "allowed.made", partition))
            conn.expect_ok()
    with connection(auth_nsqd.port("TCP")) as conn:
        conn.negotiate()
        conn.send(encode_auth("subonly"))
        assert conn.read_response().frame_type == FRAME_TYPE_RESPONSE
        conn.subscribe("allowed.made", "c", rdy=0)
        conn.send(encode_command("INTERNAL_CREATE_TOPIC", "allowed.made", 5))
        conn.expect_error('E_UNAUTHORIZED AUTH failed for CREATE_TOPIC on "allowed.made" ""')


def test_no_authorizations(auth_nsqd):
    expect_auth_error(auth_nsqd, "none", "E_UNAUTHORIZED AUTH no authorizations found")


def test_auth_server_refuses_the_secret(auth_nsqd, auth_server):
    expect_auth_error(auth_nsqd, "bad", AUTH_FAILED)
    assert auth_server.requests_for("bad")


@pytest.mark.parametrize("secret", ["nottl", "badpermission"])
def test_answers_go_refuses_fail_auth(auth_nsqd, secret):
    # Go's QueryAuthd: a ttl <= 0 ("invalid TTL") or a permission other than subscribe and
    # publish ("unknown permission"; nsqpy adds admin) is an error, so AUTH fails.
    expect_auth_error(auth_nsqd, secret, AUTH_FAILED)


def test_admin_grants_nothing_over_tcp(auth_nsqd):
    with connection(auth_nsqd.port("TCP")) as conn:
        conn.negotiate()
        conn.send(encode_auth("adminonly"))
        assert json.loads(conn.read_response().data)["permission_count"] == 1
        conn.send(encode_pub("allowed_topic", b"x"))
        conn.expect_error('E_UNAUTHORIZED AUTH failed for PUB on "allowed_topic" ""')


def test_auth_twice(auth_nsqd):
    with connection(auth_nsqd.port("TCP")) as conn:
        conn.negotiate()
        conn.send(encode_auth("good"))
        assert conn.read_response().frame_type == FRAME_TYPE_RESPONSE
        conn.send(encode_auth("good"))
        conn.expect_error("E_INVALID AUTH already set")


def test_auth_after_sub(auth_nsqd):
    with connection(auth_nsqd.port("TCP")) as conn:
        conn.negotiate()
        conn.send(encode_auth("good"))
        assert conn.read_response().frame_type == FRAME_TYPE_RESPONSE
        conn.subscribe("allowed.t", "c", rdy=0)
        conn.send(encode_auth("good"))
        conn.expect_error("E_INVALID cannot AUTH in current state")


def test_auth_disabled(no_auth_nsqd):
    with connection(no_auth_nsqd.port("TCP")) as conn:
        assert conn.negotiate()["auth_required"] is False
        conn.send(encode_auth("good"))
        conn.expect_error("E_AUTH_DISABLED AUTH disabled")


def test_auth_server_down_never_lets_a_client_in(down_nsqd):
    for _ in range(2):
        expect_auth_error(down_nsqd, "good", AUTH_FAILED)
    with connection(down_nsqd.port("TCP")) as conn:
        conn.negotiate()
        conn.send(encode_pub("allowed.t", b"x"))
        conn.expect_error("E_AUTH_FIRST AUTH required before PUB")


# -- TTL ----------------------------------------------------------------------------------------


def publish_until_refused(conn, topic: str, timeout: float = 5.0):
    """PUB every 20 ms while nsqd answers OK; the first other frame."""
    give_up = time.monotonic() + timeout
    while True:
        assert time.monotonic() < give_up, "nsqd never asked the auth server again"
        conn.send(encode_pub(topic, b"x"))
        frame = conn.read_response()
        if frame.frame_type != FRAME_TYPE_RESPONSE:
            return frame
        time.sleep(0.02)


@pytest.mark.parametrize(
    "new_answer, text",
    [
        (
            {"ttl": 60, "authorizations": [dict(ALLOW_ALL, topic="^elsewhere$")]},
            'E_UNAUTHORIZED AUTH failed for PUB on "allowed.ttl" ""',
        ),
        (500, AUTH_FAILED),
    ],
    ids=["new-authorizations", "auth-server-error"],
)
def test_expired_authorizations_are_asked_for_again(auth_nsqd, auth_server, new_answer, text):
    """ttl 1: nsqd keeps the answer for a second, then asks again and obeys the new answer
    (an auth server failing then refuses, as Go's IsAuthorized does)."""
    secret = f"ttl-{'error' if isinstance(new_answer, int) else 'changed'}"
    auth_server.answers[secret] = dict(GOOD, ttl=1)
    with connection(auth_nsqd.port("TCP")) as conn:
        conn.negotiate()
        conn.send(encode_auth(secret))
        assert conn.read_response().frame_type == FRAME_TYPE_RESPONSE
        authed_at = time.monotonic()
        auth_server.answers[secret] = new_answer
        conn.send(encode_pub("allowed.ttl", b"x"))
        conn.expect_ok()  # within the TTL: the first answer still holds
        assert len(auth_server.requests_for(secret)) == 1
        frame = publish_until_refused(conn, "allowed.ttl")
        refused_after = time.monotonic() - authed_at
        assert frame.data.decode() == text
        conn.expect_closed()
    assert refused_after >= 0.9, "nsqd asked again before the TTL ran out"
    assert len(auth_server.requests_for(secret)) == 2


# -- pynsq's auth_secret ---------------------------------------------------------------------------


class Recorder:
    def __init__(self) -> None:
        self.auth_replies: list[dict] = []
        self.errors: list[str] = []
        self.closing = False  # pynsq reports its own close as a failed read


def recording(cls):
    """A pynsq Reader or Writer class that records AUTH replies and connection errors."""

    class Recording(cls):
        def __init__(self, recorder: Recorder, **kwargs) -> None:
            self.recorder = recorder
            super().__init__(**kwargs)

        def _on_connection_auth_response(self, conn, data, **kwargs) -> None:
            self.recorder.auth_replies.append(data)
            super()._on_connection_auth_response(conn, data, **kwargs)

        def _on_connection_error(self, conn, error, **kwargs) -> None:
            if not self.recorder.closing:
                self.recorder.errors.append(str(error))
            super()._on_connection_error(conn, error, **kwargs)

    return Recording


def run_pynsq(session, *args) -> None:
    asyncio.run(asyncio.wait_for(session(*args), 30))


async def pynsq_authorized(address: str, writer_log: Recorder, reader_log: Recorder, got: list):
    topic = "allowed.pynsq"
    writer = recording(nsq.Writer)(writer_log, nsqd_tcp_addresses=[address], auth_secret="good")
    await wait_until(lambda: any(c.connected() for c in writer.conns.values()), "the Writer")
    answers: list = []
    for index in range(5):
        writer.pub(topic, b"auth-%d" % index, callback=lambda conn, data: answers.append(data))
    await wait_until(lambda: len(answers) == 5, "the answers to 5 PUBs")
    assert answers == [b"OK"] * 5

    def handle(message: nsq.Message) -> bool:
        got.append(message.body)
        return True

    reader = recording(nsq.Reader)(
        reader_log,
        topic=topic,
        channel="pynsq",
        message_handler=handle,
        nsqd_tcp_addresses=[address],
        auth_secret="good",
        max_in_flight=10,
    )
    await wait_until(lambda: len(got) == 5, "5 messages")
    writer_log.closing = reader_log.closing = True
    reader.close()
    for conn in list(writer.conns.values()):
        conn.close()


def test_pynsq_with_auth_secret_publishes_and_consumes(auth_nsqd):
    writer_log, reader_log, got = Recorder(), Recorder(), []
    run_pynsq(pynsq_authorized, f"127.0.0.1:{auth_nsqd.port('TCP')}", writer_log, reader_log, got)
    assert sorted(got) == [b"auth-%d" % i for i in range(5)]
    expected = {"identity": "alice", "identity_url": "http://x", "permission_count": 1}
    assert writer_log.auth_replies == [expected]
    assert reader_log.auth_replies == [expected]
    assert writer_log.errors == [] and reader_log.errors == []


async def pynsq_refused(address: str, writer_log: Recorder, reader_log: Recorder):
    writer = recording(nsq.Writer)(writer_log, nsqd_tcp_addresses=[address], auth_secret="bad")
    reader = recording(nsq.Reader)(
        reader_log,
        topic="allowed.pynsq-refused",
        channel="pynsq",
        message_handler=lambda message: True,
        nsqd_tcp_addresses=[address],
        auth_secret="bad",
    )
    await wait_until(lambda: writer_log.errors and reader_log.errors, "both AUTH refusals")
    assert not writer.conns and not reader.conns  # neither ever became ready
    writer_log.closing = reader_log.closing = True
    reader.close()


def test_pynsq_with_a_bad_secret_is_refused(auth_nsqd, auth_server):
    writer_log, reader_log = Recorder(), Recorder()
    run_pynsq(pynsq_refused, f"127.0.0.1:{auth_nsqd.port('TCP')}", writer_log, reader_log)
    assert writer_log.auth_replies == [] and reader_log.auth_replies == []
    assert AUTH_FAILED in writer_log.errors[0]
    assert AUTH_FAILED in reader_log.errors[0]
    poll(lambda: len(auth_server.requests_for("bad")) >= 2, "both AUTH queries")
