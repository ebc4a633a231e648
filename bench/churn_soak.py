"""A broker that runs for months under a busy day: clients that come and go, topics made and
deleted, a steady stream beneath; whether memory stays flat and nothing is lost.

    .venv/bin/python -m bench.churn_soak [--minutes 10] [--reference ../go/nsqd]
        [--nsqd-args=-workers=2]

Three client processes at once, against one nsqd:

* steady: 2,000 messages a second published (PUB, acknowledged) round the 50 topics `s0`..
  `s49`, each consumed by one long-lived consumer of channel `steady` that FINs everything;
* churn: 100 connections a second, each IDENTIFY, `SUB s<k> churn#ephemeral`, `RDY 5`, FIN
  the messages it gets (up to 3, within 2 s), then half send CLS and FIN what still comes
  until CLOSE_WAIT, half just close;
* lifecycle: every second a topic is created, a consumer subscribes, 10 messages are
  published and consumed, and the topic is deleted while the consumer sends its last 3 FINs
  (nsqd closes the connection; a FIN it refused instead is counted).

Figures: RSS each minute and its growth a minute over the second half, nsqd's CPU per
operation (a publish, a delivery, a connection, a lifecycle step), the median `/stats` (every
10 s), the error frames the clients got (`E_FIN_FAILED` apart), and what the steady consumers
never received of what was acknowledged. With `--reference`, Go's nsqd runs the same right
after, in the same invocation.
"""

import argparse
import multiprocessing
import selectors
import socket
import statistics
import struct
import sys
import threading
import time
import urllib.request

from bench._support import (
    MIB,
    Nsqd,
    Report,
    add_common_arguments,
    banner,
    http_post,
    record_against_reference,
)
from nsqpy.common.command import (
    MAGIC_V2,
    encode_command,
    encode_fin,
    encode_identify,
    encode_pub,
    encode_rdy,
    encode_sub,
)

STEADY_TOPICS = 50
STEADY_RATE = 2000
CHURN_RATE = 100
# Each connection waits for its messages (the steady stream gives a topic 40 a second).
CHURN_THREADS = 16
IDENTIFY = encode_identify({"client_id": "soak", "heartbeat_interval": 30000})
FRAME_RESPONSE, FRAME_ERROR, FRAME_MESSAGE = 0, 1, 2


class Frames:
    """Frames off one socket (blocking or not)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""

    def feed(self) -> bool:
        data = self.sock.recv(256 * 1024)
        if not data:
            return False
        self.buffer += data
        return True

    def pop(self) -> list[tuple[int, bytes]]:
        frames = []
        buffer = self.buffer
        while len(buffer) >= 8:
            size, kind = struct.unpack_from(">ii", buffer)
            if len(buffer) < 4 + size:
                break
            frames.append((kind, buffer[8 : 4 + size]))
            buffer = buffer[4 + size :]
        self.buffer = buffer
        return frames

    def next(self) -> tuple[int, bytes]:
        while True:
            frames = self.pop()
            if frames:
                # One at a time: put the rest back in front.
                first, rest = frames[0], frames[1:]
                self.buffer = b"".join(_encode(kind, data) for kind, data in rest) + self.buffer
                return first
            if not self.feed():
                raise ConnectionError("closed")


def _encode(kind: int, data: bytes) -> bytes:
    return struct.pack(">ii", len(data) + 4, kind) + data


def _connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _count_error(counts: dict, data: bytes) -> None:
    key = "fin_failed" if data.startswith(b"E_FIN_FAILED") else "other_errors"
    counts[key] = counts.get(key, 0) + 1
    if key == "other_errors":
        counts.setdefault("error_samples", []).append(data[:120].decode(errors="replace"))


# -- the client processes ----------------------------------------------------------------------


def steady(port: int, stop, results) -> None:
    """The producer and the 50 consumers; (published, received, counts) at the end."""
    counts: dict = {"published": 0, "received": 0}
    consumers: dict[socket.socket, Frames] = {}
    for index in range(STEADY_TOPICS):
        sock = _connect(port)
        sock.sendall(MAGIC_V2 + IDENTIFY)
        frames = Frames(sock)
        frames.next()
        sock.sendall(encode_sub(f"s{index}", "steady") + encode_rdy(100))
        frames.next()
        sock.setblocking(False)
        consumers[sock] = frames
    draining = threading.Event()

    def consume() -> None:
        selector = selectors.DefaultSelector()
        for sock in consumers:
            selector.register(sock, selectors.EVENT_READ)
        while True:
            if draining.is_set() and counts["received"] >= counts["published"]:
                return
            for key, _mask in selector.select(0.2):
                frames = consumers[key.fileobj]
                if not frames.feed():
                    selector.unregister(key.fileobj)
                    continue
                fins = []
                for kind, data in frames.pop():
                    if kind == FRAME_MESSAGE:
                        counts["received"] += 1
                        fins.append(encode_fin(data[10:26]))
                    elif kind == FRAME_ERROR:
                        _count_error(counts, data)
                    elif data == b"_heartbeat_":
                        fins.append(encode_command("NOP"))
                if fins:
                    key.fileobj.setblocking(True)
                    key.fileobj.sendall(b"".join(fins))
                    key.fileobj.setblocking(False)

    reader = threading.Thread(target=consume, daemon=True)
    reader.start()
    producer = _connect(port)
    producer.sendall(MAGIC_V2 + IDENTIFY)
    answers = Frames(producer)
    answers.next()
    batch = 20
    started = time.monotonic()
    sent = 0
    while not stop.is_set():
        due = started + sent / STEADY_RATE
        delay = due - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        producer.sendall(
            b"".join(
                encode_pub(f"s{(sent + n) % STEADY_TOPICS}", b"m%d" % (sent + n))
                for n in range(batch)
            )
        )
        for _ in range(batch):
            kind, data = answers.next()
            if kind == FRAME_RESPONSE and data == b"OK":
                counts["published"] += 1
            elif kind == FRAME_ERROR:
                _count_error(counts, data)
        sent += batch
    draining.set()
    reader.join(60)
    results.put(("steady", counts))


def churn(port: int, stop, results) -> None:
    """Connections one after another at CHURN_RATE a second, from CHURN_THREADS threads."""
    counts: dict = {"connections": 0, "delivered": 0}
    lock = threading.Lock()
    started = time.monotonic()
    serial = iter(range(1 << 62))

    def one(number: int) -> None:
        sock = _connect(port)
        sock.settimeout(5)
        frames = Frames(sock)
        got: list[tuple[int, bytes]] = []
        try:
            sock.sendall(MAGIC_V2 + IDENTIFY)
            frames.next()
            sock.sendall(
                encode_sub(f"s{number % STEADY_TOPICS}", "churn#ephemeral") + encode_rdy(5)
            )
            frames.next()
            received = 0
            deadline = time.monotonic() + 2
            while received < 3 and time.monotonic() < deadline:
                sock.settimeout(max(0.01, deadline - time.monotonic()))
                try:
                    kind, data = frames.next()
                except TimeoutError:
                    break
                if kind == FRAME_MESSAGE:
                    received += 1
                    sock.sendall(encode_fin(data[10:26]))
                elif kind == FRAME_ERROR:
                    got.append((kind, data))
            if number % 2 == 0:
                # A library consumer's stop: CLS, and the messages already on their way are
                # finished as they come, until CLOSE_WAIT.
                sock.settimeout(5)
                sock.sendall(encode_command("CLS"))
                while True:
                    kind, data = frames.next()
                    if kind == FRAME_ERROR:
                        got.append((kind, data))
                    elif kind == FRAME_MESSAGE:
                        received += 1
                        sock.sendall(encode_fin(data[10:26]))
                    if kind == FRAME_RESPONSE and data == b"CLOSE_WAIT":
                        break
            with lock:
                counts["connections"] += 1
                counts["delivered"] += received
                for _kind, data in got:
                    _count_error(counts, data)
        except OSError:
            with lock:
                counts["broken"] = counts.get("broken", 0) + 1
        finally:
            sock.close()

    def run() -> None:
        while not stop.is_set():
            with lock:
                number = next(serial)
            delay = started + number / CHURN_RATE - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            one(number)

    threads = [threading.Thread(target=run, daemon=True) for _ in range(CHURN_THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    results.put(("churn", counts))


def lifecycle(port: int, http_port: int, stop, results) -> None:
    """A topic made, used and deleted every second."""
    counts: dict = {"topics": 0, "delivered": 0}
    number = 0
    while not stop.is_set():
        begun = time.monotonic()
        topic = f"life{number}"
        number += 1
        http_post(http_port, f"/topic/create?topic={topic}")
        sock = _connect(port)
        sock.settimeout(10)
        frames = Frames(sock)
        try:
            sock.sendall(MAGIC_V2 + IDENTIFY)
            frames.next()
            sock.sendall(encode_sub(topic, "c") + encode_rdy(10))
            frames.next()
            sock.sendall(b"".join(encode_pub(topic, b"life%d" % n) for n in range(10)))
            received = 0
            last_fins = []
            while received < 10:
                kind, data = frames.next()
                if kind == FRAME_MESSAGE:
                    received += 1
                    if received <= 7:
                        sock.sendall(encode_fin(data[10:26]))
                    else:
                        last_fins.append(encode_fin(data[10:26]))
                elif kind == FRAME_ERROR:
                    _count_error(counts, data)
            counts["delivered"] += received
            # The topic goes while its consumer still finishes its last messages (the delete
            # sent first): Go closes the connection, so those FINs are never refused.
            deletion = socket.create_connection(("127.0.0.1", http_port))
            deletion.sendall(
                f"POST /topic/delete?topic={topic} HTTP/1.1\r\nHost: nsqd\r\n"
                "Content-Length: 0\r\nConnection: close\r\n\r\n".encode()
            )
            sock.sendall(b"".join(last_fins))
            while deletion.recv(4096):
                pass
            deletion.close()
            while True:
                kind, data = frames.next()
                if kind == FRAME_ERROR:
                    _count_error(counts, data)
        except (OSError, ConnectionError, EOFError):
            pass
        finally:
            sock.close()
        counts["topics"] += 1
        time.sleep(max(0.0, begun + 1 - time.monotonic()))
    results.put(("lifecycle", counts))


# -- the run -----------------------------------------------------------------------------------


def _stats_ms(http_port: int) -> float:
    begun = time.perf_counter()
    with urllib.request.urlopen(
        f"http://127.0.0.1:{http_port}/stats?format=json", timeout=30
    ) as reply:
        reply.read()
    return (time.perf_counter() - begun) * 1000


def run_once(minutes: float) -> dict:
    seconds = minutes * 60
    with Nsqd() as nsqd:
        for index in range(STEADY_TOPICS):
            http_post(nsqd.http_port, f"/topic/create?topic=s{index}")
        context = multiprocessing.get_context("spawn")
        stop = context.Event()
        results = context.Queue()
        processes = [
            context.Process(target=steady, args=(nsqd.tcp_port, stop, results)),
            context.Process(target=churn, args=(nsqd.tcp_port, stop, results)),
            context.Process(target=lifecycle, args=(nsqd.tcp_port, nsqd.http_port, stop, results)),
        ]
        for process in processes:
            process.start()
        started = time.monotonic()
        cpu_before = nsqd.cpu_seconds()
        rss: list[tuple[float, int]] = []
        stats_times: list[float] = []
        next_stats = started + 10
        while time.monotonic() - started < seconds:
            now = time.monotonic()
            rss.append((now - started, nsqd.memory()["VmRSS"]))
            if now >= next_stats:
                stats_times.append(_stats_ms(nsqd.http_port))
                next_stats += 10
            nsqd.check_alive()
            time.sleep(max(0.0, started + len(rss) * 5 - time.monotonic()))
        stop.set()
        gathered = dict(results.get(timeout=120) for _ in processes)
        for process in processes:
            process.join(30)
        cpu = nsqd.cpu_seconds() - cpu_before
        idle_rss = nsqd.memory()["VmRSS"]
        nsqd.check_alive()
    steady_counts, churn_counts, life_counts = (
        gathered["steady"],
        gathered["churn"],
        gathered["lifecycle"],
    )
    operations = (
        steady_counts["published"]
        + steady_counts["received"]
        + churn_counts["connections"]
        + churn_counts["delivered"]
        + life_counts["topics"] * 23  # create, sub, 10 pubs, 10 deliveries, delete
    )
    half = [sample for sample in rss if sample[0] >= seconds / 2]
    growth = 0.0
    if len(half) >= 2:
        (t0, r0), (t1, r1) = half[0], half[-1]
        growth = (r1 - r0) / MIB / max(t1 - t0, 1e-9) * 60
    per_minute = [r / MIB for t, r in rss if int(t) % 60 < 5]
    errors = {
        name: counts.get(key, 0)
        for name, counts in gathered.items()
        for key in ("fin_failed", "other_errors", "broken")
        if counts.get(key)
        for name in [f"{name}_{key}"]
    }
    samples = [s for counts in gathered.values() for s in counts.get("error_samples", [])[:3]]
    return {
        "rss_per_minute_mib": [round(value, 1) for value in per_minute],
        "rss_growth_mib_per_min": growth,
        "rss_end_mib": rss[-1][1] / MIB,
        "rss_idle_mib": idle_rss / MIB,
        "cpu_us_per_operation": cpu / operations * 1e6 if operations else 0.0,
        "stats_ms_median": statistics.median(stats_times) if stats_times else 0.0,
        "published": steady_counts["published"],
        "lost": max(0, steady_counts["published"] - steady_counts["received"]),
        "churn_connections": churn_counts["connections"],
        "lifecycle_topics": life_counts["topics"],
        "errors": errors,
        "error_samples": samples,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    add_common_arguments(parser, runs=1, reference=True)
    args = parser.parse_args(argv)
    banner(
        "churn soak (bench.churn_soak)",
        f"{args.minutes:g} min: {STEADY_RATE} msgs/s on {STEADY_TOPICS} topics, {CHURN_RATE}"
        " connections/s, a topic made and deleted each second",
    )
    report = Report(args.json)
    record_against_reference(
        report,
        "churn_soak",
        args,
        lambda: run_once(args.minutes),
        lambda label, key: f"soak {args.minutes:g} min, {label}: {key}",
        (
            ("rss_growth_mib_per_min", "MiB/min"),
            ("rss_end_mib", "MiB"),
            ("cpu_us_per_operation", "µs"),
            ("stats_ms_median", "ms"),
            ("lost", "msgs"),
        ),
    )
    report.write()


if __name__ == "__main__":
    main(sys.argv[1:])
