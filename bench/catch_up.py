"""A new replica catching up from an aged leader (docs/design.md §14, "Catch-up"): how fast it
copies the retained log, and what that costs the leader's producers meanwhile.

    .venv/bin/python -m bench.catch_up [--megabytes 200] [--runs 3] [--quick]

A cluster of processes on this machine (bench.replication's: etcd, one nsqlookupd, three
nsqds, 8 MiB segments). Each run: a topic of one partition and 2 replicas gets `--megabytes`
of 1 KiB messages; its channel is moved past the first half (`/channel/setoffset`) and
retention runs on both replicas (`/topic/greedyclean`), so the log starts in the middle. A
producer then publishes one MPUB of 20 messages at a time, acknowledged by both replicas;
after 5 s its replicator goes to 3 (`/topic/meta/update`): the third node starts its log over
at the leader's start, copies the rest, and joins the ISR.

* **catch-up rate**: the retained log's size (bytes and messages, the leader's end minus its
  start when the node joined) over the time from the update to the node in the ISR.
* **write cost**: the producer's acknowledged messages per second while the copy ran, as a
  share of its rate in the 5 s before.
"""

import argparse
import json
import socket
import sys
import threading
import time
import urllib.request

from bench._support import Record, Report, add_common_arguments, banner, runs_of, spread
from bench.replication import Cluster, running_cluster
from nsqpy.common.command import MAGIC_V2, encode_mpub
from nsqpy.common.frame import FRAME_TYPE_RESPONSE, FrameDecoder

BODY = b"c" * 1000
SEGMENT = 8 * 1024 * 1024


def call(port: int, method: str, path: str) -> dict:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", method=method, data=b"" if method == "POST" else None
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        body = response.read()
    return json.loads(body) if body else {}


def partition(cluster: Cluster, topic: str) -> dict:
    return next(e for e in cluster.stats()["partitions"] if e["topic"] == topic)


def offsets(node, topic: str) -> dict:
    return call(node.ports["HTTP"], "GET", f"/partition/offsets?topic={topic}")["partitions"][0]


def fill(port: int, topic: str, megabytes: int) -> None:
    """MPUB batches of 100 × 1 KiB, 8 outstanding, until `megabytes` are acknowledged."""
    command = encode_mpub(f"{topic} 0", [BODY] * 100)
    batches = megabytes * 1024 * 1024 // (100 * (len(BODY) + 34))
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(MAGIC_V2 + command * min(8, batches))
        sent, acked = min(8, batches), 0
        decoder = FrameDecoder()
        while acked < batches:
            data = sock.recv(65536)
            if not data:
                raise ConnectionError("nsqd closed the connection")
            oks = sum(1 for frame in decoder.receive_data(data) if frame.data == b"OK")
            acked += oks
            more = min(oks, batches - sent)
            if more:
                sock.sendall(command * more)
                sent += more


class Producer:
    """One MPUB of 20 messages at a time to the partition's leader; each ack's time."""

    def __init__(self, port: int, topic: str) -> None:
        self.times: list[float] = []
        self._stop = threading.Event()
        self._command = encode_mpub(f"{topic} 0", [b"p" * 100] * 20)
        self._thread = threading.Thread(target=self._run, args=(port,), daemon=True)
        self._thread.start()

    def _run(self, port: int) -> None:
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(MAGIC_V2)
            decoder = FrameDecoder()
            while not self._stop.is_set():
                sock.sendall(self._command)
                frames = []
                while not frames:
                    frames = decoder.receive_data(sock.recv(4096))
                frame = frames[0]
                if frame.frame_type != FRAME_TYPE_RESPONSE:
                    raise RuntimeError(f"publish refused: {frame}")
                self.times.append(time.monotonic())

    def rate(self, start: float, end: float) -> float:
        return 20 * sum(1 for moment in self.times if start <= moment < end) / (end - start)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)


def one_run(cluster: Cluster, topic: str, megabytes: int) -> tuple[float, float, float]:
    """(MB/s, messages/s, write rate during the copy ÷ before)."""
    lookupd = cluster.lookupd.ports["HTTP"]
    call(lookupd, "POST", f"/topic/create?topic={topic}&partition_num=1&replicator=2")
    cluster.wait(lambda: cluster.leader(topic) is not None, f"a leader of {topic}")
    leader = cluster.leader(topic)
    call(leader.ports["HTTP"], "POST", f"/channel/create?topic={topic}&channel=c&partition=0")
    fill(leader.ports["TCP"], topic, megabytes)
    end = offsets(leader, topic)["end"]["offset"]
    request = urllib.request.Request(
        f"http://127.0.0.1:{leader.ports['HTTP']}/channel/setoffset?topic={topic}&channel=c"
        "&partition=0",
        method="POST",
        data=f"virtual_queue:{end // 2}".encode(),
    )
    urllib.request.urlopen(request, timeout=30).read()
    isr = partition(cluster, topic)["isr"]
    holders = [n for n in cluster.nodes if any(f":{n.ports['TCP']}:" in m for m in isr)]

    def cleaned() -> bool:
        for node in holders:
            call(node.ports["HTTP"], "POST", f"/topic/greedyclean?topic={topic}&partition=0")
        return all(offsets(node, topic)["start"]["offset"] > 0 for node in holders)

    cluster.wait(cleaned, "retention on both replicas", 60)
    producer = Producer(leader.ports["TCP"], topic)
    try:
        time.sleep(5)  # the producer's rate before the copy
        updated = time.monotonic()
        call(lookupd, "POST", f"/topic/meta/update?topic={topic}&replicator=3")
        cluster.wait(lambda: len(partition(cluster, topic)["isr"]) == 3, "the join", 600)
        joined = time.monotonic()
    finally:
        producer.stop()
    log = offsets(leader, topic)
    copied_bytes = log["end"]["offset"] - log["start"]["offset"]
    copied_messages = log["end"]["count"] - log["start"]["count"]
    took = joined - updated
    cost = producer.rate(updated, joined) / producer.rate(updated - 5, updated)
    call(lookupd, "POST", f"/topic/delete?topic={topic}&partition=**")
    return copied_bytes / took / 1e6, copied_messages / took, cost


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=int, default=200, help="published before aging")
    add_common_arguments(parser, runs=3)
    args = parser.parse_args(argv)
    runs = runs_of(args)
    megabytes = 40 if args.quick else args.megabytes
    banner(
        "catch-up from an aged leader (bench.catch_up)",
        f"{megabytes} MiB published, half removed by retention; {runs} run(s)",
    )
    report = Report(args.json)
    rates, messages, costs = [], [], []
    nsqd_args = (f"-max-bytes-per-file={SEGMENT}",)
    with running_cluster("nsqpy-bench-catch-up-", nsqd_args) as cluster:
        for run in range(runs):
            mb, count, cost = one_run(cluster, f"aged{run}", megabytes)
            rates.append(mb)
            messages.append(count)
            costs.append(cost * 100)
            print(
                f"  run {run + 1}: {mb:.1f} MB/s, {count:,.0f} msgs/s; the producer kept"
                f" {cost:.0%} of its rate meanwhile",
                flush=True,
            )
    loads = [0.0] * runs
    print(f"  catch-up: {spread(rates, '.1f')} MB/s, {spread(messages)} msgs/s")
    print(f"  producer rate while it ran, % of before: {spread(costs, '.0f')}")
    report.add(Record("catch_up", "new replica catch-up rate", "MB/s", rates, loads))
    report.add(Record("catch_up", "new replica catch-up rate", "msgs/s", messages, loads))
    report.add(
        Record("catch_up", "producer rate during the catch-up, % of before", "%", costs, loads)
    )
    report.write()


if __name__ == "__main__":
    main(sys.argv[1:])
