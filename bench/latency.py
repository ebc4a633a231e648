"""Publish → delivery latency at a steady, low rate: p50, p99 and max.

    .venv/bin/python -m bench.latency [--rate 100] [--duration 10] [--runs 3] [--quick]

Every run starts a fresh nsqd (its defaults otherwise). One consumer SUBs (after an IDENTIFY
when the variant sets one) and sends its RDY; then one publisher PUBs ``--rate`` messages a
second for ``--duration`` seconds on a fixed schedule, each body holding the publisher's
time.monotonic_ns() taken just before the send (CLOCK_MONOTONIC is one clock for all
processes of the machine). The consumer notes, for each message, the time from that stamp to
the receive that brought it, and FINs it at once. Both are separate processes.

Variants (each a figure of its own):

* **RDY 1, output_buffer_timeout -1**: the client asks for no output buffering at all;
* **RDY 1, default 250 ms output buffer timeout**: with RDY 1 Go nsqd flushes after each
  message anyway (the client is no longer ready once one message is in flight);
* **RDY 100, default 250 ms output buffer timeout**: the case that shows flush-when-idle.
  Go nsqd would keep a lone message in its buffer until the 250 ms flush ticker fires (so
  p50 ~125 ms); our pump flushes as soon as no more messages are ready (docs/design.md
  §3.3).

Each figure: median (min–max) over runs of each run's p50, p99 and max.
"""

import argparse
import multiprocessing
import statistics
import sys
import time
from dataclasses import dataclass

from bench import _clients
from bench._support import (
    TARGETS,
    Nsqd,
    Record,
    Report,
    add_common_arguments,
    banner,
    load_range,
    run_clients,
    runs_of,
    spread,
    verdict,
)

TOPIC = "bench_latency"
CHANNEL = "bench_channel"


@dataclass(frozen=True)
class Variant:
    label: str
    rdy: int
    identify: dict | None


VARIANTS = [
    Variant("RDY 1, output_buffer_timeout -1 (unbuffered)", 1, {"output_buffer_timeout": -1}),
    Variant("RDY 1, default 250 ms output buffer timeout", 1, None),
    Variant("RDY 100, default 250 ms output buffer timeout", 100, None),
]


@dataclass
class Sample:
    count: int
    p50: float  # seconds
    p99: float
    max: float
    late: float  # the publisher's worst lateness against its schedule
    nsqd_cpu: float
    client_cpu: float
    others_cpu: float
    wall: float
    load: float


def percentile(ordered: list[float], fraction: float) -> float:
    """Nearest-rank percentile of a sorted list."""
    index = max(0, min(len(ordered) - 1, round(fraction * len(ordered) + 0.5) - 1))
    return ordered[index]


def measure(nsqd: Nsqd, context, variant: Variant, rate: int, count: int, size: int) -> Sample:
    jobs = [
        (
            _clients.stamped_consumer,
            (nsqd.port, TOPIC, CHANNEL, variant.rdy, variant.identify, count),
        ),
        (_clients.paced_publisher, (nsqd.port, TOPIC, rate, count, size)),
    ]
    run = run_clients(nsqd, context, jobs, timeout=count / rate + 120)
    (_, latencies, consumer_cpu, granted), publisher = run.results
    _, _sent, start, end, publisher_cpu, late = publisher
    if granted is not None:
        print(f"    nsqd granted output_buffer_timeout {granted['output_buffer_timeout']} ms")
    ordered = sorted(latencies)
    client_cpu = consumer_cpu + publisher_cpu
    return Sample(
        count=len(ordered),
        p50=percentile(ordered, 0.50),
        p99=percentile(ordered, 0.99),
        max=ordered[-1],
        late=late,
        nsqd_cpu=run.window.nsqd_cpu,
        client_cpu=client_cpu,
        others_cpu=run.window.others(client_cpu),
        wall=end - start,
        load=run.window.load,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, default=100, help="messages per second")
    parser.add_argument("--duration", type=float, default=10, help="seconds per run")
    parser.add_argument("--size", type=int, default=200, help="message body bytes")
    parser.add_argument(
        "--variants", default="", help="comma-separated variant numbers (1-based); all by default"
    )
    add_common_arguments(parser)
    args = parser.parse_args(argv)
    runs = runs_of(args)
    count = int(args.rate * args.duration)
    chosen = [VARIANTS[int(n) - 1] for n in args.variants.split(",") if n] or VARIANTS
    context = multiprocessing.get_context("spawn")
    started = time.monotonic()
    banner(
        "latency",
        f"{args.rate} msgs/s for {args.duration:g} s ({count:,} PUBs of {args.size} bytes),"
        f" 1 consumer, {runs} run(s) per variant, nsqd defaults",
    )
    report = Report(args.json)
    rows = []
    for variant in chosen:
        samples = []
        for _ in range(runs):
            with Nsqd() as nsqd:
                sample = measure(nsqd, context, variant, args.rate, count, args.size)
            samples.append(sample)
            print(
                f"  {variant.label}: p50 {sample.p50 * 1e3:.2f} ms, p99 {sample.p99 * 1e3:.2f} ms,"
                f" max {sample.max * 1e3:.2f} ms ({sample.count:,} messages; publisher at most"
                f" {sample.late * 1e3:.1f} ms behind schedule)",
                flush=True,
            )
        loads = [s.load for s in samples]
        nsqd_cpu = statistics.median(s.nsqd_cpu / s.wall for s in samples)
        client_cpu = statistics.median(s.client_cpu for s in samples)
        others = statistics.median(s.others_cpu / s.wall for s in samples)
        rows.append(
            f"| {variant.label} | {spread([s.p50 * 1e3 for s in samples], '.2f')} |"
            f" {spread([s.p99 * 1e3 for s in samples], '.2f')} |"
            f" {spread([s.max * 1e3 for s in samples], '.2f')} | {nsqd_cpu:.3f} |"
            f" {client_cpu:.2f} | {others:.2f} | {load_range(loads)} |"
        )
        for name, key, target in (
            ("p50", lambda s: s.p50, "latency_p50"),
            ("p99", lambda s: s.p99, None),
            ("max", lambda s: s.max, None),
        ):
            report.add(
                Record(
                    "latency",
                    f"{variant.label}: {name}",
                    "ms",
                    [key(s) * 1e3 for s in samples],
                    loads,
                    target,
                    {"nsqd CPU/wall": round(nsqd_cpu, 3), "others CPU/wall": round(others, 2)},
                )
            )
    print()
    print(
        "| variant | p50 ms median (min–max) | p99 ms | max ms | nsqd CPU/wall |"
        " clients CPU s | others CPU/wall | load avg |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    print("\n".join(rows))
    for record in report.records:
        if record.target:
            print(f"  {record.workload}: {verdict(record.median, TARGETS[record.target])}")
    report.write()
    print(f"\nlatency: done in {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main(sys.argv[1:])
