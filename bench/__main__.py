"""Run the benchmark suite (or the named benchmarks), then print one summary with the targets.

    .venv/bin/python -m bench                        # everything (~6-8 min on 2 cores)
    .venv/bin/python -m bench tcp latency            # only these
    .venv/bin/python -m bench --quick                # one run per figure instead of 3
    .venv/bin/python -m bench --list                 # the benchmarks and what they run
    .venv/bin/python -m bench --profile-missed       # then py-spy nsqd for each missed target
    .venv/bin/python -m bench --reference ../go/nsqd # each workload on Go's nsqd too: ratios

Each benchmark runs in its own interpreter as `python -m bench.<module> [preset options]`
(run one by hand the same way, with its own options: `--help`), starts its own nsqd for every
run (fresh data dir, ephemeral ports) and writes its figures as JSON for the summary. A
benchmark that fails does not stop the others; the exit status says whether any failed.
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from bench._support import (
    REFERENCE_NSQD,
    ROOT,
    TARGETS,
    Record,
    banner,
    git_revision,
    load_average,
    load_range,
    read_records,
    spread,
    verdict,
)
from bench.four_topics import GO_CLIENTS


@dataclass(frozen=True)
class Benchmark:
    name: str
    module: str
    args: tuple[str, ...]
    description: str
    aliases: tuple[str, ...] = ()
    # Its workloads run on Go's nsqd too (only flags Go has): `--reference`.
    reference: bool = False


SUITE = [
    Benchmark(
        "tcp",
        "pub_sub",
        (),
        "TCP publish x1, x4 (MPUB, no channel) and consume x1, x4 (one channel), 1M msgs in memory",
        ("pub_sub",),
        reference=True,
    ),
    Benchmark("fanout", "fanout", (), "1 TCP publisher, 4 channels x 1 consumer", reference=True),
    Benchmark(
        "http",
        "http_pub",
        (),
        "HTTP /pub and /mpub, 32 keep-alive connections",
        ("http_pub",),
        reference=True,
    ),
    Benchmark(
        "latency", "latency", (), "publish→delivery at 100 msgs/s: p50/p99/max", reference=True
    ),
    Benchmark("memory", "memory", (), "nsqd RSS with 1,000,000 messages queued", reference=True),
    Benchmark(
        "diskqueue_bound",
        "disk_bound",
        (),
        "TCP publish and consume with --mem-queue-size=0",
        ("disk_bound",),
        reference=True,
    ),
    Benchmark(
        "diskqueue",
        "diskqueue_bench",
        (),
        "DiskQueue alone: 1M puts then gets, single and batched",
        ("diskqueue_bench",),
    ),
    Benchmark(
        "security",
        "security_bench",
        (),
        "TCP consume over plain, snappy, deflate, TLS, TLS+snappy",
        ("security_bench",),
    ),
    Benchmark(
        "log_topic",
        "log_topic",
        (),
        "log topics against classic ones: TCP publish and consume, restart with a 10M backlog,"
        " range fetch",
    ),
    Benchmark(
        "many_clients",
        "many_clients",
        (),
        "10,000 consumers with 1 s heartbeats, 100 publishes/s: /ping p50/p99/max",
        reference=True,
    ),
    Benchmark(
        "four_topics",
        "four_topics",
        (),
        "4 topics, Go's bench_writer + bench_reader on each (needs --reference DIR)",
        reference=True,
    ),
    Benchmark(
        "group_commit",
        "group_commit",
        (),
        "log topic with --sync-every=1: PUB-and-wait publishers x1, x8, x32, messages per group",
    ),
    Benchmark(
        "delay_queue",
        "delay_queue",
        (),
        "DPUB, REQ with a delay and due messages, log topic against classic; RSS of 1M delayed",
    ),
]
BY_NAME = {name: bench for bench in SUITE for name in (bench.name, *bench.aliases)}
# For --profile-missed: the bench.profile workload behind each target.
PROFILE_OF_TARGET = {
    "tcp_publish": "publish",
    "tcp_consume": "consume",
    "http_pub": "http-pub",
    "rss": "memory",
    "latency_p50": "latency",
}


def summary(records: list[Record]) -> str:
    rows = [
        "| benchmark | figure | median (min–max) | unit | runs | load avg | target | verdict |"
        " notes (median run) |",
        "| --- | --- | ---: | --- | ---: | ---: | --- | --- | --- |",
    ]
    for record in records:
        fmt = ",.0f" if record.median >= 100 else ".2f"
        target = TARGETS.get(record.target) if record.target else None
        rows.append(
            f"| {record.bench} | {record.workload} | {spread(record.values, fmt)} | {record.unit}"
            f" | {record.runs or len(record.values)} | {load_range(record.loads)} |"
            f" {target.text if target else '–'} |"
            f" {verdict(record.median, target) if target else '–'} |"
            f" {'; '.join(f'{key} {value}' for key, value in record.notes.items())} |"
        )
    return "\n".join(rows)


# Figures where less is better: the ratio to Go is then Go's figure over ours, so that above
# 1 always means ahead of Go.
_LOWER_IS_BETTER = {"ms", "MiB", "s"}


def reference_summary(ours: list[Record], go: list[Record]) -> str:
    """Each figure on both daemons, and ours as a multiple of Go's (above 1: ahead)."""
    theirs = {(record.bench, record.workload): record for record in go}
    rows = [
        "| benchmark | figure | nsqpy median | Go median | unit | nsqpy ÷ Go (≥ 1: ahead) |"
        " per nsqd CPU-second, nsqpy ÷ Go |",
        "| --- | --- | ---: | ---: | --- | ---: | ---: |",
    ]
    for record in ours:
        other = theirs.get((record.bench, record.workload))
        if other is None or not other.median or not record.median:
            continue
        fmt = ",.0f" if record.median >= 100 else ".2f"
        if record.unit in _LOWER_IS_BETTER:
            ratio = other.median / record.median
        else:
            ratio = record.median / other.median
        per_cpu = "–"
        key = next((k for k in record.notes if k.endswith("per nsqd CPU-s")), None)
        if key is not None and key in other.notes:
            mine, go_value = _number(record.notes[key]), _number(other.notes[key])
            if mine and go_value:
                per_cpu = f"{mine / go_value:.2f}"
        rows.append(
            f"| {record.bench} | {record.workload} | {format(record.median, fmt)} |"
            f" {format(other.median, fmt)} | {record.unit} | {ratio:.2f} | {per_cpu} |"
        )
    return "\n".join(rows)


def _number(value: object) -> float | None:
    try:
        return float(str(value).replace(",", ""))
    except ValueError:
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", metavar="NAME", help="benchmarks (default: all)")
    parser.add_argument("--quick", action="store_true", help="one run per figure")
    parser.add_argument("--list", action="store_true", help="list the benchmarks")
    parser.add_argument(
        "--reference",
        metavar="PATH",
        help="Go's nsqd (the binary, or a directory holding it): run each workload that Go's"
        " nsqd can run on it too, in the same run, and print the ratios",
    )
    parser.add_argument(
        "--profile-missed",
        action="store_true",
        help="afterwards, py-spy nsqd (bench.profile --format raw) under each missed target",
    )
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.list:
        for bench in SUITE:
            aliases = f" (or {', '.join(bench.aliases)})" if bench.aliases else ""
            print(f"  {bench.name:<16} {bench.description}{aliases}")
            print(f"  {'':<16} python -m bench.{bench.module} {' '.join(bench.args)}")
        return 0
    unknown = [name for name in args.names if name not in BY_NAME]
    if unknown:
        print(f"unknown benchmark(s) {', '.join(unknown)}; see --list")
        return 2
    chosen = [BY_NAME[name] for name in args.names] or SUITE
    reference = None
    if args.reference:
        reference = os.path.abspath(args.reference)
        if os.path.isdir(reference):
            reference = os.path.join(reference, "nsqd")
        if not os.access(reference, os.X_OK):
            print(f"--reference: {reference} is not an executable nsqd")
            return 2
    banner("bench", f"{', '.join(b.name for b in chosen)}" + (" (quick)" if args.quick else ""))
    started = time.monotonic()
    revision = git_revision()
    failed: list[str] = []
    records: list[Record] = []
    go_records: list[Record] = []
    with tempfile.TemporaryDirectory(prefix="nsqpy-bench-run-") as scratch:
        for bench in chosen:
            runs = [("", None)]
            if reference is not None and bench.reference:
                # Alternated, ours first: the same clients against each daemon in one run.
                runs.append((" (Go)", reference))
            for label, nsqd in runs:
                output = os.path.join(scratch, f"{bench.name}{'-go' if nsqd else ''}.json")
                command = [sys.executable, "-m", f"bench.{bench.module}", *bench.args]
                command += ["--quick"] if args.quick else []
                command += ["--json", output]
                print(f"\n== {bench.name}{label}: {' '.join(command[1:-2])}", flush=True)
                environment = {**os.environ, REFERENCE_NSQD: nsqd} if nsqd else dict(os.environ)
                if reference is not None:
                    # Go's bench_writer and bench_reader beside it, for bench.four_topics.
                    environment[GO_CLIENTS] = os.path.dirname(reference)
                began = time.monotonic()
                result = subprocess.run(command, cwd=ROOT, env=environment)
                print(
                    f"== {bench.name}{label}: exit {result.returncode},"
                    f" {time.monotonic() - began:.0f} s, load average {load_average():.2f}",
                    flush=True,
                )
                if result.returncode or not os.path.exists(output):
                    failed.append(bench.name + label)
                    continue
                (go_records if nsqd else records).extend(read_records(output))
    print(f"\n== summary ({time.monotonic() - started:.0f} s, commit {revision})\n")
    print(summary(records))
    if reference is not None:
        print(f"\n== against Go's nsqd ({reference})\n")
        print(reference_summary(records, go_records))
    if git_revision() != revision:
        print(f"\nnote: the tree changed during the run: now {git_revision()}")
    missed = sorted(
        {
            record.target
            for record in records
            if record.target and verdict(record.median, TARGETS[record.target]).startswith("MISS")
        }
    )
    if failed:
        print(f"\nfailed: {', '.join(failed)}")
    if args.profile_missed and missed:
        workloads = [PROFILE_OF_TARGET[target] for target in missed]
        print(f"\n== profiles of nsqd under the missed targets: {', '.join(workloads)}")
        subprocess.run(
            [sys.executable, "-m", "bench.profile", "--format", "raw", *workloads], cwd=ROOT
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
