"""Real network faults (docs/RELIABILITY.md): etcd, nsqlookupd, three nsqds and the clients
each in a network namespace of their own, on a bridge in a namespace of the suite's
(`tests/cluster/netns.py`). Against the leader of a 3-replica topic, one after the other: cut
off from its followers and etcd while its clients still reach it; deaf to its followers; mute
to them; 30 % random packet loss; and 100 ms more latency on every replication link (user
space: no netem here); then retention on every replica under load, a follower started again
inside its lease on an emptied data directory, and the leader's disk (each node's is a 16 MiB
tmpfs) filled, then freed. Smart-client producers and consumers run throughout (one topic
consumed in order). Afterwards: nothing acknowledged lost, first deliveries of the ordered
topic in publishing order, every replica byte-identical from the later of its and its
leader's start, and after each heal the writes resumed within 10 s."""

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cluster.local_cluster import SUITE_NSQD_ARGS
from tests.cluster.netns import Network, set_delay
from tests.cluster.traffic import log_files, retained_log, same_from
from tests.harness import DaemonProcess
from tests.support.polling import poll
from tests.support.tmpfs import Tmpfs

REPO = Path(__file__).parents[2]
FAULT_SECONDS = 4.0
RESUME_WITHIN = 10.0
TOPICS = {"t": False, "o": True}  # name: consumed in order


class Agent:
    """The clients' process in the client namespace (`tests/cluster/netns_agent.py`)."""

    def __init__(self, network: Network) -> None:
        self.process = subprocess.Popen(
            [*network.prefix_for("client"), sys.executable, "-m", "tests.cluster.netns_agent"],
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def ask(self, **request) -> dict:
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        assert line, "the client agent exited"
        return json.loads(line)

    def http(self, method: str, url: str) -> dict:
        return self.ask(op="http", method=method, url=url)

    def close(self) -> None:
        self.process.kill()
        self.process.wait()


class NetCluster:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.network = Network(["etcd", "lookupd", "n0", "n1", "n2", "client"])
        self.processes: list = []
        self.daemons: dict[str, DaemonProcess] = {}
        self.delays: dict[str, Path] = {}
        self.disks: dict[str, Tmpfs] = {}
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    def address(self, host: str) -> str:
        return self.network.addresses[host]

    def _start(self) -> None:
        network = self.network
        self.agent = Agent(network)
        etcd = self.address("etcd")
        etcd_dir = self.root / "etcd"
        self.processes.append(
            subprocess.Popen(
                [
                    *network.prefix_for("etcd"),
                    "/usr/bin/etcd",
                    "--name=netns",
                    f"--data-dir={etcd_dir}",
                    f"--listen-client-urls=http://{etcd}:2379",
                    f"--advertise-client-urls=http://{etcd}:2379",
                    f"--listen-peer-urls=http://{etcd}:2380",
                    f"--initial-advertise-peer-urls=http://{etcd}:2380",
                    f"--initial-cluster=netns=http://{etcd}:2380",
                    "--heartbeat-interval=25",
                    "--election-timeout=250",
                    "--log-level=warn",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
        poll(
            lambda: self.agent.http("POST", f"http://{etcd}:2379/v3/kv/range").get("status"),
            "etcd answering",
            timeout=30.0,
        )
        cluster = [f"-cluster-leadership-addresses=http://{etcd}:2379", "-cluster-node-ttl=2s"]
        lookupd = self.address("lookupd")
        self.daemons["lookupd"] = DaemonProcess(
            "nsqlookupd",
            [
                f"-tcp-address={lookupd}:4160",
                f"-http-address={lookupd}:4161",
                f"-broadcast-address={lookupd}",
                *cluster,
            ],
            prefix=network.prefix_for("lookupd"),
        ).start(wait_for=("TCP", "HTTP"))
        for index in range(3):
            host = f"n{index}"
            ip = self.address(host)
            data = self.root / host
            # A small disk of its own, which a fault fills.
            self.disks[host] = Tmpfs(data, "16m")
            control = self.root / f"{host}.delay"
            set_delay(control, 0)
            self.delays[host] = control
            relay = [sys.executable, "-m", "tests.cluster.delay_relay"]
            self.processes.append(
                subprocess.Popen(
                    [*network.prefix_for(host), *relay, f"{ip}:4251", f"{ip}:4250", str(control)],
                    cwd=REPO,
                    stderr=subprocess.DEVNULL,
                )
            )
            self.daemons[host] = DaemonProcess(
                "nsqd",
                [
                    f"-tcp-address={ip}:4150",
                    f"-http-address={ip}:4151",
                    f"-rpc-port={ip}:4250",
                    "-broadcast-rpc-port=4251",
                    f"-broadcast-address={ip}",
                    f"-lookupd-tcp-address={lookupd}:4160",
                    f"-data-path={data}",
                    f"-node-id={index}",
                    "-sync-every=1",
                    "-sync-timeout=200ms",
                    *cluster,
                    *SUITE_NSQD_ARGS,
                ],
                cwd=data,
                prefix=network.prefix_for(host),
            ).start(wait_for=("TCP", "HTTP", "RPC"))
        poll(
            lambda: len(self.stats().get("nsqd_nodes", [])) == 3,
            "three nsqds in the cluster",
            timeout=30.0,
        )
        poll(lambda: self.stats().get("is_master"), "a master nsqlookupd", timeout=30.0)

    def lookupd_url(self, path: str) -> str:
        return f"http://{self.address('lookupd')}:4161{path}"

    def stats(self) -> dict:
        answer = self.agent.http("GET", self.lookupd_url("/cluster/stats"))
        return json.loads(answer["body"]) if answer.get("status") == 200 else {}

    def partition(self, topic: str) -> dict | None:
        for entry in self.stats().get("partitions", []):
            if entry["topic"] == topic and entry["partition"] == 0:
                return entry
        return None

    def host_of(self, node_id: str) -> str:
        ip = node_id.split(":")[0]
        return next(host for host, address in self.network.addresses.items() if address == ip)

    def create_topic(self, topic: str, ordered: bool) -> None:
        query = f"topic={topic}&partition_num=1&replicator=3"
        if ordered:
            query += "&orderedmulti=true"
        reply = self.agent.http("POST", self.lookupd_url(f"/topic/create?{query}"))
        assert reply.get("status") == 200, reply
        reply = self.agent.http(
            "POST", self.lookupd_url(f"/channel/create?topic={topic}&channel=c")
        )
        assert reply.get("status") == 200, reply

    def whole(self, topic: str) -> bool:
        entry = self.partition(topic)
        return entry is not None and len(entry["isr"]) == 3 and not entry["catchup"]

    def close(self) -> None:
        for daemon in self.daemons.values():
            if daemon.process is not None and daemon.process.poll() is None:
                daemon.kill()
        for process in self.processes:
            process.kill()
            process.wait()
        if hasattr(self, "agent"):
            self.agent.close()
        for disk in self.disks.values():
            disk.close()
        self.network.close()


@pytest.fixture
def net_cluster(tmp_path):
    cluster = NetCluster(tmp_path)
    try:
        yield cluster
    finally:
        cluster.close()


def followers(cluster: NetCluster, entry: dict) -> list[str]:
    return [cluster.host_of(node) for node in entry["isr"] if node != entry["leader"]]


def isolate(cluster: NetCluster, leader: str, peers: list[str]) -> None:
    cluster.network.cut(leader, [*peers, "etcd"])


def deaf(cluster: NetCluster, leader: str, peers: list[str]) -> None:
    cluster.network.cut(leader, peers, outbound=False)


def mute(cluster: NetCluster, leader: str, peers: list[str]) -> None:
    cluster.network.cut(leader, peers, inbound=False)


def lossy(cluster: NetCluster, leader: str, peers: list[str]) -> None:
    cluster.network.lose(leader, 30)


def slow(cluster: NetCluster, leader: str, peers: list[str]) -> None:
    for control in cluster.delays.values():
        set_delay(control, 100)


def replace_follower_disk(cluster: NetCluster, leader: str, peers: list[str]) -> None:
    """A follower killed and started again inside its lease on an emptied data directory."""
    daemon = cluster.daemons[peers[0]]
    daemon.kill()
    for child in (cluster.root / peers[0]).iterdir():
        if child.is_dir():
            shutil.rmtree(child)
        else:
            child.unlink()
    daemon.start(wait_for=("TCP", "HTTP", "RPC"))


def fill_leader_disk(cluster: NetCluster, leader: str, peers: list[str]) -> None:
    cluster.disks[leader].fill()


def run_retention(cluster: NetCluster, leader: str, peers: list[str]) -> None:
    """Retention on every replica of every topic, while they take writes and are consumed."""
    for topic in TOPICS:
        for host in (leader, *peers):
            url = f"http://{cluster.address(host)}:4151/topic/greedyclean?topic={topic}"
            assert cluster.agent.http("POST", url).get("status") == 200


FAULTS = {
    "leader cut off from its followers and etcd": isolate,
    "leader deaf to its followers": deaf,
    "leader mute to its followers": mute,
    "30 % packet loss at the leader": lossy,
    "100 ms more latency on every replication link": slow,
    "retention on every replica": run_retention,
    "a follower's disk replaced": replace_follower_disk,
    "the leader's disk full": fill_leader_disk,
}


def heal_all(cluster: NetCluster) -> None:
    for host in ("n0", "n1", "n2"):
        cluster.network.heal(host)
        set_delay(cluster.delays[host], 0)
        cluster.disks[host].free()


def test_writes_resume_after_every_network_fault_and_nothing_is_lost(net_cluster):
    cluster = net_cluster
    for topic, ordered in TOPICS.items():
        cluster.create_topic(topic, ordered)
        poll(lambda t=topic: cluster.whole(t), f"{topic} on three nodes", timeout=30.0)
    lookupd = f"{cluster.address('lookupd')}:4161"
    assert cluster.agent.ask(op="start", lookupd=lookupd, topics=TOPICS) == {"ok": True}
    poll(
        lambda: all(cluster.agent.ask(op="first_ack_after", at=0).values()),
        "acknowledged publishes to every topic",
        timeout=30.0,
    )
    resumed = {}
    for name, fault in FAULTS.items():
        entry = cluster.partition("t")
        leader = cluster.host_of(entry["leader"])
        fault(cluster, leader, followers(cluster, entry))
        print(f"{time.strftime('%H:%M:%S')} fault '{name}' at {leader}, ISR {entry['isr']}")
        time.sleep(FAULT_SECONDS)  # the fault lasts this long, traffic going on
        heal_all(cluster)
        print(f"{time.strftime('%H:%M:%S')} healed")
        healed = time.monotonic()
        first = poll(
            lambda at=healed: (
                (acks := cluster.agent.ask(op="first_ack_after", at=at))
                and all(moment is not None for moment in acks.values())
                and acks
            ),
            f"writes after healing '{name}'",
            timeout=RESUME_WITHIN + 5,
        )
        resumed[name] = round(max(first.values()) - healed, 2)
        assert resumed[name] <= RESUME_WITHIN, (name, resumed)
        for topic in TOPICS:
            poll(
                lambda t=topic: cluster.whole(t), f"{topic}'s ISR whole after '{name}'", timeout=60
            )
    results = cluster.agent.ask(op="finish", timeout=60)
    print("network faults: writes resumed after (s):", json.dumps(resumed))
    print("network faults:", json.dumps(results))
    for topic, result in results.items():
        if result["lost"]:
            _explain_loss(cluster, topic, result)
        assert result["lost"] == 0, (topic, result)
        # Traffic went on between the faults (the faulted leader's topic acknowledges little
        # while a fault lasts).
        assert result["acknowledged"] > 20, (topic, result)
    assert results["o"]["in_order"], results["o"]
    for topic in TOPICS:
        entry = cluster.partition(topic)
        expected = retained_log(_Node(cluster, entry["leader"]), topic, 0)
        for node_id in entry["isr"]:
            poll(
                lambda n=node_id, t=topic, e=expected: same_from(
                    retained_log(_Node(cluster, n), t, 0), e
                ),
                f"{topic} identical on {node_id} from the later start",
                timeout=30.0,
            )


class _Node:
    """What `log_files` needs of a node: where its data is."""

    def __init__(self, cluster: NetCluster, node_id: str) -> None:
        self.data_path = cluster.root / cluster.host_of(node_id)


def _explain_loss(cluster: NetCluster, topic: str, result: dict) -> None:
    """Where the lost messages are (which replica's log has them) and what every daemon
    logged about the topic from 8 s before the first one's acknowledgement, for the failure's
    report."""
    for sequence, acked_at in zip(result["lost_first"], result["lost_acked_at"], strict=True):
        body = b"%s-%08d" % (topic.encode(), sequence)
        for host in ("n0", "n1", "n2"):
            files = log_files(_Node(cluster, f"{cluster.address(host)}:0:0:0"), topic, 0)
            found = [name for name, data in files.items() if body in data]
            print(f"LOSS {body!r} acknowledged at {acked_at}, on {host}: {found}")
    print(json.dumps(cluster.stats().get("partitions"), indent=1))
    moment = result["lost_acked_at"][0][:8]
    for name, daemon in cluster.daemons.items():
        print(f"===== {name}")
        print(
            "\n".join(
                line
                for line in daemon.lines
                if (f"TOPIC({topic})" in line or "CLUSTER" in line or f"[{topic}" in line)
                and "channels to" not in line
                and _seconds(line) - _seconds(moment) > -8
            )
        )


def _seconds(text: str) -> float:
    """Seconds of the day of a log line (`... 2026/11/26 04:41:27.758 ...`) or of HH:MM:SS."""
    for word in text.split():
        if word.count(":") == 2:
            hours, minutes, seconds = word.split(":")
            return int(hours) * 3600 + int(minutes) * 60 + float(seconds)
    return 0.0
