"""A connection's end frees it (docs/design.md §3.6): with Python's cycle collector off, every
object of a closed connection (the connection, its interpreter and their parts, its client,
its streams, an ephemeral channel it was the last consumer of) is gone once nsqd has seen the
end, and the heartbeat clock holds nothing of it. Reference counting alone frees them: nothing
of a connection may hold a cycle, since nsqd's collector thresholds (`gc.set_threshold(100_000,
50, 100)`, for `/ping` at 10,000 connections) let a full collection wait for long.

Plain, TLS, snappy and deflate connections, one that AUTHs, a consumer (subscribed to an
ephemeral channel, a message in flight) and a producer; each ended cleanly (CLS, or a plain
close for a producer) and by a reset. The clients are tests/nsqd/connection_churn.py's,
in a thread; nsqd runs in the test's event loop, so the test can hold
weak references to its objects.
"""

import dataclasses
import gc
import weakref
from functools import partial

import pytest
import trio

from nsqpy.nsqd.connection import V2Connection
from nsqpy.nsqd.metadata_journal import journal_files
from tests.nsqd.connection_churn import consumer_and_producer, end_client, open_client
from tests.nsqd.wire import Wire
from tests.security.support import Certificates, make_certificates
from tests.support.auth_server import answering
from tests.support.nsqd import tcp_port
from tests.support.polling import wait_until

KINDS = ["plain", "tls", "snappy", "deflate", "auth"]
SECRET = "lifetime"
CLIENT_ID = "lifetime"


@pytest.fixture(scope="module")
def certificates(tmp_path_factory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("certificates"))


@pytest.fixture(scope="module")
def auth_server():
    allow_all = {"topic": ".*", "channels": [".*"], "permissions": ["subscribe", "publish"]}
    with answering({SECRET: {"ttl": 3600, "authorizations": [allow_all]}}) as server:
        yield server


@pytest.fixture
def nsqd_options(nsqd_options, request, certificates, auth_server):
    callspec = getattr(request.node, "callspec", None)
    kind = callspec.params.get("kind", "plain") if callspec is not None else "plain"
    if kind == "tls":
        return dataclasses.replace(
            nsqd_options,
            tls_cert=certificates.server_cert,
            tls_key=certificates.server_key,
            https_address="127.0.0.1:0",
        )
    if kind == "auth":
        return dataclasses.replace(
            nsqd_options, auth_http_address=[f"127.0.0.1:{auth_server.port}"]
        )
    return nsqd_options


def the_connection(role: str) -> V2Connection | None:
    """nsqd's connection of the test's client, once it is the only one (found among the
    objects Python tracks); a consumer's is the subscribed one."""
    found = [
        o
        for o in gc.get_objects()
        if type(o) is V2Connection and o.client.client_id == CLIENT_ID and not o.protocol.internal
    ]
    if len(found) != 1 or (role == "consumer") != (found[0].client.channel is not None):
        return None
    return found[0]


def parts_of(connection: V2Connection) -> dict[str, object]:
    """What a connection is made of, by name: what must go with it."""
    protocol = connection.protocol
    parts = {
        "connection": connection,
        "interpreter": protocol,
        "client": connection.client,
        "parser": protocol.parser,
        "youzan commands": protocol.youzan,
        "worker hops": connection.hops,
    }
    # The socket object, once one was made (a polled connection has its descriptor alone).
    if connection._socket is not None:
        parts["socket"] = connection._socket
    # trio's stream, once the connection has tasks of its own (a polled one has none).
    stream = vars(connection).get("stream")
    if stream is not None:
        parts["stream"] = stream
    if connection._tls is not None:
        parts["tls stream"] = connection._tls
    if connection.client.channel is not None:
        parts["ephemeral channel"] = connection.client.channel
    return parts


@pytest.mark.parametrize("end", ["clean", "reset"])
@pytest.mark.parametrize("role", ["consumer", "producer"])
@pytest.mark.parametrize("kind", KINDS)
async def test_a_closed_connections_objects_are_freed_at_once(nsqd, certificates, kind, role, end):
    port = tcp_port(nsqd)
    connection_kind, secret = kind_and_secret(kind)
    gc.collect()
    gc.disable()
    try:
        opening = partial(consumer_and_producer, port, connection_kind, certificates, secret=secret)
        consumer, producer = await trio.to_thread.run_sync(opening)
        # The other one goes first, with its objects.
        other, other_role = (producer, "producer") if role == "consumer" else (consumer, "consumer")
        await trio.to_thread.run_sync(end_client, other, other_role, "clean")
        client = consumer if role == "consumer" else producer
        connection = await wait_until(
            lambda: the_connection(role), f"the {role}'s connection alone"
        )
        assert connection.timers_at < float("inf")  # booked on the heartbeat clock
        references = {name: weakref.ref(part) for name, part in parts_of(connection).items()}
        del connection
        await trio.to_thread.run_sync(end_client, client, role, end)

        def alive() -> list[str]:
            return [name for name, reference in references.items() if reference() is not None]

        await wait_until(
            lambda: not alive(),
            lambda: f"{kind} {role}, {end} end: still alive with the collector off: {alive()}",
        )
        assert nsqd.heartbeats.booked() == 0
    finally:
        gc.enable()


def kind_and_secret(kind: str) -> tuple[str, bytes | None]:
    """The connection's kind and the secret it AUTHs with (an AUTHing one is plain)."""
    return ("plain", SECRET.encode()) if kind == "auth" else (kind, None)


async def test_ephemeral_channels_that_come_and_go_write_no_metadata(nsqd, monkeypatch):
    """`nsqd.dat` holds no ephemeral topic or channel, so one that comes and goes writes
    nothing, neither the file nor a journal line (rewriting the file for each was most of
    nsqd's work under such churn); a stored channel made afterwards is written."""
    from nsqpy.nsqd import topology_store

    writes: list[str] = []
    real = topology_store.write_metadata

    def counted(data_path: str, encoded: bytes) -> None:
        writes.append(data_path)
        real(data_path, encoded)

    monkeypatch.setattr(topology_store, "write_metadata", counted)
    data_path = nsqd.options.data_path
    topic = nsqd.get_topic("churn")  # a stored topic first, and its own write
    await wait_until(lambda: writes and not journal_files(data_path), "the topic's write")
    writes.clear()
    for _ in range(30):
        wire = await Wire.connect(nsqd)
        await wire.subscribe("churn", "gone#ephemeral")
        await wire.aclose()
        await wait_until(lambda: "gone#ephemeral" not in topic.channels, "the channel gone")
    assert writes == []
    assert journal_files(data_path) == []
    topic.get_channel("kept")
    await wait_until(lambda: writes, "the stored channel's write")


@pytest.mark.parametrize("kind", ["plain", "tls", "snappy", "deflate"])
async def test_a_fatal_error_ends_the_connection_at_once_on_every_stream(
    nsqd, certificates, kind, monkeypatch
):
    """After a fatal error nsqd sends the error, ends its writes (over TLS a close_notify,
    then the socket's; under compression, the stream's under it) and drops what the client
    still sends for up to the linger: the client sees the end at once, on every stream
    (Youzan's go-nsq checks it within a second over TLS, snappy and deflate). The linger is
    set to a minute here: only an end sent at once reaches the client in time."""
    from nsqpy.nsqd import connection as module

    monkeypatch.setattr(module, "REFUSED_LINGER", 60.0)
    port = tcp_port(nsqd)

    def refused() -> None:
        client = open_client(port, kind, "producer", certificates)  # reads time out in 10 s
        client.send(b"BOGUS\n")
        client.expect_error("E_INVALID invalid command BOGUS")

    await trio.to_thread.run_sync(refused)
