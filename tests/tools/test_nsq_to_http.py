"""nsq_to_http against a real nsqd and real local HTTP servers."""

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from nsqpy.client.blocking import Producer
from tests.support.polling import poll
from tests.support.stats import channel_stats
from tests.tools.support import start_tool, stop_tool


class Upstream:
    """A local HTTP server that records requests; answers 500 to the first `fail_first`."""

    def __init__(self, fail_first: int = 0) -> None:
        self.requests: list[tuple[str, str, bytes, str]] = []
        self.fail_first = fail_first
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                with lock:
                    failing = upstream.fail_first > 0
                    upstream.fail_first -= 1
                    if not failing:
                        upstream.requests.append(
                            (self.command, self.path, body, self.headers.get("Content-Type"))
                        )
                self.send_response(500 if failing else 200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_GET = do_POST = _answer

            def log_message(self, *args) -> None:
                pass

        lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def upstreams():
    servers = [Upstream(), Upstream()]
    yield servers
    for server in servers:
        server.close()


def delivered(nsqd, topic, count) -> bool:
    stats = channel_stats(nsqd, topic, "nsq_to_http")
    return bool(
        stats
        and stats["message_count"] == count
        and stats["depth"] == 0
        and stats["in_flight_count"] == 0
        and stats["deferred_count"] == 0
    )


def run_to_http(nsqd, topic, *args, count):
    tcp = nsqd.addresses["TCP"]
    with Producer(tcp) as producer:
        producer.multi_publish(topic, [b"body %d" % i for i in range(count)])
    tool = start_tool("nsq_to_http", f"--topic={topic}", f"--nsqd-tcp-address={tcp}", *args)
    poll(lambda: delivered(nsqd, topic, count))
    stop_tool(tool)


def test_round_robin_posts_each_message_once(nsqd, topic, upstreams):
    first, second = upstreams
    run_to_http(
        nsqd,
        topic,
        "--mode=round-robin",
        "-n",
        "1",
        "--content-type=text/plain",
        f"--post={first.url}/a",
        f"--post={second.url}/b",
        count=6,
    )
    assert len(first.requests) == len(second.requests) == 3
    bodies = sorted(body for _m, _p, body, _ct in first.requests + second.requests)
    assert bodies == sorted(b"body %d" % i for i in range(6))
    assert {(m, ct) for m, _p, _b, ct in first.requests} == {("POST", "text/plain")}


def test_fan_out_gets_every_endpoint_with_escaped_body(nsqd, topic, upstreams):
    first, second = upstreams
    run_to_http(
        nsqd,
        topic,
        "--mode=fan-out",
        f"--get={first.url}/x?data=%s",
        f"--get={second.url}/y?data=%s",
        count=3,
    )
    for upstream, path in ((first, "/x"), (second, "/y")):
        assert sorted(p for _m, p, _b, _ct in upstream.requests) == [
            f"{path}?data=body+{i}" for i in range(3)
        ]


def test_failed_request_is_requeued_and_retried(nsqd, topic):
    upstream = Upstream(fail_first=1)
    try:
        tcp = nsqd.addresses["TCP"]
        with Producer(tcp) as producer:
            producer.publish(topic, b"retry me")
        tool = start_tool(
            "nsq_to_http",
            f"--topic={topic}",
            f"--nsqd-tcp-address={tcp}",
            f"--post={upstream.url}/",
            "--mode=round-robin",
        )
        poll(lambda: upstream.requests)
        poll(lambda: delivered(nsqd, topic, 1))
        stats = channel_stats(nsqd, topic, "nsq_to_http")
        _out, err = stop_tool(tool)
        assert stats["requeue_count"] == 1
        assert b"got status code 500" in err
        assert [body for _m, _p, body, _ct in upstream.requests] == [b"retry me"]
    finally:
        upstream.close()
