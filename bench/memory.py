"""nsqd's resident memory with 1,000,000 messages queued and no consumer.

    .venv/bin/python -m bench.memory [--count 1000000] [--runs 3] [--quick]

Every run starts a fresh nsqd, notes its VmRSS when idle, publishes ``--count`` messages of
``--size`` bytes over 4 TCP connections (MPUB batches of 200, bench/_clients.py), checks with
`/stats` that the topic holds them all, waits ``--settle`` seconds and reads VmRSS (resident
now) and VmHWM (the peak) from /proc/<pid>/status. Variants:

* **no channel, default --mem-queue-size 10000**: the topic keeps 10,000 messages in memory,
  the rest in its diskqueue (the target: RSS ≤ 64 MiB; Go nsqd: ~16 MiB);
* **1 channel without consumer, default**: the same in the channel (the usual way messages
  pile up: a consumer is away);
* **no channel, --mem-queue-size 1000000**: all of them in memory, for context (what one
  queued message costs in Python objects).
"""

import argparse
import multiprocessing
import statistics
import sys
import time
from dataclasses import dataclass

from bench import _clients
from bench._support import (
    MIB,
    TARGETS,
    Nsqd,
    Record,
    Report,
    add_common_arguments,
    banner,
    load_average,
    load_range,
    runs_of,
    spread,
    verdict,
)
from bench.pub_sub import Params, publish

TOPIC = "bench_memory"
CHANNEL = "bench_channel"


@dataclass(frozen=True)
class Variant:
    label: str
    mem_queue_size: int | None  # None: nsqd's default
    channel: bool
    target: str | None


VARIANTS = [
    Variant("no channel, default --mem-queue-size 10000", None, False, "rss"),
    Variant("1 channel without consumer, default --mem-queue-size 10000", None, True, "rss"),
    Variant("no channel, --mem-queue-size 1000000 (all in memory)", 1_000_000, False, None),
]


@dataclass
class Sample:
    idle: int  # bytes
    rss: int
    peak: int
    depth: int
    publish_rate: float
    load: float


def queued(nsqd, variant: Variant) -> int:
    stats = nsqd.stats(TOPIC)["topics"][0]
    return stats["channels"][0]["depth"] if variant.channel else stats["depth"]


def measure(context, variant: Variant, count: int, size: int, settle: float) -> Sample:
    flags = [] if variant.mem_queue_size is None else [f"-mem-queue-size={variant.mem_queue_size}"]
    with Nsqd(flags) as nsqd:
        idle = nsqd.memory()["VmRSS"]
        params = Params(count=count, size=size, topic=TOPIC, channel=CHANNEL)
        if variant.channel:
            _clients.create_channel(nsqd.port, TOPIC, CHANNEL)
        published = publish(nsqd, context, params, 4)
        # The topic hands its messages to the channel in the background (Go's messagePump, to
        # the channel's diskqueue past --mem-queue-size): wait until all of them are there.
        deadline = time.monotonic() + 120
        while (depth := queued(nsqd, variant)) != published.messages:
            nsqd.check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError(f"{published.messages:,} published but {depth:,} queued")
            time.sleep(0.1)
        time.sleep(settle)
        nsqd.check_alive()
        memory = nsqd.memory()
    return Sample(idle, memory["VmRSS"], memory["VmHWM"], depth, published.rate, load_average())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=1_000_000, help="messages queued")
    parser.add_argument("--size", type=int, default=200, help="message body bytes")
    parser.add_argument("--settle", type=float, default=1.0, help="seconds before reading RSS")
    add_common_arguments(parser)
    args = parser.parse_args(argv)
    runs = runs_of(args)
    context = multiprocessing.get_context("spawn")
    started = time.monotonic()
    banner(
        "memory",
        f"VmRSS of nsqd with {args.count:,} messages of {args.size} bytes queued, no consumer,"
        f" {runs} run(s) per variant",
    )
    report = Report(args.json)
    rows = []
    for variant in VARIANTS:
        samples = []
        for _ in range(runs):
            sample = measure(context, variant, args.count, args.size, args.settle)
            samples.append(sample)
            print(
                f"  {variant.label}: RSS {sample.rss / MIB:.1f} MiB (idle {sample.idle / MIB:.1f},"
                f" peak {sample.peak / MIB:.1f}), {sample.depth:,} queued,"
                f" published at {sample.publish_rate:,.0f} msgs/s",
                flush=True,
            )
        loads = [s.load for s in samples]
        rss = [s.rss / MIB for s in samples]
        per_message = statistics.median((s.rss - s.idle) / s.depth for s in samples)
        rows.append(
            f"| {variant.label} | {spread(rss, '.1f')} |"
            f" {spread([s.idle / MIB for s in samples], '.1f')} |"
            f" {spread([s.peak / MIB for s in samples], '.1f')} | {per_message:.0f} |"
            f" {statistics.median(s.publish_rate for s in samples):,.0f} | {load_range(loads)} |"
        )
        report.add(
            Record(
                "memory",
                f"RSS, {args.count:,} queued, {variant.label}",
                "MiB",
                rss,
                loads,
                variant.target,
                {
                    "idle MiB": round(statistics.median(s.idle / MIB for s in samples), 1),
                    "peak MiB": round(statistics.median(s.peak / MIB for s in samples), 1),
                    "bytes/msg over idle": round(per_message),
                },
            )
        )
    print()
    print(
        "| variant | RSS MiB median (min–max) | idle RSS MiB | peak RSS (VmHWM) MiB |"
        " bytes/msg over idle | publish msgs/s | load avg |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    print("\n".join(rows))
    for record in report.records:
        if record.target:
            print(f"  {record.workload}: {verdict(record.median, TARGETS[record.target])}")
    report.write()
    print(f"\nmemory: done in {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main(sys.argv[1:])
