"""Clients that connect and go, of every kind a connection's life differs by: plain, TLS,
snappy and deflate; consumers of an ephemeral channel (a message in flight) and producers;
each ended cleanly (CLS, or a plain close for a producer) or by a reset. The clients are
tests/security/support.py's NegotiatedConnection."""

import socket
import struct

from nsqpy.common.command import CLS, encode_auth, encode_pub
from tests.security.support import Certificates, NegotiatedConnection

KINDS = ("plain", "tls", "snappy", "deflate")
ENDS = ("clean", "reset")


def open_client(
    port: int,
    kind: str,
    role: str,
    certificates: Certificates,
    *,
    topic: str = "lifetime",
    client_id: str = "lifetime",
    secret: bytes | None = None,
) -> NegotiatedConnection:
    """A client of `kind` (its upgrade granted and made; AUTH with `secret`), then subscribed
    to `<topic> c#ephemeral` with RDY 1 (a consumer) or having published one message (a
    producer)."""
    client = NegotiatedConnection(port)
    settings: dict = {"client_id": client_id}
    context = None
    if kind == "tls":
        settings["tls_v1"], context = True, certificates.client_context()
    elif kind == "snappy":
        settings["snappy"] = True
    elif kind == "deflate":
        settings["deflate"], settings["deflate_level"] = True, 6
    reply = client.negotiate(context, **settings)
    granted = {"tls": "tls_v1", "snappy": "snappy", "deflate": "deflate"}.get(kind)
    assert granted is None or reply[granted], reply
    if secret is not None:
        assert reply["auth_required"], reply
        client.send(encode_auth(secret))
        client.read_response()
    if role == "producer":
        client.send(encode_pub(topic, b"published"))
        client.expect_ok()
    else:
        client.subscribe(topic, "c#ephemeral", 1)
    return client


def end_client(client: NegotiatedConnection, role: str, end: str) -> None:
    if end == "reset":
        # SO_LINGER with a zero timeout: the close sends a reset, not a FIN.
        client.transport.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    elif role == "consumer":
        client.send(CLS)
        frame = client.read_response()
        assert frame.data == b"CLOSE_WAIT", frame
    client.close()


def consumer_and_producer(
    port: int,
    kind: str,
    certificates: Certificates,
    *,
    topic: str = "lifetime",
    secret: bytes | None = None,
) -> tuple[NegotiatedConnection, NegotiatedConnection]:
    """A consumer subscribed to `<topic> c#ephemeral`, then a producer's message in flight to
    it (published once its channel exists: an ephemeral channel of an earlier consumer still
    being deleted would take it)."""
    consumer = open_client(port, kind, "consumer", certificates, topic=topic, secret=secret)
    producer = open_client(port, kind, "producer", certificates, topic=topic, secret=secret)
    assert consumer.read_messages(1)[0].body == b"published"
    return consumer, producer


def churn(port: int, certificates: Certificates, topics: list[str], rounds: int = 1) -> None:
    """Every kind and end on every topic, `rounds` times: a consumer with a message in flight
    and its producer, both ended."""
    for _round in range(rounds):
        for topic in topics:
            for kind in KINDS:
                for end in ENDS:
                    consumer, producer = consumer_and_producer(
                        port, kind, certificates, topic=topic
                    )
                    end_client(producer, "producer", end)
                    end_client(consumer, "consumer", end)
