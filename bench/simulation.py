"""The cluster simulator (nsqpy/simulation.py): how many seeded fault schedules a second one
core runs, and how many simulated seconds a real one holds.

    .venv/bin/python -m bench.simulation [--schedules 100] [--first 0]

Each schedule is `nsqpy/fault_schedule.py`'s: two nsqlookupds and three nsqds started, a topic
of two partitions on three replicas, its producers, one to four faults, the cluster healed and
checked. Its simulated time is the virtual clock at its end (the trace's last line). The
nodes' files go on tmpfs where there is one, as in `make test`.
"""

import argparse
import resource
import sys
import time

from bench._support import Record, Report, add_common_arguments, banner, load_average
from nsqpy.fault_schedule import schedule
from nsqpy.simulation import run_schedule


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedules", type=int, default=100)
    parser.add_argument("--first", type=int, default=0, help="the first seed")
    add_common_arguments(parser, runs=1)
    args = parser.parse_args(argv)
    banner("the cluster simulator (bench.simulation)", f"{args.schedules:,} schedules")
    report = Report(args.json)
    load = load_average()
    simulated = 0.0
    failed = 0
    started, cpu_started = time.perf_counter(), cpu_seconds()
    for seed in range(args.first, args.first + args.schedules):
        trace, failures = run_schedule(seed, schedule)
        simulated += float(trace[-1].split()[0]) if trace else 0.0
        failed += bool(failures)
    elapsed, cpu = time.perf_counter() - started, cpu_seconds() - cpu_started
    rate = args.schedules / elapsed
    ratio = simulated / elapsed
    each = cpu / args.schedules * 1000
    count = args.schedules
    print(f"  {count:,} schedules in {elapsed:.1f} s, {cpu:.1f} s CPU ({each:.0f} ms each);")
    print(f"  {rate:.2f} schedules a second; {simulated / args.schedules:.1f} simulated s each,")
    print(f"  {ratio:.0f} simulated s a real second; {failed} failed")
    report.add(Record("simulation", "schedules a second", "1/s", [rate], [load]))
    report.add(Record("simulation", "simulated seconds a real second", "s/s", [ratio], [load]))
    report.write()


if __name__ == "__main__":
    main(sys.argv[1:])
