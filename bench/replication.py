"""Replicated partitions (docs/design.md §14): acknowledged publish throughput by replica count,
and the write unavailability of a leader failover.

    .venv/bin/python -m bench.replication [--count 300000] [--runs 3] [--failovers 5] [--quick]

A cluster of processes on this machine: etcd (/usr/bin/etcd), one nsqlookupd and three nsqds in
cluster mode, every port ephemeral.

* **throughput**: topics `r1`, `r2`, `r3` of one partition with replicator 1, 2 and 3, led by the
  same nsqd; bench.pub_sub's publisher (MPUB batches of 200 × 200-byte messages, 8 outstanding)
  publishes `--count` messages to each, in turn, alternating the order every run; a publish is
  acknowledged once every ISR follower has it. The figure is each rate ÷ replicator 1's, same run.
* **failover**: a publisher sends one PUB at a time to the leader of `f` (replicator 3), which
  it finds through nsqlookupd's `/cluster/stats`; the leader is killed (SIGKILL), and the time
  from the kill to the next acknowledged publish is measured; the node is started again (same
  ports) before the next trial. nsqd's `--cluster-node-ttl` is its default (3 s).
"""

import argparse
import collections
import contextlib
import json
import multiprocessing
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from bench import _clients
from bench._support import BIN, Record, Report, add_common_arguments, banner, runs_of, spread
from nsqpy.common.command import MAGIC_V2, encode_pub
from nsqpy.common.frame import FRAME_TYPE_RESPONSE, FrameDecoder

_LISTENING = re.compile(r"(TCP|HTTP|RPC): listening on \S+:(\d+)")


def free_port() -> int:
    # etcd cannot be given port 0 (its JSON gateway would dial port 0): a port that was free.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Process:
    """A daemon of the cluster; its ports from its `... listening on` lines."""

    def __init__(self, command: list[str], wait_for: tuple[str, ...] = ()) -> None:
        self.command = command
        self.ports: dict[str, int] = {}
        # The last log lines, for the error report when something fails.
        self.lines: collections.deque[str] = collections.deque(maxlen=50)
        self.start(wait_for)

    def start(self, wait_for: tuple[str, ...]) -> None:
        self.process = subprocess.Popen(
            self.command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        deadline = time.monotonic() + 30
        while not all(kind in self.ports for kind in wait_for):
            line = self.process.stderr.readline()
            if not line or time.monotonic() > deadline:
                raise RuntimeError(f"{self.command[0]} did not start")
            match = _LISTENING.search(line)
            if match:
                self.ports[match.group(1)] = int(match.group(2))
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        for line in self.process.stderr:
            self.lines.append(line.rstrip("\n"))

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait()


class Cluster:
    def __init__(self, root: Path, nsqd_args: tuple[str, ...] = ()) -> None:
        etcd = shutil.which("etcd")
        if etcd is None:
            raise SystemExit("etcd not found: `make etcd` installs Debian's etcd-server")
        client, peer = free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{client}"
        self.etcd = Process(
            [
                etcd, "--name=bench", f"--data-dir={root / 'etcd'}",
                f"--listen-client-urls={self.etcd_url}", f"--advertise-client-urls={self.etcd_url}",
                f"--listen-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-cluster=bench=http://127.0.0.1:{peer}", "--log-level=error",
            ]
        )  # fmt: skip
        cluster = [f"-cluster-leadership-addresses={self.etcd_url}", "-cluster-id=bench"]
        self.lookupd = Process(
            [
                str(BIN / "nsqlookupd"), "-tcp-address=127.0.0.1:0", "-http-address=127.0.0.1:0",
                "-broadcast-address=127.0.0.1", *cluster,
            ],
            ("TCP", "HTTP"),
        )  # fmt: skip
        self.root = root
        self.cluster = cluster
        self.nsqd_args = nsqd_args
        self.nodes = [self._nsqd(index, {}) for index in range(3)]
        self.wait(
            lambda: (stats := self.stats())["is_master"] and len(stats["nsqd_nodes"]) == 3,
            "a master nsqlookupd and three nsqds",
        )

    def _nsqd(self, index: int, ports: dict[str, int]) -> Process:
        data = self.root / f"nsqd{index}"
        data.mkdir(exist_ok=True)
        return Process(
            [
                str(BIN / "nsqd"),
                f"-tcp-address=127.0.0.1:{ports.get('TCP', 0)}",
                f"-http-address=127.0.0.1:{ports.get('HTTP', 0)}",
                f"-rpc-port=127.0.0.1:{ports.get('RPC', 0)}",
                "-broadcast-address=127.0.0.1", f"-node-id={index}", f"-data-path={data}",
                f"-lookupd-tcp-address=127.0.0.1:{self.lookupd.ports['TCP']}", *self.cluster,
                *self.nsqd_args,
            ],
            ("TCP", "HTTP", "RPC"),
        )  # fmt: skip

    def restart(self, index: int) -> None:
        self.nodes[index] = self._nsqd(index, self.nodes[index].ports)

    def stats(self) -> dict:
        url = f"http://127.0.0.1:{self.lookupd.ports['HTTP']}/cluster/stats"
        with urllib.request.urlopen(url, timeout=5) as response:
            return json.loads(response.read())

    def create(self, topic: str, replicator: int) -> None:
        url = (
            f"http://127.0.0.1:{self.lookupd.ports['HTTP']}/topic/create?topic={topic}"
            f"&partition_num=1&replicator={replicator}"
        )
        urllib.request.urlopen(urllib.request.Request(url, method="POST"), timeout=10).read()
        self.wait(lambda: self.leader(topic) is not None, f"a leader of {topic}")

    def leader(self, topic: str) -> Process | None:
        for entry in self.stats()["partitions"]:
            if entry["topic"] == topic and entry["leader"]:
                tcp = int(entry["leader"].split(":")[2])
                for node in self.nodes:
                    if node.ports.get("TCP") == tcp and node.process.poll() is None:
                        return node
        return None

    @staticmethod
    def wait(check, what: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out waiting for {what}")
            time.sleep(0.02)

    def close(self) -> None:
        for node in self.nodes:
            node.kill()
        self.lookupd.kill()
        self.etcd.kill()


@contextlib.contextmanager
def running_cluster(prefix: str, nsqd_args: tuple[str, ...] = ()) -> Iterator[Cluster]:
    """A Cluster in a temporary directory of its own, its logs printed if the bench fails,
    stopped and removed at the end."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    cluster = Cluster(root, nsqd_args)
    try:
        yield cluster
    except Exception:
        for index, node in enumerate(cluster.nodes):
            print(f"--- nsqd{index} log (last lines)", *node.lines, sep="\n", file=sys.stderr)
        print("--- nsqlookupd", *cluster.lookupd.lines, sep="\n", file=sys.stderr)
        raise
    finally:
        cluster.close()
        shutil.rmtree(root, ignore_errors=True)


def throughput(cluster: Cluster, topic: str, count: int) -> float:
    node = cluster.leader(topic)
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(1)
    results = context.Queue()
    batches = count // 200
    _clients.publisher(node.ports["TCP"], topic, batches, 200, 200, 8, barrier, results)
    messages, start, end, _cpu, _ = results.get()
    return messages / (end - start)


def pub_once(port: int, topic: str, body: bytes) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
            sock.sendall(MAGIC_V2 + encode_pub(topic, body))
            decoder = FrameDecoder()
            while True:
                data = sock.recv(4096)
                if not data:
                    return False
                for frame in decoder.receive_data(data):
                    return frame.frame_type == FRAME_TYPE_RESPONSE and frame.data == b"OK"
    except OSError:
        return False


def failover(cluster: Cluster) -> float:
    """Seconds from killing the leader of `f` to the next acknowledged publish."""
    old = cluster.leader("f")
    index = cluster.nodes.index(old)
    assert pub_once(old.ports["TCP"], "f", b"before")
    old.kill()
    killed = time.monotonic()
    while True:
        leader = cluster.leader("f")
        if leader is not None and pub_once(leader.ports["TCP"], "f", b"after"):
            unavailable = time.monotonic() - killed
            break
        if time.monotonic() - killed > 60:
            raise RuntimeError("no new leader within 60 s")
        time.sleep(0.02)
    cluster.restart(index)
    cluster.wait(lambda: len(isr_of(cluster, "f")) == 3, "the old leader back in the ISR")
    return unavailable


def isr_of(cluster: Cluster, topic: str) -> list[str]:
    for entry in cluster.stats()["partitions"]:
        if entry["topic"] == topic:
            return entry["isr"]
    return []


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=300_000, help="messages per topic per run")
    parser.add_argument("--failovers", type=int, default=5, help="leader kills")
    add_common_arguments(parser)
    args = parser.parse_args(argv)
    runs = runs_of(args)
    failovers = 2 if args.quick else args.failovers
    banner(
        "replication (bench.replication)",
        f"3 nsqds in cluster mode; {args.count:,} messages of 200 bytes per topic and run,"
        f" {runs} run(s); {failovers} leader kill(s)",
    )
    report = Report(args.json)
    with running_cluster("nsqpy-bench-cluster-") as cluster:
        for replicator in (1, 2, 3):
            cluster.create(f"r{replicator}", replicator)
        rates: dict[int, list[float]] = {1: [], 2: [], 3: []}
        for run in range(runs):
            order = (1, 2, 3) if run % 2 == 0 else (3, 2, 1)
            for replicator in order:
                rates[replicator].append(throughput(cluster, f"r{replicator}", args.count))
            figures = ", ".join(f"replicator {r} {rates[r][-1]:,.0f}" for r in (1, 2, 3))
            print(f"  run {run + 1}: {figures} msgs/s", flush=True)
        load = [os.getloadavg()[0]] * runs
        for replicator in (1, 2, 3):
            workload = f"TCP publish, replicator {replicator}"
            report.add(Record("replication", workload, "msgs/s", rates[replicator], load))
            if replicator > 1:
                ratios = [a / b for a, b in zip(rates[replicator], rates[1], strict=True)]
                print(f"  replicator {replicator} ÷ replicator 1: {spread(ratios, '.2f')}")
                workload = f"TCP publish: replicator {replicator} ÷ replicator 1 (same run)"
                notes = {"target": "≥ 0.4"}
                report.add(Record("replication", workload, "×", ratios, load, notes=notes))
        cluster.create("f", 3)
        unavailable = [failover(cluster) for _ in range(failovers)]
        each = ", ".join(f"{u:.2f}" for u in unavailable)
        print(
            "  failover after kill -9 of the leader: write unavailability p50"
            f" {statistics.median(unavailable):.2f} s ({each})"
        )
        workload = "write unavailability after a leader kill -9"
        notes = {"target": "p50 ≤ 5 s"}
        loads = [0.0] * failovers
        report.add(Record("replication", workload, "s", unavailable, loads, notes=notes))
    report.write()


if __name__ == "__main__":
    main(sys.argv[1:])
