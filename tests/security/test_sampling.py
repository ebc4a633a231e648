"""IDENTIFY `sample_rate` (docs/protocol.md §2.1): nsqd delivers a client only about that percentage
of the channel's messages.

Go's messagePump skips a message when `rand.Int31n(100) > sample_rate`, so a rate of 30
delivers 31 in 100 on average and the skipped messages are gone from the channel for good;
0 switches sampling off. The consumer reads and FINs until /stats shows the channel empty
with nothing in flight, then counts what it got.
"""

import json
import time

import pytest

from nsqpy.common.command import encode_mpub
from tests.security.support import (
    NegotiatedConnection,
    client_stats,
    connection,
    http_get,
    http_url,
    running_nsqd,
)

MESSAGES = 2000
DEADLINE = 20.0


@pytest.fixture(scope="module")
def nsqd(tmp_path_factory):
    with running_nsqd(tmp_path_factory.mktemp("sampling")) as daemon:
        yield daemon


def channel_drained(daemon, topic: str, channel: str) -> bool:
    reply = http_get(http_url(daemon, f"/stats?format=json&topic={topic}&channel={channel}"))
    for found in json.loads(reply.body)["topics"]:
        for stats in found["channels"]:
            if stats["channel_name"] == channel:
                return stats["depth"] == 0 and stats["in_flight_count"] == 0
    return False


def consume_everything(conn: NegotiatedConnection, daemon, topic: str, channel: str) -> int:
    """Read and FIN messages until the channel is drained; how many arrived."""
    received = 0
    conn.sock.settimeout(0.1)
    give_up = time.monotonic() + DEADLINE
    while time.monotonic() < give_up:
        try:
            messages = conn.read_messages(1)
        except TimeoutError:
            if channel_drained(daemon, topic, channel):
                return received
            continue
        received += len(messages)
        conn.finish(messages)
    raise AssertionError(f"the channel was not drained in {DEADLINE}s ({received} received)")


def sampled(daemon, topic: str, rate: int) -> int:
    with connection(daemon.port("TCP")) as conn:
        reply = conn.negotiate(client_id=topic, sample_rate=rate)
        assert reply["sample_rate"] == rate
        conn.subscribe(topic, "sampled", rdy=500)
        assert client_stats(f"http://{daemon.addresses['HTTP']}", topic)["sample_rate"] == rate
        with connection(daemon.port("TCP")) as publisher:
            publisher.send(encode_mpub(topic, [b"%d" % i for i in range(MESSAGES)]))
            publisher.expect_ok()
        return consume_everything(conn, daemon, topic, "sampled")


def test_sample_rate_30_delivers_about_30_percent(nsqd):
    delivered = sampled(nsqd, "sample30", 30)
    # Expected 31% (620); the standard deviation is about 21 messages.
    assert 0.20 * MESSAGES <= delivered <= 0.40 * MESSAGES, delivered


def test_sample_rate_0_delivers_everything(nsqd):
    assert sampled(nsqd, "sample0", 0) == MESSAGES
