"""What a message held deferred in memory costs: RSS a DPUB'd message adds beyond its body.

    .venv/bin/python -m bench.deferred_memory [--count 100000] [--runs 1]
        [--reference ../go/nsqd]

A classic topic with one channel, `--mem-queue-size=1000000`; `--count` DPUBs of 100 B with
an hour's delay, pipelined a thousand at a time, each acknowledged. Figure: nsqd's RSS growth
over them (after a thousand first, so start-up's own growth is out), divided by the count,
less the 100 B body. With `--reference`, Go's nsqd (or another tree's) runs the same right
after, in the same invocation.
"""

import argparse
import socket
import sys
import time

from bench._support import (
    Nsqd,
    Report,
    add_common_arguments,
    banner,
    http_post,
    record_against_reference,
    runs_of,
)
from nsqpy.common.command import MAGIC_V2, encode_dpub

BODY = b"x" * 100
BATCH = 1000


def _acknowledge(sock: socket.socket, count: int) -> None:
    seen = b""
    while seen.count(b"OK") < count:
        data = sock.recv(65536)
        if not data:
            raise ConnectionError("closed")
        seen += data


def run_once(count: int) -> dict:
    with Nsqd(["-mem-queue-size=1000000"]) as nsqd:
        for path in ("/topic/create?topic=t", "/channel/create?topic=t&channel=c"):
            http_post(nsqd.http_port, path)
        sock = socket.create_connection(("127.0.0.1", nsqd.tcp_port))
        sock.sendall(MAGIC_V2)
        batch = encode_dpub("t", 3_600_000, BODY) * BATCH
        sock.sendall(batch)
        _acknowledge(sock, BATCH)
        time.sleep(1)
        before = nsqd.memory()["VmRSS"]
        for _ in range(count // BATCH):
            sock.sendall(batch)
            _acknowledge(sock, BATCH)
        time.sleep(2)
        after = nsqd.memory()["VmRSS"]
        nsqd.check_alive()
        sock.close()
    return {"bytes_beyond_body": (after - before) / (count // BATCH * BATCH) - len(BODY)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=100_000)
    add_common_arguments(parser, runs=1, reference=True)
    args = parser.parse_args(argv)
    runs = runs_of(args)
    banner(
        "deferred memory (bench.deferred_memory)",
        f"{args.count:,} DPUBs of 100 B, an hour's delay, one channel; {runs} run(s)",
    )
    report = Report(args.json)
    record_against_reference(
        report,
        "deferred_memory",
        args,
        lambda: run_once(args.count),
        lambda label, _key: f"deferred message, {label}: bytes beyond its body",
        (("bytes_beyond_body", "B"),),
    )
    report.write()


if __name__ == "__main__":
    main(sys.argv[1:])
