"""The blocking client, the smart client and the tools against an nsqd that lets nobody in
unproven: TLS required with a client certificate signed by its CA, AUTH, and every HTTP route
but /ping and /info behind AUTH (`--http-auth-required`). The clients take go-nsq's option
names (nsqpy.client.security.Security; the tools' `--consumer-opt`/`--producer-opt`)."""

import threading
import urllib.error
from collections.abc import Iterator

import pytest

from nsqpy.client.blocking import (
    Connection,
    Consumer,
    NSQError,
    Producer,
    http_json,
    http_request,
)
from nsqpy.client.security import Security, SecurityMismatch
from nsqpy.client.smart import SmartConsumer, SmartProducer
from nsqpy.common.command import NOP, encode_pub
from tests.harness import start_nsqlookupd
from tests.security.support import Certificates, running_nsqd
from tests.support.auth_server import AuthServer, answering
from tests.support.polling import poll
from tests.tools.support import run_tool

ALL = {"topic": ".*", "channels": [".*"]}
ANSWERS = {
    "both": {
        "ttl": 3600,
        "identity": "pipeline",
        "authorizations": [{**ALL, "permissions": ["subscribe", "publish"]}],
    },
    "read-only": {"ttl": 3600, "authorizations": [{**ALL, "permissions": ["subscribe"]}]},
    "wrong": 403,
}


@pytest.fixture(scope="module")
def auth_server() -> Iterator[AuthServer]:
    with answering(ANSWERS) as server:
        yield server


@pytest.fixture(scope="module")
def lookupd():
    daemon = start_nsqlookupd()
    yield daemon
    daemon.stop()


@pytest.fixture(scope="module")
def strict_nsqd(certs: Certificates, auth_server, lookupd, tmp_path_factory):
    flags = [
        *certs.tls_flags(),
        "-tls-required=true",
        "-tls-client-auth-policy=require-verify",
        f"-tls-root-ca-file={certs.ca}",
        f"-auth-http-address=127.0.0.1:{auth_server.port}",
        "-http-auth-required",
        "-log-topic=lt",
        f"-lookupd-tcp-address={lookupd.addresses['TCP']}",
        "-broadcast-address=127.0.0.1",
    ]
    with running_nsqd(tmp_path_factory.mktemp("strict"), *flags) as daemon:
        yield daemon


def security(certs: Certificates, secret: str = "both", **changes) -> Security:
    settings = {
        "tls_v1": True,
        "tls_root_ca_file": certs.ca,
        "tls_cert": certs.client_cert,
        "tls_key": certs.client_key,
        "auth_secret": secret,
        **changes,
    }
    return Security(**settings)


def test_the_blocking_client_publishes_and_consumes_over_tls_with_auth(strict_nsqd, certs):
    tcp, http = strict_nsqd.addresses["TCP"], strict_nsqd.addresses["HTTP"]
    proven = security(certs)
    with Producer(tcp, security=proven) as producer:
        producer.publish("secured", b"one")
        producer.multi_publish("secured", [b"two", b"three"])
        assert producer.auth_reply["identity"] == "pipeline"
    with Consumer(tcp, "secured", "c", security=proven) as consumer:
        bodies = []
        while len(bodies) < 3:
            message = consumer.receive(timeout=10)
            assert message is not None, f"only {bodies} arrived"
            message.finish()
            bodies.append(message.body)
        assert bodies == [b"one", b"two", b"three"]
        # nsqd saw TLS, the client certificate and the AUTH of this very connection.
        stats = http_json(http, "/stats", security=proven, format="json", topic="secured")
        (client,) = stats["topics"][0]["channels"][0]["clients"]
        assert (client["tls"], client["authed"], client["auth_identity"]) == (
            True,
            True,
            "pipeline",
        )


def test_a_tls_connection_read_in_one_thread_takes_sends_from_another(strict_nsqd, certs):
    """OpenSSL runs one call at a time on a connection. A read racing a send from another
    thread took the send for nsqd's close (the smart consumer lost a subscription so, right
    after its RDY): over TLS the reader and the senders take turns."""
    errors: list[BaseException] = []
    stop = threading.Event()
    with Connection(strict_nsqd.addresses["TCP"], security=security(certs)) as connection:

        def read_until_stopped() -> None:
            try:
                while not stop.is_set():
                    connection.read_frame(timeout=0)
            except BaseException as error:  # the test's verdict, below
                errors.append(error)

        reader = threading.Thread(target=read_until_stopped)
        reader.start()
        try:
            for _ in range(30_000):
                connection.send(NOP)
                if errors:
                    break
        finally:
            stop.set()
            reader.join()
        assert errors == []
        connection.send(encode_pub("turns", b"after"))
        assert connection.read_response() == b"OK"


@pytest.mark.parametrize(
    ("changes", "error", "text"),
    [
        ({"auth_secret": ""}, SecurityMismatch, "requires AUTH and no auth secret was given"),
        ({"auth_secret": "wrong"}, NSQError, "E_AUTH_FAILED"),
        ({"auth_secret": "read-only"}, NSQError, "E_UNAUTHORIZED"),
    ],
)
def test_the_blocking_client_says_what_is_missing(strict_nsqd, certs, changes, error, text):
    with pytest.raises(error, match=text):
        with Producer(strict_nsqd.addresses["TCP"], security=security(certs, **changes)) as p:
            p.publish("secured", b"refused")


def test_the_http_helpers_go_to_https_when_told_and_carry_the_secret(strict_nsqd, certs):
    """The plain port answers TLS_REQUIRED with the HTTPS port: with TLS settings the helper
    asks there, presenting the client certificate and the secret as a Bearer credential."""
    http = strict_nsqd.addresses["HTTP"]
    http_request(http, "/pub", method="POST", body=b"kept", security=security(certs), topic="lt")
    offsets = http_json(http, "/partition/offsets", security=security(certs), topic="lt")
    (partition,) = offsets["partitions"]
    assert partition["end"]["offset"] > partition["start"]["offset"]
    with pytest.raises(urllib.error.HTTPError) as plain:
        http_json(http, "/partition/offsets", topic="lt")
    assert plain.value.code == 403 and b"TLS_REQUIRED" in plain.value.read()
    with pytest.raises(urllib.error.HTTPError) as anonymous:
        http_json(http, "/partition/offsets", security=security(certs, ""), topic="lt")
    assert anonymous.value.code == 401 and b"AUTH_REQUIRED" in anonymous.value.read()


def test_the_smart_client_through_nsqlookupd(strict_nsqd, lookupd, certs):
    proven = security(certs)
    lookupd_http = lookupd.addresses["HTTP"]
    http = strict_nsqd.addresses["HTTP"]
    # nsqlookupd lists a topic to writers once it has a channel.
    http_request(http, "/topic/create", method="POST", security=proven, topic="smart")
    http_request(
        http, "/channel/create", method="POST", security=proven, topic="smart", channel="c"
    )
    with SmartProducer([lookupd_http], security=proven) as producer:
        poll(lambda: producer.refresh("smart").complete, "nsqlookupd to list the nsqd")
        for number in range(5):
            producer.publish("smart", f"smart-{number}".encode())
    with SmartConsumer([lookupd_http], "smart", "c", max_in_flight=5, security=proven) as consumer:
        received = consumer.receive_many(5, timeout=10, finish=True)
    assert sorted(m.body for m in received) == [f"smart-{n}".encode() for n in range(5)]


def go_nsq_options(flag: str, certs: Certificates) -> list[str]:
    return [
        f"--{flag}=tls_v1,true",
        f"--{flag}=tls_root_ca_file,{certs.ca}",
        f"--{flag}=tls_cert,{certs.client_cert}",
        f"--{flag}=tls_key,{certs.client_key}",
        f"--{flag}=tls_min_version,tls1.2",
        f"--{flag}=auth_secret,both",
    ]


def test_the_tools_take_go_nsqs_tls_and_auth_options(strict_nsqd, certs):
    tcp = strict_nsqd.addresses["TCP"]
    published = run_tool(
        "to_nsq",
        "--topic=tools",
        f"--nsqd-tcp-address={tcp}",
        *go_nsq_options("producer-opt", certs),
        stdin=b"alpha\nbeta\ngamma\n",
    )
    assert published.returncode == 0, published.stderr
    tailed = run_tool(
        "nsq_tail",
        "--topic=tools",
        f"--nsqd-tcp-address={tcp}",
        "-n",
        "3",
        *go_nsq_options("consumer-opt", certs),
    )
    assert tailed.returncode == 0, tailed.stderr
    assert tailed.stdout.splitlines() == [b"alpha", b"beta", b"gamma"]
    refused = run_tool("to_nsq", "--topic=tools", f"--nsqd-tcp-address={tcp}", stdin=b"x\n")
    assert refused.returncode == 1
    assert b"requires AUTH and no auth secret was given" in refused.stderr


def test_a_tool_reports_an_unreadable_ca_file_at_start(tmp_path):
    result = run_tool(
        "nsq_tail",
        "--topic=t",
        "--nsqd-tcp-address=127.0.0.1:1",
        "--consumer-opt=tls_v1",
        f"--consumer-opt=tls_root_ca_file,{tmp_path / 'missing.pem'}",
    )
    assert result.returncode == 1
    assert b"failed to read custom Certificate Authority file" in result.stderr
