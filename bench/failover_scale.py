"""Failover at scale (docs/design.md §14): how long until a killed node's partitions take
writes again, against how many partitions it led; and the write gap when the master
nsqlookupd is killed, then a data node.

    .venv/bin/python -m bench.failover_scale [--partitions 30,300] [--runs 1] [--ttl 3]
    .venv/bin/python -m bench.failover_scale --master-then-node [--runs 3]

A cluster of processes on this machine: etcd, nsqlookupd (two with `--master-then-node`: the
master and a standby), three nsqds in cluster mode (`--cluster-node-ttl`, 3 s by default).

* **partitions led** (default): topics of 10 partitions of 3 replicas until the cluster holds
  N partitions in all; every partition gets a prober, a connection to its leader that sends
  one `PUB <topic> <partition>` at a time and, after an error, tries the next live node (a
  follower refuses at once). The node leading the most partitions is killed
  (SIGKILL); for each partition the time from the kill to the first publish *sent after it*
  that is acknowledged: for the partitions it led (their failover) and for those it followed
  (their leader drops it from the ISR); and when the node's key went from etcd (its lease
  ran out: two to three seconds after the kill, by where in its refresh cycle the lease
  was), so that the election is seen apart from the lease. Printed: first / median / last of
  each, also counted from the key's end, and the ratio of the last to the smallest N's last
  (same run).
* **`--master-then-node`**: a topic of 10 partitions; the master nsqlookupd is killed, then
  (0.5 s later) the node leading the most partitions; the figure is the longest write gap of
  any partition it led, from the node's kill: the standby becomes master within the lease and
  carries on the election.
"""

import argparse
import base64
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import trio

from bench._support import BIN, Record, Report, add_common_arguments, banner, runs_of
from bench.replication import Process, free_port
from nsqpy.common.command import MAGIC_V2, encode_pub
from nsqpy.common.frame import FRAME_TYPE_RESPONSE, FrameDecoder

PARTITIONS_A_TOPIC = 10
REPLICAS = 3
PUB_TIMEOUT = 5.0
# A prober publishes this often until the kill, and tries again this long after a refusal.
IDLE_INTERVAL = 0.5
RETRY_INTERVAL = 0.02


class ScaleCluster:
    """etcd, `lookupds` nsqlookupds and three nsqds, every port chosen at start."""

    def __init__(self, root: Path, ttl: float, lookupds: int = 1) -> None:
        etcd = shutil.which("etcd")
        if etcd is None:
            raise SystemExit("etcd not found: `make etcd` installs Debian's etcd-server")
        self.root = root
        client, peer = free_port(), free_port()
        url = self.etcd_url = f"http://127.0.0.1:{client}"
        self.etcd = Process(
            [
                etcd, "--name=bench", f"--data-dir={root / 'etcd'}",
                f"--listen-client-urls={url}", f"--advertise-client-urls={url}",
                f"--listen-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-cluster=bench=http://127.0.0.1:{peer}", "--log-level=error",
            ]
        )  # fmt: skip
        cluster = [
            f"-cluster-leadership-addresses={url}",
            "-cluster-id=bench",
            f"-cluster-node-ttl={ttl:g}s",
        ]
        self.lookupds = [
            Process(
                [
                    str(BIN / "nsqlookupd"),
                    "-tcp-address=127.0.0.1:0",
                    "-http-address=127.0.0.1:0",
                    "-broadcast-address=127.0.0.1",
                    "-balance-interval=off",
                    *cluster,
                ],
                ("TCP", "HTTP"),
            )  # fmt: skip
            for _ in range(lookupds)
        ]
        self.nodes = []
        for index in range(3):
            data = root / f"nsqd{index}"
            data.mkdir(exist_ok=True)
            self.nodes.append(
                Process(
                    [
                        str(BIN / "nsqd"), "-tcp-address=127.0.0.1:0",
                        "-http-address=127.0.0.1:0", "-rpc-port=127.0.0.1:0",
                        "-broadcast-address=127.0.0.1", f"-node-id={index}",
                        f"-data-path={data}",
                        *[f"-lookupd-tcp-address=127.0.0.1:{lookupd.ports['TCP']}"
                          for lookupd in self.lookupds],
                        *cluster,
                    ],
                    ("TCP", "HTTP", "RPC"),
                )
            )  # fmt: skip
        self.wait(lambda: len(self.stats().get("nsqd_nodes", [])) == 3, "a master and three nsqds")

    def master(self) -> Process:
        for lookupd in self.lookupds:
            if lookupd.process.poll() is None and self.stats(lookupd).get("is_master"):
                return lookupd
        raise LookupError("no master")

    def stats(self, lookupd: Process | None = None) -> dict:
        if lookupd is None:
            lookupd = self.live_lookupd()
        url = f"http://127.0.0.1:{lookupd.ports['HTTP']}/cluster/stats"
        with urllib.request.urlopen(url, timeout=5) as response:
            return json.loads(response.read())

    def live_lookupd(self) -> Process:
        return next(lookupd for lookupd in self.lookupds if lookupd.process.poll() is None)

    def create(self, topic: str) -> None:
        master = self.wait(self._master_or_none, "a master")
        url = (
            f"http://127.0.0.1:{master.ports['HTTP']}/topic/create?topic={topic}"
            f"&partition_num={PARTITIONS_A_TOPIC}&replicator={REPLICAS}"
        )
        try:
            urllib.request.urlopen(urllib.request.Request(url, method="POST"), timeout=60).read()
        except urllib.error.HTTPError as error:
            raise RuntimeError(f"creating {topic}: {error.code} {error.read()[:300]!r}") from None

    def _master_or_none(self) -> Process | None:
        try:
            return self.master()
        except (LookupError, OSError):
            return None

    def leaders(self) -> dict[tuple[str, int], int]:
        """Each partition's leader's TCP port, as the cluster says."""
        found = {}
        for entry in self.stats()["partitions"]:
            if entry["leader"]:
                found[(entry["topic"], entry["partition"])] = int(entry["leader"].split(":")[2])
        return found

    def node_id_of_port(self, port: int) -> str:
        return next(node["id"] for node in self.stats()["nodes"] if node["tcp_port"] == port)

    def node_key_exists(self, node_id: str) -> bool:
        """Whether etcd still holds the node's key (its lease has not run out)."""
        key = f"/NSQMetaData/bench/NsqdNodes/Node-{node_id}".encode()
        body = json.dumps({"key": base64.b64encode(key).decode(), "count_only": True}).encode()
        request = urllib.request.Request(f"{self.etcd_url}/v3/kv/range", data=body, method="POST")
        with urllib.request.urlopen(request, timeout=2) as response:
            return int(json.loads(response.read()).get("count", 0)) > 0

    def node_of_port(self, port: int) -> Process:
        return next(node for node in self.nodes if node.ports["TCP"] == port)

    @staticmethod
    def wait(check, what: str, timeout: float = 120):
        deadline = time.monotonic() + timeout
        while True:
            try:
                found = check()
            except OSError:
                found = None
            if found:
                return found
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out waiting for {what}")
            time.sleep(0.05)

    def close(self) -> None:
        for process in [*self.nodes, *self.lookupds, self.etcd]:
            process.kill()


class Publisher:
    """One connection to a node, one `PUB <topic> <partition>` at a time."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.stream: trio.SocketStream | None = None
        self.decoder = FrameDecoder()

    async def publish(self, topic: str, partition: int, body: bytes) -> bool:
        """Whether the publish was acknowledged; any other outcome closes the connection."""
        try:
            with trio.fail_after(PUB_TIMEOUT):
                if self.stream is None:
                    self.stream = await trio.open_tcp_stream("127.0.0.1", self.port)
                    await self.stream.send_all(MAGIC_V2)
                    self.decoder = FrameDecoder()
                await self.stream.send_all(encode_pub(topic, body, partition))
                while True:
                    data = await self.stream.receive_some(4096)
                    if not data:
                        break
                    for frame in self.decoder.receive_data(data):
                        if frame.frame_type == FRAME_TYPE_RESPONSE and frame.data == b"OK":
                            return True
                        break
                    else:
                        continue
                    break
        except (OSError, trio.TooSlowError, trio.BrokenResourceError):
            pass
        self.close()
        return False

    def close(self) -> None:
        if self.stream is not None:
            self.stream.socket.close()
            self.stream = None


class Probes:
    """A prober a partition: one publish at a time to its leader on a connection it keeps,
    every `IDLE_INTERVAL` until the kill (light: 1,000 probers must not load the cluster they
    measure), then as soon as the last one is answered; each partition's first acknowledged
    publish sent after `kill_at`. A prober whose publish fails tries the next live node (a
    follower refuses at once, `E_FAILED_ON_NOT_LEADER`) `RETRY_INTERVAL` later, so no one
    needs to tell it where the leader went, and the cluster is asked nothing meanwhile."""

    def __init__(self, cluster: ScaleCluster, keys: list[tuple[str, int]]) -> None:
        self.cluster = cluster
        self.keys = keys
        self.leaders = cluster.leaders()
        self.ports = [node.ports["TCP"] for node in cluster.nodes]
        self.kill_at: float | None = None
        self.recovered: dict[tuple[str, int], float] = {}
        self.done = trio.Event()
        self.killed_event = trio.Event()
        # Seconds from the kill until the node's key was gone from etcd.
        self.detected = float("nan")

    def killed(self, port: int) -> None:
        self.kill_at = trio.current_time()
        self.ports = [other for other in self.ports if other != port]
        self.killed_event.set()

    async def probe(self, key: tuple[str, int]) -> None:
        topic, partition = key
        publisher = Publisher(self.leaders[key])
        try:
            while key not in self.recovered:
                sent = trio.current_time()
                if await publisher.publish(topic, partition, b"x" * 100):
                    if self.kill_at is not None and sent >= self.kill_at:
                        self.recovered[key] = trio.current_time() - self.kill_at
                        if len(self.recovered) == len(self.keys):
                            self.done.set()
                        return
                    if self.kill_at is None:
                        with trio.move_on_after(IDLE_INTERVAL):
                            await self.killed_event.wait()
                    continue
                ports = self.ports
                port = publisher.port
                publisher.port = (
                    ports[(ports.index(port) + 1) % len(ports)] if port in ports else ports[0]
                )
                await trio.sleep(RETRY_INTERVAL)
        finally:
            publisher.close()


async def watch_key(cluster: ScaleCluster, node_id: str, probes: "Probes") -> None:
    """When the killed node's key goes from etcd (its lease ran out), as seconds after the
    kill, in `probes.detected`."""
    while await trio.to_thread.run_sync(cluster.node_key_exists, node_id):
        await trio.sleep(0.01)
    assert probes.kill_at is not None
    probes.detected = trio.current_time() - probes.kill_at


async def measure_failover(cluster: ScaleCluster, victim: Process, keys) -> "Probes":
    probes = Probes(cluster, keys)
    node_id = cluster.node_id_of_port(victim.ports["TCP"])
    async with trio.open_nursery() as nursery:
        for key in keys:
            nursery.start_soon(probes.probe, key)
        await trio.sleep(2.0)  # every prober connected and publishing
        probes.killed(victim.ports["TCP"])
        victim.kill()
        nursery.start_soon(watch_key, cluster, node_id, probes)
        with trio.move_on_after(120):
            await probes.done.wait()
        probes.done.set()
        nursery.cancel_scope.cancel()
    return probes


def summary(values: list[float]) -> str:
    if not values:
        return "none"
    values = sorted(values)
    return f"{values[0]:.2f} / {statistics.median(values):.2f} / {values[-1]:.2f} s"


def failover_at(root: Path, total: int, ttl: float) -> dict:
    cluster = ScaleCluster(root, ttl)
    try:
        for number in range(total // PARTITIONS_A_TOPIC):
            cluster.create(f"s{number}")
        cluster.wait(
            lambda: (
                len(cluster.leaders()) == total
                and all(len(p["isr"]) == REPLICAS for p in cluster.stats()["partitions"])
            ),
            f"{total} partitions with full ISRs",
            timeout=600,
        )
        leaders = cluster.leaders()
        counts: dict[int, int] = {}
        for port in leaders.values():
            counts[port] = counts.get(port, 0) + 1
        victim_port = max(counts, key=lambda port: counts[port])
        victim = cluster.node_of_port(victim_port)
        led = [key for key, port in leaders.items() if port == victim_port]
        followed = [key for key, port in leaders.items() if port != victim_port]
        probes = trio.run(measure_failover, cluster, victim, led + followed)
        recovered = probes.recovered
        master_log = [line for line in cluster.master().lines if "one pass" in line]
        return {
            "total": total,
            "detected": probes.detected,
            "led": len(led),
            "led_times": [recovered[key] for key in led if key in recovered],
            "followed_times": [recovered[key] for key in followed if key in recovered],
            "missing": len(led) + len(followed) - len(recovered),
            "master_log": master_log[-1:] if master_log else [],
        }
    finally:
        cluster.close()


def master_then_node(root: Path, ttl: float) -> float:
    cluster = ScaleCluster(root, ttl, lookupds=2)
    try:
        cluster.create("m")
        cluster.wait(
            lambda: (
                len(cluster.leaders()) == PARTITIONS_A_TOPIC
                and all(len(p["isr"]) == REPLICAS for p in cluster.stats()["partitions"])
            ),
            "the topic with full ISRs",
        )
        leaders = cluster.leaders()
        counts: dict[int, int] = {}
        for port in leaders.values():
            counts[port] = counts.get(port, 0) + 1
        victim_port = max(counts, key=lambda port: counts[port])
        led = [key for key, port in leaders.items() if port == victim_port]
        master = cluster.master()

        async def run() -> dict:
            probes = Probes(cluster, led)
            async with trio.open_nursery() as nursery:
                for key in led:
                    nursery.start_soon(probes.probe, key)
                await trio.sleep(1.0)
                master.kill()
                await trio.sleep(0.5)
                probes.killed(victim_port)
                cluster.node_of_port(victim_port).kill()
                with trio.move_on_after(120):
                    await probes.done.wait()
                probes.done.set()
                nursery.cancel_scope.cancel()
            return probes.recovered

        recovered = trio.run(run)
        if len(recovered) < len(led):
            raise RuntimeError(f"{len(led) - len(recovered)} partitions never took writes again")
        return max(recovered.values())
    finally:
        cluster.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", default="30,300", help="totals to measure, comma-separated")
    parser.add_argument("--ttl", type=float, default=3.0, help="--cluster-node-ttl, seconds")
    parser.add_argument("--master-then-node", action="store_true")
    add_common_arguments(parser, runs=1)
    args = parser.parse_args(argv)
    runs = runs_of(args)
    report = Report(args.json)
    load = os.getloadavg()[0]
    if args.master_then_node:
        banner(
            "failover after the master's kill (bench.failover_scale)",
            f"2 nsqlookupds, 3 nsqds, {PARTITIONS_A_TOPIC} partitions x {REPLICAS}; {runs} run(s)",
        )
        gaps = []
        for _run in range(runs):
            root = Path(tempfile.mkdtemp(prefix="nsqpy-bench-failover-"))
            try:
                gaps.append(master_then_node(root, args.ttl))
            finally:
                shutil.rmtree(root, ignore_errors=True)
            print(
                f"  write gap after the master's and a node's kill -9: {gaps[-1]:.2f} s", flush=True
            )
        report.add(
            Record(
                "failover_scale",
                "write gap: master nsqlookupd kill -9, then a data node's (standby takes over)",
                "s",
                gaps,
                [load] * len(gaps),
                notes={"ttl": args.ttl},
            )
        )
        report.write()
        return
    totals = [int(value) for value in args.partitions.split(",")]
    banner(
        "failover at scale (bench.failover_scale)",
        f"3 nsqds, topics of {PARTITIONS_A_TOPIC} partitions x {REPLICAS}, totals {totals};"
        f" node lease {args.ttl:g} s; {runs} run(s)",
    )
    for run in range(runs):
        lasts = {}
        for total in totals:
            root = Path(tempfile.mkdtemp(prefix="nsqpy-bench-failover-"))
            try:
                result = failover_at(root, total, args.ttl)
            finally:
                shutil.rmtree(root, ignore_errors=True)
            lasts[total] = max(result["led_times"], default=float("nan"))
            detected = result["detected"]
            after = [seconds - detected for seconds in result["led_times"]]
            print(
                f"  run {run + 1}, {total} partitions, {result['led']} led by the killed node:"
                f" key gone {detected:.2f} s after the kill;"
                f" led {summary(result['led_times'])} ({summary(after)} after the key went);"
                f" followed {summary(result['followed_times'])}"
                + (f"; {result['missing']} never writable" if result["missing"] else "")
                + (f"\n    master: {result['master_log'][0]}" if result["master_log"] else ""),
                flush=True,
            )
            for kind in ("led", "followed"):
                times = result[f"{kind}_times"]
                if times:
                    report.add(
                        Record(
                            "failover_scale",
                            f"{total} partitions: last {kind} partition writable after kill -9",
                            "s",
                            [max(times)],
                            [load],
                            notes={
                                "first": min(times),
                                "median": statistics.median(times),
                                "key_gone_after": detected,
                            },
                        )
                    )
        smallest = totals[0]
        for total in totals[1:]:
            ratio = lasts[total] / lasts[smallest]
            print(f"  run {run + 1}: last led partition, {total} ÷ {smallest}: {ratio:.2f}")
    report.write()


if __name__ == "__main__":
    main(sys.argv[1:])
