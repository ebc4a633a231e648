"""One topic of several partitions, each with its own publisher and consumer: what `--workers`
gives a partitioned topic, whose partitions go round the workers (docs/design.md §15).

    .venv/bin/python -m bench.partitions [--partitions 4] [--count 400000]
        [--nsqd-args="-workers=2"] [--runs 3] [--quick]

Every run starts a fresh nsqd (``--mem-queue-size`` 1,000,000, as bench.pub_sub), creates the
topic with ``/topic/create?partition_num=N``, and starts one consumer per partition (Youzan's
`SUB topic channel partition`, RDY 2500) and one publisher per partition (`MPUB topic
partition`, batches of 200, 8 outstanding), each a process of its own (bench/_clients.py),
released together. Figures: ``--count`` messages over the time to the last publisher's last
answer (published) and to the last consumer's last message (consumed), with nsqd's CPU (the
supervisor and its workers) over the window.
"""

import argparse
import multiprocessing
import sys
import urllib.request
from dataclasses import dataclass

from bench import _clients
from bench._support import (
    Nsqd,
    Report,
    add_common_arguments,
    add_rates,
    banner,
    run_clients,
    runs_of,
)

TOPIC = "bench_partitions"
BATCH = 200


@dataclass
class Sample:
    published: float  # msgs/s, all publishers
    consumed: float  # msgs/s, all consumers
    nsqd_cpu: float
    client_cpu: float
    wall: float
    load: float


def run_once(nsqd: Nsqd, context, partitions: int, count: int, size: int, rdy: int) -> Sample:
    create = f"http://127.0.0.1:{nsqd.http_port}/topic/create?topic={TOPIC}"
    urllib.request.urlopen(
        urllib.request.Request(f"{create}&partition_num={partitions}", method="POST"), timeout=30
    ).close()
    batches = count // partitions // BATCH
    each = batches * BATCH
    counters = [context.Value("q", 0) for _ in range(partitions)]
    jobs: list[tuple] = [
        (_clients.consumer, (nsqd.port, (TOPIC, partition), "ch", rdy, each, counter))
        for partition, counter in enumerate(counters)
    ]
    jobs += [
        (_clients.publisher, (nsqd.port, (TOPIC, partition), batches, BATCH, size, 8))
        for partition in range(partitions)
    ]
    run = run_clients(nsqd, context, jobs)
    # Consumers: (received, start, last, cpu, chunks); publishers: (messages, start, end, cpu, 0).
    consumers, publishers = run.results[:partitions], run.results[partitions:]
    for result in consumers:
        if result[0] != each:
            raise RuntimeError(f"a partition's consumer received {result[0]:,} of {each:,}")
    start = min(run.column(1))
    total = each * partitions
    last = max(result[2] for result in consumers)
    return Sample(
        published=total / (max(result[2] for result in publishers) - start),
        consumed=total / (last - start),
        nsqd_cpu=run.window.nsqd_cpu,
        client_cpu=sum(run.column(3)),
        wall=last - start,
        load=run.window.load,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--count", type=int, default=400_000, help="messages, all partitions")
    parser.add_argument("--size", type=int, default=200, help="message body bytes")
    parser.add_argument("--rdy", type=int, default=2500)
    parser.add_argument("--nsqd-args", default="", help="more nsqd flags")
    parser.add_argument("--name", default="", help="a suffix for the figures' names")
    add_common_arguments(parser)
    args = parser.parse_args(argv)
    flags = ["-mem-queue-size=1000000", *args.nsqd_args.split()]
    context = multiprocessing.get_context("spawn")
    banner(
        "partitions",
        f"1 topic of {args.partitions} partitions, a publisher and a consumer each,"
        f" {args.count:,} messages of {args.size} bytes, nsqd {' '.join(flags)}",
    )
    samples: list[Sample] = []
    for _ in range(runs_of(args)):
        with Nsqd(flags) as nsqd:
            sample = run_once(nsqd, context, args.partitions, args.count, args.size, args.rdy)
        samples.append(sample)
        print(
            f"  published {sample.published:,.0f} msgs/s, consumed {sample.consumed:,.0f}"
            f" msgs/s; nsqd CPU/wall {sample.nsqd_cpu / sample.wall:.2f}, clients"
            f" {sample.client_cpu / sample.wall:.2f}",
            flush=True,
        )
    report = Report(args.json)
    name = f"1 topic of {args.partitions} partitions, a publisher and a consumer each"
    if args.name:
        name += f", {args.name}"
    add_rates(report, "partitions", name, samples)
    report.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
