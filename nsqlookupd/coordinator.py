"""nsqlookupd in a cluster (docs/design.md §14): every nsqlookupd follows the cluster's metadata
in etcd (for `/lookup`'s write leaders and meta, and `/listlookup`); one of them, the master,
elected through etcd, runs the coordinator.

* **Election**: each nsqlookupd registers `NsqlookupdNodes/Node-<id>` on its lease and tries to
  create `LookupdLeaderSession` on the same lease; the one that did is the master until its
  lease ends; the others watch the key and try again when it goes.
* **Failure** (`check`): a node whose key is gone (its lease ended: killed, frozen, cut off)
  leaves every ISR it was in for the catch-up list; where it led, the live ISR member with the
  most messages becomes leader with the next write epoch. A leader that is alive but refuses
  writes (it cannot replicate: cut off from its followers one way or both) for
  `UNWRITABLE_GRACE`, or says so, is replaced the same way when a majority of the replicas
  answers without it. Every change is a transaction on the info's revision (`Epoch`), so two
  masters can never both win.
* **Replica count** (`_keep_replicas`, not in upgrade mode): a partition with fewer replicas
  than it should have (a node gone past `--cluster-replace-dead-after`, a node being removed,
  a higher replicator) gets one on the least loaded node without it, which catches up from the
  leader and joins the ISR; then the departing one is dropped. One with more drops the extra.
* **Planned leader transfer** (`transfer_leader`): the leader stops taking publishes, finishes
  what it took and sends its channels' positions (`POST /cluster/leader/handover`); once the
  chosen ISR member has the same log, it is named leader with the next write epoch, and the
  old leader goes on as a follower. Writes pause for the hand-over only. Balancing, moves and
  node removal use it.
* **Balance** (`nsqlookupd/placement.py`): while the cluster is stable and within
  `--balance-interval`, one leader (or replica) move at a time towards every node leading at
  most its share of each topic's partitions and of the cluster's.
* **ISR requests** from nsqds: a leader drops followers that cannot take its writes
  (`leave_isr`), a caught-up node joins (`join_isr`, next write epoch).

The operators' requests (create, expand, move, remove a node, ...) are in
`nsqlookupd/operations.py`.
"""

import json
import logging
from dataclasses import replace
from typing import TYPE_CHECKING

import trio

from nsqpy import network
from nsqpy.common.cluster_meta import (
    ClusterKeys,
    ClusterState,
    NodeInfo,
    ReplicaInfo,
    TopicMeta,
    TopicsView,
)
from nsqpy.control_plane import ControlPlaneHealth, keep_running
from nsqpy.daemon.log import first_error
from nsqpy.etcd import (
    EtcdAuthError,
    EtcdError,
    LeaseLost,
    WatchEvent,
    etcd_client,
    keep_lease_alive,
    release_lease,
)
from nsqpy.nsqlookupd.coordinator_error import CoordinatorError
from nsqpy.nsqlookupd.elections import Elections
from nsqpy.nsqlookupd.info_writes import NotMaster, ReplicaInfoWrites
from nsqpy.nsqlookupd.node_absences import NodeAbsences
from nsqpy.nsqlookupd.node_reports import NodeCallError, NodeReports, call_node
from nsqpy.nsqlookupd.placement import (
    Move,
    node_loads,
    partition_load_factor,
)
from nsqpy.nsqlookupd.replica_moves import ReplicaMoves

if TYPE_CHECKING:
    from nsqpy.nsqlookupd.server import NSQLookupd

logger = logging.getLogger("nsqlookupd")
# The master checks every partition this often, besides on each node event.
CHECK_INTERVAL = 1.0
# How often the master reads every node's partitions (others less often: only for stats).
POLL_INTERVAL = 1.0
FOLLOWER_POLL_INTERVAL = 5.0
# How often every nsqlookupd checks that etcd answers (for /cluster/stats and nsqadmin).
ETCD_CHECK_INTERVAL = 2.0
# A campaign that failed (etcd away, the lease lost) is made again after this.
CAMPAIGN_RETRY_DELAY = 0.2


class Coordinator:
    def __init__(self, lookupd: "NSQLookupd") -> None:
        self.lookupd = lookupd
        options = lookupd.options
        self.keys = ClusterKeys(options.cluster_leadership_root_dir, options.cluster_id)
        self.client = etcd_client(options, network=network.current().etcd)
        self.ttl = max(1, round(options.cluster_node_ttl))
        self.is_master = False
        self.master: dict | None = None
        self.lookupds: dict[str, dict] = {}
        self.state = ClusterState()
        # A replica's node that is gone -> when the master first saw it gone (trio's clock).
        self.gone_since: dict[str, float] = {}
        self.nodes: dict[str, NodeInfo] = {}
        self.view = TopicsView(self.keys)
        self.metas = self.view.metas
        self.infos = self.view.infos
        self.reports = NodeReports()
        # Partitions with no leader to elect, and why (`/cluster/stats`).
        self.leaderless: dict[tuple[str, int], str] = {}
        # Partitions a transfer or move is under way for: nothing else changes them meanwhile.
        self.busy: set[tuple[str, int]] = set()
        # The balancing move under way (Youzan's balanceWaiting), and how many were made.
        self.balancing: Move | None = None
        self.balance_moves = 0
        self.balance_rounds = 0  # times balance looked for a move
        self._changed = trio.Event()
        # The revision the watch of the cluster goes on from.
        self._followed_to = 0
        # etcd's answers, the master, this nsqlookupd's lease: logged once a change, and in
        # `/stats` and `/cluster/stats` while they last.
        self.health = ControlPlaneHealth(
            self.client.health, lookupd.log, lease_holder="this nsqlookupd"
        )
        # The master's replica-info writes: batched, fenced by its master key.
        self.writes = ReplicaInfoWrites(self.client, self.keys.lookupd_leader)
        # Nodes whose key went, until they are taken for gone (or come back).
        self.absences = NodeAbsences(self.ttl, options.cluster_secret)
        # Why this nsqlookupd is not campaigning now (logged once a change).
        self._campaign_problem = ""
        # Elections made in one pass, and the partitions they elected (for the stats).
        self.election_passes = 0
        self.elected = 0
        # The master's elections and ISR departures, and where it puts replicas.
        self.elections = Elections(self)
        self.moves = ReplicaMoves(self)

    @property
    def etcd_ok(self) -> bool:
        return self.client.health.reachable and self.client.health.answered_once

    @property
    def etcd_error(self) -> str:
        if not self.client.health.answered_once and self.client.health.reachable:
            return "not checked yet"
        return self.client.health.error

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
        log = self.lookupd.log
        async with self.client, trio.open_nursery() as nursery:
            # Each loop outlives whatever escapes it (docs/design.md §14: no daemon exits over
            # its coordination): logged, and started again.
            nursery.start_soon(keep_running, "checking etcd", self._check_etcd, log)
            await self._load()
            nursery.start_soon(keep_running, "following the cluster", self._follow, log)
            nursery.start_soon(keep_running, "the campaign", self._campaign, log)
            nursery.start_soon(keep_running, "polling the nodes", self._poll_nodes, log)

    # -- following the cluster ---------------------------------------------------------------

    async def _load(self) -> int:
        kvs, revision = await self.client.read_prefix(
            self.keys.base,
            lambda error: None,  # etcd's health says it, once an outage
        )
        for kv in kvs:
            self.learn(kv.key, kv.value, kv.mod_revision)
        self._followed_to = revision + 1
        return revision

    async def _follow(self) -> None:
        """Every change under the cluster's root, from where the last read or event left off
        (`keep_running` starts it again from there)."""
        await self.client.follow_prefix(
            self.keys.base,
            self._followed_to,
            self._take_event,
            self._load,
            lambda error: None,  # etcd's health says it, once an outage
        )

    def _take_event(self, event: WatchEvent) -> None:
        self.learn(event.kv.key, event.value, event.kv.mod_revision)
        self._followed_to = max(self._followed_to, event.kv.mod_revision + 1)
        self.notify_changed()

    def learn(self, key: str, value: bytes | None, revision: int) -> None:
        """Take what etcd holds at `key` (None: deleted) into this master's view."""
        keys = self.keys
        try:
            if key.startswith(keys.nsqd_nodes):
                node = key[len(keys.nsqd_nodes) :].removeprefix("Node-")
                if value is None:
                    last_known = self.nodes.pop(node, None)
                    self.absences.vanished(node, last_known, trio.current_time())
                    self.reports.forget(node)
                else:
                    self.nodes[node] = NodeInfo.from_json(value)
                    self.absences.returned(node)
            elif key.startswith(keys.lookupd_nodes):
                node = key[len(keys.lookupd_nodes) :].removeprefix("Node-")
                if value is None:
                    self.lookupds.pop(node, None)
                else:
                    self.lookupds[node] = json.loads(value)
            elif key == keys.lookupd_leader:
                self.master = json.loads(value) if value else None
                self.health.master_changed(self.master)
            elif key == keys.cluster_state:
                # Never back to an older revision (see `TopicsView.take`).
                if revision >= self.state.revision:
                    self.state = (
                        ClusterState.from_json(value, revision) if value else ClusterState()
                    )
            else:
                self.view.take(key, value, revision)
        except (ValueError, KeyError, TypeError) as error:
            self.lookupd.log.error("CLUSTER: bad metadata at %s - %s", key, error)

    async def _check_etcd(self) -> None:
        """Whether etcd answers, and each of its members, for `/cluster/stats` (nsqadmin shows
        it): a read through the client's failover, and every member asked for itself."""
        while True:
            try:
                await self.client.get(self.keys.lookupd_leader)
            except (EtcdError, EtcdAuthError):
                pass  # the client's health has it, and says it once
            await self.client.check_members()
            await trio.sleep(ETCD_CHECK_INTERVAL)

    def control_plane(self) -> dict:
        """The `control_plane` object of `/stats` and `/cluster/stats`: what is wrong now
        (etcd unreachable, no master, this nsqlookupd's lease lost, a node whose lease is
        lost), since when, and the elections made so far."""
        view = self.health.to_json()
        now = trio.current_time()
        lost_nodes = []
        holders = {
            node
            for info in self.infos.values()
            for node in (info.leader, *info.isr, *info.catchup)
            if node
        }
        answering = set(self.absences.answering())
        for node in sorted(holders - set(self.nodes)):
            since = self.absences.absent_since(node)
            state = "answers, registering again" if node in answering else "not answering"
            lost_nodes.append(
                {
                    "node": node,
                    "lease_lost_for": round(now - since, 1) if since is not None else None,
                    "state": state,
                }
            )
            seconds = f" for {now - since:.0f} s" if since is not None else ""
            view["problems"].append(f"node {node}: its lease is lost{seconds} ({state})")
        view["healthy"] = not view["problems"]
        view["is_master"] = self.is_master
        view["nodes_lease_lost"] = lost_nodes
        view["elections"] = {
            "passes": self.election_passes,
            "elected": self.elected,
            "transactions": self.writes.transactions,
            "writes": self.writes.writes,
        }
        return view

    async def call_node(
        self, node: NodeInfo, method: str, path: str, timeout: float, **params: object
    ) -> dict:
        """A request to a node's HTTP API as the cluster's own caller (`--cluster-secret`)."""
        secret = self.lookupd.options.cluster_secret
        return await call_node(node, method, path, timeout, secret=secret, **params)

    def lost_members(self, info: ReplicaInfo) -> list[str]:
        """The ISR members that are live in another incarnation than the one the ISR counted
        on (a replaced or emptied disk): they hold none of the acknowledged data."""
        lost = []
        for node in info.isr:
            live = self.nodes.get(node)
            if live is not None and not info.proven(node, live.incarnation):
                lost.append(node)
        return lost

    def catch_up_reports(self, key: tuple[str, int], info: ReplicaInfo) -> list[dict]:
        """The partition's replicas that last reported a catch-up under way, with its
        progress (`nsqd/catch_up.py`)."""
        found = []
        for node in dict.fromkeys([*info.catchup, *info.followers()]):
            report = self.reports.of(node, key)
            progress = report.get("catch_up") if report is not None else None
            if progress:
                found.append({"node": node, **progress})
            elif node in info.catchup:
                found.append({"node": node, "phase": "not reported", "error": ""})
        return found

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

    def eligible_nodes(self) -> list[str]:
        """Live nodes that may take partitions: not being removed, nor removed and waiting to
        be stopped."""
        return sorted(node for node in self.nodes if node not in self.state.removing)

    def holds_any(self, node: str) -> bool:
        return any(info.holds(node) for info in self.infos.values())

    def removed_nodes(self) -> list[str]:
        """Nodes whose removal is done (they hold nothing) and that have not left yet: they
        may be stopped, and are given nothing meanwhile (Youzan's "data_transferred")."""
        return sorted(node for node in self.state.removing if not self.holds_any(node))

    def stable(self) -> bool:
        """Youzan's IsClusterStable, and more: not in upgrade mode, no node still being
        emptied, every partition led by a live node with its full ISR and nothing catching
        up."""
        if self.state.upgrading or any(self.holds_any(node) for node in self.state.removing):
            return False
        for key, info in self.infos.items():
            if info.leader not in self.nodes or info.catchup or len(info.isr) < info.replica:
                return False
            if self.lost_members(info):
                return False
            # What the nodes say: a leader that refuses writes, a member catching up.
            report = self.reports.of(info.leader, key)
            if report is not None and report.get("role") == "leader":
                if not report.get("writable") and not report.get("handing_over"):
                    return False
            for node in info.followers():
                report = self.reports.of(node, key)
                if report is not None and report.get("catching_up"):
                    return False
        return True

    # -- the master election -----------------------------------------------------------------

    async def _campaign(self) -> None:
        """Stand for master, again and again: a lease lost, etcd away or restarted, a master
        key taken by another are each a state this leaves (logged once) for a new
        campaign, never an exit. trio groups what a nursery's child raises: the handlers
        are `except*`, which see an error alone or grouped."""
        while True:
            try:
                await self._stand()
            except* LeaseLost as group:
                self._campaign_stopped(
                    f"the lease was lost - {first_error(group)}", lease_lost=True
                )
            except* NotMaster as group:
                self._campaign_stopped(f"{first_error(group)}")
            except* (EtcdError, EtcdAuthError) as group:
                self._campaign_stopped(f"etcd - {first_error(group)}")
            await trio.sleep(CAMPAIGN_RETRY_DELAY)

    async def _stand(self) -> None:
        """One lease's campaign: register on it, take the master key if it is free and lead
        while the lease lives, else wait for the key to go and try again."""
        lease = await self.client.grant_lease(self.ttl)
        lost = False
        try:
            node = self.node
            await self.client.put(self.keys.lookupd_node(node["ID"]), json.dumps(node), lease=lease)
            self.health.lease_lost.end(f"lease {lease:x}")
            self._campaign_resumed()
            async with trio.open_nursery() as nursery:
                await nursery.start(keep_lease_alive, self.client, lease, self.ttl)
                while True:
                    fence = await self.client.campaign(
                        self.keys.lookupd_leader, json.dumps(node), lease
                    )
                    if fence:
                        await self._lead(fence, lease)
                    await self._wait_for_no_master()
        except* LeaseLost:
            lost = True
            raise
        finally:
            self._step_down()
            if not lost:
                # Another nsqlookupd can be master now, not a TTL later.
                await release_lease(self.client, lease)

    async def _lead(self, fence: int, lease: int) -> None:
        self.writes.fence = fence
        self.is_master = True
        self.lookupd.log.info("CLUSTER: this nsqlookupd is the master (lease %x)", lease)
        try:
            await self._coordinate()
        finally:
            self._step_down()

    def _step_down(self) -> None:
        if self.is_master:
            self.lookupd.log.info("CLUSTER: this nsqlookupd is no longer the master")
        self.is_master = False
        self.writes.stop()

    def _campaign_stopped(self, why: str, *, lease_lost: bool = False) -> None:
        if lease_lost:
            self.health.lease_lost.begin(why)
        if why != self._campaign_problem:
            self._campaign_problem = why
            self.lookupd.log.error("CLUSTER: campaign stopped: %s; campaigning again", why)

    def _campaign_resumed(self) -> None:
        if self._campaign_problem:
            self.lookupd.log.info("CLUSTER: campaigning again (after: %s)", self._campaign_problem)
            self._campaign_problem = ""

    def notify_changed(self) -> None:
        """Wake every task waiting for the cluster's metadata to change."""
        changed, self._changed = self._changed, trio.Event()
        changed.set()

    async def wait_changed(self, timeout: float) -> None:
        """Until the metadata changes, or `timeout` seconds."""
        with trio.move_on_after(timeout):
            await self._changed.wait()

    async def _wait_for_no_master(self) -> None:
        """Until the master key is free: another holds it (this campaign lost), so wait for
        the watch to bring its deletion."""
        if self.master is None:
            # The watch has not brought the holder's key yet: ask again after a moment.
            await self.wait_changed(CAMPAIGN_RETRY_DELAY)
        while self.master is not None:
            await self._changed.wait()

    # -- the master's work --------------------------------------------------------------------

    async def _coordinate(self) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.writes.run)
            nursery.start_soon(self.moves.balance_loop)
            while True:
                try:
                    await self.check()
                except* (EtcdError, EtcdAuthError, CoordinatorError) as group:
                    # etcd away for a moment, a partition that changed meanwhile: the next
                    # check tries again. A lost lease, or the master key gone to another,
                    # ends this master instead.
                    self.lookupd.log.warning("CLUSTER: check - %s", first_error(group))
                if not self.writes.fence:
                    raise NotMaster("the master key is another nsqlookupd's now")
                await self.wait_changed(CHECK_INTERVAL)

    def require_master(self) -> None:
        if not self.is_master:
            raise CoordinatorError(400, "E_FAILED_ON_NOT_LEADER")

    async def check(self) -> None:
        """Every partition whose nodes are gone: ISR members leave for the catch-up list, a
        partition whose leader is gone gets a new one (all of them in one pass, their infos
        in as few transactions as fit); then the replica counts, and the leaders that refuse
        writes. A node whose key went is taken for gone only once it does not answer, or
        after a lease TTL (`nsqlookupd/node_absences.py`)."""
        now = trio.current_time()
        for node in [node for node in self.gone_since if node in self.nodes]:
            del self.gone_since[node]
        live = self.nodes
        absent = {
            node
            for key, info in self.infos.items()
            if key not in self.busy
            for node in (info.leader, *info.isr, *info.catchup)
            if node and node not in live
        }
        gone = await self.absences.gone(absent, now) if absent else set()
        elections: list[tuple[tuple[str, int], ReplicaInfo]] = []
        leaves: list[tuple[tuple[str, int], ReplicaInfo, list[str]]] = []
        steady: list[tuple[tuple[str, int], ReplicaInfo]] = []
        for key, info in sorted(self.infos.items()):
            if key in self.busy:
                continue
            for node in (*info.isr, *info.catchup):
                if node not in live:
                    self.gone_since.setdefault(node, now)
            lost = self.lost_members(info)
            if info.leader and (info.leader in gone or info.leader in lost):
                elections.append((key, info))
            elif any(node in gone or node in lost for node in info.followers()):
                leaves.append((key, info, [n for n in info.followers() if n in gone or n in lost]))
            elif not any(node in absent for node in (info.leader, *info.isr)):
                steady.append((key, info))
        if elections:
            await self.elections.elect_many(elections)
        if leaves:
            await self.elections.leave_many(leaves)
        if not self.state.upgrading:
            for key, info in steady:
                self.leaderless.pop(key, None)
                current = self.infos.get(key)
                if current is not None and current.epoch == info.epoch:
                    await self.moves.keep_replicas(*key, current, now)
        await self.elections.check_leader_health(now)
        if self.state.removing:
            await self.moves.finish_removals()

    async def write_replica_info(
        self, topic: str, partition: int, updated: ReplicaInfo, previous: ReplicaInfo
    ) -> bool:
        """Write `updated` if etcd still holds `previous` (its revision); whether it did."""
        (done,) = await self.write_replica_infos([((topic, partition), updated, previous)])
        return done

    async def write_replica_infos(
        self, items: list[tuple[tuple[str, int], ReplicaInfo, ReplicaInfo]]
    ) -> list[bool]:
        """For each (partition, updated, previous): write `updated` if etcd still holds
        `previous` (its revision), all of them batched and fenced by the master key
        (`nsqlookupd/info_writes.py`); whether each was written. Taken into this master's
        view at once. CoordinatorError when this nsqlookupd is no longer the master."""
        if not items:
            return []
        requests = []
        for (topic, partition), updated, previous in items:
            # Incarnations are kept for ISR members only: one that leaves must earn its place
            # (and have its incarnation recorded) again.
            value = updated.recording({}).to_json()
            requests.append((self.keys.replica_info(topic, partition), value, previous.epoch))
        try:
            revisions = await self.writes.write_many(requests)
        except NotMaster as error:
            raise CoordinatorError(400, f"E_FAILED_ON_NOT_LEADER {error}") from None
        for (key, value, _previous), revision in zip(requests, revisions, strict=True):
            if revision:
                self.learn(key, value, revision)
        if any(revisions):
            self.notify_changed()
        return [bool(revision) for revision in revisions]

    async def current(self, topic: str, partition: int) -> ReplicaInfo:
        kv = await self.client.get(self.keys.replica_info(topic, partition))
        if kv is None:
            raise CoordinatorError(404, "E_TOPIC_NOT_EXIST")
        self.learn(kv.key, kv.value, kv.mod_revision)
        return self.infos[(topic, partition)]

    # -- planned leader transfer ---------------------------------------------------------------

    # -- balance ---------------------------------------------------------------------------------

    # -- reading the nodes ---------------------------------------------------------------------

    async def _poll_nodes(self) -> None:
        """Every node's partitions, for leader health, hand-overs, balance and load factors."""
        while True:
            nodes = dict(self.nodes)
            async with trio.open_nursery() as polling:
                for node_id, node in nodes.items():
                    polling.start_soon(self._poll_node, node_id, node)
            await trio.sleep(POLL_INTERVAL if self.is_master else FOLLOWER_POLL_INTERVAL)

    async def _poll_node(self, node_id: str, node: NodeInfo) -> None:
        try:
            answer = await self.call_node(node, "GET", "/cluster/partitions", POLL_INTERVAL)
        except NodeCallError:
            return
        if node_id in self.nodes:
            self.reports.take(node_id, answer, trio.current_time())

    def node_stats(self) -> dict[str, dict]:
        """Each live node's leaders, replicas and Youzan load factors."""
        loads = node_loads(self.nodes, self.infos, self.reports.loads())
        return {
            node: {
                "leaders": load.leaders,
                "replicas": load.replicas,
                "leader_load_factor": round(load.leader_load_factor, 3),
                "node_load_factor": round(load.node_load_factor, 3),
            }
            for node, load in loads.items()
        }

    def topn_topics(self, count: int) -> list[dict]:
        """Youzan's `topn_topics`: the busiest partitions (`<topic>-<partition>`) by load
        factor."""
        loads = self.reports.loads()
        ranked = sorted(
            ((partition_load_factor(load), key) for key, load in loads.items()),
            key=lambda item: (-item[0], item[1]),
        )[:count]
        return [
            {"topic": f"{topic}-{partition}", "load_factor": round(factor, 3)}
            for factor, (topic, partition) in ranked
        ]

    # -- requests from nsqds ---------------------------------------------------------------------

    @staticmethod
    def check_request(info: ReplicaInfo, *, leader: str, epoch: int) -> None:
        """A node's request about a partition's replicas comes from its leader and acts on
        the info the master holds now (`epoch`, its revision); refused otherwise."""
        if leader != info.leader:
            raise CoordinatorError(400, f"E_FAILED_ON_NOT_LEADER {leader} does not lead it")
        if epoch != info.epoch:
            raise CoordinatorError(409, f"E_STALE_EPOCH epoch {epoch}, the info is at {info.epoch}")

    async def leave_isr(
        self, topic: str, partition: int, nodes: list[str], *, leader: str, epoch: int
    ) -> ReplicaInfo:
        """The leader drops followers that cannot take its writes."""
        self.require_master()
        info = await self.current(topic, partition)
        self.check_request(info, leader=leader, epoch=epoch)
        leaving = [node for node in nodes if node in info.isr and node != info.leader]
        if not leaving:
            return info
        updated = await self.elections.leave(topic, partition, info, leaving)
        if updated is None:
            raise CoordinatorError(409, "E_STALE_EPOCH the partition changed meanwhile")
        return updated

    async def join_isr(
        self, topic: str, partition: int, node: str, incarnation: str, leader: str, epoch: int
    ) -> ReplicaInfo:
        """The partition's leader, holding its writes, admits `node` (caught up to its end in
        `incarnation`) into the ISR (`LeaderRole.admit`): written only if the info is still
        the one at revision `epoch`, so a join the leader gave up on can never land later."""
        self.require_master()
        info = await self.current(topic, partition)
        live = self.nodes.get(node)
        if (
            node in info.isr
            and live is not None
            and incarnation == live.incarnation == info.incarnation_of(node)
            and leader == info.leader
        ):
            return info  # asked again: it is in
        self.check_request(info, leader=leader, epoch=epoch)
        if live is None:
            raise CoordinatorError(400, f"E_NOT_LIVE {node} is not a live node")
        if node not in info.catchup:
            raise CoordinatorError(400, f"E_NOT_CATCHUP {node} does not hold the partition")
        if incarnation != live.incarnation:
            raise CoordinatorError(
                400,
                f"E_INCARNATION {node} caught up in incarnation {incarnation or 'unknown'},"
                f" it is in {live.incarnation or 'unknown'} now",
            )
        updated = replace(
            info,
            isr=(*info.isr, node),
            catchup=tuple(other for other in info.catchup if other != node),
            epoch_for_write=info.epoch_for_write + 1,
        ).recording({node: incarnation})
        if not await self.write_replica_info(topic, partition, updated, info):
            raise CoordinatorError(409, "E_STALE_EPOCH the partition changed meanwhile")
        self.lookupd.log.info("CLUSTER: %s/%d: %s joined the ISR", topic, partition, node)
        return self.infos[(topic, partition)]

    # -- cluster state ---------------------------------------------------------------------------

    async def change_state(self, **changes) -> ClusterState:
        """Write the cluster state with `changes` (a transaction on its revision)."""
        self.require_master()
        for _ in range(5):
            kv = await self.client.get(self.keys.cluster_state)
            current = ClusterState.from_json(kv.value, kv.mod_revision) if kv else ClusterState()
            updated = replace(current, **changes)
            if kv is None:
                revision = await self.client.create(self.keys.cluster_state, updated.to_json())
            else:
                revision = await self.client.replace(
                    self.keys.cluster_state, updated.to_json(), kv.mod_revision
                )
            if revision:
                self.learn(self.keys.cluster_state, updated.to_json(), revision)
                self.notify_changed()
                return self.state
        raise CoordinatorError(409, "E_CONFLICT the cluster state kept changing")
