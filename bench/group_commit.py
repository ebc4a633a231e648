"""Group commit of a log topic that fsyncs every publish (Youzan's `syncdisk=1`).

    .venv/bin/python -m bench.group_commit [--publishers 1,8,32] [--seconds 5] [--runs 3]

Each publisher is a connection that sends one PUB of a 200-byte message, waits for its OK and
sends the next: the latency-bound producer that a fsync per publish hurts most. nsqd runs with
`--sync-every=1 --log-topic=*`, so every acknowledged message was fsynced first. The figures:
acknowledged msgs/s for all publishers together, and messages per group (index entries
written, from the size of the partition's commit-log index): how many waiting publishes each
write and fsync carried.
"""

import argparse
import os
import socket
import sys
import threading
import time

from bench._support import Nsqd, Record, Report, add_common_arguments, banner, runs_of, spread
from nsqpy.common.command import MAGIC_V2, encode_pub
from nsqpy.partition_log import ENTRY

TOPIC = "bench_group"
BODY = b"x" * 200
OK_FRAME_SIZE = 4 + 4 + 2  # [size][frame type]OK


def publish_until(port: int, deadline: float, counts: list[int], slot: int) -> None:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(MAGIC_V2)
    command = encode_pub(TOPIC, BODY)
    sent = 0
    while time.monotonic() < deadline:
        sock.sendall(command)
        reply = b""
        while len(reply) < OK_FRAME_SIZE:
            data = sock.recv(OK_FRAME_SIZE - len(reply))
            if not data:
                raise ConnectionError("nsqd closed the connection")
            reply += data
        if not reply.endswith(b"OK"):
            raise RuntimeError(f"publish refused: {reply!r}")
        sent += 1
    counts[slot] = sent
    sock.close()


def run(publishers: int, seconds: float) -> tuple[float, float]:
    """(acknowledged msgs/s, messages per index entry) on a fresh nsqd."""
    with Nsqd(["-sync-every=1", "-log-topic=*"]) as nsqd:
        # The topic exists before the clock starts.
        publish_until(nsqd.tcp_port, 0, [0], 0)
        counts = [0] * publishers
        deadline = time.monotonic() + seconds
        started = time.monotonic()
        threads = [
            threading.Thread(target=publish_until, args=(nsqd.tcp_port, deadline, counts, slot))
            for slot in range(publishers)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        elapsed = time.monotonic() - started
        index = os.path.join(nsqd.data_path, TOPIC, f"{TOPIC}_0.commit.log")
        entries = os.path.getsize(index) // ENTRY.size
    total = sum(counts)
    return total / elapsed, total / max(entries, 1)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--publishers", default="1,8,32", help="connections, comma-separated")
    parser.add_argument("--seconds", type=float, default=5.0, help="publishing time per run")
    add_common_arguments(parser)
    args = parser.parse_args(argv)
    runs = runs_of(args)
    counts = [int(value) for value in args.publishers.split(",")]
    banner(
        "group_commit (bench.group_commit)",
        f"PUB then wait for OK, 200-byte messages, --sync-every=1 log topic, {args.seconds:g} s"
        f" per run, {runs} run(s) per publisher count",
    )
    report = Report(args.json)
    for publishers in counts:
        rates, groups = [], []
        for _ in range(runs):
            rate, group = run(publishers, args.seconds)
            rates.append(rate)
            groups.append(group)
        print(
            f"  {publishers} publisher(s): {spread(rates, ',.0f')} msgs/s acknowledged,"
            f" {spread(groups, '.1f')} messages per group",
            flush=True,
        )
        report.add(
            Record(
                bench="group_commit",
                workload=f"PUB and wait, sync every message, {publishers} publisher(s)",
                unit="msgs/s",
                values=rates,
                loads=[0.0] * runs,
            )
        )
        report.add(
            Record(
                bench="group_commit",
                workload=f"messages per group (index entry), {publishers} publisher(s)",
                unit="msgs",
                values=groups,
                loads=[0.0] * runs,
            )
        )
    report.write()


if __name__ == "__main__":
    main(sys.argv[1:])
