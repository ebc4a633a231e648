"""Fan-out: one TCP publisher, one topic with 4 channels, one consumer on each channel.

    .venv/bin/python -m bench.fanout [--count 250000] [--channels 4] [--runs 3] [--quick]

Every run starts a fresh nsqd (``--mem-queue-size`` 1,000,000, as bench.pub_sub and Go's
bench.sh, so nothing goes to disk). The consumers SUB first (creating the channels) and wait
on a barrier with the publisher; then the publisher MPUBs ``--count`` messages (batches of
200, 8 outstanding) while every consumer receives and FINs its channel's copy of each with
``RDY --rdy``: publish and delivery overlap, as in production. Figures: msgs/s delivered per
channel (``--count`` over the time from the start to that consumer's last message; median
over channels and runs), in total (channels x ``--count`` over the time to the last message
of all) and the publisher's own rate. Clients are separate processes (bench/_clients.py).
"""

import argparse
import multiprocessing
import statistics
import sys
import time
from dataclasses import dataclass

from bench import _clients
from bench._support import (
    Nsqd,
    Record,
    Report,
    add_common_arguments,
    banner,
    load_range,
    median_of,
    run_clients,
    runs_of,
    spread,
)

TOPIC = "bench_fanout"


@dataclass
class Sample:
    count: int
    channels: int
    per_channel: list[float]  # msgs/s of each channel
    total: float  # msgs/s delivered, all channels
    publish: float  # msgs/s published
    wall: float
    nsqd_cpu: float
    client_cpu: float
    others_cpu: float
    load: float


def fan_out(nsqd: Nsqd, context, count: int, channels: int, rdy: int, size: int) -> Sample:
    batch = 200
    count = count // batch * batch
    counters = [context.Value("q", 0) for _ in range(channels)]
    jobs = [(_clients.publisher, (nsqd.port, TOPIC, count // batch, batch, size, 8))]
    jobs += [
        (_clients.consumer, (nsqd.port, TOPIC, f"channel{index}", rdy, count, counter))
        for index, counter in enumerate(counters)
    ]
    run = run_clients(nsqd, context, jobs)
    # Publisher: (messages, start, end, cpu, 0); consumers: (received, start, last, cpu, chunks).
    publisher, consumers = run.results[0], run.results[1:]
    start = min(run.column(1))
    for result in consumers:
        if result[0] != count:
            raise RuntimeError(f"a channel received {result[0]:,} of {count:,} messages")
    last = max(result[2] for result in consumers)
    client_cpu = sum(run.column(3))
    return Sample(
        count=count,
        channels=channels,
        per_channel=[count / (result[2] - start) for result in consumers],
        total=count * channels / (last - start),
        publish=count / (publisher[2] - publisher[1]),
        wall=last - start,
        nsqd_cpu=run.window.nsqd_cpu,
        client_cpu=client_cpu,
        others_cpu=run.window.others(client_cpu),
        load=run.window.load,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=250_000, help="messages published")
    parser.add_argument("--channels", type=int, default=4)
    parser.add_argument("--size", type=int, default=200, help="message body bytes")
    parser.add_argument("--rdy", type=int, default=2500)
    parser.add_argument("--mem-queue-size", type=int, default=1_000_000)
    add_common_arguments(parser)
    args = parser.parse_args(argv)
    runs = runs_of(args)
    flags = [f"-mem-queue-size={args.mem_queue_size}"]
    context = multiprocessing.get_context("spawn")
    started = time.monotonic()
    banner(
        "fanout",
        f"1 publisher, {args.channels} channels x 1 consumer, {args.count:,} messages of"
        f" {args.size} bytes per run, RDY {args.rdy}, {runs} run(s), nsqd {' '.join(flags)}",
    )
    samples = []
    for _ in range(runs):
        with Nsqd(flags) as nsqd:
            sample = fan_out(nsqd, context, args.count, args.channels, args.rdy, args.size)
        samples.append(sample)
        print(
            f"  per channel {', '.join(f'{rate:,.0f}' for rate in sample.per_channel)} msgs/s;"
            f" total {sample.total:,.0f} msgs/s; published {sample.publish:,.0f} msgs/s",
            flush=True,
        )
    per_channel = [rate for sample in samples for rate in sample.per_channel]
    median = median_of(samples, lambda s: s.total)
    loads = [s.load for s in samples]
    delivered = median.count * median.channels
    print()
    print(
        "| figure | msgs/s median (min–max) | wall s | nsqd CPU s | nsqd CPU/wall |"
        " nsqd µs/delivery | clients CPU s | others CPU/wall | load avg |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    common = (
        f" {median.wall:.2f} | {median.nsqd_cpu:.2f} | {median.nsqd_cpu / median.wall:.2f} |"
        f" {median.nsqd_cpu / delivered * 1e6:.2f} | {median.client_cpu:.2f} |"
        f" {median.others_cpu / median.wall:.2f} | {load_range(loads)} |"
    )
    print(f"| delivered per channel ({args.channels} channels) | {spread(per_channel)} |{common}")
    print(f"| delivered, all channels | {spread([s.total for s in samples])} |{common}")
    print(f"| published (1 connection) | {spread([s.publish for s in samples])} |{common}")

    report = Report(args.json)
    notes = {
        "nsqd CPU/wall": round(median.nsqd_cpu / median.wall, 2),
        "nsqd µs/delivery": round(median.nsqd_cpu / delivered * 1e6, 2),
        "clients CPU s": round(median.client_cpu, 2),
        "others CPU/wall": round(median.others_cpu / median.wall, 2),
    }
    label = f"1 publisher, {args.channels} channels"
    report.add(
        Record(
            "fanout",
            f"{label}: delivered per channel",
            "msgs/s",
            per_channel,
            loads,
            runs=len(samples),
        )
    )
    totals = [s.total for s in samples]
    report.add(
        Record("fanout", f"{label}: delivered, all channels", "msgs/s", totals, loads, None, notes)
    )
    publishes = [s.publish for s in samples]
    report.add(Record("fanout", f"{label}: published", "msgs/s", publishes, loads))
    report.write()
    print(
        f"\nfanout: median per channel {statistics.median(per_channel):,.0f} msgs/s;"
        f" done in {time.monotonic() - started:.0f} s"
    )


if __name__ == "__main__":
    main(sys.argv[1:])
