"""Four topics at once, each with its own producer and consumer: Go's `bench_writer` and
`bench_reader` (one connection each, `GOMAXPROCS=1`), so the load is Go's and the client is
not the limit.

    .venv/bin/python -m bench.four_topics --go-clients DIR [--topics 4]
        [--runfor 10] [--nsqd-args="-FLAG=VALUE ..."] [--split 2] [--runs 3] [--quick]

Every run starts a fresh nsqd (``--mem-queue-size`` 1,000,000, as bench.pub_sub), starts one
`bench_reader` per topic (channel `ch`, RDY 2500) and one `bench_writer` per topic (MPUB of
200 × 200 B), all released by the same `--deadline`, and reads the rate each prints when its
``--runfor`` seconds are over. Figures: messages published per second (the writers' sum) and
consumed per second (the readers' sum), with nsqd's CPU over the window.

``--split N`` runs N independent nsqds instead of one, topic i on nsqd i mod N: what N
processes that each own a share of the topics can do at best, with nothing between them (the
ceiling of a shard-per-core nsqd on this machine).

The Go clients are benchmark tools, not part of the project: ``--go-clients DIR`` names the
folder holding them (`python -m bench --reference DIR` passes its folder on). Without them
the benchmark says so and records nothing.
"""

import argparse
import datetime
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass

from bench._support import (
    REFERENCE_NSQD,
    Nsqd,
    Report,
    Window,
    add_common_arguments,
    add_rates,
    banner,
    runs_of,
)

# Where `python -m bench --reference DIR` says Go's bench_writer and bench_reader are.
GO_CLIENTS = "NSQPY_BENCH_GO_CLIENTS"
# "duration: 10.001s - 19.073mb/s - 99999.000ops/s - 10.000us/op"
_RATE = re.compile(r"([0-9.]+)ops/s")
_TOOLS = ("bench_writer", "bench_reader")
# The clients sleep until this many seconds from now, so all start together.
START_DELAY = 2.0


@dataclass
class Sample:
    published: float  # msgs/s, all writers
    consumed: float  # msgs/s, all readers
    nsqd_cpu: float
    wall: float
    load: float


def go_clients_folder(given: str | None) -> str | None:
    """The folder holding bench_writer and bench_reader: given, or from the runner."""
    candidates = [given, os.environ.get(GO_CLIENTS)]
    reference = os.environ.get(REFERENCE_NSQD)
    if reference:
        candidates.append(os.path.dirname(reference))
    for folder in filter(None, candidates):
        if all(os.access(os.path.join(folder, tool), os.X_OK) for tool in _TOOLS):
            return os.path.abspath(folder)
    return None


def run_once(nsqds: list[Nsqd], folder: str, args: argparse.Namespace) -> Sample:
    # Go parses the deadline as UTC, in whole seconds.
    start_at = datetime.datetime.now(datetime.UTC).replace(microsecond=0) + datetime.timedelta(
        seconds=START_DELAY + 1
    )
    common = [
        f"--size={args.size}",
        f"--runfor={args.runfor}s",
        f"--deadline={start_at.strftime('%Y-%m-%d %H:%M:%S')}",
    ]
    environment = {**os.environ, "GOMAXPROCS": "1"}
    clients: list[tuple[str, subprocess.Popen]] = []
    for index in range(args.topics):
        topic = f"four_{index}"
        address = f"--nsqd-tcp-address=127.0.0.1:{nsqds[index % len(nsqds)].tcp_port}"
        reader = [
            os.path.join(folder, "bench_reader"),
            address,
            *common,
            f"--topic={topic}",
            "--channel=ch",
            f"--rdy={args.rdy}",
        ]
        writer = [
            os.path.join(folder, "bench_writer"),
            address,
            *common,
            f"--topic={topic}",
            f"--batch-size={args.batch}",
        ]
        for kind, command in (("reader", reader), ("writer", writer)):
            process = subprocess.Popen(
                command,
                env=environment,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            clients.append((kind, process))
    # The window opens when the clients' deadline comes.
    time.sleep(max(0.0, (start_at - datetime.datetime.now(datetime.UTC)).total_seconds()))
    windows = [Window(nsqd) for nsqd in nsqds]
    started = time.monotonic()
    rates: dict[str, list[float]] = {"reader": [], "writer": []}
    for kind, process in clients:
        output, _ = process.communicate(timeout=args.runfor + 120)
        match = _RATE.search(output or "")
        if process.returncode or match is None:
            raise RuntimeError(f"bench_{kind} failed ({process.returncode}): {output.strip()}")
        rates[kind].append(float(match.group(1)))
    for window, nsqd in zip(windows, nsqds, strict=True):
        window.close()
        nsqd.check_alive()
    return Sample(
        published=sum(rates["writer"]),
        consumed=sum(rates["reader"]),
        nsqd_cpu=sum(window.nsqd_cpu for window in windows),
        wall=time.monotonic() - started,
        load=windows[0].load,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--go-clients", default=None, help="folder of bench_writer/bench_reader")
    parser.add_argument("--topics", type=int, default=4)
    parser.add_argument("--runfor", type=int, default=10, help="seconds each client runs")
    parser.add_argument("--size", type=int, default=200, help="message body bytes")
    parser.add_argument("--batch", type=int, default=200, help="messages per MPUB")
    parser.add_argument("--rdy", type=int, default=2500)
    parser.add_argument("--nsqd-args", default="", help="more nsqd flags")
    parser.add_argument("--split", type=int, default=1, help="independent nsqds sharing the topics")
    parser.add_argument("--name", default="", help="a suffix for the figures' names")
    add_common_arguments(parser)
    args = parser.parse_args()
    report = Report(args.json)
    folder = go_clients_folder(args.go_clients)
    banner("four_topics", f"{args.topics} topics, bench_writer + bench_reader each, GOMAXPROCS=1")
    if folder is None:
        print(
            "  skipped: needs Go's bench_writer and bench_reader (--go-clients DIR, or"
            " python -m bench --reference DIR)"
        )
        report.write()
        return 0
    flags = ["-mem-queue-size=1000000", *args.nsqd_args.split()]
    samples: list[Sample] = []
    for _ in range(runs_of(args)):
        nsqds = [Nsqd(flags) for _ in range(args.split)]
        try:
            sample = run_once(nsqds, folder, args)
        finally:
            for nsqd in nsqds:
                nsqd.stop()
        samples.append(sample)
        print(
            f"  published {sample.published:,.0f} msgs/s, consumed {sample.consumed:,.0f} msgs/s;"
            f" nsqd CPU/wall {sample.nsqd_cpu / sample.wall:.2f}",
            flush=True,
        )
    name = f"{args.topics} topics, Go bench_writer + bench_reader each (GOMAXPROCS=1)"
    if args.split > 1:
        name += f", {args.split} independent nsqds"
    if args.name:
        name += f", {args.name}"
    add_rates(report, "four_topics", name, samples)
    report.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
