"""Publishing over HTTP the ways real clients do, then consuming over TCP.

Three kinds of HTTP client against the in-process nsqd: requests written by hand on a raw
socket (as curl sends them, with `Connection: close`, and HTTP/1.0 with and without
keep-alive), Python's `urllib.request` (in a worker thread, since it blocks), and the HTTP
publisher of a real NSQ client library from PyPI, gnsq's `NsqdHTTPClient` (in a subprocess,
since gnsq runs under gevent's monkey-patching). Every message is then read back by a V2
consumer over TCP and compared byte for byte.
"""

import json
import sys
import urllib.error
import urllib.request
from pathlib import Path

import trio

from tests.nsqd.wire import consumer
from tests.support.http import RawConnection, encode_request

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT_DEADLINE = 60.0


async def receive_bodies(wire, count: int) -> list[bytes]:
    messages = await wire.read_messages(count)
    await wire.finish(*messages)
    return [message.body for message in messages]


# -- raw sockets, written by hand -------------------------------------------------------------


async def test_curl_style_requests_publish(nsqd):
    wire = await consumer(nsqd, "curl", "ch", rdy=10)
    connection = await RawConnection.open(nsqd.http_address)
    host = nsqd.http_address
    raw = (
        f"POST /pub?topic=curl HTTP/1.1\r\nHost: {host}\r\nUser-Agent: curl/8.5.0\r\n"
        "Accept: */*\r\nContent-Length: 11\r\n"
        "Content-Type: application/x-www-form-urlencoded\r\n\r\nhello world"
    ).encode()
    await connection.send(raw)
    response = await connection.read_response()
    assert (response.status_line, response.body) == ("HTTP/1.1 200 OK", b"OK")
    # Header names are case-insensitive; a query with escapes names the same topic.
    await connection.send(
        b"POST /mpub?topic=c%75rl HTTP/1.1\r\nhost: x\r\ncontent-length: 7\r\n\r\nab\n\ncd\n"
    )
    assert (await connection.read_response()).body == b"OK"
    await connection.aclose()
    assert await receive_bodies(wire, 3) == [b"hello world", b"ab", b"cd"]


async def test_connection_close_is_answered_then_closed(nsqd):
    wire = await consumer(nsqd, "closing", "ch", rdy=10)
    connection = await RawConnection.open(nsqd.http_address)
    await connection.send(
        encode_request("POST", "/pub?topic=closing", b"last", headers=[("Connection", "close")])
    )
    response = await connection.read_response()
    assert (response.status, response.body) == (200, b"OK")
    assert response.header("Connection") == "close"
    assert await connection.closed_by_peer()
    await connection.aclose()
    assert await receive_bodies(wire, 1) == [b"last"]


async def test_http_1_0_request_is_answered_in_http_1_0_then_closed(nsqd):
    """Go's net/http answers an HTTP/1.0 request with an HTTP/1.0 status line and closes the
    connection afterwards without a `Connection: close` header (closing is 1.0's default)."""
    wire = await consumer(nsqd, "old", "ch", rdy=10)
    connection = await RawConnection.open(nsqd.http_address)
    await connection.send(b"POST /pub?topic=old HTTP/1.0\r\nContent-Length: 9\r\n\r\nfrom 1.0!")
    response = await connection.read_response()
    assert await connection.closed_by_peer()
    await connection.aclose()
    assert await receive_bodies(wire, 1) == [b"from 1.0!"]
    assert (response.status_line, response.body) == ("HTTP/1.0 200 OK", b"OK")
    assert response.header("Connection") is None


async def test_http_1_0_keep_alive_keeps_the_connection(nsqd):
    """An HTTP/1.0 client asking for keep-alive gets it, and Go confirms it in the reply."""
    wire = await consumer(nsqd, "old", "ch", rdy=10)
    connection = await RawConnection.open(nsqd.http_address)
    responses = []
    for body in (b"one", b"two"):
        await connection.send(
            b"POST /pub?topic=old HTTP/1.0\r\nConnection: keep-alive\r\n"
            b"Content-Length: 3\r\n\r\n" + body
        )
        responses.append(await connection.read_response())
    await connection.aclose()
    assert await receive_bodies(wire, 2) == [b"one", b"two"]
    for response in responses:
        assert (response.status_line, response.body) == ("HTTP/1.0 200 OK", b"OK")
        assert response.header("Connection") == "keep-alive"


# -- urllib.request ----------------------------------------------------------------------------


def _urllib_session(base: str) -> dict:
    """Blocking: what urllib sees for a few publishes and one refused request."""

    def post(path: str, data: bytes) -> tuple[int, bytes, str | None]:
        with urllib.request.urlopen(urllib.request.Request(base + path, data=data)) as reply:
            return reply.status, reply.read(), reply.headers.get("X-NSQ-Content-Type")

    results = {
        "pub": post("/pub?topic=urllib", b"from urllib"),
        "mpub": post("/mpub?topic=urllib", b"line 1\nline 2"),
        "deferred": post("/pub?topic=urllib&defer=10", b"deferred"),
    }
    with urllib.request.urlopen(base + "/stats?format=json&topic=urllib") as reply:
        results["stats"] = json.load(reply)
    try:
        post("/pub?topic=not%20valid", b"x")
    except urllib.error.HTTPError as error:
        results["error"] = (error.code, error.read(), error.headers.get("Content-Type"))
    return results


async def test_urllib_publishes_and_reads_stats(nsqd):
    wire = await consumer(nsqd, "urllib", "ch", rdy=10)
    results = await trio.to_thread.run_sync(_urllib_session, f"http://{nsqd.http_address}")
    ok = (200, b"OK", "nsq; version=1.0")
    assert (results["pub"], results["mpub"], results["deferred"]) == (ok, ok, ok)
    assert results["stats"]["topics"][0]["message_count"] == 4
    json_type = "application/json; charset=utf-8"
    assert results["error"] == (400, b'{"message":"INVALID_TOPIC"}', json_type)
    bodies = await receive_bodies(wire, 4)
    assert bodies[:3] == [b"from urllib", b"line 1", b"line 2"]
    assert bodies[3] == b"deferred"


# -- gnsq's NsqdHTTPClient ---------------------------------------------------------------------


async def test_gnsq_http_client_publishes(nsqd):
    wire = await consumer(nsqd, "gnsq_http", "ch", rdy=10)
    port = nsqd.http_address.rsplit(":", 1)[1]
    argv = [
        sys.executable,
        "-m",
        "tests.nsqd_http.gnsq_http_publish",
        f"--port={port}",
        "--topic=gnsq_http",
    ]
    with trio.fail_after(SCRIPT_DEADLINE):
        completed = await trio.run_process(
            argv, cwd=str(REPO_ROOT), capture_stdout=True, capture_stderr=True, check=False
        )
    output = completed.stdout.decode() + completed.stderr.decode()
    assert completed.returncode == 0, output
    results = json.loads(completed.stdout.splitlines()[-1])
    assert results == {
        "publish": "OK",
        "publish_defer": "OK",
        "multipublish": "OK",
        "multipublish_binary": "OK",
        "ping": "OK",
        "info_version": results["info_version"],
        "message_count": 6,
        "empty": "http error <400>",
    }
    assert results["info_version"].startswith("1.3.0")
    bodies = await receive_bodies(wire, 6)
    assert sorted(bodies) == sorted(
        [
            b"gnsq pub",
            b"gnsq deferred",
            b"gnsq m1",
            b"gnsq m2",
            b"gnsq b1\nwith newline",
            b"gnsq b2",
        ]
    )
    # All but the deferred one arrive in publish order.
    assert [body for body in bodies if body != b"gnsq deferred"] == [
        b"gnsq pub",
        b"gnsq m1",
        b"gnsq m2",
        b"gnsq b1\nwith newline",
        b"gnsq b2",
    ]
