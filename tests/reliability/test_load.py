"""Many idle connections and a steady message stream at once (issue #10).

nsqd runs as its own process with a raised file-descriptor limit. A swarm of idle consumers
(`load_clients.py`, one epoll loop in another process) holds thousands of connections open,
each with a short heartbeat interval that it answers with `NOP`. Meanwhile a publisher
sends a paced stream of 1,000 messages a second, a consumer receives and finishes them, and
`/ping` is asked ten times a second on a fresh HTTP connection.

What is asserted: every `/ping` is answered (within a generous 5 s), no connection that
answered its heartbeats is dropped, every acknowledged message is delivered, nsqd's `/stats`
counts every idle client, and nsqd's resident memory does not grow in the second half of
the run beyond a generous bound. The latencies and memory figures are printed, not asserted
(performance goals are reported, not tested): run with `-s` to see them.

The default run is short (2,000 connections with 1 s heartbeats, 10 s); `-m slow` runs the
full one, 10,000 connections for 60 s, with 5 s heartbeats and with 1 s heartbeats (10,000
heartbeat round trips a second, most of one core for nsqd here). Any size by hand:
`python -m tests.reliability.test_load CONNECTIONS SECONDS HEARTBEAT_MS`.
"""

import json
import os
import resource
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import trio

from nsqpy.common.command import (
    MAGIC_V2,
    encode_fin,
    encode_identify,
    encode_pub,
    encode_rdy,
    encode_sub,
)
from nsqpy.common.frame import FRAME_TYPE_ERROR, FRAME_TYPE_MESSAGE, FrameDecoder
from nsqpy.common.message import decode_message
from tests.harness import start_nsqd

ROOT = Path(__file__).resolve().parents[2]
RATE = 1000  # messages a second
BODY_SIZE = 100
HEARTBEAT_MS = 1000
PING_EVERY = 0.1
PING_TIMEOUT = 5.0
# Resident memory may grow this much between the middle and the end of the stream.
RSS_GROWTH_BOUND_MIB = 64


def _proc_status(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of a process, in KiB."""
    values = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                values[key] = int(rest.split()[0])
    return values


def _raise_fd_limit(needed: int) -> tuple[int, int]:
    """Raise this process's soft limit (children inherit it); returns the old limits."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed:
        assert hard >= needed, f"hard limit {hard} < {needed} file descriptors"
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
    return soft, hard


class _Swarm:
    """The idle-client process; `report()` asks it for its counters."""

    def __init__(self, port: int, count: int, heartbeat_ms: int) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.reliability.load_clients", str(port), str(count)]
            + [str(heartbeat_ms)],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def _line(self) -> dict:
        line = self.process.stdout.readline()
        assert line, f"idle-client swarm exited: {self.process.wait()}"
        return json.loads(line)

    def ready(self) -> dict:
        return self._line()

    def report(self) -> dict:
        self.process.stdin.write("stats\n")
        self.process.stdin.flush()
        return self._line()

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


async def _read_frames(stream: trio.SocketStream, decoder: FrameDecoder):
    data = await stream.receive_some(65536)
    if not data:
        raise ConnectionError("nsqd closed the connection")
    return decoder.receive_data(data)


async def _ping(http_port: int) -> float | None:
    """Seconds until `/ping` on a fresh connection answered `OK`; None when it did not."""
    started = time.monotonic()
    with trio.move_on_after(PING_TIMEOUT):
        stream = await trio.open_tcp_stream("127.0.0.1", http_port)
        try:
            await stream.send_all(b"GET /ping HTTP/1.1\r\nHost: nsqd\r\nConnection: close\r\n\r\n")
            response = b""
            while not response.endswith(b"\r\n\r\nOK"):
                data = await stream.receive_some(4096)
                if not data:
                    break
                response += data
        finally:
            await stream.aclose()
        if response.startswith(b"HTTP/1.1 200") and response.endswith(b"OK"):
            return time.monotonic() - started
    return None


class _Stream:
    """The paced publisher and its consumer."""

    def __init__(self, tcp_port: int, seconds: float) -> None:
        self.tcp_port = tcp_port
        self.total = int(RATE * seconds)
        self.acknowledged = 0
        self.received: set[bytes] = set()
        self.deliveries = 0
        self.all_received = trio.Event()
        self.publish_seconds = 0.0
        self.errors: list[str] = []
        self.consumer_address = ""

    def body(self, number: int) -> bytes:
        return b"%08d" % number + b"." * (BODY_SIZE - 8)

    async def publish(self) -> None:
        stream = await trio.open_tcp_stream("127.0.0.1", self.tcp_port)
        decoder = FrameDecoder()
        await stream.send_all(MAGIC_V2)
        started = trio.current_time()
        sent = 0
        tick = 0.01
        while sent < self.total:
            # Send what the rate allows by now, in one write; then wait for their OKs.
            due = min(self.total, int((trio.current_time() - started) * RATE) + 1)
            batch = [encode_pub("stream", self.body(number)) for number in range(sent, due)]
            await stream.send_all(b"".join(batch))
            sent = due
            while self.acknowledged < sent:
                for frame in await _read_frames(stream, decoder):
                    assert frame.frame_type != FRAME_TYPE_ERROR, frame.data
                    if frame.data == b"_heartbeat_":  # every 30 s, publishing or not
                        await stream.send_all(b"NOP\n")
                        continue
                    assert frame.data == b"OK", frame.data
                    self.acknowledged += 1
            await trio.sleep_until(started + (sent / RATE) + tick)
        self.publish_seconds = trio.current_time() - started
        await stream.aclose()

    async def consume(self) -> None:
        stream = await trio.open_tcp_stream("127.0.0.1", self.tcp_port)
        self.consumer_address = f"127.0.0.1:{stream.socket.getsockname()[1]}"
        try:
            await self._consume(stream)
        except (trio.BrokenResourceError, ConnectionError) as error:
            self.errors.append(f"consumer {self.consumer_address}: {error!r}")
            self.all_received.set()

    async def _consume(self, stream: trio.SocketStream) -> None:
        decoder = FrameDecoder()
        await stream.send_all(
            MAGIC_V2
            + encode_identify({"heartbeat_interval": HEARTBEAT_MS})
            + encode_sub("stream", "c")
            + encode_rdy(500)
        )
        while len(self.received) < self.total:
            replies = []
            for frame in await _read_frames(stream, decoder):
                if frame.frame_type == FRAME_TYPE_MESSAGE:
                    message = decode_message(frame.data)
                    self.received.add(message.body)
                    self.deliveries += 1
                    replies.append(encode_fin(message.id))
                elif frame.data == b"_heartbeat_":
                    replies.append(b"NOP\n")
                else:
                    assert frame.frame_type != FRAME_TYPE_ERROR, frame.data
            if replies:
                await stream.send_all(b"".join(replies))
        self.all_received.set()
        await stream.aclose()


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values) or [float("nan")]
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))]


def _stats_idle(http_port: int) -> tuple[int, dict]:
    """The idle channel's client count and nsqd's memory stats (GC pauses among them)."""
    url = (
        f"http://127.0.0.1:{http_port}/stats?format=json&topic=idle&channel=idle"
        "&include_clients=false"
    )
    with urllib.request.urlopen(url, timeout=60) as response:
        stats = json.load(response)
    (topic,) = stats["topics"]
    (channel,) = topic["channels"]
    return channel["client_count"], stats.get("memory", {})


def run_load(tmp_path, connections: int, seconds: float, heartbeat_ms: int) -> dict:
    old_limits = _raise_fd_limit(connections + 1000)
    try:
        daemon = start_nsqd(tmp_path)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, old_limits)
    swarm = None
    try:
        pid = daemon.process.pid
        swarm = _Swarm(daemon.port("TCP"), connections, heartbeat_ms)
        connect_started = time.monotonic()
        ready = swarm.ready()
        connect_seconds = time.monotonic() - connect_started
        assert ready["subscribed"] == connections, ready
        memory = {"start": _proc_status(pid)}

        stream = _Stream(daemon.port("TCP"), seconds)
        pings: list[float | None] = []
        slow_pings: list[tuple[float, float]] = []  # (seconds into the stream, latency)

        async def pinger(done: trio.Event) -> None:
            started = next_ping = trio.current_time()
            while not done.is_set():
                pings.append(await _ping(daemon.port("HTTP")))
                if pings[-1] is None or pings[-1] > 0.1:
                    slow_pings.append((next_ping - started, pings[-1] or PING_TIMEOUT))
                next_ping += PING_EVERY
                await trio.sleep_until(next_ping)

        async def sample_memory() -> None:
            await trio.sleep(seconds / 2)  # the middle of the paced stream
            memory["middle"] = _proc_status(pid)

        async def main() -> None:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(pinger, stream.all_received)
                nursery.start_soon(sample_memory)
                nursery.start_soon(stream.consume)
                try:
                    await stream.publish()
                except (trio.BrokenResourceError, ConnectionError) as error:
                    stream.errors.append(f"publisher: {error!r}")
                with trio.fail_after(60 + seconds):
                    await stream.all_received.wait()

        trio.run(main)
        memory["end"] = _proc_status(pid)
        swarm_report = swarm.report()
        client_count, memory_stats = _stats_idle(daemon.port("HTTP"))
        answered = [latency for latency in pings if latency is not None]
        figures = {
            "stream_errors": stream.errors,
            "nsqd_errors": [line for line in daemon.lines if "ERROR" in line or "WARN" in line][
                :20
            ],
            "consumer_log": [line for line in daemon.lines if stream.consumer_address in line],
            "connections": connections,
            "heartbeat_ms": heartbeat_ms,
            "connect_seconds": round(connect_seconds, 1),
            "seconds": seconds,
            "published": stream.acknowledged,
            "publish_seconds": round(stream.publish_seconds, 1),
            "received": len(stream.received),
            "deliveries": stream.deliveries,
            "pings": len(pings),
            "pings_unanswered": len(pings) - len(answered),
            "ping_ms": {
                "p50": round(_percentile(answered, 0.5) * 1000, 1),
                "p99": round(_percentile(answered, 0.99) * 1000, 1),
                "max": round(max(answered, default=float("nan")) * 1000, 1),
            },
            "rss_mib": {
                phase: round(values["VmRSS"] / 1024, 1) for phase, values in memory.items()
            },
            "peak_rss_mib": round(memory["end"]["VmHWM"] / 1024, 1),
            "stats_client_count": client_count,
            "nsqd_memory_stats": memory_stats,
            "slow_pings": [
                (round(at, 1), round(latency * 1000)) for at, latency in slow_pings[:30]
            ],
            "swarm": swarm_report,
        }
        print("\nLOAD FIGURES", json.dumps(figures, indent=1))
        return figures
    finally:
        if swarm is not None:
            swarm.close()
        assert daemon.stop(timeout=120) == 0, daemon.log[-5000:]


def assert_load(figures: dict) -> None:
    connections = figures["connections"]
    swarm = figures["swarm"]
    assert figures["stream_errors"] == [], figures
    assert figures["pings_unanswered"] == 0, figures
    assert swarm["dropped"] == 0 and swarm["failed"] == 0, swarm
    assert swarm["alive"] == connections, swarm
    assert figures["stats_client_count"] == connections, figures
    # Every connection heard (and answered) heartbeats all along the run.
    expected_heartbeats = figures["seconds"] * 1000 / figures["heartbeat_ms"]
    assert swarm["min_heartbeats"] >= expected_heartbeats / 2, swarm
    assert figures["published"] == int(RATE * figures["seconds"])
    assert figures["received"] == figures["published"], figures
    rss = figures["rss_mib"]
    assert rss["end"] - rss["middle"] < RSS_GROWTH_BOUND_MIB, rss


def test_2000_idle_connections_and_a_stream_for_10_s(tmp_path):
    assert_load(run_load(tmp_path, 2000, 10.0, heartbeat_ms=1000))


@pytest.mark.slow
@pytest.mark.parametrize("heartbeat_ms", [5000, 1000])
def test_10000_idle_connections_and_a_stream_for_60_s(tmp_path, heartbeat_ms):
    assert_load(run_load(tmp_path, 10_000, 60.0, heartbeat_ms=heartbeat_ms))


if __name__ == "__main__":  # a manual run: CONNECTIONS SECONDS HEARTBEAT_MS
    import tempfile

    with tempfile.TemporaryDirectory() as directory:
        assert_load(run_load(directory, int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])))
    os._exit(0)
