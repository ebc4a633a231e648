"""The connection poller (nsqd/connection_poller.py, docs/design.md §2): plain V2 clients are
accepted and served by it without a task of their own, and one that must wait for something
(an upgrade, AUTH, a socket that does not take a write whole) gets its own tasks and loses
nothing on the way. nsqd runs in the test's event loop, so the test can count its tasks."""

import dataclasses
import socket

import pytest
import trio

from nsqpy.common.command import (
    MAGIC_V2,
    encode_identify,
    encode_mpub,
    encode_pub,
    encode_rdy,
    encode_sub,
)
from nsqpy.common.frame import FRAME_TYPE_MESSAGE, FrameDecoder
from nsqpy.common.message import decode_message
from tests.nsqd.connection_churn import open_client
from tests.nsqd.wire import Wire, close_all_wires
from tests.security.support import Certificates, make_certificates
from tests.support.nsqd import tcp_port
from tests.support.polling import wait_until

CLIENTS = 40


@pytest.fixture(autouse=True)
async def close_connections():
    yield
    close_all_wires()


@pytest.fixture(scope="module")
def certificates(tmp_path_factory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("certificates"))


def tasks_living() -> int:
    return trio.lowlevel.current_statistics().tasks_living


async def test_plain_producers_and_consumers_cost_no_task_of_their_own(nsqd):
    """Forty consumers and forty producers connected, identified, subscribed or publishing:
    nsqd runs as many tasks as before they came, and serves every one of them."""
    poller = nsqd.connection_poller
    assert poller is not None
    nsqd.get_topic("polled").get_channel("c")  # the topic's pump is a task of its own
    before = tasks_living()
    consumers = []
    for _ in range(CLIENTS):
        wire = await Wire.connect(nsqd)
        await wire.identify(feature_negotiation=True, client_id="polled")
        await wire.subscribe("polled", "c", 1)
        consumers.append(wire)
    producers = []
    for index in range(CLIENTS):
        wire = await Wire.connect(nsqd)
        await wire.identify(feature_negotiation=True)
        await wire.send(encode_pub("polled", b"%d" % index))
        await wire.expect_ok()
        producers.append(wire)
    assert len(poller) == 2 * CLIENTS
    assert tasks_living() == before
    # Each consumer, RDY 1, gets one of the forty messages.
    bodies = sorted([(await wire.read_message()).body for wire in consumers], key=int)
    assert bodies == [b"%d" % index for index in range(CLIENTS)]
    for wire in consumers + producers:
        await wire.aclose()
    await wait_until(lambda: len(poller) == 0, "every connection gone from the poller")
    assert tasks_living() == before


@pytest.fixture
def nsqd_options(nsqd_options, certificates):
    return dataclasses.replace(
        nsqd_options,
        tls_cert=certificates.server_cert,
        tls_key=certificates.server_key,
        https_address="127.0.0.1:0",
    )


@pytest.mark.parametrize("kind", ["tls", "snappy", "deflate"])
async def test_an_upgraded_connection_gets_tasks_of_its_own(nsqd, certificates, kind):
    """An upgrade waits for a handshake or a stream layered on the socket: the connection
    leaves the poller for a read loop and a message pump of its own, and is served there."""
    poller = nsqd.connection_poller
    nsqd.get_topic("upgraded")
    before = tasks_living()

    def connect():
        return open_client(tcp_port(nsqd), kind, "producer", certificates, topic="upgraded")

    client = await trio.to_thread.run_sync(connect)
    try:
        assert len(poller) == 0
        assert tasks_living() >= before + 2
        assert nsqd.get_topic("upgraded").depth == 1
    finally:
        await trio.to_thread.run_sync(client.close)
    await wait_until(lambda: tasks_living() == before, "the connection's tasks ended")


async def test_a_consumer_whose_socket_is_full_gets_every_message_in_order(nsqd):
    """A consumer that reads nothing for a while, its receive buffer small, RDY over the
    whole backlog: the socket stops taking the deliveries part way; the connection goes on
    in tasks of its own with what was left, and every message arrives once, in order."""
    # 10 MB: more than loopback's socket buffers take.
    count, body = 1000, b"m" * 10_000
    topic = nsqd.get_topic("full")
    topic.get_channel("c")
    producer = await Wire.connect(nsqd)
    for start in range(0, count, 100):
        await producer.send(
            encode_mpub("full", [b"%06d" % index + body for index in range(start, start + 100)])
        )
        await producer.expect_ok()
    await producer.aclose()
    poller = nsqd.connection_poller
    await wait_until(lambda: len(poller) == 0, "the producer gone")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    stream = trio.SocketStream(trio.socket.from_stdlib_socket(sock))
    await stream.socket.connect(("127.0.0.1", tcp_port(nsqd)))
    await stream.send_all(
        MAGIC_V2
        + encode_identify({"heartbeat_interval": 60000})
        + encode_sub("full", "c")
        + encode_rdy(count)
    )
    # The poller sent what the socket took and handed the rest to the connection's tasks.
    await wait_until(
        lambda: len(nsqd._connections) == 1 and len(poller) == 0, "the consumer out of the poller"
    )
    decoder = FrameDecoder()
    received: list[bytes] = []
    with trio.fail_after(30):
        while len(received) < count:
            data = await stream.receive_some(65536)
            assert data, "nsqd closed the connection"
            for frame in decoder.receive_data(data):
                if frame.frame_type == FRAME_TYPE_MESSAGE:
                    received.append(decode_message(frame.data).body[:6])
    assert received == [b"%06d" % index for index in range(count)]
    await stream.aclose()
