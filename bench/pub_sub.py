"""TCP publish and consume throughput of our nsqd, like Go's bench_writer and bench_reader.

    .venv/bin/python -m bench.pub_sub [--count 1000000] [--runs 3] [--quick]
                                      [--publishers 1,4] [--consumers 1,4]
                                      [--mem-queue-size 1000000]

Every run starts a fresh nsqd (``--mem-queue-size`` 1,000,000 by default, as Go's bench.sh
runs it, so every message stays in memory; `bench.disk_bound` runs this with 0). The clients
(bench/_clients.py) are separate processes on raw sockets and our codec:

* **publish**: N connections, each sending MPUB batches of ``--batch`` x ``--size``-byte
  messages, ``--window`` batches outstanding; every OK read sends as many new batches in one
  send. The topic has no channel (Go's bench_writer), so messages stay in the topic.
* **publish, 1 channel**: the same into a topic whose channel exists (fan-out on publish);
  this is how the consume runs fill the queue, timed as a figure of its own.
* **consume**: with ``--count`` messages queued in the channel, M connections SUB the same
  channel with ``RDY --rdy``; each received chunk is answered with all its FINs in one send.
  The clock starts when RDY is sent and stops when the last message arrives.

Each figure is the median of ``--runs`` runs with min and max. CPU seconds are measured over
the timed window: nsqd's from /proc/<pid>/stat, the clients' from time.process_time() in each
client process (summed), the rest of the machine's from /proc/stat ("others"), so one can tell
who was busy (nsqd is single-threaded: 1.0 CPU-s per wall-s is one saturated core).
``--nsqd-gc off|T0,T1,T2`` starts nsqd with the cyclic GC disabled or re-tuned, an experiment
that leaves nsqd's code alone. Profiles: ``python -m bench.profile publish`` (or consume).
"""

import argparse
import multiprocessing
import sys
import time
from dataclasses import dataclass, field

from bench import _clients
from bench._support import (
    ClientRun,
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

TOPIC = "bench_topic"
CHANNEL = "bench_channel"


@dataclass
class Sample:
    messages: int
    wall: float
    nsqd_cpu: float
    client_cpu: float
    others_cpu: float
    load: float
    chunks: int = 0  # consume: receives that held messages, all consumers

    @property
    def rate(self) -> float:
        return self.messages / self.wall

    @classmethod
    def of(cls, run: ClientRun) -> "Sample":
        """From clients that put (messages, start, end, cpu, chunks)."""
        client_cpu = sum(run.column(3))
        return cls(
            messages=sum(run.column(0)),
            wall=max(run.column(2)) - min(run.column(1)),
            nsqd_cpu=run.window.nsqd_cpu,
            client_cpu=client_cpu,
            others_cpu=run.window.others(client_cpu),
            load=run.window.load,
            chunks=sum(run.column(4)),
        )


@dataclass
class Figure:
    label: str
    connections: int
    target: str | None
    samples: list[Sample] = field(default_factory=list)


# -- workloads (bench.profile runs these too) ------------------------------------------------


@dataclass
class Params:
    count: int = 1_000_000
    size: int = 200
    batch: int = 200
    window: int = 8
    rdy: int = 2500
    topic: str = TOPIC
    channel: str = CHANNEL


def publish(nsqd: Nsqd, context, params: Params, connections: int) -> Sample:
    """`params.count` messages over `connections` publishers (rounded down to whole MPUBs)."""
    per_connection = params.count // (params.batch * connections)
    if per_connection < 1:
        raise SystemExit("--count is smaller than one batch per connection")
    arguments = (nsqd.port, params.topic, per_connection, params.batch, params.size, params.window)
    return Sample.of(run_clients(nsqd, context, [(_clients.publisher, arguments)] * connections))


def consume(nsqd: Nsqd, context, params: Params, connections: int, queued: int) -> Sample:
    total = context.Value("q", 0)
    arguments = (nsqd.port, params.topic, params.channel, params.rdy, queued, total)
    sample = Sample.of(run_clients(nsqd, context, [(_clients.consumer, arguments)] * connections))
    if sample.messages != queued:
        print(f"    note: received {sample.messages:,} messages for {queued:,} queued")
    return sample


def fill(nsqd: Nsqd, context, params: Params, publishers: int) -> Sample:
    """Create the channel, then publish `params.count` messages into it."""
    _clients.create_channel(nsqd.port, params.topic, params.channel)
    return publish(nsqd, context, params, publishers)


# -- report ----------------------------------------------------------------------------------


def table(figures: list[Figure]) -> str:
    rows = [
        "| workload | conns | msgs/run | msgs/s median (min–max) | wall s | nsqd CPU s |"
        " nsqd CPU/wall | nsqd µs/msg | clients CPU s | others CPU/wall | load avg |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for figure in figures:
        samples = figure.samples
        median = median_of(samples, lambda s: s.rate)
        rows.append(
            f"| {figure.label} | {figure.connections} | {median.messages:,} |"
            f" {spread([s.rate for s in samples])} | {median.wall:.2f} |"
            f" {median.nsqd_cpu:.2f} | {median.nsqd_cpu / median.wall:.2f} |"
            f" {median.nsqd_cpu / median.messages * 1e6:.2f} | {median.client_cpu:.2f} |"
            f" {median.others_cpu / median.wall:.2f} | {load_range([s.load for s in samples])} |"
        )
    return "\n".join(rows)


def _int_list(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=1_000_000, help="messages per run")
    parser.add_argument("--size", type=int, default=200, help="message body bytes")
    parser.add_argument("--batch", type=int, default=200, help="messages per MPUB")
    parser.add_argument("--window", type=int, default=8, help="MPUBs outstanding per conn")
    parser.add_argument("--rdy", type=int, default=2500)
    parser.add_argument("--publishers", type=_int_list, default=[1, 4], help="e.g. 1,4")
    parser.add_argument("--consumers", type=_int_list, default=[1, 4], help="e.g. 1,4")
    parser.add_argument("--fill-publishers", type=int, default=4)
    parser.add_argument("--mem-queue-size", type=int, default=1_000_000)
    parser.add_argument(
        "--nsqd-arg", action="append", default=[], help="extra nsqd flag (repeatable)"
    )
    parser.add_argument(
        "--nsqd-gc",
        default="default",
        help="experiment: 'off' (gc.disable()) or 'T0,T1,T2' (gc.set_threshold) in nsqd",
    )
    parser.add_argument("--name", default="tcp", help="the figures' name in the summary")
    # Profiles moved to bench.profile; the flag of older commands in RESULTS.md still parses.
    parser.add_argument("--no-profile", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--no-targets", dest="targets", action="store_false", help="compare with no target"
    )
    add_common_arguments(parser)
    args = parser.parse_args(argv)
    runs = runs_of(args)
    params = Params(args.count, args.size, args.batch, args.window, args.rdy)
    flags = [f"-mem-queue-size={args.mem_queue_size}", *args.nsqd_arg]

    context = multiprocessing.get_context("spawn")
    started = time.monotonic()
    banner(
        f"{args.name} (bench.pub_sub)",
        f"{args.count:,} messages of {args.size} bytes per run, MPUB batches of {args.batch},"
        f" window {args.window}, RDY {args.rdy}, {runs} run(s), nsqd {' '.join(flags)}"
        + ("" if args.nsqd_gc == "default" else f", nsqd GC {args.nsqd_gc}"),
    )
    publish_target = "tcp_publish" if args.targets else None
    consume_target = "tcp_consume" if args.targets else None
    figures: list[Figure] = []
    for connections in args.publishers:
        figure = Figure("TCP publish (MPUB, no channel)", connections, publish_target)
        for _ in range(runs):
            with Nsqd(flags, gc_mode=args.nsqd_gc) as nsqd:
                figure.samples.append(publish(nsqd, context, params, connections))
            print(f"  publish x{connections}: {figure.samples[-1].rate:,.0f} msgs/s", flush=True)
        figures.append(figure)
    filled = Figure("TCP publish (MPUB, 1 channel)", args.fill_publishers, None)
    for connections in args.consumers:
        figure = Figure("TCP consume (RDY, FIN)", connections, consume_target)
        for _ in range(runs):
            with Nsqd(flags, gc_mode=args.nsqd_gc) as nsqd:
                filled.samples.append(fill(nsqd, context, params, args.fill_publishers))
                queued = filled.samples[-1].messages
                figure.samples.append(consume(nsqd, context, params, connections, queued))
            sample = figure.samples[-1]
            print(
                f"  fill x{args.fill_publishers}: {filled.samples[-1].rate:,.0f} msgs/s,"
                f" consume x{connections}: {sample.rate:,.0f} msgs/s"
                f" ({sample.messages / max(sample.chunks, 1):,.0f} msgs per receive)",
                flush=True,
            )
        figures.append(figure)
    if filled.samples:
        figures.insert(len(args.publishers), filled)
    print()
    print(table(figures))

    report = Report(args.json)
    suffix = f", --mem-queue-size {args.mem_queue_size}"
    for figure in figures:
        median = median_of(figure.samples, lambda s: s.rate)
        report.add(
            Record(
                bench=args.name,
                workload=f"{figure.label} x{figure.connections}{suffix}",
                unit="msgs/s",
                values=[s.rate for s in figure.samples],
                loads=[s.load for s in figure.samples],
                target=figure.target,
                notes={
                    "nsqd CPU/wall": round(median.nsqd_cpu / median.wall, 2),
                    "nsqd µs/msg": round(median.nsqd_cpu / median.messages * 1e6, 2),
                    "msgs per nsqd CPU-s": f"{median.messages / median.nsqd_cpu:,.0f}",
                    "clients CPU s": round(median.client_cpu, 2),
                    "others CPU/wall": round(median.others_cpu / median.wall, 2),
                },
            )
        )
    report.write()
    print(f"\n{args.name}: done in {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main(sys.argv[1:])
