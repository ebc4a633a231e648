"""An nsqd's membership of a cluster, through etcd (docs/design.md §14).

The node's key (`NsqdNodes/Node-<id>`) lives on a lease the session keeps alive: when the node
dies or freezes past `--cluster-node-ttl`, the key goes and the master nsqlookupd moves the
partitions it led. The session reads every topic's metadata and replica info, watches them,
and hands each change to `ClusterNode.apply`. It also finds the master (its leader session
key) for the requests only the master grants: leaving and joining a partition's ISR.

The write path never waits on etcd: a leader keeps serving while etcd is away, and only ISR
changes and elections need it.
"""

import json
import logging
import urllib.parse
from typing import TYPE_CHECKING

import trio

from nsqpy import network
from nsqpy.common.cluster_meta import ReplicaInfo, TopicsView
from nsqpy.control_plane import ControlPlaneHealth, keep_running
from nsqpy.etcd import (
    EtcdAuthError,
    EtcdError,
    LeaseLost,
    WatchEvent,
    etcd_client,
    keep_lease_alive,
    release_lease,
)
from nsqpy.nsqd.cluster_partition import ClusterMetadataError, MasterRefusal

if TYPE_CHECKING:
    from nsqpy.nsqd.cluster import ClusterNode

logger = logging.getLogger("nsqd")
MASTER_TIMEOUT = 5.0
# How often every etcd member is asked for itself (for `/stats`).
ETCD_CHECK_INTERVAL = 2.0
# How long a registration that failed waits before the next try.
REGISTER_RETRY_DELAY = 0.5


class ClusterSession:
    def __init__(self, node: "ClusterNode") -> None:
        self.node = node
        self.nsqd = node.nsqd
        options = self.nsqd.options
        self.client = etcd_client(options, network=network.current().etcd)
        self.keys = node.keys
        self.ttl = max(1, round(options.cluster_node_ttl))
        self.view = TopicsView(self.keys)
        self.metas = self.view.metas
        self.infos = self.view.infos
        self.master: dict | None = None
        self.lease = 0
        # With `--workers`, worker 0 holds the node's registration and lease; every worker
        # follows the topics and applies what its own partitions are told.
        self.registers = node.nsqd.worker is None or node.nsqd.worker.index == 0
        self._nursery: trio.Nursery | None = None
        # The revision the watch of the topics goes on from.
        self._topics_from = 0
        # Metadata this node could not apply, said once each.
        self._refused: set[tuple[str, int, str]] = set()
        # The cluster's topics have been read from etcd at least once.
        self.loaded = False
        # etcd's answers, the master, this node's lease: logged once a change, and in
        # `/stats` while they last.
        self.health = ControlPlaneHealth(
            self.client.health, self.nsqd.log, lease_holder="this nsqd"
        )
        # Why this node is not registered now (logged once a change).
        self._register_problem = ""

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with self.client:
            try:
                await self._run(task_status)
            finally:
                if self.lease:
                    # A clean stop: the master moves this node's partitions now.
                    await release_lease(self.client, self.lease)

    async def _run(self, task_status) -> None:
        log = self.nsqd.log
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            # A refused password ends the start (EtcdAuthError, one line); etcd away does not:
            # it may start after nsqd (a whole cluster started at once).
            while self.registers and not await self._try_register(refused_password_ends=True):
                await trio.sleep(REGISTER_RETRY_DELAY)
            await self._load()
            # Each loop outlives whatever escapes it (docs/design.md §14: no daemon exits over
            # its coordination): logged, and started again.
            if self.registers:
                nursery.start_soon(
                    keep_running, "the node's registration", self._keep_registered, log
                )
            nursery.start_soon(keep_running, "following the topics", self._watch_topics, log)
            nursery.start_soon(keep_running, "following the master", self._watch_master, log)
            nursery.start_soon(keep_running, "checking etcd", self._check_etcd, log)
            task_status.started()

    # -- membership --------------------------------------------------------------------------

    async def _register(self) -> None:
        self.lease = await self.client.grant_lease(self.ttl)
        await self.client.put(
            self.keys.nsqd_node(self.node.node_id), self.node.info().to_json(), lease=self.lease
        )
        self.nsqd.log.info(
            "CLUSTER: node %s registered (lease %x, %d s)", self.node.node_id, self.lease, self.ttl
        )
        self.health.lease_lost.end(f"registered again on lease {self.lease:x}")

    async def _try_register(self, *, refused_password_ends: bool = False) -> bool:
        """One registration; whether it was made. Why it was not is logged once a change of
        reason (etcd's own outage is etcd's health's line)."""
        try:
            await self._register()
        except EtcdAuthError as error:
            if refused_password_ends:
                raise
            self._cannot_register(str(error))
            return False
        except EtcdError as error:
            self._cannot_register(
                type(error).__name__ if not self.client.health.reachable else str(error)
            )
            return False
        if self._register_problem:
            self._register_problem = ""
        return True

    def _cannot_register(self, why: str) -> None:
        if why != self._register_problem:
            self._register_problem = why
            if self.client.health.reachable:
                self.nsqd.log.error("CLUSTER: cannot register - %s; trying again", why)

    async def _keep_registered(self) -> None:
        """Keep the node's lease alive; when it is lost (etcd revoked it, or this node could
        not refresh it in time: frozen, cut off), register again on a new one, as a node the
        master may have moved partitions off (the watch brings the news), until it is made."""
        while True:
            try:
                await keep_lease_alive(self.client, self.lease, self.ttl)
            except LeaseLost as error:
                self.health.lease_lost.begin(str(error))
            except (EtcdError, EtcdAuthError) as error:
                self.health.lease_lost.begin(f"its refresh failed - {error}")
            while not await self._try_register():
                await trio.sleep(REGISTER_RETRY_DELAY)
            # What changed while this node was away may have passed its watch by.
            await self._load()

    async def _check_etcd(self) -> None:
        """Every etcd member asked for itself now and then, for `/stats`: the calls go to
        the member that answered last, so a member gone would otherwise stay unnoticed."""
        while True:
            await self.client.check_members()
            await trio.sleep(ETCD_CHECK_INTERVAL)

    # -- following the topics ----------------------------------------------------------------

    async def _load(self) -> int:
        kvs, revision = await self.client.read_prefix(
            self.keys.topics,
            lambda error: None,  # etcd's health says it, once an outage
        )
        # A load after the lease was lost starts again from what etcd holds now.
        self.metas.clear()
        self.infos.clear()
        for kv in kvs:
            self._take(kv.key, kv.value, kv.mod_revision)
        for topic, partition in sorted(self.infos):
            self._apply(topic, partition)
        self._forget_deleted_topics()
        self.loaded = True
        self._topics_from = revision + 1
        return revision

    def _forget_deleted_topics(self) -> None:
        """Local partitions of topics deleted while this node was away go, as in Youzan's
        loadLocalTopicData; unless etcd holds no topic at all (an etcd emptied by accident
        must not empty every node as well)."""
        if not self.metas:
            return
        for topic in self.nsqd.all_partitions():
            if topic.replication.info is not None and topic.name not in self.metas:
                self.node.forget(topic.name, topic.partition, "the topic was deleted")

    def _take(self, key: str, value: bytes | None, revision: int) -> tuple[str, int] | None:
        """The partition whose replica info `key` now holds, if that is what it is."""
        try:
            parsed = self.view.take(key, value, revision)
        except (ValueError, KeyError, TypeError) as error:
            self.nsqd.log.error("CLUSTER: bad metadata at %s - %s", key, error)
            return None
        if parsed is None or parsed[2] != "ReplicaInfo" or value is None:
            return None
        return parsed[0], parsed[1]

    def _apply(self, topic: str, partition: int) -> None:
        meta = self.metas.get(topic)
        info = self.infos.get((topic, partition))
        if meta is None or info is None:
            return
        try:
            self.node.apply(topic, partition, meta, info)
        except (ClusterMetadataError, OSError) as error:
            # One partition this node cannot hold (a name a cluster cannot serve, a disk
            # that refuses its files) costs that partition, never the others or the node.
            key = (topic, partition, str(error))
            if key not in self._refused:
                self._refused.add(key)
                self.nsqd.log.error(
                    "CLUSTER: cannot hold %s/%d as the cluster says - %s", topic, partition, error
                )
        except Exception:
            # A bug must cost the partition it met, never the node and every other one.
            self.nsqd.log.exception("CLUSTER: internal error applying %s/%d", topic, partition)

    def take_info(self, topic: str, partition: int, value: str | bytes, revision: int) -> None:
        """Take a partition's replica info that a peer or the master answered with (written
        at `revision`): this node may not have it from etcd yet, or may not reach etcd."""
        data = value.encode() if isinstance(value, str) else value
        key = self.keys.replica_info(topic, partition)
        if self._take(key, data, int(revision)) is not None:
            self._apply(topic, partition)

    async def _watch_topics(self) -> None:
        """Every change of the topics, from where the last read or event left off
        (`keep_running` starts it again from there)."""
        await self.client.follow_prefix(
            self.keys.topics,
            self._topics_from,
            self._take_event,
            self._load,
            lambda error: None,  # etcd's health says it, once an outage
        )

    def _take_event(self, event: WatchEvent) -> None:
        self._topics_from = max(self._topics_from, event.kv.mod_revision + 1)
        value = event.value
        changed = self._take(event.kv.key, value, event.kv.mod_revision)
        if changed is not None:
            self._apply(*changed)
            return
        parsed = self.keys.parse_topic_key(event.kv.key)
        if parsed is None:
            return
        topic, partition, what = parsed
        if what == "ReplicaInfo" and value is None and partition is not None:
            # The partition is gone from the cluster (`/topic/delete`).
            self.node.forget(topic, partition, "the topic was deleted")
        elif what == "TopicMeta" and value is not None:
            for known, number in list(self.infos):
                if known == topic:
                    self._apply(known, number)
        elif what == "TopicMeta":
            for local in self.nsqd.registry.partitions(topic):
                self.node.forget(topic, local.partition, "the topic was deleted")

    async def reload(self, topic: str, partition: int) -> bool:
        """Read one partition's replica info now (a peer knows a newer one than the watch
        brought so far). Whether etcd answered."""
        try:
            kv = await self.client.get(self.keys.replica_info(topic, partition))
        except (EtcdError, EtcdAuthError) as error:
            self.nsqd.log.error("CLUSTER: cannot read %s/%d - %s", topic, partition, error)
            return False
        if kv is not None and self._take(kv.key, kv.value, kv.mod_revision) is not None:
            self._apply(topic, partition)
        return True

    def refresh(self, topic: str, partition: int) -> None:
        """`reload`, in the background."""
        if self._nursery is not None:
            self._nursery.start_soon(self.reload, topic, partition)

    # -- the master --------------------------------------------------------------------------

    async def _watch_master(self) -> None:
        key = self.keys.lookupd_leader
        while True:
            try:
                # The key and the revision it was read at, in one answer: a master elected
                # between two reads would be missed by a watch from the second's.
                kvs, current = await self.client.get_prefix(key)
                self._take_master(next((kv.value for kv in kvs if kv.key == key), None))
                async with self.client.watch_prefix(key, current + 1) as watch:
                    async for event in watch:
                        self._take_master(event.value)
            except (EtcdError, EtcdAuthError):
                await trio.sleep(REGISTER_RETRY_DELAY)  # etcd's health says it, once an outage

    def _take_master(self, value: bytes | None) -> None:
        try:
            self.master = json.loads(value) if value else None
        except ValueError:
            self.master = None
        self.health.master_changed(self.master)

    def _master_address(self) -> str | None:
        master = self.master
        if not master:
            return None
        return f"{master.get('NodeIP')}:{master.get('HttpPort')}"

    async def _ask_master(self, path: str, *, refusals: bool = False, **params) -> dict | None:
        """The master's answer; None when it could not be had, or it refused (MasterRefusal
        instead with `refusals`)."""
        address = self._master_address()
        if address is None:
            self.nsqd.log.error("CLUSTER: no master nsqlookupd to ask for %s", path)
            return None
        url = f"http://{address}{path}?{urllib.parse.urlencode(params)}"
        try:
            return await _post_json(url, self.nsqd.options.cluster_secret)
        except MasterRefusal as refusal:
            if refusals:
                raise
            self.nsqd.log.error("CLUSTER: %s from the master - %s", path, refusal)
            return None
        except (OSError, ValueError) as error:
            self.nsqd.log.error("CLUSTER: %s from the master - %s", path, error)
            return None

    async def leave_isr(
        self, topic: str, partition: int, nodes: list[str], info: ReplicaInfo
    ) -> ReplicaInfo | None:
        """Ask the master to drop `nodes` from the partition's ISR; the new info once it did
        (applied here at once), None when it did not."""
        for _attempt in range(3):
            try:
                answer = await self._ask_master(
                    "/cluster/isr/leave",
                    refusals=True,
                    topic=topic,
                    partition=partition,
                    node=",".join(nodes),
                    leader=self.node.node_id,
                    epoch=info.epoch,
                )
            except MasterRefusal as refusal:
                if "E_STALE_EPOCH" not in str(refusal):
                    self.nsqd.log.error("CLUSTER: /cluster/isr/leave from the master - %s", refusal)
                    return None
                # The info moved on since this node read it: ask again about the current one.
                if not await self.reload(topic, partition):
                    return None
                current = self.infos.get((topic, partition))
                if current is None or current.leader != self.node.node_id:
                    return None
                if not any(node in current.isr for node in nodes):
                    return current
                info = current
                continue
            if answer is None:
                return None
            if not await self.reload(topic, partition) and "Epoch" in answer:
                # etcd is out of reach from here, the master is not: its answer is what it
                # wrote.
                self.take_info(topic, partition, json.dumps(answer), int(answer["Epoch"]))
            updated = self.infos.get((topic, partition))
            if updated is None or any(node in updated.isr for node in nodes):
                return None
            return updated
        return None

    async def resign(self, topic: str, partition: int, info: ReplicaInfo) -> bool:
        """As the partition's leader, whose disk refuses writes: ask the master to hand the
        partition to a caught-up follower. Whether it did."""
        answer = await self._ask_master(
            "/cluster/leader/resign",
            topic=topic,
            partition=partition,
            node=self.node.node_id,
            epoch=info.epoch,
        )
        return answer is not None and answer.get("Leader") != self.node.node_id

    async def stopping(self) -> dict | None:
        """Ask the master to move this node's leaderships and ISR places off it (a clean
        stop); what it did, or None."""
        return await self._ask_master(
            "/cluster/node/leave", node=self.node.node_id, incarnation=self.node.incarnation
        )

    async def report_unwritable(self, topic: str, partition: int, info: ReplicaInfo) -> bool:
        """Tell the master that this node, the partition's leader, cannot replicate it: the
        master may give it to a follower that the others reach. Whether it was told."""
        return await self._tell_master("/cluster/leader/unwritable", topic, partition, info)

    async def admit(
        self, topic: str, partition: int, node: str, incarnation: str, info: ReplicaInfo
    ) -> ReplicaInfo | None:
        """As the partition's leader, with its writes held, ask the master to move `node`
        (caught up in `incarnation` at this leader's end) from the catch-up list into the
        ISR, if the info is still `info`. The info that holds it (applied here at once); None
        when no answer came; MasterRefusal when the master refused (it did not add it)."""
        address = self._master_address()
        if address is None:
            self.nsqd.log.error("CLUSTER: no master nsqlookupd to ask for /cluster/isr/join")
            return None
        query = urllib.parse.urlencode(
            {
                "topic": topic,
                "partition": partition,
                "node": node,
                "incarnation": incarnation,
                "leader": self.node.node_id,
                "epoch": info.epoch,
            }
        )
        try:
            answer = await _post_json(
                f"http://{address}/cluster/isr/join?{query}",
                self.nsqd.options.cluster_secret,
                abandon_on_cancel=False,
            )
        except MasterRefusal:
            raise
        except (OSError, ValueError) as error:
            self.nsqd.log.error("CLUSTER: /cluster/isr/join from the master - %s", error)
            return None
        if "Epoch" in answer:
            self.take_info(topic, partition, json.dumps(answer), int(answer["Epoch"]))
        return self.infos.get((topic, partition))

    async def _tell_master(self, path: str, topic: str, partition: int, info: ReplicaInfo) -> bool:
        answer = await self._ask_master(
            path, topic=topic, partition=partition, node=self.node.node_id, epoch=info.epoch
        )
        return answer is not None


async def _post_json(url: str, secret: str, *, abandon_on_cancel: bool = True) -> dict:
    """POST to the master as the cluster's own caller (`--cluster-secret`, if any)."""
    answer = await network.current().request(
        "POST",
        url,
        timeout=MASTER_TIMEOUT,
        headers=network.bearer(secret),
        abandon_on_cancel=abandon_on_cancel,
    )
    if answer.status >= 400:
        raise MasterRefusal(f"{answer.status} {answer.body[:200]!r}")
    return json.loads(answer.body) if answer.body else {}
