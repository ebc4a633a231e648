"""Our nsqadmin process, pointed at a stand-in nsqlookupd and nsqd that answer exactly what Go
nsqlookupd and Go nsqd answered in the reference captures, must answer what Go nsqadmin
answered in the same captures: `/api/topics`, `/api/topics/test`, `/api/nodes` and `/ping`,
body and content headers.

The stand-ins listen on ephemeral ports; their port numbers are swapped for the capture's
(nsqd 24151, nsqlookupd 24161) in both directions.
"""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import pytest

from tests.nsqadmin.support import http, reference, start_nsqadmin

GO_NSQD_PORT = 24151
GO_LOOKUPD_PORT = 24161


class StandIn:
    """An HTTP server answering GET paths with captured bodies; it records what it is asked."""

    def __init__(self, answer) -> None:
        self.requests: list[str] = []
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                stand_in.requests.append(self.path)
                status, body = answer(self.path)
                self.send_response(status)
                self.send_header("Content-Type", "application/json; charset=utf-8")
                self.send_header("X-NSQ-Content-Type", "nsq; version=1.0")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def replay():
    ports = {}

    def to_ours(body: bytes) -> bytes:
        text = body.decode()
        text = text.replace(f'"http_port":{GO_NSQD_PORT}', f'"http_port":{ports["nsqd"]}')
        return text.encode()

    def to_gos(body: bytes) -> bytes:
        text = body.decode()
        text = text.replace(f'"http_port":{ports["nsqd"]}', f'"http_port":{GO_NSQD_PORT}')
        text = text.replace(f'127.0.0.1:{ports["nsqd"]}"', f'127.0.0.1:{GO_NSQD_PORT}"')
        text = text.replace(f"127.0.0.1:{ports['lookupd']}/", f"127.0.0.1:{GO_LOOKUPD_PORT}/")
        return text.encode()

    def lookupd_answer(path: str) -> tuple[int, bytes]:
        url = urlsplit(path)
        query = parse_qs(url.query)
        captures = {
            "/topics": "nsqlookupd_topics.http",
            "/nodes": "nsqlookupd_nodes.http",
            "/lookup": "nsqlookupd_lookup.http",
            "/channels": "nsqlookupd_channels.http",
        }
        if url.path not in captures or (
            url.path in ("/lookup", "/channels") and query.get("topic") != ["test"]
        ):
            return 404, b'{"message":"NOT_FOUND"}'
        return 200, to_ours(reference(captures[url.path]).body)

    def nsqd_answer(path: str) -> tuple[int, bytes]:
        url = urlsplit(path)
        if url.path != "/stats":
            return 404, b'{"message":"NOT_FOUND"}'
        body = reference("nsqd_stats_json_with_producer.http").json()
        if parse_qs(url.query).get("include_clients") == ["false"]:
            for topic in body["topics"]:
                for channel in topic["channels"]:
                    channel["clients"] = None
        return 200, json.dumps(body, separators=(",", ":")).encode()

    lookupd = StandIn(lookupd_answer)
    nsqd = StandIn(nsqd_answer)
    ports.update(lookupd=lookupd.port, nsqd=nsqd.port)
    admin = start_nsqadmin(f"-lookupd-http-address=127.0.0.1:{lookupd.port}")
    url = f"http://127.0.0.1:{admin.port('HTTP')}"
    yield url, to_gos, nsqd
    admin.stop()
    lookupd.close()
    nsqd.close()


@pytest.mark.parametrize(
    ("path", "capture"),
    [
        ("/api/topics", "nsqadmin_api_topics.http"),
        ("/api/topics/test", "nsqadmin_api_topic.http"),
        ("/api/nodes", "nsqadmin_api_nodes.http"),
        ("/ping", "nsqadmin_ping.http"),
    ],
)
def test_answers_what_go_nsqadmin_answered(replay, path, capture):
    url, to_gos, _nsqd = replay
    ours = http("GET", url + path)
    go = reference(capture)
    assert ours.status == go.status
    assert to_gos(ours.body) == go.body
    for header in ("content-type", "x-nsq-content-type"):
        assert ours.headers.get(header) == go.headers.get(header), header


def test_asks_nsqd_for_one_topic_without_clients(replay):
    url, _to_gos, nsqd = replay
    nsqd.requests.clear()
    http("GET", url + "/api/topics/test")
    # (The chart poller asks for every topic meanwhile: that one names no topic.)
    asked = [path for path in nsqd.requests if "topic=" in path]
    assert asked == ["/stats?format=json&topic=test&include_clients=false"]
