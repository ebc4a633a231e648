"""Real clients over TLS (and TLS with snappy or deflate) against the nsqd console script.

nsqd runs with the session's trustme certificate; the clients verify it against the trustme
CA. Each client publishes and consumes a batch through the negotiated layers, the test asserts
that the IDENTIFY reply the client itself received granted each feature (a client silently
falls back to plain when a feature is refused, docs/design.md §11), and /stats — read while the
client
is still connected — must show TLS and the compression on nsqd's side of the connection.

* pynsq 0.9.1 (tornado) runs on its own asyncio loop in this thread; its Reader and Writer
  report the IDENTIFY reply through `_on_connection_identify_response`.
* nsqjs runs `node/security.js` (tests/interop/node), which prints the IDENTIFY replies its
  connections kept (`conn.statemachine.identifyResponse`), then stays connected until its
  stdin closes, while the test reads /stats.

TLS+snappy and pynsq: pynsq's `SnappySocket` signals "no whole snappy chunk yet" with a plain
`OSError(EWOULDBLOCK)`, which tornado ≥ 6.1 (6.6 here) no longer takes for "would block", so
pynsq drops the connection as soon as a read ends inside a snappy chunk (docs/design.md §11; the
large
random bodies below make that happen at once). That is pynsq's bug, not nsqd's: TLS+snappy is
covered unpatched by nsqjs, and pynsq's TLS+snappy test runs with `pynsq_snappy_shim`, which
re-raises that one error as the `BlockingIOError` tornado expects and changes nothing else.
"""

import asyncio
import errno
import json
import queue
import random
import shutil
import subprocess
import threading

import nsq
import pytest
import tornado
from nsq.snappy_socket import SnappySocket

from tests.interop.support import INTEROP_DIR
from tests.security.support import http_get, running_nsqd
from tests.support.polling import wait_until

NODE_DIR = INTEROP_DIR / "node"
MESSAGES = 200
DEADLINE = 30.0


@pytest.fixture(scope="module", params=["1", "2"], ids=["one process", "two workers"])
def tls_nsqd(request, certs, tmp_path_factory):
    """Also with `--workers=2`, where a connection accepted by the worker that does not own
    its topic is relayed to the owner through the first one's TLS and compression."""
    flags = (*certs.tls_flags(), f"-workers={request.param}")
    with running_nsqd(tmp_path_factory.mktemp("tls-interop"), *flags) as daemon:
        yield daemon


def bodies(label: str) -> list[bytes]:
    """Small bodies, most of them compressible, and every 50th one 100 kB of random bytes:
    an incompressible frame spans several TLS records and snappy chunks, so a read can end
    in the middle of a chunk."""
    noise = random.Random(label).randbytes(100_000)
    return [
        f"{label}-{index}-".encode() + (noise if index % 50 == 7 else b"payload " * (index % 50))
        for index in range(MESSAGES)
    ]


def stats_clients(daemon, certs, topic: str, channel: str) -> tuple[list, list]:
    """(the channel's clients, the producers) of /stats, read over HTTPS."""
    url = f"https://{daemon.addresses['HTTPS']}/stats?format=json&topic={topic}"
    reply = http_get(url, certs.client_context())
    assert reply.status == 200, reply
    stats = json.loads(reply.body)
    consumers = [
        client
        for found in stats["topics"]
        for found_channel in found["channels"]
        if found_channel["channel_name"] == channel
        for client in found_channel["clients"]
    ]
    return consumers, stats.get("producers") or []


# -- pynsq --------------------------------------------------------------------------------------


class Report:
    def __init__(self) -> None:
        self.identify: dict[str, list[dict]] = {"writer": [], "reader": []}
        self.errors: list[str] = []
        self.published_ok = 0
        self.received: list[bytes] = []
        self.consumers: list[dict] = []
        self.producers: list[dict] = []
        self.closing = False


def recording(cls, role: str):
    class Recording(cls):
        def __init__(self, report: Report, **kwargs) -> None:
            self.report = report
            super().__init__(**kwargs)

        def _on_connection_identify_response(self, conn, data, **kwargs) -> None:
            self.report.identify[role].append(data)
            super()._on_connection_identify_response(conn, data, **kwargs)

        def _on_connection_error(self, conn, error, **kwargs) -> None:
            if not self.report.closing:  # pynsq reports its own close as a failed read
                self.report.errors.append(f"{role}: {error!r}")
            super()._on_connection_error(conn, error, **kwargs)

    return Recording


async def until_clean(predicate, what: str, report: Report) -> None:
    """Until `predicate` holds; a client error fails at once, not at the deadline."""

    def holds() -> bool:
        assert not report.errors, f"while waiting for {what}: {report.errors}"
        return predicate()

    await wait_until(holds, what, timeout=DEADLINE)


async def pynsq_session(report: Report, address: str, topic: str, stats, options: dict) -> None:
    expected = bodies(topic)
    writer = recording(nsq.Writer, "writer")(report, nsqd_tcp_addresses=[address], **options)
    await until_clean(
        lambda: any(c.connected() for c in writer.conns.values()), "the Writer", report
    )

    def on_published(conn, data) -> None:
        if data == b"OK":
            report.published_ok += 1
        else:
            report.errors.append(f"publish: {data!r}")

    writer.pub(topic, expected[0], callback=on_published)
    writer.mpub(topic, expected[1:], callback=on_published)
    await until_clean(lambda: report.published_ok == 2, "the PUB and MPUB answers", report)

    def handle(message: nsq.Message) -> bool:
        report.received.append(message.body)
        return True

    reader = recording(nsq.Reader, "reader")(
        report,
        topic=topic,
        channel="tls",
        message_handler=handle,
        nsqd_tcp_addresses=[address],
        max_in_flight=50,
        **options,
    )
    await until_clean(lambda: len(report.received) >= MESSAGES, f"{MESSAGES} messages", report)
    # Both connections are still open: nsqd's view of them.
    report.consumers, report.producers = stats(topic, "tls")
    report.closing = True
    reader.close()
    for conn in list(writer.conns.values()):
        conn.close()


def run_pynsq(daemon, certs, topic: str, **options) -> Report:
    report = Report()
    address = f"127.0.0.1:{daemon.port('TCP')}"
    tls = {"tls_v1": True, "tls_options": {"ca_certs": certs.ca}}

    def stats(topic: str, channel: str):
        return stats_clients(daemon, certs, topic, channel)

    session = pynsq_session(report, address, topic, stats, {**tls, **options})
    asyncio.run(asyncio.wait_for(session, DEADLINE + 10))
    return report


def assert_pynsq_negotiated(report: Report, topic: str, *, snappy: bool, deflate: bool) -> None:
    assert report.errors == []
    assert sorted(report.received) == sorted(bodies(topic))
    for role in ("writer", "reader"):
        (reply,) = report.identify[role]
        granted = {key: reply[key] for key in ("tls_v1", "snappy", "deflate")}
        assert granted == {"tls_v1": True, "snappy": snappy, "deflate": deflate}, role
    (consumer,) = report.consumers
    producers = [p for p in report.producers if p["user_agent"].startswith("pynsq")]
    for client in [consumer, *producers]:
        assert client["user_agent"].startswith("pynsq/")
        assert (client["tls"], client["snappy"], client["deflate"]) == (True, snappy, deflate)
        assert client["tls_version"] == "TLS1.2"  # pynsq asks for ssl.PROTOCOL_TLSv1_2
    assert producers, "the Writer is not among /stats producers"


def test_pynsq_over_tls(tls_nsqd, certs):
    report = run_pynsq(tls_nsqd, certs, "pynsq-tls")
    assert_pynsq_negotiated(report, "pynsq-tls", snappy=False, deflate=False)


def test_pynsq_over_tls_with_deflate(tls_nsqd, certs):
    report = run_pynsq(tls_nsqd, certs, "pynsq-tls-deflate", deflate=True, deflate_level=6)
    assert_pynsq_negotiated(report, "pynsq-tls-deflate", snappy=False, deflate=True)
    assert report.identify["reader"][0]["deflate_level"] == 6


@pytest.fixture
def pynsq_snappy_shim(monkeypatch):
    """Make pynsq 0.9.1's snappy socket say "would block" the way tornado ≥ 6.1 expects."""
    if tornado.version_info < (6, 1):
        return
    original = SnappySocket._recv

    def _recv(self, size, method):
        try:
            return original(self, size, method)
        except OSError as error:
            if type(error) is OSError and error.args == (errno.EWOULDBLOCK,):
                raise BlockingIOError(errno.EWOULDBLOCK, "no whole snappy chunk yet") from None
            raise

    monkeypatch.setattr(SnappySocket, "_recv", _recv)


def test_pynsq_over_tls_with_snappy(tls_nsqd, certs, pynsq_snappy_shim):
    report = run_pynsq(tls_nsqd, certs, "pynsq-tls-snappy", snappy=True)
    assert_pynsq_negotiated(report, "pynsq-tls-snappy", snappy=True, deflate=False)


# -- nsqjs --------------------------------------------------------------------------------------


def run_nsqjs(daemon, certs, topic: str, compression: str) -> tuple[dict, list, list]:
    """Run node/security.js; (its report, the channel's /stats clients, the producers), the
    /stats read after the report while nsqjs is still connected."""
    node = shutil.which("node")
    assert node, "Node.js is needed for the nsqjs interop tests: install node and npm"
    assert (NODE_DIR / "node_modules" / "nsqjs").is_dir(), (
        "nsqjs is not installed: run `make install` (npm ci --prefix tests/interop/node)"
    )
    argv = [
        node,
        str(NODE_DIR / "security.js"),
        f"--port={daemon.port('TCP')}",
        f"--topic={topic}",
        "--channel=tls",
        f"--ca={certs.ca}",
        f"--compression={compression}",
    ]
    process = subprocess.Popen(
        argv,
        cwd=NODE_DIR,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: lines.put(process.stdout.readline()), daemon=True).start()
    try:
        try:
            line = lines.get(timeout=DEADLINE + 10)
        except queue.Empty:
            raise AssertionError(f"nsqjs gave no report in {DEADLINE + 10}s") from None
        if not line:
            process.wait(10)
            raise AssertionError(f"nsqjs exited {process.returncode}:\n{process.stderr.read()}")
        report = json.loads(line)
        consumers, producers = stats_clients(daemon, certs, topic, "tls")
        process.stdin.close()
        assert process.wait(10) == 0, process.stderr.read()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return report, consumers, producers


@pytest.mark.parametrize("compression", ["none", "snappy", "deflate"])
def test_nsqjs_over_tls(tls_nsqd, certs, compression):
    topic = f"nsqjs-tls-{compression}"
    report, consumers, producers = run_nsqjs(tls_nsqd, certs, topic, compression)
    assert report["errors"] == []
    assert (report["published_ok"], report["received"]) == (2, MESSAGES)
    snappy, deflate = compression == "snappy", compression == "deflate"
    for role in ("writer", "reader"):
        (reply,) = report["identify"][role]
        granted = {key: reply[key] for key in ("tls_v1", "snappy", "deflate")}
        assert granted == {"tls_v1": True, "snappy": snappy, "deflate": deflate}, role
    (consumer,) = consumers
    producers = [p for p in producers if p["user_agent"].startswith("nsqjs")]
    assert producers, "the Writer is not among /stats producers"
    for client in [consumer, *producers]:
        assert (client["tls"], client["snappy"], client["deflate"]) == (True, snappy, deflate)
        assert client["tls_version"] == "TLS1.3"
