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
import urllib.error
import urllib.parse
import urllib.request
from typing import TYPE_CHECKING

import trio

from nsqpy.common.cluster_meta import ReplicaInfo, TopicsView
from nsqpy.etcd import (
    EtcdAuthError,
    EtcdError,
    LeaseLost,
    WatchEvent,
    etcd_client,
    keep_lease_alive,
    release_lease,
)
from nsqpy.nsqd.cluster import ClusterMetadataError, MasterRefusal

if TYPE_CHECKING:
    from nsqpy.nsqd.cluster import ClusterNode

logger = logging.getLogger("nsqd")
MASTER_TIMEOUT = 5.0


class ClusterSession:
    def __init__(self, node: "ClusterNode") -> None:
        self.node = node
        self.nsqd = node.nsqd
        options = self.nsqd.options
        self.client = etcd_client(options)
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
        # Metadata this node could not apply, said once each.
        self._refused: set[tuple[str, int, str]] = set()
        # The cluster's topics have been read from etcd at least once.
        self.loaded = False

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with self.client:
            try:
                await self._run(task_status)
            finally:
                if self.lease:
                    # A clean stop: the master moves this node's partitions now.
                    await release_lease(self.client, self.lease)

    async def _run(self, task_status) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            while self.registers:
                try:
                    await self._register()
                    break
                except EtcdError as error:
                    # etcd may start after nsqd (a whole cluster started at once).
                    self.nsqd.log.error("CLUSTER: cannot register with etcd yet - %s", error)
                    await trio.sleep(0.5)
            revision = await self._load()
            if self.registers:
                nursery.start_soon(self._keep_registered)
            nursery.start_soon(self._watch_topics, revision + 1)
            nursery.start_soon(self._watch_master)
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

    async def _keep_registered(self) -> None:
        while True:
            try:
                await keep_lease_alive(self.client, self.lease, self.ttl)
            except LeaseLost as error:
                # Frozen or cut off past the TTL: the master has moved this node's partitions
                # (the watch brings the news). Join again as a node that leads nothing.
                self.nsqd.log.error("CLUSTER: %s; registering again", error)
            while True:
                try:
                    await self._register()
                    # What changed while this node was away may have passed its watch by.
                    await self._load()
                    break
                except (EtcdError, EtcdAuthError) as error:
                    self.nsqd.log.error("CLUSTER: cannot register - %s", error)
                    await trio.sleep(0.5)

    # -- following the topics ----------------------------------------------------------------

    async def _load(self) -> int:
        kvs, revision = await self.client.read_prefix(
            self.keys.topics,
            lambda error: self.nsqd.log.error("CLUSTER: cannot read the topics - %s", error),
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

    async def _watch_topics(self, revision: int) -> None:
        await self.client.follow_prefix(
            self.keys.topics,
            revision,
            self._take_event,
            self._load,
            lambda error: self.nsqd.log.error("CLUSTER: watching the topics - %s", error),
        )

    def _take_event(self, event: WatchEvent) -> None:
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
            except EtcdError as error:
                self.nsqd.log.error("CLUSTER: watching the master - %s", error)
                await trio.sleep(0.5)

    def _take_master(self, value: bytes | None) -> None:
        try:
            self.master = json.loads(value) if value else None
        except ValueError:
            self.master = None

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
            return await trio.to_thread.run_sync(
                _post_json, url, self.nsqd.options.cluster_secret, abandon_on_cancel=True
            )
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
            answer = await trio.to_thread.run_sync(
                _post_json,
                f"http://{address}/cluster/isr/join?{query}",
                self.nsqd.options.cluster_secret,
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


def _post_json(url: str, secret: str) -> dict:
    """POST to the master as the cluster's own caller (`--cluster-secret`, if any)."""
    headers = {"Authorization": f"Bearer {secret}"} if secret else {}
    request = urllib.request.Request(url, method="POST", data=b"", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=MASTER_TIMEOUT) as response:
            body = response.read()
    except urllib.error.HTTPError as error:
        raise MasterRefusal(f"{error.code} {error.read()[:200]!r}") from None
    return json.loads(body) if body else {}
