"""Log topics (docs/design.md §13) against classic topics, in the same run.

    .venv/bin/python -m bench.log_topic [--count 1000000] [--backlog 10000000] [--runs 3]
                                        [--quick]

* **publish / consume**: bench.pub_sub's workloads (MPUB batches of 200 × 200-byte messages,
  RDY 2500 with batched FINs) on a classic topic and on partition 0 of a log topic
  (`/topic/create?partition_num=1`), alternating, each run on a fresh nsqd with nsqd's
  defaults; the figure is log ÷ classic.
* **restart**: a log topic with ``--backlog`` messages (2 GB at the default 10,000,000 of 200
  bytes) and a channel that has read none of them; nsqd is stopped cleanly and started again on
  the same data path; the time from starting the process to the first message delivered to a
  consumer, and nsqd's RSS then and after 100,000 more deliveries.
* **range fetch**: `/partition/fetch` from the start of that log to its end, 4 MiB per request
  on one keep-alive connection, records counted by walking their size prefixes: msgs/s to one
  reader.
"""

import argparse
import http.client
import multiprocessing
import socket
import struct
import sys
import tempfile
import time
import urllib.request

from bench import _clients
from bench._support import Nsqd, Record, Report, add_common_arguments, banner, runs_of, spread
from bench.pub_sub import Params, consume, fill, publish
from nsqpy.common.command import MAGIC_V2, encode_rdy, encode_sub
from nsqpy.common.frame import FRAME_TYPE_MESSAGE, FrameDecoder

TOPIC = "bench_topic"
_SIZE = struct.Struct(">I")


def create_log_topic(nsqd: Nsqd, topic: str = TOPIC) -> None:
    request = urllib.request.Request(
        f"http://127.0.0.1:{nsqd.http_port}/topic/create?topic={topic}&partition_num=1",
        method="POST",
        data=b"",
    )
    urllib.request.urlopen(request, timeout=30).read()


def publish_consume(context, params: Params, log: bool) -> tuple[float, float]:
    """(publish msgs/s with no channel, consume msgs/s) on fresh nsqds."""
    with Nsqd() as nsqd:
        if log:
            create_log_topic(nsqd)
        published = publish(nsqd, context, params, 1).rate
    with Nsqd() as nsqd:
        if log:
            create_log_topic(nsqd)
        queued = fill(nsqd, context, params, 4).messages
        consumed = consume(nsqd, context, params, 1, queued).rate
    return published, consumed


def first_delivery(port: int, timeout: float = 120) -> None:
    """SUB the backlog's channel, RDY 1, and wait for one message."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    sock.sendall(MAGIC_V2 + encode_sub(TOPIC, "backlog") + encode_rdy(1))
    decoder = FrameDecoder()
    while True:
        data = sock.recv(65536)
        if not data:
            raise ConnectionError("nsqd closed the connection")
        if any(f.frame_type == FRAME_TYPE_MESSAGE for f in decoder.receive_data(data)):
            sock.close()
            return


def drain(port: int, count: int) -> None:
    """Receive and FIN `count` messages of the backlog's channel, RDY 2500."""
    context = multiprocessing.get_context("spawn")
    total = context.Value("q", 0)
    barrier = context.Barrier(1)
    results = context.Queue()
    _clients.consumer(port, TOPIC, "backlog", 2500, count, total, barrier, results)


def range_fetch(http_port: int) -> tuple[int, float]:
    """Fetch the whole partition; (messages, seconds)."""
    connection = http.client.HTTPConnection("127.0.0.1", http_port, timeout=60)
    offset = 0
    messages = 0
    started = time.monotonic()
    while True:
        connection.request(
            "GET", f"/partition/fetch?topic={TOPIC}&partition=0&offset={offset}&max_bytes=4194304"
        )
        response = connection.getresponse()
        data = response.read()
        if response.status != 200:
            raise RuntimeError(f"fetch failed: {response.status} {data[:200]!r}")
        if not data:
            break
        at = 0
        unpack = _SIZE.unpack_from
        while at < len(data):
            at += 4 + unpack(data, at)[0]
            messages += 1
        offset = int(response.getheader("X-NSQ-Next-Offset"))
    elapsed = time.monotonic() - started
    connection.close()
    return messages, elapsed


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=1_000_000, help="messages per pub/sub run")
    parser.add_argument("--backlog", type=int, default=10_000_000, help="messages for restart")
    add_common_arguments(parser)
    args = parser.parse_args(argv)
    runs = runs_of(args)
    backlog = 1_000_000 if args.quick and args.backlog == 10_000_000 else args.backlog
    params = Params(count=args.count)
    context = multiprocessing.get_context("spawn")
    started = time.monotonic()
    banner(
        "log_topic (bench.log_topic)",
        f"{args.count:,} messages of 200 bytes per pub/sub run, {runs} run(s) alternating"
        f" classic and log; restart with a backlog of {backlog:,}",
    )
    report = Report(args.json)
    rates: dict[str, list[float]] = {name: [] for name in ("pc", "cc", "pl", "cl")}
    for run in range(runs):
        classic = publish_consume(context, params, log=False)
        log = publish_consume(context, params, log=True)
        rates["pc"].append(classic[0])
        rates["cc"].append(classic[1])
        rates["pl"].append(log[0])
        rates["cl"].append(log[1])
        print(
            f"  run {run + 1}: publish classic {classic[0]:,.0f}, log {log[0]:,.0f};"
            f" consume classic {classic[1]:,.0f}, log {log[1]:,.0f} msgs/s",
            flush=True,
        )
    for kind, classic_key, log_key in (("publish", "pc", "pl"), ("consume", "cc", "cl")):
        ratios = [lo / cl for lo, cl in zip(rates[log_key], rates[classic_key], strict=True)]
        for label, key in (("classic topic", classic_key), ("log topic", log_key)):
            report.add(
                Record(
                    bench="log_topic",
                    workload=f"TCP {kind} x1, {label}",
                    unit="msgs/s",
                    values=rates[key],
                    loads=[0.0] * runs,
                )
            )
        report.add(
            Record(
                bench="log_topic",
                workload=f"TCP {kind}: log ÷ classic (same run)",
                unit="×",
                values=ratios,
                loads=[0.0] * runs,
                notes={"target": "≥ 0.9"},
            )
        )
        print(f"  {kind}: log ÷ classic {spread(ratios, '.2f')}")

    data_path = tempfile.mkdtemp(prefix="nsqpy-bench-log-")
    with Nsqd(data_path=data_path) as nsqd:
        create_log_topic(nsqd)
        _clients.create_channel(nsqd.port, TOPIC, "backlog")
        fill_started = time.monotonic()
        publish(nsqd, context, Params(count=backlog), 4)
        print(f"  backlog of {backlog:,} written in {time.monotonic() - fill_started:.0f} s")
        nsqd.terminate()
    launched = time.monotonic()
    with Nsqd(data_path=data_path) as nsqd:
        first_delivery(nsqd.port)
        restart = time.monotonic() - launched
        rss_first = nsqd.memory()["VmRSS"] / 2**20
        drain(nsqd.port, 100_000)
        rss_after = nsqd.memory()["VmRSS"] / 2**20
        messages, elapsed = range_fetch(nsqd.http_port)
        nsqd.keep_data = False
    print(
        f"  restart to first delivery {restart:.2f} s; RSS {rss_first:.1f} MiB, after 100,000"
        f" deliveries {rss_after:.1f} MiB; range fetch {messages / elapsed:,.0f} msgs/s"
        f" ({messages:,} in {elapsed:.1f} s)"
    )
    for workload, unit, value in (
        (f"restart to first delivery, backlog {backlog:,}", "s", restart),
        (f"RSS at first delivery, backlog {backlog:,}", "MiB", rss_first),
        (f"RSS after 100,000 deliveries, backlog {backlog:,}", "MiB", rss_after),
        ("range fetch, one reader, 4 MiB requests", "msgs/s", messages / elapsed),
    ):
        report.add(Record("log_topic", workload, unit, [value], [0.0]))
    report.write()
    print(f"\nlog_topic: done in {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main(sys.argv[1:])
