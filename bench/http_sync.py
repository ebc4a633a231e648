"""Durable publishing over HTTP and over TCP, and what it does to everyone else's `/ping`.

    .venv/bin/python -m bench.http_sync [--publishers 8] [--duration 5] [--runs 3]

nsqd runs with `--sync-every=1 --mem-queue-size=0`: every message goes to its topic's diskqueue
and is fsynced before it is acknowledged. `--publishers` processes each publish to a topic of
their own, one message per request and one request outstanding, for `--duration` seconds,
while another process asks `GET /ping` every 10 ms on a connection of its own and times each
answer. Two variants: the publishers use `POST /pub` (keep-alive) or TCP `PUB` (one command,
then its `OK`). Figures per variant: messages/s acknowledged, and the `/ping` p50/p99/max.
"""

import argparse
import multiprocessing
import socket
import statistics
import struct
import time

from bench._support import Nsqd, git_revision, load_average, machine, today

PING_INTERVAL = 0.01
BODY = b"x" * 200


def _http_publisher(port: int, topic: str, stop_at: float, results) -> None:
    sock = socket.create_connection(("127.0.0.1", port))
    request = (
        f"POST /pub?topic={topic} HTTP/1.1\r\nHost: bench\r\nContent-Length: {len(BODY)}\r\n\r\n"
    ).encode() + BODY
    count = 0
    buffer = b""
    while time.monotonic() < stop_at:
        sock.sendall(request)
        while b"\r\n\r\nOK" not in buffer:
            buffer += sock.recv(65536)
        buffer = buffer[buffer.index(b"\r\n\r\nOK") + 6 :]
        count += 1
    results.put(count)


def _tcp_publisher(port: int, topic: str, stop_at: float, results) -> None:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(b"  V2")
    command = f"PUB {topic}\n".encode() + struct.pack(">i", len(BODY)) + BODY
    ok = struct.pack(">ii", 6, 0) + b"OK"
    count = 0
    buffer = b""
    while time.monotonic() < stop_at:
        sock.sendall(command)
        while len(buffer) < len(ok):
            buffer += sock.recv(65536)
        assert buffer[: len(ok)] == ok, buffer
        buffer = buffer[len(ok) :]
        count += 1
    results.put(count)


def _pinger(port: int, stop_at: float, results) -> None:
    sock = socket.create_connection(("127.0.0.1", port))
    request = b"GET /ping HTTP/1.1\r\nHost: bench\r\n\r\n"
    latencies = []
    buffer = b""
    while time.monotonic() < stop_at:
        started = time.perf_counter()
        sock.sendall(request)
        while b"\r\n\r\nOK" not in buffer:
            buffer += sock.recv(65536)
        latencies.append(time.perf_counter() - started)
        buffer = buffer[buffer.index(b"\r\n\r\nOK") + 6 :]
        time.sleep(PING_INTERVAL)
    results.put(latencies)


def run(variant: str, publishers: int, duration: float) -> dict:
    context = multiprocessing.get_context("spawn")
    with Nsqd(["--sync-every=1", "--mem-queue-size=0"]) as nsqd:
        counts = context.Queue()
        pings = context.Queue()
        start = time.monotonic() + 1.0  # let every process connect first
        stop_at = start + duration
        target = _http_publisher if variant == "http" else _tcp_publisher
        port = nsqd.http_port if variant == "http" else nsqd.tcp_port
        processes = [
            context.Process(target=target, args=(port, f"t{n}", stop_at, counts))
            for n in range(publishers)
        ]
        processes.append(context.Process(target=_pinger, args=(nsqd.http_port, stop_at, pings)))
        for process in processes:
            process.start()
        total = sum(counts.get(timeout=duration + 60) for _ in range(publishers))
        latencies = sorted(pings.get(timeout=duration + 60))
        for process in processes:
            process.join()
        wall = time.monotonic() - start
        nsqd.check_alive()
    quantiles = statistics.quantiles(latencies, n=100)
    return {
        "msgs_per_s": total / wall,
        "ping_p50_ms": quantiles[49] * 1000,
        "ping_p99_ms": quantiles[98] * 1000,
        "ping_max_ms": latencies[-1] * 1000,
        "pings": len(latencies),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--publishers", type=int, default=8)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    print(f"http_sync: {today()}, commit {git_revision()}, {machine()}, load {load_average():.2f}")
    print(f"{args.publishers} publishers, {args.duration:.0f} s, --sync-every=1 --mem-queue-size=0")
    print("| variant | run | msgs/s | /ping p50 ms | p99 ms | max ms |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for variant in ("http", "tcp"):
        for number in range(1, args.runs + 1):
            figures = run(variant, args.publishers, args.duration)
            print(
                f"| {variant} | {number} | {figures['msgs_per_s']:,.0f} "
                f"| {figures['ping_p50_ms']:.2f} | {figures['ping_p99_ms']:.2f} "
                f"| {figures['ping_max_ms']:.2f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
