"""What the disk fault and corrupt startup tests share: HTTP answers and draining a channel."""

import time

from nsqpy.common.command import encode_rdy, encode_sub
from nsqpy.common.frame import FRAME_TYPE_MESSAGE
from nsqpy.common.message import decode_message
from tests.harness import V2Connection
from tests.support.http import request


def http(port: int, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
    """(status, body) of one request, whatever its status."""
    reply = request(port, method, path, body)
    return reply.status, reply.body


def receive_all(
    port: int,
    topic: str,
    channel: str,
    wanted: set[bytes],
    limit: set[bytes],
    *partition: int,
):
    """Subscribe and FIN until every body of `wanted` came; everything received must be in
    `limit` (what was ever published). With a `partition`, as a Youzan consumer of it (its
    message IDs binary)."""
    connection = V2Connection(port)
    received: set[bytes] = set()
    try:
        connection.send(encode_sub(topic, channel, *partition))
        assert connection.read_response().data == b"OK"
        connection.send(encode_rdy(100))
        deadline = time.monotonic() + 10
        while not wanted <= received:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"{topic}: {len(wanted - received)} acknowledged not delivered"
            connection.sock.settimeout(remaining)
            frame = connection.read_frame()
            if frame.frame_type == FRAME_TYPE_MESSAGE:
                message = decode_message(frame.data)
                assert message.body in limit, f"never published: {message.body[:20]!r}"
                received.add(message.body)
                connection.send(b"FIN " + message.id + b"\n")
    finally:
        connection.close()
    return received
