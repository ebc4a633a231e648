"""nsq_pubsub against a real nsqd and nsqlookupd (tests/tools/conftest.py: subprocesses on
ephemeral ports), read the ways its users read it: a raw HTTP/1.1 client decoding the chunked
stream as curl does, Server-Sent Events, aiohttp's WebSocket client, and 1,000 SSE subscribers
at once. Where messages are is checked with nsqd's own /stats. Every wait is a poll with a
deadline."""

import asyncio
import http.client
import json
import signal
import socket
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import aiohttp
import pytest
import trustme

from nsqpy.client.blocking import http_json, http_publish, http_request
from tests.harness import DaemonProcess, start_nsqd
from tests.support.http import Headers, HTTPReply, request
from tests.support.polling import poll
from tests.support.stats import channel_stats, topic_channels
from tests.tools.pubsub import publish, start_pubsub, stats, subscribers_of
from tests.tools.support import lookupd_has_topic, run_tool

DEADLINE = 10.0


@pytest.fixture
def launch():
    """Start nsq_pubsubs for one test (`launch(*flags)`); each is stopped at its end, also
    when the test failed first."""
    started: list[DaemonProcess] = []

    def launch_one(*args: str, port: int = 0) -> DaemonProcess:
        started.append(start_pubsub(*args, port=port))
        return started[-1]

    yield launch_one
    for daemon in started:
        daemon.stop()


@pytest.fixture(scope="module")
def pubsub(nsqd):
    daemon = start_pubsub(f"-nsqd-tcp-address={nsqd.addresses['TCP']}")
    yield daemon
    assert daemon.stop() == 0, daemon.log


def announce_body(address: str, method: str, path: str, length: int) -> HTTPReply:
    """A request that declares a `length` byte body and sends none of it: the answer a server
    gives from the headers alone (nsqd's too-big refusals), which a client sending the whole
    body could lose to the server closing on it."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=DEADLINE) as sock:
        head = f"{method} {path} HTTP/1.1\r\nHost: {address}\r\nContent-Length: {length}\r\n\r\n"
        sock.sendall(head.encode())
        response = http.client.HTTPResponse(sock)
        response.begin()
        return HTTPReply(response.status, response.read(), Headers(response.getheaders()))


class Stream:
    """A subscriber on a raw socket, reading as curl does: the status line and headers, then
    the chunked body, each chunk `<hex size>\\r\\n<data>\\r\\n`, until the `0` chunk."""

    def __init__(
        self,
        address: str,
        path: str,
        headers: dict | None = None,
        *,
        receive_buffer: int | None = None,
        context: ssl.SSLContext | None = None,
    ) -> None:
        host, port = address.rsplit(":", 1)
        self.sock = socket.socket()
        if receive_buffer is not None:
            # Before connect, so the TCP window stays that small: a slow subscriber.
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        self.sock.settimeout(DEADLINE)
        self.sock.connect((host, int(port)))
        if context is not None:
            self.sock = context.wrap_socket(self.sock, server_hostname=host)
        lines = [f"GET {path} HTTP/1.1", f"Host: {address}"]
        lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        self._raw = b""
        self.body = b""
        self.ended = False
        while b"\r\n\r\n" not in self._raw:
            self._receive()
        head, self._raw = self._raw.split(b"\r\n\r\n", 1)
        status_line, *header_lines = head.decode().split("\r\n")
        self.status = int(status_line.split()[1])
        self.headers = {
            name.lower(): value.strip()
            for name, value in (line.split(":", 1) for line in header_lines)
        }

    def _receive(self) -> None:
        data = self.sock.recv(65536)
        if not data:
            raise ConnectionError("nsq_pubsub closed the connection")
        self._raw += data

    def _decode_chunks(self) -> None:
        while not self.ended:
            size_line, found, rest = self._raw.partition(b"\r\n")
            if not found:
                return
            size = int(size_line.split(b";")[0], 16)
            if len(rest) < size + 2:
                return
            self.body += rest[:size]
            self._raw = rest[size + 2 :]
            self.ended = size == 0

    def read_until(self, done) -> bytes:
        """Read and decode until `done(body)`; the body so far."""
        assert self.headers.get("transfer-encoding") == "chunked", self.headers
        self._decode_chunks()
        while not done(self.body):
            assert not self.ended, f"the stream ended: {self.body!r}"
            self._receive()
            self._decode_chunks()
        return self.body

    def lines(self, count: int) -> list[bytes]:
        body = self.read_until(lambda body: body.count(b"\n") >= count)
        return body.split(b"\n")[:count]

    def events(self, count: int) -> list[dict]:
        body = self.read_until(lambda body: len(parse_events(body)) >= count)
        return parse_events(body)[:count]

    def read_to_end(self) -> bytes:
        return self.read_until(lambda _body: self.ended)

    def close(self) -> None:
        self.sock.close()


def parse_events(body: bytes) -> list[dict]:
    """The complete Server-Sent Events in `body` (those with data), as the spec reads them:
    `id`, and the `data` lines joined with LF."""
    events = []
    for block in body.split(b"\n\n")[:-1]:
        event: dict = {"data": []}
        for line in block.split(b"\n"):
            name, _, value = line.partition(b":")
            value = value.removeprefix(b" ")
            if name == b"id":
                event["id"] = value.decode()
            elif name == b"data":
                event["data"].append(value)
        if event["data"]:
            event["data"] = b"\n".join(event["data"])
            events.append(event)
    return events


# -- streaming ---------------------------------------------------------------------------------


def test_stream_is_chunked_one_message_a_line_and_each_is_finished(pubsub, nsqd, topic):
    address = pubsub.addresses["HTTP"]
    stream = Stream(address, f"/sub?topic={topic}&channel=lines")
    try:
        assert stream.status == 200
        assert stream.headers["content-type"] == "text/plain; charset=utf-8"
        # Subscribed before the headers came: the channel exists on nsqd.
        assert channel_stats(nsqd, topic, "lines") is not None
        publish(pubsub, topic, b"one")
        reply = request(address, "POST", f"/mpub?topic={topic}", b"two\nthree\n\nfour")
        assert (reply.status, reply.body) == (200, b"OK")
        binary = b"".join(len(b).to_bytes(4, "big") + b for b in (b"five", b"six"))
        reply = request(address, "POST", f"/mpub?topic={topic}&binary=true", b"\0\0\0\2" + binary)
        assert (reply.status, reply.body) == (200, b"OK")
        http_publish(nsqd.addresses["HTTP"], topic, [b"straight to nsqd"])
        assert stream.lines(7) == [
            b"one",
            b"two",
            b"three",
            b"four",
            b"five",
            b"six",
            b"straight to nsqd",
        ]
        # FINished once written: nothing in flight, nothing waiting.
        poll(
            lambda: (
                lambda s: s["in_flight_count"] == 0 and s["depth"] == 0 and s["message_count"] == 7
            )(channel_stats(nsqd, topic, "lines")),
            timeout=DEADLINE,
        )
        (entry,) = subscribers_of(pubsub, topic)
        assert (entry["channel"], entry["kind"], entry["messages"]) == ("lines", "stream", 7)
        assert entry["nsqd_connections"] == 1
        text = request(address, "GET", "/stats").body.decode()
        assert text.startswith("Total Messages: ")
        assert f"[{topic} : lines] stream msgs: 7 in-flight: 0 connected: " in text
    finally:
        stream.close()
    poll(lambda: not subscribers_of(pubsub, topic), timeout=DEADLINE)


def test_idle_subscribers_get_heartbeats(nsqd, topic, launch):
    pubsub = launch(f"-nsqd-tcp-address={nsqd.addresses['TCP']}", "-heartbeat-interval=50ms")
    try:
        address = pubsub.addresses["HTTP"]
        plain = Stream(address, f"/sub?topic={topic}")
        # Go nsq_pubsub's heartbeat line.
        line = plain.lines(1)[0]
        assert json.loads(line).keys() == {"_heartbeat_"}
        events = Stream(address, f"/sub?topic={topic}", {"Accept": "text/event-stream"})
        # A comment line: an EventSource ignores it, a proxy sees the stream alive.
        body = events.read_until(lambda body: b': {"_heartbeat_":' in body)
        assert body.startswith(b"retry: 1000\n\n")
        plain.close()
        events.close()
    finally:
        assert pubsub.stop() == 0, pubsub.log


def test_server_sent_events_carry_the_message_id(pubsub, nsqd, topic):
    address = pubsub.addresses["HTTP"]
    stream = Stream(
        address,
        f"/sub?topic={topic}&channel=events",
        {"Accept": "text/event-stream", "Last-Event-ID": "0000000000000abc"},
    )
    try:
        assert stream.status == 200
        assert stream.headers["content-type"] == "text/event-stream"
        assert stream.headers["cache-control"] == "no-cache"
        publish(pubsub, topic, b"first")
        publish(pubsub, topic, b"two\nlines\r\nand a CR\rend")
        events = stream.events(2)
        assert [event["data"] for event in events] == [
            b"first",
            b"two\nlines\nand a CR\nend",
        ]
        ids = [event["id"] for event in events]
        # nsqd's IDs: 16 hex digits, increasing.
        assert all(len(i) == 16 and int(i, 16) for i in ids) and ids == sorted(ids)
        assert stream.body.startswith(b"retry: 1000\n\n")
        (entry,) = subscribers_of(pubsub, topic)
        assert (entry["kind"], entry["last_event_id"]) == ("sse", "0000000000000abc")
    finally:
        stream.close()


def test_websocket_subscriber(pubsub, topic):
    address = pubsub.addresses["HTTP"]

    async def scenario() -> list:
        async with aiohttp.ClientSession() as session:
            url = f"http://{address}/ws?topic={topic}&channel=sockets"
            async with session.ws_connect(url) as socket_client:
                await asyncio.to_thread(publish, pubsub, topic, b"text message")
                await asyncio.to_thread(publish, pubsub, topic, b"\xff\xfe binary")
                received = [await socket_client.receive(timeout=DEADLINE) for _ in range(2)]
                # What a subscriber sends is ignored; the stream goes on.
                await socket_client.send_str("ignored")
                await asyncio.to_thread(publish, pubsub, topic, b"after")
                received.append(await socket_client.receive(timeout=DEADLINE))
            return received

    received = asyncio.run(scenario())
    assert [(m.type, m.data) for m in received] == [
        (aiohttp.WSMsgType.TEXT, "text message"),
        (aiohttp.WSMsgType.BINARY, b"\xff\xfe binary"),
        (aiohttp.WSMsgType.TEXT, "after"),
    ]
    poll(lambda: not subscribers_of(pubsub, topic), timeout=DEADLINE)
    # A plain GET is not a WebSocket handshake.
    reply = request(address, "GET", f"/ws?topic={topic}")
    assert (reply.status, reply.body) == (400, b'{"message":"INVALID_REQUEST"}')


def test_a_shared_channel_splits_and_no_channel_means_an_ephemeral_one(nsqd, topic, launch):
    pubsub = launch(f"-nsqd-tcp-address={nsqd.addresses['TCP']}", "-max-in-flight=5")
    address = pubsub.addresses["HTTP"]
    count = 200
    expected = [b"m%03d" % number for number in range(count)]

    async def read_lines(response: aiohttp.ClientResponse, lines: list) -> None:
        while line := await response.content.readline():
            lines.append(line.rstrip(b"\n"))

    async def scenario() -> tuple[list, list, list]:
        async with aiohttp.ClientSession() as session:
            base = f"http://{address}/sub?topic={topic}"
            responses = [
                await session.get(f"{base}&channel=shared"),
                await session.get(f"{base}&channel=shared"),
                await session.get(base),
            ]
            channels = {c["channel_name"] for c in topic_channels(nsqd, topic)}
            (ephemeral,) = channels - {"shared"}
            assert ephemeral.startswith("pubsub") and ephemeral.endswith("#ephemeral")
            reply = await asyncio.to_thread(
                request, address, "POST", f"/mpub?topic={topic}", b"\n".join(expected)
            )
            assert reply.status == 200
            received: tuple[list, list, list] = ([], [], [])
            readers = [
                asyncio.create_task(read_lines(response, lines))
                for response, lines in zip(responses, received, strict=True)
            ]
            try:
                async with asyncio.timeout(DEADLINE):
                    while len(received[0]) + len(received[1]) < count or len(received[2]) < count:
                        await asyncio.sleep(0.01)
            finally:
                for reader in readers:
                    reader.cancel()
                for response in responses:
                    response.close()
            return received

    try:
        first, second, lone = asyncio.run(scenario())
        # Each message once on the shared channel, split between its subscribers (each holds
        # at most 5 unfinished, so neither can take them all); all of them on the other.
        assert sorted(first + second) == expected
        assert first and second
        assert lone == expected
        poll(lambda: [c["channel_name"] for c in topic_channels(nsqd, topic)] == ["shared"])
    finally:
        assert pubsub.stop() == 0, pubsub.log


# -- slow subscribers and subscribers that leave ----------------------------------------------


def test_a_slow_subscriber_holds_only_its_window_and_leaving_requeues_it(nsqd, topic, launch):
    """A subscriber that does not read: nsq_pubsub holds its in-flight window (RDY), the rest
    waits in nsqd; when it goes away its unfinished messages go back to the channel at once
    (REQ, not nsqd's 60 s timeout) and the next subscriber gets every message it did not."""
    window = 5
    pubsub = launch(f"-nsqd-tcp-address={nsqd.addresses['TCP']}", f"-max-in-flight={window}")
    address = pubsub.addresses["HTTP"]
    # 200 x 64 KiB: more than the kernel's socket buffers on both sides (tcp_wmem's 4 MiB).
    count = 200
    bodies = [b"%03d" % number + b"." * 65533 for number in range(count)]
    slow = Stream(address, f"/sub?topic={topic}&channel=work", receive_buffer=4096)
    try:
        for start in range(0, count, 50):
            http_publish(nsqd.addresses["HTTP"], topic, bodies[start : start + 50])

        def stuck() -> bool:
            """Its window taken and a write waiting for its socket: nothing moves now."""
            channel = channel_stats(nsqd, topic, "work")
            assert channel["in_flight_count"] <= window  # never more than the window
            (entry,) = subscribers_of(pubsub, topic)
            return entry["blocked"] and entry["in_flight"] == window

        poll(stuck, timeout=DEADLINE)
        channel = channel_stats(nsqd, topic, "work")
        # The rest waits in nsqd, not in nsq_pubsub.
        assert channel["in_flight_count"] == window
        assert channel["depth"] == count - window - stats(pubsub)["total_messages"] > 0
    finally:
        slow.close()
    line = pubsub.wait_for_log(r"subscriber of .* left after", DEADLINE)
    requeued = int(line.rsplit("(", 1)[1].split()[0])
    assert requeued == window
    poll(lambda: channel_stats(nsqd, topic, "work")["in_flight_count"] == 0, timeout=DEADLINE)
    channel = channel_stats(nsqd, topic, "work")
    assert (channel["requeue_count"], channel["timeout_count"]) == (window, 0)
    taken = stats(pubsub)["total_messages"]

    reader = Stream(address, f"/sub?topic={topic}&channel=work")
    try:
        rest = reader.lines(count - taken)
        assert sorted(line[:3] for line in rest) == [b"%03d" % n for n in range(taken, count)]
        poll(
            lambda: (lambda s: s["depth"] == 0 and s["in_flight_count"] == 0)(
                channel_stats(nsqd, topic, "work")
            ),
            timeout=DEADLINE,
        )
    finally:
        reader.close()
        assert pubsub.stop() == 0, pubsub.log


def test_sigterm_requeues_ends_the_streams_and_exits_0(nsqd, topic, launch):
    """A subscriber with nothing waiting for it gets the end of its stream (the last chunk);
    one whose socket is full is cut off, its messages REQueued (not left to time out)."""
    pubsub = launch(f"-nsqd-tcp-address={nsqd.addresses['TCP']}", "-max-in-flight=3")
    address = pubsub.addresses["HTTP"]
    slow = Stream(address, f"/sub?topic={topic}&channel=stop", receive_buffer=4096)
    idle = Stream(address, f"/sub?topic={topic}_idle&channel=idle")
    body = b"." * 65536
    for _batch in range(2):  # nsqd's --max-body-size is 5 MiB
        http_publish(nsqd.addresses["HTTP"], topic, [body] * 50)
    poll(
        lambda: any(e["blocked"] and e["in_flight"] == 3 for e in subscribers_of(pubsub, topic)),
        timeout=DEADLINE,
    )
    pubsub.process.send_signal(signal.SIGTERM)
    assert pubsub.process.wait(DEADLINE) == 0, pubsub.log
    assert idle.read_to_end() == b""
    poll(lambda: channel_stats(nsqd, topic, "stop")["in_flight_count"] == 0, timeout=DEADLINE)
    channel = channel_stats(nsqd, topic, "stop")
    assert (channel["requeue_count"], channel["timeout_count"]) == (3, 0)
    slow.close()
    idle.close()


def process_threads(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    raise AssertionError("no Threads: line")


# -- 1,000 subscribers --------------------------------------------------------------------------


def test_a_thousand_sse_subscribers_are_held_and_each_receives(pubsub, nsqd, topic):
    """1,000 EventSource-style subscribers at once, each on its own ephemeral channel (so each
    must get the message), each with its own nsqd connection, held by one nsq_pubsub."""
    address = pubsub.addresses["HTTP"]
    count = 1000

    async def first_event(response: aiohttp.ClientResponse) -> dict:
        body = b""
        while not parse_events(body):
            line = await response.content.readline()
            assert line, "the stream ended"
            body += line
        return parse_events(body)[0]

    async def scenario() -> list[dict]:
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as session:
            url = f"http://{address}/sub?topic={topic}"
            headers = {"Accept": "text/event-stream"}
            async with asyncio.timeout(30):
                responses = await asyncio.gather(
                    *(session.get(url, headers=headers) for _ in range(count))
                )
            try:
                refused = [await r.text() for r in responses if r.status != 200]
                assert refused == [], f"{len(refused)} refused, the first: {refused[0]}"
                held = await asyncio.to_thread(subscribers_of, pubsub, topic)
                assert len(held) == count
                # One thread holds them all (nsqpy/client/asyncio.py): no thread per subscriber.
                assert process_threads(pubsub.process.pid) < 16
                assert {entry["nsqd_connections"] for entry in held} == {1}
                assert len({entry["channel"] for entry in held}) == count
                channels = await asyncio.to_thread(topic_channels, nsqd, topic)
                assert len(channels) == count
                await asyncio.to_thread(publish, pubsub, topic, b"to every one")
                async with asyncio.timeout(30):
                    return await asyncio.gather(*(first_event(r) for r in responses))
            finally:
                for response in responses:
                    response.close()

    events = asyncio.run(scenario())
    assert {event["data"] for event in events} == {b"to every one"}
    # One message, one ID, a copy on every channel.
    assert len({event["id"] for event in events}) == 1
    poll(lambda: not subscribers_of(pubsub, topic), timeout=30)
    poll(lambda: not topic_channels(nsqd, topic), timeout=30)


# -- errors --------------------------------------------------------------------------------------


# The same requests to nsqd's HTTP API and to nsq_pubsub get the same answers.
PUBLISH_REFUSALS = [
    ("POST", "/pub?topic={topic}", b""),
    ("POST", "/pub", b"body"),
    ("POST", "/pub?topic=a%20b", b"body"),
    ("POST", "/pub?topic={topic}&defer=abc", b"body"),
    ("POST", "/pub?topic={topic}&defer=-1", b"body"),
    ("POST", "/pub?topic={topic}&defer=3600001", b"body"),
    ("POST", "/pub?topic={topic}", 1024 * 1024 + 1),
    ("POST", "/mpub?topic={topic}", 5 * 1024 * 1024 + 1),
    ("POST", "/mpub?topic={topic}&binary=true", b"\0\0\0\2\0\0\0\5hello"),
    ("POST", "/mpub?topic={topic}", b"x" * (1024 * 1024 + 1) + b"\nsmall"),
    ("GET", "/pub?topic={topic}", None),
    ("GET", "/nowhere", None),
]


@pytest.mark.parametrize(("method", "path", "body"), PUBLISH_REFUSALS)
def test_publish_refusals_are_nsqds(pubsub, nsqd, topic, method, path, body):
    path = path.format(topic=topic)
    if isinstance(body, int):
        expected = announce_body(nsqd.addresses["HTTP"], method, path, body)
        got = announce_body(pubsub.addresses["HTTP"], method, path, body)
    else:
        expected = request(nsqd.addresses["HTTP"], method, path, body)
        got = request(pubsub.addresses["HTTP"], method, path, body)
    assert expected.status >= 400
    assert (got.status, got.body) == (expected.status, expected.body)
    assert got.headers.get("Allow") == expected.headers.get("Allow")
    assert got.headers["X-Nsq-Content-Type"] == "nsq; version=1.0"
    # Nothing was published, and nsq_pubsub serves on.
    document = http_json(nsqd.addresses["HTTP"], "/stats", format="json", topic=topic)
    assert [t["message_count"] for t in document["topics"] or []] in ([], [0])
    assert request(pubsub.addresses["HTTP"], "GET", "/ping").body == b"OK"


@pytest.mark.parametrize(
    ("method", "path", "status", "message"),
    [
        ("GET", "/sub", 400, "MISSING_ARG_TOPIC"),
        ("GET", "/sub?topic=a%20b", 400, "INVALID_ARG_TOPIC"),
        ("GET", "/sub?topic=t&channel=", 400, "INVALID_ARG_CHANNEL"),
        ("GET", "/sub?topic=t&channel=" + "c" * 65, 400, "INVALID_ARG_CHANNEL"),
        ("GET", "/ws?topic=bad!", 400, "INVALID_ARG_TOPIC"),
        ("POST", "/sub?topic=t", 405, "METHOD_NOT_ALLOWED"),
        ("GET", "/sub?topic=t&a=b;c", 400, "INVALID_REQUEST"),
    ],
)
def test_subscribe_refusals(pubsub, method, path, status, message):
    got = request(pubsub.addresses["HTTP"], method, path, b"" if method == "POST" else None)
    assert (got.status, json.loads(got.body)) == (status, {"message": message})
    assert request(pubsub.addresses["HTTP"], "GET", "/ping").body == b"OK"


def test_an_unreachable_nsqd_is_an_upstream_error(topic, launch):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        nowhere = f"127.0.0.1:{probe.getsockname()[1]}"
    pubsub = launch(f"-nsqd-tcp-address={nowhere}")
    try:
        address = pubsub.addresses["HTTP"]
        for method, path, body in (
            ("GET", f"/sub?topic={topic}", None),
            ("POST", f"/pub?topic={topic}", b"lost"),
        ):
            reply = request(address, method, path, body)
            assert reply.status == 502
            assert json.loads(reply.body)["message"].startswith(f"UPSTREAM_ERROR: {nowhere}: ")
    finally:
        assert pubsub.stop() == 0, pubsub.log


@pytest.mark.parametrize(
    ("flags", "error"),
    [
        ((), "--nsqd-tcp-address or --lookupd-http-address required"),
        (
            ("--nsqd-tcp-address=127.0.0.1:1", "--lookupd-http-address=127.0.0.1:2"),
            "use --nsqd-tcp-address or --lookupd-http-address not both",
        ),
        (("--nsqd-tcp-address=127.0.0.1:1", "-max-in-flight", "0"), "--max-in-flight must be > 0"),
        (
            ("--nsqd-tcp-address=127.0.0.1:1", "--consumer-opt=bogus,1"),
            'invalid value "bogus,1" for flag -consumer-opt: invalid option bogus',
        ),
        (
            ("--nsqd-tcp-address=127.0.0.1:1", "--consumer-opt=tls_v1,maybe"),
            'invalid value "tls_v1,maybe" for flag -consumer-opt: failed to coerce option tls_v1'
            ' (maybe) - strconv.ParseBool: parsing "maybe": invalid syntax',
        ),
        (
            ("--nsqd-tcp-address=127.0.0.1:1", "--producer-opt=tls_min_version,tls9"),
            'invalid value "tls_min_version,tls9" for flag -producer-opt: ERROR: tls9 is not a'
            " tls version",
        ),
        (
            ("--nsqd-tcp-address=127.0.0.1:1", "--http-address=127.0.0.1"),
            "listen (127.0.0.1) failed",
        ),
    ],
)
def test_bad_flags_stop_it_with_gos_errors(flags, error):
    result = run_tool("nsq_pubsub", *flags)
    assert result.returncode == 1, result.stderr.decode()
    assert error in result.stderr.decode()


def test_version_and_module_entry_point():
    result = run_tool("nsq_pubsub", "--version")
    assert result.returncode == 0
    assert result.stdout.decode().startswith("nsq_pubsub v1.3.0 (built w/nsqpy-")
    module = subprocess.run(
        [sys.executable, "-m", "nsqpy.tools.nsq_pubsub", "--version"],
        capture_output=True,
        cwd=Path(__file__).resolve().parents[2],
        timeout=DEADLINE,
        check=False,
    )
    assert (module.returncode, module.stdout) == (0, result.stdout)


# -- through nsqlookupd ------------------------------------------------------------------------


def test_through_lookupd_a_new_classic_topic(nsqd, lookupd, topic, launch):
    pubsub = launch(f"-lookupd-http-address={lookupd.addresses['HTTP']}")
    address = pubsub.addresses["HTTP"]
    try:
        # No nsqd has the topic: it goes to one nsqlookupd lists in /nodes.
        publish(pubsub, topic, b"first")
        poll(lambda: lookupd_has_topic(lookupd, topic), timeout=DEADLINE)
        stream = Stream(address, f"/sub?topic={topic}&channel=c")
        try:
            assert subscribers_of(pubsub, topic)[0]["nsqd_connections"] == 1
            publish(pubsub, topic, b"second")
            # The topic kept "first" for its first channel.
            assert stream.lines(2) == [b"first", b"second"]
        finally:
            stream.close()
    finally:
        assert pubsub.stop() == 0, pubsub.log


def test_through_lookupd_a_partitioned_topic(nsqd, lookupd, topic, launch):
    lookupd_http = lookupd.addresses["HTTP"]
    http_request(
        lookupd_http,
        "/topic/create",
        method="POST",
        topic=topic,
        partition_num="2",
        replicator="1",
    )

    def partitions(access: str) -> dict:
        try:
            document = http_json(lookupd_http, "/lookup", topic=topic, access=access)
        except urllib.error.HTTPError:
            return {}
        return document.get("partitions") or {}

    poll(lambda: len(partitions("r")) == 2, timeout=DEADLINE)
    pubsub = launch(f"-lookupd-http-address={lookupd_http}")
    try:
        stream = Stream(pubsub.addresses["HTTP"], f"/sub?topic={topic}&channel=c")
        try:
            # One connection per partition, at its leader.
            assert subscribers_of(pubsub, topic)[0]["nsqd_connections"] == 2
            # The SUBs created the channel on both partitions: both become writable.
            poll(lambda: len(partitions("w")) == 2, timeout=DEADLINE)
            bodies = [b"p%02d" % number for number in range(10)]
            for body in bodies:
                publish(pubsub, topic, body)
            assert sorted(stream.lines(10)) == bodies
        finally:
            stream.close()
        # The smart client spread them over both partitions.
        topics = http_json(nsqd.addresses["HTTP"], "/stats", format="json", topic=topic)["topics"]
        counts = {t["topic_partition"]: t["message_count"] for t in topics}
        assert counts == {0: 5, 1: 5}
    finally:
        assert pubsub.stop() == 0, pubsub.log


# -- TLS ----------------------------------------------------------------------------------------


def test_tls_to_nsqd_and_https_to_subscribers(tmp_path, topic, launch):
    authority = trustme.CA()
    server = authority.issue_cert("127.0.0.1", "localhost")
    ca, cert, key = tmp_path / "ca.pem", tmp_path / "cert.pem", tmp_path / "key.pem"
    authority.cert_pem.write_to_path(str(ca))
    server.cert_chain_pems[0].write_to_path(str(cert))
    server.private_key_pem.write_to_path(str(key))
    data = tmp_path / "nsqd"
    data.mkdir()
    nsqd = start_nsqd(
        data,
        f"-tls-cert={cert}",
        f"-tls-key={key}",
        # With a certificate nsqd also serves HTTPS, by default on the shared port 4152.
        "-https-address=127.0.0.1:0",
        wait_for=("TCP", "HTTP", "HTTPS"),
    )
    try:
        pubsub = launch(
            f"-nsqd-tcp-address={nsqd.addresses['TCP']}",
            "-https-address=127.0.0.1:0",
            f"-tls-cert={cert}",
            f"-tls-key={key}",
            "--consumer-opt=tls_v1,true",
            f"--consumer-opt=tls_root_ca_file,{ca}",
            "--producer-opt=tls_v1",
            f"--producer-opt=tls_root_ca_file,{ca}",
            "--producer-opt=tls_min_version,tls1.2",
        )
        https = pubsub.wait_for_log("HTTPS: listening on").rsplit(" ", 1)[1]
        context = ssl.create_default_context(cafile=str(ca))
        assert request(https, "GET", "/ping", context=context).body == b"OK"
        stream = Stream(https, f"/sub?topic={topic}&channel=secure", context=context)
        try:
            assert stream.status == 200
            reply = request(https, "POST", f"/pub?topic={topic}", b"over TLS", context=context)
            assert reply.status == 200
            assert stream.lines(1) == [b"over TLS"]
            # Both of nsq_pubsub's connections negotiated TLS.
            document = http_json(nsqd.addresses["HTTP"], "/stats", format="json", topic=topic)
            (channel,) = document["topics"][0]["channels"]
            assert [client["tls"] for client in channel["clients"]] == [True]
            assert [client["tls"] for client in document["producers"]] == [True]
        finally:
            stream.close()
        assert pubsub.stop() == 0, pubsub.log
    finally:
        nsqd.stop()
