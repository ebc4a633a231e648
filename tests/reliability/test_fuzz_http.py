"""Fuzzing nsqd's HTTP API (issue #10): a short seeded run of the request generator, judged
against fuzz/http_spec.py (the table docs/openapi.yaml is generated from), slowloris
connections, and a regression test for each bug the fuzzing found."""

import json
import socket
import struct
from pathlib import Path

import pytest

from fuzz import http_spec
from fuzz.canary import Canary
from fuzz.daemon import RSSSampler
from fuzz.http_fuzz import HTTPFuzzer, HTTPSlowloris, ResponseReader
from nsqpy.common.frame import FrameDecoder
from tests.reliability.fuzz_fixtures import fuzz_nsqd, shared_fuzz_nsqd  # noqa: F401

SEED = 0x10F022
SHORT_REQUESTS = 3000
ROOT = Path(__file__).resolve().parents[2]


def _request(port: int, raw: bytes, *, head: bool = False, count: int = 1):
    """Send raw request bytes; the responses (None where nsqd closed first)."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        try:
            sock.sendall(raw)
        except (BrokenPipeError, ConnectionResetError):
            pass  # nsqd answered early and closed; its answer is still there to read
        reader = ResponseReader(sock)
        return [reader.read(head) for _ in range(count)]


def test_openapi_document_is_the_one_generated_from_the_fuzzers_table() -> None:
    assert (ROOT / "docs" / "openapi.yaml").read_text() == http_spec.openapi_yaml()


def test_the_table_covers_every_route_nsqd_serves() -> None:
    from nsqpy.nsqd.http_api import HTTPAPI

    class _Options:
        max_msg_size = max_body_size = 1
        auth_http_address: list[str] = []
        cluster_secret = ""

    class _NSQD:
        options = _Options()
        storage = None
        worker = None

    router = HTTPAPI(_NSQD()).router
    served = {(m, p) for p, methods in router._routes.items() for m in methods}
    served |= {(m, prefix + "{opt}") for prefix, methods in router._prefixes for m in methods}
    documented = {(e.method, e.path) for e in http_spec.ENDPOINTS}
    assert served == documented


def test_seeded_http_fuzz_gets_only_documented_answers(nsqd) -> None:
    """3,000 generated requests (real endpoints, mutated methods, paths and queries, hostile
    names, bodies at and past the limits, wrong Content-Length, chunked, pipelined, headers
    past 1 MiB) while slowloris connections hold their headers open: every response is a
    status and Go error message documented for its endpoint, never an undocumented 5xx, and
    the slowloris connections are answered in the end."""
    http_port = nsqd.port("HTTP")
    rss = RSSSampler(nsqd.pid).start()
    canary = Canary(nsqd.port("TCP")).start()
    slowloris = HTTPSlowloris(http_port, connections=3, gap=0.05).start()
    stats = HTTPFuzzer(http_port, SEED, SHORT_REQUESTS, workers=4).run()
    slow = slowloris.finish()
    problems = canary.finish()
    rss.stop()
    assert stats.violations == [], (stats.violations[:5], nsqd.health_lines)
    assert stats.requests == SHORT_REQUESTS
    assert slow.violations == [] and slow.slowloris_answered == 3
    assert problems == []
    assert nsqd.alive()
    assert nsqd.internal_error_count == 0, nsqd.internal_errors
    # Youzan's `/coordinator/stats` answers 500 `Coordinator is disabled.` outside a cluster.
    assert set(stats.server_errors) <= {"/coordinator/stats"}, stats.server_errors
    assert {200, 400, 404, 405, 413, 431} <= set(stats.status)
    assert rss.peak < 1024 * 1024, f"RSS peaked at {rss.peak} KiB"
    assert nsqd.stop() == 0


# -- regressions found by the fuzzing --------------------------------------------------------


def test_headers_past_go_limit_get_431_and_a_close(shared_nsqd) -> None:
    """Headers (or a request line) past Go's 1 MiB + 4 KiB used to be buffered without limit,
    in one header or in many; Go answers 431 and closes."""
    port = shared_nsqd.port("HTTP")
    big = b"b" * ((1 << 20) + 8192)
    for raw in [
        b"GET /ping HTTP/1.1\r\nX-Big: " + big + b"\r\n\r\n",
        b"GET /ping HTTP/1.1\r\n"
        + b"".join(b"X-%d: %s\r\n" % (n, b"v" * 1000) for n in range(1100))
        + b"\r\n",
        b"GET /" + big + b" HTTP/1.1\r\n\r\n",
    ]:
        (response,) = _request(port, raw)
        assert response.status == 431
        assert response.body == http_spec.HEADERS_TOO_LARGE_TEXT
        assert response.headers["connection"] == "close"
    # Just under the limit is served.
    (response,) = _request(port, b"GET /ping HTTP/1.1\r\nX-Big: " + b"b" * 1_000_000 + b"\r\n\r\n")
    assert (response.status, response.body) == (200, b"OK")


def test_an_endless_header_is_cut_off_at_the_limit(shared_nsqd) -> None:
    """A header that never ends: shared_nsqd stops reading at the limit instead of growing."""
    port = shared_nsqd.port("HTTP")
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(b"GET /ping HTTP/1.1\r\nX-Endless: ")
        sent = 0
        chunk = b"e" * 65536
        try:
            while sent < 64 * 1024 * 1024:
                sock.sendall(chunk)
                sent += len(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass
        response = ResponseReader(sock).read(False)
    # The header limit (1 MiB + 4 KiB), what a closing connection reads and drops
    # (LINGER_MAX_BYTES), and the sockets' buffers: far from the 64 MiB offered.
    assert sent < 6 * 1024 * 1024
    assert response is None or response.status == 431


def test_head_gets_no_body(shared_nsqd) -> None:
    """The response to HEAD used to carry the body, which a client reads as the start of the
    next response on a keep-alive connection."""
    port = shared_nsqd.port("HTTP")
    raw = b"HEAD /pub HTTP/1.1\r\nHost: x\r\n\r\nGET /ping HTTP/1.1\r\nHost: x\r\n\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(raw)
        reader = ResponseReader(sock)
        head = reader.read(True)
        ping = reader.read(False)
    assert head.status == 405 and head.headers["allow"] == "OPTIONS, POST"
    assert (ping.status, ping.body) == (200, b"OK")


@pytest.mark.parametrize(
    "target, message",
    [
        ("/topic/create?topic=t&partition_num=%C2%B2", "INVALID_ARG_TOPIC_PARTITION_NUM"),
        ("/topic/create?topic=t&partition=%C2%B2", "INVALID_ARG_TOPIC_PARTITION"),
        ("/pubtrace?topic=t&trace_id=%C2%B2", "INVALID_TRACE_ID"),
        ("/topic/delete?topic=t&partition=%D9%A3", "INVALID_ARG_TOPIC_PARTITION"),
        ("/pubtrace?topic=t&trace_id=1&partition=1_0", "INVALID_ARG_TOPIC_PARTITION"),
    ],
)
def test_non_ascii_digits_are_refused_not_a_500(shared_nsqd, target, message) -> None:
    """str.isdigit() takes '²' (and int() then raises: 500 INTERNAL_ERROR) and '٣' (which
    int() reads as 3); Go's strconv refuses both, and `1_0`."""
    port = shared_nsqd.port("HTTP")
    _request(port, b"POST /topic/create?topic=t HTTP/1.1\r\nContent-Length: 0\r\n\r\n")
    raw = f"POST {target} HTTP/1.1\r\nContent-Length: 1\r\n\r\nx".encode()
    (response,) = _request(port, raw)
    assert response.status == 400
    assert response.body == b'{"message":"%s"}' % message.encode()
    assert shared_nsqd.internal_error_count == 0, shared_nsqd.internal_errors


def test_deep_json_in_config_is_invalid_value_not_a_500(shared_nsqd) -> None:
    body = b"[" * 100_000
    raw = (
        b"PUT /config/nsqlookupd_tcp_addresses HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % len(body)
        + body
    )
    (response,) = _request(shared_nsqd.port("HTTP"), raw)
    assert response.status == 400
    assert response.body == b'{"message":"INVALID_VALUE"}'
    assert shared_nsqd.internal_error_count == 0, shared_nsqd.internal_errors


def test_a_client_id_with_a_lone_surrogate_does_not_break_metrics_or_stats(shared_nsqd) -> None:
    """IDENTIFY `{"client_id":"\\ud800"}` decoded to a lone surrogate, which cannot be
    encoded: GET /metrics answered 500 INTERNAL_ERROR for as long as the client stayed.
    Go's JSON decoder turns it into U+FFFD, and so does nsqd now."""
    body = b'{"client_id":"a\\ud800b","hostname":"\\udfff","user_agent":"\\ud83d"}'
    with socket.create_connection(("127.0.0.1", shared_nsqd.port("TCP")), timeout=30) as sock:
        sock.sendall(b"  V2IDENTIFY\n" + struct.pack(">i", len(body)) + body + b"SUB t c\n")
        decoder = FrameDecoder()
        frames = []
        while len(frames) < 2:
            frames.extend(decoder.receive_data(sock.recv(65536)))
        assert [f.data for f in frames] == [b"OK", b"OK"]
        port = shared_nsqd.port("HTTP")
        (metrics,) = _request(port, b"GET /metrics HTTP/1.1\r\n\r\n")
        (stats,) = _request(port, b"GET /stats?format=json HTTP/1.1\r\n\r\n")
    assert metrics.status == 200
    assert stats.status == 200
    clients = [
        client["client_id"]
        for topic in json.loads(stats.body)["topics"]
        for channel in topic["channels"]
        for client in channel["clients"]
    ]
    assert "a\ufffdb" in clients
    assert shared_nsqd.internal_error_count == 0, shared_nsqd.internal_errors
