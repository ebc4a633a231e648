"""A cluster node on every core (docs/design.md §15, "In a cluster"): what `--workers` costs and
gives a 3-node cluster's replicated publishes.

    .venv/bin/python -m bench.cluster_workers [--count 200000] [--partitions 4]
        [--replicator 3] [--workers 1,2] [--runs 3] [--quick]

Per run and worker count: etcd, one nsqlookupd and three nsqds in cluster mode with
`-workers=N` on every node (bench/replication.py's cluster), a topic of `--partitions`
partitions on `--replicator` replicas, one publisher per partition (Youzan's `MPUB topic
partition` to its leader, batches of 200 × 200 bytes, 8 outstanding; bench/_clients.py), all
released together. A publish is acknowledged once every ISR follower has it. Figures: the
acknowledged messages per second over the window, and the CPU time of every nsqd process
(supervisors and workers) and of every cluster process (with nsqlookupd and etcd) per
acknowledged message. The worker counts alternate run by run.
"""

import argparse
import multiprocessing
import sys
import time
import urllib.request
from dataclasses import dataclass

from bench import _clients
from bench._support import (
    Record,
    Report,
    add_common_arguments,
    banner,
    load_average,
    process_cpu_seconds,
    spread,
)
from bench.replication import Cluster, running_cluster

TOPIC = "w"
BATCH = 200


@dataclass
class Sample:
    rate: float  # acknowledged msgs/s, every publisher
    nsqd_cpu_us: float  # CPU µs of the nsqd processes per acknowledged message
    cluster_cpu_us: float  # the same with nsqlookupd and etcd
    load: float


def cpu_of(pids: list[int]) -> float:
    """CPU-seconds of these processes, each with its workers (`process_cpu_seconds`)."""
    return sum(process_cpu_seconds(pid) for pid in pids)


def leaders(cluster: Cluster, partitions: int) -> dict[int, int]:
    """Each partition's leader's TCP port, once every partition has one."""
    found: dict[int, int] = {}

    def all_led() -> bool:
        found.clear()
        for entry in cluster.stats()["partitions"]:
            if entry["topic"] == TOPIC and entry["leader"] and entry.get("writable", True):
                found[entry["partition"]] = int(entry["leader"].split(":")[2])
        return len(found) == partitions

    cluster.wait(all_led, f"a leader for each of {TOPIC}'s partitions")
    return dict(found)


def run_once(workers: int, partitions: int, replicator: int, count: int) -> Sample:
    with running_cluster("nsqpy-bench-workers-", (f"-workers={workers}",)) as cluster:
        lookupd = f"http://127.0.0.1:{cluster.lookupd.ports['HTTP']}"
        create = (
            f"{lookupd}/topic/create?topic={TOPIC}&partition_num={partitions}"
            f"&replicator={replicator}"
        )
        urllib.request.urlopen(urllib.request.Request(create, method="POST"), timeout=30).read()
        ports = leaders(cluster, partitions)
        context = multiprocessing.get_context("spawn")
        barrier = context.Barrier(partitions + 1)
        results = context.Queue()
        batches = count // partitions // BATCH
        clients = [
            context.Process(
                target=_clients.publisher,
                args=(ports[p], (TOPIC, p), batches, BATCH, 200, 8, barrier, results),
            )
            for p in range(partitions)
        ]
        for client in clients:
            client.start()
        nsqds = [node.process.pid for node in cluster.nodes]
        everything = [*nsqds, cluster.lookupd.process.pid, cluster.etcd.process.pid]
        barrier.wait()
        nsqd_before, all_before = cpu_of(nsqds), cpu_of(everything)
        answers = [results.get(timeout=600) for _ in clients]
        nsqd_cpu, all_cpu = cpu_of(nsqds) - nsqd_before, cpu_of(everything) - all_before
        load = load_average()
        for client in clients:
            client.join()
        messages = sum(answer[0] for answer in answers)
        start = min(answer[1] for answer in answers)
        end = max(answer[2] for answer in answers)
        return Sample(
            rate=messages / (end - start),
            nsqd_cpu_us=1e6 * nsqd_cpu / messages,
            cluster_cpu_us=1e6 * all_cpu / messages,
            load=load,
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=200_000, help="messages, all partitions")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--replicator", type=int, default=3)
    parser.add_argument("--workers", default="1,2", help="worker counts to alternate")
    add_common_arguments(parser)
    args = parser.parse_args(argv)
    counts = [int(value) for value in args.workers.split(",")]
    runs = 1 if args.quick else args.runs
    count = 40_000 if args.quick else args.count
    banner(
        "cluster_workers",
        f"3 nsqds in cluster mode, workers {counts}; a topic of {args.partitions} partitions on"
        f" {args.replicator} replicas, a publisher per partition, {count:,} messages a run",
    )
    samples: dict[int, list[Sample]] = {workers: [] for workers in counts}
    for run in range(runs):
        order = counts if run % 2 == 0 else list(reversed(counts))
        for workers in order:
            sample = run_once(workers, args.partitions, args.replicator, count)
            samples[workers].append(sample)
            print(
                f"  run {run + 1}, workers={workers}: {sample.rate:,.0f} msgs/s acknowledged;"
                f" CPU µs a message: nsqds {sample.nsqd_cpu_us:.2f},"
                f" cluster {sample.cluster_cpu_us:.2f}; load {sample.load:.2f}",
                flush=True,
            )
            time.sleep(1)
    report = Report(args.json)
    name = f"{args.partitions} partitions on {args.replicator} replicas"
    for workers in counts:
        taken = samples[workers]
        loads = [sample.load for sample in taken]
        rates = [sample.rate for sample in taken]
        nsqd_cpu = [sample.nsqd_cpu_us for sample in taken]
        print(
            f"  workers={workers}: {spread(rates)} msgs/s; nsqd CPU µs a message"
            f" {spread(nsqd_cpu, '.2f')}"
        )
        report.add(Record("cluster_workers", f"{name}, workers={workers}", "msgs/s", rates, loads))
        report.add(
            Record(
                "cluster_workers",
                f"{name}, workers={workers}: nsqd CPU a message acknowledged",
                "µs",
                nsqd_cpu,
                loads,
            )
        )
    report.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
