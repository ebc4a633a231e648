"""Operating a replicated cluster (docs/operations.md): the write gap of planned leader
transfers, the duplicates a failover costs consumers, and how long balance takes.

    .venv/bin/python -m bench.cluster_ops [--runs 5] [--quick]

A cluster of processes on this machine (bench.replication's: etcd, one nsqlookupd, three
nsqds, every port ephemeral), the project's smart client as producer and consumer.

* **planned transfer write gap**: a producer publishes one message at a time to each
  partition and records when each is acknowledged; the longest time between two
  acknowledgements around the operation is its write gap, for a rolling restart of the three
  nodes (3 partitions × 3 replicas; each node in turn: SIGTERM, started again, ISRs whole; the
  longest gap of the partitions the stopping node led, and of those it followed; with 2
  replicas a partition takes no writes until the node is back, Youzan's rule), a move of a
  2-replica partition with its leadership to the node that does not hold it
  (`/topic/partition/move?move_leader=true`), and the balance that gives a returned node its
  leaderships back (6 partitions × 3 replicas, a node killed and started again once writes go
  on without it; the gaps of the partitions whose leader moved back, from the node's start).
* **duplicates after a leader kill -9**: a consumer (max-in-flight 100) drains a backlog of a
  3-replica partition; the leader is killed with SIGKILL once half the backlog is consumed;
  the messages delivered twice, as a share of what the consumer received in the 2 s before
  the kill.
* **time to balance**: from starting again a node killed with SIGKILL (6 partitions × 2
  replicas, 3 nodes, as in the issue that asked for balance) to leaders balanced (no node
  leading more than 2).
"""

import argparse
import json
import math
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterable

from bench._support import Record, Report, add_common_arguments, banner, runs_of, spread
from bench.replication import Cluster, running_cluster
from nsqpy.client.blocking import NSQError
from nsqpy.client.smart import SmartClientError, SmartConsumer, SmartProducer


def post(cluster: Cluster, path: str, timeout: float = 120) -> None:
    url = f"http://127.0.0.1:{cluster.lookupd.ports['HTTP']}{path}"
    request = urllib.request.Request(url, method="POST", data=b"")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            response.read()
    except urllib.error.HTTPError as error:
        raise RuntimeError(f"POST {path}: {error.code} {error.read().decode()}") from error


def create(cluster: Cluster, topic: str, partitions: int, replicas: int) -> None:
    post(cluster, f"/topic/create?topic={topic}&partition_num={partitions}&replicator={replicas}")
    cluster.wait(lambda: len(entries(cluster, topic)) == partitions, f"{topic} placed")
    post(cluster, f"/channel/create?topic={topic}&channel=c")


def entries(cluster: Cluster, topic: str) -> dict[int, dict]:
    return {e["partition"]: e for e in cluster.stats()["partitions"] if e["topic"] == topic}


def whole(cluster: Cluster, topic: str) -> bool:
    return all(len(e["isr"]) == e["replica"] for e in entries(cluster, topic).values())


def node_of(cluster: Cluster, node_id: str):
    tcp = int(node_id.split(":")[2])
    return next(n for n in cluster.nodes if n.ports.get("TCP") == tcp)


class Acks:
    """One producer thread per partition, one publish at a time; each acknowledgement's
    time, by partition."""

    def __init__(self, cluster: Cluster, topic: str, partitions: int) -> None:
        self.lookupd = f"127.0.0.1:{cluster.lookupd.ports['HTTP']}"
        self.topic = topic
        self.times: dict[int, list[float]] = {p: [] for p in range(partitions)}
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._produce, args=(p,), daemon=True)
            for p in range(partitions)
        ]
        for thread in self._threads:
            thread.start()

    def _produce(self, partition: int) -> None:
        with SmartProducer(self.lookupd, publish_timeout=30, partition_cooldown=0.2) as producer:
            while not self._stop.is_set():
                try:
                    producer.publish(self.topic, b"x" * 100, partition=partition)
                except (SmartClientError, NSQError, OSError):
                    continue
                self.times[partition].append(time.monotonic())

    def gap(self, partition: int, start: float, end: float) -> float:
        """The longest time between two acknowledgements of `partition` that spans part of
        [start, end]."""
        times = self.times[partition]
        gaps = [b - a for a, b in zip(times, times[1:], strict=False) if b >= start and a <= end]
        return max(gaps, default=0.0)

    def going_on(self, partitions: Iterable[int]) -> bool:
        """Whether each of `partitions` had a publish acknowledged in the last 0.2 s."""
        now = time.monotonic()
        return all(self.times[p] and self.times[p][-1] > now - 0.2 for p in partitions)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)


def rolling_restart_gaps(cluster: Cluster) -> tuple[float, float]:
    """A rolling restart of the three nodes (each: SIGTERM, started again, every ISR whole)
    under a producer per partition (3 partitions × 3 replicas, so each node leads one and
    follows two): the longest write gap of a partition the stopping node led, and of one it
    followed."""
    create(cluster, "restart", 3, 3)
    acks = Acks(cluster, "restart", 3)
    led: list[float] = []
    followed: list[float] = []
    try:
        cluster.wait(lambda: all(len(t) > 100 for t in acks.times.values()), "publishes")
        for index, node in enumerate(cluster.nodes):
            leaders = {p: e["leader"] for p, e in entries(cluster, "restart").items()}
            tcp = f":{node.ports['TCP']}:"
            started = time.monotonic()
            node.process.send_signal(signal.SIGTERM)
            node.process.wait(30)
            cluster.restart(index)
            cluster.wait(lambda: whole(cluster, "restart"), "the ISRs whole again")
            cluster.wait(lambda: acks.going_on(range(3)), "publishes going on")
            for partition, leader in leaders.items():
                gap = acks.gap(partition, started, time.monotonic())
                (led if tcp in leader else followed).append(gap)
        return max(led), max(followed)
    finally:
        acks.stop()
        post(cluster, "/topic/delete?topic=restart&partition=**")


def move_gap(cluster: Cluster) -> float:
    create(cluster, "move", 1, 2)
    acks = Acks(cluster, "move", 1)
    try:
        cluster.wait(lambda: len(acks.times[0]) > 100, "publishes")
        entry = entries(cluster, "move")[0]
        spare = next(
            f"127.0.0.1:{n.ports['RPC']}:{n.ports['TCP']}:{i}"
            for i, n in enumerate(cluster.nodes)
            if f"127.0.0.1:{n.ports['RPC']}:{n.ports['TCP']}:{i}" not in entry["isr"]
        )
        started = time.monotonic()
        post(
            cluster,
            f"/topic/partition/move?topic=move&partition=0&move_leader=true"
            f"&move_from={entry['leader']}&move_to={spare}",
        )
        cluster.wait(lambda: acks.going_on([0]), "publishes going on")
        return acks.gap(0, started, time.monotonic())
    finally:
        acks.stop()
        post(cluster, "/topic/delete?topic=move&partition=**")


def leader_counts(cluster: Cluster, topic: str) -> Counter:
    return Counter(e["leader"] for e in entries(cluster, topic).values())


def balanced(cluster: Cluster, topic: str, partitions: int) -> bool:
    counts = leader_counts(cluster, topic)
    return len(counts) == 3 and max(counts.values()) <= math.ceil(partitions / 3)


def balance(cluster: Cluster, replicas: int, acks_too: bool) -> tuple[float, float]:
    """Seconds from starting a killed node again to balanced leaders, and the longest write
    gap of the partitions whose leader moved back meanwhile."""
    create(cluster, "balance", 6, replicas)
    acks = Acks(cluster, "balance", 6) if acks_too else None
    try:
        if acks is not None:
            cluster.wait(lambda: all(len(t) > 20 for t in acks.times.values()), "publishes")
        victim = cluster.nodes[2]
        victim.kill()
        cluster.wait(lambda: not balanced(cluster, "balance", 6), "the failover", 60)
        if acks is not None:
            cluster.wait(lambda: acks.going_on(range(6)), "publishes without the node", 60)
        before = {p: e["leader"] for p, e in entries(cluster, "balance").items()}
        started = time.monotonic()
        cluster.restart(2)
        cluster.wait(lambda: balanced(cluster, "balance", 6), "balanced leaders", 120)
        took = time.monotonic() - started
        gap = 0.0
        if acks is not None:
            moved = [p for p, e in entries(cluster, "balance").items() if e["leader"] != before[p]]
            cluster.wait(lambda: acks.going_on(moved), "publishes")
            gap = max((acks.gap(p, started, time.monotonic()) for p in moved), default=0.0)
        return took, gap
    finally:
        if acks is not None:
            acks.stop()
        post(cluster, "/topic/delete?topic=balance&partition=**")


def duplicates(cluster: Cluster, backlog: int) -> tuple[float, int, int]:
    """(duplicates ÷ received in the 2 s before the kill, duplicates, that count)."""
    create(cluster, "dups", 1, 3)
    lookupd = f"127.0.0.1:{cluster.lookupd.ports['HTTP']}"
    with SmartProducer(lookupd) as producer:
        for start in range(0, backlog, 200):
            bodies = [b"%09d" % n for n in range(start, min(start + 200, backlog))]
            producer.multi_publish("dups", bodies, partition=0)
    received: Counter = Counter()
    history: list[tuple[float, int]] = []
    lock = threading.Lock()

    def handle(message) -> None:
        with lock:
            received[message.body] += 1

    consumer = SmartConsumer(lookupd, "dups", "c", handle, max_in_flight=100, backoff_max=0.5)
    try:
        started = time.monotonic()
        # The kill comes halfway through the backlog, while the consumer is busy.
        while True:
            with lock:
                consumed = sum(received.values())
            history.append((time.monotonic(), consumed))
            if consumed >= backlog // 2:
                break
            if time.monotonic() - started > 120:
                raise RuntimeError("the consumer did not get half the backlog in 120 s")
            time.sleep(0.01)
        leader = node_of(cluster, entries(cluster, "dups")[0]["leader"])
        index = cluster.nodes.index(leader)
        killed = time.monotonic()
        leader.kill()
        with lock:
            at_kill = sum(received.values())
        if history[0][0] > killed - 2:
            raise RuntimeError(
                f"half the backlog took {killed - history[0][0]:.1f} s, not 2:"
                " give a larger --backlog"
            )
        before = next(count for moment, count in reversed(history) if moment <= killed - 2)
        cluster.wait(lambda: len(received) >= backlog, "the backlog consumed", 120)
    finally:
        consumer.close()
    cluster.restart(index)
    cluster.wait(lambda: whole(cluster, "dups"), "the ISR whole again", 60)
    post(cluster, "/topic/delete?topic=dups&partition=**")
    twice = sum(count - 1 for count in received.values())
    window = at_kill - before
    return twice / window, twice, window


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backlog", type=int, default=400_000, help="messages for duplicates")
    parser.add_argument(
        "--restart-only",
        action="store_true",
        help="measure the rolling restart's write gaps only (before/after a change to stops)",
    )
    add_common_arguments(parser, runs=5)
    args = parser.parse_args(argv)
    runs = runs_of(args)
    banner(
        "cluster operations (bench.cluster_ops)",
        f"3 nsqds in cluster mode; {runs} run(s) of each operation",
    )
    report = Report(args.json)
    figures: dict[str, list[float]] = {
        "rolling restart": [],
        "rolling restart (followed)": [],
        "move": [],
        "balance": [],
        "time to balance": [],
        "duplicates": [],
    }
    with running_cluster("nsqpy-bench-ops-") as cluster:
        for run in range(runs):
            led_gap, followed_gap = rolling_restart_gaps(cluster)
            figures["rolling restart"].append(led_gap)
            figures["rolling restart (followed)"].append(followed_gap)
            if args.restart_only:
                print(
                    f"  run {run + 1}: write gap rolling restart {led_gap * 1000:.0f} ms led,"
                    f" {followed_gap * 1000:.0f} ms followed",
                    flush=True,
                )
                continue
            figures["move"].append(move_gap(cluster))
            _, gap = balance(cluster, replicas=3, acks_too=True)
            figures["balance"].append(gap)
            took, _ = balance(cluster, replicas=2, acks_too=False)
            figures["time to balance"].append(took)
            share, twice, window = duplicates(cluster, args.backlog)
            figures["duplicates"].append(share * 100)
            print(
                f"  run {run + 1}: write gap rolling restart {led_gap * 1000:.0f} ms led,"
                f" {followed_gap * 1000:.0f} ms followed,"
                f" move {figures['move'][-1] * 1000:.0f} ms, balance {gap * 1000:.0f} ms;"
                f" balanced in {took:.1f} s; {twice} duplicates of {window} received in the 2 s"
                f" before the kill ({share:.2%})",
                flush=True,
            )
    loads = [0.0] * runs
    if args.restart_only:
        for kind in ("rolling restart", "rolling restart (followed)"):
            values = [gap * 1000 for gap in figures[kind]]
            print(f"  write gap, {kind}: p50 {spread(values, '.0f')} ms")
        return
    for kind in ("rolling restart", "rolling restart (followed)", "move", "balance"):
        values = [gap * 1000 for gap in figures[kind]]
        print(f"  planned transfer write gap, {kind}: p50 {spread(values, '.0f')} ms")
        report.add(
            Record("cluster_ops", f"planned transfer write gap ({kind})", "ms", values, loads,
                   notes={"target": "p50 ≤ 300 ms"})
        )  # fmt: skip
    took_spread = spread(figures["time to balance"], ".1f")
    print(f"  time from a node's return to balanced leaders: {took_spread} s")
    report.add(
        Record("cluster_ops", "time from a node's return to balanced leaders", "s",
               figures["time to balance"], loads, notes={"target": "≤ 30 s"})
    )  # fmt: skip
    print(
        "  duplicates after a leader kill -9 (max-in-flight 100), % of the 2 s before:"
        f" {spread(figures['duplicates'], '.2f')}"
    )
    report.add(
        Record("cluster_ops", "duplicates after a leader kill -9, % of 2 s of consumption", "%",
               figures["duplicates"], loads, notes={"target": "≤ 1 %"})
    )  # fmt: skip
    report.write()
    print(json.dumps({k: [round(v, 3) for v in vs] for k, vs in figures.items()}))


if __name__ == "__main__":
    main(sys.argv[1:])
