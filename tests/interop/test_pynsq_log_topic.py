"""A real pynsq Reader consumes partition 0 of a log topic (docs/design.md §13) with a classic
SUB and hex IDs, FINs every message, and the channel's cursor confirms them all."""

import json

import nsq
from tornado import ioloop

from tests.harness import http_request, start_nsqd

COUNT = 20


def test_pynsq_consumes_a_log_topic(tmp_path):
    daemon = start_nsqd(tmp_path, "--sync-every=1")
    try:
        port = daemon.port("HTTP")
        http_request(port, "POST", "/topic/create?topic=logt&partition_num=1")
        # A log topic's new channel starts at the end: create it before publishing.
        http_request(port, "POST", "/channel/create?topic=logt&channel=py&partition=0")
        for n in range(COUNT):
            http_request(port, "POST", "/pub?topic=logt&partition=0", b"m%d" % n)
        received = read_with_pynsq(daemon.port("TCP"), port)
        assert sorted(received) == sorted(b"m%d" % n for n in range(COUNT))
        (channel,) = channel_stats(port)
        assert (channel["confirmed_count"], channel["lag"]) == (COUNT, 0)
    finally:
        daemon.stop()


def channel_stats(http_port: int) -> list[dict]:
    stats = json.loads(http_request(http_port, "GET", "/stats?format=json&topic=logt"))
    return stats["topics"][0]["channels"]


def read_with_pynsq(tcp_port: int, http_port: int) -> list[bytes]:
    """Run a Reader until the channel confirmed every message (pynsq FINs after the handler
    returns), checking /stats every 50 ms; 20 s at most."""
    received: list[bytes] = []
    loop = ioloop.IOLoop.current()

    def handler(message) -> bool:
        received.append(message.body)
        return True

    def check() -> None:
        if channel_stats(http_port)[0]["confirmed_count"] == COUNT:
            loop.stop()

    reader = nsq.Reader(
        topic="logt",
        channel="py",
        nsqd_tcp_addresses=[f"127.0.0.1:{tcp_port}"],
        message_handler=handler,
        max_in_flight=10,
    )
    poller = ioloop.PeriodicCallback(check, 50)
    poller.start()
    timeout = loop.call_later(20, loop.stop)
    loop.start()
    poller.stop()
    loop.remove_timeout(timeout)
    reader.close()
    return received
