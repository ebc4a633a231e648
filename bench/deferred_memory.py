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
import json
import os
import socket
import sys
import time
import urllib.request

from bench._support import (
    REFERENCE_NSQD,
    Nsqd,
    Record,
    Report,
    add_common_arguments,
    banner,
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
            request = urllib.request.Request(
                f"http://127.0.0.1:{nsqd.http_port}{path}", method="POST"
            )
            urllib.request.urlopen(request, timeout=30).read()
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
    parser.add_argument("--reference", default="", help="another nsqd to run the same workload")
    add_common_arguments(parser, runs=1)
    args = parser.parse_args(argv)
    runs = runs_of(args)
    banner(
        "deferred memory (bench.deferred_memory)",
        f"{args.count:,} DPUBs of 100 B, an hour's delay, one channel; {runs} run(s)",
    )
    report = Report(args.json)
    servers = [("nsqpy", "")]
    if args.reference:
        servers.append(("reference", os.path.abspath(args.reference)))
    figures: dict[str, list[dict]] = {name: [] for name, _path in servers}
    for _run in range(runs):
        for name, path in servers:
            if path:
                os.environ[REFERENCE_NSQD] = path
            else:
                os.environ.pop(REFERENCE_NSQD, None)
            result = run_once(args.count)
            figures[name].append(result)
            print(f"  {name}: {json.dumps({k: round(v, 1) for k, v in result.items()})}")
    os.environ.pop(REFERENCE_NSQD, None)
    load = [os.getloadavg()[0]] * runs
    for name, results in figures.items():
        report.add(
            Record(
                "deferred_memory",
                f"deferred message, {name}: bytes beyond its body",
                "B",
                [result["bytes_beyond_body"] for result in results],
                load,
            )
        )
    report.write()


if __name__ == "__main__":
    main(sys.argv[1:])
