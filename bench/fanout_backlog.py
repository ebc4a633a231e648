"""Fan-out into a backlog: what a topic with many channels costs its publisher when nothing is
consumed (every channel keeps its copy, most of it on disk past `--mem-queue-size`).

    .venv/bin/python -m bench.fanout_backlog [--channels 1,10,100] [--count 200000]
        [--runs 1] [--reference ../go/nsqd]

One publisher, MPUB of 100 messages of 100 B, 8 in flight, into a topic whose C channels were
made over HTTP first; nsqd's defaults (`--mem-queue-size=10000`). Figures: the publisher's
rate (acknowledged messages a second), the end-to-end rate (messages over the time until
every channel's depth holds all of them, from `/stats`), and nsqd's RSS then. With
`--reference`, Go's nsqd (or another tree's) runs the same right after, in the same
invocation.
"""

import argparse
import socket
import struct
import sys
import time

from bench._support import (
    MIB,
    Nsqd,
    Report,
    add_common_arguments,
    banner,
    http_post,
    record_against_reference,
    runs_of,
)
from nsqpy.common.command import MAGIC_V2, encode_mpub

TOPIC = "fan"
BATCH = 100
IN_FLIGHT = 8


def _read_answers(sock: socket.socket, buffer: bytearray, count: int) -> None:
    """`count` frames, each checked to be OK."""
    while count:
        while len(buffer) < 4 or len(buffer) < 4 + struct.unpack_from(">i", buffer)[0]:
            data = sock.recv(65536)
            if not data:
                raise ConnectionError("closed")
            buffer += data
        size = struct.unpack_from(">i", buffer)[0]
        frame = bytes(buffer[4 : 4 + size])
        del buffer[: 4 + size]
        if frame != b"\x00\x00\x00\x00OK":
            raise RuntimeError(f"MPUB answered {frame!r}")
        count -= 1


def _depths(nsqd: Nsqd) -> list[int]:
    topics = nsqd.stats(TOPIC)["topics"]
    return [channel["depth"] for channel in topics[0]["channels"]] if topics else []


def run_once(channels: int, count: int) -> dict:
    with Nsqd() as nsqd:
        http_post(nsqd.http_port, f"/topic/create?topic={TOPIC}")
        for index in range(channels):
            http_post(nsqd.http_port, f"/channel/create?topic={TOPIC}&channel=c{index}")
        command = encode_mpub(TOPIC, [b"x" * 100] * BATCH)
        batches = count // BATCH
        sock = socket.create_connection(("127.0.0.1", nsqd.tcp_port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(MAGIC_V2)
        buffer = bytearray()
        started = time.perf_counter()
        sent = answered = 0
        while answered < batches:
            ahead = min(IN_FLIGHT - (sent - answered), batches - sent)
            if ahead:
                sock.sendall(command * ahead)
                sent += ahead
            _read_answers(sock, buffer, 1)
            answered += 1
        published = time.perf_counter() - started
        sock.close()
        while not (depths := _depths(nsqd)) or min(depths) < batches * BATCH:
            time.sleep(0.05)
        end_to_end = time.perf_counter() - started
        nsqd.check_alive()
        rss = nsqd.memory()["VmRSS"] / MIB
    total = batches * BATCH
    return {
        "publish_msgs_per_s": total / published,
        "end_to_end_msgs_per_s": total / end_to_end,
        "rss_mib": rss,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--channels", default="1,10,100", help="comma-separated counts")
    parser.add_argument("--count", type=int, default=200_000)
    add_common_arguments(parser, runs=1, reference=True)
    args = parser.parse_args(argv)
    runs = runs_of(args)
    sizes = [int(size) for size in args.channels.split(",")]
    banner(
        "fan-out into a backlog (bench.fanout_backlog)",
        f"{args.count:,} x 100 B by MPUB of {BATCH}, C = {args.channels} channels, nothing"
        f" consumed; {runs} run(s)",
    )
    report = Report(args.json)
    for size in sizes:
        record_against_reference(
            report,
            "fanout_backlog",
            args,
            lambda size=size: run_once(size, args.count),
            lambda label, key, size=size: f"C={size}, {label}: {key}",
            (
                ("publish_msgs_per_s", "msgs/s"),
                ("end_to_end_msgs_per_s", "msgs/s"),
                ("rss_mib", "MiB"),
            ),
            label=f"C={size} ",
        )
    report.write()


if __name__ == "__main__":
    main(sys.argv[1:])
