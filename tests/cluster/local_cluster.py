"""A cluster of real processes on 127.0.0.1 for the cluster tests: etcd, nsqlookupd(s) and nsqds
in cluster mode (docs/design.md §14), every port ephemeral.

A node's cluster ID is `<ip>:<rpc port>:<tcp port>:<node id>`, so a node that restarts keeps its
ports: `restart` starts it again on the ports it had. They are chosen below the kernel's
ephemeral range (tests/support/ports.py), so no connection takes one while the node is down.
Everything that depends on the cluster reacting is polled with a deadline (`wait_for`).
"""

import json
import os
import signal
from pathlib import Path

from tests.cluster.etcd_server import EtcdServer
from tests.cluster.proxy import BlackholeProxy
from tests.harness import DaemonProcess, start_nsqlookupd
from tests.support.http import HTTPReply, request
from tests.support.polling import poll
from tests.support.ports import restartable_port
from tests.support.tmpfs import Tmpfs

DEADLINE = 20.0


# What every cluster nsqd of a run gets besides its own flags: `make test-cluster-workers`
# runs the suites that run a cluster with `-workers=2` on every node.
SUITE_NSQD_ARGS = tuple(os.environ.get("NSQPY_TEST_CLUSTER_NSQD_ARGS", "").split())


class Node:
    """One nsqd of the cluster."""

    def __init__(self, cluster: "LocalCluster", index: int) -> None:
        self.cluster = cluster
        self.index = index
        self.data_path = cluster.root / f"nsqd{index}"
        self.data_path.mkdir(parents=True, exist_ok=True)
        # A small disk of its own (`LocalCluster(disks=)`), which a test can fill.
        self.disk: Tmpfs | None = None
        size = cluster.disks.get(index)
        if size is not None:
            self.disk = Tmpfs(self.data_path, size)
        self.ports: dict[str, int] = {}
        self.process: DaemonProcess | None = None
        self.rpc_proxy: BlackholeProxy | None = None

    @property
    def node_id(self) -> str:
        return f"127.0.0.1:{self.ports['RPC']}:{self.ports['TCP']}:{self.index}"

    @property
    def tcp_port(self) -> int:
        return self.ports["TCP"]

    @property
    def http_port(self) -> int:
        return self.ports["HTTP"]

    def start(self) -> "Node":
        return self.launch().wait_listening()

    def launch(self) -> "Node":
        """Start the node's process without waiting for it to listen (`wait_listening`)."""
        cluster = self.cluster
        ports = self.ports
        for kind in ("TCP", "HTTP", "RPC"):
            ports.setdefault(kind, restartable_port())
        rpc = [f"-rpc-port=127.0.0.1:{ports['RPC']}"]
        if cluster.rpc_proxies:
            # Peers reach the node through a proxy the test can black-hole: the node binds a
            # port of its own and advertises the proxy's (its ID carries the proxy's).
            if self.rpc_proxy is None:
                bound = restartable_port()
                self.rpc_proxy = BlackholeProxy(("127.0.0.1", bound))
                self.ports["RPC bound"] = bound
            rpc = [
                f"-rpc-port=127.0.0.1:{ports['RPC bound']}",
                f"-broadcast-rpc-port={self.rpc_proxy.port}",
            ]
        args = [
            f"-tcp-address=127.0.0.1:{ports['TCP']}",
            f"-http-address=127.0.0.1:{ports['HTTP']}",
            *rpc,
            "-broadcast-address=127.0.0.1",
            f"-data-path={self.data_path}",
            f"-node-id={self.index}",
            f"-cluster-leadership-addresses={cluster.etcd_url_of(self.index)}",
            f"-cluster-id={cluster.cluster_id}",
            f"-cluster-node-ttl={cluster.ttl}s",
            "-sync-timeout=200ms",
            *[f"-lookupd-tcp-address=127.0.0.1:{ld.port('TCP')}" for ld in cluster.lookupds],
            *cluster.nsqd_args,
            *cluster.node_args.get(self.index, ()),
            *SUITE_NSQD_ARGS,
        ]
        self.process = DaemonProcess("nsqd", args, cwd=self.data_path).launch()
        return self

    def wait_listening(self) -> "Node":
        self.process.wait_listening(wait_for=("TCP", "HTTP", "RPC"))
        ports = self.ports
        for kind in ("TCP", "HTTP", "RPC"):
            ports[kind] = self.process.port(kind)
        if self.rpc_proxy is not None:
            ports["RPC"] = self.rpc_proxy.port
        return self

    def http(self, method: str, target: str, body: bytes = b"") -> HTTPReply:
        payload = body if method in ("POST", "PUT") else None
        return request(self.http_port, method, target, payload, self.cluster.headers)

    def kill(self) -> None:
        self.process.kill()

    def stop(self) -> None:
        self.process.stop()

    def pause(self) -> None:
        """SIGSTOP to the node's processes (with `--workers`, the supervisor's too), as a
        frozen machine: the workers first, so none sees its supervisor stand still first."""
        for pid in [*self.worker_pids(), self.process.process.pid]:
            os.kill(pid, signal.SIGSTOP)

    def resume(self) -> None:
        for pid in [self.process.process.pid, *self.worker_pids()]:
            os.kill(pid, signal.SIGCONT)

    def worker_pids(self) -> list[int]:
        """The node's worker processes (`--workers`): its process's children."""
        pid = self.process.process.pid
        children: list[int] = []
        try:
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children") as listed:
                    children.extend(int(child) for child in listed.read().split())
        except OSError:
            return []  # the process is gone
        return children

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.process.poll() is None


class LocalCluster:
    def __init__(
        self,
        root: Path,
        etcd: EtcdServer,
        *,
        nsqds: int = 3,
        lookupds: int = 1,
        ttl: float = 2.0,
        nsqd_args: tuple[str, ...] = (),
        node_args: dict[int, tuple[str, ...]] | None = None,
        lookupd_args: tuple[str, ...] = (),
        etcd_urls: dict[int, str] | None = None,
        lookupd_etcd_urls: dict[int, str] | None = None,
        rpc_proxies: bool = False,
        disks: dict[int, str] | None = None,
        credential: str = "",
    ) -> None:
        self.root = root
        # What the tests' HTTP requests carry (Authorization: Bearer), for a secured cluster.
        self.headers = {"Authorization": f"Bearer {credential}"} if credential else {}
        # Nodes whose data directory is a tmpfs of this size, by node index.
        self.disks = disks or {}
        self.etcd = etcd
        # A node's own way to etcd (a black-holing proxy in the chaos tests), by node index.
        self.etcd_urls = etcd_urls or {}
        # Every node's replication port behind a black-holing proxy (`Node.rpc_proxy`).
        self.rpc_proxies = rpc_proxies
        self.cluster_id = "test"
        self.ttl = ttl
        self.nsqd_args = nsqd_args
        # A node's own flags besides `nsqd_args`, by node index.
        self.node_args = node_args or {}
        self.lookupds: list[DaemonProcess] = []
        # nsqlookupds a test froze (SIGSTOP): asked nothing until they run again.
        self.paused_lookupds: set[int] = set()
        for index in range(lookupds):
            directory = root / f"lookupd{index}"
            directory.mkdir(parents=True, exist_ok=True)
            # Ports a restart can take again (the nsqds name them): below the ephemeral range.
            self.lookupds.append(
                start_nsqlookupd(
                    "-broadcast-address=127.0.0.1",
                    # Its own way to etcd (a black-holing proxy), or etcd's.
                    "-cluster-leadership-addresses="
                    + (lookupd_etcd_urls or {}).get(index, etcd.client_url),
                    f"-cluster-id={self.cluster_id}",
                    f"-cluster-node-ttl={ttl}s",
                    *lookupd_args,
                    tcp_port=restartable_port(),
                    http_port=restartable_port(),
                    cwd=directory,
                )
            )
        self.nodes: list[Node] = []
        try:
            # Side by side: each spends most of its start importing, and then waits on etcd.
            for index in range(nsqds):
                self.nodes.append(Node(self, index))
                self.nodes[-1].launch()
            for node in self.nodes:
                node.wait_listening()
            poll(
                lambda: len(self.stats().get("nsqd_nodes", [])) == nsqds,
                lambda: f"nsqds registered: {self.stats()}\n{self._log_tails()}",
            )
            poll(lambda: self.master() is not None, "a master nsqlookupd")
        except BaseException:
            self.close()  # what was started, and the disks mounted
            raise

    def etcd_url_of(self, index: int) -> str:
        return self.etcd_urls.get(index, self.etcd.client_url)

    def close(self) -> None:
        for node in self.nodes:
            if node.process is not None:
                if node.running:
                    node.resume()
                node.kill()
        for index in range(len(self.lookupds)):
            self.kill_lookupd(index)
        for node in self.nodes:
            if node.rpc_proxy is not None:
                node.rpc_proxy.close()
            if node.disk is not None:
                node.disk.close()

    def __enter__(self) -> "LocalCluster":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    # -- nsqlookupd -----------------------------------------------------------------------------

    def kill_lookupd(self, index: int) -> None:
        self.resume_lookupd(index)
        self.lookupds[index].kill()

    def restart_lookupd(self, index: int) -> None:
        """Start an nsqlookupd the test killed again, on the ports it had."""
        # Its arguments name the ports it was given at first.
        self.lookupds[index].launch().wait_listening(wait_for=("TCP", "HTTP"))

    def pause_lookupd(self, index: int) -> None:
        os.kill(self.lookupds[index].process.pid, signal.SIGSTOP)
        self.paused_lookupds.add(index)

    def resume_lookupd(self, index: int) -> None:
        if index in self.paused_lookupds:
            os.kill(self.lookupds[index].process.pid, signal.SIGCONT)
            self.paused_lookupds.discard(index)

    def live_lookupds(self) -> list[int]:
        """The nsqlookupds running and not frozen."""
        return [
            index
            for index, lookupd in enumerate(self.lookupds)
            if lookupd.process.poll() is None and index not in self.paused_lookupds
        ]

    def lookupd_http(self, method: str, target: str, index: int | None = None) -> HTTPReply:
        """A request to nsqlookupd `index`, or to the first one running (and not frozen)."""
        if index is None:
            live = self.live_lookupds()
            index = live[0] if live else 0
        lookupd = self.lookupds[index]
        # No test stops an nsqlookupd it asks: one that exited is a failure of its own, named
        # with its last lines rather than as a refused connection.
        exit_code = lookupd.process.poll()
        if exit_code is not None:
            last = "\n".join(lookupd.lines[-40:])
            raise AssertionError(f"nsqlookupd {index} exited ({exit_code}), last lines:\n{last}")
        return request(lookupd.port("HTTP"), method, target, None, self.headers)

    def stats(self, index: int | None = None) -> dict:
        """`/cluster/stats` of nsqlookupd `index`; by default the master's (the first running
        one's when none is): a standby cut off from etcd holds an older view."""
        if index is not None:
            return self._stats_of(index)
        first = None
        for live in self.live_lookupds():
            try:
                stats = self._stats_of(live)
            except OSError:
                continue  # stopped meanwhile
            if stats.get("is_master"):
                return stats
            first = first or stats
        return first if first is not None else self._stats_of(0)

    def _stats_of(self, index: int) -> dict:
        reply = self.lookupd_http("GET", "/cluster/stats", index)
        assert reply.status == 200, reply
        return json.loads(reply.body)

    def describe(self) -> str:
        """The cluster as the master sees it and what each nsqlookupd last did to it, for a
        failure message."""
        lines = [f"cluster stats: {self.stats()}"]
        for index, lookupd in enumerate(self.lookupds):
            done = [line for line in lookupd.log.splitlines() if "CLUSTER" in line]
            lines.append(f"nsqlookupd {index}, its last cluster lines:")
            lines.extend(done[-40:])
        for node in self.nodes:
            if node.process is None:
                continue
            # A partition's own lines, and what the node could not do with one ("CLUSTER:
            # cannot hold t/0 ...", an internal error and its traceback).
            kept = [
                line
                for line in node.process.log.splitlines()
                if "TOPIC(" in line or "CLUSTER" in line or not line.startswith("[")
            ]
            lines.append(f"nsqd {node.node_id}, its last partition and cluster lines:")
            lines.extend(kept[-25:])
        return "\n".join(lines)

    def _log_tails(self) -> str:
        """Each daemon's last log lines, for a failure message."""
        lines = []
        for name, process in [
            *((f"nsqlookupd {i}", lookupd.process) for i, lookupd in enumerate(self.lookupds)),
            *((f"nsqd {node.index}", node.process) for node in self.nodes),
        ]:
            if process is not None:
                lines.append(f"{name}, its last lines:")
                lines.extend(process.log.splitlines()[-15:])
        return "\n".join(lines)

    def master(self) -> DaemonProcess | None:
        index = self.master_index()
        return self.lookupds[index] if index is not None else None

    def master_index(self) -> int | None:
        """The running nsqlookupd that says it is the master."""
        for index in self.live_lookupds():
            try:
                if self.stats(index).get("is_master"):
                    return index
            except OSError:
                continue  # stopped meanwhile
        return None

    def master_http(self, method: str, target: str) -> HTTPReply:
        master = poll(self.master, "a master nsqlookupd")
        return request(master.port("HTTP"), method, target, None, self.headers)

    def create_topic(self, topic: str, partitions: int, replicas: int, **extra: str) -> None:
        query = f"topic={topic}&partition_num={partitions}&replicator={replicas}"
        for key, value in extra.items():
            query += f"&{key}={value}"
        reply = self.master_http("POST", f"/topic/create?{query}")
        assert reply.status == 200, reply
        for partition in range(partitions):
            poll(
                lambda p=partition: self.node_leading(topic, p) is not None,
                f"a leader of {topic}/{partition}",
            )
            # Followers learn of the partition from etcd a moment after the leader does.
            for node_id in self.partition(topic, partition)["isr"]:
                holder = self.node(node_id)
                poll(
                    lambda n=holder, p=partition: (
                        self.role_of(n, topic, p) in ("leader", "follower")
                    ),
                    f"{node_id} holding {topic}/{partition}",
                )

    def create_writable_topic(
        self, topic: str, partitions: int, replicas: int, channel: str = "c"
    ) -> None:
        """`create_topic`, then `channel` on each partition, and wait until the master lists
        every partition to writers (it lists one once it has a channel)."""
        self.create_topic(topic, partitions, replicas)
        for partition in range(partitions):
            leader = self.node_leading(topic, partition)
            target = f"/channel/create?topic={topic}&channel={channel}&partition={partition}"
            reply = leader.http("POST", target)
            assert reply.status == 200, reply

        def writable() -> bool:
            reply = self.lookupd_http("GET", f"/lookup?topic={topic}&access=w")
            listed = json.loads(reply.body).get("partitions") if reply.status == 200 else None
            return len(listed or {}) == partitions

        poll(writable, f"every partition of {topic} listed to writers")

    def partition(self, topic: str, partition: int) -> dict | None:
        for entry in self.stats()["partitions"]:
            if entry["topic"] == topic and entry["partition"] == partition:
                return entry
        return None

    def node(self, node_id: str) -> Node:
        for node in self.nodes:
            if node.ports and node.node_id == node_id:
                return node
        raise KeyError(node_id)

    def node_leading(self, topic: str, partition: int) -> Node | None:
        """The node that leads the partition and says so (its /stats lists it writable)."""
        entry = self.partition(topic, partition)
        if entry is None or not entry["leader"]:
            return None
        node = self.node(entry["leader"])
        if not node.running:
            return None
        return node if self.role_of(node, topic, partition) == "leader" else None

    @staticmethod
    def role_of(node: Node, topic: str, partition: int) -> str | None:
        """The role `node` says it has for the partition; None when it holds none or is down."""
        try:
            # Short: a frozen node (SIGSTOP) does not answer at all.
            reply = request(
                node.http_port,
                "GET",
                f"/partition/offsets?topic={topic}",
                headers=node.cluster.headers,
                timeout=1,
            )
        except OSError:
            return None
        if reply.status != 200:
            return None
        for item in json.loads(reply.body)["partitions"]:
            if item["partition"] == partition:
                return item.get("role")
        return None
