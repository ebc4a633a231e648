"""A raw client of one nsqd's `--log-topic=lt` and its channel `c`, for the tests of log topics'
channels on real nsqd processes."""

import json

from tests.harness import V2Connection, http_request

FLAGS = ("--log-topic=lt", "--sync-timeout=50ms", "--mem-queue-size=0", "--sync-every=1")


def create_channel(daemon) -> None:
    """Channel `c` before the messages: a new channel of a log topic starts at its end."""
    http_request(daemon.port("HTTP"), "POST", "/topic/create?topic=lt")
    http_request(daemon.port("HTTP"), "POST", "/channel/create?topic=lt&channel=c")


def mpub(port: int, bodies: list[bytes]) -> None:
    connection = V2Connection(port)
    for start in range(0, len(bodies), 100):
        batch = bodies[start : start + 100]
        payload = len(batch).to_bytes(4, "big") + b"".join(
            len(body).to_bytes(4, "big") + body for body in batch
        )
        connection.send(b"MPUB lt\n" + len(payload).to_bytes(4, "big") + payload)
        assert connection.read_response().data == b"OK"
    connection.close()


def subscribe(port: int, rdy: int) -> V2Connection:
    connection = V2Connection(port)
    connection.send(b"SUB lt c\n")
    assert connection.read_response().data == b"OK"
    connection.send(b"RDY %d\n" % rdy)
    return connection


def channel_stats(daemon) -> dict:
    stats = json.loads(http_request(daemon.port("HTTP"), "GET", "/stats?format=json&topic=lt"))
    (topic,) = stats["topics"]
    (channel,) = topic["channels"]
    return channel
