"""The operators' requests to a cluster's master nsqlookupd (docs/operations.md, "Operating a
replicated cluster"), with Youzan's names, parameters and error texts
(`nsqlookupd/http.go`, `consistence/nsqlookup_coord_api.go`): creating, expanding, moving,
updating and deleting topics, removing a node, upgrade mode, top-N balance, tombstoning an
nsqlookupd, and channels made or deleted on every partition's leader.

Each raises CoordinatorError with the status and text Youzan's nsqlookupd answers.
"""

import time
from dataclasses import replace
from typing import TYPE_CHECKING

import trio

from nsqpy.common.cluster_meta import ReplicaInfo, TopicMeta
from nsqpy.common.names import is_valid_name
from nsqpy.nsqlookupd.coordinator import CoordinatorError
from nsqpy.nsqlookupd.node_reports import NodeCallError
from nsqpy.nsqlookupd.placement import place_partitions

if TYPE_CHECKING:
    from nsqpy.nsqlookupd.coordinator import Coordinator

# Youzan's limits (consistence/nsqlookup_coord_api.go).
MAX_PARTITION_NUM = 255
MAX_SYNC_EVERY = 4000
MAX_RETENTION_DAYS = 60
MAX_REPLICATOR = 5
# Youzan's error texts.
NOT_MASTER = "Not nsqlookup leader"
TOPIC_NOT_CREATED = "topic is not created"
CLUSTER_UNSTABLE = "the cluster is unstable"
NO_NODE = "No node is available for topic"
CHANNEL_CALL_TIMEOUT = 5.0


class ClusterOperations:
    def __init__(self, coordinator: "Coordinator") -> None:
        self.coordinator = coordinator
        self.log = coordinator.lookupd.log

    def _require_master(self, status: int = 400) -> None:
        if not self.coordinator.is_master:
            raise CoordinatorError(status, NOT_MASTER)

    def _meta(self, topic: str, status: int = 400) -> TopicMeta:
        meta = self.coordinator.metas.get(topic)
        if meta is None:
            raise CoordinatorError(status, TOPIC_NOT_CREATED)
        return meta

    # -- topics ----------------------------------------------------------------------------

    async def create_topic(self, topic: str, meta: TopicMeta) -> None:
        """Youzan's CreateTopic: `TopicMeta`, then each partition's `ReplicaInfo`, placed on
        the least loaded nodes (`nsqlookupd/placement.py`)."""
        coordinator = self.coordinator
        coordinator.require_master()
        # The limits `/topic/meta/update` keeps, with its texts.
        if meta.retention_day > MAX_RETENTION_DAYS:
            raise CoordinatorError(400, "max retention days allowed exceed")
        if meta.sync_every > MAX_SYNC_EVERY:
            raise CoordinatorError(400, "max sync every allowed exceed")
        if topic in coordinator.metas:
            raise CoordinatorError(400, "E_TOPIC_EXIST")
        nodes = coordinator.eligible_nodes()
        if len(nodes) < meta.replica:
            raise CoordinatorError(
                400,
                f"E_NOT_ENOUGH_NODES {len(nodes)} nsqd node(s) for {meta.replica} replicas",
            )
        placement = place_partitions(
            topic,
            range(meta.partition_num),
            meta.replica,
            nodes,
            coordinator.infos,
            coordinator.reports.loads(),
        )
        # Youzan's MagicCode is the creation time in nanoseconds: never 0, never reused.
        meta = replace(meta, magic_code=time.time_ns())
        if not await coordinator.client.create(coordinator.keys.topic_meta(topic), meta.to_json()):
            raise CoordinatorError(400, "E_TOPIC_EXIST")
        coordinator.metas[topic] = meta
        await self._create_partitions(topic, meta, placement, channels=())
        self.log.info(
            "CLUSTER: created %s: %d partition(s), %d replica(s)",
            topic,
            meta.partition_num,
            meta.replica,
        )

    async def _create_partitions(
        self,
        topic: str,
        meta: TopicMeta,
        placement: dict[int, tuple[str, ...]],
        channels: tuple[str, ...],
    ) -> None:
        coordinator = self.coordinator
        for partition, replicas in sorted(placement.items()):
            info = ReplicaInfo(
                replicas[0], replicas, channels=channels, replica=meta.replica
            ).recording(
                # Each starts empty in the incarnation it is in now: that is what it holds.
                {node: coordinator.nodes[node].incarnation for node in replicas}
            )
            key = coordinator.keys.replica_info(topic, partition)
            revision = await coordinator.client.create(key, info.to_json())
            if revision:
                coordinator.learn(key, info.to_json(), revision)

    async def expand(self, topic: str, partition_num: int) -> None:
        """Youzan's ExpandTopicPartition: the new partitions are placed on the least loaded
        nodes with the topic's channels, and then the topic's meta says how many there are
        (clients that follow `/lookup?metainfo=` start using them)."""
        coordinator = self.coordinator
        self._require_master(500)
        if partition_num >= MAX_PARTITION_NUM:
            raise CoordinatorError(500, "max partition allowed exceed")
        if coordinator.state.upgrading:
            raise CoordinatorError(500, CLUSTER_UNSTABLE)
        meta = self._meta(topic, 500)
        if partition_num < meta.partition_num:
            raise CoordinatorError(500, "the partition number can not be reduced")
        if partition_num == meta.partition_num:
            return
        nodes = coordinator.eligible_nodes()
        if len(nodes) < meta.replica:
            raise CoordinatorError(500, NO_NODE)
        placement = place_partitions(
            topic,
            range(meta.partition_num, partition_num),
            meta.replica,
            nodes,
            coordinator.infos,
            coordinator.reports.loads(),
        )
        await self._create_partitions(topic, meta, placement, self._channels_of(topic))
        await self._write_meta(topic, replace(meta, partition_num=partition_num), 500)
        self.log.info(
            "CLUSTER: expanded %s from %d to %d partitions",
            topic,
            meta.partition_num,
            partition_num,
        )

    def _channels_of(self, topic: str) -> tuple[str, ...]:
        """The channels the topic's partitions have, as their leaders report them."""
        coordinator = self.coordinator
        channels: set[str] = set()
        for (name, _partition), info in coordinator.infos.items():
            if name == topic:
                report = coordinator.reports.of(info.leader, (name, _partition))
                if report is not None:
                    channels.update(report.get("channels") or ())
        for registration in coordinator.lookupd.db.find_registrations("channel", topic, "*"):
            channels.add(registration[2])
        return tuple(sorted(channel for channel in channels if not channel.endswith("#ephemeral")))

    async def _write_meta(self, topic: str, meta: TopicMeta, status: int) -> None:
        coordinator = self.coordinator
        revision = coordinator.view.meta_revisions.get(topic, 0)
        written = await coordinator.client.replace(
            coordinator.keys.topic_meta(topic), meta.to_json(), revision
        )
        if not written:
            raise CoordinatorError(status, "E_CONFLICT the topic's meta changed meanwhile")
        coordinator.learn(coordinator.keys.topic_meta(topic), meta.to_json(), written)

    async def update_meta(
        self,
        topic: str,
        *,
        replicator: int | None,
        sync_every: int | None,
        retention_days: int | None,
        disable_channel_auto_create: bool | None,
        upgrade_ext: bool,
    ) -> None:
        """Youzan's ChangeTopicMetaParam. A new replicator reaches each partition's replica
        info, and the master adds or drops replicas to match (`ReplicaMoves.keep_replicas`)."""
        coordinator = self.coordinator
        self._require_master()
        if not is_valid_name(topic):
            raise CoordinatorError(400, "invalid topic name")
        if retention_days is not None and retention_days > MAX_RETENTION_DAYS:
            raise CoordinatorError(400, "max retention days allowed exceed")
        if sync_every is not None and sync_every > MAX_SYNC_EVERY:
            raise CoordinatorError(400, "max sync every allowed exceed")
        if replicator is not None and replicator > MAX_REPLICATOR:
            raise CoordinatorError(400, "max replicator allowed exceed")
        meta = self._meta(topic)
        changed = meta
        if sync_every is not None and sync_every >= 0:
            changed = replace(changed, sync_every=sync_every)
        if retention_days is not None and retention_days >= 0:
            changed = replace(changed, retention_day=retention_days)
        if replicator is not None and replicator > 0:
            if len(coordinator.eligible_nodes()) < replicator:
                raise CoordinatorError(400, NO_NODE)
            changed = replace(changed, replica=replicator)
        if disable_channel_auto_create is not None:
            changed = replace(changed, disable_channel_auto_create=disable_channel_auto_create)
        if upgrade_ext and not meta.ext:
            # Youzan allows non-ext to ext only.
            changed = replace(changed, ext=True)
        if changed == meta:
            return
        await self._write_meta(topic, changed, 400)
        if changed.replica != meta.replica:
            for key, info in sorted(coordinator.infos.items()):
                if key[0] == topic and info.replica != changed.replica:
                    for _ in range(5):
                        current = await coordinator.current(*key)
                        if await coordinator.write_replica_info(
                            *key, replace(current, replica=changed.replica), current
                        ):
                            break
        coordinator.notify_changed()
        self.log.info("CLUSTER: %s: meta updated to %s", topic, changed)

    async def delete_topic(self, topic: str) -> None:
        """Youzan's DeleteTopic with partition `**`: every partition's replica info and the
        topic's meta go; each node deletes its replicas as it sees them go."""
        coordinator = self.coordinator
        self._require_master(500)
        if topic not in coordinator.metas:
            raise CoordinatorError(404, "TOPIC_NOT_FOUND")
        self.log.warning("CLUSTER: removing all the partitions of topic: %s", topic)
        for key in sorted(key for key in coordinator.infos if key[0] == topic):
            await coordinator.client.delete(coordinator.keys.replica_info(*key))
            coordinator.infos.pop(key, None)
        await coordinator.client.delete(coordinator.keys.topic_meta(topic))
        coordinator.metas.pop(topic, None)
        coordinator.view.meta_revisions.pop(topic, None)

    # -- partitions and nodes -------------------------------------------------------------------

    async def move(
        self, topic: str, partition: int, move_leader: bool, source: str, destination: str
    ) -> None:
        """Youzan's MoveTopicPartitionDataByManual: `destination` catches up and joins the ISR
        before `source` leaves (the leadership first, with `move_leader`)."""
        coordinator = self.coordinator
        self._require_master()
        if coordinator.balancing is not None:
            raise CoordinatorError(400, "another balance is running, should wait")
        if coordinator.state.upgrading:
            raise CoordinatorError(400, CLUSTER_UNSTABLE)
        if source == destination:
            raise CoordinatorError(400, "move to and from node can not be the same")
        info = coordinator.infos.get((topic, partition))
        if info is None:
            raise CoordinatorError(400, TOPIC_NOT_CREATED)
        if move_leader and source != info.leader:
            raise CoordinatorError(400, "move from not the topic leader")
        if not move_leader:
            if source == info.leader:
                raise CoordinatorError(400, "can not move leader without moveleader param")
            if source not in info.isr:
                raise CoordinatorError(400, "the move source node has no replica for the topic")
            if destination in info.isr:
                raise CoordinatorError(400, "the move destination has the topic data already")
        if destination not in coordinator.nodes:
            raise CoordinatorError(400, "the move destination is not found in cluster")
        if source not in coordinator.nodes:
            raise CoordinatorError(400, "the move source data is lost in cluster")
        await coordinator.moves.move_replica(
            topic, partition, source, destination, move_leader=move_leader
        )

    async def remove_node(self, node: str) -> None:
        """Youzan's MarkNodeAsRemoving: the master moves every replica off the node (its
        leaderships to caught-up followers, its replicas to other nodes, each caught up
        before the node's copy goes), then the node holds nothing and may be stopped."""
        coordinator = self.coordinator
        self._require_master()
        holds = any(info.holds(node) for info in coordinator.infos.values())
        if node not in coordinator.nodes and not holds:
            raise CoordinatorError(400, "node not found")
        if node in coordinator.state.removing:
            self.log.info("CLUSTER: %s is already being removed", node)
            return
        self.log.info("CLUSTER: marking %s as removing", node)
        await coordinator.change_state(removing=(*coordinator.state.removing, node))

    async def set_upgrading(self, upgrading: bool) -> None:
        """Youzan's SetClusterUpgradeState: while upgrading, no replica is added, replaced,
        moved or balanced (nodes restart one after another); elections still happen."""
        coordinator = self.coordinator
        self._require_master()
        if coordinator.state.upgrading == upgrading:
            return
        await coordinator.change_state(upgrading=upgrading)
        self.log.info(
            "CLUSTER: the cluster state has been changed to %s",
            "upgrading" if upgrading else "normal",
        )

    async def set_topn_balance(self, enabled: bool) -> None:
        self._require_master()
        await self.coordinator.change_state(topn_balance=enabled)

    async def tombstone_lookupd(self, node: str, restore: bool) -> None:
        """Youzan's `/cluster/lookupd/tombstone`: hide an nsqlookupd from `/listlookup`
        (clients stop using it) or, with `restore`, show it again."""
        coordinator = self.coordinator
        tombstoned = coordinator.state.tombstoned_lookupds
        if restore:
            if node not in tombstoned:
                raise CoordinatorError(404, "lookup node id not found")
            await coordinator.change_state(
                tombstoned_lookupds=tuple(n for n in tombstoned if n != node)
            )
            return
        if node not in coordinator.lookupds:
            raise CoordinatorError(404, "lookup node id not found")
        if node not in tombstoned:
            await coordinator.change_state(tombstoned_lookupds=(*tombstoned, node))

    # -- channels ----------------------------------------------------------------------------

    async def channel_everywhere(self, topic: str, channel: str, *, delete: bool) -> None:
        """Create (or delete) the channel on every partition's leader, which takes it to its
        followers before it answers. CoordinatorError(500) naming the partitions that
        failed."""
        coordinator = self.coordinator
        self._meta(topic)
        if delete and channel not in self._channels_of(topic):
            raise CoordinatorError(404, "CHANNEL_NOT_FOUND")
        failures: dict[int, str] = {}
        path = "/channel/delete" if delete else "/channel/create"

        async def call(partition: int, info: ReplicaInfo) -> None:
            deadline = trio.current_time() + CHANNEL_CALL_TIMEOUT
            while True:
                info = coordinator.infos.get((topic, partition), info)
                node = coordinator.nodes.get(info.leader)
                try:
                    if node is None:
                        raise NodeCallError(0, f"its leader {info.leader} is not live")
                    await coordinator.call_node(
                        node,
                        "POST",
                        path,
                        CHANNEL_CALL_TIMEOUT,
                        topic=topic,
                        channel=channel,
                        partition=partition,
                    )
                    return
                except NodeCallError as error:
                    if delete and error.status == 404:
                        return
                    if trio.current_time() >= deadline:
                        failures[partition] = str(error)
                        return
                    # A new partition's leader may not have taken its part yet, or a leader
                    # is changing: ask again.
                    await trio.sleep(0.1)

        async with trio.open_nursery() as calls:
            for (name, partition), info in sorted(coordinator.infos.items()):
                if name == topic:
                    calls.start_soon(call, partition, info)
        if failures:
            detail = "; ".join(f"partition {p}: {why}" for p, why in sorted(failures.items()))
            raise CoordinatorError(500, f"E_CHANNEL_FAILED {detail}")
        self.log.info(
            "CLUSTER: %s channel %s on every partition of %s",
            "deleted" if delete else "created",
            channel,
            topic,
        )
