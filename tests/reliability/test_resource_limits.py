"""Per-connection resource limits, enforced with Go's exact errors and before any allocation.

nsqd runs as its own process (with `-max-rdy-count=50 -max-output-buffer-size=4096`, default
message and body limits), so that its memory can be read from /proc. Before each hostile
request the test resets nsqd's peak resident size (`/proc/<pid>/clear_refs`, 5) and after it
checks that the peak (VmHWM) rose by less than 16 MiB: a length prefix of 4 GiB - 1, 2 GiB or
2 GiB - 1 is answered from the prefix alone, never by allocating or reading that much.
"""

import json
import socket
import struct
import threading

import pytest

from nsqpy.common.command import MAGIC_V2, encode_identify, encode_mpub, encode_rdy, encode_sub
from nsqpy.common.frame import FRAME_TYPE_ERROR, FRAME_TYPE_RESPONSE
from tests.harness import V2Connection, start_nsqd

MAX_RDY = 50
MAX_OUTPUT_BUFFER = 4096
MAX_MSG = 1024 * 1024  # nsqd's defaults
MAX_BODY = 5 * 1024 * 1024
PEAK_GROWTH_BOUND_KIB = 16 * 1024
# After the prefix the client goes on sending this much, as if the body were coming.
TRAILING_JUNK = 32 * 1024 * 1024


def size(value: int) -> bytes:
    return struct.pack(">I", value)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    nsqd = start_nsqd(
        tmp_path_factory.mktemp("limits"),
        f"-max-rdy-count={MAX_RDY}",
        f"-max-output-buffer-size={MAX_OUTPUT_BUFFER}",
    )
    yield nsqd
    assert nsqd.stop() == 0, nsqd.log[-3000:]


class PeakMemory:
    """nsqd's peak resident size over a block, from a reset peak."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def _status(self, key: str) -> int:
        with open(f"/proc/{self.pid}/status") as status:
            for line in status:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
        raise AssertionError(f"no {key}")

    def __enter__(self) -> "PeakMemory":
        with open(f"/proc/{self.pid}/clear_refs", "w") as clear_refs:
            clear_refs.write("5")  # VmHWM := VmRSS
        self.before = self._status("VmRSS")
        return self

    def __exit__(self, *exc) -> None:
        self.growth = self._status("VmHWM") - self.before


def _send_junk(sock: socket.socket, amount: int) -> None:
    """Keep sending until `amount` bytes went out or nsqd closed the connection."""
    chunk = b"j" * (1024 * 1024)
    try:
        for _ in range(amount // len(chunk)):
            sock.sendall(chunk)
    except OSError:
        pass  # nsqd answered and closed: nothing more is read either way


def _expect_fatal_error(connection: V2Connection, text: str) -> None:
    frame = connection.read_response()
    assert (frame.frame_type, frame.data.decode()) == (FRAME_TYPE_ERROR, text)
    assert connection.is_closed_by_peer()


HUGE = [2**32 - 1, 2**31, 2**31 - 1]


def _tcp_cases():
    for prefix in HUGE:
        signed = prefix - 2**32 if prefix >= 2**31 else prefix
        too_big = signed > 0
        yield (
            b"PUB t\n",
            prefix,
            f"E_BAD_MESSAGE PUB message too big {signed} > {MAX_MSG}"
            if too_big
            else f"E_BAD_MESSAGE PUB invalid message body size {signed}",
        )
        yield (
            b"DPUB t 0\n",
            prefix,
            f"E_BAD_MESSAGE DPUB message too big {signed} > {MAX_MSG}"
            if too_big
            else f"E_BAD_MESSAGE DPUB invalid message body size {signed}",
        )
        yield (
            b"MPUB t\n",
            prefix,
            f"E_BAD_BODY MPUB body too big {signed} > {MAX_BODY}"
            if too_big
            else f"E_BAD_BODY MPUB invalid body size {signed}",
        )
        for name in ("IDENTIFY", "AUTH"):
            yield (
                name.encode() + b"\n",
                prefix,
                f"E_BAD_BODY {name} body too big {signed} > {MAX_BODY}"
                if too_big
                else f"E_BAD_BODY {name} invalid body size {signed}",
            )
        # Inside an MPUB body of a valid size: the message count, then a message's size.
        yield (
            b"MPUB t\n" + size(1000),
            prefix,
            f"E_BAD_BODY MPUB invalid message count {signed}",
        )
        yield (
            b"MPUB t\n" + size(1000) + size(1),
            prefix,
            f"E_BAD_MESSAGE MPUB message too big {signed} > {MAX_MSG}"
            if too_big
            else f"E_BAD_MESSAGE MPUB invalid message(0) body size {signed}",
        )


@pytest.mark.parametrize(("head", "prefix", "error"), list(_tcp_cases()))
def test_huge_length_prefix_is_refused_before_any_allocation(daemon, head, prefix, error):
    connection = V2Connection(daemon.port("TCP"))
    try:
        with PeakMemory(daemon.process.pid) as peak:
            connection.send(head + size(prefix))
            sender = threading.Thread(target=_send_junk, args=(connection.sock, TRAILING_JUNK))
            sender.start()
            _expect_fatal_error(connection, error)
            sender.join(30)
        assert peak.growth < PEAK_GROWTH_BOUND_KIB, f"nsqd's peak grew {peak.growth} KiB"
    finally:
        connection.close()


@pytest.mark.parametrize(
    ("path", "error"),
    [("/pub?topic=t", "MSG_TOO_BIG"), ("/mpub?topic=t", "BODY_TOO_BIG")],
)
@pytest.mark.parametrize("declared", [2**32, 2**32 - 1, 2**31])
def test_http_content_length_of_4_gib_is_413_before_the_body(daemon, path, error, declared):
    with PeakMemory(daemon.process.pid) as peak:
        sock = socket.create_connection(("127.0.0.1", daemon.port("HTTP")), timeout=10)
        try:
            sock.sendall(
                f"POST {path} HTTP/1.1\r\nHost: nsqd\r\nContent-Length: {declared}\r\n\r\n".encode()
            )
            # The answer comes from the headers alone: no body byte was sent yet.
            response = b""
            while b"\r\n\r\n" not in response or not response.endswith(b"}"):
                data = sock.recv(4096)
                assert data, response
                response += data
            _send_junk(sock, TRAILING_JUNK)
        finally:
            sock.close()
    head, _, body = response.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413 Request Entity Too Large"), head
    assert json.loads(body) == {"message": error}
    assert peak.growth < PEAK_GROWTH_BOUND_KIB, f"nsqd's peak grew {peak.growth} KiB"


def _identify(port: int, settings: dict) -> V2Connection:
    connection = V2Connection(port)
    connection.send(encode_identify({"feature_negotiation": True, **settings}))
    return connection


def test_output_buffer_size_is_bounded_by_max_output_buffer_size(daemon):
    connection = _identify(daemon.port("TCP"), {"output_buffer_size": MAX_OUTPUT_BUFFER})
    frame = connection.read_response()
    assert frame.frame_type == FRAME_TYPE_RESPONSE
    assert json.loads(frame.data)["output_buffer_size"] == MAX_OUTPUT_BUFFER
    connection.close()

    too_big = MAX_OUTPUT_BUFFER + 1
    connection = _identify(daemon.port("TCP"), {"output_buffer_size": too_big})
    _expect_fatal_error(
        connection, f"E_BAD_BODY IDENTIFY output buffer size ({too_big}) is invalid"
    )
    connection.close()


@pytest.mark.parametrize(
    ("count", "shown"),
    [
        (b"51", "51"),
        (b"4294967295", "4294967295"),
        (b"18446744073709551615", "-1"),  # Go keeps a uint64 in an int64
    ],
)
def test_rdy_is_bounded_by_max_rdy_count(daemon, count, shown):
    connection = _identify(daemon.port("TCP"), {})
    reply = json.loads(connection.read_response().data)
    assert reply["max_rdy_count"] == MAX_RDY
    connection.send(encode_sub("t", "c") + encode_rdy(MAX_RDY))
    assert connection.read_response().data == b"OK"
    connection.send(b"RDY " + count + b"\n")
    _expect_fatal_error(connection, f"E_INVALID RDY count {shown} out of range 0-{MAX_RDY}")
    connection.close()


def test_the_peak_meter_sees_a_body_at_the_limit(daemon):
    """The control for the bounds above: an MPUB of max-body-size is read and stored, and
    the meter sees nsqd's peak grow by at least that much; nsqd still serves afterwards."""
    message_size = (MAX_BODY - 4) // 5 - 4
    connection = V2Connection(daemon.port("TCP"))
    try:
        with PeakMemory(daemon.process.pid) as peak:
            connection.send(encode_mpub("big", [b"m" * message_size] * 5))
            assert connection.read_response().data == b"OK"
        assert peak.growth >= MAX_BODY // 1024, f"nsqd's peak grew only {peak.growth} KiB"
    finally:
        connection.close()


def test_a_consumer_that_does_not_read_costs_a_bounded_output_buffer(daemon):
    """A consumer with RDY at the maximum and ~1 MiB messages that never reads: nsqd writes
    to it until the write deadline cuts it off, holding at most one bounded output buffer
    beyond the messages it already keeps in flight (Go: output_buffer_size plus a message)."""
    body = b"o" * (MAX_MSG - 64)
    publisher = V2Connection(daemon.port("TCP"))
    publisher.send(b"PUB out\n" + size(len(body)) + body)
    assert publisher.read_response().data == b"OK"
    stalled = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stalled.connect(("127.0.0.1", daemon.port("TCP")))
        address = f"127.0.0.1:{stalled.getsockname()[1]}"
        stalled.sendall(
            MAGIC_V2 + encode_identify({"heartbeat_interval": 1000}) + encode_sub("out", "c")
        )
        # The channel exists now: fill it with RDY's worth of messages, then let them go.
        publisher.send(b"".join(b"PUB out\n" + size(len(body)) + body for _ in range(MAX_RDY)))
        for _ in range(MAX_RDY):
            assert publisher.read_response().data == b"OK"
        with PeakMemory(daemon.process.pid) as peak:
            stalled.sendall(encode_rdy(MAX_RDY))
            daemon.wait_for_log(rf"\[{address}\] write deadline exceeded", timeout=30)
        assert peak.growth < PEAK_GROWTH_BOUND_KIB, f"nsqd's peak grew {peak.growth} KiB"
    finally:
        stalled.close()
        publisher.close()
