"""Profile nsqd with py-spy under one of the bench workloads: a flame graph SVG and/or the
top functions from collapsed stacks, into bench/profiles/ (git-ignored).

    .venv/bin/python -m bench.profile WORKLOAD [--format svg|raw|both] [--rate 200]
    .venv/bin/python -m bench.profile --list

Each profile starts a fresh nsqd with the workload's flags, prepares it (e.g. fills the
channel for `consume`, untimed and unprofiled), attaches `py-spy record --pid <nsqd>
--function` and runs the workload once with the same clients as the benchmarks. ``svg``
writes py-spy's flame graph (`bench/profiles/<workload>-<time>.svg`); ``raw`` writes the
collapsed stacks (`.txt`) and prints the top functions by own and inclusive share of the main
thread's samples (the trio loop); ``both`` runs the workload twice, once for each (py-spy
writes one format per recording). py-spy pauses nsqd for each sample, so rates under a
profile are somewhat lower than the benchmarks'.

py-spy counts a sample whenever nsqd's thread is not sleeping, which includes time it is
runnable but preempted: on a busy 2-core machine a function that wakes another process (a
socket write to a waiting client) collects the time the scheduler gives that process. Look
at ``--gil`` (only samples holding the GIL: nsqd's Python work) next to the default, and at
nsqd's user/system CPU split and nonvoluntary context switches, which this prints.
"""

import argparse
import multiprocessing
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace

from bench import connection_churn, fanout, http_pub, latency, pub_sub, topic_creation
from bench._profiling import Profiler, summarize
from bench._support import PROFILES, Nsqd, banner, process_counters


@dataclass(frozen=True)
class Workload:
    description: str
    flags: list[str]
    # run(nsqd, context, options, prepared) -> what happened, e.g. "523,000 msgs/s"
    run: Callable
    # prepare(nsqd, context, options) -> anything run() needs (not profiled)
    prepare: Callable | None = None


def _publish(connections: int):
    def run(nsqd, context, options, _prepared) -> str:
        sample = pub_sub.publish(nsqd, context, pub_sub.Params(count=options.count), connections)
        return f"{sample.rate:,.0f} msgs/s published over {connections} connection(s)"

    return run


def _fill(nsqd, context, options) -> int:
    return pub_sub.fill(nsqd, context, pub_sub.Params(count=options.count), 4).messages


def _consume(connections: int):
    def run(nsqd, context, options, queued: int) -> str:
        params = pub_sub.Params(count=options.count)
        sample = pub_sub.consume(nsqd, context, params, connections, queued)
        return f"{sample.rate:,.0f} msgs/s consumed over {connections} connection(s)"

    return run


def _fanout(nsqd, context, options, _prepared) -> str:
    sample = fanout.fan_out(nsqd, context, options.count // 4, 4, 2500, 200)
    return f"{sample.total:,.0f} msgs/s delivered in total to 4 channels"


def _http(index: int):
    def run(nsqd, context, options, _prepared) -> str:
        workload = http_pub.workloads(200, 100)[index]
        args = SimpleNamespace(
            connections=32, duration=options.duration, wrk_threads=1, processes=1
        )
        if http_pub.choose_client("auto") == "wrk":
            sample = http_pub.run_wrk(nsqd, workload, args)
        else:
            sample = http_pub.run_python(nsqd, workload, args, context)
        return f"{sample.rate:,.0f} req/s {workload.label}"

    return run


def _latency(nsqd, context, options, _prepared) -> str:
    variant = latency.VARIANTS[2]
    count = int(100 * options.duration)
    sample = latency.measure(nsqd, context, variant, 100, count, 200)
    return f"{variant.label}: p50 {sample.p50 * 1e3:.2f} ms, p99 {sample.p99 * 1e3:.2f} ms"


def _topics(_nsqd, _context, options, _prepared) -> str:
    topics = max(100, options.count // 500)
    result = topic_creation.create_all(_nsqd, topics)
    return f"{topics:,} topics x 2 channels in {result['seconds']:.1f} s"


def _churn(mode: str):
    def run(nsqd, _context, options, _prepared) -> str:
        count, _failed, elapsed = connection_churn.drive(nsqd, options.duration, mode, [])
        return f"{count / elapsed:,.0f} connections/s ({mode})"

    return run


IN_MEMORY = ["-mem-queue-size=1000000"]
ON_DISK = ["-mem-queue-size=0"]
WORKLOADS = {
    "publish": Workload("TCP publish, 1 connection, no channel", IN_MEMORY, _publish(1)),
    "publish4": Workload("TCP publish, 4 connections, no channel", IN_MEMORY, _publish(4)),
    "consume": Workload("TCP consume, 1 connection", IN_MEMORY, _consume(1), _fill),
    "consume4": Workload("TCP consume, 4 connections", IN_MEMORY, _consume(4), _fill),
    "fanout": Workload("1 publisher, 4 channels x 1 consumer", IN_MEMORY, _fanout),
    "http-pub": Workload("HTTP /pub, 32 connections, nsqd defaults", [], _http(0)),
    "http-mpub": Workload("HTTP /mpub of 100, 32 connections, nsqd defaults", [], _http(1)),
    "topics": Workload("HTTP topic and 2 channel creates, --count/500 topics", [], _topics),
    "churn-sub": Workload("connect, IDENTIFY, SUB ephemeral, RDY 1, close", [], _churn("sub")),
    "churn-pub": Workload("connect, IDENTIFY, PUB, close", [], _churn("pub")),
    "latency": Workload("100 msgs/s, RDY 100, nsqd defaults", [], _latency),
    "memory": Workload("TCP publish x4 with nsqd defaults (overflow to disk)", [], _publish(4)),
    "disk-publish": Workload("TCP publish, 1 connection, --mem-queue-size=0", ON_DISK, _publish(1)),
    "disk-consume": Workload(
        "TCP consume, 1 connection, --mem-queue-size=0", ON_DISK, _consume(1), _fill
    ),
}


def profile(name: str, fmt: str, options, context) -> str:
    """One fresh nsqd, prepared, profiled under one run of the workload; the output path."""
    workload = WORKLOADS[name]
    PROFILES.mkdir(exist_ok=True)
    extension = "svg" if fmt == "svg" else "txt"
    tag = "-gil" if options.gil else ""
    output = PROFILES / f"{name}{tag}-{time.strftime('%Y%m%d-%H%M%S')}.{extension}"
    with Nsqd(workload.flags, gc_mode=options.nsqd_gc) as nsqd:
        prepared = workload.prepare(nsqd, context, options) if workload.prepare else None
        extra = (["--gil"] if options.gil else []) + (["--native"] if options.native else [])
        profiler = Profiler(
            nsqd.pid, str(output), options.rate, "flamegraph" if fmt == "svg" else "raw", extra
        )
        before = process_counters(nsqd.pid)
        try:
            outcome = workload.run(nsqd, context, options, prepared)
        finally:
            after = process_counters(nsqd.pid)
            seconds = profiler.stop()
    delta = {key: after[key] - before[key] for key in before}
    print(f"  {name} ({workload.description}): {outcome}; sampled {seconds:.1f} s")
    print(
        f"  nsqd over the workload: {delta['user']:.2f} s user + {delta['system']:.2f} s system"
        f" CPU, {delta['nonvoluntary']:,.0f} nonvoluntary and {delta['voluntary']:,.0f}"
        " voluntary context switches"
    )
    print(f"  wrote {output}")
    if fmt == "raw":
        print(summarize(str(output), options.rate, options.top))
    return str(output)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workloads", nargs="*", metavar="WORKLOAD", help="see --list")
    parser.add_argument("--list", action="store_true", help="list the workloads")
    parser.add_argument("--format", choices=("svg", "raw", "both"), default="svg")
    parser.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    parser.add_argument("--top", type=int, default=15, help="functions to list (raw)")
    parser.add_argument("--count", type=int, default=1_000_000, help="messages (TCP workloads)")
    parser.add_argument("--duration", type=float, default=5, help="seconds (HTTP, latency)")
    parser.add_argument(
        "--nsqd-gc", default="default", help="'off' or 'T0,T1,T2': nsqd's GC, as in pub_sub"
    )
    parser.add_argument(
        "--gil",
        action="store_true",
        help="py-spy --gil: only samples holding the GIL (Python work, without time in"
        " syscalls or spent preempted by other processes)",
    )
    parser.add_argument("--native", action="store_true", help="py-spy --native: C frames too")
    args = parser.parse_args(argv)
    if args.list or not args.workloads:
        for name, workload in WORKLOADS.items():
            print(f"  {name:<13} {workload.description} (nsqd {' '.join(workload.flags) or '-'})")
        return
    unknown = [name for name in args.workloads if name not in WORKLOADS]
    if unknown:
        parser.error(f"unknown workload(s) {', '.join(unknown)}; see --list")
    context = multiprocessing.get_context("spawn")
    banner("profile", f"py-spy at {args.rate} Hz, {args.format}: {', '.join(args.workloads)}")
    formats = ["svg", "raw"] if args.format == "both" else [args.format]
    for name in args.workloads:
        for fmt in formats:
            profile(name, fmt, args, context)


if __name__ == "__main__":
    main(sys.argv[1:])
