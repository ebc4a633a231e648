"""nsqlookupd in a cluster (docs/design.md §14): every nsqlookupd follows the cluster's metadata
in etcd (for `/lookup`'s write leaders and meta, and `/listlookup`); one of them, the master,
elected through etcd, runs the coordinator.

* **Election**: each nsqlookupd registers `NsqlookupdNodes/Node-<id>` on its lease and tries to
  create `LookupdLeaderSession` on the same lease; the one that did is the master until its
  lease ends; the others watch the key and try again when it goes.
* **Placement** (`create_topic`): a partition's replicas go on distinct live nsqds, its leader
  first, spread by partition number; `TopicMeta` and each `ReplicaInfo` are created in etcd,
  and the nsqds, which watch them, take their parts.
* **Failure** (`check`): a node whose key is gone (its lease ended: killed, frozen, cut off)
  leaves every ISR it was in for the catch-up list; where it led, the live ISR member with the
  most messages becomes leader with the next write epoch. Every change is a transaction on
  the info's revision (`Epoch`), so two masters can never both win.
* **Replacement**: a replica whose node stays gone past `--cluster-replace-dead-after` goes to
  the live node that holds the fewest replicas, on the catch-up list: it catches up from the
  leader and joins the ISR, so a partition does not stay under-replicated (or, with two
  replicas, unwritable) while a node is gone for good.
* **ISR requests** from nsqds: a leader drops followers that cannot take its writes
  (`leave_isr`), a caught-up node joins (`join_isr`, next write epoch).
"""

import json
import logging
import urllib.error
import urllib.request
from dataclasses import replace
from typing import TYPE_CHECKING

import trio

from common.cluster_meta import ClusterKeys, NodeInfo, ReplicaInfo, TopicMeta, TopicsView
from common.etcd import EtcdClient, EtcdError, LeaseLost, keep_lease_alive, release_lease

if TYPE_CHECKING:
    from nsqlookupd.server import NSQLookupd

logger = logging.getLogger("nsqlookupd")
# The master checks every partition this often, besides on each node event.
CHECK_INTERVAL = 1.0
OFFSETS_TIMEOUT = 2.0


class CoordinatorError(Exception):
    """A request the coordinator refuses: `status` and Youzan-style `text` for HTTP."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status = status
        self.text = text


class Coordinator:
    def __init__(self, lookupd: "NSQLookupd") -> None:
        self.lookupd = lookupd
        options = lookupd.options
        self.keys = ClusterKeys(options.cluster_leadership_root_dir, options.cluster_id)
        endpoints = [a.strip() for a in options.cluster_leadership_addresses.split(",") if a]
        self.client = EtcdClient(
            [a if "://" in a else f"http://{a}" for a in endpoints], timeout=3.0
        )
        self.ttl = max(1, round(options.cluster_node_ttl))
        self.is_master = False
        self.master: dict | None = None
        self.lookupds: dict[str, dict] = {}
        # A replica's node that is gone -> when the master first saw it gone (trio's clock).
        self._gone_since: dict[str, float] = {}
        self.nodes: dict[str, NodeInfo] = {}
        self.view = TopicsView(self.keys)
        self.metas = self.view.metas
        self.infos = self.view.infos
        self._changed = trio.Event()

    @property
    def node(self) -> dict:
        lookupd = self.lookupd
        address = lookupd.options.broadcast_address
        return {
            "ID": f"{address}:{lookupd.http_port}:{lookupd.tcp_port}",
            "NodeIP": address,
            "TcpPort": str(lookupd.tcp_port),
            "HttpPort": str(lookupd.http_port),
            "RpcPort": "",
            "Epoch": 0,
        }

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        # Started at once: reading the cluster waits on etcd, and a SIGTERM must stop this
        # nsqlookupd even while etcd is away.
        task_status.started()
        async with self.client, trio.open_nursery() as nursery:
            revision = await self._load()
            nursery.start_soon(self._follow, revision + 1)
            nursery.start_soon(self._campaign)

    # -- following the cluster ---------------------------------------------------------------

    async def _load(self) -> int:
        while True:
            try:
                kvs, revision = await self.client.get_prefix(self.keys.base)
                break
            except EtcdError as error:
                self.lookupd.log.error("CLUSTER: cannot read the cluster - %s", error)
                await trio.sleep(0.5)
        for kv in kvs:
            self._take(kv.key, kv.value, kv.mod_revision)
        return revision

    async def _follow(self, revision: int) -> None:
        async with self.client.watch_prefix(self.keys.base, revision) as watch:
            async for event in watch:
                value = event.kv.value if event.kind == "PUT" else None
                self._take(event.kv.key, value, event.kv.mod_revision)
                self._changed.set()

    def _take(self, key: str, value: bytes | None, revision: int) -> None:
        keys = self.keys
        try:
            if key.startswith(keys.nsqd_nodes):
                node = key[len(keys.nsqd_nodes) :].removeprefix("Node-")
                if value is None:
                    self.nodes.pop(node, None)
                else:
                    self.nodes[node] = NodeInfo.from_json(value)
            elif key.startswith(keys.lookupd_nodes):
                node = key[len(keys.lookupd_nodes) :].removeprefix("Node-")
                if value is None:
                    self.lookupds.pop(node, None)
                else:
                    self.lookupds[node] = json.loads(value)
            elif key == keys.lookupd_leader:
                self.master = json.loads(value) if value else None
            else:
                self.view.take(key, value, revision)
        except (ValueError, KeyError, TypeError) as error:
            self.lookupd.log.error("CLUSTER: bad metadata at %s - %s", key, error)

    def leader_of(self, topic: str, partition: int) -> str | None:
        info = self.infos.get((topic, partition))
        return info.leader if info is not None else None

    def is_leader(self, topic: str, partition: int, peer) -> bool:
        """Whether a registered nsqd is the partition's leader (True for partitions that are
        not the cluster's)."""
        info = self.infos.get((topic, partition))
        if info is None:
            return True
        node = self.nodes.get(info.leader)
        if node is None:
            return False
        return node.tcp_port == peer.tcp_port and node.ip == peer.broadcast_address

    def is_writable(self, topic: str, partition: int) -> bool:
        """Whether the partition's ISR is a majority of its replicas (True for partitions
        that are not the cluster's)."""
        info = self.infos.get((topic, partition))
        return info is None or len(info.isr) > info.replica // 2

    def meta_of(self, topic: str) -> TopicMeta | None:
        return self.metas.get(topic)

    def under_replicated(self) -> list[tuple[str, int]]:
        return sorted(key for key, info in self.infos.items() if len(info.isr) < info.replica)

    # -- the master election -----------------------------------------------------------------

    async def _campaign(self) -> None:
        while True:
            lease = 0
            try:
                lease = await self.client.grant_lease(self.ttl)
                node = self.node
                await self.client.put(
                    self.keys.lookupd_node(node["ID"]), json.dumps(node), lease=lease
                )
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._keep, lease, nursery.cancel_scope)
                    while True:
                        if await self.client.create(
                            self.keys.lookupd_leader, json.dumps(node), lease=lease
                        ):
                            self.lookupd.log.info("CLUSTER: this nsqlookupd is the master")
                            self.is_master = True
                            await self._coordinate()
                        await self._wait_for_no_master()
            except (EtcdError, LeaseLost) as error:
                self.lookupd.log.error("CLUSTER: campaign - %s", error)
            finally:
                self.is_master = False
                if lease:
                    # Another nsqlookupd can be master now, not a TTL later.
                    await release_lease(self.client, lease)
            await trio.sleep(0.2)

    async def _keep(self, lease: int, scope: trio.CancelScope) -> None:
        try:
            await keep_lease_alive(self.client, lease, self.ttl)
        finally:
            scope.cancel()

    async def _wait_for_no_master(self) -> None:
        while self.master is not None:
            self._changed = trio.Event()
            await self._changed.wait()

    # -- the master's work --------------------------------------------------------------------

    async def _coordinate(self) -> None:
        while True:
            await self.check()
            with trio.move_on_after(CHECK_INTERVAL):
                self._changed = trio.Event()
                await self._changed.wait()

    async def check(self) -> None:
        """Every partition whose nodes are gone: ISR members leave for the catch-up list, a
        partition whose leader is gone gets a new one, and a replica whose node stays gone
        past `--cluster-replace-dead-after` goes to another node."""
        now = trio.current_time()
        for node in [node for node in self._gone_since if node in self.nodes]:
            del self._gone_since[node]
        for (topic, partition), info in list(self.infos.items()):
            live = self.nodes
            for node in (*info.isr, *info.catchup):
                if node not in live:
                    self._gone_since.setdefault(node, now)
            if info.leader and info.leader not in live:
                await self._elect(topic, partition, info)
            elif any(node not in live for node in info.followers()):
                gone = [node for node in info.followers() if node not in live]
                await self._leave(topic, partition, info, gone)
            elif any(node not in live for node in info.catchup):
                await self._replace_gone(topic, partition, info, now)

    async def _replace_gone(
        self, topic: str, partition: int, info: ReplicaInfo, now: float
    ) -> None:
        """Give the replica of a node gone too long to the live node holding the fewest
        replicas: it joins the catch-up list, catches up from the leader and joins the ISR."""
        after = self.lookupd.options.cluster_replace_dead_after
        gone = [
            node
            for node in info.catchup
            if node not in self.nodes and after > 0 and now - self._gone_since[node] >= after
        ]
        holders = {info.leader, *info.isr, *info.catchup}
        spare = [node for node in self.nodes if node not in holders]
        if not gone or not spare:
            return
        load = dict.fromkeys(spare, 0)
        for other in self.infos.values():
            for node in {other.leader, *other.isr, *other.catchup}:
                if node in load:
                    load[node] += 1
        replacement = min(spare, key=lambda node: (load[node], node))
        updated = replace(
            info, catchup=(*(node for node in info.catchup if node != gone[0]), replacement)
        )
        if await self._write(topic, partition, updated, info):
            self.lookupd.log.info(
                "CLUSTER: %s/%d: %s gone for %.0fs, its replica goes to %s",
                topic,
                partition,
                gone[0],
                now - self._gone_since[gone[0]],
                replacement,
            )

    async def _elect(self, topic: str, partition: int, info: ReplicaInfo) -> None:
        candidates = [node for node in info.isr if node != info.leader and node in self.nodes]
        if not candidates:
            return  # nothing to fail over to: the partition waits for its leader
        counts = {}
        async with trio.open_nursery() as asking:
            for node in candidates:
                asking.start_soon(self._ask_count, node, topic, partition, counts)
        reachable = [node for node in candidates if node in counts]
        if not reachable:
            return
        led = {}
        for other in self.infos.values():
            led[other.leader] = led.get(other.leader, 0) + 1
        leader = max(reachable, key=lambda node: (counts[node], -led.get(node, 0)))
        updated = replace(
            info,
            leader=leader,
            isr=tuple(node for node in info.isr if node in self.nodes),
            catchup=tuple(dict.fromkeys([*info.catchup, info.leader])),
            epoch_for_write=info.epoch_for_write + 1,
        )
        if await self._write(topic, partition, updated, info):
            self.lookupd.log.info(
                "CLUSTER: %s/%d: leader %s gone, %s leads (write epoch %d, %d messages)",
                topic,
                partition,
                info.leader,
                leader,
                updated.epoch_for_write,
                counts[leader],
            )

    async def _ask_count(self, node: str, topic: str, partition: int, counts: dict) -> None:
        info = self.nodes.get(node)
        if info is None:
            return
        url = f"http://{info.ip}:{info.http_port}/partition/offsets?topic={topic}"
        try:
            with trio.fail_after(OFFSETS_TIMEOUT):
                answer = await trio.to_thread.run_sync(_get_json, url, abandon_on_cancel=True)
        except (OSError, ValueError, trio.TooSlowError):
            return
        for entry in answer.get("partitions", []):
            if int(entry.get("partition", -1)) == partition:
                counts[node] = int(entry["end"]["count"])

    async def _leave(
        self, topic: str, partition: int, info: ReplicaInfo, nodes: list[str]
    ) -> ReplicaInfo | None:
        updated = replace(
            info,
            isr=tuple(node for node in info.isr if node not in nodes),
            catchup=tuple(dict.fromkeys([*info.catchup, *nodes])),
        )
        if await self._write(topic, partition, updated, info):
            self.lookupd.log.info(
                "CLUSTER: %s/%d: %s left the ISR", topic, partition, ",".join(nodes)
            )
            return self.infos.get((topic, partition), updated)
        return None

    async def _write(
        self, topic: str, partition: int, updated: ReplicaInfo, previous: ReplicaInfo
    ) -> bool:
        key = self.keys.replica_info(topic, partition)
        revision = await self.client.replace(key, updated.to_json(), previous.epoch)
        if not revision:
            return False
        self._take(key, updated.to_json(), revision)
        return True

    # -- requests -----------------------------------------------------------------------------

    def _require_master(self) -> None:
        if not self.is_master:
            raise CoordinatorError(400, "E_FAILED_ON_NOT_LEADER")

    async def create_topic(self, topic: str, meta: TopicMeta) -> None:
        self._require_master()
        if topic in self.metas:
            raise CoordinatorError(400, "E_TOPIC_EXIST")
        nodes = sorted(self.nodes)
        if len(nodes) < meta.replica:
            raise CoordinatorError(
                400,
                f"E_NOT_ENOUGH_NODES {len(nodes)} nsqd node(s) for {meta.replica} replicas",
            )
        if not await self.client.create(self.keys.topic_meta(topic), meta.to_json()):
            raise CoordinatorError(400, "E_TOPIC_EXIST")
        self.metas[topic] = meta
        for partition in range(meta.partition_num):
            replicas = tuple(nodes[(partition + i) % len(nodes)] for i in range(meta.replica))
            info = ReplicaInfo(replicas[0], replicas, replica=meta.replica)
            key = self.keys.replica_info(topic, partition)
            revision = await self.client.create(key, info.to_json())
            if revision:
                self._take(key, info.to_json(), revision)
        self.lookupd.log.info(
            "CLUSTER: created %s: %d partition(s), %d replica(s)",
            topic,
            meta.partition_num,
            meta.replica,
        )

    async def _current(self, topic: str, partition: int) -> ReplicaInfo:
        kv = await self.client.get(self.keys.replica_info(topic, partition))
        if kv is None:
            raise CoordinatorError(404, "E_TOPIC_NOT_EXIST")
        self._take(kv.key, kv.value, kv.mod_revision)
        return self.infos[(topic, partition)]

    async def leave_isr(self, topic: str, partition: int, nodes: list[str]) -> ReplicaInfo:
        self._require_master()
        for _ in range(5):
            info = await self._current(topic, partition)
            leaving = [node for node in nodes if node in info.isr and node != info.leader]
            if not leaving:
                return info
            updated = await self._leave(topic, partition, info, leaving)
            if updated is not None:
                return updated
        raise CoordinatorError(409, "E_CONFLICT the partition kept changing")

    async def join_isr(self, topic: str, partition: int, node: str) -> ReplicaInfo:
        self._require_master()
        for _ in range(5):
            info = await self._current(topic, partition)
            if node in info.isr:
                return info
            if node not in self.nodes:
                raise CoordinatorError(400, f"E_NOT_LIVE {node} is not a live node")
            updated = replace(
                info,
                isr=(*info.isr, node),
                catchup=tuple(other for other in info.catchup if other != node),
                epoch_for_write=info.epoch_for_write + 1,
            )
            if await self._write(topic, partition, updated, info):
                self.lookupd.log.info("CLUSTER: %s/%d: %s joined the ISR", topic, partition, node)
                return self.infos[(topic, partition)]
        raise CoordinatorError(409, "E_CONFLICT the partition kept changing")


def _get_json(url: str) -> dict:
    try:
        with urllib.request.urlopen(url, timeout=OFFSETS_TIMEOUT) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as error:
        raise ValueError(f"{error.code}") from None
